//! The socket syscalls both kernel backends make directly: a gathered send, a file range,
//! a peek, a non-blocking connect and its outcome. (io_uring keeps these as syscalls: a peek
//! and a connect are rare, and a connect through the ring would slip past seccomp's socket
//! rules.)

use std::io;
use std::os::fd::{OwnedFd, RawFd};

use socket2::SockRef;

use super::{Peer, Waiting};

/// Largest `sendfile` per call: bounds how long one connection holds the worker.
const SENDFILE_CHUNK: u64 = 1 << 20;

/// Starts a non-blocking connection.
pub(super) fn connect(to: Peer<'_>) -> io::Result<OwnedFd> {
    // mio's connect makes the socket non-blocking (and close-on-exec) before connecting.
    Ok(match to {
        Peer::Tcp(addr) => {
            let s = mio::net::TcpStream::connect(addr)?;
            s.set_nodelay(true)?;
            std::net::TcpStream::from(s).into()
        }
        Peer::Unix(path) => {
            std::os::unix::net::UnixStream::from(mio::net::UnixStream::connect(path)?).into()
        }
    })
}

/// Established (`true`), still connecting (`false`), or its error.
pub(super) fn connected(fd: &OwnedFd) -> io::Result<bool> {
    let s = SockRef::from(fd);
    if let Some(e) = s.take_error()? {
        return Err(e);
    }
    match s.peer_addr().map(|_| ()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
        Err(e) => Err(e),
    }
}

/// Reads into `buf` (a non-blocking socket, or `MSG_DONTWAIT`: never waits).
pub(super) fn recv(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // `recv`, not `read`: a socket read through the VFS also pays the file-access hooks
    // (fsnotify, the LSMs' permission check) on every call; measured on proxy-small-50
    // (four socket calls per request), `read` cost about 1 µs per request more.
    // SAFETY: `buf` is a live, exclusively borrowed slice valid for its length during the
    // call; the fd is the caller's open socket.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// What waits in the socket, without taking it.
pub(super) fn peek(fd: RawFd) -> Waiting {
    let mut byte = 0u8;
    loop {
        // SAFETY: `recv` into one live, exclusively borrowed byte, on a socket open for
        // the call; MSG_PEEK leaves the byte queued and MSG_DONTWAIT keeps it from
        // blocking.
        let n = unsafe {
            libc::recv(
                fd,
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        return match n {
            0 => Waiting::Closed,
            1.. => Waiting::Bytes,
            _ => match io::Error::last_os_error().kind() {
                io::ErrorKind::WouldBlock => Waiting::Nothing,
                io::ErrorKind::Interrupted => continue,
                // Reset or failed: as good as closed.
                _ => Waiting::Closed,
            },
        };
    }
}

pub(super) fn write_memory(fd: RawFd, iov: &[io::IoSlice<'_>], more: bool) -> io::Result<usize> {
    // A file follows (a head before sendfile): MSG_MORE lets the kernel fill the head's packet
    // with the file's first bytes instead of sending the head alone.
    let flags = libc::MSG_NOSIGNAL | if more { libc::MSG_MORE } else { 0 };
    let n = if iov.len() == 1 {
        // The common case: one contiguous buffer.
        // SAFETY: the slice is valid for its length for the duration of the call; `fd` is
        // the caller's open socket.
        unsafe { libc::send(fd, iov[0].as_ptr().cast(), iov[0].len(), flags) }
    } else {
        // SAFETY: IoSlice is ABI-compatible with iovec on Unix (std guarantees it); the slices
        // outlive the call; the msghdr names no address and no control data.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = iov.len() as _;
            libc::sendmsg(fd, &msg, flags)
        }
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

pub(super) fn send_file(fd: RawFd, file: RawFd, offset: u64, len: u64) -> io::Result<usize> {
    let count = len.min(SENDFILE_CHUNK) as usize;
    let mut off = offset as libc::off_t;
    // SAFETY: both descriptors are open for the duration of the call (the socket is the
    // caller's, the file is held by the output segment); `off` is a valid, exclusively
    // borrowed off_t that the kernel updates; no memory is shared otherwise.
    let n = unsafe { libc::sendfile(fd, file, &mut off, count) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n == 0 {
        // The file shrank under us: the promised Content-Length can no longer be met.
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file truncated while sending",
        ));
    }
    Ok(n as usize)
}
