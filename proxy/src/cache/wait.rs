//! A miss held while another request fills its key, and a stale entry standing in for a
//! failed app.

use std::sync::Arc;

use super::answer::{answer, Validators};
use super::counts::{Count, Counts};
use super::fill::Fill;
use tern_cache::{Entry, Flight, FlightState, Join, Rules};
use tern_server::{CacheOutcome, Fallback, Hold, HoldStep, HoldWaker, Response};

/// How often a miss waiting for another request's fill looks again if no wake-up came (the
/// fill's end wakes it at once; this is the backstop). The worker's timer wheel rounds it up
/// to its tick (100 ms), as nginx's `proxy_cache_lock` looks every 500 ms.
pub const WAIT_POLL_MS: u64 = 10;

/// A miss waiting for another request's fill of its key (the relay asks it, see
/// [`Hold`]): answered from the entry when the fill stored it, sent to the app when the
/// fill ended without storing or the lock time passed; when the fill was abandoned (the app
/// failed, its client left), the first waiter to see it leads the next fill.
pub(super) struct Waiter {
    /// Its own fill, should it lead one (its mark then set).
    pub(super) fill: Fill,
    pub(super) flight: Arc<Flight>,
    /// Rung when the flight ends, so the relay asks at once, not at its next timer.
    pub(super) waker: HoldWaker,
    /// When it stops waiting (the worker's clock, ms).
    pub(super) give_up_ms: u64,
    pub(super) head_only: bool,
    pub(super) if_none_match: Option<Vec<u8>>,
    pub(super) if_modified_since: Option<Vec<u8>>,
    pub(super) status_field: bool,
}

impl Waiter {
    /// Has the flight wake this waiter's relay when it ends.
    pub(super) fn watch(&self) {
        let waker = self.waker.clone();
        self.flight.on_end(Box::new(move || waker.wake()));
    }

    fn go(&self, counted: Count) -> HoldStep {
        self.fill.counts.bump(self.fill.worker, counted);
        HoldStep::Go(None)
    }
}

impl Hold for Waiter {
    fn poll(&mut self, unix_secs: u64, now_ms: u64) -> HoldStep {
        let worker = self.fill.worker;
        match self.flight.state() {
            FlightState::Filling if now_ms >= self.give_up_ms => self.go(Count::LockTimeout),
            FlightState::Filling => HoldStep::Wait((now_ms + WAIT_POLL_MS).min(self.give_up_ms)),
            FlightState::Stored => {
                let Some(entry) = self.fill.store.get(&self.fill.key) else {
                    return self.go(Count::Miss);
                };
                if !entry.freshness.is_fresh(unix_secs) {
                    return self.go(Count::Miss);
                }
                self.fill.counts.bump(worker, Count::Coalesced);
                let asked = Validators::kept(
                    self.if_none_match.as_deref(),
                    self.if_modified_since.as_deref(),
                );
                let status = self
                    .status_field
                    .then_some(&b"tern; hit; detail=coalesced"[..]);
                let counts = &self.fill.counts;
                HoldStep::Answer(answer(
                    &asked,
                    &entry,
                    unix_secs,
                    status,
                    CacheOutcome::Hit,
                    || counts.bump(worker, Count::NotModified),
                ))
            }
            FlightState::NotStored => self.go(Count::Miss),
            FlightState::Abandoned if now_ms >= self.give_up_ms => self.go(Count::LockTimeout),
            FlightState::Abandoned if self.head_only => self.go(Count::Miss),
            FlightState::Abandoned => match self.fill.store.flights().join(self.fill.key) {
                Join::Lead(mark) => {
                    self.fill.counts.bump(worker, Count::Miss);
                    let mut fill = self.fill.clone_empty();
                    fill.mark = Some(mark);
                    HoldStep::Go(Some(Box::new(fill)))
                }
                Join::Wait(flight) => {
                    self.flight = flight;
                    self.watch();
                    HoldStep::Wait((now_ms + WAIT_POLL_MS).min(self.give_up_ms))
                }
            },
        }
    }
}

/// A stale entry served in place of a failed app's answer (RFC 5861 `stale-if-error`).
pub(super) struct StaleOnError {
    pub(super) entry: Arc<Entry>,
    pub(super) rules: Arc<Rules>,
    pub(super) counts: Arc<Counts>,
    pub(super) worker: usize,
    pub(super) if_none_match: Option<Vec<u8>>,
    pub(super) if_modified_since: Option<Vec<u8>>,
    pub(super) status_field: bool,
}

impl Fallback for StaleOnError {
    fn answer(&mut self, unix_secs: u64) -> Option<Response> {
        // The app may have taken long to fail: the window is judged now.
        if !self.entry.freshness.serves_on_error(&self.rules, unix_secs) {
            return None;
        }
        let (counts, worker) = (&self.counts, self.worker);
        counts.bump(worker, Count::StaleError);
        let asked = Validators::kept(
            self.if_none_match.as_deref(),
            self.if_modified_since.as_deref(),
        );
        let status = self
            .status_field
            .then_some(&b"tern; fwd=stale; detail=stale-if-error"[..]);
        Some(answer(
            &asked,
            &self.entry,
            unix_secs,
            status,
            CacheOutcome::Stale,
            || counts.bump(worker, Count::NotModified),
        ))
    }
}
