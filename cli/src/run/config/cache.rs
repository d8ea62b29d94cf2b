//! A proxy or PHP route's shared cache (`tern_proxy::cache`, rules in `tern_cache`): `cache = true`
//! (the cache named "default") or `cache = "NAME"`, a `[cache.NAME]` block with its sizes,
//! and the route's `cache_*` keys: what enters the key, lifetimes by status for answers that
//! give none, which cookies bypass it, and whether `Cache-Status` is written.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use super::file::{RouteFile, RunFile};
use super::problems::Problems;
use super::route::{kind_keys, KindKey};

/// The cache keys of a proxy or PHP route.
pub(super) const KEYS: &[KindKey] = kind_keys![
    cache,
    cache_key_query,
    cache_key_headers,
    cache_valid,
    cache_bypass_cookies,
    cache_ignore_cookies,
    cache_authorized,
    cache_status,
    cache_override,
];

/// `cache = true` or `cache = "NAME"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum CacheChoice {
    On(bool),
    Named(String),
}

/// `cache_key_query = "all" | "none" | "sorted"` or a list of parameter names.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum KeyQueryFile {
    Word(String),
    Names(Vec<String>),
}

/// `[cache.NAME]`: sizes as bytes or with a K, M or G suffix ("256M").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CacheBlock {
    pub(super) memory: Option<Spanned<String>>,
    pub(super) max_object: Option<Spanned<String>>,
    /// How long a miss waits for another request's fill of its key ("5s", "500ms"; "0":
    /// misses never wait).
    pub(super) lock: Option<Spanned<String>>,
    /// How long past its lifetime an entry still answers while one request refreshes it,
    /// and when the app fails ("30s", "1h"; an answer's own `stale-while-revalidate` and
    /// `stale-if-error` may give longer).
    pub(super) stale_while_updating: Option<Spanned<String>>,
    pub(super) stale_if_error: Option<Spanned<String>>,
    /// A folder of the cache's own for bodies over `max_object` (sent with `sendfile`), at
    /// most `disk_size` bytes of them, each at most `max_disk_object`.
    pub(super) disk: Option<Spanned<String>>,
    pub(super) disk_size: Option<Spanned<String>>,
    pub(super) max_disk_object: Option<Spanned<String>>,
}

/// A cache's folder, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskPlan {
    pub folder: std::path::PathBuf,
    pub size: u64,
    pub max_object: u64,
}

/// A route's cache, checked.
#[derive(Debug, Clone)]
pub struct CachePlan {
    pub name: String,
    pub memory: u64,
    pub max_object: u64,
    pub rules: tern_cache::Rules,
    pub status_field: bool,
    /// See [`CacheBlock::lock`].
    pub lock: std::time::Duration,
    pub disk: Option<DiskPlan>,
}

const DEFAULT_MEMORY: u64 = 64 << 20;
const DEFAULT_MAX_OBJECT: u64 = 1 << 20;
const DEFAULT_DISK_SIZE: u64 = 1 << 30;
/// nginx's `proxy_cache_lock_timeout`.
const DEFAULT_LOCK: std::time::Duration = std::time::Duration::from_secs(5);
/// A wait longer than this is a mistake: the app's first-byte timeout is the bound that
/// matters by then.
const MAX_LOCK: std::time::Duration = std::time::Duration::from_secs(600);

/// `"500ms"`, or a duration as [`duration`] reads it.
fn lock_time(text: &str) -> Option<std::time::Duration> {
    match text.trim().strip_suffix("ms") {
        Some(ms) => ms.parse().ok().map(std::time::Duration::from_millis),
        None => duration(text).map(std::time::Duration::from_secs),
    }
}

fn size(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().last()? {
        (i, 'K' | 'k') => (&t[..i], 1 << 10),
        (i, 'M' | 'm') => (&t[..i], 1 << 20),
        (i, 'G' | 'g') => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// `"10m"`, `"30s"`, `"2h"`, `"1d"`, or seconds.
fn duration(text: &str) -> Option<u64> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().last()? {
        (i, 's') => (&t[..i], 1),
        (i, 'm') => (&t[..i], 60),
        (i, 'h') => (&t[..i], 3600),
        (i, 'd') => (&t[..i], 86_400),
        _ => (t, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(unit)
}

/// The route's cache, if it has one; problems go to `p` (and give None).
pub(super) fn check_cache(
    route: &RouteFile,
    file: &RunFile,
    p: &mut Problems<'_>,
) -> Option<CachePlan> {
    let choice = route.cache.as_ref()?;
    let at = choice.span().start;
    let name = chosen(route)?.to_owned();
    let mut ok = true;
    let (mut memory, mut max_object) = (DEFAULT_MEMORY, DEFAULT_MAX_OBJECT);
    let mut lock = DEFAULT_LOCK;
    let (mut stale_while_updating, mut stale_if_error) = (0, 0);
    let mut disk = None;
    match file
        .cache
        .as_ref()
        .and_then(|c| c.get(&name))
        .map(Spanned::get_ref)
    {
        None if name != "default" => {
            p.at(at, format!("cache {name:?} has no [cache.{name}] block"));
            ok = false;
        }
        None => {}
        Some(block) => {
            let mut read = |v: &Option<Spanned<String>>, what: &str, into: &mut u64| {
                if let Some(v) = v {
                    match size(v.get_ref()) {
                        Some(n) if n > 0 => *into = n,
                        _ => {
                            p.at(
                                v.span().start,
                                format!("{what} {:?}: a size such as \"64M\"", v.get_ref()),
                            );
                            ok = false;
                        }
                    }
                }
            };
            read(&block.memory, "memory", &mut memory);
            read(&block.max_object, "max_object", &mut max_object);
            for (v, what, into) in [
                (
                    &block.stale_while_updating,
                    "stale_while_updating",
                    &mut stale_while_updating,
                ),
                (&block.stale_if_error, "stale_if_error", &mut stale_if_error),
            ] {
                let Some(v) = v else { continue };
                match duration(v.get_ref()) {
                    Some(secs) => *into = secs,
                    None => {
                        p.at(
                            v.span().start,
                            format!(
                                "{what} {:?}: a duration such as \"30s\" or \"1h\"",
                                v.get_ref()
                            ),
                        );
                        ok = false;
                    }
                }
            }
            if let Some(v) = &block.lock {
                match lock_time(v.get_ref()) {
                    Some(t) if t <= MAX_LOCK => lock = t,
                    _ => {
                        p.at(
                            v.span().start,
                            format!("lock {:?}: a duration such as \"5s\" or \"500ms\" (at most 10m; \"0\": misses never wait)", v.get_ref()),
                        );
                        ok = false;
                    }
                }
            }
            disk = check_disk(block, max_object, p, &mut ok);
            if max_object > memory / 4 {
                let at = block
                    .max_object
                    .as_ref()
                    .or(block.memory.as_ref())
                    .map_or(at, |v| v.span().start);
                p.at(at, format!("max_object ({max_object} bytes) must be at most a quarter of memory ({memory})"));
                ok = false;
            }
        }
    }
    let mut rules = tern_cache::Rules {
        // The largest object either tier keeps.
        max_object: disk
            .as_ref()
            .map_or(max_object, |d: &DiskPlan| d.max_object),
        stale_while_updating,
        stale_if_error,
        ..tern_cache::Rules::default()
    };
    if let Some(q) = &route.cache_key_query {
        rules.key_query = match q.get_ref() {
            KeyQueryFile::Word(w) if w == "all" => tern_cache::KeyQuery::All,
            KeyQueryFile::Word(w) if w == "none" => tern_cache::KeyQuery::None,
            KeyQueryFile::Word(w) if w == "sorted" => tern_cache::KeyQuery::Sorted,
            KeyQueryFile::Names(names) => tern_cache::KeyQuery::Only(names.clone()),
            KeyQueryFile::Word(w) => {
                p.at(q.span().start, format!("cache_key_query {w:?}: use \"all\", \"none\", \"sorted\" or a list of names"));
                ok = false;
                tern_cache::KeyQuery::All
            }
        };
    }
    if let Some(h) = &route.cache_key_headers {
        for name in h.get_ref() {
            if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                p.at(
                    h.span().start,
                    format!("cache_key_headers: {name:?} is not a field name"),
                );
                ok = false;
            }
            let lower = name.to_ascii_lowercase();
            if ["authorization", "cookie"].contains(&lower.as_str()) {
                p.at(h.span().start, format!("cache_key_headers: {name} is a credential: use cache_authorized or the cookie keys"));
                ok = false;
            }
            rules.key_headers.push(lower);
        }
    }
    if let Some(v) = &route.cache_valid {
        for (statuses, life) in v.get_ref() {
            let Some(secs) = duration(life) else {
                p.at(
                    v.span().start,
                    format!("cache_valid {statuses:?}: {life:?} is not a duration such as \"10m\""),
                );
                ok = false;
                continue;
            };
            for s in statuses.split_whitespace() {
                match s.parse::<u16>() {
                    Ok(status) if [200, 203, 204, 300, 301, 308, 404, 410].contains(&status) => {
                        rules.valid.push((status, secs));
                    }
                    _ => {
                        p.at(v.span().start, format!("cache_valid: {s:?} is not a status that is stored (200 203 204 300 301 308 404 410)"));
                        ok = false;
                    }
                }
            }
        }
    }
    let patterns = |v: &Spanned<Vec<String>>| {
        v.get_ref()
            .iter()
            .map(|s| tern_cache::CookiePattern::new(s))
            .collect::<Vec<_>>()
    };
    match (&route.cache_bypass_cookies, &route.cache_ignore_cookies) {
        (Some(b), Some(_)) => {
            p.at(
                b.span().start,
                "give cache_bypass_cookies or cache_ignore_cookies, not both",
            );
            ok = false;
        }
        (Some(b), None) => rules.cookies = tern_cache::CookieRule::Only(patterns(b)),
        (None, Some(i)) => rules.cookies = tern_cache::CookieRule::AllBut(patterns(i)),
        (None, None) => {}
    }
    rules.cache_authorized = route
        .cache_authorized
        .as_ref()
        .is_some_and(|v| *v.get_ref());
    if let Some(o) = &route.cache_override {
        rules.override_headers = *o.get_ref();
        if rules.override_headers && rules.valid.is_empty() {
            p.at(
                o.span().start,
                "cache_override needs cache_valid: its lifetimes replace the answers' own",
            );
            ok = false;
        }
    }
    let status_field = route.cache_status.as_ref().is_some_and(|v| *v.get_ref());
    ok.then_some(CachePlan {
        name,
        memory,
        max_object,
        rules,
        status_field,
        lock,
        disk,
    })
}

/// A `[cache.NAME]` block's folder, if it names one.
fn check_disk(
    block: &CacheBlock,
    max_object: u64,
    p: &mut Problems<'_>,
    ok: &mut bool,
) -> Option<DiskPlan> {
    let Some(folder) = &block.disk else {
        for v in [&block.disk_size, &block.max_disk_object]
            .into_iter()
            .flatten()
        {
            p.at(
                v.span().start,
                "disk_size and max_disk_object need a disk folder",
            );
            *ok = false;
        }
        return None;
    };
    let path = std::path::PathBuf::from(folder.get_ref());
    if !path.is_absolute() {
        p.at(
            folder.span().start,
            format!(
                "disk {:?}: an absolute path, a folder of the cache's own",
                folder.get_ref()
            ),
        );
        *ok = false;
    }
    let mut read = |v: &Option<Spanned<String>>, what: &str, default: u64| match v {
        None => Some(default),
        Some(v) => match size(v.get_ref()) {
            Some(n) if n > 0 => Some(n),
            _ => {
                p.at(
                    v.span().start,
                    format!("{what} {:?}: a size such as \"1G\"", v.get_ref()),
                );
                *ok = false;
                None
            }
        },
    };
    let size = read(&block.disk_size, "disk_size", DEFAULT_DISK_SIZE)?;
    let max_disk_object = read(&block.max_disk_object, "max_disk_object", size / 4)?;
    let at = block
        .max_disk_object
        .as_ref()
        .or(block.disk_size.as_ref())
        .unwrap_or(folder)
        .span()
        .start;
    if max_disk_object > size / 4 {
        p.at(at, format!("max_disk_object ({max_disk_object} bytes) must be at most a quarter of disk_size ({size})"));
        *ok = false;
    }
    if max_disk_object <= max_object {
        p.at(at, format!("max_disk_object ({max_disk_object} bytes) must be larger than max_object ({max_object}): the folder keeps the bodies memory does not"));
        *ok = false;
    }
    Some(DiskPlan {
        folder: path,
        size,
        max_object: max_disk_object,
    })
}

/// The `[cache.NAME]` blocks (each with its place in the file, for the unused-block check).
pub(super) type CacheBlocks = BTreeMap<String, Spanned<CacheBlock>>;

/// The name a route's `cache` key chooses, if any.
fn chosen(route: &RouteFile) -> Option<&str> {
    match route.cache.as_ref()?.get_ref() {
        CacheChoice::On(false) => None,
        CacheChoice::On(true) => Some("default"),
        CacheChoice::Named(n) => Some(n),
    }
}

/// A `[cache.NAME]` block no route chooses is a mistake (a misspelt name, a route that lost
/// its `cache` key): its memory would be reserved for nothing, so it is refused.
pub(super) fn check_unused(file: &RunFile, p: &mut Problems<'_>) {
    let Some(blocks) = &file.cache else { return };
    for (name, block) in blocks {
        let used = file
            .site
            .iter()
            .flat_map(|s| &s.route)
            .any(|r| chosen(r) == Some(name.as_str()));
        if !used {
            p.at(
                block.span().start,
                format!("[cache.{name}] is not used: no route has cache = {name:?}"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations() {
        assert_eq!(size("64M"), Some(64 << 20));
        assert_eq!(size("512k"), Some(512 << 10));
        assert_eq!(size("1000"), Some(1000));
        assert_eq!(size("x"), None);
        assert_eq!(duration("10m"), Some(600));
        assert_eq!(duration("2h"), Some(7200));
        assert_eq!(duration("45"), Some(45));
        assert_eq!(duration("m"), None);
        assert_eq!(
            lock_time("500ms"),
            Some(std::time::Duration::from_millis(500))
        );
        assert_eq!(lock_time("5s"), Some(std::time::Duration::from_secs(5)));
        assert_eq!(lock_time("0"), Some(std::time::Duration::ZERO));
        assert_eq!(lock_time("soon"), None);
    }
}
