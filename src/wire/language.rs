//! The language a cell is written in and the context (one kernel of a session) that runs it
//! (`docs/contract.md`, "Languages"): what the execute body's `language` names and what
//! keys a session's kernels apart.

use serde::{Deserialize, Serialize};

/// The language of a cell, and of the kernel that runs it.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Python 3 (the default): `runner/kernel_runner.py`.
    #[default]
    Python,
    /// A stateful Bash shell, hosted by the Python runner (`runner/kernel_runner.py`, "Bash").
    Bash,
    /// JavaScript on Node, hosted by the Python runner (`runner/node_kernel.js`).
    Javascript,
    /// TypeScript on Node: each cell's types are stripped, then it runs as JavaScript.
    Typescript,
}

impl Language {
    /// Every language, in the order the docs list them.
    pub const ALL: [Language; 4] = [
        Language::Python,
        Language::Bash,
        Language::Javascript,
        Language::Typescript,
    ];

    /// The name the API uses (`python`, `bash`, `javascript`, `typescript`).
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Bash => "bash",
            Language::Javascript => "javascript",
            Language::Typescript => "typescript",
        }
    }

    /// True when this server runs kernels of the language (the others are refused before any
    /// kernel starts, `unsupported_language`).
    pub fn is_served(self) -> bool {
        matches!(
            self,
            Language::Python | Language::Bash | Language::Javascript | Language::Typescript
        )
    }

    /// Ok when this server runs kernels of the language; else the error every caller answers
    /// with (HTTP 400 `unsupported_language`).
    pub fn check_served(self) -> Result<(), UnsupportedLanguage> {
        if self.is_served() {
            Ok(())
        } else {
            Err(UnsupportedLanguage(self))
        }
    }

    /// The language `name` names, if any.
    pub fn parse(name: &str) -> Option<Language> {
        Language::ALL.into_iter().find(|l| l.name() == name)
    }
}

/// A cell in a language this server runs no kernel of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("language {:?} is not served by this server; served: {}", .0.name(), served())]
pub struct UnsupportedLanguage(pub Language);

/// The served languages' names, comma-separated.
fn served() -> String {
    Language::ALL
        .into_iter()
        .filter(|l| l.is_served())
        .map(Language::name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl std::fmt::Display for Language {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One kernel of a session: a name and the language its kernel runs. A session holds at most
/// one kernel per context; each has its own memory, and a timeout, crash or reset of one
/// loses only its own state. The default context of a language is named by the language
/// (`python`, `bash`): a cell that names only a language runs there. Named contexts
/// (several kernels of one language, e.g. E2B's code contexts) use the same key.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Context {
    /// The context's name, unique within its owner.
    pub name: String,
    /// The language its kernel runs.
    pub language: Language,
}

impl Context {
    /// The default context of `language`, named by it.
    pub fn of(language: Language) -> Context {
        Context {
            name: language.name().to_string(),
            language,
        }
    }

    /// True for the default Python context, the one kernel every session had before
    /// languages: its kernel keys, labels and hashes are those of before.
    pub fn is_default_python(&self) -> bool {
        self.language == Language::Python && self.name == Language::Python.name()
    }
}

impl Default for Context {
    fn default() -> Context {
        Context::of(Language::Python)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_json_and_parse() {
        for language in Language::ALL {
            let json = serde_json::to_value(language).expect("serialise");
            assert_eq!(json, serde_json::json!(language.name()));
            assert_eq!(Language::parse(language.name()), Some(language));
        }
        assert!(serde_json::from_value::<Language>(serde_json::json!("ruby")).is_err());
        assert_eq!(Language::parse("Python"), None);
    }

    #[test]
    fn the_default_context_is_python() {
        assert!(Context::default().is_default_python());
        assert!(!Context::of(Language::Bash).is_default_python());
        assert_eq!(Context::of(Language::Bash).name, "bash");
    }
}
