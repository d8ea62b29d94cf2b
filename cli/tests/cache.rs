//! The shared cache of proxy routes (`cache = ...`): the real server in front of a small
//! upstream that says how many times it was asked and what it was sent. Hits, Age, HEAD and
//! 304 from an entry; what is never stored (private, Set-Cookie, errors, no lifetime, too
//! large); what bypasses it (cookies, Authorization); that no unkeyed client field reaches the
//! app on a cached route; a POST invalidating its target; `--check`'s lines; concurrent misses
//! coalesced into one request to an app that answers only when the test lets it, and sent on
//! after the lock time. Then the same on a PHP route, with real PHP-FPM: hits, a logged-in
//! cookie, a script setting a cookie, a POST, front-controller pages kept apart, revalidation,
//! stale-if-error and coalescing.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::support;
use support::*;

/// An upstream that answers by path, counting requests per path and keeping their heads.
struct App {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
    /// `/slow` answers only once this is open.
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn pass(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
    }

    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }
}

impl App {
    fn start() -> App {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let counts = Arc::new(Mutex::new(HashMap::<String, usize>::new()));
        let gate = Arc::new(Gate::default());
        let (s, g) = (seen.clone(), gate.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let (seen, counts, gate) = (s.clone(), counts.clone(), g.clone());
                std::thread::spawn(move || serve(conn, &seen, &counts, &gate));
            }
        });
        App { addr, seen, gate }
    }

    /// Requests whose request line names `path` (with its query).
    fn asked(&self, target: &str) -> Vec<String> {
        let line = |h: &String| h.lines().next().unwrap_or("").split(' ').nth(1) == Some(target);
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|h| line(h))
            .cloned()
            .collect()
    }
}

fn serve(
    conn: TcpStream,
    seen: &Mutex<Vec<String>>,
    counts: &Mutex<HashMap<String, usize>>,
    gate: &Gate,
) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut out = conn;
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let field = |name: &str| {
            head.lines().skip(1).find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        let length: usize = field("content-length").map_or(0, |v| v.parse().unwrap());
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        seen.lock().unwrap().push(head.clone());
        let mut parts = head.split(' ');
        let method = parts.next().unwrap_or("").to_string();
        let target = parts.next().unwrap_or("").to_string();
        let path = target.split('?').next().unwrap_or("").to_string();
        let n = {
            let mut c = counts.lock().unwrap();
            let n = c.entry(target.clone()).or_default();
            *n += 1;
            *n
        };
        // Held, once counted (so the numbers follow the order requests came in): every
        // request for /slow, a refresh of /held (not its first).
        if path == "/slow" || path == "/held" && n >= 2 {
            gate.pass();
        }
        // The body tells which request made it and what the app was told.
        let text = format!(
            "{method} {target} #{n} xfh={:?} ua={:?} lang={:?} cookie={:?}\n",
            field("x-original-host").or(field("x-forwarded-host")),
            field("user-agent"),
            field("accept-language"),
            field("cookie"),
        );
        let (status, extra, body): (u16, &str, Vec<u8>) = match path.as_str() {
            "/private" => (200, "Cache-Control: private, max-age=60\r\n", text.into()),
            "/cookie" => (
                200,
                "Cache-Control: max-age=60\r\nSet-Cookie: s=1\r\n",
                text.into(),
            ),
            "/error" => (500, "Cache-Control: public, max-age=60\r\n", text.into()),
            "/plain" => (200, "", text.into()),
            // PHP's session_cache_limiter("nocache").
            "/nocache" => (
                200,
                "Cache-Control: no-store, no-cache, must-revalidate\r\nPragma: no-cache\r\n\
                 Expires: Thu, 19 Nov 1981 08:52:00 GMT\r\n",
                text.into(),
            ),
            // Made 50 s ago by the upstream's clock: 10 s of its minute left.
            "/dated" => (
                200,
                &*format!("Cache-Control: max-age=60\r\nDate: {}\r\n", ago(50)).leak(),
                text.into(),
            ),
            // Made 90 s ago with a minute's lifetime: stale when it comes.
            "/stale" => (
                200,
                &*format!("Cache-Control: max-age=60\r\nDate: {}\r\n", ago(90)).leak(),
                text.into(),
            ),
            "/big" => (200, "Cache-Control: max-age=60\r\n", vec![b'b'; 300 * 1024]),
            // A page worth compressing.
            "/article" => (
                200,
                "Cache-Control: max-age=60\r\nContent-Type: text/html\r\n",
                "<p>words words words</p>\n".repeat(200).into_bytes(),
            ),
            // Over the memory tier's largest object, sent in chunks (no length up front).
            "/chunked-big" => (200, "Cache-Control: max-age=60\r\n", vec![b'c'; 600 * 1024]),
            // Fresh for a second.
            "/held" => (200, "Cache-Control: max-age=1\r\n", text.into()),
            // Fresh for a second, then failing.
            "/flaky" if n == 1 => (200, "Cache-Control: max-age=1\r\n", text.into()),
            "/flaky" => (500, "", text.into()),
            // Fresh for a second; its validator still holds after.
            "/validated" if field("if-none-match").as_deref() == Some("\"v7\"") => (
                304,
                "Cache-Control: max-age=60\r\nETag: \"v7\"\r\n",
                Vec::new(),
            ),
            "/validated" => (
                200,
                "Cache-Control: max-age=1\r\nETag: \"v7\"\r\n",
                text.into(),
            ),
            _ if method == "POST" => (200, "", text.into()),
            _ if path.starts_with("/tagged/") => (
                200,
                "Cache-Control: max-age=60\r\nCache-Tag: product-42, list\r\nSurrogate-Key: home\r\n",
                text.into(),
            ),
            _ => (
                200,
                "Cache-Control: max-age=60\r\nETag: \"v1\"\r\nContent-Type: text/plain\r\n",
                text.into(),
            ),
        };
        let chunked = path.starts_with("/chunked");
        let mut answer = format!("HTTP/1.1 {status} X\r\n{extra}");
        if chunked {
            answer.push_str("Transfer-Encoding: chunked\r\n\r\n");
            answer.push_str(&format!("{:x}\r\n", body.len()));
        } else {
            answer.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        }
        let mut bytes = answer.into_bytes();
        if method != "HEAD" {
            bytes.extend_from_slice(&body);
        }
        if chunked {
            bytes.extend_from_slice(b"\r\n0\r\n\r\n");
        }
        if out.write_all(&bytes).is_err() {
            return;
        }
    }
}

fn ago(secs: u64) -> String {
    httpdate::fmt_http_date(std::time::SystemTime::now() - std::time::Duration::from_secs(secs))
}

fn config(dir: &Path, app: &App, route_keys: &str, blocks: &str) -> std::path::PathBuf {
    let conf = dir.join("tern.toml");
    std::fs::write(
        &conf,
        format!(
            "{blocks}\n[[site]]\nname = \"one\"\nhosts = [\"one.test\"]\ndefault = true\n\n\
             [[site.route]]\npath = \"/\"\nproxy = \"{}\"\n{route_keys}\n",
            app.addr
        ),
    )
    .unwrap();
    conf
}

/// `tern run --check` on `conf`.
fn check(conf: &Path) -> std::process::Output {
    Command::new(TERN)
        .args(["run", "--check", "--config"])
        .arg(conf)
        .output()
        .unwrap()
}

fn started(route_keys: &str) -> (tempfile::TempDir, App, Tern) {
    started_with(route_keys, "")
}

/// With more keys in `[cache.main]`.
fn started_with(route_keys: &str, block_keys: &str) -> (tempfile::TempDir, App, Tern) {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start();
    let conf = config(
        dir.path(),
        &app,
        route_keys,
        &format!("[cache.main]\nmemory = \"4M\"\nmax_object = \"256K\"\n{block_keys}"),
    );
    let tern = Tern::start_run(&conf);
    (dir, app, tern)
}

const CACHED: &str = "cache = \"main\"\ncache_status = true\ncache_ignore_cookies = [\"_ga*\"]";

#[test]
fn a_fresh_answer_is_served_from_the_cache_with_its_age_head_and_validators() {
    let (_dir, app, tern) = started(CACHED);
    let first = tern.get("/page");
    assert_eq!(first.status, 200);
    assert!(first.text().starts_with("GET /page #1"), "{}", first.text());
    assert_eq!(first.header("cache-status"), Some("tern; fwd=miss"));
    let second = tern.get("/page");
    assert_eq!(second.status, 200);
    assert_eq!(
        second.text(),
        first.text(),
        "the same answer, from the cache"
    );
    assert!(second
        .header("age")
        .is_some_and(|a| a.parse::<u64>().unwrap() <= 2));
    assert_eq!(second.header("cache-status"), Some("tern; hit"));
    assert_eq!(second.header("etag"), Some("\"v1\""));
    assert_eq!(second.header("content-type"), Some("text/plain"));
    assert_eq!(app.asked("/page").len(), 1, "the app was asked once");

    // HEAD from the GET's entry: its head and length, no body.
    let head = tern.client().request("HEAD", "/page", &[]);
    assert_eq!(head.status, 200);
    assert_eq!(head.content_length(), Some(first.body.len() as u64));
    assert!(head.body.is_empty());
    // The client's validators against the entry's.
    let cond = tern.get_with("/page", &[("If-None-Match", "\"v1\"")]);
    assert_eq!(cond.status, 304);
    assert_eq!(cond.header("etag"), Some("\"v1\""));
    assert!(cond.body.is_empty());
    assert_eq!(
        tern.get_with("/page", &[("If-None-Match", "\"v0\"")])
            .status,
        200
    );
    assert_eq!(app.asked("/page").len(), 1);

    // The query is part of the key.
    assert!(tern.get("/page?a=1").text().contains("#1"));
    assert!(tern.get("/page?a=2").text().contains("#1"));
    assert_eq!(app.asked("/page?a=1").len(), 1);
}

#[test]
fn a_range_is_answered_from_the_whole_entry() {
    let (_dir, app, tern) = started(CACHED);
    let whole = tern.get("/page");
    let len = whole.body.len();
    let part = tern.get_with("/page", &[("Range", "bytes=0-3")]);
    assert_eq!(part.status, 206);
    assert_eq!(part.body, whole.body[..4]);
    assert_eq!(
        part.header("content-range"),
        Some(&*format!("bytes 0-3/{len}"))
    );
    assert_eq!(part.header("cache-status"), Some("tern; hit"));
    let tail = tern.get_with("/page", &[("Range", "bytes=-2")]);
    assert_eq!((tail.status, &tail.body[..]), (206, &whole.body[len - 2..]));
    let past = tern.get_with("/page", &[("Range", &format!("bytes={len}-"))]);
    assert_eq!(past.status, 416);
    assert_eq!(
        past.header("content-range"),
        Some(&*format!("bytes */{len}"))
    );
    // If-Range: the entry's strong ETag, else the whole entry.
    let same = tern.get_with("/page", &[("Range", "bytes=1-2"), ("If-Range", "\"v1\"")]);
    assert_eq!((same.status, &same.body[..]), (206, &whole.body[1..3]));
    for other in ["\"v0\"", "W/\"v1\""] {
        let r = tern.get_with("/page", &[("Range", "bytes=1-2"), ("If-Range", other)]);
        assert_eq!((r.status, r.body.len()), (200, len), "If-Range {other}");
    }
    // Several ranges: the whole entry (as for static files).
    let several = tern.get_with("/page", &[("Range", "bytes=0-1,3-4")]);
    assert_eq!((several.status, several.body.len()), (200, len));
    assert_eq!(app.asked("/page").len(), 1, "all from the one entry");
}

#[test]
fn what_is_never_stored_goes_to_the_app_every_time() {
    let (_dir, app, tern) = started(CACHED);
    for path in ["/private", "/cookie", "/error", "/plain", "/big"] {
        let a = tern.get(path);
        let b = tern.get(path);
        assert_eq!(a.status, b.status, "{path}");
        assert_eq!(app.asked(path).len(), 2, "{path}: asked twice");
        assert_eq!(
            b.header("cache-status"),
            Some("tern; fwd=miss"),
            "{path}: not a hit"
        );
        if path == "/big" {
            assert_eq!(
                b.body.len(),
                300 * 1024,
                "over max_object: relayed whole all the same"
            );
        }
    }
}

#[test]
fn credentials_bypass_the_cache_and_unkeyed_fields_never_reach_the_app() {
    let (_dir, app, tern) = started(CACHED);
    // A poisoner's fields: dropped on the way, so the entry is the same for everyone.
    let poisoned = tern.get_with(
        "/p",
        &[
            ("X-Forwarded-Host", "evil.test"),
            ("X-Original-URL", "/admin"),
            ("User-Agent", "evil"),
            ("Accept-Language", "xx"),
            ("Cookie", "_ga=GA1.2"),
        ],
    );
    assert!(
        poisoned.text().contains("ua=None lang=None cookie=None"),
        "{}",
        poisoned.text()
    );
    let head = &app.asked("/p")[0];
    for word in ["evil", "/admin", "_ga", "xx"] {
        assert!(!head.contains(word), "{word} reached the app: {head}");
    }
    let clean = tern.get("/p");
    assert_eq!(clean.text(), poisoned.text());

    // A session cookie or Authorization: to the app as they came, nothing stored.
    let own = tern.get_with("/p", &[("Cookie", "session=alice")]);
    assert!(own.text().contains("#2") && own.text().contains("session=alice"));
    assert_eq!(own.header("cache-status"), Some("tern; fwd=bypass"));
    let own = tern.get_with("/p", &[("Authorization", "Basic YTpi")]);
    assert!(own.text().contains("#3"), "{}", own.text());
    assert_eq!(
        tern.get("/p").text(),
        clean.text(),
        "no personal answer was stored"
    );
    assert_eq!(app.asked("/p").len(), 3);
}

#[test]
fn cache_override_keeps_what_the_app_says_not_to_for_the_routes_lifetime() {
    let (_dir, app, tern) = started(&format!(
        "{CACHED}\ncache_valid = {{ \"200\" = \"1m\" }}\ncache_override = true"
    ));
    let first = tern.get("/nocache");
    assert_eq!(first.header("cache-status"), Some("tern; fwd=miss"));
    let hit = tern.get("/nocache");
    assert_eq!(hit.header("cache-status"), Some("tern; hit"));
    assert_eq!(hit.body, first.body);
    // The app's fields go out as it sent them; only the cache reads them differently.
    assert_eq!(
        hit.header("cache-control"),
        Some("no-store, no-cache, must-revalidate")
    );
    // Set-Cookie still keeps an answer out, and a cookie still goes past.
    tern.get("/cookie");
    assert_eq!(
        tern.get("/cookie").header("cache-status"),
        Some("tern; fwd=miss")
    );
    let past = tern.get_with("/nocache", &[("Cookie", "session=1")]);
    assert_eq!(past.header("cache-status"), Some("tern; fwd=bypass"));
    assert_eq!(app.asked("/nocache").len(), 2);
    // Without the override the same page is never stored.
    let (_dir, app, tern) = started(&format!("{CACHED}\ncache_valid = {{ \"200\" = \"1m\" }}"));
    tern.get("/nocache");
    assert_eq!(
        tern.get("/nocache").header("cache-status"),
        Some("tern; fwd=miss")
    );
    assert_eq!(app.asked("/nocache").len(), 2);
}

#[test]
fn the_access_log_says_what_the_cache_made_of_each_request() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start();
    let log = dir.path().join("access.log");
    let conf = config(
        dir.path(),
        &app,
        &format!("{CACHED}{METRICS}"),
        &format!(
            "access_log = \"{}\"\naccess_log_format = \"json\"\n\
             [cache.main]\nmemory = \"4M\"\nmax_object = \"256K\"\n",
            log.display()
        ),
    );
    let tern = Tern::start_run(&conf);
    tern.get("/page");
    tern.get("/page");
    tern.get_with("/page", &[("Cookie", "session=1")]);
    tern.get_with("/page", &[("If-None-Match", "\"v1\"")]);
    tern.get("/validated");
    until_stale();
    let refreshed = tern.get("/validated");
    assert_eq!(
        refreshed.header("cache-status"),
        Some("tern; fwd=stale; fwd-status=304")
    );
    tern.get("/metrics");
    let mut lines = Vec::new();
    assert!(
        eventually(Duration::from_secs(5), || {
            lines = std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .collect();
            lines.len() >= 7
        }),
        "{} lines",
        lines.len()
    );
    let seen: Vec<(String, u64, Option<&str>)> = lines
        .iter()
        .map(|l| {
            (
                l["target"].as_str().unwrap().to_owned(),
                l["status"].as_u64().unwrap(),
                l.get("cache").map(|c| c.as_str().unwrap()),
            )
        })
        .collect();
    let want = [
        ("/page", 200, Some("MISS")),
        ("/page", 200, Some("HIT")),
        ("/page", 200, Some("BYPASS")),
        ("/page", 304, Some("HIT")),
        ("/validated", 200, Some("MISS")),
        ("/validated", 200, Some("REVALIDATED")),
        ("/metrics", 200, None),
    ];
    let want: Vec<(String, u64, Option<&str>)> = want
        .iter()
        .map(|(t, s, c)| (t.to_string(), *s, *c))
        .collect();
    assert_eq!(seen, want);
}

#[test]
fn a_hit_is_compressed_once_per_coding_and_the_copy_kept_in_the_caches_memory() {
    let (_dir, app, tern) = started(&format!("{CACHED}\ncompress = [\"gzip\", \"br\"]{METRICS}"));
    let memory = || {
        let page = tern.get("/metrics").text();
        series_value(&page, "tern_cache_memory_bytes{cache=\"main\"}")
    };
    let plain = tern.get("/article");
    assert_eq!(plain.header("content-encoding"), None);
    let stored = memory();
    let gzip = [("Accept-Encoding", "gzip")];
    let first = tern.get_with("/article", &gzip);
    assert_eq!(
        (
            first.header("content-encoding"),
            first.header("cache-status")
        ),
        (Some("gzip"), Some("tern; hit"))
    );
    assert_eq!(first.header("vary"), Some("Accept-Encoding"));
    let mut back = Vec::new();
    flate2::read::GzDecoder::new(&first.body[..])
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back, plain.body);
    let with_gzip = memory();
    assert!(
        with_gzip > stored && with_gzip < stored + plain.body.len() as f64,
        "the gzip copy is kept: {stored} -> {with_gzip}"
    );
    // The next gzip hit is the kept copy; a brotli one adds its own.
    assert_eq!(tern.get_with("/article", &gzip).body, first.body);
    assert_eq!(memory(), with_gzip);
    let br = tern.get_with("/article", &[("Accept-Encoding", "br")]);
    assert_eq!(br.header("content-encoding"), Some("br"));
    assert!(memory() > with_gzip);
    // A range is never a copy.
    let part = tern.get_with(
        "/article",
        &[("Accept-Encoding", "gzip"), ("Range", "bytes=0-9")],
    );
    assert_eq!((part.status, part.body.len()), (206, 10));
    assert_eq!(app.asked("/article").len(), 1);
}

#[test]
fn a_flood_of_distinct_keys_keeps_memory_within_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start();
    let conf = config(
        dir.path(),
        &app,
        &format!("{CACHED}{METRICS}"),
        "[cache.main]\nmemory = \"256K\"\nmax_object = \"16K\"\n",
    );
    let tern = Tern::start_run(&conf);
    let mut client = tern.client();
    for i in 0..3000 {
        let r = client.get(&format!("/page?flood={i}"), &[]);
        assert_eq!(r.status, 200);
    }
    let page = tern.get("/metrics").text();
    let bytes = series_value(&page, "tern_cache_memory_bytes{cache=\"main\"}");
    let stored = series_value(&page, "tern_cache_stored_total{cache=\"main\"}");
    let evicted = series_value(&page, "tern_cache_evictions_total{cache=\"main\"}");
    assert_eq!(stored, 3000.0);
    assert!(evicted > 1000.0, "{evicted}");
    assert!(bytes <= (256 * 1024) as f64, "{bytes} bytes held");
    assert!(bytes > (64 * 1024) as f64, "it is used: {bytes}");
    assert_eq!(app.asked("/page?flood=2999").len(), 1);
}

#[test]
fn a_successful_post_drops_its_target() {
    let (_dir, app, tern) = started(CACHED);
    assert!(tern.get("/doc").text().contains("#1"));
    assert!(tern.get("/doc").text().contains("#1"));
    let post = tern
        .client()
        .request("POST", "/doc", &[("Content-Length", "0")]);
    assert_eq!(post.status, 200);
    assert!(
        tern.get("/doc").text().starts_with("GET /doc #3"),
        "refetched after the POST (#2 was the POST)"
    );
    assert_eq!(app.asked("/doc").len(), 3);
}

#[test]
fn check_names_the_lines_of_wrong_cache_keys() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start();
    let conf = config(
        dir.path(),
        &app,
        "cache = \"nope\"\ncache_key_query = \"some\"\ncache_valid = { \"200 500\" = \"10m\" }\n\
         cache_key_headers = [\"Cookie\"]",
        "[cache.main]\nmemory = \"lots\"\n",
    );
    let out = check(&conf);
    assert!(!out.status.success());
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    for needle in [
        "cache \"nope\" has no [cache.nope] block",
        "cache_key_query \"some\"",
        "\"500\" is not a status that is stored",
        "Cookie is a credential",
        "[cache.main] is not used: no route has cache = \"main\"",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    assert!(
        text.contains("line 12: cache \"nope\""),
        "lines are named:\n{text}"
    );
    // The lock time and stale windows of a cache a route uses.
    let conf = config(
        dir.path(),
        &app,
        "cache = \"main\"",
        "[cache.main]\nmemory = \"4M\"\nlock = \"soon\"\nstale_if_error = \"later\"\n",
    );
    let out = check(&conf);
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("line 3: lock \"soon\": a duration"), "{text}");
    assert!(
        text.contains("line 4: stale_if_error \"later\": a duration"),
        "{text}"
    );
    // A folder: absolute, and for bodies larger than memory keeps.
    for (block, needle) in [
        (
            "disk = \"cache\"\n",
            "line 3: disk \"cache\": an absolute path",
        ),
        (
            "disk = \"/tmp/x\"\nmax_disk_object = \"1M\"\n",
            "line 4: max_disk_object (1048576 bytes) must be larger than max_object (1048576)",
        ),
        (
            "disk = \"/tmp/x\"\ndisk_size = \"4M\"\nmax_disk_object = \"2M\"\n",
            "line 5: max_disk_object (2097152 bytes) must be at most a quarter of disk_size",
        ),
        (
            "disk_size = \"1G\"\n",
            "line 3: disk_size and max_disk_object need a disk folder",
        ),
        (
            "disk = \"/tmp/x\"\ndisk_size = \"big\"\n",
            "line 4: disk_size \"big\": a size",
        ),
    ] {
        let conf = config(
            dir.path(),
            &app,
            "cache = \"main\"",
            &format!("[cache.main]\nmemory = \"64M\"\n{block}"),
        );
        let out = check(&conf);
        assert!(!out.status.success(), "{block}");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    let conf = config(dir.path(), &app, "cache = true\ncache_override = true", "");
    let out = check(&conf);
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        text.contains("line 11: cache_override needs cache_valid"),
        "{text}"
    );
}

#[test]
fn the_upstreams_date_counts_in_the_entrys_age() {
    let (_dir, app, tern) = started(CACHED);
    assert!(tern.get("/dated").text().contains("#1"));
    let hit = tern.get("/dated");
    assert!(hit.text().contains("#1"), "a hit: {}", hit.text());
    let age: u64 = hit.header("age").unwrap().parse().unwrap();
    assert!((50..=53).contains(&age), "Age {age}: now − Date, not 0");
    assert!(
        hit.header("date").is_some_and(|d| d != ago(50)),
        "tern's own Date"
    );
    // Stale by its Date when it came: not stored.
    assert!(tern.get("/stale").text().contains("#1"));
    assert!(tern.get("/stale").text().contains("#2"));
    assert_eq!(app.asked("/dated").len(), 1);
}

/// The value of one series on a /metrics page.
fn series_value(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{series} not on the page:\n{page}"))
}

#[test]
fn metrics_count_lookups_bypasses_refusals_and_memory() {
    let metrics_route = "\n[[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n";
    let (_dir, _app, tern) = started(&format!("{CACHED}{metrics_route}"));
    tern.get("/page");
    tern.get("/page");
    tern.get_with("/page", &[("If-None-Match", "\"v1\"")]);
    tern.get_with("/page", &[("Cookie", "session=1")]);
    tern.get("/private");
    tern.client().request("POST", "/page", &[]);
    let page = tern.get("/metrics").text();
    promtool_accepts("/metrics with a cache", &page);
    let value = |series: &str| series_value(&page, series);
    let c = "cache=\"main\"";
    assert_eq!(
        value(&format!("tern_cache_lookups_total{{result=\"hit\",{c}}}")),
        2.0
    );
    assert_eq!(
        value(&format!(
            "tern_cache_lookups_total{{result=\"not_modified\",{c}}}"
        )),
        1.0
    );
    assert_eq!(
        value(&format!("tern_cache_lookups_total{{result=\"miss\",{c}}}")),
        2.0
    );
    assert_eq!(
        value(&format!(
            "tern_cache_bypassed_total{{cause=\"cookie\",{c}}}"
        )),
        1.0
    );
    assert_eq!(
        value(&format!(
            "tern_cache_uncacheable_total{{cause=\"private\",{c}}}"
        )),
        1.0
    );
    assert_eq!(value(&format!("tern_cache_stored_total{{{c}}}")), 1.0);
    assert_eq!(
        value(&format!("tern_cache_invalidations_total{{{c}}}")),
        1.0
    );
    assert_eq!(
        value(&format!("tern_cache_entries{{{c}}}")),
        0.0,
        "the POST dropped it"
    );
    assert!(page.contains("tern_cache_memory_bytes{cache=\"main\"}"));
}

const METRICS: &str = "\n[[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n";

/// A cache whose bodies over 256 KiB go to `folder` (at most 2 MiB each, 8 MiB in all).
fn started_with_folder(folder: &Path) -> (tempfile::TempDir, App, Tern) {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start();
    let blocks = format!(
        "[cache.main]\nmemory = \"4M\"\nmax_object = \"256K\"\ndisk = \"{}\"\n\
         disk_size = \"8M\"\nmax_disk_object = \"2M\"\n",
        folder.display()
    );
    let conf = config(dir.path(), &app, &format!("{CACHED}{METRICS}"), &blocks);
    (dir, app, Tern::start_run(&conf))
}

/// A GET whose answer may come chunked (a miss relayed as the app sent it).
fn get_any(tern: &Tern, path: &str) -> Resp {
    let mut c = tern.client();
    c.chunked_ok = true;
    c.get(path, &[])
}

/// The body files in a cache folder, with their lengths.
fn body_files(folder: &Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut files: Vec<_> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (e.path(), e.metadata().unwrap().len())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn bodies_over_max_object_are_kept_in_the_cache_folder_and_sent_from_it() {
    let folder_dir = tempfile::tempdir().unwrap();
    let folder = folder_dir.path().join("bodies");
    let (_dir, app, tern) = started_with_folder(&folder);
    let big = vec![b'b'; 300 * 1024];
    let first = tern.get("/big");
    assert_eq!(
        (first.status, first.header("cache-status")),
        (200, Some("tern; fwd=miss"))
    );
    assert_eq!(first.body, big);
    let files = body_files(&folder);
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0].1, 300 * 1024);
    assert!(files[0]
        .0
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("body-"));
    let hit = tern.get("/big");
    assert_eq!(
        (hit.status, hit.header("cache-status")),
        (200, Some("tern; hit"))
    );
    assert_eq!(hit.body, big);
    // A range of it, from the file.
    let part = tern.get_with("/big", &[("Range", "bytes=1000-1099")]);
    assert_eq!(part.status, 206);
    assert_eq!(part.header("content-range"), Some("bytes 1000-1099/307200"));
    assert_eq!(part.body, vec![b'b'; 100]);
    // A body with no length up front moves to the folder when it outgrows memory's limit.
    let chunked = get_any(&tern, "/chunked-big");
    assert_eq!(chunked.body, vec![b'c'; 600 * 1024]);
    let again = get_any(&tern, "/chunked-big");
    assert_eq!(
        (again.header("cache-status"), again.body.len()),
        (Some("tern; hit"), 600 * 1024)
    );
    assert_eq!(app.asked("/big").len(), 1);
    assert_eq!(app.asked("/chunked-big").len(), 1);
    let page = tern.get("/metrics").text();
    promtool_accepts("/metrics with a cache folder", &page);
    assert_eq!(
        series_value(&page, "tern_cache_disk_bytes{cache=\"main\"}"),
        (900 * 1024) as f64
    );
    assert_eq!(
        series_value(&page, "tern_cache_entries{cache=\"main\"}"),
        2.0
    );
    assert!(
        series_value(&page, "tern_cache_memory_bytes{cache=\"main\"}") < (64 * 1024) as f64,
        "the bodies are not in memory"
    );
    // A successful POST drops the entry, and its file goes with it.
    tern.client().request("POST", "/big", &[]);
    assert_eq!(body_files(&folder).len(), 1);
    let page = tern.get("/metrics").text();
    assert_eq!(
        series_value(&page, "tern_cache_disk_bytes{cache=\"main\"}"),
        (600 * 1024) as f64
    );
}

#[test]
fn a_body_file_cut_short_is_never_sent_and_the_app_answers_instead() {
    let folder_dir = tempfile::tempdir().unwrap();
    let folder = folder_dir.path().join("bodies");
    let (_dir, app, tern) = started_with_folder(&folder);
    tern.get("/big");
    let files = body_files(&folder);
    assert_eq!(files.len(), 1);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&files[0].0)
        .unwrap()
        .set_len(1000)
        .unwrap();
    let answer = tern.get("/big");
    assert_eq!(
        (answer.status, answer.header("cache-status")),
        (200, Some("tern; fwd=miss"))
    );
    assert_eq!(answer.body, vec![b'b'; 300 * 1024], "the app's whole body");
    assert_eq!(app.asked("/big").len(), 2);
    // Stored anew, in a new file.
    let hit = tern.get("/big");
    assert_eq!(
        (hit.header("cache-status"), hit.body.len()),
        (Some("tern; hit"), 300 * 1024)
    );
    let page = tern.get("/metrics").text();
    assert_eq!(
        series_value(
            &page,
            "tern_cache_disk_errors_total{op=\"read\",cache=\"main\"}"
        ),
        1.0
    );
    assert_eq!(tern.log_lines("no longer holds its 307200 bytes").len(), 1);
}

#[test]
fn a_full_cache_folder_sends_the_answer_unstored_and_counts_it() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to mount a small file system");
        return;
    }
    let folder_dir = tempfile::tempdir().unwrap();
    let folder = folder_dir.path().join("bodies");
    std::fs::create_dir(&folder).unwrap();
    // 400 KiB: one 300 KiB body fits, the second does not.
    let mounted = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=400k,mode=0700",
            "tern-test-cache",
        ])
        .arg(&folder)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a tmpfs on {}", folder.display());
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&folder);
    let (_dir, app, tern) = started_with_folder(&folder);
    assert_eq!(tern.get("/big").body.len(), 300 * 1024);
    assert_eq!(tern.get("/big").header("cache-status"), Some("tern; hit"));
    // The folder is full before this one's end: it is sent whole, not stored.
    let full = get_any(&tern, "/chunked-big");
    assert_eq!(
        (full.status, full.header("cache-status")),
        (200, Some("tern; fwd=miss"))
    );
    assert_eq!(full.body, vec![b'c'; 600 * 1024]);
    let again = get_any(&tern, "/chunked-big");
    assert_eq!(again.body, vec![b'c'; 600 * 1024]);
    assert_eq!(again.header("cache-status"), Some("tern; fwd=miss"));
    assert_eq!(app.asked("/chunked-big").len(), 2);
    // Nothing of the failed writes is left, and the stored body still answers.
    assert_eq!(body_files(&folder).len(), 1);
    assert_eq!(tern.get("/big").header("cache-status"), Some("tern; hit"));
    let page = tern.get("/metrics").text();
    assert_eq!(
        series_value(
            &page,
            "tern_cache_disk_errors_total{op=\"write\",cache=\"main\"}"
        ),
        2.0
    );
    assert_eq!(tern.log_lines("No space left on device").len(), 2);
}

/// `n` clients, each on its own connection and thread, GET `path`; their answers once all
/// came.
fn many_get(tern: &Tern, n: usize, path: &'static str) -> std::thread::JoinHandle<Vec<Resp>> {
    let addr = tern.addr();
    std::thread::spawn(move || {
        let clients: Vec<_> = (0..n)
            .map(|_| {
                std::thread::spawn(move || {
                    // They are answered only once all are in and the app is let go.
                    let mut c = Client::connect(addr).read_timeout(Duration::from_secs(30));
                    c.get(path, &[])
                })
            })
            .collect();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    })
}

/// `tern cache purge --control CONTROL ARGS...`: whether it succeeded, and what it printed.
fn purge(control: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(TERN)
        .args(["cache", "purge", "--control"])
        .arg(control)
        .args(args)
        .output()
        .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

#[test]
fn tern_cache_purge_drops_entries_by_url_prefix_tag_and_all_through_the_control_socket() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start();
    let control = dir.path().join("control.sock");
    let metrics_route = "\n[[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n";
    let conf = config(
        dir.path(),
        &app,
        &format!("{CACHED}{metrics_route}"),
        &format!(
            "control = \"{}\"\n[cache.main]\nmemory = \"4M\"\nmax_object = \"256K\"\n",
            control.display()
        ),
    );
    let tern = Tern::start_run(&conf);
    let status = |path: &str| tern.get(path).header("cache-status").map(str::to_owned);
    let miss = Some("tern; fwd=miss".to_owned());
    let hit = Some("tern; hit".to_owned());
    let paths = [
        "/page",
        "/page?a=1",
        "/blog/a",
        "/blog/b",
        "/tagged/x",
        "/tagged/y",
    ];
    for path in paths {
        let first = tern.get(path);
        assert_eq!(
            first.header("cache-status"),
            Some("tern; fwd=miss"),
            "{path}"
        );
        // The app's tags are for purging: neither the answer that filled the entry nor a hit
        // carries them.
        assert_eq!(first.header("cache-tag"), None, "{path}");
        assert_eq!(first.header("surrogate-key"), None, "{path}");
        let again = tern.get(path);
        assert_eq!(again.header("cache-status"), Some("tern; hit"), "{path}");
        assert_eq!(again.header("cache-tag"), None, "{path}");
    }

    // A URL: each query of its path (the host and path as a request for them is keyed).
    let (ok, out) = purge(&control, &["http://TEST./a/../page"]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "purged 2 entries (main: 2)");
    assert_eq!(status("/page"), miss);
    assert_eq!(status("/page?a=1"), miss);
    assert_eq!(status("/blog/a"), hit, "other paths stay");
    // A URL with a query: that query's entries only.
    let (ok, out) = purge(&control, &["http://test/page?a=1"]);
    assert!(ok && out.contains("purged 1 entry"), "{out}");
    assert_eq!(status("/page"), hit);
    assert_eq!(status("/page?a=1"), miss);
    // Another host's entries are not this one's.
    let (ok, out) = purge(&control, &["http://other.test/page"]);
    assert!(ok && out.contains("purged 0 entries"), "{out}");

    // A prefix, on this host or (a path alone) on every host.
    let (ok, out) = purge(&control, &["--prefix", "http://test/blog/"]);
    assert!(ok && out.contains("purged 2 entries"), "{out}");
    assert_eq!(status("/blog/a"), miss);
    let (ok, out) = purge(&control, &["--prefix", "/blog/", "--cache", "main"]);
    assert!(ok && out.contains("purged 1 entry"), "{out}");
    assert_eq!(status("/blog/a"), miss);

    // A tag, from either field.
    assert_eq!(status("/tagged/x"), hit);
    let (ok, out) = purge(&control, &["--tag", "home"]);
    assert!(ok && out.contains("purged 2 entries"), "{out}");
    assert_eq!(status("/tagged/x"), miss);
    let (ok, out) = purge(&control, &["--tag", "product-42"]);
    assert!(ok && out.contains("purged 1 entry"), "{out}");

    // Everything.
    let (ok, out) = purge(&control, &["--all"]);
    assert!(ok && !out.contains("purged 0 "), "{out}");
    for path in paths {
        assert_eq!(status(path), miss, "{path}");
    }

    // Mistakes are errors, and purge nothing.
    let (ok, out) = purge(&control, &["--all", "--cache", "nope"]);
    assert!(
        !ok && out.contains("no cache named \"nope\" (this server has: main)"),
        "{out}"
    );
    let (ok, out) = purge(&control, &["http://test/%00"]);
    assert!(
        !ok && out.contains("no request could have this path"),
        "{out}"
    );
    let (ok, out) = purge(&control, &["test/page"]);
    assert!(!ok && out.contains("not an http"), "{out}");
    let (ok, _) = purge(&control, &["--tag", "a b"]);
    assert!(!ok);
    assert_eq!(status("/page"), hit);

    let page = tern.get("/metrics").text();
    promtool_accepts("/metrics after purges", &page);
    let value = |series: &str| series_value(&page, series);
    // Eight purges ran (the mistakes purged nothing): 2+1+0 by URL, 2+1 by prefix, 2+1 by
    // tag, and the 3 entries there were at --all.
    assert_eq!(value("tern_cache_purges_total{cache=\"main\"}"), 8.0);
    assert_eq!(value("tern_cache_purged_total{cache=\"main\"}"), 12.0);
}

#[test]
fn tern_cache_purge_without_a_server_says_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control.sock");
    let (ok, out) = purge(&control, &["--all"]);
    assert!(!ok);
    assert!(
        out.contains("cannot reach a server's control socket at"),
        "{out}"
    );
    let (ok, out) = purge(&control, &[]);
    assert!(
        !ok && out.contains("required"),
        "one of URL, --prefix, --tag, --all: {out}"
    );
}

#[test]
fn a_second_server_on_one_control_socket_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start();
    let control = dir.path().join("control.sock");
    let conf = config(
        dir.path(),
        &app,
        CACHED,
        &format!(
            "control = \"{}\"\n[cache.main]\nmemory = \"4M\"\n",
            control.display()
        ),
    );
    let _first = Tern::start_run(&conf);
    let out = Command::new(TERN)
        .args(["run", "--listen", "127.0.0.1:0", "--config"])
        .arg(&conf)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another server answers on it"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

#[test]
fn concurrent_misses_for_one_key_make_one_request_to_the_app() {
    const CLIENTS: usize = 200;
    // A lock time far longer than the test: here nobody may give up waiting.
    let (_dir, app, tern) = started_with(&format!("{CACHED}{METRICS}"), "lock = \"10m\"\n");
    let answers = many_get(&tern, CLIENTS, "/slow");
    // Every client's request is in: one reached the app (held at its gate), the others
    // wait for its fill.
    let waits = "tern_cache_waits_total{cache=\"main\"}";
    assert!(
        eventually(Duration::from_secs(30), || tern.metric(waits)
            == CLIENTS as u64 - 1),
        "waiters: {}",
        tern.metric(waits)
    );
    assert_eq!(app.asked("/slow").len(), 1);
    app.gate.open();
    let answers = answers.join().unwrap();
    assert_eq!(answers.len(), CLIENTS);
    for a in &answers {
        assert_eq!(a.status, 200, "{}", a.text());
        assert!(a.text().starts_with("GET /slow #1 "), "{}", a.text());
    }
    let mut statuses: HashMap<String, usize> = HashMap::new();
    for a in &answers {
        let status = a.header("cache-status").unwrap_or("none").to_string();
        *statuses.entry(status).or_default() += 1;
    }
    assert_eq!(
        statuses.get("tern; hit; detail=coalesced").copied(),
        Some(CLIENTS - 1),
        "{statuses:?}\n{}",
        tern.get("/metrics").text()
    );
    assert_eq!(app.asked("/slow").len(), 1, "one request reached the app");
    assert_eq!(
        tern.metric("tern_cache_coalesced_total{cache=\"main\"}"),
        CLIENTS as u64 - 1
    );
    assert_eq!(
        tern.metric("tern_cache_lock_timeouts_total{cache=\"main\"}"),
        0
    );
    promtool_accepts("/metrics with waiters", &tern.get("/metrics").text());
}

#[test]
fn past_the_lock_time_waiters_go_to_the_app_uncached() {
    const CLIENTS: usize = 20;
    let (_dir, app, tern) = started_with(&format!("{CACHED}{METRICS}"), "lock = \"300ms\"\n");
    let answers = many_get(&tern, CLIENTS, "/slow");
    // The app holds every request: past the lock time each waiter asked it itself.
    assert!(
        eventually(Duration::from_secs(30), || app.asked("/slow").len()
            == CLIENTS),
        "asked {} times",
        app.asked("/slow").len()
    );
    assert_eq!(
        tern.metric("tern_cache_lock_timeouts_total{cache=\"main\"}"),
        CLIENTS as u64 - 1
    );
    app.gate.open();
    let answers = answers.join().unwrap();
    assert!(answers
        .iter()
        .all(|a| a.status == 200 && a.header("cache-status") == Some("tern; fwd=miss")));
    // Only the fill's answer was stored: the next request is a hit on it.
    let hit = tern.get("/slow");
    assert_eq!(hit.header("cache-status"), Some("tern; hit"));
    assert_eq!(tern.metric("tern_cache_stored_total{cache=\"main\"}"), 1);
    assert_eq!(tern.metric("tern_cache_coalesced_total{cache=\"main\"}"), 0);
}

/// Past a one-second lifetime by the server's clock (which counts whole seconds).
fn until_stale() {
    std::thread::sleep(Duration::from_millis(2100));
}

#[test]
fn a_stale_entry_answers_while_one_request_refreshes_it() {
    let (_dir, app, tern) = started_with(
        &format!("{CACHED}{METRICS}"),
        "stale_while_updating = \"1m\"\n",
    );
    assert!(tern.get("/held").text().starts_with("GET /held #1 "));
    until_stale();
    let addr = tern.addr();
    let refresh = std::thread::spawn(move || Client::connect(addr).get("/held", &[]));
    assert!(
        eventually(Duration::from_secs(10), || app.asked("/held").len() == 2),
        "the refresh reached the app"
    );
    // While the app holds the refresh: the stale entry, at once.
    let stale = tern.get("/held");
    assert!(
        stale.text().starts_with("GET /held #1 "),
        "{}",
        stale.text()
    );
    assert_eq!(
        stale.header("cache-status"),
        Some("tern; hit; detail=stale")
    );
    assert!(stale
        .header("age")
        .is_some_and(|a| a.parse::<u64>().unwrap() >= 2));
    app.gate.open();
    let refreshed = refresh.join().unwrap();
    assert!(
        refreshed.text().starts_with("GET /held #2 "),
        "{}",
        refreshed.text()
    );
    assert_eq!(refreshed.header("cache-status"), Some("tern; fwd=stale"));
    let hit = tern.get("/held");
    assert!(hit.text().starts_with("GET /held #2 "));
    assert_eq!(hit.header("cache-status"), Some("tern; hit"));
    assert_eq!(app.asked("/held").len(), 2);
    assert_eq!(
        tern.metric("tern_cache_stale_served_total{reason=\"updating\",cache=\"main\"}"),
        1
    );
}

#[test]
fn a_stale_entry_answers_when_the_app_fails() {
    let (_dir, app, tern) =
        started_with(&format!("{CACHED}{METRICS}"), "stale_if_error = \"1h\"\n");
    assert!(tern.get("/flaky").text().starts_with("GET /flaky #1 "));
    until_stale();
    let rescued = tern.get("/flaky");
    assert_eq!(rescued.status, 200);
    assert!(
        rescued.text().starts_with("GET /flaky #1 "),
        "{}",
        rescued.text()
    );
    assert_eq!(
        rescued.header("cache-status"),
        Some("tern; fwd=stale; detail=stale-if-error")
    );
    assert_eq!(
        app.asked("/flaky").len(),
        2,
        "the app was asked, and failed"
    );
    assert_eq!(
        tern.metric("tern_cache_stale_served_total{reason=\"error\",cache=\"main\"}"),
        1
    );
    // Without a window the failure is the answer.
    let (_dir, _app, tern) = started(CACHED);
    tern.get("/flaky");
    until_stale();
    assert_eq!(tern.get("/flaky").status, 500);
}

#[test]
fn a_stale_entry_is_revalidated_with_the_app() {
    let (_dir, app, tern) = started(&format!("{CACHED}{METRICS}"));
    assert!(tern
        .get("/validated")
        .text()
        .starts_with("GET /validated #1 "));
    until_stale();
    let refreshed = tern.get("/validated");
    assert_eq!(refreshed.status, 200);
    assert!(
        refreshed.text().starts_with("GET /validated #1 "),
        "{}",
        refreshed.text()
    );
    assert_eq!(
        refreshed.header("cache-status"),
        Some("tern; fwd=stale; fwd-status=304")
    );
    let asked = app.asked("/validated");
    assert_eq!(asked.len(), 2);
    assert!(asked[1].contains("If-None-Match: \"v7\""), "{}", asked[1]);
    // Fresh for a minute now.
    until_stale();
    let hit = tern.get("/validated");
    assert_eq!(hit.header("cache-status"), Some("tern; hit"));
    assert!(hit.text().starts_with("GET /validated #1 "));
    assert_eq!(app.asked("/validated").len(), 2);
    assert_eq!(
        tern.metric("tern_cache_revalidated_total{cache=\"main\"}"),
        1
    );
}

#[test]
fn a_fill_whose_connection_panicked_is_taken_over_by_a_waiter() {
    let dir = tempfile::tempdir().unwrap();
    let app = App::start();
    let conf = config(
        dir.path(),
        &app,
        &format!("{CACHED}{METRICS}"),
        "[cache.main]\nmemory = \"4M\"\nlock = \"10m\"\n",
    );
    let mut cmd = Command::new(TERN);
    cmd.arg("run").arg("--config").arg(&conf);
    cmd.args(["--listen", "127.0.0.1:0", "--workers", "1"]);
    if std::env::var_os("TERN_TEST_SANDBOX").is_none_or(|v| v != "off") {
        cmd.args(["--sandbox", "on"]);
    }
    cmd.env("TERN_TEST_FAULTS", "1");
    let tern = Tern::spawn(cmd);
    // The fill, on an HTTP/2 connection, held by the app.
    let mut h2 = crate::h2_support::RawH2::connect(tern.addr(), &[]);
    h2.request(1, "GET", "/slow", &[], false);
    assert!(eventually(Duration::from_secs(10), || app
        .asked("/slow")
        .len()
        == 1));
    let addr = tern.addr();
    // The same key (the Host is part of it): it waits for the fill. The answer comes only
    // after the app is let go, so its client may wait longer than a read usually does.
    let waiter = std::thread::spawn(move || {
        let mut c = Client::connect(addr).read_timeout(Duration::from_secs(30));
        c.send(b"GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n");
        c.read_response(false)
    });
    let waits = "tern_cache_waits_total{cache=\"main\"}";
    assert!(eventually(Duration::from_secs(10), || tern.metric(waits) == 1));
    // A panic in that connection's code: it closes, its relay with it.
    h2.request(3, "GET", "/tern-test-fault/connection", &[], false);
    assert!(
        eventually(Duration::from_secs(10), || app.asked("/slow").len() == 2),
        "the waiter took the fill over"
    );
    app.gate.open();
    let answer = waiter.join().unwrap();
    assert!(
        answer.text().starts_with("GET /slow #2 "),
        "{}",
        answer.text()
    );
    assert_eq!(
        tern.metric("tern_cache_lock_timeouts_total{cache=\"main\"}"),
        0
    );
    let mut c = Client::connect(tern.addr());
    c.send(b"GET /slow HTTP/1.1\r\nHost: localhost\r\n\r\n");
    assert_eq!(
        c.read_response(false).header("cache-status"),
        Some("tern; hit")
    );
}

/// A PHP route's cache, with real PHP-FPM: scripts that count their runs (in `runs/`, outside
/// the root) and say what they were told. WordPress sends no lifetime of its own, so the
/// route gives one (`cache_valid`), as nginx's `fastcgi_cache_valid` micro-caching does.
struct PhpCached {
    _tmp: tempfile::TempDir,
    _fpm: crate::php_support::PhpFpm,
    tern: Tern,
}

const PHP_CACHED: &str =
    "cache = \"main\"\ncache_status = true\ncache_valid = { \"200\" = \"1m\" }\n\
     cache_bypass_cookies = [\"wordpress_logged_in_*\", \"comment_author_*\", \"wp-postpass_*\"]";

fn php_config(dir: &Path, socket: &Path) -> std::path::PathBuf {
    let www = dir.join("www");
    let runs = dir.join("runs");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::create_dir_all(&runs).unwrap();
    // Each script counts its runs in a file of its own and says what it was told.
    let counted = format!(
        "<?php $f = '{}/' . basename($_SERVER['SCRIPT_NAME']);\n\
         $n = (int) @file_get_contents($f) + 1; file_put_contents($f, $n);\n",
        runs.display()
    );
    let told = "echo 'run ', $n, ' uri=', $_SERVER['REQUEST_URI'], ' script=', \
                $_SERVER['SCRIPT_NAME'], ' ua=', $_SERVER['HTTP_USER_AGENT'] ?? '-', ' xfh=', \
                $_SERVER['HTTP_X_FORWARDED_HOST'] ?? '-', ' cookie=', \
                $_SERVER['HTTP_COOKIE'] ?? '-', ' proto=', $_SERVER['SERVER_PROTOCOL'], \"\\n\";\n";
    // Fresh for a second; then answers 304 to its validator.
    let validated = "if (($_SERVER['HTTP_IF_NONE_MATCH'] ?? '') === '\"v7\"') {\n\
                     http_response_code(304); header('Cache-Control: max-age=60');\n\
                     header('ETag: \"v7\"'); exit; }\n\
                     header('Cache-Control: max-age=1'); header('ETag: \"v7\"');\n";
    // Fresh for a second, then failing.
    let flaky = "if ($n > 1) { http_response_code(500); echo \"down\\n\"; exit; }\n\
                 header('Cache-Control: max-age=1');\n";
    // Answers once the test lets it (creates `runs/open`); PHP polls for it, bounded.
    let slow = format!(
        "for ($i = 0; $i < 3000 && !file_exists('{}/open'); $i++) usleep(10000);\n\
         header('Cache-Control: max-age=60');\n",
        runs.display()
    );
    for (name, more) in [
        ("slow.php", slow.as_str()),
        ("count.php", ""),
        ("index.php", ""),
        ("sets-cookie.php", "setcookie('seen', '1');\n"),
        ("validated.php", validated),
        ("flaky.php", flaky),
    ] {
        std::fs::write(www.join(name), format!("{counted}{more}{told}")).unwrap();
    }
    let conf = dir.join("tern.toml");
    std::fs::write(
        &conf,
        format!(
            "[cache.main]\nmemory = \"4M\"\nstale_if_error = \"1h\"\n\n[[site]]\nname = \"blog\"\nhosts = [\"blog.test\"]\n\
             default = true\n\n[[site.route]]\npath = \"/\"\nstatic = \"{}\"\n\
             fastcgi = \"unix:{}\"\ntry_files = [\"$uri\", \"$uri/\", \"/index.php\"]\n{PHP_CACHED}\n{METRICS}",
            www.display(),
            socket.display()
        ),
    )
    .unwrap();
    conf
}

/// `None` (skipped) without php-fpm.
fn php_cached() -> Option<PhpCached> {
    let tmp = tempfile::tempdir().unwrap();
    let fpm = crate::php_support::PhpFpm::start(tmp.path())?;
    let conf = php_config(tmp.path(), &fpm.socket);
    let tern = Tern::start_run(&conf);
    Some(PhpCached {
        _tmp: tmp,
        _fpm: fpm,
        tern,
    })
}

/// A PHP answer comes chunked from the app (it gives no length), whole from the cache.
fn php_request(tern: &Tern, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
    let mut c = tern.client();
    c.chunked_ok = true;
    c.request(method, path, headers)
}

#[test]
fn a_php_scripts_answer_is_cached_until_a_cookie_or_a_post_says_otherwise() {
    // Bound whole: the site and PHP-FPM live as long as the test.
    let Some(site) = php_cached() else {
        return;
    };
    let tern = &site.tern;
    let get = |path: &str, headers: &[(&str, &str)]| php_request(tern, "GET", path, headers);
    let first = get("/count.php", &[]);
    assert_eq!(first.status, 200, "{}", first.text());
    assert!(first.text().starts_with("run 1 "), "{}", first.text());
    assert_eq!(first.header("cache-status"), Some("tern; fwd=miss"));
    let second = get("/count.php", &[]);
    assert_eq!(second.text(), first.text(), "the script did not run again");
    assert_eq!(second.header("cache-status"), Some("tern; hit"));

    // Unkeyed fields never reach the script, and it is told HTTP/1.1 whatever the client
    // spoke: the same entry for everyone.
    let poisoned = get(
        "/count.php?x=1",
        &[("User-Agent", "evil"), ("X-Forwarded-Host", "evil.test")],
    );
    assert!(
        poisoned
            .text()
            .starts_with("run 2 uri=/count.php?x=1 script=/count.php ua=- "),
        "{}",
        poisoned.text()
    );
    assert!(!poisoned.text().contains("evil"), "{}", poisoned.text());
    assert!(poisoned.text().ends_with("proto=HTTP/1.1\n"));

    // Paths a front controller runs one script for are entries of their own.
    let a = get("/2024/hello-world/", &[]);
    let b = get("/2024/other-post/", &[]);
    assert!(
        a.text()
            .starts_with("run 1 uri=/2024/hello-world/ script=/index.php"),
        "{}",
        a.text()
    );
    assert!(
        b.text()
            .starts_with("run 2 uri=/2024/other-post/ script=/index.php"),
        "{}",
        b.text()
    );
    assert_eq!(get("/2024/hello-world/", &[]).text(), a.text());
    assert_eq!(get("/2024/other-post/", &[]).text(), b.text());

    // Logged in (WordPress's cookie): to the script as it came, and nothing stored.
    let own = get(
        "/count.php",
        &[("Cookie", "wordpress_logged_in_0123abcd=alice%7C1700000000")],
    );
    assert!(own.text().starts_with("run 3 "), "{}", own.text());
    assert!(own
        .text()
        .contains("cookie=wordpress_logged_in_0123abcd=alice"));
    assert_eq!(own.header("cache-status"), Some("tern; fwd=bypass"));
    assert_eq!(
        get("/count.php", &[]).text(),
        first.text(),
        "the entry stands"
    );

    // An answer that sets a cookie is never stored.
    for n in 1..=2 {
        let r = get("/sets-cookie.php", &[]);
        assert!(r.text().starts_with(&format!("run {n} ")), "{}", r.text());
        assert!(r
            .header("set-cookie")
            .is_some_and(|c| c.starts_with("seen=1")));
        assert_eq!(r.header("cache-status"), Some("tern; fwd=miss"));
    }

    // A POST runs the script and drops its entry.
    let post = php_request(tern, "POST", "/count.php", &[("Content-Length", "0")]);
    assert!(post.text().starts_with("run 4 "), "{}", post.text());
    let after = get("/count.php", &[]);
    assert!(after.text().starts_with("run 5 "), "{}", after.text());
    assert_eq!(after.header("cache-status"), Some("tern; fwd=miss"));
    assert_eq!(get("/count.php", &[]).text(), after.text());
}

#[test]
fn check_takes_the_cache_keys_on_a_php_route() {
    let dir = tempfile::tempdir().unwrap();
    let conf = php_config(dir.path(), &dir.path().join("php.sock"));
    let out = check(&conf);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The README's WordPress micro-caching example, in a site of its own.
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    let start = readme
        .find("[cache.wp]")
        .expect("the README's WordPress cache example");
    let example = &readme[start..start + readme[start..].find("```").unwrap()];
    let www = dir.path().join("www");
    let example = example
        .replace("/srv/wordpress", www.to_str().unwrap())
        .replace(
            "[[site.route]]",
            "[[site]]\nname = \"wp\"\nhosts = [\"wp.test\"]\n\n[[site.route]]",
        );
    let conf = dir.path().join("wp.toml");
    std::fs::write(&conf, example).unwrap();
    let out = check(&conf);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_php_scripts_stale_entry_is_revalidated_and_stands_in_when_php_fails() {
    let Some(site) = php_cached() else {
        return;
    };
    let tern = &site.tern;
    let get = |path: &str| php_request(tern, "GET", path, &[]);
    let first = get("/validated.php");
    assert!(first.text().starts_with("run 1 "), "{}", first.text());
    let flaky = get("/flaky.php");
    assert!(flaky.text().starts_with("run 1 "), "{}", flaky.text());
    until_stale();
    // The refresh asks the script with the entry's ETag (an HTTP_IF_NONE_MATCH parameter):
    // its 304 refreshes the entry, the client gets the whole answer.
    let refreshed = get("/validated.php");
    assert_eq!(refreshed.status, 200);
    assert_eq!(refreshed.text(), first.text());
    assert_eq!(
        refreshed.header("cache-status"),
        Some("tern; fwd=stale; fwd-status=304")
    );
    let runs = site._tmp.path().join("runs");
    let ran = |script: &str| std::fs::read_to_string(runs.join(script)).unwrap();
    assert_eq!(ran("validated.php"), "2", "the script was asked again");
    // PHP failing: the stale entry instead of its 500.
    let rescued = get("/flaky.php");
    assert_eq!(rescued.status, 200);
    assert_eq!(rescued.text(), flaky.text());
    assert_eq!(
        rescued.header("cache-status"),
        Some("tern; fwd=stale; detail=stale-if-error")
    );
    assert_eq!(ran("flaky.php"), "2", "PHP was asked, and failed");
}

#[test]
fn concurrent_misses_for_one_php_page_run_the_script_once() {
    const CLIENTS: usize = 20;
    let Some(site) = php_cached() else {
        return;
    };
    let addr = site.tern.addr();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).read_timeout(Duration::from_secs(30));
                c.chunked_ok = true;
                c.get("/slow.php", &[])
            })
        })
        .collect();
    // One ran the script (held until `open`), the others wait for its fill.
    let waits = "tern_cache_waits_total{cache=\"main\"}";
    assert!(
        eventually(Duration::from_secs(30), || site.tern.metric(waits)
            == CLIENTS as u64 - 1),
        "waiters: {}",
        site.tern.metric(waits)
    );
    let runs = site._tmp.path().join("runs");
    std::fs::write(runs.join("open"), "").unwrap();
    let answers: Vec<Resp> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    for a in &answers {
        assert_eq!(a.status, 200, "{}", a.text());
        assert!(a.text().starts_with("run 1 "), "{}", a.text());
    }
    let coalesced = answers
        .iter()
        .filter(|a| a.header("cache-status") == Some("tern; hit; detail=coalesced"))
        .count();
    assert_eq!(coalesced, CLIENTS - 1);
    assert_eq!(
        std::fs::read_to_string(runs.join("slow.php")).unwrap(),
        "1",
        "the script ran once"
    );
}
