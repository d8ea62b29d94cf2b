//! Every `/metrics` page tern serves is accepted by Prometheus's own linter, `promtool check
//! metrics` (counters end in `_total`, one HELP and TYPE per name, histograms well formed):
//! `tern run` with two sites, a proxy route and a counters route; `tern serve` with a gate (its
//! `/.tern-gate/metrics`); `tern demo`. The figures per site are checked too: answers by class
//! under each site's label, the duration histogram's count and `/statusz`'s lines.
//!
//! promtool comes from Debian's prometheus package (`scripts/install-metrics-test-deps`, run by
//! `scripts/test-all`). Without it the test skips, except under CI (`CI` set), where it fails:
//! a check that silently did not run would pass for the wrong reason.

mod support;

use std::process::Command;

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
    // Answers by site and class (every answer so far was sent before this page was asked).
    for (series, want) in [
        ("tern_responses_total{site=\"blog\",class=\"2xx\"}", 2.0),
        ("tern_responses_total{site=\"blog\",class=\"4xx\"}", 1.0),
        ("tern_responses_total{site=\"shop\",class=\"2xx\"}", 1.0),
        ("tern_responses_total{site=\"shop\",class=\"4xx\"}", 1.0),
        ("tern_responses_total{site=\"\",class=\"4xx\"}", 1.0),
        ("tern_responses_total{site=\"blog\",class=\"5xx\"}", 0.0),
        ("tern_request_duration_seconds_count{site=\"blog\"}", 3.0),
        (
            "tern_request_duration_seconds_bucket{site=\"blog\",le=\"+Inf\"}",
            3.0,
        ),
        ("tern_request_duration_seconds_count{site=\"shop\"}", 2.0),
        ("tern_request_duration_seconds_count{site=\"\"}", 1.0),
    ] {
        assert_eq!(sample(&page, series), want, "{series}");
    }
    // One upstream connection per worker at most (two workers, two proxied requests).
    let connects = sample(&page, "tern_upstream_connects_total");
    assert!((1.0..=2.0).contains(&connects), "{connects}");
    // Buckets are cumulative: never falling, ending at the count.
    let buckets: Vec<f64> = page
        .lines()
        .filter(|l| l.starts_with("tern_request_duration_seconds_bucket{site=\"shop\""))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(buckets.len(), tern_server::DURATION_BUCKETS);
    assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    assert!(sample(&page, "tern_request_duration_seconds_sum{site=\"shop\"}") > 0.0);

    // /statusz: the same names and labels as plain lines, the histogram as its count and sum.
    let statusz = tern.get("/statusz").text();
    for line in [
        "responses{site=\"blog\",class=\"2xx\"}: 2",
        "request_duration_seconds_count{site=\"blog\"}: 3",
        "timeouts{kind=\"header\"}: 0",
    ] {
        assert!(statusz.lines().any(|l| l == line), "{line}:\n{statusz}");
    }
    assert!(!statusz.contains("_bucket"), "{statusz}");
    assert!(!statusz.contains("_total"), "{statusz}");
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
