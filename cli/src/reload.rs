//! `tern reload`: asks a running `tern run` to reload through its control socket (`control.rs`)
//! and says how it went. The reload is the one `SIGHUP` runs; unlike a signal, the caller
//! learns its outcome, so `systemctl reload` (the package's `ExecReload=`) fails on a bad
//! config instead of reporting success.

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct ReloadArgs {
    /// The server's control socket (its config's `control`).
    #[arg(long, value_name = "PATH", default_value = crate::control::DEFAULT_PATH)]
    control: PathBuf,
}

/// Prints what changed; an error (exit 1) when nothing did or the server cannot be reached.
pub fn reload(args: ReloadArgs) -> Result<(), String> {
    let changes = crate::control::ask(&args.control, "reload")
        .map_err(|why| format!("reload failed: {why}"))?;
    println!("{changes}");
    Ok(())
}
