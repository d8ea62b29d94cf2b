//! Access logs: one line per answer (per stream on HTTP/2), in nginx's `combined` format or
//! as one JSON object.
//!
//! A line is formatted on the worker that answered, without a general formatter: bytes are
//! appended, numbers written by `itoa`, the timestamp re-formatted once a second, the
//! client address cached. It goes into the worker's own buffer ([`WorkerLog`]); a full
//! buffer, or one whose first line is 100 ms old, is handed to the writer thread over a
//! bounded lock-free queue and an empty one taken back, so a worker makes no system call
//! for a line. When the writer falls behind and the queue is full, the worker keeps its
//! buffer and appends up to [`BUF_MAX`]; past that, lines are dropped and counted
//! (`access_log_lines_dropped`), and the worker never waits.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use tern_codec::{RequestHead, Version};
use tern_runtime::{Clock, InboxSender};

use crate::handler::{LogTarget, WorkerMessage};
use crate::request_id::RequestId;
use crate::stats::{Counter, Stats};

/// A buffer is handed to the writer once it holds this much.
const HAND_OVER_AT: usize = 32 * 1024;
/// What a new buffer is allocated with (a line past `HAND_OVER_AT` still fits).
const BUF_CAPACITY: usize = 64 * 1024;
/// While the queue is full, a worker's buffer grows to this, then lines are dropped.
pub(crate) const BUF_MAX: usize = 256 * 1024;
/// Lines wait at most about this long in a worker's buffer (twice that on a quiet worker,
/// which the writer wakes every `MAX_AGE`).
const MAX_AGE: Duration = Duration::from_millis(100);
/// Full buffers waiting for the writer, beyond those per worker.
const QUEUE_SLACK: usize = 16;

/// The line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// nginx's `combined`, then `"$host" $duration_us $upstream_us`.
    Combined,
    /// One JSON object per line.
    Json,
}

/// The client address of a request (e.g. behind trusted proxies); without one, the peer.
pub type ClientIp = Arc<dyn Fn(SocketAddr, &RequestHead<'_>) -> IpAddr + Send + Sync>;

/// An access log file, opened at start-up (before privileges are dropped), for
/// [`crate::Server::with_access_log`].
pub struct AccessLog {
    path: PathBuf,
    format: AccessLogFormat,
    client_ip: Option<ClientIp>,
    file: File,
}

impl AccessLog {
    /// Opens `path` for appending, creating it with mode 0640 (std opens with O_CLOEXEC).
    pub fn open(path: &Path, format: AccessLogFormat) -> io::Result<AccessLog> {
        Ok(AccessLog {
            path: path.to_path_buf(),
            format,
            client_ip: None,
            file: open_log(path)?,
        })
    }

    /// Where the client address comes from (trusted proxies); the socket peer without.
    pub fn with_client_ip(mut self, client_ip: ClientIp) -> AccessLog {
        self.client_ip = Some(client_ip);
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn into_file(self) -> File {
        self.file
    }
}

fn open_log(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
}

/// What workers and the writer share.
pub(crate) struct LogShared {
    format: AccessLogFormat,
    client_ip: Option<ClientIp>,
    path: PathBuf,
    /// Buffers with lines, on their way to the writer.
    full: ArrayQueue<Vec<u8>>,
    /// Written buffers, on their way back.
    empty: ArrayQueue<Vec<u8>>,
    writer: OnceLock<Thread>,
    /// Per worker: its buffer holds lines. The writer wakes such workers every `MAX_AGE`,
    /// so that the lines of a worker that went quiet still go out.
    pending: Box<[AtomicBool]>,
    reopen: AtomicBool,
    stats: Stats,
}

impl LogShared {
    pub(crate) fn new(log: &AccessLog, workers: usize, stats: Stats) -> LogShared {
        LogShared::with_queue(log, workers, workers * 2 + QUEUE_SLACK, stats)
    }

    fn with_queue(log: &AccessLog, workers: usize, queue: usize, stats: Stats) -> LogShared {
        LogShared {
            format: log.format,
            client_ip: log.client_ip.clone(),
            path: log.path.clone(),
            full: ArrayQueue::new(queue),
            empty: ArrayQueue::new(queue),
            writer: OnceLock::new(),
            pending: (0..workers.max(1))
                .map(|_| AtomicBool::new(false))
                .collect(),
            reopen: AtomicBool::new(false),
            stats,
        }
    }

    /// Asks the writer to reopen the file (SIGUSR1, after logrotate moved it).
    pub(crate) fn request_reopen(&self) {
        self.reopen.store(true, Ordering::Release);
        self.wake_writer();
    }

    fn wake_writer(&self) {
        if let Some(t) = self.writer.get() {
            t.unpark();
        }
    }
}

/// One request's part of a line. Borrows the request head.
#[derive(Clone, Copy)]
pub(crate) struct LogEntry<'a> {
    /// The log it goes to (a handler may choose: a site's own log).
    pub target: LogTarget,
    pub client: IpAddr,
    /// The worker clock's microseconds when the request was complete.
    pub start_us: u64,
    /// None: answered before a request was parsed (bad input, a timeout).
    pub request: Option<LogRequest<'a>>,
    /// Set by the handler when the request's site gives ids (`X-Request-Id`).
    pub request_id: Option<RequestId>,
}

#[derive(Clone, Copy)]
pub(crate) struct LogRequest<'a> {
    pub method: &'a [u8],
    pub target: &'a [u8],
    pub version: Version,
    pub host: Option<&'a [u8]>,
    pub referer: Option<&'a [u8]>,
    pub user_agent: Option<&'a [u8]>,
}

impl<'a> LogEntry<'a> {
    /// An answer with no request (bad input refused by the codec, a timeout).
    pub fn bare(peer: SocketAddr, start_us: u64) -> LogEntry<'static> {
        LogEntry {
            target: LogTarget::DEFAULT,
            client: peer.ip().to_canonical(),
            start_us,
            request: None,
            request_id: None,
        }
    }
}

/// A [`LogEntry`] kept while its reply is pending (the head it borrowed is gone by then).
/// Only deferred requests pay for this copy.
pub(crate) struct SavedEntry {
    target: LogTarget,
    client: IpAddr,
    start_us: u64,
    version: Version,
    request_id: Option<RequestId>,
    text: Vec<u8>,
    /// Method, target, host, referer, user agent: ranges of `text`.
    fields: [Option<(u32, u32)>; 5],
}

impl SavedEntry {
    /// None for an entry without a request (those are never deferred).
    pub fn save(e: &LogEntry<'_>) -> Option<Box<SavedEntry>> {
        let r = e.request?;
        let parts = [
            Some(r.method),
            Some(r.target),
            r.host,
            r.referer,
            r.user_agent,
        ];
        let mut text = Vec::with_capacity(parts.iter().flatten().map(|p| p.len()).sum());
        let fields = parts.map(|p| {
            p.map(|p| {
                let start = text.len() as u32;
                text.extend_from_slice(p);
                (start, text.len() as u32)
            })
        });
        Some(Box::new(SavedEntry {
            target: e.target,
            client: e.client,
            start_us: e.start_us,
            version: r.version,
            request_id: e.request_id,
            text,
            fields,
        }))
    }

    pub fn entry(&self) -> LogEntry<'_> {
        let field =
            |i: usize| self.fields[i].map(|(start, end)| &self.text[start as usize..end as usize]);
        LogEntry {
            target: self.target,
            client: self.client,
            start_us: self.start_us,
            request: Some(LogRequest {
                method: field(0).unwrap_or(b"-"),
                target: field(1).unwrap_or(b"-"),
                version: self.version,
                host: field(2),
                referer: field(3),
                user_agent: field(4),
            }),
            request_id: self.request_id,
        }
    }
}

/// One worker's side of its access logs: a buffer per file. A line goes to the file its
/// entry names ([`LogTarget`]).
pub(crate) struct WorkerLog {
    logs: Vec<LogBuffer>,
}

impl WorkerLog {
    pub(crate) fn new(shared: &[Arc<LogShared>], id: usize) -> WorkerLog {
        WorkerLog {
            logs: shared
                .iter()
                .map(|s| LogBuffer::new(s.clone(), id))
                .collect(),
        }
    }

    /// The entry for a parsed request (the client address as the first log finds it);
    /// `start_us` is when it was complete.
    pub fn entry<'h>(
        &self,
        head: &RequestHead<'h>,
        peer: SocketAddr,
        start_us: u64,
    ) -> LogEntry<'h> {
        self.logs[0].entry(head, peer, start_us)
    }

    pub fn record(&mut self, e: &LogEntry<'_>, status: u16, bytes: u64, clock: &Clock) {
        self.record_upstream(e, status, bytes, None, clock)
    }

    /// [`Self::record`] for a proxied answer: `upstream_us` is how long the upstream server
    /// took, from the request sent to the response's end.
    pub fn record_upstream(
        &mut self,
        e: &LogEntry<'_>,
        status: u16,
        bytes: u64,
        upstream_us: Option<u64>,
        clock: &Clock,
    ) {
        if let Some(log) = self.logs.get_mut(usize::from(e.target.0)) {
            log.record_upstream(e, status, bytes, upstream_us, clock);
        }
    }

    /// Once per loop turn: lines older than `MAX_AGE` go to the writer.
    #[inline]
    pub fn tick(&mut self, now_ms: u64) {
        for log in &mut self.logs {
            log.tick(now_ms);
        }
    }

    /// After a panic in a connection's code: a line it was writing may be cut short, and
    /// is dropped (every whole line ends with `\n`).
    pub fn drop_partial_lines(&mut self) {
        for log in &mut self.logs {
            let whole = log
                .buf
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1);
            log.buf.truncate(whole);
        }
    }
}

/// One worker's side of one log file: its buffer, the cached timestamp and client address.
pub(crate) struct LogBuffer {
    shared: Arc<LogShared>,
    id: usize,
    buf: Vec<u8>,
    /// Lines in `buf`.
    lines: u64,
    /// The worker clock's milliseconds when `buf`'s first line was added.
    since_ms: u64,
    stamp: Stamp,
    ip: IpCache,
}

impl LogBuffer {
    pub(crate) fn new(shared: Arc<LogShared>, id: usize) -> LogBuffer {
        LogBuffer {
            id,
            buf: Vec::with_capacity(BUF_CAPACITY),
            lines: 0,
            since_ms: 0,
            stamp: Stamp::new(shared.format),
            ip: IpCache::default(),
            shared,
        }
    }

    /// The entry for a parsed request; `start_us` is when it was complete.
    pub fn entry<'h>(
        &self,
        head: &RequestHead<'h>,
        peer: SocketAddr,
        start_us: u64,
    ) -> LogEntry<'h> {
        let client = match &self.shared.client_ip {
            Some(f) => f(peer, head),
            None => peer.ip(),
        };
        LogEntry {
            target: LogTarget::DEFAULT,
            client: client.to_canonical(),
            start_us,
            request: Some(LogRequest {
                method: head.method_str.as_bytes(),
                target: head.target.as_bytes(),
                version: head.version,
                host: head.host,
                referer: head.referer,
                user_agent: head.user_agent,
            }),
            request_id: None,
        }
    }

    /// Appends the line of an answer: `status`, with `bytes` of body queued for the client,
    /// `upstream_us` the upstream's time for a proxied answer.
    pub fn record_upstream(
        &mut self,
        e: &LogEntry<'_>,
        status: u16,
        bytes: u64,
        upstream_us: Option<u64>,
        clock: &Clock,
    ) {
        if self.buf.len() >= BUF_MAX && !self.hand_over() {
            self.shared
                .stats
                .worker(self.id)
                .bump(Counter::AccessLogLinesDropped);
            return;
        }
        let duration_us = clock.precise_us().saturating_sub(e.start_us);
        self.stamp.refresh(clock.unix_secs());
        if self.buf.is_empty() {
            self.since_ms = clock.now_ms();
            self.shared.pending[self.id].store(true, Ordering::Relaxed);
        }
        let client = self.ip.text(e.client);
        let line = Line {
            stamp: self.stamp.text(),
            client,
            entry: e,
            status,
            bytes,
            duration_us,
            upstream_us,
        };
        match self.shared.format {
            AccessLogFormat::Combined => line.push_combined(&mut self.buf),
            AccessLogFormat::Json => line.push_json(&mut self.buf),
        }
        self.lines += 1;
        if self.buf.len() >= HAND_OVER_AT {
            self.hand_over();
        }
    }

    /// Once per loop turn: lines older than `MAX_AGE` go to the writer.
    #[inline]
    pub fn tick(&mut self, now_ms: u64) {
        if !self.buf.is_empty()
            && now_ms.saturating_sub(self.since_ms) >= MAX_AGE.as_millis() as u64
        {
            self.hand_over();
        }
    }

    /// Gives the buffer to the writer and takes an empty one. False if the queue is full
    /// (the buffer is kept).
    fn hand_over(&mut self) -> bool {
        if self.shared.full.is_full() {
            return false;
        }
        let fresh = self
            .shared
            .empty
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BUF_CAPACITY));
        let full = std::mem::replace(&mut self.buf, fresh);
        match self.shared.full.push(full) {
            Ok(()) => {
                self.lines = 0;
                self.shared.pending[self.id].store(false, Ordering::Relaxed);
                self.shared.wake_writer();
                true
            }
            Err(full) => {
                // Another worker took the last slot meanwhile.
                let fresh = std::mem::replace(&mut self.buf, full);
                let _ = self.shared.empty.push(fresh);
                false
            }
        }
    }
}

impl Drop for LogBuffer {
    /// The worker is exiting (shutdown): its last lines go to the writer, which runs until
    /// every worker has exited. Waits for queue room a bounded time.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.buf.is_empty() && !self.hand_over() {
            if Instant::now() >= deadline {
                let stats = self.shared.stats.worker(self.id);
                for _ in 0..self.lines {
                    stats.bump(Counter::AccessLogLinesDropped);
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The writer thread: writes handed-over buffers to the file, reopens it on request, wakes
/// workers whose lines wait, and exits once stopped (after every worker has exited and
/// handed over its last lines) with the queue drained. `stopped` is the server's
/// `StopSignal::is_stopped`.
pub(crate) fn run_writer(
    shared: Arc<LogShared>,
    mut file: File,
    inboxes: Vec<InboxSender<WorkerMessage>>,
    stopped: impl Fn() -> bool,
) {
    let _ = shared.writer.set(std::thread::current());
    let mut last_nudge = Instant::now();
    loop {
        // Read before draining: whatever was handed over before the stop is drained below.
        let stopped = stopped();
        while let Some(mut buf) = shared.full.pop() {
            write_out(&mut file, &buf, &shared);
            buf.clear();
            if buf.capacity() <= 2 * BUF_CAPACITY {
                let _ = shared.empty.push(buf);
            }
        }
        if shared.reopen.swap(false, Ordering::AcqRel) {
            match open_log(&shared.path) {
                Ok(f) => {
                    file = f;
                    tracing::info!("access log reopened: {}", shared.path.display());
                }
                Err(e) => tracing::error!(
                    "cannot reopen the access log {}: {e}; still writing to the old file",
                    shared.path.display()
                ),
            }
        }
        if stopped {
            return;
        }
        if last_nudge.elapsed() >= MAX_AGE {
            last_nudge = Instant::now();
            for (pending, inbox) in shared.pending.iter().zip(&inboxes) {
                if pending.load(Ordering::Relaxed) {
                    inbox.nudge();
                }
            }
        }
        std::thread::park_timeout(MAX_AGE);
    }
}

fn write_out(file: &mut File, buf: &[u8], shared: &LogShared) {
    let lines = memchr::memchr_iter(b'\n', buf).count() as u64;
    let aux = shared.stats.aux();
    match file.write_all(buf) {
        Ok(()) => aux.add_shared(Counter::AccessLogLines, lines),
        Err(e) => {
            aux.add_shared(Counter::AccessLogLinesDropped, lines);
            // At most one line a second: a full disk must not flood the error log too.
            static LAST: std::sync::Mutex<Option<Instant>> = std::sync::Mutex::new(None);
            let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                *last = Some(Instant::now());
                tracing::error!(
                    "cannot write the access log {}: {e}; {lines} lines dropped",
                    shared.path.display()
                );
            }
        }
    }
}

/// The fields of one line.
struct Line<'a> {
    stamp: &'a [u8],
    client: &'a [u8],
    entry: &'a LogEntry<'a>,
    status: u16,
    bytes: u64,
    duration_us: u64,
    upstream_us: Option<u64>,
}

impl Line<'_> {
    /// `$remote_addr - - [$time_local] "$request" $status $body_bytes_sent "$http_referer"
    /// "$http_user_agent" "$host" $duration_us $upstream_us`, escaped as nginx does.
    fn push_combined(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.client);
        out.extend_from_slice(b" - - [");
        out.extend_from_slice(self.stamp);
        out.extend_from_slice(b"] \"");
        let r = self.entry.request;
        match r {
            Some(r) => {
                push_nginx(out, r.method);
                out.push(b' ');
                push_nginx(out, r.target);
                out.push(b' ');
                out.extend_from_slice(protocol(r.version));
            }
            None => out.push(b'-'),
        }
        out.extend_from_slice(b"\" ");
        out.extend_from_slice(itoa::Buffer::new().format(self.status).as_bytes());
        out.push(b' ');
        out.extend_from_slice(itoa::Buffer::new().format(self.bytes).as_bytes());
        for field in [
            r.and_then(|r| r.referer),
            r.and_then(|r| r.user_agent),
            r.and_then(|r| r.host),
        ] {
            out.extend_from_slice(b" \"");
            match field {
                Some(v) => push_nginx(out, v),
                None => out.push(b'-'),
            }
            out.push(b'"');
        }
        out.push(b' ');
        out.extend_from_slice(itoa::Buffer::new().format(self.duration_us).as_bytes());
        out.push(b' ');
        match self.upstream_us {
            Some(us) => out.extend_from_slice(itoa::Buffer::new().format(us).as_bytes()),
            None => out.push(b'-'),
        }
        // Only on sites that give ids, so other lines keep their shape. Its characters
        // need no escaping (see `RequestId::parse`).
        if let Some(id) = &self.entry.request_id {
            out.push(b' ');
            out.extend_from_slice(id.as_str().as_bytes());
        }
        out.push(b'\n');
    }

    fn push_json(&self, out: &mut Vec<u8>) {
        let r = self.entry.request;
        out.extend_from_slice(b"{\"time\":\"");
        out.extend_from_slice(self.stamp);
        out.extend_from_slice(b"\",\"client\":\"");
        out.extend_from_slice(self.client);
        out.extend_from_slice(b"\",\"method\":");
        push_json_opt(out, r.map(|r| r.method));
        out.extend_from_slice(b",\"target\":");
        push_json_opt(out, r.map(|r| r.target));
        out.extend_from_slice(b",\"protocol\":");
        match r {
            Some(r) => {
                out.push(b'"');
                out.extend_from_slice(protocol(r.version));
                out.push(b'"');
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"status\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.status).as_bytes());
        out.extend_from_slice(b",\"bytes\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.bytes).as_bytes());
        out.extend_from_slice(b",\"duration_us\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.duration_us).as_bytes());
        out.extend_from_slice(b",\"referer\":");
        push_json_opt(out, r.and_then(|r| r.referer));
        out.extend_from_slice(b",\"user_agent\":");
        push_json_opt(out, r.and_then(|r| r.user_agent));
        out.extend_from_slice(b",\"host\":");
        push_json_opt(out, r.and_then(|r| r.host));
        out.extend_from_slice(b",\"upstream_us\":");
        match self.upstream_us {
            Some(us) => out.extend_from_slice(itoa::Buffer::new().format(us).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        if let Some(id) = &self.entry.request_id {
            out.extend_from_slice(b",\"request_id\":\"");
            out.extend_from_slice(id.as_str().as_bytes());
            out.push(b'"');
        }
        out.extend_from_slice(b"}\n");
    }
}

fn protocol(v: Version) -> &'static [u8] {
    match v {
        Version::Http10 => b"HTTP/1.0",
        Version::Http11 => b"HTTP/1.1",
        // As nginx writes it (`$server_protocol`), which log analysers expect.
        Version::Http2 => b"HTTP/2.0",
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Printable ASCII that needs no escape in either format.
#[inline]
fn plain(b: u8) -> bool {
    (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\'
}

fn push_hex_byte(out: &mut Vec<u8>, prefix: &[u8], b: u8) {
    out.extend_from_slice(prefix);
    out.push(HEX[usize::from(b >> 4)]);
    out.push(HEX[usize::from(b & 15)]);
}

/// nginx's escaping (`log_format` default): `"`, `\`, control characters and bytes above
/// 0x7e become `\xHH`.
fn push_nginx(out: &mut Vec<u8>, s: &[u8]) {
    if s.iter().all(|&b| plain(b)) {
        out.extend_from_slice(s);
        return;
    }
    for &b in s {
        if plain(b) {
            out.push(b);
        } else {
            push_hex_byte(out, b"\\x", b);
        }
    }
}

/// A JSON string, or `null`. Valid UTF-8 stays as it is; `"` and control characters get
/// JSON escapes; a backslash and each byte that is not UTF-8 become the text `\xHH` (as in
/// the combined format), so the decoded string tells a client's `\xFF` from a 0xFF byte.
fn push_json_opt(out: &mut Vec<u8>, s: Option<&[u8]>) {
    let Some(s) = s else {
        out.extend_from_slice(b"null");
        return;
    };
    out.push(b'"');
    if s.iter().all(|&b| plain(b)) {
        out.extend_from_slice(s);
    } else {
        for chunk in s.utf8_chunks() {
            for &b in chunk.valid().as_bytes() {
                match b {
                    b'"' => out.extend_from_slice(b"\\\""),
                    b'\\' => out.extend_from_slice(b"\\\\x5C"),
                    0..=0x1f | 0x7f => push_hex_byte(out, b"\\u00", b),
                    _ => out.push(b),
                }
            }
            for &b in chunk.invalid() {
                push_hex_byte(out, b"\\\\x", b);
            }
        }
    }
    out.push(b'"');
}

/// The timestamp of the current second, formatted when the second changes.
struct Stamp {
    format: AccessLogFormat,
    secs: u64,
    text: [u8; 26],
    len: usize,
}

impl Stamp {
    fn new(format: AccessLogFormat) -> Stamp {
        let mut s = Stamp {
            format,
            secs: 0,
            text: [0; 26],
            len: 0,
        };
        s.format_secs(0);
        s
    }

    #[inline]
    fn refresh(&mut self, secs: u64) {
        if secs != self.secs {
            self.format_secs(secs);
        }
    }

    fn text(&self) -> &[u8] {
        &self.text[..self.len]
    }

    /// `23/Nov/2026:21:12:08 +0000` (combined, in UTC) or `2026-11-23T21:12:08Z` (JSON).
    #[cold]
    fn format_secs(&mut self, secs: u64) {
        const MONTHS: [&[u8; 3]; 12] = [
            b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
            b"Dec",
        ];
        self.secs = secs;
        let (y, m, d) = civil_from_days((secs / 86_400) as i64);
        let t = secs % 86_400;
        let (hh, mm, ss) = ((t / 3600) as u32, (t / 60 % 60) as u32, (t % 60) as u32);
        let mut out = Vec::with_capacity(26);
        let two = |out: &mut Vec<u8>, v: u32| {
            out.push(b'0' + (v / 10) as u8);
            out.push(b'0' + (v % 10) as u8);
        };
        let year = |out: &mut Vec<u8>| {
            for div in [1000, 100, 10, 1] {
                out.push(b'0' + (y / div % 10) as u8);
            }
        };
        match self.format {
            AccessLogFormat::Combined => {
                two(&mut out, d);
                out.push(b'/');
                out.extend_from_slice(MONTHS[m as usize - 1]);
                out.push(b'/');
                year(&mut out);
                out.push(b':');
                two(&mut out, hh);
                out.push(b':');
                two(&mut out, mm);
                out.push(b':');
                two(&mut out, ss);
                out.extend_from_slice(b" +0000");
            }
            AccessLogFormat::Json => {
                year(&mut out);
                out.push(b'-');
                two(&mut out, m);
                out.push(b'-');
                two(&mut out, d);
                out.push(b'T');
                two(&mut out, hh);
                out.push(b':');
                two(&mut out, mm);
                out.push(b':');
                two(&mut out, ss);
                out.push(b'Z');
            }
        }
        self.len = out.len();
        self.text[..out.len()].copy_from_slice(&out);
    }
}

/// Year, month (1-12) and day (1-31) of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// The last client address and its text: a keep-alive connection's requests share it.
#[derive(Default)]
struct IpCache {
    ip: Option<IpAddr>,
    text: Vec<u8>,
}

impl IpCache {
    fn text(&mut self, ip: IpAddr) -> &[u8] {
        if self.ip != Some(ip) {
            self.ip = Some(ip);
            self.text.clear();
            push_ip(&mut self.text, ip);
        }
        &self.text
    }
}

/// An address as `Display` writes it (RFC 5952 for IPv6), without a formatter.
fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip.to_canonical() {
        IpAddr::V4(a) => {
            for (i, octet) in a.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                out.extend_from_slice(itoa::Buffer::new().format(octet).as_bytes());
            }
        }
        IpAddr::V6(a) => {
            let seg = a.segments();
            // The longest run of two or more zero groups (the first of equals) becomes `::`.
            let (mut best_at, mut best_len) = (8, 0);
            let mut i = 0;
            while i < 8 {
                let start = i;
                while i < 8 && seg[i] == 0 {
                    i += 1;
                }
                if i - start > best_len {
                    (best_at, best_len) = (start, i - start);
                }
                i += 1;
            }
            if best_len < 2 {
                (best_at, best_len) = (8, 0);
            }
            let mut i = 0;
            while i < 8 {
                if i == best_at {
                    out.extend_from_slice(b"::");
                    i += best_len;
                    continue;
                }
                if i > 0 && i != best_at + best_len {
                    out.push(b':');
                }
                let g = seg[i];
                let mut started = false;
                for shift in [12, 8, 4, 0] {
                    let nibble = (g >> shift) & 15;
                    if started || nibble != 0 || shift == 0 {
                        started = true;
                        out.push(b"0123456789abcdef"[usize::from(nibble)]);
                    }
                }
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    fn request<'a>(target: &'a [u8], ua: Option<&'a [u8]>) -> LogEntry<'a> {
        LogEntry {
            target: LogTarget::DEFAULT,
            client: "192.0.2.7".parse().unwrap(),
            start_us: 0,
            request: Some(LogRequest {
                method: b"GET",
                target,
                version: Version::Http11,
                host: Some(b"example.org"),
                referer: None,
                user_agent: ua,
            }),
            request_id: None,
        }
    }

    fn line(format: AccessLogFormat, e: &LogEntry<'_>, secs: u64) -> String {
        let mut stamp = Stamp::new(format);
        stamp.refresh(secs);
        let mut client = Vec::new();
        push_ip(&mut client, e.client);
        let l = Line {
            stamp: stamp.text(),
            client: &client,
            entry: e,
            status: 200,
            bytes: 1234,
            duration_us: 56,
            upstream_us: None,
        };
        let mut out = Vec::new();
        match format {
            AccessLogFormat::Combined => l.push_combined(&mut out),
            AccessLogFormat::Json => l.push_json(&mut out),
        }
        String::from_utf8(out).expect("a log line is UTF-8")
    }

    #[test]
    fn combined_line_is_nginx_combined_plus_host_and_times() {
        let e = request(b"/a?b=1", Some(b"curl/8.5"));
        assert_eq!(
            line(AccessLogFormat::Combined, &e, 784_111_777),
            "192.0.2.7 - - [06/Nov/1994:08:49:37 +0000] \"GET /a?b=1 HTTP/1.1\" 200 1234 \"-\" \"curl/8.5\" \"example.org\" 56 -\n"
        );
        let bare = LogEntry::bare("[2001:db8::1]:5".parse().unwrap(), 0);
        assert_eq!(
            line(AccessLogFormat::Combined, &bare, 0),
            "2001:db8::1 - - [01/Jan/1970:00:00:00 +0000] \"-\" 200 1234 \"-\" \"-\" \"-\" 56 -\n"
        );
    }

    #[test]
    fn json_line_has_every_field() {
        let e = request(b"/", None);
        let text = line(AccessLogFormat::Json, &e, 1_795_468_328);
        assert_eq!(
            text,
            "{\"time\":\"2026-11-23T21:12:08Z\",\"client\":\"192.0.2.7\",\"method\":\"GET\",\"target\":\"/\",\"protocol\":\"HTTP/1.1\",\"status\":200,\"bytes\":1234,\"duration_us\":56,\"referer\":null,\"user_agent\":null,\"host\":\"example.org\",\"upstream_us\":null}\n"
        );
        let bare = LogEntry::bare("10.0.0.1:1".parse().unwrap(), 0);
        let text = line(AccessLogFormat::Json, &bare, 0);
        assert!(
            text.contains("\"method\":null,\"target\":null,\"protocol\":null,"),
            "{text}"
        );
    }

    const HOSTILE: &[u8] = b"a\"b\\c\x01\td\x7f\xff\xc3\xa9 \"\n-";

    #[test]
    fn combined_escapes_hostile_bytes_like_nginx() {
        let e = request(b"/x\"y\\z", Some(HOSTILE));
        let text = line(AccessLogFormat::Combined, &e, 0);
        assert!(text.contains("\"GET /x\\x22y\\x5Cz HTTP/1.1\""), "{text}");
        assert!(
            text.contains("\"a\\x22b\\x5Cc\\x01\\x09d\\x7F\\xFF\\xC3\\xA9 \\x22\\x0A-\""),
            "{text}"
        );
        // One line, and every quote that is left delimits a field.
        assert_eq!(text.matches('\n').count(), 1);
        assert_eq!(text.matches('"').count(), 8, "{text}");
    }

    #[test]
    fn json_escapes_hostile_bytes_into_valid_json() {
        let e = request(b"/x\"y\\z", Some(HOSTILE));
        let text = line(AccessLogFormat::Json, &e, 0);
        assert_eq!(text.matches('\n').count(), 1);
        assert!(text.contains("\"target\":\"/x\\\"y\\\\x5Cz\""), "{text}");
        assert!(
            text.contains(
                "\"user_agent\":\"a\\\"b\\\\x5Cc\\u0001\\u0009d\\u007F\\\\xFF\u{e9} \\\"\\u000A-\""
            ),
            "{text}"
        );
        // A strict parser (with the value decoded) agrees.
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).expect("valid JSON");
        assert_eq!(v["user_agent"], "a\"b\\x5Cc\u{1}\td\u{7f}\\xFF\u{e9} \"\n-");
        assert_eq!(v["target"], "/x\"y\\x5Cz");
        assert_eq!(v["upstream_us"], serde_json::Value::Null);
        assert_eq!(v["duration_us"], 56);
    }

    #[test]
    fn timestamps_match_the_calendar() {
        for secs in [0, 784_111_777, 951_782_400, 1_709_164_800, 4_102_444_799] {
            let mut s = Stamp::new(AccessLogFormat::Json);
            s.refresh(secs);
            let when = std::time::UNIX_EPOCH + Duration::from_secs(secs);
            // httpdate gives `Sun, 06 Nov 1994 08:49:37 GMT`.
            let http = httpdate::fmt_http_date(when);
            let parts: Vec<&str> = http.split([' ', ':']).collect();
            let month = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ]
            .iter()
            .position(|m| *m == parts[2])
            .unwrap()
                + 1;
            let want = format!(
                "{}-{month:02}-{}T{}:{}:{}Z",
                parts[3], parts[1], parts[4], parts[5], parts[6]
            );
            assert_eq!(std::str::from_utf8(s.text()).unwrap(), want);
            let mut c = Stamp::new(AccessLogFormat::Combined);
            c.refresh(secs);
            let want = format!(
                "{}/{}/{}:{}:{}:{} +0000",
                parts[1], parts[2], parts[3], parts[4], parts[5], parts[6]
            );
            assert_eq!(std::str::from_utf8(c.text()).unwrap(), want);
        }
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let mut samples: Vec<IpAddr> = vec![
            "0.0.0.0".parse().unwrap(),
            "255.255.255.255".parse().unwrap(),
            "::".parse().unwrap(),
            "::1".parse().unwrap(),
            "1::".parse().unwrap(),
            "2001:db8::1:0:0:1".parse().unwrap(),
            "2001:0:0:1::1".parse().unwrap(),
            "1:0:1:0:1:0:1:0".parse().unwrap(),
            "fe80::abcd:ef01:2345:6789".parse().unwrap(),
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2000 {
            let mut seg = [0u16; 8];
            for s in &mut seg {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Many zero groups, so runs of every length and position occur.
                *s = if x & 3 == 0 { (x >> 20) as u16 } else { 0 };
            }
            samples.push(IpAddr::V6(Ipv6Addr::from(seg)));
        }
        for ip in samples {
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                ip.to_canonical().to_string(),
                "{ip:?}"
            );
        }
    }

    fn test_log(queue: usize) -> (Arc<LogShared>, Stats, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let log =
            AccessLog::open(&dir.path().join("access.log"), AccessLogFormat::Combined).unwrap();
        let stats = Stats::new(1);
        (
            Arc::new(LogShared::with_queue(&log, 1, queue, stats.clone())),
            stats,
            dir,
        )
    }

    #[test]
    fn full_buffers_are_handed_over_and_come_back_empty() {
        let (shared, stats, _dir) = test_log(4);
        let mut w = WorkerLog::new(std::slice::from_ref(&shared), 0);
        let mut clock = Clock::new();
        clock.update();
        let e = request(b"/some/page.html", Some(b"Mozilla/5.0"));
        let mut n = 0;
        while shared.full.is_empty() {
            w.record(&e, 200, 10, &clock);
            n += 1;
        }
        assert!(!shared.pending[0].load(Ordering::Relaxed));
        let mut handed = shared.full.pop().unwrap();
        assert!(handed.len() >= HAND_OVER_AT);
        assert_eq!(memchr::memchr_iter(b'\n', &handed).count(), n);
        assert!(w.logs[0].buf.is_empty(), "the worker took an empty buffer");
        // The written buffer comes back through `empty` and is reused.
        handed.clear();
        let ptr = handed.as_ptr();
        shared.empty.push(handed).unwrap();
        while shared.full.is_empty() {
            w.record(&e, 200, 10, &clock);
        }
        assert_eq!(
            w.logs[0].buf.as_ptr(),
            ptr,
            "the worker took the written buffer back"
        );
        assert!(w.logs[0].buf.is_empty());
        assert_eq!(stats.snapshot().get(Counter::AccessLogLinesDropped), 0);
    }

    #[test]
    fn a_quiet_worker_hands_over_old_lines() {
        let (shared, _stats, _dir) = test_log(4);
        let mut w = WorkerLog::new(std::slice::from_ref(&shared), 0);
        let mut clock = Clock::new();
        clock.update();
        w.record(&request(b"/", None), 200, 0, &clock);
        assert!(shared.pending[0].load(Ordering::Relaxed));
        w.tick(clock.now_ms() + 1);
        assert!(shared.full.is_empty(), "young lines wait for company");
        w.tick(clock.now_ms() + 100);
        assert_eq!(shared.full.len(), 1);
        assert!(!shared.pending[0].load(Ordering::Relaxed));
    }

    #[test]
    fn lines_are_dropped_and_counted_when_the_queue_stays_full() {
        let (shared, stats, _dir) = test_log(1);
        let mut w = WorkerLog::new(std::slice::from_ref(&shared), 0);
        let mut clock = Clock::new();
        clock.update();
        let e = request(b"/some/page.html", Some(b"Mozilla/5.0"));
        let mut recorded = 0u64;
        // One buffer fills the queue; the next grows to BUF_MAX; then lines are dropped.
        while stats.snapshot().get(Counter::AccessLogLinesDropped) < 10 {
            w.record(&e, 200, 10, &clock);
            recorded += 1;
            assert!(w.logs[0].buf.len() < BUF_MAX + 1024, "the buffer is capped");
        }
        let queued = memchr::memchr_iter(b'\n', &shared.full.pop().unwrap()).count() as u64;
        let kept = memchr::memchr_iter(b'\n', &w.logs[0].buf).count() as u64;
        assert_eq!(
            queued + kept + 10,
            recorded,
            "every line is queued, kept or counted"
        );
        // Room again: the kept buffer goes at the next line, nothing more is dropped.
        w.record(&e, 200, 10, &clock);
        assert_eq!(shared.full.len(), 1);
        assert_eq!(stats.snapshot().get(Counter::AccessLogLinesDropped), 10);
        shared.full.pop(); // room for the worker's last line as it is dropped
    }

    #[test]
    fn the_writer_writes_everything_handed_over_before_the_stop() {
        let (shared, stats, dir) = test_log(4);
        let file = open_log(&dir.path().join("access.log")).unwrap();
        let stop = crate::StopSignal::default();
        let writer = {
            let (shared, stop) = (shared.clone(), stop.clone());
            std::thread::spawn(move || {
                run_writer(shared, file, Vec::new(), move || stop.is_stopped())
            })
        };
        let mut clock = Clock::new();
        clock.update();
        let mut w = WorkerLog::new(std::slice::from_ref(&shared), 0);
        for _ in 0..1000 {
            w.record(&request(b"/", None), 200, 0, &clock);
        }
        drop(w); // as a worker exits: its last lines are handed over
        stop.raise();
        writer.join().unwrap();
        let text = std::fs::read_to_string(dir.path().join("access.log")).unwrap();
        assert_eq!(text.lines().count(), 1000);
        assert_eq!(stats.snapshot().get(Counter::AccessLogLines), 1000);
    }

    #[test]
    fn saved_entries_give_back_what_they_saved() {
        let e = request(b"/t?q", Some(b"ua"));
        let saved = SavedEntry::save(&e).unwrap();
        let back = saved.entry();
        assert_eq!(
            line(AccessLogFormat::Json, &back, 5),
            line(AccessLogFormat::Json, &e, 5)
        );
        assert!(SavedEntry::save(&LogEntry::bare("1.2.3.4:5".parse().unwrap(), 0)).is_none());
    }

    #[test]
    fn a_request_id_ends_the_line_when_there_is_one() {
        let mut e = request(b"/", None);
        e.request_id = RequestId::parse(b"abc-1");
        let combined = line(AccessLogFormat::Combined, &e, 0);
        assert!(
            combined.ends_with("\"example.org\" 56 - abc-1\n"),
            "{combined}"
        );
        let json = line(AccessLogFormat::Json, &e, 0);
        assert!(
            json.ends_with(",\"upstream_us\":null,\"request_id\":\"abc-1\"}\n"),
            "{json}"
        );
        let back = SavedEntry::save(&e).unwrap();
        assert_eq!(line(AccessLogFormat::Json, &back.entry(), 0), json);
    }
}
