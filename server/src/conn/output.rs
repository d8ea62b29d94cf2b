use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::Bytes;

use crate::response::{Body, FileBody};

/// Bodies up to this size are copied next to their head, so head and body leave in one
/// write; above it they are queued by reference and gathered with `writev`.
const COPY_BODY_MAX: usize = 16 * 1024;
/// Sent bytes at the front of the buffer worth moving the rest down for (see `compact`).
const COMPACT_AT: usize = 64 * 1024;
/// Most slices handed out for one `writev`.
pub const MAX_IOVECS: usize = 64;

enum Segment {
    /// Bytes of `buf` up to this index.
    Mem {
        end: usize,
    },
    Shared {
        bytes: Bytes,
        pos: usize,
    },
    File {
        body: FileBody,
        sent: u64,
    },
}

/// Pending output of one connection: heads and small bodies in a contiguous buffer (borrowed
/// from the worker's pool), large bodies by reference, files by descriptor, all in order.
/// It does no I/O: the driver sends what [`Output::memory_slices`] and [`Output::front_file`]
/// describe (or the TLS transport encrypts it) and reports progress with [`Output::advance`].
///
/// Completion-safe: a driver whose sends complete later (io_uring) calls [`Output::seal`]
/// once it has handed the slices to the kernel. Until the completion, nothing handed out may
/// move, and an append could reallocate `buf`; so `seal` retires the buffer at once: its
/// unsent bytes become `Shared` segments (turning the `Vec` into `Bytes` keeps its heap block
/// where it is, and nothing can write to `Bytes`), and later appends go to a fresh buffer, as
/// h2o moves its write buffer to `buf_in_flight`. A readiness driver sends and advances in
/// one step and never seals: it pays nothing for this.
#[derive(Default)]
pub struct Output {
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    buf_pos: usize,
    /// Start of the bytes in `buf` not yet covered by a `Mem` segment.
    open_run: usize,
    segments: VecDeque<Segment>,
    pending: usize,
}

impl Output {
    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// Bytes (of memory segments) still to send, plus file bytes.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// The buffer to write a head into. The caller must then call `commit_head`.
    pub fn head_buf(&mut self, pool_buf: impl FnOnce() -> Vec<u8>) -> &mut Vec<u8> {
        if self.buf.capacity() == 0 {
            self.buf = pool_buf();
        }
        self.compact();
        &mut self.buf
    }

    /// Accounts for bytes appended to `head_buf()` since the last call.
    pub fn commit(&mut self, before_len: usize) {
        self.pending += self.buf.len() - before_len;
    }

    /// The memory slices last returned by `memory_slices` were handed to the kernel, which
    /// reads them until the send completes (see the type's documentation): `buf`'s unsent
    /// bytes become `Shared` segments in place, and the next append takes a fresh buffer
    /// from the pool. No byte moves: the heap block of the old `Vec` is owned by the segments
    /// now, and freed once they are sent.
    pub fn seal(&mut self) {
        if self.buf.len() == self.buf_pos {
            return; // nothing of `buf` is in flight
        }
        self.close_run();
        let old = bytes::Bytes::from(std::mem::take(&mut self.buf));
        let mut start = self.buf_pos;
        for seg in self.segments.iter_mut() {
            if let Segment::Mem { end } = *seg {
                *seg = Segment::Shared {
                    bytes: old.slice(start..end),
                    pos: 0,
                };
                start = end;
            }
        }
        self.buf_pos = 0;
        self.open_run = 0;
        debug_assert!(
            self.buf.capacity() == 0
                && self
                    .segments
                    .iter()
                    .all(|s| !matches!(s, Segment::Mem { .. })),
            "a sealed output must hold nothing that can move"
        );
    }

    pub fn push_body(&mut self, body: Body) {
        let len = body.len() as usize;
        match body {
            Body::Empty => {}
            Body::Static(b) if len <= COPY_BODY_MAX => self.push_copy(b),
            Body::Owned(b) if len <= COPY_BODY_MAX => self.push_copy(&b),
            Body::Shared(b) if len <= COPY_BODY_MAX => self.push_copy(&b),
            Body::Static(b) => self.push_shared(Bytes::from_static(b)),
            Body::Owned(b) => self.push_shared(Bytes::from(b)),
            Body::Shared(b) => self.push_shared(b),
            Body::File(f) => {
                if f.len > 0 {
                    self.close_run();
                    self.pending += f.len as usize;
                    self.segments.push_back(Segment::File { body: f, sent: 0 });
                }
            }
        }
    }

    /// Appends raw bytes (e.g. `100 Continue`).
    pub fn push_copy(&mut self, bytes: &[u8]) {
        self.compact();
        self.buf.extend_from_slice(bytes);
        self.pending += bytes.len();
    }

    fn push_shared(&mut self, bytes: Bytes) {
        self.close_run();
        self.pending += bytes.len();
        self.segments.push_back(Segment::Shared { bytes, pos: 0 });
    }

    /// The buffer is emptied when everything is sent; output that is refilled before it ever
    /// drains (a relay feeding a client as fast as the socket takes it, in pieces) would grow
    /// it by everything that passes. So once the sent prefix is large and at least half the
    /// buffer, the unsent rest moves down. Only between sends: a readiness driver's sends are
    /// done by then, and a completion driver's in-flight bytes were sealed out of `buf`.
    fn compact(&mut self) {
        if self.buf_pos < COMPACT_AT || self.buf_pos * 2 < self.buf.len() {
            return;
        }
        let sent = self.buf_pos;
        self.buf.drain(..sent);
        for seg in self.segments.iter_mut() {
            if let Segment::Mem { end } = seg {
                *end -= sent;
            }
        }
        self.open_run = self.open_run.saturating_sub(sent);
        self.buf_pos = 0;
    }

    fn close_run(&mut self) {
        if self.buf.len() > self.open_run {
            self.segments.push_back(Segment::Mem {
                end: self.buf.len(),
            });
            self.open_run = self.buf.len();
        }
    }

    /// The memory segments before the first file, as slices for one `writev` (or one TLS
    /// write), at most `max_bytes` of them. Returns how many slices were filled and whether a
    /// file follows them (its head can then go out with `MSG_MORE`).
    pub fn memory_slices<'a>(&'a self, iov: &mut [IoSlice<'a>], max_bytes: usize) -> (usize, bool) {
        let mut n = 0;
        let mut total = 0;
        let mut pos = self.buf_pos;
        let mut push = |iov: &mut [IoSlice<'a>], n: &mut usize, bytes: &'a [u8]| -> bool {
            if *n == iov.len() || total >= max_bytes {
                return false;
            }
            let take = bytes.len().min(max_bytes - total);
            if take > 0 {
                iov[*n] = IoSlice::new(&bytes[..take]);
                *n += 1;
                total += take;
            }
            true
        };
        for seg in &self.segments {
            match seg {
                Segment::Mem { end } => {
                    if !push(iov, &mut n, &self.buf[pos..*end]) {
                        return (n, false);
                    }
                    pos = *end;
                }
                Segment::Shared { bytes, pos: p } => {
                    if !push(iov, &mut n, &bytes[*p..]) {
                        return (n, false);
                    }
                }
                Segment::File { .. } => return (n, true),
            }
        }
        if self.buf.len() > pos {
            push(iov, &mut n, &self.buf[pos..]);
        }
        (n, false)
    }

    /// The file at the front of the output, if the next bytes to send come from one: the file,
    /// the offset of its next byte and how many bytes of it remain.
    pub fn front_file(&self) -> Option<(&std::fs::File, u64, u64)> {
        match self.segments.front() {
            Some(Segment::File { body, sent }) => {
                Some((&body.file, body.offset + *sent, body.len - *sent))
            }
            _ => None,
        }
    }

    /// Marks `n` bytes as sent: from the file at the front if there is one (see
    /// [`Self::front_file`]), else from the memory segments. Ends a seal: the send completed.
    pub fn advance(&mut self, n: usize) {
        if let Some(Segment::File { body, sent }) = self.segments.front_mut() {
            *sent += n as u64;
            self.pending -= n;
            if *sent >= body.len {
                self.segments.pop_front();
            }
        } else {
            self.advance_memory(n);
        }
        if self.pending == 0 {
            self.reset();
        }
    }

    fn advance_memory(&mut self, mut n: usize) {
        self.pending -= n;
        while n > 0 {
            match self.segments.front_mut() {
                None => {
                    self.buf_pos += n;
                    return;
                }
                Some(Segment::Mem { end }) => {
                    let avail = *end - self.buf_pos;
                    if n < avail {
                        self.buf_pos += n;
                        return;
                    }
                    self.buf_pos = *end;
                    n -= avail;
                    self.segments.pop_front();
                }
                Some(Segment::Shared { bytes, pos }) => {
                    let avail = bytes.len() - *pos;
                    if n < avail {
                        *pos += n;
                        return;
                    }
                    n -= avail;
                    self.segments.pop_front();
                }
                Some(Segment::File { .. }) => unreachable!("memory slices never cover a file"),
            }
        }
    }

    fn reset(&mut self) {
        self.buf.clear();
        self.buf_pos = 0;
        self.open_run = 0;
        self.segments.clear();
        self.pending = 0;
    }

    /// Hands the (empty) buffer back for pooling. Only call when `is_empty()`.
    pub fn take_buf(&mut self) -> Option<Vec<u8>> {
        debug_assert!(self.is_empty());
        (self.buf.capacity() > 0).then(|| std::mem::take(&mut self.buf))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{self, Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;
    use tern_runtime::io::{EpollIo, EpollSock};

    /// Sends the output the way the driver does for a plain connection: `Ok(true)` when all
    /// of it went out, `Ok(false)` when the socket was full.
    fn flush(out: &mut Output, sock: &mut EpollSock) -> io::Result<bool> {
        let mut io = EpollIo::detached()?;
        loop {
            let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
            let t = crate::conn::plain_transmit(out, &mut iov);
            if matches!(t, crate::conn::Transmit::Nothing) {
                return Ok(true);
            }
            match crate::driver::send_once(&mut io, sock, &t, &iov)? {
                Some(n) => out.advance(n),
                None => return Ok(false),
            }
        }
    }

    fn drain(mut out: Output, a: UnixStream, mut b: UnixStream) -> Vec<u8> {
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            b.read_to_end(&mut got).unwrap();
            got
        });
        let mut a = EpollSock::from_std_unix(a).unwrap();
        while !flush(&mut out, &mut a).unwrap() {
            std::thread::yield_now();
        }
        drop(a);
        reader.join().unwrap()
    }

    /// Output refilled before it ever drains (a relay feeding a client whose sends take all
    /// but the last piece) keeps its buffer bounded.
    #[test]
    fn output_that_never_drains_stays_bounded() {
        let mut out = Output::default();
        let mut sent = Vec::new();
        let mut pushed = 0u32;
        for round in 0..2000 {
            for _ in 0..5 {
                let piece: Vec<u8> = (0..10_000u32).map(|i| (pushed + i) as u8).collect();
                pushed += 10_000;
                out.push_body(Body::Owned(piece));
            }
            out.push_body(Body::Shared(bytes::Bytes::from_static(&[0xAA; 20_000])));
            // Take all but a little, so that it never drains.
            let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
            let (n, _) = out.memory_slices(&mut iov, out.pending() - 5000);
            let took: usize = iov[..n].iter().map(|s| s.len()).sum();
            for s in &iov[..n] {
                sent.extend_from_slice(s);
            }
            out.advance(took);
            assert!(!out.is_empty(), "round {round} drained");
            assert!(
                out.buf.capacity() <= 1 << 20,
                "round {round}: {}",
                out.buf.capacity()
            );
        }
        assert!(sent.len() > 100 << 20);
    }

    #[test]
    fn interleaved_heads_bodies_and_files_keep_order() {
        let mut file = tempfile::tempfile().unwrap();
        let content: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        file.write_all(&content).unwrap();
        let file = Arc::new(file);

        let mut out = Output::default();
        let mut expected = Vec::new();
        let big = vec![7u8; 40_000];
        for i in 0..3u8 {
            let head = format!("HEAD{i}\r\n");
            let before = out.head_buf(Vec::new).len();
            out.head_buf(Vec::new).extend_from_slice(head.as_bytes());
            out.commit(before);
            expected.extend_from_slice(head.as_bytes());
            match i {
                0 => {
                    out.push_body(Body::Static(b"small"));
                    expected.extend_from_slice(b"small");
                }
                1 => {
                    out.push_body(Body::Owned(big.clone()));
                    expected.extend_from_slice(&big);
                }
                _ => {
                    out.push_body(Body::File(FileBody {
                        file: file.clone(),
                        offset: 1000,
                        len: 250_000,
                    }));
                    expected.extend_from_slice(&content[1000..251_000]);
                }
            }
        }
        out.push_copy(b"tail");
        expected.extend_from_slice(b"tail");
        assert_eq!(out.pending(), expected.len());
        let (a, b) = UnixStream::pair().unwrap();
        assert_eq!(drain(out, a, b), expected);
    }

    /// Over TCP the head before a file goes out with `sendmsg(MSG_MORE)`; the bytes must still
    /// arrive whole and in order, and the last packet must not be held back.
    #[test]
    fn head_then_file_over_tcp_arrives_whole() {
        let mut file = tempfile::tempfile().unwrap();
        let content: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        file.write_all(&content).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let a = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut b, _) = listener.accept().unwrap();
        let mut out = Output::default();
        let before = out.head_buf(Vec::new).len();
        out.head_buf(Vec::new).extend_from_slice(b"HEAD\r\n");
        out.commit(before);
        out.push_body(Body::File(FileBody {
            file: Arc::new(file),
            offset: 0,
            len: content.len() as u64,
        }));
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; 6 + 200_000];
            b.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
            b.read_exact(&mut got).unwrap();
            got
        });
        let mut a = EpollSock::from_std_tcp(a).unwrap();
        while !flush(&mut out, &mut a).unwrap() {
            std::thread::yield_now();
        }
        // The connection stays open: the reader must get everything without an EOF push.
        let got = reader.join().unwrap();
        assert_eq!(&got[..6], b"HEAD\r\n");
        assert!(got[6..] == content[..]);
    }

    /// What a completion backend relies on: slices handed out and sealed keep their address
    /// and bytes whatever is appended before the send completes (here enough to reallocate
    /// the buffer twice over), and everything still leaves in order.
    #[test]
    fn sealed_bytes_never_move_until_the_send_completes() {
        let mut out = Output::default();
        let mut expected = Vec::new();
        let append = |out: &mut Output, expected: &mut Vec<u8>, bytes: &[u8]| {
            let before = out.head_buf(|| Vec::with_capacity(128)).len();
            out.head_buf(|| Vec::with_capacity(128))
                .extend_from_slice(bytes);
            out.commit(before);
            expected.extend_from_slice(bytes);
        };
        append(&mut out, &mut expected, &[b'a'; 100]);
        let first = |out: &Output| {
            let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
            let (n, _) = out.memory_slices(&mut iov, usize::MAX);
            assert!(n > 0);
            (iov[0].as_ptr() as usize, iov[0].to_vec())
        };
        let (ptr, bytes) = first(&out);
        out.seal();
        append(&mut out, &mut expected, &[b'b'; 10_000]);
        out.push_copy(&[b'c'; 5000]);
        expected.extend_from_slice(&[b'c'; 5000]);
        out.push_body(Body::Owned(vec![b'd'; 20_000]));
        expected.extend_from_slice(&[b'd'; 20_000]);
        assert_eq!(first(&out), (ptr, bytes.clone()));
        // The send completes partly; the rest is resent from where it was.
        out.advance(40);
        let (ptr2, rest) = first(&out);
        assert_eq!((ptr2, &rest[..]), (ptr + 40, &bytes[40..]));
        // Appends go on in the fresh buffer.
        append(&mut out, &mut expected, b"tail");
        assert_eq!(out.pending(), expected.len() - 40);
        let (a, b) = UnixStream::pair().unwrap();
        assert_eq!(drain(out, a, b), expected[40..]);
    }

    #[test]
    fn truncated_file_is_an_error_not_a_hang() {
        let file = Arc::new(tempfile::tempfile().unwrap());
        let mut out = Output::default();
        out.push_body(Body::File(FileBody {
            file,
            offset: 0,
            len: 10,
        }));
        let (a, _b) = UnixStream::pair().unwrap();
        assert!(flush(&mut out, &mut EpollSock::from_std_unix(a).unwrap()).is_err());
    }
}
