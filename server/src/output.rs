use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::os::fd::AsRawFd;

use bytes::Bytes;

use crate::response::{Body, FileBody};

/// Bodies up to this size are copied next to their head, so head and body leave in one
/// write; above it they are queued by reference and gathered with `writev`.
const COPY_BODY_MAX: usize = 16 * 1024;
/// Largest `sendfile` per call: bounds how long one connection holds the worker.
const SENDFILE_CHUNK: usize = 1 << 20;
/// Bytes one flush may write before yielding to other connections.
pub const FLUSH_BUDGET: usize = 4 << 20;
const MAX_IOVECS: usize = 64;

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

pub enum Flush {
    /// Everything was written.
    Done,
    /// The socket is full; wait for writability.
    Blocked,
    /// The budget ran out with the socket still writable; come back next turn.
    Yielded,
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
        &mut self.buf
    }

    /// Accounts for bytes appended to `head_buf()` since the last call.
    pub fn commit(&mut self, before_len: usize) {
        self.pending += self.buf.len() - before_len;
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
        self.buf.extend_from_slice(bytes);
        self.pending += bytes.len();
    }

    fn push_shared(&mut self, bytes: Bytes) {
        self.close_run();
        self.pending += bytes.len();
        self.segments.push_back(Segment::Shared { bytes, pos: 0 });
    }

    fn close_run(&mut self) {
        if self.buf.len() > self.open_run {
            self.segments.push_back(Segment::Mem {
                end: self.buf.len(),
            });
            self.open_run = self.buf.len();
        }
    }

    /// Writes as much as the socket takes, up to the budget.
    pub fn flush<S: Write + AsRawFd>(&mut self, sock: &mut S) -> io::Result<Flush> {
        let mut written = 0usize;
        while self.pending > 0 {
            if written >= FLUSH_BUDGET {
                return Ok(Flush::Yielded);
            }
            let n = match self.segments.front() {
                Some(Segment::File { .. }) => self.send_file(sock)?,
                _ => self.write_memory(sock)?,
            };
            match n {
                Some(n) => written += n,
                None => return Ok(Flush::Blocked),
            }
        }
        self.reset();
        Ok(Flush::Done)
    }

    /// One `write`/`writev` of the memory segments before the first file. `None` = would block.
    fn write_memory<S: Write + AsRawFd>(&mut self, sock: &mut S) -> io::Result<Option<usize>> {
        let result = if self.segments.is_empty() {
            // The common case: only the contiguous buffer. One plain write.
            sock.write(&self.buf[self.buf_pos..])
        } else {
            let mut iov: [IoSlice<'_>; MAX_IOVECS] = [IoSlice::new(&[]); MAX_IOVECS];
            let mut n = 0;
            let mut pos = self.buf_pos;
            let mut reached_file = false;
            for seg in &self.segments {
                if n == MAX_IOVECS {
                    break;
                }
                match seg {
                    Segment::Mem { end } => {
                        iov[n] = IoSlice::new(&self.buf[pos..*end]);
                        pos = *end;
                    }
                    Segment::Shared { bytes, pos: p } => iov[n] = IoSlice::new(&bytes[*p..]),
                    Segment::File { .. } => {
                        reached_file = true;
                        break;
                    }
                }
                n += 1;
            }
            if !reached_file && n < MAX_IOVECS && self.buf.len() > pos {
                iov[n] = IoSlice::new(&self.buf[pos..]);
                n += 1;
            }
            if reached_file {
                // A file follows (a head before sendfile): MSG_MORE lets the kernel fill the
                // head's packet with the file's first bytes instead of sending the head alone.
                send_more(sock.as_raw_fd(), &iov[..n])
            } else {
                sock.write_vectored(&iov[..n])
            }
        };
        match result {
            Ok(0) => Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                self.advance(n);
                Ok(Some(n))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Some(0)),
            Err(e) => Err(e),
        }
    }

    fn send_file<S: AsRawFd>(&mut self, sock: &mut S) -> io::Result<Option<usize>> {
        let Some(Segment::File { body, sent }) = self.segments.front_mut() else {
            return Ok(Some(0));
        };
        let remaining = body.len - *sent;
        let count = remaining.min(SENDFILE_CHUNK as u64) as usize;
        let mut offset = (body.offset + *sent) as libc::off_t;
        // SAFETY: both descriptors are open for the duration of the call (the socket is
        // borrowed, the file is held by the Arc in this segment); `offset` is a valid,
        // exclusively borrowed off_t that the kernel updates; no memory is shared otherwise.
        let n =
            unsafe { libc::sendfile(sock.as_raw_fd(), body.file.as_raw_fd(), &mut offset, count) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                io::ErrorKind::Interrupted => Ok(Some(0)),
                _ => Err(e),
            };
        }
        if n == 0 {
            // The file shrank under us: the promised Content-Length can no longer be met.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file truncated while sending",
            ));
        }
        let n = n as usize;
        *sent += n as u64;
        self.pending -= n;
        if *sent == body.len {
            self.segments.pop_front();
        }
        Ok(Some(n))
    }

    fn advance(&mut self, mut n: usize) {
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
                Some(Segment::File { .. }) => unreachable!("writev never covers a file segment"),
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

/// `sendmsg` with `MSG_MORE`: queue these bytes, more follow at once.
fn send_more(fd: std::os::fd::RawFd, iov: &[IoSlice<'_>]) -> io::Result<usize> {
    // SAFETY: IoSlice is ABI-compatible with iovec on Unix (std guarantees it); the slices
    // outlive the call; the msghdr names no address and no control data; `fd` is the
    // caller's open socket.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = iov.len() as _;
        libc::sendmsg(fd, &msg, libc::MSG_MORE | libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    fn drain(mut out: Output, mut a: UnixStream, mut b: UnixStream) -> Vec<u8> {
        let reader = std::thread::spawn(move || {
            let mut got = Vec::new();
            b.read_to_end(&mut got).unwrap();
            got
        });
        a.set_nonblocking(false).unwrap();
        loop {
            match out.flush(&mut a).unwrap() {
                Flush::Done => break,
                Flush::Blocked | Flush::Yielded => continue,
            }
        }
        drop(a);
        reader.join().unwrap()
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
        let mut a = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
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
        while !matches!(out.flush(&mut a).unwrap(), Flush::Done) {}
        // The connection stays open: the reader must get everything without an EOF push.
        let got = reader.join().unwrap();
        assert_eq!(&got[..6], b"HEAD\r\n");
        assert!(got[6..] == content[..]);
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
        let (mut a, _b) = UnixStream::pair().unwrap();
        assert!(out.flush(&mut a).is_err());
    }
}
