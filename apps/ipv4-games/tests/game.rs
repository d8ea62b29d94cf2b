//! End-to-end tests of the IPv4 Games: the game runs in-process on an ephemeral port and the
//! tests talk raw HTTP/1.1 to it over real TCP sockets, checking answers through the HTTP API
//! and what is durable by reading the data folder back the way recovery does.
//!
//! Nothing here sleeps a fixed time to wait for the game: every wait polls with a deadline.

use std::collections::HashMap;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tern_ipv4_games::land::Land;
use tern_ipv4_games::{build, bundled_site, journal, GameConfig};
use tern_server::{ServerConfig, ServerHandle};
use tern_services::{RateLimitConfig, TrustedProxies};
use tern_testkit::{eventually, request_bytes, Client, NoAnswer, Resp};

/// How long a client waits for any answer before the test fails (never hangs).
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The 1×1 GIF the game answers image requests with.
const GIF_1X1: &[u8] = &[
    0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xff, 0xff, 0xff, 0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x01, 0x00, 0x00, 0x02, 0x02, 0x44, 0x01, 0x00, 0x3b,
];

// ---------------------------------------------------------------------------------------------
// The HTTP/1.1 client (tern-testkit's), and what the game's answers need of it.

/// A connection to the game that waits up to [`READ_TIMEOUT`] for each read.
fn open(addr: SocketAddr) -> Client {
    Client::connect(addr).read_timeout(READ_TIMEOUT)
}

/// The game's API answers in JSON.
trait Json {
    fn json(&self) -> serde_json::Value;
}

impl Json for Resp {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text()))
    }
}

fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Resp {
    open(addr).request("GET", path, headers)
}

/// A claim from `ip` (via X-Forwarded-For) answered as text.
fn claim_as(addr: SocketAddr, ip: &str, name: &str) -> Resp {
    get(
        addr,
        &format!("/claim/{name}"),
        &[("X-Forwarded-For", ip), ("Accept", "text/plain")],
    )
}

// ---------------------------------------------------------------------------------------------
// The game under test.

/// Settings shared by most tests: pages from the source tree, 127.0.0.1 trusted as a proxy
/// (so X-Forwarded-For picks the player's address), scores rebuilt every second.
fn game_config(data: &Path) -> GameConfig {
    let mut g = GameConfig::new(data, bundled_site());
    g.proxies = TrustedProxies::parse("127.0.0.1").unwrap();
    g.score_interval = Duration::from_secs(1);
    g
}

struct Game {
    handle: Option<ServerHandle>,
    addr: SocketAddr,
    data: PathBuf,
}

impl Game {
    fn start(game: GameConfig) -> Game {
        Game::start_with(game, 2)
    }

    fn start_with(game: GameConfig, workers: usize) -> Game {
        let mut config = ServerConfig::default();
        config.runtime.listen = vec!["127.0.0.1:0".parse().unwrap()];
        config.runtime.workers = workers;
        config.runtime.shutdown_grace = Duration::from_secs(2);
        let data = game.data_dir.clone();
        let server = build(config, game).expect("build the game");
        let handle = server.start().expect("start the game");
        let addr = handle.local_addr();
        Game {
            handle: Some(handle),
            addr,
            data,
        }
    }

    /// Graceful shutdown: every worker drains, then the writer stops.
    fn stop(mut self) {
        let handle = self.handle.take().unwrap();
        handle.shutdown();
        handle.join();
    }

    fn get(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        get(self.addr, path, headers)
    }

    fn claim(&self, ip: &str, name: &str) -> Resp {
        claim_as(self.addr, ip, name)
    }

    /// /statusz as a map; also checks every line is `key: value`.
    fn statusz(&self) -> HashMap<String, f64> {
        let r = self.get("/statusz", &[]);
        assert_eq!(r.status, 200);
        assert!(r.header("content-type").unwrap().starts_with("text/plain"));
        r.text()
            .lines()
            .map(|l| {
                let (k, v) = l
                    .split_once(": ")
                    .unwrap_or_else(|| panic!("statusz line {l:?}"));
                (k.to_string(), v.parse().unwrap())
            })
            .collect()
    }

    fn stat(&self, key: &str) -> u64 {
        *self
            .statusz()
            .get(key)
            .unwrap_or_else(|| panic!("/statusz has no {key}")) as u64
    }

    /// What is durable: the data folder read back the way recovery reads it.
    fn db(&self) -> Land {
        on_disk(&self.data)
    }

    fn row(&self, ip: &str) -> Option<(String, i64)> {
        row(&self.db(), ip)
    }
}

impl Drop for Game {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            handle.shutdown();
            handle.join();
        }
    }
}

/// The state recovery rebuilds from `data` (read-only: beside a live game).
fn on_disk(data: &Path) -> Land {
    let land = Land::new();
    journal::recover_read_only(data, &land).expect("the data folder reads back");
    land
}

fn row(land: &Land, ip: &str) -> Option<(String, i64)> {
    let ip = u32::from(ip.parse::<Ipv4Addr>().unwrap());
    land.holder(ip).map(|(n, c)| (n, c as i64))
}

fn count_rows(land: &Land) -> i64 {
    land.claimed() as i64
}

/// Writes a journal segment holding `claims` (address, name, time) into `data`, as a game
/// that made them would have.
fn seed(data: &Path, claims: &[(&str, &str, i64)]) {
    std::fs::create_dir_all(data).unwrap();
    let mut buf = journal::frame::header(journal::frame::Kind::Journal).to_vec();
    let at = journal::frame::begin_frame(&mut buf);
    for &(ip, nick, created) in claims {
        journal::Record {
            ip: u32::from(ip.parse::<Ipv4Addr>().unwrap()),
            created: created as u32,
            nick,
        }
        .encode(&mut buf);
    }
    journal::frame::finish_frame(&mut buf, at);
    std::fs::write(journal::segment_path(data, 1), buf).unwrap();
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Many connections at once need more than the common soft limit of 1024 descriptors (the
/// game runs in this process, so both ends count).
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a pointer to a live, initialised rlimit.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max.min(65_536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The tests.

#[test]
fn ip_answers_the_callers_address_as_text() {
    let dir = tempfile::tempdir().unwrap();
    let game = Game::start(game_config(dir.path()));
    let r = game.get("/ip", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "127.0.0.1\n");
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));

    // Through the trusted proxy (127.0.0.1), the forwarded address.
    let r = game.get("/ip", &[("X-Forwarded-For", "198.51.100.23")]);
    assert_eq!((r.status, r.text().as_str()), (200, "198.51.100.23\n"));

    // HEAD: the same head, no body; the keep-alive connection stays usable.
    let mut c = open(game.addr);
    let h = c.request("HEAD", "/ip", &[]);
    assert_eq!(h.status, 200);
    assert_eq!(h.header("content-length"), Some("10"));
    let again = c.request("GET", "/ip", &[]);
    assert_eq!(again.text(), "127.0.0.1\n");

    // IPv6 clients are refused, for /ip and for claims.
    let v6 = [("X-Forwarded-For", "2001:db8::1")];
    let r = game.get("/ip", &v6);
    assert_eq!((r.status, r.text().as_str()), (400, "IPv4 only\n"));
    let r = game.get("/claim/sixer", &v6);
    assert_eq!((r.status, r.text().as_str()), (400, "IPv4 only\n"));
    assert_eq!(count_rows(&game.db()), 0);
    assert_eq!(game.stat("claims_ipv6_refused"), 2);
}

#[test]
fn claims_are_answered_by_accept_after_both_url_forms() {
    let dir = tempfile::tempdir().unwrap();
    let game = Game::start(game_config(dir.path()));

    // Query form, no Accept: the HTML page.
    let r = game.get("/claim?name=alice", &[("X-Forwarded-For", "192.0.2.1")]);
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert!(
        r.text().contains("192.0.2.1 is now claimed by alice"),
        "{}",
        r.text()
    );
    assert_eq!(game.row("192.0.2.1").unwrap().0, "alice");

    // A browser's Accept: still HTML. Other query parameters are ignored.
    let r = game.get(
        "/claim?x=1&name=amy&y=2",
        &[
            ("X-Forwarded-For", "192.0.2.2"),
            (
                "Accept",
                "text/html,application/xhtml+xml,image/webp,*/*;q=0.8",
            ),
        ],
    );
    assert_eq!(r.status, 200);
    assert!(r.text().contains("192.0.2.2 is now claimed by amy"));

    // Path form, text/plain: one line.
    let r = game.get(
        "/claim/bob",
        &[("X-Forwarded-For", "192.0.2.3"), ("Accept", "text/plain")],
    );
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert_eq!(r.text(), "192.0.2.3 is now claimed by bob\n");

    // An <img> beacon: the 1×1 GIF, byte for byte.
    let r = game.get(
        "/claim/carol",
        &[
            ("X-Forwarded-For", "192.0.2.4"),
            (
                "Accept",
                "image/avif,image/webp,image/apng,image/*,*/*;q=0.8",
            ),
        ],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("image/gif"));
    assert_eq!(r.body, GIF_1X1);

    // `+` arrives as %2B; every other allowed character as is; 40 bytes is the limit.
    let r = game.claim("192.0.2.5", "a%2Bb@c/d:e.f^g!h-i_j*k");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.text(),
        "192.0.2.5 is now claimed by a+b@c/d:e.f^g!h-i_j*k\n"
    );
    let forty = "x".repeat(40);
    assert_eq!(game.claim("192.0.2.6", &forty).status, 200);
    let r = game.get(
        "/claim?name=q%2Bq",
        &[("X-Forwarded-For", "192.0.2.7"), ("Accept", "text/plain")],
    );
    assert_eq!(r.text(), "192.0.2.7 is now claimed by q+q\n");

    // HEAD on a claim: the same head without a body; the connection stays usable.
    let mut c = open(game.addr);
    let h = c.request("HEAD", "/claim/dave", &[("X-Forwarded-For", "192.0.2.8")]);
    assert_eq!(h.status, 200);
    assert!(h.header("content-type").unwrap().starts_with("text/html"));
    let n: usize = h.header("content-length").unwrap().parse().unwrap();
    assert!(n > 0);
    assert_eq!(c.request("GET", "/ip", &[]).text(), "127.0.0.1\n");

    let db = game.db();
    for (ip, nick) in [
        ("192.0.2.1", "alice"),
        ("192.0.2.2", "amy"),
        ("192.0.2.3", "bob"),
        ("192.0.2.4", "carol"),
        ("192.0.2.5", "a+b@c/d:e.f^g!h-i_j*k"),
        ("192.0.2.6", forty.as_str()),
        ("192.0.2.7", "q+q"),
        ("192.0.2.8", "dave"),
    ] {
        assert_eq!(row(&db, ip).map(|r| r.0).as_deref(), Some(nick), "{ip}");
    }
    assert_eq!(count_rows(&db), 8);
}

#[test]
fn invalid_names_methods_and_unknown_paths() {
    let dir = tempfile::tempdir().unwrap();
    let game = Game::start(game_config(dir.path()));
    let forty_one = "y".repeat(41);
    let bad = [
        "/claim?name=a+b".to_string(),
        "/claim/a+b".to_string(),
        format!("/claim/{forty_one}"),
        format!("/claim?name={forty_one}"),
        "/claim/a%20b".to_string(),
        "/claim?name=a%20b".to_string(),
        "/claim/%C3%BCmlaut".to_string(),
        "/claim/a%3Cb".to_string(),
        "/claim/a~b".to_string(),
        "/claim?name=".to_string(),
        "/claim?nickname=bob".to_string(),
        "/claim".to_string(),
        "/claim/".to_string(),
    ];
    for path in &bad {
        let r = game.get(path, &[("X-Forwarded-For", "192.0.2.9")]);
        assert_eq!(r.status, 400, "{path}");
        assert!(r.text().starts_with("invalid name"), "{path}: {}", r.text());
    }
    // A broken escape never reaches the game: the codec refuses the path.
    let r = game.get("/claim/a%2", &[("X-Forwarded-For", "192.0.2.9")]);
    assert_eq!(r.status, 400);
    // Raw non-ASCII bytes in the target: refused too (by the name check or the parser).
    let mut c = open(game.addr);
    c.send(b"GET /claim/\xc3\xbcml HTTP/1.1\r\nHost: t\r\nX-Forwarded-For: 192.0.2.9\r\n\r\n");
    assert_eq!(c.read_response(false).status, 400);
    assert_eq!(count_rows(&game.db()), 0);
    assert!(game.stat("claims_invalid_name") >= bad.len() as u64);

    // Claims are GET only.
    let mut c = open(game.addr);
    let r = c.request("POST", "/claim?name=bob", &[("Content-Length", "0")]);
    assert_eq!(r.status, 405);
    let allow = r.header("allow").expect("405 names the allowed methods");
    assert!(allow.contains("GET"), "{allow}");
    let r = open(game.addr).request("POST", "/claim/bob", &[("Content-Length", "0")]);
    assert_eq!(r.status, 405);
    assert_eq!(count_rows(&game.db()), 0);

    // Unknown paths fall through to the pages: 404; the pages themselves are served.
    assert_eq!(game.get("/no-such-page", &[]).status, 404);
    let r = game.get("/", &[]);
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    let h = open(game.addr).request("HEAD", "/", &[]);
    assert_eq!(h.status, 200);
    assert_eq!(
        h.header("content-length").unwrap(),
        r.body.len().to_string()
    );
}

#[test]
fn recent_and_scores_have_their_json_shapes_etags_and_gzip() {
    let dir = tempfile::tempdir().unwrap();
    let game = Game::start(game_config(dir.path()));
    let claims = [
        ("10.0.0.1", "alice"),
        ("10.0.1.1", "alice"),
        ("10.0.2.1", "alice"),
        ("10.0.3.1", "bob"),
        ("11.0.0.1", "bob"),
        ("11.0.1.1", "bob"),
    ];
    for (ip, name) in claims {
        assert_eq!(game.claim(ip, name).status, 200);
    }

    // /recent: the claims, newest first.
    let mut recent = game.get("/recent", &[]);
    assert!(
        eventually(Duration::from_secs(5), || {
            recent = game.get("/recent", &[]);
            recent.json()["claims"].as_array().unwrap().len() == claims.len()
        }),
        "{}",
        recent.text()
    );
    assert_eq!(recent.status, 200);
    assert_eq!(recent.header("content-type"), Some("application/json"));
    assert!(recent.header("cache-control").unwrap().contains("max-age="));
    let v = recent.json();
    assert!(v["generated"].as_u64().unwrap() > 1_600_000_000);
    let items = v["claims"].as_array().unwrap();
    let now = unix_now() as u64;
    for item in items {
        let t = item["time"].as_u64().unwrap();
        assert!(t + 60 > now && t <= now + 1, "{item}");
    }
    // Claims were made one after another, so the newest is the last one made.
    let listed: Vec<(String, String)> = items
        .iter()
        .map(|i| {
            (
                i["ip"].as_str().unwrap().to_string(),
                i["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(listed[0], ("11.0.1.1".to_string(), "bob".to_string()));
    let mut want: Vec<(String, String)> = claims
        .iter()
        .map(|(i, n)| (i.to_string(), n.to_string()))
        .collect();
    let mut got = listed.clone();
    want.sort();
    got.sort();
    assert_eq!(got, want);

    // If-None-Match with the ETag just seen: 304 (nothing was claimed since).
    let etag = recent.header("etag").unwrap().to_string();
    let r = game.get("/recent", &[("If-None-Match", &etag)]);
    assert_eq!(r.status, 304);
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert!(r.body.is_empty());

    // Large enough to be gzipped: the gzip body decodes to the identity body.
    assert!(recent.body.len() >= 256, "{} bytes", recent.body.len());
    let z = game.get("/recent", &[("Accept-Encoding", "gzip")]);
    assert_eq!(z.status, 200);
    assert_eq!(z.header("content-encoding"), Some("gzip"));
    assert!(z.header("vary").unwrap().contains("Accept-Encoding"));
    let mut plain = Vec::new();
    flate2::read::GzDecoder::new(&z.body[..])
        .read_to_end(&mut plain)
        .unwrap();
    assert_eq!(plain, recent.body);

    // Every score window: the tally per /8, once its rebuild has caught up.
    for path in [
        "/score",
        "/score/hour",
        "/score/day",
        "/score/week",
        "/score/month",
    ] {
        let mut r = game.get(path, &[]);
        assert!(
            eventually(Duration::from_secs(8), || {
                r = game.get(path, &[]);
                r.json()["total"] == 6
            }),
            "{path}: {}",
            r.text()
        );
        assert_eq!(r.header("content-type"), Some("application/json"));
        let cc = r.header("cache-control").unwrap();
        let max_age: u32 = cc
            .strip_prefix("public, max-age=")
            .unwrap_or_else(|| panic!("{cc}"))
            .parse()
            .unwrap();
        assert!(max_age >= 1, "{cc}");
        let v = r.json();
        let window = path.strip_prefix("/score/").unwrap_or("all");
        assert_eq!(v["window"], window);
        assert!(v["generated"].as_u64().unwrap() > 1_600_000_000);
        let blocks = v["blocks"].as_array().unwrap();
        assert_eq!(blocks.len(), 2, "{v}");
        assert_eq!(blocks[0]["block"], 10);
        assert_eq!(blocks[0]["total"], 4);
        assert_eq!(blocks[0]["leaders"][0]["name"], "alice");
        assert_eq!(blocks[0]["leaders"][0]["count"], 3);
        assert_eq!(blocks[0]["leaders"][1]["name"], "bob");
        assert_eq!(blocks[0]["leaders"][1]["count"], 1);
        assert_eq!(blocks[1]["block"], 11);
        assert_eq!(blocks[1]["total"], 2);
        assert_eq!(blocks[1]["leaders"][0]["name"], "bob");
        let board = v["leaderboard"].as_array().unwrap();
        assert_eq!(board.len(), 2);
        assert_eq!(board[0]["name"], "alice");
        assert_eq!(board[0]["count"], 3);
        assert_eq!(board[0]["blocks"], 1);
        assert_eq!(board[1]["name"], "bob");
        assert_eq!(board[1]["count"], 3);
        assert_eq!(board[1]["blocks"], 1);

        // A previous ETag gives 304 as long as the snapshot is the same. The body carries
        // its "generated" time, so a rebuild between the two requests changes the ETag; then
        // the answer must be a full 200 with the new ETag, and we try again.
        let mut hit = false;
        for _ in 0..20 {
            let first = game.get(path, &[]);
            let etag = first.header("etag").unwrap().to_string();
            let again = game.get(path, &[("If-None-Match", &etag)]);
            if again.status == 304 {
                assert_eq!(again.header("etag"), Some(etag.as_str()));
                hit = true;
                break;
            }
            assert_eq!(again.status, 200);
            assert_ne!(again.header("etag"), Some(etag.as_str()), "{path}");
        }
        assert!(hit, "{path}: never 304");
    }
    assert!(game.stat("score_rebuilds") >= 5);
}

#[test]
fn upsert_rules_hold_through_the_api() {
    let dir = tempfile::tempdir().unwrap();
    // Two addresses alice claimed earlier: half an hour ago, and two hours ago.
    let (half, two) = ("203.0.113.51", "203.0.113.52");
    let half_hour_ago = unix_now() - 1800;
    let two_hours_ago = unix_now() - 7200;
    seed(
        dir.path(),
        &[
            (half, "alice", half_hour_ago),
            (two, "alice", two_hours_ago),
        ],
    );
    let game = Game::start(game_config(dir.path()));
    let ip = "203.0.113.50";

    assert_eq!(game.claim(ip, "alice").status, 200);
    let (nick, first) = game.row(ip).unwrap();
    assert_eq!(nick, "alice");
    assert!((first - unix_now()).abs() <= 2);

    // The same name within the hour: answered 200, nothing changes.
    assert_eq!(game.claim(ip, "alice").status, 200);
    assert_eq!(game.row(ip).unwrap(), ("alice".to_string(), first));
    assert_eq!(game.stat("claims_unchanged"), 1);

    // The same name, the old claim half an hour old: still unchanged.
    assert_eq!(game.claim(half, "alice").status, 200);
    assert_eq!(game.row(half).unwrap().1, half_hour_ago);
    assert_eq!(game.stat("claims_unchanged"), 2);

    // Over an hour old: refreshed to now.
    assert_eq!(game.claim(two, "alice").status, 200);
    let (nick, refreshed) = game.row(two).unwrap();
    assert_eq!(nick, "alice");
    assert!((refreshed - unix_now()).abs() <= 2, "{refreshed}");
    assert_eq!(game.stat("claims_unchanged"), 2);

    // A new name replaces the old one at once, whatever the age.
    assert_eq!(game.claim(ip, "bob").status, 200);
    let (nick, created) = game.row(ip).unwrap();
    assert_eq!(nick, "bob");
    assert!(created >= first);
    assert_eq!(count_rows(&game.db()), 3);
    assert_eq!(game.stat("claims_saved"), 5);
    assert_eq!(game.stat("claims_changed"), 3);

    // /recent lists the latest claim of the address under its new name.
    let mut v = serde_json::Value::Null;
    assert!(eventually(Duration::from_secs(5), || {
        v = game.get("/recent", &[]).json();
        v["claims"][0]["name"] == "bob"
    }));
    assert_eq!(v["claims"][0]["ip"], ip);
}

#[test]
fn concurrent_claims_are_all_durable_when_answered() {
    raise_fd_limit();
    let dir = tempfile::tempdir().unwrap();
    let game = Game::start(game_config(dir.path()));
    const THREADS: usize = 20;
    const PER_THREAD: usize = 30;
    let addr = game.addr;
    // Each claim from its own /24 so that no rate limit applies; each thread opens all its
    // connections and sends every request before reading any answer, so all claims are in
    // flight at once.
    let ip_of = |i: usize| format!("10.{}.{}.7", i / 256, i % 256);
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            std::thread::spawn(move || {
                let ids: Vec<usize> = (0..PER_THREAD).map(|k| t * PER_THREAD + k).collect();
                let mut conns: Vec<Client> = ids.iter().map(|_| open(addr)).collect();
                for (c, &i) in conns.iter_mut().zip(&ids) {
                    let ip = format!("10.{}.{}.7", i / 256, i % 256);
                    c.send(&request_bytes(
                        "GET",
                        &format!("/claim/player{i}"),
                        &[("X-Forwarded-For", &ip), ("Accept", "text/plain")],
                    ));
                }
                conns
                    .iter_mut()
                    .zip(&ids)
                    .map(|(c, &i)| (i, c.read_response(false)))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut answered = 0;
    for t in threads {
        for (i, r) in t.join().unwrap() {
            assert_eq!(r.status, 200, "claim {i}: {}", r.text());
            assert_eq!(
                r.text(),
                format!("{} is now claimed by player{i}\n", ip_of(i))
            );
            answered += 1;
        }
    }
    let total = THREADS * PER_THREAD;
    assert_eq!(answered, total);

    let db = game.db();
    assert_eq!(count_rows(&db), total as i64);
    for i in 0..total {
        assert_eq!(row(&db, &ip_of(i)).map(|r| r.0), Some(format!("player{i}")));
    }
    let s = game.statusz();
    println!(
        "{total} claims in {} journal writes over {} worker turns",
        s["journal_writes"], s["claim_turns"]
    );
    assert_eq!(s["claims_saved"] as usize, total);
    assert_eq!(s["claims_received"] as usize, total);
    assert_eq!(s["claims_changed"] as usize, total);
    // One write per turn that took claims, never one per claim more than that.
    assert!(s["journal_writes"] <= s["claim_turns"]);
}

#[test]
fn graceful_shutdown_answers_the_claims_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = game_config(dir.path());
    config.sync = tern_ipv4_games::SyncMode::Full;
    let game = Game::start(config);
    let mut conns: Vec<Client> = (0..20)
        .map(|i| {
            let mut c = open(game.addr);
            c.send(&request_bytes(
                "GET",
                &format!("/claim/last{i}"),
                &[
                    ("X-Forwarded-For", &format!("198.51.{i}.99")),
                    ("Accept", "text/plain"),
                ],
            ));
            c
        })
        .collect();
    // Stop while the claims wait for their sync; the stop waits for their answers.
    let data = game.data.clone();
    let stopping = std::thread::spawn(move || game.stop());
    for (i, c) in conns.iter_mut().enumerate() {
        let r = c.read_response(false);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.text(),
            format!("198.51.{i}.99 is now claimed by last{i}\n")
        );
    }
    stopping.join().unwrap();
    let disk = on_disk(&data);
    for i in 0..20 {
        assert_eq!(
            row(&disk, &format!("198.51.{i}.99")).unwrap().0,
            format!("last{i}")
        );
    }
}

#[test]
fn at_max_claims_new_addresses_get_503_and_held_ones_still_change_hands() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = game_config(dir.path());
    config.max_claims = 2;
    config.max_names = Some(10);
    let game = Game::start(config);
    assert_eq!(game.claim("198.51.100.1", "first").status, 200);
    assert_eq!(game.claim("198.51.100.2", "second").status, 200);
    let r = game.claim("198.51.100.3", "third");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.text(),
        "the game is full: no more new addresses or names can be claimed here\n"
    );
    assert_eq!(game.stat("claims_refused_full"), 1);
    // An address already held can still be taken over.
    assert_eq!(game.claim("198.51.100.1", "taker").status, 200);
    let db = game.db();
    assert_eq!(row(&db, "198.51.100.1").unwrap().0, "taker");
    assert_eq!(row(&db, "198.51.100.2").unwrap().0, "second");
    assert_eq!(row(&db, "198.51.100.3"), None);
    assert_eq!(game.stat("claimed_addresses"), 2);
}

/// What one request of the rate-limit test got.
#[derive(Debug, PartialEq)]
enum Outcome {
    Ok,
    /// 429 with `Connection: close`, and then the connection closed.
    Limited,
    /// Closed without an answer.
    Dropped,
}

fn limited_claim(addr: SocketAddr, ip: &str, name: &str) -> Outcome {
    let mut c = open(addr);
    c.send(&request_bytes(
        "GET",
        &format!("/claim/{name}"),
        &[("X-Forwarded-For", ip), ("Accept", "text/plain")],
    ));
    match c.read_answer(false) {
        Ok(r) if r.status == 200 => Outcome::Ok,
        Ok(r) if r.status == 429 => {
            assert!(r.closes(), "429 must close: {:?}", r.headers);
            assert!(r.header("retry-after").is_some());
            assert!(c.closed_within(Duration::from_secs(5)), "socket left open");
            Outcome::Limited
        }
        Ok(r) => panic!("unexpected {} {}", r.status, r.text()),
        Err(NoAnswer::Closed) => Outcome::Dropped,
        Err(NoAnswer::TimedOut) => panic!("no answer and no close"),
        Err(NoAnswer::Broken(why)) => panic!("a broken answer: {why}"),
    }
}

#[test]
fn rate_limits_per_24_answer_429_then_drop() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = game_config(dir.path());
    config.rate_limit = RateLimitConfig {
        per_second: 1,
        burst: 2,
        ..RateLimitConfig::default()
    };
    // One worker: the limits are split between workers, and the kernel picks the worker.
    let game = Game::start_with(config, 1);
    let addr = game.addr;

    // Buckets refill once a second, so run each sequence inside one second; if a second
    // boundary fell inside it anyway (a slow machine), run it again from another /24.
    let mut seen = Vec::new();
    for attempt in 0..3 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        std::thread::sleep(Duration::from_nanos(
            1_000_000_000 - now.subsec_nanos() as u64 + 20_000_000,
        ));
        let started = unix_now();
        seen = (0..8)
            .map(|k| limited_claim(addr, &format!("203.0.{}.{}", 113 + attempt, k + 1), "eve"))
            .collect();
        if unix_now() == started {
            break;
        }
    }
    use Outcome::*;
    assert_eq!(
        seen,
        [Ok, Ok, Limited, Limited, Dropped, Dropped, Dropped, Dropped]
    );
    let s = game.statusz();
    assert!(s["claims_rate_limited"] >= 2.0);
    assert!(s["claims_rate_dropped"] >= 4.0);

    // Another /24 has its own bucket; loopback (no forwarded address) is never limited.
    assert_eq!(limited_claim(addr, "198.51.100.1", "frank"), Ok);
    for k in 0..10 {
        let r = get(
            addr,
            &format!("/claim/local{k}"),
            &[("Accept", "text/plain")],
        );
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), format!("127.0.0.1 is now claimed by local{k}\n"));
    }
}

#[test]
fn forwarded_addresses_count_only_from_trusted_proxies() {
    // No trusted proxies: the headers are the client's own words and are ignored.
    let dir = tempfile::tempdir().unwrap();
    let mut config = game_config(dir.path());
    config.proxies = TrustedProxies::default();
    let game = Game::start(config);
    for h in [
        ("X-Forwarded-For", "9.9.9.9"),
        ("Forwarded", "for=9.9.9.9"),
        ("X-Forwarded-For", "2001:db8::1"),
    ] {
        let r = game.get("/ip", &[h]);
        assert_eq!((r.status, r.text().as_str()), (200, "127.0.0.1\n"), "{h:?}");
    }
    let r = game.claim("9.9.9.9", "spoofer");
    assert_eq!(r.text(), "127.0.0.1 is now claimed by spoofer\n");
    assert_eq!(game.row("9.9.9.9"), None);
    assert_eq!(game.row("127.0.0.1").unwrap().0, "spoofer");
    game.stop();

    // Trusting the local proxy and an inner network: the right-most hop not trusted.
    let dir = tempfile::tempdir().unwrap();
    let mut config = game_config(dir.path());
    config.proxies = TrustedProxies::parse("127.0.0.1, 10.0.0.0/8").unwrap();
    let game = Game::start(config);
    let ip = |headers: &[(&str, &str)]| game.get("/ip", headers).text();
    assert_eq!(ip(&[("X-Forwarded-For", "9.9.9.9")]), "9.9.9.9\n");
    assert_eq!(
        ip(&[("X-Forwarded-For", "1.1.1.1, 2.2.2.2, 10.1.2.3")]),
        "2.2.2.2\n"
    );
    assert_eq!(
        ip(&[
            ("X-Forwarded-For", "1.1.1.1"),
            ("X-Forwarded-For", "3.3.3.3, 10.0.0.9")
        ]),
        "3.3.3.3\n"
    );
    assert_eq!(
        ip(&[("Forwarded", "for=4.4.4.4;proto=http, for=5.5.5.5")]),
        "5.5.5.5\n"
    );
    let r = game.claim("1.1.1.1, 6.6.6.6", "proxied");
    assert_eq!(r.text(), "6.6.6.6 is now claimed by proxied\n");
    assert_eq!(game.row("6.6.6.6").unwrap().0, "proxied");
    assert_eq!(game.row("1.1.1.1"), None);
    let r = game.get("/ip", &[("X-Forwarded-For", "2001:db8::1")]);
    assert_eq!((r.status, r.text().as_str()), (400, "IPv4 only\n"));
}

#[test]
fn claims_survive_a_restart_and_show_on_recent_and_player_pages() {
    let dir = tempfile::tempdir().unwrap();
    let game = Game::start(game_config(dir.path()));
    assert_eq!(game.claim("192.0.2.77", "keeper").status, 200);
    assert_eq!(game.claim("193.0.2.78", "keeper").status, 200);
    assert_eq!(game.claim("192.0.2.79", "other").status, 200);
    game.stop();

    let game = Game::start(game_config(dir.path()));
    let mut v = serde_json::Value::Null;
    assert!(
        eventually(Duration::from_secs(5), || {
            v = game.get("/recent", &[]).json();
            v["claims"].as_array().unwrap().len() == 3
        }),
        "{v}"
    );
    let names: Vec<(&str, &str)> = v["claims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["ip"].as_str().unwrap(), c["name"].as_str().unwrap()))
        .collect();
    for want in [
        ("192.0.2.77", "keeper"),
        ("193.0.2.78", "keeper"),
        ("192.0.2.79", "other"),
    ] {
        assert!(names.contains(&want), "{want:?} not in {names:?}");
    }

    let r = game.get("/player/keeper", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    let p = r.json();
    assert_eq!(p["name"], "keeper");
    assert_eq!(p["total"], 2);
    assert_eq!(p["blocks"][0]["block"], 192);
    assert_eq!(p["blocks"][0]["count"], 1);
    assert_eq!(p["blocks"][1]["block"], 193);
    let mut ips: Vec<&str> = p["recent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["ip"].as_str().unwrap())
        .collect();
    ips.sort();
    assert_eq!(ips, ["192.0.2.77", "193.0.2.78"]);
    // Unknown players have nothing; bad names are refused.
    let p = game.get("/player/nobody", &[]).json();
    assert_eq!(p["total"], 0);
    assert_eq!(game.get("/player/a+b", &[]).status, 400);
    // The claim still works after the restart, and the score counts all three.
    assert_eq!(game.claim("192.0.2.80", "keeper").status, 200);
    let mut s = serde_json::Value::Null;
    assert!(
        eventually(Duration::from_secs(8), || {
            s = game.get("/score", &[]).json();
            s["total"] == 4
        }),
        "{s}"
    );
}

#[test]
fn metrics_and_statusz_expose_the_counters() {
    let dir = tempfile::tempdir().unwrap();
    let game = Game::start(game_config(dir.path()));
    for k in 0..3 {
        assert_eq!(game.claim(&format!("198.18.{k}.1"), "counted").status, 200);
    }
    assert_eq!(game.get("/claim/a+b", &[]).status, 400);

    let r = game.get("/metrics", &[]);
    assert_eq!(r.status, 200);
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let text = r.text();
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .parse()
            .unwrap()
    };
    for (name, kind) in [
        ("tern_claims_saved_total", "counter"),
        ("tern_claims_received_total", "counter"),
        ("tern_journal_writes_total", "counter"),
        ("tern_claims_invalid_name_total", "counter"),
        ("tern_claimed_addresses", "gauge"),
        ("tern_snapshot_bytes", "gauge"),
    ] {
        assert!(
            text.contains(&format!("# HELP {name} ")),
            "no HELP for {name}"
        );
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "no TYPE for {name}"
        );
    }
    assert_eq!(value("tern_claims_saved_total"), 3.0);
    assert_eq!(value("tern_claims_received_total"), 3.0);
    assert_eq!(value("tern_claims_invalid_name_total"), 1.0);
    assert!(value("tern_journal_writes_total") >= 1.0);
    assert_eq!(value("tern_claimed_addresses"), 3.0);
    // Every line is a comment or `name value`.
    for line in text.lines() {
        assert!(
            line.starts_with("# HELP ")
                || line.starts_with("# TYPE ")
                || line.split(' ').count() == 2,
            "{line:?}"
        );
    }

    let s = game.statusz();
    assert_eq!(s["claims_saved"], 3.0);
    assert!(s.contains_key("journal_bytes"));
}
