//! Watching a sandbox's directory (envd's WatchDir stream and its polled watcher:
//! CreateWatcher, GetWatcherEvents, RemoveWatcher), by polling: a watcher keeps the last
//! listing it took through the kernel's file helper (`filesystem::walk`), and the next one
//! taken is compared with it. A name that appeared is a `CREATE` (and a `WRITE` when it is a
//! file with content), one that went a `REMOVE`, one whose kind, size or modification time
//! (to the second) changed a `WRITE`. Changes between two listings that cancel out (a file
//! made and removed) are not seen, nor a rewrite of the same size within the same second
//! (docs/e2b.md, "Watching").
//!
//! A polled watcher lists when its events are asked for (no task of its own); a WatchDir
//! stream lists every [`POLL_INTERVAL`] while its client reads, and ends at the client's
//! deadline (at most [`MAX_STREAM_LIFE`]), when the sandbox goes, or when the client does (its
//! body is the loop: nothing runs once it is dropped).
//!
//! Bounds: [`MAX_WATCHERS_PER_SANDBOX`], [`MAX_WATCHERS_PER_TENANT`] and [`MAX_WATCHERS`] on
//! the host (polled watchers and streams together; one more is `resource_exhausted`); a
//! watcher keeps at most [`MAX_WATCHED_ENTRIES`] names and reads at most
//! [`MAX_WATCHED_DIRS`] directories a listing (a larger tree is watched in part), so the
//! events one listing yields are at most twice that.

// A Connect error is the HTTP response itself, built once on the refusal path and answered
// as is: boxing it would only add an allocation.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::response::Response;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::entries::{self, entry_info, file_error, EntryInfo};
use super::rpc::{self, envelope, error, unary_ok};
use super::{Facade, InSandbox};
use crate::files::{FileEntry, FilePath};
use crate::orchestrator::{FileError, FileRequest};
use crate::server::AppState;

/// Watchers (polled and streams) one sandbox may have.
pub(crate) const MAX_WATCHERS_PER_SANDBOX: usize = 8;
/// Watchers one tenant may have.
pub(crate) const MAX_WATCHERS_PER_TENANT: usize = 32;
/// Watchers on the host.
pub(crate) const MAX_WATCHERS: usize = 256;
/// Names one watcher keeps (its directory's, and its subdirectories' when recursive).
pub(crate) const MAX_WATCHED_ENTRIES: usize = 2048;
/// Directories one watcher's listing reads.
pub(crate) const MAX_WATCHED_DIRS: usize = 64;
/// Levels a recursive watcher goes down.
const RECURSIVE_DEPTH: u32 = 32;
/// How often a WatchDir stream lists its directory.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Longest life of a WatchDir stream.
pub(crate) const MAX_STREAM_LIFE: Duration = Duration::from_secs(3600);
/// Polls without an event after which a stream sends a keepalive.
const KEEPALIVE_POLLS: u32 = 20;

/// CreateWatcher's and WatchDir's request.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WatchRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default, alias = "include_entry")]
    include_entry: bool,
}

/// GetWatcherEvents's and RemoveWatcher's request.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WatcherId {
    #[serde(default, alias = "watcher_id")]
    pub(super) watcher_id: String,
}

/// envd's `filesystem.FilesystemEvent` in Connect's JSON mapping.
#[derive(Serialize, Debug, PartialEq, Eq)]
struct Event {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    entry: Option<EntryInfo>,
}

/// A listing: each name under the directory (relative, `/`-joined) and its entry.
type Snapshot = BTreeMap<String, (FilePath, FileEntry)>;

/// What one watcher watches, and its last listing.
struct Watcher {
    sandbox: String,
    tenant: String,
    request: FileRequest,
    dir: FilePath,
    depth: u32,
    include_entry: bool,
    last: tokio::sync::Mutex<Snapshot>,
}

/// A watcher's place under the bounds: a polled one keeps its [`Watcher`], a stream only its
/// place (given back when its guard drops).
struct Place {
    sandbox: String,
    tenant: String,
    watcher: Option<Arc<Watcher>>,
}

/// The watchers of the facade's sandboxes. Cheap to clone.
#[derive(Clone, Default)]
pub(crate) struct Watchers {
    table: Arc<Mutex<HashMap<String, Place>>>,
}

/// A stream's place, given back when it drops.
struct Guard {
    table: Arc<Mutex<HashMap<String, Place>>>,
    id: String,
}

impl Drop for Guard {
    fn drop(&mut self) {
        lock(&self.table).remove(&self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn new_id() -> String {
    let bytes: [u8; 12] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

async fn listing(state: &AppState, watcher: &Watcher) -> Result<Snapshot, FileError> {
    let (found, _cut) = entries::walk(
        state,
        &watcher.request,
        &watcher.dir,
        watcher.depth,
        MAX_WATCHED_ENTRIES,
        MAX_WATCHED_DIRS,
    )
    .await?;
    let skip = watcher.dir.parts().len();
    Ok(found
        .into_iter()
        .map(|(path, entry)| (path.parts()[skip..].join("/"), (path, entry)))
        .collect())
}

/// The events that turn `old` into `new`.
fn diff(old: &Snapshot, new: &Snapshot, include_entry: bool) -> Vec<Event> {
    let event = |name: &str, kind, at: Option<&(FilePath, FileEntry)>| Event {
        name: name.to_owned(),
        kind,
        entry: at
            .filter(|_| include_entry)
            .map(|(path, entry)| entry_info(path, entry)),
    };
    let mut events = Vec::new();
    for (name, now) in new {
        match old.get(name) {
            None => {
                events.push(event(name, "EVENT_TYPE_CREATE", Some(now)));
                if now.1.kind == "file" && now.1.size > 0 {
                    events.push(event(name, "EVENT_TYPE_WRITE", Some(now)));
                }
            }
            Some(before) if before.1 != now.1 => {
                events.push(event(name, "EVENT_TYPE_WRITE", Some(now)));
            }
            Some(_) => {}
        }
    }
    for name in old.keys().filter(|n| !new.contains_key(*n)) {
        events.push(event(name, "EVENT_TYPE_REMOVE", None));
    }
    events
}

impl Watchers {
    /// Takes a place for `call`'s sandbox under the bounds, forgetting first the polled
    /// watchers of sandboxes that are gone.
    fn reserve(
        &self,
        facade: &Facade,
        call: &InSandbox,
        watcher: Option<Arc<Watcher>>,
    ) -> Result<String, Response> {
        let mut table = lock(&self.table);
        table.retain(|_, place| place.watcher.is_none() || facade.exists(&place.sandbox));
        let tenant = &call.tenant.name;
        let of_sandbox = table.values().filter(|p| p.sandbox == call.id).count();
        let of_tenant = table.values().filter(|p| &p.tenant == tenant).count();
        let refused = if of_sandbox >= MAX_WATCHERS_PER_SANDBOX {
            Some(format!(
                "sandbox {} already has {MAX_WATCHERS_PER_SANDBOX} watchers",
                call.id
            ))
        } else if of_tenant >= MAX_WATCHERS_PER_TENANT {
            Some(format!(
                "tenant {tenant} already has {MAX_WATCHERS_PER_TENANT} watchers"
            ))
        } else if table.len() >= MAX_WATCHERS {
            Some(format!("the host already has {MAX_WATCHERS} watchers"))
        } else {
            None
        };
        if let Some(refused) = refused {
            return Err(error(
                "resource_exhausted",
                format!("{refused}, the most allowed; stop one first (docs/e2b.md, \"Watching\")"),
            ));
        }
        let id = new_id();
        table.insert(
            id.clone(),
            Place {
                sandbox: call.id.clone(),
                tenant: tenant.clone(),
                watcher,
            },
        );
        Ok(id)
    }

    /// A watcher of the directory `asked.path`, its first listing taken.
    async fn watcher(
        state: &AppState,
        call: &InSandbox,
        request: FileRequest,
        asked: WatchRequest,
    ) -> Result<Watcher, Response> {
        let dir = super::envd::native_path(&asked.path).map_err(entries::e2b_to_connect)?;
        match entries::stat(state, &request, &dir).await {
            Ok(entry) if entry.kind == "dir" => {}
            Ok(_) => {
                return Err(error(
                    "invalid_argument",
                    format!("path {:?} is not a directory", asked.path),
                ))
            }
            Err(e) => return Err(file_error(e)),
        }
        let mut watcher = Watcher {
            sandbox: call.id.clone(),
            tenant: call.tenant.name.clone(),
            request,
            dir,
            depth: if asked.recursive { RECURSIVE_DEPTH } else { 1 },
            include_entry: asked.include_entry,
            last: Default::default(),
        };
        let first = listing(state, &watcher).await.map_err(file_error)?;
        watcher.last = tokio::sync::Mutex::new(first);
        Ok(watcher)
    }

    /// CreateWatcher: a polled watcher; answers its id.
    pub(super) async fn create(
        &self,
        state: &AppState,
        facade: &Facade,
        call: &InSandbox,
        request: FileRequest,
        asked: WatchRequest,
    ) -> Response {
        let watcher = match Watchers::watcher(state, call, request, asked).await {
            Ok(w) => Arc::new(w),
            Err(e) => return e,
        };
        match self.reserve(facade, call, Some(watcher)) {
            Ok(id) => unary_ok(serde_json::json!({"watcherId": id})),
            Err(e) => e,
        }
    }

    fn find(&self, call: &InSandbox, id: &str) -> Option<Arc<Watcher>> {
        lock(&self.table)
            .get(id)
            .and_then(|p| p.watcher.clone())
            .filter(|w| w.sandbox == call.id && w.tenant == call.tenant.name)
    }

    /// GetWatcherEvents: what changed since the last call (or the watcher's creation).
    pub(super) async fn events(&self, state: &AppState, call: &InSandbox, id: &str) -> Response {
        let Some(watcher) = self.find(call, id) else {
            return error("not_found", format!("watcher {id:?} not found"));
        };
        let mut last = watcher.last.lock().await;
        let now = match listing(state, &watcher).await {
            Ok(now) => now,
            Err(e) => return file_error(e),
        };
        let events = diff(&last, &now, watcher.include_entry);
        *last = now;
        unary_ok(serde_json::json!({"events": events}))
    }

    /// RemoveWatcher.
    pub(super) fn remove(&self, call: &InSandbox, id: &str) -> Response {
        if self.find(call, id).is_none() {
            return error("not_found", format!("watcher {id:?} not found"));
        }
        lock(&self.table).remove(id);
        unary_ok(serde_json::json!({}))
    }

    /// WatchDir: a stream of the directory's events, a start event first.
    pub(super) async fn stream(
        &self,
        state: &AppState,
        facade: &Facade,
        call: &InSandbox,
        request: FileRequest,
        asked: WatchRequest,
        deadline: Option<Duration>,
    ) -> Response {
        let watcher = match Watchers::watcher(state, call, request, asked).await {
            Ok(w) => w,
            Err(e) => return e,
        };
        let id = match self.reserve(facade, call, None) {
            Ok(id) => id,
            Err(e) => return e,
        };
        let guard = Guard {
            table: self.table.clone(),
            id,
        };
        let life = deadline
            .filter(|d| !d.is_zero())
            .map_or(MAX_STREAM_LIFE, |d| d.min(MAX_STREAM_LIFE));
        let end = tokio::time::Instant::now() + life;
        let start = envelope(0, br#"{"start":{}}"#);
        let poll = Poll {
            state: state.clone(),
            facade: facade.clone(),
            watcher,
            _guard: guard,
            quiet: 0,
            end,
            done: false,
        };
        let events = futures::stream::unfold(poll, |mut poll| async move {
            if poll.done {
                return None;
            }
            let frames = poll.next().await;
            Some((futures::stream::iter(frames), poll))
        })
        .flatten();
        rpc::stream_response(futures::stream::iter([start]).chain(events))
    }
}

/// A WatchDir stream's loop.
struct Poll {
    state: AppState,
    facade: Facade,
    watcher: Watcher,
    _guard: Guard,
    quiet: u32,
    end: tokio::time::Instant,
    done: bool,
}

impl Poll {
    /// The frames of the next poll: its events, a keepalive, or the end of the stream.
    async fn next(&mut self) -> Vec<Bytes> {
        loop {
            let wake = (tokio::time::Instant::now() + POLL_INTERVAL).min(self.end);
            tokio::time::sleep_until(wake).await;
            if tokio::time::Instant::now() >= self.end {
                self.done = true;
                return vec![rpc::end_of_stream(None)];
            }
            if !self.facade.exists(&self.watcher.sandbox) {
                self.done = true;
                let message = format!("sandbox {:?} is gone", self.watcher.sandbox);
                return vec![rpc::end_of_stream(Some(("not_found", message)))];
            }
            let now = match listing(&self.state, &self.watcher).await {
                Ok(now) => now,
                Err(e) => {
                    self.done = true;
                    let message = e.to_string();
                    return vec![rpc::end_of_stream(Some(("unavailable", message)))];
                }
            };
            let mut last = self.watcher.last.lock().await;
            let events = diff(&last, &now, self.watcher.include_entry);
            *last = now;
            drop(last);
            if !events.is_empty() {
                self.quiet = 0;
                return events
                    .iter()
                    .map(|e| {
                        let frame = serde_json::json!({"filesystem": e}).to_string();
                        envelope(0, frame.as_bytes())
                    })
                    .collect();
            }
            self.quiet += 1;
            if self.quiet >= KEEPALIVE_POLLS {
                self.quiet = 0;
                return vec![envelope(0, br#"{"keepalive":{}}"#)];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, kind: &str, size: u64, modified: &str) -> (String, (FilePath, FileEntry)) {
        (
            name.to_owned(),
            (
                FilePath::parse(name).expect("a path"),
                FileEntry {
                    name: name.to_owned(),
                    kind: kind.to_owned(),
                    size,
                    modified: modified.to_owned(),
                },
            ),
        )
    }

    #[test]
    fn a_listing_compared_with_the_last_gives_create_write_and_remove() {
        let old: Snapshot = [
            entry("kept", "file", 1, "t1"),
            entry("changed", "file", 1, "t1"),
            entry("gone", "file", 1, "t1"),
        ]
        .into();
        let new: Snapshot = [
            entry("kept", "file", 1, "t1"),
            entry("changed", "file", 2, "t1"),
            entry("made", "file", 3, "t2"),
            entry("dir", "dir", 4096, "t2"),
        ]
        .into();
        let got: Vec<(String, &str)> = diff(&old, &new, false)
            .into_iter()
            .map(|e| (e.name, e.kind))
            .collect();
        assert_eq!(
            got,
            vec![
                ("changed".to_owned(), "EVENT_TYPE_WRITE"),
                ("dir".to_owned(), "EVENT_TYPE_CREATE"),
                ("made".to_owned(), "EVENT_TYPE_CREATE"),
                ("made".to_owned(), "EVENT_TYPE_WRITE"),
                ("gone".to_owned(), "EVENT_TYPE_REMOVE"),
            ]
        );
    }
}
