//! Token buckets per network prefix (IPv4 /24, IPv6 /48 by default), one byte each.
//!
//! A bucket holds *debt*: zero means full, every request adds one, and each second the refill
//! rate is subtracted. Debt up to `burst` is allowed; a little more answers 429 and closes;
//! beyond that the connection is closed without an answer, so a flood costs us as little as
//! possible. Zeroed memory is a table of full buckets, so nothing is ever initialised per key.
//!
//! Buckets live in a fixed hashed table per worker (no locks, no cross-core traffic); two
//! prefixes that hash alike share a bucket, which can only make limits stricter. A client is
//! spread over workers by the kernel's SO_REUSEPORT hash, so each worker enforces its share
//! of the configured rate and burst.

use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crossbeam_utils::CachePadded;
use ipnet::IpNet;

#[derive(Debug, Clone)]
pub struct RateLimitConfig {
    /// Requests per second each prefix may make over time (whole server).
    pub per_second: u32,
    /// Requests a prefix may make at once after being quiet (whole server).
    pub burst: u32,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    /// Never limited (loopback always is).
    pub exempt: Vec<IpNet>,
    /// Buckets per worker (a power of two); one byte each.
    pub buckets: usize,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            per_second: 50,
            burst: 100,
            ipv4_prefix: 24,
            ipv6_prefix: 48,
            exempt: Vec::new(),
            buckets: 1 << 16,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateDecision {
    Allow,
    /// Over the limit: answer 429 and close.
    Reject,
    /// Far over the limit: close without an answer.
    Drop,
}

struct Table {
    debt: Box<[AtomicU8]>,
    refilled_at: AtomicU64,
}

pub struct PrefixLimiter {
    config: RateLimitConfig,
    tables: Box<[CachePadded<Table>]>,
    /// Per-worker share of the rate and burst.
    refill: u8,
    allow_up_to: u8,
    reject_up_to: u8,
    seed: u64,
    mask: usize,
}

impl PrefixLimiter {
    pub fn new(config: RateLimitConfig, workers: usize) -> PrefixLimiter {
        let workers = workers.max(1) as u32;
        let buckets = config.buckets.max(64).next_power_of_two();
        let share = |v: u32| v.div_ceil(workers).clamp(1, 120) as u8;
        let allow_up_to = share(config.burst);
        let reject_up_to = allow_up_to.saturating_mul(2).max(allow_up_to + 1);
        let tables = (0..workers)
            .map(|_| {
                CachePadded::new(Table {
                    debt: (0..buckets).map(|_| AtomicU8::new(0)).collect(),
                    refilled_at: AtomicU64::new(0),
                })
            })
            .collect();
        PrefixLimiter {
            refill: share(config.per_second),
            allow_up_to,
            reject_up_to,
            config,
            tables,
            seed: std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish(),
            mask: buckets - 1,
        }
    }

    /// Seconds after which a prefix just refused has tokens again, at worst (its debt at the
    /// most a refusal leaves, paid back at this worker's share of the rate): the value of a
    /// 429's `Retry-After`.
    pub fn retry_after_secs(&self) -> u64 {
        let excess = u64::from(self.reject_up_to - self.allow_up_to) + 1;
        excess.div_ceil(u64::from(self.refill)).max(1)
    }

    pub fn is_exempt(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_loopback() || self.config.exempt.iter().any(|n| n.contains(&ip))
    }

    /// Charges one request from `ip` to its prefix's bucket on `worker`. Each worker must only
    /// pass its own id (buckets are single-writer).
    pub fn check(&self, worker: usize, ip: IpAddr, now_secs: u64) -> RateDecision {
        if self.is_exempt(ip) {
            return RateDecision::Allow;
        }
        let table = &self.tables[worker % self.tables.len()];
        self.refill(table, now_secs);
        let slot = &table.debt[self.index(ip)];
        // Single writer per table: a plain load + store, no locked instruction.
        let debt = slot.load(Ordering::Relaxed).saturating_add(1);
        slot.store(debt, Ordering::Relaxed);
        if debt <= self.allow_up_to {
            RateDecision::Allow
        } else if debt <= self.reject_up_to {
            RateDecision::Reject
        } else {
            RateDecision::Drop
        }
    }

    fn refill(&self, table: &Table, now_secs: u64) {
        let last = table.refilled_at.load(Ordering::Relaxed);
        if now_secs <= last {
            return;
        }
        table.refilled_at.store(now_secs, Ordering::Relaxed);
        let amount = (now_secs - last)
            .saturating_mul(self.refill as u64)
            .min(255) as u8;
        // One pass over the table once a second (64 KiB by default): cheaper than keeping a
        // timestamp per bucket, and keeps each bucket to one byte.
        for slot in table.debt.iter() {
            let d = slot.load(Ordering::Relaxed);
            if d != 0 {
                slot.store(d.saturating_sub(amount), Ordering::Relaxed);
            }
        }
    }

    fn index(&self, ip: IpAddr) -> usize {
        let key: u64 = match ip.to_canonical() {
            IpAddr::V4(v4) => {
                let bits = self.config.ipv4_prefix.min(32) as u32;
                (u32::from(v4) as u64).checked_shr(32 - bits).unwrap_or(0)
            }
            IpAddr::V6(v6) => {
                let bits = self.config.ipv6_prefix.min(128) as u32;
                let k = u128::from(v6).checked_shr(128 - bits).unwrap_or(0);
                // Mark v6 keys so they never collide with v4 keys by construction.
                ((k as u64) ^ ((k >> 64) as u64)) ^ (1 << 63)
            }
        };
        // Fibonacci hashing of the keyed prefix; the random seed keeps an attacker from
        // choosing prefixes that collide with a victim's bucket.
        let h = (key ^ self.seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> 32) as usize & self.mask
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(per_second: u32, burst: u32) -> PrefixLimiter {
        PrefixLimiter::new(
            RateLimitConfig {
                per_second,
                burst,
                exempt: vec!["192.0.2.0/24".parse().unwrap()],
                ..Default::default()
            },
            1,
        )
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn burst_then_reject_then_drop() {
        let l = limiter(10, 5);
        let a = ip("203.0.113.7");
        let seen: Vec<_> = (0..12).map(|_| l.check(0, a, 100)).collect();
        assert_eq!(&seen[..5], &[RateDecision::Allow; 5]);
        assert_eq!(&seen[5..10], &[RateDecision::Reject; 5]);
        assert_eq!(&seen[10..], &[RateDecision::Drop; 2]);
    }

    #[test]
    fn the_whole_prefix_shares_a_bucket_and_others_do_not() {
        let l = limiter(10, 3);
        for last in 1..=3 {
            assert_eq!(
                l.check(0, ip(&format!("198.51.100.{last}")), 5),
                RateDecision::Allow
            );
        }
        assert_eq!(l.check(0, ip("198.51.100.200"), 5), RateDecision::Reject);
        assert_eq!(l.check(0, ip("198.51.101.1"), 5), RateDecision::Allow);
        // IPv6: the /48 is the unit.
        for _ in 0..3 {
            assert_eq!(l.check(0, ip("2001:db8:1::1"), 5), RateDecision::Allow);
        }
        assert_eq!(
            l.check(0, ip("2001:db8:1:ffff::9"), 5),
            RateDecision::Reject
        );
        assert_eq!(l.check(0, ip("2001:db8:2::1"), 5), RateDecision::Allow);
    }

    #[test]
    fn refills_once_a_second() {
        let l = limiter(2, 2);
        let a = ip("203.0.113.1");
        assert_eq!(l.check(0, a, 10), RateDecision::Allow);
        assert_eq!(l.check(0, a, 10), RateDecision::Allow);
        assert_eq!(l.check(0, a, 10), RateDecision::Reject);
        // One second later two tokens are back: debt 3 - 2 = 1, so one more is allowed.
        assert_eq!(l.check(0, a, 11), RateDecision::Allow);
        assert_eq!(l.check(0, a, 11), RateDecision::Reject);
        // A long quiet spell refills completely.
        assert_eq!(l.check(0, a, 1000), RateDecision::Allow);
        assert_eq!(l.check(0, a, 1000), RateDecision::Allow);
    }

    #[test]
    fn loopback_and_configured_networks_are_exempt() {
        let l = limiter(1, 1);
        for _ in 0..1000 {
            assert_eq!(l.check(0, ip("127.0.0.1"), 1), RateDecision::Allow);
            assert_eq!(l.check(0, ip("::1"), 1), RateDecision::Allow);
            assert_eq!(l.check(0, ip("192.0.2.55"), 1), RateDecision::Allow);
            assert_eq!(l.check(0, ip("::ffff:127.0.0.1"), 1), RateDecision::Allow);
        }
    }

    #[test]
    fn workers_share_the_rate() {
        let l = PrefixLimiter::new(
            RateLimitConfig {
                per_second: 10,
                burst: 10,
                ..Default::default()
            },
            2,
        );
        let a = ip("203.0.113.9");
        let allowed = (0..20)
            .filter(|_| l.check(0, a, 1) == RateDecision::Allow)
            .count();
        assert_eq!(allowed, 5);
        assert_eq!(l.check(1, a, 1), RateDecision::Allow);
    }
}
