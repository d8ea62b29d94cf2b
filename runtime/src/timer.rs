/// Identifies what a timer is for; the runtime hands it back unchanged when it fires. The layer
/// above packs a connection slot and generation into it.
pub type TimerKey = u64;

/// Entries a slot keeps room for after it empties (shrinking below this would only make the
/// next arms reallocate).
const SLOT_KEEP: usize = 64;

/// A hashed timing wheel with lazy cancellation.
///
/// Entries are never removed early: a connection that extends its deadline simply keeps a
/// deadline field of its own, and when the old entry fires the owner sees the deadline has
/// moved and re-arms. Refreshing a keep-alive deadline per request is therefore a plain store,
/// and arming is O(1).
pub struct TimerWheel {
    slots: Vec<Vec<(TimerKey, u64)>>,
    tick_ms: u64,
    /// The tick up to which all slots have been processed.
    current_tick: u64,
    len: usize,
}

impl TimerWheel {
    /// `slots` × `tick_ms` is the horizon; later entries wait in a slot for extra rotations.
    pub fn new(tick_ms: u64, slots: usize) -> TimerWheel {
        assert!(tick_ms > 0 && slots > 0);
        TimerWheel {
            slots: (0..slots).map(|_| Vec::new()).collect(),
            tick_ms,
            current_tick: 0,
            len: 0,
        }
    }

    /// Arms a timer that fires at or after `at_ms` (in the clock's monotonic milliseconds).
    pub fn schedule(&mut self, key: TimerKey, at_ms: u64) {
        // Never place an entry in a slot that has already been swept this rotation.
        let tick = (at_ms.div_ceil(self.tick_ms)).max(self.current_tick + 1);
        let slot = (tick % self.slots.len() as u64) as usize;
        self.slots[slot].push((key, at_ms));
        self.len += 1;
    }

    /// Moves every entry due at `now_ms` into `fired`, as `(key, at_ms)`.
    pub fn expire(&mut self, now_ms: u64, fired: &mut Vec<(TimerKey, u64)>) {
        let now_tick = now_ms / self.tick_ms;
        if now_tick <= self.current_tick || self.len == 0 {
            self.current_tick = self.current_tick.max(now_tick);
            return;
        }
        let n = self.slots.len() as u64;
        let steps = (now_tick - self.current_tick).min(n);
        for step in 1..=steps {
            let slot = ((self.current_tick + step) % n) as usize;
            let entries = &mut self.slots[slot];
            let before = entries.len();
            entries.retain(|&(key, at)| {
                if at <= now_ms {
                    fired.push((key, at));
                    false
                } else {
                    true
                }
            });
            self.len -= before - entries.len();
            // A burst (thousands of connections arming in one tick) must not leave its peak
            // capacity in the slot for good: over hours every slot would hold one (up to
            // 1024 × the largest burst). Shrinking happens only after such a burst.
            if entries.capacity() > SLOT_KEEP && entries.len() < entries.capacity() / 4 {
                entries.shrink_to((entries.len() * 2).max(SLOT_KEEP));
            }
        }
        self.current_tick = now_tick;
    }

    /// Milliseconds until the next tick boundary if anything is armed: the longest the event
    /// loop may sleep without making a timer late by more than one tick.
    pub fn poll_timeout_ms(&self, now_ms: u64) -> Option<u64> {
        (self.len > 0).then(|| self.tick_ms - now_ms % self.tick_ms)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fire(w: &mut TimerWheel, now: u64) -> Vec<TimerKey> {
        let mut out = Vec::new();
        w.expire(now, &mut out);
        out.into_iter().map(|(k, _)| k).collect()
    }

    #[test]
    fn fires_at_deadline_not_before() {
        let mut w = TimerWheel::new(10, 64);
        w.schedule(1, 105);
        w.schedule(2, 50);
        assert!(fire(&mut w, 40).is_empty());
        assert_eq!(fire(&mut w, 60), vec![2]);
        assert!(fire(&mut w, 100).is_empty());
        assert_eq!(fire(&mut w, 110), vec![1]);
        assert!(w.is_empty());
    }

    #[test]
    fn deadlines_beyond_the_horizon_wait_extra_rotations() {
        let mut w = TimerWheel::new(10, 8); // 80 ms horizon
        w.schedule(7, 500);
        for now in (0..500).step_by(10) {
            assert!(fire(&mut w, now).is_empty(), "fired early at {now}");
        }
        assert_eq!(fire(&mut w, 500), vec![7]);
    }

    #[test]
    fn a_long_sleep_fires_everything_due() {
        let mut w = TimerWheel::new(10, 8);
        for k in 0..20 {
            w.schedule(k, k * 7);
        }
        let mut got = fire(&mut w, 10_000);
        got.sort();
        assert_eq!(got, (0..20).collect::<Vec<_>>());
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn a_burst_does_not_leave_its_peak_capacity_behind() {
        let mut w = TimerWheel::new(10, 8);
        for k in 0..10_000 {
            w.schedule(k, 50);
        }
        assert_eq!(fire(&mut w, 60).len(), 10_000);
        let kept: usize = w.slots.iter().map(Vec::capacity).sum();
        assert!(
            kept <= 8 * SLOT_KEEP,
            "{kept} entries of room kept after the burst"
        );
    }

    #[test]
    fn past_deadline_fires_on_next_expire() {
        let mut w = TimerWheel::new(10, 8);
        let _ = fire(&mut w, 1000);
        w.schedule(3, 990);
        assert_eq!(fire(&mut w, 1010), vec![3]);
    }
}
