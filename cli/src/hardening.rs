//! `--user`, `--group` and `--sandbox`: what a server gives up once it has started.
//!
//! Each command says what it still needs from the file system ([`Needs`]); this module turns
//! that and the flags into a [`tern_sandbox::Plan`], checks what can be checked before
//! anything is bound (the account exists), and hands the server the step that drops
//! privileges and enters the sandbox between binding the ports and starting the workers
//! ([`tern_server::Server::after_bind`]).

use std::io;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use serde::Deserialize;
use tern_sandbox::{Account, Give, Mode, Paths, Plan};
use tern_server::{Method, Response, Router};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxArg {
    On,
    Off,
    /// On where the kernel supports it (the default).
    Auto,
}

/// The flags (every server command has them).
#[derive(Args, Debug, Clone, Default)]
pub struct HardeningArgs {
    /// Once the ports are bound and files opened as root, run as this user (setuid; no way
    /// back). Files tern creates (the game's database, key files) are given to it.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// The group to run as with --user [default: the user's own group].
    #[arg(long, value_name = "NAME", requires = "user")]
    pub group: Option<String>,
    /// Landlock and seccomp once started: only the served paths, certificates and data
    /// folder; only the system calls a server makes [default: on where the kernel supports
    /// it; `on` refuses to start without them].
    #[arg(long, value_enum, value_name = "on|off|auto")]
    pub sandbox: Option<SandboxArg>,
    /// For tern's own tests, in debug builds only: routes under /.tern-test/sandbox/ that
    /// try what the sandbox forbids.
    #[cfg(debug_assertions)]
    #[arg(long, hide = true)]
    pub sandbox_probes: bool,
}

impl HardeningArgs {
    /// `--sandbox-probes`, which release builds do not have.
    pub fn probes(&self) -> bool {
        #[cfg(debug_assertions)]
        return self.sandbox_probes;
        #[cfg(not(debug_assertions))]
        false
    }
}

/// The same settings from a config file (`user`, `group`, `sandbox`); flags win.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FileHardening {
    pub user: Option<String>,
    pub group: Option<String>,
    pub sandbox: Option<SandboxArg>,
}

/// What a running command still needs from the file system.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    /// Read: served roots, certificates and keys, the config file (see [`Needs::read_file`]).
    pub read: Vec<PathBuf>,
    /// Read and write: the data folder.
    pub write: Vec<PathBuf>,
    /// Rewritten in place, nothing else in their folder: the ticket-key file.
    pub write_files: Vec<PathBuf>,
    /// Made by tern, so given to `--user`: the data folder and its files, key files.
    pub give: Vec<Give>,
    /// The reverse proxy connects to upstreams over TCP, or Unix sockets.
    pub connect_tcp: bool,
    pub connect_unix: bool,
}

impl Needs {
    /// A file re-read on reload (config, certificate, key): its folder, and the folder of the
    /// file it links to, since editors and certbot replace files by renaming a new one in
    /// (a new inode, which a rule for the old file would not cover).
    pub fn read_file(&mut self, path: &Path) {
        self.read.push(folder_of(path));
        if let Ok(target) = std::fs::canonicalize(path) {
            self.read.push(folder_of(&target));
        }
    }

    /// Certificates, keys and the ticket-key file of an HTTPS plan.
    pub fn add_tls(&mut self, options: &tern_server::TlsOptions) {
        for pair in &options.certs {
            self.read_file(&pair.cert);
            self.read_file(&pair.key);
        }
        if let Some(keys) = &options.ticket_keys {
            self.write_files.push(keys.clone());
            self.give.push(Give::File(keys.clone()));
        }
    }
}

/// The folder a file is in, made absolute; the file itself where that folder would be `/`
/// (never the whole file system).
pub fn folder_of(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match absolute.parent() {
        Some(p) if p.parent().is_some() => p.to_path_buf(),
        _ => absolute,
    }
}

/// The error of the lockdown step, told apart from a bind error by `run_server`.
#[derive(Debug)]
pub struct LockdownError(pub String);

impl std::fmt::Display for LockdownError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LockdownError {}

/// Resolves the plan, looking the account up now, so a typo fails at once.
pub fn plan(
    args: &HardeningArgs,
    file: Option<&FileHardening>,
    needs: Needs,
) -> Result<Plan, String> {
    let empty = FileHardening::default();
    let file = file.unwrap_or(&empty);
    let user = args.user.as_deref().or(file.user.as_deref());
    let group = args.group.as_deref().or(file.group.as_deref());
    if group.is_some() && user.is_none() {
        return Err("`group` needs `user`".into());
    }
    let account = user.map(|u| Account::lookup(u, group)).transpose()?;
    let mode = match args.sandbox.or(file.sandbox) {
        None | Some(SandboxArg::Auto) => Mode::Auto,
        Some(SandboxArg::On) => Mode::On,
        Some(SandboxArg::Off) => Mode::Off,
    };
    Ok(Plan {
        mode,
        paths: Paths {
            read: needs.read,
            write: needs.write,
            write_files: needs.write_files,
            connect_tcp: needs.connect_tcp,
            connect_unix: needs.connect_unix,
        },
        account,
        give_to_account: needs.give,
    })
}

/// The step for [`tern_server::Server::after_bind`]: lockdown, then one log line naming the
/// protections in force.
pub fn lockdown_step(plan: Plan) -> impl FnOnce() -> io::Result<()> {
    move || {
        // Here, not at planning: a start-up error stays the only line a failed start prints.
        if plan.account.is_none() && tern_sandbox::account::running_as_root() {
            tracing::warn!("running as root: give --user NAME to drop privileges after start-up");
        }
        // /proc is outside the sandbox: the RSS gauge opens its file now, reads it later.
        tern_services::metrics::rss_bytes();
        tern_services::metrics::add_process_metrics(vec![|| {
            tern_services::metrics::Metric::counter(
                "sandbox_denied_syscalls",
                "system calls the seccomp sandbox refused with EPERM",
                tern_sandbox::denied_syscalls(),
            )
        }]);
        let applied =
            tern_sandbox::lockdown(&plan).map_err(|e| io::Error::other(LockdownError(e)))?;
        if applied.missing.is_empty() {
            tracing::info!("protections: {}", applied.describe());
        } else {
            tracing::warn!("protections: {}", applied.describe());
        }
        Ok(())
    }
}

/// The start error's line: a lockdown failure as it is, anything else as a bind error.
pub fn start_error(e: &io::Error) -> String {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<LockdownError>())
    {
        Some(lockdown) => lockdown.0.clone(),
        None => format!("cannot listen on {e}"),
    }
}

/// A reload error, with a hint when the sandbox is why a new path cannot be opened.
pub fn explain_reload_error(e: String) -> String {
    if e.contains("Permission denied") && tern_sandbox::landlock::is_active() {
        format!("{e} (the sandbox allows only the paths given at start-up: restart tern to use a new one)")
    } else {
        e
    }
}

/// Test-only routes (debug builds, `--sandbox-probes`) that try what the sandbox forbids and answer what happened:
/// `GET /.tern-test/sandbox/open?PATH` opens a file, `GET /.tern-test/sandbox/exec` calls execve
/// on a path that does not exist. Each answers `ok` or the error.
pub fn probe_routes(router: Router) -> Router {
    fn answer(result: io::Result<()>) -> Response {
        let body = match result {
            Ok(()) => "ok\n".to_string(),
            Err(e) => format!("error: {e}\n"),
        };
        Response::new(200)
            .with_header("Content-Type", "text/plain")
            .with_body(tern_server::Body::Owned(body.into_bytes()))
    }
    router
        .route(
            Method::Get,
            "/.tern-test/sandbox/open",
            |req: &tern_server::Request<'_>, _: &mut tern_server::HandlerContext<'_>| {
                use std::os::unix::fs::OpenOptionsExt;
                let path = req.query().unwrap_or("");
                // Never blocks on a fifo, never becomes a controlling terminal.
                let open = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
                    .open(path);
                answer(open.map(drop)).into()
            },
        )
        .route(
            Method::Get,
            "/.tern-test/sandbox/exec",
            |_: &tern_server::Request<'_>, _: &mut tern_server::HandlerContext<'_>| {
                // A path that does not exist: without the sandbox this fails with ENOENT
                // (and can never replace the server), with it seccomp answers EPERM first.
                let path = c"/nonexistent/tern-sandbox-probe";
                let argv = [path.as_ptr(), std::ptr::null()];
                let envp = [std::ptr::null()];
                // SAFETY: NUL-terminated path and argument/environment arrays that live
                // across the call; execve returns only on failure, as it must here.
                unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
                answer(Err(io::Error::last_os_error())).into()
            },
        )
}
