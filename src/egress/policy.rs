//! Network policies parsed and matched (`docs/reliability.md`, "Network egress"). A
//! [`Policy`] is one `{"allow", "deny"}` parsed once; [`Grant`] is what applies to one kernel:
//! its tenant's policy and, within it, its session's. A destination is judged twice: by the
//! name the kernel asked for (before resolving), then by each address the proxy resolved it to.

use std::net::IpAddr;
use std::sync::Arc;

use crate::wire::NetworkPolicy;

/// The preset `pypi`: the Python package index and its file host, HTTPS only.
pub const PYPI_PRESET: [&str; 2] = ["pypi.org:443", "files.pythonhosted.org:443"];

/// Most entries one policy may hold (allow and deny together).
pub const MAX_ENTRIES: usize = 256;

/// Longest host name accepted (DNS's own limit).
pub const MAX_HOST_LEN: usize = 253;

/// A policy entry that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Parsing one entry failed.
    #[error("network policy entry {entry:?}: {why}")]
    Entry {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Parsing the policy failed: too many entries.
    #[error("a network policy holds at most {MAX_ENTRIES} entries")]
    TooMany,
}

/// What an entry names: a host (exactly, or its subdomains) or an address range.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// This host name exactly (lower case, no trailing dot).
    Host(String),
    /// Any strict subdomain of this name (`*.example.com`).
    Subdomains(String),
    /// An address range: its base and prefix length.
    Range(IpAddr, u8),
}

/// One parsed entry: a target and, optionally, the one port it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    target: Target,
    port: Option<u16>,
}

/// One parsed policy: allow and deny entries (presets expanded).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    allow: Vec<Entry>,
    deny: Vec<Entry>,
}

/// Why a destination is refused (the `reason` of metrics and audit lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// No allow entry names it (of the tenant's or of the session's policy).
    NotAllowed,
    /// A deny entry names it.
    Denied,
    /// It resolved to a private, loopback, link-local or otherwise special address that no
    /// allow entry names explicitly.
    PrivateAddress,
}

impl Refusal {
    /// The reason's name in metrics and audit lines.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "not_allowed",
            Refusal::Denied => "denied",
            Refusal::PrivateAddress => "private_address",
        }
    }
}

impl Policy {
    /// Parses `wire`: every entry checked, presets expanded.
    pub fn parse(wire: &NetworkPolicy) -> Result<Policy, PolicyError> {
        if wire.allow.len() + wire.deny.len() > MAX_ENTRIES {
            return Err(PolicyError::TooMany);
        }
        let parse_all = |entries: &[String]| -> Result<Vec<Entry>, PolicyError> {
            let mut out = Vec::new();
            for text in entries {
                out.extend(parse_entry(text)?);
            }
            Ok(out)
        };
        Ok(Policy {
            allow: parse_all(&wire.allow)?,
            deny: parse_all(&wire.deny)?,
        })
    }

    /// True when it allows nothing.
    pub fn is_none(&self) -> bool {
        self.allow.is_empty()
    }

    /// Judges the name (or address literal) a kernel asked for, before resolving: allowed
    /// when an allow entry could match it (by name, or, for an address range, by the
    /// addresses checked next), refused when a deny entry names it.
    pub fn check_name(&self, host: &str, port: u16) -> Result<(), Refusal> {
        let host = normalise_host(host);
        let literal = host.parse::<IpAddr>().ok();
        let names = |e: &Entry| {
            port_matches(e, port)
                && match (&e.target, literal) {
                    (Target::Range(base, len), Some(ip)) => in_range(ip, *base, *len),
                    (Target::Range(..), None) => false,
                    (_, Some(_)) => false,
                    (target, None) => name_matches(target, &host),
                }
        };
        if self.deny.iter().any(names) {
            return Err(Refusal::Denied);
        }
        let may_allow = |e: &Entry| {
            port_matches(e, port)
                && match (&e.target, literal) {
                    (Target::Range(base, len), Some(ip)) => in_range(ip, *base, *len),
                    // A name resolving into an allowed range is judged on its addresses.
                    (Target::Range(..), None) => true,
                    (_, Some(_)) => false,
                    (target, None) => name_matches(target, &host),
                }
        };
        if self.allow.iter().any(may_allow) {
            Ok(())
        } else {
            Err(Refusal::NotAllowed)
        }
    }

    /// Judges one address `host` resolved to (or its literal): refused when a deny range holds
    /// it; a special address (`is_special`) only when an allow range names it explicitly; an
    /// ordinary one when the name was allowed by name or an allow range holds it.
    pub fn check_address(&self, host: &str, port: u16, ip: IpAddr) -> Result<(), Refusal> {
        let host = normalise_host(host);
        let literal = host.parse::<IpAddr>().is_ok();
        let range_holds = |e: &Entry| {
            port_matches(e, port)
                && matches!(e.target, Target::Range(base, len) if in_range(ip, base, len))
        };
        if self.deny.iter().any(range_holds) {
            return Err(Refusal::Denied);
        }
        if self.allow.iter().any(range_holds) {
            return Ok(());
        }
        if is_special(ip) {
            return Err(Refusal::PrivateAddress);
        }
        let by_name = !literal
            && self
                .allow
                .iter()
                .any(|e| port_matches(e, port) && name_matches(&e.target, &host));
        if by_name {
            Ok(())
        } else {
            Err(Refusal::NotAllowed)
        }
    }
}

/// What applies to one kernel: its tenant's policy and its session's within it (a destination
/// must pass both). A session with no policy of its own has the tenant's.
#[derive(Debug, Clone, Default)]
pub struct Grant {
    /// The tenant's policy (the operator's: tenants file or `--network-allow`).
    pub tenant: Arc<Policy>,
    /// The session's own, when it set one.
    pub session: Option<Arc<Policy>>,
}

impl Grant {
    /// [`Policy::check_name`] under both policies.
    pub fn check_name(&self, host: &str, port: u16) -> Result<(), Refusal> {
        self.tenant.check_name(host, port)?;
        match &self.session {
            Some(s) => s.check_name(host, port),
            None => Ok(()),
        }
    }

    /// [`Policy::check_address`] under both policies.
    pub fn check_address(&self, host: &str, port: u16, ip: IpAddr) -> Result<(), Refusal> {
        self.tenant.check_address(host, port, ip)?;
        match &self.session {
            Some(s) => s.check_address(host, port, ip),
            None => Ok(()),
        }
    }
}

/// Lower case, without a trailing dot or IPv6 brackets.
fn normalise_host(host: &str) -> String {
    let host = host.trim_end_matches('.');
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.to_ascii_lowercase()
}

fn port_matches(entry: &Entry, port: u16) -> bool {
    entry.port.is_none_or(|p| p == port)
}

fn name_matches(target: &Target, host: &str) -> bool {
    match target {
        Target::Host(name) => name == host,
        Target::Subdomains(parent) => host
            .strip_suffix(parent.as_str())
            .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        Target::Range(..) => false,
    }
}

/// True when `ip` is in the range `base`/`len` (an IPv4-mapped IPv6 address as its IPv4).
pub fn in_range(ip: IpAddr, base: IpAddr, len: u8) -> bool {
    match (ip, base) {
        (IpAddr::V4(ip), IpAddr::V4(base)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(base) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(base)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(base) & mask
        }
        (IpAddr::V6(ip), IpAddr::V4(_)) => ip
            .to_ipv4_mapped()
            .is_some_and(|v4| in_range(IpAddr::V4(v4), base, len)),
        (IpAddr::V4(_), IpAddr::V6(_)) => false,
    }
}

/// Addresses refused unless an allow range names them: private, loopback, link-local (the
/// cloud metadata address 169.254.169.254 among them), shared (CGNAT), unspecified,
/// multicast, broadcast, documentation-free reserved ranges, and their IPv6 counterparts.
pub fn is_special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_private()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                || o[0] >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_special(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] == 0x64 && s[1] == 0xff9b)
                || s[0] == 0x2002
        }
    }
}

/// One entry's text as its entries (a preset is several).
fn parse_entry(text: &str) -> Result<Vec<Entry>, PolicyError> {
    let bad = |why| PolicyError::Entry {
        entry: text.chars().take(300).collect(),
        why,
    };
    let text = text.trim();
    if text == "pypi" {
        return PYPI_PRESET
            .iter()
            .map(|e| parse_one(e).map_err(bad))
            .collect();
    }
    parse_one(text).map(|e| vec![e]).map_err(bad)
}

fn parse_one(text: &str) -> Result<Entry, &'static str> {
    if text.is_empty() {
        return Err("empty");
    }
    // `[v6]:port`, `[v6]`, a bare v6 address or range, else `target[:port]`.
    let (target, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inner, after) = rest.split_once(']').ok_or("unclosed [")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("expected :PORT after ]")?),
        };
        (inner, port)
    } else if text.matches(':').count() > 1 {
        (text, None)
    } else {
        match text.rsplit_once(':') {
            Some((t, p)) => (t, Some(p)),
            None => (text, None),
        }
    };
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err("the port must be a number in 1..=65535"),
            Ok(n) => Some(n),
        },
    };
    Ok(Entry {
        target: parse_target(target)?,
        port,
    })
}

fn parse_target(text: &str) -> Result<Target, &'static str> {
    if let Some((base, len)) = text.split_once('/') {
        let base: IpAddr = base.parse().map_err(|_| "not an address range")?;
        let max = if base.is_ipv4() { 32 } else { 128 };
        let len: u8 = len
            .parse()
            .ok()
            .filter(|l| *l <= max)
            .ok_or("bad prefix length")?;
        return Ok(Target::Range(base, len));
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        let len = if ip.is_ipv4() { 32 } else { 128 };
        return Ok(Target::Range(ip, len));
    }
    let name = text.trim_end_matches('.').to_ascii_lowercase();
    let (wild, name) = match name.strip_prefix("*.") {
        Some(rest) => (true, rest.to_string()),
        None => (false, name),
    };
    if name.is_empty() || name.len() > MAX_HOST_LEN {
        return Err("not a host name");
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if !name.split('.').all(label_ok) {
        return Err("not a host name, preset or address range");
    }
    Ok(if wild {
        Target::Subdomains(name)
    } else {
        Target::Host(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> Policy {
        Policy::parse(&NetworkPolicy {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
        })
        .expect("parses")
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("address")
    }

    #[test]
    fn entries_parse_and_bad_ones_say_why() {
        let p = policy(
            &[
                "pypi",
                "Example.COM.",
                "*.example.org:8443",
                "203.0.113.0/24",
                "127.0.0.1:8080",
                "[::1]:80",
                "2001:db8::/32",
            ],
            &[],
        );
        assert_eq!(p.allow.len(), 8);
        for bad in [
            "",
            "a b",
            "x:0",
            "x:99999",
            "1.2.3.4/33",
            "-a.com",
            "*.",
            "[::1",
            "a:b",
        ] {
            let err = Policy::parse(&NetworkPolicy {
                allow: vec![bad.into()],
                deny: vec![],
            })
            .expect_err(bad);
            assert!(err.to_string().contains("network policy entry"), "{err}");
        }
        let many = NetworkPolicy {
            allow: vec!["a.com".into(); MAX_ENTRIES + 1],
            deny: vec![],
        };
        assert_eq!(Policy::parse(&many), Err(PolicyError::TooMany));
    }

    #[test]
    fn names_match_exactly_or_by_subdomain_and_ports_when_given() {
        let p = policy(&["example.com", "*.example.org:8443", "pypi"], &[]);
        assert_eq!(p.check_name("EXAMPLE.com.", 80), Ok(()));
        assert_eq!(p.check_name("a.example.com", 80), Err(Refusal::NotAllowed));
        assert_eq!(p.check_name("a.b.example.org", 8443), Ok(()));
        assert_eq!(p.check_name("example.org", 8443), Err(Refusal::NotAllowed));
        assert_eq!(
            p.check_name("evilexample.org", 8443),
            Err(Refusal::NotAllowed)
        );
        assert_eq!(p.check_name("a.example.org", 443), Err(Refusal::NotAllowed));
        assert_eq!(p.check_name("files.pythonhosted.org", 443), Ok(()));
        assert_eq!(p.check_name("pypi.org", 80), Err(Refusal::NotAllowed));
    }

    #[test]
    fn deny_wins_and_private_addresses_need_an_explicit_range() {
        let p = policy(&["*.example.com", "example.com"], &["secret.example.com"]);
        assert_eq!(
            p.check_name("secret.example.com", 443),
            Err(Refusal::Denied)
        );
        assert_eq!(p.check_name("www.example.com", 443), Ok(()));
        assert_eq!(
            p.check_address("www.example.com", 443, ip("93.184.216.34")),
            Ok(())
        );
        for private in [
            "10.1.2.3",
            "127.0.0.1",
            "169.254.169.254",
            "192.168.1.1",
            "::1",
            "fd00::1",
            "::ffff:10.0.0.1",
            "100.64.0.1",
        ] {
            assert_eq!(
                p.check_address("www.example.com", 443, ip(private)),
                Err(Refusal::PrivateAddress),
                "{private}"
            );
        }
        let p = policy(&["example.com", "10.0.0.0/8"], &["10.9.0.0/16"]);
        assert_eq!(p.check_address("example.com", 443, ip("10.1.2.3")), Ok(()));
        assert_eq!(
            p.check_address("example.com", 443, ip("10.9.2.3")),
            Err(Refusal::Denied)
        );
        // An address literal is allowed only by a range that holds it.
        assert_eq!(p.check_name("10.1.2.3", 22), Ok(()));
        assert_eq!(p.check_name("11.1.2.3", 22), Err(Refusal::NotAllowed));
        assert_eq!(
            p.check_address("11.1.2.3", 22, ip("11.1.2.3")),
            Err(Refusal::NotAllowed)
        );
        // Loopback with a port: only that port.
        let p = policy(&["127.0.0.1:8080"], &[]);
        assert_eq!(p.check_address("127.0.0.1", 8080, ip("127.0.0.1")), Ok(()));
        assert_eq!(p.check_name("127.0.0.1", 8081), Err(Refusal::NotAllowed));
    }

    #[test]
    fn a_grant_needs_both_the_tenants_and_the_sessions_policy() {
        let grant = Grant {
            tenant: Arc::new(policy(&["pypi", "example.com"], &[])),
            session: Some(Arc::new(policy(&["example.com", "other.com"], &[]))),
        };
        assert_eq!(grant.check_name("example.com", 443), Ok(()));
        assert_eq!(grant.check_name("pypi.org", 443), Err(Refusal::NotAllowed));
        assert_eq!(grant.check_name("other.com", 443), Err(Refusal::NotAllowed));
        let tenant_only = Grant {
            session: None,
            ..grant
        };
        assert_eq!(tenant_only.check_name("pypi.org", 443), Ok(()));
        assert!(Policy::default().is_none());
        assert_eq!(
            Grant::default().check_name("example.com", 443),
            Err(Refusal::NotAllowed)
        );
    }
}
