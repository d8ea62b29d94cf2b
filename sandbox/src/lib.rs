//! tern-sandbox: least privilege once start-up is over.
//!
//! A server binds its ports, reads its certificates and opens its database with whatever
//! privileges it was started with; after that a bug in it should be able to reach as little
//! as possible. [`lockdown`] runs at that moment, on the only thread there is (before the
//! workers start, so every later thread inherits the restrictions):
//!
//! 1. [`account`]: drop to an unprivileged user (setgroups, setgid, setuid; no way back),
//!    after giving that user the files tern created as root;
//! 2. [`landlock`]: the file system shrinks to the served roots and certificates (read-only)
//!    and the data folders (read-write), never a whole system folder ([`is_system_folder`]);
//!    no TCP bind, TCP connects only to the upstreams' ports; no signals or abstract sockets
//!    outside the process;
//! 3. [`seccomp`]: an allow-list of the system calls a running server makes; any other call
//!    fails with EPERM (like pledge's EPERM mode, not a kill), is counted, and is logged.

pub mod account;
pub mod landlock;
pub mod seccomp;

use std::path::{Component, Path, PathBuf};

pub use account::{Account, Give};
pub use seccomp::{denied_syscalls, report_denials};

/// Why a protection could not be put in place.
#[derive(Debug)]
pub enum Error {
    /// The kernel lacks it (or it is disabled): `--sandbox auto` goes on without it.
    Unsupported {
        part: &'static str,
        why: String,
    },
    Failed {
        part: &'static str,
        why: String,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Unsupported { part, why } | Error::Failed { part, why } => {
                write!(f, "{part}: {why}")
            }
        }
    }
}

/// Whether to sandbox (`--sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Sandbox where the kernel supports it; say so where it does not.
    #[default]
    Auto,
    /// Sandbox, or refuse to start.
    On,
    Off,
}

/// What the running server still needs from the file system and the network.
#[derive(Debug, Clone, Default)]
pub struct Paths {
    /// Files and folders it reads: served roots, certificates and keys, its config file.
    pub read: Vec<PathBuf>,
    /// Folders it writes: the game's data folder (database, WAL).
    pub write: Vec<PathBuf>,
    /// Single files it rewrites in place, and nothing else in their folders: ticket keys.
    pub write_files: Vec<PathBuf>,
    /// Folders it creates files in and appends to, nothing else: access logs (`SIGUSR1`
    /// creates the file anew after logrotate renamed it).
    pub log_folders: Vec<PathBuf>,
    /// Outbound connections: the reverse proxy's upstreams.
    pub connect: Connect,
}

/// Where the running server connects: the reverse proxy's upstreams. Fixed at start-up, since
/// Landlock rules cannot be added once in force (a reload that needs more is refused).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Connect {
    /// TCP ports, on any host (Landlock rules are by port alone). Empty: seccomp refuses IPv4
    /// and IPv6 sockets.
    pub tcp_ports: Vec<u16>,
    /// Folders of the Unix sockets. Empty: seccomp refuses Unix sockets. Landlock (ABI 9)
    /// limits Unix connects to beneath them, unless one is a system folder (`/run` for
    /// `/run/app.sock`), which it never opens whole: then it does not limit them.
    pub unix_folders: Vec<PathBuf>,
}

impl Connect {
    /// Whether any outbound connection is allowed.
    pub fn any(&self) -> bool {
        self.tcp() || self.unix()
    }

    pub fn tcp(&self) -> bool {
        !self.tcp_ports.is_empty()
    }

    pub fn unix(&self) -> bool {
        !self.unix_folders.is_empty()
    }

    pub fn allows_tcp_port(&self, port: u16) -> bool {
        self.tcp_ports.contains(&port)
    }

    /// Whether a Unix socket is beneath one of the folders (as Landlock sees it: links
    /// resolved).
    pub fn allows_unix_socket(&self, socket: &Path) -> bool {
        let Some(folder) = socket.parent() else {
            return false;
        };
        let folder = resolved(folder);
        self.unix_folders
            .iter()
            .any(|f| folder.starts_with(resolved(f)))
    }
}

/// `path` with its links resolved where it exists, else made absolute.
fn resolved(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// Folders that many programs share, each holding far more than one server needs, which the
/// sandbox never opens whole: `/`, every folder directly in it (`/etc`, `/var`, `/usr`,
/// `/home`, `/tmp`, `/srv`, `/run`, ...), every folder directly in `/home`, `/usr`, `/var`,
/// `/dev`, `/proc` and `/sys` (`/home/alice`, `/var/log`, `/var/lib`, `/usr/share`, ...),
/// `/run/user` and the folders in it, and the system's key and certificate stores. Links are
/// resolved first (`/var/run` is `/run`); a file is no folder.
pub fn is_system_folder(path: &Path) -> bool {
    const SHARED_PARENTS: &[&str] = &["home", "usr", "var", "dev", "proc", "sys"];
    const KEY_STORES: &[&str] = &[
        "/etc/ssl",
        "/etc/ssl/certs",
        "/etc/ssl/private",
        "/etc/pki",
        "/etc/pki/tls",
        "/etc/pki/tls/certs",
        "/etc/pki/tls/private",
        "/etc/letsencrypt",
        "/etc/letsencrypt/live",
        "/etc/letsencrypt/archive",
    ];
    let path = resolved(path);
    if path.exists() && !path.is_dir() {
        return false;
    }
    let names: Vec<&str> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name.to_str().unwrap_or("")),
            _ => None,
        })
        .collect();
    let shared = match names.as_slice() {
        [] | [_] | ["run", "user"] | ["run", "user", _] => true,
        [parent, _] => SHARED_PARENTS.contains(parent),
        _ => false,
    };
    shared || KEY_STORES.iter().any(|store| path == Path::new(store))
}

impl Paths {
    /// Refuses a plan that would open a system folder whole (one line for the start-up
    /// error): a folder of its own, or `--sandbox off`, is the way out.
    pub fn refuse_system_folders(&self) -> Result<(), String> {
        let lists: [(&[PathBuf], &str); 3] = [
            (&self.read, "the folder to read"),
            (&self.write, "the folder to write"),
            (&self.log_folders, "the access log's folder"),
        ];
        for (paths, what) in lists {
            if let Some(path) = paths.iter().find(|p| is_system_folder(p)) {
                return Err(format!(
                    "cannot sandbox: {what} {} is a system folder, which the sandbox never opens whole: use a folder of its own, or --sandbox off",
                    path.display()
                ));
            }
        }
        Ok(())
    }
}

/// Everything [`lockdown`] does, decided before it runs.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub mode: Mode,
    pub paths: Paths,
    /// Drop to this account (`--user`/`--group`).
    pub account: Option<Account>,
    /// What tern created as root that the account must own, so that it can still write it:
    /// the data folder and its files, ticket-key files.
    pub give_to_account: Vec<Give>,
}

/// The protections in force, for the start-up log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    pub user: Option<String>,
    pub landlock: Option<String>,
    pub seccomp: bool,
    /// Why a protection is missing (kernel support), when the mode is `Auto`.
    pub missing: Vec<String>,
}

impl Applied {
    /// One line: what protects this process.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(user) = &self.user {
            parts.push(format!("running as {user}"));
        }
        if let Some(landlock) = &self.landlock {
            parts.push(format!("Landlock ({landlock})"));
        }
        if self.seccomp {
            parts.push("seccomp allow-list (other system calls fail with EPERM)".to_string());
        }
        let mut line = if parts.is_empty() {
            "no sandbox".to_string()
        } else {
            parts.join("; ")
        };
        if !self.missing.is_empty() {
            line.push_str(&format!("; without {}", self.missing.join(", ")));
        }
        line
    }
}

/// Drops privileges and applies the sandbox the plan asks for. Must run before any thread
/// other than the caller exists: setuid and Landlock act on the calling thread, and threads
/// started later inherit both. Errors are one line for the start-up message.
pub fn lockdown(plan: &Plan) -> Result<Applied, String> {
    if plan.mode != Mode::Off {
        plan.paths.refuse_system_folders()?;
    }
    if plan.mode != Mode::Off || plan.account.is_some() {
        let threads = account::thread_count();
        if threads > 1 {
            return Err(format!(
                "cannot sandbox: {threads} threads already run (it must happen before the workers start)"
            ));
        }
    }
    let mut applied = Applied::default();
    if let Some(account) = &plan.account {
        account.give(&plan.give_to_account)?;
        account.become_it()?;
        applied.user = Some(account.to_string());
    }
    if plan.mode == Mode::Off {
        return Ok(applied);
    }
    let landlock = if kernel_lacks("landlock") {
        Err(landlock::unsupported(PRETENDED.into()))
    } else {
        landlock::restrict(&plan.paths, kernel_lacks("landlock-tcp"))
    };
    match landlock {
        Ok(restricted) => {
            applied.landlock = Some(restricted.status);
            // Older Landlock ABIs: weaker, said in the start-up line, never a refusal (as
            // with a partly enforced ruleset).
            applied.missing.extend(restricted.lacking);
        }
        Err(e) => degrade(plan.mode, &mut applied, e)?,
    }
    let seccomp = if kernel_lacks("seccomp") {
        Err(seccomp::unsupported(PRETENDED.into()))
    } else {
        seccomp::install(&plan.paths.connect)
    };
    match seccomp {
        Ok(()) => applied.seccomp = true,
        Err(e) => degrade(plan.mode, &mut applied, e)?,
    }
    Ok(applied)
}

/// A protection that could not be applied: noted under `auto` when the kernel lacks it,
/// else the start-up error.
fn degrade(mode: Mode, applied: &mut Applied, e: Error) -> Result<(), String> {
    match e {
        Error::Unsupported { part, why } if mode == Mode::Auto => {
            applied.missing.push(format!("{part} ({why})"));
            Ok(())
        }
        e @ Error::Unsupported { .. } => Err(format!("cannot sandbox (--sandbox on): {e}")),
        e => Err(format!("cannot sandbox: {e}")),
    }
}

const PRETENDED: &str = "not in this kernel (TERN_TEST_KERNEL_WITHOUT)";

/// For tests of the start-up on older kernels: `TERN_TEST_KERNEL_WITHOUT=landlock,seccomp`
/// makes a debug build behave as if the kernel lacked them (`landlock-tcp`: Landlock before
/// ABI 4, without TCP rules). Release builds ignore it, so no
/// environment can switch a production sandbox off.
fn kernel_lacks(feature: &str) -> bool {
    cfg!(debug_assertions)
        && std::env::var("TERN_TEST_KERNEL_WITHOUT")
            .is_ok_and(|v| v.split(',').any(|f| f == feature))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_folders_are_the_shared_ones_not_a_folder_of_ones_own() {
        for shared in [
            "/",
            "/etc",
            "/var",
            "/usr",
            "/home",
            "/root",
            "/tmp",
            "/srv",
            "/var/log",
            "/var/lib",
            "/usr/share",
            "/home/alice",
            "/run/user",
            "/run/user/1000",
            "/etc/ssl/private",
            "/etc/letsencrypt/live",
            "/var/run",
        ] {
            assert!(is_system_folder(Path::new(shared)), "{shared}");
        }
        for own in [
            "/etc/tern",
            "/var/log/tern",
            "/var/lib/tern",
            "/srv/www",
            "/home/alice/site",
            "/etc/letsencrypt/live/example.com",
            "/run/app",
        ] {
            assert!(!is_system_folder(Path::new(own)), "{own}");
        }
        // A file is no folder, wherever it is.
        assert!(!is_system_folder(Path::new("/etc/hostname")));
    }

    #[test]
    fn a_plan_that_opens_a_system_folder_whole_is_refused_in_one_line() {
        let logs_in_var_log = Paths {
            log_folders: vec!["/var/log".into()],
            ..Paths::default()
        };
        assert_eq!(
            logs_in_var_log.refuse_system_folders(),
            Err("cannot sandbox: the access log's folder /var/log is a system folder, which the sandbox never opens whole: use a folder of its own, or --sandbox off".into())
        );
        let serving_etc = Paths {
            read: vec!["/srv/www".into(), "/etc".into()],
            ..Paths::default()
        };
        assert!(serving_etc
            .refuse_system_folders()
            .is_err_and(|e| e.contains("the folder to read /etc is a system folder")));
        let own = Paths {
            read: vec!["/etc/tern".into(), "/etc/hostname".into()],
            write: vec!["/var/lib/tern".into()],
            log_folders: vec!["/var/log/tern".into()],
            ..Paths::default()
        };
        assert_eq!(own.refuse_system_folders(), Ok(()));
    }

    #[test]
    fn a_unix_socket_is_allowed_beneath_the_folders_and_a_tcp_port_by_number() {
        let connect = Connect {
            tcp_ports: vec![3000],
            unix_folders: vec!["/run/app".into()],
        };
        assert!(connect.allows_tcp_port(3000) && !connect.allows_tcp_port(3001));
        assert!(connect.allows_unix_socket(Path::new("/run/app/app.sock")));
        assert!(connect.allows_unix_socket(Path::new("/run/app/sub/app.sock")));
        assert!(!connect.allows_unix_socket(Path::new("/run/docker.sock")));
        assert!(!connect.allows_unix_socket(Path::new("/run/application.sock")));
    }

    #[test]
    fn the_description_names_each_protection_and_what_is_missing() {
        let applied = Applied {
            user: Some("tern (uid 999, gid 999)".into()),
            landlock: Some("fully enforced".into()),
            seccomp: true,
            missing: vec![],
        };
        assert_eq!(
            applied.describe(),
            "running as tern (uid 999, gid 999); Landlock (fully enforced); seccomp allow-list (other system calls fail with EPERM)"
        );
        let partial = Applied {
            seccomp: true,
            missing: vec!["Landlock (not supported by this kernel)".into()],
            ..Applied::default()
        };
        assert_eq!(
            partial.describe(),
            "seccomp allow-list (other system calls fail with EPERM); without Landlock (not supported by this kernel)"
        );
        assert_eq!(Applied::default().describe(), "no sandbox");
    }
}
