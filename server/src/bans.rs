//! Bans: peers that abused the server are closed at accept, before any read.
//!
//! A peer is banned when a handler drops its connection (`Reply::Drop`, e.g. far over the
//! IPv4 Games' token bucket), or after `after_strikes` header timeouts (slowloris) within
//! `strike_window`. A ban covers the peer's IPv4 /32 (or /24) or IPv6 /64 and expires.
//!
//! The accept path must stay cheap and shared-nothing: with no bans it reads one atomic that
//! changes only when a ban is added or expires (on its own cache line, so strikes recorded
//! by other workers do not bounce it); with bans it loads an `ArcSwap` snapshot (a sorted
//! slice, binary-searched). Adding a ban or a strike takes a mutex: that happens at most once
//! per timed-out or dropped connection, never per accept.
//!
//! Memory is fixed: at most `capacity` bans (4096 by default; when full the ban closest to
//! its expiry is replaced) and a direct-mapped strike table of `STRIKE_SLOTS` entries (two
//! addresses hashing alike share a slot, which can only delay a ban). Each entry is 32 bytes:
//! the strike table, the master list and the published snapshot are 128 KiB each at most
//! (384 KiB), plus, for a moment, an older snapshot per worker still searching one.

use std::hash::BuildHasher;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use ipnet::IpNet;
use tern_runtime::{ratelog, Clock};

use crate::stats::{Counter, WorkerStats};

/// Strike slots (direct-mapped by a keyed hash of the banned prefix).
pub const STRIKE_SLOTS: usize = 4096;

#[derive(Debug, Clone)]
pub struct BanConfig {
    /// Header timeouts (slow request heads or TLS handshakes) within `strike_window` that
    /// ban the peer; 0: timeouts never ban.
    pub after_strikes: u32,
    pub strike_window: Duration,
    /// How long a ban lasts.
    pub duration: Duration,
    /// Prefix length an IPv4 ban covers (32 or 24); IPv6 bans cover the /64.
    pub ipv4_prefix: u8,
    /// Never banned (a /24 ban that covers one of these still lets it in).
    pub exempt: Vec<IpNet>,
    /// Most bans held at once.
    pub capacity: usize,
}

impl Default for BanConfig {
    fn default() -> Self {
        BanConfig {
            after_strikes: 3,
            strike_window: Duration::from_secs(60),
            duration: Duration::from_secs(600),
            ipv4_prefix: 32,
            exempt: default_exempt(),
            capacity: 4096,
        }
    }
}

/// 127.0.0.1 and ::1: local tools, health checks and stress scripts are never locked out.
pub fn default_exempt() -> Vec<IpNet> {
    vec![
        IpNet::from(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        IpNet::from(IpAddr::V6(Ipv6Addr::LOCALHOST)),
    ]
}

/// A ban for the kernel's set (`--ban-nft-set`), sent through [`Bans::with_sink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BanNotice {
    pub net: IpNet,
    pub seconds: u64,
}

/// Why a ban was added (for the log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BanCause {
    Strikes,
    Dropped,
}

/// A ban that was just added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Added {
    pub net: IpNet,
    /// The sink (nft feeder) could not take it: its queue was full or it is gone.
    pub sink_failed: bool,
}

/// Keys are 128 bits: an IPv4 prefix as its IPv4-mapped IPv6 address (`::ffff:a.b.c.0`), an
/// IPv6 /64 with its low half zero; the two never collide.
type Key = u128;

#[derive(Default)]
struct Snapshot {
    /// Sorted by key; expired entries stay until the next rebuild and are ignored.
    entries: Box<[(Key, u64)]>,
    /// The earliest expiry in `entries` (u64::MAX when empty): past it, a rebuild is due.
    earliest_ms: u64,
}

#[derive(Clone, Copy, Default)]
struct Strike {
    key: Key,
    first_ms: u64,
    count: u32,
}

struct State {
    /// Sorted by key, at most `capacity` entries: (key, expiry in ms of `Bans::epoch`).
    bans: Vec<(Key, u64)>,
    strikes: Box<[Strike]>,
}

/// What the accept path reads, alone on its cache lines.
#[repr(align(128))]
struct Hot {
    /// Entries in the published snapshot; 0 lets an accept skip everything else.
    active: AtomicUsize,
    snapshot: ArcSwap<Snapshot>,
}

/// The server's ban set, shared by every worker.
pub struct Bans {
    hot: Hot,
    config: BanConfig,
    state: Mutex<State>,
    hasher: std::collections::hash_map::RandomState,
    epoch: Instant,
    sink: Option<SyncSender<BanNotice>>,
}

impl Bans {
    pub fn new(mut config: BanConfig) -> Bans {
        config.ipv4_prefix = config.ipv4_prefix.min(32);
        config.capacity = config.capacity.max(1);
        Bans {
            hot: Hot {
                active: AtomicUsize::new(0),
                snapshot: ArcSwap::from_pointee(Snapshot {
                    entries: Box::new([]),
                    earliest_ms: u64::MAX,
                }),
            },
            state: Mutex::new(State {
                bans: Vec::with_capacity(config.capacity),
                strikes: vec![Strike::default(); STRIKE_SLOTS].into_boxed_slice(),
            }),
            config,
            hasher: Default::default(),
            epoch: Instant::now(),
            sink: None,
        }
    }

    /// New bans are also offered to `sink` (never blocking; a full queue is reported in
    /// [`Added::sink_failed`]).
    pub fn with_sink(mut self, sink: SyncSender<BanNotice>) -> Bans {
        self.sink = Some(sink);
        self
    }

    pub fn config(&self) -> &BanConfig {
        &self.config
    }

    /// Milliseconds since this set was made (the time base of every `_at` method).
    pub fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn is_exempt(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.config.exempt.iter().any(|n| n.contains(&ip))
    }

    /// The prefix a ban of `ip` covers.
    pub fn net_of(&self, ip: IpAddr) -> IpNet {
        let (addr, len) = match ip.to_canonical() {
            IpAddr::V4(a) => (
                IpAddr::V4(Ipv4Addr::from(
                    u32::from(a) & v4_mask(self.config.ipv4_prefix),
                )),
                self.config.ipv4_prefix,
            ),
            IpAddr::V6(a) => (IpAddr::V6(Ipv6Addr::from(u128::from(a) & V6_MASK)), 64),
        };
        IpNet::new(addr, len).expect("prefix length within the family's bits")
    }

    fn key(&self, ip: IpAddr) -> Key {
        match ip.to_canonical() {
            IpAddr::V4(a) => {
                0xffff_0000_0000 | Key::from(u32::from(a) & v4_mask(self.config.ipv4_prefix))
            }
            IpAddr::V6(a) => u128::from(a) & V6_MASK,
        }
    }

    /// The accept-path check.
    #[inline]
    pub fn is_banned(&self, ip: IpAddr) -> bool {
        // The common case: no bans, one load of a line that is written only when bans change.
        if self.hot.active.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.is_banned_at(ip, self.now_ms())
    }

    #[cold]
    pub fn is_banned_at(&self, ip: IpAddr, now_ms: u64) -> bool {
        let snap = self.hot.snapshot.load();
        if snap.earliest_ms <= now_ms {
            // A ban expired: publish a snapshot without it (if no other thread is at it).
            if let Ok(mut state) = self.state.try_lock() {
                self.publish(&mut state, now_ms);
            }
        }
        let banned = match snap.entries.binary_search_by_key(&self.key(ip), |e| e.0) {
            Ok(i) => snap.entries[i].1 > now_ms,
            Err(_) => false,
        };
        // A /24 ban may cover an exempt address; it still gets in.
        banned && !self.is_exempt(ip)
    }

    /// Bans available to the accept path right now (expired ones included until the next
    /// rebuild).
    pub fn active(&self) -> usize {
        self.hot.active.load(Ordering::Relaxed)
    }

    /// A header timeout from `ip`. Returns the ban if this strike completed one.
    pub fn strike(&self, ip: IpAddr) -> Option<Added> {
        self.strike_at(ip, self.now_ms())
    }

    pub fn strike_at(&self, ip: IpAddr, now_ms: u64) -> Option<Added> {
        if self.config.after_strikes == 0 || self.is_exempt(ip) {
            return None;
        }
        let key = self.key(ip);
        let slot = self.hasher.hash_one(key) as usize % STRIKE_SLOTS;
        let window = self.config.strike_window.as_millis() as u64;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut state.strikes[slot];
        if s.count == 0 || s.key != key || now_ms.saturating_sub(s.first_ms) >= window {
            *s = Strike {
                key,
                first_ms: now_ms,
                count: 0,
            };
        }
        s.count += 1;
        if s.count < self.config.after_strikes {
            return None;
        }
        *s = Strike::default();
        self.add(&mut state, ip, key, now_ms)
    }

    /// Bans `ip` at once (a handler dropped its connection). None if exempt or already banned.
    pub fn ban(&self, ip: IpAddr) -> Option<Added> {
        self.ban_at(ip, self.now_ms())
    }

    pub fn ban_at(&self, ip: IpAddr, now_ms: u64) -> Option<Added> {
        if self.is_exempt(ip) {
            return None;
        }
        let key = self.key(ip);
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.add(&mut state, ip, key, now_ms)
    }

    fn add(&self, state: &mut State, ip: IpAddr, key: Key, now_ms: u64) -> Option<Added> {
        let until = now_ms.saturating_add(self.config.duration.as_millis() as u64);
        match state.bans.binary_search_by_key(&key, |e| e.0) {
            Ok(i) if state.bans[i].1 > now_ms => return None, // banned already
            Ok(i) => state.bans[i].1 = until,
            Err(_) => {
                if state.bans.len() >= self.config.capacity {
                    state.bans.retain(|e| e.1 > now_ms);
                }
                if state.bans.len() >= self.config.capacity {
                    // Full of live bans: the one closest to its end makes room.
                    let soonest = (0..state.bans.len())
                        .min_by_key(|&j| state.bans[j].1)
                        .expect("capacity is at least 1");
                    state.bans.remove(soonest);
                }
                let i = state.bans.partition_point(|e| e.0 < key);
                state.bans.insert(i, (key, until));
            }
        }
        self.publish(state, now_ms);
        let net = self.net_of(ip);
        let sink_failed = match &self.sink {
            // The kernel cannot honour an exemption inside a /24: that ban stays tern's own.
            Some(_) if self.covers_exempt(net) => false,
            Some(sink) => {
                let seconds = self.config.duration.as_secs().max(1);
                match sink.try_send(BanNotice { net, seconds }) {
                    Ok(()) => false,
                    Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => true,
                }
            }
            None => false,
        };
        Some(Added { net, sink_failed })
    }

    /// True if `net` holds an exempt address.
    pub fn covers_exempt(&self, net: IpNet) -> bool {
        self.config
            .exempt
            .iter()
            .any(|e| net.contains(&e.network()) || e.contains(&net.network()))
    }

    /// Drops expired bans and publishes what is left to the accept path.
    fn publish(&self, state: &mut State, now_ms: u64) {
        state.bans.retain(|e| e.1 > now_ms);
        let entries: Box<[(Key, u64)]> = state.bans.as_slice().into();
        let earliest_ms = entries.iter().map(|e| e.1).min().unwrap_or(u64::MAX);
        let active = entries.len();
        self.hot.snapshot.store(Arc::new(Snapshot {
            entries,
            earliest_ms,
        }));
        self.hot.active.store(active, Ordering::Relaxed);
    }
}

/// A strike (header timeout) or a dropped connection from `ip`, on a worker: counts and logs
/// (rate-limited) the ban it may add.
pub(crate) fn record(bans: &Bans, stats: &WorkerStats, clock: &Clock, ip: IpAddr, cause: BanCause) {
    let added = match cause {
        BanCause::Strikes => bans.strike(ip),
        BanCause::Dropped => bans.ban(ip),
    };
    let Some(added) = added else {
        return;
    };
    stats.bump(Counter::BansAdded);
    if added.sink_failed {
        stats.bump(Counter::BanNftFailures);
    }
    if ratelog::admit("ban_added", clock.now_ms()) {
        let why = match cause {
            BanCause::Strikes => "slow request heads",
            BanCause::Dropped => "dropped by a handler (far over a rate limit)",
        };
        let secs = bans.config.duration.as_secs();
        tracing::info!(net = %added.net, "banned for {secs} s: {why}");
    }
}

const V6_MASK: u128 = !((1u128 << 64) - 1);

fn v4_mask(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p => u32::MAX << (32 - u32::from(p.min(32))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn bans(f: impl FnOnce(&mut BanConfig)) -> Bans {
        let mut c = BanConfig::default();
        f(&mut c);
        Bans::new(c)
    }

    #[test]
    fn prefixes() {
        let b32 = bans(|_| {});
        assert_eq!(b32.net_of(ip("192.0.2.77")).to_string(), "192.0.2.77/32");
        assert_eq!(
            b32.net_of(ip("::ffff:192.0.2.77")).to_string(),
            "192.0.2.77/32"
        );
        assert_eq!(
            b32.net_of(ip("2001:db8:1:2:3:4:5:6")).to_string(),
            "2001:db8:1:2::/64"
        );
        let b24 = bans(|c| c.ipv4_prefix = 24);
        assert_eq!(b24.net_of(ip("192.0.2.77")).to_string(), "192.0.2.0/24");
        assert_eq!(v4_mask(0), 0);
        assert_eq!(v4_mask(32), u32::MAX);
        assert_eq!(v4_mask(40), u32::MAX);
    }

    #[test]
    fn ban_covers_its_prefix_only() {
        let b = bans(|c| c.ipv4_prefix = 24);
        assert!(b.ban_at(ip("192.0.2.77"), 0).is_some());
        assert!(b.is_banned_at(ip("192.0.2.1"), 1));
        assert!(b.is_banned_at(ip("::ffff:192.0.2.200"), 1));
        assert!(!b.is_banned_at(ip("192.0.3.1"), 1));
        assert!(!b.is_banned_at(ip("::ffff:192.0.0.1"), 1));

        let b = bans(|_| {});
        b.ban_at(ip("192.0.2.77"), 0).unwrap();
        assert!(b.is_banned_at(ip("192.0.2.77"), 1));
        assert!(!b.is_banned_at(ip("192.0.2.78"), 1));
        b.ban_at(ip("2001:db8::1"), 0).unwrap();
        assert!(b.is_banned_at(ip("2001:db8::ffff:1"), 1));
        assert!(!b.is_banned_at(ip("2001:db8:0:1::1"), 1));
        // An IPv6 /64 whose upper half is zero is not an IPv4 key.
        assert!(!b.is_banned_at(ip("::c000:24d"), 1));
    }

    #[test]
    fn bans_expire() {
        let b = bans(|c| c.duration = Duration::from_secs(10));
        b.ban_at(ip("192.0.2.1"), 1_000).unwrap();
        assert_eq!(b.active(), 1);
        assert!(b.is_banned_at(ip("192.0.2.1"), 10_999));
        assert!(!b.is_banned_at(ip("192.0.2.1"), 11_000));
        // The check that saw it expire published a snapshot without it.
        assert_eq!(b.active(), 0);
        assert!(!b.is_banned(ip("192.0.2.1")));
        // Banned again after expiry.
        assert!(b.ban_at(ip("192.0.2.1"), 11_000).is_some());
        assert!(b.is_banned_at(ip("192.0.2.1"), 11_001));
    }

    #[test]
    fn a_live_ban_is_not_added_twice() {
        let b = bans(|_| {});
        assert!(b.ban_at(ip("192.0.2.1"), 0).is_some());
        assert!(b.ban_at(ip("192.0.2.1"), 5).is_none());
    }

    #[test]
    fn capacity_bounds_the_set() {
        let b = bans(|c| c.capacity = 8);
        for i in 0..20u8 {
            b.ban_at(IpAddr::V4(Ipv4Addr::new(198, 51, 100, i)), u64::from(i))
                .unwrap();
            assert!(b.active() <= 8);
        }
        assert_eq!(b.active(), 8);
        assert_eq!(b.state.lock().unwrap().bans.len(), 8);
        // The newest are kept; the ones closest to expiry made room.
        assert!(b.is_banned_at(ip("198.51.100.19"), 20));
        assert!(b.is_banned_at(ip("198.51.100.12"), 20));
        assert!(!b.is_banned_at(ip("198.51.100.11"), 20));
        assert!(!b.is_banned_at(ip("198.51.100.0"), 20));
    }

    #[test]
    fn exempt_addresses_are_never_banned() {
        let b = bans(|c| c.after_strikes = 1);
        for a in ["127.0.0.1", "::1", "::ffff:127.0.0.1"] {
            assert!(b.is_exempt(ip(a)));
            assert!(b.ban_at(ip(a), 0).is_none());
            assert!(b.strike_at(ip(a), 0).is_none());
            assert!(!b.is_banned_at(ip(a), 1));
        }
        assert!(!b.is_exempt(ip("127.0.0.2")));
        assert!(b.ban_at(ip("127.0.0.2"), 0).is_some());

        // A /24 ban over an exempt address still lets that address in.
        let b = bans(|c| c.ipv4_prefix = 24);
        b.ban_at(ip("127.0.0.2"), 0).unwrap();
        assert!(b.is_banned_at(ip("127.0.0.3"), 1));
        assert!(!b.is_banned_at(ip("127.0.0.1"), 1));
        assert!(b.covers_exempt(b.net_of(ip("127.0.0.2"))));

        let b = bans(|c| c.exempt = vec!["203.0.113.0/24".parse().unwrap()]);
        assert!(b.ban_at(ip("203.0.113.9"), 0).is_none());
        assert!(b.ban_at(ip("127.0.0.1"), 0).is_some());
    }

    #[test]
    fn strikes_within_the_window_ban() {
        let b = bans(|c| {
            c.after_strikes = 3;
            c.strike_window = Duration::from_secs(10);
        });
        let a = ip("192.0.2.9");
        assert!(b.strike_at(a, 0).is_none());
        assert!(b.strike_at(a, 4_000).is_none());
        assert!(!b.is_banned_at(a, 4_000));
        let added = b.strike_at(a, 9_999).unwrap();
        assert_eq!(added.net.to_string(), "192.0.2.9/32");
        assert!(b.is_banned_at(a, 10_000));
    }

    #[test]
    fn strikes_outside_the_window_do_not_ban() {
        let b = bans(|c| {
            c.after_strikes = 3;
            c.strike_window = Duration::from_secs(10);
        });
        let a = ip("192.0.2.9");
        assert!(b.strike_at(a, 0).is_none());
        assert!(b.strike_at(a, 5_000).is_none());
        // The window restarts here.
        assert!(b.strike_at(a, 10_000).is_none());
        assert!(b.strike_at(a, 12_000).is_none());
        assert!(!b.is_banned_at(a, 12_000));
        assert!(b.strike_at(a, 19_000).is_some());
        // Strikes of another address do not count.
        let other = bans(|c| c.after_strikes = 2);
        assert!(other.strike_at(ip("192.0.2.1"), 0).is_none());
        assert!(other.strike_at(ip("192.0.2.2"), 0).is_none());
        assert!(other.strike_at(ip("192.0.2.1"), 1).is_some());
    }

    #[test]
    fn zero_strikes_never_ban() {
        let b = bans(|c| c.after_strikes = 0);
        for t in 0..10 {
            assert!(b.strike_at(ip("192.0.2.9"), t).is_none());
        }
        assert!(b.ban_at(ip("192.0.2.9"), 10).is_some());
    }

    #[test]
    fn the_sink_gets_bans_and_reports_a_full_queue() {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let b = Bans::new(BanConfig {
            duration: Duration::from_secs(90),
            ..BanConfig::default()
        })
        .with_sink(tx);
        assert!(!b.ban_at(ip("192.0.2.1"), 0).unwrap().sink_failed);
        assert!(b.ban_at(ip("192.0.2.2"), 0).unwrap().sink_failed);
        assert_eq!(
            rx.try_recv().unwrap(),
            BanNotice {
                net: "192.0.2.1/32".parse().unwrap(),
                seconds: 90
            }
        );
        assert!(rx.try_recv().is_err());
        // A /24 over an exempt address is not handed to the kernel.
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        let b = bans(|c| c.ipv4_prefix = 24).with_sink(tx);
        assert!(!b.ban_at(ip("127.0.0.2"), 0).unwrap().sink_failed);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn entries_are_32_bytes() {
        // The memory bound in the docs (4096 × 32 B = 128 KiB per table) rests on this.
        assert!(std::mem::size_of::<Strike>() <= 32);
        assert!(std::mem::size_of::<(Key, u64)>() <= 32);
        assert_eq!(BanConfig::default().capacity, 4096);
        assert_eq!(STRIKE_SLOTS, 4096);
    }

    #[test]
    fn the_check_without_bans_is_the_fast_path() {
        let b = bans(|_| {});
        assert_eq!(b.active(), 0);
        assert!(!b.is_banned(ip("192.0.2.1")));
        // Strikes alone publish nothing.
        b.strike_at(ip("192.0.2.1"), 0);
        assert_eq!(b.active(), 0);
    }
}
