//! The shared cache on a PHP route, with real PHP-FPM (`support/php.rs`): a HEAD answered
//! from a GET's entry while a HEAD that misses stores nothing; the lock time on a slow script
//! (concurrent misses wait for the one that runs it, then past `lock` run it themselves, their
//! answers not stored); and `/metrics` counting what the cache made of each request on the
//! route, read from the Prometheus text with exact values.
//!
//! Each script counts its runs in `runs/NAME` (outside the root), so a test knows how often
//! PHP ran it whatever tern says.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::php_support::PhpFpm;
use crate::support;
use support::*;

/// tern and PHP-FPM, for as long as the test holds it.
struct Php {
    tmp: tempfile::TempDir,
    _fpm: PhpFpm,
    tern: Tern,
}

impl Php {
    /// How many times `script` ran (0 if never).
    fn runs(&self, script: &str) -> u64 {
        std::fs::read_to_string(self.tmp.path().join("runs").join(script))
            .map_or(0, |n| n.trim().parse().unwrap())
    }

    /// Lets every run of `slow.php` (waiting or to come) answer.
    fn open(&self) {
        std::fs::write(self.tmp.path().join("runs").join("open"), "").unwrap();
    }

    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Resp {
        let mut c = self.tern.client();
        // A script's answer comes chunked from tern when PHP gives no length.
        c.chunked_ok = true;
        c.request(method, path, headers)
    }

    fn get(&self, path: &str) -> Resp {
        self.request("GET", path, &[])
    }

    fn head(&self, path: &str) -> Resp {
        self.request("HEAD", path, &[])
    }

    /// `/metrics`, parsed.
    fn metrics(&self) -> Metrics {
        let page = self.tern.get("/metrics").text();
        Metrics::parse(&page)
    }
}

/// A site whose only route runs PHP with a cache (`lock` its lock time), and `/metrics`.
/// `None` (skipped) without php-fpm.
fn started(lock: &str) -> Option<Php> {
    let tmp = tempfile::tempdir().unwrap();
    let fpm = PhpFpm::start(tmp.path())?;
    let conf = config(tmp.path(), &fpm.socket, lock);
    let tern = Tern::start_run(&conf);
    Some(Php {
        tmp,
        _fpm: fpm,
        tern,
    })
}

fn config(dir: &Path, socket: &Path, lock: &str) -> PathBuf {
    let www = dir.join("www");
    let runs = dir.join("runs");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::create_dir_all(&runs).unwrap();
    // Counted first, so a run shows in `runs/` as soon as PHP starts it; under a lock, as
    // runs may start together (waiters past the lock time), and renamed into place, so a
    // reader never sees a half-written count.
    let counted = format!(
        "<?php $f = '{}/' . basename($_SERVER['SCRIPT_NAME']);\n\
         $l = fopen($f . '.lock', 'c'); flock($l, LOCK_EX);\n\
         $n = (int) @file_get_contents($f) + 1;\n\
         file_put_contents($f . '.tmp', $n); rename($f . '.tmp', $f);\n\
         flock($l, LOCK_UN); fclose($l);\n\
         header('X-Run: ' . $n); header('X-Method: ' . $_SERVER['REQUEST_METHOD']);\n",
        runs.display()
    );
    let told = "echo 'run ', $n, ' ', $_SERVER['REQUEST_METHOD'], ' uri=', \
                $_SERVER['REQUEST_URI'], \"\\n\";\n";
    // Answers once the test creates `runs/open` (polled, 30 s at most).
    let slow = format!(
        "for ($i = 0; $i < 3000 && !file_exists('{}/open'); $i++) usleep(10000);\n",
        runs.display()
    );
    for (name, more) in [
        ("count.php", ""),
        ("slow.php", slow.as_str()),
        ("sets-cookie.php", "setcookie('seen', '1');\n"),
    ] {
        std::fs::write(www.join(name), format!("{counted}{more}{told}")).unwrap();
    }
    let conf = dir.join("tern.toml");
    std::fs::write(
        &conf,
        format!(
            "[cache.main]\nmemory = \"4M\"\nlock = \"{lock}\"\n\n\
             [[site]]\nname = \"blog\"\nhosts = [\"blog.test\"]\ndefault = true\n\n\
             [[site.route]]\npath = \"/\"\nstatic = \"{}\"\nfastcgi = \"unix:{}\"\n\
             try_files = [\"$uri\", \"$uri/\", \"/index.php\"]\n\
             cache = \"main\"\ncache_status = true\ncache_valid = {{ \"200\" = \"1m\" }}\n\
             cache_bypass_cookies = [\"wordpress_logged_in_*\"]\n\n\
             [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n",
            www.display(),
            socket.display()
        ),
    )
    .unwrap();
    conf
}

/// A Prometheus text page: each sample by its name and its labels (sorted), and the
/// families' declared types.
struct Metrics {
    samples: BTreeMap<(String, Vec<(String, String)>), f64>,
    types: BTreeMap<String, String>,
    page: String,
}

impl Metrics {
    fn parse(page: &str) -> Metrics {
        let mut samples = BTreeMap::new();
        let mut types = BTreeMap::new();
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                types.insert(name.to_owned(), kind.to_owned());
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            let (name, labels) = match series.split_once('{') {
                None => (series, Vec::new()),
                Some((name, rest)) => {
                    let inner = rest.strip_suffix('}').unwrap_or_else(|| panic!("{line}"));
                    let mut labels: Vec<(String, String)> = inner
                        .split(',')
                        .filter(|l| !l.is_empty())
                        .map(|l| {
                            let (k, v) = l.split_once('=').unwrap_or_else(|| panic!("{line}"));
                            (k.to_owned(), v.trim_matches('"').to_owned())
                        })
                        .collect();
                    labels.sort();
                    (name, labels)
                }
            };
            let old = samples.insert((name.to_owned(), labels), value);
            assert!(old.is_none(), "{line}: a sample twice");
        }
        Metrics {
            samples,
            types,
            page: page.to_owned(),
        }
    }

    /// The value of `name` on cache `main` with `labels` besides; panics if absent.
    fn cache(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let mut key: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        key.push(("cache".into(), "main".into()));
        key.sort();
        *self
            .samples
            .get(&(name.to_owned(), key))
            .unwrap_or_else(|| panic!("{name}{labels:?} not on the page:\n{}", self.page))
    }

    /// Every sample of `name` on cache `main`, by its other labels.
    fn all(&self, name: &str) -> BTreeMap<Vec<(String, String)>, f64> {
        self.samples
            .iter()
            .filter(|((n, labels), _)| {
                n == name && labels.iter().any(|(k, v)| k == "cache" && v == "main")
            })
            .map(|((_, labels), v)| {
                let rest = labels
                    .iter()
                    .filter(|(k, _)| k != "cache")
                    .cloned()
                    .collect();
                (rest, *v)
            })
            .collect()
    }
}

fn label(k: &str, v: &str) -> Vec<(String, String)> {
    vec![(k.to_owned(), v.to_owned())]
}

#[test]
fn a_head_is_answered_from_a_gets_entry_and_a_head_that_misses_stores_nothing() {
    let Some(php) = started("5s") else {
        return;
    };
    // HEAD first: PHP runs the script as HEAD, and nothing is stored.
    for n in 1..=2 {
        let head = php.head("/count.php");
        assert_eq!(head.status, 200);
        assert_eq!(
            head.header("cache-status"),
            Some("tern; fwd=miss"),
            "HEAD {n}"
        );
        assert_eq!(head.header("x-run"), Some(&*n.to_string()));
        assert_eq!(head.header("x-method"), Some("HEAD"));
        assert!(head.body.is_empty());
        assert_eq!(php.runs("count.php"), n);
    }
    assert_eq!(php.metrics().cache("tern_cache_stored_total", &[]), 0.0);
    // A GET fills the entry...
    let get = php.get("/count.php");
    assert_eq!(get.header("cache-status"), Some("tern; fwd=miss"));
    assert_eq!(get.text(), "run 3 GET uri=/count.php\n");
    assert_eq!(get.header("x-run"), Some("3"));
    // ...which answers a HEAD: the GET's head and length, no body, PHP not asked.
    let head = php.head("/count.php");
    assert_eq!(head.status, 200);
    assert_eq!(head.header("cache-status"), Some("tern; hit"));
    assert_eq!(head.header("x-run"), Some("3"));
    assert_eq!(head.header("x-method"), Some("GET"), "the GET's own head");
    assert_eq!(head.content_length(), Some(get.body.len() as u64));
    assert!(head.header("age").is_some());
    assert!(head.body.is_empty());
    assert_eq!(php.get("/count.php").text(), get.text());
    assert_eq!(php.runs("count.php"), 3);
    let m = php.metrics();
    assert_eq!(m.cache("tern_cache_stored_total", &[]), 1.0);
    assert_eq!(
        m.cache("tern_cache_lookups_total", &[("result", "hit")]),
        2.0
    );
    assert_eq!(
        m.cache("tern_cache_lookups_total", &[("result", "miss")]),
        3.0
    );

    // A HEAD while a GET runs the script: it waits for that fill, never starts one, and is
    // answered from the entry.
    let addr = php.tern.addr();
    let filler = std::thread::spawn(move || {
        let mut c = Client::connect(addr).read_timeout(Duration::from_secs(30));
        c.chunked_ok = true;
        c.get("/slow.php", &[])
    });
    assert!(
        eventually(Duration::from_secs(10), || php.runs("slow.php") == 1),
        "the GET reached PHP"
    );
    let waiter = std::thread::spawn(move || {
        let mut c = Client::connect(addr).read_timeout(Duration::from_secs(30));
        c.request("HEAD", "/slow.php", &[])
    });
    assert!(
        eventually(Duration::from_secs(10), || php
            .metrics()
            .cache("tern_cache_waits_total", &[])
            == 1.0),
        "the HEAD waits"
    );
    assert_eq!(php.runs("slow.php"), 1, "the HEAD did not run the script");
    php.open();
    let filled = filler.join().unwrap();
    assert_eq!(filled.text(), "run 1 GET uri=/slow.php\n");
    let head = waiter.join().unwrap();
    assert_eq!(
        (head.status, head.header("cache-status")),
        (200, Some("tern; hit; detail=coalesced"))
    );
    assert_eq!(head.content_length(), Some(filled.body.len() as u64));
    assert!(head.body.is_empty());
    assert_eq!(php.runs("slow.php"), 1);
}

#[test]
fn past_the_lock_time_waiting_misses_run_the_script_themselves_unstored() {
    const CLIENTS: usize = 3;
    const LOCK: Duration = Duration::from_secs(3);
    let Some(php) = started("3s") else {
        return;
    };
    let addr = php.tern.addr();
    let sent = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).read_timeout(Duration::from_secs(30));
                c.chunked_ok = true;
                c.get("/slow.php", &[])
            })
        })
        .collect();
    // One runs the script (held until `open`), the others wait for its fill, PHP not asked.
    assert!(
        eventually(Duration::from_secs(10), || php
            .metrics()
            .cache("tern_cache_waits_total", &[])
            == (CLIENTS - 1) as f64),
        "waiters"
    );
    let seen_waiting = sent.elapsed();
    assert!(
        seen_waiting < LOCK,
        "seen waiting only after {seen_waiting:?}"
    );
    assert_eq!(php.runs("slow.php"), 1, "the waiters did not run it");
    // Past the lock time each waiter runs the script itself.
    assert!(
        eventually(Duration::from_secs(20), || php.runs("slow.php")
            == CLIENTS as u64),
        "runs: {}",
        php.runs("slow.php")
    );
    let all_ran = sent.elapsed();
    assert!(
        all_ran >= LOCK,
        "the waiters went to PHP after {all_ran:?}, before the lock time"
    );
    let m = php.metrics();
    assert_eq!(
        m.cache("tern_cache_lock_timeouts_total", &[]),
        (CLIENTS - 1) as f64
    );
    php.open();
    let answers: Vec<Resp> = clients.into_iter().map(|c| c.join().unwrap()).collect();
    let mut runs: Vec<String> = answers
        .iter()
        .map(|a| {
            assert_eq!(a.status, 200);
            assert_eq!(
                a.header("cache-status"),
                Some("tern; fwd=miss"),
                "{}",
                a.text()
            );
            a.text()
        })
        .collect();
    runs.sort();
    assert_eq!(
        runs,
        [
            "run 1 GET uri=/slow.php\n",
            "run 2 GET uri=/slow.php\n",
            "run 3 GET uri=/slow.php\n"
        ]
    );
    // Only the fill that led was stored: the next request is a hit on run 1.
    let hit = php.get("/slow.php");
    assert_eq!(hit.header("cache-status"), Some("tern; hit"));
    assert_eq!(hit.text(), "run 1 GET uri=/slow.php\n");
    assert_eq!(php.runs("slow.php"), CLIENTS as u64);
    let m = php.metrics();
    assert_eq!(m.cache("tern_cache_stored_total", &[]), 1.0);
    assert_eq!(m.cache("tern_cache_coalesced_total", &[]), 0.0);
    assert_eq!(
        m.cache("tern_cache_lookups_total", &[("result", "hit")]),
        1.0
    );
}

#[test]
fn metrics_count_hits_misses_bypasses_and_stores_on_the_php_route() {
    let Some(php) = started("5s") else {
        return;
    };
    let status = |r: &Resp| r.header("cache-status").map(str::to_owned);
    let s = |v: &str| Some(v.to_owned());
    // Filled, then a hit (a cookie the route does not name is no reason to go past).
    assert_eq!(status(&php.get("/count.php")), s("tern; fwd=miss"));
    assert_eq!(status(&php.get("/count.php")), s("tern; hit"));
    let theme = php.request("GET", "/count.php", &[("Cookie", "theme=dark")]);
    assert_eq!(status(&theme), s("tern; hit"));
    assert_eq!(status(&php.get("/count.php?a=1")), s("tern; fwd=miss"));
    assert_eq!(status(&php.get("/count.php?a=1")), s("tern; hit"));
    // Past the cache: logged in, credentials, a body.
    let bypasses: &[&[(&str, &str)]] = &[
        &[("Cookie", "wordpress_logged_in_ab=alice")],
        &[("Authorization", "Basic YTpi")],
        &[("Content-Length", "3")],
    ];
    for headers in bypasses {
        let mut c = php.tern.client();
        c.chunked_ok = true;
        c.send(&request_bytes("GET", "/count.php", headers));
        if headers[0].0 == "Content-Length" {
            c.send(b"a=1");
        }
        let r = c.read_response(false);
        assert_eq!(r.status, 200, "{headers:?}");
        assert_eq!(status(&r), s("tern; fwd=bypass"), "{headers:?}");
    }
    // Never stored: an answer setting a cookie (twice), a HEAD that missed.
    for _ in 0..2 {
        assert_eq!(status(&php.get("/sets-cookie.php")), s("tern; fwd=miss"));
    }
    assert_eq!(status(&php.head("/count.php?b=1")), s("tern; fwd=miss"));
    // A POST drops the entry; the next GET fills it again, and a HEAD hits it.
    let post = php.request("POST", "/count.php", &[("Content-Length", "0")]);
    assert_eq!(post.status, 200);
    assert_eq!(status(&php.get("/count.php")), s("tern; fwd=miss"));
    assert_eq!(status(&php.head("/count.php")), s("tern; hit"));

    let page = php.tern.get("/metrics").text();
    promtool_accepts("/metrics with a PHP route's cache", &page);
    let m = Metrics::parse(&page);
    for family in [
        "tern_cache_lookups_total",
        "tern_cache_bypassed_total",
        "tern_cache_uncacheable_total",
        "tern_cache_stored_total",
        "tern_cache_invalidations_total",
    ] {
        assert_eq!(
            m.types.get(family).map(String::as_str),
            Some("counter"),
            "{family}"
        );
    }
    let lookups: BTreeMap<_, _> = [
        (label("result", "hit"), 4.0),
        (label("result", "miss"), 6.0),
        (label("result", "expired"), 0.0),
        (label("result", "not_modified"), 0.0),
    ]
    .into_iter()
    .collect();
    assert_eq!(m.all("tern_cache_lookups_total"), lookups);
    let bypassed: BTreeMap<_, _> = [
        (label("cause", "authorization"), 1.0),
        (label("cause", "body"), 1.0),
        (label("cause", "cookie"), 1.0),
        (label("cause", "identity"), 0.0),
        (label("cause", "method"), 0.0),
        (label("cause", "upgrade"), 0.0),
    ]
    .into_iter()
    .collect();
    assert_eq!(m.all("tern_cache_bypassed_total"), bypassed);
    let uncacheable = m.all("tern_cache_uncacheable_total");
    assert_eq!(uncacheable[&label("cause", "set_cookie")], 2.0);
    assert_eq!(
        uncacheable.values().sum::<f64>(),
        2.0,
        "nothing else refused: {uncacheable:?}"
    );
    assert_eq!(m.cache("tern_cache_stored_total", &[]), 3.0);
    assert_eq!(m.cache("tern_cache_invalidations_total", &[]), 1.0);
    assert_eq!(m.cache("tern_cache_entries", &[]), 2.0);
    assert_eq!(m.cache("tern_cache_waits_total", &[]), 0.0);
    // PHP ran what went past or was not stored, and each fill once.
    assert_eq!(php.runs("count.php"), 8);
    assert_eq!(php.runs("sets-cookie.php"), 2);
}
