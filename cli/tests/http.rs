//! `tern serve` end to end: the real binary on an ephemeral port, raw TCP clients.
//!
//! HTTP/1.1 connection handling (keep-alive, pipelining, split requests, HEAD), conditional
//! requests, ranges, content-coding negotiation, path safety, dotfiles, errors, MIME types,
//! directories, change detection and large (sendfile) bodies. Every test starts its own server.

use std::time::{Duration, Instant};

use crate::support;
use support::*;

// ---------------------------------------------------------------------------------------------
// Connections
// ---------------------------------------------------------------------------------------------

#[test]
fn keep_alive_serves_100_requests_on_one_connection() {
    let site = Site::new();
    site.write("index.html", "<h1>home</h1>\n");
    site.write("a.txt", "alpha\n");
    let tern = site.start(&[]);
    let mut c = tern.client();
    for i in 0..100 {
        let (path, want) = if i % 2 == 0 {
            ("/", "<h1>home</h1>\n")
        } else {
            ("/a.txt", "alpha\n")
        };
        let r = c.get(path, &[]);
        assert_eq!(r.status, 200, "request {i}");
        assert_eq!(r.text(), want, "request {i}");
        assert!(!r.closes(), "request {i} closed the connection");
        assert_eq!(r.version, "HTTP/1.1");
        assert!(
            r.header("date").is_some_and(|d| d.ends_with(" GMT")),
            "Date"
        );
        assert!(r.header("server").is_some(), "Server");
    }
}

#[test]
fn sixteen_pipelined_requests_are_answered_in_order() {
    let site = Site::new();
    site.write_numbered(16);
    let tern = site.start(&[]);
    let mut c = tern.client();
    sixteen_pipelined(&mut c);
    // Nothing more: the connection is idle and open.
    let r = c.get("/n00.txt", &[]);
    assert_eq!(r.text(), "file number 0\n");
}

#[test]
fn a_deep_pipeline_is_answered_in_order_while_the_client_keeps_writing() {
    // 2000 requests (far more than one read buffer) written by one thread while another
    // reads: answers must come back complete and in order, with no deadlock.
    let site = Site::new();
    for i in 0..10 {
        site.write(
            &format!("p{i}.txt"),
            format!("pipelined {i}\n").repeat(i + 1),
        );
    }
    let tern = site.start(&[]);
    let mut c = tern.client();
    let mut writer = c.stream.try_clone().unwrap();
    const N: usize = 2000;
    let sender = std::thread::spawn(move || {
        use std::io::Write;
        let mut batch = Vec::new();
        for i in 0..N {
            batch.extend(request_bytes("GET", &format!("/p{}.txt", i % 10), &[]));
            if batch.len() > 8192 {
                writer.write_all(&batch).unwrap();
                batch.clear();
            }
        }
        writer.write_all(&batch).unwrap();
    });
    for i in 0..N {
        let r = c.read_response(false);
        assert_eq!(r.status, 200, "response {i}");
        let k = i % 10;
        assert_eq!(
            r.text(),
            format!("pipelined {k}\n").repeat(k + 1),
            "response {i}"
        );
    }
    sender.join().unwrap();
}

#[test]
fn a_request_split_across_many_small_writes_is_answered() {
    let site = Site::new();
    site.write("split.txt", "assembled\n");
    let tern = site.start(&[]);
    let mut c = tern.client();
    let req = request_bytes(
        "GET",
        "/split.txt",
        &[("User-Agent", "tern-tests"), ("Accept", "*/*")],
    );
    // One byte per write, so that every line ending (and the blank line) is split.
    for b in &req {
        c.send(std::slice::from_ref(b));
        std::thread::sleep(Duration::from_millis(1));
    }
    let r = c.read_response(false);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "assembled\n");
    // Then a request in 5-byte pieces with a longer pause in the middle of the head.
    for (i, piece) in req.chunks(5).enumerate() {
        c.send(piece);
        std::thread::sleep(Duration::from_millis(if i == 4 { 150 } else { 2 }));
    }
    assert_eq!(c.read_response(false).text(), "assembled\n");
    // And the connection is still good for the next request.
    assert_eq!(c.get("/split.txt", &[]).text(), "assembled\n");
}

#[test]
fn head_has_get_headers_and_no_body() {
    let site = Site::new();
    let body = text_body("head");
    site.write("page.txt", &body);
    site.write("small.txt", "tiny\n");
    let tern = site.start(&[]);
    let mut c = tern.client();
    // HEAD then GET in one write: if HEAD leaked a body, the GET's response would be garbled.
    let mut batch = request_bytes("HEAD", "/page.txt", &[]);
    batch.extend(request_bytes("GET", "/small.txt", &[]));
    batch.extend(request_bytes(
        "HEAD",
        "/page.txt",
        &[("Accept-Encoding", "gzip")],
    ));
    batch.extend(request_bytes("GET", "/page.txt", &[]));
    c.send(&batch);
    let head = c.read_response(true);
    let small = c.read_response(false);
    let head_gz = c.read_response(true);
    let get = c.read_response(false);
    assert_eq!(head.status, 200);
    assert_eq!(head.content_length(), Some(body.len() as u64));
    assert_eq!(small.status, 200);
    assert_eq!(small.text(), "tiny\n");
    assert_eq!(get.text(), body);
    for h in ["content-type", "etag", "last-modified", "content-length"] {
        assert_eq!(head.header(h), get.header(h), "{h} of HEAD and GET");
    }
    assert!(head_gz.has("content-encoding", "gzip"));
    let gz_len = head_gz.content_length().unwrap();
    assert!(gz_len < body.len() as u64);
    // The GET with gzip has exactly the length HEAD announced.
    let gz = c.get("/page.txt", &[("Accept-Encoding", "gzip")]);
    assert_eq!(gz.body.len() as u64, gz_len);
}

#[test]
fn head_of_a_large_file_sends_no_body() {
    let site = Site::new();
    write_pattern_file(&site.root.join("big.bin"), 1 << 20);
    site.write("small.txt", "after\n");
    let tern = site.start(&[]);
    let mut c = tern.client();
    let mut batch = request_bytes("HEAD", "/big.bin", &[]);
    batch.extend(request_bytes("GET", "/small.txt", &[]));
    c.send(&batch);
    let head = c.read_response(true);
    assert_eq!(head.status, 200);
    assert_eq!(head.content_length(), Some(1 << 20));
    let small = c.read_response(false);
    assert_eq!(small.status, 200);
    assert_eq!(small.text(), "after\n");
}

#[test]
fn http_1_0_closes_unless_keep_alive_is_asked_for() {
    let site = Site::new();
    site.write("a.txt", "alpha\n");
    let tern = site.start(&[]);

    let mut c = tern.client();
    c.send(b"GET /a.txt HTTP/1.0\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "alpha\n");
    assert!(
        c.at_eof(),
        "an HTTP/1.0 connection without keep-alive is closed"
    );

    let mut c = tern.client();
    c.send(b"GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.text(), "alpha\n");
    assert!(r
        .header("connection")
        .is_some_and(|v| v.eq_ignore_ascii_case("keep-alive")));
    c.send(b"GET /a.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(c.read_response(false).text(), "alpha\n");

    let mut c = tern.client();
    let r = c.get("/a.txt", &[("Connection", "close")]);
    assert_eq!(r.text(), "alpha\n");
    assert!(r.closes());
    assert!(c.at_eof());
}

// ---------------------------------------------------------------------------------------------
// Conditional requests
// ---------------------------------------------------------------------------------------------

#[test]
fn if_none_match_gives_304() {
    let site = Site::new();
    site.write("page.html", "<p>cached</p>\n");
    let tern = site.start(&[("--cache-control"), "public, max-age=60"]);
    let first = tern.get("/page.html");
    assert_eq!(first.status, 200);
    let etag = first.header("etag").expect("ETag").to_owned();
    assert!(
        etag.starts_with('"') && etag.ends_with('"'),
        "strong ETag {etag}"
    );
    assert!(first.has("cache-control", "public, max-age=60"));

    let mut c = tern.client();
    // A 304 has no body: pipeline a plain GET behind it to prove nothing extra was sent.
    let mut batch = request_bytes("GET", "/page.html", &[("If-None-Match", &etag)]);
    batch.extend(request_bytes("GET", "/page.html", &[]));
    c.send(&batch);
    let r = c.read_response(false);
    assert_eq!(r.status, 304);
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert!(r.has("cache-control", "public, max-age=60"));
    assert!(r.header("content-type").is_none() || r.content_length().unwrap_or(0) == 0);
    let r = c.read_response(false);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "<p>cached</p>\n");

    let in_list = format!("\"nope\", {etag}, \"other\"");
    let weak = format!("W/{etag}");
    for (inm, want) in [
        (etag.as_str(), 304),
        (in_list.as_str(), 304),
        ("*", 304),
        (weak.as_str(), 304),
        ("\"nope\", \"other\"", 200),
        ("\"\"", 200),
    ] {
        let r = c.get("/page.html", &[("If-None-Match", inm)]);
        assert_eq!(r.status, want, "If-None-Match: {inm}");
        if want == 200 {
            assert_eq!(r.text(), "<p>cached</p>\n");
        } else {
            assert!(r.body.is_empty());
        }
    }
    // HEAD is conditional too.
    let r = c.request("HEAD", "/page.html", &[("If-None-Match", &etag)]);
    assert_eq!(r.status, 304);
}

#[test]
fn if_modified_since_gives_304_and_if_none_match_wins() {
    let site = Site::new();
    let path = site.write("page.html", "<p>dated</p>\n");
    // A whole-second mtime in the past, so the comparisons are exact.
    let mtime = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let tern = site.start(&[]);
    let first = tern.get("/page.html");
    let lm = first
        .header("last-modified")
        .expect("Last-Modified")
        .to_owned();
    assert_eq!(lm, "Tue, 14 Nov 2023 22:13:20 GMT");
    let etag = first.header("etag").unwrap().to_owned();

    let mut c = tern.client();
    let older = "Tue, 14 Nov 2023 21:13:20 GMT";
    let newer = "Wed, 15 Nov 2023 22:13:20 GMT";
    for (headers, want) in [
        (vec![("If-Modified-Since", lm.as_str())], 304),
        (vec![("If-Modified-Since", newer)], 304),
        (vec![("If-Modified-Since", older)], 200),
        (vec![("If-Modified-Since", "not a date")], 200),
        // If-None-Match is evaluated instead of If-Modified-Since (RFC 9110 §13.2.2).
        (
            vec![
                ("If-None-Match", "\"other\""),
                ("If-Modified-Since", lm.as_str()),
            ],
            200,
        ),
        (
            vec![
                ("If-Modified-Since", lm.as_str()),
                ("If-None-Match", "\"other\""),
            ],
            200,
        ),
        (
            vec![
                ("If-None-Match", etag.as_str()),
                ("If-Modified-Since", older),
            ],
            304,
        ),
    ] {
        let r = c.get("/page.html", &headers);
        assert_eq!(r.status, want, "{headers:?}");
        if want == 200 {
            assert_eq!(r.text(), "<p>dated</p>\n", "{headers:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Ranges
// ---------------------------------------------------------------------------------------------

#[test]
fn byte_ranges() {
    let site = Site::new();
    let body = text_body("range");
    let len = body.len();
    site.write("page.txt", &body);
    let tern = site.start(&[]);
    let mut c = tern.client();

    let full = c.get("/page.txt", &[]);
    assert!(full.has("accept-ranges", "bytes"));
    let etag = full.header("etag").unwrap().to_owned();
    let lm = full.header("last-modified").unwrap().to_owned();

    let check = |r: &Resp, start: usize, end: usize| {
        assert_eq!(r.status, 206, "bytes {start}-{end}");
        let cr = format!("bytes {start}-{end}/{len}");
        assert_eq!(r.header("content-range"), Some(cr.as_str()));
        assert_eq!(r.content_length(), Some((end - start + 1) as u64));
        assert_eq!(r.body, body.as_bytes()[start..=end]);
        assert!(r.header("content-encoding").is_none());
    };
    check(&c.get("/page.txt", &[("Range", "bytes=0-9")]), 0, 9);
    check(
        &c.get("/page.txt", &[("Range", "bytes=-5")]),
        len - 5,
        len - 1,
    );
    check(&c.get("/page.txt", &[("Range", "bytes=5-")]), 5, len - 1);
    // An end beyond the length is clamped.
    check(
        &c.get("/page.txt", &[("Range", "bytes=100-999999")]),
        100,
        len - 1,
    );
    // A suffix longer than the file is the whole file.
    check(
        &c.get("/page.txt", &[("Range", "bytes=-999999")]),
        0,
        len - 1,
    );
    // Ranges apply to the identity representation even when gzip is acceptable.
    check(
        &c.get(
            "/page.txt",
            &[("Range", "bytes=10-19"), ("Accept-Encoding", "gzip, br")],
        ),
        10,
        19,
    );

    for unsat in [
        format!("bytes={len}-"),
        format!("bytes={}-{}", len + 10, len + 20),
    ] {
        let r = c.get("/page.txt", &[("Range", &unsat)]);
        assert_eq!(r.status, 416, "{unsat}");
        let cr = format!("bytes */{len}");
        assert_eq!(r.header("content-range"), Some(cr.as_str()), "{unsat}");
    }

    // If-Range: a stale validator means "send me everything".
    let r = c.get(
        "/page.txt",
        &[("Range", "bytes=0-9"), ("If-Range", "\"stale-etag\"")],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), body);
    let r = c.get(
        "/page.txt",
        &[
            ("Range", "bytes=0-9"),
            ("If-Range", "Tue, 14 Nov 2023 22:13:20 GMT"),
        ],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), body);
    // A weak validator never matches If-Range (strong comparison).
    let r = c.get(
        "/page.txt",
        &[("Range", "bytes=0-9"), ("If-Range", &format!("W/{etag}"))],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), body);
    // A current one keeps the range.
    check(
        &c.get("/page.txt", &[("Range", "bytes=0-9"), ("If-Range", &etag)]),
        0,
        9,
    );
    check(
        &c.get("/page.txt", &[("Range", "bytes=0-9"), ("If-Range", &lm)]),
        0,
        9,
    );
    // Several ranges or another unit: the whole file.
    for ignored in ["bytes=0-1,5-6", "items=0-1"] {
        let r = c.get("/page.txt", &[("Range", ignored)]);
        assert_eq!(r.status, 200, "{ignored}");
        assert_eq!(r.text(), body);
    }
}

// ---------------------------------------------------------------------------------------------
// Content codings
// ---------------------------------------------------------------------------------------------

#[test]
fn gzip_and_brotli_are_negotiated() {
    let site = Site::new();
    let body = text_body("compress");
    assert!(body.len() > 1024);
    site.write("page.txt", &body);
    site.write("image.png", [0x89u8, b'P', b'N', b'G'].repeat(600));
    let tern = site.start(&[]);
    let mut c = tern.client();

    let gz = c.get("/page.txt", &[("Accept-Encoding", "gzip")]);
    assert_eq!(gz.status, 200);
    assert!(gz.has("content-encoding", "gzip"));
    assert!(gz.has("vary", "Accept-Encoding"));
    assert!(gz.body.len() < body.len());
    assert_eq!(gunzip(&gz.body), body.as_bytes());

    let br = c.get("/page.txt", &[("Accept-Encoding", "br")]);
    assert!(br.has("content-encoding", "br"));
    assert!(br.has("vary", "Accept-Encoding"));
    assert_eq!(unbrotli(&br.body), body.as_bytes());

    let both = c.get("/page.txt", &[("Accept-Encoding", "gzip, deflate, br")]);
    assert!(
        both.has("content-encoding", "br"),
        "br is preferred on a tie"
    );
    let pref = c.get("/page.txt", &[("Accept-Encoding", "gzip;q=0.9, br;q=0.5")]);
    assert!(pref.has("content-encoding", "gzip"), "higher q wins");

    for refused in ["gzip;q=0, br;q=0", "identity", "deflate"] {
        let id = c.get("/page.txt", &[("Accept-Encoding", refused)]);
        assert!(id.header("content-encoding").is_none(), "{refused}");
        assert!(id.has("vary", "Accept-Encoding"), "{refused}");
        assert_eq!(id.text(), body, "{refused}");
    }
    let plain = c.get("/page.txt", &[]);
    assert!(plain.header("content-encoding").is_none());
    assert!(plain.has("vary", "Accept-Encoding"));
    assert_eq!(plain.text(), body);

    // Each representation has its own strong validator, and 304s follow the chosen one.
    let (e_id, e_gz, e_br) = (
        plain.header("etag").unwrap(),
        gz.header("etag").unwrap(),
        br.header("etag").unwrap(),
    );
    assert!(e_id != e_gz && e_gz != e_br && e_id != e_br);
    let r = c.get(
        "/page.txt",
        &[("Accept-Encoding", "gzip"), ("If-None-Match", e_gz)],
    );
    assert_eq!(r.status, 304);
    assert_eq!(r.header("etag"), Some(e_gz));
    let r = c.get(
        "/page.txt",
        &[("Accept-Encoding", "gzip"), ("If-None-Match", e_id)],
    );
    assert_eq!(
        r.status, 200,
        "the identity ETag does not validate the gzip body"
    );

    // Already-compressed types are left alone.
    let png = c.get("/image.png", &[("Accept-Encoding", "gzip, br")]);
    assert_eq!(png.status, 200);
    assert!(png.header("content-encoding").is_none());
}

#[test]
fn a_gz_file_beside_a_file_is_its_gzip_variant() {
    let site = Site::new();
    let plain = text_body("plain original");
    let pre = text_body("PRECOMPRESSED VARIANT");
    let pre_gz = gzip(pre.as_bytes());
    site.write("doc.txt", &plain);
    site.write("doc.txt.gz", &pre_gz);
    let tern = site.start(&[]);
    let mut c = tern.client();

    let r = c.get("/doc.txt", &[("Accept-Encoding", "gzip")]);
    assert_eq!(r.status, 200);
    assert!(r.has("content-encoding", "gzip"));
    assert!(r.has("vary", "Accept-Encoding"));
    assert!(
        r.header("content-type").unwrap().starts_with("text/plain"),
        "the type is that of doc.txt, not of a .gz"
    );
    assert_eq!(r.body, pre_gz, "the bytes of doc.txt.gz, as they are");
    assert_eq!(gunzip(&r.body), pre.as_bytes());

    let r = c.get("/doc.txt", &[]);
    assert!(r.header("content-encoding").is_none());
    assert_eq!(r.text(), plain);
}

// ---------------------------------------------------------------------------------------------
// Path safety
// ---------------------------------------------------------------------------------------------

/// Sends `target` verbatim in the request line on a fresh connection.
fn raw_get(tern: &Tern, target: &[u8]) -> Resp {
    let mut c = tern.client();
    let mut req = b"GET ".to_vec();
    req.extend_from_slice(target);
    req.extend_from_slice(b" HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    c.send(&req);
    c.read_response(false)
}

#[test]
fn traversal_never_leaves_the_root() {
    let site = Site::new();
    site.write("index.html", "home\n");
    site.write("a/file.txt", "inside a\n");
    let tern = site.start(&[]);
    let targets: &[&[u8]] = &[
        b"/../secret",
        b"/%2e%2e/secret",
        b"/%2E%2E/secret",
        b"/a/../../secret",
        b"/a/%2e%2e/%2e%2e/secret",
        b"/..%2fsecret",
        b"/%2e%2e%2fsecret",
        b"/a/..%2f..%2fsecret",
        b"/..%5csecret",
        b"/..\\secret",
        b"/a\\b",
        b"/a%00b",
        b"/a%00/../../secret",
        b"/./../secret",
        b"//../secret",
        b"/a/./../../secret",
        b"/..",
        b"/%2e%2e",
        b"/.%2e/secret",
        b"/%252e%252e/secret",
        b"../secret",
        b"http://test/../secret",
    ];
    for &target in targets {
        let r = raw_get(&tern, target);
        let shown = String::from_utf8_lossy(target);
        assert!(
            r.status == 400 || r.status == 404,
            "{shown}: status {}",
            r.status
        );
        assert!(find(&r.body, SECRET).is_none(), "{shown} leaked the secret");
    }
    // And the server is fine: legitimate paths with dots still work.
    assert_eq!(tern.get("/a/../a/file.txt").text(), "inside a\n");
    assert_eq!(tern.get("/a/%2e/file.txt").text(), "inside a\n");
}

#[test]
fn symlinks_inside_are_followed_and_outside_refused() {
    use std::os::unix::fs::symlink;
    let site = Site::new();
    site.write("sub/real.txt", "real content\n");
    symlink("sub/real.txt", site.root.join("inside.txt")).unwrap();
    site.write("top.txt", "top content\n");
    // Goes up, but stays inside.
    symlink("../top.txt", site.root.join("sub/up.txt")).unwrap();
    symlink("sub", site.root.join("subdir-link")).unwrap();
    symlink("../secret", site.root.join("outside.txt")).unwrap();
    symlink(
        site.base().join("secret"),
        site.root.join("abs-outside.txt"),
    )
    .unwrap();
    symlink("..", site.root.join("parent")).unwrap();
    symlink("sub/../../secret", site.root.join("sneaky.txt")).unwrap();
    let tern = site.start(&[]);

    let r = tern.get("/inside.txt");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "real content\n");
    let r = tern.get("/sub/up.txt");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "top content\n");
    let r = tern.get("/subdir-link/real.txt");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "real content\n");

    for path in [
        "/outside.txt",
        "/abs-outside.txt",
        "/parent/secret",
        "/sneaky.txt",
    ] {
        let r = tern.get(path);
        assert_eq!(r.status, 404, "{path}");
        assert!(find(&r.body, SECRET).is_none(), "{path} leaked the secret");
    }
}

#[test]
fn dotfiles_are_hidden_unless_asked_for() {
    let site = Site::new();
    site.write(".env", "API_KEY=hunter2\n");
    site.write(".git/config", "[core]\n");
    site.write("sub/.hidden", "hidden\n");
    site.write("visible.txt", "visible\n");

    let tern = site.start(&[]);
    for path in [
        "/.env",
        "/.git/config",
        "/sub/.hidden",
        "/%2eenv",
        "/sub/%2ehidden",
    ] {
        let r = tern.get(path);
        assert_eq!(r.status, 404, "{path}");
        assert!(!r.text().contains("hunter2"));
    }
    assert_eq!(tern.get("/visible.txt").status, 200);
    drop(tern);

    let tern = site.start(&["--serve-dotfiles"]);
    let r = tern.get("/.env");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "API_KEY=hunter2\n");
    assert_eq!(tern.get("/.git/config").text(), "[core]\n");
    assert_eq!(tern.get("/sub/.hidden").text(), "hidden\n");
}

// ---------------------------------------------------------------------------------------------
// Errors, types, directories
// ---------------------------------------------------------------------------------------------

#[test]
fn not_found_is_a_small_html_page_and_keeps_the_connection() {
    let site = Site::new();
    site.write("a.txt", "alpha\n");
    let tern = site.start(&[]);
    let mut c = tern.client();
    let r = c.get("/no/such/file.txt", &[]);
    assert_eq!(r.status, 404);
    assert!(r.has("content-type", "text/html; charset=utf-8"));
    assert!(r.body.len() < 1024, "404 body is {} bytes", r.body.len());
    let text = r.text();
    assert!(text.contains("<html") && text.contains("404"), "{text}");
    assert!(!r.closes());
    assert_eq!(c.get("/a.txt", &[]).text(), "alpha\n");
    // HEAD of a missing file: the 404's headers, no body (the next answer must parse).
    let mut batch = request_bytes("HEAD", "/missing", &[]);
    batch.extend(request_bytes("GET", "/a.txt", &[]));
    c.send(&batch);
    let r = c.read_response(true);
    assert_eq!(r.status, 404);
    assert_eq!(c.read_response(false).text(), "alpha\n");
}

#[test]
fn query_strings_are_ignored_and_odd_paths_are_not_errors() {
    let site = Site::new();
    site.write("a.txt", "alpha\n");
    site.write("sp ace.txt", "space\n");
    site.write("caf\u{e9}.txt", "cafe\n");
    let tern = site.start(&[]);
    let mut c = tern.client();
    for (path, want) in [
        ("/a.txt?v=123", "alpha\n"),
        ("/a.txt?", "alpha\n"),
        ("/a.txt?x=/../secret", "alpha\n"),
        ("/sp%20ace.txt", "space\n"),
        ("/caf%C3%A9.txt", "cafe\n"),
        ("//a.txt", "alpha\n"),
        ("/./a.txt", "alpha\n"),
    ] {
        let r = c.get(path, &[]);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.text(), want, "{path}");
    }
    // A name longer than NAME_MAX, and a path longer than PATH_MAX: not found, not 500.
    let long_name = format!("/{}", "n".repeat(300));
    let long_path = "/d".repeat(2100);
    for path in [long_name.as_str(), long_path.as_str()] {
        let r = tern.get(path);
        assert!(
            [400, 404, 414, 431].contains(&r.status),
            "{} bytes: status {}",
            path.len(),
            r.status
        );
    }
    // A bad percent-escape is a client error.
    for path in ["/a%2", "/a%zz.txt", "/%"] {
        let r = tern.get(path);
        assert!(r.status == 400 || r.status == 404, "{path}: {}", r.status);
    }
    assert_eq!(c.get("/a.txt", &[]).text(), "alpha\n");
}

#[test]
fn other_methods_get_405_with_allow() {
    let site = Site::new();
    site.write("a.txt", "alpha\n");
    let tern = site.start(&[]);
    let mut c = tern.client();
    for method in ["POST", "DELETE", "PUT", "OPTIONS", "PATCH"] {
        let r = c.request(method, "/a.txt", &[("Content-Length", "0")]);
        assert_eq!(r.status, 405, "{method}");
        assert!(
            r.has("allow", "GET, HEAD"),
            "{method}: {:?}",
            r.header("allow")
        );
    }
    // A POST with a body: the body is consumed and the next pipelined request is answered.
    let mut batch =
        b"POST /a.txt HTTP/1.1\r\nHost: test\r\nContent-Length: 11\r\n\r\nhello world".to_vec();
    batch.extend(request_bytes("GET", "/a.txt", &[]));
    c.send(&batch);
    assert_eq!(c.read_response(false).status, 405);
    let r = c.read_response(false);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "alpha\n");
    // 405 on a missing path too (the method is checked first).
    assert_eq!(c.request("DELETE", "/nope", &[]).status, 405);
}

#[test]
fn content_types_by_extension() {
    let site = Site::new();
    for name in [
        "page.html",
        "style.css",
        "app.js",
        "image.png",
        "data.json",
        "file.weirdext",
        "noext",
        "UPPER.HTML",
    ] {
        site.write(name, "x");
    }
    let tern = site.start(&[]);
    let mut c = tern.client();
    let ct = |c: &mut Client, p: &str| {
        let r = c.get(p, &[]);
        assert_eq!(r.status, 200, "{p}");
        r.header("content-type").expect("Content-Type").to_owned()
    };
    assert_eq!(ct(&mut c, "/page.html"), "text/html; charset=utf-8");
    assert_eq!(ct(&mut c, "/UPPER.HTML"), "text/html; charset=utf-8");
    assert_eq!(ct(&mut c, "/style.css"), "text/css; charset=utf-8");
    let js = ct(&mut c, "/app.js");
    assert!(
        js == "text/javascript; charset=utf-8" || js == "application/javascript; charset=utf-8",
        "{js}"
    );
    assert_eq!(ct(&mut c, "/image.png"), "image/png");
    assert_eq!(ct(&mut c, "/data.json"), "application/json; charset=utf-8");
    assert_eq!(ct(&mut c, "/file.weirdext"), "application/octet-stream");
    assert_eq!(ct(&mut c, "/noext"), "application/octet-stream");
}

#[test]
fn directories_serve_index_html_and_redirect_without_slash() {
    let site = Site::new();
    site.write("index.html", "root index\n");
    site.write("docs/index.html", "docs index\n");
    site.write("docs/deeper/index.html", "deeper index\n");
    site.write("empty/readme.txt", "no index here\n");
    site.write("sp ace/index.html", "space index\n");
    let tern = site.start(&[]);
    let mut c = tern.client();

    for (path, want) in [
        ("/", "root index\n"),
        ("/docs/", "docs index\n"),
        ("/docs/deeper/", "deeper index\n"),
        ("/docs/?q=1", "docs index\n"),
    ] {
        let r = c.get(path, &[]);
        assert_eq!(r.status, 200, "{path}");
        assert!(r.has("content-type", "text/html; charset=utf-8"), "{path}");
        assert_eq!(r.text(), want, "{path}");
    }
    for (path, location) in [
        ("/docs", "/docs/"),
        ("/docs/deeper", "/docs/deeper/"),
        ("/docs?x=1&y=2", "/docs/?x=1&y=2"),
        ("/sp%20ace", "/sp%20ace/"),
    ] {
        let r = c.get(path, &[]);
        assert_eq!(r.status, 301, "{path}");
        assert_eq!(r.header("location"), Some(location), "{path}");
    }
    assert_eq!(c.get("/empty/", &[]).status, 404);
    // The redirect target works.
    assert_eq!(c.get("/sp%20ace/", &[]).text(), "space index\n");
}

// ---------------------------------------------------------------------------------------------
// Changes on disk
// ---------------------------------------------------------------------------------------------

#[test]
fn changes_on_disk_are_served_within_a_second() {
    let site = Site::new();
    site.write("changed.txt", "version 1\n");
    site.write("replaced.txt", "old file\n");
    site.write("removed.txt", "going away\n");
    site.write("page.txt", text_body("before"));
    let tern = site.start(&[]);

    // Warm every worker's cache (connections spread over both workers).
    for _ in 0..8 {
        let mut c = tern.client();
        for p in [
            "/changed.txt",
            "/replaced.txt",
            "/removed.txt",
            "/added.txt",
            "/page.txt",
        ] {
            c.get(p, &[("Accept-Encoding", "gzip")]);
        }
    }

    let changed_at = Instant::now();
    // In place, same size.
    site.write("changed.txt", "version 2\n");
    // A new file renamed over the old one (how deploys do it).
    site.write("replaced.tmp", "new file, other length\n");
    std::fs::rename(
        site.root.join("replaced.tmp"),
        site.root.join("replaced.txt"),
    )
    .unwrap();
    std::fs::remove_file(site.root.join("removed.txt")).unwrap();
    site.write("added.txt", "brand new\n");
    site.write("page.txt", text_body("after"));

    let limit = Duration::from_millis(1200);
    let check = |path: &str, ok: &dyn Fn(&Resp) -> bool| {
        let done = eventually(limit.saturating_sub(changed_at.elapsed()), || {
            // Several fresh connections, so that both workers are asked.
            (0..4).all(|_| ok(&tern.get_with(path, &[("Accept-Encoding", "gzip")])))
        });
        assert!(done, "{path} not updated within 1.2 s");
    };
    check("/changed.txt", &|r| {
        r.status == 200 && r.text() == "version 2\n"
    });
    check("/replaced.txt", &|r| {
        r.status == 200 && r.text() == "new file, other length\n"
    });
    check("/removed.txt", &|r| r.status == 404);
    check("/added.txt", &|r| {
        r.status == 200 && r.text() == "brand new\n"
    });
    check("/page.txt", &|r| {
        r.status == 200
            && r.has("content-encoding", "gzip")
            && gunzip(&r.body) == text_body("after").as_bytes()
    });
    assert!(changed_at.elapsed() < Duration::from_millis(1500));
}

#[test]
fn large_files_replaced_or_removed_are_noticed_within_a_second() {
    let site = Site::new();
    // Over --max-cached-size (64 KiB by default): served from an open descriptor.
    let old = "o".repeat(200 << 10);
    let new = "N".repeat(300 << 10);
    site.write("large.txt", &old);
    site.write("gone.bin", vec![7u8; 100 << 10]);
    let tern = site.start(&[]);
    for _ in 0..8 {
        let mut c = tern.client();
        assert_eq!(c.get("/large.txt", &[]).body.len(), old.len());
        assert_eq!(c.get("/gone.bin", &[]).status, 200);
    }
    let changed_at = Instant::now();
    site.write("large.tmp", &new);
    std::fs::rename(site.root.join("large.tmp"), site.root.join("large.txt")).unwrap();
    std::fs::remove_file(site.root.join("gone.bin")).unwrap();
    let limit = Duration::from_millis(1200);
    let ok = eventually(limit.saturating_sub(changed_at.elapsed()), || {
        (0..4).all(|_| {
            let r = tern.get("/large.txt");
            r.status == 200 && r.body == new.as_bytes()
        })
    });
    assert!(ok, "replaced large file not served within 1.2 s");
    let ok = eventually(limit.saturating_sub(changed_at.elapsed()), || {
        (0..4).all(|_| tern.get("/gone.bin").status == 404)
    });
    assert!(ok, "removed large file still served after 1.2 s");
}

#[test]
fn a_switched_root_symlink_is_followed_within_a_second() {
    use std::os::unix::fs::symlink;
    let site = Site::new();
    site.write("releases/1/index.html", "release one\n");
    site.write("releases/2/index.html", "release two\n");
    let current = site.root.join("current");
    symlink("releases/1", &current).unwrap();
    let tern = Tern::start(&current, &[]);
    assert_eq!(tern.get("/").text(), "release one\n");

    let switched_at = Instant::now();
    symlink("releases/2", site.root.join("current.tmp")).unwrap();
    std::fs::rename(site.root.join("current.tmp"), &current).unwrap();
    let ok = eventually(Duration::from_millis(1200), || {
        (0..4).all(|_| tern.get("/").text() == "release two\n")
    });
    assert!(
        ok,
        "still serving the old release {:?} after the switch",
        switched_at.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// Large files (sendfile)
// ---------------------------------------------------------------------------------------------

const EIGHT_MIB: u64 = 8 << 20;

#[test]
fn large_file_reaches_a_slow_reader_intact() {
    let site = Site::new();
    write_pattern_file(&site.root.join("big.bin"), EIGHT_MIB);
    let tern = site.start(&[]);
    let mut c = tern.client();
    // Keep the kernel's buffers far smaller than the file, so the server must wait for us.
    c.small_receive_buffer(128 << 10);
    c.send(&request_bytes("GET", "/big.bin", &[]));
    // Let the server fill the socket buffers and wait for writability.
    std::thread::sleep(Duration::from_millis(200));
    let r = c.read_response(false);
    assert_eq!(r.status, 200);
    assert!(r.has("content-type", "application/octet-stream"));
    assert_eq!(r.body.len() as u64, EIGHT_MIB);
    check_pattern(&r.body, 0);

    // Slow in the middle too: small reads with pauses.
    c.send(&request_bytes("GET", "/big.bin", &[]));
    let head = c.read_head_only();
    assert_eq!(head.content_length(), Some(EIGHT_MIB));
    let mut got = 0u64;
    let mut pauses = 0;
    while got < EIGHT_MIB {
        let n = (EIGHT_MIB - got).min(1 << 20) as usize;
        let chunk = c.read_exact_raw(n);
        check_pattern(&chunk, got);
        got += n as u64;
        if pauses < 3 {
            std::thread::sleep(Duration::from_millis(100));
            pauses += 1;
        }
    }
    // The connection is still in step.
    let r = c.get("/big.bin", &[("Range", "bytes=0-15")]);
    assert_eq!(r.status, 206);
    check_pattern(&r.body, 0);
}

#[test]
fn range_in_the_middle_of_a_large_file() {
    let site = Site::new();
    write_pattern_file(&site.root.join("big.bin"), EIGHT_MIB);
    let tern = site.start(&[]);
    let mut c = tern.client();
    let (start, end) = (3_000_001u64, 5_123_456u64);
    let r = c.get("/big.bin", &[("Range", &format!("bytes={start}-{end}"))]);
    assert_eq!(r.status, 206);
    let cr = format!("bytes {start}-{end}/{EIGHT_MIB}");
    assert_eq!(r.header("content-range"), Some(cr.as_str()));
    assert_eq!(r.body.len() as u64, end - start + 1);
    check_pattern(&r.body, start);

    let r = c.get("/big.bin", &[("Range", "bytes=-100")]);
    assert_eq!(r.status, 206);
    check_pattern(&r.body, EIGHT_MIB - 100);

    let r = c.get("/big.bin", &[("Range", &format!("bytes={EIGHT_MIB}-"))]);
    assert_eq!(r.status, 416);
    let cr = format!("bytes */{EIGHT_MIB}");
    assert_eq!(r.header("content-range"), Some(cr.as_str()));
}

#[test]
fn pipelined_large_and_small_bodies_stay_in_order() {
    let site = Site::new();
    write_pattern_file(&site.root.join("big.bin"), 2 << 20);
    site.write("a.txt", "alpha\n");
    let tern = site.start(&[]);
    let mut c = tern.client();
    let mut batch = Vec::new();
    for _ in 0..3 {
        batch.extend(request_bytes("GET", "/a.txt", &[]));
        batch.extend(request_bytes("GET", "/big.bin", &[]));
    }
    batch.extend(request_bytes(
        "GET",
        "/big.bin",
        &[("Range", "bytes=1000-1999")],
    ));
    c.send(&batch);
    for _ in 0..3 {
        assert_eq!(c.read_response(false).text(), "alpha\n");
        let big = c.read_response(false);
        assert_eq!(big.body.len(), 2 << 20);
        check_pattern(&big.body, 0);
    }
    let r = c.read_response(false);
    assert_eq!(r.status, 206);
    check_pattern(&r.body, 1000);
}
