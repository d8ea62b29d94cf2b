//! The completion backend: one io_uring per worker, behind the same progress calls as epoll
//! (`Io`), so nothing above the runtime changes.
//!
//! - **Receiving**: a watched socket keeps one multishot receive on the ring, which takes
//!   buffers from the worker's provided-buffer ring (`bufring.rs`) as bytes arrive; `recv`
//!   copies from the oldest such buffer and gives it back. An idle connection holds no
//!   buffer, as with epoll. A socket whose unread bytes pass [`RX_CAP`] (an app that stopped
//!   reading it) has its receive cancelled until it is read down, so one client cannot take
//!   every buffer; a receive that found no buffer (`ENOBUFS`) waits for buffers to come back.
//!   When it does, the bytes other sockets' apps left unread are copied to the heap and their
//!   buffers given back (`reclaim_unread`): sockets held back (a relay whose client opens no
//!   window) must not starve the ones that are read.
//! - **Sending**: `send` copies up to [`SEND_CHUNK`] bytes (up to [`BIG_SEND`] when offered
//!   more and no send is under way, [`MAX_BIG_SENDS_OUT`] at once per worker) into a buffer
//!   of the backend and queues one send on the ring; all of a turn's sends go to the kernel
//!   in the turn's one `io_uring_enter`. Copying, rather than pointing the kernel at the
//!   caller's memory, leaves the caller free to reuse or drop its buffers at once (a
//!   connection closed while its send is in flight must not have its memory recycled under
//!   the kernel); the cost is one copy of what a kernel `send` copies anyway. While a send is in flight the socket
//!   takes up to a chunk more, sent after it in order (a frame queued just before a close
//!   still goes out), then nothing more (`Ok(None)`) until a completion reports it writable.
//! - **Files** go out by `sendfile` as a syscall (zero copy); when the socket is full, a
//!   one-shot poll on the ring says when to try again.
//! - **Connecting**, peeking and shutting down stay syscalls (seccomp's socket rules keep
//!   judging the connects; see `sys.rs`).
//! - **UDP sockets** ([`UringDatagram`]) are watched with a multishot poll for reading on the
//!   ring (and a one-shot poll for room after a send found none), reported as epoll reports
//!   them; the receives and sends themselves are syscalls through quinn-udp (`recvmmsg`,
//!   `sendmsg` with GSO), as on epoll. Receiving through the ring (`RECVMSG` with provided
//!   buffers) could come later; it would need GRO-sized buffers and the control messages
//!   parsed here.
//! - **Closing**: dropping a [`UringSock`] hands its descriptor back to the backend, which
//!   cancels its receive and polls, lets a send under way finish (the app counted those
//!   bytes as sent, as it counts bytes in a kernel socket's buffer; it is cancelled when the
//!   peer takes nothing for [`ORPHAN_SEND_STALL`], and [`ORPHAN_SEND_LIMIT`] bounds it in
//!   all), and closes it once the last completion is in.
//!
//! The ring is made before the sandbox closes, disabled, with an allow-list of exactly the
//! operations above (`setup.rs`), and enabled by its worker.

mod bufring;
mod setup;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::time::Duration;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use quinn_udp::{RecvMeta, Transmit as DatagramTransmit};

use self::bufring::BufRing;
pub use self::setup::Prepared;
use super::datagram::KernelDatagram;
use super::{sys, Backend, Io, Peer, Readiness, Transmit, Waiting};
use crate::waker::Waker;

/// Unread bytes a socket may hold in ring buffers before its receive is paused.
const RX_CAP: usize = 64 * 1024;
/// Most bytes one send copies and queues (but see [`BIG_SEND`]).
const SEND_CHUNK: usize = 64 * 1024;
/// Send buffers kept for reuse.
const SPARE_SENDS: usize = 64;
/// Most bytes a send that starts at once copies: a TLS transport's big block (256 KiB of
/// records, for a peer that keeps up) goes out in one send, as it does on epoll, and the
/// transport, seeing it taken whole, keeps making big blocks.
const BIG_SEND: usize = 256 * 1024;
/// Big send buffers kept for reuse.
const SPARE_BIG_SENDS: usize = 8;
/// Big sends under way at once, per worker: the ring copies what the transport offers, so
/// a peer that stops reading holds its send's buffer (unlike the transport's own blocks,
/// which it gets back at once); past this, sends are [`SEND_CHUNK`] again.
const MAX_BIG_SENDS_OUT: usize = 16;
/// How long a dropped socket's last send may take before it is cancelled: what the app
/// sent before closing goes out, as a kernel socket's buffer would after `close`, but a
/// peer that stopped reading does not keep it forever.
const ORPHAN_SEND_LIMIT: Duration = Duration::from_secs(30);
/// How long a dropped socket's send may make no progress: a peer that stopped reading
/// would otherwise hold a descriptor and a send buffer for the whole limit (a kernel
/// socket closed with unsent bytes holds no descriptor).
const ORPHAN_SEND_STALL: Duration = Duration::from_secs(2);
/// While dropped sockets' sends are under way, the loop looks at them at least this often.
const ORPHAN_CHECK: Duration = Duration::from_millis(250);

/// A dropped socket whose last send is still under way.
struct Orphan {
    slot: u32,
    generation: u32,
    /// Cancelled at this time whatever happens.
    limit: std::time::Instant,
    /// Cancelled at this time unless the peer takes bytes before.
    stalled_at: std::time::Instant,
}

/// What a completion is about: the top byte of its `user_data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Recv = 1,
    Send = 2,
    PollOut = 3,
    Cancel = 4,
    Listener = 5,
    Waker = 6,
    /// A UDP socket's multishot poll for reading.
    DatagramIn = 7,
}

impl Op {
    fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Recv,
            2 => Op::Send,
            3 => Op::PollOut,
            4 => Op::Cancel,
            5 => Op::Listener,
            6 => Op::Waker,
            7 => Op::DatagramIn,
            _ => return None,
        })
    }
}

/// `user_data`: the operation, the slot's generation (so a late completion for a slot that
/// was reused is recognised), and the slot (or the listener's token).
fn user_data(op: Op, generation: u32, slot: u32) -> u64 {
    (op as u64) << 56 | u64::from(generation & 0x00ff_ffff) << 32 | u64::from(slot)
}

fn split_user_data(data: u64) -> (Option<Op>, u32, u32) {
    (
        Op::from_u8((data >> 56) as u8),
        (data >> 32) as u32 & 0x00ff_ffff,
        data as u32,
    )
}

/// Counters of the ring's work, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UringStats {
    /// Operations queued on the ring.
    pub submissions: u64,
    /// Completions taken from it.
    pub completions: u64,
    /// Calls of `io_uring_enter` (one per loop turn, plus one when the queue fills).
    pub enters: u64,
    /// Multishot receives started again after they ended (pause, buffers, or the kernel).
    pub rearms: u64,
    /// Receives that found the buffer ring empty.
    pub buffers_exhausted: u64,
    /// Buffers given back early, their unread bytes copied out (`reclaim_unread`).
    pub buffers_reclaimed: u64,
}

/// One socket's state in the backend, by slot.
#[derive(Default)]
struct Slot {
    /// Bumped when the slot is freed: completions carry it.
    generation: u32,
    fd: RawFd,
    token: Option<usize>,
    /// Bytes received, oldest first, then the end or an error.
    rx: VecDeque<Rx>,
    /// Unread bytes copied out of ring buffers when the ring ran dry (`reclaim_unread`):
    /// they come before everything in `rx`.
    set_aside: Option<Box<SetAside>>,
    /// Unread bytes, in `set_aside` and `rx`.
    rx_bytes: u32,
    /// A multishot receive is on the ring.
    recv_armed: bool,
    /// Its receive was stopped because the app left too much unread: it starts again once
    /// the app read it down to half.
    recv_held: bool,
    /// Its receive found no buffer: it starts again once buffers came back.
    recv_starved: bool,
    /// The app has no room for its input (`hold_input`): no receive until it calls `recv`.
    recv_paused: bool,
    /// The send on the ring (boxed: an idle socket's slot stays small).
    send: Option<Box<Outgoing>>,
    /// Bytes taken while that send is under way, sent after it (in order): a last frame
    /// queued just before a close (a GOAWAY after a PING's ACK) goes out as it would from a
    /// kernel socket's buffer.
    next: Option<Box<Outgoing>>,
    /// A send failed with this errno (0: none): the next call reports it.
    error: i32,
    shutdown_after_send: bool,
    /// The app was told to wait for the send under way (`Ok(None)`): its completion reports
    /// the socket writable. (Otherwise it reports nothing: a pass over the connection per
    /// completed send would cost as much as the syscall it saves.)
    want_writable: bool,
    /// A one-shot poll for room (or for a connect's outcome) is on the ring.
    poll_out: bool,
    /// A UDP socket's multishot poll for reading is on the ring.
    poll_in: bool,
    connecting: bool,
    /// Completions still to come for this slot.
    owed: u32,
    /// Dropped by the app: closes once nothing is owed.
    closing: Option<OwnedFd>,
    /// What to report for it at the end of the turn (`Readiness` bits).
    news: u8,
}

/// Bytes on their way out, and how many went.
#[derive(Default)]
struct Outgoing {
    buf: Vec<u8>,
    sent: usize,
    /// Holds up to [`BIG_SEND`] bytes (counted in `big_sends_out`).
    big: bool,
}

/// Bytes the app left unread, in the heap, and how many it has read since.
struct SetAside {
    bytes: Vec<u8>,
    read: usize,
}

enum Rx {
    Data { bid: u16, off: u32, len: u32 },
    End,
    Error(i32),
}

const READABLE: u8 = 1;
const WRITABLE: u8 = 2;
const READ_CLOSED: u8 = 4;
const ERROR: u8 = 8;

type Dropped = Rc<RefCell<Vec<(u32, u32, OwnedFd)>>>;

pub struct UringIo {
    // Field order matters: the ring (and with it every registration) goes before the buffer
    // memory it was given.
    ring: IoUring,
    bufs: BufRing,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Sockets the app dropped since the last turn: (slot, generation, descriptor).
    dropped: Dropped,
    /// Slots with news this turn.
    touched: Vec<u32>,
    /// Receives waiting for buffers to come back.
    starved: Vec<u32>,
    /// Dropped sockets whose last send is still under way, and when it is given up.
    orphans: Vec<Orphan>,
    /// [`ORPHAN_SEND_STALL`], shorter in tests.
    orphan_stall: Duration,
    /// Watched listeners: descriptor and token.
    listeners: Vec<(RawFd, usize)>,
    /// The inbox's eventfd and token, and where the ring reads its counter into.
    waker: Option<(RawFd, usize)>,
    waker_buf: Box<[u8; 8]>,
    /// Boxed as the slots hold them: moving one between them moves no buffer header.
    #[allow(clippy::vec_box)]
    spare_sends: Vec<Box<Outgoing>>,
    #[allow(clippy::vec_box)]
    spare_big_sends: Vec<Box<Outgoing>>,
    /// Big send buffers in use ([`MAX_BIG_SENDS_OUT`]).
    big_sends_out: usize,
    completions: Vec<cqueue::Entry>,
    stats: UringStats,
    /// `stats` when the app last took them (`take_ring_counts`).
    reported: UringStats,
    /// Set while one of the app's calls runs, and left set if a panic unwinds out of it
    /// ([`Io::poisoned`]).
    in_call: Rc<Cell<bool>>,
}

/// Marks an app's call into the backend as under way until it returns. Unwinding (a panic
/// in the call) leaves the mark: the tables the call was changing may be half-updated.
struct InCall(Rc<Cell<bool>>);

impl InCall {
    fn enter(flag: &Rc<Cell<bool>>) -> InCall {
        flag.set(true);
        InCall(flag.clone())
    }
}

impl Drop for InCall {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.0.set(false);
        }
    }
}

/// A socket of the io_uring backend. Dropping it closes it (through the backend, once the
/// ring is done with it).
pub struct UringSock {
    slot: u32,
    generation: u32,
    fd: Option<OwnedFd>,
    dropped: Dropped,
}

impl UringSock {
    fn fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }
}

/// A UDP socket of the io_uring backend: a slot like a TCP socket's (so a dropped one is
/// closed, and its late completions are recognised, the same way), and quinn-udp's state.
pub struct UringDatagram {
    sock: UringSock,
    kernel: KernelDatagram,
}

impl UringDatagram {
    fn fd(&self) -> &OwnedFd {
        self.sock.fd.as_ref().expect("an open socket")
    }
}

impl Drop for UringSock {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            self.dropped
                .borrow_mut()
                .push((self.slot, self.generation, fd));
        }
    }
}

impl UringIo {
    /// What the backend keeps per socket besides the socket itself (an idle one's share).
    pub const BYTES_PER_SOCKET: usize = std::mem::size_of::<Slot>();

    /// Rings for `workers` workers, made on the calling thread before the sandbox closes:
    /// each disabled, restricted to what this backend submits, with its buffers registered.
    /// An error names what this kernel or its policy refused.
    pub fn prepare(workers: usize) -> io::Result<Vec<Prepared>> {
        (0..workers).map(|_| setup::prepare()).collect()
    }

    /// A backend on the calling thread (tests and tools; a worker's comes from `prepare`).
    pub fn on_this_thread() -> io::Result<UringIo> {
        UringIo::start(setup::prepare()?)
    }

    #[cfg(test)]
    fn set_orphan_stall(&mut self, stall: Duration) {
        self.orphan_stall = stall;
    }

    pub fn stats(&self) -> UringStats {
        self.stats
    }

    fn from_prepared(prepared: Prepared) -> io::Result<UringIo> {
        let (ring, bufs) = prepared.enable()?;
        Ok(UringIo {
            ring,
            bufs,
            slots: Vec::new(),
            free: Vec::new(),
            dropped: Rc::default(),
            touched: Vec::new(),
            starved: Vec::new(),
            orphans: Vec::new(),
            orphan_stall: ORPHAN_SEND_STALL,
            listeners: Vec::new(),
            waker: None,
            waker_buf: Box::new([0; 8]),
            spare_sends: Vec::new(),
            spare_big_sends: Vec::new(),
            big_sends_out: 0,
            completions: Vec::with_capacity(1024),
            stats: UringStats::default(),
            reported: UringStats::default(),
            in_call: Rc::default(),
        })
    }

    fn sock(&mut self, fd: OwnedFd, connecting: bool) -> UringSock {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[slot as usize];
        s.fd = fd.as_raw_fd();
        s.connecting = connecting;
        UringSock {
            slot,
            generation: s.generation,
            fd: Some(fd),
            dropped: self.dropped.clone(),
        }
    }

    /// Queues an operation; a full submission queue goes to the kernel first.
    fn push(&mut self, sqe: squeue::Entry) {
        self.stats.submissions += 1;
        loop {
            // SAFETY: every operation queued here names memory the backend owns and keeps
            // until its completion: a send buffer held in its slot, the waker's boxed
            // counter, the registered buffer ring; descriptors stay open until their last
            // completion (`closing`).
            if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
                return;
            }
            self.stats.enters += 1;
            if let Err(e) = self.ring.submit() {
                if e.raw_os_error() != Some(libc::EBUSY) {
                    tracing::error!("io_uring submit failed: {e}");
                }
            }
        }
    }

    fn arm_recv(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        if s.recv_armed || s.closing.is_some() || s.token.is_none() {
            return;
        }
        s.recv_armed = true;
        s.recv_held = false;
        s.recv_starved = false;
        s.owed += 1;
        let data = user_data(Op::Recv, s.generation, slot);
        let sqe = opcode::RecvMulti::new(types::Fd(s.fd), bufring::GROUP)
            .build()
            .user_data(data);
        self.push(sqe);
    }

    fn arm_poll_out(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        if s.poll_out {
            return;
        }
        s.poll_out = true;
        s.owed += 1;
        let data = user_data(Op::PollOut, s.generation, slot);
        let sqe = opcode::PollAdd::new(types::Fd(s.fd), libc::POLLOUT as u32)
            .build()
            .user_data(data);
        self.push(sqe);
    }

    /// A UDP socket's poll for reading: multishot, so each arrival that finds the socket
    /// (edge) posts a completion without a new submission. POLL_ADD is on the ring's
    /// allow-list already (listeners, room to write); multishot is a flag of the operation,
    /// not an SQE flag.
    fn arm_poll_in(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        if s.poll_in || s.closing.is_some() || s.token.is_none() {
            return;
        }
        s.poll_in = true;
        s.owed += 1;
        let data = user_data(Op::DatagramIn, s.generation, slot);
        let sqe = opcode::PollAdd::new(types::Fd(s.fd), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(data);
        self.push(sqe);
    }

    fn cancel(&mut self, op: Op, slot: u32) {
        let generation = self.slots[slot as usize].generation;
        let sqe = opcode::AsyncCancel::new(user_data(op, generation, slot))
            .build()
            .user_data(user_data(Op::Cancel, generation, slot));
        self.push(sqe);
    }

    fn submit_send(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        let Some(out) = &s.send else { return };
        let rest = &out.buf[out.sent..];
        s.owed += 1;
        let sqe = opcode::Send::new(types::Fd(s.fd), rest.as_ptr(), rest.len() as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .user_data(user_data(Op::Send, s.generation, slot));
        self.push(sqe);
    }

    fn note(&mut self, slot: u32, news: u8) {
        let s = &mut self.slots[slot as usize];
        if s.news == 0 {
            self.touched.push(slot);
        }
        s.news |= news;
    }

    /// Sockets the app dropped: cancel what is in flight; close when nothing is owed.
    fn bury_dropped(&mut self) {
        let dropped = std::mem::take(&mut *self.dropped.borrow_mut());
        for (slot, generation, fd) in dropped {
            let s = &mut self.slots[slot as usize];
            debug_assert_eq!(s.generation, generation);
            s.token = None;
            s.closing = Some(fd);
            let (recv, send, poll) = (s.recv_armed, s.send.is_some(), s.poll_out);
            let poll_in = s.poll_in;
            if recv {
                self.cancel(Op::Recv, slot);
            }
            if poll_in {
                self.cancel(Op::DatagramIn, slot);
            }
            // The app counted the bytes of a send on the ring as sent (as it counts bytes
            // in a kernel socket's buffer): they go out before the descriptor closes.
            if send {
                let now = std::time::Instant::now();
                self.orphans.push(Orphan {
                    slot,
                    generation,
                    limit: now + ORPHAN_SEND_LIMIT,
                    stalled_at: now + self.orphan_stall,
                });
            }
            if poll {
                self.cancel(Op::PollOut, slot);
            }
            self.finish_if_closed(slot);
        }
    }

    fn finish_if_closed(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        if s.closing.is_none() || s.owed > 0 {
            return;
        }
        let mut old = std::mem::take(s);
        s.generation = old.generation.wrapping_add(1) & 0x00ff_ffff;
        for rx in old.rx.drain(..) {
            if let Rx::Data { bid, .. } = rx {
                self.bufs.give_back(bid);
            }
        }
        for out in [old.send.take(), old.next.take()].into_iter().flatten() {
            self.recycle(out);
        }
        self.free.push(slot);
        // `old.closing` drops here: the descriptor closes.
    }

    fn recycle(&mut self, mut out: Box<Outgoing>) {
        let (spares, keep) = if out.big {
            self.big_sends_out -= 1;
            (&mut self.spare_big_sends, SPARE_BIG_SENDS)
        } else {
            (&mut self.spare_sends, SPARE_SENDS)
        };
        if spares.len() < keep {
            out.buf.clear();
            out.sent = 0;
            spares.push(out);
        }
    }

    fn live(&self, slot: u32, generation: u32) -> bool {
        self.slots
            .get(slot as usize)
            .is_some_and(|s| s.generation == generation)
    }

    fn complete(&mut self, cqe: &cqueue::Entry, ready: &mut Vec<Readiness>) {
        self.stats.completions += 1;
        let (op, generation, slot) = split_user_data(cqe.user_data());
        let (res, flags) = (cqe.result(), cqe.flags());
        match op {
            Some(Op::Listener) => {
                let token = slot as usize;
                if let Some(&(fd, _)) = self.listeners.iter().find(|(_, t)| *t == token) {
                    ready.push(Readiness {
                        token,
                        readable: true,
                        ..Readiness::default()
                    });
                    if !cqueue::more(flags) {
                        self.watch_listener_fd(fd, token);
                    }
                }
            }
            Some(Op::Waker) => {
                if let Some((fd, token)) = self.waker {
                    ready.push(Readiness {
                        token,
                        readable: true,
                        ..Readiness::default()
                    });
                    self.read_waker(fd);
                }
            }
            Some(Op::Recv) => self.received(slot, generation, res, flags),
            Some(Op::DatagramIn) if self.live(slot, generation) => {
                self.datagram_polled(slot, res, flags)
            }
            Some(Op::Send) if self.live(slot, generation) => self.sent(slot, res),
            Some(Op::PollOut) if self.live(slot, generation) => {
                let s = &mut self.slots[slot as usize];
                s.poll_out = false;
                s.owed -= 1;
                self.note(slot, WRITABLE);
                self.finish_if_closed(slot);
            }
            _ => {}
        }
    }

    fn received(&mut self, slot: u32, generation: u32, res: i32, flags: u32) {
        let buffer = cqueue::buffer_select(flags);
        if buffer.is_some() {
            self.bufs.taken();
        }
        if !self.live(slot, generation) {
            if let Some(bid) = buffer {
                self.bufs.give_back(bid);
            }
            return;
        }
        let more = cqueue::more(flags);
        let s = &mut self.slots[slot as usize];
        if !more {
            s.recv_armed = false;
            s.owed -= 1;
        }
        if s.closing.is_some() {
            // The bytes are nobody's.
            if let Some(bid) = buffer {
                self.bufs.give_back(bid);
            }
            self.finish_if_closed(slot);
            return;
        }
        let news = match res {
            1.. => {
                let bid = buffer.expect("a receive with bytes names its buffer");
                s.rx.push_back(Rx::Data {
                    bid,
                    off: 0,
                    len: res as u32,
                });
                s.rx_bytes += res as u32;
                READABLE
            }
            0 => {
                s.rx.push_back(Rx::End);
                READABLE | READ_CLOSED
            }
            _ if -res == libc::ENOBUFS => {
                self.stats.buffers_exhausted += 1;
                if !s.recv_starved {
                    s.recv_starved = true;
                    self.starved.push(slot);
                }
                0
            }
            _ if -res == libc::ECANCELED => 0,
            _ => {
                s.rx.push_back(Rx::Error(-res));
                READABLE | ERROR
            }
        };
        if s.rx_bytes as usize >= RX_CAP && !s.recv_held {
            // The app is not reading it: stop taking buffers for it (`recv` starts again).
            s.recv_held = true;
            if more {
                self.cancel(Op::Recv, slot);
            }
        }
        if !more {
            // Ended: by the kernel (it may, at any time), our cancel, or no buffer.
            self.maybe_rearm(slot);
        }
        if news != 0 {
            self.note(slot, news);
        }
    }

    /// A UDP socket's poll for reading fired (or ended). Its generation was checked: a poll
    /// of a socket dropped and closed since cannot reach the slot's next socket, and one
    /// of a socket dropped but not closed yet reports nothing (its token is gone).
    fn datagram_polled(&mut self, slot: u32, res: i32, flags: u32) {
        let more = cqueue::more(flags);
        let s = &mut self.slots[slot as usize];
        if !more {
            s.poll_in = false;
            s.owed -= 1;
        }
        if s.closing.is_some() {
            self.finish_if_closed(slot);
            return;
        }
        let news = match res {
            0.. => {
                let revents = res as u32 as libc::c_short;
                let mut news = 0;
                if revents & libc::POLLIN != 0 {
                    news |= READABLE;
                }
                if revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                    // The read collects the error.
                    news |= READABLE | ERROR;
                }
                if !more {
                    // The kernel may end a multishot poll (an overflowing completion queue).
                    self.arm_poll_in(slot);
                }
                news
            }
            _ if -res == libc::ECANCELED => 0,
            _ => {
                // Not armed again (it would fail again each turn): the app hears of an error
                // and its reads still work; only the reports of arrivals stop.
                tracing::warn!(
                    "io_uring: a UDP socket's poll failed: {}",
                    io::Error::from_raw_os_error(-res)
                );
                READABLE | ERROR
            }
        };
        if news != 0 {
            self.note(slot, news);
        }
    }

    fn sent(&mut self, slot: u32, res: i32) {
        let s = &mut self.slots[slot as usize];
        s.owed -= 1;
        if s.closing.is_some() && res > 0 {
            // A dropped socket's peer took bytes: its stall clock starts again.
            let (stall, generation) = (self.orphan_stall, s.generation);
            let orphan = |o: &&mut Orphan| o.slot == slot && o.generation == generation;
            if let Some(o) = self.orphans.iter_mut().find(orphan) {
                o.stalled_at = std::time::Instant::now() + stall;
            }
        }
        let s = &mut self.slots[slot as usize];
        let mut done = true;
        if res >= 0 {
            if let Some(out) = &mut s.send {
                out.sent += res as usize;
                done = out.sent >= out.buf.len();
            }
        } else if -res != libc::ECANCELED {
            s.error = -res;
        }
        if !done {
            self.submit_send(slot);
            return;
        }
        let s = &mut self.slots[slot as usize];
        let out = s.send.take();
        if res >= 0 {
            if let Some(next) = s.next.take() {
                s.send = Some(next);
                self.submit_send(slot);
                if let Some(out) = out {
                    self.recycle(out);
                }
                return;
            }
        } else if let Some(next) = s.next.take() {
            // Failed or cancelled: what waited behind it is lost with it.
            self.recycle(next);
        }
        let s = &mut self.slots[slot as usize];
        if s.shutdown_after_send && s.closing.is_none() {
            s.shutdown_after_send = false;
            // SAFETY: shutdown takes no pointers; the descriptor is this open socket's.
            unsafe { libc::shutdown(s.fd, libc::SHUT_WR) };
        }
        let news = if s.error != 0 {
            WRITABLE | ERROR
        } else if std::mem::take(&mut s.want_writable) {
            WRITABLE
        } else {
            0
        };
        if let Some(out) = out {
            self.recycle(out);
        }
        if news != 0 {
            self.note(slot, news);
        }
        self.finish_if_closed(slot);
    }

    fn watch_listener_fd(&mut self, fd: RawFd, token: usize) {
        let sqe = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .multi(true)
            .build()
            .user_data(user_data(Op::Listener, 0, token as u32));
        self.push(sqe);
    }

    fn read_waker(&mut self, fd: RawFd) {
        let sqe = opcode::Read::new(types::Fd(fd), self.waker_buf.as_mut_ptr(), 8)
            .build()
            .user_data(user_data(Op::Waker, 0, 0));
        self.push(sqe);
    }

    /// Dropped sockets whose last send did not finish in time: cancelled (then closed).
    fn give_up_orphans(&mut self) {
        if self.orphans.is_empty() {
            return;
        }
        let now = std::time::Instant::now();
        let mut orphans = std::mem::take(&mut self.orphans);
        orphans.retain(|o| {
            let s = &self.slots[o.slot as usize];
            let waiting = s.generation == o.generation && s.send.is_some();
            if waiting && (now >= o.limit || now >= o.stalled_at) {
                self.cancel(Op::Send, o.slot);
                return false;
            }
            waiting
        });
        self.orphans = orphans;
    }

    /// The ring ran dry while sockets sit on bytes their app has not read (a relay held back
    /// by a client that opens no window, a connection paused at its cap): those bytes are
    /// copied to the heap and their buffers given back. Without this, sockets the app does
    /// not read could keep every buffer, and the worker's other sockets, starved, would never
    /// receive again (as with a kernel socket's own buffer, a socket's unread bytes are its
    /// own cost, bounded by the cap). Only under pressure: the copy is not free.
    fn reclaim_unread(&mut self) {
        if self.starved.is_empty() {
            return;
        }
        let bufs = &mut self.bufs;
        for s in &mut self.slots {
            while let Some(&Rx::Data { bid, off, len }) = s.rx.front() {
                s.rx.pop_front();
                if s.closing.is_none() {
                    let aside = s.set_aside.get_or_insert_with(|| {
                        Box::new(SetAside {
                            bytes: Vec::with_capacity(s.rx_bytes as usize),
                            read: 0,
                        })
                    });
                    aside.bytes.extend_from_slice(bufs.bytes(bid, off, len));
                } // else the bytes are nobody's
                bufs.give_back(bid);
                self.stats.buffers_reclaimed += 1;
            }
        }
    }

    /// Receives that ran out of buffers start again once some came back.
    fn feed_starved(&mut self) {
        while self.bufs.available() > 0 {
            let Some(slot) = self.starved.pop() else {
                return;
            };
            self.maybe_rearm(slot);
        }
    }

    /// Starts the socket's receive again if it ended and nothing holds it back: not the end
    /// or an error (the socket is done), not the app's unread bytes above half the cap, not
    /// an empty buffer ring, not a close or a connect under way.
    fn maybe_rearm(&mut self, slot: u32) {
        let s = &self.slots[slot as usize];
        let ended = matches!(s.rx.back(), Some(Rx::End | Rx::Error(_)));
        let held = s.recv_held && s.rx_bytes as usize >= RX_CAP / 2;
        let starved = s.recv_starved && self.bufs.available() == 0;
        let gone = s.closing.is_some() || s.token.is_none();
        if s.recv_armed || s.recv_paused || ended || held || starved || s.connecting || gone {
            return;
        }
        self.stats.rearms += 1;
        self.arm_recv(slot);
    }

    fn enter(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        self.stats.enters += 1;
        let submitter = self.ring.submitter();
        let result = match timeout {
            Some(t) if t.is_zero() => submitter.submit_and_wait(0),
            Some(t) => {
                let ts = types::Timespec::from(t);
                submitter.submit_with_args(1, &types::SubmitArgs::new().timespec(&ts))
            }
            None => submitter.submit_and_wait(1),
        };
        match result {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

impl Io for UringIo {
    type Sock = UringSock;
    type Datagram = UringDatagram;

    fn connect(&mut self, to: Peer<'_>) -> io::Result<UringSock> {
        let _call = InCall::enter(&self.in_call);
        let fd = sys::connect(to)?;
        Ok(self.sock(fd, true))
    }

    fn watch(&mut self, sock: &mut UringSock, token: usize) -> io::Result<()> {
        let _call = InCall::enter(&self.in_call);
        let slot = sock.slot;
        let s = &mut self.slots[slot as usize];
        s.token = Some(token);
        if s.connecting {
            // Room to write means the connect finished; receiving starts once it did.
            self.arm_poll_out(slot);
        } else {
            self.arm_recv(slot);
        }
        Ok(())
    }

    fn connected(&mut self, sock: &mut UringSock) -> io::Result<bool> {
        let _call = InCall::enter(&self.in_call);
        let done = sys::connected(sock.fd.as_ref().expect("an open socket"))?;
        let s = &mut self.slots[sock.slot as usize];
        if done && s.connecting {
            s.connecting = false;
            self.arm_recv(sock.slot);
        } else if !done {
            self.arm_poll_out(sock.slot);
        }
        Ok(done)
    }

    fn send(&mut self, sock: &mut UringSock, what: &Transmit<'_>) -> io::Result<Option<usize>> {
        let _call = InCall::enter(&self.in_call);
        let slot = sock.slot;
        let s = &mut self.slots[slot as usize];
        if s.error != 0 {
            return Err(io::Error::from_raw_os_error(std::mem::take(&mut s.error)));
        }
        let in_flight = s.send.is_some();
        let next_full = s.next.as_ref().is_some_and(|n| n.buf.len() >= SEND_CHUNK);
        if in_flight && (next_full || matches!(what, Transmit::File { .. })) {
            s.want_writable = true;
            return Ok(None); // its completion reports the socket writable
        }
        match *what {
            Transmit::Memory { iov, more: _ } => {
                // (`more`: a file follows. The file waits for this send's completion, a turn
                // later, so holding this one back for it would only delay it.)
                let (mut out, cap) = match s.next.take() {
                    Some(next) => (next, SEND_CHUNK),
                    None if !in_flight
                        && self.big_sends_out < MAX_BIG_SENDS_OUT
                        && iov.iter().map(|s| s.len()).sum::<usize>() > SEND_CHUNK =>
                    {
                        self.big_sends_out += 1;
                        let big = self.spare_big_sends.pop().unwrap_or_else(|| {
                            Box::new(Outgoing {
                                buf: Vec::with_capacity(BIG_SEND),
                                sent: 0,
                                big: true,
                            })
                        });
                        (big, BIG_SEND)
                    }
                    None => (self.spare_sends.pop().unwrap_or_default(), SEND_CHUNK),
                };
                let before = out.buf.len();
                for slice in iov {
                    let room = cap - out.buf.len();
                    out.buf.extend_from_slice(&slice[..slice.len().min(room)]);
                    if out.buf.len() == cap {
                        break;
                    }
                }
                let n = out.buf.len() - before;
                if out.buf.is_empty() {
                    self.recycle(out);
                    return Ok(Some(0));
                }
                if in_flight {
                    // Waits behind the send under way (`sent` submits it).
                    self.slots[slot as usize].next = Some(out);
                } else {
                    self.slots[slot as usize].send = Some(out);
                    self.submit_send(slot);
                }
                Ok(Some(n))
            }
            Transmit::File {
                fd: file,
                offset,
                len,
            } => match sys::send_file(s.fd, file, offset, len) {
                Ok(0) => Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => Ok(Some(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.arm_poll_out(slot);
                    Ok(None)
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(Some(0)),
                Err(e) => Err(e),
            },
        }
    }

    fn recv(&mut self, sock: &mut UringSock, buf: &mut [u8]) -> io::Result<usize> {
        let _call = InCall::enter(&self.in_call);
        // From as many queued buffers as fit, as a kernel read takes everything waiting (a
        // relay that gets a whole answer in one read compresses it in one pass).
        let slot = sock.slot;
        let s = &mut self.slots[slot as usize];
        if s.token.is_none() && s.rx.is_empty() && s.set_aside.is_none() {
            // Not watched yet: a connection just accepted, whose request is usually there
            // already (the listener defers accepts until bytes arrive). One syscall answers
            // it in this turn, as epoll does, where waiting for a receive on the ring would
            // take two more turns (and a connection answered and closed at once, never one).
            return sys::recv(s.fd, buf);
        }
        // The app has room again: its receive starts again below.
        let resume = std::mem::take(&mut s.recv_paused);
        let mut n = 0;
        if let Some(aside) = &mut s.set_aside {
            let rest = &aside.bytes[aside.read..];
            n = rest.len().min(buf.len());
            buf[..n].copy_from_slice(&rest[..n]);
            aside.read += n;
            s.rx_bytes -= n as u32;
            if aside.read == aside.bytes.len() {
                s.set_aside = None;
            }
        }
        while n < buf.len() {
            let Some(front) = s.rx.front_mut() else {
                break;
            };
            match front {
                Rx::Data { bid, off, len } => {
                    let take = (buf.len() - n).min(*len as usize);
                    buf[n..n + take].copy_from_slice(self.bufs.bytes(*bid, *off, take as u32));
                    n += take;
                    *off += take as u32;
                    *len -= take as u32;
                    s.rx_bytes -= take as u32;
                    if *len == 0 {
                        let bid = *bid;
                        s.rx.pop_front();
                        self.bufs.give_back(bid);
                    }
                }
                // The end or an error comes after the bytes before it, on the next call.
                _ if n > 0 => break,
                Rx::End => return Ok(0),
                Rx::Error(e) => return Err(io::Error::from_raw_os_error(*e)),
            }
        }
        if resume || self.slots[slot as usize].recv_held {
            self.maybe_rearm(slot);
        }
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    }

    fn hold_input(&mut self, sock: &mut UringSock) {
        let _call = InCall::enter(&self.in_call);
        let slot = sock.slot;
        let s = &mut self.slots[slot as usize];
        if s.recv_paused {
            return;
        }
        s.recv_paused = true;
        // (A receive held at the cap has its cancel on the way already.)
        if s.recv_armed && !s.recv_held {
            self.cancel(Op::Recv, slot);
        }
    }

    fn peek(&mut self, sock: &mut UringSock) -> Waiting {
        let _call = InCall::enter(&self.in_call);
        let s = &self.slots[sock.slot as usize];
        if s.set_aside.is_some() {
            return Waiting::Bytes;
        }
        match s.rx.front() {
            Some(Rx::Data { .. }) => Waiting::Bytes,
            Some(_) => Waiting::Closed,
            None => sys::peek(sock.fd()),
        }
    }

    fn shutdown_write(&mut self, sock: &mut UringSock) -> io::Result<()> {
        let _call = InCall::enter(&self.in_call);
        let s = &mut self.slots[sock.slot as usize];
        if s.send.is_some() {
            // After the bytes on the ring, not before them.
            s.shutdown_after_send = true;
            return Ok(());
        }
        let fd = sock.fd.as_ref().expect("an open socket");
        socket2::SockRef::from(fd).shutdown(std::net::Shutdown::Write)
    }

    fn unacked_bytes(&self, sock: &UringSock) -> io::Result<u32> {
        let fd = sock.fd.as_ref().expect("an open socket");
        let s = &self.slots[sock.slot as usize];
        let queued = s.send.as_ref().map_or(0, |out| out.buf.len() - out.sent)
            + s.next.as_ref().map_or(0, |next| next.buf.len());
        Ok(crate::sockstat::unacked_bytes(fd)? + queued as u32)
    }

    fn watch_datagram(&mut self, sock: &mut UringDatagram, token: usize) -> io::Result<()> {
        let _call = InCall::enter(&self.in_call);
        let slot = sock.sock.slot;
        self.slots[slot as usize].token = Some(token);
        self.arm_poll_in(slot);
        // As a new epoll registration reports: room to write (readable comes from the poll,
        // at once if datagrams wait).
        self.note(slot, WRITABLE);
        Ok(())
    }

    fn recv_datagrams(
        &mut self,
        sock: &mut UringDatagram,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> io::Result<usize> {
        sock.kernel.recv(sock.fd(), bufs, meta)
    }

    fn send_datagram(
        &mut self,
        sock: &mut UringDatagram,
        transmit: &DatagramTransmit<'_>,
    ) -> io::Result<bool> {
        let _call = InCall::enter(&self.in_call);
        let sent = sock.kernel.send(sock.fd(), transmit)?;
        if !sent {
            // Its completion reports the socket writable.
            self.arm_poll_out(sock.sock.slot);
        }
        Ok(sent)
    }

    fn datagram_local_addr(&self, sock: &UringDatagram) -> SocketAddr {
        sock.kernel.local_addr()
    }

    fn max_gso_segments(&self, sock: &UringDatagram) -> usize {
        sock.kernel.max_gso_segments()
    }

    fn gro_segments(&self, sock: &UringDatagram) -> usize {
        sock.kernel.gro_segments()
    }

    fn poisoned(&self) -> bool {
        self.in_call.get()
    }

    fn take_ring_counts(&mut self) -> Option<UringStats> {
        let now = self.stats;
        let last = std::mem::replace(&mut self.reported, now);
        Some(UringStats {
            submissions: now.submissions - last.submissions,
            completions: now.completions - last.completions,
            enters: now.enters - last.enters,
            rearms: now.rearms - last.rearms,
            buffers_exhausted: now.buffers_exhausted - last.buffers_exhausted,
            buffers_reclaimed: now.buffers_reclaimed - last.buffers_reclaimed,
        })
    }

    fn short_read_drains(&self, sock: &UringSock) -> bool {
        // Nothing more is queued here: the next bytes come with a completion, which reports
        // the socket readable.
        let s = &self.slots[sock.slot as usize];
        s.rx.is_empty() && s.set_aside.is_none()
    }
}

impl Backend for UringIo {
    const NAME: &'static str = "io_uring";
    type Prepared = Prepared;

    fn start(prepared: Prepared) -> io::Result<UringIo> {
        UringIo::from_prepared(prepared)
    }

    fn watch_listener(
        &mut self,
        listener: &mut mio::net::TcpListener,
        token: usize,
    ) -> io::Result<()> {
        let fd = listener.as_raw_fd();
        self.listeners.push((fd, token));
        self.watch_listener_fd(fd, token);
        Ok(())
    }

    fn unwatch_listener(&mut self, listener: &mut mio::net::TcpListener) {
        let fd = listener.as_raw_fd();
        let Some(i) = self.listeners.iter().position(|&(f, _)| f == fd) else {
            return;
        };
        let (_, token) = self.listeners.swap_remove(i);
        let sqe = opcode::AsyncCancel::new(user_data(Op::Listener, 0, token as u32))
            .build()
            .user_data(user_data(Op::Cancel, 0, 0));
        self.push(sqe);
        // At once: the poll holds the listener open, and the caller closes it next.
        self.stats.enters += 1;
        let _ = self.ring.submit();
    }

    fn watch_waker(&mut self, waker: &Waker, token: usize) -> io::Result<()> {
        self.waker = Some((waker.fd(), token));
        self.read_waker(waker.fd());
        Ok(())
    }

    fn wait(&mut self, timeout: Option<Duration>, ready: &mut Vec<Readiness>) -> io::Result<()> {
        self.bury_dropped();
        self.give_up_orphans();
        self.reclaim_unread();
        self.feed_starved();
        let timeout = match self.orphans.is_empty() {
            true => timeout,
            false => Some(timeout.map_or(ORPHAN_CHECK, |t| t.min(ORPHAN_CHECK))),
        };
        self.enter(timeout)?;
        let mut completions = std::mem::take(&mut self.completions);
        completions.extend(self.ring.completion());
        for cqe in &completions {
            self.complete(cqe, ready);
        }
        completions.clear();
        self.completions = completions;
        for slot in std::mem::take(&mut self.touched) {
            let s = &mut self.slots[slot as usize];
            let news = std::mem::take(&mut s.news);
            if let Some(token) = s.token {
                ready.push(Readiness {
                    token,
                    readable: news & READABLE != 0,
                    writable: news & WRITABLE != 0,
                    read_closed: news & READ_CLOSED != 0,
                    error: news & ERROR != 0,
                });
            }
        }
        Ok(())
    }

    fn adopt(&mut self, stream: std::net::TcpStream) -> UringSock {
        let _call = InCall::enter(&self.in_call);
        self.sock(stream.into(), false)
    }

    fn adopt_datagram(&mut self, sock: std::net::UdpSocket) -> io::Result<UringDatagram> {
        let _call = InCall::enter(&self.in_call);
        let kernel = KernelDatagram::new(&sock)?;
        Ok(UringDatagram {
            sock: self.sock(sock.into(), false),
            kernel,
        })
    }

    fn flush(&mut self, within: Duration) {
        let limit = std::time::Instant::now() + within;
        let mut ready = Vec::new();
        loop {
            self.bury_dropped();
            let sending = self.slots.iter().any(|s| s.send.is_some());
            let now = std::time::Instant::now();
            if !sending || now >= limit {
                return;
            }
            ready.clear();
            if self.wait(Some(limit - now), &mut ready).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
