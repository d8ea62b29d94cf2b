//! The cost of choosing a route on a site with 50 routes (issue 27's goal: under 0.2 µs per
//! request), single-threaded, no criterion: the site table's lookup (Host, then the route
//! by prefix and matchers) over a mix of request heads parsed once beforehand.
//!
//! Run: `cargo run --release -p tern-vhost --example route_match [SECONDS]` (default 3).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tern_server::{Limits, Parsed, Reply, Request, Response};
use tern_vhost::{Action, HeaderEdits, MatchSpec, Route, RouteOptions, Site, SiteTable};

fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3);
    let table = SiteTable::new(vec![site()], None).expect("the table builds");
    let requests = [
        "GET / HTTP/1.1\r\nHost: bench.test\r\n\r\n",
        "GET /assets/app.3f9c.js HTTP/1.1\r\nHost: bench.test\r\n\r\n",
        "GET /api/v2/users/42/orders?page=3 HTTP/1.1\r\nHost: bench.test\r\nAccept: application/json\r\n\r\n",
        "POST /api/v2/users HTTP/1.1\r\nHost: bench.test\r\nContent-Length: 0\r\n\r\n",
        "GET /docs/section-17/page/intro HTTP/1.1\r\nHost: bench.test\r\n\r\n",
        "GET /blog/2024/05/a-long-post-name HTTP/1.1\r\nHost: bench.test\r\n\r\n",
        "GET /u/12345 HTTP/1.1\r\nHost: bench.test\r\n\r\n",
        "GET /deep/link/in/the/spa/that/has/many/segments HTTP/1.1\r\nHost: bench.test\r\n\r\n",
    ];
    let mut slots: Vec<Vec<std::mem::MaybeUninit<httparse::Header<'_>>>> = (0..requests.len())
        .map(|_| vec![std::mem::MaybeUninit::uninit(); 16])
        .collect();
    let mut heads = Vec::new();
    for (raw, slot) in requests.iter().zip(slots.iter_mut()) {
        match tern_server::parse_request(raw.as_bytes(), slot, &Limits::default()) {
            Ok(Parsed::Complete(h)) => heads.push(h),
            other => panic!("{raw:?}: {other:?}"),
        }
    }
    for h in &heads {
        let route = table
            .route_of(h)
            .map(|p| String::from_utf8_lossy(p).into_owned());
        println!("{:<50} -> {:?}", h.target, route);
    }
    let mut done = 0u64;
    let mut found = 0u64;
    let start = Instant::now();
    let limit = Duration::from_secs(secs);
    while start.elapsed() < limit {
        for _ in 0..10_000 {
            for h in &heads {
                found += u64::from(
                    std::hint::black_box(table.route_of(std::hint::black_box(h))).is_some(),
                );
            }
            done += heads.len() as u64;
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / done as f64;
    println!(
        "{} routes: {done} lookups in {:.2?}: {ns:.1} ns per request ({found} found)",
        table.route_count(),
        start.elapsed()
    );
}

/// 50 routes: prefixes of several depths, some with methods, headers or a pattern.
fn site() -> Site {
    let answer: Arc<dyn tern_server::Handler> = Arc::new(
        |_: &Request<'_>, _: &mut tern_server::HandlerContext<'_>| -> Reply {
            Response::new(204).into()
        },
    );
    let mut routes = Vec::new();
    let mut add = |prefix: String, matchers: MatchSpec| {
        routes.push(Route {
            prefix,
            action: Action::Handler(answer.clone()),
            headers: HeaderEdits::default(),
            options: RouteOptions {
                matchers,
                ..Default::default()
            },
        })
    };
    add("/".into(), MatchSpec::default());
    add("/assets".into(), MatchSpec::default());
    add(
        "/api/v2".into(),
        MatchSpec {
            methods: vec!["POST".into()],
            ..Default::default()
        },
    );
    add(
        "/api/v2".into(),
        MatchSpec {
            headers: vec![("Accept".into(), "application/json".into())],
            ..Default::default()
        },
    );
    add("/api/v2".into(), MatchSpec::default());
    add(
        "/u".into(),
        MatchSpec {
            path_regex: Some("^/u/[0-9]+$".into()),
            ..Default::default()
        },
    );
    for i in 0..20 {
        add(format!("/docs/section-{i}"), MatchSpec::default());
    }
    for i in 0..24 {
        add(format!("/blog/{}", 2000 + i), MatchSpec::default());
    }
    Site {
        name: "bench".into(),
        hosts: vec!["bench.test".into()],
        routes,
        log: tern_server::LogTarget::DEFAULT,
        counted_as: tern_server::AnswerRow::NONE,
        error_pages: Vec::new(),
        request_ids: None,
        compress: None,
        headers: Default::default(),
    }
}
