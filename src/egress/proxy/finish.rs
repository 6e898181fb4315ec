//! The accounting of one connection: its audit line (the log, or the `--egress-audit` file)
//! and its tenant's counters, when it is refused or when it ends.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use super::audit::AuditLine;
use super::outcome::Outcome;
use super::table::{ConnBytes, KernelEntry, LiveGuard, Table};

/// Writes the audit line of one connection.
pub(super) fn audit(
    table: &Table,
    entry: &KernelEntry,
    host: &str,
    port: u16,
    out: u64,
    inb: u64,
    outcome: Result<(), Outcome>,
) {
    let verdict = match outcome {
        Ok(()) => "allowed",
        Err(o) => o.name(),
    };
    if let Err(o) = outcome {
        table
            .refusals
            .push(&entry.tenant, &entry.session, host, port, o.name());
    }
    if let Some(file) = &table.audit {
        let line = AuditLine {
            tenant: entry.tenant.clone(),
            session: entry.session.clone(),
            host: host.to_string(),
            port,
            bytes_out: out,
            bytes_in: inb,
            outcome: verdict,
        };
        if file.record(&line) {
            return;
        }
        // A full backlog (or a writer gone): the line goes to the log below.
        tracing::warn!("the egress audit file's backlog is full; logging instead");
    }
    tracing::info!(
        target: "kernelbox::egress::audit",
        tenant = %entry.tenant,
        session = %entry.session,
        host = %super::audit::audit_host(host),
        port,
        bytes_out = out,
        bytes_in = inb,
        outcome = verdict,
        "egress connection"
    );
}

/// The permits one kernel connection holds: one of the proxy's total and one of its kernel's
/// (`--egress-connections`). Shared by the kernel's connection and what it became (a tunnel, a
/// forwarded request's upstream connection): released when the last of them ends.
pub(super) struct Permits {
    pub(super) _total: tokio::sync::OwnedSemaphorePermit,
    pub(super) _kernel: tokio::sync::OwnedSemaphorePermit,
}

/// Counts and audits one allowed connection when it ends.
pub(super) struct Finish {
    pub(super) entry: Arc<KernelEntry>,
    pub(super) table: Arc<Table>,
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) bytes: Arc<ConnBytes>,
    pub(super) outcome: Mutex<Result<(), Outcome>>,
    pub(super) _live: LiveGuard,
    pub(super) _permits: Arc<Permits>,
}

impl Finish {
    pub(super) fn fail(&self, outcome: Outcome) {
        *self.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Err(outcome);
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        let (inb, out) = (
            self.bytes.bytes_in.load(Ordering::Relaxed),
            self.bytes.bytes_out.load(Ordering::Relaxed),
        );
        let outcome = *self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ledger) = self.table.ledger.get() {
            // What the ledger was not given yet (`Table::settle_usage` gave the rest).
            let (unreported_in, unreported_out) = self.bytes.take_unreported();
            if unreported_in > 0 || unreported_out > 0 {
                ledger.record(&self.entry.tenant, &self.entry.session, |r| {
                    r.network_bytes_in += unreported_in;
                    r.network_bytes_out += unreported_out;
                });
            }
        }
        self.table.count(&self.entry.tenant, |c| {
            c.bytes_in += inb;
            c.bytes_out += out;
            match outcome {
                Ok(()) => c.connections += 1,
                Err(o) => *c.refusals.entry(o.name()).or_default() += 1,
            }
        });
        audit(
            &self.table,
            &self.entry,
            &self.host,
            self.port,
            out,
            inb,
            outcome,
        );
    }
}
