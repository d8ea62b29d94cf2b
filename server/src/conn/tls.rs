//! The TLS transport: ciphertext from the driver goes into the session, plaintext comes out
//! into the protocol's read buffer; the protocol's output (memory and file ranges) is
//! encrypted in bounded batches into a pooled buffer of records the driver sends. Idle, it
//! holds no buffer of tern's, only the session.
//!
//! A pipelined batch of answers is handed to rustls in one vectored write, so its records are
//! as few and as full as possible and leave in one `write`. Files cannot use `sendfile`
//! (without kernel TLS): they are read with `pread` in batch-sized pieces into the worker's
//! scratch buffer and encrypted from there, never read whole.

use std::io::IoSlice;
use std::os::unix::fs::FileExt;

use tern_runtime::BufPool;
use tern_tls::{Plaintext, TlsFailure, TlsSession};

use super::output::{Output, MAX_IOVECS};
use super::records::Records;
use super::types::Transmit;
use crate::exchange::ConnCx;

/// Plaintext encrypted per batch: the records of one batch stay under the pool's largest
/// kept buffer (64 KiB) and leave in one write.
const BATCH: usize = 60 * 1024;

pub(super) struct Tls {
    session: TlsSession,
    /// Ciphertext read, and records to send.
    records: Records,
    /// The first byte arrived (the plain-HTTP check is done).
    started: bool,
    /// The handshake completed (and was counted).
    established: bool,
    failed: bool,
    /// close_notify was asked for: it follows the last of the protocol's output.
    close_requested: bool,
    close_sent: bool,
}

/// What moving decrypted bytes to the protocol found.
pub(super) enum Moved {
    Bytes(usize),
    Nothing,
    PeerClosed,
}

impl Tls {
    pub fn new(session: TlsSession) -> Tls {
        Tls {
            session,
            records: Records::default(),
            started: false,
            established: false,
            failed: false,
            close_requested: false,
            close_sent: false,
        }
    }

    pub fn recv_buf(&mut self, pool: &mut BufPool) -> &mut [u8] {
        self.records
            .inbuf
            .get_or_insert_with(|| pool.take_read())
            .spare_mut()
    }

    pub fn filled(&mut self, n: usize) {
        self.records.filled(n);
    }

    /// On the first bytes only: does the client speak plain HTTP (a request line starts
    /// with an upper-case method; a TLS record starts with a content type byte, 0x14-0x18)?
    pub fn looks_like_plain_http(&mut self) -> bool {
        if self.started {
            return false;
        }
        let Some(first) = self
            .records
            .inbuf
            .as_ref()
            .and_then(|b| b.data().first().copied())
        else {
            return false;
        };
        self.started = true;
        first.is_ascii_uppercase()
    }

    pub fn started(&self) -> bool {
        self.started
    }

    /// Feeds the ciphertext read so far to the session (as much as it takes).
    pub fn decrypt(&mut self) -> Result<(), TlsFailure> {
        let Some(inbuf) = self.records.inbuf.as_mut() else {
            return Ok(());
        };
        if self.failed {
            inbuf.consume(inbuf.len());
            return Ok(());
        }
        if inbuf.is_empty() {
            return Ok(());
        }
        match self.session.feed(inbuf.data()) {
            Ok(n) => {
                inbuf.consume(n);
                Ok(())
            }
            Err(failure) => {
                self.failed = true;
                inbuf.consume(inbuf.len());
                Err(failure)
            }
        }
    }

    /// True once, when the handshake has just completed.
    pub fn just_established(&mut self) -> bool {
        if self.established || self.failed || self.session.is_handshaking() {
            return false;
        }
        self.established = true;
        true
    }

    /// The client chose HTTP/2 by ALPN.
    pub fn chose_h2(&self) -> bool {
        self.session.alpn() == Some(b"h2")
    }

    /// The client is an ACME CA validating by TLS-ALPN-01.
    pub fn chose_acme_tls(&self) -> bool {
        self.session.alpn() == Some(tern_tls::ACME_TLS_ALPN)
    }

    pub fn is_handshaking(&self) -> bool {
        !self.established
    }

    /// Moves decrypted bytes into the protocol's buffer (asked for only when needed).
    pub fn read_plaintext<'b>(&mut self, buf: impl FnOnce() -> &'b mut [u8]) -> Moved {
        if !self.established {
            return Moved::Nothing;
        }
        match self.session.read_plaintext(buf()) {
            Plaintext::Data(n) => Moved::Bytes(n),
            Plaintext::Empty => Moved::Nothing,
            Plaintext::Closed => Moved::PeerClosed,
        }
    }

    /// Encrypts the next batch of the protocol's output, once the previous batch is sent.
    /// Fails if a file being sent shrank.
    pub fn fill(&mut self, out: &mut Output, cx: &mut ConnCx<'_>) -> Result<(), ()> {
        if self.records.sending() {
            return Ok(());
        }
        let plaintext = self.established && !self.failed && !out.is_empty();
        let close_due = self.close_requested && !self.close_sent;
        if !plaintext && !close_due && !self.session.wants_write() {
            return Ok(());
        }
        let Some(outbuf) = self.records.next_batch(cx.buffers) else {
            return Ok(());
        };
        while plaintext && outbuf.len() < BATCH && !out.is_empty() {
            let room = BATCH - outbuf.len();
            let taken = if let Some((file, offset, len)) = out.front_file() {
                let want = room.min(len as usize);
                if cx.scratch.len() < want {
                    cx.scratch.resize(BATCH, 0);
                }
                let got = match file.read_at(&mut cx.scratch[..want], offset) {
                    Ok(0) | Err(_) => return Err(()), // shrank: Content-Length can't be met
                    Ok(got) => got,
                };
                self.session
                    .write_plaintext(&[IoSlice::new(&cx.scratch[..got])])
            } else {
                let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
                let (count, _) = out.memory_slices(&mut iov, room);
                self.session.write_plaintext(&iov[..count])
            };
            out.advance(taken);
            self.session.encode(outbuf);
            if taken == 0 {
                break; // rustls takes nothing even with its buffer flushed: try again later
            }
        }
        // close_notify goes after everything the protocol queued (a 408 before closing).
        if close_due && out.is_empty() {
            self.close_sent = true;
            self.session.close();
        }
        // Handshake messages, alerts, close_notify.
        self.session.encode(outbuf);
        Ok(())
    }

    pub fn transmit<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> Transmit {
        self.records.transmit(iov)
    }

    pub fn sent(&mut self, n: usize) {
        self.records.sent(n);
    }

    /// Records are queued or waiting in the session (or close_notify is due).
    pub fn wants_write(&self) -> bool {
        self.records.sending()
            || self.session.wants_write()
            || (self.close_requested && !self.close_sent)
    }

    /// Asks for close_notify once, on an established session; it is encrypted after the
    /// output still queued. True if it was asked for now.
    pub fn close_notify(&mut self) -> bool {
        if self.close_requested || self.failed || !self.established {
            return false;
        }
        self.close_requested = true;
        true
    }

    pub fn is_idle(&self) -> bool {
        self.established && self.records.read_all_taken() && !self.wants_write()
    }

    pub fn release_idle_buffers(&mut self, pool: &mut BufPool) {
        self.records.release_idle(pool);
    }

    pub fn recycle(&mut self, pool: &mut BufPool) {
        self.records.recycle(pool);
    }
}
