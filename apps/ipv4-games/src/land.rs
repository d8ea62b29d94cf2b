//! The game's state in memory: who holds each claimed address and since when, how many
//! addresses each name holds in each /8, each name's latest claims, and the latest claims of
//! all. Every read of the game is served from here; the store (`store`) only makes changes
//! durable and rebuilds this at start-up.
//!
//! Addresses live in 65,536 blocks, one per /16, each behind its own lock: a reader (a score
//! scan) holds one block at a time, and no map ever grows past one /16's worth of entries,
//! so no resize stalls a worker the way one table of 100 M entries would. A block is a
//! `hashbrown` map of 11 bytes per slot until it holds more than a dense array of the whole
//! /16 would cost (`DENSE_AT`), then that array (8 bytes per address of the /16). Each /16's
//! lock and map header share a cache line of their own, and a turn's claims prefetch those
//! lines together (`prefetch_turn`), so a turn's misses on them overlap.
//!
//! Changes come only from the store, one batch at a time under its write lock, so deciding a
//! claim (`decide`) and applying it (`apply_all`) see the same state. Locks are taken in the
//! order block → names (which hold each name's counts per /8), and recent alone, never the
//! other way.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use hashbrown::HashTable;
use tern_services::background::Yielder;

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
    /// hashbrown, not a table of our own: an open-addressing table of 10-byte slots whose
    /// first slot is known before the lookup (so a turn could prefetch it) was tried and
    /// measured on 2026-12-02 against this map, the rest of land.rs alike. The commit alone
    /// (`bench/claim-path-ab 4 1`, examples/claim_path: 3 M held, turns of 20, ns per claim):
    /// warm 986/1367/1287/962 against 1725/1399/1853/1471 (0.71×), with the caches thrashed
    /// before each turn 6403/9065/7369/6391 against 9073/6148/6555/6026 (1.08×). A whole claim
    /// (`bench/claims-ab --busy --rounds 6 --sync normal`, own table ÷ hashbrown, CPU per
    /// claim): 0.98× quiet (rounds 0.78–1.06), 1.00× beside the cache-thrashing neighbour
    /// (0.94–1.23). No measurable win where it matters, so no hash table of our own to keep.
    Sparse(hashbrown::HashMap<[u8; 2], Held>),
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

    /// Where a lookup of `low` reads first, for a prefetch: known for a dense array only
    /// (hashbrown does not say where a lookup will read).
    fn first_read(&self, low: u16) -> Option<*const u8> {
        match self {
            Block::Sparse(_) => None,
            Block::Dense(a, _) => Some((&a[low as usize] as *const Held).cast()),
        }
    }

    fn len(&self) -> usize {
        match self {
            Block::Sparse(m) => m.len(),
            Block::Dense(_, len) => *len,
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

/// A /16's lock and map header on a cache line of their own, which `Land::prefetch_turn`
/// loads for a turn's claims together.
#[repr(align(64))]
struct Shard(Mutex<Block>);

/// A name's held addresses per /8 (the player page's counts): a short list while it holds
/// few, all 256 counts (1 KiB) once it holds at least `PER8_DENSE_HELD` addresses in more
/// than `PER8_FEW` /8s, which keeps it under 16 bytes per address held.
enum Per8 {
    Few(Vec<(u8, u32)>),
    All(Box<[u32; 256]>),
}

const PER8_FEW: usize = 16;
const PER8_DENSE_HELD: u64 = 64;

impl Per8 {
    fn add(&mut self, slash8: u8, held: u64) {
        match self {
            Per8::Few(v) => {
                if let Some(e) = v.iter_mut().find(|e| e.0 == slash8) {
                    e.1 += 1;
                } else if v.len() >= PER8_FEW && held >= PER8_DENSE_HELD {
                    let mut all = Box::new([0u32; 256]);
                    for &(b, n) in v.iter() {
                        all[b as usize] = n;
                    }
                    all[slash8 as usize] = 1;
                    *self = Per8::All(all);
                } else {
                    v.push((slash8, 1));
                }
            }
            Per8::All(a) => a[slash8 as usize] += 1,
        }
    }

    fn remove(&mut self, slash8: u8) {
        match self {
            Per8::Few(v) => {
                if let Some(i) = v.iter().position(|e| e.0 == slash8) {
                    v[i].1 -= 1;
                    if v[i].1 == 0 {
                        v.swap_remove(i);
                    }
                }
            }
            Per8::All(a) => a[slash8 as usize] = a[slash8 as usize].saturating_sub(1),
        }
    }

    /// (/8, addresses) where it holds some, by /8.
    fn counts(&self) -> Vec<(u8, u64)> {
        let mut out: Vec<(u8, u64)> = match self {
            Per8::Few(v) => v.iter().map(|&(b, n)| (b, n as u64)).collect(),
            Per8::All(a) => (0..=255u8)
                .filter(|&b| a[b as usize] > 0)
                .map(|b| (b, a[b as usize] as u64))
                .collect(),
        };
        out.sort_unstable();
        out
    }

    fn bytes(&self) -> usize {
        match self {
            Per8::Few(v) => v.capacity() * std::mem::size_of::<(u8, u32)>(),
            Per8::All(_) => std::mem::size_of::<[u32; 256]>(),
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
    /// Where those addresses are.
    per8: Per8,
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
            per8: Per8::Few(Vec::new()),
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
        info.per8 = Per8::Few(Vec::new());
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

    fn per8_bytes(&self) -> usize {
        self.info.iter().map(|i| i.per8.bytes()).sum()
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
    blocks: Box<[Shard]>,
    /// Names, with each name's count of addresses per /8 (player pages).
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

/// Asks the CPU to start loading the cache line at `p`: a hint that never faults, so any
/// address will do.
#[inline]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE, which the instruction needs, is part of every x86_64 CPU; a prefetch
    // reads nothing the program sees and never faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl Land {
    pub fn new() -> Land {
        Land {
            blocks: (0..1 << 16)
                .map(|_| Shard(Mutex::new(Block::Sparse(hashbrown::HashMap::new()))))
                .collect(),
            names: Mutex::new(Names::default()),
            recent: Mutex::new(VecDeque::with_capacity(RECENT_LEN)),
            version: AtomicU64::new(0),
            claimed: AtomicU64::new(0),
        }
    }

    fn block(&self, ip: u32) -> std::sync::MutexGuard<'_, Block> {
        lock(&self.blocks[(ip >> 16) as usize].0)
    }

    /// Starts loading what deciding and applying a turn's claims on `ips` will read: first
    /// every /16's lock and map header, then (those being on their way) the address's slot
    /// in the /16s that are dense arrays. The claims' cache misses then overlap instead
    /// of coming one after another, which matters most when a neighbour has emptied the
    /// caches. Takes each /16's lock briefly; changes nothing.
    pub fn prefetch_turn(&self, ips: impl Iterator<Item = u32> + Clone) {
        for ip in ips.clone() {
            prefetch((&self.blocks[(ip >> 16) as usize] as *const Shard).cast());
        }
        for ip in ips {
            if let Some(p) = self.block(ip).first_read(ip as u16) {
                prefetch(p);
            }
        }
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
        let mut new = false;
        self.apply_all([(ip, nick, created)], |n| new = n);
        new
    }

    /// `apply` for a batch (a turn's changes, in order): the latest claims and the counters
    /// are updated once for the batch. `each` learns of every change whether the address was
    /// unclaimed.
    pub fn apply_all<'a>(
        &self,
        changes: impl IntoIterator<Item = (u32, &'a str, u64)>,
        mut each: impl FnMut(bool),
    ) {
        let mut latest: [Option<(u32, Arc<str>, u64)>; RECENT_LEN] = std::array::from_fn(|_| None);
        let (mut n, mut new) = (0usize, 0u64);
        for (ip, nick, created) in changes {
            let (was_new, name) = self.set(ip, nick, created, true);
            new += was_new as u64;
            each(was_new);
            latest[n % RECENT_LEN] = Some((ip, name, created));
            n += 1;
        }
        if n == 0 {
            return;
        }
        self.claimed.fetch_add(new, Ordering::Relaxed);
        {
            let mut recent = lock(&self.recent);
            // The batch's last RECENT_LEN changes, oldest first, each pushed to the front.
            let kept = n.min(RECENT_LEN);
            recent.truncate(RECENT_LEN - kept);
            for k in n - kept..n {
                if let Some(c) = latest[k % RECENT_LEN].take() {
                    recent.push_front(c);
                }
            }
        }
        self.version.fetch_add(1, Ordering::Release);
    }

    /// `apply` for loading a snapshot, which is in address order, not time order: the latest
    /// claims come with it (`set_recent`), and a player's latest holdings are found by a scan
    /// when first asked for.
    pub fn load(&self, ip: u32, nick: &str, created: u64) {
        let (new, _) = self.set(ip, nick, created, false);
        self.claimed.fetch_add(new as u64, Ordering::Relaxed);
    }

    /// Returns whether the address was unclaimed, and the holder's name as the state keeps it.
    /// Leaves `claimed` to the caller.
    fn set(&self, ip: u32, nick: &str, created: u64, remember: bool) -> (bool, Arc<str>) {
        let created32 = created.min(u32::MAX as u64) as u32;
        let slash8 = (ip >> 24) as u8;
        let mut block = self.block(ip);
        let mut names = lock(&self.names);
        let id = names.intern(nick);
        let old = block.set(ip as u16, Held::new(id, created32));
        if let Some(old) = old {
            let info = &mut names.info[old.name() as usize];
            info.per8.remove(slash8);
            info.held -= 1;
            if info.held == 0 && old.name() != id {
                names.release(old.name());
            }
        }
        let info = &mut names.info[id as usize];
        info.held += 1;
        info.per8.add(slash8, info.held);
        if remember {
            if info.recent.len() == PLAYER_RECENT {
                info.recent.pop_front();
            }
            info.recent.push_back((ip, created32));
        }
        let name = info.name.clone();
        drop(names);
        drop(block);
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
        let (id, ring, blocks) = {
            let names = lock(&self.names);
            let id = names.find(nick)?;
            let info = &names.info[id as usize];
            (id, info.recent.clone(), info.per8.counts())
        };
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
            lock(&block.0).for_each(|low, held| {
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
        let names = lock(&self.names);
        let mut rows: Vec<(u8, &str, u64)> = names
            .info
            .iter()
            .filter(|i| i.held > 0)
            .flat_map(|i| {
                i.per8
                    .counts()
                    .into_iter()
                    .map(move |(b, n)| (b, &*i.name, n))
            })
            .collect();
        rows.sort_by_key(|r| r.0);
        for (b, name, n) in rows {
            f(b, name, n);
        }
    }

    /// Every held address with its holder's name id and time, /16 by /16 in address order
    /// (so each /8 comes whole), each block locked only while it is read: a scan never holds
    /// up claims for long. Ids are resolved afterwards with `names_of`; an id freed and
    /// reused meanwhile resolves to its new name, which a board rebuilt every few seconds
    /// tolerates.
    /// `yielder` is given a point between blocks (the scan shares a core with the workers).
    pub fn scan_ids(&self, yielder: &mut Yielder, mut f: impl FnMut(u32, u32, u64)) {
        for (hi, block) in self.blocks.iter().enumerate() {
            yielder.point();
            let block = lock(&block.0);
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
            let block = lock(&block.0);
            if block.len() == 0 {
                continue;
            }
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
    pub fn bytes(&self, yielder: &mut Yielder) -> MemoryUse {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                yielder.point();
                lock(&b.0).bytes()
            })
            .sum::<usize>()
            + self.blocks.len() * std::mem::size_of::<Shard>();
        let names = lock(&self.names);
        MemoryUse {
            addresses: blocks,
            counts: names.per8_bytes(),
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

    /// The scans of the background threads give the CPU back between /16 blocks (what keeps
    /// a score rebuild from stalling a worker on a shared core for a whole time slice), and
    /// see every address whatever the yielder does.
    #[test]
    fn scans_offer_the_cpu_back_between_blocks() {
        let land = Land::new();
        for i in 0..1000u32 {
            land.apply(i.wrapping_mul(0x9E37_79B1), "alice", 10);
        }
        for (every, yields) in [
            (std::time::Duration::ZERO, (1 << 16) / 64),
            (std::time::Duration::MAX, 0),
        ] {
            let mut yielder = Yielder::new(every);
            let mut seen = 0;
            land.scan_ids(&mut yielder, |_, _, _| seen += 1);
            assert_eq!((seen, yielder.yields()), (1000, yields));
            let mut yielder = Yielder::new(every);
            assert_eq!(land.bytes(&mut yielder).name_count, 1);
            assert_eq!(yielder.yields(), yields);
        }
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
            Some(("odd".into(), DENSE_AT as u64 + 99))
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

    #[test]
    fn prefetching_a_turn_reads_any_block_kind_and_changes_nothing() {
        // The prefetch intrinsic (the `unsafe` in `prefetch`) on every kind of block: an
        // empty /16, a sparse map (its /16's line only), a dense array (its slot too), and
        // addresses repeated in one turn.
        let land = Land::new();
        let sparse = ip(3, 3, 0, 0);
        for i in 0..100u32 {
            land.apply(sparse + i * 601, "s", i as u64);
        }
        let dense = ip(4, 4, 0, 0);
        for i in 0..DENSE_AT as u32 + 1 {
            land.apply(dense + i, "d", 1);
        }
        assert!(matches!(*land.block(dense), Block::Dense(..)));
        let v = land.version();
        let turn: Vec<u32> = (0..=0xffffu32)
            .step_by(97)
            .flat_map(|low| {
                [
                    sparse + low,
                    dense + low,
                    ip(5, 5, 0, 0) + low,
                    sparse + low,
                ]
            })
            .collect();
        land.prefetch_turn(turn.iter().copied());
        land.prefetch_turn(std::iter::empty());
        assert_eq!(land.version(), v);
        assert_eq!(land.claimed(), 100 + DENSE_AT as u64 + 1);
        assert_eq!(land.holder(sparse + 601), Some(("s".into(), 1)));
        assert_eq!(land.holder(ip(5, 5, 0, 0)), None);
    }

    #[test]
    fn a_block_stays_sparse_up_to_dense_at_and_finds_every_address_while_it_grows() {
        let land = Land::new();
        let base = ip(7, 7, 0, 0);
        // Addresses spread over the /16 in a scrambled order, re-claimed as they go.
        let low = |i: u32| (i.wrapping_mul(40_503) & 0xffff) as u16;
        for i in 0..DENSE_AT as u32 {
            land.apply(base + low(i) as u32, "a", i as u64);
            if i % 997 == 0 {
                for j in (0..=i).step_by(101) {
                    assert_eq!(
                        land.holder(base + low(j) as u32),
                        Some(("a".into(), j as u64))
                    );
                }
                assert_eq!(land.holder(base + low(i + 1) as u32), None);
            }
        }
        assert!(matches!(*land.block(base), Block::Sparse(ref m) if m.len() == DENSE_AT));
        // A holder changing keeps the count; the next new address turns the block dense.
        land.apply(base + low(5) as u32, "b", 1);
        assert!(matches!(*land.block(base), Block::Sparse(_)));
        land.apply(base + low(DENSE_AT as u32) as u32, "b", 2);
        assert!(matches!(*land.block(base), Block::Dense(_, n) if n == DENSE_AT + 1));
        assert_eq!(land.holder(base + low(5) as u32), Some(("b".into(), 1)));
        assert_eq!(land.claimed(), DENSE_AT as u64 + 1);
    }

    #[test]
    fn per_8_counts_stay_right_through_a_name_growing_dense_and_losing_addresses() {
        let land = Land::new();
        // 300 addresses over 30 /8s: the counts turn dense (more than 16 /8s, 64+ held).
        for i in 0..300u32 {
            land.apply(ip((i % 30) as u8 + 1, 0, (i / 30) as u8, 1), "ann", 10);
        }
        let p = land.player("ann").unwrap();
        assert_eq!(p.total, 300);
        assert_eq!(p.blocks, (1..=30).map(|b| (b, 10)).collect::<Vec<_>>());
        // bob takes all of /8 number 1 and one address of number 2.
        for k in 0..10u8 {
            land.apply(ip(1, 0, k, 1), "bob", 11);
        }
        land.apply(ip(2, 0, 0, 1), "bob", 11);
        let p = land.player("ann").unwrap();
        assert_eq!(p.total, 289);
        assert_eq!(p.blocks[0], (2, 9));
        assert_eq!(p.blocks.len(), 29);
        assert_eq!(land.player("bob").unwrap().blocks, vec![(1, 10), (2, 1)]);
        // A name with few addresses in few /8s, then none: forgotten, its id reused cleanly.
        land.apply(ip(9, 9, 9, 9), "cy", 12);
        land.apply(ip(9, 9, 9, 9), "dee", 13);
        assert!(land.player("cy").is_none());
        assert_eq!(land.player("dee").unwrap().blocks, vec![(9, 1)]);
        let mut all = Vec::new();
        land.per_block_counts(|b, n, c| all.push((b, n.to_string(), c)));
        assert_eq!(all.iter().map(|r| r.2).sum::<u64>(), land.claimed());
    }

    #[test]
    fn a_batch_keeps_the_latest_claims_in_order_and_counts_once() {
        let land = Land::new();
        land.apply(ip(1, 1, 1, 1), "old", 1);
        let v0 = land.version();
        let batch: Vec<(u32, String, u64)> = (0..70u32)
            .map(|i| (ip(2, 0, 0, 0) + i, format!("n{i}"), 100 + i as u64))
            .collect();
        let mut news = 0;
        land.apply_all(batch.iter().map(|(a, n, c)| (*a, n.as_str(), *c)), |new| {
            news += new as u32
        });
        assert_eq!(news, 70);
        assert_eq!(land.version(), v0 + 1);
        assert_eq!(land.claimed(), 71);
        let recent = land.recent();
        assert_eq!(recent.len(), RECENT_LEN);
        // Newest first: the batch's last 50, "old" pushed out.
        let names: Vec<_> = recent.iter().map(|c| c.nick.clone()).collect();
        let want: Vec<_> = (20..70).rev().map(|i| format!("n{i}")).collect();
        assert_eq!(names, want);
        // A small batch goes in front of what was there, in its own order.
        land.apply_all([(ip(3, 0, 0, 1), "x", 1), (ip(3, 0, 0, 2), "y", 2)], |_| {});
        let names: Vec<_> = land.recent().into_iter().map(|c| c.nick).take(3).collect();
        assert_eq!(names, ["y", "x", "n69"]);
    }
}
