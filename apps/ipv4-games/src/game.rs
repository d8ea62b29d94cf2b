//! The game's shared state and its request handlers. Handlers run on the workers and never
//! touch the database: claims go to the writer through a bounded queue, reads come from
//! snapshots, player pages from a lookup thread.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tern_server::{Body, HandlerContext, Reply, Request, Response, Router, Stats};
use tern_services::handoff::Refused;
use tern_services::metrics::{self, Metric};
use tern_services::{
    AppCounters, HandoffSender, PrefixLimiter, RateDecision, SnapshotCell, TrustedProxies,
};

use crate::answer;
use crate::name;
use crate::player::Lookup;
use crate::store::Claim;
use crate::views::{self, Window};
use crate::writer::ClaimRequest;

pub const C_QUEUED: usize = 0;
pub const C_COMMITTED: usize = 1;
pub const C_UNCHANGED: usize = 2;
pub const C_BATCHES: usize = 3;
pub const C_QUEUE_FULL: usize = 4;
pub const C_RATE_LIMITED: usize = 5;
pub const C_RATE_DROPPED: usize = 6;
pub const C_INVALID_NAMES: usize = 7;
pub const C_IPV6_REFUSED: usize = 8;
pub const C_COMMIT_ERRORS: usize = 9;
pub const C_LOOKUPS: usize = 10;
pub const C_SCORE_REBUILDS: usize = 11;
pub const C_WAL_RESETS: usize = 12;

pub static COUNTER_NAMES: [(&str, &str); 13] = [
    ("claims_queued", "claims handed to the writer"),
    (
        "claims_committed",
        "claims committed to the database (then answered)",
    ),
    (
        "claims_unchanged",
        "committed claims that changed nothing (same name within the hour)",
    ),
    ("claim_batches", "transactions committed by the writer"),
    (
        "claims_queue_full",
        "claims answered 503 because the writer's queue was full",
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
    (
        "claim_commit_errors",
        "batches whose commit failed (answered 503)",
    ),
    ("player_lookups", "player pages looked up"),
    ("score_rebuilds", "score snapshots rebuilt"),
    (
        "wal_resets",
        "times the checkpointer folded the WAL back and started it over",
    ),
];

/// Everything the handlers and background threads share.
pub struct Game {
    pub workers: usize,
    pub counters: AppCounters<13>,
    pub recent: SnapshotCell,
    pub scores: [SnapshotCell; 5],
    pub claims: HandoffSender<ClaimRequest>,
    pub lookups: HandoffSender<Lookup>,
    pub limiter: PrefixLimiter,
    pub proxies: TrustedProxies,
    pub stats: Stats,
    pub started: Instant,
    pub last_batch: AtomicU64,
    pub largest_batch: AtomicU64,
    /// Refreshed by the views thread once a second so /metrics never reads /proc on a worker.
    pub rss: AtomicU64,
    /// The views thread is inside one of its chunk reads: a RESTART checkpoint would wait for
    /// it while holding off the writer, so the checkpointer waits for the chunk to end.
    pub scanning: std::sync::atomic::AtomicBool,
    /// The checkpointer is resetting the WAL: the writer starts no transaction until this
    /// is clear again (see `lib::checkpointer`).
    pub hold_writer: std::sync::atomic::AtomicBool,
    /// The WAL is due for a reset: the views thread starts no scan until it is done.
    pub restart_pending: std::sync::atomic::AtomicBool,
}

impl Game {
    pub fn writer_slot(&self) -> usize {
        self.workers
    }

    pub fn views_slot(&self) -> usize {
        self.workers + 1
    }

    pub fn lookup_slot(&self) -> usize {
        self.workers + 2
    }

    pub fn checkpoint_slot(&self) -> usize {
        self.workers + 3
    }

    pub fn note_batch(&self, n: usize) {
        self.last_batch.store(n as u64, Ordering::Relaxed);
        self.largest_batch.fetch_max(n as u64, Ordering::Relaxed);
    }

    pub fn publish_recent<'a>(&self, recent: impl IntoIterator<Item = &'a Claim>) {
        let now = unix_now();
        let json = views::recent_json(recent.into_iter(), now);
        // Rebuilt right after commits, so clients may cache it only briefly.
        self.recent.store(tern_services::Snapshot::new(
            "application/json",
            json,
            now,
            1,
        ));
    }

    fn metrics(&self) -> Vec<Metric> {
        let mut m = metrics::process_metrics(self.started);
        if let Some(rss) = m.iter_mut().find(|m| m.name == "resident_memory_bytes") {
            rss.value = self.rss.load(Ordering::Relaxed) as f64;
        }
        m.extend(metrics::server_metrics(&self.stats.snapshot()));
        m.extend(self.counters.metrics());
        m.push(Metric::gauge(
            "claims_queue_length",
            "claims waiting for the writer",
            self.claims.len() as f64,
        ));
        m.push(Metric::gauge(
            "claims_queue_capacity",
            "room in the writer's queue",
            self.claims.capacity() as f64,
        ));
        m.push(Metric::gauge(
            "claim_batch_last",
            "claims in the last committed batch",
            self.last_batch.load(Ordering::Relaxed) as f64,
        ));
        m.push(Metric::gauge(
            "claim_batch_largest",
            "claims in the largest committed batch",
            self.largest_batch.load(Ordering::Relaxed) as f64,
        ));
        m
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
    let request = ClaimRequest {
        ip,
        nick,
        at: req.unix_secs,
        answer: answer::choose(req.head.accept),
        pending: cx.defer(),
    };
    match game.claims.offer(request) {
        Ok(()) => {
            game.counters.add(cx.worker_id, C_QUEUED, 1);
            Reply::Later
        }
        Err(Refused::Full(back)) | Err(Refused::Closed(back)) => {
            back.pending.cancel();
            game.counters.add(cx.worker_id, C_QUEUE_FULL, 1);
            Response::text(
                503,
                "busy: too many claims waiting; try again in a second\n",
            )
            .with_header("Retry-After", "1")
            .into()
        }
    }
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
        move |req: &Request<'_>, _: &mut HandlerContext<'_>| g.recent.respond(req).into(),
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
pub fn run_views(
    conn: rusqlite::Connection,
    game: Arc<Game>,
    base: Duration,
    stop: tern_server::StopSignal,
) {
    tern_services::background::lower_priority();
    let mut short = views::Schedule::new(base);
    let mut long = views::Schedule::new(base * 3);
    let mut rss_at = Instant::now();
    let mut published: [Option<u64>; 5] = [None; 5];
    while !stop.is_stopped() {
        let now = Instant::now();
        if now >= rss_at {
            game.rss.store(metrics::rss_bytes(), Ordering::Relaxed);
            rss_at = now + Duration::from_secs(1);
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
        let filled = tally.fill(&conn, |reading| {
            if !reading {
                game.scanning.store(false, Ordering::SeqCst);
                return;
            }
            // Raise `scanning` before looking at `restart_pending` (the checkpointer does
            // the reverse), so a WAL reset and a chunk's read never both start.
            loop {
                game.scanning.store(true, Ordering::SeqCst);
                if !game.restart_pending.load(Ordering::SeqCst) {
                    return;
                }
                game.scanning.store(false, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        match filled {
            Ok(()) => {
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
            }
            Err(e) => tracing::error!("rebuilding scores failed: {e}"),
        }
        let took = now.elapsed();
        schedule.done(now, took);
        if windows.len() == Window::ALL.len() {
            // A full pass covers the short windows too.
            short.done(now, took);
        }
    }
}
