//! The words a connection's parts and its driver share: what to send ([`Transmit`]), what to
//! do next ([`Action`]), what the worker should do with the connection ([`Status`]), which
//! deadline runs ([`Timeout`]), and who the connection is ([`Link`], defined with the
//! exchanges that need it). No logic; the protocols import these from here, not from `conn/mod.rs`, so that no
//! file of `conn/` imports the file that declares it.

use std::os::fd::RawFd;

pub(crate) use crate::exchange::Link;

/// What a connection asks of its worker after an event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Open,
    /// Sending was cut short by the fairness budget; drive again next turn.
    Yielded,
    Close,
}

/// Which timeout a deadline stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timeout {
    Header,
    Body,
    Idle,
    Write,
    Linger,
    /// The relay's timeout toward its upstream (connect, first byte, idle).
    Upstream,
    /// HTTP/2: answers are owed to the client and no DATA has gone out since the stall began
    /// (frames the client reads meanwhile, PING ACKs and the like, do not count; see
    /// `Http2::next_deadline`). Unlike `Write`, acknowledged bytes give no extension.
    Stall,
    /// Not a timeout: an idle connection gives back memory it kept for the next request
    /// (`Conn::trim_if_due`), and stays open.
    Trim,
}

/// What to send next.
#[must_use]
pub(crate) enum Transmit {
    Nothing,
    /// The first `count` slices given to `poll_transmit`; `more`: a file follows at once.
    Memory {
        count: usize,
        more: bool,
    },
    /// `len` bytes of `file` from `offset` (sendfile).
    File {
        file: RawFd,
        offset: u64,
        len: u64,
    },
    /// The output cannot be produced (a file shrank under us): close.
    Failed,
}

/// What the driver should do once everything is sent.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Read into `recv_buf` (if the socket may have bytes).
    Read,
    /// Nothing to do until readiness or a reply.
    Wait,
    /// New output was queued (e.g. close_notify): transmit again.
    Transmit,
    /// Half-close the socket, then call `handle_write_shutdown` and keep reading.
    ShutdownWrite,
    Close,
}
