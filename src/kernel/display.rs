//! A cell's displays, assembled on the host from the pieces the scanner finds, under the caps
//! the runner was given (`RunnerDisplayCaps`): whatever the kernel writes, the host holds at
//! most one display's bytes being assembled and the cell's cap of finished ones
//! (`docs/contract.md`, "Rich results"; `docs/architecture.md`, runner protocol).

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::protocol::RunnerDisplayCaps;
use crate::cell::messages;
use crate::rich::{nesting_within, RawJson, RichResult, MAX_DISPLAY_DEPTH};

/// Most MIME types in one display, and most spilled paths it may name; a display with more is
/// dropped (each entry costs the host more than its bytes).
const MAX_DISPLAY_ENTRIES: usize = 32;

/// Most spilled paths named in a result's `warning`.
const WARNING_PATHS: usize = 10;

/// A display as the runner sends it: a bundle plus the files it was spilled to.
#[derive(Deserialize)]
struct WireDisplay {
    #[serde(deserialize_with = "bounded_map")]
    data: BTreeMap<String, Box<RawValue>>,
    #[serde(default)]
    metadata: Option<Box<RawValue>>,
    #[serde(default)]
    is_main_result: bool,
    #[serde(default, deserialize_with = "bounded_seq")]
    spilled: Vec<String>,
}

/// The displays of one cell.
#[derive(Debug)]
pub(super) struct Displays {
    caps: RunnerDisplayCaps,
    /// Bytes of finished displays, each with `caps.overhead` more.
    used: usize,
    /// The display being assembled.
    assembling: Vec<u8>,
    /// True while the display being assembled is past the bundle cap (its bytes are dropped).
    over: bool,
    results: Vec<RichResult>,
    spilled: Vec<String>,
    /// Displays the host dropped: past a cap, malformed, or broken in transit.
    dropped: u64,
}

impl Displays {
    pub(super) fn new(caps: RunnerDisplayCaps) -> Displays {
        Displays {
            caps,
            used: 0,
            assembling: Vec::new(),
            over: false,
            results: Vec::new(),
            spilled: Vec::new(),
            dropped: 0,
        }
    }

    /// Takes one piece; returns the display it finished, if it was accepted.
    pub(super) fn piece(&mut self, bytes: &[u8], last: bool) -> Option<&RichResult> {
        if !self.over && self.assembling.len() + bytes.len() > self.caps.bundle {
            self.over = true;
            self.assembling = Vec::new();
        }
        if !self.over {
            self.assembling.extend_from_slice(bytes);
        }
        if !last {
            return None;
        }
        let text = std::mem::take(&mut self.assembling);
        if std::mem::take(&mut self.over)
            || self.used + text.len() + self.caps.overhead > self.caps.cell
        {
            self.dropped += 1;
            return None;
        }
        if !nesting_within(&text, MAX_DISPLAY_DEPTH) {
            self.dropped += 1;
            return None;
        }
        let Ok(wire) = serde_json::from_slice::<WireDisplay>(&text) else {
            self.dropped += 1;
            return None;
        };
        self.used += text.len() + self.caps.overhead;
        drop(text);
        let metadata = wire
            .metadata
            .filter(|m| m.get().starts_with('{'))
            .map_or_else(RawJson::empty_object, RawJson::from_raw);
        self.spilled.extend(wire.spilled);
        self.results.push(RichResult {
            data: wire
                .data
                .into_iter()
                .map(|(k, v)| (k, RawJson::from_raw(v)))
                .collect(),
            metadata,
            is_main_result: wire.is_main_result,
        });
        self.results.last()
    }

    /// A piece that was not one: the display being assembled is lost.
    pub(super) fn broken(&mut self) {
        self.assembling = Vec::new();
        self.over = false;
        self.dropped += 1;
    }

    /// The cell's results, and the warning about spilled or dropped displays (the runner's
    /// own count of displays it dropped included).
    pub(super) fn finish(self, runner_dropped: u64) -> (Vec<RichResult>, Option<String>) {
        let (bundle, cell) = (self.caps.bundle, self.caps.cell);
        let mut warning = Vec::new();
        if !self.spilled.is_empty() {
            let mut paths = self.spilled[..self.spilled.len().min(WARNING_PATHS)].join(", ");
            if self.spilled.len() > WARNING_PATHS {
                paths.push_str(&format!(" and {} more", self.spilled.len() - WARNING_PATHS));
            }
            warning.push(messages::displays_saved_warning(bundle, cell, &paths));
        }
        let dropped = self.dropped + runner_dropped;
        if dropped > 0 {
            warning.push(messages::displays_dropped_warning(dropped, bundle, cell));
        }
        let warning = (!warning.is_empty()).then(|| warning.join(" "));
        (self.results, warning)
    }
}

/// A map of at most [`MAX_DISPLAY_ENTRIES`] entries, refused as soon as it has more.
fn bounded_map<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Box<RawValue>>, D::Error> {
    struct Bounded;
    impl<'de> Visitor<'de> for Bounded {
        type Value = BTreeMap<String, Box<RawValue>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "an object of at most {MAX_DISPLAY_ENTRIES} MIME types")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                if out.len() == MAX_DISPLAY_ENTRIES {
                    return Err(serde::de::Error::custom("too many MIME types"));
                }
                out.insert(k, v);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Bounded)
}

/// A list of at most [`MAX_DISPLAY_ENTRIES`] strings, refused as soon as it has more.
fn bounded_seq<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Bounded;
    impl<'de> Visitor<'de> for Bounded {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a list of at most {MAX_DISPLAY_ENTRIES} paths")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(path) = seq.next_element::<String>()? {
                if out.len() == MAX_DISPLAY_ENTRIES {
                    return Err(serde::de::Error::custom("too many paths"));
                }
                out.push(path);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Bounded)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> RunnerDisplayCaps {
        RunnerDisplayCaps {
            bundle: 200,
            cell: 1000,
            overhead: 100,
        }
    }

    fn bundle(text: &str) -> String {
        format!(r#"{{"data":{{"text/plain":"{text}"}},"metadata":{{}},"is_main_result":false}}"#)
    }

    #[test]
    fn pieces_make_displays_and_the_caps_drop_the_rest() {
        let mut d = Displays::new(caps());
        let one = bundle("a");
        let (head, tail) = one.split_at(10);
        assert!(d.piece(head.as_bytes(), false).is_none());
        let got = d.piece(tail.as_bytes(), true).unwrap();
        assert_eq!(got.text("text/plain").as_deref(), Some("a"));
        // Past the bundle cap: dropped, and nothing of it held.
        let big = bundle(&"x".repeat(300));
        for piece in big.as_bytes().chunks(50) {
            assert!(d.piece(piece, false).is_none());
            assert!(d.assembling.len() <= 200);
        }
        assert!(d.piece(b"", true).is_none());
        // Each display counts its JSON and the overhead: the cell cap stops them.
        let mut accepted = 1;
        for _ in 0..20 {
            accepted += usize::from(d.piece(bundle("b").as_bytes(), true).is_some());
        }
        assert_eq!(accepted, 1000 / (one.len() + 100));
        // Not JSON, or too many MIME types: dropped too.
        d.broken();
        let (results, warning) = d.finish(2);
        assert_eq!(results.len(), accepted);
        let dropped = 1 + (21 - accepted) + 1 + 2;
        assert_eq!(
            warning.as_deref(),
            Some(format!("{dropped} display(s) past the caps (200 bytes each, 1000 bytes per cell) were dropped.").as_str())
        );
    }

    #[test]
    fn a_display_with_too_many_mime_types_is_refused_and_spills_are_reported() {
        let mut d = Displays::new(RunnerDisplayCaps {
            bundle: 100_000,
            cell: 1_000_000,
            overhead: 0,
        });
        let many: Vec<String> = (0..=MAX_DISPLAY_ENTRIES)
            .map(|i| format!(r#""t/{i}":"""#))
            .collect();
        let text = format!(r#"{{"data":{{{}}}}}"#, many.join(","));
        assert!(d.piece(text.as_bytes(), true).is_none());
        let spilled =
            r#"{"data":{"text/plain":"note"},"metadata":[],"spilled":["/work/display-1-1.png"]}"#;
        let got = d.piece(spilled.as_bytes(), true).unwrap();
        assert_eq!(got.metadata.get(), "{}");
        let (results, warning) = d.finish(0);
        assert_eq!(results.len(), 1);
        assert_eq!(
            warning.as_deref(),
            Some("Display data over the caps (100000 bytes each, 1000000 bytes per cell) was saved to files inside the kernel: /work/display-1-1.png. 1 display(s) past the caps (100000 bytes each, 1000000 bytes per cell) were dropped.")
        );
    }
}
