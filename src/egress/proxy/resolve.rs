//! Judging and resolving a destination (`docs/reliability.md`, "Network egress"): the name
//! judged before any lookup (a name no name entry allows is never resolved), then every
//! address: the egress network, the host's own addresses and kernelbox's listeners refused
//! whatever the policy, special ranges only by an entry inside them, and the addresses of
//! names denied exactly refused to broad allowances.

use std::net::{IpAddr, SocketAddr};

use super::super::host::{canonical, HostAddrs};
use super::super::policy::{in_range, normalise_host, special_range, Grant, Refusal};
use super::lookup::lookup;
use super::outcome::Outcome;
use super::table::Table;

/// One judged address: where to connect, and the special range it is in (a live connection
/// is judged again with it when the policy changes).
#[derive(Debug, Clone, Copy)]
pub(super) struct Judged {
    pub(super) addr: SocketAddr,
    pub(super) special: Option<(IpAddr, u8)>,
}

/// Judges `host:port` for a kernel of `tenant` under `grant` and resolves it: the address to
/// connect to. Nothing is looked up for a name the grant does not allow by a name entry.
pub(super) async fn judge(
    table: &Table,
    tenant: &str,
    grant: &Grant,
    host: &str,
    port: u16,
) -> Result<Judged, Outcome> {
    grant.check_name(host, port).map_err(Outcome::Refused)?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    // An address literal is judged as one (without its trailing dots, as the policy judged
    // it) and never handed to the resolver: `127.0.0.1.` is no reason for a lookup.
    let addrs: Vec<SocketAddr> = match normalise_host(host).parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => {
            table.count(tenant, |c| c.lookups += 1);
            lookup(bare, port).await?
        }
    };
    let interfaces = table.host.interfaces();
    let denied = grant.names_denied_by_address(host, port);
    let denied = if denied.is_empty() {
        Vec::new()
    } else {
        table.denied_names.addresses(&denied, port).await
    };
    let mut first = None;
    // Every address must pass: a name with one private address among public ones is refused.
    for addr in &addrs {
        let ip = canonical(addr.ip());
        if table
            .kernel_network
            .is_some_and(|(base, len)| in_range(ip, base, len))
        {
            return Err(Outcome::KernelNetwork);
        }
        if refused_on_host(&table.host, &interfaces, SocketAddr::new(ip, port)) {
            return Err(Outcome::HostAddress);
        }
        let special = special_range(ip, interfaces.networks());
        grant
            .check_address(host, port, ip, special)
            .map_err(Outcome::Refused)?;
        if denied.contains(&ip) {
            return Err(Outcome::Refused(Refusal::Denied));
        }
        first.get_or_insert(Judged {
            addr: SocketAddr::new(ip, port),
            special,
        });
    }
    first.ok_or(Outcome::ResolveFailed)
}

/// True for a destination refused whatever the policy: the unspecified address (it reaches
/// the host), an address of the host's interfaces other than loopback, and kernelbox's own
/// listening addresses (loopback included).
fn refused_on_host(
    host: &HostAddrs,
    interfaces: &super::super::host::Interfaces,
    dest: SocketAddr,
) -> bool {
    let ip = dest.ip();
    ip.is_unspecified()
        || (!ip.is_loopback() && interfaces.is_host(ip))
        || host.is_listener(dest, interfaces)
}
