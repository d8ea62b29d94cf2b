//! Player pages: one player's holdings, looked up on a thread of its own (a read connection),
//! never on a worker.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, Connection};
use serde::Serialize;
use tern_server::{Body, Pending, Response, StopSignal};
use tern_services::HandoffReceiver;

use crate::game::{Game, C_LOOKUPS};

pub struct Lookup {
    pub nick: String,
    pub pending: Pending,
}

#[derive(Serialize)]
struct PlayerJson<'a> {
    name: &'a str,
    total: u64,
    blocks: Vec<BlockCount>,
    recent: Vec<RecentIp>,
}

#[derive(Serialize)]
struct BlockCount {
    block: u8,
    count: u64,
}

#[derive(Serialize)]
struct RecentIp {
    ip: String,
    time: u64,
}

pub fn player_json(conn: &Connection, nick: &str) -> rusqlite::Result<Vec<u8>> {
    let mut blocks = Vec::new();
    let mut stmt = conn.prepare_cached(
        "SELECT ip >> 24, COUNT(*) FROM land WHERE nick = ?1 GROUP BY 1 ORDER BY 1",
    )?;
    let mut rows = stmt.query(params![nick])?;
    while let Some(r) = rows.next()? {
        blocks.push(BlockCount {
            block: r.get::<_, i64>(0)? as u8,
            count: r.get::<_, i64>(1)? as u64,
        });
    }
    let mut recent = Vec::new();
    let mut stmt = conn.prepare_cached(
        "SELECT ip, created FROM land WHERE nick = ?1 ORDER BY created DESC LIMIT 50",
    )?;
    let mut rows = stmt.query(params![nick])?;
    while let Some(r) = rows.next()? {
        recent.push(RecentIp {
            ip: std::net::Ipv4Addr::from(r.get::<_, i64>(0)? as u32).to_string(),
            time: r.get::<_, Option<i64>>(1)?.unwrap_or(0) as u64,
        });
    }
    let json = PlayerJson {
        name: nick,
        total: blocks.iter().map(|b| b.count).sum(),
        blocks,
        recent,
    };
    Ok(serde_json::to_vec(&json).expect("plain data serialises"))
}

pub fn run(conn: Connection, rx: HandoffReceiver<Lookup>, game: Arc<Game>, stop: StopSignal) {
    let mut batch = Vec::new();
    loop {
        batch.clear();
        match rx.recv_batch(&mut batch, 16, Duration::from_millis(100)) {
            None => break,
            Some(0) if stop.is_stopped() => break,
            Some(_) => {}
        }
        for lookup in batch.drain(..) {
            game.counters.add(game.lookup_slot(), C_LOOKUPS, 1);
            let response = match player_json(&conn, &lookup.nick) {
                Ok(json) => Response::new(200)
                    .with_header("Content-Type", "application/json")
                    .with_header("Cache-Control", "public, max-age=2")
                    .with_body(Body::Owned(json)),
                Err(e) => {
                    tracing::error!("player lookup failed: {e}");
                    Response::text(503, "lookup failed; try again\n")
                        .with_header("Retry-After", "1")
                }
            };
            lookup.pending.complete_retrying(response);
        }
    }
}
