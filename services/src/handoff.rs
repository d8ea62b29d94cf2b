//! A bounded hand-off from workers to one background thread. Offering never blocks: a full
//! queue hands the item back at once, so the handler can answer 503 instead of holding the
//! connection (and the worker) waiting for room.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError};

/// Creates a queue holding at most `capacity` items.
pub fn handoff<T>(capacity: usize) -> (HandoffSender<T>, HandoffReceiver<T>) {
    let (tx, rx) = crossbeam_channel::bounded(capacity);
    let full = Arc::new(AtomicU64::new(0));
    (
        HandoffSender {
            tx,
            full: full.clone(),
        },
        HandoffReceiver { rx },
    )
}

/// The workers' side; cheap to clone.
pub struct HandoffSender<T> {
    tx: Sender<T>,
    /// Offers refused because the queue was full, over the queue's life.
    full: Arc<AtomicU64>,
}

impl<T> Clone for HandoffSender<T> {
    fn clone(&self) -> Self {
        HandoffSender {
            tx: self.tx.clone(),
            full: self.full.clone(),
        }
    }
}

/// Why an offer was refused; the item comes back.
#[derive(Debug)]
pub enum Refused<T> {
    Full(T),
    /// The receiving thread has exited (the server is stopping).
    Closed(T),
}

impl<T> HandoffSender<T> {
    pub fn offer(&self, item: T) -> Result<(), Refused<T>> {
        match self.tx.try_send(item) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(item)) => {
                // Contended only while the queue is full, i.e. when we are shedding anyway.
                self.full.fetch_add(1, Ordering::Relaxed);
                Err(Refused::Full(item))
            }
            Err(TrySendError::Disconnected(item)) => Err(Refused::Closed(item)),
        }
    }

    pub fn len(&self) -> usize {
        self.tx.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tx.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.tx.capacity().unwrap_or(usize::MAX)
    }

    pub fn full_count(&self) -> u64 {
        self.full.load(Ordering::Relaxed)
    }
}

/// The background thread's side.
pub struct HandoffReceiver<T> {
    rx: Receiver<T>,
}

impl<T> HandoffReceiver<T> {
    /// Waits up to `timeout` for a first item, then takes whatever else is already queued, up
    /// to `max` in all (a batch). Returns the number taken (0 on timeout); `None` when every
    /// sender is gone and the queue is empty.
    pub fn recv_batch(&self, out: &mut Vec<T>, max: usize, timeout: Duration) -> Option<usize> {
        let first = match self.rx.recv_timeout(timeout) {
            Ok(item) => item,
            Err(RecvTimeoutError::Timeout) => return Some(0),
            Err(RecvTimeoutError::Disconnected) => return None,
        };
        let before = out.len();
        out.push(first);
        self.drain_into(out, before + max);
        Some(out.len() - before)
    }

    /// Takes what is queued right now, until `out` holds `max` items; never waits.
    pub fn drain_into(&self, out: &mut Vec<T>, max: usize) -> usize {
        let before = out.len();
        while out.len() < max {
            match self.rx.try_recv() {
                Ok(item) => out.push(item),
                Err(_) => break,
            }
        }
        out.len() - before
    }

    pub fn len(&self) -> usize {
        self.rx.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_queue_hands_the_item_back_and_counts() {
        let (tx, rx) = handoff(2);
        tx.offer(1).unwrap();
        tx.offer(2).unwrap();
        match tx.offer(3) {
            Err(Refused::Full(3)) => {}
            other => panic!("expected Full(3), got {other:?}"),
        }
        assert_eq!(tx.full_count(), 1);
        assert_eq!(tx.len(), 2);
        let mut batch = Vec::new();
        assert_eq!(rx.recv_batch(&mut batch, 10, Duration::ZERO), Some(2));
        assert_eq!(batch, [1, 2]);
        tx.offer(4).unwrap();
    }

    #[test]
    fn batches_are_capped_and_timeouts_return_zero() {
        let (tx, rx) = handoff(100);
        for i in 0..10 {
            tx.offer(i).unwrap();
        }
        let mut batch = Vec::new();
        assert_eq!(rx.recv_batch(&mut batch, 4, Duration::ZERO), Some(4));
        batch.clear();
        assert_eq!(rx.recv_batch(&mut batch, 100, Duration::ZERO), Some(6));
        batch.clear();
        let t = std::time::Instant::now();
        assert_eq!(
            rx.recv_batch(&mut batch, 100, Duration::from_millis(20)),
            Some(0)
        );
        assert!(t.elapsed() >= Duration::from_millis(20));
        drop(tx);
        assert_eq!(rx.recv_batch(&mut batch, 100, Duration::ZERO), None);
    }

    #[test]
    fn offers_from_other_threads_arrive() {
        let (tx, rx) = handoff(1000);
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for i in 0..100 {
                        while tx.offer(t * 1000 + i).is_err() {}
                    }
                })
            })
            .collect();
        drop(tx);
        for t in threads {
            t.join().unwrap();
        }
        let mut all = Vec::new();
        while rx.recv_batch(&mut all, 64, Duration::ZERO).is_some() {}
        assert_eq!(all.len(), 400);
    }
}
