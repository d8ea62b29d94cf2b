//! Rate-limited logging for lines an outsider can trigger (bad requests, timeouts, descriptor
//! exhaustion, handler panics): an attack must not turn into a disk flood.
//!
//! Each kind of message may log at most [`PER_WINDOW`] lines per one-second window on each
//! thread; the rest are counted, and when the window ends one summary line says how many were
//! suppressed. The state is thread-local (workers never share it), so checking costs no lock
//! and no shared atomic; the time is the caller's (the worker's cached clock), so it costs no
//! syscall either. With W workers a kind logs at most W × [`PER_WINDOW`] lines a second.
//!
//! ```ignore
//! if tern_runtime::ratelog::admit("bad_request", cx.clock.now_ms()) {
//!     tracing::info!(%peer, "bad request: {cause}");
//! }
//! ```
//!
//! A summary is written when the next message of its kind arrives after the window, or when
//! the worker calls [`flush`] (once per loop turn; one thread-local load when nothing is
//! pending).

use std::cell::RefCell;

/// Lines per kind per window per thread.
pub const PER_WINDOW: u32 = 5;
/// Window length in milliseconds.
pub const WINDOW_MS: u64 = 1_000;

/// The limiter itself: pure state, driven by the caller's clock (so tests inject the time).
#[derive(Debug)]
pub struct RateLimiter {
    per_window: u32,
    window_ms: u64,
    kinds: Vec<KindState>,
    /// The earliest end of a window with suppressed messages (`u64::MAX`: none pending).
    next_due_ms: u64,
}

#[derive(Debug)]
struct KindState {
    kind: &'static str,
    window_start_ms: u64,
    logged: u32,
    suppressed: u64,
}

impl RateLimiter {
    pub const fn new(per_window: u32, window_ms: u64) -> RateLimiter {
        RateLimiter {
            per_window,
            window_ms,
            kinds: Vec::new(),
            next_due_ms: u64::MAX,
        }
    }

    /// Whether a message of `kind` may be logged at `now_ms`. Before answering, a window of
    /// this kind that has ended reports its suppressed count to `summary` (kind, count).
    pub fn admit(
        &mut self,
        kind: &'static str,
        now_ms: u64,
        mut summary: impl FnMut(&'static str, u64),
    ) -> bool {
        let window_ms = self.window_ms;
        let idx = match self.kinds.iter().position(|k| k.kind == kind) {
            Some(i) => i,
            None => {
                self.kinds.push(KindState {
                    kind,
                    window_start_ms: now_ms,
                    logged: 0,
                    suppressed: 0,
                });
                self.kinds.len() - 1
            }
        };
        let k = &mut self.kinds[idx];
        if now_ms.saturating_sub(k.window_start_ms) >= window_ms {
            if k.suppressed > 0 {
                summary(k.kind, k.suppressed);
            }
            k.window_start_ms = now_ms;
            k.logged = 0;
            k.suppressed = 0;
        }
        if k.logged < self.per_window {
            k.logged += 1;
            return true;
        }
        k.suppressed += 1;
        let due = k.window_start_ms + window_ms;
        self.next_due_ms = self.next_due_ms.min(due);
        false
    }

    /// Reports every ended window that suppressed messages. Cheap when nothing is pending.
    #[inline]
    pub fn flush(&mut self, now_ms: u64, summary: impl FnMut(&'static str, u64)) {
        if now_ms >= self.next_due_ms {
            self.flush_slow(now_ms, summary);
        }
    }

    #[cold]
    fn flush_slow(&mut self, now_ms: u64, mut summary: impl FnMut(&'static str, u64)) {
        let mut next = u64::MAX;
        for k in &mut self.kinds {
            if k.suppressed == 0 {
                continue;
            }
            let end = k.window_start_ms + self.window_ms;
            if now_ms >= end {
                summary(k.kind, k.suppressed);
                // A new, empty window starts now: the next messages log again at once.
                k.window_start_ms = now_ms;
                k.logged = 0;
                k.suppressed = 0;
            } else {
                next = next.min(end);
            }
        }
        self.next_due_ms = next;
    }
}

thread_local! {
    static LIMITER: RefCell<RateLimiter> = const { RefCell::new(RateLimiter::new(PER_WINDOW, WINDOW_MS)) };
}

fn log_summary(kind: &'static str, suppressed: u64) {
    tracing::warn!("suppressed {suppressed} similar messages ({kind}) in the last second");
}

/// Whether this thread may log a message of `kind` now (`now_ms`: the worker clock's
/// milliseconds). Logs the summary of an ended window first when there is one.
pub fn admit(kind: &'static str, now_ms: u64) -> bool {
    LIMITER
        .try_with(|l| match l.try_borrow_mut() {
            Ok(mut l) => l.admit(kind, now_ms, log_summary),
            Err(_) => false,
        })
        .unwrap_or(false)
}

/// Writes the summaries of ended windows on this thread. Call once per loop turn.
#[inline]
pub fn flush(now_ms: u64) {
    let _ = LIMITER.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            l.flush(now_ms, log_summary);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives a limiter with a fake clock, collecting the summaries.
    struct Harness {
        limiter: RateLimiter,
        now_ms: u64,
        summaries: Vec<(&'static str, u64)>,
    }

    impl Harness {
        fn new(per_window: u32) -> Harness {
            Harness {
                limiter: RateLimiter::new(per_window, 1_000),
                now_ms: 10_000,
                summaries: Vec::new(),
            }
        }

        fn admit(&mut self, kind: &'static str) -> bool {
            let s = &mut self.summaries;
            self.limiter.admit(kind, self.now_ms, |k, n| s.push((k, n)))
        }

        fn flush(&mut self) {
            let s = &mut self.summaries;
            self.limiter.flush(self.now_ms, |k, n| s.push((k, n)));
        }

        fn advance(&mut self, ms: u64) {
            self.now_ms += ms;
        }
    }

    #[test]
    fn admits_n_per_window_then_suppresses() {
        let mut h = Harness::new(3);
        let admitted = (0..10).filter(|_| h.admit("bad")).count();
        assert_eq!(admitted, 3);
        assert!(h.summaries.is_empty(), "no summary before the window ends");
        h.advance(999);
        assert!(!h.admit("bad"));
        h.flush();
        assert!(h.summaries.is_empty(), "window not over at 999 ms");
    }

    #[test]
    fn summary_when_window_ends_by_flush() {
        let mut h = Harness::new(2);
        for _ in 0..7 {
            h.admit("timeout");
        }
        h.advance(1_000);
        h.flush();
        assert_eq!(h.summaries, vec![("timeout", 5)]);
        // Only once, and the next window admits again.
        h.flush();
        assert_eq!(h.summaries.len(), 1);
        assert!(h.admit("timeout"));
        assert!(h.admit("timeout"));
        assert!(!h.admit("timeout"));
    }

    #[test]
    fn summary_when_window_ends_by_next_message() {
        let mut h = Harness::new(1);
        assert!(h.admit("emfile"));
        assert!(!h.admit("emfile"));
        assert!(!h.admit("emfile"));
        h.advance(1_500);
        assert!(h.admit("emfile"), "a new window admits again");
        assert_eq!(h.summaries, vec![("emfile", 2)]);
        h.advance(1_000);
        h.flush();
        assert_eq!(
            h.summaries.len(),
            1,
            "nothing was suppressed in that window"
        );
    }

    #[test]
    fn kinds_are_limited_separately() {
        let mut h = Harness::new(2);
        assert!(h.admit("a"));
        assert!(h.admit("a"));
        assert!(!h.admit("a"));
        assert!(h.admit("b"), "another kind has its own budget");
        assert!(h.admit("b"));
        assert!(!h.admit("b"));
        assert!(!h.admit("b"));
        h.advance(1_000);
        h.flush();
        h.summaries.sort();
        assert_eq!(h.summaries, vec![("a", 1), ("b", 2)]);
    }

    #[test]
    fn quiet_limiter_flush_is_a_no_op() {
        let mut h = Harness::new(5);
        assert!(h.admit("x"));
        h.advance(10_000);
        h.flush();
        assert!(h.summaries.is_empty());
        assert_eq!(h.limiter.next_due_ms, u64::MAX);
    }

    #[test]
    fn sustained_flood_logs_a_bounded_number_of_lines() {
        let mut h = Harness::new(5);
        let mut logged = 0;
        // 100 000 messages over 10 s: at most 5 lines plus one summary per second.
        for i in 0..100_000u64 {
            if i % 10_000 == 0 && i > 0 {
                h.advance(1_000);
            }
            if h.admit("flood") {
                logged += 1;
            }
            h.flush();
        }
        h.advance(1_000);
        h.flush();
        assert_eq!(logged, 50);
        assert_eq!(h.summaries.len(), 10);
        let suppressed: u64 = h.summaries.iter().map(|(_, n)| n).sum();
        assert_eq!(suppressed, 100_000 - 50);
    }

    #[test]
    fn thread_local_helpers_do_not_panic_and_limit() {
        let admitted = (0..100).filter(|_| admit("helper-test", 5)).count();
        assert_eq!(admitted, PER_WINDOW as usize);
        flush(5 + WINDOW_MS);
        assert!(admit("helper-test", 5 + WINDOW_MS));
    }
}
