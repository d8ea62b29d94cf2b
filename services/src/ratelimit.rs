//! Token buckets per network prefix (IPv4 /24, IPv6 /48 by default), one byte each.
//!
//! A bucket holds *debt*: zero means full, every request adds one, and each second the refill
//! rate is subtracted. Debt up to `burst` is allowed; a little more answers 429 and closes;
//! beyond that the connection is closed without an answer, so a flood costs us as little as
//! possible. Zeroed memory is a table of full buckets, so nothing is ever initialised per key.
//!
//! A route may also queue: `queue` requests past the burst are not refused but let through
//! later, each when the rate has paid its debt back (nginx's `limit_req burst=` without
//! `nodelay`); the caller holds the request (a timer, never a blocked worker).
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
    /// Requests a prefix may have waiting past the burst, let through at the rate (0: none
    /// wait, refused at once; whole server).
    pub queue: u32,
    /// Never limited.
    pub exempt: Vec<IpNet>,
    /// Loopback is never limited either (a client of the same machine).
    pub exempt_loopback: bool,
    /// Peers whose `X-Forwarded-For` names the client: the limit counts the client they name
    /// (empty: the peer is the client).
    pub trusted: crate::TrustedProxies,
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
            queue: 0,
            exempt: Vec::new(),
            exempt_loopback: true,
            trusted: crate::TrustedProxies::default(),
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

/// What becomes of a request for a limit that may queue ([`PrefixLimiter::judge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateVerdict {
    Allow,
    /// Within the queue: let it through after this many milliseconds.
    Delay(u64),
    /// Over the limit and the queue: answer 429.
    Reject,
    /// Far over: close without an answer.
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
    /// Debt up to this waits its turn (`allow_up_to` when nothing queues).
    delay_up_to: u8,
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
        let queued = if config.queue == 0 {
            0
        } else {
            share(config.queue)
        };
        // At most 240: below the 255 a bucket saturates at, so a flood still reaches Drop.
        let delay_up_to = allow_up_to + queued;
        let reject_up_to = delay_up_to
            .saturating_add(allow_up_to)
            .clamp(delay_up_to + 1, 254);
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
            delay_up_to,
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
        let excess = u64::from(self.reject_up_to - self.delay_up_to) + 1;
        excess.div_ceil(u64::from(self.refill)).max(1)
    }

    pub fn is_exempt(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        (self.config.exempt_loopback && ip.is_loopback())
            || self.config.exempt.iter().any(|n| n.contains(&ip))
    }

    /// The address a request is counted under: its peer's, or the client a trusted proxy
    /// names.
    pub fn client_of(
        &self,
        peer: std::net::SocketAddr,
        head: &tern_server::RequestHead<'_>,
    ) -> IpAddr {
        if self.config.trusted.is_empty() {
            peer.ip()
        } else {
            self.config.trusted.client_ip(peer, head)
        }
    }

    /// Charges one request from `ip` to its prefix's bucket on `worker`. Each worker must only
    /// pass its own id (buckets are single-writer). A limit that queues lets a queued request
    /// through here (the caller cannot hold it): use [`PrefixLimiter::judge`] for those.
    pub fn check(&self, worker: usize, ip: IpAddr, now_secs: u64) -> RateDecision {
        match self.judge(worker, ip, now_secs) {
            RateVerdict::Allow | RateVerdict::Delay(_) => RateDecision::Allow,
            RateVerdict::Reject => RateDecision::Reject,
            RateVerdict::Drop => RateDecision::Drop,
        }
    }

    /// As [`PrefixLimiter::check`], and a request past the burst but within the queue is
    /// told how long to wait: until the rate has paid back the debt ahead of it.
    pub fn judge(&self, worker: usize, ip: IpAddr, now_secs: u64) -> RateVerdict {
        if self.is_exempt(ip) {
            return RateVerdict::Allow;
        }
        let table = &self.tables[worker % self.tables.len()];
        self.refill(table, now_secs);
        let slot = &table.debt[self.index(ip)];
        // Single writer per table: a plain load + store, no locked instruction.
        let debt = slot.load(Ordering::Relaxed).saturating_add(1);
        slot.store(debt, Ordering::Relaxed);
        if debt <= self.allow_up_to {
            RateVerdict::Allow
        } else if debt <= self.delay_up_to {
            let ahead = u64::from(debt - self.allow_up_to);
            RateVerdict::Delay((ahead * 1000).div_ceil(u64::from(self.refill)))
        } else if debt <= self.reject_up_to {
            RateVerdict::Reject
        } else {
            RateVerdict::Drop
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

    /// Past the burst, `queue` requests wait their turn, each until the rate has paid back
    /// the debt ahead of it; past the queue, refused; far past, dropped.
    #[test]
    fn a_queue_delays_at_the_rate_then_refuses() {
        let l = PrefixLimiter::new(
            RateLimitConfig {
                per_second: 2,
                burst: 1,
                queue: 3,
                ..Default::default()
            },
            1,
        );
        let a = ip("203.0.113.5");
        let seen: Vec<_> = (0..6).map(|_| l.judge(0, a, 50)).collect();
        assert_eq!(
            seen,
            [
                RateVerdict::Allow,
                RateVerdict::Delay(500),
                RateVerdict::Delay(1000),
                RateVerdict::Delay(1500),
                RateVerdict::Reject,
                RateVerdict::Drop,
            ]
        );
        // Refusals count too (a flood pays for itself): two seconds later the rate has paid
        // four back, and a request waits behind the one still queued.
        assert_eq!(l.judge(0, a, 52), RateVerdict::Delay(1000));
        assert_eq!(l.judge(0, a, 52), RateVerdict::Delay(1500));
        assert_eq!(l.judge(0, a, 52), RateVerdict::Reject);
        // A limit without a queue never delays.
        let l = limiter(2, 1);
        assert_eq!(l.judge(0, a, 1), RateVerdict::Allow);
        assert_eq!(l.judge(0, a, 1), RateVerdict::Reject);
    }

    #[test]
    fn loopback_is_limited_when_not_exempt_and_proxied_clients_by_their_address() {
        let l = PrefixLimiter::new(
            RateLimitConfig {
                per_second: 1,
                burst: 1,
                exempt_loopback: false,
                trusted: crate::TrustedProxies::parse("127.0.0.1").unwrap(),
                ..Default::default()
            },
            1,
        );
        assert_eq!(l.check(0, ip("127.0.0.1"), 1), RateDecision::Allow);
        assert_eq!(l.check(0, ip("127.0.0.1"), 1), RateDecision::Reject);
        let client = tern_server::testing::with_request(
            b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.7\r\n\r\n",
            "127.0.0.1:9".parse().unwrap(),
            false,
            |req| l.client_of(req.peer, req.head),
        );
        assert_eq!(client, ip("198.51.100.7"));
        // From a peer it does not trust, the header is the client's word: the peer counts.
        let client = tern_server::testing::with_request(
            b"GET / HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.7\r\n\r\n",
            "203.0.113.9:9".parse().unwrap(),
            false,
            |req| l.client_of(req.peer, req.head),
        );
        assert_eq!(client, ip("203.0.113.9"));
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
