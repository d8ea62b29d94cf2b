//! An upstream group: the servers of one proxy route, which one takes the next request, and
//! which are skipped for having failed (passive health, as nginx's `max_fails`/
//! `fail_timeout`). Balancing state is per worker (a cursor and in-flight counts, each on
//! its worker's own cache line, written only by that worker); health is shared, one atomic
//! pair per server, since a server that refuses one worker refuses them all.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use tern_server::{UpstreamAddr, UpstreamOutcome, UpstreamTimeouts, Upstreams};

/// How a server is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    #[default]
    RoundRobin,
    /// The server with the fewest requests in flight from this worker.
    LeastConn,
}

#[derive(Debug, Clone)]
pub struct GroupOptions {
    pub servers: Vec<UpstreamAddr>,
    pub balance: Balance,
    /// Failures in a row after which a server is skipped...
    pub max_fails: u32,
    /// ...for this long.
    pub fail_timeout: Duration,
    pub timeouts: UpstreamTimeouts,
    /// Idle connections kept per worker and server.
    pub keepalive: usize,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            servers: Vec::new(),
            balance: Balance::RoundRobin,
            max_fails: 3,
            fail_timeout: Duration::from_secs(10),
            timeouts: UpstreamTimeouts::default(),
            keepalive: 128,
        }
    }
}

struct Health {
    fails: AtomicU32,
    /// Monotonic ms until which the server is skipped (0: never).
    down_until_ms: AtomicU64,
}

/// One worker's balancing state.
#[derive(Default)]
struct WorkerState {
    cursor: AtomicUsize,
    /// Requests in flight per server (least-connections).
    in_flight: Vec<AtomicU32>,
}

pub struct UpstreamGroup {
    options: GroupOptions,
    pool_key: u64,
    health: Vec<Health>,
    workers: Vec<CachePadded<WorkerState>>,
}

static NEXT_POOL_KEY: AtomicU64 = AtomicU64::new(1);

impl UpstreamGroup {
    /// A group for `workers` worker threads. Panics on an empty server list (the config
    /// check refuses one).
    pub fn new(options: GroupOptions, workers: usize) -> UpstreamGroup {
        assert!(
            !options.servers.is_empty(),
            "an upstream group needs a server"
        );
        let n = options.servers.len();
        UpstreamGroup {
            health: (0..n)
                .map(|_| Health {
                    fails: AtomicU32::new(0),
                    down_until_ms: AtomicU64::new(0),
                })
                .collect(),
            workers: (0..workers.max(1))
                .map(|_| {
                    CachePadded::new(WorkerState {
                        cursor: AtomicUsize::new(0),
                        in_flight: (0..n).map(|_| AtomicU32::new(0)).collect(),
                    })
                })
                .collect(),
            pool_key: NEXT_POOL_KEY.fetch_add(1, Ordering::Relaxed),
            options,
        }
    }

    pub fn servers(&self) -> &[UpstreamAddr] {
        &self.options.servers
    }

    /// Whether `server` is being skipped at `now_ms`.
    pub fn is_down(&self, server: usize, now_ms: u64) -> bool {
        self.health[server].down_until_ms.load(Ordering::Relaxed) > now_ms
    }

    fn worker(&self, worker: usize) -> &WorkerState {
        &self.workers[worker % self.workers.len()]
    }
}

impl Upstreams for UpstreamGroup {
    fn pool_key(&self) -> u64 {
        self.pool_key
    }

    fn addr(&self, server: usize) -> &UpstreamAddr {
        &self.options.servers[server]
    }

    fn pick(&self, worker: usize, now_ms: u64, tried: u64) -> Option<usize> {
        let n = self.options.servers.len();
        let w = self.worker(worker);
        let start = w.cursor.load(Ordering::Relaxed);
        let untried = |i: usize| i >= 64 || tried & (1 << i) == 0;
        let candidates = (0..n).map(|k| (start + k) % n).filter(|&i| untried(i));
        let choice = match self.options.balance {
            Balance::RoundRobin => candidates.clone().find(|&i| !self.is_down(i, now_ms)),
            Balance::LeastConn => candidates
                .clone()
                .filter(|&i| !self.is_down(i, now_ms))
                .min_by_key(|&i| w.in_flight[i].load(Ordering::Relaxed)),
        }
        // Every untried server is down: try the one that comes back first rather than fail
        // outright (a probe; a success brings it back for everyone).
        .or_else(|| {
            candidates.min_by_key(|&i| self.health[i].down_until_ms.load(Ordering::Relaxed))
        })?;
        w.cursor.store((choice + 1) % n, Ordering::Relaxed);
        Some(choice)
    }

    fn begin(&self, worker: usize, server: usize) {
        let c = &self.worker(worker).in_flight[server];
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    fn end(&self, worker: usize, server: usize, outcome: UpstreamOutcome, now_ms: u64) {
        let c = &self.worker(worker).in_flight[server];
        c.store(
            c.load(Ordering::Relaxed).saturating_sub(1),
            Ordering::Relaxed,
        );
        let h = &self.health[server];
        match outcome {
            UpstreamOutcome::Ok => {
                if h.fails.load(Ordering::Relaxed) != 0 {
                    h.fails.store(0, Ordering::Relaxed);
                }
                if h.down_until_ms.load(Ordering::Relaxed) != 0 {
                    h.down_until_ms.store(0, Ordering::Relaxed);
                }
            }
            UpstreamOutcome::Failed => {
                let fails = h.fails.fetch_add(1, Ordering::Relaxed) + 1;
                if fails >= self.options.max_fails {
                    h.fails.store(0, Ordering::Relaxed);
                    let until = now_ms + self.options.fail_timeout.as_millis() as u64;
                    h.down_until_ms.store(until, Ordering::Relaxed);
                }
            }
            UpstreamOutcome::Abandoned => {}
        }
    }

    fn timeouts(&self) -> UpstreamTimeouts {
        self.options.timeouts
    }

    fn max_idle(&self) -> usize {
        self.options.keepalive
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: usize, balance: Balance) -> UpstreamGroup {
        let servers = (0..n)
            .map(|i| UpstreamAddr::Tcp(format!("127.0.0.1:{}", 9000 + i).parse().unwrap()))
            .collect();
        UpstreamGroup::new(
            GroupOptions {
                servers,
                balance,
                max_fails: 2,
                fail_timeout: Duration::from_secs(10),
                ..GroupOptions::default()
            },
            2,
        )
    }

    #[test]
    fn round_robin_takes_turns_per_worker() {
        let g = group(3, Balance::RoundRobin);
        let picks: Vec<usize> = (0..6).map(|_| g.pick(0, 0, 0).unwrap()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
        assert_eq!(g.pick(1, 0, 0), Some(0), "each worker has its own cursor");
        assert_eq!(
            g.pick(0, 0, 0b001),
            Some(1),
            "a server that failed this request is skipped"
        );
        assert_eq!(g.pick(0, 0, 0b111), None);
    }

    #[test]
    fn least_connections_prefers_the_idlest() {
        let g = group(3, Balance::LeastConn);
        g.begin(0, 0);
        g.begin(0, 0);
        g.begin(0, 1);
        assert_eq!(g.pick(0, 0, 0), Some(2));
        g.begin(0, 2);
        g.begin(0, 2);
        assert_eq!(g.pick(0, 0, 0), Some(1));
        g.end(0, 0, UpstreamOutcome::Ok, 0);
        g.end(0, 0, UpstreamOutcome::Ok, 0);
        assert_eq!(g.pick(0, 0, 0), Some(0));
    }

    #[test]
    fn failing_servers_are_skipped_for_a_while_then_probed() {
        let g = group(2, Balance::RoundRobin);
        g.end(0, 0, UpstreamOutcome::Failed, 1000);
        assert!(!g.is_down(0, 1000), "one failure is not enough");
        g.end(1, 0, UpstreamOutcome::Failed, 1000);
        assert!(g.is_down(0, 1000));
        for _ in 0..4 {
            assert_eq!(g.pick(0, 2000, 0), Some(1));
        }
        assert!(!g.is_down(0, 11_000), "back after fail_timeout");
        // Both down: the one back first is probed rather than failing outright.
        g.end(0, 1, UpstreamOutcome::Failed, 5000);
        g.end(0, 1, UpstreamOutcome::Failed, 5000);
        assert_eq!(g.pick(0, 6000, 0), Some(0));
        g.end(0, 0, UpstreamOutcome::Ok, 6000);
        assert!(!g.is_down(0, 6000), "a success brings it back");
        // Abandoned exchanges say nothing about the server.
        g.end(0, 0, UpstreamOutcome::Abandoned, 6000);
        g.end(0, 0, UpstreamOutcome::Abandoned, 6000);
        assert!(!g.is_down(0, 6000));
    }
}
