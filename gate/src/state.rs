//! The running gate: its config, policy and keyring (each swapped whole on reload), the check
//! pool, the rate limits and the counters.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use tern_server::Server;
use tern_services::metrics::Metric;

use crate::config::{self, GateConfig};
use crate::keyring::{unix_now, Keyring, Rotation};
use crate::limits::{Buckets, Failures};
use crate::policy::Policy;
use crate::pool::Pool;
use crate::pow::ReplaySet;
use crate::stats::{Decisions, Stats};

/// How the gate is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// In front of tern's own routes (`tern serve --gate`, `tern demo --gate`).
    Guard,
    /// Behind nginx's `auth_request` (`tern gate`): `/auth` answers 204 or 401/403.
    AuthRequest,
}

/// What a reload replaces at once.
pub struct Loaded {
    pub config: GateConfig,
    pub policy: Policy,
    pub decisions: Decisions,
}

/// The gate; cheap to clone (every handle shares one state).
#[derive(Clone)]
pub struct Gate {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub path: Option<PathBuf>,
    pub mode: Mode,
    pub workers: usize,
    pub loaded: ArcSwap<Loaded>,
    pub keyring: ArcSwap<Keyring>,
    pub replay: ReplaySet,
    pub pool: Pool,
    pub login_buckets: Buckets,
    pub challenge_buckets: Buckets,
    pub failures: Failures,
    pub stats: Stats,
    /// Set when `exec:` checkers run through helpers (a sandboxed server).
    pub exec_helpers: std::sync::OnceLock<crate::checkers::ExecHelpers>,
}

/// Unexpired challenges the replay set can hold (16 bytes of nonce plus an expiry each).
const REPLAY_CAPACITY: usize = 1 << 17;
/// Slots of each per-network table (8 bytes each).
const LIMIT_SLOTS: usize = 1 << 16;

impl Gate {
    /// Reads the config at `path` (and its policy and keyring, creating the key file on first
    /// start). `workers` sizes the per-worker counters.
    pub fn open(path: &Path, mode: Mode, workers: usize) -> Result<Gate, String> {
        let config = config::load(path)?;
        Gate::with_config(config, Some(path.to_path_buf()), mode, workers)
    }

    /// A gate from a checked config (tests, or a config embedded in another file).
    pub fn with_config(
        config: GateConfig,
        path: Option<PathBuf>,
        mode: Mode,
        workers: usize,
    ) -> Result<Gate, String> {
        check_files(&config)?;
        let keyring = open_keyring(&config)?;
        let loaded = load_policy(config, workers)?;
        let c = &loaded.config;
        let l = &c.limits;
        let inner = Inner {
            path,
            mode,
            workers: workers.max(1),
            pool: Pool::new(c.pool_threads, c.pool_queue),
            login_buckets: Buckets::new(l.login_per_minute, l.login_burst, LIMIT_SLOTS),
            challenge_buckets: Buckets::new(l.challenge_per_minute, l.challenge_burst, LIMIT_SLOTS),
            failures: Failures::new(
                l.failures_per_user,
                l.failure_window.as_secs() / 60,
                LIMIT_SLOTS,
            ),
            replay: ReplaySet::new(REPLAY_CAPACITY),
            stats: Stats::new(workers.max(1)),
            exec_helpers: std::sync::OnceLock::new(),
            keyring: ArcSwap::from_pointee(keyring),
            loaded: ArcSwap::from_pointee(loaded),
        };
        Ok(Gate {
            inner: Arc::new(inner),
        })
    }

    /// Checks a config file, its policy and its checkers' files the way `open` would, without
    /// creating or touching the key file. Returns the config and the policy's rule count.
    pub fn check(path: &Path) -> Result<(GateConfig, usize), String> {
        let config = config::load(path)?;
        check_files(&config)?;
        let loaded = load_policy(config, 1)?;
        let rules = loaded.policy.rule_names().len();
        Ok((loaded.config, rules))
    }

    /// Runs `exec:` checkers through helper processes (see `checkers::ExecHelpers`); for a
    /// server whose sandbox forbids starting programs. Only the first call counts.
    pub fn use_exec_helpers(&self, helpers: crate::checkers::ExecHelpers) {
        let _ = self.inner.exec_helpers.set(helpers);
    }

    /// Threads of the check pool (one exec helper each).
    pub fn pool_threads(&self) -> usize {
        self.inner.pool.threads()
    }

    pub fn mode(&self) -> Mode {
        self.inner.mode
    }

    pub fn config(&self) -> arc_swap::Guard<Arc<Loaded>> {
        self.inner.loaded.load()
    }

    /// Re-reads the config, the policy (and its CIDR files) and the key file; a bad file
    /// changes nothing. The pool and the rate-limit tables keep their start-up sizes.
    pub fn reload(&self) -> Result<String, String> {
        let Some(path) = &self.inner.path else {
            return Ok("gate: nothing to re-read".into());
        };
        let config = config::load(path)?;
        check_files(&config)?;
        let keyring = open_keyring(&config)?;
        let old = self.inner.loaded.load();
        let mut note = String::new();
        if config.pool_threads != old.config.pool_threads
            || config.pool_queue != old.config.pool_queue
        {
            note.push_str("; [pool] changes need a restart");
        }
        if config.keyring != old.config.keyring {
            note.push_str("; a new keyring file logs everyone out");
        }
        let loaded = load_policy(config, self.inner.workers)?;
        let rules = loaded.policy.rule_names().len();
        let realms = loaded.config.realms.len();
        self.inner.loaded.store(Arc::new(loaded));
        self.inner.keyring.store(Arc::new(keyring));
        Ok(format!(
            "gate: config, {rules} policy rules, {realms} realms and keys re-read{note}"
        ))
    }

    /// Re-reads the key file when rotation is due (rotating it, under a file lock so nodes
    /// sharing the file rotate once) or when another node has rotated it.
    fn refresh_keys(&self, last_seen: &mut Option<SystemTime>) {
        let loaded = self.inner.loaded.load();
        let path = &loaded.config.keyring;
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let due = unix_now() >= self.inner.keyring.load().next_rotation();
        if !due && modified == *last_seen {
            return;
        }
        match open_keyring(&loaded.config) {
            Ok(k) => {
                if due {
                    tracing::info!(
                        "gate: signing keys rotated (current key {})",
                        k.current_kid()
                    );
                }
                self.inner.keyring.store(Arc::new(k));
                *last_seen = std::fs::metadata(path).and_then(|m| m.modified()).ok();
            }
            Err(e) => tracing::error!("gate: keys not refreshed: {e}"),
        }
    }

    /// Adds the gate's threads to `server`: the check pool, and a key watcher that rotates
    /// the keys on schedule and picks up another node's rotation. They start after the
    /// server's sandbox is in place, like every background thread.
    pub fn install(&self, mut server: Server) -> Server {
        for i in 0..self.inner.pool.threads() {
            let pool = self.inner.pool.clone();
            server.background(&format!("gate-check-{i}"), move |stop| {
                pool.thread_loop(|| stop.is_stopped())
            });
        }
        let gate = self.clone();
        server.background("gate-keys", move |stop| {
            let mut last_seen = None;
            gate.refresh_keys(&mut last_seen);
            // Twice a minute is plenty: rotation overlaps by a whole session lifetime. Short
            // sleeps, so a stopping server is not kept waiting.
            let mut next = std::time::Instant::now() + Duration::from_secs(30);
            while !stop.is_stopped() {
                std::thread::sleep(Duration::from_millis(200));
                if std::time::Instant::now() >= next {
                    gate.refresh_keys(&mut last_seen);
                    next += Duration::from_secs(30);
                }
            }
        });
        let gate = self.clone();
        tern_services::metrics::add_metrics_source(move || gate.metrics());
        server
    }

    /// Starts the check pool's threads without a server (tests and benches).
    pub fn spawn_pool(&self) -> Vec<std::thread::JoinHandle<()>> {
        self.inner.pool.spawn_threads()
    }

    /// Everything for /statusz and /metrics.
    pub fn metrics(&self) -> Vec<Metric> {
        let mut out = self.inner.stats.metrics();
        out.push(Metric::gauge(
            "gate_check_queue",
            "login checks waiting for a pool thread",
            self.inner.pool.queued() as f64,
        ));
        out.push(Metric::gauge(
            "gate_checks_running",
            "login checks being run by the pool",
            self.inner.pool.running() as f64,
        ));
        let loaded = self.inner.loaded.load();
        let names = loaded.policy.rule_names();
        for (i, name) in names.iter().enumerate() {
            out.push(
                Metric::counter(
                    "gate_policy_decisions",
                    "requests decided by each policy rule (since the policy was loaded)",
                    loaded.decisions.sum(i),
                )
                .with_label("rule", name.clone()),
            );
        }
        out
    }

    pub(crate) fn stats(&self) -> &Stats {
        &self.inner.stats
    }
}

/// Password files and programs must be there at start (and reload), not discovered missing at
/// the first login.
fn check_files(config: &GateConfig) -> Result<(), String> {
    for realm in &config.realms {
        for checker in &realm.checkers {
            match checker {
                crate::config::CheckerSpec::File(path) => {
                    std::fs::File::open(path).map_err(|e| {
                        format!(
                            "realm {:?}: cannot read {}: {e}",
                            realm.name,
                            path.display()
                        )
                    })?;
                }
                crate::config::CheckerSpec::Exec(program) => {
                    use std::os::unix::fs::PermissionsExt;
                    let meta = std::fs::metadata(program).map_err(|e| {
                        format!("realm {:?}: {}: {e}", realm.name, program.display())
                    })?;
                    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
                        return Err(format!(
                            "realm {:?}: {} is not an executable file",
                            realm.name,
                            program.display()
                        ));
                    }
                }
                crate::config::CheckerSpec::GuestPow => {}
            }
        }
    }
    Ok(())
}

fn open_keyring(config: &GateConfig) -> Result<Keyring, String> {
    // Keys stay usable for a whole session (and a challenge) after they stop being current,
    // so rotation never logs anyone out.
    let rotation = Rotation {
        rotate_every: config.rotate_every,
        keep_for: config.session_lifetime + config.challenge_lifetime + Duration::from_secs(3600),
    };
    Keyring::load_or_create(&config.keyring, &rotation, unix_now())
        .map_err(|e| format!("gate keyring {}: {e}", config.keyring.display()))
}

fn load_policy(config: GateConfig, workers: usize) -> Result<Loaded, String> {
    let realms: Vec<&str> = config.realms.iter().map(|r| r.name.as_str()).collect();
    let policy = match &config.policy {
        Some(path) => Policy::load(path, &realms).map_err(|e| e.to_string())?,
        None => Policy::parse(
            crate::policy::DEFAULT_POLICY,
            Path::new("(built-in default policy)"),
            &realms,
        )
        .map_err(|e| e.to_string())?,
    };
    let decisions = Decisions::new(workers, policy.rule_names().len());
    Ok(Loaded {
        config,
        policy,
        decisions,
    })
}
