//! An upstream group: the servers of one proxy route, which one takes the next request, and
//! which are skipped for having failed (passive health, as nginx's `max_fails`/
//! `fail_timeout`). Balancing state is per worker (a cursor, smooth weighted round-robin
//! weights and in-flight counts, each on its worker's own cache line, written only by that
//! worker); health is shared, one atomic pair per server, since a server that refuses one
//! worker refuses them all.
//!
//! Servers have a weight (a share of the requests, nginx's `weight=`) and may be backups
//! (`backup`): a backup takes requests only while no primary server can (every primary is
//! down or already failed this request).

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::CachePadded;
use tern_server::{
    RetryPolicy, UpstreamAddr, UpstreamOutcome, UpstreamRow, UpstreamTimeouts, UpstreamTls,
    Upstreams,
};

/// How a server is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Balance {
    #[default]
    RoundRobin,
    /// The server with the fewest requests in flight from this worker (per unit of weight).
    LeastConn,
}

/// How a group's servers are checked (by the process's checker thread, `health.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    /// The path (and query) asked for.
    pub path: String,
    /// The Host sent; None: the server's address.
    pub host: Option<String>,
    pub interval: Duration,
    /// For the connect, and then for the answer's status line.
    pub timeout: Duration,
    /// Answers counted as healthy.
    pub statuses: RangeInclusive<u16>,
    /// Good checks in a row that bring a server back.
    pub rise: u32,
    /// Failed checks in a row that take it out.
    pub fall: u32,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            path: "/".into(),
            host: None,
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            statuses: 200..=399,
            rise: 2,
            fall: 3,
        }
    }
}

/// One server of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamServer {
    pub addr: UpstreamAddr,
    /// Its share of the requests, relative to the others of its tier (at least 1).
    pub weight: u32,
    /// Takes requests only while no primary server can.
    pub backup: bool,
    /// With TLS (the group's [`GroupOptions::tls`]): the name its certificate must carry,
    /// sent as SNI.
    pub tls_name: Option<rustls::pki_types::ServerName<'static>>,
}

impl UpstreamServer {
    /// A primary server of weight 1.
    pub fn new(addr: UpstreamAddr) -> UpstreamServer {
        UpstreamServer {
            addr,
            weight: 1,
            backup: false,
            tls_name: None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct GroupOptions {
    /// What logs and metrics call the group (its site and route).
    pub name: String,
    /// The row of the server's counters its exchanges are counted in (`Stats::upstream` of
    /// its name).
    pub counted_as: UpstreamRow,
    pub servers: Vec<UpstreamServer>,
    pub balance: Balance,
    /// Failures in a row after which a server is skipped...
    pub max_fails: u32,
    /// ...for this long.
    pub fail_timeout: Duration,
    pub timeouts: UpstreamTimeouts,
    /// Idle connections kept per worker and server.
    pub keepalive: usize,
    /// When a request goes on to the next server.
    pub retry: RetryPolicy,
    /// Active health checks, by the process's checker thread (`health::watch`).
    pub health_check: Option<HealthCheck>,
    /// TLS to every server of the group (`tern_tls::upstream::client_config`); each server
    /// gives its name in [`UpstreamServer::tls_name`].
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            name: String::new(),
            counted_as: UpstreamRow::NONE,
            servers: Vec::new(),
            balance: Balance::RoundRobin,
            max_fails: 3,
            fail_timeout: Duration::from_secs(10),
            timeouts: UpstreamTimeouts::default(),
            keepalive: 128,
            retry: RetryPolicy::default(),
            health_check: None,
            tls: None,
        }
    }
}

#[derive(Default)]
struct Health {
    fails: AtomicU32,
    /// Monotonic ms until which the server is skipped (0: never).
    down_until_ms: AtomicU64,
    /// Taken out by its health check (written by the checker thread only).
    checked_down: AtomicBool,
    checks_ok: AtomicU64,
    checks_failed: AtomicU64,
    went_down: AtomicU64,
    came_up: AtomicU64,
}

/// A server's health-check figures, for the counters pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckFigures {
    pub down: bool,
    pub ok: u64,
    pub failed: u64,
    pub went_down: u64,
    pub came_up: u64,
}

/// One worker's balancing state.
#[derive(Default)]
struct WorkerState {
    /// Whose turn it is among the primaries...
    cursor: AtomicUsize,
    /// ...and among the backups: a tier of its own, so the backups take turns whatever the
    /// primaries' cursor does (one cursor for both sent every retry that fell to the backups
    /// to the same one: 5:1 between two equal backups).
    backup_cursor: AtomicUsize,
    /// Smooth weighted round-robin: each server's current weight (nginx's
    /// `current_weight`); unused when all weights are equal.
    current: Vec<AtomicI64>,
    /// Requests in flight per server (least-connections).
    in_flight: Vec<AtomicU32>,
}

pub struct UpstreamGroup {
    options: GroupOptions,
    pool_key: u64,
    health: Vec<Health>,
    workers: Vec<CachePadded<WorkerState>>,
    /// Every server has the same weight: plain round-robin by cursor, no weights to add up.
    equal_weights: bool,
    has_backup: bool,
    /// Bit i: server i (of the first 64, as `tried` counts them) is a backup.
    backup_mask: u64,
    /// Per server, when the group speaks TLS.
    tls: Vec<Option<UpstreamTls>>,
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
        let first_weight = options.servers[0].weight;
        UpstreamGroup {
            health: (0..n).map(|_| Health::default()).collect(),
            workers: (0..workers.max(1))
                .map(|_| {
                    CachePadded::new(WorkerState {
                        cursor: AtomicUsize::new(0),
                        backup_cursor: AtomicUsize::new(0),
                        current: (0..n).map(|_| AtomicI64::new(0)).collect(),
                        in_flight: (0..n).map(|_| AtomicU32::new(0)).collect(),
                    })
                })
                .collect(),
            pool_key: NEXT_POOL_KEY.fetch_add(1, Ordering::Relaxed),
            equal_weights: options.servers.iter().all(|s| s.weight == first_weight),
            has_backup: options.servers.iter().any(|s| s.backup),
            backup_mask: options
                .servers
                .iter()
                .take(64)
                .enumerate()
                .filter(|(_, s)| s.backup)
                .fold(0, |mask, (i, _)| mask | 1 << i),
            tls: options
                .servers
                .iter()
                .map(|s| {
                    let config = options.tls.clone()?;
                    let name = s.tls_name.clone()?;
                    Some(UpstreamTls { config, name })
                })
                .collect(),
            options,
        }
    }

    pub fn servers(&self) -> &[UpstreamServer] {
        &self.options.servers
    }

    pub fn name(&self) -> &str {
        &self.options.name
    }

    pub fn health_check(&self) -> Option<&HealthCheck> {
        self.options.health_check.as_ref()
    }

    /// Whether `server` is being skipped at `now_ms`: it failed recently, or its health
    /// check took it out.
    pub fn is_down(&self, server: usize, now_ms: u64) -> bool {
        let h = &self.health[server];
        h.down_until_ms.load(Ordering::Relaxed) > now_ms || h.checked_down.load(Ordering::Relaxed)
    }

    /// The health check's verdict on `server`; true if that changed it (and it was counted).
    pub fn set_checked_down(&self, server: usize, down: bool) -> bool {
        let h = &self.health[server];
        if h.checked_down.swap(down, Ordering::Relaxed) == down {
            return false;
        }
        let changes = if down { &h.went_down } else { &h.came_up };
        changes.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Counts a health check of `server`.
    pub fn count_check(&self, server: usize, ok: bool) {
        let h = &self.health[server];
        let n = if ok { &h.checks_ok } else { &h.checks_failed };
        n.fetch_add(1, Ordering::Relaxed);
    }

    pub fn check_figures(&self, server: usize) -> CheckFigures {
        let h = &self.health[server];
        CheckFigures {
            down: h.checked_down.load(Ordering::Relaxed),
            ok: h.checks_ok.load(Ordering::Relaxed),
            failed: h.checks_failed.load(Ordering::Relaxed),
            went_down: h.went_down.load(Ordering::Relaxed),
            came_up: h.came_up.load(Ordering::Relaxed),
        }
    }

    fn worker(&self, worker: usize) -> &WorkerState {
        &self.workers[worker % self.workers.len()]
    }

    /// The server the balancing method takes among those `ok` accepts (one tier: primaries
    /// or backups, `cursor` being that tier's), if any. A retry within the tier
    /// (`first_try` false) takes the next one in turn and moves nothing: were it to move the
    /// cursor or the weights, a server that fails every request would get the first try of
    /// every request.
    fn choose(
        &self,
        w: &WorkerState,
        cursor: &AtomicUsize,
        ok: impl Fn(usize) -> bool,
        first_try: bool,
    ) -> Option<usize> {
        let n = self.options.servers.len();
        let start = cursor.load(Ordering::Relaxed);
        let mut in_turn = (0..n).map(|k| (start + k) % n).filter(|&i| ok(i));
        if !first_try {
            return in_turn.next();
        }
        let weight = |i: usize| u64::from(self.options.servers[i].weight.max(1));
        let choice = match self.options.balance {
            Balance::RoundRobin if self.equal_weights => in_turn.clone().next(),
            Balance::RoundRobin => {
                // Smooth weighted round-robin (nginx's): every candidate gains its weight,
                // the one with the most goes, and pays back the candidates' total. Spreads a
                // 5:1:1 split as a a b a c a a, not a a a a a b c.
                let mut total = 0i64;
                let mut best: Option<(usize, i64)> = None;
                for i in (0..n).filter(|&i| ok(i)) {
                    let wi = weight(i) as i64;
                    let cur = w.current[i].load(Ordering::Relaxed) + wi;
                    w.current[i].store(cur, Ordering::Relaxed);
                    total += wi;
                    if best.is_none_or(|(_, b)| cur > b) {
                        best = Some((i, cur));
                    }
                }
                best.map(|(i, cur)| {
                    w.current[i].store(cur - total, Ordering::Relaxed);
                    i
                })
            }
            // Fewest in flight per unit of weight (a/wa < b/wb as a*wb < b*wa); the first in
            // turn among equals, so ties go round.
            Balance::LeastConn => in_turn.clone().reduce(|best, i| {
                let (a, b) = (
                    u64::from(w.in_flight[i].load(Ordering::Relaxed)),
                    u64::from(w.in_flight[best].load(Ordering::Relaxed)),
                );
                if a * weight(best) < b * weight(i) {
                    i
                } else {
                    best
                }
            }),
        };
        if let Some(i) = choice {
            cursor.store((i + 1) % n, Ordering::Relaxed);
        }
        choice
    }
}

impl Upstreams for UpstreamGroup {
    fn pool_key(&self) -> u64 {
        self.pool_key
    }

    fn addr(&self, server: usize) -> &UpstreamAddr {
        &self.options.servers[server].addr
    }

    fn pick(&self, worker: usize, now_ms: u64, tried: u64) -> Option<usize> {
        let w = self.worker(worker);
        let servers = &self.options.servers;
        let untried = |i: usize| i >= 64 || tried & (1 << i) == 0;
        let usable = |i: usize| untried(i) && !self.is_down(i, now_ms);
        let primary = |i: usize| !servers[i].backup && usable(i);
        if let Some(i) = self.choose(w, &w.cursor, primary, tried == 0) {
            return Some(i);
        }
        if self.has_backup {
            // The first backup this request tries is a first try of the backup tier, whatever
            // the primaries did before it.
            let backups_tried = tried & self.backup_mask != 0;
            let backup = |i: usize| servers[i].backup && usable(i);
            if let Some(i) = self.choose(w, &w.backup_cursor, backup, !backups_tried) {
                return Some(i);
            }
        }
        // Every untried server is down: try the one that comes back first rather than fail
        // outright (a probe; a success brings it back for everyone). Not one its health check
        // took out: the checker, not a client's request, finds out when it is back.
        (0..servers.len())
            .filter(|&i| untried(i) && !self.health[i].checked_down.load(Ordering::Relaxed))
            .min_by_key(|&i| self.health[i].down_until_ms.load(Ordering::Relaxed))
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

    fn retry(&self) -> RetryPolicy {
        self.options.retry
    }

    fn tls(&self, server: usize) -> Option<&UpstreamTls> {
        self.tls[server].as_ref()
    }

    fn counted_as(&self) -> UpstreamRow {
        self.options.counted_as
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(n: usize, balance: Balance) -> UpstreamGroup {
        let servers = (0..n)
            .map(|i| {
                UpstreamServer::new(UpstreamAddr::Tcp(
                    format!("127.0.0.1:{}", 9000 + i).parse().unwrap(),
                ))
            })
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

    fn weighted(specs: &[(u32, bool)], balance: Balance) -> UpstreamGroup {
        let servers = specs
            .iter()
            .enumerate()
            .map(|(i, &(weight, backup))| UpstreamServer {
                addr: UpstreamAddr::Tcp(format!("127.0.0.1:{}", 9000 + i).parse().unwrap()),
                weight,
                backup,
                tls_name: None,
            })
            .collect();
        UpstreamGroup::new(
            GroupOptions {
                servers,
                balance,
                max_fails: 1,
                ..GroupOptions::default()
            },
            1,
        )
    }

    #[test]
    fn weights_are_spread_smoothly_as_nginx_does() {
        let g = weighted(&[(5, false), (1, false), (1, false)], Balance::RoundRobin);
        let picks: Vec<usize> = (0..14).map(|_| g.pick(0, 0, 0).unwrap()).collect();
        assert_eq!(picks, [0, 0, 1, 0, 2, 0, 0, 0, 0, 1, 0, 2, 0, 0]);
        // A server that is down is left out, and the rest keep their shares.
        let g = weighted(&[(3, false), (1, false), (2, false)], Balance::RoundRobin);
        g.end(0, 1, UpstreamOutcome::Failed, 0); // max_fails = 1: down for fail_timeout
        let mut counts = [0; 3];
        for _ in 0..30 {
            counts[g.pick(0, 1, 0).unwrap()] += 1;
        }
        assert_eq!(counts, [18, 0, 12]);
    }

    #[test]
    fn a_retry_takes_the_next_server_in_turn_and_moves_no_cursor() {
        for balance in [Balance::RoundRobin, Balance::LeastConn] {
            let g = weighted(&[(1, false), (1, false), (1, false)], balance);
            assert_eq!(g.pick(0, 0, 0), Some(0));
            // Server 0 answered 503: the retry goes to 1, and the next request's first try
            // is still 1's turn, so a failing server does not get every first try.
            assert_eq!(g.pick(0, 0, 0b001), Some(1));
            assert_eq!(g.pick(0, 0, 0), Some(1), "{balance:?}");
            assert_eq!(g.pick(0, 0, 0), Some(2), "{balance:?}");
        }
        // Weighted: a retry leaves the weights as they were.
        let g = weighted(&[(5, false), (1, false), (1, false)], Balance::RoundRobin);
        assert_eq!(g.pick(0, 0, 0), Some(0));
        assert_eq!(g.pick(0, 0, 0b001), Some(1));
        let picks: Vec<usize> = (0..6).map(|_| g.pick(0, 0, 0).unwrap()).collect();
        assert_eq!(picks, [0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn backups_take_requests_only_when_no_primary_can() {
        for balance in [Balance::RoundRobin, Balance::LeastConn] {
            let g = weighted(&[(1, false), (2, true), (1, false)], balance);
            for _ in 0..10 {
                assert_ne!(g.pick(0, 0, 0), Some(1), "{balance:?}");
            }
            assert_eq!(g.pick(0, 0, 0b001), Some(2), "the other primary first");
            assert_eq!(
                g.pick(0, 0, 0b101),
                Some(1),
                "every primary failed: the backup"
            );
            assert_eq!(g.pick(0, 0, 0b111), None);
            // Both primaries down (max_fails = 1): the backup, until they are back.
            g.end(0, 0, UpstreamOutcome::Failed, 1000);
            g.end(0, 2, UpstreamOutcome::Failed, 1000);
            assert_eq!(g.pick(0, 2000, 0), Some(1));
            assert_eq!(
                g.pick(0, 2000, 0b010),
                Some(0),
                "all down: probe the first back"
            );
            assert_ne!(g.pick(0, 20_000, 0), Some(1), "{balance:?}");
        }
    }

    /// Every primary refuses (before and after it is marked down): each request's first try
    /// goes to it, its retry to a backup. Two equal backups got the requests 5:1, every retry
    /// falling to the backup after the primaries' cursor.
    #[test]
    fn backups_share_evenly_when_the_primaries_fail() {
        for balance in [Balance::RoundRobin, Balance::LeastConn] {
            for specs in [
                &[(1, false), (1, true), (1, true)][..],
                &[(1, true), (1, false), (1, true), (1, false)][..],
                &[(2, false), (1, true), (1, true)][..],
            ] {
                let g = weighted(specs, balance);
                let mut counts = vec![0; specs.len()];
                // max_fails = 1, fail_timeout 10 s: requests 10 s apart find every primary
                // back, those between find them down.
                for n in 0..24u64 {
                    let now = n * 4000;
                    let mut tried = 0u64;
                    loop {
                        let i = g.pick(0, now, tried).unwrap();
                        g.begin(0, i);
                        if specs[i].1 {
                            g.end(0, i, UpstreamOutcome::Ok, now);
                            counts[i] += 1;
                            break;
                        }
                        g.end(0, i, UpstreamOutcome::Failed, now);
                        tried |= 1 << i;
                    }
                }
                let backups: Vec<usize> = (0..specs.len())
                    .filter(|&i| specs[i].1)
                    .map(|i| counts[i])
                    .collect();
                assert_eq!(backups, [12, 12], "{balance:?} {specs:?}: {counts:?}");
            }
        }
    }

    #[test]
    fn least_connections_counts_per_unit_of_weight() {
        let g = weighted(&[(3, false), (1, false)], Balance::LeastConn);
        // 2 in flight on a weight of 3 is less load than 1 on a weight of 1.
        g.begin(0, 0);
        g.begin(0, 0);
        g.begin(0, 1);
        assert_eq!(g.pick(0, 0, 0), Some(0));
        g.begin(0, 0);
        g.begin(0, 0);
        assert_eq!(g.pick(0, 0, 0), Some(1), "4/3 is more than 1/1");
    }

    #[test]
    fn servers_taken_out_by_their_check_are_skipped_and_never_probed() {
        let g = group(2, Balance::RoundRobin);
        assert!(g.set_checked_down(0, true));
        assert!(!g.set_checked_down(0, true), "no change, not counted again");
        for _ in 0..4 {
            assert_eq!(g.pick(0, 0, 0), Some(1));
        }
        assert_eq!(g.pick(0, 0, 0b10), None, "not probed: the checker decides");
        g.end(0, 0, UpstreamOutcome::Ok, 0);
        assert!(
            g.is_down(0, 0),
            "a passive success does not overrule the check"
        );
        assert!(g.set_checked_down(0, false));
        assert_eq!(g.pick(0, 0, 0b10), Some(0));
        let f = g.check_figures(0);
        assert_eq!((f.down, f.went_down, f.came_up), (false, 1, 1));
    }
}
