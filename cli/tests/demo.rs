//! End-to-end tests of `tern demo` (the IPv4 Games) against the real binary: the start-up
//! line, refusing bad flags, and the durability promise — a claim answered 200 is in the
//! database even if the process is SIGKILLed right after.

mod support;

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, OptionalExtension};
use support::{Client, Tern};

/// `ipv4-games.sqlite` in the data folder (tern_ipv4_games::store::FILE_NAME).
fn db_path(data: &Path) -> std::path::PathBuf {
    data.join("ipv4-games.sqlite")
}

#[test]
fn demo_prints_its_address_and_plays() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let tern = Tern::start_demo(&data, &[]);
    let line = &tern.line;
    let want = format!("http://127.0.0.1:{}", tern.addr().port());
    assert!(line.contains(&want), "{line:?} lacks {want}");
    assert!(line.starts_with("tern: IPv4 Games"), "{line:?}");
    // The data folder is created and the game answers.
    assert!(db_path(&data).exists());
    let r = tern.get("/ip");
    assert_eq!((r.status, r.text().as_str()), (200, "127.0.0.1\n"));
    let r = tern.get_with("/claim/first", &[("Accept", "text/plain")]);
    assert_eq!(r.text(), "127.0.0.1 is now claimed by first\n");
    assert_eq!(tern.get("/").status, 200);
}

#[test]
fn bad_network_lists_are_one_line_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for (flag, value) in [
        ("--trusted-proxies", "10.0.0.0/8,banana"),
        ("--trusted-proxies", "300.1.2.3"),
        ("--rate-exempt", "10.0.0.0/33"),
    ] {
        let failed = Tern::demo_failing(tmp.path(), &[flag, value]);
        assert!(
            !failed.status.success(),
            "{flag} {value}: {:?}",
            failed.status
        );
        let err = failed.stderr.trim_end();
        assert_eq!(err.lines().count(), 1, "{flag} {value}: {err:?}");
        assert!(
            err.starts_with("tern: ") && err.contains(flag),
            "{flag} {value}: {err:?}"
        );
        assert!(failed.stdout.is_empty(), "{:?}", failed.stdout);
    }
}

/// What a run under load until SIGKILL saw.
struct KillRun {
    acked: usize,
    rows: i64,
    secs: f64,
}

/// Starts `tern demo` with `extra`, claims from 16 threads (each claim from its own /24 via
/// X-Forwarded-For, with its own name) for `load`, SIGKILLs the process mid-load, restarts it on
/// the same data and checks that every claim answered 200 is in the database under its name.
fn claims_until_sigkill(extra: &[&str], load: Duration) -> KillRun {
    const THREADS: u32 = 16;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut args = vec!["--trusted-proxies", "127.0.0.1"];
    args.extend_from_slice(extra);
    let mut tern = Tern::start_demo(&data, &args);
    let addr = tern.addr();
    let killed = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let killed = killed.clone();
            std::thread::spawn(move || {
                let mut acked: Vec<(Ipv4Addr, String)> = Vec::new();
                let mut client = Client::connect(addr);
                // Every claim from its own /24 (no rate limit applies): 65 536 per thread at most.
                for i in 0u32..65_536 {
                    if killed.load(Ordering::Acquire) {
                        break;
                    }
                    let ip = Ipv4Addr::new(20 + t as u8, (i >> 8) as u8, i as u8, 1);
                    let name = format!("t{t}-{i}");
                    let xff = ip.to_string();
                    let req = support::request_bytes(
                        "GET",
                        &format!("/claim/{name}"),
                        &[("X-Forwarded-For", &xff), ("Accept", "text/plain")],
                    );
                    if client.stream.write_all(&req).is_err() {
                        assert!(
                            killed.load(Ordering::Acquire),
                            "write failed before the kill"
                        );
                        break;
                    }
                    match client.try_read_response(false) {
                        Ok(r) => {
                            assert_eq!(r.status, 200, "{}", r.text());
                            assert_eq!(r.text(), format!("{ip} is now claimed by {name}\n"));
                            acked.push((ip, name));
                        }
                        Err(e) => {
                            assert!(killed.load(Ordering::Acquire), "before the kill: {e}");
                            break;
                        }
                    }
                }
                acked
            })
        })
        .collect();
    std::thread::sleep(load);
    killed.store(true, Ordering::Release);
    tern.signal(libc::SIGKILL);
    let secs = started.elapsed().as_secs_f64();
    let status = tern
        .wait_exit(Duration::from_secs(5))
        .expect("exits on SIGKILL");
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
    let acked: Vec<(Ipv4Addr, String)> = threads
        .into_iter()
        .flat_map(|t| t.join().expect("client thread"))
        .collect();
    assert!(acked.len() > 100, "only {} claims answered", acked.len());

    // Start again on the same data: SQLite recovers the WAL; the game serves the claims.
    let tern = Tern::start_demo(&data, &args);
    let db = Connection::open_with_flags(db_path(&data), OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open the database read-only");
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    let mut stmt = db.prepare("SELECT nick FROM land WHERE ip = ?1").unwrap();
    let mut missing = Vec::new();
    for (ip, name) in &acked {
        let got: Option<String> = stmt
            .query_row([u32::from(*ip) as i64], |r| r.get(0))
            .optional()
            .unwrap();
        if got.as_deref() != Some(name.as_str()) {
            missing.push((ip, name, got));
        }
    }
    let rows: i64 = db
        .query_row("SELECT COUNT(*) FROM land", [], |r| r.get(0))
        .unwrap();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged claims lost, e.g. {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(5)]
    );
    assert!(rows >= acked.len() as i64);
    let (_, last) = acked.last().unwrap();
    let r = tern.get(&format!("/player/{last}"));
    assert_eq!(r.status, 200);
    assert!(r.text().contains("\"total\":1"), "{}", r.text());
    KillRun {
        acked: acked.len(),
        rows,
        secs,
    }
}

#[test]
fn sigkill_under_load_loses_no_acknowledged_claim() {
    let load = Duration::from_secs(2);
    let normal = claims_until_sigkill(&[], load);
    println!(
        "--sync normal: {} claims answered 200 in {:.2} s ({:.0} claims/s), all {} found; {} rows after restart",
        normal.acked,
        normal.secs,
        normal.acked as f64 / normal.secs,
        normal.acked,
        normal.rows
    );
    let full = claims_until_sigkill(&["--sync", "full"], load);
    println!(
        "--sync full:   {} claims answered 200 in {:.2} s ({:.0} claims/s), all {} found; {} rows after restart",
        full.acked,
        full.secs,
        full.acked as f64 / full.secs,
        full.acked,
        full.rows
    );
    println!(
        "claims/s full vs normal: {:.2}x (informational: 16 clients, debug build, shared cores)",
        (full.acked as f64 / full.secs) / (normal.acked as f64 / normal.secs)
    );
}
