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
use tern_sandbox::{Account, Connect, Give, Mode, Paths, Plan};
use tern_server::{Method, Response, Router, UpstreamAddr};

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

impl HardeningArgs {
    /// `user`, `group` and `sandbox` in force: each flag wins over the file's key.
    pub fn in_force(&self, file: Option<&FileHardening>) -> FileHardening {
        FileHardening {
            user: self
                .user
                .clone()
                .or_else(|| file.and_then(|f| f.user.clone())),
            group: self
                .group
                .clone()
                .or_else(|| file.and_then(|f| f.group.clone())),
            sandbox: self.sandbox.or(file.and_then(|f| f.sandbox)),
        }
    }
}

/// This binary, which helper processes re-run (see [`helper_command`]).
pub fn own_binary() -> Result<PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("cannot find tern's own binary: {e}"))
}

/// A helper process started before the sandbox closes (it forbids starting programs): a
/// re-run of this binary (`exe`, from [`own_binary`]) as `tern SUBCOMMAND`, with an empty
/// environment but for `PATH`, in `/`, as `account` (the one tern drops to) when there is one.
pub fn helper_command(
    exe: &Path,
    subcommand: &str,
    account: Option<&Account>,
) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg(subcommand)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .current_dir("/");
    if let Some(a) = account {
        // std drops supplementary groups too when it changes the user as root.
        cmd.uid(a.uid).gid(a.gid);
    }
    cmd
}

/// What a running command still needs from the file system and the network.
#[derive(Debug, Clone, Default)]
pub struct Needs {
    /// Read: served roots, certificates and keys, the config file (see [`Needs::read_file`]).
    pub read: Vec<PathBuf>,
    /// Read and write: the data folder.
    pub write: Vec<PathBuf>,
    /// Rewritten in place, nothing else in their folder: the ticket-key file.
    pub write_files: Vec<PathBuf>,
    /// Create and append only: the access logs' folders (see [`Needs::access_log`]).
    pub log_folders: Vec<PathBuf>,
    /// Made by tern, so given to `--user`: the data folder and its files, key files.
    pub give: Vec<Give>,
    /// The reverse proxy's upstreams (see [`Needs::connect_to`]).
    pub connect: Connect,
}

impl Needs {
    /// A file re-read on reload (config, certificate, key): what [`beside`] grants for it and
    /// for the file it links to, since editors and certbot replace files by renaming a new
    /// one in (a new inode, which a rule for the old file would not cover).
    pub fn read_file(&mut self, path: &Path) {
        self.read.push(beside(path));
        if let Ok(target) = std::fs::canonicalize(path) {
            self.read.push(beside(&target));
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

    /// An access log (the file itself, not a link to it): its folder takes new files, since
    /// `SIGUSR1` creates the file anew after logrotate renamed it, and the file is given to
    /// `--user`. A log directly in a system folder (`/var/log`) is refused at start-up
    /// ([`tern_sandbox::Paths::refuse_system_folders`]): it needs a folder of its own.
    pub fn access_log(&mut self, file: &Path) {
        self.log_folders.push(folder_of(file));
        self.give.push(Give::File(file.to_path_buf()));
    }

    /// An upstream of the reverse proxy: its TCP port, or its Unix socket's folder (an app
    /// makes its socket anew when it restarts, so a rule for the file would not last).
    /// The IPv4 Games' PostgreSQL store (`postgres://…`): its threads reconnect inside the
    /// sandbox, to the database's ports (any host: Landlock rules are by port) or socket folder.
    pub fn connect_to_store(&mut self, url: &str) -> Result<(), String> {
        let (ports, folders) = tern_ipv4_games::store::postgres::endpoints(url)?;
        for port in ports {
            self.connect_to(&UpstreamAddr::Tcp(std::net::SocketAddr::from((
                [127, 0, 0, 1],
                port,
            ))));
        }
        for folder in folders {
            self.connect_to(&UpstreamAddr::Unix(folder.join(".s.PGSQL")));
        }
        Ok(())
    }

    pub fn connect_to(&mut self, upstream: &UpstreamAddr) {
        match upstream {
            UpstreamAddr::Tcp(addr) => {
                if !self.connect.tcp_ports.contains(&addr.port()) {
                    self.connect.tcp_ports.push(addr.port());
                }
            }
            UpstreamAddr::Unix(socket) => self.connect.unix_folders.push(folder_of(socket)),
        }
    }
}

/// Whether the sandbox set up at start-up lets the workers connect to `upstream`.
pub fn can_connect(connect: &Connect, upstream: &UpstreamAddr) -> bool {
    match upstream {
        UpstreamAddr::Tcp(addr) => connect.allows_tcp_port(addr.port()),
        UpstreamAddr::Unix(socket) => connect.allows_unix_socket(socket),
    }
}

/// What the sandbox grants for something read that may be replaced by a rename (a file, a
/// static root): the folder it is in, where its replacement will appear; the thing itself
/// where that folder is a system folder (`/etc`, `/srv`, `/home/alice`: a rule for it would
/// open all of it), where a replacement then needs a restart.
pub fn beside(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match absolute.parent() {
        Some(folder) if !tern_sandbox::is_system_folder(folder) => folder.to_path_buf(),
        _ => absolute,
    }
}

/// The folder a file is in, made absolute (`/` for a file directly in it).
fn folder_of(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    absolute
        .parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf)
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
    let settings = args.in_force(file);
    let (user, group) = (settings.user.as_deref(), settings.group.as_deref());
    if group.is_some() && user.is_none() {
        return Err("`group` needs `user`".into());
    }
    let account = user.map(|u| Account::lookup(u, group)).transpose()?;
    let mode = match settings.sandbox {
        None | Some(SandboxArg::Auto) => Mode::Auto,
        Some(SandboxArg::On) => Mode::On,
        Some(SandboxArg::Off) => Mode::Off,
    };
    let mut read = needs.read;
    // The executable itself, read only: a panic's backtrace is symbolized from its debug
    // info when it happens (`panic_log.rs`), which means opening the file.
    if let Ok(exe) = std::env::current_exe() {
        read.push(exe);
    }
    let paths = Paths {
        read,
        write: needs.write,
        write_files: needs.write_files,
        log_folders: needs.log_folders,
        connect: needs.connect,
    };
    // Here too, not only at lockdown: before anything is bound.
    if mode != Mode::Off {
        paths.refuse_system_folders()?;
    }
    Ok(Plan {
        mode,
        paths,
        account,
        give_to_account: needs.give,
    })
}

/// The step for [`tern_server::Server::after_bind`]: lockdown, then one log line naming the
/// protections in force and the sockets' backend (whose io_uring rings were made and
/// restricted before this step).
pub fn lockdown_step(plan: Plan) -> impl FnOnce(&str) -> io::Result<()> {
    move |backend| {
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
            tracing::info!("protections: {}; sockets: {backend}", applied.describe());
        } else {
            tracing::warn!("protections: {}; sockets: {backend}", applied.describe());
        }
        Ok(())
    }
}

/// The start error's line: a lockdown failure as it is, a backend that cannot be set up
/// (`--io uring`) with what refused it, anything else as a bind error.
pub fn start_error(e: &io::Error) -> String {
    let inner = e.get_ref();
    if let Some(lockdown) = inner.and_then(|i| i.downcast_ref::<LockdownError>()) {
        return lockdown.0.clone();
    }
    if let Some(backend) = inner.and_then(|i| i.downcast_ref::<tern_runtime::BackendUnavailable>())
    {
        return format!("cannot use {backend} (--io auto falls back to epoll)");
    }
    format!("cannot listen on {e}")
}

/// A reload error, with a hint when the sandbox is why a new path cannot be opened.
pub fn explain_reload_error(e: String) -> String {
    if e.contains("Permission denied") && tern_sandbox::landlock::is_active() {
        format!("{e} (the sandbox allows only the paths given at start-up: restart tern to use a new one)")
    } else {
        e
    }
}

/// Test-only routes (debug builds, `--sandbox-probes`) that try what the sandbox forbids and
/// answer `ok` or the error, each under `/.tern-test/sandbox/`: `open?PATH` opens a file,
/// `exec` calls execve on a path that does not exist, `connect?ADDR` and `connect-unix?PATH`
/// connect, `fast-open?ADDR` connects with TCP Fast Open (`sendto(MSG_FASTOPEN)`), and
/// `openat2-setuid?PATH` creates a setuid file with `openat2`.
pub fn probe_routes(router: Router) -> Router {
    type Probe = fn(&str) -> io::Result<()>;
    let probes: [(&str, Probe); 7] = [
        ("open", probe_open),
        ("exec", probe_exec),
        ("connect", |addr| {
            let addr = parse_addr(addr)?;
            std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).map(drop)
        }),
        ("connect-unix", |path| {
            std::os::unix::net::UnixStream::connect(path).map(drop)
        }),
        ("fast-open", probe_fast_open),
        ("openat2-setuid", probe_openat2_setuid),
        // A new io_uring (a worker's was made before lockdown).
        ("io-uring", |_| {
            tern_runtime::io::UringIo::prepare(1).map(drop)
        }),
    ];
    probes.into_iter().fold(router, |router, (name, probe)| {
        router.route(
            Method::Get,
            &format!("/.tern-test/sandbox/{name}"),
            move |req: &tern_server::Request<'_>, _: &mut tern_server::HandlerContext<'_>| {
                let body = match probe(req.query().unwrap_or("")) {
                    Ok(()) => "ok\n".to_string(),
                    Err(e) => format!("error: {e}\n"),
                };
                Response::new(200)
                    .with_header("Content-Type", "text/plain")
                    .with_body(tern_server::Body::Owned(body.into_bytes()))
                    .into()
            },
        )
    })
}

fn parse_addr(addr: &str) -> io::Result<std::net::SocketAddr> {
    addr.parse()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{addr}: {e}")))
}

fn probe_open(path: &str) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    // Never blocks on a fifo, never becomes a controlling terminal.
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map(drop)
}

fn probe_exec(_: &str) -> io::Result<()> {
    // A path that does not exist: without the sandbox this fails with ENOENT (and can never
    // replace the server), with it seccomp answers EPERM first.
    let path = c"/nonexistent/tern-sandbox-probe";
    let argv = [path.as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null()];
    // SAFETY: NUL-terminated path and argument/environment arrays that live across the call;
    // execve returns only on failure, as it must here.
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    Err(io::Error::last_os_error())
}

/// `sendto(MSG_FASTOPEN)` on a new IPv4 socket: a connect without `connect`.
fn probe_fast_open(addr: &str) -> io::Result<()> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let std::net::SocketAddr::V4(addr) = parse_addr(addr)? else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "IPv4 only"));
    };
    // SAFETY: socket has no memory arguments; the descriptor is owned (closed) below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: all-zero is a valid sockaddr_in; the fields are filled in below.
    let mut to: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    to.sin_family = libc::AF_INET as libc::sa_family_t;
    to.sin_port = addr.port().to_be();
    to.sin_addr.s_addr = u32::from(*addr.ip()).to_be();
    // SAFETY: one byte from a static buffer, to an address struct that lives across the
    // call, with its exact size.
    let sent = unsafe {
        libc::sendto(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            b"x".as_ptr().cast(),
            1,
            libc::MSG_FASTOPEN,
            (&to as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `openat2(PATH, O_CREAT, 04755)`: a setuid file, if anything lets it through.
fn probe_openat2_setuid(path: &str) -> io::Result<()> {
    let path = std::ffi::CString::new(path)?;
    // SAFETY: open_how is a plain C struct of three u64s; all-zero is a valid value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC) as u64;
    how.mode = 0o4755;
    // SAFETY: a valid C string and a live open_how of the size passed, both outliving the
    // call, which only reads them; a returned descriptor is closed at once.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: closes the descriptor openat2 just returned.
    unsafe { libc::close(fd as libc::c_int) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file in a folder of its own is granted with its folder (a replacement renamed in is
    /// seen); one directly in a system folder alone, never all of `/etc` or `/srv`.
    #[test]
    fn reading_a_file_or_root_never_opens_a_system_folder() {
        assert_eq!(
            beside(Path::new("/etc/tern/tern.toml")),
            PathBuf::from("/etc/tern")
        );
        assert_eq!(
            beside(Path::new("/etc/tern.toml")),
            PathBuf::from("/etc/tern.toml")
        );
        assert_eq!(beside(Path::new("/srv/www")), PathBuf::from("/srv/www"));
        assert_eq!(
            beside(Path::new("/srv/www/current")),
            PathBuf::from("/srv/www")
        );
        assert_eq!(
            beside(Path::new("/etc/ssl/private/site.key")),
            PathBuf::from("/etc/ssl/private/site.key")
        );
        let mut needs = Needs::default();
        needs.read_file(Path::new("/etc/hostname"));
        assert!(
            needs.read.iter().all(|p| p != Path::new("/etc")),
            "{:?}",
            needs.read
        );
    }

    #[test]
    fn upstreams_give_their_ports_and_socket_folders() {
        let mut needs = Needs::default();
        for upstream in [
            UpstreamAddr::Tcp("127.0.0.1:3000".parse().unwrap()),
            UpstreamAddr::Tcp("[::1]:3000".parse().unwrap()),
            UpstreamAddr::Unix("/run/wiki/wiki.sock".into()),
        ] {
            needs.connect_to(&upstream);
        }
        assert_eq!(needs.connect.tcp_ports, [3000]);
        assert_eq!(needs.connect.unix_folders, [PathBuf::from("/run/wiki")]);
        let moved = UpstreamAddr::Tcp("127.0.0.1:3001".parse().unwrap());
        assert!(!can_connect(&needs.connect, &moved));
        let docker = UpstreamAddr::Unix("/run/docker.sock".into());
        assert!(!can_connect(&needs.connect, &docker));
    }
}
