//! Who a kernel belongs to, and the key that names one kernel.

use std::collections::BTreeSet;
use std::fmt;

use sha2::{Digest, Sha256};

use crate::config::{KernelRuntime, WorkMode};
use crate::wire::Context;

/// Longest session, child or tenant name accepted.
pub const MAX_NAME_LEN: usize = 128;

/// A session, child or tenant name that could break labels, keys or paths.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "invalid {what} name {name:?}: use 1-{MAX_NAME_LEN} of A-Z a-z 0-9 . _ - @ : (no \"::\"; not \".\" or \"..\")"
)]
pub struct NameError {
    /// Which name was refused: `session`, `child`, `tenant` or `context`.
    pub what: &'static str,
    /// The name as given (shortened).
    pub name: String,
}

/// Checks a name used in owners and labels. `.` and `..` are refused: in a URL path they
/// are the segments a client or proxy may resolve away, so `/v1/sessions/../execute` would
/// not be the session it names (docs/http-api.md, "Endpoints").
pub fn validate_name(what: &'static str, name: &str) -> Result<(), NameError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name != "."
        && name != ".."
        && !name.contains("::")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@' | b':'));
    if ok {
        Ok(())
    } else {
        Err(NameError {
            what,
            name: name.chars().take(MAX_NAME_LEN + 8).collect(),
        })
    }
}

/// The owner of a kernel: a tenant's session, or a delegated child of one.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct Owner {
    /// Namespace of the owner; tenants never see each other's kernels.
    pub tenant: String,
    /// The session (one agent conversation) within the tenant.
    pub session: String,
    /// The delegated sub-agent, when the call comes from one.
    pub child: Option<String>,
}

impl Owner {
    /// Validates and builds an owner.
    pub fn new(tenant: &str, session: &str, child: Option<&str>) -> Result<Owner, NameError> {
        validate_name("tenant", tenant)?;
        validate_name("session", session)?;
        if let Some(child) = child {
            validate_name("child", child)?;
        }
        Ok(Owner {
            tenant: tenant.to_string(),
            session: session.to_string(),
            child: child.map(str::to_string),
        })
    }

    /// True for a delegated child's owner: its kernels are pinned past the LRU cap.
    pub fn is_child(&self) -> bool {
        self.child.is_some()
    }
}

impl fmt::Display for Owner {
    /// `session` or `session::child::child_id`, as the `io.kernelbox.owner` label names owners.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.child {
            None => write!(f, "{}", self.session),
            Some(child) => write!(f, "{}::child::{}", self.session, child),
        }
    }
}

/// The root session of an owner as [`Owner`]'s `Display` writes it (`session` or
/// `session::child::id`): the part before the first `::` (names never hold `::`).
pub(crate) fn root_session(owner: &str) -> &str {
    owner.split("::").next().unwrap_or(owner)
}

/// One kernel per key: (owner, mode, image, working dir, sorted tool set).
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct KernelKey {
    /// Who the kernel belongs to.
    pub owner: Owner,
    /// Strict or project mode (project mode names the directory).
    pub mode: WorkMode,
    /// Image the kernel runs.
    pub image: String,
    /// Tools the kernel's cells may call, sorted.
    pub tools: BTreeSet<String>,
    /// The OCI runtime the kernel runs under (its tenant's, else the server's).
    pub runtime: KernelRuntime,
    /// Which of the owner's kernels: its context, a name and a language (the default Python
    /// context when absent from a stored key, which every key written before languages is).
    #[serde(default)]
    pub context: Context,
}

impl KernelKey {
    /// A stable short hash of the key, used in labels.
    pub fn hash(&self) -> String {
        let mut h = Sha256::new();
        h.update(self.owner.tenant.as_bytes());
        h.update([0]);
        h.update(self.owner.to_string().as_bytes());
        h.update([0]);
        h.update(self.mode.name().as_bytes());
        if let WorkMode::Project(dir) = &self.mode {
            h.update(dir.to_string_lossy().as_bytes());
        }
        h.update([0]);
        h.update(self.image.as_bytes());
        for tool in &self.tools {
            h.update([0]);
            h.update(tool.as_bytes());
        }
        // runc kernels keep the hashes they had before runtimes were a choice.
        if self.runtime != KernelRuntime::Runc {
            h.update([1]);
            h.update(self.runtime.name().as_bytes());
        }
        // So do Python kernels of the default context.
        if !self.context.is_default_python() {
            h.update([2]);
            h.update(self.context.language.name().as_bytes());
            h.update([0]);
            h.update(self.context.name.as_bytes());
        }
        hex::encode(&h.finalize()[..8])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_owners_are_qualified() {
        let parent = Owner::new("t", "conv-a", None).unwrap();
        let child = Owner::new("t", "conv-a", Some("child-1")).unwrap();
        assert_eq!(parent.to_string(), "conv-a");
        assert_eq!(child.to_string(), "conv-a::child::child-1");
        assert_ne!(parent, child);
        assert_eq!(root_session(&child.to_string()), "conv-a");
        assert_eq!(root_session(&parent.to_string()), "conv-a");
        assert!(child.is_child());
    }

    #[test]
    fn names_that_break_labels_or_paths_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a b",
            "x::child::y",
            "..\u{0}",
            &"x".repeat(200),
        ] {
            let err = validate_name("session", bad).expect_err(bad);
            assert_eq!(err.what, "session");
            assert!(
                err.to_string().starts_with("invalid session name "),
                "{err}"
            );
        }
        for good in [
            "conv-a",
            "user@example.com",
            "t:1",
            "a.b_c",
            "...",
            ".a",
            "a..b",
        ] {
            assert!(validate_name("session", good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn key_hash_depends_on_every_part() {
        let key = KernelKey {
            owner: Owner::new("t", "s", None).unwrap(),
            mode: WorkMode::Strict,
            image: "img".into(),
            tools: BTreeSet::new(),
            runtime: KernelRuntime::Runc,
            context: Context::default(),
        };
        let mut other = key.clone();
        other.tools.insert("web_search".into());
        assert_ne!(key.hash(), other.hash());
        let mut bash = key.clone();
        bash.context = Context::of(crate::wire::Language::Bash);
        assert_ne!(key.hash(), bash.hash());
        let mut other = key.clone();
        other.runtime = KernelRuntime::Runsc;
        assert_ne!(key.hash(), other.hash());
        let mut tenant = key.clone();
        tenant.owner.tenant = "u".into();
        assert_ne!(key.hash(), tenant.hash());
        assert_eq!(key.hash(), key.clone().hash());
    }
}
