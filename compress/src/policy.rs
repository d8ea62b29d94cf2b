//! Which answers are compressed, and the header edits a compressed answer needs.

use crate::{accept, Encoding, Levels};

/// Answers whose size is known and below this are sent as they are (Caddy's default; nginx's
/// `gzip_min_length` is 20): below it the coding's own framing eats most of the gain.
pub const DEFAULT_MIN_SIZE: u64 = 512;

/// Media types compressed when a config names none: text and the structured text formats.
/// `text/*` does not take `text/event-stream` unless it is named itself (see
/// [`Policy::decide`]).
pub const DEFAULT_TYPES: &[&str] = &[
    "text/*",
    "application/json",
    "application/javascript",
    "application/x-javascript",
    "application/xml",
    "application/xhtml+xml",
    "application/rss+xml",
    "application/atom+xml",
    "application/ld+json",
    "application/manifest+json",
    "application/wasm",
    "image/svg+xml",
    "font/ttf",
    "font/otf",
];

/// A site's or a route's compression settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// In the server's order of preference; never empty.
    encodings: Vec<Encoding>,
    min_size: u64,
    /// Lowercase `type/subtype` or `type/*`.
    types: Vec<String>,
    levels: Levels,
}

/// What an answer's head says, as far as compression is concerned.
#[derive(Debug, Default, Clone, Copy)]
pub struct Answer<'a> {
    pub status: u16,
    pub content_type: Option<&'a [u8]>,
    pub content_encoding: Option<&'a [u8]>,
    pub cache_control: Option<&'a [u8]>,
    /// A `Content-Range` field is present.
    pub content_range: bool,
    /// The body's length, when known (a HEAD answer's: the one the GET would have).
    pub length: Option<u64>,
}

/// What to do with an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Not a candidate: sent as it is, no `Vary` added.
    Leave,
    /// A candidate, but this client gets identity: add `Vary: Accept-Encoding` (a cache must
    /// not give this copy to a client that asked for a coding).
    VaryOnly,
    /// Compress with this coding (and add `Vary`).
    Compress(Encoding),
}

impl Policy {
    /// `encodings`: the server's preference, no repeats; `types`: `type/subtype` or
    /// `type/*` entries (a parameter, `*/*` or a malformed entry is refused).
    pub fn new(encodings: &[Encoding], min_size: u64, types: &[String]) -> Result<Policy, String> {
        if encodings.is_empty() {
            return Err("the list of codings is empty".into());
        }
        for (i, e) in encodings.iter().enumerate() {
            if encodings[..i].contains(e) {
                return Err(format!("{} is listed twice", e.name()));
            }
        }
        let mut checked = Vec::with_capacity(types.len());
        for t in types {
            checked.push(check_type(t)?);
        }
        if checked.is_empty() {
            return Err("the list of types is empty".into());
        }
        Ok(Policy {
            encodings: encodings.to_vec(),
            min_size,
            types: checked,
            levels: Levels::default(),
        })
    }

    /// The same policy compressing at `levels`.
    pub fn with_levels(self, levels: Levels) -> Policy {
        Policy { levels, ..self }
    }

    pub fn levels(&self) -> &Levels {
        &self.levels
    }

    /// The server's codings, the default size and types.
    pub fn with_defaults(encodings: &[Encoding]) -> Result<Policy, String> {
        let types: Vec<String> = DEFAULT_TYPES.iter().map(|t| t.to_string()).collect();
        Policy::new(encodings, DEFAULT_MIN_SIZE, &types)
    }

    pub fn encodings(&self) -> &[Encoding] {
        &self.encodings
    }

    pub fn min_size(&self) -> u64 {
        self.min_size
    }

    /// The coding this client gets by its Accept-Encoding (`None`: identity).
    pub fn negotiate(&self, accept_encoding: Option<&[u8]>) -> Option<Encoding> {
        accept::negotiate(accept_encoding, &self.encodings)
    }

    /// Whether the answer is compressed, for a client that gets `chosen`. Never: interim,
    /// 204, 206 and 304 answers (no body, or a range of the identity body), an answer with a
    /// `Content-Range` or a `Content-Encoding` (other than identity), one marked
    /// `Cache-Control: no-transform`, a type not in the list (or none at all), a known size
    /// below the minimum. `text/event-stream` only when the list names it.
    pub fn decide(&self, answer: &Answer<'_>, chosen: Option<Encoding>) -> Decision {
        let s = answer.status;
        if s < 200 || s == 204 || s == 206 || s == 304 || answer.content_range {
            return Decision::Leave;
        }
        if answer
            .content_encoding
            .is_some_and(|v| !trim(v).eq_ignore_ascii_case(b"identity"))
        {
            return Decision::Leave;
        }
        if answer.cache_control.is_some_and(no_transform) {
            return Decision::Leave;
        }
        if answer.length.is_some_and(|n| n < self.min_size) {
            return Decision::Leave;
        }
        let Some(content_type) = answer.content_type else {
            return Decision::Leave;
        };
        if !self.type_listed(content_type) {
            return Decision::Leave;
        }
        match chosen {
            Some(e) => Decision::Compress(e),
            None => Decision::VaryOnly,
        }
    }

    fn type_listed(&self, content_type: &[u8]) -> bool {
        let media = trim(content_type.split(|&b| b == b';').next().unwrap_or(b""));
        let Some(slash) = media.iter().position(|&b| b == b'/') else {
            return false;
        };
        let (top, sub) = (&media[..slash], &media[slash + 1..]);
        self.types.iter().any(|t| {
            let t = t.as_bytes();
            if t.eq_ignore_ascii_case(media) {
                return true;
            }
            // `type/*`; an event stream only by name: each event must reach the client as
            // it is sent, and a coding that holds bytes back is a surprise there.
            t.ends_with(b"/*")
                && t[..t.len() - 2].eq_ignore_ascii_case(top)
                && !(top.eq_ignore_ascii_case(b"text") && sub.eq_ignore_ascii_case(b"event-stream"))
        })
    }
}

fn check_type(t: &str) -> Result<String, String> {
    let bad = || {
        format!("{t:?} is not a media type: write type/subtype or type/* (no parameters, no */*)")
    };
    let (top, sub) = t.split_once('/').ok_or_else(bad)?;
    let token = |s: &str| !s.is_empty() && s.bytes().all(is_tchar);
    if !token(top) || !(sub == "*" || token(sub)) || top == "*" {
        return Err(bad());
    }
    Ok(t.to_ascii_lowercase())
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn trim(v: &[u8]) -> &[u8] {
    v.trim_ascii()
}

/// Whether a `Cache-Control` value has the `no-transform` directive (RFC 9111 §5.2.1.6 and
/// §5.2.2.6): on an answer, intermediaries must not change its content; on a request, the
/// client asks them not to.
pub fn no_transform(cache_control: &[u8]) -> bool {
    cache_control.split(|&b| b == b',').any(|d| {
        let d = trim(d);
        let name = d.split(|&b| b == b'=').next().unwrap_or(b"");
        trim(name).eq_ignore_ascii_case(b"no-transform")
    })
}

/// The ETag of a compressed answer: a strong one made weak (`W/"x"`), as nginx does, since
/// the compressed bytes are not the identity ones; a weak one is kept. `None`: keep as is.
pub fn weak_etag(etag: &[u8]) -> Option<Vec<u8>> {
    let v = trim(etag);
    if v.starts_with(b"\"") {
        let mut w = Vec::with_capacity(v.len() + 2);
        w.extend_from_slice(b"W/");
        w.extend_from_slice(v);
        Some(w)
    } else {
        None
    }
}

/// The Vary value once `Accept-Encoding` is in it: `None` when `existing` already names it
/// (or is `*`), else the existing list with it appended (or it alone).
pub fn vary_with_accept_encoding(existing: Option<&[u8]>) -> Option<Vec<u8>> {
    let Some(v) = existing.map(trim).filter(|v| !v.is_empty()) else {
        return Some(b"Accept-Encoding".to_vec());
    };
    let names = |v: &[u8]| {
        v.split(|&b| b == b',').any(|n| {
            let n = trim(n);
            n == b"*" || n.eq_ignore_ascii_case(b"accept-encoding")
        })
    };
    if names(v) {
        return None;
    }
    let mut out = Vec::with_capacity(v.len() + 17);
    out.extend_from_slice(v);
    out.extend_from_slice(b", Accept-Encoding");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Encoding::{Br, Gzip, Zstd};

    fn policy() -> Policy {
        Policy::with_defaults(&[Zstd, Br, Gzip]).unwrap()
    }

    fn html(length: Option<u64>) -> Answer<'static> {
        Answer {
            status: 200,
            content_type: Some(b"text/html; charset=utf-8"),
            length,
            ..Answer::default()
        }
    }

    #[test]
    fn candidates_are_compressed_or_varied() {
        let p = policy();
        assert_eq!(
            p.decide(&html(Some(4096)), Some(Br)),
            Decision::Compress(Br)
        );
        assert_eq!(p.decide(&html(None), Some(Gzip)), Decision::Compress(Gzip));
        assert_eq!(p.decide(&html(Some(4096)), None), Decision::VaryOnly);
        let json = Answer {
            content_type: Some(b"Application/JSON"),
            ..html(None)
        };
        assert_eq!(p.decide(&json, Some(Zstd)), Decision::Compress(Zstd));
        let not_found = Answer {
            status: 404,
            ..html(Some(1000))
        };
        assert_eq!(p.decide(&not_found, Some(Gzip)), Decision::Compress(Gzip));
    }

    #[test]
    fn refusals() {
        let p = policy();
        let leave = |a: Answer<'_>| assert_eq!(p.decide(&a, Some(Gzip)), Decision::Leave, "{a:?}");
        leave(html(Some(100)));
        leave(html(Some(511)));
        for status in [101, 103, 204, 206, 304] {
            leave(Answer {
                status,
                ..html(None)
            });
        }
        leave(Answer {
            content_range: true,
            ..html(None)
        });
        leave(Answer {
            content_encoding: Some(b"gzip"),
            ..html(None)
        });
        leave(Answer {
            cache_control: Some(b"public, No-Transform"),
            ..html(None)
        });
        leave(Answer {
            cache_control: Some(b"max-age=60,no-transform=\"x\""),
            ..html(None)
        });
        leave(Answer {
            content_type: Some(b"image/png"),
            ..html(None)
        });
        leave(Answer {
            content_type: None,
            ..html(None)
        });
        leave(Answer {
            content_type: Some(b"garbage"),
            ..html(None)
        });
        leave(Answer {
            content_type: Some(b"text/event-stream"),
            ..html(None)
        });
        // identity is no coding; other Cache-Control directives change nothing.
        let ok = Answer {
            content_encoding: Some(b" identity "),
            cache_control: Some(b"no-cache, max-age=0"),
            ..html(Some(512))
        };
        assert_eq!(p.decide(&ok, Some(Br)), Decision::Compress(Br));
    }

    #[test]
    fn event_streams_only_by_name() {
        let p = Policy::new(&[Gzip], 0, &["text/event-stream".into()]).unwrap();
        let sse = Answer {
            content_type: Some(b"text/event-stream"),
            ..html(None)
        };
        assert_eq!(p.decide(&sse, Some(Gzip)), Decision::Compress(Gzip));
        assert_eq!(p.decide(&html(None), Some(Gzip)), Decision::Leave);
    }

    #[test]
    fn bad_settings_are_refused() {
        let t = |s: &str| Policy::new(&[Gzip], 0, &[s.to_string()]);
        assert!(t("text/*").is_ok());
        assert!(t("Application/Vnd.Api+JSON").is_ok());
        for bad in [
            "text",
            "*/*",
            "text/",
            "/json",
            "text/html; charset=utf-8",
            "te xt/html",
            "",
        ] {
            assert!(t(bad).is_err(), "{bad:?}");
        }
        assert!(Policy::new(&[], 0, &["text/*".into()]).is_err());
        assert!(Policy::new(&[Gzip, Gzip], 0, &["text/*".into()]).is_err());
        assert!(Policy::new(&[Gzip], 0, &[]).is_err());
    }

    #[test]
    fn etags_become_weak() {
        assert_eq!(weak_etag(b"\"abc\"").as_deref(), Some(&b"W/\"abc\""[..]));
        assert_eq!(weak_etag(b"W/\"abc\""), None);
        assert_eq!(weak_etag(b"garbage"), None);
    }

    #[test]
    fn vary_is_merged() {
        let v = |e: Option<&str>| vary_with_accept_encoding(e.map(str::as_bytes));
        assert_eq!(v(None).as_deref(), Some(&b"Accept-Encoding"[..]));
        assert_eq!(v(Some(" ")).as_deref(), Some(&b"Accept-Encoding"[..]));
        assert_eq!(
            v(Some("Origin")).as_deref(),
            Some(&b"Origin, Accept-Encoding"[..])
        );
        assert_eq!(v(Some("origin, accept-encoding")), None);
        assert_eq!(v(Some("*")), None);
    }
}
