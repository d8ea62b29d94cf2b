//! The ciphertext side of a TLS session to an upstream: records read and not yet
//! taken by the session, and records made and not yet sent, each in a pooled buffer given
//! back when it holds nothing (an idle session keeps no buffer here). Records are made one
//! batch at a time, only once the previous batch is all sent, so what a send was given never
//! moves (nothing to seal for a completion backend).

use std::io::IoSlice;

use tern_runtime::{BufPool, ReadBuf};

use super::types::Transmit;

#[derive(Default)]
pub(super) struct Records {
    /// Ciphertext read but not yet taken by the session.
    pub inbuf: Option<ReadBuf>,
    /// Records to send, and how much of them is sent.
    out: Vec<u8>,
    out_pos: usize,
}

impl Records {
    /// Records made are still being sent.
    pub fn sending(&self) -> bool {
        self.out_pos < self.out.len()
    }

    /// The buffer the next batch of records goes into, once the last one is all sent
    /// (`None` while it is not).
    pub fn next_batch(&mut self, pool: &mut BufPool) -> Option<&mut Vec<u8>> {
        if self.sending() {
            return None;
        }
        self.out.clear();
        self.out_pos = 0;
        if self.out.capacity() == 0 {
            self.out = pool.take_write();
        }
        Some(&mut self.out)
    }

    pub fn transmit<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> Transmit {
        if !self.sending() {
            return Transmit::Nothing;
        }
        iov[0] = IoSlice::new(&self.out[self.out_pos..]);
        Transmit::Memory {
            count: 1,
            more: false,
        }
    }

    pub fn sent(&mut self, n: usize) {
        self.out_pos += n;
        if !self.sending() {
            self.out.clear();
            self.out_pos = 0;
        }
    }

    /// `n` bytes were read into the ciphertext buffer's spare room.
    pub fn filled(&mut self, n: usize) {
        if let Some(inbuf) = self.inbuf.as_mut() {
            inbuf.filled(n);
        }
    }

    /// Nothing read waits for the session.
    pub fn read_all_taken(&self) -> bool {
        self.inbuf.as_ref().is_none_or(|b| b.is_empty())
    }

    /// Gives back the buffers that hold nothing.
    pub fn release_idle(&mut self, pool: &mut BufPool) {
        if self.inbuf.as_ref().is_some_and(|b| b.is_empty()) {
            if let Some(b) = self.inbuf.take() {
                pool.give_read(b);
            }
        }
        if !self.sending() && self.out.capacity() > 0 {
            pool.give_write(std::mem::take(&mut self.out));
            self.out_pos = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_made_only_once_the_last_is_sent_and_idle_records_hold_no_buffer() {
        let mut pool = BufPool::new(4096, 16 * 1024, 4);
        let mut r = Records::default();
        r.next_batch(&mut pool)
            .unwrap()
            .extend_from_slice(b"record one");
        let handed = offered(&r).expect("records to send").0;
        r.sent(3);
        assert!(
            r.next_batch(&mut pool).is_none(),
            "the batch in flight stays put"
        );
        let (at, rest) = offered(&r).expect("the rest to send");
        assert_eq!((at - handed, rest.as_slice()), (3, b"ord one".as_slice()));
        r.sent(7);
        assert!(offered(&r).is_none());
        r.release_idle(&mut pool);
        assert!(
            r.inbuf.is_none() && r.out.capacity() == 0,
            "idle: no buffer kept"
        );
    }

    /// The address and bytes `transmit` offers, if any.
    fn offered(r: &Records) -> Option<(usize, Vec<u8>)> {
        let mut iov = [IoSlice::new(&[])];
        match r.transmit(&mut iov) {
            Transmit::Memory { count: 1, .. } => Some((iov[0].as_ptr() as usize, iov[0].to_vec())),
            _ => None,
        }
    }
}
