//! A hit's answer from an entry: 304 from the client's validators, a range, or the whole
//! entry, with its `Age`.

use tern_cache::policy;
use tern_cache::{Entry, StoredBody};
use tern_server::static_files::range::{self, RangeSpec};
use tern_server::{Body, CacheOutcome, FileBody, Method, Request, Response};

/// The client's validators, and the range a GET asks for (with its `If-Range`).
pub(super) struct Validators<'a> {
    pub(super) if_none_match: Option<&'a [u8]>,
    pub(super) if_modified_since: Option<&'a [u8]>,
    pub(super) range: Option<(&'a [u8], Option<&'a [u8]>)>,
    /// The client takes some coding: a whole body's compressed copies are offered.
    pub(super) codings: bool,
}

impl<'a> Validators<'a> {
    /// For an answer given later than its request (a waiter's, a stale one in place of a
    /// failed app, a refresh's): the validators kept from the request, the whole entry, and
    /// its compressed copies offered whatever the client takes (the compression decides).
    pub(super) fn kept(
        if_none_match: Option<&'a [u8]>,
        if_modified_since: Option<&'a [u8]>,
    ) -> Validators<'a> {
        Validators {
            if_none_match,
            if_modified_since,
            range: None,
            codings: true,
        }
    }

    pub(super) fn of(req: &Request<'a>) -> Validators<'a> {
        let head = req.head;
        Validators {
            if_none_match: head.if_none_match,
            if_modified_since: head.if_modified_since,
            // RFC 9110 §14.2: a range applies to GET only.
            range: (req.method() == Method::Get)
                .then_some(head.range)
                .flatten()
                .map(|r| (r, head.if_range)),
            codings: head.accept_encoding.is_some(),
        }
    }
}

/// The part of a whole 200 entry a GET's `Range` asks for: its bounds, or `None` for the
/// whole entry (no range, one tern ignores, or an `If-Range` the entry no longer matches);
/// `Err` for a range past its end (416).
pub(super) fn range_of(asked: &Validators<'_>, entry: &Entry) -> Result<Option<(u64, u64)>, ()> {
    let Some((range, if_range)) = asked.range else {
        return Ok(None);
    };
    if entry.status != 200 {
        return Ok(None);
    }
    // If-Range: the entry's strong ETag, or its Last-Modified exactly (RFC 9110 §13.1.5).
    if let Some(ir) = if_range.map(<[u8]>::trim_ascii) {
        let holds = match ir.first() {
            Some(b'"') => entry.etag.as_deref() == Some(ir),
            _ => !ir.starts_with(b"W/") && entry.last_modified.as_deref() == Some(ir),
        };
        if !holds {
            return Ok(None);
        }
    }
    match range::parse(range, entry.body.len()) {
        RangeSpec::Ignore => Ok(None),
        RangeSpec::Satisfiable { start, end } => Ok(Some((start, end))),
        RangeSpec::Unsatisfiable => Err(()),
    }
}

/// A fresh entry's answer: its head as stored, `Age` from the worker's clock, its body
/// shared (a HEAD gets the same head; the connection leaves the body out); 304 when the
/// client's validators match (`not_modified` is told). `status`: its `Cache-Status`, if the
/// route writes it; `outcome`: what the access log says of it.
pub(super) fn answer(
    asked: &Validators<'_>,
    entry: &Entry,
    now: u64,
    status: Option<&[u8]>,
    outcome: CacheOutcome,
    not_modified_counted: impl FnOnce(),
) -> Response {
    {
        let age = entry.freshness.age(now);
        let mut buf = itoa::Buffer::new();
        if not_modified(asked, entry) {
            not_modified_counted();
            let mut r = Response::new(304);
            for line in entry.head.split_inclusive(|&b| b == b'\n') {
                let name = line.split(|&b| b == b':').next().unwrap_or_default();
                // RFC 9110 §15.4.5: the fields a 200 would have carried that describe it.
                if [
                    &b"etag"[..],
                    b"cache-control",
                    b"expires",
                    b"vary",
                    b"last-modified",
                    b"content-location",
                ]
                .iter()
                .any(|n| name.eq_ignore_ascii_case(n))
                {
                    r.push_raw_headers(line);
                }
            }
            r.push_header("Age", buf.format(age).as_bytes());
            if let Some(status) = status {
                r.push_header("Cache-Status", status);
            }
            r.cache_outcome = Some(outcome);
            return r;
        }
        let len = entry.body.len();
        let mut r = match range_of(asked, entry) {
            Ok(None) => {
                let mut r = Response::new(entry.status).with_body(body_of(entry, 0, len));
                r.push_raw_headers(&entry.head);
                // A whole body in memory is compressed once per coding, then sent as kept.
                if let (StoredBody::Memory(_), true) = (&entry.body, asked.codings) {
                    r.copies = Some(entry.copies.clone());
                }
                r
            }
            Ok(Some((start, end))) => range::partial(&entry.head, start, end, len)
                .with_body(body_of(entry, start, end + 1 - start)),
            Err(()) => range::unsatisfiable(len),
        };
        r.push_header("Age", buf.format(age).as_bytes());
        if let Some(status) = status {
            r.push_header("Cache-Status", status);
        }
        r.cache_outcome = Some(outcome);
        r
    }
}

/// `len` bytes of the entry's body from `start`: shared from memory, or sent from its file.
fn body_of(entry: &Entry, start: u64, len: u64) -> Body {
    match &entry.body {
        StoredBody::Memory(b) => Body::Shared(b.slice(start as usize..(start + len) as usize)),
        StoredBody::Disk(d) => Body::File(FileBody {
            file: d.file().clone(),
            offset: start,
            len,
        }),
    }
}

/// The client's validators match the entry's (RFC 9110 §13.2.2: If-None-Match first, and
/// If-Modified-Since only without it).
pub(super) fn not_modified(asked: &Validators<'_>, entry: &Entry) -> bool {
    if entry.status != 200 {
        return false;
    }
    if let Some(inm) = asked.if_none_match {
        return entry
            .etag
            .as_deref()
            .is_some_and(|etag| policy::none_match_hits(inm, etag));
    }
    match (asked.if_modified_since, entry.last_modified.as_deref()) {
        (Some(since), Some(lm)) => policy::not_modified_since(since, lm),
        _ => false,
    }
}
