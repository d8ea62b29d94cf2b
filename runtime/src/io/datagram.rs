//! What the kernel backends share for UDP sockets: quinn-udp's state of one socket (which
//! offloads and control messages it has) and its calls, `recvmmsg` with the GRO, ECN and
//! packet-info control messages and `sendmsg` with GSO, made at once on a non-blocking socket.
//! Both epoll and io_uring make these calls as syscalls (the ring only waits for readiness).

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::AsFd;

use quinn_udp::{RecvMeta, Transmit, UdpSockRef, UdpSocketState};

/// One UDP socket's quinn-udp state and bound address (its descriptor stays with the
/// backend's own socket type, which decides how it is watched and closed).
#[derive(Debug)]
pub(super) struct KernelDatagram {
    state: UdpSocketState,
    local: SocketAddr,
}

impl KernelDatagram {
    /// Turns on what the kernel offers (GRO, packet info, ECN, no fragmentation) and makes
    /// the socket non-blocking. Only setsockopt, getsockopt, getsockname, fcntl and uname:
    /// calls the sandbox allows, so this may run after lockdown, on the worker's thread.
    pub(super) fn new(sock: &std::net::UdpSocket) -> io::Result<KernelDatagram> {
        let state = UdpSocketState::new(UdpSockRef::from(sock))?;
        Ok(KernelDatagram {
            state,
            local: sock.local_addr()?,
        })
    }

    pub(super) fn recv(
        &self,
        fd: &impl AsFd,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> io::Result<usize> {
        // quinn-udp fills one `meta` per buffer and indexes them without a check.
        let n = bufs.len().min(meta.len());
        self.state.recv(UdpSockRef::from(fd), &mut bufs[..n], meta)
    }

    pub(super) fn send(&self, fd: &impl AsFd, transmit: &Transmit<'_>) -> io::Result<bool> {
        match self.state.try_send(UdpSockRef::from(fd), transmit) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            // Larger than the path allows (an MTU probe): lost, as it would have been on the
            // way, and the prober learns that from the missing acknowledgement (quinn counts
            // it sent too).
            Err(e) if quinn_udp::is_msg_size_err(&e) => Ok(true),
            Err(e) => Err(e),
        }
    }

    pub(super) fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub(super) fn max_gso_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    pub(super) fn gro_segments(&self) -> usize {
        self.state.gro_segments()
    }
}
