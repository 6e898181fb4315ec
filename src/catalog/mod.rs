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
//! still owed). Generations only grow. At most [`MAX_ENTRIES`] rows are kept: past that the
//! least recently changed rows that are not live go first.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};

use redb::{ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::cell::StateLost;

/// Rows kept at most (the registry remembers as many keys).
pub const MAX_ENTRIES: usize = 65_536;

/// The catalog file inside the state directory.
pub const FILE_NAME: &str = "catalog.redb";

/// Changes queued for the writer thread before new ones are dropped (and counted).
const QUEUE: usize = 8_192;

/// Changes applied in one transaction at most.
const BATCH: usize = 1_024;

/// What the catalog knows of one kernel key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// [`KernelKey::hash`](crate::owner::KernelKey::hash).
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

/// Why the catalog could not be opened, read or written; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The state directory could not be created or used.
    #[error("state directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The error.
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
        /// The error.
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
    /// Inserts or replaces a row (its `seq` changed: the old ordering slot goes).
    fn put(&mut self, old_seq: Option<u64>, row: &Row) -> Result<(), CatalogError>;
    fn remove(&mut self, row: &Row) -> Result<(), CatalogError>;
    fn len(&mut self) -> Result<usize, CatalogError>;
    fn next_seq(&mut self) -> Result<u64, CatalogError>;
    /// Rows in change order, oldest first; the first `limit` only when given.
    fn oldest(&mut self, limit: Option<usize>) -> Result<Vec<Row>, CatalogError>;
}

/// The rules of the module documentation, over any storage.
fn apply_changes(rows: &mut dyn Rows, changes: &[Change]) -> Result<(), CatalogError> {
    let mut seq = rows.next_seq()?;
    for change in changes {
        let mut write = |rows: &mut dyn Rows, old: Option<Row>, entry: Entry| {
            let row = Row { seq, entry };
            seq += 1;
            rows.put(old.map(|o| o.seq), &row)
        };
        match change {
            Change::Started {
                key_hash,
                tenant,
                owner,
                generation,
            } => {
                let old = rows.get(key_hash)?;
                let generation = old
                    .as_ref()
                    .map_or(*generation, |o| o.entry.generation.max(*generation));
                let entry = Entry {
                    key_hash: key_hash.clone(),
                    tenant: tenant.clone(),
                    owner: owner.clone(),
                    generation,
                    state: EntryState::Live,
                };
                write(rows, old, entry)?;
            }
            Change::Lost {
                key_hash,
                tenant,
                owner,
                generation,
                loss,
            } => {
                let old = rows.get(key_hash)?;
                let generation = old
                    .as_ref()
                    .map_or(*generation, |o| o.entry.generation.max(*generation));
                let entry = Entry {
                    key_hash: key_hash.clone(),
                    tenant: tenant.clone(),
                    owner: owner.clone(),
                    generation,
                    state: EntryState::Lost { loss: loss.clone() },
                };
                write(rows, old, entry)?;
            }
            Change::Ended { key_hash } => {
                if let Some(old) = rows.get(key_hash)? {
                    if old.entry.state == EntryState::Live {
                        let entry = Entry {
                            state: EntryState::Ended,
                            ..old.entry.clone()
                        };
                        write(rows, Some(old), entry)?;
                    }
                }
            }
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
            }
        }
    }
    let excess = rows.len()?.saturating_sub(MAX_ENTRIES);
    if excess == 0 {
        return Ok(());
    }
    // Read only as far as needed: live rows are skipped, so widen the scan until enough
    // others are found (or there are no more rows).
    let mut scan = excess + 16;
    loop {
        let candidates = rows.oldest(Some(scan))?;
        let exhausted = candidates.len() < scan;
        let doomed: Vec<Row> = candidates
            .into_iter()
            .filter(|r| r.entry.state != EntryState::Live)
            .take(excess)
            .collect();
        if doomed.len() == excess || exhausted {
            for row in &doomed {
                rows.remove(row)?;
            }
            return Ok(());
        }
        scan = scan.saturating_mul(2);
    }
}

/// The catalog in memory: for tests, and for library users who want the semantics without a
/// file.
#[derive(Debug, Default)]
pub struct MemoryCatalog {
    inner: Mutex<MemoryRows>,
}

#[derive(Debug, Default, Clone)]
struct MemoryRows {
    rows: HashMap<String, Row>,
    order: BTreeMap<u64, String>,
}

impl Rows for MemoryRows {
    fn get(&mut self, key_hash: &str) -> Result<Option<Row>, CatalogError> {
        Ok(self.rows.get(key_hash).cloned())
    }
    fn put(&mut self, old_seq: Option<u64>, row: &Row) -> Result<(), CatalogError> {
        if let Some(old) = old_seq {
            self.order.remove(&old);
        }
        self.order.insert(row.seq, row.entry.key_hash.clone());
        self.rows.insert(row.entry.key_hash.clone(), row.clone());
        Ok(())
    }
    fn remove(&mut self, row: &Row) -> Result<(), CatalogError> {
        self.order.remove(&row.seq);
        self.rows.remove(&row.entry.key_hash);
        Ok(())
    }
    fn len(&mut self) -> Result<usize, CatalogError> {
        Ok(self.rows.len())
    }
    fn next_seq(&mut self) -> Result<u64, CatalogError> {
        Ok(self.order.keys().next_back().map_or(0, |s| s + 1))
    }
    fn oldest(&mut self, limit: Option<usize>) -> Result<Vec<Row>, CatalogError> {
        Ok(self
            .order
            .values()
            .take(limit.unwrap_or(usize::MAX))
            .filter_map(|h| self.rows.get(h).cloned())
            .collect())
    }
}

impl Catalog for MemoryCatalog {
    fn load(&self) -> Result<Vec<Entry>, CatalogError> {
        let mut rows = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Ok(rows.oldest(None)?.into_iter().map(|r| r.entry).collect())
    }

    fn apply(&self, changes: &[Change]) -> Result<(), CatalogError> {
        let mut rows = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // All or nothing, as a transaction.
        let mut copy = rows.clone();
        apply_changes(&mut copy, changes)?;
        *rows = copy;
        Ok(())
    }
}

/// Key hash -> JSON [`Row`].
const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entries");
/// Change sequence -> key hash, for least-recently-changed order.
const ORDER: TableDefinition<u64, &str> = TableDefinition::new("order");

/// The first bytes of every redb file.
const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// The catalog in one redb file (`catalog.redb` in the state directory). redb holds an
/// exclusive lock on the file while it is open, so a second server on the same state
/// directory is refused ([`CatalogError::Locked`]); every commit is durable before it returns.
pub struct RedbCatalog {
    path: PathBuf,
    db: redb::Database,
}

impl std::fmt::Debug for RedbCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbCatalog")
            .field("path", &self.path)
            .finish()
    }
}

impl RedbCatalog {
    /// Opens (creating the directory, mode 0700, and the file as needed) the catalog in
    /// `state_dir`. Blocking.
    pub fn open(state_dir: &Path) -> Result<RedbCatalog, CatalogError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)
            .map_err(|source| CatalogError::Dir {
                path: state_dir.to_path_buf(),
                source,
            })?;
        let path = state_dir.join(FILE_NAME);
        check_magic(&path)?;
        // redb asserts on some malformed headers: a damaged file must be an error, not a
        // panic reaching the caller.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            redb::Database::create(&path)
        }));
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => {
                return Err(CatalogError::Locked { path })
            }
            Ok(Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(reason)))) => {
                return Err(CatalogError::Corrupt { path, reason })
            }
            Ok(Err(e)) => {
                return Err(CatalogError::Storage {
                    path,
                    operation: "opening",
                    reason: e.to_string(),
                })
            }
            Err(_) => {
                return Err(CatalogError::Corrupt {
                    path,
                    reason: "the file could not be read as a catalog".into(),
                })
            }
        };
        let catalog = RedbCatalog { path, db };
        // Create the tables once, so readers never meet a missing one.
        catalog.apply(&[])?;
        Ok(catalog)
    }

    /// The catalog file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn storage(&self, operation: &'static str) -> impl Fn(redb::Error) -> CatalogError + '_ {
        move |e| match e {
            redb::Error::Corrupted(reason) => CatalogError::Corrupt {
                path: self.path.clone(),
                reason,
            },
            e => CatalogError::Storage {
                path: self.path.clone(),
                operation,
                reason: e.to_string(),
            },
        }
    }
}

/// A non-empty file that does not start like a redb file is refused before redb sees it.
fn check_magic(path: &Path) -> Result<(), CatalogError> {
    use std::io::Read;
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(CatalogError::Storage {
                path: path.to_path_buf(),
                operation: "opening",
                reason: e.to_string(),
            })
        }
    };
    let mut head = Vec::with_capacity(REDB_MAGIC.len());
    (&mut file)
        .take(REDB_MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(|e| CatalogError::Storage {
            path: path.to_path_buf(),
            operation: "reading",
            reason: e.to_string(),
        })?;
    if !head.is_empty() && head != REDB_MAGIC {
        return Err(CatalogError::Corrupt {
            path: path.to_path_buf(),
            reason: "not a catalog file".into(),
        });
    }
    Ok(())
}

struct RedbRows<'t> {
    catalog: &'t RedbCatalog,
    entries: redb::Table<'t, &'static str, &'static [u8]>,
    order: redb::Table<'t, u64, &'static str>,
}

impl RedbRows<'_> {
    fn err(&self, operation: &'static str) -> impl Fn(redb::StorageError) -> CatalogError + '_ {
        let storage = self.catalog.storage(operation);
        move |e| storage(e.into())
    }

    fn decode(&self, bytes: &[u8]) -> Result<Row, CatalogError> {
        serde_json::from_slice(bytes).map_err(|e| CatalogError::Corrupt {
            path: self.catalog.path.clone(),
            reason: format!("a row does not decode: {e}"),
        })
    }
}

impl Rows for RedbRows<'_> {
    fn get(&mut self, key_hash: &str) -> Result<Option<Row>, CatalogError> {
        let found = self.entries.get(key_hash).map_err(self.err("reading"))?;
        found.map(|v| self.decode(v.value())).transpose()
    }

    fn put(&mut self, old_seq: Option<u64>, row: &Row) -> Result<(), CatalogError> {
        let bytes = serde_json::to_vec(row).map_err(|e| CatalogError::Storage {
            path: self.catalog.path.clone(),
            operation: "encoding",
            reason: e.to_string(),
        })?;
        let err = self.catalog.storage("writing");
        if let Some(old) = old_seq {
            self.order.remove(old).map_err(|e| err(e.into()))?;
        }
        self.order
            .insert(row.seq, row.entry.key_hash.as_str())
            .map_err(|e| err(e.into()))?;
        self.entries
            .insert(row.entry.key_hash.as_str(), bytes.as_slice())
            .map_err(|e| err(e.into()))?;
        Ok(())
    }

    fn remove(&mut self, row: &Row) -> Result<(), CatalogError> {
        let err = self.catalog.storage("removing");
        self.order.remove(row.seq).map_err(|e| err(e.into()))?;
        self.entries
            .remove(row.entry.key_hash.as_str())
            .map_err(|e| err(e.into()))?;
        Ok(())
    }

    fn len(&mut self) -> Result<usize, CatalogError> {
        let n = self.entries.len().map_err(self.err("counting"))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn next_seq(&mut self) -> Result<u64, CatalogError> {
        let last = self.order.last().map_err(self.err("reading"))?;
        Ok(last.map_or(0, |(k, _)| k.value() + 1))
    }

    fn oldest(&mut self, limit: Option<usize>) -> Result<Vec<Row>, CatalogError> {
        read_rows(self.catalog, &self.order, &self.entries, limit)
    }
}

fn read_rows(
    catalog: &RedbCatalog,
    order: &impl ReadableTable<u64, &'static str>,
    entries: &impl ReadableTable<&'static str, &'static [u8]>,
    limit: Option<usize>,
) -> Result<Vec<Row>, CatalogError> {
    let err = catalog.storage("reading");
    let mut rows = Vec::new();
    let ordered = order.iter().map_err(|e| err(e.into()))?;
    for item in ordered.take(limit.unwrap_or(usize::MAX)) {
        let (_, hash) = item.map_err(|e| err(e.into()))?;
        if let Some(bytes) = entries.get(hash.value()).map_err(|e| err(e.into()))? {
            let row: Row =
                serde_json::from_slice(bytes.value()).map_err(|e| CatalogError::Corrupt {
                    path: catalog.path.clone(),
                    reason: format!("a row does not decode: {e}"),
                })?;
            rows.push(row);
        }
    }
    Ok(rows)
}

impl Catalog for RedbCatalog {
    fn load(&self) -> Result<Vec<Entry>, CatalogError> {
        let err = self.storage("reading");
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let order = txn.open_table(ORDER).map_err(|e| err(e.into()))?;
        let entries = txn.open_table(ENTRIES).map_err(|e| err(e.into()))?;
        Ok(read_rows(self, &order, &entries, None)?
            .into_iter()
            .map(|r| r.entry)
            .collect())
    }

    fn apply(&self, changes: &[Change]) -> Result<(), CatalogError> {
        let err = self.storage("writing");
        let txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        {
            let mut rows = RedbRows {
                catalog: self,
                entries: txn.open_table(ENTRIES).map_err(|e| err(e.into()))?,
                order: txn.open_table(ORDER).map_err(|e| err(e.into()))?,
            };
            // An error drops the transaction uncommitted: all or nothing.
            apply_changes(&mut rows, changes)?;
        }
        txn.commit().map_err(|e| err(e.into()))
    }
}

/// Answers once a change is durable; dropped unanswered when it could not be written.
pub type Durable = tokio::sync::oneshot::Receiver<()>;

enum Msg {
    Change(Change, Option<tokio::sync::oneshot::Sender<()>>),
    /// Everything queued before it is applied; then the sender is answered.
    Flush(SyncSender<()>),
    /// Apply what is queued and stop.
    Close,
}

/// Feeds a [`Catalog`] from one dedicated thread. Recording never blocks: a change that does
/// not fit the bounded queue is dropped, logged and counted as a failure, as is a change the
/// catalog refused.
pub struct CatalogWriter {
    tx: Mutex<Option<SyncSender<Msg>>>,
    closed: AtomicBool,
    failures: Arc<AtomicU64>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for CatalogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogWriter")
            .field("failures", &self.failures())
            .finish_non_exhaustive()
    }
}

impl CatalogWriter {
    /// Starts the writer thread for `catalog`.
    pub fn start(catalog: Arc<dyn Catalog>) -> std::io::Result<CatalogWriter> {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let failures = Arc::new(AtomicU64::new(0));
        let counted = failures.clone();
        let thread = std::thread::Builder::new()
            .name("kernelbox-catalog".into())
            .spawn(move || write_forever(catalog.as_ref(), &rx, &counted))?;
        Ok(CatalogWriter {
            tx: Mutex::new(Some(tx)),
            closed: AtomicBool::new(false),
            failures,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues a change without blocking. After [`CatalogWriter::close`] changes are ignored.
    pub fn record(&self, change: Change) {
        self.send(change, None);
    }

    /// [`CatalogWriter::record`], and a receiver answered once the change is durable (it
    /// errs at once when the change was dropped or ignored, or later when the write failed).
    pub fn record_durable(&self, change: Change) -> Durable {
        let (ack, durable) = tokio::sync::oneshot::channel();
        self.send(change, Some(ack));
        durable
    }

    fn send(&self, change: Change, ack: Option<tokio::sync::oneshot::Sender<()>>) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = tx.as_ref() else { return };
        match tx.try_send(Msg::Change(change, ack)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("catalog queue full; a change was dropped");
            }
            Err(TrySendError::Disconnected(_)) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("catalog writer stopped; a change was dropped");
            }
        }
    }

    /// Changes dropped or refused so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Waits (blocking) until everything recorded so far is applied or has failed.
    pub fn flush(&self) {
        let (ack, done) = std::sync::mpsc::sync_channel(1);
        let sent = {
            let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
            tx.as_ref()
                .is_some_and(|tx| tx.send(Msg::Flush(ack)).is_ok())
        };
        if sent {
            let _ = done.recv();
        }
    }

    /// Applies everything queued, stops the thread and waits for it (blocking). Idempotent.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = tx {
            let _ = tx.send(Msg::Close);
        }
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// What one pass of the writer collected.
#[derive(Default)]
struct Batch {
    changes: Vec<Change>,
    durable: Vec<tokio::sync::oneshot::Sender<()>>,
    flushed: Vec<SyncSender<()>>,
}

fn write_forever(catalog: &dyn Catalog, rx: &Receiver<Msg>, failures: &AtomicU64) {
    let mut batch = Batch::default();
    loop {
        let mut close = false;
        match rx.recv() {
            Ok(msg) => close |= batch.take(msg),
            Err(_) => return,
        }
        while !close && batch.changes.len() < BATCH {
            match rx.try_recv() {
                Ok(msg) => close |= batch.take(msg),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    close = true;
                }
            }
        }
        if !batch.changes.is_empty() {
            match catalog.apply(&batch.changes) {
                Ok(()) => {
                    for ack in batch.durable.drain(..) {
                        let _ = ack.send(());
                    }
                }
                Err(e) => {
                    failures.fetch_add(batch.changes.len() as u64, Ordering::Relaxed);
                    tracing::warn!(error = %e, changes = batch.changes.len(), "catalog write failed");
                    batch.durable.clear();
                }
            }
            batch.changes.clear();
        }
        for ack in batch.flushed.drain(..) {
            let _ = ack.send(());
        }
        if close {
            return;
        }
    }
}

impl Batch {
    /// Sorts a message into the batch; true for `Close`.
    fn take(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Change(c, ack) => {
                self.changes.push(c);
                self.durable.extend(ack);
            }
            Msg::Flush(ack) => self.flushed.push(ack),
            Msg::Close => return true,
        }
        false
    }
}

#[cfg(test)]
mod tests;
