//! Sending an HTTP/2 connection's answer bodies: the queue of answers waiting for
//! flow-control window (`Http2::sending`), which goes next (RFC 9218 urgency, then
//! incremental round-robin: [`pick`]), DATA frames of memory, files and relayed answers as the
//! windows and the output allow ([`Http2::pump`]), answers that can never get window once the
//! client is gone, and the [`Stall`] the write timeout runs from.

use std::os::unix::fs::FileExt;

use tern_http2::frame::HEADER_LEN;
use tern_http2::{ErrorCode, Priority};
use tern_runtime::ratelog;

use super::{Http2, Remaining, Stall, PUMP_TARGET};
use crate::conn::output::Output;
use crate::conn::relay::HeldAnswer;
use crate::exchange::ConnCx;
use crate::response::{Body, FileBody};

/// DATA bytes that must go out for a stalled connection's write timeout to start over: a
/// client dribbling window a few bytes at a time does not keep it open.
const STALL_PROGRESS: usize = 16 * 1024;

impl Remaining {
    fn len(&self) -> u64 {
        match self {
            Remaining::Memory(b) => b.len() as u64,
            Remaining::File { body } => body.len,
            Remaining::Relay => 0,
        }
    }
}

impl Stall {
    /// The stall as of `now`: over when nothing is `owed`; else begun now if it had not, or
    /// if enough DATA went out since it began.
    fn at(self, owed: bool, now: u64) -> Stall {
        if !owed {
            Stall::default()
        } else if self.since_ms.is_none() || self.data >= STALL_PROGRESS {
            Stall {
                since_ms: Some(now),
                data: 0,
            }
        } else {
            self
        }
    }
}

impl Http2 {
    /// Queues DATA frames while there is window and the output is short, by priority: the
    /// lowest urgency first; within it, non-incremental answers one after another in stream
    /// order, incremental ones a frame each in turn (RFC 9218 §4).
    pub(super) fn pump(&mut self, out: &mut Output, cx: &mut ConnCx<'_>) {
        self.pump_frames(out, cx);
        // A frame just sent may have taken the last of a window that can no longer grow.
        self.drop_starved(cx);
    }

    /// The frames of [`Http2::pump`].
    fn pump_frames(&mut self, out: &mut Output, cx: &mut ConnCx<'_>) {
        while out.pending() < PUMP_TARGET && !self.session.is_closed() {
            let Some(i) = self.next_to_send() else {
                return;
            };
            if matches!(self.sending[i].body, Remaining::Relay) {
                self.pump_relay(i, out, cx);
                continue;
            }
            let s = &mut self.sending[i];
            let mut cap = self.session.send_capacity(s.stream);
            let file_segments = self.file_frame > 0 && matches!(s.body, Remaining::File { .. });
            if file_segments {
                cap = cap.min(self.file_frame as usize);
            }
            let n = (cap as u64).min(s.body.len()) as usize;
            let end = n as u64 == s.body.len();
            let id = s.stream;
            match &mut s.body {
                Remaining::Memory(b) => {
                    let header = self.session.data_frame(id, n, end);
                    out.head_buf(|| cx.buffers.take_write());
                    out.push_copy(&header);
                    out.push_body(Body::Shared(b.split_to(n)));
                }
                Remaining::File { body } if file_segments => {
                    // A file that shrinks under a segment fails the transport's read: the
                    // connection closes (in plain TCP only the stream is reset).
                    let header = self.session.data_frame(id, n, end);
                    out.head_buf(|| cx.buffers.take_write());
                    out.push_copy(&header);
                    out.push_body(Body::File(FileBody {
                        file: body.file.clone(),
                        offset: body.offset,
                        len: n as u64,
                    }));
                    body.offset += n as u64;
                    body.len -= n as u64;
                }
                Remaining::File { body } => {
                    // Plain TCP: read next to its frame header, so the frame is one contiguous
                    // piece of output and one write carries many frames.
                    let buf = out.head_buf(|| cx.buffers.take_write());
                    let before = buf.len();
                    buf.resize(before + HEADER_LEN + n, 0);
                    if let Err(e) = body
                        .file
                        .read_exact_at(&mut buf[before + HEADER_LEN..], body.offset)
                    {
                        buf.truncate(before);
                        if ratelog::admit("http2_file_read", cx.clock.now_ms()) {
                            tracing::warn!("file read failed mid-answer ({e}); stream reset");
                        }
                        self.sending.swap_remove(i);
                        self.session.reset(id, ErrorCode::Internal, buf);
                        out.commit(before);
                        continue;
                    }
                    let header = self.session.data_frame(id, n, end);
                    buf[before..before + HEADER_LEN].copy_from_slice(&header);
                    out.commit(before);
                    body.offset += n as u64;
                    body.len -= n as u64;
                }
                Remaining::Relay => unreachable!("relayed answers are pumped by pump_relay"),
            }
            self.frame_queued(i, id, n, end, out, cx);
        }
    }

    /// One DATA frame of the relayed answer at `sending[i]`, as the window allows.
    fn pump_relay(&mut self, i: usize, out: &mut Output, cx: &mut ConnCx<'_>) {
        let id = self.sending[i].stream;
        let cap = self.session.send_capacity(id);
        let Some(answer) = self
            .relays
            .iter_mut()
            .find(|r| r.id == id)
            .map(|r| &mut r.answer)
        else {
            self.sending.swap_remove(i);
            return;
        };
        if answer.broken {
            // flush_relays resets it.
            self.sending.swap_remove(i);
            return;
        }
        let n = cap.min(answer.data.len());
        let end = answer.end && n == answer.data.len();
        let header = self.session.data_frame(id, n, end);
        out.head_buf(|| cx.buffers.take_write());
        out.push_copy(&header);
        out.push_copy(&answer.data[..n]);
        answer.data.drain(..n);
        self.frame_queued(i, id, n, end, out, cx);
    }

    /// A DATA frame of `n` bytes was queued for the answer at `sending[i]` (stream `id`);
    /// `end`: it was the last, and the answer is out of the queue.
    fn frame_queued(
        &mut self,
        i: usize,
        id: u32,
        n: usize,
        end: bool,
        out: &mut Output,
        cx: &mut ConnCx<'_>,
    ) {
        self.last_served = id;
        self.data_sent(n);
        if end {
            self.sending.swap_remove(i);
            let buf = out.head_buf(|| cx.buffers.take_write());
            let before = buf.len();
            self.session.answer_sent(id, buf);
            out.commit(before);
        }
    }

    /// `n` bytes of DATA were queued: progress for a stall.
    pub(super) fn data_sent(&self, n: usize) {
        let mut stall = self.stall.get();
        stall.data = stall.data.saturating_add(n);
        self.stall.set(stall);
    }

    /// Since when the connection has been stalled, if it is (`owed`: it has bytes for the
    /// client that wait), as of `now`; see [`Stall`].
    pub(super) fn stalled_since(&self, owed: bool, now: u64) -> Option<u64> {
        let stall = self.stall.get().at(owed, now);
        self.stall.set(stall);
        stall.since_ms
    }

    fn next_to_send(&self) -> Option<usize> {
        let ready = self.sending.iter().map(|s| {
            let window = self.session.send_capacity(s.stream) > 0;
            let ready = match s.body {
                // An empty last frame needs no window.
                Remaining::Relay => {
                    self.relay_has_output(s.stream) && (window || self.relay_only_ends(s.stream))
                }
                _ => window,
            };
            (s.stream, s.priority, ready)
        });
        pick(ready, self.last_served)
    }

    /// A proxied answer has nothing left but its end.
    fn relay_only_ends(&self, id: u32) -> bool {
        self.h2_answer(id)
            .is_some_and(|a| a.data.is_empty() && a.end)
    }

    /// A proxied answer has body bytes (or its end) to send.
    pub(super) fn relay_has_output(&self, id: u32) -> bool {
        self.h2_answer(id)
            .is_some_and(|a| !a.data.is_empty() || a.end || a.broken)
    }

    fn h2_answer(&self, id: u32) -> Option<&HeldAnswer> {
        self.relays.iter().find(|r| r.id == id).map(|r| &r.answer)
    }

    /// After the peer's EOF no WINDOW_UPDATE can come: an answer that needs window and has
    /// none left can never be completed. Its relay is abandoned now (its encoder and
    /// buffers freed, its upstream released) and its body forgotten, rather than held until
    /// the write timeout for a client that is gone.
    pub(super) fn drop_starved(&mut self, cx: &ConnCx<'_>) {
        if !self.peer_eof {
            return;
        }
        let session = &self.session;
        let starved = |id: u32| session.send_capacity(id) == 0;
        for r in &mut self.relays {
            let owes_data = !r.answer.end || !r.answer.data.is_empty();
            if owes_data && starved(r.id) {
                self.sending.retain(|s| s.stream != r.id);
                r.abandon(cx.stats);
            }
        }
        // Bodies of the connection's own answers (files, memory) likewise.
        self.sending.retain(|s| {
            matches!(s.body, Remaining::Relay) || s.body.len() == 0 || !starved(s.stream)
        });
    }
}

/// Which answer sends its next frame (RFC 9218 §4), by position in `queue` (stream id,
/// priority, whether its window is open): the lowest urgency among the ready ones; within
/// it, a non-incremental answer before incremental ones, the lowest stream id first (one
/// after another); incremental ones take turns, the next stream id after the one served
/// last.
fn pick(
    queue: impl Iterator<Item = (u32, Priority, bool)> + Clone,
    last_served: u32,
) -> Option<usize> {
    let ready = queue.enumerate().filter(|(_, (_, _, ready))| *ready);
    let urgency = ready.clone().map(|(_, (_, p, _))| p.urgency).min()?;
    let candidates = ready.filter(move |(_, (_, p, _))| p.urgency == urgency);
    if let Some((i, _)) = candidates
        .clone()
        .filter(|(_, (_, p, _))| !p.incremental)
        .min_by_key(|(_, (id, _, _))| *id)
    {
        return Some(i);
    }
    candidates
        .min_by_key(|(_, (id, _, _))| (*id <= last_served, *id))
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(urgency: u8, incremental: bool) -> Priority {
        Priority {
            urgency,
            incremental,
        }
    }

    #[test]
    fn only_data_moves_a_stall_deadline() {
        let begun = Stall::default().at(true, 1_000);
        assert_eq!(begun.since_ms, Some(1_000));
        // Time passing and frames other than DATA (nothing counted) move nothing.
        assert_eq!(begun.at(true, 5_000), begun);
        // A dribble of DATA short of STALL_PROGRESS moves nothing either.
        let dribbled = Stall {
            data: STALL_PROGRESS - 1,
            ..begun
        };
        assert_eq!(dribbled.at(true, 6_000).since_ms, Some(1_000));
        // Enough DATA starts it over; nothing owed ends it.
        let moved = Stall {
            data: STALL_PROGRESS,
            ..begun
        };
        assert_eq!(
            moved.at(true, 7_000),
            Stall {
                since_ms: Some(7_000),
                data: 0
            }
        );
        assert_eq!(moved.at(false, 7_000), Stall::default());
    }

    #[test]
    fn urgent_answers_go_first_and_incremental_ones_take_turns() {
        // An image (default priority) queued before a stylesheet (u=0): the stylesheet first.
        let q = [(1, p(3, false), true), (3, p(0, false), true)];
        assert_eq!(pick(q.iter().copied(), 0), Some(1));
        // A stylesheet whose window is shut does not hold the image back.
        let q = [(1, p(3, false), true), (3, p(0, false), false)];
        assert_eq!(pick(q.iter().copied(), 0), Some(0));
        // Non-incremental answers of one urgency go one after another, by stream id.
        let q = [(7, p(3, false), true), (5, p(3, false), true)];
        assert_eq!(pick(q.iter().copied(), 7), Some(1));
        // Incremental ones round-robin: after 5 comes 7, after 7 comes 5 again.
        let q = [(5, p(3, true), true), (7, p(3, true), true)];
        assert_eq!(pick(q.iter().copied(), 5), Some(1));
        assert_eq!(pick(q.iter().copied(), 7), Some(0));
        // Of one urgency, a non-incremental answer goes before incremental ones.
        let q = [(5, p(3, true), true), (9, p(3, false), true)];
        assert_eq!(pick(q.iter().copied(), 0), Some(1));
        assert_eq!(pick([(1, p(3, false), false)].iter().copied(), 0), None);
    }
}
