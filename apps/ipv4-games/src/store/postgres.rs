//! The PostgreSQL store: several tern nodes play one game on one database.
//!
//! Each node keeps the whole state in memory (`Land`) for reads, as with the journal; the
//! durability point is PostgreSQL. Workers hand each turn's claims to the `pg-writer` thread
//! through a bounded queue (full: 503 at once; workers never wait and never run tokio). The
//! writer sends everything queued meanwhile as one transaction: an upsert of the whole group
//! (`unnest` arrays, deduplicated by address; the refresh rule in its `WHERE`) whose changed
//! rows are appended to `claim_log` by the same statement, then answers the group after the
//! commit. A connection lost mid-commit leaves the outcome unknown: those claims get a 503,
//! and the log says later what happened.
//!
//! Memory follows the log, never the writer: the `pg-follower` thread of every node (its own
//! connection) polls `claim_log` every `poll` and applies rows in log order, its own node's
//! included. Claim transactions take one transaction-level advisory lock before writing, so
//! they commit one at a time, in the order of their transaction ids: a cursor on
//! `(xid, id)` that reads only below `pg_snapshot_xmin` (every transaction under it has
//! ended) can never skip a row committed late, and every node applies changes to one address
//! in the order PostgreSQL made them. The price is that claim transactions of all nodes
//! queue on that lock; a group is one short statement, so the lock is held for one
//! statement and the commit's flush.
//!
//! The client is `postgres` (rust-postgres, synchronous, its own current-thread tokio runtime
//! inside the two threads that use it). Every connection (the writer's, the follower's,
//! their reconnects, `--check`) is made from one [`Database`], settled at start-up: TLS as
//! the URL's `sslmode` and `sslrootcert` say (`postgres_tls`), names resolved.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};

use super::postgres_tls::{self, Tls};
use tern_server::{Pending, Response, Server, StopSignal};
use tern_services::handoff::Refused;
use tern_services::metrics::Metric;
use tern_services::{handoff, HandoffReceiver, HandoffSender};

use super::{ClaimStore, Refusal, Staged};
use crate::land::{Claim, Land, RECENT_LEN};

/// Schema versions this tern knows; a database with a higher one was set up by a newer tern.
/// 1: `land`, `claim_log`. 2: `tern_save_claims`, a group's whole transaction in one call.
const SCHEMA_VERSION: i32 = 2;
/// `pg_advisory_xact_lock` keys: schema changes, and claim transactions (see the module doc).
const MIGRATE_LOCK: i64 = 0x7465_726e_0001;
const CLAIM_LOCK: i64 = 0x7465_726e_0002;
/// A group whose transaction has run this long means the database is stalled (a lock, a
/// long query, a slow disk): new claims are refused at once instead of queueing behind it.
const STALLED: Duration = Duration::from_secs(1);
/// Claims that waited this long in the writer's queue are refused when it gets to them:
/// with the statement timeout (5 s) this bounds how long any claim waits for its answer.
const MAX_QUEUED: Duration = Duration::from_secs(2);
/// Log rows older than this are deleted (a node always starts from `land`, so only running
/// nodes read the log, and they are never that far behind).
const LOG_KEEP: &str = "1 hour";

/// Settings of the PostgreSQL store.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// `postgres://user@host:port/db?sslmode=verify-full&sslrootcert=/etc/ca.pem` (any URL
    /// rust-postgres accepts, plus libpq's `sslmode` values and `sslrootcert`).
    pub url: String,
    /// Turns' claims that may wait for the writer; beyond it claims are answered 503.
    pub queue: usize,
    /// How often other nodes' claims are looked for.
    pub poll: Duration,
    /// Most addresses held (checked against this node's memory).
    pub max_claims: u64,
}

/// One worker turn's claims, and when they were queued.
type Turn = (Instant, Vec<Staged>);

pub struct PgStore {
    options: PgOptions,
    database: Database,
    turns: HandoffSender<Turn>,
    receiver: Mutex<Option<HandoffReceiver<Turn>>>,
    /// The writer cannot reach the database: claims are answered 503 at once.
    down: AtomicBool,
    /// When the writer's current transaction started, in milliseconds since `epoch` (0:
    /// none running); read by the workers to refuse claims while the database is stalled.
    saving_since: AtomicU64,
    epoch: Instant,
    /// Where the follower goes on: (xid as text, id).
    cursor: Mutex<(String, i64)>,
    /// The writer's and the follower's first connections, made at start-up (before the
    /// sandbox closes; later ones are allowed to the database's ports only).
    first_clients: Mutex<Option<(Writer, Client)>>,
    stats: Stats,
}

#[derive(Default)]
struct Stats {
    saved: AtomicU64,
    groups: AtomicU64,
    changes: AtomicU64,
    refused_busy: AtomicU64,
    refused_down: AtomicU64,
    refused_stalled: AtomicU64,
    refused_full: AtomicU64,
    unknown_outcome: AtomicU64,
    commit_nanos: AtomicU64,
    followed: AtomicU64,
    follow_lag_nanos: AtomicU64,
    reconnects: AtomicU64,
    bootstrap_nanos: AtomicU64,
    bootstrapped: AtomicU64,
}

/// An error with the database's own message when there is one, else with its causes
/// (rust-postgres's `Display` says only "db error", "error performing TLS handshake").
fn describe(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return format!("{}: {}", db.severity(), db.message());
    }
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        if let Some(hint) = c
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .and_then(certificate_hint)
        {
            text = format!("{text} ({hint})");
        }
        cause = c.source();
    }
    text
}

/// What a refused server certificate means, where rustls says it in its own terms.
fn certificate_hint(e: &rustls::Error) -> Option<&'static str> {
    match e {
        rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer) => {
            Some("the server's certificate is not issued by a CA of sslrootcert")
        }
        _ => None,
    }
}

/// What the sandbox must let tern connect to for `url`: TCP ports, and folders of Unix
/// sockets (a `host=/run/postgresql` URL).
/// Also checks the URL's TLS parameters (no file is read here).
pub fn endpoints(url: &str) -> Result<(Vec<u16>, Vec<std::path::PathBuf>), String> {
    let params = postgres_tls::split_url(url)?;
    postgres_tls::check(&params)?;
    let config: postgres::Config = params
        .url
        .parse()
        .map_err(|e| format!("bad PostgreSQL URL {:?}: {e}", redact(url)))?;
    let ports = config.get_ports();
    let mut tcp = Vec::new();
    let mut unix = Vec::new();
    for (i, host) in config.get_hosts().iter().enumerate() {
        let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        match host {
            postgres::config::Host::Tcp(_) => tcp.push(port),
            postgres::config::Host::Unix(dir) => unix.push(dir.clone()),
        }
    }
    if config.get_hosts().is_empty() {
        tcp.push(ports.first().copied().unwrap_or(5432));
    }
    Ok((tcp, unix))
}

/// Where and how every connection is made, settled once at start-up: names resolved and root
/// certificates read now, because reconnects happen inside the sandbox, which allows neither
/// DNS lookups nor reading files (a database that moves to another address needs a restart
/// of tern, or a stable address such as a virtual IP). A URL without a password takes
/// `PGPASSWORD` from the environment, as libpq does: a password on the command line would be
/// visible to every user in `ps`. Statement and lock timeouts turn a stuck database into
/// errors (503s) instead of claims waiting without end.
#[derive(Clone)]
pub struct Database {
    config: postgres::Config,
    tls: Tls,
    /// The URL without its password, for messages.
    shown: String,
}

impl Database {
    pub fn open(url: &str) -> Result<Database, String> {
        let shown = redact(url);
        let params = postgres_tls::split_url(url)?;
        let mut config: postgres::Config = params
            .url
            .parse()
            .map_err(|e| format!("bad PostgreSQL URL {shown:?}: {e}"))?;
        if config.get_password().is_none() {
            if let Some(password) = std::env::var_os("PGPASSWORD") {
                config.password(password.as_encoded_bytes());
            }
        }
        // A URL's own `hostaddr` says where to connect without a lookup.
        if config.get_hostaddrs().is_empty() {
            let mut addrs = Vec::new();
            for host in config.get_hosts() {
                if let postgres::config::Host::Tcp(name) = host {
                    let ip = match name.parse::<std::net::IpAddr>() {
                        Ok(ip) => ip,
                        Err(_) => std::net::ToSocketAddrs::to_socket_addrs(&(name.as_str(), 0))
                            .map_err(|e| format!("cannot resolve the PostgreSQL host {name}: {e}"))?
                            .next()
                            .ok_or_else(|| format!("the PostgreSQL host {name} has no address"))?
                            .ip(),
                    };
                    addrs.push(ip);
                }
            }
            for ip in addrs {
                config.hostaddr(ip);
            }
        }
        let unix_only = !config.get_hosts().is_empty()
            && config.get_hostaddrs().is_empty()
            && config
                .get_hosts()
                .iter()
                .all(|h| !matches!(h, postgres::config::Host::Tcp(_)));
        let tls = postgres_tls::settle(&params, &postgres_tls::Env::process(), unix_only)?;
        config
            .ssl_mode(tls.mode)
            .connect_timeout(Duration::from_secs(5))
            .options(
                "-c statement_timeout=5000 -c lock_timeout=5000 -c client_min_messages=warning",
            )
            .application_name("tern");
        Ok(Database { config, tls, shown })
    }

    pub fn connect(&self) -> Result<Client, String> {
        let connected = match &self.tls.connector {
            None => self.config.connect(NoTls),
            Some(tls) => self.config.connect(tls.clone()),
        };
        let connected = match connected {
            // `prefer` goes plain when the handshake fails, as libpq does (the server said it
            // speaks TLS, but not in a way rustls accepts: an old protocol version, no
            // common cipher suite). rust-postgres only says so in its message.
            Err(e)
                if self.tls.mode == postgres::config::SslMode::Prefer
                    && e.to_string() == "error performing TLS handshake" =>
            {
                tracing::warn!(
                    "the TLS handshake with PostgreSQL failed ({}); sslmode=prefer: connecting \
                     without TLS",
                    describe(&e)
                );
                let mut plain = self.config.clone();
                plain.ssl_mode(postgres::config::SslMode::Disable);
                plain.connect(NoTls)
            }
            other => other,
        };
        connected.map_err(|e| format!("cannot connect to {}: {}", self.shown, describe(&e)))
    }

    /// How TLS is set up, e.g. "verify-full: chain and host name checked against FILE".
    pub fn tls_summary(&self) -> &str {
        &self.tls.summary
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// Creates or checks the schema, once per database whatever the number of nodes starting
/// at once (a transaction-level advisory lock orders them).
pub fn migrate(client: &mut Client) -> Result<(), String> {
    let fail = |e: postgres::Error| format!("setting up the schema failed: {}", describe(&e));
    let mut tx = client.transaction().map_err(fail)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
        .map_err(fail)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS tern_schema (version integer NOT NULL)")
        .map_err(fail)?;
    let version: Option<i32> = tx
        .query_one("SELECT max(version) FROM tern_schema", &[])
        .map_err(fail)?
        .get(0);
    let version = version.unwrap_or(0);
    if version > SCHEMA_VERSION {
        return Err(format!(
            "the database's schema is version {version}, set up by a newer tern (this one \
             knows up to {SCHEMA_VERSION}): run the newer tern"
        ));
    }
    if version < 1 {
        tx.batch_execute(
            "CREATE TABLE land (
                 ip bigint PRIMARY KEY,
                 nick text NOT NULL,
                 created bigint NOT NULL
             );
             CREATE TABLE claim_log (
                 id bigserial PRIMARY KEY,
                 xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
                 at timestamptz NOT NULL DEFAULT now(),
                 ip bigint NOT NULL,
                 nick text NOT NULL,
                 created bigint NOT NULL
             );
             CREATE INDEX claim_log_order ON claim_log (xid, id);
             CREATE INDEX claim_log_at ON claim_log (at);
             INSERT INTO tern_schema VALUES (1);",
        )
        .map_err(fail)?;
    }
    if version < 2 {
        tx.batch_execute(&save_function()).map_err(fail)?;
        tx.batch_execute("INSERT INTO tern_schema VALUES (2)")
            .map_err(fail)?;
    }
    tx.commit().map_err(fail)
}

/// `tern_save_claims(ips, nicks, created)`: one group's transaction, so that the writer
/// sends one statement per group (run as an implicit transaction: it commits before the
/// answer, one round trip) instead of BEGIN, lock, upsert and COMMIT. It takes the claim
/// lock (see the module doc), upserts the group (the refresh rule in the `WHERE`) and
/// appends the changed rows to `claim_log`; returns how many changed. Parameters are
/// prefixed: PL/pgSQL would read a bare `created` as the parameter, not the column.
fn save_function() -> String {
    format!(
        "CREATE OR REPLACE FUNCTION tern_save_claims(p_ips int8[], p_nicks text[], p_created int8[])
         RETURNS bigint LANGUAGE plpgsql AS $fn$
         DECLARE
             n bigint;
         BEGIN
             PERFORM pg_advisory_xact_lock({CLAIM_LOCK});
             WITH input AS (
                 SELECT * FROM unnest(p_ips, p_nicks, p_created) AS t(ip, nick, created)
             ), changed AS (
                 INSERT INTO land AS l (ip, nick, created)
                 SELECT input.ip, input.nick, input.created FROM input
                 ON CONFLICT (ip) DO UPDATE SET nick = excluded.nick, created = excluded.created
                 WHERE l.nick <> excluded.nick OR l.created < excluded.created - 3600
                 RETURNING l.ip, l.nick, l.created
             )
             INSERT INTO claim_log (ip, nick, created)
             SELECT changed.ip, changed.nick, changed.created FROM changed;
             GET DIAGNOSTICS n = ROW_COUNT;
             RETURN n;
         END
         $fn$"
    )
}

/// `tern demo --store URL --check`: connects, sets up or checks the schema, and says what
/// the database holds.
pub fn check(url: &str) -> Result<String, String> {
    let database = Database::open(url)?;
    let mut client = database.connect()?;
    migrate(&mut client)?;
    let fail = |e: postgres::Error| format!("reading the database failed: {}", describe(&e));
    let claims: i64 = client
        .query_one("SELECT count(*) FROM land", &[])
        .map_err(fail)?
        .get(0);
    let server: String = client
        .query_one("SHOW server_version", &[])
        .map_err(fail)?
        .get(0);
    let sync: String = client
        .query_one("SHOW synchronous_commit", &[])
        .map_err(fail)?
        .get(0);
    let encryption: Option<String> = client
        .query_one(
            "SELECT CASE WHEN ssl THEN version || ' ' || cipher END FROM pg_stat_ssl \
             WHERE pid = pg_backend_pid()",
            &[],
        )
        .map_err(fail)?
        .get(0);
    Ok(format!(
        "{}: PostgreSQL {server}, schema version {SCHEMA_VERSION}, {claims} claimed addresses, \
         synchronous_commit = {sync}, connection {}, sslmode={}",
        redact(url),
        encryption.as_deref().unwrap_or("not encrypted"),
        database.tls_summary()
    ))
}

impl PgStore {
    /// Connects, sets up the schema and loads the current state into `land`. Any failure
    /// here is a start-up error (one line).
    pub fn open(options: PgOptions, land: &Land) -> Result<PgStore, String> {
        let started = Instant::now();
        let database = Database::open(&options.url)?;
        let mut client = database.connect()?;
        migrate(&mut client)?;
        let (cursor, loaded) = bootstrap(&mut client, land)?;
        let writer = Writer::new(client)?;
        let follower_client = database.connect()?;
        let stats = Stats::default();
        stats.bootstrapped.store(loaded, Ordering::Relaxed);
        stats
            .bootstrap_nanos
            .store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        tracing::info!(
            addresses = loaded,
            ms = started.elapsed().as_millis() as u64,
            tls = database.tls_summary(),
            "IPv4 Games state loaded from PostgreSQL"
        );
        let (turns, receiver) = handoff(options.queue.max(1));
        Ok(PgStore {
            options,
            database,
            turns,
            receiver: Mutex::new(Some(receiver)),
            down: AtomicBool::new(false),
            saving_since: AtomicU64::new(0),
            epoch: Instant::now(),
            cursor: Mutex::new(cursor),
            first_clients: Mutex::new(Some((writer, follower_client))),
            stats,
        })
    }

    /// The writer thread: one transaction per group of turns, answered after its commit.
    fn run_writer(&self, rx: HandoffReceiver<Turn>, first: Writer, stop: StopSignal) {
        let mut writer = Some(first);
        let mut turns = Vec::new();
        let mut backoff = Duration::from_millis(100);
        let mut retry_at = Instant::now();
        let mut last_used = Instant::now();
        loop {
            // While the database is away, claims are refused at once (`commit`), so this
            // thread tries to reconnect on its own, with backoff, not only when claims come.
            if writer.as_ref().is_none_or(|w| w.client.is_closed()) && Instant::now() >= retry_at {
                writer = None;
                match Writer::connect(&self.database) {
                    Ok(w) => {
                        writer = Some(w);
                        backoff = Duration::from_millis(100);
                        if self.down.swap(false, Ordering::AcqRel) {
                            self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!("PostgreSQL is reachable again; claims are saved");
                        }
                    }
                    Err(e) => {
                        if !self.down.swap(true, Ordering::AcqRel) {
                            tracing::error!("{e}; claims are answered 503 until it is back");
                        }
                        retry_at = Instant::now() + backoff;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            }
            turns.clear();
            let wait = if writer.is_some() {
                Duration::from_millis(100)
            } else {
                retry_at
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(10))
            };
            match rx.recv_batch(&mut turns, 256, wait) {
                None => return,
                Some(0) if stop.is_stopped() => return,
                Some(0) => continue,
                Some(_) => {}
            }
            let mut claims = Vec::new();
            let mut late = Vec::new();
            for (queued, turn) in turns.drain(..) {
                if queued.elapsed() > MAX_QUEUED {
                    late.extend(turn);
                } else {
                    claims.extend(turn);
                }
            }
            if !late.is_empty() {
                self.refuse(late, Refusal::WriteFailed, &self.stats.refused_stalled);
            }
            if claims.is_empty() {
                continue;
            }
            // A connection idle for a while may have died unnoticed (a database restart):
            // check it before trusting claims to it, rather than fail them.
            if last_used.elapsed() > Duration::from_secs(1)
                && writer
                    .as_mut()
                    .is_some_and(|w| w.client.is_valid(Duration::from_secs(1)).is_err())
            {
                writer = Writer::connect(&self.database).ok();
                if writer.is_some() {
                    self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                }
            }
            let Some(w) = writer.as_mut() else {
                self.refuse(claims, Refusal::WriteFailed, &self.stats.refused_down);
                continue;
            };
            last_used = Instant::now();
            let started = Instant::now();
            self.saving_since.store(
                (started - self.epoch).as_millis() as u64 + 1,
                Ordering::Release,
            );
            let saved = save(w, &claims);
            self.saving_since.store(0, Ordering::Release);
            match saved {
                Ok(changed) => {
                    self.stats
                        .commit_nanos
                        .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    self.stats.groups.fetch_add(1, Ordering::Relaxed);
                    self.stats.changes.fetch_add(changed, Ordering::Relaxed);
                    self.stats
                        .saved
                        .fetch_add(claims.len() as u64, Ordering::Relaxed);
                    tern_server::complete_all(claims.into_iter().map(Staged::saved));
                }
                Err(e) => {
                    // Committed or not, nobody can say: not acknowledged. The follower reads
                    // what happened from the log.
                    tracing::error!(
                        claims = claims.len(),
                        "saving claims in PostgreSQL failed: {}; answered 503",
                        describe(&e)
                    );
                    if w.client.is_closed() {
                        writer = None;
                        if !self.down.swap(true, Ordering::AcqRel) {
                            tracing::error!(
                                "lost the connection to PostgreSQL; claims are answered 503 until it is back"
                            );
                        }
                        retry_at = Instant::now();
                    }
                    self.refuse(claims, Refusal::WriteFailed, &self.stats.unknown_outcome);
                }
            }
        }
    }

    fn refuse(&self, claims: Vec<Staged>, why: Refusal, counter: &AtomicU64) {
        counter.fetch_add(claims.len() as u64, Ordering::Relaxed);
        tern_server::complete_all(claims.into_iter().map(|c| c.refused(why)));
    }

    /// The follower thread: applies every node's changes, in the log's order.
    fn run_follower(&self, land: Arc<Land>, client: Client, stop: StopSignal) {
        let mut client = Some(client);
        let mut last_prune = Instant::now();
        while !stop.is_stopped() {
            if client.as_ref().is_none_or(|c| c.is_closed()) {
                client = self.database.connect().ok();
                if client.is_none() {
                    std::thread::sleep(Duration::from_millis(500));
                    continue;
                }
            }
            let c = client.as_mut().expect("connected above");
            let mut cursor = lock(&self.cursor).clone();
            match follow(c, &land, &mut cursor) {
                Ok((n, lag)) => {
                    *lock(&self.cursor) = cursor;
                    if n > 0 {
                        self.stats.followed.fetch_add(n, Ordering::Relaxed);
                        self.stats.follow_lag_nanos.store(lag, Ordering::Relaxed);
                    }
                    if n as usize == FOLLOW_BATCH {
                        continue; // more waiting
                    }
                }
                Err(e) => {
                    tracing::warn!("following the claim log failed: {}", describe(&e));
                    client = None;
                }
            }
            if last_prune.elapsed() > Duration::from_secs(60) {
                last_prune = Instant::now();
                if let Some(c) = client.as_mut() {
                    let sql =
                        format!("DELETE FROM claim_log WHERE at < now() - interval '{LOG_KEEP}'");
                    if let Err(e) = c.batch_execute(&sql) {
                        tracing::warn!("pruning the claim log failed: {}", describe(&e));
                    }
                }
            }
            std::thread::sleep(self.options.poll);
        }
    }
}

/// Rows read per poll at most.
const FOLLOW_BATCH: usize = 10_000;

/// The writer's connection and its prepared statement.
struct Writer {
    client: Client,
    save: postgres::Statement,
}

impl Writer {
    fn connect(database: &Database) -> Result<Writer, String> {
        Writer::new(database.connect()?)
    }

    fn new(mut client: Client) -> Result<Writer, String> {
        let save = client
            .prepare("SELECT tern_save_claims($1, $2, $3)")
            .map_err(|e| format!("preparing the claim statement failed: {}", describe(&e)))?;
        Ok(Writer { client, save })
    }
}

/// Saves one group in one transaction (one statement, one round trip); returns how many
/// claims changed something. The call returns once PostgreSQL said ReadyForQuery, after
/// the implicit transaction's commit; an error at commit is an error here.
fn save(writer: &mut Writer, claims: &[Staged]) -> Result<u64, postgres::Error> {
    // ON CONFLICT may not meet one address twice in a statement: the last claim of an
    // address in the group stands for it (the earlier ones are answered as if made and
    // replaced at once, which they were).
    let mut last: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    for (i, c) in claims.iter().enumerate() {
        last.insert(c.ip, i);
    }
    let mut picked: Vec<usize> = last.into_values().collect();
    picked.sort_unstable();
    let ips: Vec<i64> = picked.iter().map(|&i| claims[i].ip as i64).collect();
    let nicks: Vec<&str> = picked.iter().map(|&i| claims[i].nick.as_str()).collect();
    let created: Vec<i64> = picked.iter().map(|&i| claims[i].at as i64).collect();
    let row = writer
        .client
        .query_one(&writer.save, &[&ips, &nicks, &created])?;
    Ok(row.get::<_, i64>(0).max(0) as u64)
}

/// Loads `land` from the database in one snapshot; returns the log cursor to follow from
/// and the addresses loaded. Log rows the snapshot already holds may be applied again
/// after it: in log order that ends in the same state.
fn bootstrap(client: &mut Client, land: &Land) -> Result<((String, i64), u64), String> {
    let fail =
        |e: postgres::Error| format!("loading the game from PostgreSQL failed: {}", describe(&e));
    let mut tx = client
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(fail)?;
    // Reading every address takes longer than the statement timeout the claims run under
    // (about 0.7 s per million).
    tx.batch_execute("SET LOCAL statement_timeout = 0")
        .map_err(fail)?;
    let xmin: String = tx
        .query_one("SELECT pg_snapshot_xmin(pg_current_snapshot())::text", &[])
        .map_err(fail)?
        .get(0);
    let mut n = 0u64;
    {
        let params: [&(dyn postgres::types::ToSql + Sync); 0] = [];
        let mut rows = tx
            .query_raw("SELECT ip, nick, created FROM land", params)
            .map_err(fail)?;
        use postgres::fallible_iterator::FallibleIterator;
        while let Some(row) = rows.next().map_err(fail)? {
            let ip: i64 = row.get(0);
            let nick: &str = row.get(1);
            let created: i64 = row.get(2);
            land.load(ip as u32, nick, created.max(0) as u64);
            n += 1;
        }
    }
    let recent: Vec<Claim> = tx
        .query(
            "SELECT ip, nick, created FROM claim_log ORDER BY xid DESC, id DESC LIMIT $1",
            &[&(RECENT_LEN as i64)],
        )
        .map_err(fail)?
        .iter()
        .map(|r| Claim {
            ip: r.get::<_, i64>(0) as u32,
            nick: r.get(1),
            created: r.get::<_, i64>(2).max(0) as u64,
        })
        .collect();
    land.set_recent(recent);
    tx.commit().map_err(fail)?;
    Ok(((xmin, 0), n))
}

/// Applies the log rows after `cursor` that no running transaction can still precede;
/// returns how many, and how old the newest was (nanoseconds).
fn follow(
    client: &mut Client,
    land: &Land,
    cursor: &mut (String, i64),
) -> Result<(u64, u64), postgres::Error> {
    let rows = client.query(
        "SELECT xid::text, id, ip, nick, created,
                (extract(epoch FROM clock_timestamp() - at) * 1e9)::int8
         FROM claim_log
         WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
           AND (xid, id) > ($1::text::xid8, $2)
         ORDER BY xid, id
         LIMIT $3",
        &[&cursor.0, &cursor.1, &(FOLLOW_BATCH as i64)],
    )?;
    let mut lag = 0;
    for r in &rows {
        let ip: i64 = r.get(2);
        let nick: &str = r.get(3);
        let created: i64 = r.get(4);
        land.apply(ip as u32, nick, created.max(0) as u64);
        lag = r.get::<_, i64>(5).max(0) as u64;
    }
    if let Some(r) = rows.last() {
        *cursor = (r.get(0), r.get(1));
    }
    Ok((rows.len() as u64, lag))
}

impl PgStore {
    /// How long the writer's current transaction has run (zero: none is running).
    fn saving_for(&self) -> Duration {
        match self.saving_since.load(Ordering::Acquire) {
            0 => Duration::ZERO,
            since => self
                .epoch
                .elapsed()
                .saturating_sub(Duration::from_millis(since - 1)),
        }
    }
}

impl ClaimStore for PgStore {
    fn commit(
        &self,
        land: &Land,
        claims: &mut Vec<Staged>,
        answers: &mut Vec<(Pending, Response)>,
    ) {
        if self.down.load(Ordering::Acquire) {
            self.stats
                .refused_down
                .fetch_add(claims.len() as u64, Ordering::Relaxed);
            answers.extend(claims.drain(..).map(|c| c.refused(Refusal::WriteFailed)));
            return;
        }
        if land.claimed() >= self.options.max_claims {
            // Only held addresses may still change hands.
            let (held, new): (Vec<Staged>, Vec<Staged>) =
                claims.drain(..).partition(|c| land.holder(c.ip).is_some());
            self.stats
                .refused_full
                .fetch_add(new.len() as u64, Ordering::Relaxed);
            answers.extend(new.into_iter().map(|c| c.refused(Refusal::Full)));
            claims.extend(held);
            if claims.is_empty() {
                return;
            }
        }
        if self.saving_for() > STALLED {
            self.stats
                .refused_stalled
                .fetch_add(claims.len() as u64, Ordering::Relaxed);
            answers.extend(claims.drain(..).map(|c| c.refused(Refusal::WriteFailed)));
            return;
        }
        match self.turns.offer((Instant::now(), std::mem::take(claims))) {
            Ok(()) => {}
            Err(Refused::Full((_, back))) | Err(Refused::Closed((_, back))) => {
                self.stats
                    .refused_busy
                    .fetch_add(back.len() as u64, Ordering::Relaxed);
                answers.extend(back.into_iter().map(|c| c.refused(Refusal::WriteFailed)));
            }
        }
    }

    fn start(self: Arc<Self>, server: &mut Server, land: Arc<Land>) {
        let rx = lock(&self.receiver)
            .take()
            .expect("the PostgreSQL store is started once");
        let (writer, follower) = lock(&self.first_clients)
            .take()
            .expect("the PostgreSQL store is started once");
        let store = self.clone();
        server.background("pg-writer", move |stop| store.run_writer(rx, writer, stop));
        server.background("pg-follower", move |stop| {
            self.run_follower(land, follower, stop)
        });
    }

    fn metrics(&self, out: &mut Vec<Metric>) {
        let s = &self.stats;
        let (get, seconds) = (super::count, super::seconds);
        metrics_table! { out;
            counter "claims_saved" "claims answered 200 once committed in PostgreSQL" = get(&s.saved);
            counter "pg_groups" "claim transactions committed" = get(&s.groups);
            counter "claims_changed" "claims that changed an address's holder or time" = get(&s.changes);
            counter "claims_refused_busy" "claims refused because the writer's queue was full" = get(&s.refused_busy);
            counter "claims_refused_down" "claims refused while PostgreSQL was unreachable" = get(&s.refused_down);
            counter "claims_refused_stalled" "claims refused while a claim transaction had run over a second, or after waiting over two seconds for one" = get(&s.refused_stalled);
            counter "claims_refused_full" "claims of new addresses refused at --max-claims" = get(&s.refused_full);
            counter "claims_outcome_unknown" "claims refused because their commit failed or its outcome is unknown" = get(&s.unknown_outcome);
            counter "claims_followed" "claim log rows applied to this node's state" = get(&s.followed);
            counter "pg_reconnects" "times the writer reconnected after losing PostgreSQL" = get(&s.reconnects);
            seconds "pg_commit_seconds_total" "time spent saving claim groups" = seconds(&s.commit_nanos);
            gauge "pg_follow_lag_seconds" "age of the newest claim log row when this node applied it" = seconds(&s.follow_lag_nanos);
            gauge "pg_down" "1 while the writer cannot reach PostgreSQL" = self.down.load(Ordering::Relaxed) as u8 as f64;
            gauge "pg_transaction_seconds" "how long the claim transaction running now has run (0: none)" = self.saving_for().as_secs_f64();
            gauge "recovered_claims" "addresses loaded from PostgreSQL at start-up" = get(&s.bootstrapped) as f64;
            gauge "recovery_seconds" "time the start-up load took" = seconds(&s.bootstrap_nanos);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_checked_with_the_endpoints_and_kept_out_of_rust_postgres() {
        // The README's failover URL: names for the certificates, addresses for the sandbox.
        let url = "postgres://tern@db1.internal,db2.internal:5433/games?hostaddr=10.0.0.5,10.0.0.6\
                   &target_session_attrs=read-write&sslmode=verify-full&sslrootcert=/etc/ca.pem";
        assert_eq!(endpoints(url).unwrap().0, vec![5432, 5433]);
        let e = endpoints("postgres://tern@h/games?sslmode=verify").unwrap_err();
        assert!(e.contains("sslmode=\"verify\" is not supported"), "{e}");
        // No lookup where the URL gives the addresses; TLS without a root needs no file.
        let database = Database::open(
            "postgres://tern@db1.internal,db2.internal/games?hostaddr=10.0.0.5,10.0.0.6\
             &sslmode=require",
        )
        .unwrap();
        assert_eq!(database.config.get_hostaddrs().len(), 2);
        assert_eq!(
            database.config.get_ssl_mode(),
            postgres::config::SslMode::Require
        );
    }
}
