//! Landlock: what the file system and the network look like from inside the sandbox.
//!
//! Read-only: the paths in [`Paths::read`] (served roots, certificates, config).
//! Read-write without execute: [`Paths::write`] (data folders) and the single files of
//! [`Paths::write_files`] (ticket keys, rewritten in place). Create and append only:
//! [`Paths::log_folders`]. (`/proc/self/statm`, for the RSS gauge, is opened before the
//! lockdown and read with `pread`.) No other path can be opened, created, renamed or removed.
//! TCP bind is refused (every listener is bound before); TCP connect only to the ports of
//! [`Connect::tcp_ports`] (ABI 4, Linux 6.7); connecting to a pathname Unix socket only beneath
//! [`Connect::unix_folders`] (`LANDLOCK_ACCESS_FS_RESOLVE_UNIX`, ABI 9, Linux 7.1: before it,
//! such a connect is checked by no Landlock right, only by the socket file's permissions, and
//! not where a socket's folder is a system folder, which no rule opens whole); signals and
//! abstract Unix sockets cannot reach outside the process (scopes, ABI 6).

use std::sync::atomic::{AtomicBool, Ordering};

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort,
    RestrictionStatus, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};

use crate::{is_system_folder, Connect, Error, Paths};

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

fn log_access() -> BitFlags<AccessFs> {
    // Open with O_APPEND | O_CREAT: no reading, truncating, renaming or removing old logs.
    AccessFs::MakeReg | AccessFs::WriteFile
}

/// What [`restrict`] put in force.
pub struct Restricted {
    /// How completely, for the start-up line.
    pub status: String,
    /// What the plan needs that is not enforced (this kernel's Landlock cannot, or a Unix
    /// socket folder cannot take a rule), one phrase each.
    pub lacking: Vec<String>,
}

/// Restricts the calling thread (and the threads it starts later). `without_tcp_rules`
/// behaves as a kernel before ABI 4 (tests only).
pub fn restrict(paths: &Paths, without_tcp_rules: bool) -> Result<Restricted, Error> {
    let failed = |e: landlock::RulesetError| Error::Failed {
        part: "Landlock",
        why: e.to_string(),
    };
    let connect = &paths.connect;
    let mut fs_access = AccessFs::from_all(ABI_WANTED);
    let unix_rules = unix_rules(connect);
    if !unix_rules.is_empty() {
        // Only with Unix upstreams (seccomp refuses Unix sockets otherwise), so that a kernel
        // before ABI 9 reports "partly enforced" only where it matters.
        fs_access |= AccessFs::ResolveUnix;
    }
    let net_access = if without_tcp_rules {
        BitFlags::EMPTY
    } else {
        AccessNet::BindTcp | AccessNet::ConnectTcp
    };
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(fs_access)
        .map_err(failed)?;
    if !net_access.is_empty() {
        ruleset = ruleset.handle_access(net_access).map_err(failed)?;
    }
    let mut created = ruleset
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
        .add_rules(path_beneath_rules(&paths.log_folders, log_access()))
        .map_err(failed)?
        .add_rules(path_beneath_rules(unix_rules, AccessFs::ResolveUnix))
        .map_err(failed)?;
    if !net_access.is_empty() {
        for &port in &connect.tcp_ports {
            created = created
                .add_rule(NetPort::new(port, AccessNet::ConnectTcp))
                .map_err(failed)?;
        }
    }
    let status: RestrictionStatus = created.restrict_self().map_err(failed)?;
    let enforced = match status.ruleset {
        RulesetStatus::FullyEnforced => "fully enforced",
        RulesetStatus::PartiallyEnforced => "partly enforced: an older kernel",
        RulesetStatus::NotEnforced => "",
    };
    if !enforced.is_empty() {
        ACTIVE.store(true, Ordering::Relaxed);
    }
    match status.ruleset {
        RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => {
            let abi = if without_tcp_rules {
                ABI::V3
            } else {
                ABI::from(status.landlock)
            };
            Ok(Restricted {
                status: enforced.into(),
                lacking: lacking(connect, abi),
            })
        }
        RulesetStatus::NotEnforced => Err(unsupported(why_not_available())),
    }
}

/// Why Landlock is not there, from the errno of the probe the kernel documents for this
/// (`landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)`): the landlock crate
/// only says "not enforced", and a filter that blocks the call looks like a kernel without it.
fn why_not_available() -> String {
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the kernel reads no
    // memory and creates no descriptor; it returns the ABI version or fails with an errno.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    explain_probe(abi, errno)
}

/// `LANDLOCK_CREATE_RULESET_VERSION` (linux/landlock.h).
const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;

fn explain_probe(abi: libc::c_long, errno: i32) -> String {
    if abi >= 0 {
        return format!("the kernel offers ABI {abi}, yet the ruleset was not enforced");
    }
    match errno {
        libc::EPERM => "the landlock_create_ruleset system call is refused (EPERM) by a seccomp \
             filter around tern, e.g. a container's (systemd-nspawn before 256 needs \
             --system-call-filter='landlock_create_ruleset landlock_add_rule \
             landlock_restrict_self'); the kernel itself may support it"
            .into(),
        libc::EOPNOTSUPP => {
            "built into this kernel but disabled at boot (add landlock to the lsm= boot parameter)"
                .into()
        }
        libc::ENOSYS => "not in this kernel (built without CONFIG_SECURITY_LANDLOCK)".into(),
        other => format!(
            "not available ({})",
            std::io::Error::from_raw_os_error(other)
        ),
    }
}

/// The folders Unix connects are limited to: none where [`unix_rules_skipped`] says why not.
fn unix_rules(connect: &Connect) -> &[std::path::PathBuf] {
    if unix_rules_skipped(connect).is_some() {
        &[]
    } else {
        &connect.unix_folders
    }
}

/// Why Unix connects get no Landlock rules although there are Unix upstreams: a socket's
/// folder is a system folder (a rule would open all of it), or it cannot be reached now (a
/// rule needs it; the app may make it later, and a proxy starts before its apps).
fn unix_rules_skipped(connect: &Connect) -> Option<String> {
    connect.unix_folders.iter().find_map(|folder| {
        let folder_shown = folder.display();
        if is_system_folder(folder) {
            Some(format!(
                "a Unix upstream's socket is directly in {folder_shown}, a system folder: give it a folder of its own"
            ))
        } else if !folder.is_dir() {
            Some(format!(
                "the Unix upstream's folder {folder_shown} could not be reached at start-up"
            ))
        } else {
            None
        }
    })
}

/// The connect rules that are not enforced (by a kernel with Landlock `abi`, or for a Unix
/// socket folder that cannot take a rule), for the start-up line.
fn lacking(connect: &Connect, abi: ABI) -> Vec<String> {
    let abi_number = abi as i32;
    let mut lacking = Vec::new();
    if connect.tcp() && abi < ABI::V4 {
        lacking.push(format!(
            "Landlock TCP port rules (kernel ABI {abi_number} < 4: the workers may connect to any TCP port)"
        ));
    }
    if connect.unix() && abi < ABI::V6 {
        lacking.push(format!(
            "Landlock's scope for abstract Unix sockets (kernel ABI {abi_number} < 6: the workers may connect to any abstract socket)"
        ));
    }
    if let Some(why) = unix_rules_skipped(connect) {
        lacking.push(format!("Landlock rules for Unix socket connects ({why})"));
    } else if connect.unix() && abi < ABI::V9 {
        lacking.push(format!(
            "Landlock rules for Unix socket connects (kernel ABI {abi_number} < 9: the workers may connect to any Unix socket their user may write)"
        ));
    }
    lacking
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    fn denied<T>(r: std::io::Result<T>) -> bool {
        matches!(r, Err(e) if e.kind() == ErrorKind::PermissionDenied)
    }

    /// Runs `checks` in a child restricted to `paths` (a ruleset cannot be taken back) and
    /// asserts it returned 0 (else the number of its first failing check). Skips where the
    /// kernel has no Landlock.
    fn in_a_restricted_child(paths: &Paths, checks: impl FnOnce(&Restricted) -> i32) {
        // SAFETY: fork in a test; the child makes system calls and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let code = match restrict(paths, false) {
                Err(Error::Unsupported { .. }) => 99,
                Err(_) => 10,
                Ok(restricted) => checks(&restricted),
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

    /// Reads inside the read paths work, writes there are refused, the write folder takes
    /// new files, and anything else is EACCES.
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
            ..Paths::default()
        };
        in_a_restricted_child(&paths, |_| {
            if std::fs::read(site.join("index.html")).ok().as_deref() != Some(&b"hi"[..]) {
                11
            } else if !denied(std::fs::write(site.join("new"), "x")) {
                12
            } else if std::fs::write(data.join("db"), "x").is_err() {
                13
            } else if !denied(std::fs::read(&outside)) {
                14
            } else if !denied(std::fs::read("/etc/hostname")) {
                16
            } else {
                0
            }
        });
    }

    /// An access log's folder: a new file can be created and appended to (SIGUSR1 after
    /// logrotate), but old logs cannot be read, truncated, renamed or removed.
    #[test]
    fn in_a_child_a_log_folder_takes_new_files_and_appends_only() {
        use std::fs::OpenOptions;
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let logs = tmp.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        std::fs::write(logs.join("access.log.1"), "old\n").unwrap();
        let paths = Paths {
            log_folders: vec![logs.clone()],
            ..Paths::default()
        };
        in_a_restricted_child(&paths, |_| {
            let append = |name: &str| {
                OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(logs.join(name))
                    .and_then(|mut f| f.write_all(b"line\n"))
            };
            if append("access.log").is_err() {
                11
            } else if !denied(std::fs::read(logs.join("access.log.1"))) {
                12
            } else if !denied(std::fs::remove_file(logs.join("access.log.1"))) {
                13
            } else if !denied(std::fs::rename(logs.join("access.log.1"), logs.join("x"))) {
                14
            } else if !denied(
                OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(logs.join("access.log.1")),
            ) {
                15
            } else if !denied(std::fs::create_dir(logs.join("sub"))) {
                16
            } else {
                0
            }
        });
    }

    /// With a TCP upstream on one port, a connect to another port is refused (ABI 4), and
    /// nothing can bind.
    #[test]
    fn in_a_child_tcp_connects_reach_only_the_upstream_ports() {
        let upstream = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let (upstream, other) = (upstream.local_addr().unwrap(), other.local_addr().unwrap());
        let paths = Paths {
            connect: Connect {
                tcp_ports: vec![upstream.port()],
                ..Connect::default()
            },
            ..Paths::default()
        };
        in_a_restricted_child(&paths, |restricted| {
            if !restricted.lacking.is_empty() {
                // A kernel before ABI 4 says so instead.
                return if restricted.lacking[0].starts_with("Landlock TCP port rules") {
                    0
                } else {
                    11
                };
            }
            if std::net::TcpStream::connect(upstream).is_err() {
                12
            } else if !denied(std::net::TcpStream::connect(other)) {
                13
            } else if !denied(std::net::TcpListener::bind("127.0.0.1:0")) {
                14
            } else {
                0
            }
        });
    }

    /// With a Unix upstream its socket is reachable; from ABI 9 on a socket elsewhere is not,
    /// and a kernel before says what it lacks.
    #[test]
    fn in_a_child_a_unix_upstream_is_reachable_and_others_only_before_abi_9() {
        use std::os::unix::net::{UnixListener, UnixStream};
        let tmp = tempfile::tempdir().unwrap();
        let (app, other) = (tmp.path().join("app"), tmp.path().join("other"));
        std::fs::create_dir(&app).unwrap();
        std::fs::create_dir(&other).unwrap();
        let _app = UnixListener::bind(app.join("app.sock")).unwrap();
        let _other = UnixListener::bind(other.join("other.sock")).unwrap();
        let paths = Paths {
            connect: Connect {
                unix_folders: vec![app.clone()],
                ..Connect::default()
            },
            ..Paths::default()
        };
        in_a_restricted_child(&paths, |restricted| {
            let before_abi_9 = restricted
                .lacking
                .iter()
                .any(|l| l.starts_with("Landlock rules for Unix socket connects (kernel ABI"));
            if UnixStream::connect(app.join("app.sock")).is_err() {
                11
            } else if before_abi_9 {
                0
            } else if !restricted.lacking.is_empty() {
                12
            } else if !denied(UnixStream::connect(other.join("other.sock"))) {
                13
            } else {
                0
            }
        });
    }

    #[test]
    fn older_kernels_and_unusable_socket_folders_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let both = Connect {
            tcp_ports: vec![3000],
            unix_folders: vec![tmp.path().to_path_buf()],
        };
        assert_eq!(lacking(&both, ABI::V9), Vec::<String>::new());
        let on_6_18 = lacking(&both, ABI::V7);
        assert_eq!(on_6_18.len(), 1);
        assert!(on_6_18[0].starts_with("Landlock rules for Unix socket connects (kernel ABI 7 < 9"));
        let tcp_only = Connect {
            tcp_ports: vec![3000],
            ..Connect::default()
        };
        assert_eq!(lacking(&tcp_only, ABI::V4), Vec::<String>::new());
        assert_eq!(
            lacking(&tcp_only, ABI::V3),
            ["Landlock TCP port rules (kernel ABI 3 < 4: the workers may connect to any TCP port)"]
        );
        assert_eq!(lacking(&Connect::default(), ABI::V1), Vec::<String>::new());

        // No Unix rules at all, on any kernel, for a socket in a system folder or in a folder
        // not there yet.
        let socket_in_run = Connect {
            unix_folders: vec!["/run".into()],
            ..Connect::default()
        };
        assert!(unix_rules(&socket_in_run).is_empty());
        assert_eq!(
            lacking(&socket_in_run, ABI::V9),
            ["Landlock rules for Unix socket connects (a Unix upstream's socket is directly in /run, a system folder: give it a folder of its own)"]
        );
        let not_yet = Connect {
            unix_folders: vec![tmp.path().join("not-yet")],
            ..Connect::default()
        };
        assert!(unix_rules(&not_yet).is_empty());
        assert_eq!(
            lacking(&not_yet, ABI::V9),
            [format!(
                "Landlock rules for Unix socket connects (the Unix upstream's folder {} could not be reached at start-up)",
                tmp.path().join("not-yet").display()
            )]
        );
    }

    /// A container's seccomp filter answering `landlock_create_ruleset` with EPERM (as
    /// systemd-nspawn 252's does) is named as such, not as a kernel without Landlock.
    #[test]
    fn in_a_child_a_filter_blocking_landlock_is_named() {
        use seccompiler::{SeccompAction, SeccompFilter};
        let filter = SeccompFilter::new(
            [(libc::SYS_landlock_create_ruleset, Vec::new())]
                .into_iter()
                .collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            std::env::consts::ARCH.try_into().unwrap(),
        )
        .unwrap();
        let program: seccompiler::BpfProgram = filter.try_into().unwrap();
        // SAFETY: fork in a test; the child makes system calls and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: prctl on the calling thread only (a filter needs no_new_privs).
            let nnp = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            let code = if nnp != 0 || seccompiler::apply_filter(&program).is_err() {
                10
            } else {
                match restrict(&Paths::default(), false) {
                    Err(Error::Unsupported { why, .. })
                        if why.contains("refused (EPERM) by a seccomp filter") =>
                    {
                        0
                    }
                    Err(_) => 11,
                    Ok(_) => 12,
                }
            };
            // SAFETY: ends the child without the harness's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "child died: {status}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "failed check");
    }

    #[test]
    fn each_probe_errno_names_its_cause() {
        assert!(explain_probe(-1, libc::EOPNOTSUPP).contains("disabled at boot"));
        assert!(explain_probe(-1, libc::ENOSYS).contains("CONFIG_SECURITY_LANDLOCK"));
        assert!(explain_probe(-1, libc::EPERM).contains("seccomp filter"));
        assert!(explain_probe(7, 0).contains("ABI 7"));
    }
}
