//! A streaming execute: `output` events as the cell writes (whole UTF-8, at most
//! [`MAX_STREAM_BACKLOG`] bytes waiting for the client) and `display` events as it displays
//! (in order with the output; at most the cell's display cap waiting), then the `result`.
//! Every queued event counts against the tenant's and the host's response bytes in flight
//! from when it is queued (`pending.rs`); the `result` repeats the displays already sent as
//! events (docs/contract.md, "Rich results"), and is counted in full as well.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::Response;

use super::pending::{Charge, Meter};
use crate::cell::{CellResult, OutputStream};
use crate::kernel::CommandStream;
use crate::orchestrator::{AdmissionNotice, CommandRequest, ExecuteRequest};
use crate::rich::RichResult;
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::wire::{CommandEvent, ErrorDetail, StreamEvent};

/// One line of an NDJSON stream: the event (its `event` first, `src/wire/event.rs`) and a
/// newline.
pub(crate) fn line(event: &impl serde::Serialize) -> Bytes {
    let mut line = serde_json::to_vec(event).unwrap_or_else(|_| b"null".to_vec());
    line.push(b'\n');
    Bytes::from(line)
}

/// Turns output bytes into whole UTF-8 text, carrying a split character to the next chunk
/// and capping the bytes streamed.
pub(super) struct Utf8Stream {
    pub(super) carry: Vec<u8>,
    pub(super) sent: usize,
    pub(super) cap: usize,
    pub(super) dropped: usize,
}

impl Utf8Stream {
    pub(super) fn push(&mut self, chunk: &[u8]) -> String {
        let room = self.cap.saturating_sub(self.sent);
        let take = chunk.len().min(room);
        self.dropped += chunk.len() - take;
        self.sent += take;
        self.carry.extend_from_slice(&chunk[..take]);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.carry) {
                Ok(s) => {
                    text.push_str(s);
                    self.carry.clear();
                    return text;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    text.push_str(&String::from_utf8_lossy(&self.carry[..valid]));
                    match e.error_len() {
                        // An incomplete character at the end: keep it for the next chunk.
                        None => {
                            self.carry.drain(..valid);
                            return text;
                        }
                        Some(n) => {
                            text.push('\u{FFFD}');
                            self.carry.drain(..valid + n);
                        }
                    }
                }
            }
        }
    }

    pub(super) fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.carry).into_owned();
        self.carry.clear();
        text
    }
}

/// Bytes of NDJSON events of one streaming execute produced and not yet taken by the client's
/// connection. A client that does not keep up loses output past this (the cell never waits
/// for it); the stream then ends with an `output_truncated` event counting the dropped bytes,
/// before the `result`.
pub const MAX_STREAM_BACKLOG: usize = 1024 * 1024;

/// The sending side of a streaming execute: output events are dropped, never queued, past
/// [`MAX_STREAM_BACKLOG`] bytes.
pub(super) struct StreamTx {
    /// Lines, whether each is the last, whether it counts against the output backlog, and
    /// its bytes counted as the response's until the client's connection takes them.
    pub(super) tx: tokio::sync::mpsc::UnboundedSender<Queued>,
    pub(super) queued: Arc<std::sync::atomic::AtomicUsize>,
    pub(super) meter: Arc<Meter>,
}

/// One queued line of a stream: the line, whether it is the last, whether it counts against
/// the output backlog, and its charge.
pub(super) type Queued = (Bytes, bool, bool, Charge);

/// Bytes of `display` events of one streaming execute waiting for the client, beyond the
/// cell's display cap (`Config::cells.display.cell_bytes`): the JSON of the events around the
/// bundles. The kernel accepts no more displays per cell than the cap, so none is dropped
/// unless the runner's displays are not what it would send.
const DISPLAY_EVENT_SLACK: usize = 64 * 1024;

impl StreamTx {
    /// Queues an output event unless the backlog is full; false if it was dropped.
    pub(super) fn try_send(&self, line: Bytes) -> bool {
        use std::sync::atomic::Ordering;
        let len = line.len();
        let admitted = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + len <= MAX_STREAM_BACKLOG).then_some(q + len)
            })
            .is_ok();
        if admitted {
            let charge = self.meter.charge(len);
            if self.tx.send((line, false, true, charge)).is_err() {
                // The client went away: nothing is queued for it any more.
                self.queued.fetch_sub(len, Ordering::AcqRel);
            }
        }
        admitted
    }

    /// Queues a closing event (the rest of the output, truncation, the result) whatever the
    /// backlog: a handful of lines per stream (the shape's closing lines).
    pub(super) fn send_final(&self, line: Bytes, last: bool) {
        self.queued
            .fetch_add(line.len(), std::sync::atomic::Ordering::AcqRel);
        let charge = self.meter.charge(line.len());
        let _ = self.tx.send((line, last, true, charge));
    }

    /// Queues a `display` event outside the output backlog (the caller bounds them).
    pub(super) fn send_display(&self, line: Bytes) {
        let charge = self.meter.charge(line.len());
        let _ = self.tx.send((line, false, false, charge));
    }
}

/// How a streamed execute's events are written: kernelbox's own ([`Native`],
/// `src/wire/event.rs`), or the E2B API's (`server/e2b/interpreter.rs`), which translates the
/// same cell's output, displays and result into its own lines.
pub(crate) trait Shape: Send + Sync + 'static {
    /// Text the cell wrote on `stream`, as a line; `None` when the shape holds it back for
    /// now (it then goes out with the next output or the closing lines) or leaves it out.
    fn output(&self, text: &str, stream: OutputStream) -> Option<Bytes>;
    /// A rich result the cell displayed.
    fn display(&self, result: &RichResult) -> Bytes;
    /// Output dropped because the client did not read it in time.
    fn truncated(&self, bytes: usize) -> Bytes;
    /// The closing lines of a cell that ran (at least one).
    fn result(&self, result: &CellResult) -> Vec<Bytes>;
    /// The closing lines of an execute that failed (at least one).
    fn error(&self, error: &ErrorDetail) -> Vec<Bytes>;
}

/// kernelbox's own events (`src/wire/event.rs`).
pub(crate) struct Native;

impl Shape for Native {
    fn output(&self, text: &str, stream: OutputStream) -> Option<Bytes> {
        Some(line(&StreamEvent::output(text, stream)))
    }
    fn display(&self, result: &RichResult) -> Bytes {
        line(&StreamEvent::display(result))
    }
    fn truncated(&self, bytes: usize) -> Bytes {
        line(&StreamEvent::truncated(bytes))
    }
    fn result(&self, result: &CellResult) -> Vec<Bytes> {
        vec![line(&StreamEvent::result(result))]
    }
    fn error(&self, error: &ErrorDetail) -> Vec<Bytes> {
        vec![line(&StreamEvent::error(error))]
    }
}

/// Streams `output` and `display` events (`src/wire/event.rs`) as the cell writes, then one `result` (or
/// `error`) line. The cell runs to its end even if the client goes away. `admission` is told
/// whether the cell got a kernel slot before any kernel starts (the caller answers a refusal
/// 429 instead of this stream).
pub(super) fn stream_execute(
    state: AppState,
    request: ExecuteRequest,
    admission: AdmissionNotice,
    meter: Arc<Meter>,
) -> Response {
    stream_shaped(state, request, admission, meter, Arc::new(Native))
}

/// [`stream_execute`] with its lines written by `shape`.
pub(crate) fn stream_shaped(
    state: AppState,
    mut request: ExecuteRequest,
    admission: AdmissionNotice,
    meter: Arc<Meter>,
    shape: Arc<dyn Shape>,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Queued>();
    let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tx = Arc::new(StreamTx {
        tx,
        queued: queued.clone(),
        meter,
    });
    let config = state.inner.orchestrator.config();
    let decoder = Arc::new(Mutex::new(CellDecoder {
        text: Utf8Stream {
            carry: Vec::new(),
            sent: 0,
            cap: config.cells.output.spill_bytes,
            dropped: 0,
        },
        stream: OutputStream::Stdout,
    }));
    let display_cap = config.cells.display.cell_bytes + DISPLAY_EVENT_SLACK;
    arm_sinks(&mut request, &tx, &decoder, display_cap, &shape);
    // The cell's spans stay in the request's trace (docs/usage.md, "Traces").
    tokio::spawn(crate::telemetry::carry(run_to_the_end(
        state, request, admission, decoder, tx, shape,
    )));
    ndjson_response(rx, queued)
}

/// A streamed cell's output decoded: one UTF-8 decoder for the output as it interleaves, and
/// the stream its undecoded bytes came on (a change of stream sends what it holds first).
pub(super) struct CellDecoder {
    text: Utf8Stream,
    stream: OutputStream,
}

impl CellDecoder {
    /// Queues `text` as an `output` event of the current stream, or counts it dropped.
    fn send(&mut self, tx: &StreamTx, shape: &dyn Shape, text: &str) {
        if !text.is_empty()
            && !shape
                .output(text, self.stream)
                .is_none_or(|l| tx.try_send(l))
        {
            self.text.dropped += text.len();
        }
    }
}

/// The request's output and display sinks, which turn what the cell writes into stream lines.
fn arm_sinks(
    request: &mut ExecuteRequest,
    tx: &Arc<StreamTx>,
    decoder: &Arc<Mutex<CellDecoder>>,
    display_cap: usize,
    shape: &Arc<dyn Shape>,
) {
    {
        let tx = tx.clone();
        let decoder = decoder.clone();
        let shape = shape.clone();
        request.sink = Some(Arc::new(move |stream: OutputStream, chunk: &[u8]| {
            let mut decoder = decoder.lock().unwrap_or_else(|p| p.into_inner());
            if stream != decoder.stream {
                let rest = decoder.text.finish();
                decoder.send(&tx, &*shape, &rest);
                decoder.stream = stream;
            }
            let text = decoder.text.push(chunk);
            decoder.send(&tx, &*shape, &text);
        }));
    }
    // Not counted against the output backlog: a large image must not cost the stream its
    // output. At most the display cap of them per stream; output decoded so far goes first.
    let tx = tx.clone();
    let decoder = decoder.clone();
    let shape = shape.clone();
    let displayed = std::sync::atomic::AtomicUsize::new(0);
    request.display_sink = Some(Arc::new(move |result: &crate::rich::RichResult| {
        let mut decoder = decoder.lock().unwrap_or_else(|p| p.into_inner());
        let text = decoder.text.finish();
        decoder.send(&tx, &*shape, &text);
        let event = shape.display(result);
        let total = displayed.fetch_add(event.len(), std::sync::atomic::Ordering::AcqRel);
        if total + event.len() <= display_cap {
            tx.send_display(event);
        }
    }));
}

/// Runs the cell to its end (whether or not the client still reads), then sends the output
/// left undecoded, what was dropped, and the final `result` (or `error`) line.
async fn run_to_the_end(
    state: AppState,
    request: ExecuteRequest,
    admission: AdmissionNotice,
    decoder: Arc<Mutex<CellDecoder>>,
    tx: Arc<StreamTx>,
    shape: Arc<dyn Shape>,
) {
    let outcome = state
        .inner
        .orchestrator
        .execute_with_admission(request, admission)
        .await;
    let (rest, stream, dropped) = {
        let mut d = decoder.lock().unwrap_or_else(|p| p.into_inner());
        (d.text.finish(), d.stream, d.text.dropped)
    };
    if !rest.is_empty() {
        if let Some(line) = shape.output(&rest, stream) {
            tx.send_final(line, false);
        }
    }
    if dropped > 0 {
        tx.send_final(shape.truncated(dropped), false);
    }
    let closing = match outcome {
        Ok(result) => {
            state.inner.metrics.cell(&result);
            shape.result(&result)
        }
        Err(e) => shape.error(&ApiError::from(e).body().error),
    };
    // One write for all of them: lines written apart would wait on the client's delayed
    // acknowledgement of the first (Nagle's algorithm).
    tx.send_final(Bytes::from(closing.concat()), true);
}

/// The NDJSON response reading the queued lines. A line's charge is kept until the next is
/// asked for: the body (`pending::counted`) counts it from there until it is handed over, so
/// it is never out of the count.
fn ndjson_response(
    rx: tokio::sync::mpsc::UnboundedReceiver<Queued>,
    queued: Arc<std::sync::atomic::AtomicUsize>,
) -> Response {
    let stream = futures::stream::unfold((rx, false, None), move |(mut rx, done, taken)| {
        let queued = queued.clone();
        async move {
            drop::<Option<Charge>>(taken);
            if done {
                return None;
            }
            let (bytes, last, counted, charge) = rx.recv().await?;
            if counted {
                queued.fetch_sub(bytes.len(), std::sync::atomic::Ordering::AcqRel);
            }
            Some((Ok::<_, Infallible>(bytes), (rx, last, Some(charge))))
        }
    });
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// A streaming command (`POST /v1/sessions/{session}/commands` with NDJSON): `stdout` and
/// `stderr` events as the command writes (whole UTF-8 each, under the same backlog as a cell's
/// output, the streams' bytes counted as the response's), then `output_truncated` when some
/// were dropped, then its `result` (or `error`). The command runs to its end or timeout even
/// if the client goes away.
pub(super) fn stream_command(
    state: AppState,
    mut request: CommandRequest,
    meter: Arc<Meter>,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Queued>();
    let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let tx = Arc::new(StreamTx {
        tx,
        queued: queued.clone(),
        meter,
    });
    let cap = state.inner.orchestrator.config().cells.output.spill_bytes;
    let decoder = || {
        Mutex::new(Utf8Stream {
            carry: Vec::new(),
            sent: 0,
            cap,
            dropped: 0,
        })
    };
    let decoders = Arc::new([decoder(), decoder()]);
    {
        let (tx, decoders) = (tx.clone(), decoders.clone());
        request.sink = Some(Arc::new(move |stream: CommandStream, chunk: &[u8]| {
            let (i, event) = command_event(stream);
            let mut decoder = decoders[i].lock().unwrap_or_else(|p| p.into_inner());
            let text = decoder.push(chunk);
            if !text.is_empty() && !tx.try_send(line(&event(&text))) {
                decoder.dropped += text.len();
            }
        }));
    }
    tokio::spawn(async move {
        let outcome = state.inner.orchestrator.run_command(request).await;
        let mut dropped = 0;
        for stream in [CommandStream::Stdout, CommandStream::Stderr] {
            let (i, event) = command_event(stream);
            let mut d = decoders[i].lock().unwrap_or_else(|p| p.into_inner());
            let rest = d.finish();
            dropped += d.dropped;
            if !rest.is_empty() {
                tx.send_final(line(&event(&rest)), false);
            }
        }
        if dropped > 0 {
            tx.send_final(line(&CommandEvent::truncated(dropped)), false);
        }
        let last = match outcome {
            Ok(result) => line(&CommandEvent::result(&result)),
            Err(e) => line(&CommandEvent::error(&ApiError::from(e).body().error)),
        };
        tx.send_final(last, true);
    });
    ndjson_response(rx, queued)
}

/// A command stream's decoder index and the event its text goes out in.
fn command_event(stream: CommandStream) -> (usize, fn(&str) -> CommandEvent<'_>) {
    match stream {
        CommandStream::Stdout => (0, CommandEvent::stdout),
        CommandStream::Stderr => (1, CommandEvent::stderr),
    }
}
