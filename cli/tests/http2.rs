//! HTTP/2 end to end: the real `tern` binary with a plain and a TLS listener on ephemeral ports,
//! talked to by the `h2` crate (over tokio-rustls, or with prior knowledge on the plain port),
//! by frames written by hand (`support/h2.rs`'s `RawH2`, for what `h2` refuses to send and for
//! watching RST_STREAM and GOAWAY), and by `curl` and `nghttp` when they are installed
//! (`scripts/install-h2-test-deps` installs them; without them those tests print SKIPPED).
//!
//! What tern promises: ALPN `h2` (preferred) and `http/1.1` on `--listen-tls`; prior knowledge
//! (`PRI * HTTP/2.0`) on `--listen`; no server push and no h2c Upgrade; every feature over
//! HTTP/2 (static files with 304/206/gzip/br/HEAD, request bodies under `--max-body`, pending
//! replies, `/statusz` and `/metrics`); lowercase response headers and no connection-specific
//! ones; malformed requests are stream errors; GOAWAY on shutdown lets in-flight streams end.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{h2_support, support, tls_support};
use h2_support::*;
use support::*;
use tls_support::*;

const HELLO: &str = "hello over h2\n";

/// A site, a test CA, a certificate for localhost/127.0.0.1 written to files, and the CA file
/// for curl.
struct Fixture {
    site: Site,
    ca: Ca,
    cert: PathBuf,
    key: PathBuf,
    ca_file: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let site = Site::new();
        site.write("hello.txt", HELLO);
        let ca = Ca::new();
        let leaf = ca.issue("default", &["localhost", "127.0.0.1"]);
        let (cert, key) = leaf.write(site.base(), "default");
        let ca_file = ca.write(site.base());
        Fixture {
            site,
            ca,
            cert,
            key,
            ca_file,
        }
    }

    fn tls_args(&self, extra: &[&str]) -> Vec<String> {
        let mut args = cert_key_args(&self.cert, &self.key);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// `tern serve` with a plain and a TLS listener, and `extra`.
    fn start(&self, extra: &[&str]) -> Tern {
        Tern::spawn(serve_command(
            &self.site.root,
            &["--listen", "127.0.0.1:0", "--listen-tls", "127.0.0.1:0"],
            &self.tls_args(extra),
        ))
    }

    /// A verifying client offering ALPN `h2` then `http/1.1`.
    fn h2_config(&self) -> std::sync::Arc<rustls::ClientConfig> {
        alpn_config(&self.ca, &["h2", "http/1.1"])
    }
}

/// Which transport an `h2` crate connection runs over.
#[derive(Clone, Copy, Debug)]
enum Via {
    /// Plain TCP, prior knowledge.
    H2c,
    /// TLS, ALPN h2.
    Tls,
}

async fn connect(fx: &Fixture, tern: &Tern, via: Via) -> H2Conn {
    connect_with(fx, tern, via, builder()).await
}

async fn connect_with(fx: &Fixture, tern: &Tern, via: Via, b: h2::client::Builder) -> H2Conn {
    match via {
        Via::H2c => H2Conn::h2c_with(tern.addr(), b).await,
        Via::Tls => H2Conn::tls_with(tern.https(), &fx.h2_config(), "localhost", b)
            .await
            .unwrap_or_else(|alpn| {
                panic!(
                    "ALPN chose {:?}, not h2",
                    alpn.map(|p| String::from_utf8_lossy(&p).into_owned())
                )
            }),
    }
}

// ---------------------------------------------------------------------------------------------
// Negotiation: ALPN on the TLS port, prior knowledge on the plain port
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn alpn_picks_h2_and_http11_still_works() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);

    // A client offering h2 and http/1.1 gets h2, and HTTP/2 works.
    let mut c = connect(&fx, &tern, Via::Tls).await;
    assert_eq!(c.alpn.as_deref(), Some(&b"h2"[..]));
    let r = c.get("/hello.txt", &[]).await;
    assert_eq!((r.status, r.text().as_str()), (200, HELLO));
    assert_no_connection_headers(&r, "GET /hello.txt over TLS");

    // tern prefers h2 even when the client lists http/1.1 first.
    let reversed = alpn_config(&fx.ca, &["http/1.1", "h2"]);
    let c2 = H2Conn::tls(tern.https(), &reversed, "localhost").await;
    assert!(
        c2.is_ok(),
        "offered http/1.1 then h2, ALPN chose {:?}",
        c2.err()
            .flatten()
            .map(|p| String::from_utf8_lossy(&p).into_owned())
    );

    // An h2-only client gets h2.
    let h2_only = alpn_config(&fx.ca, &["h2"]);
    let mut c3 = H2Conn::tls(tern.https(), &h2_only, "localhost")
        .await
        .unwrap_or_else(|_| panic!("an h2-only client did not get h2"));
    assert_eq!(c3.get("/hello.txt", &[]).await.text(), HELLO);

    // A client offering only http/1.1 gets HTTP/1.1 over TLS, as does one offering no ALPN.
    for (label, protocols) in [("http/1.1 only", vec!["http/1.1"]), ("no ALPN", vec![])] {
        let config = alpn_config(&fx.ca, &protocols);
        let mut t = TlsClient::connect_tls(tern.https(), &config, "localhost");
        let want: Option<&[u8]> = if protocols.is_empty() {
            None
        } else {
            Some(b"http/1.1")
        };
        assert_eq!(t.alpn(), want, "{label}: ALPN");
        let r = t.get("/hello.txt", &[]);
        assert_eq!((r.status, r.version.as_str()), (200, "HTTP/1.1"), "{label}");
        assert_eq!(r.text(), HELLO, "{label}");
    }

    // The HTTP/2 connection is still fine.
    assert_eq!(c.get("/hello.txt", &[]).await.text(), HELLO);
}

#[tokio::test]
async fn prior_knowledge_on_the_plain_port() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    let mut c = H2Conn::h2c(tern.addr()).await;
    let r = c.get("/hello.txt", &[]).await;
    assert_eq!((r.status, r.text().as_str()), (200, HELLO));
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert_no_connection_headers(&r, "GET /hello.txt over h2c");
    // HTTP/1.1 on the same port is unchanged.
    let r = tern.get("/hello.txt");
    assert_eq!((r.status, r.version.as_str()), (200, "HTTP/1.1"));
    assert_eq!(r.text(), HELLO);
    // A second request on the HTTP/2 connection.
    assert_eq!(c.get("/hello.txt", &[]).await.text(), HELLO);
    assert!(!c.ended(), "the connection ended");
}

// ---------------------------------------------------------------------------------------------
// Multiplexing and flow control
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_hundred_concurrent_streams_on_one_connection_are_all_answered() {
    let fx = Fixture::new();
    fx.site.write_numbered(100);
    let tern = fx.start(&[]);
    for via in [Via::H2c, Via::Tls] {
        let mut c = connect(&fx, &tern, via).await;
        // All 100 requests are sent before any response is read.
        let mut set = tokio::task::JoinSet::new();
        for i in 0..100usize {
            let path = format!("/n{i:02}.txt");
            let fut = c
                .start("GET", &path, &[], None)
                .await
                .unwrap_or_else(|e| panic!("{via:?}: opening stream {i}: {e}"));
            set.spawn(async move { (i, fut.await) });
        }
        let deadline = Instant::now() + H2_TIMEOUT;
        let mut answered = [false; 100];
        while let Some(joined) = within(
            deadline.saturating_duration_since(Instant::now()),
            &format!("{via:?}: 100 multiplexed GETs"),
            set.join_next(),
        )
        .await
        {
            let (i, r) = joined.unwrap();
            let r = r.unwrap_or_else(|e| panic!("{via:?}: stream {i}: {e}"));
            assert_eq!(r.status, 200, "{via:?}: /n{i:02}.txt");
            assert_eq!(
                r.text(),
                format!("file number {i}\n"),
                "{via:?}: /n{i:02}.txt"
            );
            answered[i] = true;
        }
        assert!(
            answered.iter().all(|a| *a),
            "{via:?}: not every stream was answered"
        );
        assert!(!c.ended(), "{via:?}: the connection ended");
    }
}

#[tokio::test]
async fn a_large_file_arrives_intact_through_a_small_window() {
    const SIZE: u64 = 5 << 20;
    let fx = Fixture::new();
    write_pattern_file(&fx.site.root.join("big.bin"), SIZE);
    let tern = fx.start(&[]);
    for via in [Via::H2c, Via::Tls] {
        // An 8 KiB stream window: the server must wait for our WINDOW_UPDATEs all the way.
        let mut b = builder();
        b.initial_window_size(8 * 1024);
        let mut c = connect_with(&fx, &tern, via, b).await;
        let req = c.request("GET", "/big.bin", &[]);
        let mut send = c.send.clone().ready().await.unwrap();
        let (resp, _) = send.send_request(req, true).unwrap();
        let resp = within(H2_TIMEOUT, "GET /big.bin", resp).await.unwrap();
        assert_eq!(resp.status(), 200, "{via:?}");
        assert_eq!(
            resp.headers()
                .get("content-length")
                .and_then(|v| v.to_str().ok()),
            Some(SIZE.to_string().as_str()),
            "{via:?}"
        );
        let mut body = resp.into_body();

        // While the big stream waits on its window, another stream is answered.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r = c.get("/hello.txt", &[]).await;
        assert_eq!(
            r.text(),
            HELLO,
            "{via:?}: a stream behind a flow-blocked one"
        );

        // Now read it all, in order and intact.
        let mut at = 0u64;
        let started = Instant::now();
        while let Some(chunk) = within(
            H2_TIMEOUT,
            &format!("{via:?}: /big.bin at byte {at}"),
            body.data(),
        )
        .await
        {
            let chunk = chunk.unwrap_or_else(|e| panic!("{via:?}: /big.bin at byte {at}: {e}"));
            check_pattern(&chunk, at);
            at += chunk.len() as u64;
            body.flow_control().release_capacity(chunk.len()).unwrap();
        }
        assert_eq!(at, SIZE, "{via:?}: bytes received");
        println!(
            "{via:?}: 5 MiB through an 8 KiB window in {:.2} s",
            started.elapsed().as_secs_f64()
        );

        // A download the client gives up on (RST_STREAM CANCEL while the server waits on the
        // window), then the connection goes on.
        let req = c.request("GET", "/big.bin", &[]);
        let mut send = c.send.clone().ready().await.unwrap();
        let (resp, _) = send.send_request(req, true).unwrap();
        let resp = within(H2_TIMEOUT, "GET /big.bin again", resp)
            .await
            .unwrap();
        let mut body = resp.into_body();
        let first = within(H2_TIMEOUT, "its first DATA", body.data()).await;
        assert!(matches!(first, Some(Ok(_))), "{via:?}: {first:?}");
        drop(body);
        let r = c.get("/hello.txt", &[]).await;
        assert_eq!(r.text(), HELLO, "{via:?}: after a cancelled download");

        // A range in the middle of it, on the same connection.
        let r = c
            .get("/big.bin", &[("range", "bytes=1000003-3100002")])
            .await;
        assert_eq!(r.status, 206, "{via:?}");
        assert_eq!(r.body.len(), 2_100_000, "{via:?}");
        check_pattern(&r.body, 1_000_003);
        assert!(!c.ended(), "{via:?}: the connection ended");
    }
}

// ---------------------------------------------------------------------------------------------
// Static files over HTTP/2
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn static_files_200_304_206_and_content_codings() {
    let fx = Fixture::new();
    let body = text_body("h2");
    fx.site.write("page.txt", &body);
    let pre = text_body("PRECOMPRESSED VARIANT");
    let pre_gz = gzip(pre.as_bytes());
    fx.site.write("doc.txt", text_body("plain original"));
    fx.site.write("doc.txt.gz", &pre_gz);
    fx.site.write("dir/index.html", "<h1>dir</h1>\n");
    let tern = fx.start(&[]);
    let mut c = connect(&fx, &tern, Via::Tls).await;

    let full = c.get("/page.txt", &[]).await;
    assert_eq!(full.status, 200);
    assert_eq!(full.text(), body);
    assert_eq!(full.content_length(), Some(body.len() as u64));
    assert!(full
        .header("content-type")
        .unwrap()
        .starts_with("text/plain"));
    assert_no_connection_headers(&full, "GET /page.txt");
    let etag = full.header("etag").expect("etag").to_owned();
    let modified = full
        .header("last-modified")
        .expect("last-modified")
        .to_owned();

    // 304 by If-None-Match and by If-Modified-Since: HEADERS only.
    for (name, value) in [
        ("if-none-match", etag.as_str()),
        ("if-modified-since", modified.as_str()),
    ] {
        let r = c.get("/page.txt", &[(name, value)]).await;
        assert_eq!(r.status, 304, "{name}");
        assert!(r.ended_with_headers, "{name}: a 304 with DATA frames");
        assert!(r.body.is_empty(), "{name}");
        assert_eq!(r.header("etag"), Some(etag.as_str()), "{name}");
    }

    // 206, 206 under If-Range, 200 under a stale If-Range, 416.
    let r = c.get("/page.txt", &[("range", "bytes=10-19")]).await;
    assert_eq!(r.status, 206);
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes 10-19/{}", body.len()).as_str())
    );
    assert_eq!(r.body, body.as_bytes()[10..20]);
    let r = c
        .get(
            "/page.txt",
            &[("range", "bytes=-7"), ("if-range", etag.as_str())],
        )
        .await;
    assert_eq!(r.status, 206);
    assert_eq!(r.body, body.as_bytes()[body.len() - 7..]);
    let r = c
        .get(
            "/page.txt",
            &[("range", "bytes=0-3"), ("if-range", "\"stale\"")],
        )
        .await;
    assert_eq!((r.status, r.body.len()), (200, body.len()));
    let r = c.get("/page.txt", &[("range", "bytes=999999-")]).await;
    assert_eq!(r.status, 416);

    // gzip and brotli made in memory, chosen by accept-encoding.
    let gz = c.get("/page.txt", &[("accept-encoding", "gzip")]).await;
    assert_eq!(gz.status, 200);
    assert!(gz.has("content-encoding", "gzip"), "{:?}", gz.headers);
    assert!(gz.has("vary", "Accept-Encoding") || gz.has("vary", "accept-encoding"));
    assert_eq!(gunzip(&gz.body), body.as_bytes());
    assert_eq!(gz.content_length(), Some(gz.body.len() as u64));
    let br = c
        .get("/page.txt", &[("accept-encoding", "gzip, deflate, br")])
        .await;
    assert!(br.has("content-encoding", "br"), "{:?}", br.headers);
    assert_eq!(unbrotli(&br.body), body.as_bytes());
    // A 304 for the gzip variant follows its own validator.
    let gz_tag = gz.header("etag").unwrap().to_owned();
    let r = c
        .get(
            "/page.txt",
            &[
                ("accept-encoding", "gzip"),
                ("if-none-match", gz_tag.as_str()),
            ],
        )
        .await;
    assert_eq!(r.status, 304);

    // A .gz file beside a file is its gzip variant, sent as it is.
    let r = c.get("/doc.txt", &[("accept-encoding", "gzip")]).await;
    assert!(r.has("content-encoding", "gzip"));
    assert_eq!(r.body, pre_gz);

    // 404 and the directory redirect.
    let r = c.get("/missing.txt", &[]).await;
    assert_eq!(r.status, 404);
    let r = c.get("/dir", &[]).await;
    assert_eq!(r.status, 301);
    assert!(r.header("location").unwrap().ends_with("/dir/"));
    assert_eq!(c.get("/dir/", &[]).await.text(), "<h1>dir</h1>\n");
    assert!(!c.ended(), "the connection ended");
}

#[tokio::test]
async fn head_has_a_content_length_and_no_data_frames() {
    let fx = Fixture::new();
    let body = text_body("head");
    fx.site.write("page.txt", &body);
    write_pattern_file(&fx.site.root.join("big.bin"), 3 << 20);
    let tern = fx.start(&[]);
    for via in [Via::H2c, Via::Tls] {
        let mut c = connect(&fx, &tern, via).await;
        for (path, headers, len) in [
            ("/page.txt", vec![], body.len() as u64),
            ("/big.bin", vec![], 3 << 20),
            ("/page.txt", vec![("accept-encoding", "gzip")], 0),
        ] {
            let r = c
                .try_request("HEAD", path, &headers, None)
                .await
                .unwrap_or_else(|e| panic!("{via:?}: HEAD {path}: {e}"));
            assert_eq!(r.status, 200, "{via:?}: HEAD {path}");
            assert!(
                r.ended_with_headers && r.data_chunks == 0 && r.body.is_empty(),
                "{via:?}: HEAD {path}: DATA frames came ({} bytes)",
                r.body.len()
            );
            let got = r.content_length().expect("content-length on HEAD");
            if len > 0 {
                assert_eq!(got, len, "{via:?}: HEAD {path}");
            } else {
                // The gzip variant: the length GET would send.
                let g = c.get(path, &headers).await;
                assert_eq!(got, g.body.len() as u64, "{via:?}: HEAD {path} gzip");
            }
        }
        // The connection is in step afterwards.
        assert_eq!(c.get("/page.txt", &[]).await.text(), body);
    }
}

// ---------------------------------------------------------------------------------------------
// Request bodies
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_body_over_the_limit_is_refused_and_the_connection_lives_on() {
    let fx = Fixture::new();
    fx.site.write("a.txt", "alpha\n");
    let tern = fx.start(&["--max-body", "1024"]);
    for via in [Via::H2c, Via::Tls] {
        let mut c = connect(&fx, &tern, via).await;
        let big = vec![b'x'; 4096];
        let len = big.len().to_string();
        for (label, headers) in [
            (
                "with content-length",
                vec![("content-length", len.as_str())],
            ),
            ("without content-length", vec![]),
        ] {
            match c.try_request("POST", "/a.txt", &headers, Some(&big)).await {
                Ok(r) => {
                    println!("{via:?}: 4 KiB POST {label}: {}", r.status);
                    assert_eq!(r.status, 413, "{via:?}: 4 KiB POST {label}: {}", r.text())
                }
                // A reset of that stream alone is fine too.
                Err(e) => {
                    println!("{via:?}: 4 KiB POST {label}: {e}");
                    assert!(
                        e.is_reset() && e.reason().is_some(),
                        "{via:?}: 4 KiB POST {label}: {e} (neither 413 nor a stream reset)"
                    )
                }
            }
            let r = c.get("/a.txt", &[]).await;
            assert_eq!(r.text(), "alpha\n", "{via:?}: after the POST {label}");
        }
        // A body under the limit is read, and the static handler refuses the method.
        let r = c
            .try_request(
                "POST",
                "/a.txt",
                &[("content-length", "11")],
                Some(b"hello world"),
            )
            .await
            .unwrap_or_else(|e| panic!("{via:?}: small POST: {e}"));
        assert_eq!(r.status, 405, "{via:?}: small POST");
        assert_eq!(r.header("allow"), Some("GET, HEAD"));
        assert_eq!(c.get("/a.txt", &[]).await.text(), "alpha\n");
        assert!(!c.ended(), "{via:?}: the connection ended");
    }
}

#[tokio::test]
async fn large_uploads_finish_through_flow_control() {
    // Bodies far over the connection's buffered-bodies limit (4 MiB), one alone and several
    // at once: flow control must never stall them (the static handler then answers 405).
    let fx = Fixture::new();
    fx.site.write("a.txt", "alpha\n");
    let tern = fx.start(&["--max-body", "67108864"]);
    let mut c = connect(&fx, &tern, Via::H2c).await;
    let big = vec![b'u'; 12 << 20];
    let len = big.len().to_string();
    let r = c
        .try_request(
            "POST",
            "/a.txt",
            &[("content-length", len.as_str())],
            Some(&big),
        )
        .await
        .unwrap_or_else(|e| panic!("a 12 MiB POST: {e}"));
    assert_eq!(r.status, 405);
    let parts = vec![b'p'; 3 << 20];
    let plen = parts.len().to_string();
    let mut all = Vec::new();
    for _ in 0..4 {
        let headers = [("content-length", plen.as_str())];
        let fut = c
            .start("POST", "/a.txt", &headers, Some(&parts))
            .await
            .unwrap();
        all.push(tokio::spawn(fut));
    }
    for (i, r) in all.into_iter().enumerate() {
        let r = within(H2_TIMEOUT, "parallel 3 MiB POSTs", r).await.unwrap();
        let r = r.unwrap_or_else(|e| panic!("parallel 3 MiB POST {i}: {e}"));
        assert_eq!(r.status, 405, "parallel POST {i}");
    }
}

// ---------------------------------------------------------------------------------------------
// The IPv4 Games over HTTP/2: pending replies, /statusz, /metrics
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn demo_claim_waits_for_its_sync_while_other_streams_are_answered() {
    let fx = Fixture::new();
    let data = fx.site.base().join("data");
    // Every sync of the journal waits 1.5 s first (a test hook), so claims stay pending.
    let mut args = fx.tls_args(&[]);
    args.extend(["--sync", "full", "--test-sync-delay-ms", "1500"].map(String::from));
    let tern = Tern::spawn(demo_command(
        &data,
        &["--listen", "127.0.0.1:0", "--listen-tls", "127.0.0.1:0"],
        &args,
    ));
    let mut c = connect(&fx, &tern, Via::Tls).await;
    let r = c.get("/ip", &[]).await;
    assert_eq!((r.status, r.text().as_str()), (200, "127.0.0.1\n"));

    let asked = Instant::now();
    let claim = c
        .start("GET", "/claim/h2-player", &[("accept", "text/plain")], None)
        .await
        .unwrap();
    let claim = tokio::spawn(claim);
    // A second claim whose stream the client resets (CANCEL) while it waits: its answer, when
    // the commit comes, has nowhere to go and must be dropped without harm.
    let cancelled = c
        .start(
            "GET",
            "/claim/h2-quitter",
            &[("accept", "text/plain")],
            None,
        )
        .await
        .unwrap();
    let cancelled = tokio::spawn(cancelled);
    // Other streams on the same connection are answered while the claim waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for path in ["/ip", "/recent", "/score/hour", "/statusz", "/metrics", "/"] {
        let r = c.get(path, &[]).await;
        assert_eq!(r.status, 200, "{path} while a claim is pending");
        assert_no_connection_headers(&r, path);
    }
    let statusz = c.get("/statusz", &[]).await.text();
    assert!(
        !claim.is_finished() && asked.elapsed() < Duration::from_millis(1400),
        "the claim was answered before its sync"
    );
    assert!(
        statusz.lines().any(|l| l == "claims_received: 2")
            && statusz.lines().any(|l| l == "claims_saved: 0"),
        "/statusz while the claims wait:\n{statusz}"
    );

    cancelled.abort(); // drops the response future: h2 resets the stream with CANCEL
    let _ = cancelled.await;

    let r = within(H2_TIMEOUT, "the claim after the sync", claim)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the claim's stream: {e}"));
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "127.0.0.1 is now claimed by h2-player\n");
    assert!(asked.elapsed() >= Duration::from_millis(1500));
    // The cancelled claim's answer was dropped; the connection serves on, and a new claim (the
    // same address, a new name) is answered.
    let r = c.get("/ip", &[]).await;
    assert_eq!(r.text(), "127.0.0.1\n", "after a cancelled pending stream");
    let r = c.get("/claim/h2-player", &[("accept", "text/plain")]).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!c.ended(), "the connection ended");

    // /statusz and /metrics over h2c too.
    let mut p = H2Conn::h2c(tern.addr()).await;
    let s = p.get("/statusz", &[]).await;
    assert_eq!(s.status, 200);
    assert!(
        s.text()
            .lines()
            .any(|l| l.starts_with("claims_saved: ") && l != "claims_saved: 0"),
        "/statusz:\n{}",
        s.text()
    );
    let m = p.get("/metrics", &[]).await;
    assert_eq!(m.status, 200);
    assert!(m
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    assert!(
        m.text().contains("# TYPE tern_claims_saved_total counter"),
        "/metrics:\n{}",
        m.text()
    );
    let r = p.get("/player/h2-player", &[]).await;
    assert!(r.text().contains("\"total\":1"), "{}", r.text());
    assert!(
        tern.stderr_text().matches("panicked").count() == 0,
        "{}",
        tern.stderr_text()
    );
}

// ---------------------------------------------------------------------------------------------
// Header rules, by hand
// ---------------------------------------------------------------------------------------------

/// Reads until stream `id` is reset and checks it was a PROTOCOL_ERROR stream error (an answer
/// before the reset is allowed: RFC 9113 8.1.1), not a connection error.
fn expect_protocol_error(raw: &mut RawH2, id: u32, what: &str) {
    let f = raw.until(&format!("{what}: RST_STREAM on stream {id}"), |f| {
        (f.stream == id && (f.ty == RST_STREAM || f.end_stream())) || f.ty == GOAWAY
    });
    match f.ty {
        RST_STREAM => assert_eq!(
            f.error_code(),
            Some(PROTOCOL_ERROR),
            "{what}: {f:?}; frames: {:?}",
            raw.seen
        ),
        GOAWAY => panic!(
            "{what}: a connection error ({f:?}) where a stream error (RST_STREAM PROTOCOL_ERROR) is due"
        ),
        _ => panic!(
            "{what}: stream {id} was answered, not reset with PROTOCOL_ERROR; frames: {:?}",
            raw.seen
        ),
    }
}

#[test]
fn malformed_headers_are_stream_errors_and_the_connection_stays_usable() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    let mut raw = RawH2::connect(tern.addr(), &[]);
    let settings = raw.until("the server's SETTINGS", |f| {
        f.ty == SETTINGS && f.flags & ACK == 0
    });
    assert!(
        settings
            .settings()
            .iter()
            .any(|(id, v)| *id == SETTINGS_MAX_CONCURRENT_STREAMS && *v >= 100),
        "SETTINGS_MAX_CONCURRENT_STREAMS (>= 100) is advertised (h2spec's http2/5.1.2 needs it): {settings:?}"
    );
    raw.request(1, "GET", "/hello.txt", &[], false);
    assert_eq!(raw.response_body(1), HELLO.as_bytes());

    let mut id = 3;
    for (what, field) in [
        ("an uppercase header name", ("X-Upper", "1")),
        ("connection: keep-alive", ("connection", "keep-alive")),
        ("keep-alive: 5", ("keep-alive", "timeout=5")),
        ("proxy-connection", ("proxy-connection", "keep-alive")),
        (
            "transfer-encoding: chunked",
            ("transfer-encoding", "chunked"),
        ),
        ("upgrade: h2c", ("upgrade", "h2c")),
        ("te: gzip", ("te", "gzip")),
    ] {
        raw.request(id, "GET", "/hello.txt", &[field], false);
        expect_protocol_error(&mut raw, id, what);
        // The connection still serves the next stream.
        raw.request(id + 2, "GET", "/hello.txt", &[], false);
        assert_eq!(raw.response_body(id + 2), HELLO.as_bytes(), "after {what}");
        id += 4;
    }
    // te: trailers is the one TE allowed.
    raw.request(id, "GET", "/hello.txt", &[("te", "trailers")], false);
    assert_eq!(raw.response_body(id), HELLO.as_bytes(), "te: trailers");
    id += 2;
    // A pseudo-header after a regular one, and a missing :path.
    raw.request(
        id,
        "GET",
        "/hello.txt",
        &[("accept", "*/*"), (":foo", "bar")],
        false,
    );
    expect_protocol_error(
        &mut raw,
        id,
        "an unknown pseudo-header after a regular field",
    );
    id += 2;
    raw.frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        id,
        &header_block(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "localhost"),
        ]),
    );
    expect_protocol_error(&mut raw, id, "no :path");
    id += 2;
    raw.request(id, "GET", "/hello.txt", &[], false);
    assert_eq!(raw.response_body(id), HELLO.as_bytes(), "at the end");
    assert!(
        !raw.seen.iter().any(|f| f.ty == GOAWAY),
        "GOAWAY: {:?}",
        raw.seen
    );
}

/// `:path` is origin-form, or `*` on OPTIONS (RFC 9113 §8.3.1): an absolute URI there is
/// malformed, never served as its path on the site `:authority` names.
#[test]
fn a_path_not_in_origin_form_is_a_stream_error() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    let mut raw = RawH2::connect(tern.addr(), &[]);
    let mut id = 1;
    for (what, path) in [
        ("an absolute-form :path", "http://other.test/hello.txt"),
        (
            "an absolute-form :path naming :authority",
            "http://localhost/hello.txt",
        ),
        ("* on a GET", "*"),
    ] {
        raw.request(id, "GET", path, &[], false);
        expect_protocol_error(&mut raw, id, what);
        id += 2;
    }
    raw.request(id, "GET", "/hello.txt", &[], false);
    assert_eq!(raw.response_body(id), HELLO.as_bytes(), "after them");
    assert!(
        !raw.seen.iter().any(|f| f.ty == GOAWAY),
        "GOAWAY: {:?}",
        raw.seen
    );
}

// ---------------------------------------------------------------------------------------------
// Shutdown
// ---------------------------------------------------------------------------------------------

/// The peer's GOAWAY ends an idle connection, and frames it sends after that (h2spec's 3.8/1
/// sends a PING) are read and dropped during a lingering close: the client sees our FIN, never
/// a reset that could destroy our last frames before it reads them.
#[test]
fn peer_goaway_closes_cleanly_even_with_frames_after_it() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    for _ in 0..40 {
        let mut raw = RawH2::connect(tern.addr(), &[]);
        raw.request(1, "GET", "/hello.txt", &[], false);
        assert_eq!(raw.response_body(1), HELLO.as_bytes());
        let mut goaway = 1u32.to_be_bytes().to_vec();
        goaway.extend_from_slice(&NO_ERROR.to_be_bytes());
        // Two writes, so that the PING often arrives while the server acts on the GOAWAY.
        raw.frame(GOAWAY, 0, 0, &goaway);
        raw.frame(PING, 0, 0, b"after-ga");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(raw.close_within(H2_TIMEOUT), Closed::Fin, "{:?}", raw.seen);
    }
}

#[test]
fn goaway_on_shutdown_lets_in_flight_streams_finish() {
    const SIZE: u64 = 2 << 20;
    let fx = Fixture::new();
    write_pattern_file(&fx.site.root.join("big.bin"), SIZE);
    let mut tern = fx.start(&["--shutdown-grace", "10"]);

    // An idle HTTP/2 connection (one request done).
    let mut idle = RawH2::connect(tern.addr(), &[]);
    idle.request(1, "GET", "/hello.txt", &[], false);
    assert_eq!(idle.response_body(1), HELLO.as_bytes());

    // A busy one: a 1 KiB stream window keeps /big.bin in flight until we open it.
    let mut busy = RawH2::connect(tern.addr(), &[(SETTINGS_INITIAL_WINDOW_SIZE, 1024)]);
    busy.request(1, "GET", "/big.bin", &[], false);
    busy.until("the first DATA of /big.bin", |f| {
        f.ty == DATA && f.stream == 1
    });

    tern.signal(libc::SIGTERM);

    // The busy connection gets a graceful GOAWAY that covers stream 1.
    let goaway = busy.until("GOAWAY after SIGTERM", |f| f.ty == GOAWAY);
    println!("busy connection: {goaway:?}");
    assert_eq!(goaway.error_code(), Some(NO_ERROR), "{goaway:?}");
    assert!(goaway.last_stream().unwrap() >= 1, "{goaway:?}");
    // A stream opened after a GOAWAY whose last stream is below it is not processed. (A server
    // may send GOAWAY(2^31-1) first and the final one a round trip later; then this is not
    // tried.)
    let last = goaway.last_stream().unwrap();
    let late = 3;
    if last < late {
        busy.request(late, "GET", "/hello.txt", &[], false);
    }

    // Open the windows: the rest of /big.bin arrives, intact.
    busy.window_update(0, 16 << 20);
    busy.window_update(1, 16 << 20);
    let mut got = Vec::new();
    for f in busy.seen.iter().filter(|f| f.ty == DATA && f.stream == 1) {
        got.extend_from_slice(f.data());
    }
    let ended = busy.seen.iter().any(|f| f.stream == 1 && f.end_stream());
    if !ended {
        loop {
            let f = busy.until("the rest of /big.bin", |f| {
                f.stream == 1 || (f.ty == GOAWAY && f.error_code() != Some(NO_ERROR))
            });
            assert!(f.ty == DATA, "{f:?}; frames: {:?}", busy.seen);
            got.extend_from_slice(f.data());
            if f.end_stream() {
                break;
            }
        }
    }
    assert_eq!(got.len() as u64, SIZE, "bytes of /big.bin after GOAWAY");
    check_pattern(&got, 0);
    assert!(
        busy.closed_within(Duration::from_secs(5)),
        "the busy connection stays open after its last stream ended"
    );
    assert!(
        !busy
            .seen
            .iter()
            .any(|f| f.stream == late && matches!(f.ty, HEADERS | DATA)),
        "stream {late}, opened after GOAWAY(last stream {last}), was answered: {:?}",
        busy.seen
    );

    // The idle connection got a GOAWAY too, and was closed.
    let g = idle.until("GOAWAY on the idle connection", |f| f.ty == GOAWAY);
    assert_eq!(g.error_code(), Some(NO_ERROR), "{g:?}");
    assert!(
        idle.closed_within(Duration::from_secs(5)),
        "the idle connection stays open"
    );

    let status = tern
        .wait_exit(Duration::from_secs(10))
        .expect("tern exits after SIGTERM");
    assert!(
        status.success(),
        "exit {status:?}; stderr:\n{}",
        tern.stderr_text()
    );
}

#[test]
fn an_idle_connection_gets_goaway_at_the_idle_timeout() {
    let fx = Fixture::new();
    let tern = fx.start(&["--idle-timeout", "1"]);
    let mut raw = RawH2::connect(tern.addr(), &[]);
    raw.request(1, "GET", "/hello.txt", &[], false);
    assert_eq!(raw.response_body(1), HELLO.as_bytes());
    let idle = Instant::now();
    let g = raw.until("GOAWAY at the idle timeout", |f| f.ty == GOAWAY);
    assert_eq!(g.error_code(), Some(NO_ERROR), "{g:?}");
    assert_eq!(g.last_stream(), Some(1), "{g:?}");
    assert!(
        raw.closed_within(Duration::from_secs(3)),
        "open after its GOAWAY"
    );
    let waited = idle.elapsed();
    assert!(
        waited > Duration::from_millis(500) && waited < Duration::from_secs(4),
        "closed after {waited:?} idle with --idle-timeout 1"
    );
}

// ---------------------------------------------------------------------------------------------
// curl and nghttp
// ---------------------------------------------------------------------------------------------

/// `curl -sS ARGS...`, bounded.
fn curl(args: &[&str]) -> Failed {
    run_to_end(
        Command::new("curl").arg("-sS").args(args),
        Duration::from_secs(30),
    )
}

#[test]
fn curl_speaks_h2_over_tls_and_with_prior_knowledge() {
    if !have("curl", "--version") {
        return;
    }
    let fx = Fixture::new();
    let body = text_body("curl");
    fx.site.write("page.txt", &body);
    let tern = fx.start(&[]);
    let ca = fx.ca_file.to_str().unwrap();
    let tls_port = tern.https().port();
    let resolve = format!("localhost:{tls_port}:127.0.0.1");
    let https = |p: &str| format!("https://localhost:{tls_port}{p}");
    let plain = |p: &str| format!("http://{}{p}", tern.addr());
    let out = fx.site.base().join("curl.out");
    let out = out.to_str().unwrap();
    let w = "%{http_version} %{response_code}";

    for (label, args, want) in [
        (
            "--http2 over TLS",
            vec!["--http2", "--cacert", ca, "--resolve", &resolve, "-o", out],
            "2 200",
        ),
        (
            "--http1.1 over TLS (ALPN http/1.1 only)",
            vec![
                "--http1.1",
                "--cacert",
                ca,
                "--resolve",
                &resolve,
                "-o",
                out,
            ],
            "1.1 200",
        ),
    ] {
        let mut a = args.clone();
        let url = https("/hello.txt");
        a.extend(["-w", w, &url]);
        let f = curl(&a);
        assert!(f.status.success(), "{label}: {}", f.stderr);
        assert_eq!(f.stdout, want, "{label}");
        assert_eq!(std::fs::read_to_string(out).unwrap(), HELLO, "{label}");
    }
    let f = curl(&[
        "--http2-prior-knowledge",
        "-o",
        out,
        "-w",
        w,
        &plain("/hello.txt"),
    ]);
    assert!(f.status.success(), "prior knowledge: {}", f.stderr);
    assert_eq!(f.stdout, "2 200", "--http2-prior-knowledge");
    assert_eq!(std::fs::read_to_string(out).unwrap(), HELLO);
    // No h2c Upgrade: curl --http2 on http:// offers it, tern answers in HTTP/1.1.
    let f = curl(&["--http2", "-o", out, "-w", w, &plain("/hello.txt")]);
    assert!(f.status.success(), "h2c upgrade offer: {}", f.stderr);
    assert_eq!(
        f.stdout, "1.1 200",
        "--http2 on http:// (Upgrade: h2c ignored)"
    );
    assert_eq!(std::fs::read_to_string(out).unwrap(), HELLO);

    // Compressed, with the headers as they came: lowercase names, no connection headers.
    let heads = fx.site.base().join("heads.txt");
    let f = curl(&[
        "--http2",
        "--compressed",
        "--cacert",
        ca,
        "--resolve",
        &resolve,
        "-D",
        heads.to_str().unwrap(),
        "-o",
        out,
        &https("/page.txt"),
    ]);
    assert!(f.status.success(), "--compressed: {}", f.stderr);
    assert_eq!(std::fs::read_to_string(out).unwrap(), body);
    let heads = std::fs::read_to_string(&heads).unwrap();
    let mut lines = heads.lines();
    assert_eq!(
        lines.next().map(str::trim_end),
        Some("HTTP/2 200"),
        "{heads}"
    );
    let mut encoding = None;
    for line in lines.filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(": ").unwrap_or_else(|| panic!("{line:?}"));
        assert_eq!(
            name,
            name.to_ascii_lowercase(),
            "header name not lowercase: {line:?}"
        );
        assert!(!CONNECTION_SPECIFIC.contains(&name), "{line:?}");
        if name == "content-encoding" {
            encoding = Some(value.to_owned());
        }
    }
    assert!(
        matches!(encoding.as_deref(), Some("br" | "gzip")),
        "content-encoding {encoding:?}:\n{heads}"
    );

    // Several URLs in one curl: one connection, reused. (Over TLS: curl 7.88.1 fails to reuse a
    // --http2-prior-knowledge connection, "Error in the HTTP2 framing layer", against nginx
    // 1.22 just the same.)
    let f = curl(&[
        "--http2",
        "--cacert",
        ca,
        "--resolve",
        &resolve,
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        "-o",
        "/dev/null",
        "-w",
        "%{http_version} %{response_code} %{num_connects}\n",
        &https("/hello.txt"),
        &https("/page.txt"),
        &https("/missing"),
    ]);
    assert!(f.status.success(), "{}", f.stderr);
    assert_eq!(
        f.stdout, "2 200 1\n2 200 0\n2 404 0\n",
        "three URLs on one connection"
    );
}

/// `nghttp -nv ARGS...`, bounded.
fn nghttp(args: &[&str]) -> Failed {
    run_to_end(
        Command::new("nghttp").args(["-nv", "-t", "10"]).args(args),
        Duration::from_secs(30),
    )
}

/// Checks nghttp's verbose output: the server's SETTINGS, `n` answers with `status`, and every
/// header name received lowercase and not connection-specific.
fn check_nghttp(out: &Failed, label: &str, n: usize, status: u16) {
    let text = &out.stdout;
    assert!(
        out.status.success(),
        "{label}: nghttp failed ({:?}):\n{text}\n{}",
        out.status,
        out.stderr
    );
    assert!(text.contains("recv SETTINGS frame"), "{label}:\n{text}");
    assert!(
        text.contains("[SETTINGS_MAX_CONCURRENT_STREAMS(0x03):"),
        "{label}: no SETTINGS_MAX_CONCURRENT_STREAMS from the server:\n{text}"
    );
    let statuses = text.matches(&format!(") :status: {status}\n")).count();
    assert_eq!(statuses, n, "{label}: answers with {status}:\n{text}");
    for line in text.lines() {
        let Some(rest) = line.split_once("recv (stream_id=").map(|(_, r)| r) else {
            continue;
        };
        let (_, field) = rest.split_once(") ").unwrap();
        let name = field.strip_prefix(':').map_or_else(
            || field.split_once(": ").unwrap().0,
            |f| f.split_once(": ").unwrap().0,
        );
        assert_eq!(name, name.to_ascii_lowercase(), "{label}: {line:?}");
        assert!(!CONNECTION_SPECIFIC.contains(&name), "{label}: {line:?}");
    }
    assert!(
        !text.contains("recv PUSH_PROMISE"),
        "{label}: the server pushed:\n{text}"
    );
    assert!(
        text.contains("recv DATA frame") && text.contains("; END_STREAM"),
        "{label}: no DATA with END_STREAM:\n{text}"
    );
}

#[test]
fn nghttp_shows_the_frames_over_tls_and_prior_knowledge() {
    if !have("nghttp", "--version") {
        return;
    }
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    let tls = format!("https://127.0.0.1:{}/hello.txt", tern.https().port());
    let out = nghttp(&[&tls]);
    assert!(
        out.stdout.contains("The negotiated protocol: h2"),
        "ALPN:\n{}",
        out.stdout
    );
    check_nghttp(&out, "TLS", 1, 200);

    let plain = format!("http://{}/hello.txt", tern.addr());
    let out = nghttp(&[&plain]);
    check_nghttp(&out, "prior knowledge", 1, 200);

    // Twenty requests multiplexed on one connection (-m 20).
    let out = nghttp(&["-m", "20", &plain]);
    check_nghttp(&out, "-m 20", 20, 200);
    assert_eq!(
        out.stdout.matches("] Connected").count(),
        1,
        "one connection:\n{}",
        out.stdout
    );
    let missing = format!("http://{}/missing", tern.addr());
    check_nghttp(&nghttp(&[&missing]), "404", 1, 404);
}

#[test]
fn a_peer_that_never_opens_its_window_is_cut_off_at_the_write_timeout() {
    let fx = Fixture::new();
    write_pattern_file(&fx.site.root.join("big.bin"), 1 << 20);
    let tern = fx.start(&["--write-timeout", "1"]);
    // A zero stream window: the answer's head goes out, its body never can.
    let mut raw = RawH2::connect(tern.addr(), &[(SETTINGS_INITIAL_WINDOW_SIZE, 0)]);
    raw.request(1, "GET", "/big.bin", &[], false);
    raw.until("the answer's HEADERS", |f| f.ty == HEADERS);
    let stalled = Instant::now();
    assert!(
        raw.closed_within(Duration::from_secs(5)),
        "a connection stalled on a shut window stayed open"
    );
    let waited = stalled.elapsed();
    assert!(
        waited > Duration::from_millis(500),
        "closed after {waited:?}, before the write timeout"
    );
    // The server is fine: another connection is answered.
    let mut ok = RawH2::connect(tern.addr(), &[]);
    ok.request(1, "GET", "/hello.txt", &[], false);
    assert_eq!(ok.response_body(1), HELLO.as_bytes());
}

#[test]
fn a_frame_dribbled_byte_by_byte_is_cut_off_at_the_header_timeout() {
    let fx = Fixture::new();
    let tern = fx.start(&["--header-timeout", "1"]);
    let mut raw = RawH2::connect(tern.addr(), &[]);
    raw.request(1, "GET", "/hello.txt", &[], false);
    assert_eq!(raw.response_body(1), HELLO.as_bytes());
    // A HEADERS frame of 200 bytes, sent one byte every 100 ms: it never completes in time.
    let frame = frame_bytes(HEADERS, END_HEADERS | END_STREAM, 3, &[0x82; 200]);
    let started = Instant::now();
    let mut closed = false;
    for b in &frame {
        if raw.sock.write_all(std::slice::from_ref(b)).is_err() {
            closed = true;
            break;
        }
        if raw.closed_within(Duration::from_millis(100)) {
            closed = true;
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still open after 5 s"
        );
    }
    assert!(closed, "the whole frame went in");
    let waited = started.elapsed();
    assert!(
        waited > Duration::from_millis(700) && waited < Duration::from_secs(4),
        "closed after {waited:?} with --header-timeout 1"
    );
}

/// The order in which DATA frames of two answers on one connection arrive.
fn data_order(tern: &Tern, second_priority: Option<&str>) -> Vec<u32> {
    let mut raw = RawH2::connect(tern.addr(), &[(SETTINGS_INITIAL_WINDOW_SIZE, 1 << 30)]);
    raw.window_update(0, 1 << 30);
    // Both requests in one write, so the server knows of both before it sends any DATA.
    let mut both = frame_bytes(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &header_block(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "localhost"),
            (":path", "/one.bin"),
        ]),
    );
    let mut second = vec![
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "localhost"),
        (":path", "/two.bin"),
    ];
    if let Some(p) = second_priority {
        second.push(("priority", p));
    }
    both.extend(frame_bytes(
        HEADERS,
        END_HEADERS | END_STREAM,
        3,
        &header_block(&second),
    ));
    raw.write(&both);
    let mut order = Vec::new();
    let mut ended = 0;
    while ended < 2 {
        let f = raw.until("DATA of the two answers", |f| f.ty == DATA);
        order.push(f.stream);
        if f.end_stream() {
            ended += 1;
        }
    }
    order
}

#[test]
fn answers_share_the_connection_and_urgent_ones_go_first() {
    let fx = Fixture::new();
    write_pattern_file(&fx.site.root.join("one.bin"), 1 << 20);
    write_pattern_file(&fx.site.root.join("two.bin"), 1 << 20);
    let tern = fx.start(&[]);
    // No priority signal: the two take turns (neither waits for the other to finish).
    let order = data_order(&tern, None);
    let first_of_3 = order.iter().position(|&s| s == 3).unwrap();
    let last_of_1 = order.iter().rposition(|&s| s == 1).unwrap();
    assert!(
        first_of_3 < last_of_1,
        "stream 3 waited for stream 1 to finish: {order:?}"
    );
    // `priority: u=0` (say, a stylesheet behind an image): all of it before the rest of 1.
    let order = data_order(&tern, Some("u=0"));
    let last_of_3 = order.iter().rposition(|&s| s == 3).unwrap();
    let last_of_1 = order.iter().rposition(|&s| s == 1).unwrap();
    assert!(
        last_of_3 < last_of_1,
        "the urgent answer finished last: {order:?}"
    );
    let frames_of_1_before = order[..last_of_3].iter().filter(|&&s| s == 1).count();
    assert!(
        frames_of_1_before <= 12,
        "{frames_of_1_before} frames of the less urgent answer went first: {order:?}"
    );
}

#[test]
fn a_header_block_spread_over_slow_continuations_is_one_head() {
    let fx = Fixture::new();
    let tern = fx.start(&["--header-timeout", "1"]);
    let mut raw = RawH2::connect(tern.addr(), &[]);
    raw.request(1, "GET", "/hello.txt", &[], false);
    assert_eq!(raw.response_body(1), HELLO.as_bytes());
    // HEADERS without END_HEADERS, then an empty CONTINUATION every 400 ms: each frame is
    // whole, but the head is not, and its clock runs from the HEADERS.
    let block = header_block(&[(":method", "GET")]);
    raw.frame(HEADERS, END_STREAM, 3, &block);
    let started = Instant::now();
    let mut closed = false;
    for _ in 0..6 {
        if raw.closed_within(Duration::from_millis(400)) {
            closed = true;
            break;
        }
        let _ = raw.sock.write_all(&frame_bytes(CONTINUATION, 0, 3, &[]));
    }
    assert!(closed, "a slow header block outlived the header timeout");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_millis(2500),
        "closed after {waited:?} with --header-timeout 1"
    );
}

#[test]
fn a_connection_idle_long_enough_to_give_back_memory_still_serves() {
    let fx = Fixture::new();
    let tern = fx.start(&[]);
    let mut raw = RawH2::connect(tern.addr(), &[]);
    raw.request(1, "GET", "/hello.txt", &[], false);
    assert_eq!(raw.response_body(1), HELLO.as_bytes());
    // Past the trim delay (1 s): the connection gives back its busy-time buffers, stays open,
    // and answers the next requests with its HPACK state intact.
    std::thread::sleep(Duration::from_millis(1500));
    for id in [3, 5] {
        raw.request(id, "GET", "/hello.txt", &[], false);
        assert_eq!(raw.response_body(id), HELLO.as_bytes());
    }
}

#[test]
fn one_trickling_upload_does_not_keep_a_stalled_one_alive() {
    let fx = Fixture::new();
    let tern = fx.start(&["--body-timeout", "1"]);
    let mut raw = RawH2::connect(tern.addr(), &[]);
    raw.request(1, "GET", "/hello.txt", &[], false);
    assert_eq!(raw.response_body(1), HELLO.as_bytes());
    // Two uploads: stream 3 sends a byte every 250 ms, stream 5 sends nothing after its head.
    raw.request(3, "POST", "/hello.txt", &[], true);
    raw.request(5, "POST", "/hello.txt", &[], true);
    let started = Instant::now();
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(5) {
        if raw.closed_within(Duration::from_millis(250)) {
            closed = true;
            break;
        }
        let _ = raw.sock.write_all(&frame_bytes(DATA, 0, 3, b"x"));
    }
    assert!(closed, "the stalled upload was kept alive by the other one");
    let waited = started.elapsed();
    assert!(
        waited > Duration::from_millis(700) && waited < Duration::from_secs(3),
        "closed after {waited:?} with --body-timeout 1"
    );
}
