//! End-to-end tests of `tern demo` (the IPv4 Games) against the real binary: the start-up
//! line, refusing bad flags and damaged data, migrating an older version's database,
//! `tern demo export`, and the durability promise — a claim answered 200 is in the data
//! folder even if the process is SIGKILLed right after.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support;
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use support::{Client, Tern};

/// The first journal segment in the data folder.
fn journal_path(data: &Path) -> std::path::PathBuf {
    data.join("journal-0000000001.log")
}

/// `tern demo export --data DATA TO`: the data folder's claims as a SQLite database.
fn export(data: &Path, to: &Path) -> Connection {
    let out = std::process::Command::new(support::TERN)
        .args(["demo", "export", "--data"])
        .arg(data)
        .arg(to)
        .output()
        .expect("run tern demo export");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with("tern: exported "),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let db = Connection::open_with_flags(to, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open the export read-only");
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db
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
    assert!(journal_path(&data).exists());
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

    // Start again on the same data: the game recovers the journal and serves the claims;
    // what it holds is checked in an export.
    let tern = Tern::start_demo(&data, &args);
    let db = export(&data, &tmp.path().join("export.sqlite"));
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

#[test]
fn a_database_of_the_previous_version_is_migrated_on_first_start() {
    // Written by tern's SQLite write path on 2026-11-26 and SIGKILLed: some claims are
    // still only in the WAL.
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../apps/ipv4-games/tests/fixtures/sqlite-2026-11-26"
    );
    for f in ["ipv4-games.sqlite", "ipv4-games.sqlite-wal"] {
        std::fs::copy(Path::new(fixture).join(f), data.join(f)).unwrap();
    }
    let tern = Tern::start_demo(&data, &["--trusted-proxies", "127.0.0.1"]);
    let holder = |ip: &str| {
        let r = tern.get_with("/recent", &[]);
        let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
        v["claims"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["ip"] == ip)
            .map(|c| c["name"].as_str().unwrap().to_string())
    };
    assert_eq!(holder("198.51.100.1").as_deref(), Some("renamed"));
    assert_eq!(holder("203.0.113.9").as_deref(), Some("old-timer"));
    let r = tern.get("/player/legacy1");
    assert!(r.text().contains("\"total\":2"), "{}", r.text());
    assert!(data.join("ipv4-games.sqlite.migrated").exists());
    assert!(!data.join("ipv4-games.sqlite").exists());
    drop(tern);
    // Exported back, every row is as the old version wrote it.
    let db = export(&data, &tmp.path().join("again.sqlite"));
    let rows: Vec<(i64, String)> = db
        .prepare("SELECT ip, nick FROM land ORDER BY ip")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let ip = |s: &str| u32::from(s.parse::<Ipv4Addr>().unwrap()) as i64;
    assert_eq!(
        rows,
        [
            (ip("198.51.100.1"), "renamed".to_string()),
            (ip("198.51.100.2"), "legacy0".into()),
            (ip("198.51.100.3"), "legacy1".into()),
            (ip("198.51.100.4"), "legacy0".into()),
            (ip("198.51.100.5"), "legacy1".into()),
            (ip("203.0.113.9"), "old-timer".into()),
        ]
    );
}

#[test]
fn damaged_data_stops_start_up_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let tern = Tern::start_demo(&data, &["--trusted-proxies", "127.0.0.1"]);
    for i in 0..3 {
        let r = tern.get_with(
            &format!("/claim/n{i}"),
            &[("X-Forwarded-For", &format!("192.0.2.{i}"))],
        );
        assert_eq!(r.status, 200);
    }
    drop(tern);
    let journal = journal_path(&data);
    let whole = std::fs::read(&journal).unwrap();
    // A flipped byte in the first of three frames: whole frames follow, so nothing may be
    // cut silently.
    let mut bad = whole.clone();
    bad[16 + 12 + 2] ^= 0x20;
    std::fs::write(&journal, &bad).unwrap();
    let failed = Tern::demo_failing(&data, &[]);
    assert!(!failed.status.success());
    let err = failed.stderr.trim_end();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("tern: ")
            && err.contains("journal-0000000001.log is damaged at byte 16 (bad checksum)")
            && err.contains("truncate it to 16 bytes"),
        "{err}"
    );
    // A future format version.
    let mut future = whole.clone();
    future[8] = 7;
    std::fs::write(&journal, &future).unwrap();
    let err = Tern::demo_failing(&data, &[]).stderr;
    assert!(err.contains("newer tern (format 7"), "{err}");
    // A torn last frame is cut, logged, and the game starts with the whole ones.
    let mut torn = whole.clone();
    torn.truncate(whole.len() - 3);
    std::fs::write(&journal, &torn).unwrap();
    let tern = Tern::start_demo(&data, &["--trusted-proxies", "127.0.0.1"]);
    let r = tern.get_with("/recent", &[]);
    let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
    assert_eq!(v["claims"].as_array().unwrap().len(), 2, "{v}");
}

#[test]
fn full_disk_answers_503_and_keeps_serving_reads() {
    // The journal may not grow past 64 KiB (RLIMIT_FSIZE; SIGXFSZ ignored, so writes past it
    // fail with EFBIG the way a full disk fails them with ENOSPC).
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let tern = Tern::start_demo_limited(&data, &["--trusted-proxies", "127.0.0.1"], 64 << 10);
    let mut saved = 0;
    let mut refused = 0;
    for i in 0..4000u32 {
        let r = tern.get_with(
            &format!("/claim/{}", "n".repeat(40)),
            &[(
                "X-Forwarded-For",
                &Ipv4Addr::from(0x0a00_0000 + i * 256).to_string(),
            )],
        );
        match r.status {
            200 => {
                assert_eq!(refused, 0, "a claim was saved after the disk filled up");
                saved += 1;
            }
            503 => {
                assert_eq!(r.header("retry-after"), Some("1"));
                assert_eq!(r.text(), "could not save the claim; try again\n");
                refused += 1;
                if refused == 5 {
                    break;
                }
            }
            s => panic!("status {s}: {}", r.text()),
        }
    }
    assert!(
        saved > 100 && refused == 5,
        "{saved} saved, {refused} refused"
    );
    // Reads go on.
    assert_eq!(tern.get("/recent").status, 200);
    assert_eq!(tern.get("/score").status, 200);
    let statusz = tern.get("/statusz").text();
    assert!(statusz.contains("journal_write_errors: 5"), "{statusz}");
    assert!(
        statusz.contains(&format!("claims_saved: {saved}")),
        "{statusz}"
    );
    drop(tern);
    // Every answered claim is there, and nothing else.
    let db = export(&data, &tmp.path().join("export.sqlite"));
    let rows: i64 = db
        .query_row("SELECT COUNT(*) FROM land", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, saved as i64);
}

#[test]
fn a_second_game_on_the_same_data_folder_is_refused() {
    // Two processes appending to one journal would overwrite each other's frames.
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let first = Tern::start_demo(&data, &[]);
    let second = Tern::demo_failing(&data, &[]);
    assert!(!second.status.success());
    let err = second.stderr.trim_end();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("is in use by another tern"), "{err}");
    assert_eq!(first.get("/ip").status, 200);
    drop(first);
    // Once it is gone, the folder is free again.
    let again = Tern::start_demo(&data, &[]);
    assert_eq!(again.get("/ip").status, 200);
}
