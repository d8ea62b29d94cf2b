//! What the journal store's write path costs per claim (`JournalStore::commit`: decide, one
//! write per turn, apply), with warm caches and with cold ones, on a state the size a long
//! benchmark leaves behind:
//!
//! ```text
//! cargo run --release -p tern-ipv4-games --example claim_path [-- --held N --turn K --seconds S]
//! ```
//!
//! The state is first filled with N claims (default 3 M) of the `bench/lua/claims.lua`
//! walk (each a fresh address for one of 1000 names); then turns of K claims (default 20)
//! of the next addresses are committed to a journal on /dev/shm under `--sync normal`, for
//! S seconds per case, on CPU 0:
//!
//! - warm: turn after turn, as on a quiet machine;
//! - cold: before each timed turn, a 64 MiB buffer is written one byte per 64-byte line
//!   (not timed), as a neighbour thrashing the caches would leave them.
//!
//! Printed: ns per claim of the commit alone (answers built, not sent), and cold ÷ warm.

use std::time::{Duration, Instant};

use tern_ipv4_games::land::Land;
use tern_ipv4_games::store::journal::{JournalOptions, JournalStore};
use tern_ipv4_games::store::{ClaimStore, Staged, SyncMode};
use tern_ipv4_games::AnswerKind;
use tern_server::testing::TestReplies;

const K: u32 = 0x9E37_79B1; // bench/lua/claims.lua's address walk

fn pin_to_cpu0() {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and sched_setaffinity(0 = this
    // thread) only read and write that local set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn names() -> Vec<String> {
    let words = [
        "ada", "bob", "cy", "dee", "eve", "fox", "gus", "hal", "ivy", "jo",
    ];
    let seps = ["", "-", "_", "."];
    (0..1000)
        .map(|i| format!("{}{}{}", words[i % 10], seps[(i / 10) % 4], i / 10))
        .collect()
}

/// Claim number n of the walk: its address (0.x and 127.x skipped as claims.lua does).
fn address(n: &mut u32) -> u32 {
    loop {
        *n = n.wrapping_add(1);
        let a = n.wrapping_mul(K);
        if a >> 24 != 0 && a >> 24 != 127 {
            return a;
        }
    }
}

struct Args {
    held: u32,
    turn: usize,
    seconds: f64,
}

fn args() -> Args {
    let mut a = Args {
        held: 3_000_000,
        turn: 20,
        seconds: 3.0,
    };
    let v: Vec<String> = std::env::args().skip(1).collect();
    for pair in v.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or("");
        match pair[0].as_str() {
            "--held" => a.held = value.parse().expect("--held N"),
            "--turn" => a.turn = value.parse().expect("--turn K"),
            "--seconds" => a.seconds = value.parse().expect("--seconds S"),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn main() {
    let a = args();
    pin_to_cpu0();
    let dir = tempfile::Builder::new()
        .prefix("tern-claim-path-")
        .tempdir_in("/dev/shm")
        .expect("a folder on /dev/shm");
    let land = Land::new();
    let store = JournalStore::open(JournalOptions::new(dir.path(), SyncMode::Normal), &land)
        .expect("a journal store");
    let names = names();
    let now = std::time::UNIX_EPOCH.elapsed().unwrap().as_secs();
    let mut n = 0u32;
    let filled = Instant::now();
    for i in 0..a.held {
        let ip = address(&mut n);
        land.load(ip, &names[(i % 1000) as usize], now - 86_400);
    }
    println!(
        "state: {} addresses, {} names (filled in {:.1} s); turns of {} claims, {} s per case",
        land.claimed(),
        land.names_held(),
        filled.elapsed().as_secs_f64(),
        a.turn,
        a.seconds
    );
    let replies = TestReplies::new();
    let mut thrash = vec![0u8; 64 << 20];
    let mut seq = 0u64;
    let (mut staged, mut answers) = (Vec::with_capacity(a.turn), Vec::new());
    let mut case = |cold: bool| -> f64 {
        let mut spent = Duration::ZERO;
        let mut claims = 0u64;
        let wall = Instant::now();
        while wall.elapsed().as_secs_f64() < a.seconds {
            if cold {
                for i in (0..thrash.len()).step_by(64) {
                    thrash[i] = thrash[i].wrapping_add(1);
                }
                std::hint::black_box(&mut thrash);
            }
            for _ in 0..a.turn {
                seq += 1;
                let ip = address(&mut n);
                staged.push(Staged {
                    ip,
                    nick: names[(seq % 1000) as usize].clone(),
                    at: now,
                    answer: AnswerKind::Text,
                    pending: replies.pending(seq),
                });
            }
            let t = Instant::now();
            store.commit(&land, &mut staged, &mut answers);
            spent += t.elapsed();
            claims += answers.len() as u64;
            for (pending, response) in answers.drain(..) {
                assert_eq!(response.status, 200);
                pending.cancel();
            }
        }
        spent.as_nanos() as f64 / claims as f64
    };
    let mut warm = Vec::new();
    let mut cold = Vec::new();
    for _ in 0..3 {
        warm.push(case(false));
        cold.push(case(true));
    }
    warm.sort_by(f64::total_cmp);
    cold.sort_by(f64::total_cmp);
    println!(
        "commit ns per claim (median of 3): warm {:.0}, cold {:.0}, cold ÷ warm {:.2}",
        warm[1],
        cold[1],
        cold[1] / warm[1]
    );
}
