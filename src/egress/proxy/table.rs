//! The kernels the proxy serves, known by address and credential, and what it shares with its
//! owner.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::super::host::HostAddrs;
use super::super::policy::Grant;
use super::audit::{AuditFile, TenantCounters};
use super::interception::Interception;
use super::limits::{Bucket, Limits};
use super::lookup::DeniedNames;

/// One kernel the proxy serves.
pub struct KernelEntry {
    /// The credential in its proxy URL (`kernelbox:TOKEN`).
    pub token: String,
    /// The tenant its policy and counters are judged under.
    pub tenant: String,
    /// The session its own policy narrowing comes from.
    pub session: String,
    pub(super) grant: Mutex<Grant>,
    pub(super) connections: Arc<Semaphore>,
    pub(super) bucket: Arc<Bucket>,
    pub(super) live: Mutex<Vec<Live>>,
    pub(super) next_live: AtomicU64,
    /// Cancelled when the kernel goes: every connection of it ends.
    pub cancel: CancellationToken,
}

impl std::fmt::Debug for KernelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelEntry")
            .field("tenant", &self.tenant)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// A connection under way: where it goes, to be judged again when the policy changes, and
/// its bytes, counted in the usage ledger as they flow.
pub(super) struct Live {
    id: u64,
    host: String,
    port: u16,
    addr: IpAddr,
    special: Option<(IpAddr, u8)>,
    cancel: CancellationToken,
    bytes: Arc<ConnBytes>,
}

/// One connection's bytes so far, and how many of them the usage ledger has been given.
#[derive(Debug, Default)]
pub(super) struct ConnBytes {
    pub(super) bytes_in: Arc<AtomicU64>,
    pub(super) bytes_out: Arc<AtomicU64>,
    reported: Mutex<(u64, u64)>,
}

impl ConnBytes {
    /// The bytes in and out not yet given to the ledger, now marked given.
    pub(super) fn take_unreported(&self) -> (u64, u64) {
        let mut reported = self.reported.lock().unwrap_or_else(|p| p.into_inner());
        let now = (
            self.bytes_in.load(Ordering::Relaxed),
            self.bytes_out.load(Ordering::Relaxed),
        );
        let delta = (
            now.0.saturating_sub(reported.0),
            now.1.saturating_sub(reported.1),
        );
        *reported = now;
        delta
    }
}

impl KernelEntry {
    /// A kernel of `tenant`'s `session` under `grant`.
    pub fn new(
        token: String,
        tenant: String,
        session: String,
        grant: Grant,
        limits: &Limits,
    ) -> Self {
        KernelEntry {
            token,
            tenant,
            session,
            grant: Mutex::new(grant),
            connections: Arc::new(Semaphore::new(limits.connections_per_kernel)),
            bucket: Arc::new(Bucket::new(limits.bytes_per_second)),
            live: Mutex::new(Vec::new()),
            next_live: AtomicU64::new(0),
            cancel: CancellationToken::new(),
        }
    }

    pub(super) fn grant(&self) -> Grant {
        self.grant.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Applies `grant` at once: connections it no longer allows are closed. Returns how many.
    pub fn set_grant(&self, grant: Grant) -> usize {
        *self.grant.lock().unwrap_or_else(|p| p.into_inner()) = grant.clone();
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut closed = 0;
        for conn in live.iter() {
            let ok = grant.check_name(&conn.host, conn.port).is_ok()
                && grant
                    .check_address(&conn.host, conn.port, conn.addr, conn.special)
                    .is_ok();
            if !ok {
                conn.cancel.cancel();
                closed += 1;
            }
        }
        closed
    }

    pub(super) fn enter(
        self: &Arc<Self>,
        host: &str,
        port: u16,
        addr: IpAddr,
        special: Option<(IpAddr, u8)>,
        bytes: Arc<ConnBytes>,
    ) -> LiveGuard {
        let id = self.next_live.fetch_add(1, Ordering::Relaxed);
        let cancel = self.cancel.child_token();
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Live {
                id,
                host: host.to_string(),
                port,
                addr,
                special,
                cancel: cancel.clone(),
                bytes,
            });
        // The caller judges the connection again once it is listed here (a grant set while the
        // name resolved or the upstream connected did not see it: `docs/reliability.md`,
        // "Network egress").
        LiveGuard {
            entry: self.clone(),
            id,
            cancel,
        }
    }
}

/// Removes its connection from the kernel's live list when dropped.
pub(super) struct LiveGuard {
    entry: Arc<KernelEntry>,
    id: u64,
    pub(super) cancel: CancellationToken,
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.entry
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|l| l.id != self.id);
    }
}

/// What the proxy shares with its owner: the kernels it serves, the tenants' counters, where
/// audit lines go, and the egress network's own range (never a destination).
#[derive(Debug, Default)]
pub struct Table {
    kernels: Mutex<HashMap<IpAddr, Arc<KernelEntry>>>,
    counters: Mutex<HashMap<String, TenantCounters>>,
    pub(super) audit: Option<AuditFile>,
    pub(super) kernel_network: Option<(IpAddr, u8)>,
    pub(super) interception: Option<Arc<Interception>>,
    /// The host's own addresses and kernelbox's listeners (`docs/reliability.md`, "Special
    /// and host addresses").
    pub(super) host: HostAddrs,
    /// The addresses of names denied exactly (`docs/reliability.md`, "Deny by name").
    pub(super) denied_names: DeniedNames,
    /// Where each connection's bytes are counted for its session when it ends (the usage
    /// ledger, `docs/usage.md`), once the orchestrator has given it.
    pub(super) ledger: std::sync::OnceLock<Arc<crate::usage::Pending>>,
    /// The recent refusals (`refusals.rs`).
    pub refusals: super::Refusals,
}

impl Table {
    /// A table whose audit lines go to `audit` (else the log), refusing destinations in
    /// `kernel_network` (the egress network's subnet: base and prefix length).
    pub fn new(audit: Option<AuditFile>, kernel_network: Option<(IpAddr, u8)>) -> Table {
        Table {
            audit,
            kernel_network,
            ..Table::default()
        }
    }

    /// Counts each connection's bytes in `ledger` for its session (set once; later calls
    /// are ignored): what flowed so far at each [`Table::settle_usage`], the rest when it
    /// ends.
    pub fn count_usage_in(&self, ledger: Arc<crate::usage::Pending>) {
        let _ = self.ledger.set(ledger);
    }

    /// Writes the `--egress-audit` file's queued lines and pending counts and stops its writer
    /// (blocking): at shutdown, after the proxy stopped.
    pub fn close_audit(&self) {
        if let Some(file) = &self.audit {
            file.close();
        }
    }

    /// Gives the usage ledger the bytes every open connection moved since it was last asked,
    /// so a connection open across hours counts in each hour it moved bytes (to within the
    /// ledger's flush interval).
    pub fn settle_usage(&self) {
        let Some(ledger) = self.ledger.get() else {
            return;
        };
        let kernels: Vec<Arc<KernelEntry>> = self
            .kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for entry in kernels {
            let (mut inb, mut out) = (0, 0);
            for live in entry.live.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                let (i, o) = live.bytes.take_unreported();
                inb += i;
                out += o;
            }
            if inb > 0 || out > 0 {
                ledger.record(&entry.tenant, &entry.session, |r| {
                    r.network_bytes_in += inb;
                    r.network_bytes_out += out;
                });
            }
        }
    }

    /// Intercepts the connections a rule of `interception` names (`docs/reliability.md`,
    /// "Credentials at the boundary"); without it every tunnel carries its bytes untouched.
    pub fn with_interception(mut self, interception: Option<Arc<Interception>>) -> Table {
        self.interception = interception;
        self
    }

    /// Refuses `addrs` (kernelbox's own listening addresses) as destinations, whatever the
    /// policy.
    pub fn refuse_listeners(&self, addrs: &[std::net::SocketAddr]) {
        self.host.add_listeners(addrs);
    }

    /// Serves `entry` for connections from `addr` (replacing any earlier kernel there).
    pub fn insert(&self, addr: IpAddr, entry: Arc<KernelEntry>) {
        if let Some(old) = self
            .kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, entry)
        {
            old.cancel.cancel();
        }
    }

    /// Stops serving the kernel at `addr` (when it is `token`'s): its connections end.
    pub fn remove(&self, addr: IpAddr, token: &str) {
        let mut kernels = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if kernels.get(&addr).is_some_and(|e| e.token == token) {
            if let Some(e) = kernels.remove(&addr) {
                e.cancel.cancel();
            }
        }
    }

    /// The kernels of `tenant`'s `session`.
    pub fn of_session(&self, tenant: &str, session: &str) -> Vec<Arc<KernelEntry>> {
        self.kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|e| e.tenant == tenant && e.session == session)
            .cloned()
            .collect()
    }

    /// The interception of connections to credential rules' hosts, when there is one.
    pub fn interception(&self) -> Option<&Arc<Interception>> {
        self.interception.as_ref()
    }

    /// Every registered kernel.
    pub fn all(&self) -> Vec<Arc<KernelEntry>> {
        self.kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    pub(super) fn lookup(&self, addr: IpAddr) -> Option<Arc<KernelEntry>> {
        self.kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .cloned()
    }

    pub(super) fn count(&self, tenant: &str, f: impl FnOnce(&mut TenantCounters)) {
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        f(counters.entry(tenant.to_string()).or_default());
    }

    /// Every tenant's counters.
    pub fn counters(&self) -> Vec<(String, TenantCounters)> {
        let counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<_> = counters
            .iter()
            .map(|(t, c)| (t.clone(), c.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}
