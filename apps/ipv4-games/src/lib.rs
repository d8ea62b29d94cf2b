//! The IPv4 Games: every visitor claims the IPv4 address they come from for a name; the board
//! shows who holds the most of each /8.
//!
//! Built only on tern's public API: routes, pending replies and an end-of-turn hook
//! (tern-server), snapshots, a bounded hand-off queue, per-prefix token buckets,
//! trusted-proxy addresses and counters (tern-services). The state lives in memory (`land`);
//! a claim is answered once the store has made it durable: by default an append-only journal
//! written once per worker turn (`store::journal`), folded into snapshots in the background.
//!
//! ```no_run
//! use tern_ipv4_games::{build, GameConfig};
//! let server = build(tern_server::ServerConfig::default(), GameConfig::new("data", "site")).unwrap();
//! let running = server.start().unwrap();
//! running.join();
//! ```

mod answer;
mod game;
pub mod journal;
pub mod land;
mod name;
pub mod pg_cluster;
mod player;
pub mod sqlite;
pub mod store;
mod views;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tern_server::static_files::{StaticFiles, StaticOptions};
use tern_server::{Router, Server, ServerConfig};
use tern_services::{handoff, RateLimitConfig, TrustedProxies};

pub use answer::AnswerKind;
pub use store::SyncMode;

/// What the game keeps in its data folder starts with these names (journal segments,
/// snapshots, and the database of older versions), so the binary can tell its files from
/// others.
pub const DATA_FILE_PREFIXES: &[&str] = &["journal-", "snapshot-", sqlite::FILE_NAME];

/// The game's settings.
#[derive(Debug, Clone)]
pub struct GameConfig {
    /// Where the journal and snapshots live (created if missing).
    pub data_dir: PathBuf,
    /// The pages (index.html, user.html, about.html, …), served with hot reload.
    pub site_dir: PathBuf,
    pub sync: SyncMode,
    /// Most addresses held at once; claims of new addresses beyond it get a 503, so memory
    /// stays bounded (see `default_max_claims`). Names are bounded to a quarter of it.
    pub max_claims: u64,
    /// Most names holding addresses at once [default: a quarter of `max_claims`].
    pub max_names: Option<u64>,
    /// A journal segment is closed past this size (then folded into a snapshot).
    pub segment_bytes: u64,
    /// Test hook for power-cut tests (`JournalOptions::sync_mark`).
    pub sync_mark: Option<PathBuf>,
    /// Test hook: a wait before each sync (`JournalOptions::test_sync_delay`).
    pub test_sync_delay: Duration,
    /// `Some("postgres://…")`: claims are saved in PostgreSQL (several nodes may share it)
    /// instead of the journal in `data_dir`.
    pub store: Option<String>,
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
            max_claims: default_max_claims(),
            max_names: None,
            segment_bytes: 64 << 20,
            sync_mark: None,
            test_sync_delay: Duration::ZERO,
            store: None,
            proxies: TrustedProxies::default(),
            rate_limit: RateLimitConfig::default(),
            score_interval: Duration::from_secs(2),
        }
    }
}

/// Bytes of memory budgeted per held address: the address itself (15–30 B), and a quarter of
/// a name at the name limit (about 130 B each: the string, its table slot, its latest
/// claims), and room for the allocator.
pub const BUDGET_PER_CLAIM: u64 = 64;

/// Enough addresses to fill half of this machine's memory at `BUDGET_PER_CLAIM` (the rest
/// for compaction, the page cache and everything else), names being limited to a quarter
/// of the addresses: a game that fills up answers 503, never gets the process killed for
/// memory.
pub fn default_max_claims() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(4 << 30);
    total / 2 / BUDGET_PER_CLAIM
}

/// The pages shipped with the game, for running from a source checkout.
pub fn bundled_site() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/site"))
}

/// Recovers the game's state, prepares the threads and routes; `start()` the result to play.
pub fn build(config: ServerConfig, game: GameConfig) -> Result<Server, String> {
    let mut server = Server::new(config, Router::new());
    let routes = mount(&mut server, game)?;
    *server.router_mut() = routes;
    Ok(server)
}

/// The game as a part of a larger server: recovers the state from the data folder, registers
/// the game's background threads and end-of-turn hook on `server` and returns its routes
/// (with the pages as their fallback), for the caller to mount where it likes (`tern run`
/// puts them behind a host name). Mount it once per server: the routes answer absolute paths
/// (`/claim/NAME`, `/score`), so they belong at `/`.
pub fn mount(server: &mut Server, game: GameConfig) -> Result<Router, String> {
    std::fs::create_dir_all(&game.data_dir)
        .map_err(|e| format!("cannot create data dir {}: {e}", game.data_dir.display()))?;
    let site = StaticFiles::new(StaticOptions::new(&game.site_dir))
        .map_err(|e| format!("cannot serve {}: {e}", game.site_dir.display()))?;
    let land = Arc::new(land::Land::new());
    let store: Arc<dyn store::ClaimStore> = match &game.store {
        Some(url) => Arc::new(store::postgres::PgStore::open(
            store::postgres::PgOptions {
                url: url.clone(),
                queue: 4096,
                poll: Duration::from_millis(25),
                max_claims: game.max_claims,
            },
            &land,
        )?),
        None => Arc::new(store::journal::JournalStore::open(
            store::journal::JournalOptions {
                segment_bytes: game.segment_bytes.max(4096),
                max_claims: game.max_claims,
                max_names: game.max_names.unwrap_or((game.max_claims / 4).max(1)),
                sync_mark: game.sync_mark.clone(),
                test_sync_delay: game.test_sync_delay,
                ..store::journal::JournalOptions::new(&game.data_dir, game.sync)
            },
            &land,
        )?),
    };
    let workers = server.config().runtime.workers.max(1);
    let (lookups, lookups_rx) = handoff(256);
    let state = Arc::new(game::Game::new(
        land.clone(),
        store.clone(),
        game::GameParts {
            workers,
            lookups,
            limiter: tern_services::PrefixLimiter::new(game.rate_limit.clone(), workers),
            proxies: game.proxies.clone(),
            stats: server.stats(),
            score_interval: game.score_interval,
        },
    ));
    let routes = game::routes(state.clone(), Router::new().fallback(site));
    server.on_turn_end(Arc::new(game::ClaimTurns(state.clone())));
    store.start(server, land);
    let s = state.clone();
    let interval = game.score_interval;
    server.background("score-views", move |stop| {
        game::run_views(s, interval, stop)
    });
    server.background("player-lookup", move |stop| {
        player::run(lookups_rx, state, stop)
    });
    Ok(routes)
}

/// `tern demo --check` on a journal: reads the data folder back without changing it and says
/// what it holds.
pub fn check_data(data_dir: &std::path::Path) -> Result<String, String> {
    let land = land::Land::new();
    let r = journal::recover_read_only(data_dir, &land)?;
    Ok(format!(
        "{}: {} claimed addresses ({} from the snapshot, {} journal records after it){}",
        data_dir.display(),
        land.claimed(),
        r.from_snapshot,
        r.from_journal,
        match &r.cut {
            Some((path, from, to)) => format!(
                "; {} ends in a torn write ({from} -> {to} bytes), cut at the next start",
                path.display()
            ),
            None => String::new(),
        }
    ))
}

/// Writes the claims of `data_dir` into a new SQLite database `to` (see `sqlite::export`).
pub fn export(data_dir: &std::path::Path, to: &std::path::Path) -> Result<u64, String> {
    sqlite::export(data_dir, to)
}
