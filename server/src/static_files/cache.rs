//! The two cache levels.
//!
//! * **Front** (per worker, `thread_local`): request key → [`Slot`] (an `Arc<Entry>`, this
//!   worker's own handles on the bodies, and when this worker last checked the file). A hit is
//!   a hash lookup in memory the worker alone touches: no syscall, no lock, no shared atomic.
//! * **Shared** (per `StaticFiles`, behind a mutex): served file → `Arc<Entry>`. Consulted only
//!   on a front miss or after a change, so that every file is read and compressed once, not
//!   once per worker.
//!
//! Memory is bounded by a [`Budget`] (`budget.rs`) that every cached entry is charged to until
//! it is dropped (by all holders). When a new entry does not fit, the oldest entries of the
//! shared map are evicted (marked, removed, and the eviction epoch bumped); fronts drop evicted
//! entries at their next revalidation of that key or their next miss (a sweep), and the new
//! entry is served uncached until the memory is actually released.
//!
//! A reload empties the shared map and gives it a new settings generation: an entry built
//! under other settings is neither found nor cached. Fronts carry the settings they were made
//! with and are dropped by their worker after a reload.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use super::budget::Budget;
use super::entry::{Entry, Source};
use super::fs::FileStat;
use super::options::Settings;

/// A cached entry is re-`stat`ed when a request finds it older than this (per worker), so a
/// change on disk is seen within ~0.5 s plus the clock's tick.
pub(crate) const REVALIDATE_MS: u64 = 500;
pub(crate) const DEFAULT_MAX_CACHE_BYTES: u64 = 256 << 20;
pub(crate) const DEFAULT_MAX_OPEN_FILES: u64 = 1024;

/// FxHash (rustc's): a couple of multiply/rotate steps per word. Keys are request paths of
/// files that exist (misses are never cached), so flooding attacks have nothing to aim at.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

type FxMap<V> = HashMap<Box<[u8]>, V, BuildHasherDefault<FxHasher>>;

struct SharedEntry {
    entry: Arc<Entry>,
    seq: u64,
    /// The settings generation the entry was built under.
    gen: u64,
}

#[derive(Default)]
struct SharedMap {
    /// Keyed by the served file's path relative to the root.
    entries: FxMap<SharedEntry>,
    next_seq: u64,
    /// Bytes charged by the entries currently in the map.
    bytes: u64,
    /// The settings generation of the entries the map accepts (see [`Shared::clear`]).
    gen: u64,
}

/// Cache statistics, for /statusz.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Entries in the shared map.
    pub entries: usize,
    /// Bytes held by live cached entries (including ones only fronts still hold).
    pub bytes: u64,
    /// Descriptors held by live cached entries (large files).
    pub open_files: u64,
    /// Compressions run so far (gzip and brotli counted separately).
    pub compressions: u64,
    /// Entries evicted to stay within the memory bound.
    pub evictions: u64,
}

pub(crate) struct Shared {
    map: Mutex<SharedMap>,
    /// Bumped whenever an entry leaves the map; fronts sweep when it changed.
    epoch: AtomicU64,
    budget: Arc<Budget>,
    pub compressions: AtomicU64,
    evictions: AtomicU64,
}

impl Shared {
    pub fn new(max_bytes: u64, max_files: u64) -> Shared {
        Shared {
            map: Mutex::new(SharedMap::default()),
            epoch: AtomicU64::new(0),
            budget: Arc::new(Budget::new(max_bytes, max_files)),
            compressions: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SharedMap> {
        // A panic elsewhere while holding the lock leaves the map consistent (every mutation
        // is a single insert/remove), so poisoning is ignored.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            entries: self.lock().entries.len(),
            bytes: self.budget.bytes.load(Ordering::Relaxed),
            open_files: self.budget.files.load(Ordering::Relaxed),
            compressions: self.compressions.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
        }
    }

    /// The entry for `rel` if it was built from exactly these files under settings `gen`.
    pub fn find(&self, rel: &[u8], stats: &[Option<FileStat>], gen: u64) -> Option<Arc<Entry>> {
        let map = self.lock();
        let se = map.entries.get(rel)?;
        let e = &se.entry;
        (se.gen == gen && e.same_files(stats) && !e.evicted.load(Ordering::Acquire))
            .then(|| e.clone())
    }

    /// Caches a freshly built entry. Returns the entry to serve and whether it is cached (an
    /// uncached one is served once and dropped). If another worker cached the same files
    /// meanwhile, that entry is returned and ours dropped. An entry built under settings
    /// older (or newer) than the map's (a reload raced with the build) is served uncached.
    pub fn insert(&self, rel: &[u8], mut entry: Entry, gen: u64) -> (Arc<Entry>, bool) {
        let mut map = self.lock();
        if gen != map.gen {
            return (Arc::new(entry), false);
        }
        if let Some(existing) = map.entries.get(rel) {
            let stats: Vec<_> = entry.watch.iter().map(|w| w.stat).collect();
            if existing.gen == gen
                && existing.entry.same_files(&stats)
                && !existing.entry.evicted.load(Ordering::Acquire)
            {
                return (existing.entry.clone(), true);
            }
        }
        let (bytes, files) = entry.cost();
        let mut charge = self.budget.try_charge(bytes, files);
        if charge.is_none() {
            self.evict(&mut map, bytes, files);
            charge = self.budget.try_charge(bytes, files);
        }
        let Some(charge) = charge else {
            return (Arc::new(entry), false);
        };
        entry.charge = Some(charge);
        let entry = Arc::new(entry);
        let seq = map.next_seq;
        map.next_seq += 1;
        map.bytes += bytes;
        let old = map.entries.insert(
            rel.into(),
            SharedEntry {
                entry: entry.clone(),
                seq,
                gen,
            },
        );
        if let Some(old) = old {
            self.retire(&mut map, &old.entry);
        }
        (entry, true)
    }

    /// Empties the map (a reload) and from now on accepts only entries built under settings
    /// `gen`. Fronts drop the removed entries at their next sweep; bodies still being sent
    /// stay alive until their responses are done.
    pub fn clear(&self, gen: u64) {
        let mut map = self.lock();
        map.gen = gen;
        for (_, old) in std::mem::take(&mut map.entries) {
            self.retire(&mut map, &old.entry);
        }
        map.bytes = 0;
    }

    /// Removes `entry` from the map if it is still there (its file changed or vanished).
    pub fn forget(&self, entry: &Arc<Entry>) {
        let Some(rel) = entry.watch.first().map(|w| w.rel.as_bytes()) else {
            return;
        };
        let mut map = self.lock();
        if map
            .entries
            .get(rel)
            .is_some_and(|s| Arc::ptr_eq(&s.entry, entry))
        {
            map.entries.remove(rel);
            self.retire(&mut map, entry);
        } else {
            entry.evicted.store(true, Ordering::Release);
        }
    }

    fn retire(&self, map: &mut SharedMap, entry: &Arc<Entry>) {
        map.bytes = map
            .bytes
            .saturating_sub(entry.charge.as_ref().map_or(0, |c| c.bytes));
        entry.evicted.store(true, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Evicts the oldest entries until the map holds at most 3/4 of the budget minus what the
    /// newcomer needs (so evictions come in batches, not one per miss).
    fn evict(&self, map: &mut SharedMap, need_bytes: u64, need_files: u64) {
        let b = &self.budget;
        let target_bytes = (b.max_bytes / 4 * 3).saturating_sub(need_bytes);
        let target_files = (b.max_files / 4 * 3).saturating_sub(need_files);
        let mut order: Vec<(u64, Box<[u8]>)> = map
            .entries
            .iter()
            .map(|(k, v)| (v.seq, k.clone()))
            .collect();
        order.sort_unstable_by_key(|(seq, _)| *seq);
        let mut files: u64 = map.entries.values().map(|s| s.entry.cost().1).sum();
        for (_, key) in order {
            if map.bytes <= target_bytes && files <= target_files {
                break;
            }
            if let Some(old) = map.entries.remove(&key) {
                files = files.saturating_sub(old.entry.cost().1);
                self.retire(map, &old.entry);
                self.evictions.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A front-cache slot: the entry plus this worker's own handles on its in-memory bodies.
/// Cloning a handle touches a refcount only this worker uses (`Bytes::from_owner` gives each
/// worker its own), so hits on a hot file do not bounce a cache line between cores.
pub(crate) struct Slot {
    pub entry: Arc<Entry>,
    pub bodies: [Option<Bytes>; 3],
    pub checked_ms: u64,
}

impl Slot {
    pub fn new(entry: Arc<Entry>, now_ms: u64) -> Slot {
        let bodies = Self::bodies(&entry, |b| Bytes::from_owner(b.clone()));
        Slot {
            entry,
            bodies,
            checked_ms: now_ms,
        }
    }

    /// For an entry served once and not kept.
    pub fn transient(entry: Arc<Entry>) -> Slot {
        let bodies = Self::bodies(&entry, Bytes::clone);
        Slot {
            entry,
            bodies,
            checked_ms: 0,
        }
    }

    fn bodies(entry: &Entry, handle: impl Fn(&Bytes) -> Bytes) -> [Option<Bytes>; 3] {
        let available = entry.available();
        std::array::from_fn(|i| match &entry.variant(i).source {
            Source::Memory(b) if available[i] => Some(handle(b)),
            _ => None,
        })
    }
}

pub(crate) struct Front {
    instance: u64,
    pub map: FxMap<Slot>,
    seen_epoch: u64,
    /// The settings this front's slots were made under; read on every request, so a hit
    /// touches no shared state.
    pub settings: Arc<Settings>,
}

impl Front {
    /// Forgets every slot and takes newer settings (a reload this thread had not seen).
    pub fn reset(&mut self, settings: Arc<Settings>) {
        self.map = FxMap::default();
        self.settings = settings;
    }

    /// Drops slots whose entries left the shared map since the last sweep.
    pub fn sweep(&mut self, epoch: u64) {
        if epoch != self.seen_epoch {
            self.map
                .retain(|_, s| !s.entry.evicted.load(Ordering::Acquire));
            self.seen_epoch = epoch;
        }
    }
}

thread_local! {
    static FRONTS: RefCell<Vec<Front>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's front cache for the `StaticFiles` instance `instance`; a new
/// front takes its settings from `settings`.
pub(crate) fn with_front<R>(
    instance: u64,
    settings: impl FnOnce() -> Arc<Settings>,
    f: impl FnOnce(&mut Front) -> R,
) -> R {
    FRONTS.with(|cell| {
        let mut fronts = cell.borrow_mut();
        let idx = match fronts.iter().position(|fr| fr.instance == instance) {
            Some(i) => i,
            None => {
                fronts.push(Front {
                    instance,
                    map: FxMap::default(),
                    seen_epoch: 0,
                    settings: settings(),
                });
                fronts.len() - 1
            }
        };
        f(&mut fronts[idx])
    })
}

/// Forgets every front cache of this thread (after a reload).
pub(crate) fn forget_thread_fronts() {
    let _ = FRONTS.try_with(|cell| {
        if let Ok(mut fronts) = cell.try_borrow_mut() {
            fronts.clear();
        }
    });
}

/// Forgets this thread's front cache for `instance` (when a `StaticFiles` is dropped).
pub(crate) fn drop_front(instance: u64) {
    // try_with: during thread teardown the thread-local may already be gone.
    let _ = FRONTS.try_with(|cell| {
        if let Ok(mut fronts) = cell.try_borrow_mut() {
            fronts.retain(|fr| fr.instance != instance);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn fx_hash_distinguishes_and_is_stable() {
        let h = BuildHasherDefault::<FxHasher>::default();
        let a = h.hash_one(&b"/index.html"[..]);
        assert_eq!(a, h.hash_one(&b"/index.html"[..]));
        assert_ne!(a, h.hash_one(&b"/index.htm"[..]));
        assert_ne!(h.hash_one(&b"/a"[..]), h.hash_one(&b"/a\0"[..]));
        // Box<[u8]> keys are found by &[u8].
        let mut m: FxMap<u32> = FxMap::default();
        m.insert(b"/x"[..].into(), 1);
        assert_eq!(m.get(&b"/x"[..]), Some(&1));
    }

    #[test]
    fn budget_refuses_past_the_limit_and_releases_on_drop() {
        let shared = Shared::new(1000, 2);
        let a = shared.budget.try_charge(600, 1).unwrap();
        assert!(shared.budget.try_charge(600, 0).is_none());
        assert!(shared.budget.try_charge(100, 2).is_none());
        assert_eq!(shared.stats().bytes, 600);
        drop(a);
        assert_eq!(shared.stats().bytes, 0);
        assert_eq!(shared.stats().open_files, 0);
        assert!(shared.budget.try_charge(1000, 2).is_some());
    }
}
