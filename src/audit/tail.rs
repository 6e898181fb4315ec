//! The trail's tail (`docs/console.md`, "What happened lately"): the last records of its
//! current file, read backwards from its end at most [`TAIL_BYTES`], for `GET /v1/audit`.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use super::{AuditError, AuditRecord};

/// Bytes read from the end of the trail's file at most, for one tail.
pub const TAIL_BYTES: u64 = 4 * 1024 * 1024;

/// The tail of one file: its last records `keep` passes (at most `limit`, oldest first), the
/// bytes read, and whether they were the whole file.
#[derive(Debug, Default)]
pub struct Tail {
    /// The records, oldest first.
    pub records: Vec<AuditRecord>,
    /// Bytes read from the end.
    pub scanned: u64,
    /// The bytes read were the whole file.
    pub whole: bool,
}

/// The last at most `limit` records of `path` that `keep` passes, from its last [`TAIL_BYTES`]
/// (a line cut by that start is skipped, as is a line that does not parse). A missing file is
/// an empty tail (nothing was audited yet).
pub fn tail(
    path: &Path,
    limit: usize,
    keep: impl Fn(&AuditRecord) -> bool,
) -> Result<Tail, AuditError> {
    let io = |op: &'static str| {
        move |source| AuditError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Tail::default()),
        Err(e) => return Err(io("open")(e)),
    };
    let len = file.seek(SeekFrom::End(0)).map_err(io("seek"))?;
    let from = len.saturating_sub(TAIL_BYTES);
    file.seek(SeekFrom::Start(from)).map_err(io("seek"))?;
    let mut bytes = Vec::with_capacity((len - from) as usize);
    file.take(len - from)
        .read_to_end(&mut bytes)
        .map_err(io("read"))?;
    let mut lines = bytes.split(|b| *b == b'\n');
    if from > 0 {
        // The first line may have begun before the bytes read.
        lines.next();
    }
    let mut records: Vec<AuditRecord> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice::<AuditRecord>(l).ok())
        .filter(|r| keep(r))
        .collect();
    let cut = records.len().saturating_sub(limit);
    records.drain(..cut);
    Ok(Tail {
        records,
        scanned: bytes.len() as u64,
        whole: from == 0,
    })
}
