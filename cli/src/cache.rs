//! `tern cache purge`: drops entries from a running `tern run`'s caches, through its control
//! socket (`control.rs`), never over the network.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    command: CacheCommand,
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Drop cached answers: those of a URL (each query and variant, or the URL's query only),
    /// those under a prefix, those the app tagged (Cache-Tag, Surrogate-Key), or all.
    Purge(PurgeArgs),
}

#[derive(Args)]
// One of these four (the struct's own group would hold --cache and --control too).
#[group(skip)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["url", "prefix", "tag", "all"])))]
struct PurgeArgs {
    /// The URL whose entries go (http[s]://host/path[?query]; with a query, only that
    /// query's).
    url: Option<String>,
    /// Every entry under this URL's path (https://host/blog/), or under a path on every host
    /// (/blog/).
    #[arg(long, value_name = "URL|PATH")]
    prefix: Option<String>,
    /// Every entry the app tagged so (`Cache-Tag: TAG` or `Surrogate-Key: TAG`).
    #[arg(long)]
    tag: Option<String>,
    /// Every entry.
    #[arg(long)]
    all: bool,
    /// Only this `[cache.NAME]` (default: every cache).
    #[arg(long, value_name = "NAME")]
    cache: Option<String>,
    /// The server's control socket (its config's `control`).
    #[arg(long, value_name = "PATH", default_value = crate::control::DEFAULT_PATH)]
    control: PathBuf,
}

pub fn cache(args: CacheArgs) -> Result<(), String> {
    let CacheCommand::Purge(p) = args.command;
    // The request is one line of words: none may be empty or hold a space or a control byte.
    for word in [&p.url, &p.prefix, &p.tag, &p.cache].into_iter().flatten() {
        if word.is_empty() || word.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "{word:?}: a URL, prefix, tag or cache name is not empty and holds no spaces"
            ));
        }
    }
    let what = match (&p.url, &p.prefix, &p.tag) {
        (Some(url), _, _) => format!("url {url}"),
        (_, Some(prefix), _) => format!("prefix {prefix}"),
        (_, _, Some(tag)) => format!("tag {tag}"),
        _ => "all".to_owned(),
    };
    let line = match &p.cache {
        Some(name) => format!("purge {what} cache {name}"),
        None => format!("purge {what}"),
    };
    let done = crate::control::ask(&p.control, &line)?;
    println!("{done}");
    Ok(())
}
