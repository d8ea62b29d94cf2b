//! The journal store: one append-only journal for the whole process, written at the end of
//! each worker turn that took claims, with one system call for the whole turn.
//!
//! The write lock covers deciding the turn's claims, writing them and applying them to
//! memory, so the journal's order is the order changes were made, and recovery replays it
//! exactly. Memory holds only what was written: a claim that repeats a change (same name
//! within the hour) is as durable as that change once it is in memory, and is answered in
//! the same turn under `--sync normal`. Under `--sync full` every answer waits for an
//! `fdatasync` that covers the journal's end at the time it was decided: a syncer thread
//! runs one sync for whatever all workers wrote meanwhile, and wakes each worker once.
//!
//! Under `--sync full` the segment is filled with zeros ahead of its writes (`ZERO_AHEAD`), so
//! that a turn's write lands on blocks the file already has and its `fdatasync` writes the
//! data alone: appending past the end changes the file's size each time, and the sync must
//! then write the inode too (measured on this machine's ext4: 164-197 µs and 64-68 µs of CPU
//! per append + fdatasync, against 106-124 µs and 46-48 µs over zeros already synced).
//! Recovery and compaction read a tail of zeros as a clean end; a closed segment is cut to
//! its length before the next one begins.
//!
//! A failed write is cut off again (so the journal never holds half a frame followed by
//! more), the turn's claims get a 503 and memory is unchanged. A failed sync is not retried
//! (the kernel may have dropped the pages it could not write): claims stop with a 503 until
//! a restart, which recovers from what is on disk.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use hashbrown::HashMap;
use tern_server::{Pending, Response, Server, StopSignal};
use tern_services::metrics::Metric;

use super::latency::Histogram;
use super::{refusal, ClaimStore, Refusal, Staged, SyncMode};
use crate::journal::{self, compact, frame, Record};
use crate::land::{Decision, Land};

/// Settings of the journal store.
#[derive(Debug, Clone)]
pub struct JournalOptions {
    pub dir: PathBuf,
    pub sync: SyncMode,
    /// A segment is closed (and becomes foldable into a snapshot) past this size.
    pub segment_bytes: u64,
    /// Most addresses held; claims of new addresses beyond it are answered 503.
    pub max_claims: u64,
    /// Most names holding addresses; claims under a new name beyond it are answered 503
    /// (each name costs far more memory than an address).
    pub max_names: u64,
    /// Test hook for power-cut tests: after each sync, `segment length` of what is synced
    /// is written here, so a test can cut the journal back to it.
    pub sync_mark: Option<PathBuf>,
    /// Test hook: the syncer waits this long before each sync, so that tests can hold
    /// claims pending. Zero in production.
    pub test_sync_delay: Duration,
    /// How long the syncer, out of work, watches for more before it sleeps: a worker on
    /// another CPU then hands it a turn with no wake-up. `None`: `SYNC_SPIN` when this
    /// process may run on more than one CPU, else zero (on one CPU a spinning syncer would
    /// only keep the worker from running).
    pub sync_spin: Option<Duration>,
}

/// How far past its end a segment is filled with zeros under `--sync full` (refilled when less
/// than half is left): one size change and block allocation per this many bytes of claims
/// (about 60,000) instead of one per sync.
pub const ZERO_AHEAD: u64 = 1 << 20;

/// The syncer's spin before it sleeps (`JournalOptions::sync_spin`), measured with
/// `examples/handoff.rs`: longer than a worker's turn between two syncs at a few claims per
/// turn, short enough that an idle game costs nothing noticeable.
pub const SYNC_SPIN: Duration = Duration::from_micros(50);

impl JournalOptions {
    /// A journal in `dir` with no limits, 64 MiB segments and no test hooks.
    pub fn new(dir: &Path, sync: SyncMode) -> JournalOptions {
        JournalOptions {
            dir: dir.to_path_buf(),
            sync,
            segment_bytes: 64 << 20,
            max_claims: u64::MAX,
            max_names: u64::MAX,
            sync_mark: None,
            test_sync_delay: Duration::ZERO,
            sync_spin: None,
        }
    }
}

/// The CPUs this thread may run on.
fn usable_cpus() -> usize {
    // SAFETY: sched_getaffinity(0 = this thread) writes at most the size given into the
    // zeroed set, which lives on this stack; CPU_COUNT only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return 1;
        }
        libc::CPU_COUNT(&set) as usize
    }
}

/// The journal store; see the module documentation.
pub struct JournalStore {
    /// Held (an exclusive `flock`) for as long as the store lives: one writer per journal.
    _lock: File,
    options: JournalOptions,
    writer: Mutex<Writer>,
    syncer: Option<Syncer>,
    /// Set when a sync failed: no more claims until a restart.
    stopped: AtomicBool,
    /// The segment being written; compaction folds the ones before it.
    current: AtomicU64,
    /// The newest snapshot (0: none).
    snapshot: AtomicU64,
    stats: Stats,
}

struct Writer {
    file: Arc<File>,
    segment: u64,
    length: u64,
    /// The file's size: past `length`, zeros written ahead (`--sync full`).
    zeroed_to: u64,
    /// `ZERO_AHEAD` zeros to write from, made at the first fill.
    zeros: Vec<u8>,
    buf: Vec<u8>,
    /// Claims of this turn decided as changes, by address: the index of the latest.
    overlay: HashMap<u32, usize>,
    outcomes: Vec<Outcome>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Write,
    Repeat,
    Full,
}

#[derive(Default)]
struct Stats {
    saved: AtomicU64,
    writes: AtomicU64,
    written_bytes: AtomicU64,
    changes: AtomicU64,
    repeats: AtomicU64,
    write_errors: AtomicU64,
    refused_full: AtomicU64,
    refused_stopped: AtomicU64,
    syncs: AtomicU64,
    sync_nanos: AtomicU64,
    sync_max_nanos: AtomicU64,
    sync_errors: AtomicU64,
    compactions: AtomicU64,
    compaction_errors: AtomicU64,
    compaction_nanos: AtomicU64,
    snapshot_bytes: AtomicU64,
    journal_bytes: AtomicU64,
    recovered: AtomicU64,
    recovery_nanos: AtomicU64,
}

/// The hand-off to the syncer (`--sync full`).
struct Syncer {
    queue: Mutex<SyncQueue>,
    wake: Condvar,
    /// What the clocks of the waits count from.
    epoch: Instant,
    /// Turns handed over so far: what a spinning syncer watches.
    queued: AtomicU64,
    /// Each fdatasync's time: the device's part of a claim's wait.
    sync_times: Histogram,
    /// A claim's wait from the end of its worker turn until its answer is handed back to the
    /// worker, less the fdatasync time in that wait: tern's own part.
    tern_waits: Histogram,
}

#[derive(Default)]
struct SyncQueue {
    answers: Vec<(Pending, Response)>,
    /// The turns those answers came from, for the account of their waits.
    turns: Vec<TurnWait>,
    /// The file and end to sync for them.
    target: Option<(Arc<File>, u64, u64)>,
    /// What is known synced: (segment, length).
    synced: (u64, u64),
    /// The syncer is syncing (it looks at the queue again when done: no wake-up needed).
    busy: bool,
    /// Nanoseconds spent in fdatasync calls that have finished, and when (nanoseconds since
    /// `Syncer::epoch`) the one under way started: the device's clock.
    device_nanos: u64,
    syncing_since: Option<u64>,
}

/// One worker turn's answers waiting for a sync.
struct TurnWait {
    /// When the turn was committed (nanoseconds since `Syncer::epoch`).
    at: u64,
    /// The device's clock then (`SyncQueue::device_nanos` plus the part of a sync under way).
    device: u64,
    answers: u64,
}

impl SyncQueue {
    fn device_clock(&self, now: u64) -> u64 {
        self.device_nanos + self.syncing_since.map_or(0, |t| now.saturating_sub(t))
    }
}

impl JournalStore {
    /// Opens the data folder: migrates a database of an older tern, recovers the state into
    /// `land`, and gets ready to append.
    pub fn open(options: JournalOptions, land: &Land) -> Result<JournalStore, String> {
        let started = Instant::now();
        let dir = &options.dir;
        let lock = lock_folder(dir)?;
        if let Some(rows) = crate::sqlite::migrate(dir)? {
            tracing::info!(
                claims = rows,
                "moved the claims of {} into the journal's first snapshot; the old file is kept as {}",
                crate::sqlite::db_path(dir).display(),
                crate::sqlite::migrated_path(dir).display()
            );
        }
        let recovered = journal::recover(dir, land)?;
        if let Some((path, from, to)) = &recovered.cut {
            tracing::warn!(
                "{}: cut a torn write at its end ({from} -> {to} bytes); no claim in it was answered",
                path.display()
            );
        }
        let path = journal::segment_path(dir, recovered.segment);
        let file = open_segment(&path, recovered.length, options.sync)?;
        let zeroed_to = file
            .metadata()
            .map_err(|e| format!("cannot read the size of {}: {e}", path.display()))?
            .len()
            .max(recovered.length);
        let listing =
            journal::list(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let stats = Stats::default();
        stats.recovered.store(
            recovered.from_snapshot + recovered.from_journal,
            Ordering::Relaxed,
        );
        stats
            .recovery_nanos
            .store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let snapshot = listing.snapshots.last().copied().unwrap_or(0);
        if snapshot != 0 {
            let size = std::fs::metadata(journal::snapshot_path(dir, snapshot))
                .map(|m| m.len())
                .unwrap_or(0);
            stats.snapshot_bytes.store(size, Ordering::Relaxed);
        }
        // The zeros written ahead in the current segment are not journal.
        stats.journal_bytes.store(
            journal_bytes(dir, snapshot.max(1)) - (zeroed_to - recovered.length),
            Ordering::Relaxed,
        );
        if recovered.from_snapshot + recovered.from_journal > 0 {
            tracing::info!(
                from_snapshot = recovered.from_snapshot,
                from_journal = recovered.from_journal,
                addresses = land.claimed(),
                ms = started.elapsed().as_millis() as u64,
                "IPv4 Games state recovered"
            );
        }
        let syncer = (options.sync == SyncMode::Full).then(|| Syncer {
            queue: Mutex::new(SyncQueue {
                synced: (recovered.segment, recovered.length),
                ..SyncQueue::default()
            }),
            wake: Condvar::new(),
            epoch: Instant::now(),
            queued: AtomicU64::new(0),
            sync_times: Histogram::default(),
            tern_waits: Histogram::default(),
        });
        Ok(JournalStore {
            _lock: lock,
            writer: Mutex::new(Writer {
                file: Arc::new(file),
                segment: recovered.segment,
                length: recovered.length,
                zeroed_to,
                zeros: Vec::new(),
                buf: Vec::with_capacity(64 << 10),
                overlay: HashMap::new(),
                outcomes: Vec::new(),
            }),
            current: AtomicU64::new(recovered.segment),
            snapshot: AtomicU64::new(snapshot),
            syncer,
            stopped: AtomicBool::new(false),
            stats,
            options,
        })
    }

    fn refuse_all(
        &self,
        claims: &mut Vec<Staged>,
        answers: &mut Vec<(Pending, Response)>,
        why: Refusal,
    ) {
        answers.extend(claims.drain(..).map(|c| c.refused(why)));
    }

    /// Closes the current segment and starts the next (under the write lock).
    fn rotate(&self, w: &mut Writer) -> Result<(), String> {
        let full = self.options.sync == SyncMode::Full;
        if w.zeroed_to > w.length {
            // A closed segment ends at its last frame (compaction and recovery would read
            // zeros as a clean end too, but its size then says what it holds).
            w.file
                .set_len(w.length)
                .map_err(|e| format!("cannot cut {}: {e}", self.segment_path(w.segment)))?;
            w.zeroed_to = w.length;
        }
        if full {
            // Closed segments must be whole on disk: recovery refuses a short one.
            w.file
                .sync_data()
                .map_err(|e| format!("cannot sync {}: {e}", self.segment_path(w.segment)))?;
        }
        let next = w.segment + 1;
        let path = journal::segment_path(&self.options.dir, next);
        let file = open_segment(&path, frame::HEADER_LEN as u64, self.options.sync)?;
        w.file = Arc::new(file);
        w.segment = next;
        w.length = frame::HEADER_LEN as u64;
        w.zeroed_to = w.length;
        self.current.store(next, Ordering::Release);
        if let Some(s) = &self.syncer {
            let mut q = lock(&s.queue);
            q.synced = q.synced.max((next, w.length));
            self.mark_synced(q.synced);
        }
        Ok(())
    }

    /// Fills the segment with zeros up to `ZERO_AHEAD` past its end, within its planned size
    /// (`segment_bytes`), under the write lock, so the next turns' writes and syncs change no
    /// size and allocate no block. Only an optimisation: if it fails (a full disk), the turns
    /// append as before (it is tried again at the next turn's write), and the failure shows
    /// where it matters, in the turns' own writes.
    fn zero_ahead(&self, w: &mut Writer) {
        let from = w.zeroed_to.max(w.length);
        // No further than the segment's end: past it, the next segment takes the turns.
        let to = (w.length + ZERO_AHEAD).min(self.options.segment_bytes);
        if to <= from {
            return;
        }
        if w.zeros.is_empty() {
            w.zeros = vec![0; ZERO_AHEAD as usize];
        }
        match w.file.write_all_at(&w.zeros[..(to - from) as usize], from) {
            Ok(()) => w.zeroed_to = to,
            Err(e) => {
                // What part landed is zeros past the end: recovery reads them as such.
                tracing::debug!("filling {} ahead: {e}", self.segment_path(w.segment));
                w.zeroed_to = w.zeroed_to.max(w.length);
            }
        }
    }

    fn segment_path(&self, n: u64) -> String {
        journal::segment_path(&self.options.dir, n)
            .display()
            .to_string()
    }

    /// Writes what is synced for the test hook: the furthest position, under the queue's
    /// lock, so that a sync of an earlier target finishing late (two workers' turns) or a
    /// rotation never moves the mark back.
    fn mark_synced(&self, (segment, length): (u64, u64)) {
        if let Some(mark) = &self.options.sync_mark {
            // Fixed width, one write at offset 0: a reader never sees half of two values.
            let line = format!("{segment:020} {length:020}\n");
            if let Ok(f) = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(mark)
            {
                let _ = f.write_all_at(line.as_bytes(), 0);
            }
        }
    }

    /// The syncer thread (`--sync full`): one `fdatasync` for everything written since the
    /// last, then every claim it covers is answered (each worker woken once).
    /// Public so that benchmarks (`examples/handoff.rs`) can run the real hand-off; a game
    /// started by `mount` runs it itself on its `claim-syncer` thread.
    pub fn run_syncer(&self, stop: StopSignal) {
        let s = self
            .syncer
            .as_ref()
            .expect("syncer runs only with --sync full");
        let since = |t: Instant| t.saturating_duration_since(s.epoch).as_nanos() as u64;
        // Swapped with the queue's each round, so neither side allocates once warm.
        let mut answers = Vec::new();
        let mut turns = Vec::new();
        let spin = self.options.sync_spin.unwrap_or(if usable_cpus() > 1 {
            SYNC_SPIN
        } else {
            Duration::ZERO
        });
        loop {
            let mut q = lock(&s.queue);
            if q.answers.is_empty() && !spin.is_zero() {
                // Still `busy`: a worker handing over a turn meanwhile wakes no one.
                let seen = s.queued.load(Ordering::Acquire);
                drop(q);
                let until = Instant::now() + spin;
                'watch: while s.queued.load(Ordering::Acquire) == seen {
                    for _ in 0..64 {
                        std::hint::spin_loop();
                        if s.queued.load(Ordering::Acquire) != seen {
                            break 'watch;
                        }
                    }
                    if Instant::now() >= until || stop.is_stopped() {
                        break;
                    }
                }
                q = lock(&s.queue);
            }
            while q.answers.is_empty() {
                if stop.is_stopped() {
                    return;
                }
                q.busy = false;
                q = s
                    .wake
                    .wait_timeout(q, Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            q.busy = true;
            std::mem::swap(&mut q.answers, &mut answers);
            std::mem::swap(&mut q.turns, &mut turns);
            let (file, segment, length) = q.target.take().expect("answers come with a target");
            let started = Instant::now();
            q.syncing_since = Some(since(started));
            drop(q);
            if !self.options.test_sync_delay.is_zero() {
                std::thread::sleep(self.options.test_sync_delay);
            }
            let synced = file.sync_data();
            let nanos = started.elapsed().as_nanos() as u64;
            self.stats.syncs.fetch_add(1, Ordering::Relaxed);
            self.stats.sync_nanos.fetch_add(nanos, Ordering::Relaxed);
            self.stats
                .sync_max_nanos
                .fetch_max(nanos, Ordering::Relaxed);
            s.sync_times.record(nanos, 1);
            let device = {
                let mut q = lock(&s.queue);
                q.device_nanos += nanos;
                q.syncing_since = None;
                if synced.is_ok() {
                    q.synced = q.synced.max((segment, length));
                    self.mark_synced(q.synced);
                }
                q.device_nanos
            };
            let n = answers.len() as u64;
            match synced {
                Ok(()) => {
                    self.stats.saved.fetch_add(n, Ordering::Relaxed);
                    tern_server::complete_all(answers.drain(..));
                }
                Err(e) => {
                    // Not retried: after a failed fsync the kernel may have dropped the dirty
                    // pages, so a later "success" would not mean they are on disk.
                    self.stopped.store(true, Ordering::Release);
                    self.stats.sync_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(
                        "syncing {} failed: {e}; claims are answered 503 until tern is restarted",
                        self.segment_path(segment)
                    );
                    self.stats.refused_stopped.fetch_add(n, Ordering::Relaxed);
                    tern_server::complete_all(
                        answers
                            .drain(..)
                            .map(|(p, _)| (p, refusal(Refusal::Stopped))),
                    );
                }
            }
            let now = since(Instant::now());
            for t in turns.drain(..) {
                let waited = now.saturating_sub(t.at);
                s.tern_waits
                    .record(waited.saturating_sub(device - t.device), t.answers);
            }
        }
    }

    /// The compaction thread: folds closed segments into a new snapshot once they hold
    /// at least a segment's worth and half the last snapshot's size (so the work of
    /// rewriting the snapshot stays a small multiple of what the journal took in).
    fn run_compactor(&self, stop: StopSignal) {
        tern_services::background::lower_priority();
        let mut yielder =
            tern_services::background::Yielder::new(tern_services::background::YIELD_EVERY);
        while !stop.is_stopped() {
            std::thread::sleep(Duration::from_millis(200));
            let current = self.current.load(Ordering::Acquire);
            let snapshot = self.snapshot.load(Ordering::Acquire);
            let first = snapshot.max(1);
            if current <= first {
                continue;
            }
            let closed = journal_bytes_between(&self.options.dir, first, current);
            let snapshot_bytes = self.stats.snapshot_bytes.load(Ordering::Relaxed);
            if closed < self.options.segment_bytes.max(snapshot_bytes / 2) {
                continue;
            }
            let started = Instant::now();
            let old = (snapshot != 0).then_some(snapshot);
            match compact::compact(&self.options.dir, old, current, &mut yielder) {
                Ok(done) => {
                    self.snapshot.store(done.covers, Ordering::Release);
                    self.stats.journal_bytes.store(
                        journal_bytes(&self.options.dir, done.covers),
                        Ordering::Relaxed,
                    );
                    self.stats
                        .snapshot_bytes
                        .store(done.bytes, Ordering::Relaxed);
                    self.stats.compactions.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .compaction_nanos
                        .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    tracing::debug!(
                        claims = done.claims,
                        segments = done.segments,
                        bytes = done.bytes,
                        ms = started.elapsed().as_millis() as u64,
                        "journal compacted"
                    );
                }
                Err(e) => {
                    self.stats.compaction_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!("compaction failed (the journal keeps everything): {e}");
                    std::thread::sleep(Duration::from_secs(5));
                }
            }
        }
    }
}

impl ClaimStore for JournalStore {
    fn commit(
        &self,
        land: &Land,
        claims: &mut Vec<Staged>,
        answers: &mut Vec<(Pending, Response)>,
    ) {
        if self.stopped.load(Ordering::Acquire) {
            let n = claims.len() as u64;
            self.stats.refused_stopped.fetch_add(n, Ordering::Relaxed);
            return self.refuse_all(claims, answers, Refusal::Stopped);
        }
        let turn_ended = Instant::now();
        let mut guard = lock(&self.writer);
        let w = &mut *guard;
        w.buf.clear();
        w.overlay.clear();
        w.outcomes.clear();
        let at = frame::begin_frame(&mut w.buf);
        land.prefetch_turn(claims.iter().map(|c| c.ip));
        let mut room = self.options.max_claims.saturating_sub(land.claimed());
        let mut name_room = self.options.max_names.saturating_sub(land.names_held());
        let near_name_limit = name_room <= claims.len() as u64;
        for (i, c) in claims.iter().enumerate() {
            let earlier = w.overlay.get(&c.ip).map(|&j| {
                let e = &claims[j];
                (e.nick.as_str(), e.at)
            });
            let decision = land.decide(c.ip, &c.nick, c.at, earlier);
            // A name new in this turn counts once per claim here: at worst a few claims
            // refused early at the limit. Far from it, names are not looked up at all.
            let new_name =
                near_name_limit && decision != Decision::Unchanged && !land.knows(&c.nick);
            let outcome = match decision {
                Decision::Unchanged => Outcome::Repeat,
                Decision::New if room == 0 => Outcome::Full,
                _ if new_name && name_room == 0 => Outcome::Full,
                decision => {
                    if decision == Decision::New {
                        room -= 1;
                    }
                    if new_name {
                        name_room -= 1;
                    }
                    Record {
                        ip: c.ip,
                        created: c.at.min(u32::MAX as u64) as u32,
                        nick: &c.nick,
                    }
                    .encode(&mut w.buf);
                    w.overlay.insert(c.ip, i);
                    Outcome::Write
                }
            };
            w.outcomes.push(outcome);
        }
        let changes = w.outcomes.iter().filter(|&&o| o == Outcome::Write).count() as u64;
        if changes > 0 {
            frame::finish_frame(&mut w.buf, at);
            if let Err(e) = w.file.write_all_at(&w.buf, w.length) {
                self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                // Whatever part of the frame landed goes again, so the next write follows
                // whole frames; if even that fails, nothing more may be appended.
                // (The cut takes the zeros written ahead with it.)
                w.zeroed_to = w.length;
                if let Err(e2) = w.file.set_len(w.length) {
                    self.stopped.store(true, Ordering::Release);
                    tracing::error!(
                        "writing {} failed ({e}) and cutting the partial write failed ({e2}); \
                         claims are answered 503 until tern is restarted",
                        self.segment_path(w.segment)
                    );
                } else {
                    tracing::error!(
                        claims = claims.len(),
                        "writing {} failed: {e}; this turn's claims are answered 503",
                        self.segment_path(w.segment)
                    );
                }
                drop(guard);
                return self.refuse_all(claims, answers, Refusal::WriteFailed);
            }
            w.length += w.buf.len() as u64;
            if self.syncer.is_some() && w.length + ZERO_AHEAD / 2 > w.zeroed_to {
                self.zero_ahead(w);
            }
            self.stats.writes.fetch_add(1, Ordering::Relaxed);
            self.stats
                .written_bytes
                .fetch_add(w.buf.len() as u64, Ordering::Relaxed);
            self.stats
                .journal_bytes
                .fetch_add(w.buf.len() as u64, Ordering::Relaxed);
            land.apply_all(
                claims
                    .iter()
                    .zip(&w.outcomes)
                    .filter(|(_, &o)| o == Outcome::Write)
                    .map(|(c, _)| (c.ip, c.nick.as_str(), c.at)),
                |_| {},
            );
            self.stats.changes.fetch_add(changes, Ordering::Relaxed);
        }
        let repeats = w.outcomes.iter().filter(|&&o| o == Outcome::Repeat).count() as u64;
        self.stats.repeats.fetch_add(repeats, Ordering::Relaxed);
        let target = (w.file.clone(), w.segment, w.length);
        let outcomes = std::mem::take(&mut w.outcomes);
        if w.length >= self.options.segment_bytes {
            if let Err(e) = self.rotate(w) {
                // Appending to the long segment goes on; the next turn tries again.
                tracing::error!("cannot start a new journal segment: {e}");
            }
        }
        drop(guard);

        let mut saved = Vec::with_capacity(claims.len());
        for (c, o) in claims.drain(..).zip(&outcomes) {
            match o {
                Outcome::Full => {
                    self.stats.refused_full.fetch_add(1, Ordering::Relaxed);
                    answers.push(c.refused(Refusal::Full));
                }
                Outcome::Write | Outcome::Repeat => saved.push(c.saved()),
            }
        }
        let Some(s) = &self.syncer else {
            // --sync normal: in the page cache, which a killed process cannot lose.
            self.stats
                .saved
                .fetch_add(saved.len() as u64, Ordering::Relaxed);
            answers.append(&mut saved);
            return;
        };
        if saved.is_empty() {
            return;
        }
        let mut q = lock(&s.queue);
        if changes == 0 && q.synced >= (target.1, target.2) {
            drop(q);
            self.stats
                .saved
                .fetch_add(saved.len() as u64, Ordering::Relaxed);
            answers.append(&mut saved);
            return;
        }
        let now = turn_ended.saturating_duration_since(s.epoch).as_nanos() as u64;
        let device = q.device_clock(now);
        q.turns.push(TurnWait {
            at: now,
            device,
            answers: saved.len() as u64,
        });
        q.answers.append(&mut saved);
        s.queued.fetch_add(1, Ordering::Release);
        if q.target
            .as_ref()
            .is_none_or(|t| (t.1, t.2) < (target.1, target.2))
        {
            q.target = Some(target);
        }
        let idle = !q.busy;
        drop(q);
        if idle {
            s.wake.notify_one();
        }
    }

    fn start(self: Arc<Self>, server: &mut Server, _land: Arc<Land>) {
        if self.syncer.is_some() {
            let store = self.clone();
            server.background("claim-syncer", move |stop| store.run_syncer(stop));
        }
        server.background("compactor", move |stop| self.run_compactor(stop));
    }

    fn metrics(&self, out: &mut Vec<Metric>) {
        let s = &self.stats;
        let (get, seconds) = (super::count, super::seconds);
        let stopped = self.stopped.load(Ordering::Relaxed) as u8 as f64;
        let segment = self.current.load(Ordering::Relaxed) as f64;
        metrics_table! { out;
            counter "claims_saved" "claims answered 200 once durable (--sync full: once synced)" = get(&s.saved);
            counter "journal_writes" "journal writes (one per worker turn with changed claims)" = get(&s.writes);
            counter "journal_written_bytes" "bytes appended to the journal" = get(&s.written_bytes);
            counter "claims_changed" "claims that changed an address's holder or time (written)" = get(&s.changes);
            counter "claims_unchanged" "claims repeating the holder's claim within the hour (not written)" = get(&s.repeats);
            counter "journal_write_errors" "journal writes that failed (their turn answered 503)" = get(&s.write_errors);
            counter "claims_refused_full" "claims refused at --max-claims (or the name limit)" = get(&s.refused_full);
            counter "claims_refused_stopped" "claims refused after a failed sync" = get(&s.refused_stopped);
            counter "journal_syncs" "fdatasync calls of the journal (--sync full)" = get(&s.syncs);
            counter "journal_sync_errors" "failed fdatasync calls (claims stop)" = get(&s.sync_errors);
            counter "compactions" "snapshots written by compaction" = get(&s.compactions);
            counter "compaction_errors" "compactions that failed" = get(&s.compaction_errors);
            seconds "journal_sync_seconds_total" "time spent in the journal's fdatasync calls" = seconds(&s.sync_nanos);
            seconds "compaction_seconds_total" "time spent compacting" = seconds(&s.compaction_nanos);
            gauge "journal_sync_seconds_max" "the longest journal fdatasync" = seconds(&s.sync_max_nanos);
            gauge "claims_stopped" "1 once a failed sync stopped claims (until restart)" = stopped;
            gauge "snapshot_bytes" "size of the newest snapshot" = get(&s.snapshot_bytes) as f64;
            gauge "journal_bytes" "bytes of journal segments not yet folded into a snapshot" = get(&s.journal_bytes) as f64;
            gauge "journal_segment" "number of the journal segment being written" = segment;
            gauge "recovered_claims" "claims read back at start-up" = get(&s.recovered) as f64;
            gauge "recovery_seconds" "time the start-up recovery took" = seconds(&s.recovery_nanos);
        }
        if let Some(syncer) = &self.syncer {
            out.extend(syncer.sync_times.metrics(
                "journal_fdatasync_seconds",
                "each fdatasync of the journal (--sync full): the device's part of a claim's wait",
            ));
            out.extend(syncer.tern_waits.metrics(
                "claim_tern_wait_seconds",
                "--sync full: a claim's wait from the end of its worker turn until its answer is \
                 handed back to the worker, less the fdatasync time in it (tern's own part)",
            ));
        }
    }
}

/// Takes the data folder's lock (`journal-lock`, an exclusive `flock`): two processes
/// appending to one journal would overwrite each other's frames. A second tern on the same
/// folder (a restart that starts the new process before stopping the old one) is refused at
/// start-up instead.
fn lock_folder(dir: &Path) -> Result<File, String> {
    use std::os::fd::AsRawFd;
    let path = dir.join("journal-lock");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(if e.kind() == std::io::ErrorKind::WouldBlock {
            format!(
                "the data folder {} is in use by another tern (a journal has one writer): stop \
                 that one first",
                dir.display()
            )
        } else {
            format!("cannot lock {}: {e}", path.display())
        });
    }
    Ok(file)
}

/// Opens segment `path` for appending at `length`, creating it (with its header) if needed.
fn open_segment(path: &Path, length: u64, sync: SyncMode) -> Result<File, String> {
    let exists = path.exists();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    if !exists || length == frame::HEADER_LEN as u64 {
        file.write_all_at(&frame::header(frame::Kind::Journal), 0)
            .and_then(|()| file.set_len(frame::HEADER_LEN as u64))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        if sync == SyncMode::Full {
            // The new file and its name must survive a power cut before anything in it
            // is acknowledged.
            file.sync_all()
                .and_then(|()| journal::sync_dir(path.parent().unwrap_or(Path::new("."))))
                .map_err(|e| format!("cannot sync {}: {e}", path.display()))?;
        }
    }
    Ok(file)
}

fn journal_bytes(dir: &Path, from: u64) -> u64 {
    journal_bytes_between(dir, from, u64::MAX)
}

/// Bytes of segments `from..until` in `dir`.
fn journal_bytes_between(dir: &Path, from: u64, until: u64) -> u64 {
    let Ok(listing) = journal::list(dir) else {
        return 0;
    };
    listing
        .segments
        .iter()
        .filter(|&&n| n >= from && n < until)
        .map(|&n| {
            std::fs::metadata(journal::segment_path(dir, n))
                .map(|m| m.len())
                .unwrap_or(0)
        })
        .sum()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::answer::AnswerKind;
    use tern_server::testing::TestReplies;

    fn options(dir: &Path, sync: SyncMode) -> JournalOptions {
        JournalOptions::new(dir, sync)
    }

    /// A fresh data folder and a store on it (`tweak` adjusts the options first).
    fn fresh(
        sync: SyncMode,
        tweak: impl FnOnce(&mut JournalOptions),
    ) -> (tempfile::TempDir, Land, JournalStore, TestReplies) {
        let dir = tempfile::tempdir().unwrap();
        let land = Land::new();
        let mut o = options(dir.path(), sync);
        tweak(&mut o);
        let store = JournalStore::open(o, &land).unwrap();
        (dir, land, store, TestReplies::new())
    }

    fn staged(replies: &TestReplies, seq: u64, ip: u32, nick: &str, at: u64) -> Staged {
        Staged {
            ip,
            nick: nick.into(),
            at,
            answer: AnswerKind::Text,
            pending: replies.pending(seq),
        }
    }

    fn statuses(answers: &mut Vec<(Pending, Response)>) -> Vec<u16> {
        let v = answers.iter().map(|(_, r)| r.status).collect();
        for (p, _) in answers.drain(..) {
            p.cancel();
        }
        v
    }

    /// (seq, status) of the replies the syncer completed, waiting up to 5 s for the first.
    fn completed(replies: &TestReplies) -> Vec<(u64, u16)> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut done = replies.completed();
        while done.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !replies.wait(left) {
                break;
            }
            done = replies.completed();
        }
        done.iter().map(|(seq, r)| (*seq, r.status)).collect()
    }

    /// Answers come refusals first: compare them as a multiset.
    fn sorted(mut v: Vec<u16>) -> Vec<u16> {
        v.sort_unstable();
        v
    }

    /// The state as recovery rebuilds it from the files.
    fn on_disk(dir: &Path) -> Vec<(u32, String, u64)> {
        let land = Land::new();
        journal::recover_read_only(dir, &land).unwrap();
        let mut v = Vec::new();
        land.sorted_scan(|ip, n, c| v.push((ip, n.to_string(), c)));
        v
    }

    fn in_memory(land: &Land) -> Vec<(u32, String, u64)> {
        let mut v = Vec::new();
        land.sorted_scan(|ip, n, c| v.push((ip, n.to_string(), c)));
        v
    }

    #[test]
    fn a_turn_is_one_write_and_is_answered_in_the_turn() {
        let (dir, land, store, replies) = fresh(SyncMode::Normal, |_| {});
        let mut claims = vec![
            staged(&replies, 1, 10, "ann", 1000),
            staged(&replies, 2, 10, "ann", 1001), // repeats the first: nothing to write
            staged(&replies, 3, 10, "bob", 1002), // a new holder
            staged(&replies, 4, 11, "cat", 1003),
        ];
        let mut answers = Vec::new();
        store.commit(&land, &mut claims, &mut answers);
        assert!(claims.is_empty());
        assert_eq!(statuses(&mut answers), [200, 200, 200, 200]);
        assert_eq!(store.stats.writes.load(Ordering::Relaxed), 1);
        assert_eq!(store.stats.changes.load(Ordering::Relaxed), 3);
        assert_eq!(store.stats.repeats.load(Ordering::Relaxed), 1);
        assert_eq!(land.holder(10), Some(("bob".into(), 1002)));
        assert_eq!(on_disk(dir.path()), in_memory(&land));
        // One frame with the three changes, in order.
        let bytes = std::fs::read(journal::segment_path(dir.path(), 1)).unwrap();
        let (frames, _) = frame::frames(&bytes, frame::Kind::Journal).unwrap();
        assert_eq!(frames.len(), 1);
        let nicks: Vec<_> = journal::records(frames[0])
            .unwrap()
            .iter()
            .map(|r| r.nick.to_string())
            .collect();
        assert_eq!(nicks, ["ann", "bob", "cat"]);
        // A turn of repeats only writes nothing.
        let mut claims = vec![staged(&replies, 5, 11, "cat", 1100)];
        store.commit(&land, &mut claims, &mut answers);
        assert_eq!(statuses(&mut answers), [200]);
        assert_eq!(store.stats.writes.load(Ordering::Relaxed), 1);
    }

    /// Under `--sync full` the segment is filled with zeros ahead of its writes, which land
    /// on them; a restart reads the zeros as a clean end (no cut, nothing lost), goes on
    /// writing over them, and a closed segment is cut to its last frame. `--sync normal`
    /// has no syncs to spare the size changes of, and fills nothing.
    #[test]
    fn full_sync_writes_over_zeros_filled_ahead_and_restarts_cleanly() {
        let (dir, land, store, replies) = fresh(SyncMode::Full, |o| o.segment_bytes = 2 << 20);
        let syncer = {
            let stop = StopSignal::default();
            let store = Arc::new(store);
            let s = store.clone();
            let st = stop.clone();
            (store, stop, std::thread::spawn(move || s.run_syncer(st)))
        };
        let store = &syncer.0;
        let segment = journal::segment_path(dir.path(), 1);
        let mut answers = Vec::new();
        let mut seq = 0;
        let mut turn = |from: u32, n: u32| {
            let mut claims: Vec<Staged> = (from..from + n)
                .map(|ip| {
                    seq += 1;
                    staged(&replies, seq, ip, "zed", 1000)
                })
                .collect();
            store.commit(&land, &mut claims, &mut answers);
            let mut done = Vec::new();
            while done.len() < n as usize {
                let more = completed(&replies);
                assert!(!more.is_empty(), "answers missing: {} of {n}", done.len());
                done.extend(more);
            }
            assert!(done.iter().all(|d| d.1 == 200), "{done:?}");
        };
        turn(1, 10);
        let length = lock(&store.writer).length;
        let size = std::fs::metadata(&segment).unwrap().len();
        assert_eq!(size, length + ZERO_AHEAD, "filled ahead");
        // The turns that follow write over the zeros: the size holds.
        turn(11, 10);
        assert_eq!(std::fs::metadata(&segment).unwrap().len(), size);
        assert_eq!(on_disk(dir.path()), in_memory(&land));
        // Enough for more fills, then a rotation: the closed segment ends at its last frame.
        for k in 0..60 {
            turn(1000 + k * 5000, 5000);
        }
        let w = lock(&store.writer);
        assert!(w.segment >= 2, "rotated");
        let closed = std::fs::read(&segment).unwrap();
        let (_, end) = frame::frames(&closed, frame::Kind::Journal).unwrap();
        assert_eq!(end, closed.len(), "a closed segment holds no zeros");
        assert!(w.zeroed_to > w.length);
        drop(w);
        syncer.1.raise();
        syncer.2.join().unwrap();
        let expected = in_memory(&land);
        drop(syncer.0);
        let land = Land::new();
        let again = JournalStore::open(options(dir.path(), SyncMode::Full), &land).unwrap();
        assert_eq!(in_memory(&land), expected);
        let r = journal::recover_read_only(dir.path(), &Land::new()).unwrap();
        assert!(r.cut.is_none(), "zeros are a clean end, not a torn write");
        // Writing on after the restart: over the zeros, found again.
        let w = lock(&again.writer);
        assert!(w.zeroed_to > w.length);
        drop(w);
        let (dir, land, store, _) = fresh(SyncMode::Normal, |_| {});
        let mut claims = vec![staged(&replies, 1, 7, "nil", 1000)];
        store.commit(&land, &mut claims, &mut answers);
        let size = std::fs::metadata(journal::segment_path(dir.path(), 1))
            .unwrap()
            .len();
        assert_eq!(
            size,
            lock(&store.writer).length,
            "--sync normal fills nothing ahead"
        );
    }

    #[test]
    fn a_second_store_on_the_same_folder_is_refused_until_the_first_is_gone() {
        let (dir, _land, store, _replies) = fresh(SyncMode::Normal, |_| {});
        let err = JournalStore::open(options(dir.path(), SyncMode::Normal), &Land::new())
            .err()
            .expect("a second writer is refused");
        assert!(err.contains("is in use by another tern"), "{err}");
        drop(store);
        assert!(JournalStore::open(options(dir.path(), SyncMode::Normal), &Land::new()).is_ok());
    }

    #[test]
    fn at_the_limit_only_new_addresses_are_refused() {
        let (_dir, land, store, replies) = fresh(SyncMode::Normal, |o| o.max_claims = 2);
        let mut claims = vec![
            staged(&replies, 1, 1, "a", 10),
            staged(&replies, 2, 2, "b", 10),
            staged(&replies, 3, 3, "c", 10),
            staged(&replies, 4, 1, "d", 10),
        ];
        let mut answers = Vec::new();
        store.commit(&land, &mut claims, &mut answers);
        let mut by_status: Vec<(u16, String)> = answers
            .iter()
            .map(|(_, r)| {
                let body = match &r.body {
                    tern_server::Body::Static(b) => b.to_vec(),
                    tern_server::Body::Owned(b) => b.clone(),
                    _ => Vec::new(),
                };
                (r.status, String::from_utf8_lossy(&body).into_owned())
            })
            .collect();
        by_status.sort();
        assert_eq!(
            by_status[..3].iter().map(|x| x.0).collect::<Vec<_>>(),
            [200, 200, 200]
        );
        assert_eq!(by_status[3].0, 503);
        assert!(
            by_status[3].1.contains("the game is full"),
            "{:?}",
            by_status[3]
        );
        statuses(&mut answers);
        assert_eq!(land.claimed(), 2);
        assert_eq!(land.holder(1), Some(("d".into(), 10)));
        assert_eq!(land.holder(3), None);
    }

    #[test]
    fn at_the_name_limit_only_held_names_may_claim() {
        let (_dir, land, store, replies) = fresh(SyncMode::Normal, |o| o.max_names = 2);
        let mut answers = Vec::new();
        let mut claims = vec![
            staged(&replies, 1, 1, "a", 10),
            staged(&replies, 2, 2, "b", 10),
            staged(&replies, 3, 3, "c", 10),
        ];
        store.commit(&land, &mut claims, &mut answers);
        assert_eq!(sorted(statuses(&mut answers)), [200, 200, 503]);
        // Known names go on claiming, new addresses included.
        let mut claims = vec![staged(&replies, 4, 4, "a", 10)];
        store.commit(&land, &mut claims, &mut answers);
        assert_eq!(statuses(&mut answers), [200]);
        // Once "b" holds nothing, its place is free for a new name.
        let mut claims = vec![
            staged(&replies, 5, 2, "a", 11),
            staged(&replies, 6, 5, "c", 11),
        ];
        store.commit(&land, &mut claims, &mut answers);
        assert_eq!(sorted(statuses(&mut answers)), [200, 503]);
        let mut claims = vec![staged(&replies, 7, 5, "c", 12)];
        store.commit(&land, &mut claims, &mut answers);
        assert_eq!(statuses(&mut answers), [200]);
        assert_eq!(land.names_held(), 2);
    }

    #[test]
    fn a_write_that_cannot_be_undone_stops_claims_and_changes_nothing() {
        let (_dir, land, store, replies) = fresh(SyncMode::Normal, |_| {});
        // /dev/full: every write fails with ENOSPC, and so does cutting it back.
        lock(&store.writer).file = Arc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/full")
                .unwrap(),
        );
        let mut answers = Vec::new();
        store.commit(
            &land,
            &mut vec![staged(&replies, 1, 5, "x", 1)],
            &mut answers,
        );
        assert_eq!(statuses(&mut answers), [503]);
        assert_eq!(land.claimed(), 0);
        assert_eq!(land.version(), 0);
        assert!(store.stopped.load(Ordering::Relaxed));
        assert_eq!(store.stats.write_errors.load(Ordering::Relaxed), 1);
        store.commit(
            &land,
            &mut vec![staged(&replies, 2, 6, "y", 1)],
            &mut answers,
        );
        assert_eq!(statuses(&mut answers), [503]);
    }

    #[test]
    fn full_sync_answers_after_the_sync_and_a_failed_sync_stops_claims() {
        let dir = tempfile::tempdir().unwrap();
        let land = Land::new();
        let mark = dir.path().join("synced");
        let mut o = options(dir.path(), SyncMode::Full);
        o.sync_mark = Some(mark.clone());
        let store = Arc::new(JournalStore::open(o, &land).unwrap());
        let replies = TestReplies::new();
        let mut answers = Vec::new();
        store.commit(
            &land,
            &mut vec![staged(&replies, 1, 5, "x", 1)],
            &mut answers,
        );
        // Not answered in the turn: the syncer answers it.
        assert!(answers.is_empty());
        let stop = StopSignal::default();
        let syncer = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || store.run_syncer(stop))
        };
        assert_eq!(completed(&replies), [(1, 200)]);
        assert!(store.stats.syncs.load(Ordering::Relaxed) >= 1);
        // (The file is longer: zeros filled ahead.)
        let length = lock(&store.writer).length;
        assert_eq!(
            std::fs::read_to_string(&mark).unwrap(),
            format!("{:020} {:020}\n", 1, length)
        );
        // A repeat of a synced change is answered in the turn.
        store.commit(
            &land,
            &mut vec![staged(&replies, 2, 5, "x", 2)],
            &mut answers,
        );
        assert_eq!(statuses(&mut answers), [200]);

        // fdatasync fails on /dev/null (EINVAL): the claim gets a 503, and so does every
        // later one, without another sync.
        lock(&store.writer).file = Arc::new(
            OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
                .unwrap(),
        );
        store.commit(
            &land,
            &mut vec![staged(&replies, 3, 6, "y", 3)],
            &mut answers,
        );
        assert_eq!(completed(&replies), [(3, 503)]);
        assert!(store.stopped.load(Ordering::Relaxed));
        store.commit(
            &land,
            &mut vec![staged(&replies, 4, 7, "z", 4)],
            &mut answers,
        );
        assert_eq!(statuses(&mut answers), [503]);
        stop.raise();
        syncer.join().unwrap();
    }

    #[test]
    fn a_full_sync_wait_is_split_into_the_devices_part_and_terns() {
        let dir = tempfile::tempdir().unwrap();
        let land = Land::new();
        let mut o = options(dir.path(), SyncMode::Full);
        // Counted as the device's time: it stands for a slow fdatasync.
        o.test_sync_delay = Duration::from_millis(60);
        let store = Arc::new(JournalStore::open(o, &land).unwrap());
        let stop = StopSignal::default();
        let syncer = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || store.run_syncer(stop))
        };
        let replies = TestReplies::new();
        let mut answers = Vec::new();
        store.commit(
            &land,
            &mut vec![
                staged(&replies, 1, 5, "x", 1),
                staged(&replies, 2, 6, "y", 1),
            ],
            &mut answers,
        );
        let started = Instant::now();
        let mut done = completed(&replies);
        while done.len() < 2 && started.elapsed() < Duration::from_secs(5) {
            replies.wait(Duration::from_millis(100));
            done.extend(completed(&replies));
        }
        assert_eq!(sorted(done.iter().map(|d| d.1).collect()), [200, 200]);
        stop.raise();
        syncer.join().unwrap();
        let mut m = Vec::new();
        store.metrics(&mut m);
        let value = |name: &str, suffix: &str| {
            m.iter()
                .find(|x| x.name == name && x.suffix == suffix)
                .map(|x| x.value)
                .unwrap()
        };
        assert!(value("journal_fdatasync_seconds", "_count") >= 1.0);
        assert!(value("journal_fdatasync_seconds", "_sum") >= 0.06);
        // Both claims counted; what they waited beyond the sync is far below the sync.
        assert_eq!(value("claim_tern_wait_seconds", "_count"), 2.0);
        assert!(value("claim_tern_wait_seconds", "_sum") < 2.0 * 0.03);
    }

    #[test]
    fn a_watching_syncer_takes_turns_handed_over_without_a_wake_up_and_still_stops() {
        // The CPUs this thread may use (the `unsafe` sched_getaffinity call): at least one,
        // and no more than the machine has.
        let cpus = usable_cpus();
        assert!(cpus >= 1);
        assert!(cpus <= std::thread::available_parallelism().map_or(1024, |n| n.get().max(cpus)));
        let (_dir, land, store, replies) = fresh(SyncMode::Full, |o| {
            // Far longer than the test: a turn answered sooner was taken while watching.
            o.sync_spin = Some(Duration::from_secs(30));
        });
        let store = Arc::new(store);
        let stop = StopSignal::default();
        let syncer = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || store.run_syncer(stop))
        };
        let mut answers = Vec::new();
        for seq in 1..=3u64 {
            let started = Instant::now();
            store.commit(
                &land,
                &mut vec![staged(&replies, seq, seq as u32, "x", seq)],
                &mut answers,
            );
            assert!(answers.is_empty());
            assert_eq!(completed(&replies), [(seq, 200)]);
            assert!(started.elapsed() < Duration::from_secs(10));
        }
        assert_eq!(store.stats.syncs.load(Ordering::Relaxed), 3);
        // A stop while it watches ends it long before the watch would.
        let started = Instant::now();
        stop.raise();
        syncer.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn compaction_racing_with_claims_from_several_workers_keeps_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let land = Arc::new(Land::new());
        let mut o = options(dir.path(), SyncMode::Normal);
        o.segment_bytes = 4096;
        let store = Arc::new(JournalStore::open(o, &land).unwrap());
        let stop = StopSignal::default();
        let compactor = {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || store.run_compactor(stop))
        };
        // Two "workers" claim the same 300 addresses under their own names, turn by turn.
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (store, land) = (store.clone(), land.clone());
                std::thread::spawn(move || {
                    let replies = TestReplies::new();
                    let mut answers = Vec::new();
                    for turn in 0..400u32 {
                        let mut claims: Vec<Staged> = (0..7)
                            .map(|k| {
                                let ip = (turn * 7 + k) % 300;
                                let nick = format!("w{w}-{}", turn % 3);
                                staged(&replies, k.into(), ip, &nick, turn as u64)
                            })
                            .collect();
                        store.commit(&land, &mut claims, &mut answers);
                        assert!(statuses(&mut answers).iter().all(|&s| s == 200));
                        if turn % 50 == 0 {
                            std::thread::sleep(Duration::from_millis(30));
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        // Let a last compaction run, then stop.
        std::thread::sleep(Duration::from_millis(500));
        stop.raise();
        compactor.join().unwrap();
        assert!(store.stats.compactions.load(Ordering::Relaxed) >= 1);
        assert_eq!(store.stats.compaction_errors.load(Ordering::Relaxed), 0);
        assert_eq!(on_disk(dir.path()), in_memory(&land));
        assert_eq!(land.claimed(), 300);
        let fresh = Land::new();
        journal::recover(dir.path(), &fresh).unwrap();
        let recent = |l: &Land| {
            l.recent()
                .into_iter()
                .map(|c| (c.ip, c.nick))
                .collect::<Vec<_>>()
        };
        assert_eq!(recent(&fresh), recent(&land));
    }
}
