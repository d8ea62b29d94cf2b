//! The memory and open files cached entries may hold ([`Budget`]), and what one entry is
//! charged ([`Charge`], given back when the entry is dropped by its last holder). Apart from
//! `cache.rs` because entries carry their charge and the cache holds entries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes and descriptors held by cached entries, with their limits.
pub(crate) struct Budget {
    pub bytes: AtomicU64,
    pub files: AtomicU64,
    pub max_bytes: u64,
    pub max_files: u64,
}

/// What one entry is charged; released when the entry is dropped.
pub(crate) struct Charge {
    budget: Arc<Budget>,
    pub bytes: u64,
    files: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        self.budget.files.fetch_sub(self.files, Ordering::AcqRel);
    }
}

impl Budget {
    pub fn new(max_bytes: u64, max_files: u64) -> Budget {
        Budget {
            bytes: AtomicU64::new(0),
            files: AtomicU64::new(0),
            max_bytes,
            max_files,
        }
    }

    /// Charges `bytes` and `files`, or None (and nothing charged) past either limit.
    pub fn try_charge(self: &Arc<Self>, bytes: u64, files: u64) -> Option<Charge> {
        let b = self.bytes.fetch_add(bytes, Ordering::AcqRel) + bytes;
        let f = self.files.fetch_add(files, Ordering::AcqRel) + files;
        let charge = Charge {
            budget: self.clone(),
            bytes,
            files,
        };
        if b > self.max_bytes || f > self.max_files {
            return None; // dropping `charge` gives it back
        }
        Some(charge)
    }
}
