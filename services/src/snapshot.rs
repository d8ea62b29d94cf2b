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
    etag: String,
    last_modified: String,
    modified_secs: u64,
    /// Content-Type, Cache-Control, ETag, Last-Modified and Vary lines, serialised once.
    headers: Vec<u8>,
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
        let etag = format!("\"s{:016x}\"", hasher.finish());
        let last_modified = httpdate::fmt_http_date(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(modified_secs),
        );
        let mut headers = Vec::with_capacity(160);
        for (name, value) in [
            ("Content-Type", content_type),
            ("Cache-Control", &format!("public, max-age={max_age_secs}")),
            ("ETag", &etag),
            ("Last-Modified", &last_modified),
            ("Vary", "Accept-Encoding"),
        ] {
            headers.extend_from_slice(name.as_bytes());
            headers.extend_from_slice(b": ");
            headers.extend_from_slice(value.as_bytes());
            headers.extend_from_slice(b"\r\n");
        }
        Snapshot {
            body: Bytes::from(body),
            gzip: gzip.map(Bytes::from),
            etag,
            last_modified,
            modified_secs,
            headers,
        }
    }

    pub fn body(&self) -> &Bytes {
        &self.body
    }

    pub fn gzip(&self) -> Option<&Bytes> {
        self.gzip.as_ref()
    }

    pub fn etag(&self) -> &str {
        &self.etag
    }

    /// The response for `req`: 304 when the client's copy is current, otherwise the body,
    /// gzipped when the client prefers it.
    pub fn respond(&self, req: &Request<'_>) -> Response {
        let mut response = Response::new(200);
        response.push_raw_headers(&self.headers);
        if negotiate::not_modified(
            req.head,
            self.etag.as_bytes(),
            self.last_modified.as_bytes(),
            self.modified_secs,
        ) {
            response.status = 304;
            return response;
        }
        match &self.gzip {
            Some(z) if negotiate::prefers_gzip(req.head.accept_encoding) => {
                response.push_raw_headers(b"Content-Encoding: gzip\r\n");
                response.with_body(Body::Shared(z.clone()))
            }
            _ => response.with_body(Body::Shared(self.body.clone())),
        }
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

    #[test]
    fn cell_swaps() {
        let cell = SnapshotCell::new(Snapshot::new("text/plain", b"old".to_vec(), 1, 5));
        cell.store(Snapshot::new("text/plain", b"new".to_vec(), 2, 5));
        assert_eq!(&cell.load().body()[..], b"new");
    }
}
