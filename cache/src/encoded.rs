//! Compressed copies of an entry's body in memory: made by the first hit whose client takes
//! a coding (by the server's compression of fixed answers), then given to every later hit
//! that takes it, so a cached page is compressed once per coding, as a static file's variants
//! are, not once per hit.
//!
//! Their bytes come out of a share of the store's memory ([`CopyBudget`], an eighth), taken
//! when a copy is kept and given back when its entry goes; a copy the share has no room for
//! is sent but not kept. So the store's bound holds with them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use tern_compress::{EncodedCopies, Encoding};

/// Slots per entry: one per coding the server speaks.
const CODINGS: usize = Encoding::ALL.len();

fn slot(coding: Encoding) -> usize {
    Encoding::ALL
        .iter()
        .position(|e| *e == coding)
        .expect("every coding is in ALL")
}

/// The bytes a store's copies may take, and those they take now.
#[derive(Debug)]
pub struct CopyBudget {
    limit: u64,
    used: AtomicU64,
}

impl CopyBudget {
    pub fn new(limit: u64) -> Arc<CopyBudget> {
        Arc::new(CopyBudget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn take(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                (u + n <= self.limit).then_some(u + n)
            })
            .is_ok()
    }

    fn give_back(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }
}

/// One body's compressed copies. Shared by an entry and the entry a 304 refreshes it into
/// (the body is the same).
#[derive(Debug, Default)]
pub struct Copies {
    slots: [OnceLock<Bytes>; CODINGS],
    /// Set when the entry is stored; none: copies are never kept (an entry not in a store).
    budget: OnceLock<Arc<CopyBudget>>,
}

impl EncodedCopies for Copies {
    fn get(&self, coding: Encoding) -> Option<Bytes> {
        self.slots[slot(coding)].get().cloned()
    }

    /// Kept if the store's share has room and no other hit kept one first.
    fn keep(&self, coding: Encoding, body: &Bytes) {
        let slot = &self.slots[slot(coding)];
        let Some(budget) = self.budget.get() else {
            return;
        };
        if slot.get().is_some() || !budget.take(body.len() as u64) {
            return;
        }
        if slot.set(body.clone()).is_err() {
            budget.give_back(body.len() as u64);
        }
    }
}

impl Copies {
    /// Charges later copies to `budget` (once: the store the entry first went into).
    pub(crate) fn charge_to(&self, budget: &Arc<CopyBudget>) {
        let _ = self.budget.set(budget.clone());
    }
}

impl Drop for Copies {
    fn drop(&mut self) {
        if let Some(budget) = self.budget.get() {
            let kept: u64 = self
                .slots
                .iter()
                .filter_map(OnceLock::get)
                .map(|b| b.len() as u64)
                .sum();
            budget.give_back(kept);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_kept_once_within_the_budget_and_given_back_when_dropped() {
        let budget = CopyBudget::new(100);
        let copies = Copies::default();
        let (gzip, br, zstd) = (Encoding::Gzip, Encoding::Br, Encoding::Zstd);
        copies.keep(gzip, &Bytes::from_static(b"not charged to anything yet"));
        assert_eq!(copies.get(gzip), None, "no budget: not kept");
        copies.charge_to(&budget);
        copies.keep(gzip, &Bytes::from(vec![1; 60]));
        copies.keep(gzip, &Bytes::from(vec![2; 10]));
        assert_eq!(copies.get(gzip).unwrap()[0], 1, "the first copy stays");
        copies.keep(br, &Bytes::from(vec![3; 50]));
        assert_eq!(copies.get(br), None, "over the budget: not kept");
        copies.keep(zstd, &Bytes::from(vec![4; 40]));
        assert_eq!(budget.used(), 100);
        drop(copies);
        assert_eq!(budget.used(), 0);
    }
}
