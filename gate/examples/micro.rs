//! The gate's per-request costs on one core, for bench/gate (not a test: it only reports).
//!
//!     cargo run --release -p tern-gate --example micro
//!
//! - a session cookie checked (one MAC, no allocation): ns each;
//! - challenges issued, and answers verified (one MAC, one SHA-256, the replay set): per second;
//! - the shipped default policy evaluated over a mix of browsers, tools and crawlers: ns each.

use std::hint::black_box;
use std::net::IpAddr;
use std::path::Path;
use std::time::Instant;

use tern_gate::keyring::Keyring;
use tern_gate::policy::{Policy, DEFAULT_POLICY};
use tern_gate::pow::{self, ChallengeSpec, ReplaySet};
use tern_gate::token::{self, Session, MAX_TOKEN};
use tern_gate::Prefix;

fn main() {
    let keyring = Keyring::from_keys(vec![(1, 1_700_000_000, [7u8; 32])]);
    let now = 1_800_000_000u64;
    let prefix = Prefix::of("192.0.2.10".parse().unwrap(), 24, 48);

    let cookie = token::issue(
        &keyring,
        &Session {
            realm: "staff",
            user: "alice",
            issued: now,
            expires: now + 86_400,
            realm_version: 3,
            prefix,
            ua_hash: pow::ua_hash(b"Mozilla/5.0"),
            proof: token::Proof::Password,
            kid: 0,
        },
    )
    .unwrap();
    let n = 2_000_000;
    let started = Instant::now();
    for _ in 0..n {
        let mut buf = [0u8; MAX_TOKEN];
        black_box(token::verify(&keyring, black_box(cookie.as_bytes()), &mut buf, now).is_ok());
    }
    let token_ns = started.elapsed().as_nanos() as f64 / n as f64;

    let spec = ChallengeSpec {
        expires: now + 600,
        not_before: now,
        prefix,
        ua_hash: pow::ua_hash(b"Mozilla/5.0"),
        rule: 3,
        difficulty: 1,
        realm_hint: 0,
        seconds: 0,
    };
    let n = 300_000;
    let started = Instant::now();
    let challenges: Vec<String> = (0..n).map(|_| pow::issue(&keyring, &spec)).collect();
    let issue_rate = n as f64 / started.elapsed().as_secs_f64();
    let answers: Vec<String> = challenges
        .iter()
        .map(|c| pow::solve(c, 1).to_string())
        .collect();
    let replay = ReplaySet::new(1 << 20);
    let started = Instant::now();
    for (c, a) in challenges.iter().zip(&answers) {
        let r = pow::verify(&keyring, c, a, now, prefix, spec.ua_hash, &replay);
        assert!(r.is_ok(), "{r:?}");
    }
    let verify_rate = n as f64 / started.elapsed().as_secs_f64();

    let policy = Policy::parse(DEFAULT_POLICY, Path::new("default"), &[]).unwrap();
    let mix: [(&str, &str, &str, &str); 8] = [
        ("GET", "/", "Mozilla/5.0 (X11; Linux x86_64; rv:132.0) Gecko/20100101 Firefox/132.0", "text/html"),
        ("GET", "/docs/guide/install.html", "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.0 Mobile/15E148 Safari/604.1", "text/html"),
        ("GET", "/robots.txt", "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)", "*/*"),
        ("GET", "/repo.git/info/refs", "git/2.43.0", "*/*"),
        ("GET", "/feed.xml", "Miniflux/2.1 (+https://miniflux.app)", "application/rss+xml"),
        ("GET", "/", "curl/8.5.0", "*/*"),
        ("GET", "/wiki/Page", "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)", "*/*"),
        ("POST", "/api/items", "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36", "application/json"),
    ];
    let ip: IpAddr = "203.0.113.9".parse().unwrap();
    let n = 2_000_000;
    let started = Instant::now();
    for i in 0..n {
        let (method, path, ua, accept) = mix[i % mix.len()];
        let d = policy.evaluate(
            black_box(method),
            black_box(path),
            |name| match name {
                "user-agent" | "User-Agent" => Some(ua.as_bytes()),
                "accept" | "Accept" => Some(accept.as_bytes()),
                _ => None,
            },
            ip,
        );
        black_box(d);
    }
    let policy_ns = started.elapsed().as_nanos() as f64 / n as f64;

    println!("gate micro (one core): session cookie checked in {token_ns:.0} ns; challenges issued {issue_rate:.0}/s; answers verified {verify_rate:.0}/s; default policy evaluated in {policy_ns:.0} ns ({} rules)", policy.rule_names().len());
}
