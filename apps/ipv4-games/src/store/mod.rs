//! The store boundary: where claims become durable. The game stages each worker turn's
//! claims and hands them to a [`ClaimStore`] at the end of the turn; the store decides each
//! against the state in memory (`Land`), makes the changes durable, applies them, and
//! answers every claim, now or (after a sync, a database commit) later. A claim is answered
//! 200 only once its change, or the change it repeats, is durable.
//!
//! Two stores: the journal (`journal::JournalStore`, one machine) and PostgreSQL
//! (`postgres::PgStore`, several nodes on one database).

/// A store's figures for `/metrics` and `/statusz`, one metric a line, in the one shape both
/// stores write theirs in: `KIND "name" "help" = value;`, where KIND is `counter` (a `u64`),
/// `seconds` (a counter of seconds, an `f64`) or `gauge` (an `f64`). Pushed onto `out` in
/// table order.
macro_rules! metrics_table {
    ($out:expr; $($kind:ident $name:literal $help:literal = $value:expr;)*) => {
        $( $out.push(metrics_table!(@$kind $name, $help, $value)); )*
    };
    (@counter $name:literal, $help:literal, $value:expr) => {
        tern_services::metrics::Metric::counter($name, $help, $value)
    };
    (@seconds $name:literal, $help:literal, $value:expr) => {
        tern_services::metrics::Metric::counter_f64($name, $help, $value)
    };
    (@gauge $name:literal, $help:literal, $value:expr) => {
        tern_services::metrics::Metric::gauge($name, $help, $value)
    };
}

pub mod journal;
mod latency;
pub mod postgres;
mod postgres_tls;

use std::sync::Arc;

use tern_server::{Pending, Response, Server};
use tern_services::metrics::Metric;

use crate::answer::{self, AnswerKind};
use crate::land::Land;

/// How durable a claim is before it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// Written to the journal (the kernel's page cache): survives the process being killed.
    Normal,
    /// Written and `fdatasync`ed: survives power loss.
    Full,
}

/// A claim waiting for the end of its worker's turn.
pub struct Staged {
    pub ip: u32,
    pub nick: String,
    /// Unix seconds.
    pub at: u64,
    pub answer: AnswerKind,
    pub pending: Pending,
}

/// Why a claim was not saved; each is a 503 with its own text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// This turn's write failed (disk full, an I/O error); a retry may work.
    WriteFailed,
    /// A sync failed: claims stop until an operator restarts tern.
    Stopped,
    /// The configured most addresses (or names) are held; only held addresses can change
    /// hands, between names that hold some.
    Full,
}

impl Staged {
    /// The 200 for a saved claim.
    pub fn saved(self) -> (Pending, Response) {
        let response = answer::claimed(self.answer, self.ip, &self.nick);
        (self.pending, response)
    }

    pub fn refused(self, why: Refusal) -> (Pending, Response) {
        (self.pending, refusal(why))
    }
}

pub fn refusal(why: Refusal) -> Response {
    match why {
        Refusal::WriteFailed => Response::text(503, "could not save the claim; try again\n")
            .with_header("Retry-After", "1"),
        Refusal::Stopped => Response::text(
            503,
            "claims are stopped: the journal could not be synced to disk; tern must be restarted\n",
        )
        .with_header("Retry-After", "60"),
        Refusal::Full => Response::text(
            503,
            "the game is full: no more new addresses or names can be claimed here\n",
        ),
    }
}

/// A counter's value, for the metric tables of the stores.
fn count(a: &std::sync::atomic::AtomicU64) -> u64 {
    a.load(std::sync::atomic::Ordering::Relaxed)
}

/// Nanoseconds counted in `a`, as seconds.
fn seconds(a: &std::sync::atomic::AtomicU64) -> f64 {
    count(a) as f64 / 1e9
}

/// Where claims become durable.
pub trait ClaimStore: Send + Sync + 'static {
    /// Saves one worker turn's claims (in arrival order): decides each against `land`, makes
    /// the changes durable, applies them to `land` in the order recovery will repeat, and
    /// answers every claim, through `answers` (delivered at the end of this turn) or later
    /// by itself. `claims` is left empty.
    fn commit(&self, land: &Land, claims: &mut Vec<Staged>, answers: &mut Vec<(Pending, Response)>);

    /// Starts the store's own threads (syncing, compaction) on `server`.
    fn start(self: Arc<Self>, server: &mut Server, land: Arc<Land>);

    /// The store's figures for `/metrics` and `/statusz`.
    fn metrics(&self, out: &mut Vec<Metric>);
}
