//! `tern serve DIR`: a static file server.

use std::path::PathBuf;

use clap::Args;
use tern_server::static_files::{StaticFiles, StaticOptions};
use tern_server::Router;

use crate::common::{run, CommonArgs};

#[derive(Args)]
pub struct ServeArgs {
    /// The directory to serve.
    dir: PathBuf,
    #[command(flatten)]
    common: CommonArgs,
    /// Serve files and directories whose name starts with a dot.
    #[arg(long)]
    serve_dotfiles: bool,
    /// Value of the Cache-Control header on file responses, e.g. "public, max-age=60".
    #[arg(long, value_name = "VALUE")]
    cache_control: Option<String>,
    /// Files up to this many bytes are held in memory with gzip and brotli variants.
    #[arg(long, value_name = "BYTES", default_value_t = 64 * 1024)]
    max_cached_size: u64,
}

pub fn serve(args: ServeArgs) -> Result<(), String> {
    let files = StaticFiles::new(StaticOptions {
        root: args.dir.clone(),
        serve_dotfiles: args.serve_dotfiles,
        cache_control: args.cache_control.clone(),
        max_cached_size: args.max_cached_size,
        index_file: "index.html".into(),
    })
    .map_err(|e| format!("cannot serve {}: {e}", args.dir.display()))?;
    let config = args.common.server_config();
    let root = std::fs::canonicalize(&args.dir).unwrap_or(args.dir);
    run(
        config,
        Router::new().fallback(files),
        &format!("serving {}", root.display()),
    )
}
