//! tern-runtime: thread per core, shared nothing.
//!
//! Each worker thread owns an event loop on its sockets' backend (epoll through `mio`, or one
//! io_uring: [`io::Backend`]), its own `SO_REUSEPORT` listener (the kernel
//! spreads connections across workers, so there is no shared accept lock) and UDP sockets
//! (for QUIC, spread the same way; [`io::Io::recv_datagrams`]), a timer wheel, a
//! buffer pool, a clock that formats the `Date` line once per second, and an [`Inbox`] through
//! which other threads hand it finished work. The runtime knows nothing about HTTP: the layer
//! above plugs in through [`WorkerApp`].

mod bufpool;
mod clock;
mod inbox;
pub mod io;
mod listener;
pub mod ratelog;
mod rlimit;
mod signals;
mod sockstat;
mod timer;
mod waker;
mod worker;

pub use bufpool::{BufPool, ReadBuf, BIG_BLOCK_SIZE, BLOCK_SIZE};
pub use clock::Clock;
pub use inbox::{DetachedInbox, Inbox, InboxSender};
pub use listener::{bind_datagram_reuseport, bind_reuseport};
pub use quinn_udp::{
    EcnCodepoint, RecvMeta, Transmit as DatagramTransmit, BATCH_SIZE as DATAGRAM_BATCH,
};
pub use rlimit::raise_fd_limit;
pub use signals::{spawn_signal_thread, SignalAction, SignalPipe, SignalThreadWaker};
pub use sockstat::unacked_bytes;
pub use timer::{TimerKey, TimerWheel};
pub use waker::Waker;
pub use worker::{
    available_cpus, BackendUnavailable, Context, IoChoice, MakeApp, Runtime, RuntimeConfig,
    RuntimeHandle, WorkerApp, FIRST_CONN_TOKEN, MAX_LISTENERS,
};
