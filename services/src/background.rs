//! Helpers for background threads that share cores with the workers.

/// Lowers the calling thread's scheduling priority to the weakest (nice 19), so rebuilding
/// snapshots only uses CPU the workers leave idle. Best effort: failure is logged and ignored.
pub fn lower_priority() {
    // SAFETY: gettid has no preconditions; setpriority on our own thread id only changes this
    // thread's nice value (Linux applies PRIO_PROCESS with a tid to that one thread).
    let rc = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19)
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!("could not lower a background thread's priority: {e}");
    }
}

/// Gives the CPU back at short intervals during a long pass of a background thread (a scan of
/// the whole game state, a snapshot). A lower priority alone does not bound how long such a
/// thread holds a core the workers share: once the scheduler picks it, it runs a whole slice
/// (measured: under the claims load on one core with 5 M addresses held, the score rebuild
/// ran for up to 5.4 ms at a time; with a yield every 100 µs, 0.8 ms at most).
/// Yielding every `every` of work bounds the stall a worker sees to about that.
pub struct Yielder {
    every: std::time::Duration,
    since: std::time::Instant,
    points: u32,
    yields: u64,
}

/// The clock is read once per this many `point`s (a point costs a few ns, the clock ~25 ns).
const POINTS_PER_CLOCK: u32 = 64;

impl Yielder {
    pub fn new(every: std::time::Duration) -> Yielder {
        Yielder {
            every,
            since: std::time::Instant::now(),
            points: 0,
            yields: 0,
        }
    }

    /// A place where the pass may give the CPU away: hold no lock a worker may want here.
    pub fn point(&mut self) {
        self.points += 1;
        if !self.points.is_multiple_of(POINTS_PER_CLOCK) || self.since.elapsed() < self.every {
            return;
        }
        std::thread::yield_now();
        self.yields += 1;
        self.since = std::time::Instant::now();
    }

    /// Times the CPU was given back so far.
    pub fn yields(&self) -> u64 {
        self.yields
    }
}

/// How long a background pass works between two yields (`Yielder`): a worker's request
/// waits at most about this for a core it shares with the pass.
pub const YIELD_EVERY: std::time::Duration = std::time::Duration::from_micros(100);

/// This thread's nice value.
pub fn current_nice() -> i32 {
    // SAFETY: as above; getpriority only reads. errno is cleared first because -1 is also a
    // valid nice value.
    unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_yielder_gives_the_cpu_back_once_its_time_is_up() {
        let mut every_time = super::Yielder::new(Duration::ZERO);
        let mut never = super::Yielder::new(Duration::MAX);
        for _ in 0..640 {
            every_time.point();
            never.point();
        }
        // The clock is looked at once per POINTS_PER_CLOCK points.
        assert_eq!(every_time.yields(), 640 / super::POINTS_PER_CLOCK as u64);
        assert_eq!(never.yields(), 0);
    }

    #[test]
    fn lowers_only_the_calling_thread() {
        let before = super::current_nice();
        let inside = std::thread::spawn(|| {
            super::lower_priority();
            super::current_nice()
        })
        .join()
        .unwrap();
        assert_eq!(inside, 19);
        assert_eq!(super::current_nice(), before);
    }
}
