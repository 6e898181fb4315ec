//! [`Auditor`]: cells and commands hand it their records without waiting (a bounded queue,
//! [`AUDIT_QUEUE`]); one task writes them, in batches, off the runtime's threads, each line
//! chained to the one before (`chain.rs`). A file trail continues the chain of the file it
//! finds (after a restart) and of the file it rotates away; each batch is synced to disk. In a
//! file trail each tenant's lines take at most one file's worth of bytes per
//! [`AUDIT_TENANT_WINDOW`] (past it they are dropped and counted), so one tenant cannot rotate
//! the others' lines out; what is dropped or rotated away is counted ([`AuditStats`],
//! `kernelbox_audit_*` in `/metrics`, `docs/usage.md` "Audit trail").

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::chain::{last_line, line_hash};
use super::{AuditError, AuditRecord, AuditSink, AUDIT_QUEUE, AUDIT_TENANT_WINDOW, GENESIS};

/// Records taken from the queue per write.
const BATCH: usize = 256;

/// How long [`Auditor::close`] waits for the queue to be written.
const CLOSE_DEADLINE: Duration = Duration::from_secs(10);

/// What the trail lost or cut, since the server started (`kernelbox_audit_*` in `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditStats {
    /// Records dropped because the writer's queue was full.
    pub dropped_queue: u64,
    /// Records that could not be encoded or written.
    pub dropped_write: u64,
    /// Records dropped because their tenant was past its byte budget.
    pub dropped_budget: u64,
    /// Lines whose code was cut to [`super::AUDIT_CODE_BYTES`].
    pub code_truncated: u64,
    /// Files rotation deleted (the oldest kept one, when a new one was rotated in).
    pub rotated_out_files: u64,
    /// Bytes of the files rotation deleted.
    pub rotated_out_bytes: u64,
}

/// The counters behind [`AuditStats`].
#[derive(Debug, Default)]
struct Counters {
    dropped_queue: AtomicU64,
    dropped_write: AtomicU64,
    dropped_budget: AtomicU64,
    code_truncated: AtomicU64,
    rotated_out_files: AtomicU64,
    rotated_out_bytes: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    fn snapshot(&self) -> AuditStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        AuditStats {
            dropped_queue: get(&self.dropped_queue),
            dropped_write: get(&self.dropped_write),
            dropped_budget: get(&self.dropped_budget),
            code_truncated: get(&self.code_truncated),
            rotated_out_files: get(&self.rotated_out_files),
            rotated_out_bytes: get(&self.rotated_out_bytes),
        }
    }
}

/// The audit trail's handle. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Auditor {
    tx: mpsc::Sender<AuditRecord>,
    /// Records refused because the queue was full or a write failed, not yet reported.
    dropped: Arc<AtomicU64>,
    counters: Arc<Counters>,
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Auditor {
    /// Opens the trail (a file: its last line's hash continues the chain) and starts its
    /// writer on `tracker`.
    pub fn start(sink: AuditSink, tracker: &TaskTracker) -> Result<Auditor, AuditError> {
        let counters = Arc::new(Counters::default());
        let trail = Trail::open(sink, counters.clone())?;
        let (tx, rx) = mpsc::channel(AUDIT_QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let task = tracker.spawn(write_forever(trail, rx, dropped.clone(), stop.clone()));
        Ok(Auditor {
            tx,
            dropped,
            counters,
            stop,
            task: Mutex::new(Some(task)),
        })
    }

    /// Queues one record; never waits. A full queue (or a closed trail) drops it, and the next
    /// line written counts it in `dropped`.
    pub fn record(&self, record: AuditRecord) {
        if record.code_truncated == Some(true) {
            Counters::add(&self.counters.code_truncated, 1);
        }
        if self.tx.try_send(record).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            Counters::add(&self.counters.dropped_queue, 1);
        }
    }

    /// What the trail lost or cut so far.
    pub fn stats(&self) -> AuditStats {
        self.counters.snapshot()
    }

    /// Writes what is queued and stops the writer (at most [`CLOSE_DEADLINE`]). Idempotent.
    pub async fn close(&self) {
        self.stop.cancel();
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            if tokio::time::timeout(CLOSE_DEADLINE, task).await.is_err() {
                tracing::warn!("the audit trail's writer did not finish within {CLOSE_DEADLINE:?}");
            }
        }
    }
}

/// The writer: batches from the queue until `stop`, then what is left.
async fn write_forever(
    trail: Trail,
    mut rx: mpsc::Receiver<AuditRecord>,
    dropped: Arc<AtomicU64>,
    stop: CancellationToken,
) {
    let mut trail = Some(trail);
    loop {
        let mut batch = Vec::with_capacity(BATCH);
        let stopping = tokio::select! {
            n = rx.recv_many(&mut batch, BATCH) => n == 0,
            _ = stop.cancelled() => true,
        };
        if stopping {
            rx.close();
            while rx.recv_many(&mut batch, BATCH).await > 0 && batch.len() < AUDIT_QUEUE {}
        }
        // Closing, the tenants' last records dropped past their budgets are written too.
        if !batch.is_empty() || stopping {
            let Some(mut t) = trail.take() else { return };
            let missed = dropped.clone();
            let written = tokio::task::spawn_blocking(move || {
                let lost = t.write(batch, missed.swap(0, Ordering::Relaxed), stopping);
                (t, lost)
            })
            .await;
            match written {
                Ok((t, lost)) => {
                    dropped.fetch_add(lost, Ordering::Relaxed);
                    trail = Some(t);
                }
                Err(e) => {
                    tracing::error!(error = %e, "the audit trail's writer failed; no more records are written");
                    return;
                }
            }
        }
        if stopping {
            return;
        }
    }
}

/// One tenant's use of its byte budget in the current window.
#[derive(Debug)]
struct Budget {
    /// When the window began (the tenant's first line after the last one ended).
    since: Instant,
    /// Bytes of its lines written in the window.
    bytes: u64,
    /// Its records dropped since its last written line.
    dropped: u64,
    /// The last of them: written, saying how many were dropped before it, when the window
    /// ends or the trail closes, so the trail shows the gap even if the tenant never writes
    /// again (one record per audited tenant at most).
    last_dropped: Option<AuditRecord>,
}

/// The open trail: where lines go, and the hash the next one chains to.
struct Trail {
    sink: AuditSink,
    /// The open file (a file sink), and its size.
    file: Option<(File, u64)>,
    prev: String,
    /// Each audited tenant's budget (a file sink's; the tenants are the configured ones).
    budgets: HashMap<String, Budget>,
    /// How long a budget lasts ([`AUDIT_TENANT_WINDOW`]).
    window: Duration,
    counters: Arc<Counters>,
}

impl Trail {
    fn open(sink: AuditSink, counters: Arc<Counters>) -> Result<Trail, AuditError> {
        let mut trail = Trail {
            sink,
            file: None,
            prev: GENESIS.to_string(),
            budgets: HashMap::new(),
            window: AUDIT_TENANT_WINDOW,
            counters,
        };
        if let AuditSink::File { path, .. } = &trail.sink {
            let path = path.clone();
            let mut file = open_append(&path)?;
            let mut size = file
                .metadata()
                .map_err(|source| io("stat", &path, source))?
                .len();
            if let Some((line, ended)) = last_line(&path)? {
                trail.prev = line_hash(&line);
                if !ended {
                    // A line cut short (a crash mid-write) stays as evidence; the next starts
                    // on its own line, chained to it.
                    file.write_all(b"\n")
                        .map_err(|source| io("write", &path, source))?;
                    size += 1;
                }
            }
            trail.file = Some((file, size));
        }
        Ok(trail)
    }

    /// Writes `batch`, the first line carrying `missed` (records dropped before it); returns
    /// how many records could not be written (they are reported by the next line). First, the
    /// last record each tenant had dropped past its budget, for tenants whose window ended
    /// (all of them when `closing`): a tenant's gap is in the trail even if it never writes
    /// again.
    fn write(&mut self, batch: Vec<AuditRecord>, missed: u64, closing: bool) -> u64 {
        let now = Instant::now();
        let window = self.window;
        let mut owed = Vec::new();
        for used in self.budgets.values_mut() {
            if closing || now.saturating_duration_since(used.since) >= window {
                if let Some(record) = used.last_dropped.take() {
                    // It is written after all: not one of the dropped (nor counted as one).
                    used.dropped = used.dropped.saturating_sub(1);
                    owed.push(record);
                }
            }
        }
        owed.sort_by(|a, b| a.time.cmp(&b.time));
        let (lost, missed) = self.write_lines(owed, missed, true);
        let (more, missed) = self.write_lines(batch, missed, false);
        if let Some((file, _)) = &self.file {
            if let Err(e) = file.sync_data() {
                tracing::warn!(error = %e, "the audit trail could not be synced to disk");
            }
        }
        lost + more + missed
    }

    /// Appends `batch`'s lines (past their tenants' budgets unless `owed`: the one record
    /// kept of a tenant's dropped ones); how many could not be written, and `missed` still
    /// unreported.
    fn write_lines(&mut self, batch: Vec<AuditRecord>, mut missed: u64, owed: bool) -> (u64, u64) {
        let mut lost = 0;
        // A tenant's lines take at most one file's worth per window (a file sink only: standard
        // output is never rotated).
        let budget = match &self.sink {
            AuditSink::File { rotate_bytes, .. } => Some(*rotate_bytes),
            AuditSink::Stdout => None,
        };
        for mut record in batch {
            record.dropped = (missed > 0).then_some(missed);
            record.prev = self.prev.clone();
            let now = Instant::now();
            if budget.is_some() {
                let window = self.window;
                let used = self.budgets.entry(record.tenant.clone()).or_insert(Budget {
                    since: now,
                    bytes: 0,
                    dropped: 0,
                    last_dropped: None,
                });
                if now.saturating_duration_since(used.since) >= window {
                    used.since = now;
                    used.bytes = 0;
                }
                record.tenant_dropped = (used.dropped > 0).then_some(used.dropped);
            }
            let mut line = match serde_json::to_vec(&record) {
                Ok(line) => line,
                Err(e) => {
                    tracing::error!(error = %e, "an audit record could not be encoded");
                    Counters::add(&self.counters.dropped_write, 1);
                    lost += 1;
                    continue;
                }
            };
            let hash = line_hash(&line);
            line.push(b'\n');
            if let (Some(limit), Some(used)) = (budget, self.budgets.get_mut(&record.tenant)) {
                // The window's first line always goes (a line is far smaller than a file).
                if !owed && used.bytes > 0 && used.bytes + line.len() as u64 > limit {
                    used.dropped += 1;
                    // Counted once it is certain not to be written: when a later one takes
                    // its place as the one kept (the metric never goes down).
                    if used.last_dropped.replace(record).is_some() {
                        Counters::add(&self.counters.dropped_budget, 1);
                    }
                    continue;
                }
            }
            match self.append(&line) {
                Ok(()) => {
                    self.prev = hash;
                    missed = 0;
                    if let Some(used) = self.budgets.get_mut(&record.tenant) {
                        used.bytes += line.len() as u64;
                        used.dropped = 0;
                        // This line reports the gap; the one kept will not be written.
                        if used.last_dropped.take().is_some() {
                            Counters::add(&self.counters.dropped_budget, 1);
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "an audit record could not be written");
                    Counters::add(&self.counters.dropped_write, 1);
                    lost += 1;
                }
            }
        }
        (lost, missed)
    }

    fn append(&mut self, line: &[u8]) -> Result<(), AuditError> {
        let AuditSink::File {
            path,
            rotate_bytes,
            keep,
        } = &self.sink
        else {
            let mut out = std::io::stdout().lock();
            return out
                .write_all(line)
                .and_then(|()| out.flush())
                .map_err(|source| io("write", Path::new("-"), source));
        };
        let (path, rotate_bytes, keep) = (path.clone(), *rotate_bytes, *keep);
        if let Some((_, size)) = &self.file {
            if *size > 0 && size + line.len() as u64 > rotate_bytes {
                self.file = None;
                if let Some(removed) = rotate(&path, keep)? {
                    // Lines leave the trail: say so (`kernelbox audit verify` shows where the
                    // trail now starts).
                    tracing::info!(
                        bytes = removed,
                        "the audit trail's oldest file was rotated out"
                    );
                    Counters::add(&self.counters.rotated_out_files, 1);
                    Counters::add(&self.counters.rotated_out_bytes, removed);
                }
            }
        }
        if self.file.is_none() {
            self.file = Some((open_append(&path)?, 0));
        }
        if let Some((file, size)) = &mut self.file {
            file.write_all(line)
                .map_err(|source| io("write", &path, source))?;
            *size += line.len() as u64;
        }
        Ok(())
    }
}

/// `path` -> `path.1` -> ... -> `path.keep` (the oldest deleted); the size of the file deleted,
/// if one was.
fn rotate(path: &Path, keep: usize) -> Result<Option<u64>, AuditError> {
    let numbered = |n: usize| PathBuf::from(format!("{}.{n}", path.display()));
    let oldest = if keep == 0 {
        path.to_path_buf()
    } else {
        numbered(keep)
    };
    let size = match std::fs::metadata(&oldest) {
        Ok(meta) => Some(meta.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(io("rotate", &oldest, source)),
    };
    if keep == 0 {
        std::fs::remove_file(path).map_err(|source| io("rotate", path, source))?;
        return Ok(size);
    }
    match std::fs::remove_file(&oldest) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(io("rotate", &oldest, source)),
    }
    for n in (1..keep).rev() {
        match std::fs::rename(numbered(n), numbered(n + 1)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(io("rotate", &numbered(n), source)),
        }
    }
    std::fs::rename(path, numbered(1)).map_err(|source| io("rotate", path, source))?;
    Ok(size)
}

/// Opens `path` for appending, created readable by its owner only.
fn open_append(path: &Path) -> Result<File, AuditError> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| io("open", path, source))
}

fn io(op: &'static str, path: &Path, source: std::io::Error) -> AuditError {
    AuditError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{verify, AuditKind};
    use super::*;

    fn record(n: usize) -> AuditRecord {
        AuditRecord {
            time: "2026-01-01T00:00:00.000Z".into(),
            kind: AuditKind::Cell,
            tenant: "t".into(),
            session: format!("s{n}"),
            child: None,
            kernel: "k".into(),
            generation: 1,
            duration_seconds: 0.5,
            status: "success".into(),
            exit_code: None,
            code_sha256: AuditRecord::code_hash(b"x"),
            code: None,
            code_bytes: None,
            code_truncated: None,
            tenant_dropped: None,
            dropped: None,
            prev: String::new(),
        }
    }

    fn of(tenant: &str, n: usize) -> AuditRecord {
        AuditRecord {
            tenant: tenant.into(),
            ..record(n)
        }
    }

    /// Every line of the trail's files, oldest first, parsed.
    fn lines(files: &[PathBuf]) -> Vec<AuditRecord> {
        files
            .iter()
            .filter(|f| f.exists())
            .flat_map(|f| {
                std::fs::read_to_string(f)
                    .expect("read")
                    .lines()
                    .map(|l| serde_json::from_str(l).expect("a record"))
                    .collect::<Vec<AuditRecord>>()
            })
            .collect()
    }

    #[test]
    fn one_tenant_past_its_budget_is_dropped_and_counted_and_cannot_rotate_the_others_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let sink = AuditSink::File {
            path: path.clone(),
            rotate_bytes: 4_000,
            keep: 1,
        };
        let counters = Arc::new(Counters::default());
        let mut trail = Trail::open(sink, counters.clone()).expect("open");
        assert_eq!(
            trail.write((0..3).map(|n| of("good", n)).collect(), 0, false),
            0
        );
        // A flood: far more than a file's worth.
        assert_eq!(
            trail.write((0..200).map(|n| of("bad", n)).collect(), 0, false),
            0
        );
        assert_eq!(
            trail.write((3..6).map(|n| of("good", n)).collect(), 0, false),
            0
        );
        let files = [dir.path().join("audit.log.1"), path.clone()];
        let all = lines(&files);
        let good: Vec<&str> = all
            .iter()
            .filter(|r| r.tenant == "good")
            .map(|r| r.session.as_str())
            .collect();
        assert_eq!(good, ["s0", "s1", "s2", "s3", "s4", "s5"], "{all:#?}");
        let bad = all.iter().filter(|r| r.tenant == "bad").count();
        let stats = counters.snapshot();
        assert!(bad < 20, "{bad}");
        // The last one is kept, to be written when the window ends: not counted as dropped.
        assert_eq!(stats.dropped_budget, 199 - bad as u64, "{stats:?}");
        assert_eq!(stats.rotated_out_files, 0, "{stats:?}");
        verify(&files).expect("the chain holds over the dropped records");
        // A new window: first the tenant's last dropped record is written, saying how many
        // were dropped before it, then its next line.
        trail.window = Duration::ZERO;
        assert_eq!(trail.write(vec![of("bad", 999)], 0, false), 0);
        let written = lines(std::slice::from_ref(&path));
        let tail: Vec<(&str, Option<u64>)> = written[written.len() - 2..]
            .iter()
            .map(|r| (r.session.as_str(), r.tenant_dropped))
            .collect();
        assert_eq!(tail, [("s199", Some(199 - bad as u64)), ("s999", None)]);
        assert_eq!(counters.snapshot().dropped_budget, 199 - bad as u64);
        // Rotation past `keep` deletes the oldest file, and counts it.
        assert_eq!(
            trail.write((0..40).map(|n| of("good", n)).collect(), 0, false),
            0
        );
        let stats = counters.snapshot();
        assert!(stats.rotated_out_files >= 1, "{stats:?}");
        assert!(stats.rotated_out_bytes >= 1_000, "{stats:?}");
        verify(&files).expect("the chain holds across rotation");
    }

    #[test]
    fn a_tenant_past_its_budget_that_never_writes_again_has_its_gap_written_at_close() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let sink = AuditSink::File {
            path: path.clone(),
            rotate_bytes: 4_000,
            keep: 1,
        };
        let counters = Arc::new(Counters::default());
        let mut trail = Trail::open(sink, counters.clone()).expect("open");
        assert_eq!(
            trail.write((0..50).map(|n| of("bad", n)).collect(), 0, false),
            0
        );
        assert_eq!(trail.write(vec![of("good", 0)], 0, false), 0);
        let files = [dir.path().join("audit.log.1"), path.clone()];
        let kept = lines(&files).len() - 1;
        assert!(kept < 49, "{kept}");
        // Closing: the tenant's last record is written, with the count dropped before it.
        assert_eq!(trail.write(Vec::new(), 0, true), 0);
        let all = lines(&files);
        let last = all.last().expect("a line");
        assert_eq!(
            (
                last.tenant.as_str(),
                last.session.as_str(),
                last.tenant_dropped
            ),
            ("bad", "s49", Some(49 - kept as u64))
        );
        assert_eq!(counters.snapshot().dropped_budget, 49 - kept as u64);
        verify(&files).expect("the chain holds");
    }

    #[test]
    fn the_chain_continues_across_reopening_and_rotation_and_an_edit_breaks_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.log");
        let sink = AuditSink::File {
            path: path.clone(),
            rotate_bytes: 2_000,
            keep: 2,
        };
        let mut trail = Trail::open(sink.clone(), Arc::default()).expect("open");
        assert_eq!(trail.write((0..5).map(record).collect(), 3, false), 0);
        drop(trail);
        // A restart: the chain goes on from the file's last line.
        let mut trail = Trail::open(sink, Arc::default()).expect("reopen");
        assert_eq!(trail.write((5..12).map(record).collect(), 0, false), 0);
        let files = [dir.path().join("audit.log.1"), path.clone()];
        let all = verify(&files).expect("the chain holds across the rotation");
        assert!(all.lines >= 2, "{all:?}");
        assert!(
            !dir.path().join("audit.log.3").exists(),
            "at most `keep` rotated files"
        );
        let text = std::fs::read_to_string(&path).expect("read");
        // Editing one line (not the last) breaks the chain at the next.
        let edited = text.replacen("\"status\":\"success\"", "\"status\":\"error\"", 1);
        assert_ne!(edited, text);
        std::fs::write(&path, edited).expect("write");
        match verify(&[path]) {
            Err(AuditError::Broken { line: 2, .. }) => {}
            other => panic!("the edit was not found at line 2: {other:?}"),
        }
    }
}
