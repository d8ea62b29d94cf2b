//! The WAL write buffer (`wal_buffer`): commits gathered into few writes must still reach the
//! file before anyone can see them, in every shape of transaction SQLite writes.
//!
//! Every check reads through a second connection on SQLite's *default* VFS, which knows
//! nothing of the buffer: it learns of frames from the wal-index and reads them from the
//! file, so a frame still sitting in the buffer would show up as a wrong or missing row.

use rusqlite::{params, Connection, OpenFlags};
use tern_ipv4_games::store::{self, SyncMode};
use tern_ipv4_games::wal_buffer;

fn plain_reader(path: &std::path::Path) -> Connection {
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap()
}

fn count(conn: &Connection) -> i64 {
    conn.query_row("SELECT count(*) FROM land", [], |r| r.get(0))
        .unwrap()
}

fn claim_batch(conn: &Connection, ips: impl Iterator<Item = u32>, nick: &str) {
    let tx = conn.unchecked_transaction().unwrap();
    {
        let mut stmt = tx.prepare_cached(store::UPSERT).unwrap();
        for ip in ips {
            stmt.execute(params![ip as i64, nick, 1_800_000_000i64])
                .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// A scrambled walk over the address space, so claims land on random pages as in the game.
fn addresses(from: u32, n: u32) -> impl Iterator<Item = u32> {
    (from..from + n).map(|i| i.wrapping_mul(0x9E37_79B1))
}

#[test]
fn every_commit_is_in_the_file_when_commit_returns() {
    assert!(wal_buffer::register());
    let dir = tempfile::tempdir().unwrap();
    let path = store::db_path(dir.path());
    let writer = store::open_writer(&path, SyncMode::Normal).unwrap();
    let reader = plain_reader(&path);
    let (_, barrier_before, writes_before) = wal_buffer::flushes();
    let mut expected = 0;
    for batch in 0..300u32 {
        let n = 1 + batch % 40;
        claim_batch(&writer, addresses(batch * 64, n), "ada");
        expected += n as i64;
        assert_eq!(count(&reader), expected, "after batch {batch}");
    }
    let integrity: String = reader
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    let (commits, barrier_after, writes_after) = wal_buffer::flushes();
    // The commit-frame path wrote everything out; the barrier (the safety net) had nothing
    // left. If a new SQLite wrote frames differently this would fail before any reader
    // could be misled.
    assert_eq!(barrier_after, barrier_before);
    assert!(commits >= 300);
    // Gathering happened: SQLite asked for two writes per frame, many frames per batch.
    assert!(writes_after - writes_before > 3 * 300);
}

#[test]
fn a_transaction_larger_than_one_write_arrives_whole() {
    // The unix VFS writes at most 128 KiB - 1 per call; a batch of thousands of claims is
    // several MiB of WAL and must go out in pieces, not be cut short.
    let dir = tempfile::tempdir().unwrap();
    let path = store::db_path(dir.path());
    let writer = store::open_writer(&path, SyncMode::Normal).unwrap();
    claim_batch(&writer, addresses(0, 20_000), "bob");
    let reader = plain_reader(&path);
    assert_eq!(count(&reader), 20_000);
    let integrity: String = reader
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
}

#[test]
fn frames_spilled_mid_transaction_and_rewritten_stay_in_order() {
    // A tiny page cache makes SQLite spill dirty pages into the WAL before the commit and
    // then write some of them again (in place, out of order) when the commit comes.
    let dir = tempfile::tempdir().unwrap();
    let path = store::db_path(dir.path());
    let writer = store::open_writer(&path, SyncMode::Full).unwrap();
    writer.pragma_update(None, "cache_size", 10).unwrap();
    for round in 0..5u32 {
        claim_batch(&writer, addresses(round * 5_000, 5_000), "cy");
        claim_batch(&writer, addresses(round * 5_000, 2_500), "dee");
    }
    let reader = plain_reader(&path);
    assert_eq!(count(&reader), 25_000);
    let dee: i64 = reader
        .query_row("SELECT count(*) FROM land WHERE nick = 'dee'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(dee, 12_500);
    let integrity: String = reader
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
}

#[test]
fn checkpoints_and_wal_restarts_keep_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = store::db_path(dir.path());
    let writer = store::open_writer(&path, SyncMode::Normal).unwrap();
    let checkpointer = store::open_checkpointer(&path).unwrap();
    let reader = plain_reader(&path);
    let mut expected = 0;
    for round in 0..40u32 {
        claim_batch(&writer, addresses(round * 500, 500), "eve");
        expected += 500;
        if round % 3 == 0 {
            store::checkpoint(&checkpointer).unwrap();
        }
        if round % 10 == 9 {
            // The WAL starts over; the writer's next frames go to the top of the file.
            assert!(store::checkpoint_restart(&checkpointer).unwrap());
        }
        assert_eq!(count(&reader), expected, "after round {round}");
    }
    drop(writer);
    // Reopened through the buffer again, everything is still there.
    let again = store::open_writer(&path, SyncMode::Normal).unwrap();
    assert_eq!(count(&again), expected);
}
