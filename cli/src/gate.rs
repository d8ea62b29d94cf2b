//! `tern gate --config gate.toml`: the auth gateway as nginx's `auth_request` backend; and
//! `--gate FILE` of `tern serve` and `tern demo`, which put the same gate in front of their
//! routes with no extra hop.

use std::path::PathBuf;

use clap::Args;
use tern_gate::{Gate, Mode};
use tern_server::{Router, Server};

use crate::common::{
    open_access_log, run_server_with_reload, CommonArgs, OnReload, ReloadTrigger, ServerReload,
};
use crate::hardening::{self, FileHardening, HardeningArgs, Needs, SandboxArg};

#[derive(Args)]
pub struct GateArgs {
    /// The gate's config file (`examples/gate.toml` explains every key); re-read on SIGHUP.
    #[arg(long, value_name = "FILE", required_unless_present = "hash_password")]
    config: Option<PathBuf>,
    /// Read a password from stdin and print `USER:HASH` (argon2id) for a `file:` checker,
    /// then exit.
    #[arg(long, value_name = "USER")]
    hash_password: Option<String>,
    /// Check the config and its policy, print what they hold, and exit.
    #[arg(long)]
    check: bool,
    #[command(flatten)]
    common: CommonArgs,
}

/// Opens the gate of `path` for a server with `workers` workers, adding what it reads and
/// writes to the sandbox's `needs`.
pub fn open(
    path: &std::path::Path,
    mode: Mode,
    workers: usize,
    hardening_args: &HardeningArgs,
    file: Option<&FileHardening>,
    needs: &mut Needs,
) -> Result<Gate, String> {
    let gate = Gate::open(path, mode, workers)?;
    let loaded = gate.config();
    let config = &loaded.config;
    let programs = config.exec_programs();
    let settings = hardening_args.in_force(file);
    if !programs.is_empty() && settings.sandbox != Some(SandboxArg::Off) {
        start_exec_helpers(
            &gate,
            programs,
            settings.user.as_deref(),
            settings.group.as_deref(),
        )?;
    }
    needs.read_file(path);
    for file in config.files_read() {
        needs.read_file(&file);
    }
    for file in loaded.policy.cidr_files() {
        needs.read_file(file);
    }
    // The key file is rewritten in place when keys rotate, by the account tern runs as.
    needs.write_files.push(config.keyring.clone());
    needs
        .give
        .push(tern_sandbox::Give::File(config.keyring.clone()));
    drop(loaded);
    Ok(gate)
}

/// The sandbox forbids starting programs, so `exec:` checkers run in helper processes
/// started now, before it (one per check thread), as the account tern will drop to. They
/// are re-runs of this binary (`tern gate-exec-helper PROGRAM...`) with an empty
/// environment, and run only the programs named here.
fn start_exec_helpers(
    gate: &Gate,
    programs: Vec<PathBuf>,
    user: Option<&str>,
    group: Option<&str>,
) -> Result<(), String> {
    let account = user
        .map(|u| tern_sandbox::Account::lookup(u, group))
        .transpose()?;
    let exe = hardening::own_binary()?;
    let helpers = tern_gate::checkers::ExecHelpers::start(programs, gate.pool_threads(), || {
        hardening::helper_command(&exe, "gate-exec-helper", account.as_ref())
    })
    .map_err(|e| format!("cannot start the gate's exec helpers: {e}"))?;
    gate.use_exec_helpers(helpers);
    Ok(())
}

/// The guard of `--gate FILE` (serve, demo) or `gate = FILE` (run), if one is given.
pub fn open_guard(
    path: Option<&std::path::Path>,
    workers: usize,
    hardening_args: &HardeningArgs,
    file: Option<&FileHardening>,
    needs: &mut Needs,
) -> Result<Option<Gate>, String> {
    path.map(|p| open(p, Mode::Guard, workers, hardening_args, file, needs))
        .transpose()
}

/// Re-reads the gate guarding a server's routes, logging the outcome in a line of its own
/// (the server's reload goes on either way).
pub fn reload(gate: &Gate, trigger: ReloadTrigger) {
    match gate.reload() {
        Ok(what) => tracing::info!("reload ({trigger}): {what}"),
        Err(e) => tracing::error!(
            "reload ({trigger}): gate unchanged: {}",
            hardening::explain_reload_error(e)
        ),
    }
}

pub fn gate(args: GateArgs) -> Result<(), String> {
    if let Some(user) = &args.hash_password {
        return hash_password(user);
    }
    let path = args.config.clone().unwrap_or_default();
    let mut config = args.common.server_config();
    let workers = config.runtime.workers;
    if args.check {
        let (gate, rules) = Gate::check(&path)?;
        println!(
            "gate config {} is valid: {} realm(s), {rules} policy rule(s), keys in {}",
            path.display(),
            gate.realms.len(),
            gate.keyring.display()
        );
        return Ok(());
    }
    let mut needs = Needs::default();
    let gate = open(
        &path,
        Mode::AuthRequest,
        workers,
        &args.common.hardening,
        None,
        &mut needs,
    )?;
    crate::service::adopt_inherited_sockets(&mut config)?;
    let access_log = args
        .common
        .access_log
        .as_deref()
        .map(|path| {
            open_access_log(
                path,
                args.common.access_log_format.unwrap_or_default(),
                &mut needs,
            )
        })
        .transpose()?;
    let lockdown = hardening::plan(&args.common.hardening, None, needs)?;
    let mut router: Router = gate.auth_router();
    if args.common.hardening.probes() {
        router = hardening::probe_routes(router);
    }
    let server = Server::new(config, router).after_bind(hardening::lockdown_step(lockdown));
    let mut server = gate.install(server);
    if let Some(log) = access_log {
        server = server.with_access_log(log);
    }
    let reloading = gate.clone();
    // The gate is all this server has to reload.
    let on_reload: OnReload = Box::new(move |_: ServerReload<'_>, _| reloading.reload());
    run_server_with_reload(
        server,
        &format!("gate ({})", path.display()),
        on_reload,
        None,
        None,
    )
}

/// `--hash-password USER`: one line for an htpasswd-style file, argon2id with the crate's
/// recommended parameters and a random salt.
fn hash_password(user: &str) -> Result<(), String> {
    if !tern_gate::checkers::valid_user(user) {
        return Err(format!(
            "{user:?} cannot be a user name (1 to 64 characters, no ':', not starting with '-')"
        ));
    }
    let mut password = String::new();
    std::io::stdin()
        .read_line(&mut password)
        .map_err(|e| format!("cannot read the password from stdin: {e}"))?;
    let password = password.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        return Err("no password on stdin".into());
    }
    let hash = tern_gate::checkers::hash_password(password)?;
    println!("{user}:{hash}");
    Ok(())
}
