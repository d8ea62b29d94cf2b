//! Fills in flight: which keys some request is fetching from the app now, so that concurrent
//! misses for one key wait for that one fill instead of each going to the app (coalescing,
//! nginx's `proxy_cache_lock`, Varnish's waiting list).
//!
//! The first miss for a key [`Flights::join`]s as the leader and gets a [`FillMark`]; later
//! misses get the [`Flight`] to watch. A waiter looks at its flight's state (one atomic load,
//! no lock) when the flight wakes it ([`Flight::on_end`]: the fill ended), and each time its
//! timer fires, which stays as the backstop. The mark ends the flight when it is dropped, whatever
//! ended the fill: stored, not storable, the app failing, the client leaving, a panic
//! unwinding through the relay. So no key can stay marked once its fill is gone.
//!
//! Only misses touch the table (one shard's mutex, held for a map operation); a hit never
//! does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::key::Key;

const SHARDS: usize = 16;

/// How a fill ended, as its waiters see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FlightState {
    /// Still fetching.
    Filling = 0,
    /// The answer was stored: the entry is in the store (unless evicted at once).
    Stored = 1,
    /// The answer came but is not for storing (uncacheable, too large): waiters go to the
    /// app themselves.
    NotStored = 2,
    /// The fill ended without an answer to judge (the app failed, the client left, a
    /// panic): a waiter may take the fill over.
    Abandoned = 3,
}

/// What a waiter is woken with when its flight ends.
pub type Wake = Box<dyn FnOnce() + Send>;

/// One fill, as its waiters watch it.
pub struct Flight {
    state: AtomicU8,
    /// Called once when the fill ends (the waiters' wake-ups).
    wakes: Mutex<Vec<Wake>>,
}

impl std::fmt::Debug for Flight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flight")
            .field("state", &self.state())
            .finish()
    }
}

impl Flight {
    fn new() -> Flight {
        Flight {
            state: AtomicU8::new(FlightState::Filling as u8),
            wakes: Mutex::default(),
        }
    }

    /// Calls `wake` when the fill ends, or now if it has ended.
    pub fn on_end(&self, wake: Wake) {
        {
            let mut wakes = self.wakes.lock().unwrap_or_else(|e| e.into_inner());
            // Looked at under the lock the end takes the list under, after its state is
            // set: either the end sees this wake in the list or this sees the end.
            if self.state() == FlightState::Filling {
                wakes.push(wake);
                return;
            }
        }
        wake();
    }

    fn end(&self, how: FlightState) {
        self.state.store(how as u8, Ordering::Release);
        let wakes = std::mem::take(&mut *self.wakes.lock().unwrap_or_else(|e| e.into_inner()));
        for wake in wakes {
            wake();
        }
    }

    pub fn state(&self) -> FlightState {
        match self.state.load(Ordering::Acquire) {
            0 => FlightState::Filling,
            1 => FlightState::Stored,
            2 => FlightState::NotStored,
            _ => FlightState::Abandoned,
        }
    }
}

/// The keys being filled, shared by the workers beside the store.
#[derive(Default)]
pub struct Flights {
    shards: [Mutex<HashMap<Key, Arc<Flight>>>; SHARDS],
}

/// What a miss does about a key's fill.
pub enum Join {
    /// No fill was under way: this request makes it, and ends it by dropping the mark.
    Lead(FillMark),
    /// Another request is filling the key: wait for it.
    Wait(Arc<Flight>),
}

impl Flights {
    fn shard(&self, key: &Key) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Flight>>> {
        // Keys are keyed hashes: any bits spread them.
        self.shards[(key.0 as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Leads the fill of `key` if none is under way, else waits for the one that is.
    pub fn join(self: &Arc<Self>, key: Key) -> Join {
        let mut shard = self.shard(&key);
        if let Some(flight) = shard.get(&key) {
            return Join::Wait(flight.clone());
        }
        let flight = Arc::new(Flight::new());
        shard.insert(key, flight.clone());
        Join::Lead(FillMark {
            flights: self.clone(),
            key,
            flight,
            ending: FlightState::Abandoned,
        })
    }

    /// The fill of `key` under way, if any (for a request that waits but never leads one:
    /// a HEAD).
    pub fn watch(&self, key: Key) -> Option<Arc<Flight>> {
        self.shard(&key).get(&key).cloned()
    }

    /// Fills under way.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The lead of one fill: the key stays marked as long as this lives.
pub struct FillMark {
    flights: Arc<Flights>,
    key: Key,
    flight: Arc<Flight>,
    /// What its waiters are told when it is dropped.
    ending: FlightState,
}

impl FillMark {
    /// The answer was stored (call after the store has it, so a waiter that sees this finds
    /// the entry).
    pub fn stored(&mut self) {
        self.ending = FlightState::Stored;
    }

    /// The answer is not for storing: waiters go to the app.
    pub fn not_stored(&mut self) {
        self.ending = FlightState::NotStored;
    }

    pub fn key(&self) -> Key {
        self.key
    }
}

impl std::fmt::Debug for FillMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FillMark")
            .field("key", &self.key)
            .field("ending", &self.ending)
            .finish()
    }
}

impl Drop for FillMark {
    fn drop(&mut self) {
        // Unmarked first, then told: a waiter told `Abandoned` can lead the next fill.
        {
            let mut shard = self.flights.shard(&self.key);
            if shard
                .get(&self.key)
                .is_some_and(|f| Arc::ptr_eq(f, &self.flight))
            {
                shard.remove(&self.key);
            }
        }
        self.flight.end(self.ending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lead(flights: &Arc<Flights>, key: Key) -> FillMark {
        match flights.join(key) {
            Join::Lead(m) => m,
            Join::Wait(_) => panic!("a fill was under way"),
        }
    }

    fn wait(flights: &Arc<Flights>, key: Key) -> Arc<Flight> {
        match flights.join(key) {
            Join::Wait(f) => f,
            Join::Lead(_) => panic!("no fill was under way"),
        }
    }

    #[test]
    fn the_first_miss_leads_and_the_next_ones_wait_for_it() {
        let flights = Arc::new(Flights::default());
        let mut mark = lead(&flights, Key(7));
        let waiters: Vec<_> = (0..1000).map(|_| wait(&flights, Key(7))).collect();
        assert!(waiters.iter().all(|w| w.state() == FlightState::Filling));
        // Another key is a fill of its own.
        let other = lead(&flights, Key(8));
        assert_eq!(flights.len(), 2);
        assert!(flights.watch(Key(9)).is_none());
        assert!(flights.watch(Key(8)).is_some());
        mark.stored();
        drop(mark);
        assert!(waiters.iter().all(|w| w.state() == FlightState::Stored));
        assert_eq!(flights.len(), 1);
        drop(other);
        assert!(flights.is_empty());
    }

    #[test]
    fn every_ending_unmarks_the_key_and_says_how_it_ended() {
        let flights = Arc::new(Flights::default());
        for (end, told) in [
            (Some(true), FlightState::Stored),
            (Some(false), FlightState::NotStored),
            (None, FlightState::Abandoned),
        ] {
            let mut mark = lead(&flights, Key(1));
            let waiter = wait(&flights, Key(1));
            match end {
                Some(true) => mark.stored(),
                Some(false) => mark.not_stored(),
                None => {}
            }
            drop(mark);
            assert_eq!(waiter.state(), told);
            assert!(flights.is_empty(), "{told:?} left the key marked");
        }
    }

    #[test]
    fn a_panic_in_the_filler_abandons_the_flight() {
        let flights = Arc::new(Flights::default());
        let mark = lead(&flights, Key(3));
        let waiter = wait(&flights, Key(3));
        let thread = std::thread::spawn(move || {
            let _mark = mark;
            panic!("the relay broke");
        });
        assert!(thread.join().is_err());
        assert_eq!(waiter.state(), FlightState::Abandoned);
        // A waiter takes the fill over.
        let _next = lead(&flights, Key(3));
    }

    #[test]
    fn an_old_mark_does_not_unmark_the_fill_that_took_over() {
        let flights = Arc::new(Flights::default());
        let first = lead(&flights, Key(5));
        // (Only possible if a mark outlived its key's entry: the table is the truth.)
        flights.shard(&Key(5)).remove(&Key(5));
        let second = lead(&flights, Key(5));
        drop(first);
        assert_eq!(flights.len(), 1, "the second fill is still marked");
        drop(second);
        assert!(flights.is_empty());
    }

    #[test]
    fn waiters_are_woken_once_when_the_fill_ends_or_at_once_after() {
        use std::sync::atomic::AtomicUsize;
        let flights = Arc::new(Flights::default());
        let mut mark = lead(&flights, Key(3));
        let woken = Arc::new(AtomicUsize::new(0));
        let flight = wait(&flights, Key(3));
        for _ in 0..5 {
            let woken = woken.clone();
            flight.on_end(Box::new(move || {
                woken.fetch_add(1, Ordering::Relaxed);
            }));
        }
        assert_eq!(woken.load(Ordering::Relaxed), 0, "not before the end");
        mark.stored();
        drop(mark);
        assert_eq!(woken.load(Ordering::Relaxed), 5);
        // A wake asked for after the end comes at once.
        let late = woken.clone();
        flight.on_end(Box::new(move || {
            late.fetch_add(1, Ordering::Relaxed);
        }));
        assert_eq!(woken.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn a_wake_asked_for_while_the_fill_ends_is_never_lost() {
        use std::sync::atomic::AtomicUsize;
        for round in 0..200u128 {
            let flights = Arc::new(Flights::default());
            let mark = lead(&flights, Key(round));
            let flight = wait(&flights, Key(round));
            let woken = Arc::new(AtomicUsize::new(0));
            let askers: Vec<_> = (0..4)
                .map(|_| {
                    let (flight, woken) = (flight.clone(), woken.clone());
                    std::thread::spawn(move || {
                        for _ in 0..50 {
                            let woken = woken.clone();
                            flight.on_end(Box::new(move || {
                                woken.fetch_add(1, Ordering::Relaxed);
                            }));
                        }
                    })
                })
                .collect();
            drop(mark);
            for a in askers {
                a.join().unwrap();
            }
            assert_eq!(woken.load(Ordering::Relaxed), 200, "round {round}");
        }
    }
}
