//! Each worker's front of the hot entries of a store: a hit found there takes no lock and
//! writes nothing shared, as a static file's hit from its front cache does. The shared map
//! (`store.rs`) takes a shard's read lock and an `Arc` clone per lookup; a front lookup is a
//! thread-local map and one relaxed load of the store's change count.
//!
//! A front holds only what its worker found in the store since the store last changed: every
//! removal, replacement, eviction and purge counts a change, and a front that sees the count
//! move empties itself before it answers. So a front never answers with an entry the store
//! no longer has, and memory beyond the store's bound is only what a worker's front still
//! holds of dropped entries until that worker's next lookup in the store, at most
//! [`FRONT_SHARE`] of the store's memory per worker. Only bodies in memory enter a front (a
//! body on disk is checked against its file before each hit).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use crate::key::Key;
use crate::store::{Entry, KeyBits, Store, StoredBody};

/// Entries a front keeps, at most.
const FRONT_ENTRIES: usize = 512;
/// A front's bytes, at most: this part of its store's memory.
pub const FRONT_SHARE: u64 = 32;

struct Front {
    /// The store's id, and a token that dies with it (a front of a store gone is dropped).
    store: u64,
    alive: Weak<()>,
    /// The store's change count when the entries were found.
    changes: u64,
    bytes: u64,
    entries: HashMap<Key, Arc<Entry>, KeyBits>,
}

thread_local! {
    static FRONTS: RefCell<Vec<Front>> = const { RefCell::new(Vec::new()) };
}

impl Store {
    /// `answer` of the entry under `key` if it gives one (a fresh entry's answer), looked for
    /// in this thread's front first and then in the store (which fills the front). None: no
    /// entry, or `answer` gave none for it; the caller looks again on its slower path.
    pub fn answer_hot<R>(&self, key: &Key, answer: impl Fn(&Entry) -> Option<R>) -> Option<R> {
        let changes = self.changes();
        let from_front = FRONTS.with(|fronts| {
            let mut fronts = fronts.borrow_mut();
            let front = self.front(&mut fronts, changes);
            front.entries.get(key).and_then(|e| answer(e))
        });
        if from_front.is_some() {
            return from_front;
        }
        let entry = self.get(key)?;
        let given = answer(&entry)?;
        if let StoredBody::Memory(_) = entry.body {
            let cap = self.memory() / FRONT_SHARE;
            FRONTS.with(|fronts| {
                let mut fronts = fronts.borrow_mut();
                let front = self.front(&mut fronts, changes);
                let weight = entry.weight();
                if front.entries.len() < FRONT_ENTRIES && front.bytes + weight <= cap {
                    if let Some(old) = front.entries.insert(*key, entry) {
                        front.bytes -= old.weight();
                    }
                    front.bytes += weight;
                }
            });
        }
        Some(given)
    }

    /// This thread's front of the store, emptied if the store's change count is no longer
    /// `changes` (made, and the fronts of stores gone dropped, if it has none).
    fn front<'f>(&self, fronts: &'f mut Vec<Front>, changes: u64) -> &'f mut Front {
        let i = match fronts.iter().position(|f| f.store == self.id()) {
            Some(i) => i,
            None => {
                fronts.retain(|f| f.alive.strong_count() > 0);
                fronts.push(Front {
                    store: self.id(),
                    alive: self.alive(),
                    changes,
                    bytes: 0,
                    entries: HashMap::default(),
                });
                fronts.len() - 1
            }
        };
        let front = &mut fronts[i];
        if front.changes != changes {
            front.entries.clear();
            front.bytes = 0;
            front.changes = changes;
        }
        front
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::purge::Purge;
    use crate::store::test_entry;
    use bytes::Bytes;

    fn entry(body: &'static [u8]) -> Entry {
        test_entry(Bytes::from_static(body))
    }

    fn body(store: &Store, key: u128) -> Option<Vec<u8>> {
        store.answer_hot(&Key(key), |e| match &e.body {
            StoredBody::Memory(b) => Some(b.to_vec()),
            StoredBody::Disk(_) => None,
        })
    }

    #[test]
    fn a_hot_entry_is_answered_from_the_front_until_the_store_changes() {
        let store = Store::new(1 << 20, 64 * 1024);
        store.insert(Key(1), entry(b"one"));
        store.insert(Key(2), entry(b"two"));
        assert_eq!(body(&store, 1).as_deref(), Some(&b"one"[..]));
        // Gone from the map without a change counted: the front still answers, so the hit
        // really came from it.
        store.forget_quietly(&Key(1));
        assert_eq!(body(&store, 1).as_deref(), Some(&b"one"[..]));
        // Any change empties the fronts: a removal of another key...
        store.remove(&Key(2));
        assert_eq!(body(&store, 1), None);
        // ...a replacement...
        store.insert(Key(3), entry(b"old"));
        assert_eq!(body(&store, 3).as_deref(), Some(&b"old"[..]));
        store.insert(Key(3), entry(b"new"));
        assert_eq!(body(&store, 3).as_deref(), Some(&b"new"[..]));
        // ...and a purge.
        store.purge(&Purge::All);
        assert_eq!(body(&store, 3), None);
        // A new key is no change: what the front holds stays.
        store.insert(Key(4), entry(b"four"));
        body(&store, 4);
        store.forget_quietly(&Key(4));
        store.insert(Key(5), entry(b"five"));
        assert_eq!(body(&store, 4).as_deref(), Some(&b"four"[..]));
    }

    #[test]
    fn an_evicted_entry_is_never_answered_from_a_front() {
        let store = Store::new(256 * 1024, 16 * 1024);
        store.insert(Key(1), entry(b"hot"));
        assert!(body(&store, 1).is_some());
        // A flood several times the store's size, of entries asked for again (so hot as
        // well), evicts it.
        for i in 10..5000u128 {
            store.insert(Key(i << 64 | i), entry(&[b'x'; 900]));
            store.get(&Key(i << 64 | i));
            store.get(&Key(i << 64 | i));
        }
        assert!(store.get(&Key(1)).is_none(), "evicted");
        assert_eq!(body(&store, 1), None);
    }

    #[test]
    fn each_thread_has_its_own_front_within_its_share_of_memory() {
        let store = Arc::new(Store::new(64 * 1024, 4 * 1024));
        for i in 0..100u128 {
            store.insert(Key(i), entry(&[b'y'; 1000]));
            body(&store, i);
        }
        let held = FRONTS.with(|f| f.borrow().iter().map(|f| f.bytes).sum::<u64>());
        assert!(held > 0 && held <= store.memory() / FRONT_SHARE, "{held}");
        let other = store.clone();
        let there = std::thread::spawn(move || {
            let before = FRONTS.with(|f| f.borrow().len());
            let found = body(&other, 99).is_some();
            (before, found)
        })
        .join()
        .unwrap();
        assert_eq!(
            there,
            (0, true),
            "another thread starts with no front of its own"
        );
    }
}
