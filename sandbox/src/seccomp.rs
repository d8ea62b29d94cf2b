//! seccomp: the system calls a running server makes, and nothing else.
//!
//! The filter is an allow-list built with `seccompiler` (Firecracker's BPF compiler). A call
//! outside it does not kill the process: it traps into [`on_sigsys`], which counts it, notes
//! which call it was and makes it return EPERM, the way pledge's EPERM mode degrades a
//! forbidden call into an error the code already handles. A thread polls the count and logs
//! ([`report_denials`]); /statusz and /metrics show it ([`denied_syscalls`]).
//!
//! Calls allowed for every argument are answered from the kernel's per-filter action cache
//! (Linux 5.11+) without running the filter, so the hot path (read, write, epoll_wait,
//! accept4, ...) pays nothing; only the few calls checked by argument (mmap and mprotect
//! without PROT_EXEC, ioctl, prctl, ...) run it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::{Connect, Error};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

/// `(name, number)` pairs, the numbers from [`sys`].
macro_rules! syscalls {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), sys::$name)),*]
    };
}

/// Syscall numbers by bare name, for [`syscalls!`].
#[allow(non_upper_case_globals)]
mod sys {
    macro_rules! numbers {
        ($($name:ident => $sys:ident),* $(,)?) => { $(pub const $name: i64 = libc::$sys;)* };
    }
    numbers! {
        read => SYS_read, write => SYS_write, readv => SYS_readv, writev => SYS_writev,
        pread64 => SYS_pread64, pwrite64 => SYS_pwrite64, preadv => SYS_preadv,
        pwritev => SYS_pwritev, sendfile => SYS_sendfile, recvfrom => SYS_recvfrom,
        sendto => SYS_sendto, recvmsg => SYS_recvmsg, sendmsg => SYS_sendmsg,
        recvmmsg => SYS_recvmmsg,
        shutdown => SYS_shutdown, close => SYS_close, accept4 => SYS_accept4,
        epoll_pwait => SYS_epoll_pwait, epoll_pwait2 => SYS_epoll_pwait2,
        epoll_ctl => SYS_epoll_ctl, epoll_create1 => SYS_epoll_create1, eventfd2 => SYS_eventfd2,
        ppoll => SYS_ppoll, getsockname => SYS_getsockname, getpeername => SYS_getpeername,
        getsockopt => SYS_getsockopt, setsockopt => SYS_setsockopt,
        openat => SYS_openat, openat2 => SYS_openat2, newfstatat => SYS_newfstatat,
        fstat => SYS_fstat, statx => SYS_statx, lseek => SYS_lseek, fsync => SYS_fsync,
        fdatasync => SYS_fdatasync, ftruncate => SYS_ftruncate, fallocate => SYS_fallocate,
        unlinkat => SYS_unlinkat, renameat => SYS_renameat, renameat2 => SYS_renameat2,
        mkdirat => SYS_mkdirat, readlinkat => SYS_readlinkat, getdents64 => SYS_getdents64,
        fcntl => SYS_fcntl, flock => SYS_flock, fchown => SYS_fchown, fchmod => SYS_fchmod,
        faccessat => SYS_faccessat, faccessat2 => SYS_faccessat2, getcwd => SYS_getcwd,
        dup => SYS_dup, dup3 => SYS_dup3, pipe2 => SYS_pipe2, munmap => SYS_munmap,
        mremap => SYS_mremap, madvise => SYS_madvise, brk => SYS_brk, futex => SYS_futex,
        clone3 => SYS_clone3, set_robust_list => SYS_set_robust_list, rseq => SYS_rseq,
        gettid => SYS_gettid, getpid => SYS_getpid, exit => SYS_exit, exit_group => SYS_exit_group,
        sched_yield => SYS_sched_yield, sched_getaffinity => SYS_sched_getaffinity,
        sched_setaffinity => SYS_sched_setaffinity, set_tid_address => SYS_set_tid_address,
        sigaltstack => SYS_sigaltstack, rt_sigaction => SYS_rt_sigaction,
        rt_sigprocmask => SYS_rt_sigprocmask, rt_sigreturn => SYS_rt_sigreturn,
        restart_syscall => SYS_restart_syscall, clock_gettime => SYS_clock_gettime,
        clock_getres => SYS_clock_getres, clock_nanosleep => SYS_clock_nanosleep,
        nanosleep => SYS_nanosleep, gettimeofday => SYS_gettimeofday, getrandom => SYS_getrandom,
        sysinfo => SYS_sysinfo, uname => SYS_uname, setpriority => SYS_setpriority,
        getuid => SYS_getuid, geteuid => SYS_geteuid, getgid => SYS_getgid,
        getegid => SYS_getegid, tgkill => SYS_tgkill, getrusage => SYS_getrusage,
        mmap => SYS_mmap, mprotect => SYS_mprotect, ioctl => SYS_ioctl, prctl => SYS_prctl,
        socketpair => SYS_socketpair, prlimit64 => SYS_prlimit64, clone => SYS_clone,
        membarrier => SYS_membarrier, sched_getparam => SYS_sched_getparam,
        // Not allowed; named so that the log can say what was refused.
        execve => SYS_execve, execveat => SYS_execveat, ptrace => SYS_ptrace,
        socket => SYS_socket, connect => SYS_connect, bind => SYS_bind, listen => SYS_listen,
        kill => SYS_kill, mount => SYS_mount, setuid => SYS_setuid, setgid => SYS_setgid,
        unshare => SYS_unshare, setns => SYS_setns, memfd_create => SYS_memfd_create,
        io_uring_setup => SYS_io_uring_setup, io_uring_enter => SYS_io_uring_enter,
        io_uring_register => SYS_io_uring_register, bpf => SYS_bpf,
        perf_event_open => SYS_perf_event_open, process_vm_readv => SYS_process_vm_readv,
        process_vm_writev => SYS_process_vm_writev, init_module => SYS_init_module,
        finit_module => SYS_finit_module, kexec_load => SYS_kexec_load, reboot => SYS_reboot,
        chroot => SYS_chroot, pivot_root => SYS_pivot_root, keyctl => SYS_keyctl,
        add_key => SYS_add_key, userfaultfd => SYS_userfaultfd, symlinkat => SYS_symlinkat,
        linkat => SYS_linkat, fchownat => SYS_fchownat, fchmodat => SYS_fchmodat,
        personality => SYS_personality, seccomp => SYS_seccomp, chdir => SYS_chdir,
        fchdir => SYS_fchdir, setsid => SYS_setsid, pidfd_open => SYS_pidfd_open,
        wait4 => SYS_wait4, waitid => SYS_waitid, getcpu => SYS_getcpu,
    }
    // x86_64 keeps the old calls that newer architectures only have in their *at forms.
    #[cfg(target_arch = "x86_64")]
    numbers! {
        open => SYS_open, stat => SYS_stat, lstat => SYS_lstat, access => SYS_access,
        unlink => SYS_unlink, rename => SYS_rename, mkdir => SYS_mkdir, readlink => SYS_readlink,
        poll => SYS_poll, epoll_wait => SYS_epoll_wait, dup2 => SYS_dup2, pipe => SYS_pipe,
        arch_prctl => SYS_arch_prctl, fork => SYS_fork, vfork => SYS_vfork, chmod => SYS_chmod,
        chown => SYS_chown, lchown => SYS_lchown, symlink => SYS_symlink, link => SYS_link,
        rmdir => SYS_rmdir,
    }
}

/// Allowed with any arguments: I/O on descriptors already open (sockets, files, epoll),
/// files under the Landlock rules, memory, threads and their synchronisation, time,
/// randomness and signal handling.
const ALLOWED: &[(&str, i64)] = syscalls![
    read,
    write,
    readv,
    writev,
    pread64,
    pwrite64,
    preadv,
    pwritev,
    sendfile,
    recvfrom,
    sendto,
    recvmsg,
    sendmsg,
    // QUIC: a worker's UDP sockets, bound before lockdown, read in batches (quinn-udp; its
    // sends are one sendmsg each, with GSO, and its set-up only setsockopt/getsockopt).
    recvmmsg,
    shutdown,
    close,
    accept4,
    epoll_pwait,
    epoll_pwait2,
    epoll_ctl,
    epoll_create1,
    eventfd2,
    ppoll,
    getsockname,
    getpeername,
    getsockopt,
    setsockopt,
    // Answered ENOSYS by the second filter (`enosys_program`).
    openat2,
    newfstatat,
    fstat,
    statx,
    lseek,
    fsync,
    fdatasync,
    ftruncate,
    fallocate,
    unlinkat,
    renameat,
    renameat2,
    readlinkat,
    getdents64,
    fcntl,
    flock,
    fchown,
    faccessat,
    faccessat2,
    getcwd,
    dup,
    dup3,
    pipe2,
    munmap,
    mremap,
    brk,
    futex,
    // Answered ENOSYS by the second filter (`enosys_program`).
    clone3,
    set_robust_list,
    rseq,
    gettid,
    getpid,
    exit,
    exit_group,
    sched_yield,
    sched_getaffinity,
    set_tid_address,
    sigaltstack,
    rt_sigaction,
    rt_sigprocmask,
    rt_sigreturn,
    restart_syscall,
    clock_gettime,
    clock_getres,
    clock_nanosleep,
    nanosleep,
    gettimeofday,
    getrandom,
    sysinfo,
    uname,
    getuid,
    geteuid,
    getgid,
    getegid,
    getrusage,
    membarrier,
    sched_getparam,
    // Reaping the `nft -i` child started before the sandbox (--ban-nft-set).
    wait4,
    // mimalloc asks which CPU it runs on (its NUMA node) on hosts with several.
    getcpu,
    // A worker's io_uring, made before lockdown: submitting and waiting. What its operations
    // may do is the ring's own allow-list (`runtime/src/io/uring/setup.rs`); seccomp cannot
    // see them.
    io_uring_enter,
];

#[cfg(target_arch = "x86_64")]
const ALLOWED_LEGACY: &[(&str, i64)] =
    syscalls![stat, lstat, access, unlink, rename, rmdir, readlink, poll, epoll_wait, dup2, pipe,];
#[cfg(not(target_arch = "x86_64"))]
const ALLOWED_LEGACY: &[(&str, i64)] = &[];

/// Allowed with the argument checks in [`rules`].
const CHECKED: &[(&str, i64)] = syscalls![
    mmap,
    mprotect,
    ioctl,
    prctl,
    socketpair,
    prlimit64,
    clone,
    openat,
    mkdirat,
    fchmod,
    madvise,
    tgkill,
    sched_setaffinity,
    setpriority,
    io_uring_register,
];
#[cfg(target_arch = "x86_64")]
const CHECKED_LEGACY: &[(&str, i64)] = syscalls![open, mkdir];
#[cfg(not(target_arch = "x86_64"))]
const CHECKED_LEGACY: &[(&str, i64)] = &[];

/// Allowed by the main filter, answered ENOSYS by [`enosys_program`].
const ANSWERED_ENOSYS: &[(&str, i64)] = syscalls![clone3, openat2];

/// Named only for the log line of a refused call.
const REFUSED_NAMES: &[(&str, i64)] = syscalls![
    execve,
    execveat,
    ptrace,
    socket,
    connect,
    bind,
    listen,
    kill,
    mount,
    setuid,
    setgid,
    unshare,
    setns,
    memfd_create,
    io_uring_setup,
    bpf,
    perf_event_open,
    process_vm_readv,
    process_vm_writev,
    init_module,
    finit_module,
    kexec_load,
    reboot,
    chroot,
    pivot_root,
    keyctl,
    add_key,
    userfaultfd,
    symlinkat,
    linkat,
    fchownat,
    fchmodat,
    personality,
    seccomp,
    chdir,
    fchdir,
    setsid,
    pidfd_open,
    waitid,
];
#[cfg(target_arch = "x86_64")]
const REFUSED_NAMES_LEGACY: &[(&str, i64)] =
    syscalls![fork, vfork, chmod, chown, lchown, symlink, link, arch_prctl];
#[cfg(not(target_arch = "x86_64"))]
const REFUSED_NAMES_LEGACY: &[(&str, i64)] = &[];

/// The name of a system call this module knows, for log lines.
pub fn syscall_name(nr: i64) -> Option<&'static str> {
    [
        ALLOWED,
        ALLOWED_LEGACY,
        CHECKED,
        CHECKED_LEGACY,
        REFUSED_NAMES,
        REFUSED_NAMES_LEGACY,
    ]
    .iter()
    .flat_map(|t| t.iter())
    .find(|(_, n)| *n == nr)
    .map(|(name, _)| *name)
}

pub(crate) fn unsupported(why: String) -> Error {
    Error::Unsupported {
        part: "seccomp",
        why,
    }
}

fn failed(why: String) -> Error {
    Error::Failed {
        part: "seccomp",
        why,
    }
}

fn cond(arg: u8, len: Len, op: Op, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, len, op, value).expect("argument index below 6")
}

fn one_of(arg: u8, values: &[u64]) -> Vec<SeccompRule> {
    values
        .iter()
        .map(|&v| SeccompRule::new(vec![cond(arg, Len::Dword, Op::Eq, v)]).expect("a condition"))
        .collect()
}

/// The filter's rules: every allowed call, the argument-checked ones with their conditions.
/// `connect`: the reverse proxy's upstreams, which decide which sockets the workers may make.
fn rules(connect: &Connect) -> BTreeMap<i64, Vec<SeccompRule>> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = ALLOWED
        .iter()
        .chain(ALLOWED_LEGACY)
        .map(|&(_, nr)| (nr, Vec::new()))
        .collect();
    let no_exec = || {
        let prot_exec = libc::PROT_EXEC as u64;
        vec![SeccompRule::new(vec![cond(2, Len::Dword, Op::MaskedEq(prot_exec), 0)]).unwrap()]
    };
    // Memory, but never executable: no code can be written and then run.
    rules.insert(libc::SYS_mmap, no_exec());
    rules.insert(libc::SYS_mprotect, no_exec());
    // ioctl: unsent bytes (SIOCOUTQ), non-blocking mode, bytes readable. (The requests are
    // c_ulong, which is u64 only on 64-bit targets.)
    #[allow(clippy::unnecessary_cast)]
    rules.insert(
        libc::SYS_ioctl,
        one_of(
            1,
            &[
                libc::TIOCOUTQ as u64,
                libc::FIONBIO as u64,
                libc::FIONREAD as u64,
            ],
        ),
    );
    // prctl: thread names, and mimalloc naming its mappings (PR_SET_VMA).
    const PR_SET_VMA: u64 = 0x53564d41;
    rules.insert(
        libc::SYS_prctl,
        one_of(
            0,
            &[
                libc::PR_SET_NAME as u64,
                libc::PR_GET_NAME as u64,
                PR_SET_VMA,
            ],
        ),
    );
    // Files and folders, but never setuid, setgid or sticky: a server that stays root must
    // not leave a setuid-root program behind in the folders it may write.
    let plain_mode = |arg: u8| {
        vec![SeccompRule::new(vec![cond(arg, Len::Dword, Op::MaskedEq(0o7000), 0)]).unwrap()]
    };
    rules.insert(libc::SYS_openat, plain_mode(3));
    rules.insert(libc::SYS_mkdirat, plain_mode(2));
    rules.insert(libc::SYS_fchmod, plain_mode(1));
    #[cfg(target_arch = "x86_64")]
    {
        rules.insert(libc::SYS_open, plain_mode(2));
        rules.insert(libc::SYS_mkdir, plain_mode(1));
    }
    // madvise: what allocators, thread stacks and aws-lc use; not HWPOISON, SOFT_OFFLINE,
    // REMOVE.
    rules.insert(
        libc::SYS_madvise,
        one_of(
            2,
            &[
                libc::MADV_NORMAL,
                libc::MADV_RANDOM,
                libc::MADV_SEQUENTIAL,
                libc::MADV_WILLNEED,
                libc::MADV_DONTNEED,
                libc::MADV_FREE,
                libc::MADV_HUGEPAGE,
                libc::MADV_NOHUGEPAGE,
                libc::MADV_DONTDUMP,
                libc::MADV_DODUMP,
                libc::MADV_COLD,
                libc::MADV_PAGEOUT,
                // aws-lc keeps its random generator's state out of forked children: it first
                // probes with an invalid advice (-1, which the kernel answers EINVAL), then
                // asks for MADV_WIPEONFORK.
                libc::MADV_WIPEONFORK,
                libc::MADV_KEEPONFORK,
                -1,
            ]
            .map(|v| v as u32 as u64),
        ),
    );
    // Signals only to this process's own threads; affinity and priority only for our own
    // threads (0 = the caller) and only downwards (nice 0..19).
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u64;
    rules.insert(libc::SYS_tgkill, one_of(0, &[pid]));
    rules.insert(libc::SYS_sched_setaffinity, one_of(0, &[0]));
    rules.insert(
        libc::SYS_setpriority,
        vec![SeccompRule::new(vec![
            cond(0, Len::Dword, Op::Eq, libc::PRIO_PROCESS as u64),
            cond(2, Len::Dword, Op::Le, 19),
        ])
        .unwrap()],
    );

    // io_uring_register: only to enable a ring made (and restricted) before lockdown, by the
    // worker that will submit to it. No new restrictions, personalities (which would carry
    // pre-sandbox credentials), buffers, files or io-wq settings.
    const IORING_REGISTER_ENABLE_RINGS: u64 = 12;
    rules.insert(
        libc::SYS_io_uring_register,
        one_of(1, &[IORING_REGISTER_ENABLE_RINGS]),
    );
    // socketpair: a Unix pair (the signal thread's wake-up), never a network socket.
    rules.insert(libc::SYS_socketpair, one_of(0, &[libc::AF_UNIX as u64]));
    // socket: stream sockets of the families the upstreams need, nothing else: IPv4 and IPv6
    // for TCP upstreams (Landlock then limits their ports), Unix only for `unix:` upstreams,
    // since Landlock before ABI 9 cannot limit which Unix socket is connected to. The type's
    // flag bits (non-blocking, close-on-exec) are masked off; the protocol must be TCP (0 is
    // TCP for a stream socket), not SCTP or MPTCP, which Landlock's TCP rules do not cover.
    let stream = libc::SOCK_STREAM as u64;
    let type_mask = !((libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as u64) & 0xffff_ffff;
    let stream_socket = |family: libc::c_int, protocol: libc::c_int| {
        SeccompRule::new(vec![
            cond(0, Len::Dword, Op::Eq, family as u64),
            cond(1, Len::Dword, Op::MaskedEq(type_mask), stream),
            cond(2, Len::Dword, Op::Eq, protocol as u64),
        ])
        .expect("a condition")
    };
    let mut socket_rules = Vec::new();
    if connect.tcp() {
        for family in [libc::AF_INET, libc::AF_INET6] {
            socket_rules.push(stream_socket(family, 0));
            socket_rules.push(stream_socket(family, libc::IPPROTO_TCP));
        }
        // MSG_FASTOPEN connects a fresh TCP socket inside sendto/sendmsg, where Landlock's
        // connect check never runs (landlock-lsm/linux#41): refused wherever TCP sockets can
        // be made. (This takes both calls out of the kernel's allow cache in proxy setups.)
        let no_fast_open = |arg: u8| {
            let fast_open = libc::MSG_FASTOPEN as u32 as u64;
            vec![SeccompRule::new(vec![cond(arg, Len::Dword, Op::MaskedEq(fast_open), 0)]).unwrap()]
        };
        rules.insert(libc::SYS_sendto, no_fast_open(3));
        rules.insert(libc::SYS_sendmsg, no_fast_open(2));
    }
    if connect.unix() {
        socket_rules.push(stream_socket(libc::AF_UNIX, 0));
    }
    if connect.any() {
        rules.insert(libc::SYS_socket, socket_rules);
        rules.insert(libc::SYS_connect, Vec::new());
    }
    // prlimit64: read a limit, never raise one.
    rules.insert(
        libc::SYS_prlimit64,
        vec![SeccompRule::new(vec![cond(2, Len::Qword, Op::Eq, 0)]).unwrap()],
    );
    // clone: threads only (glibc falls back to it where clone3 is missing).
    let thread = libc::CLONE_THREAD as u64;
    rules.insert(
        libc::SYS_clone,
        vec![SeccompRule::new(vec![cond(0, Len::Qword, Op::MaskedEq(thread), thread)]).unwrap()],
    );
    rules
}

fn target_arch() -> Result<TargetArch, Error> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|_| unsupported(format!("no filter for {}", std::env::consts::ARCH)))
}

/// Calls whose arguments sit in a struct seccomp cannot read, answered ENOSYS (as on kernels
/// before them), so that the caller falls back to an older call whose arguments the main
/// filter checks: `clone3` (its flags could make processes, not just threads; glibc falls
/// back to `clone`, checked for `CLONE_THREAD`) and `openat2` (its mode could be setuid;
/// static files fall back to `openat` one folder at a time, `openat`'s mode is checked). A
/// second filter: seccompiler gives one filter one action for matches, and ERRNO outranks
/// ALLOW when filters disagree (the main filter allows both).
pub fn enosys_program() -> Result<BpfProgram, Error> {
    let rules = ANSWERED_ENOSYS
        .iter()
        .map(|&(_, nr)| (nr, Vec::new()))
        .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        target_arch()?,
    )
    .map_err(|e| failed(e.to_string()))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| failed(e.to_string()))
}

/// Compiles the filter (separately from installing it, so that tests can check it).
pub fn program(connect: &Connect) -> Result<BpfProgram, Error> {
    let filter = SeccompFilter::new(
        rules(connect),
        SeccompAction::Trap,
        SeccompAction::Allow,
        target_arch()?,
    )
    .map_err(|e| failed(e.to_string()))?;
    filter
        .try_into()
        .map_err(|e: seccompiler::BackendError| failed(e.to_string()))
}

/// Refusals by system call number (numbers past the table share its last slot).
static DENIED_BY_NR: [AtomicU64; 512] = [const { AtomicU64::new(0) }; 512];

/// System calls refused with EPERM since start-up.
pub fn denied_syscalls() -> u64 {
    DENIED_BY_NR.iter().map(|c| c.load(Ordering::Relaxed)).sum()
}

/// `(number, count)` of each refused system call (the last slot gathers numbers ≥ 511).
fn denied_by_nr() -> Vec<(usize, u64)> {
    DENIED_BY_NR
        .iter()
        .enumerate()
        .map(|(nr, c)| (nr, c.load(Ordering::Relaxed)))
        .filter(|&(_, n)| n > 0)
        .collect()
}

/// The `siginfo_t` of a SIGSYS (`_sigsys` in the kernel's union), which the libc crate does
/// not expose: signo, errno, code, padding to the 8-byte aligned union, then the union.
#[repr(C)]
struct SigsysInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    _pad: libc::c_int,
    call_addr: *mut libc::c_void,
    syscall: libc::c_int,
    arch: libc::c_uint,
}

/// `si_code` of a SIGSYS raised by a seccomp filter (not in the libc crate).
const SYS_SECCOMP: libc::c_int = 1;

/// The SIGSYS handler: count, remember, return EPERM. Only async-signal-safe work (atomics
/// and the saved registers).
extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers; its first fields
    // are the same for every signal, and for a seccomp trap (code SYS_SECCOMP) its union
    // holds the `_sigsys` member laid out as `SigsysInfo`.
    let info = unsafe { &*(info as *const SigsysInfo) };
    if info.code != SYS_SECCOMP {
        // Sent by kill/tgkill/sigqueue, not by our filter: there is no system call to
        // answer, and the interrupted registers must stay as they are.
        return;
    }
    let nr = info.syscall;
    let slot = (nr.max(0) as usize).min(DENIED_BY_NR.len() - 1);
    DENIED_BY_NR[slot].fetch_add(1, Ordering::Relaxed);
    // SAFETY: `context` is the interrupted thread's ucontext_t, which the kernel restores on
    // return from the handler; the register written is the syscall's return value.
    unsafe { set_return_value(context, -(libc::EPERM as i64)) };
    if cfg!(debug_assertions) {
        // Debug builds (the test suite) also say so at once on stderr, so that a test that
        // ends a moment later still sees it; release builds leave it to `report_denials`.
        trace_refusal(nr as i64);
    }
}

/// `tern: sandbox: refused NAME (NR) with EPERM` on stderr, built on the stack and written
/// with one write(2): both async-signal-safe.
fn trace_refusal(nr: i64) {
    let mut line = [0u8; 96];
    let mut len = 0;
    let mut put = |bytes: &[u8]| {
        let n = bytes.len().min(line.len() - len);
        line[len..len + n].copy_from_slice(&bytes[..n]);
        len += n;
    };
    put(b"tern: sandbox: refused ");
    put(syscall_name(nr).unwrap_or("?").as_bytes());
    put(b" (");
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = nr.unsigned_abs();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    put(&digits[i..]);
    put(b") with EPERM\n");
    // SAFETY: writes `len` initialised bytes of a stack buffer to stderr.
    unsafe { libc::write(2, line.as_ptr().cast(), len) };
}

/// Sets the return value of the system call a SIGSYS interrupted: the register the thread
/// reads it from once the handler returns.
///
/// # Safety
///
/// `context` must be the `ucontext_t` the kernel passed to this SIGSYS handler (valid,
/// aligned, and not used elsewhere while the handler runs).
#[cfg(target_arch = "x86_64")]
unsafe fn set_return_value(context: *mut libc::c_void, value: i64) {
    let uc = context as *mut libc::ucontext_t;
    // SAFETY: the caller passes the handler's own ucontext_t; RAX holds the return value.
    unsafe { (*uc).uc_mcontext.gregs[libc::REG_RAX as usize] = value };
}

/// Sets the return value of the system call a SIGSYS interrupted: the register the thread
/// reads it from once the handler returns.
///
/// # Safety
///
/// `context` must be the `ucontext_t` the kernel passed to this SIGSYS handler (valid,
/// aligned, and not used elsewhere while the handler runs).
#[cfg(target_arch = "aarch64")]
unsafe fn set_return_value(context: *mut libc::c_void, value: i64) {
    let uc = context as *mut libc::ucontext_t;
    // SAFETY: the caller passes the handler's own ucontext_t; x0 holds the return value.
    unsafe { (*uc).uc_mcontext.regs[0] = value as u64 };
}

fn install_handler() -> Result<(), Error> {
    // SAFETY: a zeroed sigaction is valid; the handler only touches atomics and the
    // interrupted context, both async-signal-safe.
    let rc = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigsys as *const () as usize;
        // SA_RESTART: a SIGSYS sent from outside must not fail a blocking call with EINTR.
        action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut())
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(failed(format!(
            "cannot handle SIGSYS: {}",
            std::io::Error::last_os_error()
        )))
    }
}

/// Installs the SIGSYS handler and the filter, on every thread of the process.
pub fn install(connect: &Connect) -> Result<(), Error> {
    if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        return Err(unsupported(format!(
            "EPERM mode is not written for {}",
            std::env::consts::ARCH
        )));
    }
    // SAFETY: prctl(PR_GET_SECCOMP) only reads the calling thread's mode.
    if unsafe { libc::prctl(libc::PR_GET_SECCOMP) } < 0 {
        return Err(unsupported("not supported by this kernel".into()));
    }
    let program = program(connect)?;
    let enosys = enosys_program()?;
    install_handler()?;
    let apply = |p: &BpfProgram| {
        seccompiler::apply_filter_all_threads(p).map_err(|e| match e {
            seccompiler::Error::Seccomp(io) if io.raw_os_error() == Some(libc::EINVAL) => {
                unsupported(format!("filters not supported by this kernel ({io})"))
            }
            other => failed(other.to_string()),
        })
    };
    apply(&enosys)?;
    apply(&program)
}

/// Logs refused calls until `stopped()`: at once when a system call is refused for the first
/// time, repeats at most once per `EVERY`, and a last line at the end if any refusal is still
/// unreported. Runs on a thread of its own (polling every 100 ms).
pub fn report_denials(stopped: impl Fn() -> bool) {
    const EVERY: Duration = Duration::from_secs(5);
    let mut reported: Vec<(usize, u64)> = Vec::new();
    let mut last_line: Option<Instant> = None;
    loop {
        let done = stopped();
        let now = denied_by_nr();
        if now != reported {
            let new_call = now
                .iter()
                .any(|(nr, _)| !reported.iter().any(|(r, _)| r == nr));
            let due = last_line.is_none_or(|t| t.elapsed() >= EVERY);
            if new_call || due || done {
                tracing::warn!(
                    "sandbox: refused system calls with EPERM since start-up: {}",
                    describe_denials(&now)
                );
                reported = now;
                last_line = Some(Instant::now());
            }
        }
        if done {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `execve (59) ×2, wait4 (61) ×1`.
fn describe_denials(denied: &[(usize, u64)]) -> String {
    let list: Vec<String> = denied
        .iter()
        .map(|&(nr, n)| match syscall_name(nr as i64) {
            Some(name) => format!("{name} ({nr}) ×{n}"),
            None => format!("#{nr} ×{n}"),
        })
        .collect();
    list.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp_upstream() -> Connect {
        Connect {
            tcp_ports: vec![8080],
            ..Connect::default()
        }
    }

    fn unix_upstream() -> Connect {
        Connect {
            unix_folders: vec!["/run/app".into()],
            ..Connect::default()
        }
    }

    #[test]
    fn the_filter_compiles_and_allows_what_a_server_needs() {
        let closed = program(&Connect::default()).unwrap();
        assert!(
            closed.len() > ALLOWED.len(),
            "{} instructions",
            closed.len()
        );
        assert!(program(&tcp_upstream()).unwrap().len() > closed.len());
        assert!(rules(&tcp_upstream()).contains_key(&libc::SYS_connect));
        assert!(rules(&unix_upstream()).contains_key(&libc::SYS_connect));
        let rules = rules(&Connect::default());
        for (name, nr) in ALLOWED.iter().chain(ALLOWED_LEGACY) {
            assert!(rules.contains_key(nr), "{name}");
        }
        for forbidden in [
            "execve", "ptrace", "socket", "connect", "bind", "kill", "mount",
        ] {
            let nr = REFUSED_NAMES
                .iter()
                .find(|(n, _)| *n == forbidden)
                .unwrap()
                .1;
            assert!(!rules.contains_key(&nr), "{forbidden} must not be allowed");
        }
    }

    #[test]
    fn refusals_are_described_by_name_and_count() {
        let list = [(libc::SYS_execve as usize, 2), (511, 1)];
        assert_eq!(
            describe_denials(&list),
            format!("execve ({}) ×2, #511 ×1", libc::SYS_execve)
        );
    }

    #[test]
    fn names_come_from_the_tables() {
        assert_eq!(syscall_name(libc::SYS_execve), Some("execve"));
        assert_eq!(syscall_name(libc::SYS_read), Some("read"));
        assert_eq!(syscall_name(-5), None);
    }

    /// The filter and its EPERM trap, in a child process (a filter cannot be taken back):
    /// allowed calls work, a forbidden one returns EPERM and is counted, an executable
    /// mapping is refused, and the process lives on.
    #[test]
    fn in_a_child_forbidden_calls_fail_with_eperm_and_are_counted() {
        in_a_child(child_checks);
    }

    /// With TCP upstreams: IPv4 and IPv6 stream sockets open and connect; a Unix socket, a
    /// datagram or SCTP socket and a TCP Fast Open connect (which Landlock would not see)
    /// are refused.
    #[test]
    fn in_a_child_tcp_upstreams_allow_tcp_stream_sockets_only() {
        in_a_child(tcp_child_checks);
    }

    /// With only `unix:` upstreams: Unix stream sockets open and connect, IPv4 and IPv6
    /// sockets are refused.
    #[test]
    fn in_a_child_unix_upstreams_allow_unix_stream_sockets_only() {
        in_a_child(unix_child_checks);
    }

    /// A worker's UDP sockets, bound before lockdown, work after it through quinn-udp: its
    /// set-up (setsockopt, getsockopt), recvmmsg, sendmsg with GSO, ECN and a source address;
    /// also with TCP upstreams, which put sendmsg under an argument check. A new UDP socket
    /// is still refused.
    #[test]
    fn in_a_child_udp_sockets_made_before_lockdown_send_and_receive() {
        in_a_child(|| udp_child_checks(&Connect::default()));
        in_a_child(|| udp_child_checks(&tcp_upstream()));
    }

    /// Runs `checks` in a forked child (a filter cannot be taken back) and asserts it
    /// returned 0 (else the number of its first failing check).
    fn in_a_child(checks: fn() -> i32) {
        // SAFETY: fork in a test process; the child only makes system calls and exits with
        // _exit, never returning into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let code = checks();
            // SAFETY: ends the forked child without running the harness's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child died: status {status}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "child check failed (see its code)"
        );
    }

    fn tcp_child_checks() -> i32 {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // SAFETY: plain system calls on values owned here (the whole block).
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return 10;
            }
            if install(&tcp_upstream()).is_err() {
                return 11;
            }
            let eperm = || *libc::__errno_location() == libc::EPERM;
            let flags = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
            for family in [libc::AF_INET, libc::AF_INET6] {
                let fd = libc::socket(family, flags, 0);
                if fd < 0 {
                    return 12;
                }
                libc::close(fd);
            }
            if libc::socket(libc::AF_UNIX, flags, 0) != -1 || !eperm() {
                return 13;
            }
            if libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) != -1 || !eperm() {
                return 14;
            }
            if libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, 0) != -1 || !eperm() {
                return 15;
            }
            if libc::socket(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_SCTP) != -1 || !eperm()
            {
                return 16;
            }
            // TCP Fast Open: sendto connects the fresh socket itself.
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            if fd < 0 {
                return 17;
            }
            let mut to: libc::sockaddr_in = std::mem::zeroed();
            to.sin_family = libc::AF_INET as libc::sa_family_t;
            to.sin_port = addr.port().to_be();
            to.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let sent = libc::sendto(
                fd,
                b"x".as_ptr().cast(),
                1,
                libc::MSG_FASTOPEN,
                (&to as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            );
            if sent != -1 || !eperm() {
                return 18;
            }
            libc::close(fd);
        }
        // A real connection through std (socket, connect, then send and recv).
        let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
            return 19;
        };
        let (mut accepted, _) = listener.accept().unwrap();
        if stream.write_all(b"ping").is_err() {
            return 20;
        }
        let mut got = [0u8; 4];
        if accepted.read_exact(&mut got).is_err() || &got != b"ping" {
            return 21;
        }
        0
    }

    fn udp_child_checks(connect: &Connect) -> i32 {
        use quinn_udp::{EcnCodepoint, RecvMeta, Transmit, UdpSocketState};
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (server_addr, client_addr) =
            (server.local_addr().unwrap(), client.local_addr().unwrap());
        // SAFETY: prctl takes no pointers.
        if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
            return 10;
        }
        if install(connect).is_err() {
            return 11;
        }
        let before = denied_syscalls();
        // A worker sets its sockets up on its own thread, after lockdown.
        let (Ok(server_state), Ok(client_state)) = (
            UdpSocketState::new((&server).into()),
            UdpSocketState::new((&client).into()),
        ) else {
            return 12;
        };
        let contents = b"aaabbbcc";
        let sent = Transmit {
            destination: server_addr,
            ecn: Some(EcnCodepoint::Ect0),
            contents,
            segment_size: (client_state.max_gso_segments() > 1).then_some(3),
            src_ip: Some(client_addr.ip()),
        };
        if client_state.try_send((&client).into(), &sent).is_err() {
            return 13;
        }
        // With GRO the segments may arrive in one buffer; without, one buffer each.
        let mut storage = [[0u8; 64]; 4];
        let mut meta = [RecvMeta::default(); 4];
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < contents.len() {
            let mut bufs = storage.each_mut().map(|b| std::io::IoSliceMut::new(b));
            match server_state.recv((&server).into(), &mut bufs, &mut meta) {
                Ok(n) => {
                    for (m, buf) in meta.iter().zip(&bufs).take(n) {
                        if m.addr != client_addr || m.dst_ip != Some(server_addr.ip()) {
                            return 14;
                        }
                        got.extend_from_slice(&buf[..m.len]);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return 15;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return 16,
            }
        }
        if got != contents {
            return 17;
        }
        // SAFETY: socket takes no pointers; errno is this thread's.
        unsafe {
            if libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) != -1
                || *libc::__errno_location() != libc::EPERM
            {
                return 18;
            }
        }
        if denied_syscalls() != before + 1 {
            return 19;
        }
        0
    }

    fn unix_child_checks() -> i32 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("app.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        // SAFETY: plain system calls on values owned here (the whole block).
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return 10;
            }
            if install(&unix_upstream()).is_err() {
                return 11;
            }
            let eperm = || *libc::__errno_location() == libc::EPERM;
            for family in [libc::AF_INET, libc::AF_INET6] {
                if libc::socket(family, libc::SOCK_STREAM, 0) != -1 || !eperm() {
                    return 12;
                }
            }
            if libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0) != -1 || !eperm() {
                return 13;
            }
        }
        if std::os::unix::net::UnixStream::connect(&path).is_err() {
            return 14;
        }
        0
    }

    /// Returns 0 when every check passed, else the number of the first failing one.
    fn child_checks() -> i32 {
        // SAFETY: plain system calls on values owned here (the whole function).
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return 10;
            }
            if install(&Connect::default()).is_err() {
                return 11;
            }
            // Allowed: getpid, a read-write mapping.
            if libc::getpid() <= 0 {
                return 12;
            }
            let rw = libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if rw == libc::MAP_FAILED {
                return 13;
            }
            // Refused with EPERM: a new socket, an executable mapping, ptrace, a setuid file.
            let before = denied_syscalls();
            let eperm = || *libc::__errno_location() == libc::EPERM;
            if libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) != -1 || !eperm() {
                return 14;
            }
            if libc::mprotect(rw, 4096, libc::PROT_READ | libc::PROT_EXEC) != -1 || !eperm() {
                return 15;
            }
            if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) != -1 || !eperm() {
                return 16;
            }
            let path = c"/nonexistent-tern-test/setuid";
            let flags = libc::O_CREAT | libc::O_WRONLY;
            if libc::openat(libc::AT_FDCWD, path.as_ptr(), flags, 0o4755) != -1 || !eperm() {
                return 19;
            }
            if denied_syscalls() != before + 4 {
                return 17;
            }
            // clone3 says ENOSYS (glibc then uses clone, checked for CLONE_THREAD).
            if libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0) != -1
                || *libc::__errno_location() != libc::ENOSYS
            {
                return 20;
            }
            // So does openat2, whose mode (here setuid) seccomp cannot read.
            let mut how: libc::open_how = std::mem::zeroed();
            how.flags = (libc::O_CREAT | libc::O_WRONLY) as u64;
            how.mode = 0o4755;
            let opened = libc::syscall(
                libc::SYS_openat2,
                libc::AT_FDCWD,
                path.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            );
            if opened != -1 || *libc::__errno_location() != libc::ENOSYS {
                return 24;
            }
            // No new io_uring after lockdown (a worker's ring is made before), and a ring
            // may only be enabled: registering anything else (here buffers) is refused.
            let mut params = [0u8; 120]; // struct io_uring_params
            if libc::syscall(libc::SYS_io_uring_setup, 8, params.as_mut_ptr()) != -1 || !eperm() {
                return 25;
            }
            let null = std::ptr::null::<u8>();
            if libc::syscall(libc::SYS_io_uring_register, -1, 0, null, 0) != -1 || !eperm() {
                return 26;
            }
            // Enabling passes the filter (and fails in the kernel, EINVAL or EBADF: there is
            // no such ring).
            if libc::syscall(libc::SYS_io_uring_register, -1, 12, null, 0) != -1 || eperm() {
                return 27;
            }
            // A SIGSYS sent by a process, not by the filter, changes nothing.
            let pid = libc::getpid();
            if libc::syscall(libc::SYS_tgkill, pid, libc::gettid(), libc::SIGSYS) != 0 {
                return 21;
            }
            if denied_syscalls() != before + 6 {
                return 22;
            }
            // A thread can still start and finish.
            if std::thread::spawn(|| 7).join().ok() != Some(7) {
                return 23;
            }
            let ptrace = libc::SYS_ptrace as usize;
            if !denied_by_nr().contains(&(ptrace, 1)) {
                return 18;
            }
            0
        }
    }
}
