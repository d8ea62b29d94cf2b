//! The bytes a relay has for its upstream server (the request's head and body, a tunnel's
//! client bytes), in one buffer the driver sends from. While a retry is possible the whole
//! request stays in it, so it can be sent again from the start.
//!
//! Completion-safe, as the client's `Output` is: once a backend whose sends complete later
//! (io_uring) has the unsent bytes in hand, [`UpQueue::seal`] keeps the buffer where it is
//! until the send completes ([`UpQueue::advance`]); bytes taken from the client meanwhile wait
//! in a second buffer and join the first after. A readiness backend never seals and pays
//! nothing for it.

#[derive(Default)]
pub(super) struct UpQueue {
    buf: Vec<u8>,
    /// Bytes of `buf` sent.
    sent: usize,
    /// Bytes queued while `buf` is sealed.
    later: Vec<u8>,
    /// Where `buf`'s bytes were when sealed (debug builds check that they did not move).
    sealed_at: Option<usize>,
}

impl UpQueue {
    pub fn new(buf: Vec<u8>) -> UpQueue {
        UpQueue {
            buf,
            ..UpQueue::default()
        }
    }

    /// Where new bytes go: the buffer, or beside it while a send of it is in flight.
    pub fn tail(&mut self) -> &mut Vec<u8> {
        if self.sealed_at.is_some() {
            &mut self.later
        } else {
            &mut self.buf
        }
    }

    /// The bytes not yet sent (the driver's next send; what is queued during a seal
    /// follows once it completes).
    pub fn unsent(&self) -> &[u8] {
        &self.buf[self.sent..]
    }

    /// Bytes queued and not yet sent.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.sent + self.later.len()
    }

    /// What [`UpQueue::unsent`] gave was handed to a backend that completes the send later:
    /// nothing of it may move until [`UpQueue::advance`].
    pub fn seal(&mut self) {
        if self.sent < self.buf.len() {
            self.sealed_at = Some(self.buf.as_ptr() as usize);
        }
    }

    /// `n` bytes were sent (a seal ends: the send completed).
    pub fn advance(&mut self, n: usize) {
        self.end_seal();
        self.sent += n;
    }

    /// Everything queued was sent.
    pub fn all_sent(&self) -> bool {
        self.pending() == 0
    }

    /// Forgets the sent bytes (no retry can need them any more).
    pub fn clear(&mut self) {
        self.end_seal();
        self.buf.clear();
        self.sent = 0;
    }

    /// The request goes again from its start (a retry on another connection: whatever the
    /// old one had in flight is that connection's to finish).
    pub fn rewind(&mut self) {
        self.end_seal();
        self.sent = 0;
    }

    fn end_seal(&mut self) {
        if let Some(at) = self.sealed_at.take() {
            debug_assert_eq!(
                at,
                self.buf.as_ptr() as usize,
                "bytes handed to the kernel moved before the send completed"
            );
        }
        if !self.later.is_empty() {
            self.buf.extend_from_slice(&self.later);
            self.later.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_bytes_stay_put_and_what_comes_meanwhile_follows_them() {
        let mut q = UpQueue::new(b"GET / HTTP/1.1\r\n\r\n".to_vec());
        q.buf.shrink_to_fit(); // any append to `buf` itself would now reallocate it
        let handed = q.unsent().as_ptr();
        q.seal();
        // The client's bytes arrive while the kernel holds the first ones: 64 KiB would
        // reallocate the buffer were they appended to it.
        q.tail().extend_from_slice(&[b'x'; 64 * 1024]);
        assert_eq!(q.unsent().as_ptr(), handed, "the sealed bytes moved");
        assert_eq!(q.unsent().len(), 18, "only what was handed out is offered");
        assert_eq!(q.pending(), 18 + 64 * 1024);
        // The send completes (in part): the rest follows, then the new bytes.
        q.advance(10);
        assert_eq!(&q.unsent()[..8], b"/1.1\r\n\r\n");
        assert_eq!(q.unsent()[8], b'x');
        assert_eq!(q.unsent().len(), 8 + 64 * 1024);
        q.advance(8 + 64 * 1024);
        assert!(q.all_sent());
        // A retry sends everything again from the start.
        q.rewind();
        assert_eq!(q.unsent().len(), 18 + 64 * 1024);
    }

    #[test]
    fn without_a_seal_bytes_go_straight_into_the_buffer() {
        let mut q = UpQueue::new(b"abc".to_vec());
        q.tail().extend_from_slice(b"def");
        assert_eq!(q.unsent(), b"abcdef");
        q.advance(6);
        q.clear();
        assert!(q.all_sent());
        // Nothing unsent: a seal has nothing to keep.
        q.seal();
        q.tail().extend_from_slice(b"g");
        assert_eq!(q.unsent(), b"g");
    }
}
