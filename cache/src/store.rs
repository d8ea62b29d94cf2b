//! Entries in memory, bounded by bytes, shared by the workers.
//!
//! Why quick_cache (0.7, arthurprs/quick-cache) rather than moka or a map of our own:
//! - Eviction is S3-FIFO: a new entry must be asked for again before it displaces the hot
//!   ones, so a scan of distinct URLs (a crawler, a flood of random query strings) churns only
//!   the small probationary queue; moka's TinyLFU would do too, but
//! - it runs no threads and keeps no deferred work (moka has housekeeping tasks and a
//!   per-cache scheduler): in a thread-per-core server every cost is paid on the worker that
//!   causes it, inside the call, which is what the rest of tern assumes;
//! - items are weighted (here: bytes of head and body plus a fixed overhead), so the
//!   configured memory is a bound in bytes, not a count;
//! - the map is sharded with one `parking_lot` RwLock per shard: a hit takes one shard's read
//!   lock, no global lock; keys are already keyed SipHash values, so the map's own hasher
//!   only spreads them over shards (an attacker cannot aim at one shard without the secret);
//! - it is small (no dependencies beyond hashbrown and parking_lot here), maintained (0.7.0,
//!   2025, fuzzed and shuttle-tested by its author), MIT.
//!   Each worker keeps a front of the hot entries it found (`front.rs`), so a hit on one takes
//!   no lock at all, as a static file's does.
//!
//! Bodies over the memory tier's largest object go to the cache's folder when it has one
//! (`disk.rs`): a second map of the same kind holds those entries, weighted by their files'
//! bytes and bounded by the folder's size, so neither tier's bound counts the other's bodies.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use quick_cache::sync::Cache;
use quick_cache::{Lifecycle, OptionsBuilder, Weighter};

use crate::disk::{DiskBody, DiskTier};
use crate::encoded::{Copies, CopyBudget};
use crate::flight::Flights;
use crate::key::Key;
use crate::policy::Freshness;
use crate::purge::{Purge, Target};

/// Bytes an entry costs beyond its head and body (the entry, its `Arc`, the map's slot).
pub const ENTRY_OVERHEAD: u64 = 256;

/// A stored answer.
#[derive(Debug)]
pub struct Entry {
    pub status: u16,
    /// The upstream's header lines (`Name: value\r\n`), serialised once: without framing,
    /// `Date`, `Age` (each hit writes its own) and hop-by-hop fields.
    pub head: Bytes,
    pub body: StoredBody,
    pub freshness: Freshness,
    /// Its validators, for clients' conditional requests.
    pub etag: Option<Bytes>,
    pub last_modified: Option<Bytes>,
    /// What it was stored for, and the app's tags: what a purge names it by.
    pub target: Arc<Target>,
    pub tags: Arc<[Box<str>]>,
    /// Its body compressed, per coding, as hits asked (a memory body's only).
    pub copies: Arc<Copies>,
}

/// Where an entry's body is.
#[derive(Debug, Clone)]
pub enum StoredBody {
    Memory(Bytes),
    /// In a file of the cache's folder.
    Disk(Arc<DiskBody>),
}

impl StoredBody {
    pub fn len(&self) -> u64 {
        match self {
            StoredBody::Memory(b) => b.len() as u64,
            StoredBody::Disk(d) => d.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Entry {
    /// Bytes of memory it takes (its body's, when that is in memory).
    pub fn weight(&self) -> u64 {
        let tags: usize = self.tags.iter().map(|t| t.len() + 16).sum();
        let body = match &self.body {
            StoredBody::Memory(b) => b.len() as u64,
            StoredBody::Disk(_) => 0,
        };
        self.head.len() as u64 + body + self.target.bytes() + tags as u64 + ENTRY_OVERHEAD
    }
}

#[derive(Clone)]
struct ByBytes;

impl Weighter<Key, Arc<Entry>> for ByBytes {
    fn weight(&self, _key: &Key, entry: &Arc<Entry>) -> u64 {
        entry.weight()
    }
}

/// The disk tier's weight: the file's bytes (its entry's memory is small beside them, and
/// bounded by the folder's size over the memory tier's largest object).
#[derive(Clone)]
struct ByFileBytes;

impl Weighter<Key, Arc<Entry>> for ByFileBytes {
    fn weight(&self, _key: &Key, entry: &Arc<Entry>) -> u64 {
        entry.body.len().max(1)
    }
}

type Map<W> = Cache<Key, Arc<Entry>, W, KeyBits, CountEvictions>;

/// A map of at most `capacity` weight whose largest item weighs `largest`.
fn map<W: Weighter<Key, Arc<Entry>> + Clone>(
    capacity: u64,
    largest: u64,
    weighter: W,
    counts: &CountEvictions,
) -> Map<W> {
    // quick_cache bounds each shard by its share of the weight and refuses an item over
    // that share: shards are made few enough that four of the largest objects fit in one.
    let per_object = largest.max(1);
    let mut shards = (capacity / (4 * per_object)).clamp(1, 64) as usize;
    shards = 1 << (usize::BITS - 1 - shards.leading_zeros());
    let estimated = (capacity / 16_384).clamp(64, 1 << 20) as usize;
    let options = OptionsBuilder::new()
        .shards(shards)
        .estimated_items_capacity(estimated)
        .weight_capacity(capacity)
        .build()
        .expect("the options are in range");
    Cache::with_options(options, weighter, KeyBits, counts.clone())
}

/// A cache's folder and the entries whose bodies are there.
struct DiskStore {
    tier: DiskTier,
    map: Map<ByFileBytes>,
    max_object: u64,
    /// Entries found with their file cut short (see [`DiskBody::intact`]).
    damaged: AtomicU64,
}

/// Keys are keyed hashes already: the shard and slot come from their bits as they are.
#[derive(Clone, Default)]
pub(crate) struct KeyBits;

pub(crate) struct KeyBitsHasher(u64);

impl Hasher for KeyBitsHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.0 ^= u64::from_le_bytes(b);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 ^= (v as u64) ^ ((v >> 64) as u64);
    }
}

impl BuildHasher for KeyBits {
    type Hasher = KeyBitsHasher;
    fn build_hasher(&self) -> KeyBitsHasher {
        KeyBitsHasher(0)
    }
}

/// Counts evictions as the map makes them, and each as a change (see `front.rs`).
#[derive(Clone)]
struct CountEvictions {
    evictions: Arc<AtomicU64>,
    changes: Arc<AtomicU64>,
}

impl Lifecycle<Key, Arc<Entry>> for CountEvictions {
    type RequestState = ();
    fn on_evict(&self, _state: &mut (), _key: Key, _val: Arc<Entry>) {
        self.evictions.fetch_add(1, Ordering::Relaxed);
        self.changes.fetch_add(1, Ordering::Release);
    }
}

/// One named cache's entries (`[cache.NAME]`): shared by the routes that use it.
pub struct Store {
    /// Tells stores apart for the workers' fronts (`front.rs`); unique in the process.
    id: u64,
    /// Dies with the store: a front of a store gone is dropped.
    alive: Arc<()>,
    memory: u64,
    /// Removals, replacements, evictions and purges so far: a front that sees this move
    /// empties itself.
    changes: Arc<AtomicU64>,
    map: Map<ByBytes>,
    /// The share of `memory` that entries' compressed copies may take.
    copies: Arc<CopyBudget>,
    disk: Option<DiskStore>,
    evictions: Arc<AtomicU64>,
    counts: CountEvictions,
    max_object: u64,
    /// The keys being filled now (coalescing), beside the entries.
    flights: Arc<Flights>,
    /// Purges so far: a fill begun before one may carry what it purged (see
    /// [`Store::insert_unless_purged`]).
    purges: AtomicU64,
    purged: AtomicU64,
}

impl Store {
    /// A store of at most `memory` bytes, whose largest entry body is `max_object`.
    pub fn new(memory: u64, max_object: u64) -> Store {
        static STORES: AtomicU64 = AtomicU64::new(0);
        let counts = CountEvictions {
            evictions: Arc::default(),
            changes: Arc::default(),
        };
        // An eighth of the memory for compressed copies, the rest for entries.
        let copies = memory / 8;
        Store {
            id: STORES.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
            memory,
            changes: counts.changes.clone(),
            map: map(
                memory - copies,
                max_object + ENTRY_OVERHEAD,
                ByBytes,
                &counts,
            ),
            copies: CopyBudget::new(copies),
            disk: None,
            evictions: counts.evictions.clone(),
            counts,
            max_object,
            flights: Arc::default(),
            purges: AtomicU64::new(0),
            purged: AtomicU64::new(0),
        }
    }

    /// The same store with bodies over its memory's largest object, up to `max_object`, in
    /// `tier`'s folder, at most `size` bytes of them.
    pub fn with_disk(mut self, tier: DiskTier, size: u64, max_object: u64) -> Store {
        self.disk = Some(DiskStore {
            map: map(size, max_object, ByFileBytes, &self.counts),
            tier,
            max_object,
            damaged: AtomicU64::new(0),
        });
        self
    }

    /// The folder's tier and its largest body, if the store has one.
    pub fn disk(&self) -> Option<(&DiskTier, u64)> {
        self.disk.as_ref().map(|d| (&d.tier, d.max_object))
    }

    /// Bytes of bodies in the folder now (those being written, and those of dropped entries
    /// still being sent, included).
    pub fn disk_bytes(&self) -> u64 {
        self.disk.as_ref().map_or(0, |d| d.tier.bytes())
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn alive(&self) -> std::sync::Weak<()> {
        Arc::downgrade(&self.alive)
    }

    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// The memory it was given (entries, copies).
    pub fn memory(&self) -> u64 {
        self.memory
    }

    /// Counts a change the workers' fronts must see, after it is made.
    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Release);
    }

    pub fn flights(&self) -> &Arc<Flights> {
        &self.flights
    }

    pub fn max_object(&self) -> u64 {
        self.max_object
    }

    pub fn get(&self, key: &Key) -> Option<Arc<Entry>> {
        match (self.map.get(key), &self.disk) {
            (Some(entry), _) => Some(entry),
            (None, Some(disk)) => {
                let entry = disk.map.get(key)?;
                if let StoredBody::Disk(body) = &entry.body {
                    if !body.intact() {
                        // Never sent as the answer: the request goes to the app.
                        disk.map.remove(key);
                        self.changed();
                        disk.damaged.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            "cache folder {}: {} no longer holds its {} bytes: entry dropped",
                            disk.tier.folder().display(),
                            body.path().display(),
                            body.len()
                        );
                        return None;
                    }
                }
                Some(entry)
            }
            (None, None) => None,
        }
    }

    /// Entries dropped because their file no longer held their body, since the start.
    pub fn damaged_files(&self) -> u64 {
        self.disk
            .as_ref()
            .map_or(0, |d| d.damaged.load(Ordering::Relaxed))
    }

    /// Stores `entry` under `key` in its body's tier (replacing one there, in either); one
    /// over that tier's largest object is not.
    pub fn insert(&self, key: Key, entry: Entry) {
        match (&entry.body, &self.disk) {
            (StoredBody::Memory(b), _) if b.len() as u64 <= self.max_object => {
                entry.copies.charge_to(&self.copies);
                // Removed first: quick_cache reports a replaced value as an eviction.
                self.remove(&key);
                self.map.insert(key, Arc::new(entry));
            }
            (StoredBody::Disk(b), Some(disk)) if b.len() <= disk.max_object => {
                self.remove(&key);
                disk.map.insert(key, Arc::new(entry));
            }
            _ => {}
        }
    }

    /// The purges so far; a fill takes this when it begins.
    pub fn purges(&self) -> u64 {
        self.purges.load(Ordering::SeqCst)
    }

    /// Stores what a fill that began at `purges` brought, unless a purge came since: the app
    /// may have answered before the change the purge was for. Checked after the insert as
    /// well, so a purge is never missed: one that counted before the check finds the entry
    /// and drops it itself, and one that counted after is seen here. A purge of anything
    /// drops the fills under way (they are stored the next time).
    pub fn insert_unless_purged(&self, purges: u64, key: Key, entry: Entry) {
        if self.purges() != purges {
            return;
        }
        self.insert(key, entry);
        if self.purges() != purges {
            self.remove(&key);
        }
    }

    /// Drops the entries `purge` names; how many.
    pub fn purge(&self, purge: &Purge) -> u64 {
        self.purges.fetch_add(1, Ordering::SeqCst);
        let dropped = AtomicU64::new(0);
        // Walks each shard under its write lock: lookups on that shard wait for the walk
        // (microseconds per thousand entries), which is fine for an operator's rare purge.
        let keep = |_: &Key, entry: &Arc<Entry>| {
            let purged = purge.matches(&entry.target, &entry.tags);
            if purged {
                dropped.fetch_add(1, Ordering::Relaxed);
            }
            !purged
        };
        self.map.retain(keep);
        if let Some(disk) = &self.disk {
            disk.map.retain(keep);
        }
        self.changed();
        let dropped = dropped.into_inner();
        self.purged.fetch_add(dropped, Ordering::Relaxed);
        dropped
    }

    /// Entries dropped by purges, since the start.
    pub fn purged_entries(&self) -> u64 {
        self.purged.load(Ordering::Relaxed)
    }

    /// Drops the entry under `key`, if any (a change the workers' fronts see: a new key is
    /// not one, since no front can hold it).
    pub fn remove(&self, key: &Key) {
        let mut removed = self.map.remove(key).is_some();
        if let Some(disk) = &self.disk {
            removed |= disk.map.remove(key).is_some();
        }
        if removed {
            self.changed();
        }
    }

    pub fn clear(&self) {
        self.map.clear();
        if let Some(disk) = &self.disk {
            disk.map.clear();
        }
        self.changed();
    }

    /// Bytes of memory held (heads, bodies in memory, overhead, compressed copies).
    pub fn bytes(&self) -> u64 {
        self.map.weight() + self.copies.used()
    }

    pub fn len(&self) -> usize {
        self.map.len() + self.disk.as_ref().map_or(0, |d| d.map.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops an entry without counting a change (tests of the fronts only: what a front
    /// answers from itself).
    #[cfg(test)]
    pub(crate) fn forget_quietly(&self, key: &Key) {
        self.map.remove(key);
    }

    /// Entries evicted to make room, since the start.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

/// A fresh 200 entry for `/` on example.com with `body` in memory (the crate's tests).
#[cfg(test)]
pub(crate) fn test_entry(body: Bytes) -> Entry {
    Entry {
        status: 200,
        head: Bytes::from_static(b"Content-Type: text/plain\r\n"),
        body: StoredBody::Memory(body),
        freshness: Freshness {
            lifetime: 60,
            initial_age: 0,
            stored_at: 0,
            no_stale: false,
            stale_while_revalidate: 0,
            stale_if_error: 0,
        },
        etag: None,
        last_modified: None,
        target: Arc::new(Target::new(b"example.com", "/", None)),
        tags: Arc::new([]),
        copies: Arc::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(body: usize) -> Entry {
        test_entry(Bytes::from(vec![b'x'; body]))
    }

    #[test]
    fn memory_stays_under_its_bound_under_a_flood_of_distinct_keys() {
        let memory = 1 << 20;
        let store = Store::new(memory, 16 * 1024);
        for i in 0..20_000u128 {
            store.insert(
                Key(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)),
                entry(1000),
            );
            assert!(store.bytes() <= memory, "{} after {i}", store.bytes());
        }
        assert!(store.evictions() > 0);
        assert!(store.bytes() > memory / 2, "it is used: {}", store.bytes());
    }

    #[test]
    fn a_scan_does_not_evict_what_is_asked_for_again() {
        let store = Store::new(256 * 1024, 16 * 1024);
        let hot: Vec<Key> = (0..20u128).map(|i| Key(i << 64 | i)).collect();
        for k in &hot {
            store.insert(*k, entry(1000));
        }
        for _ in 0..3 {
            for k in &hot {
                assert!(store.get(k).is_some());
            }
        }
        // A scan of once-seen keys, several times the store's size.
        for i in 1000..3000u128 {
            store.insert(
                Key(i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)),
                entry(1000),
            );
        }
        let kept = hot.iter().filter(|k| store.get(k).is_some()).count();
        assert!(
            kept >= 18,
            "only {kept} of 20 hot entries survived the scan"
        );
    }

    #[test]
    fn objects_over_the_limit_are_not_stored_and_the_largest_fits() {
        let store = Store::new(64 * 1024, 16 * 1024);
        store.insert(Key(1), entry(16 * 1024 + 1));
        assert!(store.get(&Key(1)).is_none());
        store.insert(Key(2), entry(16 * 1024));
        assert!(store.get(&Key(2)).is_some());
        store.remove(&Key(2));
        assert!(store.get(&Key(2)).is_none());
    }

    fn tagged(path: &str, tags: &[&str]) -> Entry {
        Entry {
            target: Arc::new(Target::new(b"example.com", path, None)),
            tags: tags.iter().map(|t| Box::from(*t)).collect(),
            ..entry(10)
        }
    }

    #[test]
    fn a_purge_drops_what_it_names_and_nothing_else() {
        let store = Store::new(1 << 20, 16 * 1024);
        store.insert(Key(1), tagged("/blog/a", &["post"]));
        store.insert(Key(2), tagged("/blog/b", &[]));
        store.insert(Key(3), tagged("/shop/c", &["post", "shop"]));
        store.insert(Key(4), tagged("/", &[]));
        assert_eq!(store.purge(&Purge::Tag("post".into())), 2);
        assert!(store.get(&Key(1)).is_none() && store.get(&Key(3)).is_none());
        let blog = Purge::of_url("https://example.com/blog/", true).unwrap();
        assert_eq!(store.purge(&blog), 1);
        assert_eq!(store.len(), 1);
        assert_eq!(store.purge(&Purge::All), 1);
        assert!(store.is_empty());
    }

    #[test]
    fn a_fill_begun_before_a_purge_is_not_stored() {
        let store = Store::new(1 << 20, 16 * 1024);
        let begun = store.purges();
        store.purge(&Purge::Tag("unrelated".into()));
        store.insert_unless_purged(begun, Key(1), entry(10));
        assert!(store.get(&Key(1)).is_none());
        store.insert_unless_purged(store.purges(), Key(1), entry(10));
        assert!(store.get(&Key(1)).is_some());
    }

    #[test]
    fn large_bodies_go_to_the_folder_each_tier_within_its_bound() {
        let dir = std::env::temp_dir().join(format!("tern-store-disk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let tier = DiskTier::open(&dir).unwrap();
        let store = Store::new(64 * 1024, 4 * 1024).with_disk(tier, 64 * 1024, 16 * 1024);
        let on_disk = |n: usize| {
            let (tier, _) = store.disk().unwrap();
            let mut spill = tier.create().unwrap();
            spill.write(&vec![b'd'; n]).unwrap();
            Entry {
                body: StoredBody::Disk(Arc::new(spill.finish())),
                ..entry(0)
            }
        };
        store.insert(Key(1), on_disk(10_000));
        store.insert(Key(2), entry(1000));
        assert!(matches!(
            store.get(&Key(1)).unwrap().body,
            StoredBody::Disk(_)
        ));
        assert!(matches!(
            store.get(&Key(2)).unwrap().body,
            StoredBody::Memory(_)
        ));
        assert!(
            store.bytes() < 4 * 1024,
            "the file's bytes are not memory's"
        );
        assert_eq!(store.disk_bytes(), 10_000);
        // A new answer in memory replaces the one on disk, whose file goes.
        store.insert(Key(1), entry(100));
        assert!(matches!(
            store.get(&Key(1)).unwrap().body,
            StoredBody::Memory(_)
        ));
        assert_eq!(store.disk_bytes(), 0);
        // Over the folder's largest object: not kept (its file goes with it).
        store.insert(Key(3), on_disk(16 * 1024 + 1));
        assert!(store.get(&Key(3)).is_none());
        // A flood: the folder's bytes stay under its size.
        for i in 10..200u128 {
            store.insert(Key(i), on_disk(8 * 1024));
            assert!(store.disk_bytes() <= 64 * 1024, "{}", store.disk_bytes());
        }
        let held = store.len();
        assert!(held > 2, "{held}");
        assert_eq!(store.purge(&Purge::All) as usize, held);
        assert_eq!((store.len(), store.disk_bytes()), (0, 0));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_replaced_entry_is_not_counted_as_an_eviction() {
        let store = Store::new(1 << 20, 16 * 1024);
        for _ in 0..10 {
            store.insert(Key(1), entry(100));
        }
        assert_eq!((store.len(), store.evictions()), (1, 0));
    }
}
