use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tern_codec::{format_date_line, DATE_LINE_LEN};

/// A worker's view of time, refreshed once per event-loop turn. Monotonic milliseconds drive
/// timers; the wall-clock `Date` line is re-formatted only when the second changes, so a
/// response never pays for date formatting.
pub struct Clock {
    start: Instant,
    now_ms: u64,
    unix_secs: u64,
    date_line: [u8; DATE_LINE_LEN],
}

impl Clock {
    pub fn new() -> Clock {
        let unix_secs = unix_now();
        Clock {
            start: Instant::now(),
            now_ms: 0,
            unix_secs,
            date_line: format_date_line(unix_secs),
        }
    }

    /// Refreshes the cached time. Two vDSO calls, no syscalls.
    pub fn update(&mut self) {
        self.now_ms = self.start.elapsed().as_millis() as u64;
        let unix = unix_now();
        if unix != self.unix_secs {
            self.unix_secs = unix;
            self.date_line = format_date_line(unix);
        }
    }

    /// Milliseconds since this worker started (monotonic).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Wall-clock seconds since the Unix epoch, as of the last update.
    pub fn unix_secs(&self) -> u64 {
        self.unix_secs
    }

    /// The `Date: ...\r\n` line for the current second.
    pub fn date_line(&self) -> &[u8] {
        &self.date_line
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
    fn date_line_tracks_wall_clock() {
        let mut clock = Clock::new();
        clock.update();
        let expected = format_date_line(clock.unix_secs());
        assert_eq!(clock.date_line(), &expected[..]);
        assert!(clock.date_line().starts_with(b"Date: "));
    }

    #[test]
    fn monotonic_ms_advances() {
        let mut clock = Clock::new();
        clock.update();
        let a = clock.now_ms();
        std::thread::sleep(std::time::Duration::from_millis(20));
        clock.update();
        assert!(clock.now_ms() >= a + 15);
    }
}
