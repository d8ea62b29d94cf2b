//! A memory budget for encoders in flight: each streaming encoder is charged what its state
//! may take ([`crate::Encoder::state_bytes`]) when it is made, and gives it back when it is
//! dropped. A producer that finds the budget spent sends its answer uncompressed instead of
//! allocating: a client that opens many answers and reads none cannot make a worker hold an
//! encoder for each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Encoder state a budget allows at once. Shared by the charges it gave out: one per worker.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    live: AtomicUsize,
}

impl Budget {
    pub fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            live: AtomicUsize::new(0),
        })
    }

    /// The bytes charged and not given back yet.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Charges `bytes` if they fit under the limit; the charge is given back when the
    /// returned [`Charge`] is dropped.
    pub fn charge(self: &Arc<Budget>, bytes: usize) -> Option<Charge> {
        // One writer in practice (the worker that owns the budget); a compare-exchange keeps
        // the limit exact even if a test or a second thread charges it too.
        self.live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |live| {
                live.checked_add(bytes).filter(|&sum| sum <= self.limit)
            })
            .ok()?;
        Some(Charge {
            budget: Arc::clone(self),
            bytes,
        })
    }
}

/// Bytes charged to a [`Budget`], given back on drop.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Charge {
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.live.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_fit_under_the_limit_and_are_given_back_on_drop() {
        let budget = Budget::new(100);
        let a = budget.charge(60).unwrap();
        assert_eq!(budget.live(), 60);
        assert!(budget.charge(41).is_none(), "over the limit");
        assert_eq!(budget.live(), 60, "a refused charge takes nothing");
        let b = budget.charge(40).unwrap();
        assert_eq!((a.bytes(), b.bytes(), budget.live()), (60, 40, 100));
        drop(a);
        assert_eq!(budget.live(), 40);
        drop(b);
        assert_eq!(budget.live(), 0);
        assert!(budget.charge(usize::MAX).is_none(), "no overflow");
    }
}
