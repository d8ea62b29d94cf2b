//! The gate's config file (`gate.toml`; `examples/gate.toml` shows and explains every key).
//!
//! Problems are reported as `FILE: line N: what`; an unknown key is an error, so a typo never
//! silently leaves a site open.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tern_services::client_addr::TrustedProxies;
use toml::Spanned;

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GateFile {
    keyring: Spanned<PathBuf>,
    rotate_keys_days: Option<Spanned<u64>>,
    session_hours: Option<Spanned<u64>>,
    challenge_minutes: Option<Spanned<u64>>,
    path_prefix: Option<Spanned<String>>,
    auth_path: Option<Spanned<String>>,
    cookie: Option<Spanned<String>>,
    secure_cookies: Option<Spanned<SecureCookies>>,
    bind_to_network: Option<bool>,
    ipv4_prefix: Option<Spanned<u8>>,
    ipv6_prefix: Option<Spanned<u8>>,
    #[serde(default)]
    trusted_proxies: Vec<Spanned<String>>,
    policy: Option<Spanned<PathBuf>>,
    pool: Option<PoolFile>,
    limits: Option<LimitsFile>,
    #[serde(default)]
    realm: Vec<RealmFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolFile {
    threads: Option<Spanned<usize>>,
    queue: Option<Spanned<usize>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    login_per_minute: Option<Spanned<u32>>,
    login_burst: Option<Spanned<u32>>,
    failures_per_user: Option<Spanned<u32>>,
    failure_window_minutes: Option<Spanned<u32>>,
    challenge_per_minute: Option<Spanned<u32>>,
    challenge_burst: Option<Spanned<u32>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RealmFile {
    name: Spanned<String>,
    checkers: Spanned<Vec<Spanned<String>>>,
    guest_difficulty: Option<Spanned<u8>>,
    exec_timeout_ms: Option<Spanned<u64>>,
}

/// Whether session cookies are `Secure` (and named with the `__Host-` prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecureCookies {
    /// When the request came over TLS, or from a trusted proxy that says
    /// `X-Forwarded-Proto: https`.
    Auto,
    Always,
    Never,
}

/// One way of proving who you are, tried in a realm's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckerSpec {
    /// An htpasswd-style file of `user:hash` lines (bcrypt or argon2id), read at each login.
    File(PathBuf),
    /// A program given the user as its argument and the password on stdin; exit 0 accepts.
    Exec(PathBuf),
    /// A guest identity earned by solving a proof of work.
    GuestPow,
}

#[derive(Debug, Clone)]
pub struct RealmConfig {
    pub name: String,
    pub checkers: Vec<CheckerSpec>,
    pub guest_difficulty: u8,
    pub exec_timeout: Duration,
    /// Changes whenever the checkers change; sessions carry it, so editing a realm's
    /// checkers logs everyone out of that realm (and only that realm).
    pub version: u32,
}

impl RealmConfig {
    pub fn has_guest(&self) -> bool {
        self.checkers.contains(&CheckerSpec::GuestPow)
    }

    pub fn has_passwords(&self) -> bool {
        self.checkers
            .iter()
            .any(|c| !matches!(c, CheckerSpec::GuestPow))
    }
}

#[derive(Debug, Clone)]
pub struct Limits {
    pub login_per_minute: u32,
    pub login_burst: u32,
    pub failures_per_user: u32,
    pub failure_window: Duration,
    pub challenge_per_minute: u32,
    pub challenge_burst: u32,
}

/// A checked config, paths resolved against the file's folder.
#[derive(Debug, Clone)]
pub struct GateConfig {
    pub keyring: PathBuf,
    pub rotate_every: Duration,
    pub session_lifetime: Duration,
    pub challenge_lifetime: Duration,
    pub path_prefix: String,
    pub auth_path: String,
    pub cookie: String,
    pub secure_cookies: SecureCookies,
    pub bind_to_network: bool,
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    pub trusted_proxies: TrustedProxies,
    /// `None`: the shipped default policy.
    pub policy: Option<PathBuf>,
    pub pool_threads: usize,
    pub pool_queue: usize,
    pub limits: Limits,
    pub realms: Vec<RealmConfig>,
}

impl GateConfig {
    pub fn realm(&self, name: &str) -> Option<(usize, &RealmConfig)> {
        self.realms.iter().enumerate().find(|(_, r)| r.name == name)
    }

    /// Files the gate reads while running (for the sandbox): checker files, the policy and
    /// its CIDR files are re-read at login or reload.
    pub fn files_read(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self.policy.iter().cloned().collect();
        for realm in &self.realms {
            for c in &realm.checkers {
                if let CheckerSpec::File(p) | CheckerSpec::Exec(p) = c {
                    out.push(p.clone());
                }
            }
        }
        out
    }

    pub fn exec_programs(&self) -> Vec<PathBuf> {
        self.realms
            .iter()
            .flat_map(|r| &r.checkers)
            .filter_map(|c| match c {
                CheckerSpec::Exec(p) => Some(p.clone()),
                _ => None,
            })
            .collect()
    }
}

/// Reads and checks `path`.
pub fn load(path: &Path) -> Result<GateConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read gate config {}: {e}", path.display()))?;
    parse(&text, path)
}

/// Checks `text` as if read from `path` (relative paths in it are resolved against the
/// folder of `path`).
pub fn parse(text: &str, path: &Path) -> Result<GateConfig, String> {
    let at = |offset: usize, what: String| {
        format!(
            "gate config {}: line {}: {what}",
            path.display(),
            line_of(text, offset)
        )
    };
    let file: GateFile = toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(1);
        format!(
            "gate config {}: line {line}: {}",
            path.display(),
            e.message()
        )
    })?;
    let folder = path.parent().unwrap_or(Path::new(""));
    let resolve = |p: &Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            folder.join(p)
        }
    };
    let positive = |v: &Option<Spanned<u64>>, name: &str, default: u64| match v {
        Some(s) if *s.get_ref() == 0 => {
            Err(at(s.span().start, format!("{name} must be at least 1")))
        }
        Some(s) => Ok(*s.get_ref()),
        None => Ok(default),
    };
    let rotate_days = positive(&file.rotate_keys_days, "rotate_keys_days", 7)?;
    let session_hours = positive(&file.session_hours, "session_hours", 24)?;
    let challenge_minutes = positive(&file.challenge_minutes, "challenge_minutes", 10)?;
    let path_prefix = match &file.path_prefix {
        Some(p) => {
            let v = p.get_ref().trim_end_matches('/').to_string();
            if !v.starts_with('/') || v.len() < 2 || !v.bytes().all(is_path_byte) {
                return Err(at(
                    p.span().start,
                    "path_prefix must be a path such as \"/.tern-gate\"".into(),
                ));
            }
            v
        }
        None => "/.tern-gate".into(),
    };
    let auth_path = match &file.auth_path {
        Some(p) if !p.get_ref().starts_with('/') || !p.get_ref().bytes().all(is_path_byte) => {
            return Err(at(
                p.span().start,
                "auth_path must be a path such as \"/auth\"".into(),
            ))
        }
        Some(p) => p.get_ref().clone(),
        None => "/auth".into(),
    };
    let cookie = match &file.cookie {
        Some(c)
            if c.get_ref().is_empty()
                || c.get_ref().len() > 40
                || !c
                    .get_ref()
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') =>
        {
            return Err(at(
                c.span().start,
                "cookie must be 1 to 40 letters, digits, '_' or '-'".into(),
            ))
        }
        Some(c) => c.get_ref().clone(),
        None => "tern_gate".into(),
    };
    let bits = |v: &Option<Spanned<u8>>, name: &str, max: u8, default: u8| match v {
        Some(s) if *s.get_ref() > max => Err(at(
            s.span().start,
            format!("{name} must be between 0 and {max}"),
        )),
        Some(s) => Ok(*s.get_ref()),
        None => Ok(default),
    };
    let ipv4_prefix = bits(&file.ipv4_prefix, "ipv4_prefix", 32, 24)?;
    let ipv6_prefix = bits(&file.ipv6_prefix, "ipv6_prefix", 128, 48)?;
    let mut nets = Vec::new();
    for item in &file.trusted_proxies {
        let parsed = TrustedProxies::parse(item.get_ref())
            .map_err(|e| at(item.span().start, format!("trusted_proxies: {e}")))?;
        nets.extend(parsed.into_nets());
    }
    let (pool_threads, pool_queue) = match &file.pool {
        Some(p) => (
            count(&p.threads, 2, 1..=64).map_err(|(s, e)| at(s, format!("pool.threads {e}")))?,
            count(&p.queue, 64, 1..=100_000).map_err(|(s, e)| at(s, format!("pool.queue {e}")))?,
        ),
        None => (2, 64),
    };
    let l = file.limits.unwrap_or_default();
    let limit = |v: &Option<Spanned<u32>>, name: &str, default: u32| match v {
        Some(s) if *s.get_ref() == 0 => Err(at(
            s.span().start,
            format!("limits.{name} must be at least 1"),
        )),
        Some(s) => Ok(*s.get_ref()),
        None => Ok(default),
    };
    let limits = Limits {
        login_per_minute: limit(&l.login_per_minute, "login_per_minute", 10)?,
        login_burst: limit(&l.login_burst, "login_burst", 20)?,
        failures_per_user: limit(&l.failures_per_user, "failures_per_user", 5)?,
        failure_window: Duration::from_secs(
            60 * u64::from(limit(
                &l.failure_window_minutes,
                "failure_window_minutes",
                15,
            )?),
        ),
        challenge_per_minute: limit(&l.challenge_per_minute, "challenge_per_minute", 60)?,
        challenge_burst: limit(&l.challenge_burst, "challenge_burst", 60)?,
    };
    let mut realms: Vec<RealmConfig> = Vec::new();
    for r in &file.realm {
        let name = r.name.get_ref();
        if name.is_empty()
            || name.len() > 32
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(at(
                r.name.span().start,
                "realm name must be 1 to 32 letters, digits, '_' or '-'".into(),
            ));
        }
        if realms.iter().any(|x| &x.name == name) {
            return Err(at(
                r.name.span().start,
                format!("realm {name:?} is defined twice"),
            ));
        }
        if r.checkers.get_ref().is_empty() {
            return Err(at(
                r.checkers.span().start,
                format!("realm {name:?} needs at least one checker"),
            ));
        }
        let mut checkers = Vec::new();
        for c in r.checkers.get_ref() {
            let spec = c.get_ref();
            let checker = if let Some(p) = spec.strip_prefix("file:") {
                CheckerSpec::File(resolve(Path::new(p)))
            } else if let Some(p) = spec.strip_prefix("exec:") {
                let program = resolve(Path::new(p));
                CheckerSpec::Exec(program)
            } else if spec == "guest-pow" {
                CheckerSpec::GuestPow
            } else {
                return Err(at(
                    c.span().start,
                    format!(
                        "unknown checker {spec:?} (expected \"file:PATH\", \"exec:PROGRAM\" or \"guest-pow\")"
                    ),
                ));
            };
            if checkers.contains(&checker) {
                return Err(at(
                    c.span().start,
                    format!("checker {spec:?} is listed twice"),
                ));
            }
            checkers.push(checker);
        }
        let guest_difficulty = match &r.guest_difficulty {
            Some(d) if !(1..=32).contains(d.get_ref()) => {
                return Err(at(
                    d.span().start,
                    "guest_difficulty must be 1 to 32 bits".into(),
                ))
            }
            Some(d) => *d.get_ref(),
            None => 16,
        };
        let exec_timeout = match &r.exec_timeout_ms {
            Some(t) if !(100..=60_000).contains(t.get_ref()) => {
                return Err(at(
                    t.span().start,
                    "exec_timeout_ms must be 100 to 60000".into(),
                ))
            }
            Some(t) => Duration::from_millis(*t.get_ref()),
            None => Duration::from_secs(5),
        };
        let version = realm_version(name, &checkers);
        realms.push(RealmConfig {
            name: name.clone(),
            checkers,
            guest_difficulty,
            exec_timeout,
            version,
        });
    }
    let rotate_every = Duration::from_secs(rotate_days * 86_400);
    Ok(GateConfig {
        keyring: resolve(file.keyring.get_ref()),
        rotate_every,
        session_lifetime: Duration::from_secs(session_hours * 3600),
        challenge_lifetime: Duration::from_secs(challenge_minutes * 60),
        path_prefix,
        auth_path,
        cookie,
        secure_cookies: file
            .secure_cookies
            .map(|s| *s.get_ref())
            .unwrap_or(SecureCookies::Auto),
        bind_to_network: file.bind_to_network.unwrap_or(true),
        ipv4_prefix,
        ipv6_prefix,
        trusted_proxies: TrustedProxies::new(nets),
        policy: file.policy.as_ref().map(|p| resolve(p.get_ref())),
        pool_threads,
        pool_queue,
        limits,
        realms,
    })
}

fn count(
    v: &Option<Spanned<usize>>,
    default: usize,
    range: std::ops::RangeInclusive<usize>,
) -> Result<usize, (usize, String)> {
    match v {
        Some(s) if !range.contains(s.get_ref()) => Err((
            s.span().start,
            format!("must be {} to {}", range.start(), range.end()),
        )),
        Some(s) => Ok(*s.get_ref()),
        None => Ok(default),
    }
}

fn is_path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'/' | b'.' | b'-' | b'_' | b'~')
}

/// FNV-1a over the realm's name and checkers: stable across restarts and nodes (unlike
/// std's randomly seeded hasher), which is what lets sessions survive them.
fn realm_version(name: &str, checkers: &[CheckerSpec]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0193);
    };
    eat(name.as_bytes());
    for c in checkers {
        match c {
            CheckerSpec::File(p) => {
                eat(b"file");
                eat(p.as_os_str().as_encoded_bytes());
            }
            CheckerSpec::Exec(p) => {
                eat(b"exec");
                eat(p.as_os_str().as_encoded_bytes());
            }
            CheckerSpec::GuestPow => eat(b"guest-pow"),
        }
    }
    h
}

/// 1-based line of byte `at` in `text`.
pub fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(text: &str) -> GateConfig {
        parse(text, Path::new("/etc/tern/gate.toml")).unwrap()
    }

    fn parse_err(text: &str) -> String {
        parse(text, Path::new("/etc/tern/gate.toml")).unwrap_err()
    }

    #[test]
    fn defaults_and_relative_paths() {
        let c = parse_ok("keyring = \"gate.keys\"\n");
        assert_eq!(c.keyring, Path::new("/etc/tern/gate.keys"));
        assert_eq!(c.path_prefix, "/.tern-gate");
        assert_eq!(c.auth_path, "/auth");
        assert_eq!(c.cookie, "tern_gate");
        assert_eq!(c.session_lifetime, Duration::from_secs(86_400));
        assert_eq!(c.secure_cookies, SecureCookies::Auto);
        assert!(c.bind_to_network);
        assert!(c.policy.is_none());
        assert!(c.realms.is_empty());
    }

    #[test]
    fn realms_and_checkers() {
        let c = parse_ok(
            "keyring = \"/k\"\n[[realm]]\nname = \"staff\"\n\
             checkers = [\"file:users\", \"exec:/bin/check\", \"guest-pow\"]\n",
        );
        let r = &c.realms[0];
        assert_eq!(
            r.checkers,
            vec![
                CheckerSpec::File("/etc/tern/users".into()),
                CheckerSpec::Exec("/bin/check".into()),
                CheckerSpec::GuestPow
            ]
        );
        assert!(r.has_guest() && r.has_passwords());
        assert_eq!(c.realm("staff").unwrap().0, 0);
    }

    #[test]
    fn changing_checkers_changes_the_realm_version() {
        let a = parse_ok("keyring = \"/k\"\n[[realm]]\nname = \"s\"\ncheckers = [\"file:a\"]\n");
        let b = parse_ok("keyring = \"/k\"\n[[realm]]\nname = \"s\"\ncheckers = [\"file:a\"]\n");
        let c = parse_ok(
            "keyring = \"/k\"\n[[realm]]\nname = \"s\"\ncheckers = [\"file:a\", \"guest-pow\"]\n",
        );
        assert_eq!(a.realms[0].version, b.realms[0].version);
        assert_ne!(a.realms[0].version, c.realms[0].version);
    }

    #[test]
    fn errors_name_their_line() {
        assert!(parse_err("keyring = \"/k\"\ncookei = \"x\"\n").contains("line 2"));
        assert!(parse_err("cookie = \"x\"\n").contains("keyring"));
        let e =
            parse_err("keyring = \"/k\"\n\n[[realm]]\nname = \"s\"\ncheckers = [\"pam:login\"]\n");
        assert!(e.contains("line 5") && e.contains("unknown checker"), "{e}");
        let e = parse_err("keyring = \"/k\"\nsession_hours = 0\n");
        assert!(e.contains("line 2") && e.contains("at least 1"), "{e}");
        let e = parse_err("keyring = \"/k\"\npath_prefix = \"gate\"\n");
        assert!(e.contains("line 2"), "{e}");
        let e = parse_err("keyring = \"/k\"\ntrusted_proxies = [\"nonsense\"]\n");
        assert!(e.contains("line 2"), "{e}");
        let e = parse_err(
            "keyring = \"/k\"\n[[realm]]\nname = \"s\"\ncheckers = [\"guest-pow\"]\n[[realm]]\nname = \"s\"\ncheckers = [\"guest-pow\"]\n",
        );
        assert!(e.contains("line 6") && e.contains("twice"), "{e}");
        let e = parse_err("keyring = \"/k\"\n[[realm]]\nname = \"s\"\ncheckers = []\n");
        assert!(e.contains("line 4"), "{e}");
        let e = parse_err("keyring = \"/k\"\n[limits]\nlogin_burst = 0\n");
        assert!(e.contains("line 3"), "{e}");
        let e = parse_err("keyring = \"/k\"\n[[realm]]\nname = \"s\"\ncheckers = [\"guest-pow\"]\nguest_difficulty = 40\n");
        assert!(e.contains("line 5"), "{e}");
    }
}
