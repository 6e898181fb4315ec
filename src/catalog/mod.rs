//! The durable owner catalog: which kernel keys had a live kernel, the last generation of each
//! key, and involuntary losses not yet reported, so that a restarted server can still tell
//! an owner that its state is gone (`state_lost: server_restarted`) and keep counting
//! generations.
//!
//! [`Catalog`] is the storage seam (a cross-host catalog would be another implementation);
//! [`RedbCatalog`] keeps it in one [redb](https://docs.rs/redb) file in the state directory,
//! [`MemoryCatalog`] in memory for tests. Both share the merge and bounding rules below.
//! [`CatalogWriter`] feeds changes to a catalog from one dedicated thread through a bounded
//! channel, in batches, so no write runs on the async runtime and a warm cell writes nothing.
//! A cold start's first result waits (at most one second) until the catalog confirms that
//! kernel's start, which it writes while the cell runs. A write that fails is logged and
//! counted, never reported to a caller.
//!
//! Rules: a key's row says `live` from its kernel's start, `lost` (with the loss) when the
//! kernel went without its owner asking, `ended` when it went on purpose. A start overwrites a
//! loss (the start is the call that reported it). An end never overwrites a loss (the loss is
//! still owed). Generations only grow. Rows are bounded per tenant and in all: a tenant keeps at
//! most [`MAX_ENTRIES_PER_TENANT`] rows, past which its own least recently changed rows that
//! are not live go first; and at most [`MAX_ENTRIES`] rows are kept in all, past which the
//! tenant holding the most rows gives up its least recently changed ones first. So a tenant
//! churning through session names pushes out only its own rows, never a loss owed to another
//! tenant (docs/http-api.md, "State across a server restart").
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | rows, changes, errors, the [`Catalog`] trait and the shared merge and bounding rules |
//! | `memory.rs` | [`MemoryCatalog`] |
//! | `redb_store.rs` | [`RedbCatalog`]: one redb file, exclusively locked |
//! | `writer.rs` | [`CatalogWriter`]: the dedicated writer thread, batches, durability answers |
//! | `tests.rs` | unit tests |

mod memory;
mod redb_store;
mod writer;

pub use memory::MemoryCatalog;
pub use redb_store::RedbCatalog;
pub use writer::{CatalogWriter, Durable};

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::cell::StateLost;
use crate::usage::UsageRow;

/// Rows kept at most (the registry remembers as many keys).
pub const MAX_ENTRIES: usize = 65_536;

/// Rows kept at most for one tenant (the registry remembers as many keys per tenant).
pub const MAX_ENTRIES_PER_TENANT: usize = 16_384;

/// The catalog file inside the state directory.
pub const FILE_NAME: &str = "catalog.redb";

/// Changes queued for the writer thread before new ones are dropped (and counted).
const QUEUE: usize = 8_192;

/// Changes applied in one transaction at most.
const BATCH: usize = 1_024;

/// What the catalog knows of one kernel key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// `KernelKey::hash` (in `src/owner.rs`).
    pub key_hash: String,
    /// The key's tenant.
    pub tenant: String,
    /// The key's owner (`session` or `session::child::id`).
    pub owner: String,
    /// The last generation started (or lost) for the key.
    pub generation: u64,
    /// Where the key's last kernel stands.
    pub state: EntryState,
}

/// Where a key's last kernel stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum EntryState {
    /// Running (as far as the catalog knows: after a crash, its server is gone).
    Live,
    /// Gone without its owner asking; the loss is reported on the owner's next call.
    Lost {
        /// The loss to report.
        loss: StateLost,
    },
    /// Gone on purpose (cleared, ended by `sys.exit`, reset); only the generation matters.
    Ended,
}

/// One change to the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A key's kernel started.
    Started {
        /// The key's hash.
        key_hash: String,
        /// The key's tenant.
        tenant: String,
        /// The key's owner.
        owner: String,
        /// The kernel's generation.
        generation: u64,
    },
    /// A key's kernel went without its owner asking.
    Lost {
        /// The key's hash.
        key_hash: String,
        /// The key's tenant.
        tenant: String,
        /// The key's owner.
        owner: String,
        /// The key's generation when it was lost.
        generation: u64,
        /// The loss to report.
        loss: StateLost,
    },
    /// A key's kernel went on purpose.
    Ended {
        /// The key's hash.
        key_hash: String,
    },
    /// Every live kernel is lost at once (the server stops or restarted).
    AllLiveLost {
        /// The loss to report for each.
        loss: StateLost,
    },
}

/// Why the catalog could not be opened, read or written; every variant names the file, or
/// the cluster's shared catalog (`src/cluster/`) and what it refused.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The state directory could not be created or used.
    #[error("state directory {path}: {source}")]
    Dir {
        /// The state directory (`Config::state_dir`).
        path: PathBuf,
        /// Why creating or using it failed.
        source: std::io::Error,
    },
    /// Another process (another kernelbox server) holds the catalog.
    #[error(
        "catalog {path} is in use by another kernelbox process; give each server its own \
         state directory"
    )]
    Locked {
        /// The catalog file.
        path: PathBuf,
    },
    /// The file is not a catalog, or is damaged.
    #[error(
        "catalog {path} is corrupt ({reason}); move it away to start with an empty catalog \
         (losses recorded in it would then go unreported)"
    )]
    Corrupt {
        /// The catalog file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// Reading or writing the catalog failed.
    #[error("catalog {path}: {operation}: {reason}")]
    Storage {
        /// The catalog file.
        path: PathBuf,
        /// What was being done.
        operation: &'static str,
        /// Why it failed (the store's error, as text).
        reason: String,
    },
    /// A cluster node's write was refused: the epoch it wrote for is no longer the node's
    /// current live one (docs/cluster.md, "Catalog schema"); nothing changed.
    #[error(
        "shared catalog: node {node} is fenced at epoch {epoch} (its lease expired or it \
         registered again); the write changed nothing"
    )]
    Fenced {
        /// The node whose write was refused.
        node: String,
        /// The epoch it wrote for.
        epoch: i64,
    },
    /// The cluster's shared catalog could not be written.
    #[error("shared catalog: {reason}")]
    Shared {
        /// Why (the store's error, naming the operation).
        reason: String,
    },
}

/// Where the catalog lives. Implementations apply [`Change`]s with the rules in the module
/// documentation; they are called from one writer thread and at start, never from the async
/// runtime's workers.
pub trait Catalog: Send + Sync + std::fmt::Debug {
    /// Every row, least recently changed first.
    fn load(&self) -> Result<Vec<Entry>, CatalogError>;
    /// Applies `changes` in order, atomically.
    fn apply(&self, changes: &[Change]) -> Result<(), CatalogError>;
    /// Adds `rows` to the usage ledger (each summed into the row of its tenant, session and
    /// hour) and removes rows of hours before `keep_from` (`docs/usage.md`, "The usage
    /// ledger"), atomically.
    fn add_usage(&self, rows: &[UsageRow], keep_from: u64) -> Result<(), CatalogError>;
    /// The ledger's rows of hours in `[from, to)`, of `tenant` only when given.
    fn usage(
        &self,
        tenant: Option<&str>,
        from: u64,
        to: u64,
    ) -> Result<Vec<UsageRow>, CatalogError>;
}

/// A row as stored: the entry and when it last changed.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    seq: u64,
    #[serde(flatten)]
    entry: Entry,
}

/// The storage operations the shared rules need, inside one transaction.
trait Rows {
    fn get(&mut self, key_hash: &str) -> Result<Option<Row>, CatalogError>;
    /// Inserts or replaces a row (its `seq` changed: the old row's ordering slots go).
    fn put(&mut self, old: Option<&Row>, row: &Row) -> Result<(), CatalogError>;
    fn remove(&mut self, row: &Row) -> Result<(), CatalogError>;
    fn len(&mut self) -> Result<usize, CatalogError>;
    fn next_seq(&mut self) -> Result<u64, CatalogError>;
    /// Rows in change order, oldest first; the first `limit` only when given.
    fn oldest(&mut self, limit: Option<usize>) -> Result<Vec<Row>, CatalogError>;
    /// One tenant's rows in change order, oldest first; the first `limit` only when given.
    fn oldest_of(&mut self, tenant: &str, limit: Option<usize>) -> Result<Vec<Row>, CatalogError>;
    /// How many rows one tenant has.
    fn tenant_len(&mut self, tenant: &str) -> Result<usize, CatalogError>;
    /// Every tenant with rows, and how many.
    fn tenant_counts(&mut self) -> Result<Vec<(String, usize)>, CatalogError>;
}

/// The rules of the module documentation, over any storage: each change written in order,
/// then each tenant that gained rows brought under its own bound, then all under
/// [`MAX_ENTRIES`].
fn apply_changes(rows: &mut dyn Rows, changes: &[Change]) -> Result<(), CatalogError> {
    let mut seq = rows.next_seq()?;
    for change in changes {
        apply_change(rows, change, &mut seq)?;
    }
    let touched: std::collections::BTreeSet<&str> = changes
        .iter()
        .filter_map(|change| match change {
            Change::Started { tenant, .. } | Change::Lost { tenant, .. } => Some(tenant.as_str()),
            Change::Ended { .. } | Change::AllLiveLost { .. } => None,
        })
        .collect();
    for tenant in touched {
        let excess = rows
            .tenant_len(tenant)?
            .saturating_sub(MAX_ENTRIES_PER_TENANT);
        if excess > 0 {
            remove_oldest(rows, tenant, excess)?;
        }
    }
    bound_all(rows)
}

/// Writes one change, each row it writes taking the next `seq`.
fn apply_change(rows: &mut dyn Rows, change: &Change, seq: &mut u64) -> Result<(), CatalogError> {
    let mut write = |rows: &mut dyn Rows, old: Option<Row>, entry: Entry| {
        let row = Row { seq: *seq, entry };
        *seq += 1;
        rows.put(old.as_ref(), &row)
    };
    match change {
        Change::Started {
            key_hash,
            tenant,
            owner,
            generation,
        }
        | Change::Lost {
            key_hash,
            tenant,
            owner,
            generation,
            ..
        } => {
            let old = rows.get(key_hash)?;
            // Generations only grow, whatever order the changes arrive in.
            let generation = old
                .as_ref()
                .map_or(*generation, |o| o.entry.generation.max(*generation));
            let state = match change {
                Change::Lost { loss, .. } => EntryState::Lost { loss: loss.clone() },
                _ => EntryState::Live,
            };
            let entry = Entry {
                key_hash: key_hash.clone(),
                tenant: tenant.clone(),
                owner: owner.clone(),
                generation,
                state,
            };
            write(rows, old, entry)
        }
        Change::Ended { key_hash } => match rows.get(key_hash)? {
            Some(old) if old.entry.state == EntryState::Live => {
                let entry = Entry {
                    state: EntryState::Ended,
                    ..old.entry.clone()
                };
                write(rows, Some(old), entry)
            }
            _ => Ok(()),
        },
        Change::AllLiveLost { loss } => {
            let live: Vec<Row> = rows
                .oldest(None)?
                .into_iter()
                .filter(|r| r.entry.state == EntryState::Live)
                .collect();
            for old in live {
                let entry = Entry {
                    state: EntryState::Lost { loss: loss.clone() },
                    ..old.entry.clone()
                };
                write(rows, Some(old), entry)?;
            }
            Ok(())
        }
    }
}

/// In all at most [`MAX_ENTRIES`] rows: the tenant holding the most rows gives up its oldest
/// first, so a tenant holding fewer than another never loses a row to the bound. Live rows
/// stay, even past it.
fn bound_all(rows: &mut dyn Rows) -> Result<(), CatalogError> {
    loop {
        let excess = rows.len()?.saturating_sub(MAX_ENTRIES);
        if excess == 0 {
            return Ok(());
        }
        let mut counts = rows.tenant_counts()?;
        counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let mut removed = 0;
        for (i, (tenant, held)) in counts.iter().enumerate() {
            // Down to one fewer than the next largest tenant at most, then look again.
            let next = counts.get(i + 1).map_or(0, |c| c.1);
            let want = excess.min(held.saturating_sub(next) + 1);
            removed = remove_oldest(rows, tenant, want)?;
            if removed > 0 {
                break;
            }
        }
        if removed == 0 {
            return Ok(());
        }
    }
}

/// Removes up to `n` of `tenant`'s least recently changed rows that are not live; returns how
/// many went.
fn remove_oldest(rows: &mut dyn Rows, tenant: &str, n: usize) -> Result<usize, CatalogError> {
    // Read only as far as needed: live rows are skipped, so widen the scan until enough
    // others are found (or there are no more rows).
    let mut scan = n + 16;
    loop {
        let candidates = rows.oldest_of(tenant, Some(scan))?;
        let exhausted = candidates.len() < scan;
        let doomed: Vec<Row> = candidates
            .into_iter()
            .filter(|r| r.entry.state != EntryState::Live)
            .take(n)
            .collect();
        if doomed.len() == n || exhausted {
            for row in &doomed {
                rows.remove(row)?;
            }
            return Ok(doomed.len());
        }
        scan = scan.saturating_mul(2);
    }
}

#[cfg(test)]
mod tests;
