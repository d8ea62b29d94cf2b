//! Cache keys: the parts of a request that choose its entry, hashed to 128 bits with keys
//! drawn at each start. The parts are what tern decided, never a second parse of the URL:
//! the route (which carries the site the vhost table chose), the scheme and the Host the app
//! is sent, the canonical path (`RequestHead::path`), the query as the route keys it, the
//! method class, and the values of the route's key fields. An attacker chooses most of these
//! bytes, so the hash is SipHash keyed per start (std's `RandomState`): colliding two keys, or
//! flooding one shard of the store, would need the secret.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use crate::policy::{values, Field};

/// An entry's key (two independent 64-bit keyed hashes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub u128);

/// What a request's key is made of.
#[derive(Debug, Clone, Copy)]
pub struct KeyParts<'a> {
    /// The route (and so the site) the request took, as the handler was built with it.
    pub route: &'a str,
    pub secure: bool,
    /// The Host the app is sent.
    pub host: &'a [u8],
    /// The canonical path.
    pub path: &'a str,
    /// The query as keyed (`policy::keyed_query`).
    pub query: Option<&'a str>,
    /// What else the app is told about the target, for a FastCGI route: the path the
    /// client asked for (`REQUEST_URI`, which a `try_files` fallback leaves as it was while
    /// `path` becomes the script's), the script the path resolved to and its `PATH_INFO`.
    /// Empty for a proxy route, whose app gets `path` alone.
    pub script: &'a [&'a str],
}

/// Makes keys; one per process start (a reload keeps it, so entries survive a reload).
pub struct Keyer {
    high: RandomState,
    low: RandomState,
}

impl Default for Keyer {
    fn default() -> Self {
        Keyer::new()
    }
}

impl Keyer {
    pub fn new() -> Keyer {
        Keyer {
            high: RandomState::new(),
            low: RandomState::new(),
        }
    }

    /// The key of a GET (or HEAD) for `parts`, with the values of the `key_headers` fields.
    pub fn key(&self, parts: &KeyParts<'_>, key_headers: &[String], fields: &[Field<'_>]) -> Key {
        let mut a = self.high.build_hasher();
        let mut b = self.low.build_hasher();
        let mut write = |bytes: &[u8]| {
            // Length first: no two sequences of parts write the same bytes.
            let len = (bytes.len() as u64).to_le_bytes();
            a.write(&len);
            a.write(bytes);
            b.write(&len);
            b.write(bytes);
        };
        write(parts.route.as_bytes());
        write(if parts.secure { b"https" } else { b"http" });
        write(parts.host);
        write(parts.path.as_bytes());
        match parts.query {
            Some(q) => write(q.as_bytes()),
            // Absent, unlike an empty query (`/p?` and `/p` are different targets).
            None => write(b"\xff"),
        }
        for part in parts.script {
            write(part.as_bytes());
        }
        write(&(parts.script.len() as u64).to_le_bytes());
        for name in key_headers {
            write(name.as_bytes());
            let mut n = 0u64;
            for v in values(fields, name) {
                write(v);
                n += 1;
            }
            write(&n.to_le_bytes());
        }
        Key((u128::from(a.finish()) << 64) | u128::from(b.finish()))
    }
}

/// `host` (a Host value the codec accepted) lower-cased, without the trailing dot of its
/// name; the port kept: the form a key holds (and what a keyed request tells the app), and
/// what a purge's host is compared in. Too long for `buf` (no site could match it): as it
/// came.
pub fn normal_host<'b>(host: &'b [u8], buf: &'b mut [u8; 264]) -> &'b [u8] {
    let host = tern_codec::trim_ows(host);
    if host.len() > buf.len() {
        return host;
    }
    let (name, port) = split_port(host);
    let name = name.strip_suffix(b".").unwrap_or(name);
    let n = name.len();
    buf[..n].copy_from_slice(name);
    buf[..n].make_ascii_lowercase();
    buf[n..n + port.len()].copy_from_slice(port);
    &buf[..n + port.len()]
}

/// A host's name and its port with the colon (`:8080`, or empty); an IPv6 literal's colons
/// stay in its name (`[::1]:80` → `[::1]`, `:80`).
pub fn split_port(host: &[u8]) -> (&[u8], &[u8]) {
    match host.iter().rposition(|&b| b == b':') {
        Some(i) if !host.starts_with(b"[") || host[..i].ends_with(b"]") => host.split_at(i),
        _ => (host, &[]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts<'a>(path: &'a str, query: Option<&'a str>) -> KeyParts<'a> {
        KeyParts {
            route: "site0/route1",
            secure: true,
            host: b"example.com",
            path,
            query,
            script: &[],
        }
    }

    #[test]
    fn every_part_chooses_the_entry() {
        let k = Keyer::new();
        let base = k.key(&parts("/a", Some("x=1")), &[], &[]);
        assert_eq!(base, k.key(&parts("/a", Some("x=1")), &[], &[]));
        assert_ne!(base, k.key(&parts("/a", None), &[], &[]));
        assert_ne!(
            k.key(&parts("/a", Some("")), &[], &[]),
            k.key(&parts("/a", None), &[], &[])
        );
        assert_ne!(base, k.key(&parts("/b", Some("x=1")), &[], &[]));
        assert_ne!(
            base,
            k.key(
                &KeyParts {
                    secure: false,
                    ..parts("/a", Some("x=1"))
                },
                &[],
                &[]
            )
        );
        assert_ne!(
            base,
            k.key(
                &KeyParts {
                    host: b"other.example",
                    ..parts("/a", Some("x=1"))
                },
                &[],
                &[]
            )
        );
        assert_ne!(
            base,
            k.key(
                &KeyParts {
                    route: "site1/route1",
                    ..parts("/a", Some("x=1"))
                },
                &[],
                &[]
            )
        );
        // A FastCGI route's script parts: which script, and where its PATH_INFO starts.
        let script = |s: &'static [&'static str]| {
            k.key(
                &KeyParts {
                    script: s,
                    ..parts("/index.php", None)
                },
                &[],
                &[],
            )
        };
        assert_ne!(
            script(&["/a", "/index.php", ""]),
            script(&["/b", "/index.php", ""])
        );
        assert_ne!(
            script(&["/a.php/b", "/a.php", "/b"]),
            script(&["/a.php/b", "/a.php/b", ""])
        );
        assert_ne!(script(&[]), script(&[""]));
        // Parts do not run into each other.
        assert_ne!(
            k.key(
                &KeyParts {
                    host: b"ab",
                    path: "/c",
                    ..parts("", None)
                },
                &[],
                &[]
            ),
            k.key(
                &KeyParts {
                    host: b"a",
                    path: "b/c",
                    ..parts("", None)
                },
                &[],
                &[]
            )
        );
    }

    #[test]
    fn key_fields_choose_the_entry_and_others_do_not() {
        let k = Keyer::new();
        let lang = vec!["accept-language".to_owned()];
        let fr = [
            ("Accept-Language", &b"fr"[..]),
            ("X-Forwarded-Host", &b"evil"[..]),
        ];
        let en = [("Accept-Language", &b"en"[..])];
        let p = parts("/", None);
        assert_ne!(k.key(&p, &lang, &fr), k.key(&p, &lang, &en));
        assert_ne!(
            k.key(&p, &lang, &[]),
            k.key(&p, &lang, &[("accept-language", b"")])
        );
        // A field not in the key changes nothing.
        assert_eq!(k.key(&p, &[], &fr), k.key(&p, &[], &en));
        assert_eq!(k.key(&p, &lang, &fr), k.key(&p, &lang, &fr[..1]));
    }

    #[test]
    fn keys_differ_between_starts() {
        let p = parts("/", None);
        assert_ne!(
            Keyer::new().key(&p, &[], &[]),
            Keyer::new().key(&p, &[], &[])
        );
    }
}
