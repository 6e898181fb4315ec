//! Tenants' counters and the `--egress-audit` file (written by a thread of its own): rotated
//! like the cell audit trail (`FILE` -> `FILE.1` -> ... at [`AUDIT_ROTATE_BYTES`], at most
//! [`AUDIT_KEEP`] rotated files), repeated refusals collapsed into counted lines
//! ([`REPEAT_WINDOW`]).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Counters of one tenant (`kernelbox_egress_*` in `/metrics`).
#[derive(Debug, Default, Clone)]
pub struct TenantCounters {
    /// Bytes sent by kernels to destinations.
    pub bytes_out: u64,
    /// Bytes received from destinations.
    pub bytes_in: u64,
    /// Connections allowed.
    pub connections: u64,
    /// Names the proxy looked up for this tenant's kernels (only names a name entry allows
    /// are ever looked up).
    pub lookups: u64,
    /// Refusals and failures by reason.
    pub refusals: HashMap<&'static str, u64>,
}

/// Most audit lines waiting for the audit file's writer; past it a line goes to the log
/// instead (the proxy never waits on the disk).
pub const AUDIT_BACKLOG: usize = 4096;

/// The audit file is rotated (`FILE` -> `FILE.1`) when a line would take it past this size.
pub const AUDIT_ROTATE_BYTES: u64 = 64 * 1024 * 1024;

/// Rotated audit files kept (`FILE.1` .. `FILE.N`; the oldest is deleted).
pub const AUDIT_KEEP: usize = 5;

/// Refusals of one kernel's session to one destination for one reason within this window of
/// the first (which is written at once) are counted, and written as one line when it ends.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(10);

/// Destinations whose repeated refusals are being counted at once, at most; past it a refusal
/// of a new one is written as it comes.
pub const MAX_REPEAT_KEYS: usize = 4096;

/// Most bytes of a destination's host kept in an audit line (a DNS name's longest, 253, and
/// an IPv6 literal's brackets); a longer one (a request head may carry a 16 KiB one) is cut
/// and ends in `...`. Bounds the repeat table, the writer's backlog and the file's lines.
pub const MAX_AUDIT_HOST_BYTES: usize = 255;

/// `host` cut to [`MAX_AUDIT_HOST_BYTES`] (at a character boundary), `...` marking a cut.
pub(super) fn audit_host(host: &str) -> std::borrow::Cow<'_, str> {
    if host.len() <= MAX_AUDIT_HOST_BYTES {
        return host.into();
    }
    let mut end = MAX_AUDIT_HOST_BYTES;
    while !host.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &host[..end]).into()
}

/// One audit line: a connection allowed and ended, or a refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditLine {
    /// The kernel's tenant.
    pub tenant: String,
    /// The kernel's session.
    pub session: String,
    /// The destination's host (`-` when there was none).
    pub host: String,
    /// The destination's port.
    pub port: u16,
    /// Bytes sent to the destination.
    pub bytes_out: u64,
    /// Bytes received from it.
    pub bytes_in: u64,
    /// `allowed`, or why not ([`super::Outcome::name`]).
    pub outcome: &'static str,
}

type RepeatKey = (String, String, String, u16, &'static str);

/// Refusals counted since the first of their window.
#[derive(Debug)]
struct Repeat {
    /// When the window began (its first refusal, written at once).
    since: Instant,
    /// Its first refusal's time (Unix seconds).
    first: f64,
    /// The last counted refusal's time.
    last: f64,
    /// Refusals counted after the first.
    count: u64,
    bytes_out: u64,
    bytes_in: u64,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl AuditLine {
    fn json(&self, time: f64) -> serde_json::Value {
        serde_json::json!({
            "time": time,
            "tenant": self.tenant,
            "session": self.session,
            "host": self.host,
            "port": self.port,
            "bytes_out": self.bytes_out,
            "bytes_in": self.bytes_in,
            "outcome": self.outcome,
        })
    }

    fn key(&self) -> RepeatKey {
        (
            self.tenant.clone(),
            self.session.clone(),
            self.host.clone(),
            self.port,
            self.outcome,
        )
    }
}

/// The counted line of a window's repeats: `count` more refusals like the first, from `first`
/// to `time`.
fn repeat_line(key: &RepeatKey, r: &Repeat) -> String {
    let (tenant, session, host, port, outcome) = key;
    let mut value = AuditLine {
        tenant: tenant.clone(),
        session: session.clone(),
        host: host.clone(),
        port: *port,
        bytes_out: r.bytes_out,
        bytes_in: r.bytes_in,
        outcome,
    }
    .json(r.last);
    value["count"] = r.count.into();
    value["first"] = r.first.into();
    value.to_string() + "\n"
}

/// How the audit file is rotated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Rotated when a line would take the file past this size.
    pub bytes: u64,
    /// Rotated files kept.
    pub keep: usize,
}

impl Default for Rotation {
    fn default() -> Self {
        Rotation {
            bytes: AUDIT_ROTATE_BYTES,
            keep: AUDIT_KEEP,
        }
    }
}

/// Where audit lines go when `--egress-audit PATH` is given: one JSON line per connection
/// (repeated refusals collapsed), appended by a writer thread of its own.
#[derive(Debug)]
pub struct AuditFile {
    lines: SyncSender<Msg>,
    repeats: Arc<Mutex<HashMap<RepeatKey, Repeat>>>,
    window: Duration,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// What the writer is sent: a line, or the order to write every pending count and stop.
#[derive(Debug)]
enum Msg {
    Line(String),
    Close,
}

impl AuditFile {
    /// Opens `path` for appending (created if missing, readable by its owner only) and starts
    /// its writer, rotating at [`AUDIT_ROTATE_BYTES`] and collapsing over [`REPEAT_WINDOW`].
    pub fn open(path: &Path) -> std::io::Result<AuditFile> {
        AuditFile::open_with(path, Rotation::default(), REPEAT_WINDOW)
    }

    /// [`AuditFile::open`] with its rotation and repeat window given.
    pub fn open_with(
        path: &Path,
        rotation: Rotation,
        window: Duration,
    ) -> std::io::Result<AuditFile> {
        let out = Out::open(path, rotation)?;
        let (lines, rx) = std::sync::mpsc::sync_channel::<Msg>(AUDIT_BACKLOG);
        let repeats = Arc::new(Mutex::new(HashMap::new()));
        let writer = {
            let repeats = repeats.clone();
            std::thread::Builder::new()
                .name("kernelbox-egress-audit".into())
                .spawn(move || write_forever(out, rx, repeats, window))?
        };
        Ok(AuditFile {
            lines,
            repeats,
            window,
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Queues `line` (never waits): false when the writer's backlog is full (the caller logs
    /// it instead). A refusal like one written less than the repeat window ago is only
    /// counted, for the window's counted line. A host longer than [`MAX_AUDIT_HOST_BYTES`] is
    /// cut.
    pub fn record(&self, line: &AuditLine) -> bool {
        let time = unix_now();
        let cut;
        let line = match audit_host(&line.host) {
            std::borrow::Cow::Borrowed(_) => line,
            std::borrow::Cow::Owned(host) => {
                cut = AuditLine {
                    host,
                    ..line.clone()
                };
                &cut
            }
        };
        if line.outcome != "allowed" {
            let mut repeats = self.repeats.lock().unwrap_or_else(|p| p.into_inner());
            let key = line.key();
            if let Some(r) = repeats.get_mut(&key) {
                if r.since.elapsed() < self.window {
                    r.count += 1;
                    r.last = time;
                    r.bytes_out += line.bytes_out;
                    r.bytes_in += line.bytes_in;
                    return true;
                }
                // The window is over: its count first, then this refusal opens a new one.
                if r.count > 0 {
                    let _ = self.lines.try_send(Msg::Line(repeat_line(&key, r)));
                }
                repeats.remove(&key);
            }
            if repeats.len() < MAX_REPEAT_KEYS {
                repeats.insert(
                    key,
                    Repeat {
                        since: Instant::now(),
                        first: time,
                        last: time,
                        count: 0,
                        bytes_out: 0,
                        bytes_in: 0,
                    },
                );
            }
        }
        self.lines
            .try_send(Msg::Line(line.json(time).to_string() + "\n"))
            .is_ok()
    }

    /// Writes what is queued and every pending count, and stops the writer (blocking; the
    /// server's shutdown calls it, so that the counts of the last repeat windows are not lost).
    /// Lines recorded after it go to the log.
    pub fn close(&self) {
        let writer = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(writer) = writer {
            // Queued behind every line already sent; waits only for the writer to drain them.
            let _ = self.lines.send(Msg::Close);
            let _ = writer.join();
        }
    }
}

/// The file being written, its size and where it rotates.
struct Out {
    path: PathBuf,
    rotation: Rotation,
    file: Option<std::io::BufWriter<std::fs::File>>,
    size: u64,
}

impl Out {
    fn open(path: &Path, rotation: Rotation) -> std::io::Result<Out> {
        let file = open_append(path)?;
        let size = file.metadata()?.len();
        Ok(Out {
            path: path.to_path_buf(),
            rotation,
            file: Some(std::io::BufWriter::new(file)),
            size,
        })
    }

    fn write(&mut self, line: &str) {
        if let Err(e) = self.try_write(line) {
            tracing::warn!(path = %self.path.display(), error = %e, line = %line.trim_end(), "writing the egress audit file");
        }
    }

    fn try_write(&mut self, line: &str) -> std::io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > self.rotation.bytes {
            if let Some(mut file) = self.file.take() {
                file.flush()?;
            }
            rotate(&self.path, self.rotation.keep)?;
            self.size = 0;
        }
        if self.file.is_none() {
            let file = open_append(&self.path)?;
            self.size = file.metadata()?.len();
            self.file = Some(std::io::BufWriter::new(file));
        }
        if let Some(file) = &mut self.file {
            file.write_all(line.as_bytes())?;
            self.size += line.len() as u64;
        }
        Ok(())
    }

    fn flush(&mut self) {
        if let Some(file) = &mut self.file {
            if let Err(e) = file.flush() {
                tracing::warn!(path = %self.path.display(), error = %e, "flushing the egress audit file");
            }
        }
    }
}

/// The writer: lines as they come, the counted line of each repeat window once it is over,
/// and every pending count when the last sender (the proxy's table) is dropped.
fn write_forever(
    mut out: Out,
    rx: Receiver<Msg>,
    repeats: Arc<Mutex<HashMap<RepeatKey, Repeat>>>,
    window: Duration,
) {
    let tick = (window / 2).max(Duration::from_millis(10));
    let mut swept = Instant::now();
    loop {
        let ended = match rx.recv_timeout(tick) {
            Ok(msg) => {
                let mut batch = Some(msg);
                let mut closed = false;
                while let Some(msg) = batch {
                    match msg {
                        Msg::Line(line) => out.write(&line),
                        Msg::Close => {
                            closed = true;
                            break;
                        }
                    }
                    batch = rx.try_recv().ok();
                }
                closed
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => true,
        };
        if ended || swept.elapsed() >= tick {
            swept = Instant::now();
            let over: Vec<String> = {
                let mut repeats = repeats.lock().unwrap_or_else(|p| p.into_inner());
                let mut over = Vec::new();
                repeats.retain(|key, r| {
                    let keep = !ended && r.since.elapsed() < window;
                    if !keep && r.count > 0 {
                        over.push(repeat_line(key, r));
                    }
                    keep
                });
                over
            };
            for line in over {
                out.write(&line);
            }
        }
        out.flush();
        if ended {
            return;
        }
    }
}

/// `path` -> `path.1` -> ... -> `path.keep` (the oldest deleted), as the cell audit trail's.
fn rotate(path: &Path, keep: usize) -> std::io::Result<()> {
    let numbered = |n: usize| PathBuf::from(format!("{}.{n}", path.display()));
    let gone_is_fine = |r: std::io::Result<()>| match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    };
    if keep == 0 {
        return gone_is_fine(std::fs::remove_file(path));
    }
    gone_is_fine(std::fs::remove_file(numbered(keep)))?;
    for n in (1..keep).rev() {
        gone_is_fine(std::fs::rename(numbered(n), numbered(n + 1)))?;
    }
    std::fs::rename(path, numbered(1))
}

/// Opens `path` for appending, created readable by its owner only.
fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}
