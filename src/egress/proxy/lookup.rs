//! Names and their addresses (`docs/reliability.md`, "Deny by name"): one bounded lookup,
//! and the cache of the addresses names denied exactly resolved to.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::super::host::canonical;
use super::limits::STEP_TIMEOUT;
use super::outcome::Outcome;

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
    pub(super) async fn addresses(&self, names: &[String], port: u16) -> Vec<IpAddr> {
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
pub(super) async fn lookup(host: &str, port: u16) -> Result<Vec<SocketAddr>, Outcome> {
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
