//! The IPv4 Games: every visitor claims the IPv4 address they come from for a name; the board
//! shows who holds the most of each /8.
//!
//! Built only on tern's public API: routes and pending replies (tern-server), snapshots, a
//! bounded hand-off queue, per-prefix token buckets, trusted-proxy addresses and counters
//! (tern-services). One writer thread owns the SQLite database and commits claims in batches,
//! answering each claim only after its batch is committed.
//!
//! ```no_run
//! use tern_ipv4_games::{build, GameConfig};
//! let server = build(tern_server::ServerConfig::default(), GameConfig::new("data", "site")).unwrap();
//! let running = server.start().unwrap();
//! running.join();
//! ```

mod answer;
mod game;
mod name;
pub mod page_cache;
mod player;
pub mod store;
mod views;
pub mod wal_buffer;
mod writer;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tern_server::static_files::{StaticFiles, StaticOptions};
use tern_server::{Router, Server, ServerConfig};
use tern_services::{
    handoff, AppCounters, RateLimitConfig, Snapshot, SnapshotCell, TrustedProxies,
};

pub use store::SyncMode;

/// What the game keeps in its data folder starts with these names (the database, its WAL and
/// shared-memory files, SQLite's journal), so the binary can tell its files from others.
pub const DATA_FILE_PREFIXES: &[&str] = &[store::FILE_NAME];

/// The game's settings.
#[derive(Debug, Clone)]
pub struct GameConfig {
    /// Where the database lives (created if missing).
    pub data_dir: PathBuf,
    /// The pages (index.html, user.html, about.html, …), served with hot reload.
    pub site_dir: PathBuf,
    pub sync: SyncMode,
    /// Most claims per transaction.
    pub batch_max: usize,
    /// Claims that may wait for the writer; beyond it claims are answered 503 at once.
    pub queue_capacity: usize,
    pub proxies: TrustedProxies,
    pub rate_limit: RateLimitConfig,
    /// How often the short score windows are rebuilt (long ones: three times this).
    pub score_interval: Duration,
}

impl GameConfig {
    pub fn new(data_dir: impl Into<PathBuf>, site_dir: impl Into<PathBuf>) -> GameConfig {
        GameConfig {
            data_dir: data_dir.into(),
            site_dir: site_dir.into(),
            sync: SyncMode::Normal,
            batch_max: 1024,
            queue_capacity: 65_536,
            proxies: TrustedProxies::default(),
            rate_limit: RateLimitConfig::default(),
            score_interval: Duration::from_secs(2),
        }
    }
}

/// The pages shipped with the game, for running from a source checkout.
pub fn bundled_site() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/site"))
}

/// Opens the database, prepares the threads and routes; `start()` the result to play.
pub fn build(config: ServerConfig, game: GameConfig) -> Result<Server, String> {
    let mut server = Server::new(config, Router::new());
    let routes = mount(&mut server, game)?;
    *server.router_mut() = routes;
    Ok(server)
}

/// The game as a part of a larger server: opens the database, registers the game's
/// background threads on `server` and returns its routes (with the pages as their fallback),
/// for the caller to mount where it likes (`tern run` puts them behind a host name). Mount it
/// once per server: the routes answer absolute paths (`/claim/NAME`, `/score`), so they
/// belong at `/`.
pub fn mount(server: &mut Server, game: GameConfig) -> Result<Router, String> {
    std::fs::create_dir_all(&game.data_dir)
        .map_err(|e| format!("cannot create data dir {}: {e}", game.data_dir.display()))?;
    let db = store::db_path(&game.data_dir);
    let writer_conn = store::open_writer(&db, game.sync)
        .map_err(|e| format!("cannot open database {}: {e}", db.display()))?;
    let views_conn =
        store::open_reader(&db).map_err(|e| format!("cannot open {}: {e}", db.display()))?;
    let lookup_conn =
        store::open_reader(&db).map_err(|e| format!("cannot open {}: {e}", db.display()))?;
    let checkpoint_conn =
        store::open_checkpointer(&db).map_err(|e| format!("cannot open {}: {e}", db.display()))?;
    let site = StaticFiles::new(StaticOptions::new(&game.site_dir))
        .map_err(|e| format!("cannot serve {}: {e}", game.site_dir.display()))?;

    let workers = server.config().runtime.workers.max(1);
    let (claims, claims_rx) = handoff(game.queue_capacity.max(1));
    let (lookups, lookups_rx) = handoff(256);
    let now = game::unix_now();
    let empty_score = |w: views::Window| {
        let json = views::Tally::new(now, &[w]).render().remove(0).json;
        SnapshotCell::new(views::score_snapshot(json, now, game.score_interval))
    };
    let state = Arc::new(game::Game {
        workers,
        counters: AppCounters::new(&game::COUNTER_NAMES, workers + 4),
        recent: SnapshotCell::new(Snapshot::new(
            "application/json",
            views::recent_json([].iter(), now),
            now,
            1,
        )),
        scores: views::Window::ALL.map(empty_score),
        claims,
        lookups,
        limiter: tern_services::PrefixLimiter::new(game.rate_limit.clone(), workers),
        proxies: game.proxies.clone(),
        stats: server.stats(),
        started: Instant::now(),
        last_batch: AtomicU64::new(0),
        largest_batch: AtomicU64::new(0),
        rss: AtomicU64::new(tern_services::metrics::rss_bytes()),
        scanning: std::sync::atomic::AtomicBool::new(false),
        hold_writer: std::sync::atomic::AtomicBool::new(false),
        restart_pending: std::sync::atomic::AtomicBool::new(false),
    });
    let routes = game::routes(state.clone(), Router::new().fallback(site));

    let s = state.clone();
    let batch_max = game.batch_max.max(1);
    server.background("claim-writer", move |stop| {
        writer::run(writer_conn, claims_rx, s, batch_max, stop)
    });
    let s = state.clone();
    let interval = game.score_interval;
    server.background("score-views", move |stop| {
        game::run_views(views_conn, s, interval, stop)
    });
    let s = state.clone();
    server.background("wal-checkpoint", move |stop| {
        checkpointer(checkpoint_conn, s, stop)
    });
    server.background("player-lookup", move |stop| {
        player::run(lookup_conn, lookups_rx, state, stop)
    });
    Ok(routes)
}

/// Keeps the WAL short: a passive checkpoint every 100 ms copies what the writer committed
/// back into the database file without blocking it; once the WAL passes 64 MiB a RESTART
/// checkpoint finishes the job and the WAL starts over. That needs a moment with no write
/// transaction and no reader of old frames, which a busy writer and a long score scan never
/// leave on their own (under the claims benchmark the WAL grew past 1 GiB), so the restart
/// is arranged: `restart_pending` keeps the views thread from starting a scan, and once no
/// scan runs, `hold_writer` makes the writer wait between batches while the checkpoint runs
/// (a pause of the copy that passive runs left, and the syncs). Runs at normal priority so
/// it keeps up under sustained load; a WAL past 1 GiB is logged.
fn checkpointer(conn: rusqlite::Connection, game: Arc<game::Game>, stop: tern_server::StopSignal) {
    let page: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap_or(4096);
    let restart_frames = (64 << 20) / page.max(512);
    let warn_frames = (1 << 30) / page.max(512);
    let mut warned_at: Option<Instant> = None;
    loop {
        match store::checkpoint(&conn) {
            Ok((frames, _)) => {
                if frames > restart_frames {
                    reset_wal(&conn, &game);
                }
                if frames > warn_frames
                    && warned_at.is_none_or(|t| t.elapsed() > Duration::from_secs(60))
                {
                    tracing::warn!(
                        frames,
                        "the WAL is not shrinking: checkpoints cannot keep up"
                    );
                    warned_at = Some(Instant::now());
                }
            }
            Err(e) => tracing::error!("checkpoint failed: {e}"),
        }
        if stop.is_stopped() {
            // Fold the WAL back on the way out. A last commit the writer makes after this
            // stays in the WAL, which SQLite replays when the database is next opened.
            let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A checkpoint pass this short left little behind for the writer to wait for.
const QUICK_PASS: Duration = Duration::from_millis(3);

/// Folds the WAL back into the database so it starts over (see `checkpointer`). If that
/// cannot happen now, `restart_pending` stays up and the next round tries again.
fn reset_wal(conn: &rusqlite::Connection, game: &game::Game) {
    use std::sync::atomic::Ordering::SeqCst;
    // Announce first, then look: the views thread raises `scanning` before it looks at
    // `restart_pending`, so one of us always sees the other.
    game.restart_pending.store(true, SeqCst);
    let since = Instant::now();
    while game.scanning.load(SeqCst) {
        if since.elapsed() > Duration::from_secs(1) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Catch up while the writer goes on. The writer's pause below lasts as long as the last
    // pass's leftovers take to copy and sync (fsync here: ~0.3 ms + 1.4 ms per MiB), and a
    // pass leaves what the writer committed while it ran, so pass again until one is quick.
    for _ in 0..30 {
        let t = Instant::now();
        if let Err(e) = store::checkpoint(conn) {
            tracing::error!("checkpoint failed: {e}");
            return;
        }
        if t.elapsed() <= QUICK_PASS {
            break;
        }
    }
    game.hold_writer.store(true, SeqCst);
    let reset = store::checkpoint_restart(conn);
    game.hold_writer.store(false, SeqCst);
    match reset {
        Ok(true) => {
            game.restart_pending.store(false, SeqCst);
            game.counters
                .add(game.checkpoint_slot(), game::C_WAL_RESETS, 1);
        }
        Ok(false) => {} // a reader was in the way
        Err(e) => tracing::error!("checkpoint failed: {e}"),
    }
}
