//! A process's recent output: the last [`OUTPUT_BUFFER_BYTES`](super::OUTPUT_BUFFER_BYTES)
//! bytes of its stdout and stderr in arrival order, each byte at an absolute offset, so a
//! reader that attaches late starts from what is kept and one that falls behind learns how
//! many bytes it missed.

use std::collections::VecDeque;

use bytes::Bytes;

use crate::kernel::CommandStream;

/// The kept output.
#[derive(Debug)]
pub(super) struct Ring {
    cap: usize,
    pieces: VecDeque<(CommandStream, Bytes)>,
    /// Offset of the first kept byte.
    start: u64,
    /// Bytes kept.
    kept: usize,
}

/// What a reader at some offset gets.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Read {
    /// Bytes between the reader's offset and the first kept one (dropped before it read them).
    pub(super) missed: u64,
    /// The pieces from there on.
    pub(super) pieces: Vec<(CommandStream, Bytes)>,
    /// The offset after them: where the reader goes on.
    pub(super) next: u64,
}

impl Ring {
    /// An empty ring keeping `cap` bytes.
    pub(super) fn new(cap: usize) -> Ring {
        Ring {
            cap,
            pieces: VecDeque::new(),
            start: 0,
            kept: 0,
        }
    }

    /// The offset after the last byte.
    pub(super) fn end(&self) -> u64 {
        self.start + self.kept as u64
    }

    /// Appends a piece, dropping the oldest bytes past the cap.
    pub(super) fn push(&mut self, stream: CommandStream, mut bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        if bytes.len() > self.cap {
            let cut = bytes.len() - self.cap;
            self.start += (self.kept + cut) as u64;
            self.pieces.clear();
            self.kept = 0;
            bytes = bytes.slice(cut..);
        }
        self.kept += bytes.len();
        self.pieces.push_back((stream, bytes));
        while self.kept > self.cap {
            let over = self.kept - self.cap;
            let Some((stream, front)) = self.pieces.pop_front() else {
                break;
            };
            if front.len() > over {
                self.pieces.push_front((stream, front.slice(over..)));
                self.kept -= over;
                self.start += over as u64;
            } else {
                self.kept -= front.len();
                self.start += front.len() as u64;
            }
        }
    }

    /// What there is from `offset` on.
    pub(super) fn read_from(&self, offset: u64) -> Read {
        let missed = self.start.saturating_sub(offset);
        let mut skip = offset.saturating_sub(self.start);
        let mut pieces = Vec::new();
        for (stream, bytes) in &self.pieces {
            let len = bytes.len() as u64;
            if skip >= len {
                skip -= len;
                continue;
            }
            pieces.push((*stream, bytes.slice(skip as usize..)));
            skip = 0;
        }
        Read {
            missed,
            pieces,
            next: self.end().max(offset),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(read: &Read) -> String {
        read.pieces
            .iter()
            .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
            .collect()
    }

    #[test]
    fn a_late_reader_gets_what_is_kept_and_how_much_it_missed() {
        let mut ring = Ring::new(8);
        ring.push(CommandStream::Stdout, Bytes::from_static(b"abcd"));
        ring.push(CommandStream::Stderr, Bytes::from_static(b"efgh"));
        let all = ring.read_from(0);
        assert_eq!(
            (all.missed, text(&all).as_str(), all.next),
            (0, "abcdefgh", 8)
        );
        ring.push(CommandStream::Stdout, Bytes::from_static(b"ijk"));
        let late = ring.read_from(0);
        assert_eq!(
            (late.missed, text(&late).as_str(), late.next),
            (3, "defghijk", 11)
        );
        let mid = ring.read_from(9);
        assert_eq!((mid.missed, text(&mid).as_str()), (0, "jk"));
        assert_eq!(ring.read_from(11).pieces, Vec::new());
    }

    #[test]
    fn one_piece_past_the_cap_keeps_its_tail() {
        let mut ring = Ring::new(4);
        ring.push(CommandStream::Stdout, Bytes::from_static(b"ab"));
        ring.push(CommandStream::Stdout, Bytes::from_static(b"0123456789"));
        let read = ring.read_from(0);
        assert_eq!(
            (read.missed, text(&read).as_str(), read.next),
            (8, "6789", 12)
        );
    }
}
