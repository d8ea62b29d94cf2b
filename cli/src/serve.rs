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

use crate::common::{run_server_with_reload, CommonArgs, OnReload, ServerReload};
use crate::config::{self, Flags, Settings};

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
}

impl ServeArgs {
    /// Reads the config file (if any) and resolves every setting.
    fn settings(&self) -> Result<Settings, String> {
        let file = self.config.as_deref().map(config::load).transpose()?;
        let file_dir = self
            .config
            .as_deref()
            .and_then(Path::parent)
            .unwrap_or(Path::new(""));
        let flags = Flags {
            dir: self.dir.as_deref(),
            serve_dotfiles: self.serve_dotfiles,
            cache_control: self.cache_control.as_deref(),
            max_cached_size: self.max_cached_size,
            common: &self.common,
        };
        Settings::resolve(&flags, file.as_ref(), file_dir)
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
    let settings = args.settings()?;
    let files = StaticFiles::new(settings.static_options())
        .map_err(|e| format!("cannot serve {}: {e}", settings.root.display()))?;
    let files = Arc::new(files);
    let root = std::fs::canonicalize(&settings.root).unwrap_or(settings.root.clone());
    let mut current = settings.clone();
    let reloader = files.clone();
    let on_reload: OnReload = Box::new(move |server: ServerReload<'_>| {
        match reload(&args, &current, &reloader, server) {
            Ok((applied, changes)) => {
                current = applied;
                tracing::info!("reload (SIGHUP): {changes}");
            }
            Err(e) => tracing::error!("reload (SIGHUP) failed, nothing changed: {e}"),
        }
    });
    run_server_with_reload(
        Server::new(
            settings.server_config(),
            Router::new().fallback(Files(files)),
        ),
        &format!("serving {}", root.display()),
        on_reload,
    )
}

/// One reload: re-read, check the root, apply. Returns the settings now in force and the
/// description of what changed.
fn reload(
    args: &ServeArgs,
    current: &Settings,
    files: &StaticFiles,
    server: ServerReload<'_>,
) -> Result<(Settings, String), String> {
    let new = args.settings()?;
    let applied = current.reloadable_part_of(&new);
    files
        .reload(applied.static_options())
        .map_err(|e| e.to_string())?;
    server(&applied.server_config());
    let mut changes = current.describe_changes(&new);
    if changes.is_empty() {
        changes = "no setting changed".into();
    }
    Ok((applied, format!("{changes}; cached files dropped")))
}
