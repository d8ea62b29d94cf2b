//! The connections' timers of a worker's HTTP/3 side: µs deadlines in one heap, earliest
//! first. QUIC's timers (ACK delay, loss detection, pacing) are a millisecond or less, finer
//! than the worker's 100 ms wheel; the loop sleeps until the first.
//!
//! A connection arms its timer again only when its deadline moves earlier; the entry it
//! supersedes stays until its time comes, and is then skipped (its time is not the
//! connection's armed one). Should superseded entries pile up, the heap is made again from
//! the connections' armed times.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

pub(super) struct Deadlines {
    /// (due at, µs on the worker's clock; connection key).
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    /// Superseded entries allowed beyond 4 per connection before the heap is made again.
    pub stale_allowed: usize,
}

impl Deadlines {
    pub fn new(stale_allowed: usize) -> Deadlines {
        Deadlines {
            heap: BinaryHeap::new(),
            stale_allowed,
        }
    }

    /// When the earliest entry is due (it may be a superseded one: waking for it is harmless).
    pub fn next(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// Connection `key`'s timer at `at_us`. `connections` are open; `armed` gives every
    /// armed connection's (key, time), asked only to make the heap again.
    pub fn arm(
        &mut self,
        key: u64,
        at_us: u64,
        connections: usize,
        armed: impl FnOnce() -> Vec<(u64, u64)>,
    ) {
        self.heap.push(Reverse((at_us, key)));
        if self.heap.len() > 4 * connections + self.stale_allowed {
            let entries: Vec<_> = armed()
                .into_iter()
                .map(|(k, at)| Reverse((at, k)))
                .collect();
            self.heap = BinaryHeap::from(entries);
        }
    }

    /// The earliest entry due by `now_us`, as (key, time): the caller skips it unless the
    /// time is still its connection's armed one.
    pub fn pop_due(&mut self, now_us: u64) -> Option<(u64, u64)> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now_us => {}
            _ => return None,
        }
        self.heap.pop().map(|Reverse((at, key))| (key, at))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deadline moved earlier 10 000 times leaves a bounded heap, and what is due comes
    /// out earliest first with the armed times intact.
    #[test]
    fn superseded_entries_are_dropped_and_armed_ones_kept() {
        let mut d = Deadlines::new(16);
        // Connection 1 armed once, far ahead; connection 2 moved earlier again and again.
        let mut armed = vec![(1, 50_000), (2, 0)];
        d.arm(1, 50_000, 2, || unreachable!("no pile-up yet"));
        for at in (10_000..20_000).rev() {
            armed[1].1 = at;
            let now = armed.clone();
            d.arm(2, at, 2, || now);
            assert!(d.len() <= 4 * 2 + 16 + 1, "{} entries", d.len());
        }
        assert_eq!(d.next(), Some(10_000));
        assert_eq!(d.pop_due(9_999), None, "nothing due yet");
        // Whatever superseded entries remain are later than the armed time and carry a
        // time that is no longer connection 2's.
        assert_eq!(d.pop_due(10_000), Some((2, 10_000)));
        let mut rest = Vec::new();
        while let Some(e) = d.pop_due(u64::MAX) {
            rest.push(e);
        }
        assert!(rest.contains(&(1, 50_000)), "{rest:?}");
        assert!(
            rest.windows(2).all(|w| w[0].1 <= w[1].1),
            "earliest first: {rest:?}"
        );
        assert!(
            rest.iter().all(|&(k, at)| k == 1 || at > 10_000),
            "{rest:?}"
        );
    }
}
