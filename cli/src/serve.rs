//! `tern serve DIR`: a static file server.
//!
//! Settings come from the flags, then `--config FILE`, then the defaults (`config.rs`).
//! `SIGHUP` re-reads the file (if any), re-opens and checks the root, applies what can change
//! while running (root, dotfiles, Cache-Control, cache size, timeouts, limits), drops every
//! cached file, and logs one line; listen address, workers, pinning and shutdown grace need a
//! restart. A bad file or an unusable root changes nothing (and is logged).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Args;
use tern_server::static_files::StaticFiles;
use tern_server::{Handler, HandlerContext, Reply, Request, Router, Server};

use crate::common::{open_access_log, run_server_with_reload, CommonArgs, OnReload, ServerReload};
use crate::config::{self, FileConfig, Flags, Settings};
use crate::hardening::{self, FileHardening, Needs};
use crate::tls::{TlsArgs, TlsPlan};

#[derive(Args)]
#[command(
    override_usage = "tern serve [OPTIONS] <DIR>\n       tern serve [OPTIONS] --config <FILE> [DIR]"
)]
pub struct ServeArgs {
    /// The directory to serve (optional with --config: its `root`).
    #[arg(required_unless_present = "config")]
    dir: Option<PathBuf>,
    /// TOML file with any of the settings below (flags win over it); re-read on SIGHUP.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    tls: TlsArgs,
    #[command(flatten)]
    acme: crate::acme::AcmeArgs,
    /// Serve files and directories whose name starts with a dot.
    #[arg(long)]
    serve_dotfiles: bool,
    /// Value of the Cache-Control header on file responses, e.g. "public, max-age=60".
    #[arg(long, value_name = "VALUE")]
    cache_control: Option<String>,
    /// Files up to this many bytes are held in memory with gzip and brotli variants
    /// [default: 65536].
    #[arg(long, value_name = "BYTES")]
    max_cached_size: Option<u64>,
    /// Put the auth gateway of this config in front of the site (login, proof-of-work
    /// passes, bot policy; see `tern gate`).
    #[arg(long, value_name = "FILE")]
    gate: Option<PathBuf>,
}

impl ServeArgs {
    /// Reads the config file (if any) and resolves every setting, HTTPS included, and the
    /// file's `user`, `group` and `sandbox` (used at start-up only).
    fn settings(&self) -> Result<(Settings, Option<TlsPlan>, bool, FileHardening), String> {
        self.settings_and_acme(false)
            .map(|(s, t, p, h, _)| (s, t, p, h))
    }

    /// [`Self::settings`] and the ACME settings (start-up only: a reload keeps the helper).
    #[allow(clippy::type_complexity)]
    fn settings_and_acme(
        &self,
        with_acme: bool,
    ) -> Result<
        (
            Settings,
            Option<TlsPlan>,
            bool,
            FileHardening,
            Option<tern_acme::AcmeConfig>,
        ),
        String,
    > {
        let file = self.config.as_deref().map(config::load).transpose()?;
        let file_dir = self
            .config
            .as_deref()
            .and_then(Path::parent)
            .unwrap_or(Path::new(""));
        let file_tls = file.as_ref().and_then(FileConfig::tls);
        let mut tls_args = self.tls.clone();
        tls_args.acme = !self.acme.names.is_empty();
        let tls = tls_args.plan(file_tls, file_dir, None)?;
        let plain_given =
            self.common.listen.is_some() || file.as_ref().is_some_and(FileConfig::listen_given);
        let plain_listener = plain_given || tls.as_ref().is_some_and(|t| t.redirect_http.is_some());
        let acme = match with_acme {
            true => crate::acme::resolve(
                &self.acme,
                file_tls.and_then(|t| t.acme()),
                file_dir,
                &[],
                plain_listener,
            )?,
            false => None,
        };
        let flags = Flags {
            dir: self.dir.as_deref(),
            serve_dotfiles: self.serve_dotfiles,
            cache_control: self.cache_control.as_deref(),
            max_cached_size: self.max_cached_size,
            common: &self.common,
        };
        Ok((
            Settings::resolve(&flags, file.as_ref(), file_dir)?,
            tls,
            plain_given,
            file.as_ref().map(FileConfig::hardening).unwrap_or_default(),
            acme,
        ))
    }
}

/// The router's handle on the static files; the signal thread holds another, for reloads.
struct Files(Arc<StaticFiles>);

impl Handler for Files {
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        self.0.handle(req, cx)
    }
}

pub fn serve(args: ServeArgs) -> Result<(), String> {
    let (settings, tls, plain_given, file_hardening, acme) = args.settings_and_acme(true)?;
    // Bans are flags only (not in --config); a reload leaves them as they are.
    let bans = args.common.clone();
    let acceptor = tls.as_ref().map(crate::tls::acceptor).transpose()?;
    let files = StaticFiles::new(settings.static_options())
        .map_err(|e| format!("cannot serve {}: {e}", settings.root.display()))?;
    let files = Arc::new(files);
    let root = std::fs::canonicalize(&settings.root).unwrap_or(settings.root.clone());
    // The root's folder, not just the root: deploys swap a new root in beside the old one
    // (rename, or a `current` link to a new release), and a reload must still reach it.
    let mut needs = Needs {
        read: vec![hardening::beside(&root)],
        ..Needs::default()
    };
    if let Some(config) = &args.config {
        needs.read_file(config);
    }
    if let Some(plan) = &tls {
        needs.add_tls(&plan.options);
    }
    // No trusted proxies here: the client is the socket peer.
    let access_log = settings
        .access_log
        .as_deref()
        .map(|path| open_access_log(path, settings.access_log_format, &mut needs))
        .transpose()?;
    let gate = crate::gate::open_guard(
        args.gate.as_deref(),
        settings.server_config().runtime.workers,
        &args.common.hardening,
        Some(&file_hardening),
        &mut needs,
    )?;
    // Before the sandbox: the helper is a process of its own, and the sandbox forbids
    // starting one. Its receiving loop runs on a server background thread, which starts after
    // the sandbox (that must lock down while tern has one thread).
    let (acme_receiver, acme_loop) = match (&acme, &acceptor) {
        (Some(config), Some(acceptor)) => {
            let (receiver, receive) = crate::acme::start(
                config,
                acceptor.clone(),
                &args.common.hardening,
                Some(&file_hardening),
            )?;
            (Some(receiver), Some(receive))
        }
        _ => (None, None),
    };
    let lockdown = hardening::plan(&args.common.hardening, Some(&file_hardening), needs)?;
    let probes = args.common.hardening.probes();
    let quic_retry_always = args.common.test_quic_retry;
    let mut current = settings.clone();
    let reloader = files.clone();
    let reload_tls = acceptor.clone();
    let reload_gate = gate.clone();
    let on_reload: OnReload = Box::new(move |server: ServerReload<'_>, trigger| {
        if let Some(gate) = &reload_gate {
            crate::gate::reload(gate, trigger);
        }
        if let Some(acme) = &acme_receiver {
            acme.check_now();
        }
        let (applied, changes) = reload(&args, &current, &reloader, reload_tls.as_deref(), server)?;
        current = applied;
        Ok(changes)
    });
    let mut config = settings.server_config();
    config.quic_retry_always = quic_retry_always;
    crate::tls::configure(&mut config, settings.listen, plain_given, tls.as_ref());
    crate::service::adopt_inherited_sockets(&mut config)?;
    let mut router = Router::new().fallback(Files(files));
    if acme.is_some() {
        router = crate::acme::counters_routes(router);
    }
    if probes {
        router = hardening::probe_routes(router);
    }
    if let Some(gate) = &gate {
        router = gate.protect(router);
    }
    let mut server = Server::new(config, router).after_bind(hardening::lockdown_step(lockdown));
    if let Some(gate) = &gate {
        server = gate.install(server);
    }
    let mut server = bans.install_bans(server, &[])?;
    if let Some(receive) = acme_loop {
        crate::acme::install(&mut server, receive);
    }
    if let Some(acceptor) = &acceptor {
        server = server.with_tls(acceptor.clone());
    }
    if let Some(log) = access_log {
        server = server.with_access_log(log);
    }
    run_server_with_reload(
        server,
        &format!("serving {}", root.display()),
        on_reload,
        acceptor.as_deref(),
        None,
    )
}

/// One reload: re-read, check the root, apply. Returns the settings now in force and the
/// description of what changed.
fn reload(
    args: &ServeArgs,
    current: &Settings,
    files: &StaticFiles,
    tls: Option<&tern_server::TlsAcceptor>,
    server: ServerReload<'_>,
) -> Result<(Settings, String), String> {
    let (new, new_tls, _, _) = args.settings()?;
    // Certificates first: a bad one changes nothing at all.
    let tls_note = match (tls, &new_tls) {
        (Some(acceptor), Some(plan)) => {
            acceptor.reload(&plan.options)?;
            "; certificates re-read"
        }
        (Some(_), None) => "; HTTPS settings removed (needs a restart, ignored)",
        (None, Some(_)) => "; HTTPS settings added (needs a restart, ignored)",
        (None, None) => "",
    };
    let applied = current.reloadable_part_of(&new);
    files
        .reload(applied.static_options())
        .map_err(|e| e.to_string())?;
    server(&applied.server_config());
    let mut changes = current.describe_changes(&new);
    if changes.is_empty() {
        changes = "no setting changed".into();
    }
    Ok((
        applied,
        format!("{changes}; cached files dropped{tls_note}"),
    ))
}
