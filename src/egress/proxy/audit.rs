//! Tenants' counters and the `--egress-audit` file (written by a thread of its own).

use std::collections::HashMap;

/// Counters of one tenant (`kernelbox_egress_*` in `/metrics`).
#[derive(Debug, Default, Clone)]
pub struct TenantCounters {
    /// Bytes sent by kernels to destinations.
    pub bytes_out: u64,
    /// Bytes received from destinations.
    pub bytes_in: u64,
    /// Connections allowed.
    pub connections: u64,
    /// Names the proxy looked up for this tenant's kernels (only names a name entry allows
    /// are ever looked up).
    pub lookups: u64,
    /// Refusals and failures by reason.
    pub refusals: HashMap<&'static str, u64>,
}

/// Most audit lines waiting for the audit file's writer; past it a line goes to the log
/// instead (the proxy never waits on the disk).
pub const AUDIT_BACKLOG: usize = 4096;

/// Where audit lines go when `--egress-audit PATH` is given: one JSON line per connection,
/// appended by a writer thread of its own.
#[derive(Debug)]
pub struct AuditFile {
    pub(super) lines: std::sync::mpsc::SyncSender<String>,
}

impl AuditFile {
    /// Opens `path` for appending (created if missing) and starts its writer.
    pub fn open(path: &std::path::Path) -> std::io::Result<AuditFile> {
        use std::io::Write as _;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let (lines, rx) = std::sync::mpsc::sync_channel::<String>(AUDIT_BACKLOG);
        let path = path.to_path_buf();
        std::thread::Builder::new()
            .name("kernelbox-egress-audit".into())
            .spawn(move || {
                let mut out = std::io::BufWriter::new(file);
                // Ends when the last sender (the proxy's table) is dropped.
                while let Ok(line) = rx.recv() {
                    let mut batch = Some(line);
                    while let Some(line) = batch {
                        if let Err(e) = out.write_all(line.as_bytes()) {
                            tracing::warn!(path = %path.display(), error = %e, line = %line.trim_end(), "writing the egress audit file");
                        }
                        batch = rx.try_recv().ok();
                    }
                    if let Err(e) = out.flush() {
                        tracing::warn!(path = %path.display(), error = %e, "flushing the egress audit file");
                    }
                }
            })?;
        Ok(AuditFile { lines })
    }
}
