//! The SQLite database: schema, connections, the claim upsert and the read queries.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OpenFlags};

use crate::{page_cache, wal_buffer};

pub const FILE_NAME: &str = "ipv4-games.sqlite";

/// How hard a commit presses data towards the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// WAL with synchronous=NORMAL: a commit survives the process being killed (it is in the
    /// kernel's page cache); the last commits may be lost on power failure.
    Normal,
    /// synchronous=FULL: every commit is fsynced before it is acknowledged.
    Full,
}

pub fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// Opens (creating if needed) the writer's connection and the schema.
pub fn open_writer(path: &Path, sync: SyncMode) -> rusqlite::Result<Connection> {
    let conn = open_with(path, OpenFlags::default())?;
    // The checkpointer (or another process: a backup, an operator's sqlite3 shell) may hold
    // the lock briefly; waiting beats failing a whole batch. SQLite's own busy timeout sleeps
    // 1, 2, 5, 10, 15, 20, 25 … ms between tries, which turned an 8 ms checkpoint into a 40 ms
    // stall of every claim in flight; this handler retries every 100 µs, for up to 5 s.
    conn.busy_handler(Some(retry_every_100us::<50_000>))?;
    // Claims land at random addresses, so every claim dirties its own leaf pages, and each
    // dirty page is written whole to the WAL and again by the checkpoint. 1 KiB pages write a
    // quarter of the bytes of the default 4 KiB for the same claims (takes effect for a new
    // database only).
    conn.pragma_update(None, "page_size", 1024)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    let sync = match sync {
        SyncMode::Normal => "NORMAL",
        SyncMode::Full => "FULL",
    };
    conn.pragma_update(None, "synchronous", sync)?;
    conn.pragma_update(None, "cache_size", -65536)?; // 64 MiB
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // Checkpoints (copying the WAL back into the database, with fsyncs) run on their own
    // thread (`checkpoint`), not inside the writer's commits: inline they cost the writer
    // about twice its own work per claim (examples/write_path.rs).
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    // Once a checkpoint lets the WAL restart, give disk space back down to this size.
    // Above the checkpointer's restart threshold (64 MiB), so the WAL is not truncated and
    // re-grown on every restart (each costs filesystem work in the writer's next commit).
    conn.pragma_update(None, "journal_size_limit", 256 * 1024 * 1024)?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS land(
             ip INTEGER PRIMARY KEY,
             nick TEXT NOT NULL,
             created INTEGER
         );
         CREATE INDEX IF NOT EXISTS land_nick ON land(nick);
         CREATE INDEX IF NOT EXISTS land_created ON land(created);",
    )?;
    Ok(conn)
}

/// Every connection of the game goes through the page-cache wrapper and the WAL write
/// buffer (`wal_buffer`: one write per commit instead of two per page); if either cannot be
/// installed, SQLite's defaults serve unchanged.
fn open_with(path: &Path, flags: OpenFlags) -> rusqlite::Result<Connection> {
    page_cache::install();
    if wal_buffer::register() {
        Connection::open_with_flags_and_vfs(path, flags, wal_buffer::VFS_NAME)
    } else {
        Connection::open_with_flags(path, flags)
    }
}

/// A busy handler that retries every 100 µs, `TRIES` times.
fn retry_every_100us<const TRIES: i32>(attempt: i32) -> bool {
    std::thread::sleep(std::time::Duration::from_micros(100));
    attempt < TRIES
}

/// A read-only connection for rebuilding views; WAL lets it read while the writer commits.
pub fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = open_with(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "cache_size", -32768)?;
    Ok(conn)
}

/// A connection that only checkpoints. Opened after the writer has set up the database.
pub fn open_checkpointer(path: &Path) -> rusqlite::Result<Connection> {
    let conn = open_with(path, OpenFlags::default())?;
    // Short, and polled finely: a RESTART checkpoint holds off the writer (which waits for
    // it between batches) while it waits for readers.
    conn.busy_handler(Some(retry_every_100us::<50>))?;
    conn.pragma_update(None, "wal_autocheckpoint", 0)?;
    Ok(conn)
}

/// Copies committed WAL frames back into the database without blocking the writer (PASSIVE).
/// Returns (frames in the WAL, frames checkpointed).
pub fn checkpoint(conn: &Connection) -> rusqlite::Result<(i64, i64)> {
    checkpoint_mode(conn, "PASSIVE")
}

/// Finishes a checkpoint so that the writer's next transaction starts the WAL over from the
/// top (RESTART): copies what passive runs have not yet copied and waits (the connection's
/// busy handler) for the writer and for readers of the old frames. Under continuous commits
/// a passive checkpoint is never complete at the moment a transaction begins, so without
/// this the WAL would only grow (see `lib::checkpointer` for how the writer makes room).
/// RESTART rather than TRUNCATE: the file keeps its blocks, so the next frames overwrite
/// them instead of growing it again. Returns whether the checkpoint completed (false: the
/// writer or a reader was in the way; try again later).
pub fn checkpoint_restart(conn: &Connection) -> rusqlite::Result<bool> {
    conn.query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| {
        Ok(r.get::<_, i64>(0)? == 0)
    })
}

fn checkpoint_mode(conn: &Connection, mode: &str) -> rusqlite::Result<(i64, i64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get(1)?, r.get(2)?))
    })
}

/// The upsert: a new name replaces the old one; the same name only refreshes `created` when
/// the old claim is over an hour old (so re-claiming cannot be used to stay on top of
/// "recent" or to make us write).
pub const UPSERT: &str = "INSERT INTO land(ip, nick, created) VALUES (?1, ?2, ?3)
     ON CONFLICT(ip) DO UPDATE SET nick = excluded.nick, created = excluded.created
     WHERE land.nick <> excluded.nick OR land.created < excluded.created - 3600";

/// One claim as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub ip: u32,
    pub nick: String,
    pub created: u64,
}

/// The `n` latest claims, newest first.
pub fn latest(conn: &Connection, n: usize) -> rusqlite::Result<Vec<Claim>> {
    let mut stmt =
        conn.prepare_cached("SELECT ip, nick, created FROM land ORDER BY created DESC LIMIT ?1")?;
    let rows = stmt.query_map(params![n as i64], |r| {
        Ok(Claim {
            ip: r.get::<_, i64>(0)? as u32,
            nick: r.get(1)?,
            created: r.get::<_, i64>(2)? as u64,
        })
    })?;
    rows.collect()
}

/// Looks up one claim (tests and tools).
pub fn claim_of(conn: &Connection, ip: u32) -> rusqlite::Result<Option<Claim>> {
    let mut stmt = conn.prepare_cached("SELECT nick, created FROM land WHERE ip = ?1")?;
    let mut rows = stmt.query(params![ip as i64])?;
    match rows.next()? {
        Some(r) => Ok(Some(Claim {
            ip,
            nick: r.get(0)?,
            created: r.get::<_, i64>(1)? as u64,
        })),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upsert(conn: &Connection, ip: u32, nick: &str, at: u64) -> usize {
        conn.execute(UPSERT, params![ip as i64, nick, at as i64])
            .unwrap()
    }

    #[test]
    fn upsert_rules() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer(&db_path(dir.path()), SyncMode::Normal).unwrap();
        assert_eq!(upsert(&conn, 1, "alice", 1000), 1);
        // Same name within the hour: nothing changes.
        assert_eq!(upsert(&conn, 1, "alice", 2000), 0);
        assert_eq!(claim_of(&conn, 1).unwrap().unwrap().created, 1000);
        // Same name after more than an hour: refreshed.
        assert_eq!(upsert(&conn, 1, "alice", 4601), 1);
        assert_eq!(claim_of(&conn, 1).unwrap().unwrap().created, 4601);
        // Exactly an hour is not "over an hour".
        assert_eq!(upsert(&conn, 1, "alice", 8201), 0);
        // A new name replaces at once.
        assert_eq!(upsert(&conn, 1, "bob", 4602), 1);
        let c = claim_of(&conn, 1).unwrap().unwrap();
        assert_eq!((c.nick.as_str(), c.created), ("bob", 4602));
        upsert(&conn, 2, "carol", 5000);
        let latest = latest(&conn, 50).unwrap();
        assert_eq!(latest[0].nick, "carol");
        assert_eq!(latest[1].nick, "bob");
    }

    #[test]
    fn checkpoints_run_beside_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        let w = open_writer(&path, SyncMode::Normal).unwrap();
        let c = open_checkpointer(&path).unwrap();
        for ip in 0..100 {
            upsert(&w, ip, "erin", 1);
        }
        let (frames, done) = checkpoint(&c).unwrap();
        assert!(frames > 0);
        assert_eq!(frames, done);
        // The writer keeps going after a checkpoint, and the WAL restarts from the top.
        upsert(&w, 1000, "erin", 1);
        let (frames_after, _) = checkpoint(&c).unwrap();
        assert!(frames_after < frames, "{frames_after} >= {frames}");
    }

    #[test]
    fn reader_sees_commits_while_writer_is_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        let w = open_writer(&path, SyncMode::Full).unwrap();
        upsert(&w, 7, "dave", 1);
        let r = open_reader(&path).unwrap();
        assert_eq!(claim_of(&r, 7).unwrap().unwrap().nick, "dave");
        let mode: String = w
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }
}
