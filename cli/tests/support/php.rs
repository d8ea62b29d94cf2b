//! PHP-FPM for the PHP tests (`cli/tests/fastcgi.rs`, `cli/tests/php_apps.rs`): a pool of its
//! own on a unix socket in a temporary folder, no php.ini, killed on drop.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::eventually;

/// PHP-FPM with a pool of its own on a unix socket in `dir`.
pub struct PhpFpm {
    child: Child,
    pub socket: PathBuf,
}

impl PhpFpm {
    pub fn start(dir: &Path) -> Option<PhpFpm> {
        let binary = std::fs::read_dir("/usr/sbin")
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("php-fpm"))
            });
        let Some(binary) = binary else {
            assert!(
                std::env::var_os("CI").is_none(),
                "php-fpm is missing under CI: scripts/install-fastcgi-test-deps installs it"
            );
            eprintln!("SKIPPED: php-fpm is not installed (scripts/install-fastcgi-test-deps)");
            return None;
        };
        let socket = dir.join("php.sock");
        let conf = dir.join("php-fpm.conf");
        std::fs::write(
            &conf,
            format!(
                "[global]\nerror_log = {d}/fpm.log\ndaemonize = no\n\
                 [site]\nlisten = {s}\nlisten.mode = 0666\npm = static\npm.max_children = 4\n\
                 clear_env = yes\nsecurity.limit_extensions = .php\ncatch_workers_output = yes\n\
                 php_admin_flag[log_errors] = on\nphp_admin_value[output_buffering] = 0\n",
                d = dir.display(),
                s = socket.display()
            ),
        )
        .unwrap();
        let mut cmd = Command::new(binary);
        cmd.arg("--nodaemonize").arg("--fpm-config").arg(&conf);
        cmd.arg("-n"); // no php.ini: the defaults, the same for both servers
                       // php-fpm refuses to run as root unless told to (CI runs the tests as root).
                       // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            cmd.arg("--allow-to-run-as-root");
        }
        // A process group of its own, so that its workers go with it: killing only the master
        // left them running for good, holding whatever descriptors the test had inherited
        // (a `flock` around the test run among them).
        let child = cmd
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let fpm = PhpFpm { child, socket };
        if !eventually(Duration::from_secs(10), || fpm.socket.exists()) {
            let log = std::fs::read_to_string(dir.join("fpm.log")).unwrap_or_default();
            drop(fpm);
            panic!("php-fpm did not start: {log}");
        }
        Some(fpm)
    }
}

impl Drop for PhpFpm {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group the master leads (its pid, set at spawn); the
        // master is not reaped before the wait below, so the group's id is still ours.
        unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}
