//! End-to-end tests of `StaticFiles::serve` on temporary directories.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use tern_codec::{BodyKind, Method, RequestHead, Version};

use super::*;

/// Request headers the handler reads.
#[derive(Default, Clone, Copy)]
struct H<'a> {
    ae: Option<&'a str>,
    inm: Option<&'a str>,
    ims: Option<&'a str>,
    range: Option<&'a str>,
    if_range: Option<&'a str>,
}

fn call(sf: &StaticFiles, method: Method, target: &str, h: H<'_>, now_ms: u64) -> Response {
    let (path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (target, None),
    };
    // The codec hands handlers the canonical path, and answers 400 itself when there is none.
    let Ok(path) = tern_codec::canonical_path(path) else {
        return Response::text(400, "bad request\n");
    };
    let head = RequestHead {
        method,
        method_str: "GET",
        target,
        path,
        query,
        version: Version::Http11,
        head_len: 0,
        body: BodyKind::None,
        keep_alive: true,
        expect_continue: false,
        host: Some(b"localhost"),
        accept: None,
        accept_encoding: h.ae.map(str::as_bytes),
        if_none_match: h.inm.map(str::as_bytes),
        if_modified_since: h.ims.map(str::as_bytes),
        range: h.range.map(str::as_bytes),
        if_range: h.if_range.map(str::as_bytes),
        referer: None,
        user_agent: None,
        headers: &[],
        protocol: None,
    };
    let req = Request {
        head: &head,
        body: &[],
        peer: "127.0.0.1:9".parse().unwrap(),
        secure: false,
        local_port: 80,
        unix_secs: 0,
        now_ms,
    };
    sf.serve(&req)
}

fn get(sf: &StaticFiles, target: &str) -> Response {
    call(sf, Method::Get, target, H::default(), 0)
}

fn get_h(sf: &StaticFiles, target: &str, h: H<'_>) -> Response {
    call(sf, Method::Get, target, h, 0)
}

fn header(r: &Response, name: &str) -> Option<String> {
    let text = std::str::from_utf8(r.headers()).unwrap();
    text.split("\r\n").find_map(|line| {
        let (n, v) = line.split_once(": ")?;
        n.eq_ignore_ascii_case(name).then(|| v.to_owned())
    })
}

fn body(r: &Response) -> Vec<u8> {
    match &r.body {
        Body::Empty => Vec::new(),
        Body::Static(s) => s.to_vec(),
        Body::Owned(v) => v.clone(),
        Body::Shared(b) => b.to_vec(),
        Body::File(f) => {
            let mut buf = vec![0u8; f.len as usize];
            f.file.read_exact_at(&mut buf, f.offset).unwrap();
            buf
        }
    }
}

fn text(r: &Response) -> String {
    String::from_utf8(body(r)).unwrap()
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut d = libdeflater::Decompressor::new();
    let mut out = vec![0u8; 1 << 22];
    let n = d.gzip_decompress(b, &mut out).unwrap();
    out.truncate(n);
    out
}

fn unbrotli(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::Decompressor::new(b, 4096)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// `tmp/root` is served; `tmp/secret.txt` lies outside it.
struct Site {
    tmp: tempfile::TempDir,
}

impl Site {
    fn new() -> Site {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("root")).unwrap();
        std::fs::write(tmp.path().join("secret.txt"), "TOP SECRET").unwrap();
        Site { tmp }
    }

    fn root(&self) -> std::path::PathBuf {
        self.tmp.path().join("root")
    }

    fn write(&self, rel: &str, data: impl AsRef<[u8]>) -> &Site {
        let p = self.root().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
        self
    }

    fn serve(&self) -> StaticFiles {
        StaticFiles::new(StaticOptions::new(self.root())).unwrap()
    }

    fn serve_with(&self, f: impl FnOnce(&mut StaticOptions)) -> StaticFiles {
        let mut o = StaticOptions::new(self.root());
        f(&mut o);
        StaticFiles::new(o).unwrap()
    }
}

/// Compressible text of about `n` bytes.
fn prose(n: usize) -> String {
    let words = [
        "static", "files", "are", "served", "by", "tern", "quickly", "and", "safely",
    ];
    let mut s = String::with_capacity(n + 16);
    let mut i = 0usize;
    while s.len() < n {
        s.push_str(words[(i * 7 + i / 3) % words.len()]);
        s.push(if i % 11 == 10 { '\n' } else { ' ' });
        i += 1;
    }
    s.truncate(n);
    s
}

#[test]
fn serves_a_file_with_its_headers() {
    let site = Site::new();
    site.write("hello.txt", "hello world\n");
    let sf = site.serve();
    let r = get(&sf, "/hello.txt");
    assert_eq!(r.status, 200);
    assert_eq!(text(&r), "hello world\n");
    assert_eq!(
        header(&r, "Content-Type").unwrap(),
        "text/plain; charset=utf-8"
    );
    assert_eq!(header(&r, "Accept-Ranges").unwrap(), "bytes");
    let etag = header(&r, "ETag").unwrap();
    let inner = etag
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap();
    let parts: Vec<_> = inner.split('-').collect();
    assert_eq!(parts.len(), 3, "{etag}");
    assert!(
        parts.iter().all(|p| u128::from_str_radix(p, 16).is_ok()),
        "{etag}"
    );
    assert_eq!(parts[2], "c", "size in hex");
    let lm = header(&r, "Last-Modified").unwrap();
    assert!(httpdate::parse_http_date(&lm).is_ok(), "{lm}");
    assert!(
        header(&r, "Vary").is_none(),
        "nothing to vary on a tiny file"
    );
    assert!(header(&r, "Cache-Control").is_none());
    // The connection adds these itself.
    assert!(header(&r, "Content-Length").is_none());
    assert!(header(&r, "Date").is_none());

    // HEAD: the same response; the connection drops the body.
    let h = call(&sf, Method::Head, "/hello.txt", H::default(), 0);
    assert_eq!(h.status, 200);
    assert_eq!(h.headers(), r.headers());
    assert_eq!(h.body.len(), 12);

    // The query string is not part of the lookup.
    let q = get(&sf, "/hello.txt?v=123&x");
    assert_eq!(q.status, 200);
    assert_eq!(text(&q), "hello world\n");

    // A second request is a front-cache hit with identical output.
    let again = get(&sf, "/hello.txt");
    assert_eq!(again.headers(), r.headers());
    assert_eq!(body(&again), body(&r));
}

#[test]
fn other_methods_get_405() {
    let site = Site::new();
    site.write("a.txt", "a");
    let sf = site.serve();
    for m in [
        Method::Post,
        Method::Put,
        Method::Delete,
        Method::Options,
        Method::Patch,
        Method::Other,
    ] {
        let r = call(&sf, m, "/a.txt", H::default(), 0);
        assert_eq!(r.status, 405, "{m:?}");
        assert_eq!(header(&r, "Allow").unwrap(), "GET, HEAD");
        assert!(!body(&r).is_empty());
    }
}

#[test]
fn mime_types_and_charset() {
    let site = Site::new();
    let cases = [
        ("a.html", "text/html; charset=utf-8"),
        ("a.css", "text/css; charset=utf-8"),
        ("a.json", "application/json; charset=utf-8"),
        ("a.svg", "image/svg+xml; charset=utf-8"),
        ("a.xml", "text/xml; charset=utf-8"),
        ("a.png", "image/png"),
        ("a.woff2", "font/woff2"),
        ("a.wasm", "application/wasm"),
        ("a.tar.gz", "application/gzip"),
        ("LICENSE", "application/octet-stream"),
        ("a.weirdext", "application/octet-stream"),
    ];
    for (name, _) in cases {
        site.write(name, "x");
    }
    site.write("a.js", "x");
    let sf = site.serve();
    for (name, ct) in cases {
        let r = get(&sf, &format!("/{name}"));
        assert_eq!(r.status, 200, "{name}");
        let got = header(&r, "Content-Type").unwrap();
        // mime_guess maps .xml to text/xml or application/xml depending on version.
        if name == "a.xml" {
            assert!(got.ends_with("xml; charset=utf-8"), "{got}");
        } else {
            assert_eq!(got, ct, "{name}");
        }
    }
    let js = header(&get(&sf, "/a.js"), "Content-Type").unwrap();
    assert!(
        js == "text/javascript; charset=utf-8" || js == "application/javascript; charset=utf-8"
    );
}

#[test]
fn directories_index_and_redirect() {
    let site = Site::new();
    site.write("index.html", "<h1>home</h1>")
        .write("docs/index.html", "<h1>docs</h1>")
        .write("docs/page.html", "page")
        .write("empty/readme.txt", "no index here");
    let sf = site.serve();

    let r = get(&sf, "/");
    assert_eq!((r.status, text(&r).as_str()), (200, "<h1>home</h1>"));
    assert_eq!(
        header(&r, "Content-Type").unwrap(),
        "text/html; charset=utf-8"
    );

    let r = get(&sf, "/docs/");
    assert_eq!((r.status, text(&r).as_str()), (200, "<h1>docs</h1>"));
    let direct = get(&sf, "/docs/index.html");
    assert_eq!(header(&r, "ETag"), header(&direct, "ETag"));

    let r = get(&sf, "/docs");
    assert_eq!(r.status, 301);
    assert_eq!(header(&r, "Location").unwrap(), "/docs/");
    let r = get(&sf, "/docs?lang=en&x=1");
    assert_eq!(r.status, 301);
    assert_eq!(header(&r, "Location").unwrap(), "/docs/?lang=en&x=1");
    // Never a protocol-relative redirect.
    std::fs::create_dir(site.root().join("evil.example")).unwrap();
    let r = get(&sf, "//evil.example");
    assert_eq!(r.status, 301);
    assert_eq!(header(&r, "Location").unwrap(), "/evil.example/");

    // A directory without index.
    assert_eq!(get(&sf, "/empty/").status, 404);
    assert_eq!(get(&sf, "/empty").status, 301);
    // A file with a trailing slash is not a directory.
    assert_eq!(get(&sf, "/docs/page.html/").status, 404);
    assert_eq!(get(&sf, "/nope").status, 404);
    assert_eq!(get(&sf, "/nope/").status, 404);

    // A custom index name.
    site.write("docs/default.htm", "default");
    let sf2 = site.serve_with(|o| o.index_file = "default.htm".into());
    assert_eq!(text(&get(&sf2, "/docs/")), "default");
    assert_eq!(get(&sf2, "/").status, 404);
}

#[test]
fn not_found_page_is_small_html() {
    let site = Site::new();
    let sf = site.serve();
    let r = get(&sf, "/missing.html");
    assert_eq!(r.status, 404);
    assert_eq!(
        header(&r, "Content-Type").unwrap(),
        "text/html; charset=utf-8"
    );
    let page = text(&r);
    assert!(page.contains("404") && page.len() < 512, "{page}");
    assert!(header(&r, "ETag").is_none());
}

#[test]
fn traversal_attempts_never_reach_outside() {
    let site = Site::new();
    site.write("a/b/c.txt", "inside")
        .write("index.html", "home");
    let sf = site.serve();
    for target in [
        "/../secret.txt",
        "/../../etc/passwd",
        "/../etc/passwd",
        "/%2e%2e/secret.txt",
        "/%2e%2e/",
        "/%2E%2E/%2e%2e/etc/passwd",
        "/a/%2e%2e/%2e%2e/secret.txt",
        "/a/%2e%2e/%2e%2e/x",
        "/a/b/../../../secret.txt",
        "/..%2f..%2fsecret.txt",
        "/..%2f..%2f",
        "/a%2f..%2f..%2fsecret.txt",
        "/a/b/c.txt%00.html",
        "/%00",
        "/a\\..\\..\\secret.txt",
        "/..\\secret.txt",
        "/a%5c..%5c..%5csecret.txt",
        "/%zz",
        "/a%2",
    ] {
        let r = get(&sf, target);
        assert!(r.status == 400 || r.status == 404, "{target}: {}", r.status);
        assert!(!text(&r).contains("SECRET"), "{target}");
        assert!(!text(&r).contains("root:"), "{target}");
    }
    // Dot segments that stay inside are normalised and served.
    assert_eq!(text(&get(&sf, "/a/b/../b/./c.txt")), "inside");
    assert_eq!(text(&get(&sf, "/a//b/c.txt")), "inside");
    assert_eq!(text(&get(&sf, "/a/%62/c%2Etxt")), "inside");
    assert_eq!(get(&sf, "/a/b/..").status, 404); // names directory /a/, which has no index
    assert_eq!(text(&get(&sf, "/a/..")), "home");
}

#[test]
fn symlinks_outside_are_refused_inside_are_served() {
    let site = Site::new();
    site.write("real/file.txt", "real content");
    let root = site.root();
    let outside = site.tmp.path();
    std::os::unix::fs::symlink("../secret.txt", root.join("rel-escape.txt")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), root.join("abs-escape.txt")).unwrap();
    std::os::unix::fs::symlink("..", root.join("updir")).unwrap();
    std::os::unix::fs::symlink(outside, root.join("abs-dir")).unwrap();
    std::os::unix::fs::symlink("real/file.txt", root.join("inside.txt")).unwrap();
    std::os::unix::fs::symlink("real", root.join("inside-dir")).unwrap();
    std::os::unix::fs::symlink("/proc/self/root/etc/passwd", root.join("magic")).unwrap();
    std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
    let sf = site.serve();

    for target in [
        "/rel-escape.txt",
        "/abs-escape.txt",
        "/updir/secret.txt",
        "/abs-dir/secret.txt",
        "/magic",
        "/loop",
    ] {
        let r = get(&sf, target);
        assert_eq!(r.status, 404, "{target}");
        assert!(!text(&r).contains("SECRET"), "{target}");
    }
    assert_eq!(text(&get(&sf, "/inside.txt")), "real content");
    assert_eq!(text(&get(&sf, "/inside-dir/file.txt")), "real content");

    // A symlink swapped to point outside after it was cached is caught at revalidation.
    std::fs::remove_file(root.join("inside.txt")).unwrap();
    std::os::unix::fs::symlink("../secret.txt", root.join("inside.txt")).unwrap();
    let r = call(&sf, Method::Get, "/inside.txt", H::default(), 10_000);
    assert_eq!(r.status, 404);
    assert!(!text(&r).contains("SECRET"));
}

#[test]
fn dotfiles_are_hidden_unless_enabled() {
    let site = Site::new();
    site.write(".env", "PASSWORD=x")
        .write(".git/config", "[core]")
        .write("a/.hidden", "h")
        .write(".well-known/security.txt", "contact");
    let sf = site.serve();
    for t in [
        "/.env",
        "/.git/config",
        "/a/.hidden",
        "/.well-known/security.txt",
        "/%2eenv",
        "/.git/",
    ] {
        assert_eq!(get(&sf, t).status, 404, "{t}");
    }
    let sf = site.serve_with(|o| o.serve_dotfiles = true);
    assert_eq!(text(&get(&sf, "/.env")), "PASSWORD=x");
    assert_eq!(text(&get(&sf, "/.git/config")), "[core]");
    assert_eq!(text(&get(&sf, "/.well-known/security.txt")), "contact");
}

#[test]
fn etag_and_last_modified_give_304() {
    let site = Site::new();
    site.write("page.html", prose(4000));
    let sf = site.serve_with(|o| o.cache_control = Some("public, max-age=60".into()));
    let r = get(&sf, "/page.html");
    let etag = header(&r, "ETag").unwrap();
    let lm = header(&r, "Last-Modified").unwrap();
    assert_eq!(header(&r, "Cache-Control").unwrap(), "public, max-age=60");

    let check_304 = |r: &Response| {
        assert_eq!(r.status, 304);
        assert!(r.body.is_empty());
        assert_eq!(header(r, "ETag").unwrap(), etag);
        assert_eq!(header(r, "Last-Modified").unwrap(), lm);
        assert_eq!(header(r, "Cache-Control").unwrap(), "public, max-age=60");
        assert_eq!(header(r, "Vary").unwrap(), "Accept-Encoding");
        assert!(header(r, "Content-Type").is_none());
    };
    check_304(&get_h(
        &sf,
        "/page.html",
        H {
            inm: Some(&etag),
            ..H::default()
        },
    ));
    let weak = format!("W/{etag}");
    check_304(&get_h(
        &sf,
        "/page.html",
        H {
            inm: Some(&weak),
            ..H::default()
        },
    ));
    let list = format!("\"nope\", {etag}");
    check_304(&get_h(
        &sf,
        "/page.html",
        H {
            inm: Some(&list),
            ..H::default()
        },
    ));
    check_304(&get_h(
        &sf,
        "/page.html",
        H {
            inm: Some("*"),
            ..H::default()
        },
    ));
    check_304(&get_h(
        &sf,
        "/page.html",
        H {
            ims: Some(&lm),
            ..H::default()
        },
    ));
    check_304(&get_h(
        &sf,
        "/page.html",
        H {
            ims: Some("Fri, 01 Jan 2100 00:00:00 GMT"),
            ..H::default()
        },
    ));
    let h304 = call(
        &sf,
        Method::Head,
        "/page.html",
        H {
            inm: Some(&etag),
            ..H::default()
        },
        0,
    );
    check_304(&h304);

    // Not modified since an older date: 200.
    let old = get_h(
        &sf,
        "/page.html",
        H {
            ims: Some("Thu, 01 Jan 1970 00:00:01 GMT"),
            ..H::default()
        },
    );
    assert_eq!(old.status, 200);
    // If-None-Match wins over If-Modified-Since when present.
    let r = get_h(
        &sf,
        "/page.html",
        H {
            inm: Some("\"other\""),
            ims: Some(&lm),
            ..H::default()
        },
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 4000);
    // A tag for another representation does not match.
    let gz_tag = format!("{}-gz\"", etag.trim_end_matches('"'));
    let r = get_h(
        &sf,
        "/page.html",
        H {
            inm: Some(&gz_tag),
            ..H::default()
        },
    );
    assert_eq!(r.status, 200);
    let r = get_h(
        &sf,
        "/page.html",
        H {
            inm: Some(&gz_tag),
            ae: Some("gzip"),
            ..H::default()
        },
    );
    assert_eq!(r.status, 304);
    assert_eq!(header(&r, "ETag").unwrap(), gz_tag);
    // Garbage dates are ignored.
    assert_eq!(
        get_h(
            &sf,
            "/page.html",
            H {
                ims: Some("yesterday"),
                ..H::default()
            }
        )
        .status,
        200
    );
    // 404 carries no Cache-Control.
    assert!(header(&get(&sf, "/nope"), "Cache-Control").is_none());
}

#[test]
fn ranges_on_small_files() {
    let site = Site::new();
    let data: String = (0..1000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    site.write("abc.txt", &data).write("empty.txt", "");
    let sf = site.serve_with(|o| o.cache_control = Some("no-cache".into()));
    let rng = |r: &str| {
        get_h(
            &sf,
            "/abc.txt",
            H {
                range: Some(r),
                ..H::default()
            },
        )
    };

    let r = rng("bytes=0-9");
    assert_eq!(r.status, 206);
    assert_eq!(header(&r, "Content-Range").unwrap(), "bytes 0-9/1000");
    assert_eq!(text(&r), &data[0..10]);
    assert_eq!(header(&r, "Cache-Control").unwrap(), "no-cache");
    assert!(header(&r, "ETag").is_some());

    let r = rng("bytes=990-");
    assert_eq!(
        (r.status, header(&r, "Content-Range").unwrap()),
        (206, "bytes 990-999/1000".into())
    );
    assert_eq!(text(&r), &data[990..]);

    let r = rng("bytes=-5");
    assert_eq!(header(&r, "Content-Range").unwrap(), "bytes 995-999/1000");
    assert_eq!(text(&r), &data[995..]);

    let r = rng("bytes=500-5000");
    assert_eq!(header(&r, "Content-Range").unwrap(), "bytes 500-999/1000");
    assert_eq!(r.body.len(), 500);

    for bad in ["bytes=1000-", "bytes=1000-1001", "bytes=-0", "bytes=9-3"] {
        let r = rng(bad);
        assert_eq!(r.status, 416, "{bad}");
        assert_eq!(
            header(&r, "Content-Range").unwrap(),
            "bytes */1000",
            "{bad}"
        );
    }
    for ignored in ["bytes=0-1,5-6", "lines=1-2", "bytes=x-y"] {
        let r = rng(ignored);
        assert_eq!(r.status, 200, "{ignored}");
        assert_eq!(r.body.len(), 1000);
        assert_eq!(header(&r, "Accept-Ranges").unwrap(), "bytes");
    }

    // If-Range: matching tag or date → 206; anything else → the full 200.
    let full = get(&sf, "/abc.txt");
    let etag = header(&full, "ETag").unwrap();
    let lm = header(&full, "Last-Modified").unwrap();
    let ir = |v: &str| {
        get_h(
            &sf,
            "/abc.txt",
            H {
                range: Some("bytes=0-0"),
                if_range: Some(v),
                ..H::default()
            },
        )
    };
    assert_eq!(ir(&etag).status, 206);
    assert_eq!(ir(&lm).status, 206);
    assert_eq!(ir("\"stale\"").status, 200);
    assert_eq!(ir(&format!("W/{etag}")).status, 200);
    assert_eq!(ir("Thu, 01 Jan 1970 00:00:01 GMT").status, 200);

    // HEAD ignores Range.
    let h = call(
        &sf,
        Method::Head,
        "/abc.txt",
        H {
            range: Some("bytes=0-9"),
            ..H::default()
        },
        0,
    );
    assert_eq!(h.status, 200);

    // A 304 takes precedence over a range.
    let r = get_h(
        &sf,
        "/abc.txt",
        H {
            range: Some("bytes=0-9"),
            inm: Some(&etag),
            ..H::default()
        },
    );
    assert_eq!(r.status, 304);

    // Empty file: every range is unsatisfiable.
    let r = get_h(
        &sf,
        "/empty.txt",
        H {
            range: Some("bytes=0-"),
            ..H::default()
        },
    );
    assert_eq!(
        (r.status, header(&r, "Content-Range").unwrap()),
        (416, "bytes */0".into())
    );
    let r = get(&sf, "/empty.txt");
    assert_eq!((r.status, r.body.len()), (200, 0));
}

#[test]
fn compression_negotiation() {
    let site = Site::new();
    let page = prose(20_000);
    site.write("page.html", &page)
        .write("tiny.txt", "tiny")
        .write("pic.png", prose(20_000));
    let sf = site.serve();
    let ae = |v: Option<&str>| {
        get_h(
            &sf,
            "/page.html",
            H {
                ae: v,
                ..H::default()
            },
        )
    };

    let plain = ae(None);
    assert_eq!(plain.status, 200);
    assert!(header(&plain, "Content-Encoding").is_none());
    assert_eq!(header(&plain, "Vary").unwrap(), "Accept-Encoding");
    assert_eq!(header(&plain, "Accept-Ranges").unwrap(), "bytes");
    assert_eq!(body(&plain), page.as_bytes());
    let id_tag = header(&plain, "ETag").unwrap();

    let gz = ae(Some("gzip, deflate"));
    assert_eq!(header(&gz, "Content-Encoding").unwrap(), "gzip");
    assert_eq!(header(&gz, "Vary").unwrap(), "Accept-Encoding");
    assert_eq!(
        header(&gz, "Content-Type").unwrap(),
        "text/html; charset=utf-8"
    );
    assert!(header(&gz, "Accept-Ranges").is_none());
    let gz_tag = header(&gz, "ETag").unwrap();
    assert_eq!(gz_tag, format!("{}-gz\"", id_tag.trim_end_matches('"')));
    assert!(gz.body.len() < page.len() as u64 / 2);
    assert_eq!(gunzip(&body(&gz)), page.as_bytes());

    let br = ae(Some("gzip, deflate, br, zstd"));
    assert_eq!(header(&br, "Content-Encoding").unwrap(), "br");
    assert!(header(&br, "ETag").unwrap().ends_with("-br\""));
    assert_eq!(unbrotli(&body(&br)), page.as_bytes());

    let enc = |v: &str| header(&ae(Some(v)), "Content-Encoding");
    assert_eq!(enc("br;q=0, gzip").as_deref(), Some("gzip"));
    assert_eq!(enc("gzip;q=0.5, br;q=0.4").as_deref(), Some("gzip"));
    assert_eq!(enc("gzip;q=0.4, br;q=0.5").as_deref(), Some("br"));
    assert_eq!(enc("*").as_deref(), Some("br"));
    assert_eq!(enc("*;q=0.5, br;q=0").as_deref(), Some("gzip"));
    assert_eq!(enc("identity;q=0, gzip;q=0.2").as_deref(), Some("gzip"));
    assert_eq!(enc("identity, gzip;q=0.5").as_deref(), None);
    assert_eq!(enc("gzip;q=0, br;q=0").as_deref(), None);
    assert_eq!(enc("deflate, zstd").as_deref(), None);

    // A range is answered from the identity representation even when gzip is accepted.
    let r = get_h(
        &sf,
        "/page.html",
        H {
            ae: Some("gzip, br"),
            range: Some("bytes=0-99"),
            ..H::default()
        },
    );
    assert_eq!(r.status, 206);
    assert!(header(&r, "Content-Encoding").is_none());
    assert_eq!(body(&r), &page.as_bytes()[..100]);
    // If-Range with the gzip tag does not match the identity: full (compressed) 200.
    let r = get_h(
        &sf,
        "/page.html",
        H {
            ae: Some("gzip"),
            range: Some("bytes=0-99"),
            if_range: Some(&gz_tag),
            ..H::default()
        },
    );
    assert_eq!(r.status, 200);
    assert_eq!(header(&r, "Content-Encoding").unwrap(), "gzip");

    // Not compressed: tiny files and incompressible types.
    let t = get_h(
        &sf,
        "/tiny.txt",
        H {
            ae: Some("gzip, br"),
            ..H::default()
        },
    );
    assert!(header(&t, "Content-Encoding").is_none() && header(&t, "Vary").is_none());
    let p = get_h(
        &sf,
        "/pic.png",
        H {
            ae: Some("gzip, br"),
            ..H::default()
        },
    );
    assert!(header(&p, "Content-Encoding").is_none() && header(&p, "Vary").is_none());
    assert_eq!(p.body.len(), 20_000);

    // Each encoding was computed once.
    assert_eq!(sf.cache_stats().compressions, 2);
}

#[test]
fn precompressed_siblings_are_used_as_is() {
    let site = Site::new();
    let js = prose(10_000);
    // Distinctive content so we can tell the sibling was sent rather than a fresh compression.
    let sibling_gz = encoding::gzip(b"PRECOMPRESSED GZIP");
    site.write("app.js", &js).write("app.js.gz", &sibling_gz);
    let sf = site.serve();

    let gz = get_h(
        &sf,
        "/app.js",
        H {
            ae: Some("gzip"),
            ..H::default()
        },
    );
    assert_eq!(header(&gz, "Content-Encoding").unwrap(), "gzip");
    assert_eq!(body(&gz), sibling_gz);
    assert!(header(&gz, "Content-Type").unwrap().contains("javascript"));
    assert!(header(&gz, "ETag").unwrap().ends_with("-gz\""));
    // Brotli is still computed (no .br beside it), gzip is not.
    let br = get_h(
        &sf,
        "/app.js",
        H {
            ae: Some("br"),
            ..H::default()
        },
    );
    assert_eq!(unbrotli(&body(&br)), js.as_bytes());
    assert_eq!(sf.cache_stats().compressions, 1);
    // The sibling itself is an ordinary file.
    let raw = get(&sf, "/app.js.gz");
    assert_eq!(header(&raw, "Content-Type").unwrap(), "application/gzip");
    assert!(header(&raw, "Content-Encoding").is_none());

    // Precompressed variants work for large files too, and go out as files.
    let big = prose(300_000);
    let big_gz = encoding::gzip(big.as_bytes());
    let big_br = encoding::brotli(big.as_bytes());
    site.write("big.css", &big)
        .write("big.css.gz", &big_gz)
        .write("big.css.br", &big_br);
    let sf = site.serve_with(|o| o.max_cached_size = 1000);
    let r = get_h(
        &sf,
        "/big.css",
        H {
            ae: Some("gzip"),
            ..H::default()
        },
    );
    assert_eq!(header(&r, "Content-Encoding").unwrap(), "gzip");
    assert!(matches!(&r.body, Body::File(f) if f.offset == 0 && f.len == big_gz.len() as u64));
    assert_eq!(gunzip(&body(&r)), big.as_bytes());
    let r = get_h(
        &sf,
        "/big.css",
        H {
            ae: Some("br, gzip"),
            ..H::default()
        },
    );
    assert_eq!(header(&r, "Content-Encoding").unwrap(), "br");
    assert_eq!(unbrotli(&body(&r)), big.as_bytes());
    assert_eq!(header(&r, "Vary").unwrap(), "Accept-Encoding");
    let r = get(&sf, "/big.css");
    assert!(matches!(&r.body, Body::File(f) if f.len == big.len() as u64));
    assert_eq!(sf.cache_stats().compressions, 0);
}

#[test]
fn large_files_go_out_as_file_bodies() {
    let site = Site::new();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    site.write("video.bin", &data);
    let sf = site.serve_with(|o| o.max_cached_size = 64 * 1024);
    let r = get(&sf, "/video.bin");
    assert_eq!(r.status, 200);
    let Body::File(f) = &r.body else {
        panic!("expected a file body, got {:?}", r.body)
    };
    assert_eq!((f.offset, f.len), (0, 200_000));
    assert_eq!(body(&r), data);
    assert_eq!(header(&r, "Accept-Ranges").unwrap(), "bytes");

    let r = get_h(
        &sf,
        "/video.bin",
        H {
            range: Some("bytes=1000-1999"),
            ..H::default()
        },
    );
    assert_eq!(r.status, 206);
    let Body::File(f) = &r.body else { panic!() };
    assert_eq!((f.offset, f.len), (1000, 1000));
    assert_eq!(body(&r), &data[1000..2000]);
    let r = get_h(
        &sf,
        "/video.bin",
        H {
            range: Some("bytes=-100"),
            ..H::default()
        },
    );
    let Body::File(f) = &r.body else { panic!() };
    assert_eq!((f.offset, f.len), (199_900, 100));
    assert_eq!(
        header(&r, "Content-Range").unwrap(),
        "bytes 199900-199999/200000"
    );
    let r = get_h(
        &sf,
        "/video.bin",
        H {
            range: Some("bytes=150000-"),
            ..H::default()
        },
    );
    let Body::File(f) = &r.body else { panic!() };
    assert_eq!((f.offset, f.len), (150_000, 50_000));
    let r = get_h(
        &sf,
        "/video.bin",
        H {
            range: Some("bytes=200000-"),
            ..H::default()
        },
    );
    assert_eq!(r.status, 416);

    // Exactly at the threshold is in memory; one byte more is not.
    site.write("edge.bin", vec![1u8; 64 * 1024])
        .write("edge1.bin", vec![1u8; 64 * 1024 + 1]);
    assert!(matches!(get(&sf, "/edge.bin").body, Body::Shared(_)));
    assert!(matches!(get(&sf, "/edge1.bin").body, Body::File(_)));
    let stats = sf.cache_stats();
    assert!(stats.open_files >= 2, "{stats:?}");
}

#[test]
fn changes_are_seen_after_revalidation() {
    let site = Site::new();
    site.write("f.txt", "version one");
    let sf = site.serve();
    let at = |ms: u64| call(&sf, Method::Get, "/f.txt", H::default(), ms);

    assert_eq!(text(&at(1000)), "version one");
    let tag1 = header(&at(1000), "ETag").unwrap();
    site.write("f.txt", "version two, longer");
    // Within the revalidation interval the cached copy is served without touching the disk.
    assert_eq!(text(&at(1400)), "version one");
    // After it, the change is seen.
    let r = at(1600);
    assert_eq!(text(&r), "version two, longer");
    assert_ne!(header(&r, "ETag").unwrap(), tag1);

    // Same size, different mtime: still noticed.
    site.write("f.txt", "version TWO, longer");
    let f = std::fs::File::options()
        .write(true)
        .open(site.root().join("f.txt"))
        .unwrap();
    f.set_modified(SystemTime::now() + Duration::from_secs(5))
        .unwrap();
    drop(f);
    assert_eq!(text(&at(2200)), "version TWO, longer");

    // Removed: 404 after revalidation, and it stays gone.
    std::fs::remove_file(site.root().join("f.txt")).unwrap();
    assert_eq!(at(2300).status, 200); // still cached
    assert_eq!(at(2800).status, 404);
    assert_eq!(at(2801).status, 404);
    assert_eq!(sf.cache_stats().entries, 0);

    // Added: misses are never cached, so a new file is served at once.
    assert_eq!(
        call(&sf, Method::Get, "/new.txt", H::default(), 2900).status,
        404
    );
    site.write("new.txt", "fresh");
    assert_eq!(
        text(&call(&sf, Method::Get, "/new.txt", H::default(), 2901)),
        "fresh"
    );

    // Replaced by rename (a new inode), as deploy tools do.
    site.write("f.txt", "v3");
    assert_eq!(text(&at(3000)), "v3");
    site.write("f.txt.tmp", "v4");
    std::fs::rename(site.root().join("f.txt.tmp"), site.root().join("f.txt")).unwrap();
    assert_eq!(text(&at(3600)), "v4");

    // An index.html added to a directory that had none.
    std::fs::create_dir(site.root().join("d")).unwrap();
    assert_eq!(
        call(&sf, Method::Get, "/d/", H::default(), 4000).status,
        404
    );
    site.write("d/index.html", "now indexed");
    assert_eq!(
        text(&call(&sf, Method::Get, "/d/", H::default(), 4001)),
        "now indexed"
    );
}

#[test]
fn sibling_changes_are_seen_after_revalidation() {
    let site = Site::new();
    let css = prose(5000);
    site.write("s.css", &css);
    let sf = site.serve();
    let gz = |ms: u64| {
        call(
            &sf,
            Method::Get,
            "/s.css",
            H {
                ae: Some("gzip"),
                ..H::default()
            },
            ms,
        )
    };
    assert_eq!(gunzip(&body(&gz(0))), css.as_bytes());
    let custom = encoding::gzip(b"CUSTOM");
    site.write("s.css.gz", &custom);
    assert_eq!(
        body(&gz(100)),
        encoding::gzip(css.as_bytes()),
        "still cached"
    );
    assert_eq!(body(&gz(700)), custom, "sibling added");
    std::fs::remove_file(site.root().join("s.css.gz")).unwrap();
    assert_eq!(gunzip(&body(&gz(1400))), css.as_bytes(), "sibling removed");
}

#[test]
fn workers_share_entries_and_compress_once() {
    let site = Site::new();
    let page = prose(30_000);
    site.write("shared.html", &page);
    let sf = std::sync::Arc::new(site.serve());
    let tags: Vec<String> = (0..4)
        .map(|_| {
            let sf = sf.clone();
            std::thread::spawn(move || {
                let r = call(
                    &sf,
                    Method::Get,
                    "/shared.html",
                    H {
                        ae: Some("br"),
                        ..H::default()
                    },
                    0,
                );
                assert_eq!(header(&r, "Content-Encoding").unwrap(), "br");
                header(&r, "ETag").unwrap()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    assert!(tags.windows(2).all(|w| w[0] == w[1]));
    // Threads that race on the very first miss may each compress; later ones reuse.
    let first = sf.cache_stats().compressions;
    assert!((2..=8).contains(&first), "{first}");
    let sf2 = sf.clone();
    std::thread::spawn(move || {
        call(
            &sf2,
            Method::Get,
            "/shared.html",
            H {
                ae: Some("gzip"),
                ..H::default()
            },
            0,
        )
    })
    .join()
    .unwrap();
    assert_eq!(sf.cache_stats().compressions, first);
    assert_eq!(sf.cache_stats().entries, 1);
}

#[test]
fn cache_memory_is_bounded() {
    let site = Site::new();
    for i in 0..20 {
        site.write(&format!("f{i}.bin"), vec![i as u8; 10_000]);
    }
    let limit = 50_000;
    let sf = StaticFiles::with_cache_limits(StaticOptions::new(site.root()), limit, 10).unwrap();
    for round in 0..3u64 {
        for i in 0..20 {
            let r = call(
                &sf,
                Method::Get,
                &format!("/f{i}.bin"),
                H::default(),
                round * 1000,
            );
            assert_eq!(r.status, 200);
            assert_eq!(body(&r), vec![i as u8; 10_000]);
            let st = sf.cache_stats();
            assert!(st.bytes <= limit, "{st:?}");
        }
    }
    let st = sf.cache_stats();
    assert!(st.evictions > 0, "{st:?}");
    assert!(st.entries >= 1, "{st:?}");

    // Descriptors of large files are bounded too.
    let sf = StaticFiles::with_cache_limits(
        StaticOptions {
            max_cached_size: 100,
            ..StaticOptions::new(site.root())
        },
        limit,
        2,
    )
    .unwrap();
    for i in 0..20 {
        let r = get(&sf, &format!("/f{i}.bin"));
        assert!(matches!(r.body, Body::File(_)));
        assert_eq!(body(&r), vec![i as u8; 10_000]);
        assert!(sf.cache_stats().open_files <= 2);
    }
}

#[test]
fn special_files_are_not_served() {
    let site = Site::new();
    let fifo = site.root().join("pipe");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string path; mkfifo only creates a node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let sf = site.serve();
    // Must answer at once (O_NONBLOCK), not hang waiting for a writer.
    assert_eq!(get(&sf, "/pipe").status, 404);
}

#[test]
fn constructor_validates() {
    let site = Site::new();
    let missing = StaticFiles::new(StaticOptions::new(site.root().join("nope"))).unwrap_err();
    assert!(missing.to_string().contains("nope"), "{missing}");
    site.write("file.txt", "x");
    let file = StaticFiles::new(StaticOptions::new(site.root().join("file.txt"))).unwrap_err();
    assert!(file.to_string().contains("not a directory"), "{file}");
    for bad in ["", "a/b", "..", "."] {
        let o = StaticOptions {
            index_file: bad.into(),
            ..StaticOptions::new(site.root())
        };
        assert!(StaticFiles::new(o).is_err(), "{bad:?}");
    }
    let o = StaticOptions {
        cache_control: Some("max-age=1\r\nX-Evil: 1".into()),
        ..StaticOptions::new(site.root())
    };
    assert!(StaticFiles::new(o).is_err());
    let o = StaticOptions {
        cache_control: Some(String::new()),
        ..StaticOptions::new(site.root())
    };
    let sf = StaticFiles::new(o).unwrap();
    assert!(header(&get(&sf, "/file.txt"), "Cache-Control").is_none());
    assert_eq!(StaticOptions::default().max_cached_size, 64 * 1024);
    assert_eq!(StaticOptions::default().index_file, "index.html");
    assert!(Path::new(&StaticOptions::new("/srv").root).is_absolute());
}

#[test]
fn non_utf8_and_encoded_names() {
    let site = Site::new();
    site.write("a b.txt", "space")
        .write("caf\u{e9}.txt", "accent");
    std::fs::create_dir(site.root().join("sp ace")).unwrap();
    let sf = site.serve();
    assert_eq!(text(&get(&sf, "/a%20b.txt")), "space");
    assert_eq!(text(&get(&sf, "/caf%C3%A9.txt")), "accent");
    let r = get(&sf, "/sp%20ace");
    assert_eq!(r.status, 301);
    assert_eq!(header(&r, "Location").unwrap(), "/sp%20ace/");
    assert_eq!(get(&sf, "/%FF%FE").status, 404);
}

#[test]
fn root_symlink_switch_is_followed() {
    let tmp = tempfile::tempdir().unwrap();
    for (v, body) in [("v1", "release one"), ("v2", "release two")] {
        std::fs::create_dir(tmp.path().join(v)).unwrap();
        std::fs::write(tmp.path().join(v).join("index.html"), body).unwrap();
    }
    let current = tmp.path().join("current");
    std::os::unix::fs::symlink("v1", &current).unwrap();
    let sf = StaticFiles::new(StaticOptions::new(&current)).unwrap();
    assert_eq!(
        text(&call(&sf, Method::Get, "/", H::default(), 0)),
        "release one"
    );

    // A deploy switches the symlink atomically.
    std::os::unix::fs::symlink("v2", tmp.path().join("current.new")).unwrap();
    std::fs::rename(tmp.path().join("current.new"), &current).unwrap();
    // The root path is re-checked on the real clock at most every 500 ms.
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        text(&call(&sf, Method::Get, "/", H::default(), 600)),
        "release two"
    );
    assert_eq!(
        text(&call(&sf, Method::Get, "/index.html", H::default(), 601)),
        "release two"
    );
}

#[test]
fn last_modified_covers_precompressed_siblings() {
    let site = Site::new();
    site.write("a.css", prose(2000))
        .write("a.css.gz", encoding::gzip(prose(2000).as_bytes()));
    let set_mtime = |name: &str, secs: u64| {
        let f = std::fs::File::options()
            .write(true)
            .open(site.root().join(name))
            .unwrap();
        f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
            .unwrap();
    };
    set_mtime("a.css", 1_000_000_000);
    set_mtime("a.css.gz", 1_500_000_000);
    let sf = site.serve();
    let r = get(&sf, "/a.css");
    let lm = header(&r, "Last-Modified").unwrap();
    assert_eq!(
        httpdate::parse_http_date(&lm).unwrap(),
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_500_000_000)
    );
    let ims = httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(1_200_000_000));
    assert_eq!(
        get_h(
            &sf,
            "/a.css",
            H {
                ims: Some(&ims),
                ..H::default()
            }
        )
        .status,
        200
    );
}

#[test]
fn unservable_sibling_is_ignored_and_stable() {
    let site = Site::new();
    let js = prose(5000);
    site.write("app.js", &js);
    std::os::unix::fs::symlink("../secret.txt", site.root().join("app.js.gz")).unwrap();
    std::fs::create_dir(site.root().join("app.js.br")).unwrap();
    let sf = site.serve();
    let gz = |ms: u64| {
        call(
            &sf,
            Method::Get,
            "/app.js",
            H {
                ae: Some("gzip, br"),
                ..H::default()
            },
            ms,
        )
    };
    let r = gz(0);
    // Neither the escaping .gz nor the .br directory is used: a computed br is sent.
    assert_eq!(header(&r, "Content-Encoding").unwrap(), "br");
    assert_eq!(unbrotli(&body(&r)), js.as_bytes());
    let r = call(
        &sf,
        Method::Get,
        "/app.js",
        H {
            ae: Some("gzip"),
            ..H::default()
        },
        0,
    );
    assert_eq!(gunzip(&body(&r)), js.as_bytes());
    let compressions = sf.cache_stats().compressions;
    // Revalidation does not mistake them for changes (no rebuild, no recompression).
    for ms in [600, 1200, 1800] {
        assert_eq!(gz(ms).status, 200);
    }
    assert_eq!(sf.cache_stats().compressions, compressions);
}

// ---------------------------------------------------------------------------------------------
// Reload (SIGHUP)
// ---------------------------------------------------------------------------------------------

/// Two sites side by side: `tmp/a` and `tmp/b`, each with `index.html` and `f.txt` naming it.
fn two_roots() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    for (dir, name) in [(&a, "A"), (&b, "B")] {
        std::fs::create_dir(dir).unwrap();
        std::fs::write(dir.join("index.html"), format!("index {name}")).unwrap();
        std::fs::write(dir.join("f.txt"), format!("file {name}")).unwrap();
        std::fs::write(dir.join(".hidden"), format!("hidden {name}")).unwrap();
    }
    (tmp, a, b)
}

#[test]
fn reload_switches_root_at_once_on_a_worker() {
    let (_tmp, a, b) = two_roots();
    let sf = StaticFiles::new(StaticOptions::new(&a)).unwrap();
    assert_eq!(text(&get(&sf, "/f.txt")), "file A");
    assert_eq!(text(&get(&sf, "/")), "index A");
    assert_eq!(sf.cache_stats().entries, 2);

    sf.reload(StaticOptions::new(&b)).unwrap();
    assert_eq!(sf.cache_stats().entries, 0, "the shared cache is emptied");
    assert_eq!(sf.options().root, b);
    // What a worker does at its next loop turn.
    forget_thread_caches();
    assert_eq!(text(&get(&sf, "/f.txt")), "file B");
    assert_eq!(text(&get(&sf, "/")), "index B");
}

#[test]
fn reload_is_followed_by_other_threads_at_their_next_revalidation() {
    let (_tmp, a, b) = two_roots();
    let sf = StaticFiles::new(StaticOptions::new(&a)).unwrap();
    assert_eq!(
        text(&call(&sf, Method::Get, "/f.txt", H::default(), 0)),
        "file A"
    );
    sf.reload(StaticOptions::new(&b)).unwrap();
    // Not a tern worker: no front reset, so a fresh front hit may still answer...
    assert_eq!(
        text(&call(&sf, Method::Get, "/f.txt", H::default(), 1)),
        "file A"
    );
    // ...but a miss or a revalidation notices the new generation.
    assert_eq!(
        text(&call(&sf, Method::Get, "/", H::default(), 2)),
        "index B"
    );
    assert_eq!(
        text(&call(&sf, Method::Get, "/f.txt", H::default(), 3)),
        "file B",
        "the front was reset by the miss"
    );
}

#[test]
fn reload_to_unusable_root_keeps_the_old_one() {
    let (tmp, a, _b) = two_roots();
    let sf = StaticFiles::new(StaticOptions::new(&a)).unwrap();
    assert_eq!(text(&get(&sf, "/f.txt")), "file A");
    let missing = tmp.path().join("missing");
    let err = sf.reload(StaticOptions::new(&missing)).unwrap_err();
    assert!(err.to_string().contains("missing"), "{err}");
    let file = a.join("f.txt");
    assert!(sf.reload(StaticOptions::new(&file)).is_err());
    let bad_cc = StaticOptions {
        cache_control: Some("a\nb".into()),
        ..StaticOptions::new(&a)
    };
    assert!(sf.reload(bad_cc).is_err());
    assert_eq!(sf.options().root, a);
    forget_thread_caches();
    assert_eq!(
        text(&call(&sf, Method::Get, "/f.txt", H::default(), 10_000)),
        "file A"
    );
    assert!(header(&get(&sf, "/f.txt"), "Cache-Control").is_none());
}

#[test]
fn reload_applies_options() {
    let (_tmp, a, _b) = two_roots();
    let sf = StaticFiles::new(StaticOptions::new(&a)).unwrap();
    assert_eq!(get(&sf, "/.hidden").status, 404);
    assert!(header(&get(&sf, "/f.txt"), "Cache-Control").is_none());
    sf.reload(StaticOptions {
        serve_dotfiles: true,
        cache_control: Some("public, max-age=60".into()),
        max_cached_size: 0,
        ..StaticOptions::new(&a)
    })
    .unwrap();
    forget_thread_caches();
    assert_eq!(text(&get(&sf, "/.hidden")), "hidden A");
    let r = get(&sf, "/f.txt");
    assert_eq!(header(&r, "Cache-Control").unwrap(), "public, max-age=60");
    assert!(
        matches!(r.body, Body::File(_)),
        "max_cached_size 0: sent from disk"
    );
}

#[test]
fn reload_with_same_options_sees_a_replaced_directory_at_once() {
    let (tmp, a, _b) = two_roots();
    let sf = StaticFiles::new(StaticOptions::new(&a)).unwrap();
    assert_eq!(text(&get(&sf, "/f.txt")), "file A");
    // Swap another directory in under the same path.
    let fresh = tmp.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    std::fs::write(fresh.join("f.txt"), "file fresh").unwrap();
    std::fs::rename(&a, tmp.path().join("old")).unwrap();
    std::fs::rename(&fresh, &a).unwrap();
    // Same clock value: without the reload this would be a fresh front hit.
    sf.reload(sf.options()).unwrap();
    forget_thread_caches();
    assert_eq!(text(&get(&sf, "/f.txt")), "file fresh");
}

/// A folder is judged as a file is (the front controller of a PHP route runs only for one
/// that exists): beneath the root only, dotfolders refused while dotfiles are.
#[test]
fn folders_beneath_the_root_are_judged_as_files_are() {
    let site = Site::new();
    site.write("apps/files/js/app.js", "x")
        .write("page.txt", "x")
        .write(".git/HEAD", "x");
    let root = site.root();
    std::os::unix::fs::symlink("..", root.join("updir")).unwrap();
    std::os::unix::fs::symlink(site.tmp.path(), root.join("abs-dir")).unwrap();
    std::os::unix::fs::symlink("apps", root.join("inside-dir")).unwrap();
    let sf = site.serve();
    let folder = |key: &str| sf.folder_beneath(key, 0).map_err(|r| r.status);
    assert_eq!(folder("/"), Ok(true));
    assert_eq!(folder("/apps/files/"), Ok(true));
    assert_eq!(folder("/inside-dir/files/"), Ok(true));
    assert_eq!(folder("/nowhere/"), Ok(false));
    assert_eq!(folder("/page.txt/"), Ok(false));
    assert_eq!(folder("/updir/"), Ok(false));
    assert_eq!(folder("/abs-dir/"), Ok(false));
    assert_eq!(folder("/.git/"), Err(404));
    assert_eq!(folder("/a/../"), Err(400));
    let sf = site.serve_with(|o| o.serve_dotfiles = true);
    assert_eq!(
        sf.folder_beneath("/.git/", 0).map_err(|r| r.status),
        Ok(true)
    );
}
