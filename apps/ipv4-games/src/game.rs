//! The game's shared state and its request handlers. Handlers run on the workers: reads come
//! from memory (`Land`) and snapshots; a claim is staged for its worker's end of turn, when
//! the store saves the turn's claims together and answers them (`ClaimTurns`); player pages
//! come from a lookup thread.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use tern_server::{
    Body, HandlerContext, Pending, Reply, Request, Response, Router, Stats, TurnEnd,
};
use tern_services::background::{Yielder, YIELD_EVERY};
use tern_services::handoff::Refused;
use tern_services::metrics::{self, Metric};
use tern_services::{
    AppCounters, HandoffSender, PrefixLimiter, RateDecision, SnapshotCell, TrustedProxies,
};

use crate::answer;
use crate::land::Land;
use crate::name;
use crate::player::Lookup;
use crate::store::{ClaimStore, Staged};
use crate::views::{self, Window};

pub const C_STAGED: usize = 0;
pub const C_TURNS: usize = 1;
pub const C_RATE_LIMITED: usize = 2;
pub const C_RATE_DROPPED: usize = 3;
pub const C_INVALID_NAMES: usize = 4;
pub const C_IPV6_REFUSED: usize = 5;
pub const C_LOOKUPS: usize = 6;
pub const C_SCORE_REBUILDS: usize = 7;
pub const C_LOOKUPS_BUSY: usize = 8;

pub static COUNTER_NAMES: [(&str, &str); 9] = [
    ("claims_received", "valid claims taken by the workers"),
    (
        "claim_turns",
        "worker turns whose claims were saved together",
    ),
    (
        "claims_rate_limited",
        "requests answered 429 by the per-prefix limit",
    ),
    (
        "claims_rate_dropped",
        "connections closed unanswered, far over the per-prefix limit",
    ),
    ("claims_invalid_name", "claims refused for an invalid name"),
    (
        "claims_ipv6_refused",
        "claims or /ip requests from IPv6 clients",
    ),
    ("player_lookups", "player pages looked up"),
    ("score_rebuilds", "score snapshots rebuilt"),
    (
        "player_lookups_busy",
        "player pages answered 503 because the lookup queue was full",
    ),
];

/// `/recent` is re-rendered at most this often under load.
const RECENT_EVERY_MS: u64 = 25;

/// Everything the handlers and background threads share.
pub struct Game {
    pub workers: usize,
    pub counters: AppCounters<9>,
    pub land: Arc<Land>,
    pub store: Arc<dyn ClaimStore>,
    pub recent: SnapshotCell,
    /// The `Land::version` the published `/recent` shows, and when it was rendered.
    recent_version: AtomicU64,
    recent_at_ms: AtomicU64,
    recent_render: Mutex<()>,
    pub scores: [SnapshotCell; 5],
    pub lookups: HandoffSender<Lookup>,
    pub limiter: PrefixLimiter,
    pub proxies: TrustedProxies,
    pub stats: Stats,
    pub started: Instant,
    /// Refreshed by the views thread once a second so /metrics never reads /proc on a worker.
    pub rss: AtomicU64,
    /// `Land::bytes`, refreshed by the views thread every few seconds (it locks every block).
    state_bytes: [AtomicU64; 3],
    names_held: AtomicU64,
    /// Each worker's claims of the current turn.
    stages: Box<[CachePadded<Mutex<Vec<Staged>>>]>,
}

/// What `Game::new` needs besides the store.
pub struct GameParts {
    pub workers: usize,
    pub lookups: HandoffSender<Lookup>,
    pub limiter: PrefixLimiter,
    pub proxies: TrustedProxies,
    pub stats: Stats,
    pub score_interval: Duration,
}

impl Game {
    pub fn new(land: Arc<Land>, store: Arc<dyn ClaimStore>, parts: GameParts) -> Game {
        let now = unix_now();
        let empty_score = |w: views::Window| {
            let json = views::Tally::new(now, &[w]).render().remove(0).json;
            SnapshotCell::new(views::score_snapshot(json, now, parts.score_interval))
        };
        let game = Game {
            workers: parts.workers,
            counters: AppCounters::new(&COUNTER_NAMES, parts.workers + 4),
            recent: SnapshotCell::new(tern_services::Snapshot::new(
                "application/json",
                views::recent_json([].iter(), now),
                now,
                1,
            )),
            recent_version: AtomicU64::new(u64::MAX),
            recent_at_ms: AtomicU64::new(0),
            recent_render: Mutex::new(()),
            scores: views::Window::ALL.map(empty_score),
            lookups: parts.lookups,
            limiter: parts.limiter,
            proxies: parts.proxies,
            stats: parts.stats,
            started: Instant::now(),
            rss: AtomicU64::new(tern_services::metrics::rss_bytes()),
            state_bytes: Default::default(),
            names_held: AtomicU64::new(0),
            stages: (0..parts.workers)
                .map(|_| CachePadded::new(Mutex::new(Vec::new())))
                .collect(),
            land,
            store,
        };
        game.refresh_recent();
        game
    }

    pub fn views_slot(&self) -> usize {
        self.workers + 1
    }

    pub fn lookup_slot(&self) -> usize {
        self.workers + 2
    }

    /// Re-renders `/recent` if claims changed it and the last rendering is at least
    /// `RECENT_EVERY_MS` old. Cheap when nothing changed: two loads.
    fn refresh_recent(&self) {
        let version = self.land.version();
        if version == self.recent_version.load(Ordering::Acquire) {
            return;
        }
        let now_ms = self.started.elapsed().as_millis() as u64 + RECENT_EVERY_MS;
        if now_ms < self.recent_at_ms.load(Ordering::Relaxed) + RECENT_EVERY_MS {
            return;
        }
        // One renderer at a time; the others serve what is published.
        let Ok(_rendering) = self.recent_render.try_lock() else {
            return;
        };
        let now = unix_now();
        let claims = self.land.recent();
        let json = views::recent_json(claims.iter(), now);
        // Rebuilt right after claims, so clients may cache it only briefly.
        self.recent.store(tern_services::Snapshot::new(
            "application/json",
            json,
            now,
            1,
        ));
        self.recent_version.store(version, Ordering::Release);
        self.recent_at_ms.store(now_ms, Ordering::Relaxed);
    }

    fn metrics(&self) -> Vec<Metric> {
        let mut m = metrics::process_metrics(self.started);
        if let Some(rss) = m.iter_mut().find(|m| m.name == "resident_memory_bytes") {
            rss.value = self.rss.load(Ordering::Relaxed) as f64;
        }
        m.extend(metrics::server_metrics(&self.stats.snapshot()));
        m.extend(self.counters.metrics());
        self.store.metrics(&mut m);
        m.push(Metric::gauge(
            "claimed_addresses",
            "addresses held by a name",
            self.land.claimed() as f64,
        ));
        for (part, bytes) in ["addresses", "counts", "names"]
            .iter()
            .zip(&self.state_bytes)
        {
            m.push(
                Metric::gauge(
                    "state_bytes",
                    "memory the game's state holds, by part (allocations; refreshed every 10 s)",
                    bytes.load(Ordering::Relaxed) as f64,
                )
                .with_label("part", *part),
            );
        }
        m.push(Metric::gauge(
            "names_held",
            "names holding at least one address",
            self.names_held.load(Ordering::Relaxed) as f64,
        ));
        m
    }

    /// Measures the state's memory (for /metrics); locks every block once, briefly.
    fn measure_state(&self, yielder: &mut Yielder) {
        let used = self.land.bytes(yielder);
        for (slot, v) in self
            .state_bytes
            .iter()
            .zip([used.addresses, used.counts, used.names])
        {
            slot.store(v as u64, Ordering::Relaxed);
        }
        self.names_held.store(used.name_count, Ordering::Relaxed);
    }
}

/// Saves each worker turn's claims at the end of the turn (see `ClaimStore::commit`).
pub struct ClaimTurns(pub Arc<Game>);

impl TurnEnd for ClaimTurns {
    fn end_turn(&self, worker: usize, answers: &mut Vec<(Pending, Response)>) {
        let game = &self.0;
        let Some(stage) = game.stages.get(worker) else {
            return;
        };
        let mut staged = stage.lock().unwrap_or_else(|e| e.into_inner());
        if staged.is_empty() {
            return;
        }
        game.counters.add(worker, C_TURNS, 1);
        game.store.commit(&game.land, &mut staged, answers);
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn plain(status: u16, body: String) -> Response {
    Response::new(status)
        .with_header("Content-Type", "text/plain; charset=utf-8")
        .with_header("Cache-Control", "no-store")
        .with_body(Body::Owned(body.into_bytes()))
}

/// The caller's IPv4 address, or the answer for a caller without one.
fn caller_v4(game: &Game, req: &Request<'_>, cx: &HandlerContext<'_>) -> Result<u32, Response> {
    match game.proxies.client_ip(req.peer, req.head) {
        IpAddr::V4(v4) => Ok(u32::from(v4)),
        IpAddr::V6(_) => {
            game.counters.add(cx.worker_id, C_IPV6_REFUSED, 1);
            Err(Response::text(400, "IPv4 only\n"))
        }
    }
}

/// Applies the per-prefix limit; `Some(reply)` when the request must not go on.
fn limit(game: &Game, ip: IpAddr, req: &Request<'_>, cx: &HandlerContext<'_>) -> Option<Reply> {
    match game.limiter.check(cx.worker_id, ip, req.unix_secs) {
        RateDecision::Allow => None,
        RateDecision::Reject => {
            game.counters.add(cx.worker_id, C_RATE_LIMITED, 1);
            Some(Reply::Now(
                Response::text(429, "too many requests from your network; slow down\n")
                    .with_header("Retry-After", "1")
                    .close(),
            ))
        }
        RateDecision::Drop => {
            game.counters.add(cx.worker_id, C_RATE_DROPPED, 1);
            Some(Reply::Drop)
        }
    }
}

fn claim(
    game: &Game,
    raw_name: Option<&str>,
    req: &Request<'_>,
    cx: &mut HandlerContext<'_>,
) -> Reply {
    let ip = match caller_v4(game, req, cx) {
        Ok(ip) => ip,
        Err(r) => return r.into(),
    };
    if let Some(reply) = limit(game, IpAddr::V4(Ipv4Addr::from(ip)), req, cx) {
        return reply;
    }
    let Some(nick) = raw_name.and_then(name::parse) else {
        game.counters.add(cx.worker_id, C_INVALID_NAMES, 1);
        return Response::text(400, name::INVALID).into();
    };
    let Some(stage) = game.stages.get(cx.worker_id) else {
        return Response::text(500, "no stage for this worker\n").into();
    };
    let staged = Staged {
        ip,
        nick,
        at: req.unix_secs,
        answer: answer::choose(req.head.accept),
        pending: cx.defer(),
    };
    stage.lock().unwrap_or_else(|e| e.into_inner()).push(staged);
    game.counters.add(cx.worker_id, C_STAGED, 1);
    Reply::Later
}

fn player(game: &Game, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
    let raw = &req.path()["/player/".len()..];
    let peer = game.proxies.client_ip(req.peer, req.head);
    if let Some(reply) = limit(game, peer, req, cx) {
        return reply;
    }
    let Some(nick) = name::parse(raw) else {
        game.counters.add(cx.worker_id, C_INVALID_NAMES, 1);
        return Response::text(400, name::INVALID).into();
    };
    let lookup = Lookup {
        nick,
        pending: cx.defer(),
    };
    match game.lookups.offer(lookup) {
        Ok(()) => Reply::Later,
        Err(Refused::Full(back)) | Err(Refused::Closed(back)) => {
            back.pending.cancel();
            game.counters.add(cx.worker_id, C_LOOKUPS_BUSY, 1);
            Response::text(
                503,
                "busy: too many lookups waiting; try again in a second\n",
            )
            .with_header("Retry-After", "1")
            .into()
        }
    }
}

/// The game's routes; everything else falls through to `site` (the static pages).
pub fn routes(game: Arc<Game>, router: Router) -> Router {
    let g = game.clone();
    let mut router = router.get(
        "/ip",
        move |req: &Request<'_>, cx: &mut HandlerContext<'_>| match caller_v4(&g, req, cx) {
            Ok(ip) => plain(200, format!("{}\n", Ipv4Addr::from(ip))).into(),
            Err(r) => r.into(),
        },
    );
    let g = game.clone();
    router = router.get(
        "/claim",
        move |req: &Request<'_>, cx: &mut HandlerContext<'_>| {
            claim(&g, req.query().and_then(name::from_query), req, cx)
        },
    );
    let g = game.clone();
    router = router.prefix(
        tern_server::Method::Get,
        "/claim/",
        move |req: &Request<'_>, cx: &mut HandlerContext<'_>| {
            let raw = &req.path()["/claim/".len()..];
            claim(&g, Some(raw), req, cx)
        },
    );
    let g = game.clone();
    router = router.prefix(
        tern_server::Method::Get,
        "/player/",
        move |req: &Request<'_>, cx: &mut HandlerContext<'_>| player(&g, req, cx),
    );
    let g = game.clone();
    router = router.get(
        "/recent",
        move |req: &Request<'_>, _: &mut HandlerContext<'_>| {
            g.refresh_recent();
            g.recent.respond(req).into()
        },
    );
    for window in Window::ALL {
        let g = game.clone();
        router = router.get(
            window.path(),
            move |req: &Request<'_>, _: &mut HandlerContext<'_>| {
                g.scores[window.index()].respond(req).into()
            },
        );
    }
    let g = game.clone();
    router = router.get(
        "/statusz",
        move |_: &Request<'_>, _: &mut HandlerContext<'_>| {
            plain(200, metrics::render_statusz(&g.metrics())).into()
        },
    );
    let g = game;
    router.get(
        "/metrics",
        move |_: &Request<'_>, _: &mut HandlerContext<'_>| {
            Response::new(200)
                .with_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                .with_header("Cache-Control", "no-store")
                .with_body(Body::Owned(
                    metrics::render_prometheus("tern_", &g.metrics()).into_bytes(),
                ))
                .into()
        },
    )
}

/// Keeps the score windows fresh: short windows every `base` (2 s by default), long ones every
/// `base * 3`, each stretched so rebuilding stays under a fifth of a core.
pub fn run_views(game: Arc<Game>, base: Duration, stop: tern_server::StopSignal) {
    tern_services::background::lower_priority();
    let mut yielder = Yielder::new(YIELD_EVERY);
    let mut short = views::Schedule::new(base);
    let mut long = views::Schedule::new(base * 3);
    let mut rss_at = Instant::now();
    let mut state_at = Instant::now();
    let mut published: [Option<u64>; 5] = [None; 5];
    while !stop.is_stopped() {
        let now = Instant::now();
        if now >= rss_at {
            game.rss.store(metrics::rss_bytes(), Ordering::Relaxed);
            rss_at = now + Duration::from_secs(1);
        }
        if now >= state_at {
            game.measure_state(&mut yielder);
            state_at = now + Duration::from_secs(10);
        }
        let (schedule, windows): (&mut views::Schedule, &[Window]) = if long.due(now) {
            (&mut long, &Window::ALL)
        } else if short.due(now) {
            (&mut short, &[Window::Day, Window::Hour])
        } else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let unix = unix_now();
        let mut tally = views::Tally::new(unix, windows);
        tally.fill(&game.land, &mut yielder);
        for r in tally.render() {
            let slot = r.window.index();
            if published[slot] == Some(r.content_hash) {
                continue; // unchanged: keep the ETag clients already hold
            }
            published[slot] = Some(r.content_hash);
            let interval = if r.window.is_short() { base } else { base * 3 };
            game.scores[slot].store(views::score_snapshot(r.json, unix, interval));
            game.counters.add(game.views_slot(), C_SCORE_REBUILDS, 1);
        }
        let took = now.elapsed();
        schedule.done(now, took);
        if windows.len() == Window::ALL.len() {
            // A full pass covers the short windows too.
            short.done(now, took);
        }
    }
}
