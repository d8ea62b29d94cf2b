//! Writes a data folder for `tern demo` that holds N claims as one snapshot, for measuring
//! recovery time and memory (`bench/recovery` runs it):
//!
//! ```text
//! cargo run --release -p tern-ipv4-games --example gen_claims -- DIR N
//! cargo run --release -p tern-ipv4-games --example gen_claims -- --default-max-claims
//! ```
//!
//! The claims are those `bench/lua/claims.lua` would make: claim n (n = 1, 2, …) is address
//! n × 0x9E3779B1 mod 2³² (a permutation of the IPv4 space; 0.x and 127.x are skipped) for
//! name number n mod 1000 of the same 1000 names, and claim times rise with n over the last
//! 40 days. A snapshot lists addresses in ascending order, so they are sorted first (and each
//! claim's n is recovered from its address with the inverse of the multiplier). The folder
//! gets `snapshot-0000000001.snap` only: `tern demo --data DIR` loads it and starts a fresh
//! journal after it. `--default-max-claims` prints what `--max-claims` a start without it
//! uses on this machine.

use std::path::PathBuf;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tern_ipv4_games::journal::{self, snapshot::Writer};
use tern_ipv4_games::land::Claim;

/// The multiplier of `bench/lua/claims.lua` (odd, so n ↦ n·K mod 2³² is a permutation).
const K: u32 = 0x9E37_79B1;
/// Claim times spread over this many seconds before now.
const SPAN: u64 = 40 * 86_400;
/// The latest claims a snapshot carries for `/recent`.
const RECENT: usize = 50;

/// K⁻¹ mod 2³² (Newton's iteration: each step doubles the bits that are right).
fn inverse(k: u32) -> u32 {
    let mut x = k; // right to 3 bits for any odd k
    for _ in 0..5 {
        x = x.wrapping_mul(2u32.wrapping_sub(k.wrapping_mul(x)));
    }
    x
}

/// The address of claim n, or None where claims.lua skips it (0.x.x.x, 127.x.x.x).
fn address(n: u32) -> Option<u32> {
    let a = n.wrapping_mul(K);
    let first = a >> 24;
    (first != 0 && first != 127).then_some(a)
}

/// The 1000 names of claims.lua: ada0, bob0, …, jo0, ada-1, …, in its order.
fn names() -> Vec<String> {
    let words = [
        "ada", "bob", "cy", "dee", "eve", "fox", "gus", "hal", "ivy", "jo",
    ];
    let seps = ["", "-", "_", "."];
    (0..1000)
        .map(|i| format!("{}{}{}", words[i % 10], seps[(i / 10) % 4], i / 10))
        .collect()
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--default-max-claims") {
        println!(
            "{} (half of MemTotal at {} bytes per address)",
            tern_ipv4_games::default_max_claims(),
            tern_ipv4_games::BUDGET_PER_CLAIM
        );
        return Ok(());
    }
    let [dir, n] = &args[..] else {
        return Err("usage: gen_claims DIR N  |  gen_claims --default-max-claims".into());
    };
    let dir = PathBuf::from(dir);
    let wanted: u64 = n.replace('_', "").parse().map_err(|e| format!("N: {e}"))?;
    if wanted > (u32::MAX as u64) / 2 {
        return Err("N: at most 2^31 claims".into());
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let listing = journal::list(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !listing.segments.is_empty() || !listing.snapshots.is_empty() {
        return Err(format!("{} already holds game data", dir.display()));
    }
    let started = Instant::now();
    let mut ips = Vec::with_capacity(wanted as usize);
    let mut n = 0u32;
    while (ips.len() as u64) < wanted {
        n += 1;
        if let Some(a) = address(n) {
            ips.push(a);
        }
    }
    let last = n;
    ips.sort_unstable();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    let first_time = now - SPAN;
    let time_of = |n: u32| (first_time + (n as u64 - 1) * SPAN / last.max(1) as u64) as u32;
    let names = names();
    let name_of = |n: u32| names[(n % 1000) as usize].as_str();
    let k_inv = inverse(K);
    assert_eq!(K.wrapping_mul(k_inv), 1);

    let path = journal::snapshot_path(&dir, 1);
    let mut w = Writer::create(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    for &a in &ips {
        let n = a.wrapping_mul(k_inv);
        w.add(a, name_of(n), time_of(n))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    drop(ips);
    // The latest claims, newest first, as /recent lists them.
    let mut recent = Vec::with_capacity(RECENT);
    let mut m = last;
    while recent.len() < RECENT.min(wanted as usize) && m > 0 {
        if let Some(a) = address(m) {
            recent.push(Claim {
                ip: a,
                nick: name_of(m).to_string(),
                created: time_of(m) as u64,
            });
        }
        m -= 1;
    }
    let claims = w.claims();
    let bytes = w
        .finish(&recent)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    println!(
        "{}: {claims} claims, {bytes} bytes, in {:.1} s",
        path.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
