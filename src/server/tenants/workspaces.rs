//! A tenant's `workspaces` in the tenants file (`docs/workspaces.md`):
//! `{"quota": "1g", "ttl": "7d", "max": 100}`, each field optional (the defaults of
//! [`WorkspacePolicy`]); a tenant with the key has a workspace for every session.

use serde_json::Value;

use crate::config::{parse_bytes, parse_duration, WorkspacePolicy, MIN_WORKSPACE_QUOTA};

/// Most workspaces one tenant may be allowed.
const MAX_WORKSPACES_PER_TENANT: u64 = 100_000;

/// Parses a tenant's `workspaces` value; the error says which field and why.
pub(super) fn parse_workspaces(value: &Value) -> Result<WorkspacePolicy, (String, String)> {
    let obj = value
        .as_object()
        .ok_or_else(|| (String::new(), "must be an object".to_string()))?;
    if let Some(key) = obj
        .keys()
        .find(|k| !["quota", "ttl", "max"].contains(&k.as_str()))
    {
        return Err((
            format!(".{key}"),
            "unknown field (use quota, ttl, max)".into(),
        ));
    }
    let mut policy = WorkspacePolicy::default();
    match obj.get("quota") {
        None | Some(Value::Null) => {}
        Some(v) => {
            let bytes = match v {
                Value::String(s) => parse_bytes(s).map_err(|e| (".quota".to_string(), e))? as u64,
                Value::Number(n) => n
                    .as_u64()
                    .ok_or_else(|| (".quota".to_string(), "must be a positive size".into()))?,
                _ => return Err((".quota".into(), "must be a size such as \"1g\"".into())),
            };
            if bytes < MIN_WORKSPACE_QUOTA {
                return Err((
                    ".quota".into(),
                    format!("must be at least {MIN_WORKSPACE_QUOTA} bytes (4m)"),
                ));
            }
            policy.quota_bytes = bytes;
        }
    }
    match obj.get("ttl") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            policy.ttl = parse_duration(s).map_err(|e| (".ttl".to_string(), e))?
        }
        Some(_) => return Err((".ttl".into(), "must be a duration such as \"7d\"".into())),
    }
    match obj.get("max") {
        None | Some(Value::Null) => {}
        Some(v) => {
            policy.max = v
                .as_u64()
                .filter(|n| (1..=MAX_WORKSPACES_PER_TENANT).contains(n))
                .ok_or_else(|| {
                    (
                        ".max".to_string(),
                        format!("must be an integer from 1 to {MAX_WORKSPACES_PER_TENANT}"),
                    )
                })? as usize
        }
    }
    Ok(policy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_is_parsed_and_bad_fields_are_named() {
        let p = parse_workspaces(&serde_json::json!({"quota": "1g", "ttl": "7d", "max": 3}))
            .expect("valid");
        assert_eq!(p.quota_bytes, 1 << 30);
        assert_eq!(p.ttl, std::time::Duration::from_secs(7 * 86400));
        assert_eq!(p.max, 3);
        assert_eq!(
            parse_workspaces(&serde_json::json!({})).expect("defaults"),
            WorkspacePolicy::default()
        );
        for (bad, field) in [
            (serde_json::json!({"quota": "1k"}), ".quota"),
            (serde_json::json!({"ttl": 5}), ".ttl"),
            (serde_json::json!({"max": 0}), ".max"),
            (serde_json::json!({"size": "1g"}), ".size"),
        ] {
            assert_eq!(parse_workspaces(&bad).expect_err("refused").0, field);
        }
    }
}
