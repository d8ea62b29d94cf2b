//! What happened on a cache, counted per worker for /metrics.

use std::sync::atomic::{AtomicU64, Ordering};

use tern_cache::{Bypass, Uncacheable};

/// What happened on a cache: one slot each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    Hit,
    Miss,
    /// Found, but stale: dropped and fetched again (also counted as a miss).
    Expired,
    /// A hit answered 304 from the client's validators (also counted as a hit).
    NotModified,
    Stored,
    Invalidated,
    /// A miss that waited for another request's fill of its key (then coalesced, timed
    /// out, or sent on).
    Waited,
    /// A miss answered from the fill it waited for.
    Coalesced,
    /// A stale entry served while another request refreshes it.
    StaleUpdating,
    /// A stale entry served because the app failed.
    StaleError,
    /// A stale entry the app confirmed (304 to a conditional refresh).
    Revalidated,
    /// A miss that waited the lock time for another's fill, then went to the app.
    LockTimeout,
    /// An answer not stored because a write to the cache's folder failed.
    DiskWriteFailed,
    Bypassed(Bypass),
    Uncacheable(Uncacheable),
}

const N_PLAIN: usize = 13;
/// Slots in a block: the plain counts, then one per bypass and one per uncacheable reason.
pub const N_COUNTS: usize = N_PLAIN + Bypass::ALL.len() + Uncacheable::ALL.len();

impl Count {
    fn index(self) -> usize {
        match self {
            Count::Hit => 0,
            Count::Miss => 1,
            Count::Expired => 2,
            Count::NotModified => 3,
            Count::Stored => 4,
            Count::Invalidated => 5,
            Count::Coalesced => 6,
            Count::LockTimeout => 7,
            Count::Waited => 8,
            Count::StaleUpdating => 9,
            Count::StaleError => 10,
            Count::Revalidated => 11,
            Count::DiskWriteFailed => 12,
            Count::Bypassed(b) => N_PLAIN + b as usize,
            Count::Uncacheable(u) => N_PLAIN + Bypass::ALL.len() + u as usize,
        }
    }
}

/// One worker's counts, alone on its cache lines.
#[repr(align(128))]
struct WorkerCounts([AtomicU64; N_COUNTS]);

/// What happened to requests on a cache (shared by the routes using it), counted as the
/// server's own counters are: a block per worker, each written by its worker only (a load and
/// a store, no locked instruction on the hit path), summed when /metrics asks. One more block
/// takes counts from any other thread, with a locked add.
pub struct Counts {
    workers: Box<[WorkerCounts]>,
}

impl Counts {
    pub fn new(workers: usize) -> Counts {
        Counts {
            workers: (0..workers + 1)
                .map(|_| WorkerCounts(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// Counts `c` for worker `worker` (the handler's `HandlerContext::worker_id`, whose
    /// thread this must be).
    pub fn bump(&self, worker: usize, c: Count) {
        let shared = self.workers.len() - 1;
        if worker < shared {
            let slot = &self.workers[worker].0[c.index()];
            slot.store(slot.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        } else {
            self.workers[shared].0[c.index()].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// All workers' counts of `c`.
    pub fn total(&self, c: Count) -> u64 {
        self.workers
            .iter()
            .map(|w| w.0[c.index()].load(Ordering::Relaxed))
            .sum()
    }
}
