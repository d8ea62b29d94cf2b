//! How a connection goes on once its output is sent ([`Next`]) and how it ends ([`CloseKind`]),
//! whatever the protocol; and the lingering close both protocols use after an error answer:
//! half-close, then read and discard for a moment, so that closing with unread input does not
//! reset the connection before the client has read the answer (RFC 9112 §9.6; nginx's
//! lingering_close).

/// What the connection should do once the output is sent.
pub(crate) enum Next {
    /// Read more input.
    Read,
    /// Nothing until a pending reply arrives.
    Wait,
    /// No more requests: close (the protocol's `close_kind` says how).
    Close,
}

/// How to close.
pub(crate) enum CloseKind {
    /// At once.
    Now,
    /// Half-close, then read and discard for a moment (see [`Linger`]).
    Linger,
}

/// How long to keep reading after the half-close.
const LINGER_MS: u64 = 2_000;
/// How much to discard before giving up on a peer that keeps sending.
const LINGER_MAX_BYTES: usize = 256 * 1024;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Linger {
    pub until_ms: u64,
    discarded: usize,
}

impl Linger {
    pub fn start(now_ms: u64) -> Linger {
        Linger {
            until_ms: now_ms + LINGER_MS,
            discarded: 0,
        }
    }

    /// `n` more bytes were read and dropped. False once the peer has sent too much: close now.
    pub fn discard(&mut self, n: usize) -> bool {
        self.discarded += n;
        self.discarded <= LINGER_MAX_BYTES
    }
}

/// Close at once unless an answer may still be unread while input is pending (or the
/// protocol asks for a linger); never linger after an abort or the peer's EOF.
pub(crate) fn close_kind(abort: bool, peer_eof: bool, linger_wanted: bool) -> CloseKind {
    if abort || peer_eof || !linger_wanted {
        CloseKind::Now
    } else {
        CloseKind::Linger
    }
}
