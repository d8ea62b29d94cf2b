use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A worker's view of time, refreshed once per event-loop turn. Monotonic milliseconds drive
/// timers; wall-clock seconds change once a second, so the layer above can cache whatever it
/// formats from them (the server's `Date` line) and redo it only when they do.
pub struct Clock {
    /// Set by [`Clock::manual`]: time moves only by [`Clock::advance_ms`].
    manual: bool,
    start: Instant,
    now_us: u64,
    now_ms: u64,
    unix_secs: u64,
}

impl Clock {
    pub fn new() -> Clock {
        let unix_secs = unix_now();
        Clock {
            manual: false,
            start: Instant::now(),
            now_us: 0,
            now_ms: 0,
            unix_secs,
        }
    }

    /// A clock that stands still until told to move: for tests that drive a worker by hand
    /// (timeouts without waiting). Its wall clock starts at `unix_secs`.
    pub fn manual(unix_secs: u64) -> Clock {
        Clock {
            manual: true,
            start: Instant::now(),
            now_us: 0,
            now_ms: 0,
            unix_secs,
        }
    }

    /// Moves a manual clock on (the wall clock too, by whole seconds).
    pub fn advance_ms(&mut self, ms: u64) {
        debug_assert!(self.manual, "only a manual clock is moved by hand");
        let before = self.now_us / 1_000_000;
        self.now_us += ms * 1000;
        self.now_ms = self.now_us / 1000;
        self.unix_secs += self.now_us / 1_000_000 - before;
    }

    /// Refreshes the cached time. Two vDSO calls, no syscalls.
    pub fn update(&mut self) {
        if self.manual {
            return;
        }
        self.now_us = self.start.elapsed().as_micros() as u64;
        self.now_ms = self.now_us / 1000;
        self.unix_secs = unix_now();
    }

    /// Milliseconds since this worker started (monotonic).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Microseconds since this worker started, as of the last update (when the loop turn
    /// began: the moment a request's bytes were seen ready).
    pub fn now_us(&self) -> u64 {
        self.now_us
    }

    /// Microseconds since this worker started, read now rather than cached (one vDSO call):
    /// for the end of an access log's duration.
    pub fn precise_us(&self) -> u64 {
        if self.manual {
            return self.now_us;
        }
        self.start.elapsed().as_micros() as u64
    }

    /// Wall-clock seconds since the Unix epoch, as of the last update.
    pub fn unix_secs(&self) -> u64 {
        self.unix_secs
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_secs_track_the_wall_clock() {
        let mut clock = Clock::new();
        clock.update();
        let before = unix_now();
        assert!(clock.unix_secs().abs_diff(before) <= 1);
    }

    #[test]
    fn monotonic_ms_advances() {
        let mut clock = Clock::new();
        clock.update();
        let a = clock.now_ms();
        std::thread::sleep(std::time::Duration::from_millis(20));
        clock.update();
        assert!(clock.now_ms() >= a + 15);
        assert_eq!(clock.now_ms(), clock.now_us() / 1000);
        assert!(clock.precise_us() >= clock.now_us());
    }

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let mut clock = Clock::manual(1_000_000_000);
        std::thread::sleep(std::time::Duration::from_millis(5));
        clock.update();
        assert_eq!((clock.now_ms(), clock.precise_us()), (0, 0));
        assert_eq!(clock.unix_secs(), 1_000_000_000);
        clock.advance_ms(999);
        assert_eq!(clock.unix_secs(), 1_000_000_000, "still the same second");
        clock.advance_ms(1);
        assert_eq!(clock.now_ms(), 1000);
        assert_eq!(clock.unix_secs(), 1_000_000_001);
    }
}
