//! `tern demo`: the IPv4 Games, with its journal and snapshots in a local data folder, and
//! `tern demo export`, which writes the game's claims into a SQLite database.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use tern_ipv4_games::{build, bundled_site, GameConfig, SyncMode};
use tern_services::{RateLimitConfig, TrustedProxies};

use std::sync::Arc;

use tern_server::ClientIp;

use crate::common::{open_access_log, run_server, CommonArgs, ReloadHook};
use crate::hardening::{self, Needs};
use crate::tls::TlsArgs;
use tern_sandbox::Give;

#[derive(Clone, Copy, ValueEnum)]
enum Sync {
    /// A claim is in the journal (the kernel's page cache) before it is answered: survives
    /// the process being killed.
    Normal,
    /// A claim is also fdatasynced (one sync for everything written meanwhile) before it is
    /// answered: survives power loss.
    Full,
}

#[derive(Subcommand)]
enum DemoCommand {
    /// Write the game's claims into a new SQLite database (table land(ip, nick, created)),
    /// from the data folder's files; safe beside a running game.
    Export {
        /// The game's data folder.
        #[arg(long, value_name = "DIR", default_value = "data")]
        data: PathBuf,
        /// The database to create (must not exist).
        #[arg(value_name = "FILE")]
        to: PathBuf,
    },
}

#[derive(Args)]
pub struct DemoArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(subcommand)]
    command: Option<DemoCommand>,
    /// Folder for the claim journal and snapshots (created if missing).
    #[arg(long, value_name = "DIR", default_value = "data")]
    data: PathBuf,
    /// The game's pages [default: the pages in the source tree].
    #[arg(long, value_name = "DIR")]
    site: Option<PathBuf>,
    /// Save claims in PostgreSQL instead of the journal in --data: several tern nodes
    /// given the same database play one game (e.g. postgres://tern@db.example/games).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Check the store and exit: for PostgreSQL, connect and set up or check the schema;
    /// for the journal, read the data folder back.
    #[arg(long)]
    check: bool,
    /// How durable a claim is before it is answered (the journal; with --store, PostgreSQL's
    /// synchronous_commit decides).
    #[arg(long, value_enum, default_value = "normal")]
    sync: Sync,
    /// Most addresses held at once; claims of new addresses beyond it are answered 503
    /// [default: half this machine's memory at 64 bytes per address]; names
    /// are limited to a quarter of it.
    #[arg(long, value_name = "N")]
    max_claims: Option<u64>,
    /// Size at which a journal segment is closed and folded into a snapshot.
    #[arg(long, value_name = "MiB", default_value_t = 64)]
    segment_mib: u64,
    /// Test hook (power-cut tests): keep `segment length` of what is synced in FILE.
    #[arg(long, value_name = "FILE", hide = true)]
    test_sync_mark: Option<PathBuf>,
    /// Test hook: wait this long before each sync (--sync full), so claims stay pending.
    #[arg(long, value_name = "MS", hide = true)]
    test_sync_delay_ms: Option<u64>,
    /// Test hook: segment size in bytes, overriding --segment-mib.
    #[arg(long, value_name = "BYTES", hide = true)]
    test_segment_bytes: Option<u64>,
    /// No longer used (claims are saved once per worker turn); accepted so old unit files
    /// still start.
    #[arg(long, value_name = "N", hide = true)]
    batch_max: Option<usize>,
    /// No longer used (there is no writer queue); accepted so old unit files still start.
    #[arg(long, value_name = "N", hide = true)]
    queue: Option<usize>,
    /// Proxies whose X-Forwarded-For / Forwarded headers are believed, e.g. "127.0.0.1,10.0.0.0/8".
    #[arg(long, value_name = "CIDRS", default_value = "")]
    trusted_proxies: String,
    /// Claims per second each /24 (IPv6: /48) may make over time.
    #[arg(long, value_name = "N", default_value_t = 50)]
    rate: u32,
    /// Claims a /24 may make at once after being quiet.
    #[arg(long, value_name = "N", default_value_t = 100)]
    burst: u32,
    /// Networks never rate-limited (loopback never is), e.g. "192.0.2.0/24".
    #[arg(long, value_name = "CIDRS", default_value = "")]
    rate_exempt: String,
    /// Put the auth gateway of this config in front of the game (login, proof-of-work
    /// passes, bot policy; see `tern gate`).
    #[arg(long, value_name = "FILE")]
    gate: Option<PathBuf>,
}

pub fn demo(args: DemoArgs) -> Result<(), String> {
    if let Some(DemoCommand::Export { data, to }) = &args.command {
        let n = tern_ipv4_games::export(data, to)?;
        println!("tern: exported {n} claims to {}", to.display());
        return Ok(());
    }
    if args.check {
        let line = match &args.store {
            Some(url) => tern_ipv4_games::store::postgres::check(url)?,
            None => tern_ipv4_games::check_data(&args.data)?,
        };
        println!("tern: {line}");
        return Ok(());
    }
    if let Some(url) = &args.store {
        if !url.starts_with("postgres://") && !url.starts_with("postgresql://") {
            return Err(format!("--store: {url:?} is not a postgres:// URL"));
        }
    }
    if args.batch_max.is_some() || args.queue.is_some() {
        tracing::warn!(
            "--batch-max and --queue no longer do anything: claims are saved once per worker turn"
        );
    }
    let proxies = TrustedProxies::parse(&args.trusted_proxies)
        .map_err(|e| format!("--trusted-proxies: {e}"))?;
    // A dropped request from behind a trusted proxy must not ban the proxy itself.
    let ban_exempt = TrustedProxies::parse(&args.trusted_proxies)
        .map_err(|e| format!("--trusted-proxies: {e}"))?
        .into_nets();
    let exempt = TrustedProxies::parse(&args.rate_exempt)
        .map_err(|e| format!("--rate-exempt: {e}"))?
        .into_nets();
    let site = args.site.clone().unwrap_or_else(bundled_site);
    let mut game = GameConfig::new(&args.data, &site);
    game.sync = match args.sync {
        Sync::Normal => SyncMode::Normal,
        Sync::Full => SyncMode::Full,
    };
    if let Some(n) = args.max_claims {
        game.max_claims = n;
    }
    game.segment_bytes = args
        .test_segment_bytes
        .unwrap_or(args.segment_mib.max(1) << 20);
    game.sync_mark = args.test_sync_mark.clone();
    game.store = args.store.clone();
    game.test_sync_delay = std::time::Duration::from_millis(args.test_sync_delay_ms.unwrap_or(0));
    game.proxies = proxies;
    game.rate_limit = RateLimitConfig {
        per_second: args.rate,
        burst: args.burst,
        exempt,
        ..RateLimitConfig::default()
    };
    let data = args.data.display().to_string();
    // Ticket keys live beside the database by default, so resumption survives restarts.
    std::fs::create_dir_all(&args.data)
        .map_err(|e| format!("cannot create data dir {data}: {e}"))?;
    let plan = args
        .tls
        .plan(None, Path::new(""), Some(args.data.join("tls-ticket-keys")))?;
    let acceptor = plan.as_ref().map(crate::tls::acceptor).transpose()?;
    let mut config = args.common.server_config();
    let plain = config.runtime.listen[0];
    crate::tls::configure(
        &mut config,
        plain,
        args.common.listen.is_some(),
        plan.as_ref(),
    );
    crate::service::adopt_inherited_sockets(&mut config)?;
    let mut needs = Needs {
        read: vec![site],
        write: vec![args.data.clone()],
        give: vec![Give::Folder {
            path: args.data.clone(),
            made_by_tern: tern_ipv4_games::DATA_FILE_PREFIXES
                .iter()
                .map(|p| p.to_string())
                .chain(["tls-ticket-keys".to_string()])
                .collect(),
        }],
        ..Needs::default()
    };
    if let Some(plan) = &plan {
        needs.add_tls(&plan.options);
    }
    if let Some(url) = &args.store {
        needs.connect_to_store(url)?;
    }
    let access_log = match &args.common.access_log {
        Some(path) => {
            let format = args.common.access_log_format.unwrap_or_default();
            let log = open_access_log(path, format, &mut needs)?;
            // The address the game credits, behind --trusted-proxies.
            let proxies = TrustedProxies::parse(&args.trusted_proxies)
                .map_err(|e| format!("--trusted-proxies: {e}"))?;
            let client_ip: ClientIp = Arc::new(move |peer, head| proxies.client_ip(peer, head));
            Some(log.with_client_ip(client_ip))
        }
        None => None,
    };
    let gate = crate::gate::open_guard(
        args.gate.as_deref(),
        config.runtime.workers,
        &args.common.hardening,
        None,
        &mut needs,
    )?;
    let lockdown = hardening::plan(&args.common.hardening, None, needs)?;
    let mut server = build(config, game)?;
    if args.common.hardening.probes() {
        let router = std::mem::take(server.router_mut());
        *server.router_mut() = hardening::probe_routes(router);
    }
    if let Some(gate) = &gate {
        let router = std::mem::take(server.router_mut());
        *server.router_mut() = gate.protect(router);
        server = gate.install(server);
    }
    let server = server.after_bind(hardening::lockdown_step(lockdown));
    let mut server = args.common.install_bans(server, &ban_exempt)?;
    if let Some(acceptor) = &acceptor {
        server = server.with_tls(acceptor.clone());
    }
    if let Some(log) = access_log {
        server = server.with_access_log(log);
    }
    let tls = acceptor.zip(plan);
    let reload_gate = gate
        .map(|gate| -> ReloadHook { Box::new(move |trigger| crate::gate::reload(&gate, trigger)) });
    run_server(
        server,
        &format!("IPv4 Games (data in {data})"),
        tls,
        reload_gate,
    )
}
