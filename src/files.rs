//! Files in and out of a kernel's working directory: the one check of a path's syntax
//! ([`FilePath`]), what the file operations return, and how a transfer fails
//! ([`TransferError`]; the orchestrator's `FileError` adds the kernel's absence and the
//! refusals of an execute).
//!
//! The host never resolves a path: the bytes travel through a small helper run inside the
//! kernel's container as the kernel's user (`runner/file_helper.py`, started by
//! `kernel/files/`), which walks every path one component at a time without following a
//! symlink. Why this transport, and the limits, are in docs/files.md "Files in and out of a kernel".

use bytes::Bytes;
use futures::stream::BoxStream;
use serde::Serialize;

use crate::config::WORK_DIR;
use crate::docker::EngineError;

/// Longest path accepted, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;

/// Longest name of one path component, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// Most entries a directory listing returns (`truncated` says when there were more).
pub const MAX_LIST_ENTRIES: usize = 10_000;

/// A stream of bytes going into a kernel (an upload's body).
pub type ByteStream = BoxStream<'static, Result<Bytes, std::io::Error>>;

/// A stream of bytes coming out of a kernel (a download); an error ends it.
pub type DownloadStream = BoxStream<'static, Result<Bytes, TransferError>>;

/// A path relative to the kernel's working directory, checked for syntax: no absolute path,
/// no `.` or `..` component, no NUL, bounded lengths. Empty components (`a//b`, a trailing
/// `/`) are dropped; the empty path is the working directory itself. Parsed once, where a
/// path enters (an HTTP handler, an MCP tool's arguments, a command line), and passed on
/// checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePath {
    /// The path as given (shown in messages and sent on to a server as it was written).
    text: String,
    parts: Vec<String>,
}

impl FilePath {
    /// Checks a path; the one place its syntax is checked.
    pub fn parse(path: &str) -> Result<FilePath, TransferError> {
        let refuse = |reason: &str| TransferError::InvalidPath {
            path: path.chars().take(256).collect(),
            reason: reason.to_string(),
        };
        if path.len() > MAX_PATH_BYTES {
            return Err(refuse("longer than 4096 bytes"));
        }
        if path.starts_with('/') {
            return Err(refuse(
                "absolute paths are refused; paths are relative to the working directory",
            ));
        }
        if path.contains('\0') {
            return Err(refuse("contains a NUL byte"));
        }
        let mut parts = Vec::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if part == "." || part == ".." {
                return Err(refuse("`.` and `..` components are refused"));
            }
            if part.len() > MAX_NAME_BYTES {
                return Err(refuse("a component is longer than 255 bytes"));
            }
            parts.push(part.to_string());
        }
        Ok(FilePath {
            text: path.to_string(),
            parts,
        })
    }

    /// The path as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The path's components, in order (none for the working directory itself).
    pub fn parts(&self) -> &[String] {
        &self.parts
    }

    /// The working directory itself.
    pub fn root() -> FilePath {
        FilePath {
            text: String::new(),
            parts: Vec::new(),
        }
    }

    /// True for the working directory itself.
    pub fn is_root(&self) -> bool {
        self.parts.is_empty()
    }

    /// The path inside the kernel, e.g. `/work/data/x.csv`.
    pub fn in_kernel(&self) -> String {
        let mut path = WORK_DIR.to_string();
        for part in &self.parts {
            path.push('/');
            path.push_str(part);
        }
        path
    }
}

impl std::fmt::Display for FilePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// What an upload wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Written {
    /// Where, inside the kernel (`/work/...`).
    pub path: String,
    /// Bytes written (for a tar: the files' bytes).
    pub size: u64,
    /// Files extracted, for a tar upload.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub files: Option<u64>,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct FileEntry {
    /// The entry's name within the directory (no path).
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[schemars(extend("enum" = ["file", "dir", "symlink", "other"]))]
    pub kind: String,
    /// Size in bytes (of the link itself for a symlink).
    pub size: u64,
    /// Last modification, RFC 3339 UTC.
    #[schemars(extend("format" = "date-time"))]
    pub modified: String,
}

/// A file operation a helper answers with its status alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOp {
    /// The entry of a name (a symlink not followed).
    Stat,
    /// A directory, its parents made; whether it was made (false: it was there).
    MakeDir,
    /// A rename to this path (its parents made; a file there replaced).
    Move(FilePath),
}

/// What a [`FileOp`] answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOpDone {
    /// A stat's entry.
    Entry(FileEntry),
    /// Whether a mkdir made the directory.
    Created(bool),
    /// A move was done.
    Moved,
}

/// A directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Listing {
    /// Entries by name (at most [`MAX_LIST_ENTRIES`]).
    pub entries: Vec<FileEntry>,
    /// True when the directory holds more entries than were listed.
    pub truncated: bool,
}

/// What a read found.
pub enum Download {
    /// A regular file: exactly `size` bytes follow on `body`.
    File {
        /// How many bytes `body` carries.
        size: u64,
        /// The file's bytes; an error ends the stream (the download is then incomplete).
        body: DownloadStream,
    },
    /// A directory, listed.
    Dir(Listing),
    /// A directory, as a tar stream (regular files, directories and symlinks as links).
    Tar {
        /// The tar archive's bytes; an error ends the stream.
        body: DownloadStream,
    },
}

impl std::fmt::Debug for Download {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Download::File { size, .. } => write!(f, "Download::File({size} bytes)"),
            Download::Dir(listing) => write!(f, "Download::Dir({listing:?})"),
            Download::Tar { .. } => write!(f, "Download::Tar"),
        }
    }
}

/// A file transfer that failed; names what went wrong.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The path's syntax is refused (absolute, `..`, too long).
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath {
        /// The path as given (shortened).
        path: String,
        /// What about the path is refused.
        reason: String,
    },
    /// The kernel refused the path or the content: a symlink on the way, not a directory,
    /// a directory where a file was expected, a tar member that is a link or escapes.
    #[error("{message}")]
    Refused {
        /// Stable code: `symlink`, `not_a_directory`, `is_a_directory`, `not_a_file`,
        /// `tar_member_refused`, `invalid_tar`, `invalid_path`.
        code: &'static str,
        /// What the kernel said.
        message: String,
    },
    /// Nothing at that path.
    #[error("{0}")]
    NotFound(String),
    /// The upload passed the cap; nothing was written.
    #[error("uploads are limited to {cap} bytes; nothing was written")]
    TooLarge {
        /// The cap in bytes.
        cap: u64,
    },
    /// The working directory is full; nothing was written.
    #[error("the kernel's working directory is full; nothing was written")]
    NoSpace,
    /// The upload's body failed or ended early; nothing was written.
    #[error("reading the upload failed: {0}; nothing was written")]
    Body(String),
    /// No progress within the transfer's idle deadline.
    #[error("the file transfer made no progress for {0:?}; nothing was written")]
    Stalled(std::time::Duration),
    /// The download was read slower than `Config::files.download_min_rate`; it was cut and its
    /// kernel released.
    #[error("the download was read slower than {0} bytes/s; it was cut")]
    TooSlow(u64),
    /// The engine failed during the transfer.
    #[error("file transfer: {0}")]
    Engine(#[from] EngineError),
    /// The helper inside the kernel failed or broke its protocol.
    #[error("the file helper in the kernel failed: {0}")]
    Helper(String),
}

impl TransferError {
    /// The error for a helper's status code and message.
    pub(crate) fn from_helper(code: &str, message: String) -> TransferError {
        let refused = |code| TransferError::Refused {
            code,
            message: message.clone(),
        };
        match code {
            "not_found" => TransferError::NotFound(message),
            "no_space" => TransferError::NoSpace,
            "symlink" => refused("symlink"),
            "not_a_directory" => refused("not_a_directory"),
            "is_a_directory" => refused("is_a_directory"),
            "not_a_file" => refused("not_a_file"),
            "tar_member_refused" => refused("tar_member_refused"),
            "invalid_tar" => refused("invalid_tar"),
            "invalid_path" => refused("invalid_path"),
            "larger_than_disk" => refused("larger_than_disk"),
            "aborted" => TransferError::Body(message),
            _ => TransferError::Helper(format!("{code}: {message}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_relative_plain_names() {
        assert_eq!(FilePath::parse("a/b.txt").unwrap().parts(), ["a", "b.txt"]);
        assert_eq!(FilePath::parse("a//b/").unwrap().in_kernel(), "/work/a/b");
        assert!(FilePath::parse("").unwrap().is_root());
        for bad in ["/etc/passwd", "..", "a/../../x", "./a", "a/./b", "a\0b"] {
            assert!(
                matches!(FilePath::parse(bad), Err(TransferError::InvalidPath { .. })),
                "{bad:?} was accepted"
            );
        }
        assert!(FilePath::parse(&"x".repeat(256)).is_err());
        assert!(FilePath::parse(&"a/".repeat(2100)).is_err());
    }
}
