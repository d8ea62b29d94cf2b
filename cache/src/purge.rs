//! Purging: which entries an operator's `tern cache purge` drops. Each entry keeps what it
//! was stored for (its [`Target`]: the host and canonical path its key holds, and the query
//! as keyed) and the tags the app gave it (`Cache-Tag`, `Surrogate-Key`); a [`Purge`] names
//! entries by those, never by key, since one URL has an entry per query and per variant.
//!
//! A purge names its target the way a request would be keyed: the host as the proxy keys it
//! (lower case, no trailing dot) and the path in its canonical form, so `/a/./b%2Dc` purges
//! the entry a request for `/a/b-c` made.

use std::borrow::Cow;

use crate::key::{normal_host, split_port};

/// What an entry was stored for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The Host its key holds (`key_host`: lower case, no trailing dot, any port kept).
    pub host: Box<[u8]>,
    /// The canonical path.
    pub path: Box<str>,
    /// The query as keyed (`policy::keyed_query`).
    pub query: Option<Box<str>>,
}

impl Target {
    pub fn new(host: &[u8], path: &str, query: Option<&str>) -> Target {
        Target {
            host: host.into(),
            path: path.into(),
            query: query.map(Into::into),
        }
    }

    /// Bytes it holds, for the entry's weight.
    pub fn bytes(&self) -> u64 {
        (self.host.len() + self.path.len() + self.query.as_ref().map_or(0, |q| q.len())) as u64
    }

    /// The host without a port (`example.com:8080` → `example.com`).
    fn host_name(&self) -> &[u8] {
        split_port(&self.host).0
    }
}

/// Which entries to drop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purge {
    /// Every entry of one URL: each variant, and each query unless the URL has one.
    Url {
        host: HostMatch,
        path: String,
        query: Option<String>,
    },
    /// Every entry whose path starts with `path` (on `host`, or on every host).
    Prefix {
        host: Option<HostMatch>,
        path: String,
    },
    /// Every entry the app tagged so.
    Tag(String),
    All,
}

/// A purge's host: a name matches every port a client wrote with it; a name with a port,
/// that port only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMatch {
    name: Vec<u8>,
    port: Option<Vec<u8>>,
}

impl HostMatch {
    fn matches(&self, target: &Target) -> bool {
        match &self.port {
            None => target.host_name() == self.name.as_slice(),
            Some(port) => {
                target.host.len() == self.name.len() + 1 + port.len()
                    && target.host.starts_with(&self.name)
                    && target.host[self.name.len()] == b':'
                    && target.host.ends_with(port)
            }
        }
    }
}

impl Purge {
    /// Whether the entry stored for `target` with `tags` is to go.
    pub fn matches(&self, target: &Target, tags: &[Box<str>]) -> bool {
        match self {
            Purge::All => true,
            Purge::Tag(tag) => tags.iter().any(|t| **t == **tag),
            Purge::Url { host, path, query } => {
                host.matches(target)
                    && *target.path == **path
                    && query
                        .as_ref()
                        .is_none_or(|q| target.query.as_deref() == Some(q.as_str()))
            }
            Purge::Prefix { host, path } => {
                host.as_ref().is_none_or(|h| h.matches(target)) && target.path.starts_with(&**path)
            }
        }
    }

    /// A purge of `url` (`http[s]://host[:port]/path[?query]`): its entries, or with
    /// `prefix`, every entry under its path. A prefix may also be a path alone (`/blog/`):
    /// under it on every host.
    pub fn of_url(url: &str, prefix: bool) -> Result<Purge, String> {
        if prefix && url.starts_with('/') {
            return Ok(Purge::Prefix {
                host: None,
                path: canonical(url)?,
            });
        }
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"))
            .ok_or_else(|| format!("{url:?}: not an http:// or https:// URL"))?;
        let (authority, target) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        if authority.is_empty() || authority.contains(['@', '?', '#']) {
            return Err(format!("{url:?}: no host, or one with a user or a query"));
        }
        if target.contains('#') {
            return Err(format!("{url:?}: a fragment is never part of a request"));
        }
        let host = host_match(authority.as_bytes());
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p, Some(q.to_owned())),
            None => (target, None),
        };
        let path = canonical(path)?;
        Ok(match prefix {
            true => Purge::Prefix {
                host: Some(host),
                path,
            },
            false => Purge::Url { host, path, query },
        })
    }
}

/// A path as a request for it is keyed (see `tern_codec::canonical_path`).
fn canonical(path: &str) -> Result<String, String> {
    match tern_codec::canonical_path_opaque_slash(path) {
        Ok(Cow::Borrowed(p)) => Ok(p.to_owned()),
        Ok(Cow::Owned(p)) => Ok(p),
        Err(e) => Err(format!("{path:?}: no request could have this path ({e:?})")),
    }
}

/// The host as the proxy keys it (`normal_host`), the port apart.
fn host_match(authority: &[u8]) -> HostMatch {
    let mut buf = [0u8; 264];
    let (name, port) = split_port(normal_host(authority, &mut buf));
    HostMatch {
        name: name.to_vec(),
        port: port.strip_prefix(b":").map(<[u8]>::to_vec),
    }
}

/// The most tags one entry keeps, and the longest; the rest are ignored (an app is trusted,
/// but an entry's size must stay what its body makes it).
pub const MAX_TAGS: usize = 64;
pub const MAX_TAG_LEN: usize = 256;

/// The tags of an answer's `Cache-Tag` (comma-separated) and `Surrogate-Key` (space-
/// separated) values, in order, each once.
pub fn tags_of<'a>(fields: impl Iterator<Item = (&'a str, &'a [u8])>) -> Vec<Box<str>> {
    let mut tags: Vec<Box<str>> = Vec::new();
    for (name, value) in fields {
        let separator = if name.eq_ignore_ascii_case("cache-tag") {
            b','
        } else if name.eq_ignore_ascii_case("surrogate-key") {
            b' '
        } else {
            continue;
        };
        for tag in value.split(|&b| b == separator || b == b'\t' || b == b' ') {
            let Ok(tag) = std::str::from_utf8(tag.trim_ascii()) else {
                continue;
            };
            if tag.is_empty() || tag.len() > MAX_TAG_LEN || tags.iter().any(|t| **t == *tag) {
                continue;
            }
            if tags.len() == MAX_TAGS {
                return tags;
            }
            tags.push(tag.into());
        }
    }
    tags
}

/// Whether a field of an answer carries tags (never sent on to clients).
pub fn is_tag_field(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"cache-tag") || name.eq_ignore_ascii_case(b"surrogate-key")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(host: &str, path: &str, query: Option<&str>) -> Target {
        Target::new(host.as_bytes(), path, query)
    }

    #[test]
    fn a_url_purges_each_query_and_port_of_its_path_unless_it_names_them() {
        let p = Purge::of_url("https://Example.COM./a/./b%2dc", false).unwrap();
        assert!(p.matches(&target("example.com", "/a/b-c", None), &[]));
        assert!(p.matches(&target("example.com", "/a/b-c", Some("x=1")), &[]));
        assert!(p.matches(&target("example.com:8443", "/a/b-c", None), &[]));
        assert!(!p.matches(&target("www.example.com", "/a/b-c", None), &[]));
        assert!(!p.matches(&target("example.com", "/a/b-cd", None), &[]));

        let q = Purge::of_url("http://example.com:8080/p?x=1", false).unwrap();
        assert!(q.matches(&target("example.com:8080", "/p", Some("x=1")), &[]));
        assert!(!q.matches(&target("example.com:8080", "/p", Some("x=2")), &[]));
        assert!(!q.matches(&target("example.com:8080", "/p", None), &[]));
        assert!(!q.matches(&target("example.com", "/p", Some("x=1")), &[]));
        assert!(!q.matches(&target("example.com:80801", "/p", Some("x=1")), &[]));

        let root = Purge::of_url("https://example.com", false).unwrap();
        assert!(root.matches(&target("example.com", "/", None), &[]));
    }

    #[test]
    fn a_prefix_purges_under_its_path_on_its_host_or_on_every_host() {
        let p = Purge::of_url("https://example.com/blog/", true).unwrap();
        assert!(p.matches(&target("example.com", "/blog/", None), &[]));
        assert!(p.matches(&target("example.com", "/blog/2026/x", Some("a")), &[]));
        assert!(!p.matches(&target("example.com", "/blog", None), &[]));
        assert!(!p.matches(&target("other.example", "/blog/x", None), &[]));
        let everywhere = Purge::of_url("/blog/", true).unwrap();
        assert!(everywhere.matches(&target("other.example", "/blog/x", None), &[]));
        assert!(!everywhere.matches(&target("other.example", "/news/x", None), &[]));
    }

    #[test]
    fn tags_come_from_both_fields_and_purge_what_carries_them() {
        let fields: Vec<(&str, &[u8])> = vec![
            ("Cache-Tag", b"product-42, list,product-42"),
            ("Content-Type", b"text/html"),
            ("surrogate-key", b"home  list\tfront"),
        ];
        let tags = tags_of(fields.into_iter());
        let names: Vec<&str> = tags.iter().map(|t| &**t).collect();
        assert_eq!(names, ["product-42", "list", "home", "front"]);
        assert!(Purge::Tag("list".into()).matches(&target("a", "/", None), &tags));
        assert!(!Purge::Tag("lis".into()).matches(&target("a", "/", None), &tags));
        assert!(is_tag_field(b"CACHE-TAG") && !is_tag_field(b"cache-tags"));
    }

    #[test]
    fn tags_are_bounded() {
        let many: String = (0..100).map(|i| format!("t{i},")).collect();
        let long = "x".repeat(MAX_TAG_LEN + 1);
        let fields: Vec<(&str, &[u8])> = vec![
            ("cache-tag", long.as_bytes()),
            ("cache-tag", many.as_bytes()),
        ];
        let tags = tags_of(fields.into_iter());
        assert_eq!(tags.len(), MAX_TAGS);
        assert_eq!(&*tags[0], "t0");
    }

    #[test]
    fn what_no_request_could_name_is_refused() {
        for bad in [
            "ftp://example.com/",
            "https:///x",
            "https://user@example.com/",
            "https://example.com/a#b",
            "https://example.com/%00",
            "https://example.com/../x",
            "example.com/x",
        ] {
            assert!(Purge::of_url(bad, false).is_err(), "{bad}");
        }
        assert!(Purge::of_url("/a;b", true).is_err());
    }
}
