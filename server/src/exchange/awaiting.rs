//! The replies a connection's handlers deferred, by exchange, until they come back through the
//! worker's inbox: one table whatever the protocol (HTTP/1.1 holds at most one entry, since it
//! answers in order; HTTP/2 one per stream).

use super::context::Facts;
use crate::access_log::{LogEntry, SavedEntry};
use crate::handler::ExchangeId;

/// A deferred exchange: what its answer needs, and the request's part of its access-log line
/// (copied, since the head it borrowed is gone by the time the reply comes).
pub(crate) struct Waiting {
    pub facts: Facts,
    pub log: Option<Box<SavedEntry>>,
}

#[derive(Default)]
pub(crate) struct Awaiting {
    waiting: Vec<Waiting>,
}

impl Awaiting {
    /// The exchange's reply comes later.
    pub fn park(&mut self, facts: Facts, entry: Option<&LogEntry<'_>>) {
        let log = entry.and_then(SavedEntry::save);
        self.waiting.push(Waiting { facts, log });
    }

    /// The exchange `id` if it is waiting (a reply for one that is not is stale: the request
    /// was answered already, or its stream reset).
    pub fn take(&mut self, id: ExchangeId) -> Option<Waiting> {
        let i = self.waiting.iter().position(|w| w.facts.id == id)?;
        Some(self.waiting.swap_remove(i))
    }

    /// Exchange `id` will not be answered (its stream was reset).
    pub fn forget(&mut self, id: ExchangeId) {
        self.waiting.retain(|w| w.facts.id != id);
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// No reply still waiting will be answered (the connection failed).
    pub fn clear(&mut self) {
        self.waiting.clear();
    }

    /// Gives back the table's memory (an idle connection trimmed).
    pub fn release(&mut self) {
        self.waiting = Vec::new();
    }

    /// The last answer on this connection is among these (shutdown began).
    pub fn end_keep_alive(&mut self) {
        for w in &mut self.waiting {
            w.facts.keep_alive = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(id: u64) -> Facts {
        Facts::own_answer(ExchangeId(id), 0)
    }

    #[test]
    fn replies_are_taken_by_exchange_in_any_order_and_only_once() {
        let mut a = Awaiting::default();
        for id in [1, 3, 5] {
            a.park(facts(id), None);
        }
        assert_eq!(
            a.take(ExchangeId(5)).map(|w| w.facts.id),
            Some(ExchangeId(5))
        );
        assert!(a.take(ExchangeId(5)).is_none(), "a second reply is stale");
        a.forget(ExchangeId(1));
        assert!(
            a.take(ExchangeId(1)).is_none(),
            "a reset stream's reply is stale"
        );
        assert_eq!(
            a.take(ExchangeId(3)).map(|w| w.facts.id),
            Some(ExchangeId(3))
        );
        assert!(a.is_empty());
    }
}
