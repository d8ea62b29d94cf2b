//! SQLite, off the claim path: the format of older tern versions (migrated into the journal
//! on first start) and of `tern demo export` (a database anyone can query with SQL).
//!
//! The game's own snapshot is not a SQLite database: writing one means inserting every
//! claim into B-trees (minutes at 100 M claims, against seconds for a sequential file), and
//! reading it back at start-up is as slow. An export is made on demand instead, from the
//! same files recovery reads.

use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OpenFlags};

use crate::journal::{self, snapshot};
use crate::land::{Land, RECENT_LEN};

/// The database of tern versions before the journal.
pub const FILE_NAME: &str = "ipv4-games.sqlite";

pub fn db_path(data_dir: &Path) -> PathBuf {
    data_dir.join(FILE_NAME)
}

/// Where a migrated database is kept (untouched, for the operator to remove).
pub fn migrated_path(data_dir: &Path) -> PathBuf {
    data_dir.join(format!("{FILE_NAME}.migrated"))
}

/// The schema of the old database and of exports.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS land(
         ip INTEGER PRIMARY KEY,
         nick TEXT NOT NULL,
         created INTEGER
     );
     CREATE INDEX IF NOT EXISTS land_nick ON land(nick);
     CREATE INDEX IF NOT EXISTS land_created ON land(created);";

/// Moves the claims of an older tern's database into the journal's first snapshot, once:
/// when the folder has that database and neither snapshot nor journal. The database (with
/// what its WAL held) is read through SQLite, then renamed aside. Returns the claims moved.
pub fn migrate(data_dir: &Path) -> Result<Option<u64>, String> {
    let db = db_path(data_dir);
    if !db.exists() {
        return Ok(None);
    }
    let listing =
        journal::list(data_dir).map_err(|e| format!("cannot list {}: {e}", data_dir.display()))?;
    if !listing.segments.is_empty() || !listing.snapshots.is_empty() {
        return Ok(None);
    }
    let fail = |e: rusqlite::Error| format!("cannot migrate {}: {e}", db.display());
    // Read-write, so SQLite replays the WAL an older tern may have left.
    let conn = Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_WRITE).map_err(fail)?;
    let target = journal::snapshot_path(data_dir, 1);
    let mut out = snapshot::Writer::create(&target)
        .map_err(|e| format!("cannot create {}: {e}", target.display()))?;
    let write_err = |e: std::io::Error| format!("cannot write {}: {e}", target.display());
    {
        let mut stmt = conn
            .prepare("SELECT ip, nick, created FROM land ORDER BY ip")
            .map_err(fail)?;
        let mut rows = stmt.query([]).map_err(fail)?;
        while let Some(r) = rows.next().map_err(fail)? {
            let ip = r.get::<_, i64>(0).map_err(fail)? as u32;
            let nick: String = r.get(1).map_err(fail)?;
            let created = r.get::<_, Option<i64>>(2).map_err(fail)?.unwrap_or(0);
            out.add(ip, &nick, created.clamp(0, u32::MAX as i64) as u32)
                .map_err(write_err)?;
        }
    }
    let recent = {
        let mut stmt = conn
            .prepare("SELECT ip, nick, created FROM land ORDER BY created DESC LIMIT ?1")
            .map_err(fail)?;
        let rows = stmt
            .query_map(params![RECENT_LEN as i64], |r| {
                Ok(crate::land::Claim {
                    ip: r.get::<_, i64>(0)? as u32,
                    nick: r.get(1)?,
                    created: r.get::<_, Option<i64>>(2)?.unwrap_or(0).max(0) as u64,
                })
            })
            .map_err(fail)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(fail)?
    };
    let claims = out.claims();
    out.finish(&recent).map_err(write_err)?;
    // Closing the last connection folds the WAL back and removes it.
    conn.close().map_err(|(_, e)| fail(e))?;
    std::fs::rename(&db, migrated_path(data_dir))
        .map_err(|e| format!("cannot rename {}: {e}", db.display()))?;
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(data_dir.join(format!("{FILE_NAME}{suffix}")));
    }
    Ok(Some(claims))
}

/// Writes every claim of the data folder into a new SQLite database at `to` (the schema
/// older tern versions used: `land(ip, nick, created)`). Reads the files without changing
/// them, so it may run beside a live server (a torn last write is left out). Returns the
/// claims written.
pub fn export(data_dir: &Path, to: &Path) -> Result<u64, String> {
    if to.exists() {
        return Err(format!(
            "{} exists; export writes a new database",
            to.display()
        ));
    }
    let land = Land::new();
    journal::recover_read_only(data_dir, &land)?;
    let fail = |e: rusqlite::Error| format!("cannot write {}: {e}", to.display());
    let mut conn = Connection::open(to).map_err(fail)?;
    conn.execute_batch("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;")
        .map_err(fail)?;
    conn.execute_batch(
        "CREATE TABLE land(ip INTEGER PRIMARY KEY, nick TEXT NOT NULL, created INTEGER);",
    )
    .map_err(fail)?;
    let tx = conn.transaction().map_err(fail)?;
    let mut n = 0;
    {
        let mut stmt = tx
            .prepare("INSERT INTO land(ip, nick, created) VALUES (?1, ?2, ?3)")
            .map_err(fail)?;
        let mut failed = None;
        land.sorted_scan(|ip, nick, created| {
            if failed.is_none() {
                match stmt.execute(params![ip as i64, nick, created as i64]) {
                    Ok(_) => n += 1,
                    Err(e) => failed = Some(e),
                }
            }
        });
        if let Some(e) = failed {
            return Err(fail(e));
        }
    }
    tx.commit().map_err(fail)?;
    conn.execute_batch(SCHEMA).map_err(fail)?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database the way tern wrote it before the journal (schema, and the upsert).
    fn old_database(dir: &Path, rows: &[(u32, &str, i64)]) {
        let conn = Connection::open(db_path(dir)).unwrap();
        conn.execute_batch("PRAGMA journal_mode=WAL;").unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        for &(ip, nick, created) in rows {
            conn.execute(
                "INSERT INTO land(ip, nick, created) VALUES (?1, ?2, ?3)
                 ON CONFLICT(ip) DO UPDATE SET nick = excluded.nick, created = excluded.created",
                params![ip as i64, nick, created],
            )
            .unwrap();
        }
    }

    #[test]
    fn an_old_database_is_migrated_once_and_exported_back() {
        let dir = tempfile::tempdir().unwrap();
        old_database(dir.path(), &[(3, "b", 20), (1, "a", 10), (2, "a", 30)]);
        assert_eq!(migrate(dir.path()).unwrap(), Some(3));
        assert!(!db_path(dir.path()).exists());
        assert!(migrated_path(dir.path()).exists());
        assert_eq!(migrate(dir.path()).unwrap(), None);
        let land = Land::new();
        journal::recover(dir.path(), &land).unwrap();
        assert_eq!(land.holder(2), Some(("a".into(), 30)));
        let recent: Vec<_> = land.recent().into_iter().map(|c| c.ip).collect();
        assert_eq!(recent, [2, 3, 1]);
        let out = dir.path().join("export.sqlite");
        assert_eq!(export(dir.path(), &out).unwrap(), 3);
        let conn = Connection::open(&out).unwrap();
        let rows: Vec<(i64, String, i64)> = conn
            .prepare("SELECT ip, nick, created FROM land ORDER BY ip")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            rows,
            [
                (1, "a".into(), 10),
                (2, "a".into(), 30),
                (3, "b".into(), 20)
            ]
        );
        assert!(export(dir.path(), &out).unwrap_err().contains("exists"));
    }
}
