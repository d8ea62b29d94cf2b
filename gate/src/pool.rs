//! A bounded pool of threads for slow checks (password hashes, exec'd checkers), so a worker
//! never waits on one: the worker hands the job over and defers its reply. A full queue
//! answers at once (the caller answers 503), so a login flood costs a bounded amount of CPU
//! and memory and never slows the requests the workers are serving.
//!
//! Admission is fair between networks. Each job names the network that sent it and whether
//! that network has failed a login lately (a *suspect* claim). When the queue is full, the
//! waiting job with the weakest claim to its place gives way to a newcomer with a stronger
//! one and is answered "busy" itself: a suspect network's before a clean one's, and among
//! equals the job of the network holding the most jobs (the newest of them). Clean claims
//! are served first. So a flood from many networks, each within its own rate limit, fills the
//! queue only until its networks have failed once; from then on a network with no failures
//! always gets in, and waits behind at most the other clean claims.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::prefix::Prefix;

/// A slow check.
pub trait Job: Send + 'static {
    /// Runs on a pool thread.
    fn run(self: Box<Self>);
    /// Dropped from the queue to make room for a stronger claim: answer "busy" at once
    /// (called on the thread that admitted the newcomer, a worker: it must not block).
    fn shed(self: Box<Self>);
}

/// Who a job is for, as admission weighs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub network: Prefix,
    /// The network failed a login within the failure window.
    pub suspect: bool,
}

/// The pool's queue; cheap to clone.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    running: AtomicUsize,
    threads: usize,
    capacity: usize,
}

struct Queue {
    waiting: VecDeque<(Claim, Box<dyn Job>)>,
    /// Jobs waiting or running per network (networks with none are not kept), so the map
    /// holds at most capacity + threads entries.
    held: HashMap<Prefix, u32>,
}

impl Queue {
    fn held(&self, network: &Prefix) -> u32 {
        self.held.get(network).copied().unwrap_or(0)
    }

    fn release(&mut self, network: &Prefix) {
        if let Some(n) = self.held.get_mut(network) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(network);
            }
        }
    }

    /// How weak a claim to a place is (greater: gives way first): suspect before clean,
    /// then by the jobs its network holds (counting this one).
    fn weakness(&self, claim: &Claim, held: u32) -> (bool, u32) {
        (claim.suspect, held)
    }
}

/// The queue was full and the job's claim no stronger than any waiting one.
#[derive(Debug)]
pub struct Busy;

impl Pool {
    /// A pool of `threads` threads (started with [`Pool::thread_loop`], by the caller, so a
    /// server can start them after its sandbox is in place) and room for `queue` waiting jobs.
    pub fn new(threads: usize, queue: usize) -> Pool {
        Pool {
            shared: Arc::new(Shared {
                queue: Mutex::new(Queue {
                    waiting: VecDeque::with_capacity(queue.max(1)),
                    held: HashMap::new(),
                }),
                ready: Condvar::new(),
                running: AtomicUsize::new(0),
                threads: threads.max(1),
                capacity: queue.max(1),
            }),
        }
    }

    pub fn threads(&self) -> usize {
        self.shared.threads
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.shared.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job`, or gives it back at once when the queue is full of claims at least as
    /// strong. Admitting it may shed a weaker waiting job (answered busy before this returns).
    pub fn try_run<J: Job>(&self, claim: Claim, job: J) -> Result<(), (Busy, J)> {
        let shed = {
            let mut q = self.lock();
            let mine = q.weakness(&claim, q.held(&claim.network) + 1);
            let mut shed = None;
            if q.waiting.len() >= self.shared.capacity {
                // The weakest waiting claim; among equals the newest, so a network's older
                // jobs keep their places.
                let weakest = (0..q.waiting.len())
                    .max_by_key(|&i| {
                        let (c, _) = &q.waiting[i];
                        (q.weakness(c, q.held(&c.network)), i)
                    })
                    .filter(|&i| {
                        let (c, _) = &q.waiting[i];
                        q.weakness(c, q.held(&c.network)) > mine
                    });
                let Some(i) = weakest else {
                    return Err((Busy, job));
                };
                let (c, j) = q.waiting.remove(i).expect("an index of the queue");
                q.release(&c.network);
                shed = Some(j);
            }
            *q.held.entry(claim.network).or_insert(0) += 1;
            q.waiting.push_back((claim, Box::new(job)));
            shed
        };
        self.shared.ready.notify_one();
        if let Some(j) = shed {
            j.shed();
        }
        Ok(())
    }

    /// Jobs waiting for a thread.
    pub fn queued(&self) -> usize {
        self.lock().waiting.len()
    }

    /// Jobs being run now.
    pub fn running(&self) -> usize {
        self.shared.running.load(Ordering::Relaxed)
    }

    /// The next job for a thread: the oldest clean claim, else the oldest.
    fn next(&self, wait: Duration) -> Option<(Claim, Box<dyn Job>)> {
        let mut q = self.lock();
        if q.waiting.is_empty() {
            q = self
                .shared
                .ready
                .wait_timeout(q, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let i = q.waiting.iter().position(|(c, _)| !c.suspect).unwrap_or(0);
        let next = q.waiting.remove(i);
        if next.is_some() {
            self.shared.running.fetch_add(1, Ordering::Relaxed);
        }
        next
    }

    /// One pool thread's life: runs jobs until `stopped()` says so. A panicking job is caught
    /// (its `Pending` reply, dropped while unwinding, answers 500) and the thread goes on.
    pub fn thread_loop(&self, stopped: impl Fn() -> bool) {
        while !stopped() {
            let Some((claim, job)) = self.next(Duration::from_millis(200)) else {
                continue;
            };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run())).is_err() {
                tracing::error!("a gate check panicked; its request was answered 500");
            }
            self.lock().release(&claim.network);
            self.shared.running.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Starts the threads directly (tests and tools without a server).
    pub fn spawn_threads(&self) -> Vec<std::thread::JoinHandle<()>> {
        (0..self.shared.threads)
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

    /// A job that reports how it ended: ("ran" | "shed", its name).
    #[derive(Debug)]
    struct Probe {
        name: &'static str,
        done: crossbeam_channel::Sender<(&'static str, &'static str)>,
    }

    impl Job for Probe {
        fn run(self: Box<Self>) {
            if self.name == "boom" {
                panic!("boom");
            }
            self.done.send(("ran", self.name)).unwrap();
        }
        fn shed(self: Box<Self>) {
            self.done.send(("shed", self.name)).unwrap();
        }
    }

    fn claim(net: &str, suspect: bool) -> Claim {
        Claim {
            network: Prefix::of(net.parse().unwrap(), 24, 48),
            suspect,
        }
    }

    #[test]
    fn a_full_queue_is_refused_at_once_and_jobs_run() {
        let pool = Pool::new(1, 2);
        let (tx, rx) = crossbeam_channel::unbounded();
        let probe = |name| Probe {
            name,
            done: tx.clone(),
        };
        // No thread yet: the queue fills.
        pool.try_run(claim("192.0.2.1", false), probe("a")).unwrap();
        pool.try_run(claim("198.51.100.1", false), probe("b"))
            .unwrap();
        let (Busy, back) = pool
            .try_run(claim("203.0.113.1", false), probe("c"))
            .unwrap_err();
        assert_eq!(back.name, "c", "a refused job is given back");
        assert_eq!(pool.queued(), 2);
        let _threads = pool.spawn_threads();
        let mut got = vec![rx.recv().unwrap(), rx.recv().unwrap()];
        got.sort();
        assert_eq!(got, vec![("ran", "a"), ("ran", "b")]);
        // A panicking job does not kill the thread.
        pool.try_run(claim("192.0.2.1", false), probe("boom"))
            .unwrap();
        pool.try_run(claim("192.0.2.1", false), probe("d")).unwrap();
        assert_eq!(rx.recv().unwrap(), ("ran", "d"));
    }

    #[test]
    fn a_clean_network_takes_a_suspect_ones_place_and_goes_first() {
        let pool = Pool::new(1, 3);
        let (tx, rx) = crossbeam_channel::unbounded();
        let probe = |name| Probe {
            name,
            done: tx.clone(),
        };
        // Three networks that failed lately fill the queue.
        for (net, name) in [("10.0.1.1", "s1"), ("10.0.2.1", "s2"), ("10.0.3.1", "s3")] {
            pool.try_run(claim(net, true), probe(name)).unwrap();
        }
        // Another suspect network has no stronger claim than theirs.
        assert!(pool.try_run(claim("10.0.4.1", true), probe("s4")).is_err());
        // A clean one does: the newest of the weakest gives way, answered busy at once.
        pool.try_run(claim("192.0.2.1", false), probe("alice"))
            .unwrap();
        assert_eq!(rx.try_recv().unwrap(), ("shed", "s3"));
        // A clean job is never shed for a suspect or an equal claim.
        assert!(pool.try_run(claim("10.0.5.1", true), probe("s5")).is_err());
        pool.try_run(claim("198.51.100.1", false), probe("bob"))
            .unwrap();
        assert_eq!(rx.try_recv().unwrap(), ("shed", "s2"));
        // Clean claims are served first, then the suspect one.
        let _threads = pool.spawn_threads();
        let order: Vec<_> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(order, vec![("ran", "alice"), ("ran", "bob"), ("ran", "s1")]);
    }

    #[test]
    fn among_equal_claims_the_network_holding_most_gives_way() {
        let pool = Pool::new(1, 4);
        let (tx, rx) = crossbeam_channel::unbounded();
        let probe = |name| Probe {
            name,
            done: tx.clone(),
        };
        // One busy network holds three places, another one.
        for name in ["n1", "n2", "n3"] {
            pool.try_run(claim("192.0.2.1", false), probe(name))
                .unwrap();
        }
        pool.try_run(claim("198.51.100.1", false), probe("m1"))
            .unwrap();
        // A newcomer takes the busy network's newest place, then the next...
        pool.try_run(claim("203.0.113.1", false), probe("o1"))
            .unwrap();
        assert_eq!(rx.try_recv().unwrap(), ("shed", "n3"));
        pool.try_run(claim("203.0.114.1", false), probe("p1"))
            .unwrap();
        assert_eq!(rx.try_recv().unwrap(), ("shed", "n2"));
        // ... until every network holds one: then nobody has the stronger claim.
        assert!(pool
            .try_run(claim("203.0.115.1", false), probe("q1"))
            .is_err());
        // And a network cannot push out its own jobs to jump the queue.
        assert!(pool
            .try_run(claim("192.0.2.1", false), probe("n4"))
            .is_err());
        assert_eq!(pool.queued(), 4);
    }
}
