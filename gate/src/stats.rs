//! The gate's counters for /statusz and /metrics: one cache-line-padded row per worker (and
//! one shared by the check pool's threads), summed when a page asks.

use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use tern_services::metrics::Metric;

/// (metric name, label key and value, help).
type Row = (
    &'static str,
    Option<(&'static str, &'static str)>,
    &'static str,
);

/// Every fixed counter. Labelled rows of one name are adjacent, as the Prometheus format
/// wants.
pub const COUNTERS: &[Row] = &[
    (
        "gate_challenges_issued",
        Some(("kind", "pow")),
        "challenge pages served",
    ),
    (
        "gate_challenges_issued",
        Some(("kind", "timelock")),
        "challenge pages served",
    ),
    (
        "gate_challenges_passed",
        None,
        "challenges solved and turned into a session",
    ),
    (
        "gate_challenges_failed",
        Some(("cause", "malformed")),
        "challenge answers refused, by cause",
    ),
    (
        "gate_challenges_failed",
        Some(("cause", "unknown_key")),
        "challenge answers refused, by cause",
    ),
    (
        "gate_challenges_failed",
        Some(("cause", "bad_mac")),
        "challenge answers refused, by cause",
    ),
    (
        "gate_challenges_failed",
        Some(("cause", "expired")),
        "challenge answers refused, by cause",
    ),
    (
        "gate_challenges_failed",
        Some(("cause", "too_early")),
        "challenge answers refused, by cause",
    ),
    (
        "gate_challenges_failed",
        Some(("cause", "wrong_prefix")),
        "challenge answers refused, by cause",
    ),
    (
        "gate_challenges_failed",
        Some(("cause", "wrong_client")),
        "challenge answers refused, by cause",
    ),
    (
        "gate_challenges_failed",
        Some(("cause", "too_easy")),
        "challenge answers refused, by cause",
    ),
    (
        "gate_challenges_failed",
        Some(("cause", "replayed")),
        "challenge answers refused, by cause",
    ),
    (
        "gate_challenges_failed",
        Some(("cause", "replay_full")),
        "challenge answers refused, by cause",
    ),
    (
        "gate_challenges_rate_limited",
        None,
        "challenge pages and answers refused by the per-network limit",
    ),
    (
        "gate_logins",
        Some(("outcome", "accepted")),
        "login attempts, by outcome",
    ),
    (
        "gate_logins",
        Some(("outcome", "refused")),
        "login attempts, by outcome",
    ),
    (
        "gate_logins",
        Some(("outcome", "rate_limited")),
        "login attempts, by outcome",
    ),
    (
        "gate_logins",
        Some(("outcome", "locked_out")),
        "login attempts, by outcome",
    ),
    (
        "gate_logins",
        Some(("outcome", "busy")),
        "login attempts, by outcome",
    ),
    (
        "gate_logins",
        Some(("outcome", "unavailable")),
        "login attempts, by outcome",
    ),
    (
        "gate_logins",
        Some(("outcome", "forged")),
        "login attempts, by outcome",
    ),
    (
        "gate_sessions_refused",
        Some(("cause", "malformed")),
        "session cookies refused, by cause",
    ),
    (
        "gate_sessions_refused",
        Some(("cause", "unknown_key")),
        "session cookies refused, by cause",
    ),
    (
        "gate_sessions_refused",
        Some(("cause", "bad_mac")),
        "session cookies refused, by cause",
    ),
    (
        "gate_sessions_refused",
        Some(("cause", "expired")),
        "session cookies refused, by cause",
    ),
    (
        "gate_sessions_refused",
        Some(("cause", "wrong_prefix")),
        "session cookies refused, by cause",
    ),
    (
        "gate_sessions_refused",
        Some(("cause", "stale_realm")),
        "session cookies refused, by cause",
    ),
    (
        "gate_sessions_refused",
        Some(("cause", "wrong_client")),
        "session cookies refused, by cause",
    ),
    (
        "gate_sessions_refused",
        Some(("cause", "too_weak")),
        "session cookies refused, by cause",
    ),
    (
        "gate_paths_refused",
        None,
        "auth requests refused because the original path has no canonical form",
    ),
];

/// Index into [`COUNTERS`].
#[derive(Debug, Clone, Copy)]
pub enum C {
    IssuedPow = 0,
    IssuedTimeLock,
    Passed,
    FailedMalformed,
    FailedUnknownKey,
    FailedBadMac,
    FailedExpired,
    FailedTooEarly,
    FailedWrongPrefix,
    FailedWrongClient,
    FailedTooEasy,
    FailedReplayed,
    FailedReplayFull,
    ChallengeRateLimited,
    LoginAccepted,
    LoginRefused,
    LoginRateLimited,
    LoginLockedOut,
    LoginBusy,
    LoginUnavailable,
    LoginForged,
    SessionMalformed,
    SessionUnknownKey,
    SessionBadMac,
    SessionExpired,
    SessionWrongPrefix,
    SessionStaleRealm,
    /// Valid, but issued to another user agent.
    SessionWrongClient,
    /// Valid, but earned with less than the rule asks (a time-lock for a proof of work, fewer
    /// bits, a pass or a guest for a password login).
    SessionTooWeak,
    /// `/auth` was asked about a path with no canonical form.
    PathRefused,
}

const N: usize = 30;

pub struct Stats {
    rows: Box<[CachePadded<[AtomicU64; N]>]>,
}

impl Stats {
    /// One row per worker, plus one for the check pool.
    pub fn new(workers: usize) -> Stats {
        debug_assert_eq!(COUNTERS.len(), N);
        Stats {
            rows: (0..workers + 1)
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// The pool's row (its threads share it).
    pub fn pool_slot(&self) -> usize {
        self.rows.len() - 1
    }

    #[inline]
    pub fn bump(&self, slot: usize, c: C) {
        let row = &self.rows[slot.min(self.rows.len() - 1)];
        row[c as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn sum(&self, c: C) -> u64 {
        self.rows
            .iter()
            .map(|r| r[c as usize].load(Ordering::Relaxed))
            .sum()
    }

    pub fn metrics(&self) -> Vec<Metric> {
        COUNTERS
            .iter()
            .enumerate()
            .map(|(i, (name, label, help))| {
                let total = self.rows.iter().map(|r| r[i].load(Ordering::Relaxed)).sum();
                let m = Metric::counter(name, help, total);
                match label {
                    Some((k, v)) => m.with_label(k, *v),
                    None => m,
                }
            })
            .collect()
    }
}

/// Policy decisions of one loaded policy, per worker and rule (a reload brings new rules and
/// new counters).
pub struct Decisions {
    /// rows[worker][rule]
    rows: Box<[CachePadded<Box<[AtomicU64]>>]>,
}

impl Decisions {
    pub fn new(workers: usize, rules: usize) -> Decisions {
        Decisions {
            rows: (0..workers.max(1))
                .map(|_| CachePadded::new((0..rules).map(|_| AtomicU64::new(0)).collect()))
                .collect(),
        }
    }

    #[inline]
    pub fn bump(&self, worker: usize, rule: usize) {
        if let Some(c) = self.rows.get(worker).and_then(|r| r.get(rule)) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn sum(&self, rule: usize) -> u64 {
        self.rows
            .iter()
            .filter_map(|r| r.get(rule))
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_line_up_with_the_enum() {
        assert_eq!(COUNTERS.len(), N);
        assert_eq!(
            COUNTERS[C::SessionStaleRealm as usize].1,
            Some(("cause", "stale_realm"))
        );
        assert_eq!(
            COUNTERS[C::SessionTooWeak as usize].1,
            Some(("cause", "too_weak"))
        );
        assert_eq!(
            COUNTERS[C::FailedReplayFull as usize].1,
            Some(("cause", "replay_full"))
        );
        assert_eq!(
            COUNTERS[C::LoginForged as usize].1,
            Some(("outcome", "forged"))
        );
        let s = Stats::new(2);
        s.bump(0, C::Passed);
        s.bump(1, C::Passed);
        s.bump(s.pool_slot(), C::LoginAccepted);
        assert_eq!(s.sum(C::Passed), 2);
        assert_eq!(s.sum(C::LoginAccepted), 1);
        let d = Decisions::new(2, 3);
        d.bump(0, 2);
        d.bump(1, 2);
        d.bump(1, 9);
        assert_eq!(d.sum(2), 2);
    }
}
