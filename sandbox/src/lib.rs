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
//!    and the data folders (read-write); no TCP bind or connect; no signals or abstract
//!    sockets outside the process;
//! 3. [`seccomp`]: an allow-list of the system calls a running server makes; any other call
//!    fails with EPERM (like pledge's EPERM mode, not a kill), is counted, and is logged.

pub mod account;
pub mod landlock;
pub mod seccomp;

use std::path::PathBuf;

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

/// What the running server still needs from the file system.
#[derive(Debug, Clone, Default)]
pub struct Paths {
    /// Files and folders it reads: served roots, certificates and keys, its config file.
    pub read: Vec<PathBuf>,
    /// Folders it writes: the game's data folder (database, WAL).
    pub write: Vec<PathBuf>,
    /// Single files it rewrites in place, and nothing else in their folders: ticket keys.
    pub write_files: Vec<PathBuf>,
    /// Outbound connections (the reverse proxy's upstreams): TCP, and Unix stream sockets.
    /// Both false: no socket can be made at all. TCP is not limited to the ports of the
    /// upstreams at start-up, since a reload may move an app to a new port (blue/green
    /// deploys) and Landlock rules cannot be added once in force.
    pub connect_tcp: bool,
    pub connect_unix: bool,
}

impl Paths {
    /// Whether any outbound connection is allowed.
    pub fn connects(&self) -> bool {
        self.connect_tcp || self.connect_unix
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
        landlock::restrict(&plan.paths)
    };
    match landlock {
        Ok(status) => applied.landlock = Some(status),
        Err(e) => degrade(plan.mode, &mut applied, e)?,
    }
    let seccomp = if kernel_lacks("seccomp") {
        Err(seccomp::unsupported(PRETENDED.into()))
    } else {
        seccomp::install(plan.paths.connects())
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
/// makes a debug build behave as if the kernel lacked them. Release builds ignore it, so no
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
