//! The hash chain: each line's `prev` is the SHA-256 of the line before it (its bytes, without
//! the newline), so changing, inserting or removing a line breaks the chain at the next line.
//! What the chain cannot show alone: the last lines cut off the end (ship the trail to stdout
//! and a log store, or keep the last hash elsewhere, to anchor the tail; `docs/usage.md`).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{AuditError, AuditRecord, MAX_AUDIT_LINE};

/// The hex SHA-256 of one line (without its newline): the next line's `prev`.
pub fn line_hash(line: &[u8]) -> String {
    hex::encode(Sha256::digest(line))
}

/// What a verified trail holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Lines checked, over every file.
    pub lines: usize,
    /// The first line's `prev`: [`super::GENESIS`] for a trail's start, else the hash of the
    /// last line of the file rotated before the first one given.
    pub first_prev: String,
    /// The hash of the last line: the next line's `prev`.
    pub last_hash: String,
    /// The `time` of the first line: where the trail given starts (later than expected when
    /// rotation deleted older files).
    pub first_time: Option<String>,
    /// The `time` of the last line.
    pub last_time: Option<String>,
}

/// Checks the chain through `files`, given oldest first (`FILE.2 FILE.1 FILE`): every line a
/// record kernelbox writes, every `prev` the hash of the line before it (across files).
pub fn verify(files: &[PathBuf]) -> Result<Verified, AuditError> {
    let mut expected: Option<String> = None;
    let mut verified = Verified {
        lines: 0,
        first_prev: String::new(),
        last_hash: String::new(),
        first_time: None,
        last_time: None,
    };
    for path in files {
        let file = File::open(path).map_err(|source| AuditError::Io {
            op: "open",
            path: path.clone(),
            source,
        })?;
        let mut reader = BufReader::new(file);
        let mut line = Vec::new();
        for number in 1.. {
            line.clear();
            let read = (&mut reader)
                .take(MAX_AUDIT_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
                .map_err(|source| AuditError::Io {
                    op: "read",
                    path: path.clone(),
                    source,
                })?;
            if read == 0 {
                break;
            }
            let broken = |reason: String| AuditError::Broken {
                path: path.clone(),
                line: number,
                reason,
            };
            if line.pop() != Some(b'\n') {
                return Err(broken(if read > MAX_AUDIT_LINE {
                    format!("longer than {MAX_AUDIT_LINE} bytes")
                } else {
                    "it does not end with a newline: a partial line (a write cut short)".into()
                }));
            }
            let record: AuditRecord = serde_json::from_slice(&line)
                .map_err(|e| broken(format!("not an audit record: {e}")))?;
            match &expected {
                None => {
                    verified.first_prev = record.prev.clone();
                    verified.first_time = Some(record.time.clone());
                }
                Some(hash) if *hash != record.prev => {
                    return Err(broken(format!(
                        "its prev is {}, but the line before it hashes to {hash}: a line before \
                         it was edited, removed or inserted",
                        record.prev
                    )))
                }
                Some(_) => {}
            }
            let hash = line_hash(&line);
            verified.last_hash = hash.clone();
            verified.last_time = Some(record.time);
            expected = Some(hash);
            verified.lines += 1;
        }
    }
    Ok(verified)
}

/// The last line of `path` (without its newline) and whether it ended with one; `None` for an
/// empty file. Reads backwards from the end, at most [`MAX_AUDIT_LINE`] bytes.
pub(super) fn last_line(path: &Path) -> Result<Option<(Vec<u8>, bool)>, AuditError> {
    let io = |op: &'static str| {
        move |source| AuditError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut file = File::open(path).map_err(io("open"))?;
    let len = file.seek(SeekFrom::End(0)).map_err(io("seek"))?;
    if len == 0 {
        return Ok(None);
    }
    const CHUNK: u64 = 64 * 1024;
    // The bytes from `start` to the end, grown backwards until they hold a newline before
    // the last byte (or the whole file).
    let mut tail: Vec<u8> = Vec::new();
    let mut start = len;
    loop {
        let from = start.saturating_sub(CHUNK);
        let mut chunk = vec![0u8; (start - from) as usize];
        file.seek(SeekFrom::Start(from)).map_err(io("seek"))?;
        file.read_exact(&mut chunk).map_err(io("read"))?;
        chunk.extend_from_slice(&tail);
        tail = chunk;
        start = from;
        let body = &tail[..tail.len() - 1]; // the last byte may be the line's own newline
        if let Some(i) = memchr::memrchr(b'\n', body) {
            tail.drain(..=i);
            break;
        }
        if start == 0 {
            break;
        }
        if tail.len() > MAX_AUDIT_LINE {
            return Err(AuditError::Broken {
                path: path.to_path_buf(),
                line: 0,
                reason: format!("its last line is longer than {MAX_AUDIT_LINE} bytes"),
            });
        }
    }
    let ended = tail.last() == Some(&b'\n');
    if ended {
        tail.pop();
    }
    Ok(Some((tail, ended)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_line_is_found_across_chunks_and_without_a_newline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t");
        let long = "x".repeat(200_000);
        std::fs::write(&path, format!("a\n{long}\n")).expect("write");
        let (line, ended) = last_line(&path).expect("read").expect("a line");
        assert_eq!((line.len(), ended), (200_000, true));
        std::fs::write(&path, "a\nbc").expect("write");
        assert_eq!(
            last_line(&path).expect("read"),
            Some((b"bc".to_vec(), false))
        );
        std::fs::write(&path, "only\n").expect("write");
        assert_eq!(
            last_line(&path).expect("read"),
            Some((b"only".to_vec(), true))
        );
        std::fs::write(&path, "").expect("write");
        assert_eq!(last_line(&path).expect("read"), None);
    }
}
