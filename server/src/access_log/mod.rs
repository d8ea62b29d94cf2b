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
//!
//! Here: the API, the workers' buffers and the writer thread. The line itself: `entry.rs`
//! (what it says of the request), `line.rs` (the two formats), `stamp.rs` (the timestamp),
//! `ip_cache.rs` (the client address).

mod entry;
mod ip_cache;
mod line;
mod stamp;

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
use tern_codec::RequestHead;
use tern_runtime::{Clock, InboxSender};

pub(crate) use self::entry::{LogEntry, LogRequest, SavedEntry};
use self::ip_cache::IpCache;
pub use self::line::AccessLogFormat;
use self::line::Line;
use self::stamp::Stamp;
use crate::handler::{LogTarget, WorkerMessage};
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
            cache: None,
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

#[cfg(test)]
mod tests {
    use super::line::tests::request;
    use super::*;

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
}
