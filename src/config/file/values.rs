//! Values of the configuration file kept as the operator wrote them, checked when read: a
//! [`Size`] (`"512m"` or a number of bytes), a [`HumanDuration`] (`"30s"`), a [`Secret`]
//! (inline, `{ file = "..." }` or `{ env = "..." }`, never printed).

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::units::{parse_bytes, parse_duration};

/// A size: `"512m"`, `"1g"`, `"64k"` or a number of bytes; kept as written.
#[derive(Clone, PartialEq, Eq)]
pub struct Size(String);

impl Size {
    /// The size as written (what the matching flag takes).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A size from its text, checked.
    pub fn parse(text: &str) -> Result<Size, String> {
        Size::bytes_of(text)?;
        Ok(Size(text.trim().to_string()))
    }

    /// Its number of bytes.
    pub fn bytes(&self) -> i64 {
        Size::bytes_of(&self.0).unwrap_or(0)
    }

    /// The bytes of a size's text: `0`, or a positive size (a rate's `/s` may follow).
    fn bytes_of(text: &str) -> Result<i64, String> {
        let size = text.trim();
        let size = size.strip_suffix("/s").unwrap_or(size);
        if size.trim().parse::<f64>() == Ok(0.0) {
            return Ok(0);
        }
        parse_bytes(size)
    }
}

impl fmt::Debug for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as \"512m\" or a number of bytes")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Size, E> {
                Size::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v)
                    .map(|v| Size(v.to_string()))
                    .map_err(|_| E::custom(format!("{v} is not a size (it is negative)")))
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl JsonSchema for Size {
    fn schema_name() -> Cow<'static, str> {
        "Size".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A size: \"512m\", \"1g\", \"64k\" (binary units) or a number of bytes.",
            "anyOf": [
                {"type": "string", "pattern": "^\\s*[0-9.]+\\s*([kKmMgG][iI]?[bB]?|[bB])?\\s*(/s)?\\s*$"},
                {"type": "integer", "minimum": 0}
            ]
        })
    }
}

/// A duration: `"30s"`, `"5m"`, `"4h"`, `"7d"`; kept as written.
#[derive(Clone, PartialEq, Eq)]
pub struct HumanDuration(String);

impl HumanDuration {
    /// The duration as written (what the matching flag takes).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A duration from its text, checked.
    pub fn parse(text: &str) -> Result<HumanDuration, String> {
        parse_duration(text)?;
        Ok(HumanDuration(text.trim().to_string()))
    }

    /// A duration in its largest whole unit (`7d`, `24h` as `1d`, `90s`), else as `humantime`
    /// writes it.
    pub fn from_duration(d: std::time::Duration) -> HumanDuration {
        let secs = d.as_secs();
        let text = match secs {
            _ if d.subsec_nanos() != 0 || secs == 0 => humantime::format_duration(d).to_string(),
            s if s % 86_400 == 0 => format!("{}d", s / 86_400),
            s if s % 3600 == 0 => format!("{}h", s / 3600),
            s if s % 60 == 0 => format!("{}m", s / 60),
            s => format!("{s}s"),
        };
        HumanDuration(text)
    }
}

impl fmt::Debug for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HumanDuration, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = HumanDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"30s\", \"5m\" or \"7d\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<HumanDuration, E> {
                HumanDuration::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

impl JsonSchema for HumanDuration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A duration: \"30s\", \"5m\", \"4h\", \"7d\" (units ms, s, m, h, d; combinable: \"1h 30m\").",
            "type": "string"
        })
    }
}

/// A secret (a token, a database URL): inline, from a file (`{ file = "/run/secrets/x" }`,
/// its content with surrounding white space trimmed) or from an environment variable
/// (`{ env = "NAME" }`). Never printed: its `Debug` and `Serialize` show an inline value as
/// `<redacted>`, a file or variable by name.
#[derive(Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Secret {
    /// The value itself.
    Inline(String),
    /// Read from a file (a `docker secret`, a Kubernetes Secret mounted as a file).
    File(SecretFile),
    /// Read from an environment variable.
    Env(SecretEnv),
}

/// `{ file = "..." }`: a secret read from a file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretFile {
    /// The file holding the secret.
    pub file: PathBuf,
}

/// `{ env = "..." }`: a secret read from an environment variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretEnv {
    /// The variable holding the secret.
    pub env: String,
}

impl Secret {
    /// A secret read from this file.
    pub fn file(path: impl Into<PathBuf>) -> Secret {
        Secret::File(SecretFile { file: path.into() })
    }

    /// A secret read from this environment variable.
    pub fn env(name: impl Into<String>) -> Secret {
        Secret::Env(SecretEnv { env: name.into() })
    }
}

/// What an inline secret prints as.
pub const REDACTED: &str = "<redacted>";

/// The most bytes a secret's file may hold (a token, a database URL).
pub const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// The text of a regular file of at most `max` bytes. Anything else is refused at once, never
/// read: a FIFO (opened without waiting for its writer), a device (`/dev/zero`), a directory,
/// a larger file; the error says why.
pub fn read_bounded(path: &Path, max: u64) -> Result<String, String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "a FIFO, socket or device"
        };
        return Err(format!("not a regular file ({kind})"));
    }
    if meta.len() > max {
        return Err(format!("larger than {max} bytes"));
    }
    let mut bytes = Vec::new();
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max {
        return Err(format!("larger than {max} bytes"));
    }
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())
}

impl Secret {
    /// The secret's value, read now; the error says where it was looked for and why it failed.
    pub fn resolve(&self) -> Result<String, String> {
        let value = match self {
            Secret::Inline(v) => v.clone(),
            Secret::File(SecretFile { file }) => read_bounded(file, MAX_SECRET_BYTES)
                .map_err(|e| format!("{}: {e}", file.display()))?,
            Secret::Env(SecretEnv { env }) => {
                std::env::var(env).map_err(|e| format!("environment variable {env}: {e}"))?
            }
        };
        let value = value.trim();
        if value == REDACTED {
            // What `--print-config` writes in place of an inline secret: taken back as the
            // configuration, it would make the secret a word everyone knows.
            return Err(format!(
                "is `{REDACTED}`, the placeholder --print-config writes for a secret: give the secret itself, {{ file = \"...\" }} or {{ env = \"...\" }}"
            ));
        }
        if value.is_empty() {
            return Err(match self {
                Secret::Inline(_) => "is empty".into(),
                Secret::File(SecretFile { file }) => {
                    format!("{}: the file is empty", file.display())
                }
                Secret::Env(SecretEnv { env }) => format!("environment variable {env} is empty"),
            });
        }
        Ok(value.to_string())
    }

    /// This secret with an inline value replaced by [`REDACTED`].
    pub fn redacted(&self) -> Secret {
        match self {
            Secret::Inline(_) => Secret::Inline(REDACTED.into()),
            other => other.clone(),
        }
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::Inline(_) => f.write_str(REDACTED),
            Secret::File(SecretFile { file }) => write!(f, "{{ file = {:?} }}", file),
            Secret::Env(SecretEnv { env }) => write!(f, "{{ env = {env:?} }}"),
        }
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Secret::Inline(_) => s.serialize_str(REDACTED),
            Secret::File(file) => file.serialize(s),
            Secret::Env(env) => env.serialize(s),
        }
    }
}
