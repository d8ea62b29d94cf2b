//! What the one socket loop (`driver::pump`) asks of the byte stream it moves bytes for: a
//! client's connection ([`Conn`]), or the upstream half of one of its relays
//! (`upstream::UpstreamView`). The stream does no I/O: it says what to send and where to read
//! into, and is told what happened, like quinn-proto under quinn. Defined here, below the
//! driver, so that the driver imports connections and never the other way.

use std::io::IoSlice;

use super::types::{Action, Transmit};
use super::Conn;
use crate::exchange::ConnCx;
use crate::stats::Counter;

pub(crate) trait Stream {
    /// `poll_transmit` never fills more than one slice (TLS records, a relay's request
    /// bytes): the loop hands it one.
    const ONE_SLICE: bool = false;

    /// Describes the next bytes to send, filling `iov` for memory. What it names must not
    /// move until `handle_sent` reports it sent (a completion backend may still hold it).
    fn poll_transmit<'a>(&'a mut self, cx: &mut ConnCx<'_>, iov: &mut [IoSlice<'a>]) -> Transmit;
    /// `n` bytes of what `poll_transmit` described were sent.
    fn handle_sent(&mut self, n: usize, cx: &mut ConnCx<'_>);
    /// What `poll_transmit` described last was handed to a backend whose send completes
    /// later (`Io::SENDS_COMPLETE_LATER`): it stays where it is, whatever is queued
    /// meanwhile, until `handle_sent`.
    fn seal(&mut self);
    /// What next, once everything is sent.
    fn poll_action(&mut self, cx: &mut ConnCx<'_>) -> Action;
    /// Where to read into. Empty: take no input now (backpressure).
    fn recv_buf(&mut self, cx: &mut ConnCx<'_>) -> &mut [u8];
    /// `n` bytes were read into `recv_buf`.
    fn handle_recv(&mut self, n: usize, cx: &mut ConnCx<'_>);
    /// The peer ended its side of the stream.
    fn handle_eof(&mut self, cx: &mut ConnCx<'_>);
    /// The write side was shut down, as `poll_action` asked.
    fn handle_write_shutdown(&mut self, cx: &mut ConnCx<'_>);
    /// Sending or reading failed (or the output could not be made): the stream is over.
    fn handle_error(&mut self, cx: &mut ConnCx<'_>);
    /// Between exchanges with nothing buffered: a worker shutting down may close it once its
    /// socket is drained.
    fn is_idle(&self) -> bool;
}

impl Stream for Conn {
    fn poll_transmit<'a>(&'a mut self, cx: &mut ConnCx<'_>, iov: &mut [IoSlice<'a>]) -> Transmit {
        Conn::poll_transmit(self, cx, iov)
    }

    fn handle_sent(&mut self, n: usize, _cx: &mut ConnCx<'_>) {
        Conn::handle_sent(self, n)
    }

    fn seal(&mut self) {
        Conn::seal(self)
    }

    fn poll_action(&mut self, cx: &mut ConnCx<'_>) -> Action {
        Conn::poll_action(self, cx)
    }

    fn recv_buf(&mut self, cx: &mut ConnCx<'_>) -> &mut [u8] {
        Conn::recv_buf(self, cx)
    }

    fn handle_recv(&mut self, n: usize, cx: &mut ConnCx<'_>) {
        Conn::handle_recv(self, n, cx)
    }

    fn handle_eof(&mut self, cx: &mut ConnCx<'_>) {
        Conn::handle_eof(self, cx)
    }

    fn handle_write_shutdown(&mut self, cx: &mut ConnCx<'_>) {
        Conn::handle_write_shutdown(self, cx)
    }

    fn handle_error(&mut self, cx: &mut ConnCx<'_>) {
        // A lingering connection's reads fail when the client resets it, which is how many
        // clients end; it has nothing left to send (its write side is shut).
        if !self.is_lingering() {
            cx.stats.bump(Counter::IoErrors);
        }
    }

    fn is_idle(&self) -> bool {
        Conn::is_idle(self)
    }
}
