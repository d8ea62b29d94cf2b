//! A bounded pool of threads for slow checks (password hashes, exec'd checkers), so a worker
//! never waits on one: the worker hands the job over and defers its reply. A full queue is
//! refused at once (the caller answers 503), so a login flood costs a bounded amount of CPU
//! and memory and never slows the requests the workers are serving.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

pub type Job = Box<dyn FnOnce() + Send + 'static>;

/// The pool's queue; cheap to clone.
#[derive(Clone)]
pub struct Pool {
    jobs: Sender<Job>,
    receiver: Receiver<Job>,
    running: Arc<AtomicUsize>,
    threads: usize,
}

/// The queue was full.
#[derive(Debug)]
pub struct Busy;

impl Pool {
    /// A pool of `threads` threads (started with [`Pool::thread_loop`], by the caller, so a
    /// server can start them after its sandbox is in place) and room for `queue` waiting jobs.
    pub fn new(threads: usize, queue: usize) -> Pool {
        let (jobs, receiver) = bounded(queue.max(1));
        Pool {
            jobs,
            receiver,
            running: Arc::new(AtomicUsize::new(0)),
            threads: threads.max(1),
        }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Queues `job`, or refuses at once when the queue is full.
    pub fn try_run(&self, job: Job) -> Result<(), Busy> {
        match self.jobs.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => Err(Busy),
        }
    }

    /// Jobs waiting for a thread.
    pub fn queued(&self) -> usize {
        self.jobs.len()
    }

    /// Jobs being run now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// One pool thread's life: runs jobs until `stopped()` says so. A panicking job is caught
    /// (its `Pending` reply, dropped while unwinding, answers 500) and the thread goes on.
    pub fn thread_loop(&self, stopped: impl Fn() -> bool) {
        while !stopped() {
            let Ok(job) = self.receiver.recv_timeout(Duration::from_millis(200)) else {
                continue;
            };
            self.running.fetch_add(1, Ordering::Relaxed);
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
                tracing::error!("a gate check panicked; its request was answered 500");
            }
            self.running.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Starts the threads directly (tests and tools without a server).
    pub fn spawn_threads(&self) -> Vec<std::thread::JoinHandle<()>> {
        (0..self.threads)
            .map(|i| {
                let pool = self.clone();
                std::thread::Builder::new()
                    .name(format!("gate-check-{i}"))
                    .spawn(move || pool.thread_loop(|| false))
                    .expect("spawn a gate check thread")
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_is_refused_at_once_and_jobs_run() {
        let pool = Pool::new(1, 2);
        let (tx, rx) = crossbeam_channel::unbounded();
        // No thread yet: the queue fills.
        for i in 0..2 {
            let tx = tx.clone();
            pool.try_run(Box::new(move || tx.send(i).unwrap())).unwrap();
        }
        assert!(pool.try_run(Box::new(|| {})).is_err());
        assert_eq!(pool.queued(), 2);
        let _threads = pool.spawn_threads();
        let mut got = vec![rx.recv().unwrap(), rx.recv().unwrap()];
        got.sort();
        assert_eq!(got, vec![0, 1]);
        // A panicking job does not kill the thread.
        pool.try_run(Box::new(|| panic!("boom"))).unwrap();
        pool.try_run(Box::new(move || tx.send(7).unwrap())).unwrap();
        assert_eq!(rx.recv().unwrap(), 7);
    }
}
