//! The game's state in memory: who holds each claimed address and since when, how many
//! addresses each name holds in each /8, each name's latest claims, and the latest claims of
//! all. Every read of the game is served from here; the store (`store`) only makes changes
//! durable and rebuilds this at start-up.
//!
//! Addresses live in 65,536 blocks, one per /16, each behind its own lock: a reader (a score
//! scan) holds one block at a time, and no map ever grows past one /16's worth of entries,
//! so no resize stalls a worker the way one table of 100 M entries would. A block is a
//! `hashbrown` map of 11 bytes per slot until it holds more than a dense array of the whole
//! /16 would cost (`DENSE_AT`), then that array (8 bytes per address of the /16).
//!
//! Changes come only from the store, one batch at a time under its write lock, so deciding a
//! claim (`decide`) and applying it (`apply`) see the same state. Locks are taken in the order
//! block → names → per-/8 counts, and recent alone, never the other way.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hashbrown::{HashMap, HashTable};

/// A claim: address, name, time (Unix seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub ip: u32,
    pub nick: String,
    pub created: u64,
}

/// A re-claim by the holder refreshes its time only once the old claim is over an hour old
/// (so re-claiming cannot keep a name on top of "recent" or make the game write).
pub const REFRESH_AFTER_SECS: u64 = 3600;

/// The latest claims kept for `/recent`.
pub const RECENT_LEN: usize = 50;

/// A name's latest claims kept for its player page.
pub const PLAYER_RECENT: usize = 50;

/// One held address: the holder's name id and the claim's time, packed into 8 bytes with
/// alignment 1, so a map slot with its 2-byte key is 10 bytes (plus hashbrown's control byte).
#[derive(Clone, Copy, PartialEq, Eq)]
struct Held([u8; 8]);

impl Held {
    const EMPTY: Held = Held([0xff; 8]);

    fn new(name: u32, created: u32) -> Held {
        let mut b = [0; 8];
        b[..4].copy_from_slice(&name.to_le_bytes());
        b[4..].copy_from_slice(&created.to_le_bytes());
        Held(b)
    }

    fn name(self) -> u32 {
        u32::from_le_bytes(self.0[..4].try_into().expect("4 bytes"))
    }

    fn created(self) -> u32 {
        u32::from_le_bytes(self.0[4..].try_into().expect("4 bytes"))
    }
}

/// A /16 holding this many addresses becomes a dense array: the map's next growth (to
/// 65,536 slots of 11 bytes) would cost more than the array's 512 KiB.
const DENSE_AT: usize = 28_672;

enum Block {
    Sparse(HashMap<[u8; 2], Held>),
    /// Every address of the /16; `Held::EMPTY` where unclaimed.
    Dense(Box<[Held]>, usize),
}

impl Block {
    fn get(&self, low: u16) -> Option<Held> {
        match self {
            Block::Sparse(m) => m.get(&low.to_le_bytes()).copied(),
            Block::Dense(a, _) => Some(a[low as usize]).filter(|h| *h != Held::EMPTY),
        }
    }

    fn set(&mut self, low: u16, held: Held) -> Option<Held> {
        match self {
            Block::Sparse(m) => {
                if m.len() >= DENSE_AT && !m.contains_key(&low.to_le_bytes()) {
                    let mut dense = vec![Held::EMPTY; 1 << 16].into_boxed_slice();
                    for (k, v) in m.iter() {
                        dense[u16::from_le_bytes(*k) as usize] = *v;
                    }
                    *self = Block::Dense(dense, m.len());
                    return self.set(low, held);
                }
                m.insert(low.to_le_bytes(), held)
            }
            Block::Dense(a, len) => {
                let old = std::mem::replace(&mut a[low as usize], held);
                if old == Held::EMPTY {
                    *len += 1;
                    None
                } else {
                    Some(old)
                }
            }
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Block::Sparse(m) => m.allocation_size(),
            Block::Dense(a, _) => std::mem::size_of_val(&**a),
        }
    }

    fn for_each(&self, mut f: impl FnMut(u16, Held)) {
        match self {
            Block::Sparse(m) => m.iter().for_each(|(k, v)| f(u16::from_le_bytes(*k), *v)),
            Block::Dense(a, _) => {
                for (i, h) in a.iter().enumerate() {
                    if *h != Held::EMPTY {
                        f(i as u16, *h);
                    }
                }
            }
        }
    }
}

struct NameInfo {
    /// Shared with the latest-claims ring, which takes a reference rather than a copy.
    name: Arc<str>,
    /// Addresses held; the name is forgotten (its id reused) when this falls to zero.
    held: u64,
    /// Its latest claims, oldest first; entries it no longer holds are skipped when read.
    recent: VecDeque<(u32, u32)>,
}

/// Names to small ids and back. Ids of names that hold nothing are reused, so the table is
/// bounded by the addresses held.
#[derive(Default)]
struct Names {
    by_name: HashTable<u32>,
    info: Vec<NameInfo>,
    free: Vec<u32>,
    hasher: foldhash::fast::RandomState,
}

impl Names {
    fn hash(&self, name: &str) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(name)
    }

    fn find(&self, name: &str) -> Option<u32> {
        let info = &self.info;
        self.by_name
            .find(self.hash(name), |&id| &*info[id as usize].name == name)
            .copied()
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(id) = self.find(name) {
            return id;
        }
        let info = NameInfo {
            name: name.into(),
            held: 0,
            recent: VecDeque::new(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.info[id as usize] = info;
                id
            }
            None => {
                self.info.push(info);
                (self.info.len() - 1) as u32
            }
        };
        let hash = self.hash(name);
        let (infos, hasher) = (&self.info, &self.hasher);
        self.by_name.insert_unique(hash, id, |&id| {
            use std::hash::BuildHasher;
            hasher.hash_one(&*infos[id as usize].name)
        });
        id
    }

    fn release(&mut self, id: u32) {
        let hash = self.hash(&self.info[id as usize].name);
        if let Ok(entry) = self.by_name.find_entry(hash, |&x| x == id) {
            entry.remove();
        }
        let info = &mut self.info[id as usize];
        info.name = "".into();
        info.recent = VecDeque::new();
        self.free.push(id);
    }

    fn bytes(&self) -> usize {
        self.by_name.allocation_size()
            + self.info.capacity() * std::mem::size_of::<NameInfo>()
            + self
                .info
                .iter()
                .map(|i| i.name.len() + i.recent.capacity() * 8)
                .sum::<usize>()
    }
}

/// What a claim would do to the state, decided before it is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// An address nobody held: write it, then apply it.
    New,
    /// A new holder, or the holder's claim refreshed: write it, then apply it.
    Change,
    /// The holder re-claimed within the hour: nothing to write.
    Unchanged,
}

/// The whole game state.
pub struct Land {
    blocks: Box<[Mutex<Block>]>,
    /// Per /8: name id → addresses it holds there (the all-time board, player pages).
    per8: Box<[Mutex<HashMap<u32, u32>>]>,
    names: Mutex<Names>,
    /// The latest changes, newest first: (address, name, time).
    recent: Mutex<VecDeque<(u32, Arc<str>, u64)>>,
    /// Bumped by every applied batch that changed something (the `/recent` renderer's cue).
    version: AtomicU64,
    claimed: AtomicU64,
}

impl Default for Land {
    fn default() -> Land {
        Land::new()
    }
}

impl Land {
    pub fn new() -> Land {
        Land {
            blocks: (0..1 << 16)
                .map(|_| Mutex::new(Block::Sparse(HashMap::new())))
                .collect(),
            per8: (0..256).map(|_| Mutex::new(HashMap::new())).collect(),
            names: Mutex::new(Names::default()),
            recent: Mutex::new(VecDeque::with_capacity(RECENT_LEN)),
            version: AtomicU64::new(0),
            claimed: AtomicU64::new(0),
        }
    }

    fn block(&self, ip: u32) -> std::sync::MutexGuard<'_, Block> {
        lock(&self.blocks[(ip >> 16) as usize])
    }

    /// Addresses held by anyone.
    pub fn claimed(&self) -> u64 {
        self.claimed.load(Ordering::Relaxed)
    }

    /// Whether `nick` holds an address.
    pub fn knows(&self, nick: &str) -> bool {
        lock(&self.names).find(nick).is_some()
    }

    /// Names holding at least one address.
    pub fn names_held(&self) -> u64 {
        let names = lock(&self.names);
        (names.info.len() - names.free.len()) as u64
    }

    /// Changes so far (see `version`).
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Who holds `ip`, and since when.
    pub fn holder(&self, ip: u32) -> Option<(String, u64)> {
        let held = self.block(ip).get(ip as u16)?;
        let names = lock(&self.names);
        Some((
            names.info[held.name() as usize].name.to_string(),
            held.created() as u64,
        ))
    }

    /// What claiming `ip` for `nick` at `at` would do (the rule of `REFRESH_AFTER_SECS`).
    /// `earlier` answers for claims decided before this one in the same batch but not yet
    /// applied: `Some((nick, created))` of the latest such change to `ip`.
    pub fn decide(&self, ip: u32, nick: &str, at: u64, earlier: Option<(&str, u64)>) -> Decision {
        let unchanged =
            |held_nick: &str, created: u64| held_nick == nick && created + REFRESH_AFTER_SECS >= at;
        if let Some((held_nick, created)) = earlier {
            return if unchanged(held_nick, created) {
                Decision::Unchanged
            } else {
                Decision::Change
            };
        }
        let Some(held) = self.block(ip).get(ip as u16) else {
            return Decision::New;
        };
        let names = lock(&self.names);
        if unchanged(
            &names.info[held.name() as usize].name,
            held.created() as u64,
        ) {
            Decision::Unchanged
        } else {
            Decision::Change
        }
    }

    /// Makes `ip` held by `nick` since `created` (a change already made durable, or one
    /// replayed at start-up). Returns whether the address was unclaimed before.
    pub fn apply(&self, ip: u32, nick: &str, created: u64) -> bool {
        let (new, name) = self.set(ip, nick, created, true);
        let mut recent = lock(&self.recent);
        recent.truncate(RECENT_LEN - 1);
        recent.push_front((ip, name, created));
        drop(recent);
        self.version.fetch_add(1, Ordering::Release);
        new
    }

    /// `apply` for loading a snapshot, which is in address order, not time order: the latest
    /// claims come with it (`set_recent`), and a player's latest holdings are found by a scan
    /// when first asked for.
    pub fn load(&self, ip: u32, nick: &str, created: u64) {
        self.set(ip, nick, created, false);
    }

    /// Returns whether the address was unclaimed, and the holder's name as the state keeps it.
    fn set(&self, ip: u32, nick: &str, created: u64, remember: bool) -> (bool, Arc<str>) {
        let created32 = created.min(u32::MAX as u64) as u32;
        let mut block = self.block(ip);
        let mut names = lock(&self.names);
        let id = names.intern(nick);
        let old = block.set(ip as u16, Held::new(id, created32));
        let slash8 = (ip >> 24) as usize;
        {
            let mut per8 = lock(&self.per8[slash8]);
            if let Some(old) = old {
                if let hashbrown::hash_map::Entry::Occupied(mut e) = per8.entry(old.name()) {
                    *e.get_mut() -= 1;
                    if *e.get() == 0 {
                        e.remove();
                    }
                }
            }
            *per8.entry(id).or_default() += 1;
        }
        if let Some(old) = old {
            let info = &mut names.info[old.name() as usize];
            info.held -= 1;
            if info.held == 0 && old.name() != id {
                names.release(old.name());
            }
        }
        let info = &mut names.info[id as usize];
        info.held += 1;
        if remember {
            if info.recent.len() == PLAYER_RECENT {
                info.recent.pop_front();
            }
            info.recent.push_back((ip, created32));
        }
        let name = info.name.clone();
        drop(names);
        drop(block);
        if old.is_none() {
            self.claimed.fetch_add(1, Ordering::Relaxed);
        }
        (old.is_none(), name)
    }

    /// The latest claims, newest first (a change counts once, when made).
    pub fn recent(&self) -> Vec<Claim> {
        lock(&self.recent)
            .iter()
            .map(|(ip, name, created)| Claim {
                ip: *ip,
                nick: name.to_string(),
                created: *created,
            })
            .collect()
    }

    /// Sets the latest claims (recovery: the journal's order, not time, decides).
    pub fn set_recent(&self, claims: Vec<Claim>) {
        *lock(&self.recent) = claims
            .into_iter()
            .take(RECENT_LEN)
            .map(|c| (c.ip, Arc::from(c.nick), c.created))
            .collect();
    }

    /// A player's holdings per /8 and their latest claims still held, newest first. `None`
    /// for a name that holds nothing.
    pub fn player(&self, nick: &str) -> Option<Player> {
        let (id, ring) = {
            let names = lock(&self.names);
            let id = names.find(nick)?;
            (id, names.info[id as usize].recent.clone())
        };
        let mut blocks = Vec::new();
        for (b, per8) in self.per8.iter().enumerate() {
            if let Some(&n) = lock(per8).get(&id) {
                blocks.push((b as u8, n as u64));
            }
        }
        let total: u64 = blocks.iter().map(|b| b.1).sum();
        let still_held =
            |ip: u32, created: u32| self.block(ip).get(ip as u16) == Some(Held::new(id, created));
        let mut recent: Vec<(u32, u64)> = ring
            .iter()
            .rev()
            .filter(|&&(ip, created)| still_held(ip, created))
            .map(|&(ip, created)| (ip, created as u64))
            .collect();
        if (recent.len() as u64) < total.min(PLAYER_RECENT as u64) {
            // Some of its latest claims were taken by others: find its latest holdings the
            // long way (one pass over every block), and keep them for next time.
            recent = self.latest_of(id, PLAYER_RECENT);
            let mut names = lock(&self.names);
            if names
                .info
                .get(id as usize)
                .is_some_and(|i| &*i.name == nick)
            {
                names.info[id as usize].recent = recent
                    .iter()
                    .rev()
                    .map(|&(ip, c)| (ip, c.min(u32::MAX as u64) as u32))
                    .collect();
            }
        }
        recent.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        Some(Player {
            total,
            blocks,
            recent,
        })
    }

    /// The `n` latest holdings of name `id`, newest first, by one pass over every block.
    fn latest_of(&self, id: u32, n: usize) -> Vec<(u32, u64)> {
        let mut best: std::collections::BinaryHeap<std::cmp::Reverse<(u32, u32)>> =
            std::collections::BinaryHeap::new();
        for (hi, block) in self.blocks.iter().enumerate() {
            lock(block).for_each(|low, held| {
                if held.name() == id {
                    let ip = (hi as u32) << 16 | low as u32;
                    best.push(std::cmp::Reverse((held.created(), ip)));
                    if best.len() > n {
                        best.pop();
                    }
                }
            });
        }
        let mut v: Vec<(u32, u64)> = best
            .into_iter()
            .map(|std::cmp::Reverse((c, ip))| (ip, c as u64))
            .collect();
        v.sort_by_key(|r| std::cmp::Reverse(r.1));
        v
    }

    /// Per /8: every name holding addresses there and how many (the all-time board).
    pub fn per_block_counts(&self, mut f: impl FnMut(u8, &str, u64)) {
        for (b, per8) in self.per8.iter().enumerate() {
            // Copy the counts out first: names are locked after per-/8 counts, never while
            // holding one for long.
            let counts: Vec<(u32, u32)> = lock(per8).iter().map(|(&k, &v)| (k, v)).collect();
            let names = lock(&self.names);
            for (id, n) in counts {
                if let Some(info) = names.info.get(id as usize) {
                    f(b as u8, &info.name, n as u64);
                }
            }
        }
    }

    /// Every held address with its holder's name id and time, /16 by /16 in address order
    /// (so each /8 comes whole), each block locked only while it is read: a scan never holds
    /// up claims for long. Ids are resolved afterwards with `names_of`; an id freed and
    /// reused meanwhile resolves to its new name, which a board rebuilt every few seconds
    /// tolerates.
    pub fn scan_ids(&self, mut f: impl FnMut(u32, u32, u64)) {
        for (hi, block) in self.blocks.iter().enumerate() {
            let block = lock(block);
            block.for_each(|low, held| {
                f(
                    (hi as u32) << 16 | low as u32,
                    held.name(),
                    held.created() as u64,
                );
            });
        }
    }

    /// The names of `ids` (empty for an id no longer in use).
    pub fn names_of(&self, ids: &[u32]) -> Vec<String> {
        let names = lock(&self.names);
        ids.iter()
            .map(|&id| {
                names
                    .info
                    .get(id as usize)
                    .map(|i| i.name.to_string())
                    .unwrap_or_default()
            })
            .collect()
    }

    /// Every held address in address order (snapshots, exports), one /16 at a time.
    pub fn sorted_scan(&self, mut f: impl FnMut(u32, &str, u64)) {
        let mut rows: Vec<(u16, Held)> = Vec::new();
        for (hi, block) in self.blocks.iter().enumerate() {
            rows.clear();
            let block = lock(block);
            block.for_each(|low, held| rows.push((low, held)));
            rows.sort_unstable_by_key(|r| r.0);
            let names = lock(&self.names);
            for &(low, held) in &rows {
                let ip = (hi as u32) << 16 | low as u32;
                f(
                    ip,
                    &names.info[held.name() as usize].name,
                    held.created() as u64,
                );
            }
        }
    }

    /// Bytes of memory the state holds (allocations, not counting allocator overhead).
    pub fn bytes(&self) -> MemoryUse {
        let blocks: usize = self.blocks.iter().map(|b| lock(b).bytes()).sum::<usize>()
            + self.blocks.len() * std::mem::size_of::<Mutex<Block>>();
        let counts: usize = self.per8.iter().map(|m| lock(m).allocation_size()).sum();
        let names = lock(&self.names);
        MemoryUse {
            addresses: blocks,
            counts,
            names: names.bytes(),
            name_count: (names.info.len() - names.free.len()) as u64,
        }
    }
}

/// A player page's data.
#[derive(Debug, PartialEq, Eq)]
pub struct Player {
    pub total: u64,
    /// (/8, addresses held there), by /8.
    pub blocks: Vec<(u8, u64)>,
    /// (address, time) of its latest holdings, newest first.
    pub recent: Vec<(u32, u64)>,
}

/// What `Land::bytes` counts.
#[derive(Debug, Clone, Copy)]
pub struct MemoryUse {
    pub addresses: usize,
    pub counts: usize,
    pub names: usize,
    pub name_count: u64,
}

/// Locks, ignoring poisoning: a panic elsewhere leaves every structure here consistent
/// (each change is made whole before the next lock is taken), and the game must keep serving.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(a: u8, b: u8, c: u8, d: u8) -> u32 {
        u32::from_be_bytes([a, b, c, d])
    }

    #[test]
    fn the_refresh_rule() {
        let land = Land::new();
        let a = ip(1, 2, 3, 4);
        assert_eq!(land.decide(a, "alice", 1000, None), Decision::New);
        land.apply(a, "alice", 1000);
        // Same name within the hour: nothing changes.
        assert_eq!(land.decide(a, "alice", 2000, None), Decision::Unchanged);
        // Exactly an hour is not "over an hour".
        assert_eq!(land.decide(a, "alice", 4600, None), Decision::Unchanged);
        assert_eq!(land.decide(a, "alice", 4601, None), Decision::Change);
        // A new name replaces at once.
        assert_eq!(land.decide(a, "bob", 1001, None), Decision::Change);
        // A claim decided earlier in the same batch counts.
        assert_eq!(
            land.decide(a, "bob", 1002, Some(("bob", 1001))),
            Decision::Unchanged
        );
    }

    #[test]
    fn counts_names_and_players_follow_changes() {
        let land = Land::new();
        land.apply(ip(1, 0, 0, 1), "alice", 10);
        land.apply(ip(1, 0, 0, 2), "alice", 11);
        land.apply(ip(2, 0, 0, 1), "alice", 12);
        land.apply(ip(1, 0, 0, 2), "bob", 13);
        assert_eq!(land.claimed(), 3);
        let p = land.player("alice").unwrap();
        assert_eq!(p.total, 2);
        assert_eq!(p.blocks, vec![(1, 1), (2, 1)]);
        assert_eq!(p.recent, vec![(ip(2, 0, 0, 1), 12), (ip(1, 0, 0, 1), 10)]);
        assert_eq!(
            land.player("bob").unwrap().recent,
            vec![(ip(1, 0, 0, 2), 13)]
        );
        // bob loses his only address: his name is forgotten, its id reused.
        land.apply(ip(1, 0, 0, 2), "carol", 14);
        assert!(land.player("bob").is_none());
        assert_eq!(land.holder(ip(1, 0, 0, 2)), Some(("carol".into(), 14)));
        let mut all = Vec::new();
        land.per_block_counts(|b, n, c| all.push((b, n.to_string(), c)));
        all.sort();
        assert_eq!(
            all,
            vec![
                (1, "alice".into(), 1),
                (1, "carol".into(), 1),
                (2, "alice".into(), 1)
            ]
        );
        let recent: Vec<_> = land.recent().into_iter().map(|c| c.nick).collect();
        assert_eq!(recent, ["carol", "bob", "alice", "alice", "alice"]);
    }

    #[test]
    fn a_player_page_finds_older_holdings_when_recent_ones_were_taken() {
        let land = Land::new();
        for i in 0..80u32 {
            land.apply(ip(5, 0, 0, 0) + i, "alice", 1000 + i as u64);
        }
        // Someone takes alice's 50 latest addresses: her page must show her 30 others.
        for i in 30..80u32 {
            land.apply(ip(5, 0, 0, 0) + i, "mallory", 5000);
        }
        let p = land.player("alice").unwrap();
        assert_eq!(p.total, 30);
        assert_eq!(p.recent.len(), 30);
        assert_eq!(p.recent[0], (ip(5, 0, 0, 29), 1029));
        assert_eq!(p.recent[29], (ip(5, 0, 0, 0), 1000));
    }

    #[test]
    fn a_crowded_block_turns_dense_and_keeps_every_entry() {
        let land = Land::new();
        let base = ip(9, 9, 0, 0);
        for i in 0..(DENSE_AT as u32 + 100) {
            land.apply(base + i, if i % 2 == 0 { "even" } else { "odd" }, i as u64);
        }
        assert!(matches!(*land.block(base), Block::Dense(_, n) if n == DENSE_AT + 100));
        assert_eq!(land.holder(base + 7), Some(("odd".into(), 7)));
        assert_eq!(
            land.holder(base + DENSE_AT as u32 + 99),
            Some(("odd".into(), 28_771))
        );
        assert_eq!(land.holder(base + 60_000), None);
        let mut seen = 0;
        let mut last = None;
        land.sorted_scan(|ip, _, _| {
            assert!(last < Some(ip));
            last = Some(ip);
            seen += 1;
        });
        assert_eq!(seen, DENSE_AT + 100);
        assert_eq!(land.claimed(), (DENSE_AT + 100) as u64);
    }
}
