//! [`Auditor`]: cells and commands hand it their records without waiting (a bounded queue,
//! [`AUDIT_QUEUE`]); one task writes them, in batches, off the runtime's threads, each line
//! chained to the one before (`chain.rs`). A file trail continues the chain of the file it
//! finds (after a restart) and of the file it rotates away; each batch is synced to disk.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::chain::{last_line, line_hash};
use super::{AuditError, AuditRecord, AuditSink, AUDIT_QUEUE, GENESIS};

/// Records taken from the queue per write.
const BATCH: usize = 256;

/// How long [`Auditor::close`] waits for the queue to be written.
const CLOSE_DEADLINE: Duration = Duration::from_secs(10);

/// The audit trail's handle. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct Auditor {
    tx: mpsc::Sender<AuditRecord>,
    /// Records refused because the queue was full or a write failed, not yet reported.
    dropped: Arc<AtomicU64>,
    stop: CancellationToken,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Auditor {
    /// Opens the trail (a file: its last line's hash continues the chain) and starts its
    /// writer on `tracker`.
    pub fn start(sink: AuditSink, tracker: &TaskTracker) -> Result<Auditor, AuditError> {
        let trail = Trail::open(sink)?;
        let (tx, rx) = mpsc::channel(AUDIT_QUEUE);
        let dropped = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let task = tracker.spawn(write_forever(trail, rx, dropped.clone(), stop.clone()));
        Ok(Auditor {
            tx,
            dropped,
            stop,
            task: Mutex::new(Some(task)),
        })
    }

    /// Queues one record; never waits. A full queue (or a closed trail) drops it, and the next
    /// line written counts it in `dropped`.
    pub fn record(&self, record: AuditRecord) {
        if self.tx.try_send(record).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
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
        if !batch.is_empty() {
            let Some(mut t) = trail.take() else { return };
            let missed = dropped.clone();
            let written = tokio::task::spawn_blocking(move || {
                let lost = t.write(batch, missed.swap(0, Ordering::Relaxed));
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

/// The open trail: where lines go, and the hash the next one chains to.
struct Trail {
    sink: AuditSink,
    /// The open file (a file sink), and its size.
    file: Option<(File, u64)>,
    prev: String,
}

impl Trail {
    fn open(sink: AuditSink) -> Result<Trail, AuditError> {
        let mut trail = Trail {
            sink,
            file: None,
            prev: GENESIS.to_string(),
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
    /// how many records could not be written (they are reported by the next line).
    fn write(&mut self, batch: Vec<AuditRecord>, mut missed: u64) -> u64 {
        let mut lost = 0;
        for mut record in batch {
            record.dropped = (missed > 0).then_some(missed);
            record.prev = self.prev.clone();
            let mut line = match serde_json::to_vec(&record) {
                Ok(line) => line,
                Err(e) => {
                    tracing::error!(error = %e, "an audit record could not be encoded");
                    lost += 1;
                    continue;
                }
            };
            let hash = line_hash(&line);
            line.push(b'\n');
            match self.append(&line) {
                Ok(()) => {
                    self.prev = hash;
                    missed = 0;
                }
                Err(e) => {
                    tracing::error!(error = %e, "an audit record could not be written");
                    lost += 1;
                }
            }
        }
        if let Some((file, _)) = &self.file {
            if let Err(e) = file.sync_data() {
                tracing::warn!(error = %e, "the audit trail could not be synced to disk");
            }
        }
        lost + missed
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
                rotate(&path, keep)?;
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

/// `path` -> `path.1` -> ... -> `path.keep` (the oldest deleted).
fn rotate(path: &Path, keep: usize) -> Result<(), AuditError> {
    let numbered = |n: usize| PathBuf::from(format!("{}.{n}", path.display()));
    if keep == 0 {
        return std::fs::remove_file(path).map_err(|source| io("rotate", path, source));
    }
    match std::fs::remove_file(numbered(keep)) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(io("rotate", &numbered(keep), source)),
    }
    for n in (1..keep).rev() {
        match std::fs::rename(numbered(n), numbered(n + 1)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(io("rotate", &numbered(n), source)),
        }
    }
    std::fs::rename(path, numbered(1)).map_err(|source| io("rotate", path, source))
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
            dropped: None,
            prev: String::new(),
        }
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
        let mut trail = Trail::open(sink.clone()).expect("open");
        assert_eq!(trail.write((0..5).map(record).collect(), 3), 0);
        drop(trail);
        // A restart: the chain goes on from the file's last line.
        let mut trail = Trail::open(sink).expect("reopen");
        assert_eq!(trail.write((5..12).map(record).collect(), 0), 0);
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
