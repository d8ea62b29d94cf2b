//! The one thread that writes the database: it drains the claim queue in batches, commits each
//! batch in one transaction, and only then answers every claim of the batch (group commit).
//! Throughput comes from batching; durability from answering after the commit.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rusqlite::{params, Connection};
use tern_server::{Pending, Response, StopSignal};
use tern_services::HandoffReceiver;

use crate::answer::{self, AnswerKind};
use crate::game::{Game, C_BATCHES, C_COMMITTED, C_COMMIT_ERRORS, C_UNCHANGED};
use crate::store::{self, Claim};

/// A claim on its way to the writer, carrying the reply it completes.
pub struct ClaimRequest {
    pub ip: u32,
    pub nick: String,
    pub at: u64,
    pub answer: AnswerKind,
    pub pending: Pending,
}

/// The live feed is re-rendered at most this often under load (coalescing), and right away
/// once the queue goes quiet.
const RECENT_EVERY: Duration = Duration::from_millis(25);
pub const RECENT_LEN: usize = 50;

pub fn run(
    conn: Connection,
    rx: HandoffReceiver<ClaimRequest>,
    game: Arc<Game>,
    batch_max: usize,
    stop: StopSignal,
) {
    let slot = game.writer_slot();
    let mut recent: VecDeque<Claim> = match store::latest(&conn, RECENT_LEN) {
        Ok(v) => v.into(),
        Err(e) => {
            tracing::error!("reading the latest claims failed: {e}");
            VecDeque::new()
        }
    };
    game.publish_recent(&recent);
    let mut dirty = false;
    let mut last_render = Instant::now();
    let mut batch = Vec::with_capacity(batch_max);
    let mut changed = Vec::with_capacity(batch_max);
    loop {
        let wait = if dirty {
            RECENT_EVERY
        } else {
            Duration::from_millis(100)
        };
        batch.clear();
        let got = match rx.recv_batch(&mut batch, batch_max, wait) {
            Some(n) => n,
            None => break,
        };
        if got > 0 && got < batch_max {
            // Let the workers finish their turn before committing. Sharing a core, the first
            // claim's wake-up may have preempted a worker mid-turn; yielding lets it queue the
            // rest of the turn's claims into this batch. With a core of its own this returns
            // at once.
            std::thread::yield_now();
            rx.drain_into(&mut batch, batch_max);
        }
        if got == 0 {
            if dirty {
                game.publish_recent(&recent);
                dirty = false;
                last_render = Instant::now();
            }
            if stop.is_stopped() {
                break;
            }
            continue;
        }
        hold_while_restarting(&game);
        changed.clear();
        match commit(&conn, &batch, &mut changed) {
            Ok(()) => {
                let n = batch.len() as u64;
                let unchanged = n - changed.iter().filter(|&&c| c).count() as u64;
                game.counters.add(slot, C_COMMITTED, n);
                game.counters.add(slot, C_UNCHANGED, unchanged);
                game.counters.add(slot, C_BATCHES, 1);
                game.note_batch(batch.len());
                let answers = batch.drain(..).zip(&changed).map(|(claim, &did_change)| {
                    let response = answer::claimed(claim.answer, claim.ip, &claim.nick);
                    if did_change {
                        recent.push_front(Claim {
                            ip: claim.ip,
                            nick: claim.nick,
                            created: claim.at,
                        });
                        dirty = true;
                    }
                    (claim.pending, response)
                });
                tern_server::complete_all(answers);
                recent.truncate(RECENT_LEN);
            }
            Err(e) => {
                game.counters.add(slot, C_COMMIT_ERRORS, 1);
                tracing::error!(claims = batch.len(), "commit failed: {e}");
                tern_server::complete_all(batch.drain(..).map(|claim| {
                    let r = Response::text(503, "could not save the claim; try again\n")
                        .with_header("Retry-After", "1");
                    (claim.pending, r)
                }));
            }
        }
        if dirty && last_render.elapsed() >= RECENT_EVERY {
            game.publish_recent(&recent);
            dirty = false;
            last_render = Instant::now();
        }
    }
    if dirty {
        game.publish_recent(&recent);
    }
    tracing::info!("claim writer stopped");
}

/// Waits (at most 50 ms) while the checkpointer restarts the WAL, which needs a moment with
/// no write transaction.
fn hold_while_restarting(game: &Game) {
    let held = || game.hold_writer.load(std::sync::atomic::Ordering::Acquire);
    if !held() {
        return; // the usual case: no clock read per batch
    }
    let until = Instant::now() + Duration::from_millis(50);
    while held() && Instant::now() < until {
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Writes one batch in one transaction; `changed[i]` says whether claim `i` changed a row.
fn commit(
    conn: &Connection,
    batch: &[ClaimRequest],
    changed: &mut Vec<bool>,
) -> rusqlite::Result<()> {
    let tx = conn.unchecked_transaction()?;
    {
        let mut stmt = tx.prepare_cached(store::UPSERT)?;
        for c in batch {
            let n = stmt.execute(params![c.ip as i64, c.nick, c.at as i64])?;
            changed.push(n > 0);
        }
    }
    tx.commit()
}
