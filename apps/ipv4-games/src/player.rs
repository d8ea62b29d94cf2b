//! Player pages: one player's holdings, looked up on a thread of its own, never on a worker.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tern_server::{Body, Pending, Response, StopSignal};
use tern_services::HandoffReceiver;

use crate::game::{Game, C_LOOKUPS};
use crate::land::Land;

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

/// The player page's JSON; a name that holds nothing gets an empty page.
pub fn player_json(land: &Land, nick: &str) -> Vec<u8> {
    let player = land.player(nick);
    let (blocks, recent) = match &player {
        Some(p) => (
            p.blocks
                .iter()
                .map(|&(block, count)| BlockCount { block, count })
                .collect(),
            p.recent
                .iter()
                .map(|&(ip, time)| RecentIp {
                    ip: std::net::Ipv4Addr::from(ip).to_string(),
                    time,
                })
                .collect(),
        ),
        None => (Vec::new(), Vec::new()),
    };
    let json = PlayerJson {
        name: nick,
        total: player.as_ref().map_or(0, |p| p.total),
        blocks,
        recent,
    };
    serde_json::to_vec(&json).expect("plain data serialises")
}

/// The lookup thread: a player page may need a pass over every block (when the player's
/// latest claims were taken by others), which never runs on a worker.
pub fn run(rx: HandoffReceiver<Lookup>, game: Arc<Game>, stop: StopSignal) {
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
            let response = Response::new(200)
                .with_header("Content-Type", "application/json")
                .with_header("Cache-Control", "public, max-age=2")
                .with_body(Body::Owned(player_json(&game.land, &lookup.nick)));
            lookup.pending.complete_retrying(response);
        }
    }
}
