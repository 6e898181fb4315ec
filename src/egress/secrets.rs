//! Credentials added at the boundary (`docs/reliability.md`, "Credentials at the boundary"):
//! each tenant's secrets (`NAME -> value`) and rules (`host -> headers to set`, with
//! `${secrets.NAME}` placeholders, optionally for one session), read from a file the operator
//! controls. A value is held in a [`Secret`], whose `Debug` and `Display` print a placeholder:
//! no log line, metric or error can carry one.

use std::collections::HashMap;
use std::path::Path;

use hyper::header::{HeaderName, HeaderValue};
use serde_json::Value;

/// The text that opens a placeholder in a rule's header value (and that a request to a host
/// with no rule may not carry).
pub const PLACEHOLDER: &str = "${secrets.";

/// Most rules, and most secrets, of one tenant.
pub const MAX_RULES: usize = 256;
/// Most bytes the secrets file may have.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// A secret's value: never printed (`Debug` and `Display` show `<secret>`).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place that sends it: the header set on an intercepted request.
    fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

/// A piece of a header value template: text, or a secret's name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Secret(String),
}

/// The port a rule applies to when its `host` names none: HTTPS's (interception is of TLS
/// tunnels only).
pub const DEFAULT_RULE_PORT: u16 = 443;

/// A rule: requests to `host` (exact, or `*.suffix` for its subdomains) on `port` get
/// `headers` set, replacing any the kernel sent; `session`: only that session's kernels.
#[derive(Debug, Clone)]
pub struct Rule {
    host: String,
    port: u16,
    session: Option<String>,
    headers: Vec<(HeaderName, Vec<Piece>)>,
}

impl Rule {
    fn matches(&self, host: &str, port: u16) -> bool {
        port == self.port
            && match self.host.strip_prefix("*.") {
                Some(suffix) => host
                    .strip_suffix(suffix)
                    .is_some_and(|rest| rest.len() > 1 && rest.ends_with('.')),
                None => host == self.host,
            }
    }
}

/// One tenant's secrets and rules.
#[derive(Debug, Clone, Default)]
pub struct TenantSecrets {
    secrets: HashMap<String, Secret>,
    rules: Vec<Rule>,
}

/// Every tenant's secrets and rules (`--egress-secrets`).
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    tenants: HashMap<String, TenantSecrets>,
}

/// A secrets file that cannot be used. Never carries a value: only where and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretsError {
    /// Reading the file failed.
    #[error("reading the egress secrets file {path}: {message}")]
    Read {
        /// The secrets file as given.
        path: String,
        /// What the system said.
        message: String,
    },
    /// The file's content is wrong at `field`.
    #[error("the egress secrets file: {field}: {reason}")]
    Invalid {
        /// Where (`tenants.acme.rules[0].headers.Authorization`).
        field: String,
        /// What is wrong (never a value).
        reason: String,
    },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> SecretsError {
    SecretsError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// The headers a rule sets on one request, values marked sensitive.
pub type Headers = Vec<(HeaderName, HeaderValue)>;

impl Secrets {
    /// Reads and parses the file at `path`; a secret given as `{"env": "VAR"}` is read from
    /// this process's environment.
    pub fn load(path: &Path) -> Result<Secrets, SecretsError> {
        let read = |message: String| SecretsError::Read {
            path: path.display().to_string(),
            message,
        };
        let size = std::fs::metadata(path)
            .map_err(|e| read(e.to_string()))?
            .len();
        if size > MAX_FILE_BYTES {
            return Err(read(format!("larger than {MAX_FILE_BYTES} bytes")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| read(e.to_string()))?;
        // serde_json's errors name a line and column, never the text around them.
        let value: Value =
            serde_json::from_str(&text).map_err(|e| invalid("(file)", format!("not JSON: {e}")))?;
        Secrets::parse(&value, &|var| std::env::var(var).ok())
    }

    /// Parses `{"tenants": {NAME: {"secrets": {NAME: VALUE | {"env": VAR}}, "rules": [{"host":
    /// HOST, "headers": {NAME: TEMPLATE}, "session": SESSION?}]}}}`; `env` looks a variable up.
    pub fn parse(
        value: &Value,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Secrets, SecretsError> {
        let root = value
            .as_object()
            .ok_or_else(|| invalid("(file)", "must be an object {\"tenants\": {...}}"))?;
        if let Some(k) = root.keys().find(|k| *k != "tenants") {
            return Err(invalid(k.clone(), "unknown field (expected `tenants`)"));
        }
        let mut tenants = HashMap::new();
        let Some(all) = root.get("tenants") else {
            return Ok(Secrets { tenants });
        };
        let all = all
            .as_object()
            .ok_or_else(|| invalid("tenants", "must be an object of tenant names"))?;
        for (tenant, t) in all {
            let at = format!("tenants.{tenant}");
            tenants.insert(tenant.clone(), parse_tenant(&at, t, env)?);
        }
        Ok(Secrets { tenants })
    }

    /// True when no tenant has a rule (nothing is ever intercepted).
    pub fn is_empty(&self) -> bool {
        self.tenants.values().all(|t| t.rules.is_empty())
    }

    /// The headers `tenant`'s `session` gets on requests to `host:port`, when a rule names it
    /// (the first rule in the file that names the host, port and session, or no session, wins).
    pub fn headers(&self, tenant: &str, session: &str, host: &str, port: u16) -> Option<Headers> {
        let t = self.tenants.get(tenant)?;
        let rule = t
            .rules
            .iter()
            .find(|r| r.matches(host, port) && r.session.as_deref().is_none_or(|s| s == session))?;
        let mut out = Vec::with_capacity(rule.headers.len());
        for (name, pieces) in &rule.headers {
            let mut value = String::new();
            for piece in pieces {
                match piece {
                    Piece::Text(s) => value.push_str(s),
                    // Checked at load: every name a rule uses is the tenant's.
                    Piece::Secret(n) => value.push_str(t.secrets.get(n)?.expose()),
                }
            }
            let mut value = HeaderValue::from_str(&value).ok()?;
            value.set_sensitive(true);
            out.push((name.clone(), value));
        }
        Some(out)
    }

    /// True when `tenant`'s `session` has a rule for `host:port` (its connections there are
    /// intercepted).
    pub fn has_rule(&self, tenant: &str, session: &str, host: &str, port: u16) -> bool {
        self.tenants.get(tenant).is_some_and(|t| {
            t.rules
                .iter()
                .any(|r| r.matches(host, port) && r.session.as_deref().is_none_or(|s| s == session))
        })
    }
}

fn parse_tenant(
    at: &str,
    t: &Value,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<TenantSecrets, SecretsError> {
    let t = t
        .as_object()
        .ok_or_else(|| invalid(at, "must be {\"secrets\": {...}, \"rules\": [...]}"))?;
    if let Some(k) = t.keys().find(|k| *k != "secrets" && *k != "rules") {
        return Err(invalid(format!("{at}.{k}"), "unknown field"));
    }
    let mut secrets = HashMap::new();
    if let Some(s) = t.get("secrets") {
        let s = s
            .as_object()
            .ok_or_else(|| invalid(format!("{at}.secrets"), "must be an object"))?;
        if s.len() > MAX_RULES {
            return Err(invalid(
                format!("{at}.secrets"),
                format!("more than {MAX_RULES}"),
            ));
        }
        for (name, v) in s {
            let field = format!("{at}.secrets.{name}");
            if !valid_name(name) {
                return Err(invalid(field, "a name is letters, digits and _"));
            }
            let value = match v {
                Value::String(s) => s.clone(),
                Value::Object(o) => match (o.len(), o.get("env").and_then(Value::as_str)) {
                    (1, Some(var)) => env(var).ok_or_else(|| {
                        invalid(&field, format!("the environment variable {var} is not set"))
                    })?,
                    _ => return Err(invalid(field, "must be a string or {\"env\": VAR}")),
                },
                _ => return Err(invalid(field, "must be a string or {\"env\": VAR}")),
            };
            // A value that is no valid header text could never be sent.
            if HeaderValue::from_str(&value).is_err() {
                return Err(invalid(field, "is not valid header text"));
            }
            secrets.insert(name.clone(), Secret(value));
        }
    }
    let mut rules = Vec::new();
    if let Some(r) = t.get("rules") {
        let r = r
            .as_array()
            .ok_or_else(|| invalid(format!("{at}.rules"), "must be a list"))?;
        if r.len() > MAX_RULES {
            return Err(invalid(
                format!("{at}.rules"),
                format!("more than {MAX_RULES}"),
            ));
        }
        for (i, rule) in r.iter().enumerate() {
            rules.push(parse_rule(&format!("{at}.rules[{i}]"), rule, &secrets)?);
        }
    }
    Ok(TenantSecrets { secrets, rules })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_rule(
    at: &str,
    rule: &Value,
    secrets: &HashMap<String, Secret>,
) -> Result<Rule, SecretsError> {
    let r = rule
        .as_object()
        .ok_or_else(|| invalid(at, "must be {\"host\": ..., \"headers\": {...}}"))?;
    if let Some(k) = r
        .keys()
        .find(|k| !["host", "headers", "session"].contains(&k.as_str()))
    {
        return Err(invalid(format!("{at}.{k}"), "unknown field"));
    }
    let named = r
        .get("host")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid(format!("{at}.host"), "must be a host name"))?
        .to_ascii_lowercase();
    let bad_host = || {
        invalid(
            format!("{at}.host"),
            "must be a host name (`api.example.com` or `*.example.com`), optionally with `:PORT` (default 443)",
        )
    };
    // `HOST:PORT` names one port; a rule without one applies to HTTPS's only.
    let (host, port) = match named.rsplit_once(':') {
        // Digits only, no leading zero: `host:0443` and `host:+443` are refused.
        Some((host, text)) => match text.parse::<u16>() {
            Ok(port) if port > 0 && port.to_string() == text => (host.to_string(), port),
            _ => return Err(bad_host()),
        },
        None => (named.clone(), DEFAULT_RULE_PORT),
    };
    let bare = host.strip_prefix("*.").unwrap_or(&host);
    if bare.is_empty()
        || bare.contains('*')
        || !bare
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
    {
        return Err(bad_host());
    }
    let session = match r.get("session") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(invalid(format!("{at}.session"), "must be a session name")),
    };
    let h = r
        .get("headers")
        .and_then(Value::as_object)
        .ok_or_else(|| invalid(format!("{at}.headers"), "must be an object NAME: VALUE"))?;
    let mut headers = Vec::new();
    for (name, template) in h {
        let field = format!("{at}.headers.{name}");
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid(&field, "not a header name"))?;
        if header == hyper::header::HOST {
            return Err(invalid(field, "the Host header is the rule's host"));
        }
        let template = template
            .as_str()
            .ok_or_else(|| invalid(&field, "must be a string"))?;
        let pieces = parse_template(template).map_err(|reason| invalid(&field, reason))?;
        for piece in &pieces {
            match piece {
                Piece::Secret(n) if !secrets.contains_key(n) => {
                    return Err(invalid(
                        &field,
                        format!("names no secret of the tenant: {n}"),
                    ))
                }
                Piece::Text(s) if HeaderValue::from_str(s).is_err() => {
                    return Err(invalid(&field, "is not valid header text"))
                }
                _ => {}
            }
        }
        headers.push((header, pieces));
    }
    Ok(Rule {
        host,
        port,
        session,
        headers,
    })
}

fn parse_template(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find(PLACEHOLDER) {
        if start > 0 {
            pieces.push(Piece::Text(rest[..start].to_string()));
        }
        let after = &rest[start + PLACEHOLDER.len()..];
        let end = after
            .find('}')
            .ok_or_else(|| "a `${secrets.` without its `}`".to_string())?;
        let name = &after[..end];
        if !valid_name(name) {
            return Err("a placeholder is ${secrets.NAME}, NAME letters, digits and _".into());
        }
        pieces.push(Piece::Secret(name.to_string()));
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest.to_string()));
    }
    Ok(pieces)
}

/// True when `bytes` carry a placeholder (a request to a host with no rule is refused then).
pub fn carries_placeholder(bytes: &[u8]) -> bool {
    bytes
        .windows(PLACEHOLDER.len())
        .any(|w| w == PLACEHOLDER.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn file() -> Value {
        json!({"tenants": {
            "a": {"secrets": {"KEY": "sk-a", "OTHER": {"env": "FROM_ENV"}},
                  "rules": [{"host": "api.example.com",
                             "headers": {"Authorization": "Bearer ${secrets.KEY}"}},
                            {"host": "*.svc.example:8443", "session": "s1",
                             "headers": {"x-token": "${secrets.OTHER}"}}]},
            "b": {"secrets": {"KEY": "sk-b"}, "rules": []}
        }})
    }

    fn env(var: &str) -> Option<String> {
        (var == "FROM_ENV").then(|| "from-env".to_string())
    }

    #[test]
    fn rules_render_for_their_tenant_host_and_session_only() {
        let s = Secrets::parse(&file(), &env).expect("parsed");
        let h = s.headers("a", "any", "api.example.com", 443).expect("rule");
        assert_eq!(h[0].0, "authorization");
        assert_eq!(h[0].1, "Bearer sk-a");
        assert!(h[0].1.is_sensitive());
        assert!(s.headers("b", "any", "api.example.com", 443).is_none());
        assert!(s.headers("c", "any", "api.example.com", 443).is_none());
        assert!(s.headers("a", "any", "evil.api.example.com", 443).is_none());
        // A rule without a port is HTTPS's only; one with a port, that port's only.
        assert!(s.headers("a", "any", "api.example.com", 8443).is_none());
        assert!(s.has_rule("a", "any", "api.example.com", 443));
        assert!(!s.has_rule("a", "any", "api.example.com", 444));
        assert!(s.headers("a", "s2", "x.svc.example", 8443).is_none());
        assert_eq!(
            s.headers("a", "s1", "x.svc.example", 8443).expect("rule")[0].1,
            "from-env"
        );
        assert!(s.headers("a", "s1", "x.svc.example", 443).is_none());
        assert!(s.headers("a", "s1", "svc.example", 8443).is_none());
        assert!(s.headers("a", "s1", "xsvc.example", 8443).is_none());
    }

    #[test]
    fn errors_and_debug_never_carry_a_value() {
        let s = Secrets::parse(&file(), &env).expect("parsed");
        let printed = format!("{s:?}");
        assert!(
            !printed.contains("sk-a") && !printed.contains("from-env"),
            "{printed}"
        );
        for bad in [
            json!({"tenants": {"a": {"secrets": {"K": "sk-zzz\n"}}}}),
            json!({"tenants": {"a": {"secrets": {"K": "sk-zzz"}, "rules": [{"host": "h", "headers": {"A": "${secrets.NOPE}"}}]}}}),
            json!({"tenants": {"a": {"secrets": {"K": "sk-zzz"}, "rules": [{"host": "h:0443", "headers": {}}]}}}),
            json!({"tenants": {"a": {"secrets": {"K": "sk-zzz"}, "rules": [{"host": "h:0", "headers": {}}]}}}),
            json!({"tenants": {"a": {"secrets": {"K": "sk-zzz"}, "rules": [{"host": "h:x", "headers": {}}]}}}),
            json!({"tenants": {"a": {"secrets": {"K": "sk-zzz"}, "rules": [{"host": "h:443:1", "headers": {}}]}}}),
            json!({"tenants": {"a": {"secrets": {"K": {"env": "UNSET"}}}}}),
        ] {
            let err = Secrets::parse(&bad, &env).expect_err("refused");
            assert!(!err.to_string().contains("sk-zzz"), "{err}");
        }
    }

    #[test]
    fn placeholders_are_found_in_bytes() {
        assert!(carries_placeholder(b"Authorization: Bearer ${secrets.KEY}"));
        assert!(!carries_placeholder(b"Authorization: Bearer sk"));
    }
}
