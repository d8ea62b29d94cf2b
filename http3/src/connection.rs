//! The server side of one HTTP/3 connection (RFC 9114), sans-IO and over abstract QUIC
//! streams: the QUIC layer hands each stream's bytes to [`Connection::recv_stream_data`] in
//! whatever pieces they arrive, and the connection answers with [`Event`]s (a request head, body
//! bytes, trailers, a stream to reset or stop reading) or a [`ConnError`] carrying the
//! RFC 9114 / RFC 9204 code to close the connection with. Answers are written into caller
//! buffers ([`Connection::send_response_head`], [`Connection::send_data`]), as is our control
//! stream (its type, SETTINGS first, later GOAWAY).
//!
//! Every limit against hostile peers lives here, as in `tern_http2::Session`: the field
//! section size (SETTINGS_MAX_FIELD_SECTION_SIZE, checked while decoding), frame sizes
//! (HEADERS at most the section limit + 1 KiB, control frames at most `max_control_frame`; a
//! frame is never buffered past them), concurrent request streams, unread body bytes, a reset
//! budget (streams the peer makes us reset or resets itself before an answer, as the rapid
//! reset budget of HTTP/2) and an overhead budget (unknown frames and stream types, empty DATA).

use std::collections::{HashMap, VecDeque};

use tern_http2::request::{check_trailer, Malformed, RequestData, MAX_FIELDS};

use crate::frame::{self, kind, setting, stream_type, ErrorCode, MAX_HEADER_LEN};
use crate::qpack::{self, DecoderStream, EncoderStream};
use crate::varint;

/// What a connection allows its peer.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// SETTINGS_MAX_FIELD_SECTION_SIZE: decoded fields (name + value + 32 each); over it a
    /// request is answered 431.
    pub max_field_section_size: u64,
    /// Request streams open at once (QUIC's MAX_STREAMS should say the same; this is the
    /// bound if it does not). Past it a stream is reset with H3_REQUEST_REJECTED.
    pub max_request_streams: usize,
    /// Largest gathered request body ([`Connection::gather_body`]): a larger content-length
    /// is answered 413; a body that grows past it without one is reset with
    /// H3_EXCESSIVE_LOAD. A streamed body ([`Connection::stream_body`]) has no such bound here:
    /// its route's applies.
    pub max_body: u64,
    /// Body bytes a stream may hold that the caller has not consumed.
    pub max_buffered_body: usize,
    /// Body bytes a streamed request may hold before the caller should stop reading its
    /// stream ([`Connection::body_room`]): QUIC's flow control then holds the client back.
    pub streamed_body_buffer: usize,
    /// Largest SETTINGS frame (other control frames are one varint).
    pub max_control_frame: usize,
    /// Streams the peer may make us reset, or reset before their answer, beyond those it
    /// completes.
    pub reset_budget: i32,
    /// Unknown frames, unknown stream types and empty DATA frames the peer may send beyond
    /// what its requests earn.
    pub overhead_budget: i32,
    /// Accept RFC 9220's extended CONNECT (WebSockets over HTTP/3) and say so with
    /// SETTINGS_ENABLE_CONNECT_PROTOCOL.
    pub extended_connect: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            max_field_section_size: 32 * 1024,
            max_request_streams: 100,
            max_body: 1024 * 1024,
            max_buffered_body: 256 * 1024,
            streamed_body_buffer: 64 * 1024,
            max_control_frame: 4096,
            reset_budget: 100,
            overhead_budget: 1000,
            extended_connect: false,
        }
    }
}

/// What the caller must act on, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A request head is complete: take it with [`Connection::take_request`]. `end_stream`:
    /// the request has no body.
    Request { stream: u64, end_stream: bool },
    /// More body bytes, or the body's end: read with [`Connection::body_chunk`].
    Body(u64),
    /// The request's trailers arrived (the body is complete once `Body` says so):
    /// [`Connection::take_trailers`].
    Trailers(u64),
    /// Answer with this status without running a handler (431: field section too large;
    /// 413: body too large); the rest of the request is discarded.
    Refuse { stream: u64, status: u16 },
    /// Reset the stream both ways (RESET_STREAM and STOP_SENDING with `code`): the request
    /// is malformed, incomplete, rejected or too large.
    ResetStream {
        stream: u64,
        code: ErrorCode,
        reason: &'static str,
    },
    /// Stop reading a unidirectional stream of an unknown type (STOP_SENDING with `code`).
    StopSending { stream: u64, code: ErrorCode },
    /// The peer reset a request stream: drop whatever answer is in progress.
    Reset(u64),
    /// The peer sent GOAWAY: it opens no more requests.
    PeerGoAway,
}

/// A connection error: close the QUIC connection with this application error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnError {
    pub code: ErrorCode,
    pub reason: &'static str,
}

type Step = Result<(), ConnError>;

fn conn_err<T>(code: ErrorCode, reason: &'static str) -> Result<T, ConnError> {
    Err(ConnError { code, reason })
}

/// HEADERS frames are buffered up to the section limit plus this much QPACK overhead.
const HEADERS_SLACK: u64 = 1024;

/// Recently closed stream ids, so late bytes for them are ignored rather than read as a new
/// stream.
struct Recent {
    ids: [u64; 64],
    used: usize,
    next: usize,
}

impl Default for Recent {
    fn default() -> Recent {
        Recent {
            ids: [0; 64],
            used: 0,
            next: 0,
        }
    }
}

impl Recent {
    fn push(&mut self, id: u64) {
        self.ids[self.next] = id;
        self.next = (self.next + 1) % self.ids.len();
        self.used = (self.used + 1).min(self.ids.len());
    }

    fn contains(&self, id: u64) -> bool {
        self.ids[..self.used].contains(&id)
    }
}

enum Role {
    /// A unidirectional stream whose type is still arriving.
    UniPending,
    Control {
        settings_seen: bool,
    },
    QpackEncoder(EncoderStream),
    QpackDecoder(DecoderStream),
    /// A unidirectional stream of an unknown type: its bytes are dropped.
    Ignored,
    Request(Box<Request>),
}

impl Role {
    fn is_critical(&self) -> bool {
        matches!(
            self,
            Role::Control { .. } | Role::QpackEncoder(_) | Role::QpackDecoder(_)
        )
    }
}

/// Where a request stream is in RFC 9114 §4.1's HEADERS, DATA*, [HEADERS].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Head,
    Body,
    Trailers,
    /// Answered without a handler (431/413): the rest is skipped.
    Refused,
}

#[derive(Default)]
struct Pending {
    head: bool,
    body: bool,
    trailers: bool,
}

struct Request {
    phase: Phase,
    data: RequestData,
    /// Body bytes not yet consumed by the caller.
    body: Vec<u8>,
    received: u64,
    /// The stream's FIN arrived.
    recv_done: bool,
    /// The head event went out (or is pending in this call).
    head_raised: bool,
    /// Our answer ended (FIN queued).
    answered: bool,
    /// The caller chose how to take the body: gathered whole, or streamed.
    decided: bool,
    /// The body is streamed: bounded by the caller's reading, not by `max_body`.
    streamed: bool,
    /// The content-length of a streamed request, whose fields the caller took.
    streamed_length: Option<u64>,
    trailers: Vec<(Vec<u8>, Vec<u8>)>,
    /// Events raised once the current call's bytes are processed (so a head and its FIN in
    /// one call make one event).
    pending: Pending,
}

impl Request {
    /// The request's content-length, if it declared one.
    fn declared_length(&self) -> Option<u64> {
        if self.streamed {
            self.streamed_length
        } else {
            self.data.fields.content_length()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Gathered into `Stream::payload` (bounded when the frame starts).
    Buffer,
    /// Dropped (unknown types, refused requests).
    Skip,
    /// DATA payload, appended to the request body as it comes.
    Body,
}

#[derive(Clone, Copy)]
struct InFrame {
    kind: u64,
    remaining: u64,
    mode: Mode,
}

struct Stream {
    role: Role,
    /// A frame header (or a unidirectional stream's type) split across calls.
    head: [u8; MAX_HEADER_LEN],
    head_len: usize,
    frame: Option<InFrame>,
    payload: Vec<u8>,
}

impl Stream {
    fn new(role: Role) -> Stream {
        Stream {
            role,
            head: [0; MAX_HEADER_LEN],
            head_len: 0,
            frame: None,
            payload: Vec::new(),
        }
    }

    /// Moves bytes from `data` into `head` until `parse` reads a value from them; the bytes
    /// it took are consumed, the rest of `data` is left.
    fn take_prefix<T>(
        &mut self,
        data: &mut &[u8],
        parse: impl Fn(&[u8]) -> Option<(T, usize)>,
    ) -> Option<T> {
        let old = self.head_len;
        let n = (MAX_HEADER_LEN - old).min(data.len());
        self.head[old..old + n].copy_from_slice(&data[..n]);
        match parse(&self.head[..old + n]) {
            Some((v, used)) => {
                *data = &data[used - old..];
                self.head_len = 0;
                Some(v)
            }
            None => {
                *data = &data[n..];
                self.head_len = old + n;
                None
            }
        }
    }

    fn request(&mut self) -> &mut Request {
        match &mut self.role {
            Role::Request(r) => r,
            _ => unreachable!("only request streams carry request frames"),
        }
    }
}

/// The server side of one HTTP/3 connection.
pub struct Connection {
    cfg: Config,
    streams: HashMap<u64, Stream, foldhash::fast::RandomState>,
    recent: Recent,
    events: VecDeque<Event>,
    /// Request streams in `streams`.
    requests: usize,
    /// The highest request stream id seen (+4 is where a GOAWAY starts refusing).
    max_request_id: Option<u64>,
    peer_control: bool,
    peer_encoder: bool,
    peer_decoder: bool,
    /// The peer's SETTINGS_MAX_FIELD_SECTION_SIZE (unlimited until it says).
    peer_max_field_section: Option<u64>,
    peer_extended_connect: bool,
    /// GOAWAY sent: request streams from this id on are rejected.
    goaway_sent: Option<u64>,
    /// The last GOAWAY id the peer sent (a push id; it may only decrease).
    peer_goaway: Option<u64>,
    peer_max_push_id: Option<u64>,
    reset_budget: i32,
    overhead_budget: i32,
    /// Huffman-decoded names and values (kept for reuse).
    scratch: (Vec<u8>, Vec<u8>),
    /// A response section being encoded (kept for reuse).
    section: Vec<u8>,
    /// A field name lowercased (kept for reuse).
    lower: Vec<u8>,
    /// Answer field lines coded before on this connection.
    lines: qpack::EncodedLines,
    error: Option<ConnError>,
}

impl Connection {
    /// A server connection. The control stream's first bytes (its type, then SETTINGS) are
    /// written to `control_out`: the caller opens a unidirectional stream and sends them
    /// first, then whatever later calls append (GOAWAY). The control stream must never close.
    pub fn new(cfg: Config, control_out: &mut Vec<u8>) -> Connection {
        varint::encode(stream_type::CONTROL, control_out);
        let mut settings = vec![
            // No dynamic table and no blocked streams (see `qpack`); both are the defaults,
            // said anyway so a client knows it was meant.
            (setting::QPACK_MAX_TABLE_CAPACITY, 0),
            (setting::QPACK_BLOCKED_STREAMS, 0),
            (setting::MAX_FIELD_SECTION_SIZE, cfg.max_field_section_size),
        ];
        if cfg.extended_connect {
            settings.push((setting::ENABLE_CONNECT_PROTOCOL, 1));
        }
        frame::write_settings(control_out, &settings);
        Connection {
            streams: HashMap::default(),
            recent: Recent::default(),
            events: VecDeque::new(),
            requests: 0,
            max_request_id: None,
            peer_control: false,
            peer_encoder: false,
            peer_decoder: false,
            peer_max_field_section: None,
            peer_extended_connect: false,
            goaway_sent: None,
            peer_goaway: None,
            peer_max_push_id: None,
            reset_budget: cfg.reset_budget,
            overhead_budget: cfg.overhead_budget,
            scratch: (Vec::new(), Vec::new()),
            section: Vec::new(),
            lower: Vec::new(),
            lines: qpack::EncodedLines::default(),
            error: None,
            cfg,
        }
    }

    /// Takes the next bytes of stream `id` (a client-initiated stream: bidirectional for
    /// requests, unidirectional for control and QPACK), with `fin` when they end it. Bytes may
    /// come in any pieces. After an error the connection is closed and ignores input. The
    /// caller must not deliver bytes of a stream after acting on a `ResetStream` or
    /// `StopSending` for it (quinn discards them once the stream is stopped).
    pub fn recv_stream_data(&mut self, id: u64, data: &[u8], fin: bool) -> Step {
        if self.error.is_some() {
            return Ok(());
        }
        let result = self.recv(id, data, fin);
        if let Err(e) = result {
            self.error = Some(e);
            self.streams.clear();
            self.requests = 0;
        }
        result
    }

    fn recv(&mut self, id: u64, data: &[u8], fin: bool) -> Step {
        let mut s = match self.streams.remove(&id) {
            Some(s) => s,
            None if self.recent.contains(id) => return Ok(()),
            None => match id & 3 {
                0 => match self.open_request(id)? {
                    Some(s) => s,
                    None => return Ok(()),
                },
                2 => Stream::new(Role::UniPending),
                _ => return conn_err(ErrorCode::StreamCreation, "bytes on a server stream"),
            },
        };
        if self.process(id, &mut s, data, fin)? {
            self.streams.insert(id, s);
        } else {
            self.forget(id, &s);
        }
        Ok(())
    }

    fn forget(&mut self, id: u64, s: &Stream) {
        if matches!(s.role, Role::Request(_)) {
            self.requests -= 1;
        }
        self.recent.push(id);
    }

    /// A new request stream, or `None` if it is rejected.
    fn open_request(&mut self, id: u64) -> Result<Option<Stream>, ConnError> {
        let rejected = if self.goaway_sent.is_some_and(|first| id >= first) {
            // After our GOAWAY (§5.2): never processed, so the client may retry it elsewhere.
            Some("request after GOAWAY")
        } else if self.requests >= self.cfg.max_request_streams {
            self.spend_reset()?;
            Some("over the request stream limit")
        } else {
            None
        };
        self.max_request_id = self.max_request_id.max(Some(id));
        if let Some(reason) = rejected {
            self.recent.push(id);
            self.events.push_back(Event::ResetStream {
                stream: id,
                code: ErrorCode::RequestRejected,
                reason,
            });
            return Ok(None);
        }
        self.requests += 1;
        Ok(Some(Stream::new(Role::Request(Box::new(Request {
            phase: Phase::Head,
            data: RequestData::default(),
            body: Vec::new(),
            received: 0,
            recv_done: false,
            head_raised: false,
            answered: false,
            decided: false,
            streamed: false,
            streamed_length: None,
            trailers: Vec::new(),
            pending: Pending::default(),
        })))))
    }

    /// Feeds one stream; false: the stream is done with (reset by us, or complete).
    fn process(
        &mut self,
        id: u64,
        s: &mut Stream,
        mut data: &[u8],
        fin: bool,
    ) -> Result<bool, ConnError> {
        if matches!(s.role, Role::UniPending) {
            match s.take_prefix(&mut data, varint::decode) {
                Some(ty) => self.open_uni(id, s, ty)?,
                // A stream closed before its type said nothing: dropped.
                None => return Ok(!fin),
            }
        }
        match &mut s.role {
            Role::Ignored => return Ok(!fin),
            Role::QpackEncoder(e) => {
                e.recv(data)
                    .or_else(|r| conn_err(ErrorCode::QpackEncoderStream, r))?;
                return self.critical_end(fin);
            }
            Role::QpackDecoder(d) => {
                d.recv(data)
                    .or_else(|r| conn_err(ErrorCode::QpackDecoderStream, r))?;
                return self.critical_end(fin);
            }
            Role::UniPending => unreachable!("typed above"),
            Role::Control { .. } | Role::Request(_) => {}
        }
        while !data.is_empty() {
            let keep = match s.frame {
                None => match s.take_prefix(&mut data, |b| {
                    frame::parse_header(b).map(|(k, len, n)| ((k, len), n))
                }) {
                    None => true,
                    Some((k, len)) => self.frame_start(id, s, k, len)?,
                },
                Some(mut f) => {
                    let n = f.remaining.min(data.len() as u64) as usize;
                    let (chunk, rest) = data.split_at(n);
                    data = rest;
                    f.remaining -= n as u64;
                    s.frame = Some(f);
                    let keep = match f.mode {
                        Mode::Buffer => {
                            s.payload.extend_from_slice(chunk);
                            true
                        }
                        Mode::Skip => true,
                        Mode::Body => self.body_bytes(id, s, chunk)?,
                    };
                    if keep && f.remaining == 0 {
                        s.frame = None;
                        self.frame_end(id, s, f)?
                    } else {
                        keep
                    }
                }
            };
            if !keep {
                return Ok(false);
            }
        }
        if fin {
            if s.head_len > 0 || s.frame.is_some() {
                return conn_err(ErrorCode::Frame, "stream ended inside a frame");
            }
            if matches!(s.role, Role::Control { .. }) {
                return conn_err(ErrorCode::ClosedCriticalStream, "control stream closed");
            }
            return self.request_end(id, s);
        }
        if let Role::Request(r) = &mut s.role {
            self.raise_pending(id, r);
        }
        Ok(true)
    }

    fn critical_end(&mut self, fin: bool) -> Result<bool, ConnError> {
        if fin {
            return conn_err(ErrorCode::ClosedCriticalStream, "QPACK stream closed");
        }
        Ok(true)
    }

    fn open_uni(&mut self, id: u64, s: &mut Stream, ty: u64) -> Step {
        let (seen, role) = match ty {
            stream_type::CONTROL => (
                &mut self.peer_control,
                Role::Control {
                    settings_seen: false,
                },
            ),
            stream_type::QPACK_ENCODER => {
                (&mut self.peer_encoder, Role::QpackEncoder(EncoderStream))
            }
            stream_type::QPACK_DECODER => (
                &mut self.peer_decoder,
                Role::QpackDecoder(DecoderStream::default()),
            ),
            stream_type::PUSH => {
                return conn_err(ErrorCode::StreamCreation, "push stream from a client")
            }
            _ => {
                // Unknown and reserved types (§6.2.3, GREASE) are ignored, at a small cost.
                self.overhead()?;
                s.role = Role::Ignored;
                self.events.push_back(Event::StopSending {
                    stream: id,
                    code: ErrorCode::StreamCreation,
                });
                return Ok(());
            }
        };
        if *seen {
            return conn_err(ErrorCode::StreamCreation, "second control or QPACK stream");
        }
        *seen = true;
        s.role = role;
        Ok(())
    }

    /// A frame header arrived; false: the stream was reset.
    fn frame_start(
        &mut self,
        id: u64,
        s: &mut Stream,
        k: u64,
        len: u64,
    ) -> Result<bool, ConnError> {
        let mode = match &s.role {
            Role::Control { settings_seen } => self.control_frame_start(*settings_seen, k, len)?,
            Role::Request(r) => {
                let phase = r.phase;
                match self.request_frame_start(phase, k, len)? {
                    Some(mode) => mode,
                    None => {
                        // A head over the section limit: refused unread (no QPACK state
                        // depends on it).
                        self.refuse(id, s.request(), 431);
                        Mode::Skip
                    }
                }
            }
            _ => unreachable!("frames on control and request streams only"),
        };
        s.payload.clear();
        let f = InFrame {
            kind: k,
            remaining: len,
            mode,
        };
        if len == 0 {
            if k == kind::DATA {
                self.overhead()?; // empty DATA moves nothing forward
            }
            return self.frame_end(id, s, f);
        }
        s.frame = Some(f);
        Ok(true)
    }

    fn control_frame_start(
        &mut self,
        settings_seen: bool,
        k: u64,
        len: u64,
    ) -> Result<Mode, ConnError> {
        if !settings_seen && k != kind::SETTINGS {
            return conn_err(
                ErrorCode::MissingSettings,
                "control stream must start with SETTINGS",
            );
        }
        match k {
            kind::SETTINGS if settings_seen => {
                conn_err(ErrorCode::FrameUnexpected, "second SETTINGS")
            }
            kind::SETTINGS if len > self.cfg.max_control_frame as u64 => {
                conn_err(ErrorCode::ExcessiveLoad, "SETTINGS frame too large")
            }
            kind::SETTINGS => Ok(Mode::Buffer),
            kind::GOAWAY | kind::MAX_PUSH_ID | kind::CANCEL_PUSH => {
                if len > varint::MAX_LEN as u64 {
                    return conn_err(ErrorCode::Frame, "control frame longer than its varint");
                }
                Ok(Mode::Buffer)
            }
            kind::DATA | kind::HEADERS | kind::PUSH_PROMISE => conn_err(
                ErrorCode::FrameUnexpected,
                "request frame on the control stream",
            ),
            k if kind::is_http2_only(k) => {
                conn_err(ErrorCode::FrameUnexpected, "HTTP/2 frame type")
            }
            _ => {
                self.overhead()?;
                Ok(Mode::Skip)
            }
        }
    }

    /// The mode for a frame on a request stream; `None`: a head too large to read (431).
    fn request_frame_start(
        &mut self,
        phase: Phase,
        k: u64,
        len: u64,
    ) -> Result<Option<Mode>, ConnError> {
        let section_cap = self
            .cfg
            .max_field_section_size
            .saturating_add(HEADERS_SLACK);
        let mode = match (k, phase) {
            (kind::HEADERS | kind::DATA, Phase::Refused) => Mode::Skip,
            (kind::HEADERS, Phase::Head) if len > section_cap => return Ok(None),
            (kind::HEADERS, Phase::Body) if len > section_cap => {
                return conn_err(ErrorCode::ExcessiveLoad, "trailers too large")
            }
            (kind::HEADERS, Phase::Head | Phase::Body) => Mode::Buffer,
            (kind::HEADERS, Phase::Trailers) => {
                return conn_err(ErrorCode::FrameUnexpected, "HEADERS after trailers")
            }
            (kind::DATA, Phase::Head) => {
                return conn_err(ErrorCode::FrameUnexpected, "DATA before HEADERS")
            }
            (kind::DATA, Phase::Trailers) => {
                return conn_err(ErrorCode::FrameUnexpected, "DATA after trailers")
            }
            (kind::DATA, Phase::Body) => Mode::Body,
            (
                kind::CANCEL_PUSH
                | kind::SETTINGS
                | kind::GOAWAY
                | kind::MAX_PUSH_ID
                | kind::PUSH_PROMISE,
                _,
            ) => {
                return conn_err(
                    ErrorCode::FrameUnexpected,
                    "control frame on a request stream",
                )
            }
            (k, _) if kind::is_http2_only(k) => {
                return conn_err(ErrorCode::FrameUnexpected, "HTTP/2 frame type")
            }
            _ => {
                self.overhead()?;
                Mode::Skip
            }
        };
        Ok(Some(mode))
    }

    /// A whole frame arrived (its payload in `s.payload` if buffered); false: stream reset.
    fn frame_end(&mut self, id: u64, s: &mut Stream, f: InFrame) -> Result<bool, ConnError> {
        if f.mode != Mode::Buffer {
            return Ok(true);
        }
        let payload = std::mem::take(&mut s.payload);
        let result = match &mut s.role {
            Role::Control { settings_seen } => {
                if f.kind == kind::SETTINGS {
                    *settings_seen = true;
                }
                self.control_frame(f.kind, &payload).map(|()| true)
            }
            Role::Request(r) => match r.phase {
                Phase::Head => self.head(id, r, &payload),
                _ => self.trailers(id, r, &payload),
            },
            _ => unreachable!("frames on control and request streams only"),
        };
        s.payload = payload;
        result
    }

    fn control_frame(&mut self, k: u64, p: &[u8]) -> Step {
        match k {
            kind::SETTINGS => self.settings(p),
            kind::GOAWAY => {
                let id = frame::single_varint(p).ok_or(ConnError {
                    code: ErrorCode::Frame,
                    reason: "bad GOAWAY",
                })?;
                // From a client the id is a push id; it may only go down (§5.2).
                if self.peer_goaway.is_some_and(|prev| id > prev) {
                    return conn_err(ErrorCode::Id, "GOAWAY id increased");
                }
                if self.peer_goaway.is_none() {
                    self.events.push_back(Event::PeerGoAway);
                }
                self.peer_goaway = Some(id);
                Ok(())
            }
            kind::MAX_PUSH_ID => {
                let id = frame::single_varint(p).ok_or(ConnError {
                    code: ErrorCode::Frame,
                    reason: "bad MAX_PUSH_ID",
                })?;
                if self.peer_max_push_id.is_some_and(|prev| id < prev) {
                    return conn_err(ErrorCode::Id, "MAX_PUSH_ID decreased");
                }
                self.peer_max_push_id = Some(id);
                Ok(())
            }
            kind::CANCEL_PUSH => {
                frame::single_varint(p).ok_or(ConnError {
                    code: ErrorCode::Frame,
                    reason: "bad CANCEL_PUSH",
                })?;
                // We never promise a push, so every push id is one we never mentioned.
                conn_err(ErrorCode::Id, "CANCEL_PUSH for a push never promised")
            }
            _ => unreachable!("only these are buffered"),
        }
    }

    fn settings(&mut self, mut p: &[u8]) -> Step {
        let mut ids = Vec::new();
        while !p.is_empty() {
            let bad = ConnError {
                code: ErrorCode::Frame,
                reason: "SETTINGS ends inside a setting",
            };
            let (id, a) = varint::decode(p).ok_or(bad)?;
            let (value, b) = varint::decode(&p[a..]).ok_or(bad)?;
            p = &p[a + b..];
            if setting::is_http2_only(id) {
                return conn_err(ErrorCode::Settings, "HTTP/2 setting");
            }
            ids.push(id);
            match id {
                setting::MAX_FIELD_SECTION_SIZE => self.peer_max_field_section = Some(value),
                setting::ENABLE_CONNECT_PROTOCOL | setting::H3_DATAGRAM if value > 1 => {
                    return conn_err(ErrorCode::Settings, "boolean setting above 1")
                }
                setting::ENABLE_CONNECT_PROTOCOL => self.peer_extended_connect = value == 1,
                // The peer's QPACK table and blocked streams would only matter to an encoder
                // that used its dynamic table; ours does not.
                _ => {}
            }
        }
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return conn_err(ErrorCode::Settings, "setting repeated");
        }
        Ok(())
    }

    /// The request's HEADERS: QPACK, then RFC 9114 §4.2-4.3 (RFC 9113 §8's rules, shared
    /// with tern-http2).
    fn head(&mut self, id: u64, r: &mut Request, block: &[u8]) -> Result<bool, ConnError> {
        let fields = &mut r.data.fields;
        fields.clear();
        let decoded = qpack::decode_section(
            block,
            self.cfg.max_field_section_size as usize,
            &mut self.scratch,
            |n, v| fields.push(n, v, MAX_FIELDS),
        )
        .or_else(|reason| conn_err(ErrorCode::QpackDecompressionFailed, reason))?;
        r.phase = Phase::Body;
        let too_large = decoded.too_large || fields.too_many();
        if !too_large {
            if let Err(m) = fields.finish(self.cfg.extended_connect) {
                return self.stream_error(id, ErrorCode::Message, m.reason());
            }
            // §4.3.1: an http or https request names its authority, in :authority or Host.
            let needs_authority = matches!(fields.scheme(), Some(b"http" | b"https"));
            let has_host = || fields.iter().any(|(n, _)| n == b"host");
            if needs_authority && fields.authority().is_none() && !has_host() {
                return self.stream_error(id, ErrorCode::Message, "no :authority or Host");
            }
        }
        if too_large {
            self.refuse(id, r, 431);
        } else {
            // A declared length over max_body is refused only if the caller gathers the body
            // (`gather_body`): a route that streams bodies takes any.
            r.head_raised = true;
            r.pending.head = true;
        }
        Ok(true)
    }

    fn trailers(&mut self, id: u64, r: &mut Request, block: &[u8]) -> Result<bool, ConnError> {
        let mut malformed: Option<Malformed> = None;
        let list = &mut r.trailers;
        let decoded = qpack::decode_section(
            block,
            self.cfg.max_field_section_size as usize,
            &mut self.scratch,
            |n, v| {
                check_trailer(n, v).map_err(|m| malformed = Some(m))?;
                list.push((n.to_vec(), v.to_vec()));
                Ok(())
            },
        )
        .or_else(|reason| conn_err(ErrorCode::QpackDecompressionFailed, reason))?;
        r.phase = Phase::Trailers;
        if let Some(m) = malformed {
            return self.stream_error(id, ErrorCode::Message, m.reason());
        }
        if decoded.too_large {
            return self.stream_error(id, ErrorCode::ExcessiveLoad, "trailers too large");
        }
        r.pending.trailers = true;
        Ok(true)
    }

    fn body_bytes(&mut self, id: u64, s: &mut Stream, chunk: &[u8]) -> Result<bool, ConnError> {
        let r = s.request();
        if r.phase == Phase::Refused {
            return Ok(true); // refused 413 inside this DATA frame: the rest is dropped
        }
        r.received += chunk.len() as u64;
        if r.declared_length().is_some_and(|n| r.received > n) {
            return self.stream_error(
                id,
                ErrorCode::Message,
                Malformed::ContentLengthMismatch.reason(),
            );
        }
        if r.streamed {
            // The caller reads no more than `body_room` allows.
            r.body.extend_from_slice(chunk);
            r.pending.body = true;
            return Ok(true);
        }
        // Until the caller decides (at the head's event), `max_buffered_body` bounds what is
        // held; `gather_body` then judges the length.
        if r.decided && r.received > self.cfg.max_body {
            return self.stream_error(id, ErrorCode::ExcessiveLoad, "body over max_body");
        }
        if r.body.len() + chunk.len() > self.cfg.max_buffered_body {
            return self.stream_error(id, ErrorCode::ExcessiveLoad, "request body not read");
        }
        r.body.extend_from_slice(chunk);
        r.pending.body = true;
        Ok(true)
    }

    /// The request stream's FIN.
    fn request_end(&mut self, id: u64, s: &mut Stream) -> Result<bool, ConnError> {
        let r = s.request();
        match r.phase {
            Phase::Head => {
                return self.stream_error(
                    id,
                    ErrorCode::RequestIncomplete,
                    "request ended before its head",
                )
            }
            Phase::Refused => {}
            Phase::Body | Phase::Trailers => {
                if r.declared_length().is_some_and(|n| n != r.received) {
                    let reason = Malformed::ContentLengthMismatch.reason();
                    return self.stream_error(id, ErrorCode::Message, reason);
                }
                r.pending.body = true;
            }
        }
        r.recv_done = true;
        self.raise_pending(id, r);
        if r.answered {
            self.completed();
            return Ok(false);
        }
        Ok(true)
    }

    fn raise_pending(&mut self, id: u64, r: &mut Request) {
        let p = std::mem::take(&mut r.pending);
        let mut body = p.body;
        if p.head {
            let end_stream = r.recv_done && r.received == 0;
            body &= !end_stream;
            self.events.push_back(Event::Request {
                stream: id,
                end_stream,
            });
        }
        if body && r.head_raised {
            self.events.push_back(Event::Body(id));
        }
        if p.trailers {
            self.events.push_back(Event::Trailers(id));
        }
    }

    fn refuse(&mut self, id: u64, r: &mut Request, status: u16) {
        r.phase = Phase::Refused;
        r.body = Vec::new();
        self.events.push_back(Event::Refuse { stream: id, status });
    }

    /// Resets a request stream for the peer's fault; false (the stream is done).
    fn stream_error(
        &mut self,
        id: u64,
        code: ErrorCode,
        reason: &'static str,
    ) -> Result<bool, ConnError> {
        self.events.push_back(Event::ResetStream {
            stream: id,
            code,
            reason,
        });
        self.spend_reset()?;
        Ok(false)
    }

    fn spend_reset(&mut self) -> Step {
        self.reset_budget -= 1;
        if self.reset_budget < 0 {
            return conn_err(ErrorCode::ExcessiveLoad, "too many reset streams");
        }
        Ok(())
    }

    fn overhead(&mut self) -> Step {
        self.overhead_budget -= 1;
        if self.overhead_budget < 0 {
            return conn_err(
                ErrorCode::ExcessiveLoad,
                "too many frames or streams of no use",
            );
        }
        Ok(())
    }

    /// A request stream completed both ways: it earns budget back.
    fn completed(&mut self) {
        self.reset_budget = (self.reset_budget + 1).min(self.cfg.reset_budget);
        self.overhead_budget = (self.overhead_budget + 10).min(self.cfg.overhead_budget);
    }

    /// The peer reset stream `id` (RESET_STREAM; or STOP_SENDING, which ends our answer).
    /// A critical stream is H3_CLOSED_CRITICAL_STREAM.
    pub fn stream_reset(&mut self, id: u64) -> Step {
        if self.error.is_some() {
            return Ok(());
        }
        let Some(s) = self.streams.remove(&id) else {
            return Ok(());
        };
        let result = if s.role.is_critical() {
            conn_err(ErrorCode::ClosedCriticalStream, "critical stream reset")
        } else if let Role::Request(r) = &s.role {
            self.events.push_back(Event::Reset(id));
            if r.answered {
                Ok(())
            } else {
                self.spend_reset()
            }
        } else {
            Ok(())
        };
        self.forget(id, &s);
        if let Err(e) = result {
            self.error = Some(e);
        }
        result
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The request head of `stream` (fields only: the body comes through
    /// [`Self::body_chunk`]); its `head` gives the [`tern_codec::RequestHead`] HTTP/1.1 and
    /// HTTP/2 requests give (its `version` says Http2 until tern-codec has an Http3). Its
    /// `stream` field is the request's number (the QUIC stream id / 4: HTTP/2's field is 32
    /// bits); the QUIC id is the one the caller passed.
    pub fn take_request(&mut self, stream: u64) -> Option<RequestData> {
        let Role::Request(r) = &mut self.streams.get_mut(&stream)?.role else {
            return None;
        };
        let mut data = std::mem::take(&mut r.data);
        data.stream = (stream / 4) as u32;
        Some(data)
    }

    /// The request of `stream` whose head arrived ([`Event::Request`]), to look at before
    /// choosing how to take its body.
    pub fn peek_request(&self, stream: u64) -> Option<&RequestData> {
        match &self.streams.get(&stream)?.role {
            Role::Request(r) if r.phase != Phase::Refused => Some(&r.data),
            _ => None,
        }
    }

    /// The body of `stream` is gathered whole, up to `max_body`: a larger declared length, or
    /// more received already, is answered 413 ([`Event::Refuse`]; false is returned).
    pub fn gather_body(&mut self, stream: u64) -> bool {
        let max_body = self.cfg.max_body;
        let Some(Role::Request(r)) = self.streams.get_mut(&stream).map(|s| &mut s.role) else {
            return false;
        };
        if r.decided || r.phase == Phase::Refused {
            return !r.streamed && r.phase != Phase::Refused;
        }
        r.decided = true;
        let declared = r.data.fields.content_length().is_some_and(|n| n > max_body);
        if declared || r.received > max_body {
            r.phase = Phase::Refused;
            r.body = Vec::new();
            self.events.push_back(Event::Refuse {
                stream,
                status: 413,
            });
            return false;
        }
        true
    }

    /// The body of `stream` is taken as it comes: the request (its fields) is taken now, the
    /// body with [`Connection::body_chunk`], read from the stream only as far as
    /// [`Connection::body_room`] says.
    pub fn stream_body(&mut self, stream: u64) -> Option<RequestData> {
        let Some(Role::Request(r)) = self.streams.get_mut(&stream).map(|s| &mut s.role) else {
            return None;
        };
        if r.decided || r.phase == Phase::Refused {
            return None;
        }
        r.decided = true;
        r.streamed = true;
        r.streamed_length = r.data.fields.content_length();
        let mut data = std::mem::take(&mut r.data);
        data.stream = (stream / 4) as u32;
        Some(data)
    }

    /// How many more bytes of `stream` the caller should read into the session now: a
    /// streamed request's room in `streamed_body_buffer`; unbounded for any other stream
    /// (what they may hold is bounded as it arrives).
    pub fn body_room(&self, stream: u64) -> usize {
        match self.streams.get(&stream).map(|s| &s.role) {
            Some(Role::Request(r)) if r.streamed => {
                self.cfg.streamed_body_buffer.saturating_sub(r.body.len())
            }
            _ => usize::MAX,
        }
    }

    /// Body bytes not yet consumed, and whether the body is complete.
    pub fn body_chunk(&self, stream: u64) -> Option<(&[u8], bool)> {
        match &self.streams.get(&stream)?.role {
            Role::Request(r) if r.phase != Phase::Refused => Some((&r.body, r.recv_done)),
            _ => None,
        }
    }

    pub fn consume_body(&mut self, stream: u64, n: usize) {
        if let Some(Role::Request(r)) = self.streams.get_mut(&stream).map(|s| &mut s.role) {
            r.body.drain(..n.min(r.body.len()));
        }
    }

    /// The trailers of `stream` (names lowercase, as received).
    pub fn take_trailers(&mut self, stream: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
        match self.streams.get_mut(&stream).map(|s| &mut s.role) {
            Some(Role::Request(r)) => std::mem::take(&mut r.trailers),
            _ => Vec::new(),
        }
    }

    /// Writes the response HEADERS frame of `stream` into `out` (the stream's bytes).
    /// Names may be in any case (they are lowercased); connection-specific fields are dropped
    /// (RFC 9114 §4.2).
    pub fn send_response_head(
        &mut self,
        status: u16,
        fields: &[(&[u8], &[u8])],
        out: &mut Vec<u8>,
    ) {
        let mut section = std::mem::take(&mut self.section);
        section.clear();
        qpack::begin_section(&mut section);
        qpack::encode_status(status, &mut section);
        self.lines.answer_begins();
        self.encode_fields(fields, &mut section);
        frame::write_header(out, kind::HEADERS, section.len() as u64);
        out.extend_from_slice(&section);
        self.section = section;
    }

    /// Appends `fields` as field lines, names lowercased, hop-by-hop ones left out (RFC 9114
    /// §4.2), `set-cookie` and `authorization` with the N bit and never kept.
    fn encode_fields(&mut self, fields: &[(&[u8], &[u8])], out: &mut Vec<u8>) {
        for &(name, value) in fields {
            self.lower.clear();
            self.lower.extend(name.iter().map(u8::to_ascii_lowercase));
            match &self.lower[..] {
                b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
                | b"upgrade" => {}
                b"set-cookie" | b"authorization" => {
                    qpack::encode_field(&self.lower, value, true, out)
                }
                lower => self.lines.encode(lower, value, out),
            }
        }
    }

    /// Writes a DATA frame carrying `data` into `out`.
    pub fn send_data(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if data.is_empty() {
            return;
        }
        frame::write_header(out, kind::DATA, data.len() as u64);
        out.extend_from_slice(data);
    }

    /// Writes trailers (a HEADERS frame after the body).
    pub fn send_trailers(&mut self, fields: &[(&[u8], &[u8])], out: &mut Vec<u8>) {
        let mut section = std::mem::take(&mut self.section);
        section.clear();
        qpack::begin_section(&mut section);
        self.encode_fields(fields, &mut section);
        frame::write_header(out, kind::HEADERS, section.len() as u64);
        out.extend_from_slice(&section);
        self.section = section;
    }

    /// The answer on `stream` is complete (the caller sends its FIN). True: the request is
    /// still arriving, so the caller should also stop reading it (STOP_SENDING with
    /// H3_NO_ERROR, §4.1.2).
    pub fn answer_sent(&mut self, stream: u64) -> bool {
        let Some(s) = self.streams.get_mut(&stream) else {
            return false;
        };
        let Role::Request(r) = &mut s.role else {
            return false;
        };
        r.answered = true;
        let still_arriving = !r.recv_done;
        let s = self.streams.remove(&stream).expect("found above");
        self.forget(stream, &s);
        if !still_arriving {
            self.completed();
        }
        still_arriving
    }

    /// Graceful shutdown (§5.2): appends a GOAWAY to the control stream; requests already
    /// opened are still answered, later ones rejected.
    pub fn go_away(&mut self, control_out: &mut Vec<u8>) {
        if self.goaway_sent.is_some() || self.error.is_some() {
            return;
        }
        let first_unprocessed = self.max_request_id.map_or(0, |id| id + 4);
        frame::write_goaway(control_out, first_unprocessed);
        self.goaway_sent = Some(first_unprocessed);
    }

    /// The connection error that closed this connection, if one did.
    pub fn error(&self) -> Option<ConnError> {
        self.error
    }

    /// No request can come any more and none is open: close once the output is sent.
    pub fn is_finished(&self) -> bool {
        (self.error.is_some() || self.goaway_sent.is_some() || self.peer_goaway.is_some())
            && self.requests == 0
    }

    /// Request streams in progress.
    pub fn open_requests(&self) -> usize {
        self.requests
    }

    /// The peer's SETTINGS_MAX_FIELD_SECTION_SIZE, once its SETTINGS arrived.
    pub fn peer_max_field_section(&self) -> Option<u64> {
        self.peer_max_field_section
    }

    /// The peer accepts extended CONNECT (RFC 9220).
    pub fn peer_extended_connect(&self) -> bool {
        self.peer_extended_connect
    }
}
