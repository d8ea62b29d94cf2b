//! Every `/metrics` page tern serves is accepted by Prometheus's own linter, `promtool check
//! metrics` (counters end in `_total`, one HELP and TYPE per name, histograms well formed):
//! `tern run` with two sites, a proxy route and a counters route; `tern serve` with a gate (its
//! `/.tern-gate/metrics`); `tern demo`. The figures per site and route are checked too:
//! answers by class under each route's labels, the duration histograms, the upstream counters
//! of each proxy route's group, `/statusz`'s lines, and `--check`'s refusal of a bad route
//! `name`.
//!
//! promtool comes from Debian's prometheus package (`scripts/install-metrics-test-deps`, run by
//! `scripts/test-all`). Without it the test skips, except under CI (`CI` set), where it fails:
//! a check that silently did not run would pass for the wrong reason.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;
use std::time::Duration;

use crate::support;
use support::*;

/// The value of the sample `series` (name and labels as written) on a Prometheus page.
fn sample(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in\n{page}"))
        .parse()
        .unwrap()
}

/// One GET for `host` on a fresh connection.
fn get_for(tern: &Tern, host: &str, path: &str) -> Resp {
    let mut c = tern.client();
    c.send(format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes());
    c.read_response(false)
}

#[test]
fn tern_run_counts_answers_per_site_and_its_page_passes_promtool() {
    if !have_promtool() {
        return;
    }
    // The upstream of the proxy route: a real tern serving files.
    let upstream = Site::new();
    upstream.write("api/x.txt", "from the app\n");
    let app = upstream.start(&[]);

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("blog")).unwrap();
    std::fs::write(dir.path().join("blog/index.html"), "<p>blog</p>\n").unwrap();
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        format!(
            "[[site]]\nname = \"blog\"\nhosts = [\"blog.test\"]\n\n\
             [[site.route]]\npath = \"/\"\nstatic = \"blog\"\n\n\
             [[site]]\nname = \"shop\"\nhosts = [\"test\"]\n\n\
             [[site.route]]\npath = \"/api\"\nproxy = [\"{}\"]\n\n\
             [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n\n\
             [[site.route]]\npath = \"/statusz\"\ncounters = \"statusz\"\n",
            app.addr()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(TERN);
    cmd.arg("run").arg("--config").arg(&config);
    cmd.args(["--listen", "127.0.0.1:0", "--workers", "2"]);
    let tern = Tern::spawn(cmd);
    assert!(tern.line.starts_with("tern: running "), "{}", tern.line);

    assert_eq!(get_for(&tern, "blog.test", "/").status, 200);
    assert_eq!(get_for(&tern, "blog.test", "/index.html").status, 200);
    assert_eq!(get_for(&tern, "blog.test", "/missing").status, 404);
    let r = get_for(&tern, "test", "/api/x.txt");
    assert_eq!((r.status, r.text().as_str()), (200, "from the app\n"));
    assert_eq!(get_for(&tern, "test", "/api/none").status, 404);
    // A host no site serves: counted under no site.
    assert_eq!(get_for(&tern, "elsewhere.test", "/").status, 421);

    let page = tern.get("/metrics").text();
    promtool_accepts("tern run's /metrics", &page);
    // Answers by site, route and class (every answer so far was sent before this page was
    // asked): the blog's 404 is its static route's, the 421 no site's.
    for (series, want) in [
        (
            "tern_responses_total{site=\"blog\",route=\"/\",class=\"2xx\"}",
            2.0,
        ),
        (
            "tern_responses_total{site=\"blog\",route=\"/\",class=\"4xx\"}",
            1.0,
        ),
        (
            "tern_responses_total{site=\"blog\",route=\"\",class=\"4xx\"}",
            0.0,
        ),
        (
            "tern_responses_total{site=\"shop\",route=\"/api\",class=\"2xx\"}",
            1.0,
        ),
        (
            "tern_responses_total{site=\"shop\",route=\"/api\",class=\"4xx\"}",
            1.0,
        ),
        (
            "tern_responses_total{site=\"\",route=\"\",class=\"4xx\"}",
            1.0,
        ),
        (
            "tern_responses_total{site=\"blog\",route=\"/\",class=\"5xx\"}",
            0.0,
        ),
        (
            "tern_request_duration_seconds_count{site=\"blog\",route=\"/\"}",
            3.0,
        ),
        (
            "tern_request_duration_seconds_bucket{site=\"blog\",route=\"/\",le=\"+Inf\"}",
            3.0,
        ),
        (
            "tern_request_duration_seconds_count{site=\"shop\",route=\"/api\"}",
            2.0,
        ),
        (
            "tern_request_duration_seconds_count{site=\"\",route=\"\"}",
            1.0,
        ),
    ] {
        assert_eq!(sample(&page, series), want, "{series}");
    }
    // One upstream connection per worker at most (two workers, two proxied requests),
    // counted for the route's group.
    let connects = sample(
        &page,
        "tern_upstream_connects_total{upstream=\"shop /api\"}",
    );
    assert!((1.0..=2.0).contains(&connects), "{connects}");
    // Buckets are cumulative: never falling, ending at the count.
    let buckets: Vec<f64> = page
        .lines()
        .filter(|l| {
            l.starts_with("tern_request_duration_seconds_bucket{site=\"shop\",route=\"/api\"")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(buckets.len(), tern_server::DURATION_BUCKETS);
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    assert!(
        sample(
            &page,
            "tern_request_duration_seconds_sum{site=\"shop\",route=\"/api\"}"
        ) > 0.0
    );

    // /statusz: the same names and labels as plain lines, the histogram as its count and
    // sum, and each site's sums as the lines it had before routes had rows.
    let statusz = tern.get("/statusz").text();
    for line in [
        "responses{site=\"blog\",class=\"2xx\"}: 2",
        "responses{site=\"blog\",route=\"/\",class=\"2xx\"}: 2",
        "request_duration_seconds_count{site=\"blog\"}: 3",
        "request_duration_seconds_count{site=\"blog\",route=\"/\"}: 3",
        "timeouts{kind=\"header\"}: 0",
    ] {
        assert!(statusz.lines().any(|l| l == line), "{line}:\n{statusz}");
    }
    assert!(!statusz.contains("_bucket"), "{statusz}");
    assert!(!statusz.contains("_total"), "{statusz}");
}

/// An app for proxy routes: answers every request on a kept-alive connection with `body`,
/// after `delay`.
fn app(body: &'static str, delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                loop {
                    // The head, then the body it announces.
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body_in = vec![0; length];
                    if reader.read_exact(&mut body_in).is_err() {
                        return;
                    }
                    std::thread::sleep(delay);
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Two routes answered by tern itself and three proxy routes, one slow and one named: each
/// route's answers, histogram and upstream counters are its own, exactly.
#[test]
fn routes_have_their_own_answers_histograms_and_upstream_counters() {
    if !have_promtool() {
        return;
    }
    let slow = app("slow", Duration::from_millis(30));
    let api = app("api", Duration::ZERO);
    let other = app("other", Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        format!(
            "[[site]]\nname = \"app\"\nhosts = [\"app.test\"]\n\n\
             [[site.route]]\npath = \"/fast\"\nrespond = \"fast\"\nname = \"fast\"\n\n\
             [[site.route]]\npath = \"/gone\"\nrespond = \"gone\"\nstatus = 410\n\n\
             [[site.route]]\npath = \"/slow\"\nproxy = \"{slow}\"\n\n\
             [[site.route]]\npath = \"/api/\"\nproxy = \"{api}\"\n\n\
             [[site.route]]\npath = \"/other\"\nproxy = \"{other}\"\nname = \"other-app\"\n\
             health_check = {{ path = \"/health\", interval = 60 }}\n\n\
             [[site]]\nname = \"ops\"\nhosts = [\"ops.test\"]\n\n\
             [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n\n\
             [[site.route]]\npath = \"/statusz\"\ncounters = \"statusz\"\n"
        ),
    )
    .unwrap();
    let tern = Tern::start_run_workers(&config, 2);
    assert!(tern.line.starts_with("tern: running "), "{}", tern.line);

    // One client connection, so one worker and its pool: each group connects once, then
    // reuses its connection.
    let mut c = tern.client();
    let mut ask = |path: &str| {
        c.send(format!("GET {path} HTTP/1.1\r\nHost: app.test\r\n\r\n").as_bytes());
        let r = c.read_response(false);
        (r.status, r.text())
    };
    for _ in 0..3 {
        assert_eq!(ask("/fast"), (200, "fast".into()));
    }
    assert_eq!(ask("/gone/x").0, 410);
    for _ in 0..2 {
        assert_eq!(ask("/slow/x"), (200, "slow".into()));
    }
    for i in 0..4 {
        assert_eq!(ask(&format!("/api/{i}")), (200, "api".into()));
    }
    assert_eq!(ask("/other"), (200, "other".into()));
    assert_eq!(ask("/nothing").0, 404, "no route: the site's own row");

    let metrics = |path: &str| {
        let mut c = tern.client();
        c.send(format!("GET {path} HTTP/1.1\r\nHost: ops.test\r\n\r\n").as_bytes());
        c.read_response(false).text()
    };
    let page = metrics("/metrics");
    promtool_accepts("tern run's /metrics with routes", &page);
    let responses = |route: &str, class: &str| {
        sample(
            &page,
            &format!("tern_responses_total{{site=\"app\",route=\"{route}\",class=\"{class}\"}}"),
        )
    };
    assert_eq!(responses("fast", "2xx"), 3.0, "a route's name is its label");
    assert_eq!(responses("/gone", "4xx"), 1.0, "else its path as written");
    assert_eq!(responses("/gone", "2xx"), 0.0);
    assert_eq!(responses("/slow", "2xx"), 2.0);
    assert_eq!(responses("/api/", "2xx"), 4.0);
    assert_eq!(responses("other-app", "2xx"), 1.0);
    assert_eq!(responses("", "4xx"), 1.0);
    assert_eq!(responses("", "2xx"), 0.0);
    let histogram = |route: &str, part: &str| {
        sample(
            &page,
            &format!(
                "tern_request_duration_seconds{part}{{site=\"app\",route=\"{route}\"{}}}",
                if part == "_bucket" {
                    ",le=\"0.025\""
                } else {
                    ""
                }
            ),
        )
    };
    assert_eq!(histogram("fast", "_count"), 3.0);
    assert_eq!(histogram("/slow", "_count"), 2.0);
    assert_eq!(histogram("/api/", "_count"), 4.0);
    // The app took 30 ms for each: none of /slow's answers is in a bucket below that.
    assert_eq!(histogram("/slow", "_bucket"), 0.0);
    assert!(histogram("/slow", "_sum") >= 0.06, "{page}");
    let fast_ten = "tern_request_duration_seconds_bucket{site=\"app\",route=\"fast\",le=\"10\"}";
    assert_eq!(sample(&page, fast_ten), 3.0);
    // The answers of the pages are the ops site's, after this page.
    assert_eq!(
        sample(
            &page,
            "tern_responses_total{site=\"ops\",route=\"/metrics\",class=\"2xx\"}"
        ),
        0.0
    );

    // Each proxy route's group: one connection, then reuses; the label is the one the
    // health figures use ("SITE ROUTE", the route's name if it has one).
    let upstream = |name: &str, group: &str| {
        sample(
            &page,
            &format!("tern_upstream_{name}_total{{upstream=\"app {group}\"}}"),
        )
    };
    for (group, requests) in [("/slow", 2.0), ("/api/", 4.0), ("other-app", 1.0)] {
        assert_eq!(upstream("connects", group), 1.0, "{group}");
        assert_eq!(upstream("reuses", group), requests - 1.0, "{group}");
        assert_eq!(upstream("failures", group), 0.0, "{group}");
        assert_eq!(upstream("connect_failures", group), 0.0, "{group}");
    }
    assert_eq!(
        sample(
            &page,
            "tern_upstream_retries_total{upstream=\"app /api/\",cause=\"connect\"}"
        ),
        0.0
    );
    assert_eq!(
        sample(
            &page,
            &format!("tern_upstream_server_up{{upstream=\"app other-app\",server=\"{other}\"}}")
        ),
        1.0
    );
    // Neither a process total nor a row of no group beside the groups on /metrics.
    assert!(!page.contains("\ntern_upstream_connects_total "), "{page}");
    assert!(!page.contains("upstream=\"\""), "{page}");

    // /statusz: the totals as the lines they always were, and each group's.
    let statusz = metrics("/statusz");
    for line in [
        "upstream_connects: 3",
        "upstream_reuses: 4",
        "upstream_reuses{upstream=\"app /api/\"}: 3",
        "responses{site=\"app\",class=\"2xx\"}: 10",
        "responses{site=\"app\",class=\"4xx\"}: 2",
        "responses{site=\"app\",route=\"/api/\",class=\"2xx\"}: 4",
        "request_duration_seconds_count{site=\"app\"}: 12",
        "request_duration_seconds_count{site=\"app\",route=\"fast\"}: 3",
    ] {
        assert!(statusz.lines().any(|l| l == line), "{line}:\n{statusz}");
    }
}

/// Two proxy routes on one path, told apart by a matcher, share their `route` label but not
/// their upstream group: each group counts its own connections ("SITE ROUTE", then
/// "SITE ROUTE#2").
#[test]
fn two_proxy_routes_on_one_path_have_upstream_groups_of_their_own() {
    let posts = app("posts", Duration::ZERO);
    let reads = app("reads", Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        format!(
            "[[site]]\nname = \"app\"\ndefault = true\n\n\
             [[site.route]]\npath = \"/twin\"\nmethods = [\"POST\"]\nproxy = \"{posts}\"\n\n\
             [[site.route]]\npath = \"/twin\"\nproxy = \"{reads}\"\n\n\
             [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n"
        ),
    )
    .unwrap();
    let tern = Tern::start_run(&config);
    let mut c = tern.client();
    c.send(b"POST /twin HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    assert_eq!(c.read_response(false).text(), "posts");
    for _ in 0..2 {
        c.send(b"GET /twin HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(c.read_response(false).text(), "reads");
    }
    let page = tern.get("/metrics").text();
    let connects = |group: &str| {
        sample(
            &page,
            &format!("tern_upstream_connects_total{{upstream=\"{group}\"}}"),
        )
    };
    assert_eq!(connects("app /twin"), 1.0, "{page}");
    assert_eq!(connects("app /twin#2"), 1.0, "{page}");
    assert_eq!(
        sample(
            &page,
            "tern_upstream_reuses_total{upstream=\"app /twin#2\"}"
        ),
        1.0
    );
    assert_eq!(
        sample(
            &page,
            "tern_responses_total{site=\"app\",route=\"/twin\",class=\"2xx\"}"
        ),
        3.0,
        "one route label for both"
    );
}

/// `--check` refuses a route `name` that is not a short label value, with its line.
#[test]
fn a_bad_route_name_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        "[[site]]\nname = \"a\"\nhosts = [\"a.test\"]\n\n\
         [[site.route]]\npath = \"/\"\nrespond = \"x\"\nname = \"root\"\n\n\
         [[site.route]]\npath = \"/b\"\nrespond = \"y\"\nname = \"b\\\"} 1\"\n\n\
         [[site.route]]\npath = \"/c\"\nrespond = \"z\"\nname = \"root\"\n",
    )
    .unwrap();
    let out = Command::new(TERN)
        .arg("run")
        .arg("--check")
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let file = config.display();
    for want in [
        format!("config {file}: line 13: route name \"b\\\"}} 1\" has '\"'"),
        format!(
            "config {file}: line 18: route name \"root\" is the name of another route of this \
             site (line 8)"
        ),
    ] {
        assert!(said.lines().any(|l| l.starts_with(&want)), "{want}\n{said}");
    }
}

#[test]
fn tern_serve_with_a_gate_has_a_page_promtool_accepts() {
    if !have_promtool() {
        return;
    }
    let site = Site::new();
    site.write("index.html", "<p>hello</p>\n");
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate.toml");
    std::fs::write(
        &gate,
        "keyring = \"gate.keys\"\n\n[[realm]]\nname = \"staff\"\ncheckers = [\"guest-pow\"]\n",
    )
    .unwrap();
    let tern = site.start(&["--gate", gate.to_str().unwrap()]);
    // A browser is challenged: the gate counts it.
    let r = tern.get_with(
        "/",
        &[(
            "User-Agent",
            "Mozilla/5.0 (X11; Linux x86_64) Firefox/128.0",
        )],
    );
    assert_eq!(r.status, 403, "{}", r.text());
    let page = tern.get("/.tern-gate/metrics").text();
    promtool_accepts("tern serve --gate's /.tern-gate/metrics", &page);
    assert!(
        sample(&page, "tern_gate_challenges_issued_total{kind=\"pow\"}") >= 1.0,
        "{page}"
    );
}

#[test]
fn tern_demo_has_a_page_promtool_accepts() {
    if !have_promtool() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let tern = Tern::start_demo(data.path(), &["--workers", "2"]);
    assert_eq!(tern.get("/").status, 200);
    assert_eq!(tern.get("/claim/metrics-test").status, 200);
    let page = tern.get("/metrics").text();
    promtool_accepts("tern demo's /metrics", &page);
    // No sites: the answers carry only their class.
    assert!(sample(&page, "tern_responses_total{class=\"2xx\"}") >= 2.0);
    assert!(sample(&page, "tern_request_duration_seconds_count") >= 2.0);
    assert_eq!(sample(&page, "tern_claims_received_total"), 1.0);
}

/// On io_uring (`--io uring`) the page counts the rings' work; the counters are there on
/// epoll too, at zero, so a dashboard's series exist whichever backend runs.
#[test]
fn the_io_uring_counters_count_the_rings_work() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("www")).unwrap();
    std::fs::write(dir.path().join("www/index.html"), "<p>home</p>\n").unwrap();
    let config = dir.path().join("tern.toml");
    std::fs::write(
        &config,
        "[[site]]\nname = \"www\"\ndefault = true\n\n\
         [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n\n\
         [[site.route]]\npath = \"/\"\nstatic = \"www\"\n",
    )
    .unwrap();
    let page_on = |io: &str| {
        let mut cmd = Command::new(TERN);
        cmd.arg("run").arg("--config").arg(&config);
        cmd.args(["--listen", "127.0.0.1:0", "--workers", "1", "--io", io]);
        let tern = Tern::spawn(cmd);
        for _ in 0..5 {
            assert_eq!(tern.get("/").text(), "<p>home</p>\n");
        }
        tern.get("/metrics").text()
    };
    let page = page_on("uring");
    for series in [
        "tern_io_uring_submissions_total",
        "tern_io_uring_completions_total",
        "tern_io_uring_enters_total",
    ] {
        assert!(sample(&page, series) >= 5.0, "{series}: {page}");
    }
    assert_eq!(sample(&page, "tern_io_uring_buffer_exhaustions_total"), 0.0);
    assert_eq!(sample(&page, "tern_io_uring_buffers_reclaimed_total"), 0.0);
    if have_promtool() {
        promtool_accepts("/metrics on io_uring", &page);
    }
    let page = page_on("epoll");
    assert_eq!(sample(&page, "tern_io_uring_enters_total"), 0.0);
}
