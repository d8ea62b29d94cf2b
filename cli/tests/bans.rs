//! Bans against the real binary: slow request heads (header timeouts) and connections a
//! handler drops ban the peer, whose next connections are closed at accept without a byte;
//! neighbours and exempt addresses still get answers; bans expire; `--ban-nft-set` puts the
//! address into an nftables set inside a network namespace this test makes.
//!
//! Clients bind to other loopback addresses (127.0.0.2, ...) to be banned: 127.0.0.1 and ::1
//! are exempt by default.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use support::{demo_command, Tern};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A TCP connection from `src` (bound before connecting) to `dst`.
fn connect_from(src: IpAddr, dst: SocketAddr) -> std::io::Result<TcpStream> {
    let domain = socket2::Domain::for_address(dst);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    s.bind(&SocketAddr::new(src, 0).into())?;
    s.connect_timeout(&dst.into(), Duration::from_secs(2))?;
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    Ok(s)
}

/// What a `GET path` from `src` got: the whole answer (empty if the server closed or reset the
/// connection without a byte), and how long that took.
fn get_from(src: IpAddr, dst: SocketAddr, path: &str) -> (String, Duration) {
    let started = Instant::now();
    let mut s = connect_from(src, dst).unwrap_or_else(|e| panic!("connect from {src}: {e}"));
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    // A closed connection may already refuse the write; the read tells what happened.
    let _ = s.write_all(req.as_bytes());
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("read from {dst} as {src}: {e} after {got:?}"),
        }
    }
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

/// Answered 200 with `src` as the body of `/ip`.
fn assert_answered(tern: &Tern, src: &str) {
    let (got, _) = get_from(ip(src), tern.addr(), "/ip");
    assert!(
        got.starts_with("HTTP/1.1 200") && got.ends_with(&format!("\r\n\r\n{src}\n")),
        "{src} not answered: {got:?}; stderr:\n{}",
        tern.stderr_text()
    );
}

/// Closed at accept: not a byte, and at once (well before the 1 s header timeout).
fn assert_banned(tern: &Tern, src: &str) {
    let (got, took) = get_from(ip(src), tern.addr(), "/ip");
    assert!(got.is_empty(), "{src} was answered: {got:?}");
    assert!(
        took < Duration::from_millis(800),
        "{src}: closed after {took:?}"
    );
}

/// `n` slow request heads from `src` at once; each must be cut by the header timeout (408).
fn slow_heads(tern: &Tern, src: &str, n: usize) {
    let conns: Vec<TcpStream> = (0..n)
        .map(|_| {
            let mut s = connect_from(ip(src), tern.addr()).unwrap();
            s.write_all(b"GET /ip HTTP/1.1\r\nHost: t\r\nX-Slow: ")
                .unwrap();
            s
        })
        .collect();
    for mut s in conns {
        let mut got = String::new();
        let _ = s.read_to_string(&mut got);
        assert!(
            got.starts_with("HTTP/1.1 408"),
            "slow head from {src} not timed out: {got:?}"
        );
    }
}

fn demo(extra: &[&str]) -> (tempfile::TempDir, Tern) {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec!["--header-timeout", "1"];
    args.extend_from_slice(extra);
    let tern = Tern::start_demo(&tmp.path().join("data"), &args);
    (tmp, tern)
}

#[test]
fn slow_heads_ban_the_peer_until_the_ban_expires() {
    let (_tmp, tern) = demo(&["--ban-after", "3", "--ban-seconds", "2"]);
    // Two strikes: not yet.
    slow_heads(&tern, "127.0.0.2", 2);
    assert_answered(&tern, "127.0.0.2");
    assert_eq!(tern.statusz("bans_added"), 0);
    // The third within the window bans.
    slow_heads(&tern, "127.0.0.2", 1);
    let banned_at = Instant::now();
    assert_banned(&tern, "127.0.0.2");
    assert_banned(&tern, "127.0.0.2");
    // Neighbours and the exempt default are still served.
    assert_answered(&tern, "127.0.0.3");
    assert_answered(&tern, "127.0.0.1");
    assert_eq!(tern.statusz("bans_added"), 1);
    assert_eq!(tern.statusz("connections_banned"), 2);
    assert!(tern.statusz("timeouts{kind=\"header\"}") >= 3);
    let metrics = tern.get("/metrics").text();
    assert!(
        metrics.contains("\ntern_connections_banned_total 2\n"),
        "{metrics}"
    );
    // The ban ends after --ban-seconds.
    std::thread::sleep(Duration::from_millis(2300).saturating_sub(banned_at.elapsed()));
    assert_answered(&tern, "127.0.0.2");
    assert_eq!(tern.statusz("connections_banned"), 2);
}

#[test]
fn a_slash_24_ban_covers_the_neighbours_but_not_exempt_addresses() {
    let (_tmp, tern) = demo(&["--ban-after", "1", "--ban-ipv4-prefix", "24"]);
    slow_heads(&tern, "127.0.0.2", 1);
    assert_banned(&tern, "127.0.0.2");
    assert_banned(&tern, "127.0.0.3");
    assert_answered(&tern, "127.0.0.1");
    // The ban's log line is written by the log's own writer, not before the ban takes
    // effect: wait for it rather than expect it at once.
    assert!(
        support::eventually(Duration::from_secs(5), || tern
            .log_lines("banned for 600 s")
            .iter()
            .any(|l| l.contains("127.0.0.0/24"))),
        "no ban line for 127.0.0.0/24 in:\n{}",
        tern.stderr_text()
    );
}

#[test]
fn exempt_addresses_are_never_banned() {
    let (_tmp, tern) = demo(&["--ban-after", "1", "--ban-exempt", "127.0.0.1,127.0.0.2/32"]);
    slow_heads(&tern, "127.0.0.2", 2);
    slow_heads(&tern, "127.0.0.1", 2);
    assert_answered(&tern, "127.0.0.2");
    assert_answered(&tern, "127.0.0.1");
    assert_eq!(tern.statusz("bans_added"), 0);
    // The same strike from an address not in the list bans (so the above could fail).
    slow_heads(&tern, "127.0.0.4", 1);
    assert_banned(&tern, "127.0.0.4");
    assert_eq!(tern.statusz("bans_added"), 1);
}

#[test]
fn the_default_exemption_is_127_0_0_1() {
    let (_tmp, tern) = demo(&["--ban-after", "1"]);
    slow_heads(&tern, "127.0.0.1", 2);
    assert_answered(&tern, "127.0.0.1");
    slow_heads(&tern, "127.0.0.2", 1);
    assert_banned(&tern, "127.0.0.2");
}

#[test]
fn ban_off_never_bans() {
    let (_tmp, tern) = demo(&["--ban", "off", "--ban-after", "1"]);
    slow_heads(&tern, "127.0.0.2", 2);
    assert_answered(&tern, "127.0.0.2");
    assert_eq!(tern.statusz("bans_added"), 0);
}

/// This machine's own non-loopback IPv4 address (the rate limiter exempts all of 127/8, so a
/// client far over its bucket must come from elsewhere), if it has one.
fn own_address() -> Option<Ipv4Addr> {
    let s = UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("198.51.100.1:9").ok()?;
    match s.local_addr().ok()?.ip() {
        IpAddr::V4(a) if !a.is_loopback() && !a.is_unspecified() => Some(a),
        _ => None,
    }
}

/// Claims from `src` on new connections until the game drops one without an answer.
fn claim_until_dropped(tern: &Tern, src: IpAddr, dst: SocketAddr) {
    for i in 0..20 {
        let (got, _) = get_from(src, dst, &format!("/claim/flood{i}"));
        if got.is_empty() {
            return;
        }
        assert!(
            got.starts_with("HTTP/1.1 200") || got.starts_with("HTTP/1.1 429"),
            "{got:?}"
        );
    }
    panic!("no claim dropped; stderr:\n{}", tern.stderr_text());
}

#[test]
fn a_connection_dropped_far_over_the_rate_limit_bans() {
    let Some(own) = own_address() else {
        eprintln!("SKIP: no non-loopback IPv4 address to come from");
        return;
    };
    for bans_on in [true, false] {
        let tmp = tempfile::tempdir().unwrap();
        let mut args = vec!["--workers", "1", "--rate", "1", "--burst", "1"];
        if !bans_on {
            args.extend(["--ban", "off"]);
        }
        let cmd = demo_command(&tmp.path().join("data"), &["--listen", "0.0.0.0:0"], &args);
        let tern = Tern::spawn(cmd);
        let dst = SocketAddr::new(IpAddr::V4(own), tern.addr().port());
        claim_until_dropped(&tern, IpAddr::V4(own), dst);
        let (got, took) = get_from(IpAddr::V4(own), dst, "/ip");
        assert!(tern.statusz("connections_dropped") >= 1);
        if bans_on {
            assert!(got.is_empty(), "answered after a drop: {got:?}");
            assert!(took < Duration::from_millis(800), "closed after {took:?}");
            assert_eq!(tern.statusz("bans_added"), 1);
            assert_eq!(tern.statusz("connections_banned"), 1);
        } else {
            // /ip is not rate-limited: with bans off the same peer is answered.
            assert!(got.starts_with("HTTP/1.1 200"), "{got:?}");
            assert_eq!(tern.statusz("bans_added"), 0);
        }
    }
}

#[test]
fn bad_ban_flags_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for args in [
        &["--ban-ipv4-prefix", "16"][..],
        &["--ban-exempt", "10.0.0.0/8,banana"],
        &["--ban", "maybe"],
        &["--ban-nft-set", "inet/filter"],
        &["--ban-nft-set", "inet/t/s;flush ruleset"],
        // Well-formed, but no such set (or no nft at all): refused at start-up.
        &["--ban-nft-set", "inet/tern_no_such_table/tern_no_such_set"],
        &["--ban", "off", "--ban-nft-set", "inet/t/s"],
    ] {
        let failed = Tern::demo_failing(tmp.path(), args);
        assert!(!failed.status.success(), "{args:?}: {:?}", failed.status);
        let err = failed.stderr.trim_end();
        let first = err.lines().next().unwrap_or("");
        assert!(first.contains("--ban"), "{args:?}: {err:?}");
        if first.starts_with("tern: ") {
            assert_eq!(err.lines().count(), 1, "{args:?}: {err:?}");
        } else {
            // clap's own refusal (its usage hint follows).
            assert!(first.starts_with("error: "), "{args:?}: {err:?}");
        }
        assert!(failed.stdout.is_empty(), "{:?}", failed.stdout);
    }
}

// --ban-nft-set in a network namespace of its own.

const NETNS_ENV: &str = "TERN_BANS_TEST_IN_NETNS";

fn tool(name: &str) -> bool {
    support::have(name, "--version")
}

/// Runs `nft_inside_a_namespace` in a new network namespace (`unshare --net`), where it may
/// change the firewall freely.
#[test]
fn nft_set_gets_bans_and_the_kernel_drops_them() {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
    if !root {
        eprintln!("SKIP: --ban-nft-set test needs root (network namespace, nftables)");
        return;
    }
    if !tool("nft") && !Path::new("/usr/sbin/nft").exists() {
        eprintln!("SKIP: no nft (scripts/install-ban-test-deps installs nftables)");
        return;
    }
    if !tool("unshare") || !tool("ip") {
        eprintln!("SKIP: no unshare or ip to make a network namespace");
        return;
    }
    let probe = Command::new("unshare")
        .args(["--net", "true"])
        .stderr(Stdio::null())
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("SKIP: cannot make a network namespace here (unshare --net failed)");
        return;
    }
    let me = std::env::current_exe().unwrap();
    let out = Command::new("unshare")
        .arg("--net")
        .arg(me)
        .args([
            "--exact",
            // The test's name in this binary: its module path without the crate's name.
            &format!("{}::nft_inside_a_namespace", in_this_binary(module_path!())),
            "--ignored",
            "--nocapture",
        ])
        .env(NETNS_ENV, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "in the namespace:\n{text}");
    assert!(
        text.contains("1 passed"),
        "the inner test did not run:\n{text}"
    );
}

/// A module's path as libtest names its tests (`e2e::bans` is `bans`).
fn in_this_binary(module: &str) -> &str {
    module.split_once("::").map_or("", |(_, path)| path)
}

fn sh(cmd: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", cmd])
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "run by nft_set_gets_bans_and_the_kernel_drops_them inside a network namespace"]
fn nft_inside_a_namespace() {
    assert_eq!(
        std::env::var(NETNS_ENV).as_deref(),
        Ok("1"),
        "only inside the namespace the outer test makes: it changes the firewall"
    );
    sh("ip link set lo up");
    sh("nft add table inet tern_test");
    sh("nft 'add set inet tern_test bans { type ipv4_addr; flags timeout; }'");
    // Packets from banned addresses never reach tern.
    sh("nft 'add chain inet tern_test input { type filter hook input priority 0; }'");
    sh("nft 'add rule inet tern_test input ip saddr @bans counter drop'");

    let (_tmp, tern) = demo(&[
        "--ban-after",
        "1",
        "--ban-seconds",
        "30",
        "--ban-nft-set",
        "inet/tern_test/bans",
    ]);
    assert_answered(&tern, "127.0.0.2");
    slow_heads(&tern, "127.0.0.2", 1);
    // The feeder writes to nft -i at once; allow it a moment.
    let deadline = Instant::now() + Duration::from_secs(3);
    let listing = loop {
        let l = sh("nft list set inet tern_test bans");
        if l.contains("127.0.0.2") || Instant::now() > deadline {
            break l;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        listing.contains("127.0.0.2 timeout 30s"),
        "{listing}\nstderr:\n{}",
        tern.stderr_text()
    );
    // The kernel now drops 127.0.0.2's SYNs: connecting times out instead of being accepted
    // and closed by tern.
    let banned_before = tern.statusz("connections_banned");
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::new(ip("127.0.0.2"), 0).into()).unwrap();
    let err = s
        .connect_timeout(&tern.addr().into(), Duration::from_millis(500))
        .expect_err("connected although the kernel should drop the SYN");
    assert!(
        matches!(err.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock),
        "{err}"
    );
    assert_eq!(tern.statusz("connections_banned"), banned_before);
    let counters = sh("nft list chain inet tern_test input");
    assert!(!counters.contains("packets 0 "), "{counters}");
    // Others still get in; nothing failed on the way to nft.
    assert_answered(&tern, "127.0.0.3");
    assert_eq!(tern.statusz("ban_nft_failures"), 0);
}
