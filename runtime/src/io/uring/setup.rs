//! A worker's ring, made so that the sandbox holds: io_uring operations are not syscalls, so
//! seccomp never sees them. Each ring is therefore created on the starting thread before
//! lockdown, disabled (`IORING_SETUP_R_DISABLED`), given an allow-list of exactly the
//! operations and SQE flags the backend submits (the kernel refuses anything else with
//! `EACCES`: no open, socket, connect, bind, listen, uring_cmd, msg_ring, madvise through the
//! ring), given its buffers, and only then enabled, by its worker (`SINGLE_ISSUER` binds the
//! ring to that thread). No SQPOLL and no registered personalities: every operation runs with
//! the credentials, and so the Landlock domain, of the worker that submits it. After lockdown
//! seccomp refuses `io_uring_setup` and allows `io_uring_register` only to enable a ring
//! (`sandbox/src/seccomp.rs`).

use std::io;

use io_uring::register::{Probe, Restriction};
use io_uring::{opcode, squeue, IoUring};

use super::bufring::BufRing;

/// Submission queue entries per ring (a turn's sends and re-arms; a full queue is submitted
/// early, not lost).
const SQ_ENTRIES: u32 = 4096;
/// Completion queue entries: multishot receives may post many per turn.
const CQ_ENTRIES: u32 = 16384;
/// Receive buffers per worker, and their size (2 MiB a worker, resident once a burst has
/// touched them all: kept small, as a receive that finds none waits and is counted).
pub(super) const BUFFERS: u16 = 512;
pub(super) const BUFFER_SIZE: u32 = 4096;

/// The operations the backend submits, and nothing else. UDP sockets add none: they are
/// watched with `POLL_ADD` (multishot is a flag of the operation, not an SQE flag) and read
/// and written by syscalls, which seccomp judges.
const ALLOWED_OPS: [u8; 5] = [
    opcode::RecvMulti::CODE,
    opcode::Send::CODE,
    opcode::PollAdd::CODE,
    opcode::Read::CODE,
    opcode::AsyncCancel::CODE,
];

/// A ring made and restricted before lockdown, not enabled yet.
pub struct Prepared {
    ring: IoUring,
    bufs: BufRing,
}

/// One worker's ring. The error names the step this kernel or its policy refused.
pub(super) fn prepare() -> io::Result<Prepared> {
    if pretend_missing() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "not in this kernel (TERN_TEST_KERNEL_WITHOUT)",
        ));
    }
    let step =
        |what: &'static str| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    let ring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .setup_submit_all()
        .setup_r_disabled()
        .setup_cqsize(CQ_ENTRIES)
        .build(SQ_ENTRIES)
        .map_err(step("io_uring_setup"))?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(step("probing operations"))?;
    if let Some(missing) = ALLOWED_OPS.iter().find(|&&op| !probe.is_supported(op)) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the kernel lacks io_uring operation {missing}"),
        ));
    }
    let mut restrictions: Vec<Restriction> = ALLOWED_OPS
        .iter()
        .map(|&op| Restriction::sqe_op(op))
        .collect();
    // Multishot receives select their buffer; no other SQE flag is allowed (not ASYNC, which
    // would push work to io-wq threads, not LINK, not FIXED_FILE).
    restrictions.push(Restriction::sqe_flags_allowed(
        squeue::Flags::BUFFER_SELECT.bits(),
    ));
    ring.submitter()
        .register_restrictions(&mut restrictions)
        .map_err(step("registering restrictions"))?;
    let bufs = BufRing::new(BUFFERS, BUFFER_SIZE).map_err(step("receive buffers"))?;
    bufs.register(&ring)
        .map_err(step("registering the buffer ring"))?;
    debug_assert_eq!(bufs.size(), BUFFER_SIZE);
    Ok(Prepared { ring, bufs })
}

/// For tests of the fallback: `TERN_TEST_KERNEL_WITHOUT=io_uring` makes a debug build behave
/// as if the kernel had no io_uring (as the sandbox's switch does for Landlock). Release
/// builds ignore it.
fn pretend_missing() -> bool {
    cfg!(debug_assertions)
        && std::env::var("TERN_TEST_KERNEL_WITHOUT")
            .is_ok_and(|v| v.split(',').any(|f| f == "io_uring"))
}

impl Prepared {
    /// Enables the ring on the calling thread, which becomes its only submitter; the
    /// restrictions take effect now.
    pub(super) fn enable(self) -> io::Result<(IoUring, BufRing)> {
        self.ring.submitter().register_enable_rings()?;
        Ok((self.ring, self.bufs))
    }
}
