use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

/// A worker's inbox: a bounded lock-free queue plus the worker's `mio::Waker`. Any thread may
/// send; only the owning worker receives. Wake-ups are coalesced: a burst of sends costs one
/// eventfd write, not one per message.
pub struct Inbox<M> {
    queue: ArrayQueue<M>,
    notified: AtomicBool,
    waker: mio::Waker,
}

impl<M> Inbox<M> {
    pub fn new(waker: mio::Waker, capacity: usize) -> Inbox<M> {
        Inbox {
            queue: ArrayQueue::new(capacity),
            notified: AtomicBool::new(false),
            waker,
        }
    }

    /// Called by the owning worker when its waker fired: re-arm notification, then drain.
    /// Clearing before draining means a message pushed during the drain either is seen by it
    /// or triggers a fresh wake (the sender sees `notified == false`).
    pub fn drain(&self, mut each: impl FnMut(M)) {
        self.notified.store(false, Ordering::SeqCst);
        while let Some(m) = self.queue.pop() {
            each(m);
        }
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn wake(&self) -> io::Result<()> {
        if !self.notified.swap(true, Ordering::SeqCst) {
            self.waker.wake()?;
        }
        Ok(())
    }
}

/// The sending side of a worker's inbox; cheap to clone and `Send`.
pub struct InboxSender<M>(Arc<Inbox<M>>);

impl<M> Clone for InboxSender<M> {
    fn clone(&self) -> Self {
        InboxSender(self.0.clone())
    }
}

impl<M> InboxSender<M> {
    pub fn new(inbox: Arc<Inbox<M>>) -> InboxSender<M> {
        InboxSender(inbox)
    }

    /// Queues a message and wakes the worker. A full inbox hands the message back so the
    /// caller decides (retry, drop, or answer 503) — it never blocks.
    pub fn send(&self, msg: M) -> Result<(), M> {
        self.0.queue.push(msg)?;
        if let Err(e) = self.0.wake() {
            tracing::warn!("inbox wake failed: {e}");
        }
        Ok(())
    }

    /// Wakes the worker without a message (used for shutdown).
    pub fn nudge(&self) {
        self.0.notified.store(false, Ordering::SeqCst);
        let _ = self.0.wake();
    }

    pub fn inbox(&self) -> &Arc<Inbox<M>> {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn messages_from_other_threads_wake_the_poll_and_arrive_in_order() {
        let mut poll = mio::Poll::new().unwrap();
        let waker = mio::Waker::new(poll.registry(), mio::Token(1)).unwrap();
        let inbox = Arc::new(Inbox::new(waker, 1024));
        let sender = InboxSender::new(inbox.clone());
        let producer = std::thread::spawn(move || {
            for i in 0..500u32 {
                while sender.send(i).is_err() {
                    std::thread::yield_now();
                }
            }
        });
        let mut events = mio::Events::with_capacity(8);
        let mut got = Vec::new();
        while got.len() < 500 {
            poll.poll(&mut events, Some(Duration::from_secs(5)))
                .unwrap();
            assert!(
                !events.is_empty(),
                "no wake-up within 5 s with {} received",
                got.len()
            );
            inbox.drain(|m| got.push(m));
        }
        producer.join().unwrap();
        assert_eq!(got, (0..500).collect::<Vec<_>>());
    }

    #[test]
    fn full_inbox_returns_the_message() {
        let poll = mio::Poll::new().unwrap();
        let waker = mio::Waker::new(poll.registry(), mio::Token(1)).unwrap();
        let sender = InboxSender::new(Arc::new(Inbox::new(waker, 2)));
        assert!(sender.send(1).is_ok());
        assert!(sender.send(2).is_ok());
        assert_eq!(sender.send(3), Err(3));
    }
}
