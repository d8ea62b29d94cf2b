//! The server side of one HTTP/2 connection (RFC 9113), sans-IO: [`Session::recv`] takes
//! bytes and writes the control frames they call for (SETTINGS ACK, PING ACK, WINDOW_UPDATE,
//! RST_STREAM, GOAWAY) into the caller's buffer; complete requests come out as [`Event`]s;
//! answers go back in with [`Session::response`] and [`Session::data_frame`], which keep the
//! stream states and flow-control windows. Every limit against hostile peers lives here:
//! concurrent streams, header block size and CONTINUATION count, the decoded header list,
//! body size, a reset budget (rapid reset, CVE-2023-44487, and "MadeYouReset",
//! CVE-2025-8671) and a budget for frames that are all overhead (PING, SETTINGS, empty DATA,
//! WINDOW_UPDATE and PRIORITY floods).

use std::collections::VecDeque;

use crate::frame::{
    self, flag, kind, setting, ErrorCode, FrameHeader, DEFAULT_MAX_FRAME_SIZE, DEFAULT_WINDOW,
    HEADER_LEN, MAX_FRAME_SIZE_LIMIT, MAX_WINDOW, PREFACE,
};
use crate::hpack::{self, Indexing};
use crate::priority::Priority;
use crate::request::{check_trailer, Malformed, RequestData, MAX_FIELDS};

/// What a session allows its peer. The defaults are the numbers in ARCHITECTURE.md.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// SETTINGS_MAX_CONCURRENT_STREAMS (nginx 128, h2o 100).
    pub max_concurrent_streams: u32,
    /// The receive window of each stream (SETTINGS_INITIAL_WINDOW_SIZE).
    pub stream_window: u32,
    /// The connection's receive window (raised from 65 535 by a WINDOW_UPDATE at start).
    pub connection_window: u32,
    /// SETTINGS_MAX_HEADER_LIST_SIZE: the decoded header list (name + value + 32 each);
    /// over it a request is answered 431.
    pub max_header_list: u32,
    /// Most CONTINUATION frames after one HEADERS (the 2024 CONTINUATION flood).
    pub max_continuations: u32,
    /// Largest request body; over it the request is answered 413.
    pub max_body: u64,
    /// Request bodies held by one connection; past it only the oldest stream still receiving
    /// gets its window back (so 100 streams cannot each park a full body). At most about
    /// this plus one stream window per stream is ever buffered.
    pub max_buffered_bodies: usize,
    /// Streams the peer may make us reset (its own RST_STREAMs of unfinished streams, and
    /// stream errors it causes) beyond the streams it completes.
    pub reset_budget: i32,
    /// Frames that carry no request progress (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, empty
    /// DATA, unknown types) the peer may send beyond what its requests earn.
    pub overhead_budget: i32,
    /// Accept RFC 8441's extended CONNECT (a CONNECT with `:protocol`, how browsers open a
    /// WebSocket over HTTP/2) and say so with SETTINGS_ENABLE_CONNECT_PROTOCOL. Off, a
    /// `:protocol` is malformed like any unknown pseudo-header.
    pub extended_connect: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_concurrent_streams: 100,
            stream_window: 128 * 1024,
            connection_window: 1024 * 1024,
            max_header_list: 32 * 1024,
            max_continuations: 8,
            max_body: 1024 * 1024,
            max_buffered_bodies: 4 * 1024 * 1024,
            reset_budget: 100,
            overhead_budget: 1000,
            extended_connect: false,
        }
    }
}

/// What the caller must act on, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A request is complete (head and body): take it with [`Session::take_request`].
    Request(u32),
    /// A request's head arrived without END_STREAM: a body may follow. The caller chooses,
    /// with [`Session::gather_body`] (the body is collected, up to `max_body`, and `Request`
    /// follows) or [`Session::stream_body`] (the request is taken now and its body read as
    /// it comes with [`Session::body_chunk`]), or leaves the stream undecided until its body
    /// shows what it is: `Body` follows when its first bytes or its end arrive. Until then
    /// its window is held.
    Head(u32),
    /// More of a streamed body arrived, or its end; on a stream still undecided, the first
    /// bytes of its body or its end ([`Session::body_chunk`] says which).
    Body(u32),
    /// A request must be answered with this status without running a handler (431: header
    /// list too large; 413: body too large). Its body, if any, is discarded.
    Refuse { stream: u32, status: u16 },
    /// The stream is gone (the peer reset it, or we did): drop whatever answer is in progress.
    Reset(u32),
    /// A stream's priority changed (PRIORITY_UPDATE).
    Reprioritize(u32),
    /// A stream error we answered with RST_STREAM (for counting and logging).
    StreamError(&'static str),
}

/// A connection error: a GOAWAY with this code was written and the session is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnError {
    pub code: ErrorCode,
    pub reason: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the 24-byte client preface.
    Preface,
    /// The preface arrived; the first frame must be SETTINGS.
    FirstSettings,
    Open,
    /// A connection error was sent: input is ignored.
    Closed,
}

struct Stream {
    id: u32,
    /// END_STREAM received (or the request was refused and its body is being discarded).
    recv_closed: bool,
    /// END_STREAM sent.
    send_closed: bool,
    send_window: i64,
    /// What the peer may still send on this stream before we return window.
    recv_window: i64,
    recv_unacked: u32,
    /// DATA payload bytes received (for content-length).
    received: u64,
    /// Answered without a handler (413/431): DATA is counted and dropped.
    refused: bool,
    /// The request event was raised (taken or about to be).
    dispatched: bool,
    /// The caller has chosen how to take the body (see [`Event::Head`]).
    decided: bool,
    /// The body is read as it comes ([`Session::stream_body`]).
    streamed: bool,
    /// Response HEADERS went out.
    answered: bool,
    /// When the stream opened or last received body bytes (the caller's clock).
    progress_ms: u64,
    priority: Priority,
    data: RequestData,
}

/// The peer's settings that shape what we send.
struct PeerSettings {
    initial_window: u32,
    max_frame_size: u32,
}

/// A header block spread over HEADERS and CONTINUATION frames.
struct Continuation {
    stream: u32,
    end_stream: bool,
    self_dependent: bool,
    frames: u32,
}

/// Recently closed stream ids, to tell "closed" from "never opened" (different errors), and
/// to ignore frames the peer sent before it saw our RST_STREAM.
#[derive(Default)]
struct Recent {
    ids: [u32; 32],
    reset_by_us: [bool; 32],
    next: usize,
}

impl Recent {
    fn push(&mut self, id: u32, reset_by_us: bool) {
        self.ids[self.next] = id;
        self.reset_by_us[self.next] = reset_by_us;
        self.next = (self.next + 1) % self.ids.len();
    }

    fn find(&self, id: u32) -> Option<bool> {
        (id != 0)
            .then(|| self.ids.iter().position(|&i| i == id))
            .flatten()
            .map(|i| self.reset_by_us[i])
    }
}

pub struct Session {
    cfg: Config,
    state: State,
    decoder: hpack::Decoder,
    encoder: hpack::Encoder,
    peer: PeerSettings,
    send_window: i64,
    recv_window: i64,
    recv_unacked: u32,
    buffered: usize,
    streams: Vec<Stream>,
    spare: Vec<RequestData>,
    last_peer_stream: u32,
    recent: Recent,
    continuation: Option<Continuation>,
    /// The header block being gathered from CONTINUATION frames (kept for reuse).
    block: Vec<u8>,
    events: VecDeque<Event>,
    reset_budget: i32,
    overhead_budget: i32,
    /// GOAWAY sent with this last stream id: later streams are ignored.
    goaway_sent: Option<u32>,
    peer_goaway: bool,
    /// PRIORITY_UPDATEs for streams not yet opened (RFC 9218 §7.1), a few at most.
    early_priorities: Vec<(u32, Priority)>,
    error: Option<ConnError>,
    /// Some stream has used half its receive window (see `return_stream_windows`).
    windows_due: bool,
    /// The caller's clock (see `set_time`).
    now_ms: u64,
}

type Step = Result<(), ConnError>;

/// Request buffers kept for reuse: enough for a client's usual batch of streams, so a busy
/// connection allocates nothing per request (an idle one gives them back).
const SPARE_REQUESTS: usize = 32;

/// Streamed request bodies (proxy routes) a connection may hold for its relays, all streams
/// together, before its window stops coming back (see `return_connection_window`).
pub const STREAMED_BODY_BUDGET: usize = 512 * 1024;

fn conn_err(code: ErrorCode, reason: &'static str) -> Step {
    Err(ConnError { code, reason })
}

impl Session {
    /// A server session. Our SETTINGS and the connection window update are written to `out`
    /// at once (the server speaks first, RFC 9113 §3.4).
    pub fn new(cfg: Config, out: &mut Vec<u8>) -> Session {
        let settings = [
            (setting::MAX_CONCURRENT_STREAMS, cfg.max_concurrent_streams),
            (setting::INITIAL_WINDOW_SIZE, cfg.stream_window),
            (setting::MAX_HEADER_LIST_SIZE, cfg.max_header_list),
            (setting::ENABLE_PUSH, 0),
            (setting::NO_RFC7540_PRIORITIES, 1),
            (setting::ENABLE_CONNECT_PROTOCOL, 1),
        ];
        // The last one only when extended CONNECT is accepted.
        let n = settings.len() - usize::from(!cfg.extended_connect);
        frame::write_settings(out, &settings[..n]);
        if cfg.connection_window > DEFAULT_WINDOW {
            frame::write_window_update(out, 0, cfg.connection_window - DEFAULT_WINDOW);
        }
        Session {
            state: State::Preface,
            decoder: hpack::Decoder::new(4096),
            encoder: hpack::Encoder::new(),
            peer: PeerSettings {
                initial_window: DEFAULT_WINDOW,
                max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            },
            send_window: i64::from(DEFAULT_WINDOW),
            recv_window: i64::from(cfg.connection_window.max(DEFAULT_WINDOW)),
            recv_unacked: 0,
            buffered: 0,
            streams: Vec::new(),
            spare: Vec::new(),
            last_peer_stream: 0,
            recent: Recent::default(),
            continuation: None,
            block: Vec::new(),
            events: VecDeque::new(),
            reset_budget: cfg.reset_budget,
            overhead_budget: cfg.overhead_budget,
            goaway_sent: None,
            peer_goaway: false,
            early_priorities: Vec::new(),
            error: None,
            windows_due: false,
            now_ms: 0,
            cfg,
        }
    }

    /// Processes the complete frames at the start of `input`, writing the control frames they
    /// call for to `out`. Returns the bytes consumed (a partial frame is left for later). On a
    /// connection error a GOAWAY is written, the session is closed and the error returned.
    pub fn recv(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, ConnError> {
        let mut pos = 0;
        if self.state == State::Closed {
            return Ok(input.len());
        }
        if self.state == State::Preface {
            let n = input.len().min(PREFACE.len());
            if input[..n] != PREFACE[..n] {
                return self.fail(
                    ConnError {
                        code: ErrorCode::Protocol,
                        reason: "bad connection preface",
                    },
                    out,
                );
            }
            if n < PREFACE.len() {
                return Ok(0);
            }
            pos = PREFACE.len();
            self.state = State::FirstSettings;
        }
        while input.len() - pos >= HEADER_LEN {
            let header: &[u8; HEADER_LEN] = input[pos..pos + HEADER_LEN].try_into().unwrap();
            let h = FrameHeader::parse(header);
            if h.len > DEFAULT_MAX_FRAME_SIZE {
                return self.fail(
                    ConnError {
                        code: ErrorCode::FrameSize,
                        reason: "frame larger than SETTINGS_MAX_FRAME_SIZE",
                    },
                    out,
                );
            }
            let end = pos + HEADER_LEN + h.len as usize;
            if input.len() < end {
                break;
            }
            let payload = &input[pos + HEADER_LEN..end];
            pos = end;
            if let Err(e) = self.frame(h, payload, out) {
                return self.fail(e, out);
            }
        }
        // Windows go back once per batch of frames, not per frame.
        self.return_connection_window(out);
        self.return_stream_windows(out);
        Ok(pos)
    }

    /// How many bytes the next frame needs in all (its header included), if `input` holds a
    /// frame header; lets the caller size its read buffer.
    pub fn frame_len(&self, input: &[u8]) -> Option<usize> {
        let skip = if self.state == State::Preface {
            PREFACE.len()
        } else {
            0
        };
        let h: &[u8; HEADER_LEN] = input.get(skip..skip + HEADER_LEN)?.try_into().ok()?;
        Some(skip + HEADER_LEN + FrameHeader::parse(h).len as usize)
    }

    fn fail(&mut self, e: ConnError, out: &mut Vec<u8>) -> Result<usize, ConnError> {
        frame::write_goaway(out, self.last_peer_stream, e.code);
        self.state = State::Closed;
        self.error = Some(e);
        self.continuation = None;
        Err(e)
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        while let Some(e) = self.events.pop_front() {
            // A `Body` raised while its stream was undecided says nothing once the caller has
            // chosen to gather that body (or it was refused): `Request` follows instead.
            if let Event::Body(id) = e {
                if self
                    .find(id)
                    .is_some_and(|i| self.streams[i].decided && !self.streams[i].streamed)
                {
                    continue;
                }
            }
            return Some(e);
        }
        None
    }

    /// The connection error that closed the session, if one did.
    pub fn error(&self) -> Option<ConnError> {
        self.error
    }

    pub fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// No request can come any more (GOAWAY either way, or an error) and no stream is open:
    /// close once the output is sent.
    pub fn is_finished(&self) -> bool {
        (self.state == State::Closed || self.goaway_sent.is_some() || self.peer_goaway)
            && self.streams.is_empty()
    }

    /// Streams in progress (either side still open).
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// A header block is half received (CONTINUATION pending) or the preface/SETTINGS are
    /// still to come: the header timeout applies.
    pub fn is_mid_head(&self) -> bool {
        self.continuation.is_some() || matches!(self.state, State::Preface | State::FirstSettings)
    }

    /// `input` (unprocessed bytes) starts a DATA frame: a slow body, not a slow head.
    pub fn partial_is_data(&self, input: &[u8]) -> bool {
        self.state == State::Open && input.get(3) == Some(&kind::DATA)
    }

    /// True if some stream is still receiving its request body.
    pub fn is_receiving_body(&self) -> bool {
        self.body_progress().is_some()
    }

    /// The caller's clock, for the time of the frames `recv` takes next (the session keeps
    /// no clock of its own).
    pub fn set_time(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
    }

    /// When the stream that has waited longest for more of its body last got some (or was
    /// opened): the body timeout runs from there, so one stream trickling bytes cannot keep
    /// another stalled one alive.
    pub fn body_progress(&self) -> Option<u64> {
        self.streams
            .iter()
            .filter(|s| !s.recv_closed && !s.dispatched && !s.refused)
            .map(|s| s.progress_ms)
            .min()
    }

    /// Graceful shutdown (RFC 9113 §6.8): streams up to the last one seen are still answered,
    /// later ones ignored.
    pub fn go_away(&mut self, out: &mut Vec<u8>) {
        if self.goaway_sent.is_none() && self.state != State::Closed {
            frame::write_goaway(out, self.last_peer_stream, ErrorCode::NoError);
            self.goaway_sent = Some(self.last_peer_stream);
        }
    }

    /// Closes with a connection error of our own (e.g. the peer stopped reading).
    pub fn abort(&mut self, code: ErrorCode, reason: &'static str, out: &mut Vec<u8>) {
        if self.state != State::Closed {
            let _ = self.fail(ConnError { code, reason }, out);
        }
    }

    fn find(&self, id: u32) -> Option<usize> {
        self.streams.iter().rposition(|s| s.id == id)
    }

    fn frame(&mut self, h: FrameHeader, p: &[u8], out: &mut Vec<u8>) -> Step {
        if let Some(c) = &self.continuation {
            if h.kind != kind::CONTINUATION || h.stream != c.stream {
                return conn_err(ErrorCode::Protocol, "header block interrupted");
            }
        }
        if self.state == State::FirstSettings {
            if h.kind != kind::SETTINGS || h.has(flag::ACK) {
                return conn_err(ErrorCode::Protocol, "first frame was not SETTINGS");
            }
            self.state = State::Open;
        }
        match h.kind {
            kind::DATA => self.on_data(h, p, out),
            kind::HEADERS => self.on_headers(h, p, out),
            kind::CONTINUATION => self.on_continuation(h, p, out),
            kind::PRIORITY => self.on_priority(h, p, out),
            kind::RST_STREAM => self.on_rst_stream(h, p),
            kind::SETTINGS => self.on_settings(h, p, out),
            kind::PING => self.on_ping(h, p, out),
            kind::GOAWAY => {
                if h.stream != 0 {
                    return conn_err(ErrorCode::Protocol, "GOAWAY on a stream");
                }
                if p.len() < 8 {
                    return conn_err(ErrorCode::FrameSize, "short GOAWAY");
                }
                self.peer_goaway = true;
                Ok(())
            }
            kind::WINDOW_UPDATE => self.on_window_update(h, p, out),
            kind::PUSH_PROMISE => conn_err(ErrorCode::Protocol, "PUSH_PROMISE from a client"),
            kind::PRIORITY_UPDATE => self.on_priority_update(h, p),
            _ => self.overhead(), // unknown types are ignored (§5.5), but cost like overhead
        }
    }

    /// One frame that moved no request forward.
    fn overhead(&mut self) -> Step {
        self.overhead_budget -= 1;
        if self.overhead_budget < 0 {
            return conn_err(ErrorCode::EnhanceYourCalm, "too many control frames");
        }
        Ok(())
    }

    /// Answers a stream error with RST_STREAM and forgets the stream.
    fn stream_error(
        &mut self,
        id: u32,
        code: ErrorCode,
        reason: &'static str,
        out: &mut Vec<u8>,
    ) -> Step {
        frame::write_rst_stream(out, id, code);
        if let Some(i) = self.find(id) {
            self.remove(i, true);
            self.events.push_back(Event::Reset(id));
        } else {
            self.recent.push(id, true);
        }
        self.events.push_back(Event::StreamError(reason));
        // The peer made us reset a stream ("MadeYouReset" when it is cheap for the peer).
        self.spend_reset()
    }

    fn spend_reset(&mut self) -> Step {
        self.reset_budget -= 1;
        if self.reset_budget < 0 {
            return conn_err(ErrorCode::EnhanceYourCalm, "too many reset streams");
        }
        Ok(())
    }

    fn remove(&mut self, i: usize, reset: bool) {
        let s = self.streams.swap_remove(i);
        self.recent.push(s.id, reset);
        if !s.dispatched {
            self.buffered -= s.data.body.len();
        }
        let mut data = s.data;
        // (A dispatched request's buffers were taken; what is left here is empty.)
        if !s.dispatched && data.body.capacity() <= 64 * 1024 && self.spare.len() < SPARE_REQUESTS {
            data.fields.clear();
            data.body.clear();
            self.spare.push(data);
        }
    }

    fn on_headers(&mut self, h: FrameHeader, p: &[u8], out: &mut Vec<u8>) -> Step {
        if h.stream == 0 {
            return conn_err(ErrorCode::Protocol, "HEADERS on stream 0");
        }
        let mut p = strip_padding(h, p)?;
        let mut self_dependent = false;
        if h.has(flag::PRIORITY) {
            if p.len() < 5 {
                return conn_err(ErrorCode::FrameSize, "HEADERS too short for its priority");
            }
            let dep = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
            self_dependent = dep == h.stream;
            p = &p[5..];
        }
        let end_stream = h.has(flag::END_STREAM);
        if !h.has(flag::END_HEADERS) {
            self.block.clear();
            self.block.extend_from_slice(p);
            self.continuation = Some(Continuation {
                stream: h.stream,
                end_stream,
                self_dependent,
                frames: 0,
            });
            return self.check_block_size();
        }
        self.header_block(h.stream, p, end_stream, self_dependent, out)
    }

    fn on_continuation(&mut self, h: FrameHeader, p: &[u8], out: &mut Vec<u8>) -> Step {
        let Some(c) = &mut self.continuation else {
            return conn_err(ErrorCode::Protocol, "CONTINUATION without HEADERS");
        };
        c.frames += 1;
        if c.frames > self.cfg.max_continuations {
            return conn_err(ErrorCode::EnhanceYourCalm, "too many CONTINUATION frames");
        }
        self.block.extend_from_slice(p);
        self.check_block_size()?;
        if !h.has(flag::END_HEADERS) {
            return Ok(());
        }
        let c = self.continuation.take().expect("checked above");
        let block = std::mem::take(&mut self.block);
        let result = self.header_block(c.stream, &block, c.end_stream, c.self_dependent, out);
        self.block = block;
        result
    }

    /// A header block is never buffered past the header list limit (encoded fields are
    /// never longer than decoded ones, give or take HPACK's own bytes).
    fn check_block_size(&self) -> Step {
        if self.block.len() > self.cfg.max_header_list as usize + 1024 {
            return conn_err(ErrorCode::EnhanceYourCalm, "header block too large");
        }
        Ok(())
    }

    fn header_block(
        &mut self,
        id: u32,
        block: &[u8],
        end_stream: bool,
        self_dependent: bool,
        out: &mut Vec<u8>,
    ) -> Step {
        if let Some(i) = self.find(id) {
            return self.trailers(i, block, end_stream, out);
        }
        if id <= self.last_peer_stream || id.is_multiple_of(2) {
            self.discard_block(block)?;
            return match self.recent.find(id) {
                // Sent before the peer saw our RST_STREAM (trailers, say): ignored (§5.1).
                Some(true) => Ok(()),
                _ if self.ignored_after_goaway(id) => Ok(()),
                Some(false) => conn_err(ErrorCode::StreamClosed, "HEADERS on a closed stream"),
                None => conn_err(ErrorCode::Protocol, "stream id not new or not odd"),
            };
        }
        self.last_peer_stream = id;
        if self.goaway_sent.is_some() {
            // After our GOAWAY new streams are ignored (§6.8); the block still updates HPACK.
            return self.discard_block(block);
        }
        if self.streams.len() >= self.cfg.max_concurrent_streams as usize {
            self.discard_block(block)?;
            frame::write_rst_stream(out, id, ErrorCode::RefusedStream);
            self.recent.push(id, true);
            self.events
                .push_back(Event::StreamError("over the concurrent stream limit"));
            return self.spend_reset();
        }
        let mut data = self.spare.pop().unwrap_or_default();
        data.stream = id;
        let decoded = self
            .decoder
            .decode(block, self.cfg.max_header_list as usize, |n, v| {
                data.fields.push(n, v, MAX_FIELDS)
            })
            .map_err(|_| ConnError {
                code: ErrorCode::Compression,
                reason: "bad HPACK block",
            })?;
        // Without any signal, answers share the connection in turn (a client that says
        // nothing, like h2load or curl, gets no head-of-line blocking between its streams);
        // a `priority` field means RFC 9218's defaults for what it leaves out.
        let mut priority = Priority::UNSIGNALLED;
        for (name, value) in data.fields_iter() {
            if name == b"priority" {
                priority = Priority::parse(value, Priority::default());
            }
        }
        if let Some(i) = self.early_priorities.iter().position(|(s, _)| *s == id) {
            priority = self.early_priorities.swap_remove(i).1;
        }
        let content_length = data.fields.content_length;
        self.streams.push(Stream {
            id,
            recv_closed: end_stream,
            send_closed: false,
            send_window: i64::from(self.peer.initial_window),
            recv_window: i64::from(self.cfg.stream_window),
            recv_unacked: 0,
            received: 0,
            refused: false,
            dispatched: false,
            decided: end_stream,
            streamed: false,
            answered: false,
            progress_ms: self.now_ms,
            priority,
            data,
        });
        let i = self.streams.len() - 1;
        let too_large = decoded.too_large || self.streams[i].data.fields.too_many;
        let verdict = self.streams[i]
            .data
            .fields
            .finish(self.cfg.extended_connect);
        if let Err(m) = verdict {
            if !too_large {
                return self.stream_error(id, ErrorCode::Protocol, m.reason(), out);
            }
        }
        if self_dependent {
            return self.stream_error(id, ErrorCode::Protocol, "stream depends on itself", out);
        }
        if too_large {
            self.refuse(i, 431);
            return Ok(());
        }
        if end_stream {
            if content_length.is_some_and(|n| n != 0) {
                let reason = Malformed::ContentLengthMismatch.reason();
                return self.stream_error(id, ErrorCode::Protocol, reason, out);
            }
            self.streams[i].dispatched = true;
            self.events.push_back(Event::Request(id));
        } else {
            // The caller says whether the body is gathered (then checked against max_body)
            // or streamed.
            self.events.push_back(Event::Head(id));
        }
        Ok(())
    }

    /// A stream the peer opened after our GOAWAY: we never took it, so its frames are ignored.
    fn ignored_after_goaway(&self, id: u32) -> bool {
        self.goaway_sent
            .is_some_and(|last| id > last && !id.is_multiple_of(2))
    }

    /// Decodes a block only to keep the HPACK table in step with the peer.
    fn discard_block(&mut self, block: &[u8]) -> Step {
        self.decoder
            .decode(block, 0, |_, _| Err(()))
            .map(|_| ())
            .map_err(|_| ConnError {
                code: ErrorCode::Compression,
                reason: "bad HPACK block",
            })
    }

    /// A second header block on an open stream: trailers, which must end the stream.
    fn trailers(&mut self, i: usize, block: &[u8], end_stream: bool, out: &mut Vec<u8>) -> Step {
        let id = self.streams[i].id;
        let mut malformed = None;
        self.decoder
            .decode(block, self.cfg.max_header_list as usize, |n, v| {
                check_trailer(n, v).map_err(|m| malformed = Some(m))
            })
            .map_err(|_| ConnError {
                code: ErrorCode::Compression,
                reason: "bad HPACK block",
            })?;
        if self.streams[i].recv_closed {
            return self.stream_error(id, ErrorCode::StreamClosed, "HEADERS after END_STREAM", out);
        }
        if !end_stream {
            return self.stream_error(id, ErrorCode::Protocol, "trailers without END_STREAM", out);
        }
        if let Some(m) = malformed {
            return self.stream_error(id, ErrorCode::Protocol, m.reason(), out);
        }
        self.end_of_request(i, out)
    }

    /// END_STREAM arrived on a stream with a body.
    fn end_of_request(&mut self, i: usize, out: &mut Vec<u8>) -> Step {
        let s = &mut self.streams[i];
        s.recv_closed = true;
        if s.refused {
            return self.maybe_close(i);
        }
        if s.data
            .fields
            .content_length
            .is_some_and(|n| n != s.received)
        {
            let (id, reason) = (s.id, Malformed::ContentLengthMismatch.reason());
            return self.stream_error(id, ErrorCode::Protocol, reason, out);
        }
        if s.streamed {
            self.events.push_back(Event::Body(s.id));
            return Ok(());
        }
        if !s.decided {
            // The caller chooses now (`gather_body` then raises the request).
            self.events.push_back(Event::Body(s.id));
            return Ok(());
        }
        s.dispatched = true;
        self.buffered -= s.data.body.len();
        self.events.push_back(Event::Request(s.id));
        Ok(())
    }

    fn refuse(&mut self, i: usize, status: u16) {
        let s = &mut self.streams[i];
        s.refused = true;
        s.dispatched = true;
        s.decided = true;
        self.buffered -= s.data.body.len();
        s.data.body = Vec::new();
        self.events.push_back(Event::Refuse {
            stream: s.id,
            status,
        });
    }

    fn on_data(&mut self, h: FrameHeader, p: &[u8], out: &mut Vec<u8>) -> Step {
        if h.stream == 0 {
            return conn_err(ErrorCode::Protocol, "DATA on stream 0");
        }
        // Flow control counts the whole payload, padding included (§6.9.1).
        let len = p.len() as i64;
        if len > self.recv_window {
            return conn_err(ErrorCode::FlowControl, "DATA beyond the connection window");
        }
        self.recv_window -= len;
        self.recv_unacked += p.len() as u32;
        let data = strip_padding(h, p)?;
        self.stream_data(h, data, len, out)
    }

    fn stream_data(&mut self, h: FrameHeader, data: &[u8], len: i64, out: &mut Vec<u8>) -> Step {
        let id = h.stream;
        let Some(i) = self.find(id) else {
            if id > self.last_peer_stream {
                return conn_err(ErrorCode::Protocol, "DATA on an idle stream");
            }
            if self.recent.find(id) == Some(true) || self.ignored_after_goaway(id) {
                return Ok(()); // sent before the peer saw our RST_STREAM or GOAWAY
            }
            return self.stream_error(id, ErrorCode::StreamClosed, "DATA on a closed stream", out);
        };
        let max_body = self.cfg.max_body;
        let s = &mut self.streams[i];
        if s.recv_closed {
            if s.refused {
                return Ok(());
            }
            return self.stream_error(id, ErrorCode::StreamClosed, "DATA after END_STREAM", out);
        }
        if len > s.recv_window {
            return self.stream_error(
                id,
                ErrorCode::FlowControl,
                "DATA beyond the stream window",
                out,
            );
        }
        s.recv_window -= len;
        s.recv_unacked += len as u32;
        s.received += data.len() as u64;
        if !data.is_empty() {
            s.progress_ms = self.now_ms;
        }
        if s.data.fields.content_length.is_some_and(|n| s.received > n) {
            let reason = Malformed::ContentLengthMismatch.reason();
            return self.stream_error(id, ErrorCode::Protocol, reason, out);
        }
        let end_stream = h.has(flag::END_STREAM);
        if data.is_empty() && !end_stream {
            self.overhead()?;
        }
        let s = &mut self.streams[i];
        if s.streamed {
            // The caller takes these as they come; the window comes back as it does.
            s.data.body.extend_from_slice(data);
            if !data.is_empty() {
                self.events.push_back(Event::Body(s.id));
            }
        } else if !s.refused {
            if s.decided && s.received > max_body {
                self.refuse(i, 413);
            } else {
                if !s.decided && s.data.body.is_empty() && !data.is_empty() {
                    // The body began: the caller waiting to choose can now.
                    self.events.push_back(Event::Body(s.id));
                }
                s.data.body.extend_from_slice(data);
                self.buffered += data.len();
            }
        }
        if end_stream {
            return self.end_of_request(i, out);
        }
        if self.streams[i].recv_unacked >= self.cfg.stream_window / 2 {
            self.windows_due = true;
        }
        Ok(())
    }

    /// Returns stream windows once half used (not per frame). Past the buffered-bodies limit
    /// only the oldest stream still receiving gets window: it can always finish (its body is
    /// at most `max_body`), the others wait, and memory stays bounded without ever stalling
    /// the connection. Runs after every batch of frames, so a window held back is returned
    /// as soon as room is made (a request completed, a stream reset).
    fn return_stream_windows(&mut self, out: &mut Vec<u8>) {
        if !self.windows_due {
            return;
        }
        self.windows_due = false;
        let half = self.cfg.stream_window / 2;
        let over = self.buffered >= self.cfg.max_buffered_bodies;
        let oldest = self
            .streams
            .iter()
            .filter(|s| !s.recv_closed)
            .map(|s| s.id)
            .min();
        let max_body = self.cfg.max_body;
        for s in &mut self.streams {
            if s.recv_closed || s.recv_unacked < half || !s.decided {
                continue; // an undecided stream's window is held until the caller chooses
            }
            if s.streamed {
                // Window for what the caller has taken (see `consume_body`).
                if s.data.body.len() < half as usize {
                    frame::write_window_update(out, s.id, s.recv_unacked);
                    s.recv_window += i64::from(s.recv_unacked);
                    s.recv_unacked = 0;
                }
                continue;
            }
            if !(s.refused || s.received < max_body) {
                continue; // a body at its limit gets no more
            }
            if over && !s.refused && Some(s.id) != oldest {
                self.windows_due = true; // held back; looked at again after the next batch
                continue;
            }
            frame::write_window_update(out, s.id, s.recv_unacked);
            s.recv_window += i64::from(s.recv_unacked);
            s.recv_unacked = 0;
        }
    }

    /// Returns the connection window once half of it is used. (Memory for gathered bodies
    /// is bounded by the stream windows: see `return_stream_windows`; holding the connection
    /// window back for them could stall a body that only needs it to finish.) Streamed
    /// bodies (a proxy route) wait in the session until their relay takes them, and a relay
    /// may wait for an upstream connection: while more than [`STREAMED_BODY_BUDGET`] of them
    /// waits, all streams together, the window is held back (an adversarial pass
    /// had 100 uploads pin a stream window each, 12 MiB per connection); it goes back as the
    /// relays take their bytes ([`Session::consume_body`]).
    fn return_connection_window(&mut self, out: &mut Vec<u8>) {
        if self.recv_unacked >= self.cfg.connection_window / 2
            && self.state != State::Closed
            && self.streamed_waiting() < STREAMED_BODY_BUDGET
        {
            frame::write_window_update(out, 0, self.recv_unacked);
            self.recv_window += i64::from(self.recv_unacked);
            self.recv_unacked = 0;
        }
    }

    fn on_priority(&mut self, h: FrameHeader, p: &[u8], out: &mut Vec<u8>) -> Step {
        if h.stream == 0 {
            return conn_err(ErrorCode::Protocol, "PRIORITY on stream 0");
        }
        if p.len() != 5 {
            return self.stream_error(
                h.stream,
                ErrorCode::FrameSize,
                "PRIORITY of wrong size",
                out,
            );
        }
        let dep = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
        if dep == h.stream {
            return self.stream_error(
                h.stream,
                ErrorCode::Protocol,
                "stream depends on itself",
                out,
            );
        }
        // RFC 7540 priorities are deprecated (we said SETTINGS_NO_RFC7540_PRIORITIES).
        self.overhead()
    }

    fn on_rst_stream(&mut self, h: FrameHeader, p: &[u8]) -> Step {
        if h.stream == 0 {
            return conn_err(ErrorCode::Protocol, "RST_STREAM on stream 0");
        }
        if p.len() != 4 {
            return conn_err(ErrorCode::FrameSize, "RST_STREAM of wrong size");
        }
        if h.stream > self.last_peer_stream {
            return conn_err(ErrorCode::Protocol, "RST_STREAM on an idle stream");
        }
        let Some(i) = self.find(h.stream) else {
            return self.overhead();
        };
        let answered = self.streams[i].answered;
        self.remove(i, false);
        self.events.push_back(Event::Reset(h.stream));
        // A stream opened and cancelled before it was answered costs the budget; completed
        // streams earn it back (rapid reset, CVE-2023-44487). Cancelling an answer under way
        // (a video seek, a page left) is ordinary and free.
        if answered {
            return Ok(());
        }
        self.spend_reset()
    }

    fn on_settings(&mut self, h: FrameHeader, p: &[u8], out: &mut Vec<u8>) -> Step {
        if h.stream != 0 {
            return conn_err(ErrorCode::Protocol, "SETTINGS on a stream");
        }
        if h.has(flag::ACK) {
            if !p.is_empty() {
                return conn_err(ErrorCode::FrameSize, "SETTINGS ACK with a payload");
            }
            return self.overhead();
        }
        if !p.len().is_multiple_of(6) {
            return conn_err(ErrorCode::FrameSize, "SETTINGS of wrong size");
        }
        for chunk in p.chunks_exact(6) {
            let id = u16::from_be_bytes([chunk[0], chunk[1]]);
            let value = u32::from_be_bytes([chunk[2], chunk[3], chunk[4], chunk[5]]);
            match id {
                setting::HEADER_TABLE_SIZE => {
                    self.encoder.set_peer_max_table_size(value as usize);
                }
                setting::ENABLE_PUSH if value > 1 => {
                    return conn_err(ErrorCode::Protocol, "SETTINGS_ENABLE_PUSH not 0 or 1");
                }
                // RFC 8441 §3 (what a client says about itself means nothing to a server).
                setting::ENABLE_CONNECT_PROTOCOL if value > 1 => {
                    return conn_err(
                        ErrorCode::Protocol,
                        "SETTINGS_ENABLE_CONNECT_PROTOCOL not 0 or 1",
                    );
                }
                setting::INITIAL_WINDOW_SIZE => {
                    if i64::from(value) > MAX_WINDOW {
                        return conn_err(ErrorCode::FlowControl, "initial window too large");
                    }
                    // Every stream's send window moves by the difference (§6.9.2).
                    let delta = i64::from(value) - i64::from(self.peer.initial_window);
                    for s in &mut self.streams {
                        s.send_window += delta;
                        if s.send_window > MAX_WINDOW {
                            return conn_err(ErrorCode::FlowControl, "stream window overflow");
                        }
                    }
                    self.peer.initial_window = value;
                }
                setting::MAX_FRAME_SIZE => {
                    if !(DEFAULT_MAX_FRAME_SIZE..=MAX_FRAME_SIZE_LIMIT).contains(&value) {
                        return conn_err(
                            ErrorCode::Protocol,
                            "SETTINGS_MAX_FRAME_SIZE out of range",
                        );
                    }
                    self.peer.max_frame_size = value;
                }
                _ => {} // unknown or advisory settings are ignored (§6.5.2)
            }
        }
        frame::write_settings_ack(out);
        self.overhead()
    }

    fn on_ping(&mut self, h: FrameHeader, p: &[u8], out: &mut Vec<u8>) -> Step {
        if h.stream != 0 {
            return conn_err(ErrorCode::Protocol, "PING on a stream");
        }
        let Ok(payload) = <&[u8; 8]>::try_from(p) else {
            return conn_err(ErrorCode::FrameSize, "PING of wrong size");
        };
        if !h.has(flag::ACK) {
            frame::write_ping_ack(out, payload);
        }
        self.overhead()
    }

    fn on_window_update(&mut self, h: FrameHeader, p: &[u8], out: &mut Vec<u8>) -> Step {
        let Ok(b) = <[u8; 4]>::try_from(p) else {
            return conn_err(ErrorCode::FrameSize, "WINDOW_UPDATE of wrong size");
        };
        let inc = i64::from(u32::from_be_bytes(b) & 0x7fff_ffff);
        self.overhead()?;
        if h.stream == 0 {
            if inc == 0 {
                return conn_err(ErrorCode::Protocol, "WINDOW_UPDATE of 0");
            }
            self.send_window += inc;
            if self.send_window > MAX_WINDOW {
                return conn_err(ErrorCode::FlowControl, "connection window overflow");
            }
            return Ok(());
        }
        if h.stream > self.last_peer_stream {
            return conn_err(ErrorCode::Protocol, "WINDOW_UPDATE on an idle stream");
        }
        let Some(i) = self.find(h.stream) else {
            return Ok(()); // a stream that just closed
        };
        if inc == 0 {
            return self.stream_error(h.stream, ErrorCode::Protocol, "WINDOW_UPDATE of 0", out);
        }
        let s = &mut self.streams[i];
        s.send_window += inc;
        if s.send_window > MAX_WINDOW {
            return self.stream_error(
                h.stream,
                ErrorCode::FlowControl,
                "stream window overflow",
                out,
            );
        }
        Ok(())
    }

    fn on_priority_update(&mut self, h: FrameHeader, p: &[u8]) -> Step {
        if h.stream != 0 {
            return conn_err(ErrorCode::Protocol, "PRIORITY_UPDATE on a stream");
        }
        if p.len() < 4 {
            return conn_err(ErrorCode::FrameSize, "short PRIORITY_UPDATE");
        }
        let id = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
        if id == 0 || id.is_multiple_of(2) {
            return conn_err(ErrorCode::Protocol, "PRIORITY_UPDATE for a bad stream id");
        }
        self.overhead()?;
        if let Some(i) = self.find(id) {
            let s = &mut self.streams[i];
            // An update replaces the whole signal: what it leaves out takes the defaults.
            s.priority = Priority::parse(&p[4..], Priority::default());
            self.events.push_back(Event::Reprioritize(id));
        } else if id > self.last_peer_stream && self.early_priorities.len() < 16 {
            let prio = Priority::parse(&p[4..], Priority::default());
            self.early_priorities.push((id, prio));
        }
        Ok(())
    }

    /// Takes a complete request out of its stream (after [`Event::Request`]).
    pub fn take_request(&mut self, id: u32) -> Option<RequestData> {
        let i = self.find(id)?;
        // The stream needs no buffers any more (empty vectors allocate nothing).
        Some(std::mem::take(&mut self.streams[i].data))
    }

    /// The request of a stream whose head arrived ([`Event::Head`]), to look at before
    /// choosing how to take its body.
    pub fn peek_request(&self, id: u32) -> Option<&RequestData> {
        self.find(id).map(|i| &self.streams[i].data)
    }

    /// The body of `id` is collected whole (up to `max_body`, else 413); [`Event::Request`]
    /// follows once it is complete.
    /// The window held while undecided goes back at once (written into `out`).
    pub fn gather_body(&mut self, id: u32, out: &mut Vec<u8>) {
        let Some(i) = self.find(id) else { return };
        let max_body = self.cfg.max_body;
        let s = &mut self.streams[i];
        if s.decided {
            return;
        }
        s.decided = true;
        self.windows_due = true;
        let too_large =
            s.data.fields.content_length.is_some_and(|n| n > max_body) || s.received > max_body;
        if too_large {
            self.refuse(i, 413);
        } else if s.recv_closed {
            s.dispatched = true;
            self.buffered -= s.data.body.len();
            self.events.push_back(Event::Request(id));
        }
        self.return_stream_windows(out);
    }

    /// The body of `id` is read as it comes: the request (head, and the body bytes so far) is
    /// taken now, the rest with [`Session::body_chunk`] after each [`Event::Body`]. Its window
    /// is returned as the caller consumes, so it never holds more than one window.
    pub fn stream_body(&mut self, id: u32, out: &mut Vec<u8>) -> Option<RequestData> {
        let i = self.find(id)?;
        let s = &mut self.streams[i];
        if s.decided {
            return None;
        }
        s.decided = true;
        s.streamed = true;
        s.dispatched = true;
        self.buffered -= s.data.body.len();
        // The fields go to the caller; what came of the body so far stays, the first chunk.
        let so_far = std::mem::take(&mut s.data.body);
        let data = std::mem::take(&mut s.data);
        s.data.body = so_far;
        self.windows_due = true;
        self.return_stream_windows(out);
        Some(data)
    }

    /// The streamed body bytes of `id` not yet consumed, and whether the body has ended; on a
    /// stream still undecided (see [`Event::Head`]), what came of its body so far.
    pub fn body_chunk(&self, id: u32) -> Option<(&[u8], bool)> {
        let i = self.find(id)?;
        let s = &self.streams[i];
        (s.streamed || !s.decided).then(|| (&s.data.body[..], s.recv_closed))
    }

    /// The caller has not yet chosen how stream `id`'s body is taken (see [`Event::Head`]).
    pub fn is_undecided(&self, id: u32) -> bool {
        self.find(id).is_some_and(|i| !self.streams[i].decided)
    }

    /// Streamed body bytes received and not yet taken, all streams together.
    fn streamed_waiting(&self) -> usize {
        self.streams
            .iter()
            .filter(|s| s.streamed)
            .map(|s| s.data.body.len())
            .sum()
    }

    /// The caller used `n` bytes of [`Session::body_chunk`]; once most is taken the stream's
    /// window goes back to the peer (written into `out`), and the connection's if it was held.
    pub fn consume_body(&mut self, id: u32, n: usize, out: &mut Vec<u8>) {
        self.consume_stream_body(id, n, out);
        self.return_connection_window(out);
    }

    fn consume_stream_body(&mut self, id: u32, n: usize, out: &mut Vec<u8>) {
        let Some(i) = self.find(id) else { return };
        let s = &mut self.streams[i];
        if !s.streamed {
            return; // an undecided stream's bytes are the session's to count (`buffered`)
        }
        s.data.body.drain(..n.min(s.data.body.len()));
        // In batches, as for gathered bodies: a peer with less than half its window used
        // still has the other half to send with.
        let half = self.cfg.stream_window / 2;
        if s.streamed
            && !s.recv_closed
            && s.recv_unacked >= half
            && s.data.body.len() < half as usize
        {
            frame::write_window_update(out, s.id, s.recv_unacked);
            s.recv_window += i64::from(s.recv_unacked);
            s.recv_unacked = 0;
        }
    }

    /// No stream is open: give back what only busy connections need (stream slots, spare
    /// request buffers, queues), so an idle HTTP/2 connection stays small.
    pub fn release_idle_memory(&mut self) {
        if !self.streams.is_empty() || self.continuation.is_some() {
            return;
        }
        self.streams = Vec::new();
        self.spare = Vec::new();
        self.block = Vec::new();
        self.events = VecDeque::new();
        self.early_priorities = Vec::new();
        self.decoder.release_scratch();
    }

    /// Gives a request's buffers back for the next one.
    pub fn recycle(&mut self, mut data: RequestData) {
        if data.body.capacity() <= 64 * 1024 && self.spare.len() < SPARE_REQUESTS {
            data.fields.clear();
            data.body.clear();
            self.spare.push(data);
        }
    }

    pub fn priority(&self, id: u32) -> Priority {
        self.find(id)
            .map_or_else(Priority::default, |i| self.streams[i].priority)
    }

    /// Starts the response HEADERS of `stream` in `out`; add fields, then `finish`.
    pub fn response<'s>(
        &'s mut self,
        stream: u32,
        status: u16,
        out: &'s mut Vec<u8>,
    ) -> ResponseHeaders<'s> {
        let start = out.len();
        out.extend_from_slice(&[0; HEADER_LEN]);
        self.encoder.begin_block(out);
        self.encoder.encode_status(status, out);
        ResponseHeaders {
            session: self,
            out,
            start,
            stream,
        }
    }

    /// Body bytes that may be sent on `stream` now: the smaller window, at most one frame.
    pub fn send_capacity(&self, id: u32) -> usize {
        let Some(i) = self.find(id) else {
            return 0;
        };
        let window = self.send_window.min(self.streams[i].send_window).max(0);
        (window as usize).min(self.max_data_frame())
    }

    /// The most body bytes one DATA frame carries: 16 KiB, the size of a TLS record, even if
    /// the peer accepts larger frames.
    pub fn max_data_frame(&self) -> usize {
        self.peer.max_frame_size.min(DEFAULT_MAX_FRAME_SIZE) as usize
    }

    /// Accounts for a DATA frame of `len` body bytes (within [`Self::send_capacity`]) and
    /// returns its header. After queueing the last frame's payload, call
    /// [`Self::answer_sent`].
    pub fn data_frame(&mut self, id: u32, len: usize, end_stream: bool) -> [u8; HEADER_LEN] {
        self.send_window -= len as i64;
        // Each frame of answer earns a budget point back: a download paced by a small window
        // earns the WINDOW_UPDATEs it needs (one in, one out is no amplification).
        if len > 0 {
            self.overhead_budget = (self.overhead_budget + 1).min(self.cfg.overhead_budget);
        }
        if let Some(i) = self.find(id) {
            self.streams[i].send_window -= len as i64;
        }
        frame::data_header(len, end_stream, id)
    }

    /// The DATA frame with END_STREAM was queued: the stream closes, and if its request is
    /// still arriving, `out` gets an RST_STREAM(NO_ERROR) to stop it (§8.1).
    pub fn answer_sent(&mut self, id: u32, out: &mut Vec<u8>) {
        if let Some(i) = self.find(id) {
            self.end_of_answer(i, out);
        }
    }

    /// Our END_STREAM went out on stream `i`.
    fn end_of_answer(&mut self, i: usize, out: &mut Vec<u8>) {
        let s = &mut self.streams[i];
        s.send_closed = true;
        if !s.recv_closed {
            // Answered before the request finished: tell the peer to stop sending (§8.1).
            frame::write_rst_stream(out, s.id, ErrorCode::NoError);
            s.recv_closed = true;
            self.remove(i, true);
            return;
        }
        let _ = self.maybe_close(i);
    }

    fn maybe_close(&mut self, i: usize) -> Step {
        let s = &self.streams[i];
        if s.send_closed && s.recv_closed {
            self.remove(i, false);
            // A completed stream earns back budget spent on resets and overhead.
            self.reset_budget = (self.reset_budget + 1).min(self.cfg.reset_budget);
            self.overhead_budget = (self.overhead_budget + 10).min(self.cfg.overhead_budget);
        }
        Ok(())
    }

    /// We give up on a stream (its answer cannot be produced).
    pub fn reset(&mut self, id: u32, code: ErrorCode, out: &mut Vec<u8>) {
        frame::write_rst_stream(out, id, code);
        if let Some(i) = self.find(id) {
            self.remove(i, true);
        }
    }
}

/// A response header block being written (see [`Session::response`]).
pub struct ResponseHeaders<'s> {
    session: &'s mut Session,
    out: &'s mut Vec<u8>,
    start: usize,
    stream: u32,
}

impl ResponseHeaders<'_> {
    /// Adds a field; `name` may be in any case (it is lowercased). Connection-specific fields
    /// are dropped (RFC 9113 §8.2.2).
    pub fn field(&mut self, name: &[u8], value: &[u8]) {
        let mut lower = [0u8; 64];
        let long;
        let name: &[u8] = if name.len() <= lower.len() {
            let l = &mut lower[..name.len()];
            for (d, s) in l.iter_mut().zip(name) {
                *d = s.to_ascii_lowercase();
            }
            l
        } else {
            long = name.to_ascii_lowercase(); // rare: a handler's own long header name
            &long
        };
        let indexing = match name {
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => return,
            // Different on nearly every answer: indexing would only churn the table.
            b"content-length" | b"content-range" => Indexing::Without,
            // Secrets stay out of every table on the way (RFC 7541 §7.1.3).
            b"set-cookie" | b"authorization" => Indexing::Never,
            _ => Indexing::Incremental,
        };
        self.session.encoder.encode(name, value, indexing, self.out);
    }

    /// Closes the block (split into CONTINUATION frames if larger than the peer's frame
    /// size). `end_stream`: the answer has no body. Returns where the block's bytes are in
    /// `out` when it went out in one frame (a caller may send it again with
    /// [`Session::response_block`] while the encoder's generation stays the same).
    pub fn finish(self, end_stream: bool) -> Option<std::ops::Range<usize>> {
        self.session
            .frame_block(self.start, self.stream, end_stream, self.out)
    }
}

impl Session {
    /// Changes whenever the HPACK encoder's table does: an earlier block is valid again
    /// only while this stays the same.
    pub fn encoder_generation(&self) -> u64 {
        self.encoder.generation()
    }

    /// Sends a header block encoded earlier (see [`ResponseHeaders::finish`]) for `stream`.
    pub fn response_block(
        &mut self,
        stream: u32,
        block: &[u8],
        end_stream: bool,
        out: &mut Vec<u8>,
    ) {
        let start = out.len();
        out.extend_from_slice(&[0; HEADER_LEN]);
        out.extend_from_slice(block);
        self.frame_block(start, stream, end_stream, out);
    }

    /// Puts the frame header(s) around the block written at `start + HEADER_LEN..`.
    fn frame_block(
        &mut self,
        start: usize,
        stream: u32,
        end_stream: bool,
        out: &mut Vec<u8>,
    ) -> Option<std::ops::Range<usize>> {
        if let Some(i) = self.find(stream) {
            self.streams[i].answered = true;
        }
        let block_len = out.len() - start - HEADER_LEN;
        let max = self.peer.max_frame_size as usize;
        let end_flag = if end_stream { flag::END_STREAM } else { 0 };
        let mut single = None;
        if block_len <= max {
            let h = frame::header_bytes(
                block_len,
                kind::HEADERS,
                flag::END_HEADERS | end_flag,
                stream,
            );
            out[start..start + HEADER_LEN].copy_from_slice(&h);
            single = Some(start + HEADER_LEN..out.len());
        } else {
            let block = out.split_off(start + HEADER_LEN);
            out.truncate(start);
            let mut chunks = block.chunks(max).peekable();
            let mut first = true;
            while let Some(chunk) = chunks.next() {
                let last = chunks.peek().is_none();
                let (k, mut flags) = if first {
                    (kind::HEADERS, end_flag)
                } else {
                    (kind::CONTINUATION, 0)
                };
                if last {
                    flags |= flag::END_HEADERS;
                }
                frame::write_header(out, chunk.len(), k, flags, stream);
                out.extend_from_slice(chunk);
                first = false;
            }
        }
        if end_stream {
            if let Some(i) = self.find(stream) {
                self.end_of_answer(i, out);
            }
        }
        single
    }
}

fn strip_padding(h: FrameHeader, p: &[u8]) -> Result<&[u8], ConnError> {
    if !h.has(flag::PADDED) {
        return Ok(p);
    }
    let Some((&pad, rest)) = p.split_first() else {
        return Err(ConnError {
            code: ErrorCode::FrameSize,
            reason: "padded frame without a pad length",
        });
    };
    if pad as usize > rest.len() {
        return Err(ConnError {
            code: ErrorCode::Protocol,
            reason: "padding longer than the frame",
        });
    }
    Ok(&rest[..rest.len() - pad as usize])
}

impl RequestData {
    fn fields_iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields.iter()
    }
}
