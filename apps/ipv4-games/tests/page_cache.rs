//! The page cache wrapper (src/page_cache.rs) under the writer's own workload and worse: its
//! own test binary, so that it is installed before anything in the process opens SQLite.

use std::collections::BTreeMap;

use rusqlite::params;
use tern_ipv4_games::page_cache;
use tern_ipv4_games::store::{self, SyncMode};

/// A small deterministic generator (no dependency needed for a test's random numbers).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) as u32
    }
}

#[test]
fn random_claims_with_rollbacks_and_a_tiny_cache_match_a_model() {
    assert!(page_cache::install(), "installed before SQLite's first use");
    let dir = tempfile::tempdir().unwrap();
    let conn = store::open_writer(&store::db_path(dir.path()), SyncMode::Normal).unwrap();
    // 64 pages: the cache evicts all the time, so pages leave and re-enter it.
    conn.pragma_update(None, "cache_size", 64).unwrap();
    let mut model: BTreeMap<u32, (String, u64)> = BTreeMap::new();
    let mut rng = Lcg(7);
    let mut at = 1_000_000u64;
    for batch in 0..400 {
        let tx = conn.unchecked_transaction().unwrap();
        let mut staged = model.clone();
        {
            let mut upsert = tx.prepare_cached(store::UPSERT).unwrap();
            for _ in 0..50 {
                at += 1;
                let ip = rng.next();
                let nick = format!("n{}", rng.next() % 300);
                upsert.execute(params![ip as i64, nick, at as i64]).unwrap();
                let row = staged.entry(ip).or_insert_with(|| (nick.clone(), at));
                if row.0 != nick || row.1 + 3600 < at {
                    *row = (nick, at);
                }
            }
        }
        // Every fifth batch grows the database and is then rolled back, so page numbers
        // past the end come and go.
        if batch % 5 == 4 {
            tx.rollback().unwrap();
        } else {
            tx.commit().unwrap();
            model = staged;
        }
    }
    // Process-wide counts; the other test commits only a handful of times.
    let (skipped, _) = page_cache::truncations();
    assert!(
        skipped > 100,
        "commits after splits skip the walk: {skipped}"
    );

    let ok: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let mut stmt = conn
        .prepare("SELECT ip, nick, created FROM land ORDER BY ip")
        .unwrap();
    let rows: Vec<(u32, (String, u64))> = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)? as u32,
                (r.get(1)?, r.get::<_, i64>(2)? as u64),
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(rows.len(), model.len());
    assert!(rows.into_iter().eq(model));
}

/// Bytes the connection's page cache holds (SQLITE_DBSTATUS_CACHE_USED).
fn cache_used(conn: &rusqlite::Connection) -> i32 {
    let (mut cur, mut high) = (0, 0);
    // SAFETY: the handle is valid while `conn` lives and is used from this thread only;
    // sqlite3_db_status writes the two integers and nothing else.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_db_status(
            conn.handle(),
            rusqlite::ffi::SQLITE_DBSTATUS_CACHE_USED,
            &mut cur,
            &mut high,
            0,
        )
    };
    assert_eq!(rc, rusqlite::ffi::SQLITE_OK);
    cur
}

#[test]
fn a_truncation_that_drops_pages_is_forwarded() {
    assert!(page_cache::install());
    let dir = tempfile::tempdir().unwrap();
    let conn = rusqlite::Connection::open(dir.path().join("shrink.sqlite")).unwrap();
    // auto_vacuum shrinks the file at commit, leaving cached pages past its new end: the
    // commit's truncation must reach the real cache and free them.
    conn.execute_batch(
        "PRAGMA auto_vacuum = FULL; PRAGMA cache_size = -16384;
         CREATE TABLE t(x INTEGER PRIMARY KEY, pad BLOB);",
    )
    .unwrap();
    conn.execute_batch(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4000)
         INSERT INTO t SELECT i, zeroblob(1000) FROM n;",
    )
    .unwrap();
    let full = cache_used(&conn);
    conn.execute_batch("DELETE FROM t WHERE x > 10").unwrap();
    let shrunk = cache_used(&conn);
    assert!(
        shrunk < full / 4,
        "cache holds {shrunk} bytes after the file shrank (was {full})"
    );
    let n: i64 = conn
        .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 10);
}
