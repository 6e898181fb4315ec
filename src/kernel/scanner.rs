//! The cell's output stream taken apart: the output itself (the cell's stdout), the pieces of
//! its displays (each behind the cell's display marker, up to a newline), its stderr and
//! traceback frames (behind the same marker: a flag `e` or `t`, four hex digits of length, the
//! bytes) and, at the end, the cell's end marker and the `done` line after it
//! (`docs/architecture.md`, runner protocol; `docs/contract.md`, "stdout and stderr").

use super::protocol::MAX_DONE_LINE;

/// Longest display piece (after its marker, flag byte included) the runner writes: a piece
/// and its marker fit in one atomic pipe write (PIPE_BUF, 4096 bytes). A longer one is forged
/// and breaks the display it belongs to.
pub(super) const MAX_DISPLAY_PIECE: usize = 4096;

/// Hex digits of a stderr or traceback frame's length.
const FRAME_LENGTH_DIGITS: usize = 4;

/// Which stream a frame behind the display marker carries.
#[derive(Debug, Clone, Copy)]
enum Stream {
    Stderr,
    Traceback,
}

/// A stderr or traceback frame being read: its length's digits so far, then the bytes left.
#[derive(Debug)]
struct Frame {
    stream: Stream,
    head: Vec<u8>,
    left: Option<usize>,
}

/// What the scanner finds in a cell's output stream, in order.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Piece<'a> {
    /// Output bytes (the cell's stdout).
    Output(&'a [u8]),
    /// Bytes the cell wrote on its stderr.
    Stderr(&'a [u8]),
    /// Bytes of the traceback of a cell that raised.
    Traceback(&'a [u8]),
    /// A piece of a display's JSON; `last` ends the display.
    Display {
        /// The piece's bytes (without its marker, flag and newline).
        bytes: &'a [u8],
        /// True for the display's last piece.
        last: bool,
    },
    /// A display piece that was not one (no flag, too long, or cut by another marker): the
    /// display being assembled is lost.
    Broken,
}

/// Finds a cell's end marker and display pieces in its output stream, across chunk boundaries;
/// hands back the output around them and collects the `done` line after the end marker.
#[derive(Debug)]
pub(super) struct MarkerScanner {
    marker: Vec<u8>,
    display: Option<Vec<u8>>,
    pending: Vec<u8>,
    /// Some while inside a display piece: its bytes so far.
    piece: Option<Vec<u8>>,
    /// Some while inside a stderr or traceback frame.
    frame: Option<Frame>,
    found: bool,
    pub(super) done: Vec<u8>,
    done_complete: bool,
}

impl MarkerScanner {
    /// A scanner for the end marker `marker` and no displays.
    pub(super) fn new(marker: &str) -> Self {
        MarkerScanner {
            marker: marker.as_bytes().to_vec(),
            display: None,
            pending: Vec::new(),
            piece: None,
            frame: None,
            found: false,
            done: Vec::new(),
            done_complete: false,
        }
    }

    /// A scanner for the end marker `marker` and display pieces behind `display`.
    pub(super) fn with_display(marker: &str, display: &str) -> Self {
        MarkerScanner {
            display: Some(display.as_bytes().to_vec()),
            ..MarkerScanner::new(marker)
        }
    }

    /// True once the end marker has been seen.
    pub(super) fn found(&self) -> bool {
        self.found
    }

    /// The line after the end marker (the cell's `done` frame), once it is complete.
    pub(super) fn done_line(&self) -> Option<&[u8]> {
        self.done_complete.then_some(self.done.as_slice())
    }

    fn feed_done(&mut self, bytes: &[u8]) {
        if self.done_complete {
            return;
        }
        match bytes.iter().position(|&b| b == b'\n') {
            Some(pos) if self.done.len() + pos > MAX_DONE_LINE => {
                // Not a frame the runner would write: give up on it, the cell still ended.
                self.done = Vec::new();
                self.done_complete = true;
            }
            Some(pos) => {
                self.done.extend_from_slice(&bytes[..pos]);
                self.done_complete = true;
            }
            None if self.done.len() + bytes.len() > MAX_DONE_LINE => {
                // Not a frame the runner would write: give up on it, the cell still ended.
                self.done = Vec::new();
                self.done_complete = true;
            }
            None => self.done.extend_from_slice(bytes),
        }
    }

    /// Feeds a chunk; `out` receives what it holds, in order (never a marker, nothing after
    /// the end marker).
    pub(super) fn feed(&mut self, chunk: &[u8], mut out: impl FnMut(Piece<'_>)) {
        if self.found {
            self.feed_done(chunk);
            return;
        }
        let data: std::borrow::Cow<[u8]> = if self.pending.is_empty() {
            chunk.into()
        } else {
            let mut v = std::mem::take(&mut self.pending);
            v.extend_from_slice(chunk);
            v.into()
        };
        let mut pos = 0;
        loop {
            let rest = &data[pos..];
            if self.frame.is_some() {
                match self.feed_frame(rest, &mut out) {
                    Some(used) => pos += used,
                    None => return,
                }
                continue;
            }
            if self.piece.is_some() {
                match self.feed_piece(rest, &mut out) {
                    Some(used) => pos += used,
                    None => return,
                }
                continue;
            }
            match self.next_marker(rest) {
                Some((e, true)) => {
                    out(Piece::Output(&rest[..e]));
                    self.found = true;
                    let after = rest[e + self.marker.len()..].to_vec();
                    self.feed_done(&after);
                    return;
                }
                Some((d, false)) => {
                    out(Piece::Output(&rest[..d]));
                    self.piece = Some(Vec::new());
                    pos += d + self.display.as_ref().map_or(0, Vec::len);
                }
                None => {
                    // Hold back only a suffix that could be the start of a marker.
                    let hold = self.hold_from(rest);
                    out(Piece::Output(&rest[..hold]));
                    self.pending = rest[hold..].to_vec();
                    return;
                }
            }
        }
    }

    /// Consumes display-piece bytes from `data`; returns how many, or None when all of it
    /// went into an unfinished piece.
    fn feed_piece(&mut self, data: &[u8], out: &mut impl FnMut(Piece<'_>)) -> Option<usize> {
        let piece = self.piece.as_mut()?;
        if piece.is_empty() {
            let stream = match data.first() {
                Some(b'e') => Some(Stream::Stderr),
                Some(b't') => Some(Stream::Traceback),
                Some(_) => None,
                None => return None,
            };
            if let Some(stream) = stream {
                self.piece = None;
                self.frame = Some(Frame {
                    stream,
                    head: Vec::new(),
                    left: None,
                });
                return Some(1);
            }
        }
        // A piece is ASCII JSON: a newline ends it, and \x01 (which starts every marker) never
        // occurs in it, so a marker cuts a forged piece short instead of hiding in it.
        let stop = memchr::memchr2(b'\n', 1, data);
        let take = stop.unwrap_or(data.len());
        if piece.len() + take > MAX_DISPLAY_PIECE {
            self.piece = None;
            out(Piece::Broken);
            // The forged piece's bytes are dropped; what follows is output again.
            return Some(take);
        }
        piece.extend_from_slice(&data[..take]);
        let stop = stop?;
        let piece = self.piece.take().unwrap_or_default();
        if data[stop] == 1 {
            out(Piece::Broken);
            return Some(stop);
        }
        match piece.split_first() {
            Some((b'+', bytes)) => out(Piece::Display { bytes, last: false }),
            Some((b'.', bytes)) => out(Piece::Display { bytes, last: true }),
            _ => out(Piece::Broken),
        }
        Some(stop + 1)
    }

    /// Consumes stderr or traceback frame bytes from `data` (its length, then its bytes, which
    /// are not searched for markers); returns how many, or None when all of it was used.
    fn feed_frame(&mut self, data: &[u8], out: &mut impl FnMut(Piece<'_>)) -> Option<usize> {
        let frame = self.frame.as_mut()?;
        let mut used = 0;
        let left = match frame.left {
            Some(left) => left,
            None => {
                let take = (FRAME_LENGTH_DIGITS - frame.head.len()).min(data.len());
                frame.head.extend_from_slice(&data[..take]);
                used = take;
                if frame.head.len() < FRAME_LENGTH_DIGITS {
                    return None;
                }
                let length = std::str::from_utf8(&frame.head)
                    .ok()
                    .and_then(|hex| usize::from_str_radix(hex, 16).ok())
                    .filter(|&n| n <= MAX_DISPLAY_PIECE);
                match length {
                    Some(n) if n > 0 => n,
                    // Not a frame the runner writes (or an empty one): what follows is output.
                    _ => {
                        self.frame = None;
                        return Some(used);
                    }
                }
            }
        };
        let body = &data[used..];
        let take = left.min(body.len());
        let stream = frame.stream;
        if take > 0 {
            out(match stream {
                Stream::Stderr => Piece::Stderr(&body[..take]),
                Stream::Traceback => Piece::Traceback(&body[..take]),
            });
        }
        used += take;
        if take == left {
            self.frame = None;
        } else {
            frame.left = Some(left - take);
        }
        if used == data.len() && self.frame.is_some() {
            return None;
        }
        Some(used)
    }

    /// The first marker in `data`, in one pass: its position, and true for the end marker,
    /// false for the display marker.
    fn next_marker(&self, data: &[u8]) -> Option<(usize, bool)> {
        let display = self.display.as_deref().unwrap_or_default();
        let end_first = *self.marker.first()?;
        let display_first = display.first().copied().unwrap_or(end_first);
        let mut start = 0;
        while let Some(off) = memchr::memchr2(end_first, display_first, &data[start..]) {
            let i = start + off;
            if data[i..].starts_with(&self.marker) {
                return Some((i, true));
            }
            if !display.is_empty() && data[i..].starts_with(display) {
                return Some((i, false));
            }
            start = i + 1;
        }
        None
    }

    /// Where the held-back suffix starts: the earliest position from which the rest could be
    /// the beginning of the end marker or the display marker.
    fn hold_from(&self, data: &[u8]) -> usize {
        let longest = self
            .marker
            .len()
            .max(self.display.as_ref().map_or(0, Vec::len));
        let start = data.len().saturating_sub(longest.saturating_sub(1));
        (start..data.len())
            .find(|&i| {
                self.marker.starts_with(&data[i..])
                    || self
                        .display
                        .as_ref()
                        .is_some_and(|d| d.starts_with(&data[i..]))
            })
            .unwrap_or(data.len())
    }
}
