//! A connection driven in memory, with no socket: the very [`Conn`](crate::conn) a worker runs,
//! fed bytes by the caller, its output collected. This is what the sans-IO split buys: the
//! fuzzer (`fuzz/fuzz_targets/tls_http.rs`) and tests run the transport, the protocol and the
//! handlers without the network or threads. Deferred replies are never completed here.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64};
use std::sync::Arc;

use tern_runtime::{BufPool, Clock, Inbox, InboxSender};
use tern_tls::TlsAcceptor;

use crate::conn::output::MAX_IOVECS;
use crate::conn::{Action, Conn, ConnCx, Link, Transmit};
use crate::handler::WorkerMessage;
use crate::worker::Shared;
use crate::{ListenerKind, Router, ServerConfig, Stats};

/// One connection, in memory.
pub struct MemoryConn {
    shared: Arc<Shared>,
    clock: Clock,
    buffers: BufPool,
    scratch: Vec<u8>,
    inbox: InboxSender<WorkerMessage>,
    _poll: mio::Poll,
    conn: Conn,
    output: Vec<u8>,
    closed: bool,
    eof_delivered: bool,
}

impl MemoryConn {
    /// A connection as if accepted on a TLS listener (with `tls`) or a plain one.
    pub fn new(router: Router, tls: Option<Arc<TlsAcceptor>>) -> io::Result<MemoryConn> {
        let config = ServerConfig {
            listener_kinds: vec![if tls.is_some() {
                ListenerKind::Https
            } else {
                ListenerKind::Http
            }],
            ..ServerConfig::default()
        };
        let poll = mio::Poll::new()?;
        let waker = mio::Waker::new(poll.registry(), mio::Token(0))?;
        let inbox = InboxSender::new(Arc::new(Inbox::new(waker, 16)));
        let session = tls.as_ref().map(|t| t.accept());
        let shared = Arc::new(Shared {
            router,
            stats: Stats::new(1),
            live: arc_swap::ArcSwap::from_pointee(config.clone()),
            config,
            reloads: AtomicU64::new(0),
            hsts_line: None,
            https_port: AtomicU16::new(0),
            tls,
            bans: None,
            access_logs: Vec::new(),
        });
        let link = Link {
            peer: SocketAddr::from(([192, 0, 2, 1], 40000)),
            key: 1 << 32,
            secure: session.is_some(),
            redirect_to_https: None,
        };
        Ok(MemoryConn {
            shared,
            clock: Clock::new(),
            buffers: BufPool::new(4096, 16 * 1024, 4),
            scratch: Vec::new(),
            inbox,
            _poll: poll,
            conn: Conn::new(link, session, 0),
            output: Vec::new(),
            closed: false,
            eof_delivered: false,
        })
    }

    /// Bytes from the peer, as one read each time the connection asks for input.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.run(bytes, false);
    }

    /// The peer closed its side.
    pub fn feed_eof(&mut self) {
        self.run(&[], true);
    }

    /// Everything the connection has sent since the last call.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// The connection closed (or shut its write side down to linger).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// The server's counters (handshakes, failures, responses).
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    fn run(&mut self, mut input: &[u8], eof: bool) {
        if self.closed {
            return;
        }
        let config = self.shared.live.load_full();
        let mut cx = ConnCx {
            shared: &self.shared,
            config: &config,
            stats: self.shared.stats.worker(0),
            clock: &self.clock,
            buffers: &mut self.buffers,
            scratch: &mut self.scratch,
            access_log: None,
            inbox: &self.inbox,
            worker_id: 0,
            stopping: false,
            draining: false,
            near_limit: false,
        };
        loop {
            loop {
                let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
                let sent = match self.conn.poll_transmit(&mut cx, &mut iov) {
                    Transmit::Nothing => break,
                    Transmit::Failed => {
                        self.closed = true;
                        return;
                    }
                    Transmit::Memory { count, .. } => {
                        let mut n = 0;
                        for slice in &iov[..count] {
                            self.output.extend_from_slice(slice);
                            n += slice.len();
                        }
                        n
                    }
                    Transmit::File { file, offset, len } => {
                        let len = len.min(1 << 20) as usize;
                        let start = self.output.len();
                        self.output.resize(start + len, 0);
                        // SAFETY: `file` is open (held by the connection's output for as long
                        // as the segment is queued); the buffer is valid for `len` bytes.
                        let got = unsafe {
                            libc::pread(
                                file,
                                self.output[start..].as_mut_ptr().cast(),
                                len,
                                offset as libc::off_t,
                            )
                        };
                        if got <= 0 {
                            self.output.truncate(start);
                            self.closed = true;
                            return;
                        }
                        self.output.truncate(start + got as usize);
                        got as usize
                    }
                };
                self.conn.handle_sent(sent);
            }
            match self.conn.poll_action(&mut cx) {
                Action::Transmit => {}
                Action::Wait => return,
                Action::Close | Action::ShutdownWrite => {
                    self.conn.prepare_close();
                    let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
                    if let Transmit::Memory { count, .. } =
                        self.conn.poll_transmit(&mut cx, &mut iov)
                    {
                        for slice in &iov[..count] {
                            self.output.extend_from_slice(slice);
                        }
                    }
                    self.closed = true;
                    return;
                }
                Action::Read => {
                    if input.is_empty() {
                        if eof && !self.eof_delivered {
                            self.eof_delivered = true;
                            self.conn.handle_eof(&mut cx);
                            continue;
                        }
                        return;
                    }
                    let buf = self.conn.recv_buf(&mut cx);
                    if buf.is_empty() {
                        return;
                    }
                    let n = buf.len().min(input.len());
                    buf[..n].copy_from_slice(&input[..n]);
                    input = &input[n..];
                    self.conn.handle_recv(n, &mut cx);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Response, Router};

    fn router() -> Router {
        Router::new().get(
            "/hi",
            |_: &crate::Request<'_>, _: &mut crate::HandlerContext<'_>| {
                Response::text(200, "hi\n").into()
            },
        )
    }

    #[test]
    fn pipelined_requests_are_answered_in_order_in_memory() {
        let mut c = MemoryConn::new(router(), None).unwrap();
        c.feed(b"GET /hi HTTP/1.1\r\nHost: a\r\n\r\nGET /nope HTTP/1.1\r\nHost: a\r\n\r\n");
        let out = String::from_utf8(c.take_output()).unwrap();
        let first = out.find("200 OK").unwrap();
        let second = out.find("404 Not Found").unwrap();
        assert!(first < second, "{out}");
        assert!(!c.is_closed());
        c.feed(b"GET /hi HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        assert!(c.is_closed());
    }

    #[test]
    fn garbage_on_a_tls_connection_fails_the_handshake_with_an_alert() {
        let acceptor = TlsAcceptor::new(&tern_tls::TlsOptions {
            self_signed: true,
            alpn: vec![b"http/1.1".to_vec()],
            ..Default::default()
        })
        .unwrap();
        let mut c = MemoryConn::new(router(), Some(Arc::new(acceptor))).unwrap();
        c.feed(&[0x16, 0x03, 0x01, 0x00, 0x04, 1, 0, 0, 0]);
        let out = c.take_output();
        assert!(c.is_closed());
        assert_eq!(out.first(), Some(&0x15), "an alert record: {out:?}");
        let s = c.stats().snapshot();
        assert_eq!(s.get(crate::Counter::TlsFailedBadRecord), 1);
    }
}
