//! A tenant's `session_limits` in the tenants file (`docs/http-api.md`, "Session settings"):
//! `{"memory": "4g", "cpus": 2, "idle_timeout": "4h"}`, the most one of its sessions may ask
//! for in its settings; each field optional (the server's default: sessions may lower it,
//! not raise it).

use serde_json::Value;

use crate::config::{parse_bytes, parse_duration};
use crate::settings::{Limits, MIN_CPUS, MIN_MEMORY_BYTES};

/// Parses a tenant's `session_limits`; the error says which field and why.
pub(super) fn parse_session_limits(value: &Value) -> Result<Limits, (String, String)> {
    let obj = value
        .as_object()
        .ok_or_else(|| (String::new(), "must be an object".to_string()))?;
    if let Some(key) = obj
        .keys()
        .find(|k| !["memory", "cpus", "idle_timeout"].contains(&k.as_str()))
    {
        return Err((
            format!(".{key}"),
            "unknown field (use memory, cpus, idle_timeout)".into(),
        ));
    }
    let mut limits = Limits::default();
    match obj.get("memory") {
        None | Some(Value::Null) => {}
        Some(v) => {
            let bytes = match v {
                Value::String(s) => parse_bytes(s).map_err(|e| (".memory".to_string(), e))?,
                Value::Number(n) => n.as_i64().unwrap_or(0),
                _ => return Err((".memory".into(), "must be a size such as \"4g\"".into())),
            };
            if bytes < MIN_MEMORY_BYTES {
                return Err((".memory".into(), "must be at least 64m".into()));
            }
            limits.memory_bytes = Some(bytes);
        }
    }
    match obj.get("cpus") {
        None | Some(Value::Null) => {}
        Some(v) => {
            let cpus = v
                .as_f64()
                .filter(|c| c.is_finite() && *c >= MIN_CPUS && *c <= 1024.0)
                .ok_or_else(|| {
                    (
                        ".cpus".to_string(),
                        format!("must be a number from {MIN_CPUS} to 1024"),
                    )
                })?;
            limits.nano_cpus = Some((cpus * 1e9).round() as i64);
        }
    }
    match obj.get("idle_timeout") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            limits.idle_timeout =
                Some(parse_duration(s).map_err(|e| (".idle_timeout".to_string(), e))?)
        }
        Some(_) => {
            return Err((
                ".idle_timeout".into(),
                "must be a duration such as \"4h\"".into(),
            ))
        }
    }
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn session_limits_parse_and_name_a_bad_field() {
        let limits =
            parse_session_limits(&json!({"memory": "2g", "cpus": 1.5, "idle_timeout": "4h"}))
                .expect("valid");
        assert_eq!(limits.memory_bytes, Some(2 << 30));
        assert_eq!(limits.nano_cpus, Some(1_500_000_000));
        assert_eq!(
            limits.idle_timeout,
            Some(std::time::Duration::from_secs(4 * 3600))
        );
        assert_eq!(
            parse_session_limits(&json!({"memory": "1m"})).map_err(|e| e.0),
            Err(".memory".into())
        );
        assert_eq!(
            parse_session_limits(&json!({"cpu": 1})).map_err(|e| e.0),
            Err(".cpu".into())
        );
    }
}
