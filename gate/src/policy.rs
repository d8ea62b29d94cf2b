//! The bot policy: ordered rules, each a set of matchers and an action, compiled once at load.
//!
//! ```toml
//! [[rule]]
//! name = "git"                      # unique, shown in the counters
//! action = "allow"                  # allow | deny | challenge | timelock | login | weigh
//! user_agent = "^git/"              # regex on User-Agent ("" when absent)
//! path_prefix = ["/repo/"]          # any of these prefixes, on segment boundaries
//! path_regex = "\\.git/"            # regex on the path
//! header = { Accept = "rss|atom" }  # every named header must match (a missing one does not)
//! method = ["GET", "HEAD"]          # any of these methods
//! cidr = ["192.0.2.0/24"]           # any of these networks (and cidr_file = "list.txt")
//! difficulty = 16                   # challenge: leading zero bits of work
//! seconds = 3                       # timelock: how long the page waits
//! realm = "staff"                   # login: which realm
//! weight = 10                       # weigh: added to the request's weight, then go on
//!
//! [[threshold]]                     # after the rules, by the summed weight
//! below = 10                        # weight < 10 (the last threshold may omit it)
//! action = "challenge"
//! difficulty = 14
//! ```
//!
//! The first rule whose matchers all match and whose action is not `weigh` decides. If none
//! does, the first threshold whose `below` exceeds the weight decides; with no threshold, or
//! none that fits, the request is allowed. Evaluation allocates nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use regex::bytes::Regex;
use serde::Deserialize;
use toml::Spanned;

/// The shipped default policy (`gate/default-policy.toml`).
pub const DEFAULT_POLICY: &str = include_str!("../default-policy.toml");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
    /// A proof of work of `difficulty` leading zero bits.
    Challenge {
        difficulty: u8,
    },
    /// A page that continues by itself after `seconds` (no JavaScript needed).
    TimeLock {
        seconds: u32,
    },
    /// A login to the realm of this index.
    Login {
        realm: u16,
    },
}

/// What the policy decided, and which rule (an index into `rule_names`) decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub rule: u16,
    pub action: Action,
}

#[derive(Debug)]
pub struct PolicyError {
    origin: PathBuf,
    line: usize,
    message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "policy {}: line {}: {}",
            self.origin.display(),
            self.line,
            self.message
        )
    }
}

impl std::error::Error for PolicyError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    rule: Vec<RuleFile>,
    #[serde(default)]
    threshold: Vec<ThresholdFile>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    name: Spanned<String>,
    action: Spanned<String>,
    user_agent: Option<Spanned<String>>,
    path_prefix: Option<Spanned<OneOrMany>>,
    path_regex: Option<Spanned<String>>,
    header: Option<Spanned<BTreeMap<String, String>>>,
    method: Option<Spanned<OneOrMany>>,
    cidr: Option<Spanned<OneOrMany>>,
    cidr_file: Option<Spanned<PathBuf>>,
    difficulty: Option<Spanned<u8>>,
    seconds: Option<Spanned<u32>>,
    realm: Option<Spanned<String>>,
    weight: Option<Spanned<i32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ThresholdFile {
    below: Option<Spanned<i64>>,
    action: Spanned<String>,
    difficulty: Option<Spanned<u8>>,
    seconds: Option<Spanned<u32>>,
    realm: Option<Spanned<String>>,
}

/// What a rule does when it matches.
#[derive(Debug, Clone, Copy)]
enum Effect {
    Decide(Action),
    Weigh(i32),
}

struct Rule {
    effect: Effect,
    user_agent: Option<Regex>,
    path_prefixes: Vec<String>,
    path_regex: Option<Regex>,
    headers: Vec<(String, Regex)>,
    methods: Vec<String>,
    /// Sorted, merged address ranges (IPv4 as IPv4-mapped IPv6).
    ranges: Vec<(u128, u128)>,
    has_networks: bool,
}

impl Rule {
    fn matches<'h>(
        &self,
        method: &str,
        path: &str,
        header: &impl Fn(&str) -> Option<&'h [u8]>,
        ip: u128,
    ) -> bool {
        if !self.methods.is_empty() && !self.methods.iter().any(|m| m == method) {
            return false;
        }
        if !self.path_prefixes.is_empty()
            && !self
                .path_prefixes
                .iter()
                .any(|p| tern_server::path_under(p, path))
        {
            return false;
        }
        if let Some(re) = &self.path_regex {
            if !re.is_match(path.as_bytes()) {
                return false;
            }
        }
        if self.has_networks && !in_ranges(&self.ranges, ip) {
            return false;
        }
        if let Some(re) = &self.user_agent {
            if !re.is_match(header("user-agent").unwrap_or(b"")) {
                return false;
            }
        }
        self.headers
            .iter()
            .all(|(name, re)| header(name).is_some_and(|v| re.is_match(v)))
    }
}

fn in_ranges(ranges: &[(u128, u128)], ip: u128) -> bool {
    // The last range starting at or below ip is the only one that can hold it.
    match ranges.partition_point(|r| r.0 <= ip) {
        0 => false,
        i => ip <= ranges[i - 1].1,
    }
}

fn ip_key(ip: IpAddr) -> u128 {
    match ip.to_canonical() {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn net_range(net: IpNet) -> (u128, u128) {
    (ip_key(net.network()), ip_key(net.broadcast()))
}

/// A compiled policy.
pub struct Policy {
    rules: Vec<Rule>,
    thresholds: Vec<(i64, Action)>,
    names: Vec<String>,
    cidr_files: Vec<PathBuf>,
}

impl Policy {
    /// Reads and compiles the policy at `path` (and its CIDR files).
    pub fn load(path: &Path, realms: &[&str]) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|e| PolicyError {
            origin: path.to_path_buf(),
            line: 1,
            message: format!("cannot read: {e}"),
        })?;
        Policy::parse(&text, path, realms)
    }

    /// Compiles `text`, read from `origin` (CIDR files are relative to its folder). `realms`
    /// are the names a `login` rule may use, in order.
    pub fn parse(text: &str, origin: &Path, realms: &[&str]) -> Result<Policy, PolicyError> {
        let err = |at: usize, message: String| PolicyError {
            origin: origin.to_path_buf(),
            line: crate::config::line_of(text, at),
            message,
        };
        let file: PolicyFile = toml::from_str(text).map_err(|e| {
            err(
                e.span().map(|s| s.start).unwrap_or(0),
                e.message().to_string(),
            )
        })?;
        let folder = origin.parent().unwrap_or(Path::new(""));
        let mut names: Vec<String> = Vec::new();
        let mut rules = Vec::new();
        let mut cidr_files = Vec::new();
        for r in file.rule {
            let at = r.name.span().start;
            let name = r.name.into_inner();
            if name.is_empty()
                || name.len() > 64
                || name
                    .chars()
                    .any(|c| c.is_control() || c == '"' || c == '\\')
            {
                return Err(err(
                    at,
                    "rule names are 1 to 64 characters, without quotes or backslashes".into(),
                ));
            }
            if names.contains(&name) {
                return Err(err(at, format!("rule {name:?} is defined twice")));
            }
            let action_at = r.action.span().start;
            let effect = match r.action.get_ref().as_str() {
                "weigh" => Effect::Weigh(
                    *r.weight
                        .as_ref()
                        .ok_or_else(|| err(action_at, "a weigh rule needs a weight".into()))?
                        .get_ref(),
                ),
                other => Effect::Decide(action(
                    other,
                    action_at,
                    &r.difficulty,
                    &r.seconds,
                    &r.realm,
                    realms,
                    &err,
                )?),
            };
            if let (Some(w), false) = (&r.weight, matches!(effect, Effect::Weigh(_))) {
                return Err(err(w.span().start, "weight is for weigh rules".into()));
            }
            let regex = |s: &Option<Spanned<String>>| -> Result<Option<Regex>, PolicyError> {
                s.as_ref()
                    .map(|s| {
                        Regex::new(s.get_ref()).map_err(|e| {
                            err(
                                s.span().start,
                                format!("bad regex: {}", first_line(&e.to_string())),
                            )
                        })
                    })
                    .transpose()
            };
            let user_agent = regex(&r.user_agent)?;
            let path_regex = regex(&r.path_regex)?;
            let mut headers = Vec::new();
            if let Some(h) = &r.header {
                for (name, pattern) in h.get_ref() {
                    let re = Regex::new(pattern).map_err(|e| {
                        err(
                            h.span().start,
                            format!("bad regex for {name}: {}", first_line(&e.to_string())),
                        )
                    })?;
                    headers.push((name.to_ascii_lowercase(), re));
                }
            }
            let path_prefixes = r
                .path_prefix
                .map(|p| p.into_inner().into_vec())
                .unwrap_or_default();
            if let Some(p) = path_prefixes.iter().find(|p| !p.starts_with('/')) {
                return Err(err(at, format!("path_prefix {p:?} must start with '/'")));
            }
            // Compared with the decoded canonical path, so kept in that form: `/caf%C3%A9`
            // and `/café` are one prefix. One with no canonical form could match nothing
            // safely.
            let mut decoded_prefixes = Vec::with_capacity(path_prefixes.len());
            for p in &path_prefixes {
                let Some(d) = crate::path::canonical(p) else {
                    return Err(err(
                        at,
                        format!("path_prefix {p:?} has no canonical form (an encoded '/', ';', '..' above '/'...)"),
                    ));
                };
                decoded_prefixes.push(crate::path::policy_path(&d).into_owned());
            }
            let path_prefixes = decoded_prefixes;
            let methods = match r.method {
                Some(m) => {
                    let at = m.span().start;
                    let list = m.into_inner().into_vec();
                    if let Some(bad) = list
                        .iter()
                        .find(|m| m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()))
                    {
                        return Err(err(
                            at,
                            format!("method {bad:?} must be an upper-case token such as \"GET\""),
                        ));
                    }
                    list
                }
                None => Vec::new(),
            };
            let mut nets = Vec::new();
            let has_networks = r.cidr.is_some() || r.cidr_file.is_some();
            if let Some(c) = r.cidr {
                let at = c.span().start;
                for item in c.into_inner().into_vec() {
                    nets.push(
                        parse_net(&item)
                            .ok_or_else(|| err(at, format!("not a network: {item:?}")))?,
                    );
                }
            }
            if let Some(f) = r.cidr_file {
                let at = f.span().start;
                let path = folder.join(f.get_ref());
                let list = std::fs::read_to_string(&path)
                    .map_err(|e| err(at, format!("cannot read {}: {e}", path.display())))?;
                for (i, line) in list.lines().enumerate() {
                    let item = line.split('#').next().unwrap_or("").trim();
                    if item.is_empty() {
                        continue;
                    }
                    nets.push(parse_net(item).ok_or_else(|| {
                        err(
                            at,
                            format!(
                                "{}: line {}: not a network: {item:?}",
                                path.display(),
                                i + 1
                            ),
                        )
                    })?);
                }
                cidr_files.push(path);
            }
            names.push(name);
            rules.push(Rule {
                effect,
                user_agent,
                path_prefixes,
                path_regex,
                headers,
                methods,
                ranges: merge(nets.into_iter().map(net_range).collect()),
                has_networks,
            });
        }
        let mut thresholds = Vec::new();
        let count = file.threshold.len();
        for (i, t) in file.threshold.into_iter().enumerate() {
            let at = t.action.span().start;
            let below = match &t.below {
                Some(b) => *b.get_ref(),
                None if i + 1 == count => i64::MAX,
                None => {
                    return Err(err(
                        at,
                        "only the last threshold may leave out `below`".into(),
                    ))
                }
            };
            if thresholds.last().is_some_and(|(prev, _)| *prev >= below) {
                return Err(err(
                    at,
                    "thresholds must be in increasing order of `below`".into(),
                ));
            }
            let name = t.action.get_ref().clone();
            if name == "weigh" {
                return Err(err(at, "a threshold cannot weigh".into()));
            }
            let a = action(&name, at, &t.difficulty, &t.seconds, &t.realm, realms, &err)?;
            names.push(if below == i64::MAX {
                "threshold:rest".into()
            } else {
                format!("threshold:below {below}")
            });
            thresholds.push((below, a));
        }
        // Without a catch-all, a weight above every `below` would quietly be allowed.
        if let Some(last) = thresholds.last() {
            if last.0 != i64::MAX {
                return Err(err(
                    text.rfind("[[threshold]]").unwrap_or(0),
                    "the last threshold must leave out `below` (the catch-all for every heavier request)"
                        .into(),
                ));
            }
        }
        if names.len() >= u16::MAX as usize {
            return Err(err(0, "too many rules".into()));
        }
        names.push("default".into());
        Ok(Policy {
            rules,
            thresholds,
            names,
            cidr_files,
        })
    }

    /// Decides about one request. `header` looks a header up by lower-case name.
    pub fn evaluate<'h>(
        &self,
        method: &str,
        path: &str,
        header: impl Fn(&str) -> Option<&'h [u8]>,
        ip: IpAddr,
    ) -> Decision {
        let ip = ip_key(ip);
        let mut weight: i64 = 0;
        for (i, rule) in self.rules.iter().enumerate() {
            if !rule.matches(method, path, &header, ip) {
                continue;
            }
            match rule.effect {
                Effect::Decide(action) => {
                    return Decision {
                        rule: i as u16,
                        action,
                    }
                }
                Effect::Weigh(w) => weight += i64::from(w),
            }
        }
        for (i, (below, action)) in self.thresholds.iter().enumerate() {
            if weight < *below {
                return Decision {
                    rule: (self.rules.len() + i) as u16,
                    action: *action,
                };
            }
        }
        Decision {
            rule: (self.names.len() - 1) as u16,
            action: Action::Allow,
        }
    }

    /// Rules, then thresholds, then "default": what `Decision::rule` indexes.
    pub fn rule_names(&self) -> &[String] {
        &self.names
    }

    /// The CIDR files the policy read (re-read on reload).
    pub fn cidr_files(&self) -> &[PathBuf] {
        &self.cidr_files
    }
}

#[allow(clippy::too_many_arguments)]
fn action(
    name: &str,
    at: usize,
    difficulty: &Option<Spanned<u8>>,
    seconds: &Option<Spanned<u32>>,
    realm: &Option<Spanned<String>>,
    realms: &[&str],
    err: &impl Fn(usize, String) -> PolicyError,
) -> Result<Action, PolicyError> {
    let stray = |what: &str, present: bool| -> Result<(), PolicyError> {
        if present {
            Err(err(at, format!("{what} does not apply to action {name:?}")))
        } else {
            Ok(())
        }
    };
    if name != "challenge" {
        stray("difficulty", difficulty.is_some())?;
    }
    if name != "timelock" {
        stray("seconds", seconds.is_some())?;
    }
    if name != "login" {
        stray("realm", realm.is_some())?;
    }
    Ok(match name {
        "allow" => Action::Allow,
        "deny" => Action::Deny,
        "challenge" => {
            let d = difficulty.as_ref().map_or(16, |d| *d.get_ref());
            if !(1..=32).contains(&d) {
                return Err(err(
                    difficulty.as_ref().unwrap().span().start,
                    "difficulty must be 1 to 32 bits".into(),
                ));
            }
            Action::Challenge { difficulty: d }
        }
        "timelock" => {
            let s = seconds.as_ref().map_or(3, |s| *s.get_ref());
            if !(1..=60).contains(&s) {
                return Err(err(
                    seconds.as_ref().unwrap().span().start,
                    "seconds must be 1 to 60".into(),
                ));
            }
            Action::TimeLock { seconds: s }
        }
        "login" => {
            let r = realm
                .as_ref()
                .ok_or_else(|| err(at, "a login rule needs a realm".into()))?;
            let index = realms
                .iter()
                .position(|x| x == r.get_ref())
                .ok_or_else(|| {
                    err(
                        r.span().start,
                        format!("no realm named {:?} in the gate config", r.get_ref()),
                    )
                })?;
            Action::Login {
                realm: index as u16,
            }
        }
        other => {
            return Err(err(
                at,
                format!(
                    "unknown action {other:?} (allow, deny, challenge, timelock, login, weigh)"
                ),
            ))
        }
    })
}

fn parse_net(s: &str) -> Option<IpNet> {
    s.parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(IpNet::from))
        .map(|n| n.trunc())
}

fn merge(mut ranges: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    ranges.sort();
    let mut out: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

fn first_line(s: &str) -> &str {
    s.lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or(s)
        .trim()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(text: &str) -> Policy {
        Policy::parse(
            text,
            Path::new("/etc/tern/policy.toml"),
            &["staff", "guests"],
        )
        .unwrap()
    }

    fn error(text: &str) -> String {
        Policy::parse(text, Path::new("/etc/tern/policy.toml"), &["staff"])
            .err()
            .unwrap()
            .to_string()
    }

    fn decide(p: &Policy, method: &str, path: &str, ua: &str, ip: &str) -> (String, Action) {
        let d = p.evaluate(
            method,
            path,
            |n| match n {
                "user-agent" => Some(ua.as_bytes()),
                "accept" => Some(b"text/html".as_slice()),
                _ => None,
            },
            ip.parse().unwrap(),
        );
        (p.rule_names()[d.rule as usize].clone(), d.action)
    }

    const P: &str = r#"
[[rule]]
name = "robots"
action = "allow"
path_prefix = ["/robots.txt", "/.well-known/"]

[[rule]]
name = "office"
action = "allow"
cidr = ["192.0.2.0/24", "2001:db8::/32"]

[[rule]]
name = "staff"
action = "login"
realm = "staff"
path_prefix = "/admin/"

[[rule]]
name = "bad-bot"
action = "deny"
user_agent = "(?i)badbot"

[[rule]]
name = "html-posts"
action = "timelock"
seconds = 2
method = "POST"
header = { Accept = "html" }

[[rule]]
name = "browser"
action = "weigh"
user_agent = "Mozilla"
weight = 10

[[rule]]
name = "old"
action = "weigh"
path_regex = "^/archive/"
weight = 15

[[threshold]]
below = 1
action = "allow"

[[threshold]]
below = 20
action = "challenge"
difficulty = 12

[[threshold]]
action = "deny"
"#;

    #[test]
    fn first_deciding_rule_wins_then_thresholds() {
        let p = policy(P);
        let a = |m, path, ua, ip| decide(&p, m, path, ua, ip);
        assert_eq!(
            a("GET", "/robots.txt", "BadBot", "203.0.113.1"),
            ("robots".into(), Action::Allow)
        );
        assert_eq!(
            a("GET", "/x", "BadBot", "192.0.2.77"),
            ("office".into(), Action::Allow)
        );
        assert_eq!(
            a("GET", "/x", "BadBot", "::ffff:192.0.2.77"),
            ("office".into(), Action::Allow)
        );
        assert_eq!(
            a("GET", "/x", "BadBot", "2001:db8:5::1"),
            ("office".into(), Action::Allow)
        );
        assert_eq!(
            a("GET", "/admin/users", "curl", "203.0.113.1"),
            ("staff".into(), Action::Login { realm: 0 })
        );
        assert_eq!(
            a("GET", "/x", "a BADBOT b", "203.0.113.1"),
            ("bad-bot".into(), Action::Deny)
        );
        assert_eq!(
            a("POST", "/x", "curl", "203.0.113.1"),
            ("html-posts".into(), Action::TimeLock { seconds: 2 })
        );
        assert_eq!(
            a("GET", "/x", "curl", "203.0.113.1"),
            ("threshold:below 1".into(), Action::Allow)
        );
        assert_eq!(
            a("GET", "/x", "Mozilla/5.0", "203.0.113.1"),
            (
                "threshold:below 20".into(),
                Action::Challenge { difficulty: 12 }
            )
        );
        assert_eq!(
            a("GET", "/archive/1", "Mozilla/5.0", "203.0.113.1"),
            ("threshold:rest".into(), Action::Deny)
        );
        assert_eq!(
            a("GET", "/archive/1", "curl", "203.0.113.1").1,
            Action::Challenge { difficulty: 12 }
        );
    }

    #[test]
    fn no_thresholds_means_allow_by_default() {
        let p = policy("[[rule]]\nname = \"w\"\naction = \"weigh\"\nweight = 5\n");
        assert_eq!(
            decide(&p, "GET", "/", "x", "10.0.0.1"),
            ("default".into(), Action::Allow)
        );
    }

    /// Prefixes match whole segments of the decoded path, however the rule spells them.
    #[test]
    fn prefixes_match_decoded_segments() {
        let p = policy(
            "[[rule]]\nname = \"r\"\naction = \"allow\"\npath_prefix = [\"/robots.txt\", \"/caf%C3%A9\"]\n\
             [[rule]]\nname = \"d\"\naction = \"deny\"\n",
        );
        let a = |path| decide(&p, "GET", path, "x", "10.0.0.1").1;
        assert_eq!(a("/robots.txt"), Action::Allow);
        assert_eq!(a("/robots.txt.bak"), Action::Deny);
        assert_eq!(a("/café/menu"), Action::Allow);
        assert_eq!(a("/cafés"), Action::Deny);
        let e = Policy::parse(
            "[[rule]]\nname = \"r\"\naction = \"allow\"\npath_prefix = \"/a%2Fb\"\n",
            Path::new("p.toml"),
            &[],
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("no canonical form"), "{e}");
    }

    #[test]
    fn a_missing_header_does_not_match() {
        let p =
            policy("[[rule]]\nname = \"h\"\naction = \"deny\"\nheader = { X-Missing = \".*\" }\n");
        assert_eq!(decide(&p, "GET", "/", "x", "10.0.0.1").1, Action::Allow);
    }

    #[test]
    fn cidr_files_are_read_relative_to_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("crawlers.txt"),
            "# good ones\n198.51.100.0/24\n2001:db8:1::/48 # v6\n203.0.113.5\n",
        )
        .unwrap();
        let path = dir.path().join("policy.toml");
        std::fs::write(
            &path,
            "[[rule]]\nname = \"c\"\naction = \"deny\"\ncidr_file = \"crawlers.txt\"\n",
        )
        .unwrap();
        let p = Policy::load(&path, &[]).unwrap();
        assert_eq!(p.cidr_files(), &[dir.path().join("crawlers.txt")]);
        assert_eq!(decide(&p, "GET", "/", "x", "198.51.100.9").1, Action::Deny);
        assert_eq!(decide(&p, "GET", "/", "x", "203.0.113.5").1, Action::Deny);
        assert_eq!(decide(&p, "GET", "/", "x", "203.0.113.6").1, Action::Allow);
        assert_eq!(
            decide(&p, "GET", "/", "x", "2001:db8:1:9::1").1,
            Action::Deny
        );
        std::fs::write(dir.path().join("crawlers.txt"), "nonsense\n").unwrap();
        let e = Policy::load(&path, &[]).err().unwrap().to_string();
        assert!(
            e.contains("line 4") && e.contains("crawlers.txt: line 1"),
            "{e}"
        );
    }

    #[test]
    fn errors_name_their_line() {
        let cases = [
            ("[[rule]]\nname = \"x\"\naction = \"jump\"\n", 3, "unknown action"),
            ("[[rule]]\nname = \"x\"\naction = \"deny\"\nuser_agent = \"(\"\n", 4, "bad regex"),
            ("[[rule]]\nname = \"x\"\naction = \"deny\"\ncidr = [\"10.0.0.0/33\"]\n", 4, "not a network"),
            ("[[rule]]\nname = \"x\"\naction = \"login\"\nrealm = \"nobody\"\n", 4, "no realm"),
            ("[[rule]]\nname = \"x\"\naction = \"challenge\"\ndifficulty = 40\n", 4, "1 to 32"),
            ("[[rule]]\nname = \"x\"\naction = \"deny\"\ncolour = \"red\"\n", 4, "unknown field"),
            ("[[rule]]\nname = \"x\"\naction = \"weigh\"\n", 3, "needs a weight"),
            ("[[rule]]\nname = \"x\"\naction = \"deny\"\n[[rule]]\nname = \"x\"\naction = \"deny\"\n", 5, "twice"),
            ("[[rule]]\nname = \"x\"\naction = \"deny\"\ndifficulty = 3\n", 3, "does not apply"),
            ("[[rule]]\nname = \"x\"\naction = \"deny\"\nmethod = \"get\"\n", 4, "upper-case"),
            ("[[threshold]]\naction = \"allow\"\n[[threshold]]\nbelow = 3\naction = \"deny\"\n", 2, "only the last"),
            ("[[threshold]]\nbelow = 5\naction = \"allow\"\n[[threshold]]\nbelow = 3\naction = \"deny\"\n", 6, "increasing"),
            ("[[threshold]]\nbelow = 5\naction = \"allow\"\n", 1, "catch-all"),
        ];
        for (text, line, what) in cases {
            let e = error(text);
            assert!(
                e.starts_with(&format!("policy /etc/tern/policy.toml: line {line}: ")),
                "{text:?}: {e}"
            );
            assert!(e.contains(what), "{text:?}: {e}");
        }
    }

    #[test]
    fn ranges_merge_and_search() {
        let r = merge(vec![(10, 20), (15, 30), (31, 40), (50, 60)]);
        assert_eq!(r, vec![(10, 40), (50, 60)]);
        assert!(in_ranges(&r, 10) && in_ranges(&r, 40) && in_ranges(&r, 55));
        assert!(!in_ranges(&r, 9) && !in_ranges(&r, 41) && !in_ranges(&r, 61));
    }

    fn default_decision(method: &str, path: &str, ua: &str) -> Action {
        let p = Policy::parse(DEFAULT_POLICY, Path::new("default"), &[]).unwrap();
        let d = p.evaluate(
            method,
            path,
            |n| match n {
                "user-agent" => Some(ua.as_bytes()),
                _ => None,
            },
            "203.0.113.9".parse().unwrap(),
        );
        d.action
    }

    #[test]
    fn the_default_policy() {
        const FIREFOX: &str =
            "Mozilla/5.0 (X11; Linux x86_64; rv:132.0) Gecko/20100101 Firefox/132.0";
        const CHROME: &str = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
        const SAFARI: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_0 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.0 Mobile/15E148 Safari/604.1";
        const GPTBOT: &str = "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)";
        for ua in [FIREFOX, CHROME, SAFARI] {
            assert!(
                matches!(default_decision("GET", "/", ua), Action::Challenge { .. }),
                "{ua}"
            );
            assert_eq!(default_decision("GET", "/robots.txt", ua), Action::Allow);
            assert_eq!(
                default_decision("GET", "/.well-known/security.txt", ua),
                Action::Allow
            );
            assert_eq!(default_decision("GET", "/favicon.ico", ua), Action::Allow);
            assert_eq!(default_decision("GET", "/sitemap.xml", ua), Action::Allow);
            // A write a read would have to earn needs the same session (the guard refuses it
            // with 403 when there is none, never turning it into a GET).
            assert!(
                matches!(
                    default_decision("POST", "/comment", ua),
                    Action::Challenge { .. }
                ),
                "{ua}"
            );
        }
        assert_eq!(default_decision("GET", "/", GPTBOT), Action::Deny);
        for method in ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"] {
            assert_eq!(
                default_decision(method, "/comment", GPTBOT),
                Action::Deny,
                "{method}: refused crawlers are refused whatever the method"
            );
        }
        for path in ["/favicon.ico", "/sitemap.xml", "/.well-known/security.txt"] {
            assert_eq!(
                default_decision("GET", path, GPTBOT),
                Action::Deny,
                "{path}"
            );
        }
        assert_eq!(
            default_decision("POST", "/robots.txt", FIREFOX),
            default_decision("POST", "/", FIREFOX),
            "robots.txt is open for reading only"
        );
        // Feed readers are let in by name, not by any user agent that mentions a feed.
        for ua in [
            "python-requests/2.31 rss",
            "Mozilla/5.0 (X11; Linux x86_64) Atom/1.0 Chrome/131.0.0.0",
            "Mozilla/5.0 (compatible; rss-grabber/1.0)",
        ] {
            assert_ne!(default_decision("GET", "/", ua), Action::Allow, "{ua}");
        }
        assert_eq!(
            default_decision("GET", "/robots.txt", GPTBOT),
            Action::Allow,
            "robots.txt is for everyone"
        );
        for ua in [
            "curl/8.5.0",
            "Wget/1.21.4",
            "git/2.43.0",
            "Miniflux/2.1 (+https://miniflux.app)",
            "Mozilla/5.0 (compatible; Feedly/1.0)",
            "Thunderbird/128.0 feed",
        ] {
            assert_eq!(default_decision("GET", "/", ua), Action::Allow, "{ua}");
        }
        assert!(
            matches!(default_decision("GET", "/", ""), Action::TimeLock { .. }),
            "no user agent: wait a moment"
        );
        assert!(
            matches!(default_decision("GET", "/feed.xml", FIREFOX), Action::Allow),
            "feeds open in browsers too"
        );
    }
}
