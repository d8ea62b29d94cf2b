//! What the `--sync full` hand-off costs (worker → claim-syncer → worker), next to a plain
//! futex ping-pong measured the same way (issues 22 and 45):
//!
//! ```text
//! cargo run --release -p tern-ipv4-games --example handoff [-- --seconds S]
//! ```
//!
//! Every case runs two threads for S seconds (default 2, after a short warm-up) and counts
//! round trips; a round trip is two switches (one to each thread), and the kernel's own count
//! of context switches of both threads (voluntary and not, from /proc) is shown beside it to
//! check that.
//!
//! On one CPU (CPU 0, as bench/run pins `tern demo`):
//! - futex ping-pong: a token passed back and forth with `thread::park`/`unpark` (a futex
//!   wait and wake each way), and with a `Mutex` + `Condvar` (what the worker uses to wake the
//!   syncer).
//! - the kernel as the syncer: a write and an io_uring fsync of it, waited for on the one
//!   thread (io_uring runs a blocking fsync on an io-wq thread of its own): what a worker
//!   that synced through io_uring, with no syncer thread of tern's, would pay per turn.
//! - tern's `--sync full` path, for 1, 10 and 50 claims per turn: a "worker" thread calls the
//!   real `JournalStore::commit` with the turn's claims (fresh addresses: each is written),
//!   then sleeps in `epoll_wait` until the answers arrive (`TestReplies::wait`, the wake-up a
//!   worker gets); the syncer thread runs the real `JournalStore::run_syncer`: one
//!   `fdatasync`, then `complete_all` (one eventfd wake for the batch). The journal is on
//!   /dev/shm, so the fdatasync costs next to nothing and what is measured is the hand-off.
//! - the same turns with `--sync normal`, on one thread: the answers come back from
//!   `commit` in the same turn, with no hand-off and no wake-up at all. The difference per
//!   turn is the hand-off's cost.
//!
//! On two CPUs (worker on CPU 0, syncer on CPU 1: a machine where the game is not pinned to
//! one core), one claim per turn: the syncer sleeping as soon as it is out of work against
//! watching for the next turn first for 10, 50 or 200 µs (`JournalOptions::sync_spin`; a
//! worker handing over a turn to a watching syncer wakes no one), beside a futex ping-pong
//! across the same two CPUs.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tern_ipv4_games::land::Land;
use tern_ipv4_games::store::journal::{JournalOptions, JournalStore};
use tern_ipv4_games::store::{ClaimStore, Staged, SyncMode};
use tern_ipv4_games::AnswerKind;
use tern_server::testing::TestReplies;
use tern_server::{Pending, Response, StopSignal};

const K: u32 = 0x9E37_79B1; // bench/lua/claims.lua's address walk
const WARM_UP: Duration = Duration::from_millis(200);

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity(0 = this
    // thread) only read and write that local set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        let r = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        assert_eq!(
            r,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
}

fn gettid() -> i32 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::gettid() }
}

/// Context switches of thread `tid` of this process so far (voluntary + involuntary).
fn switches(tid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
        .expect("/proc/self/task/TID/status");
    status
        .lines()
        .filter(|l| {
            l.starts_with("voluntary_ctxt_switches") || l.starts_with("nonvoluntary_ctxt_switches")
        })
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// What one case measured.
struct Measured {
    round_trips: u64,
    seconds: f64,
    /// Switches of both threads over the measured time, as the kernel counted them.
    counted: u64,
}

impl Measured {
    fn per_second(&self) -> f64 {
        self.round_trips as f64 / self.seconds
    }
    fn us_per_round_trip(&self) -> f64 {
        self.seconds * 1e6 / self.round_trips as f64
    }
    fn counted_per_round_trip(&self) -> f64 {
        self.counted as f64 / self.round_trips as f64
    }
}

/// Runs `step` (one round trip) on a thread pinned to CPU 0 for `seconds` after a warm-up;
/// `other` is the partner thread's id (0: none) whose switches count too.
fn timed(seconds: f64, other: &AtomicU32, mut step: impl FnMut()) -> Measured {
    let warm = Instant::now();
    while warm.elapsed() < WARM_UP {
        step();
    }
    let me = gettid();
    let partner = other.load(Ordering::Acquire) as i32;
    let count = || switches(me) + if partner != 0 { switches(partner) } else { 0 };
    let before = count();
    let started = Instant::now();
    let limit = Duration::from_secs_f64(seconds);
    let mut round_trips = 0;
    while started.elapsed() < limit {
        step();
        round_trips += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    Measured {
        round_trips,
        seconds,
        counted: count() - before,
    }
}

/// The token passed with park/unpark: each side waits in `park` (a futex wait) until the
/// other has flipped `turn` to it and unparked it (a futex wake).
fn park_ping_pong(seconds: f64, partner_cpu: usize) -> Measured {
    let turn = Arc::new(AtomicU32::new(0)); // 0: the pinger's, 1: the ponger's
    let done = Arc::new(AtomicBool::new(false));
    let tid = Arc::new(AtomicU32::new(0));
    let pinger = std::thread::current();
    let ponger = {
        let (turn, done, tid) = (turn.clone(), done.clone(), tid.clone());
        std::thread::spawn(move || {
            pin_to(partner_cpu);
            tid.store(gettid() as u32, Ordering::Release);
            while !done.load(Ordering::Acquire) {
                if turn.load(Ordering::Acquire) == 1 {
                    turn.store(0, Ordering::Release);
                    pinger.unpark();
                } else {
                    std::thread::park_timeout(Duration::from_millis(50));
                }
            }
        })
    };
    while tid.load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    let ponger_thread = ponger.thread().clone();
    let m = timed(seconds, &tid, || {
        turn.store(1, Ordering::Release);
        ponger_thread.unpark();
        while turn.load(Ordering::Acquire) != 0 {
            std::thread::park();
        }
    });
    done.store(true, Ordering::Release);
    ponger_thread.unpark();
    ponger.join().unwrap();
    m
}

/// The token passed with a Mutex and a Condvar per direction, notified after the lock is
/// released (as the worker wakes the syncer: otherwise the woken thread would block again at
/// once on the mutex its waker still holds).
fn condvar_ping_pong(seconds: f64) -> Measured {
    struct Shared {
        turn: Mutex<(u32, bool)>, // (whose turn: 0 pinger, 1 ponger; done)
        to_ponger: Condvar,
        to_pinger: Condvar,
    }
    let s = Arc::new(Shared {
        turn: Mutex::new((0, false)),
        to_ponger: Condvar::new(),
        to_pinger: Condvar::new(),
    });
    let tid = Arc::new(AtomicU32::new(0));
    let ponger = {
        let (s, tid) = (s.clone(), tid.clone());
        std::thread::spawn(move || {
            pin_to(0);
            tid.store(gettid() as u32, Ordering::Release);
            loop {
                let mut g = s.turn.lock().unwrap();
                while g.0 != 1 && !g.1 {
                    g = s.to_ponger.wait(g).unwrap();
                }
                if g.1 {
                    return;
                }
                g.0 = 0;
                drop(g);
                s.to_pinger.notify_one();
            }
        })
    };
    while tid.load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    let m = timed(seconds, &tid, || {
        s.turn.lock().unwrap().0 = 1;
        s.to_ponger.notify_one();
        let mut g = s.turn.lock().unwrap();
        while g.0 != 0 {
            g = s.to_pinger.wait(g).unwrap();
        }
    });
    s.turn.lock().unwrap().1 = true;
    s.to_ponger.notify_one();
    ponger.join().unwrap();
    m
}

/// A store over a fresh journal on /dev/shm; `spin`: the syncer's (`JournalOptions::sync_spin`).
fn store(sync: SyncMode, spin: Option<Duration>) -> (tempfile::TempDir, Land, Arc<JournalStore>) {
    let dir = tempfile::Builder::new()
        .prefix("tern-handoff-")
        .tempdir_in("/dev/shm")
        .expect("a folder on /dev/shm");
    let land = Land::new();
    let options = JournalOptions {
        sync_spin: spin,
        ..JournalOptions::new(dir.path(), sync)
    };
    let store = JournalStore::open(options, &land).expect("a journal store");
    (dir, land, Arc::new(store))
}

/// Fresh claims: the next addresses of the claims.lua walk, its 1000 names.
struct Claims {
    n: u32,
    names: Vec<String>,
    seq: u64,
}

impl Claims {
    fn new() -> Claims {
        let words = [
            "ada", "bob", "cy", "dee", "eve", "fox", "gus", "hal", "ivy", "jo",
        ];
        let seps = ["", "-", "_", "."];
        let names = (0..1000)
            .map(|i| format!("{}{}{}", words[i % 10], seps[(i / 10) % 4], i / 10))
            .collect();
        Claims {
            n: 0,
            names,
            seq: 0,
        }
    }

    fn turn(&mut self, replies: &TestReplies, k: usize, out: &mut Vec<Staged>) {
        let at = std::time::UNIX_EPOCH.elapsed().unwrap().as_secs();
        for _ in 0..k {
            self.n += 1;
            self.seq = self.seq.wrapping_add(1);
            out.push(Staged {
                ip: self.n.wrapping_mul(K),
                nick: self.names[(self.n % 1000) as usize].clone(),
                at,
                answer: AnswerKind::Text,
                pending: replies.pending(self.seq),
            });
        }
    }
}

fn metric(store: &JournalStore, name: &str) -> f64 {
    let mut out = Vec::new();
    store.metrics(&mut out);
    out.iter().find(|m| m.name == name).map_or(0.0, |m| m.value)
}

/// `--sync full`: the worker (CPU 0) commits a turn of `k` claims and sleeps in epoll_wait
/// until the syncer's answers wake it; the syncer on `syncer_cpu`, spinning `spin` before it
/// sleeps (`None`: the store's default, none on one CPU).
fn full_sync(k: usize, seconds: f64, syncer_cpu: usize, spin: Option<Duration>) -> (Measured, f64) {
    let (_dir, land, store) = store(SyncMode::Full, spin);
    let stop = StopSignal::default();
    let tid = Arc::new(AtomicU32::new(0));
    let syncer = {
        let (store, stop, tid) = (store.clone(), stop.clone(), tid.clone());
        std::thread::spawn(move || {
            pin_to(syncer_cpu);
            tid.store(gettid() as u32, Ordering::Release);
            store.run_syncer(stop);
        })
    };
    while tid.load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    let replies = TestReplies::new();
    let mut claims = Claims::new();
    let (mut staged, mut answers) = (Vec::with_capacity(k), Vec::new());
    let (syncs0, seconds0) = (
        metric(&store, "journal_syncs"),
        metric(&store, "journal_sync_seconds_total"),
    );
    let m = timed(seconds, &tid, || {
        claims.turn(&replies, k, &mut staged);
        store.commit(&land, &mut staged, &mut answers);
        assert!(answers.is_empty(), "--sync full answered in the turn");
        let mut got = 0;
        while got < k {
            assert!(replies.wait(Duration::from_secs(5)), "no answer within 5 s");
            for (_, response) in replies.completed() {
                assert_eq!(response.status, 200);
                got += 1;
            }
        }
    });
    let syncs = metric(&store, "journal_syncs") - syncs0;
    let sync_seconds = metric(&store, "journal_sync_seconds_total") - seconds0;
    stop.raise();
    syncer.join().unwrap();
    (m, sync_seconds * 1e6 / syncs.max(1.0))
}

/// The kernel as the syncer: one thread on CPU 0 writes a turn's bytes to a journal on
/// /dev/shm and waits, in `io_uring_enter`, for an `IORING_OP_FSYNC` (datasync) of it. The
/// kernel runs a blocking fsync on an io-wq worker thread of its own, so this is a hand-off
/// too, with no second thread of ours: what a worker syncing through io_uring would pay.
fn uring_fsync(seconds: f64) -> Measured {
    use std::os::fd::AsRawFd;
    let dir = tempfile::Builder::new()
        .prefix("tern-handoff-uring-")
        .tempdir_in("/dev/shm")
        .expect("a folder on /dev/shm");
    let file = std::fs::File::create(dir.path().join("journal")).expect("a journal file");
    let mut ring = io_uring::IoUring::new(8).expect("an io_uring");
    let fsync = io_uring::opcode::Fsync::new(io_uring::types::Fd(file.as_raw_fd()))
        .flags(io_uring::types::FsyncFlags::DATASYNC)
        .build();
    let turn = [b'x'; 20];
    let mut at = 0u64;
    timed(seconds, &AtomicU32::new(0), || {
        use std::os::unix::fs::FileExt;
        file.write_all_at(&turn, at).expect("write");
        at += turn.len() as u64;
        // SAFETY: the entry names only `file`'s descriptor, which outlives the ring's use of
        // it: the completion is waited for below before the next turn or the file's drop.
        unsafe { ring.submission().push(&fsync) }.expect("room in the ring");
        ring.submit_and_wait(1).expect("io_uring_enter");
        let done = ring.completion().next().expect("the fsync's completion");
        assert!(done.result() >= 0, "fsync failed: {}", done.result());
    })
}

/// `--sync normal`: the same turns on one thread, answered by `commit` itself.
fn normal_sync(k: usize, seconds: f64) -> Measured {
    let (_dir, land, store) = store(SyncMode::Normal, None);
    let replies = TestReplies::new();
    let mut claims = Claims::new();
    let (mut staged, mut answers): (Vec<Staged>, Vec<(Pending, Response)>) =
        (Vec::with_capacity(k), Vec::new());
    timed(seconds, &AtomicU32::new(0), || {
        claims.turn(&replies, k, &mut staged);
        store.commit(&land, &mut staged, &mut answers);
        assert_eq!(answers.len(), k, "--sync normal answers in the turn");
        for (pending, response) in answers.drain(..) {
            assert_eq!(response.status, 200);
            pending.cancel(); // (a worker writes the answer to its connection here)
        }
    })
}

fn main() {
    let mut seconds = 2.0;
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, s] = &args[..] {
        if flag == "--seconds" {
            seconds = s.parse().expect("--seconds S");
        }
    } else if !args.is_empty() {
        eprintln!("usage: handoff [--seconds S]");
        std::process::exit(2);
    }
    pin_to(0);
    println!(
        "Two threads pinned to CPU 0 (as bench/run pins tern demo), {seconds} s per case; a round \
         trip is 2 switches (the kernel's count of both threads' context switches per round trip \
         is shown beside it)."
    );
    println!();
    println!("| case | round trips/s | switches/s | µs per switch (wake-up) | counted switches per round trip |");
    println!("|---|---|---|---|---|");
    let futex = park_ping_pong(seconds, 0);
    for (name, m) in [
        ("futex ping-pong (thread::park/unpark)", &futex),
        (
            "futex ping-pong (Mutex + Condvar)",
            &condvar_ping_pong(seconds),
        ),
        (
            "kernel hand-off: write + io_uring fsync, one thread (io-wq runs the fsync)",
            &uring_fsync(seconds),
        ),
    ] {
        println!(
            "| {name} | {:.0} | {:.0} | {:.2} | {:.2} |",
            m.per_second(),
            2.0 * m.per_second(),
            m.us_per_round_trip() / 2.0,
            m.counted_per_round_trip()
        );
    }
    println!();
    println!(
        "tern --sync full (JournalStore::commit → run_syncer: fdatasync + complete_all → \
         epoll wake-up), journal on /dev/shm, against --sync normal (answered in the turn: no \
         hand-off):"
    );
    println!();
    println!(
        "| claims per turn | round trips/s | × futex ping-pong | counted switches per round trip \
         | µs per turn (full) | µs per claim (full) | µs per claim (normal) \
         | hand-off µs per turn (full − normal) | mean fdatasync µs |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for k in [1usize, 10, 50] {
        let (full, sync_us) = full_sync(k, seconds, 0, None);
        let normal = normal_sync(k, seconds);
        println!(
            "| {k} | {:.0} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} |",
            full.per_second(),
            full.per_second() / futex.per_second(),
            full.counted_per_round_trip(),
            full.us_per_round_trip(),
            full.us_per_round_trip() / k as f64,
            normal.us_per_round_trip() / k as f64,
            full.us_per_round_trip() - normal.us_per_round_trip(),
            sync_us
        );
    }
    println!();
    println!(
        "The same with the syncer on CPU 1 (a machine where tern demo is not pinned to one CPU), \
         one claim per turn: the syncer sleeping at once (woken by a futex) against watching for \
         the next turn for a while first (JournalOptions::sync_spin; SYNC_SPIN = {} µs is the \
         default there), beside a futex ping-pong across the two CPUs:",
        tern_ipv4_games::store::journal::SYNC_SPIN.as_micros()
    );
    println!();
    println!("| case | round trips/s | × futex ping-pong (2 CPUs) | counted switches per round trip | µs per round trip |");
    println!("|---|---|---|---|---|");
    let futex2 = park_ping_pong(seconds, 1);
    println!(
        "| futex ping-pong (park/unpark), CPUs 0 and 1 | {:.0} | 1.00 | {:.2} | {:.2} |",
        futex2.per_second(),
        futex2.counted_per_round_trip(),
        futex2.us_per_round_trip()
    );
    for spin_us in [0u64, 10, 50, 200] {
        let (m, _) = full_sync(1, seconds, 1, Some(Duration::from_micros(spin_us)));
        println!(
            "| tern --sync full, syncer spins {spin_us} µs | {:.0} | {:.2} | {:.2} | {:.2} |",
            m.per_second(),
            m.per_second() / futex2.per_second(),
            m.counted_per_round_trip(),
            m.us_per_round_trip()
        );
    }
    println!();
    println!("--sync normal has no hand-off: a turn's claims are answered by the worker in that same turn.");
}
