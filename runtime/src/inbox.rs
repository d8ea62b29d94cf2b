use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use crate::waker::Waker;

/// A worker's inbox: a bounded lock-free queue plus the worker's [`Waker`]. Any thread may
/// send; only the owning worker receives. Wake-ups are coalesced: a burst of sends costs one
/// eventfd write, not one per message.
pub struct Inbox<M> {
    queue: ArrayQueue<M>,
    notified: AtomicBool,
    waker: Waker,
}

impl<M> Inbox<M> {
    pub fn new(waker: Waker, capacity: usize) -> Inbox<M> {
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

    /// The wake-up the worker's backend watches.
    pub fn waker(&self) -> &Waker {
        &self.waker
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

    /// Queues a message without waking the worker: for a thread that delivers a batch and
    /// then calls [`InboxSender::wake`] once. Sharing a core with the worker, a wake-up per
    /// message would let the worker preempt the sender after every message.
    pub fn send_quiet(&self, msg: M) -> Result<(), M> {
        self.0.queue.push(msg)
    }

    /// Wakes the worker if it has not been woken since its last drain.
    pub fn wake(&self) {
        if let Err(e) = self.0.wake() {
            tracing::warn!("inbox wake failed: {e}");
        }
    }

    /// True when both senders lead to the same worker.
    pub fn same_inbox(&self, other: &InboxSender<M>) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
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

/// An inbox no worker reads, with its own poll to wait for wake-ups as a worker's event loop
/// does: for code that completes work outside any worker (unit tests of an app's store, a
/// benchmark of the hand-off to another thread, the in-memory connection harness).
pub struct DetachedInbox<M> {
    /// The poll the waker is registered with, and its event buffer.
    poll: Mutex<(mio::Poll, mio::Events)>,
    inbox: Arc<Inbox<M>>,
}

impl<M> DetachedInbox<M> {
    pub fn new(capacity: usize) -> io::Result<DetachedInbox<M>> {
        let poll = mio::Poll::new()?;
        let waker = watched_waker(&poll, mio::Token(0))?;
        Ok(DetachedInbox {
            poll: Mutex::new((poll, mio::Events::with_capacity(4))),
            inbox: Arc::new(Inbox::new(waker, capacity)),
        })
    }

    pub fn sender(&self) -> InboxSender<M> {
        InboxSender::new(self.inbox.clone())
    }

    pub fn inbox(&self) -> &Arc<Inbox<M>> {
        &self.inbox
    }

    /// Waits up to `timeout` for the waker, as a worker's event loop does; false if it did
    /// not fire. A wake-up that came before the call is seen at once; `drain` re-arms it.
    pub fn wait(&self, timeout: Duration) -> bool {
        let mut guard = self.poll.lock().unwrap_or_else(|e| e.into_inner());
        let (poll, events) = &mut *guard;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match poll.poll(events, Some(left)) {
                Ok(()) if !events.is_empty() => return true,
                Ok(()) if left.is_zero() => return false,
                Ok(()) => {} // (woken without an event: wait out the rest)
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }
}

/// A waker watched by a `mio` poll (edge-triggered: every wake is reported).
fn watched_waker(poll: &mio::Poll, token: mio::Token) -> io::Result<Waker> {
    let waker = Waker::new()?;
    poll.registry().register(
        &mut mio::unix::SourceFd(&waker.fd()),
        token,
        mio::Interest::READABLE,
    )?;
    Ok(waker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detached_inbox_wakes_its_waiter() {
        let detached = DetachedInbox::new(4).unwrap();
        assert!(!detached.wait(Duration::from_millis(10)));
        let sender = detached.sender();
        std::thread::spawn(move || sender.send(5u8).unwrap());
        assert!(detached.wait(Duration::from_secs(5)));
        let mut got = Vec::new();
        detached.inbox().drain(|m| got.push(m));
        assert_eq!(got, [5]);
    }

    #[test]
    fn quiet_sends_wake_once_when_asked() {
        let mut poll = mio::Poll::new().unwrap();
        let waker = watched_waker(&poll, mio::Token(7)).unwrap();
        let inbox = Arc::new(Inbox::new(waker, 16));
        let sender = InboxSender::new(inbox.clone());
        assert!(sender.same_inbox(&sender.clone()));
        for i in 0..3u32 {
            sender.send_quiet(i).unwrap();
        }
        let mut events = mio::Events::with_capacity(4);
        poll.poll(&mut events, Some(Duration::from_millis(20)))
            .unwrap();
        assert!(events.is_empty(), "quiet sends must not wake the worker");
        sender.wake();
        poll.poll(&mut events, Some(Duration::from_secs(1)))
            .unwrap();
        assert_eq!(events.iter().count(), 1);
        let mut got = Vec::new();
        inbox.drain(|m| got.push(m));
        assert_eq!(got, [0, 1, 2]);
    }

    #[test]
    fn messages_from_other_threads_wake_the_poll_and_arrive_in_order() {
        let mut poll = mio::Poll::new().unwrap();
        let waker = watched_waker(&poll, mio::Token(1)).unwrap();
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
        let waker = watched_waker(&poll, mio::Token(1)).unwrap();
        let sender = InboxSender::new(Arc::new(Inbox::new(waker, 2)));
        assert!(sender.send(1).is_ok());
        assert!(sender.send(2).is_ok());
        assert_eq!(sender.send(3), Err(3));
    }
}
