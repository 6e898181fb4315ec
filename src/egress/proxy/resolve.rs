//! Judging and resolving a destination (`docs/reliability.md`, "Network egress"): the name
//! judged before any lookup (a name no name entry allows is never resolved), then every
//! address: the egress network, the host's own addresses and kernelbox's listeners refused
//! whatever the policy, special ranges only by an entry inside them, and the addresses of
//! names denied exactly refused to broad allowances.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::super::host::{canonical, HostAddrs};
use super::super::policy::{in_range, normalise_host, special_range, Grant, Refusal};
use super::limits::STEP_TIMEOUT;
use super::outcome::Outcome;
use super::table::Table;

/// Most addresses of one name the proxy considers (the first ones its lookup returned).
const MAX_ADDRS: usize = 16;

/// How long the addresses a denied name resolved to are used before it is looked up again.
pub const DENIED_NAME_TTL: Duration = Duration::from_secs(60);

/// Most denied names whose addresses are kept at once (all tenants and sessions together);
/// past it the names past their TTL, then the longest unrefreshed, are forgotten (looked up
/// again when next judged). One judgement's names (at most two policies' entries) always fit.
pub const MAX_DENIED_NAMES: usize = 4096;

/// The addresses names denied exactly resolved to, kept for [`DENIED_NAME_TTL`]; a failed
/// lookup keeps the last addresses known and is tried again after the same TTL.
#[derive(Debug, Default)]
pub(super) struct DeniedNames {
    names: Mutex<HashMap<String, (Instant, Vec<IpAddr>)>>,
}

impl DeniedNames {
    /// The addresses `names` resolve to (on `port`), each looked up again when older than
    /// [`DENIED_NAME_TTL`]; the lookups run together, each within the step timeout.
    async fn addresses(&self, names: &[String], port: u16) -> Vec<IpAddr> {
        let stale: Vec<String> = {
            let known = self.names.lock().unwrap_or_else(|p| p.into_inner());
            names
                .iter()
                .filter(|n| {
                    known
                        .get(*n)
                        .is_none_or(|(at, _)| at.elapsed() >= DENIED_NAME_TTL)
                })
                .cloned()
                .collect()
        };
        let looked = futures::future::join_all(stale.into_iter().map(|name| async move {
            let found = lookup(&name, port).await.ok();
            (name, found)
        }))
        .await;
        let mut known = self.names.lock().unwrap_or_else(|p| p.into_inner());
        // A name not resolved now keeps the last addresses known (none, the first time) and
        // is asked again after the same TTL: a failing lookup delays no more than one judgement
        // a minute.
        for (name, addrs) in looked {
            let slot = known
                .entry(name)
                .or_insert_with(|| (Instant::now(), Vec::new()));
            slot.0 = Instant::now();
            if let Some(addrs) = addrs {
                slot.1 = addrs.iter().map(|a| canonical(a.ip())).collect();
            }
        }
        // The answer is taken before anything is evicted: every name of this judgement counts,
        // however full the cache (`docs/reliability.md`, "Deny by name").
        let out = names
            .iter()
            .filter_map(|n| known.get(n))
            .flat_map(|(_, addrs)| addrs.iter().copied())
            .collect();
        evict(&mut known);
        out
    }
}

/// Brings `known` back to [`MAX_DENIED_NAMES`]: names past their TTL first, then the longest
/// unrefreshed (a judgement's own names, just refreshed, are the last to go).
fn evict(known: &mut HashMap<String, (Instant, Vec<IpAddr>)>) {
    if known.len() <= MAX_DENIED_NAMES {
        return;
    }
    known.retain(|_, (at, _)| at.elapsed() < DENIED_NAME_TTL);
    if known.len() <= MAX_DENIED_NAMES {
        return;
    }
    let mut ages: Vec<(Instant, String)> = known
        .iter()
        .map(|(name, (at, _))| (*at, name.clone()))
        .collect();
    ages.sort_unstable();
    let excess = known.len() - MAX_DENIED_NAMES;
    for (_, name) in ages.into_iter().take(excess) {
        known.remove(&name);
    }
}

/// The addresses `host` resolves to (at most [`MAX_ADDRS`]), within the step timeout.
async fn lookup(host: &str, port: u16) -> Result<Vec<SocketAddr>, Outcome> {
    let addrs: Vec<SocketAddr> =
        tokio::time::timeout(STEP_TIMEOUT, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| Outcome::ResolveFailed)?
            .map_err(|_| Outcome::ResolveFailed)?
            .take(MAX_ADDRS)
            .collect();
    if addrs.is_empty() {
        return Err(Outcome::ResolveFailed);
    }
    Ok(addrs)
}

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
