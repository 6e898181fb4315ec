//! Network policies parsed and matched (`docs/reliability.md`, "Network egress"). A
//! [`Policy`] is one `{"allow", "deny"}` parsed once; [`Grant`] is what applies to one kernel:
//! its tenant's policy and, within it, its session's. A destination is judged twice: by the
//! name the kernel asked for (before resolving: only a name a name entry allows is ever
//! resolved), then by each address the proxy resolved it to. A special address (loopback,
//! private, link-local, the host's networks, ...) passes only an allow entry that lies inside
//! its special range, never a range that covers it wholesale (`docs/reliability.md`,
//! "Special and host addresses").

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

/// What an entry names: a host (exactly, or its subdomains), any name, or an address range.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// Any host name (`*`): never an address literal.
    AnyName,
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
    /// allow entry lying inside its special range names.
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

    /// The names denied exactly (deny entries `name` or `name:PORT` for `port`) whose
    /// addresses `host` must not reach: every such name, unless an allow entry naming `host`
    /// specifically (`host` or `*.parent`, not `*`) allows it. A destination allowed only
    /// broadly (an address range, or `*`) never reaches what a denied name resolves to
    /// (`docs/reliability.md`, "Deny by name").
    pub fn names_denied_by_address(&self, host: &str, port: u16) -> Vec<&str> {
        let host = normalise_host(host);
        let specific = host.parse::<IpAddr>().is_err()
            && self.allow.iter().any(|e| {
                port_matches(e, port)
                    && matches!(e.target, Target::Host(_) | Target::Subdomains(_))
                    && name_matches(&e.target, &host)
            });
        if specific {
            return Vec::new();
        }
        self.deny
            .iter()
            .filter(|e| port_matches(e, port))
            .filter_map(|e| match &e.target {
                Target::Host(name) => Some(name.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Judges the name (or address literal) a kernel asked for, before resolving: a name is
    /// allowed only by a name entry (`host`, `*.parent`, `*`), an address literal only by a
    /// range that holds it; refused when a deny entry names it. A name no name entry allows is
    /// refused here, so it is never looked up (an address range never makes a name resolved).
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
                    (Target::Range(..), None) => false,
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
    /// it; a special address (`special` is the narrowest special range holding it, see
    /// [`special_range`]) only when an allow range holds it **and** lies inside that special
    /// range (`127.0.0.1`, `127.0.0.0/8`, `10.1.0.0/16` do; `0.0.0.0/0` or `::/0` never); an
    /// ordinary one when the name was allowed by name or an allow range holds it.
    pub fn check_address(
        &self,
        host: &str,
        port: u16,
        ip: IpAddr,
        special: Option<(IpAddr, u8)>,
    ) -> Result<(), Refusal> {
        let host = normalise_host(host);
        let literal = host.parse::<IpAddr>().is_ok();
        let range_holds = |e: &Entry| {
            port_matches(e, port)
                && matches!(e.target, Target::Range(base, len) if in_range(ip, base, len))
        };
        if self.deny.iter().any(range_holds) {
            return Err(Refusal::Denied);
        }
        if let Some((block, block_len)) = special {
            let inside = |e: &Entry| {
                range_holds(e)
                    && matches!(e.target, Target::Range(base, len)
                        if len >= block_len && same_family(base, block) && in_range(base, block, block_len))
            };
            return if self.allow.iter().any(inside) {
                Ok(())
            } else {
                Err(Refusal::PrivateAddress)
            };
        }
        if self.allow.iter().any(range_holds) {
            return Ok(());
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
    pub fn check_address(
        &self,
        host: &str,
        port: u16,
        ip: IpAddr,
        special: Option<(IpAddr, u8)>,
    ) -> Result<(), Refusal> {
        self.tenant.check_address(host, port, ip, special)?;
        match &self.session {
            Some(s) => s.check_address(host, port, ip, special),
            None => Ok(()),
        }
    }

    /// [`Policy::names_denied_by_address`] under both policies (each policy's denied names,
    /// unless that policy allows `host` by a specific name).
    pub fn names_denied_by_address(&self, host: &str, port: u16) -> Vec<String> {
        let mut names: Vec<String> = self
            .tenant
            .names_denied_by_address(host, port)
            .into_iter()
            .map(String::from)
            .collect();
        if let Some(s) = &self.session {
            names.extend(
                s.names_denied_by_address(host, port)
                    .into_iter()
                    .map(String::from),
            );
        }
        names.sort();
        names.dedup();
        names
    }
}

/// Lower case, without a trailing dot or IPv6 brackets.
pub(crate) fn normalise_host(host: &str) -> String {
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
        Target::AnyName => host.parse::<IpAddr>().is_err(),
        Target::Range(..) => false,
    }
}

fn same_family(a: IpAddr, b: IpAddr) -> bool {
    a.is_ipv4() == b.is_ipv4()
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

/// The special ranges (`docs/reliability.md`, "Special and host addresses"): this network
/// (`0.0.0.0/8`), private, shared (CGNAT), loopback, link-local (the cloud metadata address
/// 169.254.169.254 among them), IETF protocol assignments, benchmarking, multicast, reserved
/// and broadcast; and for IPv6 unspecified, loopback, unique local, link-local, multicast,
/// NAT64 and 6to4. An IPv4-mapped IPv6 address is judged as its IPv4 address.
pub const SPECIAL_RANGES: [(&str, u8); 18] = [
    ("0.0.0.0", 8),
    ("10.0.0.0", 8),
    ("100.64.0.0", 10),
    ("127.0.0.0", 8),
    ("169.254.0.0", 16),
    ("172.16.0.0", 12),
    ("192.0.0.0", 24),
    ("192.168.0.0", 16),
    ("198.18.0.0", 15),
    ("224.0.0.0", 4),
    ("240.0.0.0", 4),
    ("::", 128),
    ("::1", 128),
    ("fc00::", 7),
    ("fe80::", 10),
    ("ff00::", 8),
    ("64:ff9b::", 96),
    ("2002::", 16),
];

/// The narrowest special range holding `ip`: one of [`SPECIAL_RANGES`] or of `networks` (the
/// networks the host's interfaces are on: Docker's bridges among them). `None` for an
/// ordinary address.
pub fn special_range(
    ip: IpAddr,
    networks: impl IntoIterator<Item = (IpAddr, u8)>,
) -> Option<(IpAddr, u8)> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    };
    SPECIAL_RANGES
        .iter()
        .filter_map(|(base, len)| base.parse::<IpAddr>().ok().map(|b| (b, *len)))
        .chain(networks)
        .filter(|(base, len)| same_family(ip, *base) && in_range(ip, *base, *len))
        .max_by_key(|(_, len)| *len)
        .map(|(base, len)| (mask(base, len), len))
}

/// `base` with the bits past `len` cleared.
fn mask(base: IpAddr, len: u8) -> IpAddr {
    match base {
        IpAddr::V4(v4) => {
            let m = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
            IpAddr::V4((u32::from(v4) & m).into())
        }
        IpAddr::V6(v6) => {
            let m = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
            IpAddr::V6((u128::from(v6) & m).into())
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
    if text == "*" {
        return Ok(Target::AnyName);
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

    /// [`Policy::check_address`] with the special range of `ip` among the static ones.
    fn judge(p: &Policy, host: &str, port: u16, ip: IpAddr) -> Result<(), Refusal> {
        p.check_address(host, port, ip, special_range(ip, []))
    }

    #[test]
    fn broad_ranges_never_reach_special_addresses_and_names_need_a_name_entry() {
        let all = policy(&["0.0.0.0/0", "::/0"], &[]);
        for special in [
            "127.0.0.1",
            "10.1.2.3",
            "169.254.169.254",
            "172.17.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert_eq!(all.check_name(special, 80), Ok(()), "{special}");
            assert_eq!(
                judge(&all, special, 80, ip(special)),
                Err(Refusal::PrivateAddress),
                "{special}"
            );
        }
        assert_eq!(
            judge(&all, "93.184.216.34", 80, ip("93.184.216.34")),
            Ok(())
        );
        // A range is never a reason to resolve a name.
        assert_eq!(
            all.check_name("data.attacker.example", 80),
            Err(Refusal::NotAllowed)
        );
        // `*` allows every name (and so their lookups), never an address literal.
        let names = policy(&["*", "127.0.0.1:8080"], &[]);
        assert_eq!(names.check_name("data.attacker.example", 80), Ok(()));
        assert_eq!(
            names.check_name("93.184.216.34", 80),
            Err(Refusal::NotAllowed)
        );
        assert_eq!(judge(&names, "a.example", 80, ip("93.184.216.34")), Ok(()));
        assert_eq!(
            judge(&names, "a.example", 80, ip("127.0.0.1")),
            Err(Refusal::PrivateAddress)
        );
        assert_eq!(judge(&names, "a.example", 8080, ip("127.0.0.1")), Ok(()));
        // Narrow ranges inside the special range pass; a wider one than it does not.
        for (entry, ok) in [
            ("127.0.0.0/8", true),
            ("127.0.0.1", true),
            ("127.0.0.0/24", true),
            ("126.0.0.0/7", false),
            ("0.0.0.0/1", false),
        ] {
            let p = policy(&[entry], &[]);
            assert_eq!(
                judge(&p, "127.0.0.1", 80, ip("127.0.0.1")).is_ok(),
                ok,
                "{entry}"
            );
        }
        // A network of the host's (a Docker bridge) is a special range of its own: the
        // private range around it is too wide.
        let bridge = (ip("172.18.0.0"), 16);
        assert_eq!(special_range(ip("172.18.0.5"), [bridge]), Some(bridge));
        let p = policy(&["172.16.0.0/12"], &[]);
        assert_eq!(
            p.check_address("172.18.0.5", 80, ip("172.18.0.5"), Some(bridge)),
            Err(Refusal::PrivateAddress)
        );
        let p = policy(&["172.18.0.0/16"], &[]);
        assert_eq!(
            p.check_address("172.18.0.5", 80, ip("172.18.0.5"), Some(bridge)),
            Ok(())
        );
    }

    #[test]
    fn a_denied_names_addresses_are_refused_to_broad_allowances_only() {
        let p = policy(
            &["0.0.0.0/0", "*", "www.example.com"],
            &[
                "secret.example.com",
                "*.hidden.example",
                "other.example:443",
            ],
        );
        // A literal address and a name allowed only by `*`: the denied names of that port.
        assert_eq!(
            p.names_denied_by_address("93.184.216.34", 80),
            ["secret.example.com"]
        );
        assert_eq!(
            p.names_denied_by_address("alias.attacker.example", 443),
            ["secret.example.com", "other.example"]
        );
        // A name the policy allows specifically: the operator chose it.
        assert!(p.names_denied_by_address("www.example.com", 80).is_empty());
        let grant = Grant {
            tenant: Arc::new(policy(&["*.example.com"], &[])),
            session: Some(Arc::new(policy(&["*"], &["secret.example.com"]))),
        };
        assert_eq!(
            grant.names_denied_by_address("www.example.com", 443),
            ["secret.example.com"]
        );
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
            judge(&p, "www.example.com", 443, ip("93.184.216.34")),
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
                judge(&p, "www.example.com", 443, ip(private)),
                Err(Refusal::PrivateAddress),
                "{private}"
            );
        }
        let p = policy(&["example.com", "10.0.0.0/8"], &["10.9.0.0/16"]);
        assert_eq!(judge(&p, "example.com", 443, ip("10.1.2.3")), Ok(()));
        assert_eq!(
            judge(&p, "example.com", 443, ip("10.9.2.3")),
            Err(Refusal::Denied)
        );
        // An address literal is allowed only by a range that holds it.
        assert_eq!(p.check_name("10.1.2.3", 22), Ok(()));
        assert_eq!(p.check_name("11.1.2.3", 22), Err(Refusal::NotAllowed));
        assert_eq!(
            judge(&p, "11.1.2.3", 22, ip("11.1.2.3")),
            Err(Refusal::NotAllowed)
        );
        // Loopback with a port: only that port.
        let p = policy(&["127.0.0.1:8080"], &[]);
        assert_eq!(judge(&p, "127.0.0.1", 8080, ip("127.0.0.1")), Ok(()));
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
