//! Rate limits for the gate's own endpoints, in fixed memory shared by every worker.
//!
//! Login POSTs and challenge pages are rare per client, so one table of atomics shared by the
//! workers costs nothing on the request path, and unlike per-worker tables it holds a client
//! to its limit however the kernel spreads its connections. Keys are hashed with a seed chosen
//! at start-up: two keys that share a slot only make each other stricter, and an attacker
//! cannot aim a collision at someone else's slot.
//!
//! Bounds, when many networks write (the gate's tables have 2^16 slots, 512 KiB each):
//! - a bucket table never fills, but with N networks at their limit about N / 65 536 of the
//!   others share a slot with one of them and are held to the shared budget (429) while it
//!   lasts; never looser, so no network gets past its own limit by colliding;
//! - the failure counts are written only by the check pool, after a wrong password is hashed,
//!   so at most (pool threads x hashes a second x the failure window) of them exist at once,
//!   however many networks send them (two threads at bcrypt cost 10: some 20 000 in 15
//!   minutes). A (network, user) sharing a slot with a locked-out key is locked out with it
//!   for the window, from that network only (other networks can still log in as the user);
//! - the network stamps fill at the same rate; one pushed out of its slot looks clean again
//!   until its next failure (see [`Failures`]).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::prefix::Prefix;

/// A token bucket per network prefix, kept as the generic cell rate algorithm: each slot holds
/// the time (ms) at which its bucket would be full again, so zeroed memory is all buckets full
/// and one compare-and-swap updates a bucket.
pub struct Buckets {
    slots: Box<[AtomicU64]>,
    seed: std::collections::hash_map::RandomState,
    /// Milliseconds one request "costs".
    interval_ms: u64,
    /// How far ahead of now a slot may run: the burst.
    tolerance_ms: u64,
}

impl Buckets {
    /// `per_minute` requests per prefix over time, `burst` at once after a quiet spell.
    pub fn new(per_minute: u32, burst: u32, slots: usize) -> Buckets {
        // Rates above 1000 a minute round to one request a millisecond.
        let interval_ms = (60_000 / u64::from(per_minute.max(1))).max(1);
        Buckets {
            slots: (0..slots.next_power_of_two())
                .map(|_| AtomicU64::new(0))
                .collect(),
            seed: Default::default(),
            interval_ms,
            tolerance_ms: interval_ms * u64::from(burst.max(1).saturating_sub(1)),
        }
    }

    /// Takes one token for `prefix` at `now_ms`; false when the bucket is empty.
    fn index(&self, prefix: &Prefix) -> usize {
        self.seed.hash_one(prefix) as usize & (self.slots.len() - 1)
    }

    pub fn take(&self, prefix: &Prefix, now_ms: u64) -> bool {
        let slot = &self.slots[self.index(prefix)];
        let mut current = slot.load(Ordering::Relaxed);
        loop {
            let full_at = current.max(now_ms);
            if full_at - now_ms > self.tolerance_ms {
                return false;
            }
            match slot.compare_exchange_weak(
                current,
                full_at + self.interval_ms,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }
}

/// Failed logins per (network, realm, user): a user's name cannot be locked out for everyone
/// by a flood from one network, only for that network. And per network, when it last failed
/// at all: the check pool serves networks without recent failures first.
///
/// Both tables have a fixed number of slots however many networks write to them, and only
/// the check pool writes (a wrong password is known only once hashed), so they fill no
/// faster than the pool hashes. Two keys sharing a failure slot only make each other
/// stricter. A network's stamp carries a tag of its own: one that finds another's stamp in
/// its slot counts as clean, so a flood can at worst make a network it has pushed out look
/// clean again until its next failure, never make a clean one look suspect.
pub struct Failures {
    /// (window start in minutes << 32) | failures in that window.
    slots: Box<[AtomicU64]>,
    /// (network's tag << 32) | the minute of its last failure; 0: none.
    networks: Box<[AtomicU64]>,
    seed: std::collections::hash_map::RandomState,
    limit: u32,
    window_minutes: u64,
}

impl Failures {
    pub fn new(limit: u32, window_minutes: u64, slots: usize) -> Failures {
        let table = || {
            (0..slots.next_power_of_two())
                .map(|_| AtomicU64::new(0))
                .collect()
        };
        Failures {
            slots: table(),
            networks: table(),
            seed: Default::default(),
            limit: limit.max(1),
            window_minutes: window_minutes.max(1),
        }
    }

    fn slot(&self, prefix: &Prefix, realm: &str, user: &str) -> &AtomicU64 {
        let h = self.seed.hash_one((prefix, realm, user));
        &self.slots[h as usize & (self.slots.len() - 1)]
    }

    /// The network's stamp slot, and the tag that marks the stamp as its own (never 0).
    fn network(&self, prefix: &Prefix) -> (&AtomicU64, u64) {
        let h = self.seed.hash_one(("network", prefix));
        let slot = &self.networks[h as usize & (self.networks.len() - 1)];
        (slot, (h >> 32) | 1)
    }

    /// Whether a wrong password came from this network within the window.
    pub fn network_failed_recently(&self, prefix: &Prefix, unix_secs: u64) -> bool {
        let (slot, tag) = self.network(prefix);
        let v = slot.load(Ordering::Relaxed);
        v >> 32 == tag && unix_secs / 60 < (v & 0xffff_ffff) + self.window_minutes
    }

    /// Whether this network may try this user again now.
    pub fn allowed(&self, prefix: &Prefix, realm: &str, user: &str, unix_secs: u64) -> bool {
        let v = self.slot(prefix, realm, user).load(Ordering::Relaxed);
        let (start, count) = (v >> 32, v as u32);
        unix_secs / 60 >= start + self.window_minutes || count < self.limit
    }

    /// Counts a wrong password.
    pub fn record(&self, prefix: &Prefix, realm: &str, user: &str, unix_secs: u64) {
        let now_min = unix_secs / 60;
        let (stamp, tag) = self.network(prefix);
        stamp.store((tag << 32) | (now_min & 0xffff_ffff), Ordering::Relaxed);
        let slot = self.slot(prefix, realm, user);
        let _ = slot.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            let (start, count) = (v >> 32, v as u32);
            Some(if now_min >= start + self.window_minutes {
                (now_min << 32) | 1
            } else {
                (start << 32) | u64::from(count.saturating_add(1))
            })
        });
    }

    /// A right password clears the count.
    pub fn clear(&self, prefix: &Prefix, realm: &str, user: &str) {
        self.slot(prefix, realm, user).store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(ip: &str) -> Prefix {
        Prefix::of(ip.parse().unwrap(), 24, 48)
    }

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let b = Buckets::new(60, 5, 64);
        let p = net("192.0.2.1");
        let t = 1_000_000;
        for i in 0..5 {
            assert!(b.take(&p, t), "request {i} of the burst");
        }
        assert!(!b.take(&p, t), "the burst is spent");
        assert!(!b.take(&p, t + 500), "not yet a second later");
        assert!(b.take(&p, t + 1000), "one per second refills");
        assert!(!b.take(&p, t + 1000));
        // Another network has its own bucket (one that does not share the slot: sharing one
        // only makes two networks stricter, and the seed is random).
        let other = (1..=255)
            .map(|i| net(&format!("198.51.{i}.1")))
            .find(|o| b.index(o) != b.index(&p))
            .unwrap();
        assert!(b.take(&other, t));
        // A long quiet spell refills the whole burst, no more.
        let later = t + 3_600_000;
        for _ in 0..5 {
            assert!(b.take(&p, later));
        }
        assert!(!b.take(&p, later));
    }

    #[test]
    fn a_high_rate_still_has_its_burst() {
        let b = Buckets::new(100_000, 1000, 64);
        let p = net("192.0.2.1");
        assert!((0..1000).all(|_| b.take(&p, 5_000)));
        assert!(!b.take(&p, 5_000));
    }

    #[test]
    fn the_same_network_shares_a_bucket() {
        let b = Buckets::new(60, 2, 64);
        assert!(b.take(&net("192.0.2.1"), 10_000));
        assert!(b.take(&net("192.0.2.77"), 10_000));
        assert!(!b.take(&net("192.0.2.200"), 10_000));
    }

    #[test]
    fn failures_lock_one_network_out_of_one_user_for_a_window() {
        let f = Failures::new(3, 15, 1024);
        let (a, b) = (net("192.0.2.1"), net("198.51.100.1"));
        let t = 1_700_000_000;
        for _ in 0..3 {
            assert!(f.allowed(&a, "staff", "alice", t));
            f.record(&a, "staff", "alice", t);
        }
        assert!(!f.allowed(&a, "staff", "alice", t + 60));
        // The flood from one network leaves alice alone elsewhere, and bob alone.
        assert!(f.allowed(&b, "staff", "alice", t + 60));
        assert!(f.allowed(&a, "staff", "bob", t + 60));
        assert!(f.allowed(&a, "other", "alice", t + 60));
        // The window ends.
        assert!(f.allowed(&a, "staff", "alice", t + 16 * 60));
        f.record(&a, "staff", "alice", t + 16 * 60);
        assert!(f.allowed(&a, "staff", "alice", t + 16 * 60));
        f.clear(&a, "staff", "alice");
        assert!(f.allowed(&a, "staff", "alice", t + 16 * 60));
    }

    #[test]
    fn a_network_is_suspect_for_a_window_after_a_wrong_password() {
        let f = Failures::new(3, 15, 1024);
        let (a, b) = (net("192.0.2.1"), net("198.51.100.1"));
        let t = 1_700_000_000;
        assert!(!f.network_failed_recently(&a, t));
        f.record(&a, "staff", "alice", t);
        assert!(f.network_failed_recently(&a, t + 14 * 60));
        assert!(
            !f.network_failed_recently(&a, t + 16 * 60),
            "the window ends"
        );
        assert!(
            !f.network_failed_recently(&b, t),
            "only the network that failed"
        );
        // A right password clears the user's count, not the network's record.
        f.clear(&a, "staff", "alice");
        assert!(f.network_failed_recently(&a, t + 60));
        // Many networks writing the table never make a clean one look suspect.
        let f = Failures::new(3, 15, 16);
        for i in 0..=255 {
            f.record(&net(&format!("10.0.{i}.1")), "staff", "x", t);
        }
        let clean = (0..=255)
            .filter(|i| f.network_failed_recently(&net(&format!("172.16.{i}.1")), t))
            .count();
        assert_eq!(clean, 0);
    }
}
