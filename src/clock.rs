//! Wall-clock time as kernelbox writes it into labels and archives: whole seconds since the
//! Unix epoch. The bottom of the module graph: it imports nothing of kernelbox.

use std::time::SystemTime;

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
