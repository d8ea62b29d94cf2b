//! Pre-rendered responses swapped atomically: readers pay one `ArcSwap` load and a refcount,
//! never a lock, and never wait for a rebuild.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use arc_swap::ArcSwap;
use bytes::Bytes;
use tern_server::negotiate;
use tern_server::{Body, Request, Response};

/// Bodies shorter than this are sent as they are: gzip would save less than its header costs.
const GZIP_MIN: usize = 256;

/// One immutable rendering of a resource, with everything a response needs prepared once.
pub struct Snapshot {
    body: Bytes,
    gzip: Option<Bytes>,
    /// Strong tags differ per encoding (RFC 9110 §8.8.3): the gzip variant's ends in `-gz`.
    etag: String,
    etag_gzip: String,
    last_modified: String,
    modified_secs: u64,
    /// Content-Type, Cache-Control, ETag, Last-Modified and Vary lines, serialised once per
    /// variant (the gzip one with Content-Encoding).
    headers: Vec<u8>,
    headers_gzip: Vec<u8>,
}

impl Snapshot {
    /// Renders a snapshot of `body`, made at `modified_secs` (Unix time), cacheable for
    /// `max_age_secs`. Compresses once here, off the request path.
    pub fn new(content_type: &str, body: Vec<u8>, modified_secs: u64, max_age_secs: u32) -> Self {
        let gzip = (body.len() >= GZIP_MIN)
            .then(|| gzip(&body))
            .filter(|z| z.len() < body.len());
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        body.hash(&mut hasher);
        let tag = hasher.finish();
        let etag = format!("\"s{tag:016x}\"");
        let etag_gzip = format!("\"s{tag:016x}-gz\"");
        let last_modified = httpdate::fmt_http_date(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(modified_secs),
        );
        let cache_control = format!("public, max-age={max_age_secs}");
        let block = |etag: &str, encoding: Option<&str>| {
            let mut headers = Vec::with_capacity(192);
            let lines = [
                ("Content-Type", content_type),
                ("Cache-Control", &cache_control),
                ("ETag", etag),
                ("Last-Modified", &last_modified),
                ("Vary", "Accept-Encoding"),
            ];
            for (name, value) in lines
                .into_iter()
                .chain(encoding.map(|e| ("Content-Encoding", e)))
            {
                headers.extend_from_slice(name.as_bytes());
                headers.extend_from_slice(b": ");
                headers.extend_from_slice(value.as_bytes());
                headers.extend_from_slice(b"\r\n");
            }
            headers
        };
        Snapshot {
            headers: block(&etag, None),
            headers_gzip: block(&etag_gzip, Some("gzip")),
            body: Bytes::from(body),
            gzip: gzip.map(Bytes::from),
            etag,
            etag_gzip,
            last_modified,
            modified_secs,
        }
    }

    pub fn body(&self) -> &Bytes {
        &self.body
    }

    pub fn gzip(&self) -> Option<&Bytes> {
        self.gzip.as_ref()
    }

    /// The identity representation's entity tag.
    pub fn etag(&self) -> &str {
        &self.etag
    }

    /// The response for `req`: 304 when the client's copy (of either encoding) is current,
    /// otherwise the body, gzipped when the client prefers it.
    pub fn respond(&self, req: &Request<'_>) -> Response {
        let gzip = self
            .gzip
            .as_ref()
            .filter(|_| negotiate::prefers_gzip(req.head.accept_encoding));
        let mut response = Response::new(200);
        response.push_raw_headers(if gzip.is_some() {
            &self.headers_gzip
        } else {
            &self.headers
        });
        let fresh = |etag: &str| {
            negotiate::not_modified(
                req.head,
                etag.as_bytes(),
                self.last_modified.as_bytes(),
                self.modified_secs,
            )
        };
        if fresh(&self.etag) || (self.gzip.is_some() && fresh(&self.etag_gzip)) {
            response.status = 304;
            return response;
        }
        response.with_body(Body::Shared(gzip.unwrap_or(&self.body).clone()))
    }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    // Level 6: snapshots are rebuilt every few seconds, so compression time matters more than
    // for static files, which are compressed once per change.
    let mut c = libdeflater::Compressor::new(libdeflater::CompressionLvl::new(6).unwrap());
    let mut out = vec![0; c.gzip_compress_bound(data.len())];
    let n = c
        .gzip_compress(data, &mut out)
        .expect("bound is large enough");
    out.truncate(n);
    out
}

/// A slot holding the current [`Snapshot`]; `store` from a background thread, `respond` from
/// any worker.
pub struct SnapshotCell(ArcSwap<Snapshot>);

impl SnapshotCell {
    pub fn new(initial: Snapshot) -> SnapshotCell {
        SnapshotCell(ArcSwap::from_pointee(initial))
    }

    pub fn store(&self, snapshot: Snapshot) {
        self.0.store(Arc::new(snapshot));
    }

    pub fn load(&self) -> Arc<Snapshot> {
        self.0.load_full()
    }

    pub fn respond(&self, req: &Request<'_>) -> Response {
        self.0.load().respond(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_bodies_get_a_smaller_gzip_variant_and_small_ones_none() {
        let big = Snapshot::new("application/json", vec![b'a'; 10_000], 1_700_000_000, 5);
        assert!(big.gzip().unwrap().len() < 200);
        let small = Snapshot::new("application/json", b"{}".to_vec(), 1_700_000_000, 5);
        assert!(small.gzip().is_none());
    }

    #[test]
    fn etag_follows_content() {
        let a = Snapshot::new("text/plain", b"one".to_vec(), 1, 5);
        let b = Snapshot::new("text/plain", b"one".to_vec(), 2, 5);
        let c = Snapshot::new("text/plain", b"two".to_vec(), 1, 5);
        assert_eq!(a.etag(), b.etag());
        assert_ne!(a.etag(), c.etag());
        assert!(a.etag().starts_with('"') && a.etag().ends_with('"'));
    }

    fn respond(snapshot: &Snapshot, extra: &str) -> Response {
        let raw = format!("GET /x HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        let peer = "127.0.0.1:1".parse().unwrap();
        tern_server::testing::with_request(raw.as_bytes(), peer, false, |req| snapshot.respond(req))
    }

    fn header<'r>(r: &'r Response, name: &str) -> Option<&'r str> {
        let text = std::str::from_utf8(r.headers()).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
    }

    #[test]
    fn responses_negotiate_gzip_and_answer_304_for_either_tag() {
        let s = Snapshot::new("application/json", vec![b'x'; 4000], 1_700_000_000, 5);
        let plain = respond(&s, "");
        assert_eq!(plain.status, 200);
        assert_eq!(plain.body.len(), 4000);
        assert_eq!(header(&plain, "ETag"), Some(s.etag()));
        assert_eq!(header(&plain, "Content-Encoding"), None);
        assert_eq!(header(&plain, "Cache-Control"), Some("public, max-age=5"));

        let zipped = respond(&s, "Accept-Encoding: gzip, br\r\n");
        assert_eq!(header(&zipped, "Content-Encoding"), Some("gzip"));
        let gz_tag = header(&zipped, "ETag").unwrap().to_string();
        assert_ne!(gz_tag, s.etag());
        assert!(zipped.body.len() < 100);

        for tag in [s.etag().to_string(), gz_tag] {
            let again = respond(
                &s,
                &format!("If-None-Match: {tag}\r\nAccept-Encoding: gzip\r\n"),
            );
            assert_eq!(again.status, 304, "{tag}");
        }
        let stale = respond(&s, "If-None-Match: \"other\"\r\n");
        assert_eq!(stale.status, 200);
        let since = respond(&s, "If-Modified-Since: Tue, 14 Nov 2023 22:13:20 GMT\r\n");
        assert_eq!(since.status, 304);
    }

    #[test]
    fn cell_swaps() {
        let cell = SnapshotCell::new(Snapshot::new("text/plain", b"old".to_vec(), 1, 5));
        cell.store(Snapshot::new("text/plain", b"new".to_vec(), 2, 5));
        assert_eq!(&cell.load().body()[..], b"new");
    }
}
