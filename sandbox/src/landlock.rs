//! Landlock: what the file system and the network look like from inside the sandbox.
//!
//! Read-only: the paths in [`Paths::read`] (served roots, certificates, config).
//! Read-write without execute: [`Paths::write`] (data folders) and the single files of
//! [`Paths::write_files`] (ticket keys, rewritten in place). (`/proc/self/statm`, for the RSS
//! gauge, is opened before the lockdown and read with `pread`.) No other path can be opened, created, renamed or removed; TCP bind and connect
//! are refused (every listener is bound before); signals and abstract Unix sockets cannot
//! reach outside the process.

use std::sync::atomic::{AtomicBool, Ordering};

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible,
    RestrictionStatus, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::{Error, Paths};

static ACTIVE: AtomicBool = AtomicBool::new(false);

/// True once [`restrict`] has restricted this process (to explain a refused path).
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// The newest ABI this code knows; older kernels get what they support (best effort).
const ABI_WANTED: ABI = ABI::V7;

pub(crate) fn unsupported(why: String) -> Error {
    Error::Unsupported {
        part: "Landlock",
        why,
    }
}

fn read_access() -> BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::ReadDir
}

fn write_access() -> BitFlags<AccessFs> {
    // Everything a database and its WAL need (create, write, truncate, rename, remove),
    // nothing that makes devices, sockets, fifos or links.
    AccessFs::ReadFile
        | AccessFs::ReadDir
        | AccessFs::WriteFile
        | AccessFs::MakeReg
        | AccessFs::MakeDir
        | AccessFs::RemoveFile
        | AccessFs::RemoveDir
        | AccessFs::Truncate
        | AccessFs::Refer
}

/// Restricts the calling thread (and the threads it starts later). Returns how completely.
pub fn restrict(paths: &Paths) -> Result<String, Error> {
    let failed = |e: landlock::RulesetError| Error::Failed {
        part: "Landlock",
        why: e.to_string(),
    };
    let status: RestrictionStatus = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(ABI_WANTED))
        .map_err(failed)?
        .handle_access(if paths.connect_tcp {
            AccessNet::BindTcp.into()
        } else {
            AccessNet::BindTcp | AccessNet::ConnectTcp
        })
        .map_err(failed)?
        .scope(Scope::from_all(ABI_WANTED))
        .map_err(failed)?
        .create()
        .map_err(failed)?
        .add_rules(path_beneath_rules(&paths.read, read_access()))
        .map_err(failed)?
        .add_rules(path_beneath_rules(&paths.write, write_access()))
        .map_err(failed)?
        .add_rules(path_beneath_rules(
            &paths.write_files,
            AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate,
        ))
        .map_err(failed)?
        .restrict_self()
        .map_err(failed)?;
    let enforced = match status.ruleset {
        RulesetStatus::FullyEnforced => "fully enforced",
        RulesetStatus::PartiallyEnforced => "partly enforced: an older kernel",
        RulesetStatus::NotEnforced => "",
    };
    if !enforced.is_empty() {
        ACTIVE.store(true, Ordering::Relaxed);
    }
    match status.ruleset {
        RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(enforced.into()),
        RulesetStatus::NotEnforced => Err(unsupported(
            "not supported or not enabled in this kernel".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    /// In a child process (a ruleset cannot be taken back): reads inside the read paths work,
    /// writes there are refused, the write folder takes new files, and anything else is
    /// EACCES. Skips where the kernel has no Landlock.
    #[test]
    fn in_a_child_only_the_planned_paths_are_reachable() {
        let tmp = tempfile::tempdir().unwrap();
        let (site, data, outside) = (
            tmp.path().join("site"),
            tmp.path().join("data"),
            tmp.path().join("outside"),
        );
        for dir in [&site, &data] {
            std::fs::create_dir(dir).unwrap();
        }
        std::fs::write(site.join("index.html"), "hi").unwrap();
        std::fs::write(&outside, "secret").unwrap();
        let paths = Paths {
            read: vec![site.clone()],
            write: vec![data.clone()],
            write_files: vec![],
            connect_tcp: false,
            connect_unix: false,
        };
        // SAFETY: fork in a test; the child makes system calls and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = match restrict(&paths) {
                Err(Error::Unsupported { .. }) => 99,
                Err(_) => 10,
                Ok(_) => {
                    let denied = |r: std::io::Result<_>| matches!(r, Err(e) if e.kind() == ErrorKind::PermissionDenied);
                    if std::fs::read(site.join("index.html")).ok().as_deref() != Some(&b"hi"[..]) {
                        11
                    } else if !denied(std::fs::write(site.join("new"), "x")) {
                        12
                    } else if std::fs::write(data.join("db"), "x").is_err() {
                        13
                    } else if !denied(std::fs::read(&outside).map(drop)) {
                        14
                    } else if !denied(std::fs::read("/etc/hostname").map(drop)) {
                        16
                    } else {
                        0
                    }
                }
            };
            // SAFETY: ends the child without the harness's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child died: {status}");
        match libc::WEXITSTATUS(status) {
            99 => eprintln!("skipped: no Landlock in this kernel"),
            code => assert_eq!(code, 0, "failed check {code}"),
        }
    }
}
