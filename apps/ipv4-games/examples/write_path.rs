//! Measures the database side of a claim alone: the upsert of random addresses in batches, as
//! the writer thread does it, for a few batch sizes and page sizes.
//!
//!     cargo run --release -p tern-ipv4-games --example write_path [CLAIMS]

use std::time::Instant;

use rusqlite::params;
use tern_ipv4_games::store::{self, SyncMode};

fn main() {
    let claims: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    println!("claims  batch  page  checkpoint  µs/claim  claims/s");
    for page in [4096, 1024] {
        for auto_checkpoint in [true, false] {
            for batch in [16, 50, 256, 1024] {
                let dir = tempdir();
                let path = store::db_path(&dir);
                let conn = {
                    // page_size must be set before the first table is created.
                    let c = rusqlite::Connection::open(&path).unwrap();
                    c.pragma_update(None, "page_size", page).unwrap();
                    // Creating the table fixes the page size (open_writer's own choice then
                    // no longer applies).
                    c.execute_batch(
                        "CREATE TABLE land(ip INTEGER PRIMARY KEY, nick TEXT NOT NULL, created INTEGER)",
                    )
                    .unwrap();
                    drop(c);
                    store::open_writer(&path, SyncMode::Normal).unwrap()
                };
                if !auto_checkpoint {
                    conn.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
                }
                let mut x: u32 = 12345;
                let t = Instant::now();
                let mut done = 0;
                while done < claims {
                    let tx = conn.unchecked_transaction().unwrap();
                    {
                        let mut stmt = tx.prepare_cached(store::UPSERT).unwrap();
                        for _ in 0..batch {
                            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                            let name = format!("p{}", x % 1000);
                            stmt.execute(params![x as i64, name, 1_800_000_000i64 + done as i64])
                                .unwrap();
                            done += 1;
                        }
                    }
                    tx.commit().unwrap();
                }
                let secs = t.elapsed().as_secs_f64();
                println!(
                    "{claims:6}  {batch:5}  {page:4}  {:10}  {:8.2}  {:8.0}",
                    if auto_checkpoint { "auto" } else { "off" },
                    secs * 1e6 / done as f64,
                    done as f64 / secs
                );
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "tern-write-path-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}
