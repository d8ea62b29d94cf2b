//! The TLS transport: ciphertext read into a pooled buffer is opened there, one record at a
//! time as the protocol asks, and its plaintext copied once into the protocol's read buffer.
//! The protocol's output (memory and file ranges) is sealed into records built in place in a
//! pooled block: memory is copied into the record once, a file's bytes are read straight
//! into it (`pread`; `sendfile` needs kernel TLS), and the record is encrypted where it
//! lies. A batch of records is one block, sent whole before the next is made, so what a send
//! was given never moves. Idle, it holds no buffer, only the session's keys.

use std::io::IoSlice;
use std::ops::Range;
use std::os::unix::fs::FileExt;

use tern_runtime::{BufPool, ReadBuf, BLOCK_SIZE};
use tern_tls::{Received, TlsFailure, TlsSession, MAX_HANDSHAKE_INPUT, MAX_PLAINTEXT, MAX_RECORD};

use super::output::{Output, MAX_IOVECS};
use super::types::Transmit;
use crate::exchange::ConnCx;

/// A record shorter than this is not started at a block's end when more output waits: it
/// goes first in the next block, so records stay full.
const MIN_RECORD: usize = 4096;

pub(super) struct Tls {
    session: TlsSession,
    /// Ciphertext read and not yet consumed; a record being read by the protocol is opened
    /// in place at its front.
    inbuf: Option<ReadBuf>,
    /// Decrypted data at the front of `inbuf` the protocol has not taken yet, and how much
    /// of `inbuf` to consume once it has.
    plain: Option<(Range<usize>, usize)>,
    /// How many bytes from `inbuf`'s front the session needs to go on (a whole record).
    want: Option<usize>,
    /// Records to send: a pooled block, sent whole before the next batch is made.
    outbuf: Option<ReadBuf>,
    /// The peer took the last batch in one send: while it keeps doing so and more than a
    /// block waits, batches are big blocks. A slow reader holds a small one at most.
    fast_peer: bool,
    /// Sends of the batch under way.
    sends: u8,
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
    Failed(TlsFailure),
}

impl Tls {
    pub fn new(session: TlsSession) -> Tls {
        Tls {
            session,
            inbuf: None,
            plain: None,
            want: None,
            outbuf: None,
            fast_peer: false,
            sends: 0,
            started: false,
            established: false,
            failed: false,
            close_requested: false,
            close_sent: false,
        }
    }

    /// Where ciphertext is read into. A record (or the records of a handshake message) longer
    /// than the pooled buffer grows it to fit; the session never asks for more than the
    /// protocol's limits. It grows at least twofold, so a message in many small records is
    /// not copied once a record.
    pub fn recv_buf(&mut self, pool: &mut BufPool) -> &mut [u8] {
        let inbuf = self.inbuf.get_or_insert_with(|| pool.take_read());
        if inbuf.spare_mut().is_empty() {
            if let Some(want) = self.want.filter(|&want| want > inbuf.len()) {
                let limit = MAX_HANDSHAKE_INPUT.max(MAX_RECORD).max(want);
                inbuf.grow_to((2 * inbuf.capacity()).clamp(want, limit));
            }
        }
        inbuf.spare_mut()
    }

    pub fn filled(&mut self, n: usize) {
        if let Some(inbuf) = self.inbuf.as_mut() {
            inbuf.filled(n);
        }
    }

    /// On the first bytes only: does the client speak plain HTTP (a request line starts
    /// with an upper-case method; a TLS record starts with a content type byte, 0x14-0x18)?
    pub fn looks_like_plain_http(&mut self) -> bool {
        if self.started {
            return false;
        }
        let Some(first) = self.inbuf.as_ref().and_then(|b| b.data().first().copied()) else {
            return false;
        };
        self.started = true;
        first.is_ascii_uppercase()
    }

    pub fn started(&self) -> bool {
        self.started
    }

    /// Runs the handshake on the ciphertext read so far (records after it are opened by
    /// [`Self::read_plaintext`]).
    pub fn decrypt(&mut self) -> Result<(), TlsFailure> {
        let Some(inbuf) = self.inbuf.as_mut() else {
            return Ok(());
        };
        if self.failed {
            inbuf.consume(inbuf.len());
            return Ok(());
        }
        if !self.session.is_handshaking() || inbuf.is_empty() {
            return Ok(());
        }
        match self.session.receive(inbuf.data_mut()) {
            Ok(Received::More { taken, want }) => {
                inbuf.consume(taken);
                self.want = want;
                Ok(())
            }
            // The client closed during the handshake: the connection's end comes with EOF.
            Ok(Received::Closed { taken }) | Ok(Received::Data { taken, .. }) => {
                inbuf.consume(taken);
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

    /// Moves decrypted bytes into the protocol's buffer (asked for only when there are
    /// some), opening the next record when the last is all taken.
    pub fn read_plaintext<'b>(&mut self, buf: impl FnOnce() -> &'b mut [u8]) -> Moved {
        if !self.established || self.failed {
            return Moved::Nothing;
        }
        let Some(inbuf) = self.inbuf.as_mut() else {
            return Moved::Nothing;
        };
        if self.plain.is_none() {
            match self.session.receive(inbuf.data_mut()) {
                Ok(Received::More { taken, want }) => {
                    inbuf.consume(taken);
                    self.want = want;
                    return Moved::Nothing;
                }
                Ok(Received::Data { data, taken }) => self.plain = Some((data, taken)),
                Ok(Received::Closed { taken }) => {
                    inbuf.consume(taken);
                    return Moved::PeerClosed;
                }
                Err(failure) => {
                    self.failed = true;
                    inbuf.consume(inbuf.len());
                    return Moved::Failed(failure);
                }
            }
        }
        let Some((data, taken)) = self.plain.as_mut() else {
            return Moved::Nothing;
        };
        let into = buf();
        let n = into.len().min(data.len());
        into[..n].copy_from_slice(&inbuf.data()[data.start..data.start + n]);
        data.start += n;
        if data.start == data.end {
            inbuf.consume(*taken);
            self.plain = None;
        }
        if n == 0 {
            Moved::Nothing
        } else {
            Moved::Bytes(n)
        }
    }

    /// Seals the next batch of the protocol's output into records, once the previous batch
    /// is sent. Fails if a file being sent shrank, or output waits that the session can no
    /// longer seal (a TLS 1.2 key at its limit).
    pub fn fill(&mut self, out: &mut Output, cx: &mut ConnCx<'_>) -> Result<(), ()> {
        if self.outbuf.as_ref().is_some_and(|b| !b.is_empty()) {
            return Ok(());
        }
        let plaintext = self.established && !self.failed && !out.is_empty();
        let close_due = self.close_requested && !self.close_sent;
        if !plaintext && !close_due && !self.session.wants_write() {
            return Ok(());
        }
        let big = self.fast_peer && out.pending() > BLOCK_SIZE;
        if self
            .outbuf
            .as_ref()
            .is_some_and(|b| (b.capacity() > BLOCK_SIZE) != big)
        {
            cx.buffers.give_block(self.outbuf.take().expect("a block"));
        }
        let block = self
            .outbuf
            .get_or_insert_with(|| cx.buffers.take_block(big));
        self.sends = 0;
        let spare = block.spare_mut();
        // Handshake messages, alerts, key updates: before anything sealed after them.
        let mut made = self.session.take_control(spare);
        if plaintext && !self.session.wants_write() {
            let Some((front, back)) = self.session.record_frame() else {
                return Err(());
            };
            while !out.is_empty() {
                if out.front_file().is_some() {
                    // Whole records of file bytes: one read fills them all.
                    match seal_file_records(&mut self.session, out, spare, made, (front, back)) {
                        Ok(None) => {}
                        Ok(Some(end)) => {
                            made = end;
                            made += self.session.take_control(&mut spare[made..]);
                            if !may_seal_more(&self.session) {
                                break;
                            }
                            continue;
                        }
                        Err(()) => return Err(()),
                    }
                }
                let room = (spare.len() - made).saturating_sub(front + back);
                let body_len = room.min(MAX_PLAINTEXT);
                if body_len < MIN_RECORD.min(out.pending()) || body_len == 0 {
                    break;
                }
                let record = &mut spare[made..];
                let len = fill_body(out, &mut record[front..front + body_len])?;
                if len == 0 {
                    break;
                }
                made += self.session.seal(record, len);
                // A key update follows the record that used up the key.
                made += self.session.take_control(&mut spare[made..]);
                if !may_seal_more(&self.session) {
                    break;
                }
            }
        }
        // close_notify goes after everything the protocol queued (a 408 before closing).
        if close_due && out.is_empty() && !self.session.wants_write() {
            self.close_sent = true;
            self.session.close();
            made += self.session.take_control(&mut spare[made..]);
        }
        block.filled(made);
        Ok(())
    }

    pub fn transmit<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> Transmit {
        match &self.outbuf {
            Some(block) if !block.is_empty() => {
                iov[0] = IoSlice::new(block.data());
                Transmit::Memory {
                    count: 1,
                    more: false,
                }
            }
            _ => Transmit::Nothing,
        }
    }

    pub fn sent(&mut self, n: usize) {
        if let Some(block) = self.outbuf.as_mut() {
            block.consume(n);
            self.sends = self.sends.saturating_add(1);
            self.fast_peer = block.is_empty() && self.sends == 1;
        }
    }

    fn sending(&self) -> bool {
        self.outbuf.as_ref().is_some_and(|b| !b.is_empty())
    }

    /// Records are queued or waiting in the session (or close_notify is due).
    pub fn wants_write(&self) -> bool {
        self.sending() || self.session.wants_write() || (self.close_requested && !self.close_sent)
    }

    /// Asks for close_notify once, on an established session; it is sealed after the
    /// output still queued. True if it was asked for now.
    pub fn close_notify(&mut self) -> bool {
        if self.close_requested || self.failed || !self.established {
            return false;
        }
        self.close_requested = true;
        true
    }

    pub fn is_idle(&self) -> bool {
        self.established
            && self.plain.is_none()
            && self.inbuf.as_ref().is_none_or(|b| b.is_empty())
            && !self.wants_write()
    }

    /// Gives back the buffers that hold nothing.
    pub fn release_idle_buffers(&mut self, pool: &mut BufPool) {
        if self.plain.is_none() && self.inbuf.as_ref().is_some_and(|b| b.is_empty()) {
            if let Some(b) = self.inbuf.take() {
                pool.give_read(b);
            }
        }
        if !self.sending() {
            if let Some(b) = self.outbuf.take() {
                pool.give_block(b);
            }
        }
    }

    /// Gives back both buffers, whatever they hold (the connection is gone).
    pub fn recycle(&mut self, pool: &mut BufPool) {
        self.plain = None;
        if let Some(b) = self.inbuf.take() {
            pool.give_read(b);
        }
        if let Some(b) = self.outbuf.take() {
            pool.give_block(b);
        }
    }
}

/// After a record: more may follow in this batch unless control records wait to go first
/// (a key update that did not fit) or the session can no longer seal.
fn may_seal_more(session: &TlsSession) -> bool {
    !session.wants_write() && session.record_frame().is_some()
}

/// Records at most one batch reads from a file at once (a big block holds 16).
const FILE_RECORDS: usize = 16;

/// Seals records whose plaintext comes from the file at the front of the output, read into
/// their places with one `preadv` (rather than a `pread` each), from `made` on in `block`.
/// Returns where the records made end; `None` if it made none (fewer than two fit).
fn seal_file_records(
    session: &mut TlsSession,
    out: &mut Output,
    block: &mut [u8],
    made: usize,
    (front, back): (usize, usize),
) -> Result<Option<usize>, ()> {
    let Some((file, offset, len)) = out.front_file() else {
        return Ok(None);
    };
    // The records' places: full ones, and the file's last bytes.
    let mut plan = [(0usize, 0usize); FILE_RECORDS];
    let mut count = 0;
    let (mut at, mut left) = (made, len as usize);
    while count < FILE_RECORDS && left > 0 {
        let body = (block.len() - at)
            .saturating_sub(front + back)
            .min(MAX_PLAINTEXT);
        if body < MIN_RECORD.min(left) {
            break;
        }
        let body = body.min(left);
        plan[count] = (at, body);
        count += 1;
        at += front + body + back;
        left -= body;
    }
    if count < 2 {
        return Ok(None); // one record: the general path does as well
    }
    let got = {
        let mut iov: [std::io::IoSliceMut<'_>; FILE_RECORDS] =
            std::array::from_fn(|_| std::io::IoSliceMut::new(&mut []));
        let mut rest = &mut block[made..];
        let mut base = made;
        for (slot, &(start, body)) in iov.iter_mut().zip(&plan[..count]) {
            let (_, tail) = rest.split_at_mut(start + front - base);
            let (body_bytes, tail) = tail.split_at_mut(body);
            *slot = std::io::IoSliceMut::new(body_bytes);
            rest = tail;
            base = start + front + body;
        }
        read_vectored_at(file, &mut iov[..count], offset)
    };
    let got = match got {
        Ok(0) | Err(_) => return Err(()), // shrank: Content-Length can't be met
        Ok(got) => got,
    };
    // Sealed in order; a key update due after one of them stops the rest (their bytes
    // are read again for the next batch: only what is sealed counts as sent).
    let (mut made, mut left, mut sealed) = (made, got, 0);
    for &(start, body) in &plan[..count] {
        if left == 0 || !may_seal_more(session) {
            break;
        }
        debug_assert_eq!(start, made, "records before this one were full");
        let n = body.min(left);
        made += session.seal(&mut block[start..], n);
        left -= n;
        sealed += n;
    }
    out.advance(sealed);
    Ok((sealed > 0).then_some(made))
}

/// `preadv`: std's `read_vectored_at` is not stable yet.
fn read_vectored_at(
    file: &std::fs::File,
    bufs: &mut [std::io::IoSliceMut<'_>],
    offset: u64,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: `IoSliceMut` is ABI-compatible with `iovec` on Unix; each points to memory
    // borrowed mutably for this call, and the count is the slice's length.
    let n = unsafe {
        libc::preadv(
            file.as_raw_fd(),
            bufs.as_mut_ptr().cast::<libc::iovec>(),
            bufs.len() as libc::c_int,
            offset as libc::off_t,
        )
    };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Fills a record's plaintext from the front of the output: memory copied, files read
/// straight in. Returns how many bytes; fails if a file shrank (its Content-Length can no
/// longer be met).
fn fill_body(out: &mut Output, body: &mut [u8]) -> Result<usize, ()> {
    let mut n = 0;
    while n < body.len() && !out.is_empty() {
        let taken = if let Some((file, offset, len)) = out.front_file() {
            let want = (body.len() - n).min(len as usize);
            match file.read_at(&mut body[n..n + want], offset) {
                Ok(0) | Err(_) => return Err(()),
                Ok(got) => got,
            }
        } else {
            let mut iov = [IoSlice::new(&[]); MAX_IOVECS];
            let (count, _) = out.memory_slices(&mut iov, body.len() - n);
            let mut copied = 0;
            for slice in &iov[..count] {
                body[n + copied..n + copied + slice.len()].copy_from_slice(slice);
                copied += slice.len();
            }
            copied
        };
        if taken == 0 {
            break;
        }
        out.advance(taken);
        n += taken;
    }
    Ok(n)
}
