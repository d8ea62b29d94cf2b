//! The `tern serve --config FILE` file (TOML) and how it combines with the command line; and
//! the server keys it shares with `tern run --config`'s file ([`server_keys!`]).
//!
//! ```toml
//! root = "site"              # relative to the file's directory
//! serve_dotfiles = false
//! cache_control = "public, max-age=60"
//! max_cached_size = 65536    # bytes
//! header_timeout = 10        # seconds
//! body_timeout = 10
//! idle_timeout = 60
//! write_timeout = 30
//! max_body = 1048576         # bytes
//! max_connections = 16384    # per worker
//! listen = "127.0.0.1:8080"  # restart only
//! workers = 2                # restart only
//! pin = false                # restart only
//! io = "epoll"               # or "uring", "auto"; restart only
//! shutdown_grace = 5         # restart only
//! access_log = "/var/log/tern/access.log"  # restart only; relative to the file's directory
//! access_log_format = "combined"           # or "json"; restart only
//!
//! [tls]                      # HTTPS (certificates are re-read on SIGHUP; the rest: restart)
//! listen = "127.0.0.1:8443"
//! ticket_keys = "tls-ticket-keys"
//! redirect_http = "127.0.0.1:8080"
//! hsts = 31536000
//! self_signed = false
//! [[tls.certificates]]       # the first is the default; others are chosen by SNI
//! cert = "fullchain.pem"
//! key = "key.pem"
//! ```
//!
//! A flag on the command line wins over the file, the file over the defaults. Unknown keys and
//! bad values are errors naming the file and line.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tern_server::static_files::StaticOptions;
use tern_server::ServerConfig;
use toml::Spanned;

use crate::common::{CommonArgs, IoArg, LogFormatArg};

/// Declares a config file's struct with the server keys, listed once here: the settings of
/// the server itself, which `tern serve --config` ([`FileConfig`]) and `tern run --config`
/// (`run::config::file::RunFile`) both take. `server_keys! { file STRUCT }` gives STRUCT
/// these fields ahead of its own and a `server_keys()` method that lends them as a
/// [`ServerKeys`]; `server_keys!(view)` declares that view. serde's `flatten` would share
/// them as a struct of their own, but it cannot go with `deny_unknown_fields`.
macro_rules! server_keys {
    ($mode:ident $($rest:tt)*) => {
        $crate::config::server_keys!(@$mode [$($rest)*]
            listen: Option<std::net::SocketAddr>,
            workers: Option<toml::Spanned<usize>>,
            pin: Option<bool>,
            /// The sockets' backend, as `--io` (which wins over it).
            io: Option<$crate::common::IoArg>,
            header_timeout: Option<toml::Spanned<u64>>,
            body_timeout: Option<toml::Spanned<u64>>,
            idle_timeout: Option<toml::Spanned<u64>>,
            write_timeout: Option<toml::Spanned<u64>>,
            max_body: Option<u64>,
            max_connections: Option<toml::Spanned<usize>>,
            shutdown_grace: Option<u64>,
            user: Option<String>,
            group: Option<String>,
            sandbox: Option<$crate::hardening::SandboxArg>,
            tls: Option<$crate::tls::FileTls>,
            /// The access log (relative to the file's folder).
            access_log: Option<toml::Spanned<std::path::PathBuf>>,
            access_log_format: Option<$crate::common::LogFormatArg>,
        );
    };
    (@view [] $($(#[$key_meta:meta])* $key:ident: $ty:ty,)*) => {
        /// A file's server keys (see [`server_keys!`]), borrowed.
        #[derive(Clone, Copy)]
        pub(crate) struct ServerKeys<'a> {
            $($(#[$key_meta])* pub $key: &'a $ty,)*
        }
    };
    (
        @file [$(#[$meta:meta])* $vis:vis struct $name:ident { $($own:tt)* }]
        $($(#[$key_meta:meta])* $key:ident: $ty:ty,)*
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($(#[$key_meta])* $key: $ty,)*
            $($own)*
        }

        impl $name {
            pub(crate) fn server_keys(&self) -> $crate::config::ServerKeys<'_> {
                $crate::config::ServerKeys { $($key: &self.$key,)* }
            }
        }
    };
}
pub(crate) use server_keys;

server_keys!(view);

impl ServerKeys<'_> {
    /// Values out of range, in a fixed order: where each is in the file, and what.
    pub(crate) fn problems(&self) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (key, value) in [
            ("header_timeout", self.header_timeout),
            ("body_timeout", self.body_timeout),
            ("idle_timeout", self.idle_timeout),
            ("write_timeout", self.write_timeout),
        ] {
            if let Some(v) = value.as_ref().filter(|v| *v.get_ref() == 0) {
                out.push((
                    v.span().start,
                    format!("{key} must be at least 1 (seconds)"),
                ));
            }
        }
        for (key, value) in [
            ("workers", self.workers),
            ("max_connections", self.max_connections),
        ] {
            if let Some(v) = value.as_ref().filter(|v| *v.get_ref() == 0) {
                out.push((v.span().start, format!("{key} must be at least 1")));
            }
        }
        out
    }

    /// The flags, with these keys filling what they leave out (flags win); a relative
    /// `access_log` is taken from `dir`, the file's folder.
    pub(crate) fn under(&self, flags: &CommonArgs, dir: &Path) -> CommonArgs {
        let get = |v: &Option<Spanned<u64>>| v.as_ref().map(|v| *v.get_ref());
        let mut c = flags.clone();
        c.listen = c.listen.or(*self.listen);
        c.workers = c.workers.or(self.workers.as_ref().map(|v| *v.get_ref()));
        c.pin = c.pin || self.pin.unwrap_or(false);
        c.io = c.io.or(*self.io);
        c.header_timeout = c.header_timeout.or(get(self.header_timeout));
        c.body_timeout = c.body_timeout.or(get(self.body_timeout));
        c.idle_timeout = c.idle_timeout.or(get(self.idle_timeout));
        c.write_timeout = c.write_timeout.or(get(self.write_timeout));
        c.max_body = c.max_body.or(*self.max_body);
        c.max_connections = c
            .max_connections
            .or(self.max_connections.as_ref().map(|v| *v.get_ref()));
        c.shutdown_grace = c.shutdown_grace.or(*self.shutdown_grace);
        c.access_log = c
            .access_log
            .or_else(|| self.access_log.as_ref().map(|p| dir.join(p.get_ref())));
        c.access_log_format = c.access_log_format.or(*self.access_log_format);
        c
    }

    /// `user`, `group` and `sandbox`.
    pub(crate) fn hardening(&self) -> crate::hardening::FileHardening {
        crate::hardening::FileHardening {
            user: self.user.clone(),
            group: self.group.clone(),
            sandbox: *self.sandbox,
        }
    }
}

server_keys! {
    file
    /// The keys a config file may hold; all optional: the server keys, and the static site's.
    #[derive(Debug, Default, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct FileConfig {
        root: Option<Spanned<PathBuf>>,
        serve_dotfiles: Option<bool>,
        cache_control: Option<Spanned<String>>,
        max_cached_size: Option<u64>,
    }
}

impl FileConfig {
    /// The file names a plain listener (with TLS on, plain HTTP is served only when asked).
    pub fn listen_given(&self) -> bool {
        self.listen.is_some()
    }

    pub fn tls(&self) -> Option<&crate::tls::FileTls> {
        self.tls.as_ref()
    }

    /// `user`, `group` and `sandbox`.
    pub fn hardening(&self) -> crate::hardening::FileHardening {
        self.server_keys().hardening()
    }
}

/// Reads and checks a config file. Errors are one line: `config FILE: line N: what`.
pub fn load(path: &Path) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("config {}: cannot read: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("config {}: {e}", path.display()))
}

/// Parses and checks config text. Errors are `line N: what` (or just `what`).
pub fn parse(text: &str) -> Result<FileConfig, String> {
    let file: FileConfig = toml::from_str(text).map_err(|e| describe(text, &e))?;
    let at = |start: usize, msg: String| format!("line {}: {msg}", line_of(text, start));
    if let Some((start, what)) = file.server_keys().problems().into_iter().next() {
        return Err(at(start, what));
    }
    if let Some(cc) = &file.cache_control {
        if cc.get_ref().bytes().any(|b| b.is_ascii_control()) {
            return Err(at(
                cc.span().start,
                "cache_control must not hold control characters".into(),
            ));
        }
    }
    for (key, value) in [("root", &file.root), ("access_log", &file.access_log)] {
        if let Some(v) = value {
            if v.get_ref().as_os_str().is_empty() {
                return Err(at(v.span().start, format!("{key} must not be empty")));
            }
        }
    }
    Ok(file)
}

/// One line from a TOML error: `line N: [key: ]message`, with serde's "unknown field `x`,
/// expected one of ..." shortened to `unknown key "x"`.
pub(crate) fn describe(text: &str, e: &toml::de::Error) -> String {
    let raw = e.message().trim();
    let mut msg = match raw.strip_prefix("unknown field `") {
        Some(rest) => {
            let key = rest.split('`').next().unwrap_or(rest);
            format!("unknown key {key:?}")
        }
        None => raw.split_whitespace().collect::<Vec<_>>().join(" "),
    };
    let Some(span) = e.span() else {
        return msg;
    };
    let line_no = line_of(text, span.start);
    // For a bad value, name its key (the message alone often does not).
    if !msg.starts_with("unknown key") {
        let start = span.start.min(text.len());
        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        let line = text[line_start..].lines().next().unwrap_or("");
        if let Some((key, _)) = line.split_once('=') {
            let key = key.trim();
            let in_value = line_start + key.len() < start;
            if in_value && !key.is_empty() && !msg.contains(key) {
                msg = format!("{key}: {msg}");
            }
        }
    }
    format!("line {line_no}: {msg}")
}

/// 1-based line number of byte offset `at`.
pub(crate) fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// Everything `tern serve` runs with, resolved from flags, file and defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub root: PathBuf,
    pub serve_dotfiles: bool,
    pub cache_control: Option<String>,
    pub max_cached_size: u64,
    pub header_timeout: u64,
    pub body_timeout: u64,
    pub idle_timeout: u64,
    pub write_timeout: u64,
    pub max_body: u64,
    pub max_connections: usize,
    pub listen: SocketAddr,
    pub workers: usize,
    pub pin: bool,
    pub io: IoArg,
    pub shutdown_grace: u64,
    pub access_log: Option<PathBuf>,
    pub access_log_format: LogFormatArg,
}

/// What the command line says, before the file and defaults are applied.
pub struct Flags<'a> {
    pub dir: Option<&'a Path>,
    pub serve_dotfiles: bool,
    pub cache_control: Option<&'a str>,
    pub max_cached_size: Option<u64>,
    pub common: &'a CommonArgs,
}

impl Settings {
    /// Flags win over the file, the file over the defaults. `file_dir` is the directory
    /// relative `root` paths in the file are taken from.
    pub fn resolve(
        flags: &Flags<'_>,
        file: Option<&FileConfig>,
        file_dir: &Path,
    ) -> Result<Settings, String> {
        let empty = FileConfig::default();
        let f = file.unwrap_or(&empty);
        let c = f.server_keys().under(flags.common, file_dir);
        let defaults = ServerConfig::default();
        let static_defaults = StaticOptions::default();
        let secs = |given: Option<u64>, default: Duration| given.unwrap_or(default.as_secs());
        let root = match (flags.dir, &f.root) {
            (Some(dir), _) => dir.to_path_buf(),
            (None, Some(root)) => file_dir.join(root.get_ref()),
            (None, None) => {
                return Err(
                    "no directory to serve: give DIR or set `root` in the --config file".into(),
                )
            }
        };
        Ok(Settings {
            root,
            serve_dotfiles: flags.serve_dotfiles || f.serve_dotfiles.unwrap_or(false),
            cache_control: flags
                .cache_control
                .map(str::to_owned)
                .or_else(|| f.cache_control.as_ref().map(|v| v.get_ref().clone())),
            max_cached_size: flags
                .max_cached_size
                .or(f.max_cached_size)
                .unwrap_or(static_defaults.max_cached_size),
            header_timeout: secs(c.header_timeout, defaults.header_timeout),
            body_timeout: secs(c.body_timeout, defaults.body_timeout),
            idle_timeout: secs(c.idle_timeout, defaults.idle_timeout),
            write_timeout: secs(c.write_timeout, defaults.write_timeout),
            max_body: c.max_body.unwrap_or(defaults.limits.max_body),
            max_connections: c
                .max_connections
                .unwrap_or(defaults.max_connections_per_worker)
                .max(1),
            listen: c.listen.unwrap_or(defaults.runtime.listen[0]),
            workers: c.workers.unwrap_or(defaults.runtime.workers).max(1),
            pin: c.pin,
            io: c.io.unwrap_or_default(),
            shutdown_grace: c
                .shutdown_grace
                .unwrap_or(defaults.runtime.shutdown_grace.as_secs()),
            access_log: c.access_log,
            access_log_format: c.access_log_format.unwrap_or_default(),
        })
    }

    pub fn static_options(&self) -> StaticOptions {
        StaticOptions {
            root: self.root.clone(),
            serve_dotfiles: self.serve_dotfiles,
            cache_control: self.cache_control.clone(),
            max_cached_size: self.max_cached_size,
            ..StaticOptions::default()
        }
    }

    pub fn server_config(&self) -> ServerConfig {
        let mut config = ServerConfig::default();
        config.runtime.listen = vec![self.listen];
        config.runtime.workers = self.workers;
        config.runtime.pin = self.pin;
        config.runtime.io = self.io.into();
        config.runtime.shutdown_grace = Duration::from_secs(self.shutdown_grace);
        config.header_timeout = Duration::from_secs(self.header_timeout);
        config.body_timeout = Duration::from_secs(self.body_timeout);
        config.idle_timeout = Duration::from_secs(self.idle_timeout);
        config.write_timeout = Duration::from_secs(self.write_timeout);
        config.limits.max_body = self.max_body;
        config.max_connections_per_worker = self.max_connections;
        config
    }

    /// `new` with the settings that need a restart kept as they are in `self`.
    pub fn reloadable_part_of(&self, new: &Settings) -> Settings {
        Settings {
            listen: self.listen,
            workers: self.workers,
            pin: self.pin,
            io: self.io,
            shutdown_grace: self.shutdown_grace,
            access_log: self.access_log.clone(),
            access_log_format: self.access_log_format,
            ..new.clone()
        }
    }

    /// What differs from `self` to `new`, for the reload log line: applied changes first,
    /// then the ones that need a restart. Empty when nothing differs.
    pub fn describe_changes(&self, new: &Settings) -> String {
        let mut applied = Vec::new();
        let mut restart = Vec::new();
        let note = |list: &mut Vec<String>, name: &str, old: String, new: String| {
            if old != new {
                list.push(format!("{name} {old} -> {new}"));
            }
        };
        let cc = |v: &Option<String>| v.as_deref().map_or("none".into(), |s| format!("{s:?}"));
        note(
            &mut applied,
            "root",
            self.root.display().to_string(),
            new.root.display().to_string(),
        );
        note(
            &mut applied,
            "serve_dotfiles",
            self.serve_dotfiles.to_string(),
            new.serve_dotfiles.to_string(),
        );
        note(
            &mut applied,
            "cache_control",
            cc(&self.cache_control),
            cc(&new.cache_control),
        );
        for (name, old, new) in [
            ("max_cached_size", self.max_cached_size, new.max_cached_size),
            ("header_timeout", self.header_timeout, new.header_timeout),
            ("body_timeout", self.body_timeout, new.body_timeout),
            ("idle_timeout", self.idle_timeout, new.idle_timeout),
            ("write_timeout", self.write_timeout, new.write_timeout),
            ("max_body", self.max_body, new.max_body),
            (
                "max_connections",
                self.max_connections as u64,
                new.max_connections as u64,
            ),
        ] {
            note(&mut applied, name, old.to_string(), new.to_string());
        }
        note(
            &mut restart,
            "listen",
            self.listen.to_string(),
            new.listen.to_string(),
        );
        note(
            &mut restart,
            "workers",
            self.workers.to_string(),
            new.workers.to_string(),
        );
        note(
            &mut restart,
            "pin",
            self.pin.to_string(),
            new.pin.to_string(),
        );
        note(
            &mut restart,
            "shutdown_grace",
            self.shutdown_grace.to_string(),
            new.shutdown_grace.to_string(),
        );
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map_or("none".into(), |p| p.display().to_string())
        };
        note(
            &mut restart,
            "access_log",
            path(&self.access_log),
            path(&new.access_log),
        );
        note(
            &mut restart,
            "access_log_format",
            format!("{:?}", self.access_log_format).to_lowercase(),
            format!("{:?}", new.access_log_format).to_lowercase(),
        );
        let mut out = applied.join(", ");
        if !restart.is_empty() {
            if !out.is_empty() {
                out.push_str("; ");
            }
            let _ = write!(out, "{} need(s) a restart (ignored)", restart.join(", "));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct TestCli {
        #[command(flatten)]
        common: CommonArgs,
    }

    fn common(args: &[&str]) -> CommonArgs {
        let mut argv = vec!["t"];
        argv.extend_from_slice(args);
        TestCli::parse_from(argv).common
    }

    fn flags<'a>(dir: Option<&'a Path>, common: &'a CommonArgs) -> Flags<'a> {
        Flags {
            dir,
            serve_dotfiles: false,
            cache_control: None,
            max_cached_size: None,
            common,
        }
    }

    fn err(text: &str) -> String {
        parse(text).unwrap_err()
    }

    #[test]
    fn parses_every_key() {
        let f = parse(
            r#"
root = "site"
serve_dotfiles = true
cache_control = "public, max-age=60"
max_cached_size = 1000
header_timeout = 3
body_timeout = 4
idle_timeout = 5
write_timeout = 6
max_body = 7000
max_connections = 8
listen = "127.0.0.1:9090"
workers = 3
pin = true
io = "uring"
shutdown_grace = 9
access_log = "logs/access.log"
access_log_format = "json"
"#,
        )
        .unwrap();
        let c = common(&[]);
        let s = Settings::resolve(&flags(None, &c), Some(&f), Path::new("/etc/tern")).unwrap();
        assert_eq!(
            s,
            Settings {
                root: PathBuf::from("/etc/tern/site"),
                serve_dotfiles: true,
                cache_control: Some("public, max-age=60".into()),
                max_cached_size: 1000,
                header_timeout: 3,
                body_timeout: 4,
                idle_timeout: 5,
                write_timeout: 6,
                max_body: 7000,
                max_connections: 8,
                listen: "127.0.0.1:9090".parse().unwrap(),
                workers: 3,
                pin: true,
                io: IoArg::Uring,
                shutdown_grace: 9,
                access_log: Some(PathBuf::from("/etc/tern/logs/access.log")),
                access_log_format: LogFormatArg::Json,
            }
        );
        let config = s.server_config();
        assert_eq!(config.header_timeout, Duration::from_secs(3));
        assert_eq!(config.limits.max_body, 7000);
        assert_eq!(config.max_connections_per_worker, 8);
        assert_eq!(config.runtime.workers, 3);
        assert_eq!(
            s.static_options().cache_control.as_deref(),
            Some("public, max-age=60")
        );
    }

    #[test]
    fn user_group_and_sandbox_are_read_and_checked() {
        let f = parse("user = \"nobody\"\ngroup = \"nogroup\"\nsandbox = \"off\"\n").unwrap();
        let h = f.hardening();
        assert_eq!(h.user.as_deref(), Some("nobody"));
        assert_eq!(h.group.as_deref(), Some("nogroup"));
        assert_eq!(h.sandbox, Some(crate::hardening::SandboxArg::Off));
        let e = parse("root = \"x\"\nsandbox = \"maybe\"\n").unwrap_err();
        assert!(e.starts_with("line 2: sandbox: "), "{e}");
    }

    #[test]
    fn empty_file_and_no_file_give_todays_defaults() {
        let c = common(&[]);
        let dir = Path::new("/srv/site");
        let none = Settings::resolve(&flags(Some(dir), &c), None, Path::new("/x")).unwrap();
        let empty = parse("# nothing\n").unwrap();
        let with = Settings::resolve(&flags(Some(dir), &c), Some(&empty), Path::new("/x")).unwrap();
        assert_eq!(none, with);
        let d = ServerConfig::default();
        assert_eq!(none.root, dir);
        assert_eq!(none.header_timeout, 10);
        assert_eq!(none.idle_timeout, 60);
        assert_eq!(none.write_timeout, 30);
        assert_eq!(none.max_body, 1024 * 1024);
        assert_eq!(none.max_connections, 16_384);
        assert_eq!(none.max_cached_size, 64 * 1024);
        assert_eq!(none.listen, d.runtime.listen[0]);
        assert_eq!(none.workers, d.runtime.workers);
        assert_eq!(none.shutdown_grace, 5);
        assert!(!none.serve_dotfiles && !none.pin && none.cache_control.is_none());
        assert_eq!(none.access_log, None);
        assert_eq!(none.access_log_format, LogFormatArg::Combined);
    }

    #[test]
    fn flags_win_over_the_file() {
        let f = parse(
            "root = \"/from/file\"\nheader_timeout = 3\nlisten = \"127.0.0.1:1\"\ncache_control = \"file\"\n",
        )
        .unwrap();
        let c = common(&["--header-timeout", "7", "--listen", "127.0.0.1:2"]);
        let mut fl = flags(Some(Path::new("/from/flag")), &c);
        fl.cache_control = Some("flag");
        fl.max_cached_size = Some(5);
        let s = Settings::resolve(&fl, Some(&f), Path::new("/")).unwrap();
        assert_eq!(s.root, Path::new("/from/flag"));
        assert_eq!(s.header_timeout, 7);
        assert_eq!(s.listen.port(), 2);
        assert_eq!(s.cache_control.as_deref(), Some("flag"));
        assert_eq!(s.max_cached_size, 5);
        // Keys the flags leave alone come from the file.
        let c = common(&[]);
        let s = Settings::resolve(&flags(None, &c), Some(&f), Path::new("/")).unwrap();
        assert_eq!(s.root, Path::new("/from/file"), "absolute root kept as is");
        assert_eq!(s.header_timeout, 3);
    }

    #[test]
    fn no_root_anywhere_is_an_error() {
        let c = common(&[]);
        let e = Settings::resolve(&flags(None, &c), None, Path::new("/")).unwrap_err();
        assert!(e.contains("DIR"), "{e}");
    }

    #[test]
    fn unknown_key_names_line_and_key() {
        assert_eq!(
            err("serve_dotfiles = true\n\nrooot = \"site\"\n"),
            r#"line 3: unknown key "rooot""#
        );
        assert_eq!(
            err("[server]\nroot = \"x\"\n"),
            r#"line 1: unknown key "server""#
        );
    }

    #[test]
    fn bad_values_name_line_and_key() {
        let e = err("root = \"a\"\nheader_timeout = \"ten\"\n");
        assert!(e.starts_with("line 2: header_timeout: "), "{e}");
        let e = err("listen = \"nowhere\"\n");
        assert!(e.starts_with("line 1: listen: "), "{e}");
        let e = err("max_body = -1\n");
        assert!(e.starts_with("line 1: max_body: "), "{e}");
        let e = err("serve_dotfiles = \"yes\"\n");
        assert!(e.starts_with("line 1: serve_dotfiles: "), "{e}");
        assert_eq!(
            err("\n\nworkers = 0\n"),
            "line 3: workers must be at least 1"
        );
        assert_eq!(
            err("max_connections = 0\n"),
            "line 1: max_connections must be at least 1"
        );
        assert_eq!(
            err("idle_timeout = 0\n"),
            "line 1: idle_timeout must be at least 1 (seconds)"
        );
        assert_eq!(
            err("cache_control = \"a\\nb\"\n"),
            "line 1: cache_control must not hold control characters"
        );
        assert_eq!(err("root = \"\"\n"), "line 1: root must not be empty");
        assert_eq!(
            err("access_log = \"\"\n"),
            "line 1: access_log must not be empty"
        );
        let e = err("access_log_format = \"xml\"\n");
        assert!(e.starts_with("line 1: access_log_format: "), "{e}");
    }

    #[test]
    fn syntax_errors_are_one_line() {
        for text in [
            "root = \n",
            "root = \"unterminated\n",
            "= 3\n",
            "root = \"a\"\nroot = \"b\"\n",
        ] {
            let e = err(text);
            assert!(!e.contains('\n'), "{text:?} gave a multi-line error: {e}");
            assert!(e.starts_with("line "), "{text:?}: {e}");
        }
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tern.toml");
        std::fs::write(&path, "rooot = 1\n").unwrap();
        let e = load(&path).unwrap_err();
        assert_eq!(
            e,
            format!("config {}: line 1: unknown key \"rooot\"", path.display())
        );
        let e = load(&dir.path().join("missing.toml")).unwrap_err();
        assert!(
            e.contains("missing.toml") && e.contains("cannot read"),
            "{e}"
        );
    }

    #[test]
    fn changes_are_described_and_restart_only_ones_kept() {
        let c = common(&[]);
        let old =
            Settings::resolve(&flags(Some(Path::new("/a")), &c), None, Path::new("/")).unwrap();
        assert_eq!(old.describe_changes(&old), "");
        let mut new = old.clone();
        new.root = PathBuf::from("/b");
        new.cache_control = Some("no-store".into());
        new.idle_timeout = 5;
        new.workers = old.workers + 1;
        new.listen = "127.0.0.1:1".parse().unwrap();
        new.access_log = Some(PathBuf::from("/log"));
        let line = old.describe_changes(&new);
        assert!(
            line.starts_with(
                "root /a -> /b, cache_control none -> \"no-store\", idle_timeout 60 -> 5; "
            ),
            "{line}"
        );
        assert!(
            line.contains("listen 127.0.0.1:8080 -> 127.0.0.1:1"),
            "{line}"
        );
        assert!(line.contains("access_log none -> /log"), "{line}");
        assert!(line.ends_with("need(s) a restart (ignored)"), "{line}");
        let applied = old.reloadable_part_of(&new);
        assert_eq!(applied.root, Path::new("/b"));
        assert_eq!(applied.idle_timeout, 5);
        assert_eq!(applied.workers, old.workers);
        assert_eq!(applied.listen, old.listen);
        assert_eq!(applied.access_log, None);
    }
}
