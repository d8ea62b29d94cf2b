//! The IPv4 Games on PostgreSQL (`tern demo --store postgres://…`), end to end: real `tern demo`
//! nodes on a throwaway cluster (`tern_ipv4_games::pg_cluster`, Debian's PostgreSQL binaries,
//! installed by scripts/install-pg-test-deps). Several nodes play one game; an acknowledged
//! claim is in the database whatever is killed; the database going away gives 503s, not hangs.
//! TLS to the database as libpq's `sslmode` and `sslrootcert` say, against a cluster with
//! `ssl = on` and certificates of a test CA.

use std::io::Write;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{support, tls_support};
use support::{demo_command, eventually, Client, Tern};
use tern_ipv4_games::pg_cluster::PgCluster;

/// The tests here measure delays and load a database each: one at a time, so that one's
/// load is not another's delay.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn cluster() -> PgCluster {
    PgCluster::start(&[]).unwrap_or_else(|e| panic!("a PostgreSQL cluster for the test: {e}"))
}

/// `tern demo --store URL` on an ephemeral port, X-Forwarded-For believed from loopback.
fn node(url: &str) -> Tern {
    Tern::spawn(node_command(url))
}

/// The command [`node`] runs, for a test that adds to it.
fn node_command(url: &str) -> std::process::Command {
    let data = tempfile::tempdir().unwrap().keep();
    demo_command(
        &data,
        &["--listen", "127.0.0.1:0"],
        &[
            "--store",
            url,
            "--trusted-proxies",
            "127.0.0.1",
            "--rate-exempt",
            "0.0.0.0/0",
        ],
    )
}

/// `tern demo --store URL` with `HOME` set to `home` (where libpq's default root certificate
/// file would be).
fn node_at_home(url: &str, home: &std::path::Path) -> Tern {
    let mut cmd = node_command(url);
    cmd.env("HOME", home);
    Tern::spawn(cmd)
}

/// `tern demo --store URL --check` with `HOME` set to `home`, to its end.
fn check_store(url: &str, home: &std::path::Path) -> support::Failed {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = demo_command(data.path(), &[], &["--store", url, "--check"]);
    cmd.env("HOME", home)
        .env_remove("PGSSLMODE")
        .env_remove("PGSSLROOTCERT");
    support::run_to_end(&mut cmd, Duration::from_secs(20))
}

/// The one-line start-up error of `tern demo --store URL` (which must fail).
fn start_up_error(url: &str, home: &std::path::Path) -> String {
    let data = tempfile::tempdir().unwrap();
    let mut cmd = demo_command(data.path(), support::LISTEN, &["--store", url]);
    cmd.env("HOME", home)
        .env_remove("PGSSLMODE")
        .env_remove("PGSSLROOTCERT");
    let failed = support::run_to_end(&mut cmd, Duration::from_secs(20));
    assert!(!failed.status.success(), "{url} started");
    let err = failed.stderr.trim_end().to_string();
    assert_eq!(err.lines().count(), 1, "{url}: {err}");
    assert!(err.starts_with("tern: "), "{url}: {err}");
    err
}

/// How many of tern's sessions (`application_name = 'tern'`) use TLS, and how many do not
/// (`pg_stat_ssl`, asked over a plain connection of the test's own).
fn tern_sessions(url: &str) -> (i64, i64) {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let row = c
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
             FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.application_name = 'tern'",
            &[],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

fn claim(tern: &Tern, ip: &str, name: &str) -> (u16, String) {
    let r = tern.get_with(
        &format!("/claim/{name}"),
        &[("X-Forwarded-For", ip), ("Accept", "text/plain")],
    );
    (r.status, r.text())
}

/// `total` of the player page of `name` on `tern`.
fn holdings(tern: &Tern, name: &str) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&tern.get(&format!("/player/{name}")).text()).unwrap();
    v["total"].as_u64().unwrap()
}

/// Who holds each address in the database.
fn owners(url: &str) -> std::collections::HashMap<u32, String> {
    let mut c = postgres::Client::connect(url, postgres::NoTls).unwrap();
    c.query("SELECT ip, nick FROM land", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get::<_, i64>(0) as u32, r.get(1)))
        .collect()
}

#[test]
fn two_nodes_play_one_game() {
    let _one_at_a_time = serial();
    let pg = cluster();
    let url = pg.url("postgres");
    let a = node(&url);
    let b = node(&url);
    // Each node sees the other's claims: measure how long that takes.
    let mut delays = Vec::new();
    for i in 0..40u32 {
        let (from, to) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
        let ip = Ipv4Addr::new(10, 1, (i / 256) as u8, i as u8).to_string();
        let name = format!("p{i}");
        assert_eq!(claim(from, &ip, &name).0, 200);
        let t = Instant::now();
        assert!(
            eventually(Duration::from_secs(2), || to
                .get("/recent")
                .text()
                .contains(&format!("\"name\":\"{name}\""))),
            "{name} never reached the other node's /recent"
        );
        delays.push(t.elapsed());
    }
    delays.sort();
    let p99 = delays[delays.len() * 99 / 100];
    println!(
        "a claim reached the other node's /recent in p50 {:?}, max {:?}",
        delays[delays.len() / 2],
        delays[delays.len() - 1]
    );
    assert!(p99 < Duration::from_secs(1), "p99 {p99:?}");

    // The same address claimed on both nodes at once, again and again: one owner, the
    // same on both nodes and in the database.
    for round in 0..30 {
        let ip = format!("10.2.0.{round}");
        let (ip2, ip3) = (ip.clone(), ip.clone());
        let (addr_a, addr_b) = (a.addr(), b.addr());
        let ta = std::thread::spawn(move || {
            let mut c = Client::connect(addr_a);
            c.get(&format!("/claim/a{round}"), &[("X-Forwarded-For", &ip2)])
                .status
        });
        let tb = std::thread::spawn(move || {
            let mut c = Client::connect(addr_b);
            c.get(&format!("/claim/b{round}"), &[("X-Forwarded-For", &ip3)])
                .status
        });
        assert_eq!((ta.join().unwrap(), tb.join().unwrap()), (200, 200));
        let ipn = u32::from(ip.parse::<Ipv4Addr>().unwrap());
        let owner = owners(&url)[&ipn].clone();
        let loser = if owner.starts_with('a') {
            format!("b{round}")
        } else {
            format!("a{round}")
        };
        for n in [&a, &b] {
            assert!(
                eventually(Duration::from_secs(10), || holdings(n, &owner) == 1
                    && holdings(n, &loser) == 0),
                "round {round}: a node disagrees with the database ({owner} holds {ip}): \
                 {owner} {} {loser} {}; log: {:?}",
                holdings(n, &owner),
                holdings(n, &loser),
                postgres::Client::connect(&url, postgres::NoTls)
                    .unwrap()
                    .query(
                        "SELECT xid::text, id, nick FROM claim_log WHERE ip = $1",
                        &[&(ipn as i64)]
                    )
                    .unwrap()
                    .iter()
                    .map(|r| (
                        r.get::<_, String>(0),
                        r.get::<_, i64>(1),
                        r.get::<_, String>(2)
                    ))
                    .collect::<Vec<_>>()
            );
        }
    }
    // A node that starts later loads everything.
    let c = node(&url);
    assert_eq!(holdings(&c, "p39"), 1);
    let statusz = c.get("/statusz").text();
    assert!(statusz.contains("recovered_claims: 70"), "{statusz}");
}

/// Claims from `threads` keep-alive clients (each its own fresh addresses) until `stop`;
/// returns (answered 200, answered 503) as (address, name) lists and a count.
fn load(
    tern: &Tern,
    threads: u32,
    prefix: u8,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(Vec<(u32, String)>, usize)> {
    let addr = tern.addr();
    std::thread::spawn(move || {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut acked = Vec::new();
                    let mut refused = 0;
                    let mut c = Client::connect(addr);
                    for i in 0u32.. {
                        if stop.load(Ordering::Acquire) {
                            break;
                        }
                        let ip = Ipv4Addr::new(prefix, t as u8, (i >> 8) as u8, i as u8);
                        let name = format!("t{t}n{i}");
                        let req = support::request_bytes(
                            "GET",
                            &format!("/claim/{name}"),
                            &[
                                ("X-Forwarded-For", &ip.to_string()),
                                ("Accept", "text/plain"),
                            ],
                        );
                        if c.stream.write_all(&req).is_err() {
                            break;
                        }
                        match c.try_read_response(false) {
                            Ok(r) if r.status == 200 => acked.push((u32::from(ip), name)),
                            Ok(r) if r.status == 503 => {
                                // As a client that honours Retry-After would, only sooner.
                                refused += 1;
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            Ok(r) => panic!("status {}: {}", r.status, r.text()),
                            Err(_) => break,
                        }
                    }
                    (acked, refused)
                })
            })
            .collect();
        let mut all = Vec::new();
        let mut refused = 0;
        for w in workers {
            let (a, r) = w.join().unwrap();
            all.extend(a);
            refused += r;
        }
        (all, refused)
    })
}

fn missing(url: &str, acked: &[(u32, String)]) -> usize {
    let held = owners(url);
    acked
        .iter()
        .filter(|(ip, name)| held.get(ip) != Some(name))
        .count()
}

#[test]
fn a_killed_node_and_a_restarted_database_lose_no_acknowledged_claim() {
    let _one_at_a_time = serial();
    let pg = cluster();
    let url = pg.url("postgres");
    // SIGKILL a node under load.
    let mut a = node(&url);
    let stop = Arc::new(AtomicBool::new(false));
    let running = load(&a, 8, 20, stop.clone());
    std::thread::sleep(Duration::from_millis(1500));
    a.signal(libc::SIGKILL);
    a.wait_exit(Duration::from_secs(5)).expect("killed");
    stop.store(true, Ordering::Release);
    let (acked, _) = running.join().unwrap();
    assert!(acked.len() > 100, "only {} claims answered", acked.len());
    assert_eq!(
        missing(&url, &acked),
        0,
        "acknowledged claims lost after SIGKILL"
    );
    println!(
        "SIGKILL: {} acknowledged claims, all in the database",
        acked.len()
    );

    // Restart the database under load: 503s while it is away, never a hang, full service
    // after, and nothing acknowledged lost.
    let b = node(&url);
    let stop = Arc::new(AtomicBool::new(false));
    let running = load(&b, 8, 30, stop.clone());
    std::thread::sleep(Duration::from_millis(700));
    pg.stop().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let during = claim(&b, "30.99.0.1", "while-down");
    assert_eq!(during.0, 503, "{during:?}");
    pg.start_again().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || claim(&b, "30.99.0.2", "after")
            .0
            == 200),
        "claims never came back after the database did"
    );
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, Ordering::Release);
    let (acked, refused) = running.join().unwrap();
    println!(
        "database restart: {} acknowledged claims, {refused} answered 503 during the outage",
        acked.len()
    );
    assert!(refused > 0, "no claim saw the outage");
    assert_eq!(
        missing(&url, &acked),
        0,
        "acknowledged claims lost in the restart"
    );
    let s = b.get("/statusz").text();
    assert!(s.contains("pg_down: 0"), "{s}");
}

#[test]
fn check_and_start_up_errors_are_one_line() {
    let _one_at_a_time = serial();
    let pg = cluster();
    let url = pg.url("postgres");
    let data = tempfile::tempdir().unwrap();
    let ok = support::run_to_end(
        &mut demo_command(data.path(), &[], &["--store", &url, "--check"]),
        Duration::from_secs(20),
    );
    assert!(ok.status.success(), "{}", ok.stderr);
    assert!(
        ok.stdout.starts_with("tern: ") && ok.stdout.contains("schema version 2"),
        "{}",
        ok.stdout
    );
    // libpq's default, sslmode=prefer, goes plain with a server without TLS.
    for url in [url.clone(), format!("{url}?sslmode=prefer")] {
        let ok = check_store(&url, data.path());
        assert!(ok.status.success(), "{url}: {}", ok.stderr);
        assert!(
            ok.stdout
                .contains("connection not encrypted, sslmode=prefer"),
            "{url}: {}",
            ok.stdout
        );
    }
    // A role with a password: taken from PGPASSWORD when the URL has none.
    pg.add_password_role("player", "s3cret").unwrap();
    postgres::Client::connect(&url, postgres::NoTls)
        .unwrap()
        .batch_execute("CREATE DATABASE player OWNER player")
        .unwrap();
    let with_password = format!("postgres://player@127.0.0.1:{}/player", pg.port());
    let mut cmd = demo_command(data.path(), &[], &["--store", &with_password, "--check"]);
    cmd.env("PGPASSWORD", "s3cret");
    let ok = support::run_to_end(&mut cmd, Duration::from_secs(20));
    assert!(ok.status.success(), "{}", ok.stderr);
    // Nothing listening there; a missing database; a schema from a newer tern; a wrong
    // password.
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    c.batch_execute("CREATE DATABASE newer").unwrap();
    let mut n = postgres::Client::connect(&pg.url("newer"), postgres::NoTls).unwrap();
    n.batch_execute(
        "CREATE TABLE tern_schema (version integer NOT NULL); INSERT INTO tern_schema VALUES (99)",
    )
    .unwrap();
    for (bad, says) in [
        (
            "postgres://tern@127.0.0.1:1/postgres".to_string(),
            "cannot connect",
        ),
        (pg.url("nope"), "cannot connect"),
        (pg.url("newer"), "newer tern"),
        ("mysql://x".to_string(), "not a postgres:// URL"),
        (
            format!("postgres://player:wrong@127.0.0.1:{}/player", pg.port()),
            "password authentication failed",
        ),
        // TLS required of a server without it.
        (
            format!("{url}?sslmode=require"),
            "error performing TLS handshake: server does not support TLS",
        ),
    ] {
        let failed = Tern::demo_failing(data.path(), &["--store", &bad]);
        assert!(!failed.status.success(), "{bad}");
        let err = failed.stderr.trim_end();
        assert_eq!(err.lines().count(), 1, "{bad}: {err}");
        assert!(
            err.starts_with("tern: ") && err.contains(says),
            "{bad}: {err}"
        );
    }
}

#[test]
fn tern_run_plays_on_postgres_from_its_config() {
    let _one_at_a_time = serial();
    let pg = cluster();
    let url = pg.url("postgres");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tern.toml");
    let write = |store: &str| {
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\n[[site]]\nname = \"game\"\nhosts = [\"game.test\"]\n\
                 [[site.route]]\npath = \"/\"\napp = \"ipv4-games\"\nstore = \"{store}\"\n"
            ),
        )
        .unwrap()
    };
    // A store that is not PostgreSQL is a config problem with its line.
    write("mysql://x");
    let mut cmd = std::process::Command::new(support::TERN);
    cmd.arg("run").arg("--check").arg("--config").arg(&config);
    let failed = support::run_to_end(&mut cmd, Duration::from_secs(20));
    assert!(!failed.status.success());
    assert!(
        failed.stderr.contains("line 8: store:") && failed.stderr.contains("not a postgres:// URL"),
        "{}",
        failed.stderr
    );
    // So is a TLS setting PostgreSQL's own client would refuse.
    write(&format!("{url}?sslmode=verify-everything"));
    let mut cmd = std::process::Command::new(support::TERN);
    cmd.arg("run").arg("--check").arg("--config").arg(&config);
    let failed = support::run_to_end(&mut cmd, Duration::from_secs(20));
    assert!(!failed.status.success());
    assert!(
        failed.stderr.contains("line 8: store:")
            && failed
                .stderr
                .contains("sslmode=\"verify-everything\" is not supported"),
        "{}",
        failed.stderr
    );
    write(&url);
    let mut cmd = std::process::Command::new(support::TERN);
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .args(["--workers", "2", "--sandbox", "on"]);
    let tern = Tern::spawn(cmd);
    let mut c = tern.client();
    c.send(b"GET /claim/runner HTTP/1.1\r\nHost: game.test\r\nAccept: text/plain\r\n\r\n");
    let r = c.read_response(false);
    assert_eq!(r.text(), "127.0.0.1 is now claimed by runner\n");
    assert_eq!(owners(&url)[&u32::from(Ipv4Addr::LOCALHOST)], "runner");
}

#[test]
fn a_database_of_schema_version_1_is_upgraded_in_place() {
    let _one_at_a_time = serial();
    let pg = cluster();
    let url = pg.url("postgres");
    // The schema as the first tern with PostgreSQL left it, with a claim in it.
    let mut c = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    c.batch_execute(
        "CREATE TABLE tern_schema (version integer NOT NULL);
         CREATE TABLE land (ip bigint PRIMARY KEY, nick text NOT NULL, created bigint NOT NULL);
         CREATE TABLE claim_log (
             id bigserial PRIMARY KEY,
             xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
             at timestamptz NOT NULL DEFAULT now(),
             ip bigint NOT NULL, nick text NOT NULL, created bigint NOT NULL);
         CREATE INDEX claim_log_order ON claim_log (xid, id);
         CREATE INDEX claim_log_at ON claim_log (at);
         INSERT INTO tern_schema VALUES (1);
         INSERT INTO land VALUES (167772161, 'old-timer', 1790000000);",
    )
    .unwrap();
    let a = node(&url);
    assert_eq!(holdings(&a, "old-timer"), 1);
    assert_eq!(claim(&a, "10.0.0.2", "newcomer").0, 200);
    assert_eq!(owners(&url)[&0x0a00_0002], "newcomer");
    let version: i32 = c
        .query_one("SELECT max(version) FROM tern_schema", &[])
        .unwrap()
        .get(0);
    assert_eq!(version, 2);
}

#[test]
fn a_stalled_database_gives_503s_in_bounded_time_and_reads_go_on() {
    let _one_at_a_time = serial();
    let pg = cluster();
    let url = pg.url("postgres");
    let a = node(&url);
    assert_eq!(claim(&a, "10.3.0.1", "before").0, 200);
    // Another session holds the table: the claim transaction waits on its lock.
    let mut blocker = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    let mut tx = blocker.transaction().unwrap();
    tx.batch_execute("LOCK TABLE land IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let addr = a.addr();
    let stuck = std::thread::spawn(move || {
        let started = Instant::now();
        let r = Client::connect(addr).get(
            "/claim/stuck",
            &[("X-Forwarded-For", "10.3.0.2"), ("Accept", "text/plain")],
        );
        (
            r.status,
            r.header("retry-after").map(str::to_string),
            started.elapsed(),
        )
    });
    // Once the writer's transaction has run over a second, new claims are refused at
    // once, and reads are served.
    let running_for = |tern: &Tern| -> f64 {
        let s = tern.get("/statusz").text();
        let line = s
            .lines()
            .find_map(|l| l.strip_prefix("pg_transaction_seconds: "))
            .unwrap_or_else(|| panic!("no pg_transaction_seconds in {s}"));
        line.trim().parse().unwrap()
    };
    // A claim that comes before that waits in the writer's queue, behind the stuck one.
    assert!(
        eventually(Duration::from_secs(1), || running_for(&a) > 0.0),
        "the claim transaction never started"
    );
    let queued = std::thread::spawn(move || {
        let started = Instant::now();
        let r = Client::connect(addr).get(
            "/claim/queued",
            &[("X-Forwarded-For", "10.3.0.5"), ("Accept", "text/plain")],
        );
        (r.status, started.elapsed())
    });
    assert!(
        eventually(Duration::from_secs(4), || running_for(&a) > 1.05),
        "the claim transaction never showed as stalled"
    );
    let t = Instant::now();
    assert_eq!(claim(&a, "10.3.0.3", "later").0, 503);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    let t = Instant::now();
    let recent = a.get("/recent");
    assert_eq!(recent.status, 200);
    assert!(recent.text().contains("before"));
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    let (status, retry_after, waited) = stuck.join().unwrap();
    assert_eq!(status, 503);
    assert_eq!(retry_after.as_deref(), Some("1"));
    println!("the claim behind the lock was answered 503 after {waited:?}");
    assert!(waited < Duration::from_secs(8), "{waited:?}");
    // The queued claim was refused when the writer got to it (it had waited too long),
    // without another try at the stuck table.
    let (status, waited) = queued.join().unwrap();
    assert_eq!(status, 503);
    assert!(waited < Duration::from_secs(8), "{waited:?}");
    tx.rollback().unwrap();
    assert!(
        eventually(Duration::from_secs(5), || claim(&a, "10.3.0.4", "after").0
            == 200),
        "claims never came back once the lock was gone"
    );
    let s = a.get("/statusz").text();
    assert!(!s.contains("claims_refused_stalled: 0\n"), "{s}");
    let held = owners(&url);
    assert!(!held.contains_key(&0x0a03_0002) && !held.contains_key(&0x0a03_0005));
}

#[test]
fn a_standby_promoted_under_load_loses_no_acknowledged_claim() {
    let _one_at_a_time = serial();
    let primary = cluster();
    let standby = primary.standby().expect("a streaming standby");
    assert!(
        eventually(Duration::from_secs(20), || primary
            .replication_state()
            .unwrap()
            .is_some_and(|s| s.starts_with("streaming"))),
        "the standby never streamed"
    );
    primary.make_synchronous().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || primary
            .replication_state()
            .unwrap()
            .is_some_and(|s| s == "streaming sync")),
        "the standby never became synchronous: {:?}",
        primary.replication_state()
    );
    // Both servers in one URL; only the writable one is used.
    let url = format!(
        "postgres://tern@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        primary.port(),
        standby.port()
    );
    let a = node(&url);
    let stop = Arc::new(AtomicBool::new(false));
    let running = load(&a, 8, 40, stop.clone());
    std::thread::sleep(Duration::from_millis(1000));
    primary.stop().unwrap();
    let failed_at = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(claim(&a, "40.99.0.1", "no-primary").0, 503);
    standby.promote().unwrap();
    assert!(
        eventually(Duration::from_secs(15), || claim(
            &a,
            "40.99.0.2",
            "promoted"
        )
        .0 == 200),
        "claims never came back after the promotion"
    );
    println!(
        "claims were answered again {:?} after the primary stopped",
        failed_at.elapsed()
    );
    std::thread::sleep(Duration::from_millis(700));
    stop.store(true, Ordering::Release);
    let (acked, refused) = running.join().unwrap();
    let new_url = standby.url("postgres");
    println!(
        "failover: {} acknowledged claims, {refused} answered 503",
        acked.len()
    );
    assert!(refused > 0, "no claim saw the failover");
    assert_eq!(
        missing(&new_url, &acked),
        0,
        "acknowledged claims lost in the failover"
    );
    // The node follows the new primary's log: a claim made there directly shows up.
    let mut c = postgres::Client::connect(&new_url, postgres::NoTls).unwrap();
    c.execute(
        "SELECT tern_save_claims(ARRAY[$1::int8], ARRAY['direct'], ARRAY[1790000000::int8])",
        &[&(0x2863_0003i64)],
    )
    .unwrap();
    assert!(
        eventually(Duration::from_secs(5), || holdings(&a, "direct") == 1),
        "the node does not follow the promoted standby"
    );
}

#[test]
fn postgres_over_tls_as_libpq_does_it() {
    let _one_at_a_time = serial();
    let pg = cluster();
    let ca = tls_support::Ca::named("tern test PostgreSQL CA");
    let stranger = tls_support::Ca::named("another CA");
    let leaf = ca.issue("db", &["db.example"]);
    pg.enable_tls(&leaf.cert_pem, &leaf.key_pem).unwrap();
    let home = tempfile::tempdir().unwrap();
    let ca_file = ca.write(home.path());
    let stranger_dir = tempfile::tempdir().unwrap();
    let stranger_file = stranger.write(stranger_dir.path());
    let plain = pg.url("postgres");
    let by_ip = |params: &str| format!("{plain}?{params}");
    // The certificate's name, reached at the cluster's address without a lookup.
    let by_name = |params: &str| {
        format!(
            "postgres://tern@db.example:{}/postgres?hostaddr=127.0.0.1&{params}",
            pg.port()
        )
    };
    let encrypted = |out: &support::Failed| {
        assert!(out.status.success(), "{}", out.stderr);
        out.stdout.contains("connection TLSv1.3 ")
    };

    // require: TLS, no certificate check (the name does not match, the CA is not given).
    let ok = check_store(&by_ip("sslmode=require"), home.path());
    assert!(encrypted(&ok), "{}", ok.stdout);
    // libpq's default, prefer, takes TLS when the server offers it.
    let ok = check_store(&plain, home.path());
    assert!(encrypted(&ok), "{}", ok.stdout);
    // disable: plain, although the server offers TLS.
    let ok = check_store(&by_ip("sslmode=disable"), home.path());
    assert!(ok.status.success(), "{}", ok.stderr);
    assert!(
        ok.stdout.contains("connection not encrypted"),
        "{}",
        ok.stdout
    );

    // verify-full: the right CA and name. Both of the node's sessions (the writer's and the
    // follower's) are TLS, and so are they after the database restarted: reconnects inside
    // the sandbox use the root certificate read at start-up.
    let verified = by_name(&format!(
        "sslmode=verify-full&sslrootcert={}",
        ca_file.display()
    ));
    let ok = check_store(&verified, home.path());
    assert!(encrypted(&ok), "{}", ok.stdout);
    assert!(
        ok.stdout.contains("chain and host name checked"),
        "{}",
        ok.stdout
    );
    println!("verify-full: {}", ok.stdout.trim_end());
    let a = node_at_home(&verified, home.path());
    assert_eq!(claim(&a, "10.9.0.1", "over-tls").0, 200);
    assert!(
        eventually(Duration::from_secs(5), || tern_sessions(&plain) == (2, 0)),
        "tern's sessions: {:?}",
        tern_sessions(&plain)
    );
    pg.restart_immediate().unwrap();
    assert!(
        eventually(Duration::from_secs(15), || claim(&a, "10.9.0.2", "again").0
            == 200),
        "claims never came back after the restart"
    );
    assert!(
        eventually(Duration::from_secs(5), || tern_sessions(&plain) == (2, 0)),
        "tern's sessions after the restart: {:?}",
        tern_sessions(&plain)
    );
    assert_eq!(owners(&plain)[&0x0a09_0002], "again");
    drop(a);

    // A password role over verified TLS, SCRAM bound to the server's certificate
    // (channel_binding=require: tls-server-end-point from the TLS adapter).
    pg.add_password_role("player", "s3cret").unwrap();
    postgres::Client::connect(&plain, postgres::NoTls)
        .unwrap()
        .batch_execute("CREATE DATABASE player OWNER player")
        .unwrap();
    let data = tempfile::tempdir().unwrap();
    let player = format!(
        "postgres://player@db.example:{}/player?hostaddr=127.0.0.1&channel_binding=require&sslmode=verify-full&sslrootcert={}",
        pg.port(),
        ca_file.display()
    );
    let mut cmd = demo_command(data.path(), &[], &["--store", &player, "--check"]);
    cmd.env("HOME", home.path()).env("PGPASSWORD", "s3cret");
    let ok = support::run_to_end(&mut cmd, Duration::from_secs(20));
    assert!(encrypted(&ok), "{}", ok.stdout);

    // verify-full refuses a certificate for another name.
    let err = start_up_error(
        &by_ip(&format!(
            "sslmode=verify-full&sslrootcert={}",
            ca_file.display()
        )),
        home.path(),
    );
    assert!(
        err.contains("cannot connect") && err.contains("not valid for name \"127.0.0.1\""),
        "{err}"
    );
    println!("verify-full, wrong name: {err}");
    // verify-ca checks the chain, not the name.
    let ok = check_store(
        &by_ip(&format!(
            "sslmode=verify-ca&sslrootcert={}",
            ca_file.display()
        )),
        home.path(),
    );
    assert!(encrypted(&ok), "{}", ok.stdout);
    // verify-ca, verify-full and require with a root certificate refuse another CA's chain.
    for mode in ["verify-ca", "verify-full", "require"] {
        let err = start_up_error(
            &by_name(&format!(
                "sslmode={mode}&sslrootcert={}",
                stranger_file.display()
            )),
            home.path(),
        );
        assert!(
            err.contains("cannot connect")
                && err.contains("invalid peer certificate: UnknownIssuer"),
            "{mode}: {err}"
        );
        println!("{mode}, another CA: {err}");
    }
    // libpq's default root file counts: require checks the chain once it is there.
    let default_root = home.path().join(".postgresql/root.crt");
    std::fs::create_dir_all(default_root.parent().unwrap()).unwrap();
    std::fs::write(&default_root, stranger.pem()).unwrap();
    let err = start_up_error(&by_ip("sslmode=require"), home.path());
    assert!(err.contains("UnknownIssuer"), "{err}");
    std::fs::write(&default_root, ca.pem()).unwrap();
    let ok = check_store(&by_name("sslmode=verify-full"), home.path());
    assert!(encrypted(&ok), "{}", ok.stdout);
    std::fs::remove_file(&default_root).unwrap();

    // Settings that cannot work are one-line start-up errors.
    for (url, says) in [
        (by_ip("sslmode=allow"), "sslmode=\"allow\" is not supported"),
        (by_ip("sslmode=verify-full"), "needs the CA certificate"),
        (
            by_ip("sslmode=verify-ca&sslrootcert=/nonexistent/ca.pem"),
            "cannot read sslrootcert /nonexistent/ca.pem",
        ),
        (
            by_ip("sslrootcert=system&sslmode=require"),
            "sslrootcert=system needs sslmode=verify-full",
        ),
    ] {
        let err = start_up_error(&url, home.path());
        assert!(err.contains(says), "{url}: {err}");
    }

    // prefer goes plain when the handshake fails (libpq's retry); require does not.
    pg.set("ssl_max_protocol_version", "TLSv1.2").unwrap();
    pg.set("ssl_ciphers", "AES128-SHA").unwrap();
    let ok = check_store(&plain, home.path());
    assert!(ok.status.success(), "{}", ok.stderr);
    assert!(
        ok.stdout.contains("connection not encrypted"),
        "{}",
        ok.stdout
    );
    let err = start_up_error(&by_ip("sslmode=require"), home.path());
    assert!(err.contains("error performing TLS handshake"), "{err}");
}
