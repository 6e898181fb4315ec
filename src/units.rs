//! Sizes and durations as people write them (`512m`, `30s`): parsed in one place for the
//! configuration, the tenants file, session settings and the command line.

use std::time::Duration;

/// Parses a human duration such as `30s`, `5m` or `7d` (humantime), or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() && secs > 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("{text:?} is not a positive duration"));
    }
    humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e}"))
}

/// Parses a size such as `512m`, `1g` or a bare byte count.
pub fn parse_bytes(text: &str) -> Result<i64, String> {
    let text = text.trim().to_ascii_lowercase();
    let (num, mult) = match text.trim_end_matches(['b', 'i']).chars().last() {
        Some('k') => (&text[..text.find('k').unwrap_or(0)], 1024i64),
        Some('m') => (&text[..text.find('m').unwrap_or(0)], 1024 * 1024),
        Some('g') => (&text[..text.find('g').unwrap_or(0)], 1024 * 1024 * 1024),
        _ => (text.as_str(), 1),
    };
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size (use e.g. 512m, 1g)"))?;
    if !(value.is_finite() && value > 0.0) {
        return Err(format!("{text:?} is not a positive size"));
    }
    Ok((value * mult as f64) as i64)
}
