//! A throwaway PostgreSQL cluster for tests: `initdb` into a temporary folder, `pg_ctl start`
//! on a free loopback port, stopped (`-m immediate`) and removed on drop. Uses the server
//! binaries of Debian's `postgresql` package (`/usr/lib/postgresql/*/bin`, installed by
//! `scripts/install-pg-test-deps`). PostgreSQL refuses to run as root, so as root the
//! cluster runs as the `postgres` user (`runuser`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct PgCluster {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

/// The newest `/usr/lib/postgresql/N/bin`, if PostgreSQL is installed.
pub fn server_binaries() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

impl PgCluster {
    /// Starts a fresh cluster; `extra` are `-c name=value` settings.
    pub fn start(extra: &[&str]) -> Result<PgCluster, String> {
        let bin = server_binaries()
            .ok_or("PostgreSQL is not installed (run scripts/install-pg-test-deps)".to_string())?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let as_postgres = unsafe { libc::geteuid() } == 0;
        let dir = std::env::temp_dir().join(format!(
            "tern-pg-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let cluster = PgCluster {
            dir,
            bin,
            port,
            as_postgres,
        };
        if as_postgres {
            run(Command::new("chown").arg("postgres:").arg(&cluster.dir))?;
        }
        let db = cluster.dir.join("db");
        cluster.pg(
            "initdb",
            &[
                "-D",
                path(&db),
                "-U",
                "tern",
                "-A",
                "trust",
                "-N",
                "-E",
                "UTF8",
            ],
        )?;
        let mut options = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync=off -c full_page_writes=off",
            cluster.dir.display()
        );
        for e in extra {
            options.push_str(" -c ");
            options.push_str(e);
        }
        cluster.pg(
            "pg_ctl",
            &[
                "-D",
                path(&db),
                "-l",
                path(&cluster.dir.join("log")),
                "-w",
                "-o",
                &options,
                "start",
            ],
        )?;
        Ok(cluster)
    }

    fn pg(&self, tool: &str, args: &[&str]) -> Result<Output, String> {
        let exe = self.bin.join(tool);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        cmd.args(args).current_dir(&self.dir);
        run(&mut cmd)
    }

    /// `postgres://tern@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://tern@127.0.0.1:{}/{db}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Creates database `name` (through `psql`).
    pub fn create_database(&self, name: &str) -> Result<(), String> {
        self.psql(&format!("CREATE DATABASE \"{name}\""))
            .map(|_| ())
    }

    /// A streaming standby of this cluster (`pg_basebackup -R`) in its own folder, on its
    /// own port, started; its replication is not synchronous until `make_synchronous`.
    pub fn standby(&self) -> Result<PgCluster, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let standby = PgCluster {
            dir: self.dir.with_file_name(format!(
                "{}-standby",
                self.dir
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or("pg")
            )),
            bin: self.bin.clone(),
            port,
            as_postgres: self.as_postgres,
        };
        std::fs::create_dir_all(&standby.dir)
            .map_err(|e| format!("{}: {e}", standby.dir.display()))?;
        if self.as_postgres {
            run(Command::new("chown").arg("postgres:").arg(&standby.dir))?;
        }
        let db = standby.dir.join("db");
        standby.pg(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "tern",
                "-D",
                path(&db),
                "-R",
                "-X",
                "stream",
            ],
        )?;
        standby.start_again()?;
        Ok(standby)
    }

    /// Commits on this (primary) cluster wait for a standby's flush from now on
    /// (`synchronous_standby_names = '*'`), as a production primary with a synchronous
    /// standby does.
    pub fn make_synchronous(&self) -> Result<(), String> {
        self.psql("ALTER SYSTEM SET synchronous_standby_names = '*'")?;
        self.psql("SELECT pg_reload_conf()").map(|_| ())
    }

    /// Whether a standby streams from this cluster (`pg_stat_replication`), and in which
    /// sync state (`async`, `sync`, …).
    pub fn replication_state(&self) -> Result<Option<String>, String> {
        let out = self.psql("SELECT state || ' ' || sync_state FROM pg_stat_replication")?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Ok((!text.is_empty()).then_some(text))
    }

    /// Creates a role that must log in over TCP with `password` (SCRAM), as a production
    /// database would ask (the other roles of this cluster are trusted).
    pub fn add_password_role(&self, role: &str, password: &str) -> Result<(), String> {
        self.psql(&format!(
            "CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'"
        ))?;
        let hba = self.dir.join("db").join("pg_hba.conf");
        let old = std::fs::read_to_string(&hba).map_err(|e| format!("{}: {e}", hba.display()))?;
        std::fs::write(
            &hba,
            format!("host all \"{role}\" 127.0.0.1/32 scram-sha-256\n{old}"),
        )
        .map_err(|e| format!("{}: {e}", hba.display()))?;
        self.psql("SELECT pg_reload_conf()").map(|_| ())
    }

    /// Turns TLS on (`ssl = on`, reloaded) with this certificate chain and key (PEM), written
    /// into the data folder where PostgreSQL wants them (the key readable by its owner only);
    /// returns once new connections are offered TLS. Plain connections are still accepted.
    pub fn enable_tls(&self, cert_pem: &str, key_pem: &str) -> Result<(), String> {
        use std::os::unix::fs::PermissionsExt;
        let db = self.dir.join("db");
        for (name, pem, mode) in [
            ("server.crt", cert_pem, 0o644),
            ("server.key", key_pem, 0o600),
        ] {
            let file = db.join(name);
            std::fs::write(&file, pem).map_err(|e| format!("{}: {e}", file.display()))?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode))
                .map_err(|e| format!("{}: {e}", file.display()))?;
            if self.as_postgres {
                run(Command::new("chown").arg("postgres:").arg(&file))?;
            }
        }
        self.set("ssl", "on")
    }

    /// `ALTER SYSTEM SET name = 'value'`, reloaded; returns once new sessions see it (a bad
    /// value is refused by the reload, which then never shows: an error after 10 s).
    pub fn set(&self, name: &str, value: &str) -> Result<(), String> {
        self.psql(&format!("ALTER SYSTEM SET {name} = '{value}'"))?;
        self.psql("SELECT pg_reload_conf()")?;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let out = self.psql(&format!("SHOW {name}"))?;
            if String::from_utf8_lossy(&out.stdout).trim() == value {
                return Ok(());
            }
            if std::time::Instant::now() > until {
                let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
                return Err(format!("{name} = '{value}' never took effect; log:\n{log}"));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// `pg_ctl promote`: this standby becomes a primary.
    pub fn promote(&self) -> Result<(), String> {
        let db = self.dir.join("db");
        self.pg("pg_ctl", &["-D", path(&db), "-w", "promote"])
            .map(|_| ())
    }

    fn psql(&self, sql: &str) -> Result<Output, String> {
        self.pg(
            "psql",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "tern",
                "-d",
                "postgres",
                "-Atc",
                sql,
            ],
        )
    }

    /// A crash and restart of the database: `stop` then `start_again` (`pg_ctl restart` would
    /// leave the new server writing to this process's pipe, and `output()` would never end).
    pub fn restart_immediate(&self) -> Result<(), String> {
        self.stop()?;
        self.start_again()
    }

    /// `pg_ctl stop -m immediate`.
    pub fn stop(&self) -> Result<(), String> {
        let db = self.dir.join("db");
        self.pg(
            "pg_ctl",
            &["-D", path(&db), "-m", "immediate", "-w", "stop"],
        )
        .map(|_| ())
    }

    /// `pg_ctl start` again after `stop`.
    pub fn start_again(&self) -> Result<(), String> {
        let db = self.dir.join("db");
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=off -c full_page_writes=off",
            self.port,
            self.dir.display()
        );
        self.pg(
            "pg_ctl",
            &[
                "-D",
                path(&db),
                "-l",
                path(&self.dir.join("log")),
                "-w",
                "-o",
                &options,
                "start",
            ],
        )
        .map(|_| ())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

fn run(cmd: &mut Command) -> Result<Output, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out)
}
