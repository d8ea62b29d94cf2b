//! One worker's block of counters ([`WorkerStats`]): the counters, the bad requests by cause,
//! the answers' and the upstream groups' rows, and its streaming encoders' budget.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tern_codec::RequestError;

use super::counters::{Counter, UpstreamCounter, N_BAD, N_COUNTERS};
use super::rows::{duration_bucket, AnswerRows, Rows, Tally, UpstreamRows, START_MASK};
use crate::upstream::UpstreamRow;

/// One worker's counters, alone on its cache lines so workers never contend. Each worker is the
/// only writer of its block, so increments are a plain load + store (no locked instruction);
/// readers sum all blocks with relaxed loads.
#[repr(align(128))]
pub struct WorkerStats {
    pub(super) counters: [AtomicU64; N_COUNTERS],
    pub(super) bad_requests: [AtomicU64; N_BAD],
    pub(super) answers: AnswerRows,
    pub(super) upstreams: UpstreamRows,
    /// The worker's streaming encoders: what their state is charged now, against
    /// [`WORKER_ENCODER_BUDGET`] (kept here so the pages read it as they read counters).
    pub(super) encoders: Arc<tern_compress::Budget>,
}

/// The most streaming-encoder state one worker holds at once: about 15 brotli or zstd
/// answers in flight at the default levels, 78 gzip ones. Past it, answers that would be
/// compressed on the fly go uncompressed until some end (counted), so clients that open
/// compressed answers and never read them cannot make a worker allocate without bound.
pub const WORKER_ENCODER_BUDGET: usize = 32 << 20;

impl WorkerStats {
    pub(super) fn new() -> WorkerStats {
        WorkerStats {
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
            bad_requests: std::array::from_fn(|_| AtomicU64::new(0)),
            answers: Rows::new(),
            upstreams: Rows::new(),
            encoders: tern_compress::Budget::new(WORKER_ENCODER_BUDGET),
        }
    }

    /// The budget this worker's streaming encoders are charged to.
    pub fn encoders(&self) -> &Arc<tern_compress::Budget> {
        &self.encoders
    }

    #[inline]
    pub fn bump(&self, c: Counter) {
        bump(&self.counters[c as usize]);
    }

    /// `n` at once (single writer, like `bump`).
    #[inline]
    pub fn add(&self, c: Counter, n: u64) {
        add(&self.counters[c as usize], n);
    }

    /// For a block more than one thread writes (`Stats::aux`): a locked add.
    pub fn bump_shared(&self, c: Counter) {
        self.add_shared(c, 1);
    }

    /// `n` at once, for a block more than one thread writes (`Stats::aux`).
    pub fn add_shared(&self, c: Counter, n: u64) {
        self.counters[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    pub fn bad_request(&self, e: RequestError) {
        bump(&self.bad_requests[e.index()]);
    }

    /// Counts `c` for the upstream group of `row` (single writer, like `bump`).
    #[inline]
    pub fn bump_upstream(&self, row: UpstreamRow, c: UpstreamCounter) {
        bump(&self.upstreams.counted(row.index()).0[c as usize]);
    }

    /// An answer with `status` went out at `now_us` (the worker clock's microseconds): its
    /// class and its duration are counted in its row (its route's, or its site's). Three
    /// single-writer increments.
    #[inline]
    pub(crate) fn answered(&self, status: u16, tally: Tally, now_us: u64) {
        let row = self.answers.counted(tally.row().index());
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        bump(&row.classes[class]);
        let us = (now_us & START_MASK).saturating_sub(tally.start_us());
        bump(&row.buckets[duration_bucket(us)]);
        add(&row.sum_us, us);
    }

    /// The bytes this block takes now: its counters and the chunks of rows it holds.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<WorkerStats>() + self.answers.bytes() + self.upstreams.bytes()
    }
}

#[inline]
fn bump(a: &AtomicU64) {
    add(a, 1);
}

#[inline]
fn add(a: &AtomicU64, n: u64) {
    // Single writer: load + store is enough and avoids a locked read-modify-write.
    a.store(a.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_blocks_do_not_share_cache_lines() {
        assert!(std::mem::align_of::<WorkerStats>() >= 128);
        assert_eq!(std::mem::size_of::<WorkerStats>() % 128, 0);
    }
}
