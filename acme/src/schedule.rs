//! When to renew and when to retry: pure functions of times in Unix seconds.
//!
//! - With ACME Renewal Information (RFC 9773) the CA's window decides: a uniformly random
//!   instant inside it, kept while the window does not move (certmagic does the same).
//! - Without it, renew when 1/3 of the lifetime is left.
//! - Either way, renew at once when 1/20 or less is left (a window that never opens must not
//!   let a certificate expire).
//! - After a failure, back off along certmagic's table, capped at 6 hours and at 1/10 of what
//!   is left of the certificate, so that a 6-day certificate gets many tries before it ends.

/// A certificate's validity, Unix seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: i64,
    pub not_after: i64,
}

impl Validity {
    fn lifetime(&self) -> i64 {
        (self.not_after - self.not_before).max(0)
    }

    /// The 1/3-lifetime-left mark (the fallback without ARI).
    pub fn fallback_renewal(&self) -> i64 {
        self.not_after - self.lifetime() / 3
    }

    /// The 1/20-lifetime-left mark: renew from here on whatever ARI says.
    pub fn emergency(&self) -> i64 {
        self.not_after - self.lifetime() / 20
    }
}

/// When to renew: the ARI instant if there is one, never later than the emergency mark.
pub fn renew_at(validity: Validity, ari_selected: Option<i64>) -> i64 {
    match ari_selected {
        Some(t) => t.min(validity.emergency()),
        None => validity.fallback_renewal(),
    }
}

/// An instant in the ARI window `[start, end]` from a random `u64`; `now` if the window has
/// begun already (RFC 9773 §4.2: renew immediately).
pub fn pick_in_window(start: i64, end: i64, now: i64, random: u64) -> i64 {
    if start <= now {
        return now;
    }
    let span = (end - start).max(0) as u64;
    start + (random % (span + 1)) as i64
}

/// certmagic's retry intervals (`async.go`), in seconds; the last repeats.
const RETRY_SECS: [i64; 12] = [
    60, 120, 120, 300, 600, 600, 600, 1200, 1800, 3600, 7200, 10800,
];
const RETRY_CAP_SECS: i64 = 6 * 3600;

/// The wait after the `failures`-th failure in a row (1 = the first), given what is left of
/// the certificate being served (`None` without one).
pub fn backoff(failures: u32, left: Option<i64>) -> i64 {
    let step = (failures.max(1) - 1) as usize;
    let wait = RETRY_SECS.get(step).copied().unwrap_or(RETRY_CAP_SECS);
    match left {
        Some(left) => wait.min((left / 10).max(60)),
        None => wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86400;

    #[test]
    fn fallback_is_a_third_left_and_ari_never_passes_the_emergency_mark() {
        let v = Validity {
            not_before: 0,
            not_after: 90 * DAY,
        };
        assert_eq!(renew_at(v, None), 60 * DAY);
        assert_eq!(renew_at(v, Some(70 * DAY)), 70 * DAY);
        // A window after 1/20 left (4.5 days) is ignored.
        assert_eq!(renew_at(v, Some(89 * DAY)), 90 * DAY - 90 * DAY / 20);
        // Six-day certificates: two days left, then 7.2 hours.
        let short = Validity {
            not_before: 0,
            not_after: 6 * DAY,
        };
        assert_eq!(renew_at(short, None), 4 * DAY);
        assert_eq!(short.emergency(), 6 * DAY - 25920);
    }

    #[test]
    fn an_open_window_means_now_and_a_future_one_a_point_inside() {
        assert_eq!(pick_in_window(10, 20, 15, 7), 15);
        for r in [0, 1, 5, 10, 11, u64::MAX] {
            let t = pick_in_window(100, 110, 50, r);
            assert!((100..=110).contains(&t), "{t}");
        }
        assert_eq!(pick_in_window(100, 90, 50, 12345), 100);
    }

    #[test]
    fn backoff_grows_to_six_hours_but_stays_under_a_tenth_of_what_is_left() {
        assert_eq!(backoff(1, None), 60);
        assert_eq!(backoff(2, None), 120);
        assert_eq!(backoff(12, None), 10800);
        assert_eq!(backoff(13, None), 6 * 3600);
        assert_eq!(backoff(500, None), 6 * 3600);
        assert_eq!(backoff(500, Some(20 * 3600)), 2 * 3600);
        // Never below a minute, even for an expired certificate.
        assert_eq!(backoff(500, Some(-5)), 60);
    }
}
