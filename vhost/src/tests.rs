//! The site table's unit tests: sites by Host, routes by prefix, and whole requests through them
//! (tern_server::testing's in-memory worker where an answer is checked end to end).

use super::*;

fn fixed(body: &'static str) -> Action {
    Action::Fixed(Fixed {
        status: 200,
        body: bytes::Bytes::from_static(body.as_bytes()),
        content_type: "text/plain".into(),
    })
}

fn route(prefix: &str) -> Route {
    Route {
        prefix: prefix.into(),
        action: fixed("x"),
        headers: HeaderEdits::default(),
        options: RouteOptions::default(),
    }
}

fn site(name: &str, hosts: &[&str], prefixes: &[&str]) -> Site {
    Site {
        name: name.into(),
        hosts: hosts
            .iter()
            .map(|h| normalize_pattern(h).unwrap())
            .collect(),
        routes: prefixes.iter().map(|p| route(p)).collect(),
        log: LogTarget::DEFAULT,
        counted_as: AnswerRow::NONE,
        error_pages: Vec::new(),
        request_ids: None,
        compress: None,
        headers: HeaderEdits::default(),
    }
}

impl SiteTable {
    /// The stored prefix of the route `GET path` on `host` takes.
    fn route_prefix(&self, host: Option<&[u8]>, path: &str) -> Option<String> {
        let host = host.map_or(String::new(), |h| {
            format!("Host: {}\r\n", String::from_utf8_lossy(h))
        });
        let raw = format!("GET {path} HTTP/1.1\r\n{host}\r\n");
        tern_server::testing::with_request(
            raw.as_bytes(),
            "127.0.0.1:1".parse().unwrap(),
            false,
            |req| {
                self.route_of(req.head)
                    .map(|p| String::from_utf8_lossy(p).into_owned())
            },
        )
    }
}

#[test]
fn hosts_choose_sites_and_unknown_hosts_get_the_default_or_nothing() {
    let sites = || {
        vec![
            site("main", &["example.org"], &["/"]),
            site("wild", &["*.example.org"], &["/"]),
            site("other", &["other.test"], &["/"]),
        ]
    };
    let t = SiteTable::new(sites(), None).unwrap();
    assert_eq!(t.site_name(Some(b"Example.org:8080")), Some("main"));
    assert_eq!(t.site_name(Some(b"x.example.org")), Some("wild"));
    assert_eq!(t.site_name(Some(b"other.test")), Some("other"));
    assert_eq!(t.site_name(Some(b"nobody.test")), None);
    assert_eq!(t.site_name(None), None);
    let t = SiteTable::new(sites(), Some(2)).unwrap();
    assert_eq!(t.site_name(Some(b"nobody.test")), Some("other"));
    assert_eq!(t.site_name(None), Some("other"));
    assert_eq!(t.site_name(Some(b"example.org")), Some("main"));
}

#[test]
fn the_longest_prefix_wins_on_segment_boundaries() {
    let t = SiteTable::new(
        vec![site(
            "s",
            &["s.test"],
            &["/", "/app", "/app/admin/", "/apple"],
        )],
        None,
    )
    .unwrap();
    let at = |path| t.route_prefix(Some(b"s.test"), path);
    assert_eq!(at("/").as_deref(), Some(""));
    assert_eq!(at("/index.html").as_deref(), Some(""));
    assert_eq!(at("/app").as_deref(), Some("/app"));
    assert_eq!(at("/app/x").as_deref(), Some("/app"));
    assert_eq!(at("/app/admin").as_deref(), Some("/app/admin"));
    assert_eq!(at("/app/admin/users").as_deref(), Some("/app/admin"));
    assert_eq!(at("/app/administrator").as_deref(), Some("/app"));
    assert_eq!(at("/apple").as_deref(), Some("/apple"));
    assert_eq!(at("/apples").as_deref(), Some(""));
    let t = SiteTable::new(vec![site("s", &["s.test"], &["/docs"])], None).unwrap();
    assert_eq!(t.route_prefix(Some(b"s.test"), "/doc"), None::<String>);
}

/// The adversarial pass: a route written `/a+b` or `/café` took only that spelling, so
/// `/a%2Bb` or `/caf%C3%A9` reached the route below it. Prefixes and paths are compared
/// decoded, and a prefix with no canonical form is refused.
#[test]
fn every_spelling_of_a_name_takes_its_route() {
    let t = SiteTable::new(
        vec![site(
            "s",
            &["s.test"],
            &["/", "/a+b", "/café", "/caf%C3%A9x", "/Special:Login"],
        )],
        None,
    )
    .unwrap();
    let at = |path: &str| t.route_prefix(Some(b"s.test"), path);
    for (path, want) in [
        ("/a+b", "/a+b"),
        ("/a%2Bb/x", "/a+b"),
        ("/a%2bb", "/a+b"),
        ("/café", "/café"),
        ("/caf%C3%A9", "/café"),
        ("/caféx", "/caféx"),
        ("/Special%3ALogin", "/Special:Login"),
        ("/ab", ""),
    ] {
        assert_eq!(at(path).as_deref(), Some(want), "{path}");
    }
    for bad in ["/a;b", "/a%2Fb", "/../a", "/a#b"] {
        let e = SiteTable::new(vec![site("s", &["s.test"], &[bad])], None)
            .err()
            .unwrap_or_else(|| panic!("{bad} was accepted"));
        assert!(e.contains("no canonical form"), "{e}");
    }
}

#[test]
fn bad_tables_are_refused() {
    let e = SiteTable::new(
        vec![
            site("a", &["x.test"], &["/"]),
            site("b", &["X.test"], &["/"]),
        ],
        None,
    )
    .err()
    .unwrap();
    assert!(e.contains("belongs to another site"), "{e}");
    let e = SiteTable::new(vec![site("a", &["x.test"], &["/a", "/a/"])], None)
        .err()
        .unwrap();
    assert!(e.contains("given twice"), "{e}");
    let e = SiteTable::new(vec![site("a", &["x.test"], &["a"])], None)
        .err()
        .unwrap();
    assert!(e.contains("must start with /"), "{e}");
    let mut s = site("a", &[], &["/"]);
    s.hosts.push("UPPER.test".into());
    assert!(SiteTable::new(vec![s], None).is_err());
    assert!(SiteTable::new(vec![site("a", &[], &["/"])], Some(1)).is_err());
}
// Behaviour through a real connection (the codec's parse, the site table, the handler).

/// Answers `200 <path it saw>`, or 404 for paths under `/missing` and `/spa/deep`.
fn stripped_echo(prefix: &str) -> Action {
    let Action::Handler(echo) = echo() else {
        unreachable!()
    };
    Action::Handler(Arc::new(StripPrefix::new(prefix, echo).unwrap()))
}

fn echo() -> Action {
    Action::Handler(Arc::new(
        |req: &Request<'_>, cx: &mut HandlerContext<'_>| -> Reply {
            let path = req.path();
            if path.starts_with("/missing") || path.starts_with("/spa/deep") {
                return Response::text(404, "not found\n").into();
            }
            let id = cx
                .request_id()
                .map_or(String::new(), |i| format!(" id={}", i.as_str()));
            let body = format!("saw {path}{id}");
            Response::new(200)
                .with_body(Body::Shared(Bytes::from(body.into_bytes())))
                .into()
        },
    ))
}

fn with(prefix: &str, action: Action, options: RouteOptions) -> Route {
    Route {
        prefix: prefix.into(),
        action,
        headers: HeaderEdits::default(),
        options,
    }
}

fn serve(routes: Vec<Route>, tweak: impl FnOnce(&mut Site)) -> tern_server::testing::MemoryConn {
    let mut s = Site {
        routes,
        ..site("s", &["s.test"], &[])
    };
    tweak(&mut s);
    let table = SiteTable::new(vec![s], Some(0)).unwrap();
    let router = tern_server::Router::new().fallback(Sites::new(table));
    tern_server::testing::MemoryConn::new(router, None).unwrap()
}

/// Status and raw answer text of one request.
fn ask(conn: &mut tern_server::testing::MemoryConn, request: &str) -> (u16, String) {
    conn.feed(request.as_bytes());
    let out = conn.take_output();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text[9..12].parse().unwrap();
    (status, text)
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: s.test\r\n\r\n")
}

#[test]
fn matchers_choose_among_routes_of_one_prefix_in_order() {
    let mut c = serve(
        vec![
            with(
                "/api",
                fixed("posts"),
                RouteOptions {
                    matchers: MatchSpec {
                        methods: vec!["POST".into()],
                        ..Default::default()
                    },
                    ..Default::default()
                },
            ),
            with(
                "/api",
                fixed("v2"),
                RouteOptions {
                    matchers: MatchSpec {
                        headers: vec![("X-Version".into(), "2".into())],
                        query: vec![("v".into(), "*".into())],
                        ..Default::default()
                    },
                    ..Default::default()
                },
            ),
            with(
                "/",
                fixed("user"),
                RouteOptions {
                    matchers: MatchSpec {
                        path_regex: Some("^/u/[0-9]+$".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            ),
            with("/api", fixed("api"), RouteOptions::default()),
        ],
        |_| {},
    );
    let body = |t: String| t.rsplit("\r\n\r\n").next().unwrap().to_string();
    assert_eq!(
        body(
            ask(
                &mut c,
                "POST /api/x HTTP/1.1\r\nHost: s.test\r\nContent-Length: 0\r\n\r\n"
            )
            .1
        ),
        "posts"
    );
    assert_eq!(
        body(
            ask(
                &mut c,
                "GET /api/x?v HTTP/1.1\r\nHost: s.test\r\nX-Version: 2\r\n\r\n"
            )
            .1
        ),
        "v2"
    );
    assert_eq!(
        body(
            ask(
                &mut c,
                "GET /api/x HTTP/1.1\r\nHost: s.test\r\nX-Version: 2\r\n\r\n"
            )
            .1
        ),
        "api"
    );
    assert_eq!(body(ask(&mut c, &get("/u/42")).1), "user");
    assert_eq!(ask(&mut c, &get("/u/42x")).0, 404, "no route at / takes it");
    assert_eq!(
        ask(&mut c, &get("/%75/42")).1.rsplit("\r\n\r\n").next(),
        Some("user")
    );
}

#[test]
fn answers_are_counted_in_the_row_of_the_route_that_answered() {
    let stats = tern_server::Stats::new(1);
    let site = stats.site("s");
    let counted = |label: &str| RouteOptions {
        counted_as: Some(stats.route(site, label)),
        ..Default::default()
    };
    let routes = vec![
        with("/a", fixed("a"), counted("/a")),
        with("/b", fixed("b"), counted("posts")),
        with("/old", Action::Rewrite("/b".into()), counted("/old")),
        // A route without a row of its own counts in its site's.
        with("/c", fixed("c"), RouteOptions::default()),
    ];
    let mut c = serve(routes, |s| s.counted_as = site).with_stats(stats.clone());
    assert_eq!(ask(&mut c, &get("/a/x")).0, 200);
    assert_eq!(ask(&mut c, &get("/b")).0, 200);
    assert_eq!(ask(&mut c, &get("/old")).0, 200, "rewritten to /b");
    assert_eq!(ask(&mut c, &get("/c")).0, 200);
    assert_eq!(ask(&mut c, &get("/nothing")).0, 404);
    let s = stats.snapshot();
    let twos = |route: &str| s.answers_of("s", route).unwrap().responses[1];
    assert_eq!(twos("/a"), 1);
    assert_eq!(
        twos("posts"),
        2,
        "the route a rewrite ends at counts its answer"
    );
    assert_eq!(twos("/old"), 0);
    let own = s.answers_of("s", "").unwrap();
    assert_eq!(
        own.responses,
        [0, 1, 0, 1, 0],
        "/c, and the 404 of no route"
    );
    assert_eq!(s.answers_of("", "").unwrap().responses, [0; 5]);
}

#[test]
fn a_route_shadowed_by_an_earlier_one_is_refused() {
    let s = Site {
        routes: vec![
            with("/a", fixed("x"), RouteOptions::default()),
            with(
                "/a/",
                fixed("y"),
                RouteOptions {
                    matchers: MatchSpec {
                        methods: vec!["GET".into()],
                        ..Default::default()
                    },
                    ..Default::default()
                },
            ),
        ],
        ..site("s", &[], &[])
    };
    let e = SiteTable::new(vec![s], Some(0)).err().unwrap();
    assert!(e.contains("could never be chosen"), "{e}");
}

#[test]
fn rewrites_and_stripped_prefixes_give_the_handler_a_new_canonical_path() {
    let mut c = serve(
        vec![
            with(
                "/old",
                Action::Rewrite("/new/$1".into()),
                RouteOptions {
                    matchers: MatchSpec {
                        path_regex: Some("^/old/(.*)$".into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            ),
            with(
                "/loop",
                Action::Rewrite("/loop/x".into()),
                RouteOptions::default(),
            ),
            with("/api", stripped_echo("/api"), RouteOptions::default()),
            with("/café", stripped_echo("/café"), RouteOptions::default()),
            with("/", echo(), RouteOptions::default()),
        ],
        |_| {},
    );
    let body = |c: &mut tern_server::testing::MemoryConn, p: &str| {
        ask(c, &get(p))
            .1
            .rsplit("\r\n\r\n")
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(body(&mut c, "/old/a/b?q=1"), "saw /new/a/b");
    // A capture holding an encoded `%` or `?` stays encoded: no second decoding.
    assert_eq!(body(&mut c, "/old/a%25x"), "saw /new/a%25x");
    assert_eq!(body(&mut c, "/old/a%3Fb"), "saw /new/a%3Fb");
    assert_eq!(
        body(&mut c, "/old/%2e%2e/x"),
        "saw /x",
        "dot segments are resolved first"
    );
    assert_eq!(ask(&mut c, &get("/loop")).0, 500, "a cycle ends");
    assert_eq!(body(&mut c, "/api/users/1"), "saw /users/1");
    assert_eq!(body(&mut c, "/api"), "saw /");
    assert_eq!(body(&mut c, "/api/"), "saw /");
    assert_eq!(body(&mut c, "//api//x/./y/../z"), "saw /x/z");
    assert_eq!(body(&mut c, "/%61pi/x"), "saw /x");
    assert_eq!(body(&mut c, "/apix"), "saw /apix", "not under /api");
    assert_eq!(
        body(&mut c, "/caf%C3%A9/%C3%A9t%C3%A9"),
        "saw /%C3%A9t%C3%A9"
    );
    assert_eq!(body(&mut c, "/café/x"), "saw /x");
    assert_eq!(
        ask(&mut c, &get("/api/a%2Fb")).0,
        400,
        "refused before any route"
    );
}

/// `%2F` reaches a route that takes it, opaque inside its segment: chosen, cut and
/// handed on as sent; every other route (and no route) refuses it with 400.
#[test]
fn an_encoded_slash_reaches_only_the_routes_that_take_it() {
    let takes = RouteOptions {
        allow_encoded_slash: true,
        ..Default::default()
    };
    let routes = vec![
        with("/api", stripped_echo("/api"), takes),
        with(
            "/raw",
            echo(),
            RouteOptions {
                allow_encoded_slash: true,
                ..Default::default()
            },
        ),
        with("/other", echo(), RouteOptions::default()),
    ];
    let table = SiteTable::new(
        vec![Site {
            routes,
            ..site("s", &["s.test"], &[])
        }],
        None,
    )
    .unwrap();
    let router = tern_server::Router::new().fallback(Sites::new(table));
    let mut config = tern_server::ServerConfig::default();
    config.limits.allow_encoded_slash = true;
    let mut c = tern_server::testing::MemoryConn::with_config(router, config, None).unwrap();
    for (path, want) in [
        ("/api/a%2fb/c", "200 saw /a%2Fb/c"),
        ("/api/..%2F..%2Fother", "200 saw /..%2F..%2Fother"),
        (
            "/raw/x%2F..%2F..%2Fother",
            "200 saw /raw/x%2F..%2F..%2Fother",
        ),
        ("/api/x/../y%2Fz", "200 saw /y%2Fz"),
        ("/other/a%2Fb", "400"),
        // Chosen on the segment as written: `api%2Fx` is no route's.
        ("/api%2Fx", "400"),
        ("/nowhere/a%2Fb", "400"),
        ("/nowhere/a", "404"),
        ("/api/a%5Cb", "400"),
    ] {
        let (status, text) = ask(&mut c, &get(path));
        let body = text.rsplit("\r\n\r\n").next().unwrap();
        let got = if status == 200 {
            format!("200 {body}")
        } else {
            status.to_string()
        };
        assert_eq!(got, want, "{path}");
    }
}

/// nginx's rule for a proxy `location /app/`: the bare `/app` is redirected to the
/// folder (query kept) rather than handed to the app; a route written without the
/// slash, or without the option, takes `/app` itself.
#[test]
fn a_route_written_with_its_slash_redirects_the_bare_prefix() {
    let bare = RouteOptions {
        redirect_bare_prefix: true,
        ..Default::default()
    };
    let routes = vec![
        with("/app/", echo(), bare),
        with(
            "/plain",
            echo(),
            RouteOptions {
                redirect_bare_prefix: true,
                ..Default::default()
            },
        ),
        with("/other/", echo(), RouteOptions::default()),
    ];
    let mut c = serve(routes, |_| {});
    let (status, text) = ask(&mut c, &get("/app?x=1&y=%20"));
    assert_eq!(status, 301, "{text}");
    assert!(text.contains("\r\nLocation: /app/?x=1&y=%20\r\n"), "{text}");
    let (status, text) = ask(&mut c, &get("/%61pp"));
    assert_eq!(status, 301, "any spelling of the prefix: {text}");
    assert!(text.contains("\r\nLocation: /app/\r\n"), "{text}");
    for path in ["/app/", "/app/x", "/plain", "/other"] {
        assert_eq!(ask(&mut c, &get(path)).0, 200, "{path}");
    }
    assert_eq!(ask(&mut c, &get("/apple")).0, 404);
}

#[test]
fn try_files_takes_the_first_candidate_found_then_the_fallback() {
    let tf = |list: &[&str]| RouteOptions {
        try_files: list.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let mut c = serve(
        vec![
            with(
                "/spa",
                echo(),
                tf(&["$uri", "$uri/index.html", "/spa/index.html"]),
            ),
            with("/missing", echo(), tf(&["$uri", "=410"])),
            with("/missing/loop", echo(), tf(&["$uri", "/missing/loop/x"])),
            with("/", echo(), RouteOptions::default()),
        ],
        |_| {},
    );
    let body = |c: &mut tern_server::testing::MemoryConn, p: &str| {
        ask(c, &get(p))
            .1
            .rsplit("\r\n\r\n")
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(body(&mut c, "/spa/app.js"), "saw /spa/app.js");
    assert_eq!(body(&mut c, "/spa/deep/link"), "saw /spa/index.html");
    assert_eq!(ask(&mut c, &get("/missing/x")).0, 410);
    assert_eq!(
        ask(&mut c, &get("/missing/loop/y")).0,
        500,
        "a fallback cycle ends"
    );
}

/// A folder asked for without its slash is redirected to it, as nginx's `try_files $uri
/// $uri/` and a static route do, instead of its page answering under the bare name
/// (WordPress's `/wp-admin`); each candidate still costs at most one lookup.
#[test]
fn try_files_redirects_a_folder_to_its_slashed_path() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static LOOKUPS: AtomicUsize = AtomicUsize::new(0);
    // Files as a static route answers: `/docs` and `/empty` are folders (301 to the
    // slashed path with the query), `/docs/` has an index, `/empty/` none.
    let files = Action::Handler(Arc::new(
        |req: &Request<'_>, _cx: &mut HandlerContext<'_>| -> Reply {
            LOOKUPS.fetch_add(1, Ordering::Relaxed);
            let path = req.path();
            match path {
                "/docs" | "/empty" => {
                    let mut r = Response::text(301, "moved\n");
                    let query = req.query().map_or(String::new(), |q| format!("?{q}"));
                    r.push_header("Location", format!("{path}/{query}").as_bytes());
                    r.into()
                }
                "/docs/" | "/index.php" | "/a.txt" => {
                    let body = format!("saw {path}");
                    Response::new(200)
                        .with_body(Body::Shared(Bytes::from(body.into_bytes())))
                        .into()
                }
                _ => Response::text(404, "not found\n").into(),
            }
        },
    ));
    let mut c = serve(
        vec![with(
            "/",
            files,
            RouteOptions {
                try_files: vec!["$uri".into(), "$uri/".into(), "/index.php".into()],
                ..Default::default()
            },
        )],
        |_| {},
    );
    let (status, text) = ask(&mut c, &get("/docs?lang=en"));
    assert_eq!(status, 301, "{text}");
    assert!(text.contains("Location: /docs/?lang=en\r\n"), "{text}");
    // A folder with nothing to show is redirected too (nginx checks that it exists).
    assert_eq!(ask(&mut c, &get("/empty")).0, 301);
    // With its slash the folder answers; without one, a file is a file.
    assert!(ask(&mut c, &get("/docs/")).1.ends_with("saw /docs/"));
    assert!(ask(&mut c, &get("/a.txt")).1.ends_with("saw /a.txt"));
    // No file, no folder: the fallback, after one lookup for `$uri` and `$uri/` both.
    LOOKUPS.store(0, Ordering::Relaxed);
    assert!(ask(&mut c, &get("/articles/42"))
        .1
        .ends_with("saw /index.php"));
    assert_eq!(
        LOOKUPS.load(Ordering::Relaxed),
        2,
        "$uri, then the fallback"
    );
    LOOKUPS.store(0, Ordering::Relaxed);
    assert_eq!(ask(&mut c, &get("/docs")).0, 301);
    assert_eq!(LOOKUPS.load(Ordering::Relaxed), 1, "the redirect is $uri's");
    LOOKUPS.store(0, Ordering::Relaxed);
    assert!(ask(&mut c, &get("/articles/42/"))
        .1
        .ends_with("saw /index.php"));
    assert_eq!(
        LOOKUPS.load(Ordering::Relaxed),
        2,
        "$uri/ is $uri: asked once"
    );
}

#[test]
fn error_pages_replace_tern_s_own_answers_only() {
    let mut c = serve(
        vec![
            with(
                "/gone",
                Action::Fixed(Fixed {
                    status: 404,
                    body: Bytes::from_static(b"mine"),
                    content_type: "text/plain".into(),
                }),
                RouteOptions::default(),
            ),
            with(
                "/small",
                echo(),
                RouteOptions {
                    max_body: Some(4),
                    ..Default::default()
                },
            ),
        ],
        |s| {
            s.error_pages = vec![
                ErrorPage {
                    status: 404,
                    body: Bytes::from_static(b"<h1>lost</h1>"),
                    content_type: "text/html".into(),
                },
                ErrorPage {
                    status: 413,
                    body: Bytes::from_static(b"<h1>too big</h1>"),
                    content_type: "text/html".into(),
                },
            ]
        },
    );
    let (status, text) = ask(&mut c, &get("/nowhere"));
    assert_eq!(status, 404);
    assert!(
        text.contains("Content-Type: text/html\r\n") && text.ends_with("<h1>lost</h1>"),
        "{text}"
    );
    assert!(
        ask(&mut c, &get("/gone")).1.ends_with("mine"),
        "a fixed route's body is its own"
    );
    let (status, text) = ask(
        &mut c,
        "POST /small HTTP/1.1\r\nHost: s.test\r\nContent-Length: 5\r\n\r\nhello",
    );
    assert_eq!(status, 413);
    assert!(text.ends_with("<h1>too big</h1>"), "{text}");
    assert_eq!(
        c.stats()
            .snapshot()
            .bad(tern_server::RequestError::BodyTooLarge),
        1,
        "a route's own body limit counts as the server's does"
    );
    let (status, _) = ask(
        &mut c,
        "POST /small HTTP/1.1\r\nHost: s.test\r\nContent-Length: 4\r\n\r\nhell",
    );
    assert_eq!(status, 200);
}

#[test]
fn rate_limits_answer_429_with_retry_after() {
    let limiter = tern_services::PrefixLimiter::new(
        tern_services::RateLimitConfig {
            per_second: 1,
            burst: 2,
            buckets: 64,
            ..Default::default()
        },
        1,
    );
    let mut c = serve(
        vec![with(
            "/",
            echo(),
            RouteOptions {
                rate_limit: Some(Arc::new(limiter)),
                ..Default::default()
            },
        )],
        |_| {},
    );
    assert_eq!(ask(&mut c, &get("/a")).0, 200);
    assert_eq!(ask(&mut c, &get("/a")).0, 200);
    let (status, text) = ask(&mut c, &get("/a"));
    assert_eq!(status, 429);
    assert!(text.contains("Retry-After: 3\r\n"), "{text}");
    assert_eq!(
        c.stats().snapshot().get(tern_server::Counter::RateLimited),
        1
    );
}

/// Site-wide edits reach every answer of the site, tern's own included (no route, a
/// refusal, an error page: nginx's `add_header ... always`), and a route's own go over
/// them; fields by type follow the answer's final type (an error page's).
#[test]
fn site_headers_reach_every_answer_and_routes_override_them() {
    let limiter = tern_services::PrefixLimiter::new(
        tern_services::RateLimitConfig {
            per_second: 1,
            burst: 1,
            buckets: 64,
            ..Default::default()
        },
        1,
    );
    let mut own = with("/own", echo(), RouteOptions::default());
    own.headers = HeaderEdits {
        set: vec![("x-frame-options".into(), "SAMEORIGIN".into())],
        remove: vec!["X-Robots-Tag".into()],
        ..Default::default()
    };
    let routes = vec![
        own,
        with(
            "/limited",
            echo(),
            RouteOptions {
                rate_limit: Some(Arc::new(limiter)),
                ..Default::default()
            },
        ),
        with("/missing", echo(), RouteOptions::default()),
    ];
    let mut c = serve(routes, |s| {
        s.headers = HeaderEdits {
            set: vec![
                ("X-Frame-Options".into(), "DENY".into()),
                ("X-Robots-Tag".into(), "noindex".into()),
            ],
            by_type: vec![(
                "text/html".into(),
                vec![(
                    "Content-Security-Policy".into(),
                    "default-src 'none'".into(),
                )],
            )],
            expires: vec![("*".into(), Expires::Max)],
            ..Default::default()
        };
        s.error_pages = vec![ErrorPage {
            status: 404,
            body: Bytes::from_static(b"<h1>lost</h1>"),
            content_type: "text/html".into(),
        }];
    });
    let (status, text) = ask(&mut c, &get("/nowhere"));
    assert_eq!(status, 404);
    assert!(
        text.contains("X-Frame-Options: DENY\r\n")
            && text.contains("X-Robots-Tag: noindex\r\n")
            && text.contains("Content-Security-Policy: default-src 'none'\r\n"),
        "no route: the site's edits, by the page's type: {text}"
    );
    assert!(
        !text.contains("Expires"),
        "an error is never made cacheable: {text}"
    );
    let (status, text) = ask(&mut c, &get("/missing/x"));
    assert_eq!(status, 404);
    assert!(text.contains("X-Frame-Options: DENY\r\n"), "{text}");
    let (_, text) = ask(&mut c, &get("/own"));
    assert!(text.contains("x-frame-options: SAMEORIGIN\r\n"), "{text}");
    assert!(
        !text.contains("DENY") && !text.contains("X-Robots-Tag"),
        "the route's own over the site's: {text}"
    );
    assert!(text.contains("Expires: Thu, 31 Dec 2037"), "{text}");
    assert_eq!(ask(&mut c, &get("/limited")).0, 200);
    let (status, text) = ask(&mut c, &get("/limited"));
    assert_eq!(status, 429);
    assert!(
        text.contains("X-Frame-Options: DENY\r\n"),
        "a refusal too: {text}"
    );
}

#[test]
fn request_ids_are_made_or_taken_from_a_trusted_proxy() {
    let mut routes = vec![with("/", echo(), RouteOptions::default())];
    routes[0]
        .headers
        .set
        .push(("X-Request-Id".into(), "$request_id".into()));
    routes[0]
        .headers
        .set
        .push(("X-Seen".into(), "$scheme://$host $client".into()));
    let mut c = serve(routes, |s| {
        s.request_ids = Some(TrustedProxies::parse("192.0.2.0/24").unwrap())
    });
    // MemoryConn's peer is 192.0.2.1: trusted.
    let (_, text) = ask(
        &mut c,
        "GET / HTTP/1.1\r\nHost: S.test:81\r\nX-Request-Id: from-lb-1\r\n\r\n",
    );
    assert!(text.contains("X-Request-Id: from-lb-1\r\n"), "{text}");
    assert!(
        text.contains("X-Seen: http://s.test 192.0.2.1\r\n"),
        "{text}"
    );
    assert!(text.ends_with("saw / id=from-lb-1"), "{text}");
    let (_, text) = ask(
        &mut c,
        "GET / HTTP/1.1\r\nHost: s.test\r\nX-Request-Id: bad id\r\n\r\n",
    );
    let id = text
        .split("X-Request-Id: ")
        .nth(1)
        .unwrap()
        .split("\r\n")
        .next()
        .unwrap();
    assert_eq!(id.len(), 32, "{text}");
    let mut c = serve(vec![with("/", echo(), RouteOptions::default())], |s| {
        s.request_ids = Some(TrustedProxies::default())
    });
    let (_, text) = ask(
        &mut c,
        "GET / HTTP/1.1\r\nHost: s.test\r\nX-Request-Id: from-client\r\n\r\n",
    );
    assert!(
        !text.contains("from-client"),
        "an untrusted peer's id is replaced: {text}"
    );
}

// Internal routes and the hand-back of proxied requests (`handback.rs`), through a real
// connection and a relay to an upstream the test plays.

/// A route forwarding to the test's upstream (`tern_server::testing::MemoryUpstream`) its
/// path and query as routed, as the proxy does.
fn forward() -> Action {
    let up = Arc::new(tern_server::testing::MemoryUpstream::default());
    Action::Handler(Arc::new(
        move |req: &Request<'_>, _: &mut HandlerContext<'_>| -> Reply {
            let query = req.query().map_or(String::new(), |q| format!("?{q}"));
            let head = format!(
                "{} {}{query} HTTP/1.1\r\nHost: upstream\r\n",
                req.head.method_str,
                req.path()
            );
            Reply::Forward(Box::new(tern_server::Forward {
                upstreams: up.clone(),
                head: head.into_bytes(),
                idempotent: true,
                upgrade: false,
                edit: None,
                own_answers: None,
                max_body: u64::MAX,
                wire: Default::default(),
                not_before_ms: 0,
                tee: None,
                hold: None,
                fallback: None,
            }))
        },
    ))
}

fn internal() -> RouteOptions {
    RouteOptions {
        internal: true,
        ..Default::default()
    }
}

/// Requests the relay sent upstream, by their request lines (the tests' bodies, lower
/// case, may come right before one).
fn request_lines(sent: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(sent)
        .split("\r\n")
        .filter(|l| l.ends_with(" HTTP/1.1"))
        .map(|l| l[l.find(|c: char| c.is_ascii_uppercase()).unwrap_or(0)..].to_string())
        .collect()
}

/// An internal route is not there for a client (404 as if no route took the path, its
/// body, even one a proxy route would stream, read as usual so the connection goes on),
/// but a rewrite or a `try_files` fallback reaches it.
#[test]
fn internal_routes_answer_only_what_tern_routes_again() {
    let tf = RouteOptions {
        try_files: vec!["$uri".into(), "/protected/fallback".into()],
        ..Default::default()
    };
    let mut c = serve(
        vec![
            with("/protected", fixed("secret"), internal()),
            with("/internal-api", forward(), internal()),
            with(
                "/old",
                Action::Rewrite("/protected/x".into()),
                RouteOptions::default(),
            ),
            with("/spa", echo(), tf),
            with("/", fixed("public"), RouteOptions::default()),
        ],
        |_| {},
    );
    let (status, text) = ask(&mut c, &get("/protected/x"));
    assert_eq!(status, 404, "{text}");
    assert!(
        !text.contains("secret") && !text.contains("public"),
        "{text}"
    );
    let (status, text) = ask(
        &mut c,
        "POST /internal-api/x HTTP/1.1\r\nHost: s.test\r\nContent-Length: 3\r\n\r\nabc",
    );
    assert_eq!(status, 404, "{text}");
    assert_eq!(c.upstream_connections(), 0, "nothing reached the app");
    assert!(!c.is_closed(), "its body was read: the connection goes on");
    assert!(ask(&mut c, &get("/old")).1.ends_with("secret"), "a rewrite");
    assert!(
        ask(&mut c, &get("/spa/deep/x")).1.ends_with("secret"),
        "a fallback"
    );
    assert!(ask(&mut c, &get("/spa/app.js"))
        .1
        .ends_with("saw /spa/app.js"));
    assert!(ask(&mut c, &get("/other")).1.ends_with("public"));
}

/// The app's `X-Accel-Redirect` is followed on its site: to an internal fixed route, and
/// to an internal proxy route (a second relay, the first connection reused), each counted
/// in the row of the route that answered, with that route's header edits and the app's
/// fields nginx carries over; a status in `reroute_status` is answered by its path (with
/// that answer's own status); a route that does not follow the header passes the answer
/// on without it.
#[test]
fn an_app_hands_requests_back_to_its_site() {
    let stats = tern_server::Stats::new(1);
    let site = stats.site("s");
    let counted = |label: &str, internal: bool| RouteOptions {
        counted_as: Some(stats.route(site, label)),
        internal,
        ..Default::default()
    };
    let app = RouteOptions {
        x_accel_redirect: true,
        reroute_status: vec![(404, "/protected/missing?from=app".into())],
        ..counted("app", false)
    };
    let mut edits = HeaderEdits::default();
    edits.set.push(("X-Served-By".into(), "protected".into()));
    let mut files = with("/protected", fixed("secret"), counted("files", true));
    files.headers = edits;
    let mut c = serve(
        vec![
            with("/app", forward(), app),
            files,
            with("/internal-api", forward(), counted("api", true)),
            with("/plain", forward(), RouteOptions::default()),
        ],
        |s| s.counted_as = site,
    )
    .with_stats(stats.clone());
    let accel = |to: &str| {
        format!(
            "HTTP/1.1 200 OK\r\nX-Accel-Redirect: {to}\r\nContent-Disposition: attachment\r\n\
             Content-Type: application/pdf\r\nX-App: 1\r\nContent-Length: 3\r\n\r\napp"
        )
    };
    c.feed(get("/app/download").as_bytes());
    let sent = c.upstream_answers(&[accel("/protected/report.pdf").as_bytes()], 4096, false);
    assert_eq!(request_lines(&sent), ["GET /app/download HTTP/1.1"]);
    let text = String::from_utf8_lossy(&c.take_output()).into_owned();
    assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
    assert!(text.ends_with("\r\n\r\nsecret"), "{text}");
    assert!(
        text.contains("\r\nContent-Type: application/pdf\r\n"),
        "{text}"
    );
    assert!(
        text.contains("\r\nContent-Disposition: attachment\r\n"),
        "{text}"
    );
    assert!(text.contains("\r\nX-Served-By: protected\r\n"), "{text}");
    assert!(
        !text.contains("X-App") && !text.contains("X-Accel"),
        "{text}"
    );

    c.feed(get("/app/data?q=1").as_bytes());
    let second = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndata";
    let sent = c.upstream_answers(
        &[accel("/internal-api/v1?k=2").as_bytes(), second],
        4096,
        false,
    );
    assert_eq!(
        request_lines(&sent),
        [
            "GET /app/data?q=1 HTTP/1.1",
            "GET /internal-api/v1?k=2 HTTP/1.1"
        ],
        "the handed-back request goes out as the path and query the app named"
    );
    assert_eq!(c.upstream_connections(), 1, "on the pooled connection");
    let text = String::from_utf8_lossy(&c.take_output()).into_owned();
    assert!(text.ends_with("\r\n\r\ndata"), "{text}");

    // A POST is handed back as a GET without its body, a HEAD as a HEAD; the fields of the
    // client's head go with them.
    c.feed(b"POST /app/form HTTP/1.1\r\nHost: s.test\r\nContent-Length: 3\r\n\r\nabc");
    let second = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    let sent = c.upstream_answers(&[accel("/internal-api/p").as_bytes(), second], 4096, false);
    assert_eq!(
        request_lines(&sent),
        ["POST /app/form HTTP/1.1", "GET /internal-api/p HTTP/1.1"]
    );
    assert!(String::from_utf8_lossy(&c.take_output()).ends_with("\r\n\r\nok"));
    c.feed(b"HEAD /app/h HTTP/1.1\r\nHost: s.test\r\n\r\n");
    let sent = c.upstream_answers(&[accel("/internal-api/h").as_bytes(), second], 4096, false);
    assert_eq!(
        request_lines(&sent),
        ["HEAD /app/h HTTP/1.1", "HEAD /internal-api/h HTTP/1.1"]
    );
    let text = String::from_utf8_lossy(&c.take_output()).into_owned();
    assert!(
        text.starts_with("HTTP/1.1 200 OK\r\n") && text.ends_with("\r\n\r\n"),
        "{text}"
    );

    c.feed(get("/app/gone").as_bytes());
    c.upstream_answers(
        &[b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"],
        4096,
        false,
    );
    let text = String::from_utf8_lossy(&c.take_output()).into_owned();
    assert!(
        text.starts_with("HTTP/1.1 200 OK\r\n"),
        "the fallback's status: {text}"
    );
    assert!(text.ends_with("secret"), "{text}");

    c.feed(get("/plain").as_bytes());
    c.upstream_answers(&[accel("/protected/x").as_bytes()], 4096, false);
    let text = String::from_utf8_lossy(&c.take_output()).into_owned();
    assert!(
        text.ends_with("\r\n\r\napp"),
        "the app's own answer: {text}"
    );
    assert!(
        !text.contains("X-Accel"),
        "never sent to the client: {text}"
    );
    assert!(text.contains("X-App: 1"), "{text}");

    let s = stats.snapshot();
    let twos = |route: &str| s.answers_of("s", route).unwrap().responses[1];
    assert_eq!(twos("files"), 2, "the report and the 404's fallback");
    assert_eq!(twos("api"), 3, "the data, the POST and the HEAD");
    assert_eq!(twos("app"), 0, "answered by the routes it handed back to");
}

/// An app that keeps handing the request back ends, as a rewrite cycle does, with a 500
/// after [`MAX_REROUTES`] hand-backs; an app that names a path with no canonical form gets
/// a 502.
#[test]
fn hand_backs_are_bounded_and_checked() {
    let follows = RouteOptions {
        x_accel_redirect: true,
        ..Default::default()
    };
    let mut c = serve(
        vec![
            with("/app", forward(), follows),
            with(
                "/loop",
                forward(),
                RouteOptions {
                    x_accel_redirect: true,
                    ..internal()
                },
            ),
        ],
        |_| {},
    );
    let again = b"HTTP/1.1 200 OK\r\nX-Accel-Redirect: /loop\r\nContent-Length: 0\r\n\r\n";
    c.feed(get("/app").as_bytes());
    let sent = c.upstream_answers(&[&again[..]; 8], 4096, false);
    let lines = request_lines(&sent);
    assert_eq!(lines.len(), 1 + usize::from(MAX_REROUTES), "{lines:?}");
    let text = String::from_utf8_lossy(&c.take_output()).into_owned();
    assert!(text.starts_with("HTTP/1.1 500 "), "{text}");
    assert!(text.contains("internal redirection cycle"), "{text}");

    c.feed(get("/app").as_bytes());
    c.upstream_answers(
        &[b"HTTP/1.1 200 OK\r\nX-Accel-Redirect: /a/%2e%2e/%2e%2e/x\r\nContent-Length: 0\r\n\r\n"],
        4096,
        false,
    );
    let text = String::from_utf8_lossy(&c.take_output()).into_owned();
    assert!(text.starts_with("HTTP/1.1 502 "), "{text}");
}

#[test]
fn reroute_status_entries_are_checked() {
    assert!(check_reroute_status(404, "/fallback?x=1").is_ok());
    for (status, target, want) in [
        (200, "/x", "not a status that can be rerouted"),
        (404, "fallback", "a path starting with /"),
        (404, "/a/../../x", "no canonical form"),
        (502, "/a b", "spaces"),
    ] {
        let e = check_reroute_status(status, target).unwrap_err();
        assert!(e.contains(want), "{status} {target}: {e}");
    }
    let bad = Site {
        routes: vec![with(
            "/",
            forward(),
            RouteOptions {
                reroute_status: vec![(404, "x".into())],
                ..Default::default()
            },
        )],
        ..site("s", &[], &[])
    };
    let e = SiteTable::new(vec![bad], None).err().unwrap();
    assert!(e.contains("reroute_status"), "{e}");
}
