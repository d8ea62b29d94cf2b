//! On-the-fly compression of one answer, as the exchange (fixed answers) and the relay
//! (proxied ones) apply it: the coding negotiated for the request, the head's edits
//! (`Vary`, `Content-Encoding`, a weak `ETag`, no `Accept-Ranges`), and a fixed body
//! compressed at once. The rules themselves are `tern_compress`'s.

use std::sync::Arc;

use tern_compress::{Answer, Decision, EncodeError, Encoder, Encoding, Policy};

use tern_codec::RequestHead;

use crate::response::{Body, Response};
use crate::stats::{Counter, WorkerStats};

/// The largest fixed body compressed (at once: it is in memory already, so its compressed
/// length is known and sent). Larger ones go as they are: at these levels 256 KiB costs a
/// worker 1–3 ms, about the most one answer should take from the others.
pub const FIXED_MAX: u64 = 256 * 1024;

/// A request's compression: its route's policy and the coding its client gets.
pub(crate) struct Choice {
    policy: Arc<Policy>,
    chosen: Option<Encoding>,
}

impl Choice {
    /// The coding the request's client gets: by its Accept-Encoding, and none when it asks
    /// intermediaries not to transform the answer (`Cache-Control: no-transform` on the
    /// request, RFC 9111 §5.2.1.6: tern compressing an app's answer is such a transform).
    /// Such a client still gets `Vary: Accept-Encoding` on a candidate answer (what it gets
    /// is the identity copy any client may be given), and no `Vary: Cache-Control`, which
    /// would split every cache entry for a rare request field.
    pub fn new(policy: Arc<Policy>, head: &RequestHead<'_>) -> Choice {
        let chosen = policy
            .negotiate(head.accept_encoding)
            .filter(|_| !asks_no_transform(head));
        Choice { policy, chosen }
    }

    /// Decides for the answer `r` whose body has `length` bytes (if known; a HEAD answer's:
    /// the GET's) and edits its head: `Vary: Accept-Encoding` whenever the answer is a
    /// candidate, and for a compressed one `Content-Encoding`, a weak ETag and no
    /// `Accept-Ranges`. Returns the coding the body must then be compressed with; the
    /// caller sends it without a length (or with the compressed one).
    pub fn edit_head(&self, r: &mut Response, length: Option<u64>) -> Option<Encoding> {
        let answer = Answer {
            status: r.status,
            content_type: r.header("content-type"),
            content_encoding: r.header("content-encoding"),
            cache_control: r.header("cache-control"),
            content_range: r.header("content-range").is_some(),
            length,
        };
        let coding = match self.policy.decide(&answer, self.chosen) {
            Decision::Leave => return None,
            Decision::VaryOnly => None,
            Decision::Compress(e) => Some(e),
        };
        if let Some(vary) = tern_compress::vary_with_accept_encoding(r.header("vary")) {
            r.remove_header("vary");
            r.push_header("Vary", &vary);
        }
        let e = coding?;
        if let Some(weak) = r.header("etag").and_then(tern_compress::weak_etag) {
            r.remove_header("etag");
            r.push_header("ETag", &weak);
        }
        r.remove_header("content-encoding");
        r.remove_header("content-length");
        r.remove_header("accept-ranges");
        r.push_header("Content-Encoding", e.name().as_bytes());
        Some(e)
    }

    /// The client gets a coding if the answer turns out to be one to compress.
    pub fn may_compress(&self) -> bool {
        self.chosen.is_some()
    }

    /// A streaming encoder for `e` at the route's levels.
    pub fn encoder(&self, e: Encoding) -> Result<Encoder, EncodeError> {
        Encoder::with_levels(e, self.policy.levels())
    }
}

/// The request carries `Cache-Control: no-transform` (in any of its Cache-Control fields).
fn asks_no_transform(head: &RequestHead<'_>) -> bool {
    head.headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("cache-control"))
        .any(|h| tern_compress::no_transform(h.value))
}

/// Compresses a fixed answer (a handler's, an error page) in place when its choice says so.
/// A file body is never compressed here (it keeps `sendfile`), nor one over [`FIXED_MAX`].
pub(crate) fn fixed(r: &mut Response, choice: &Choice, stats: &WorkerStats) {
    let len = r.body.len();
    if matches!(r.body, Body::File(_)) || len > FIXED_MAX {
        return;
    }
    let Some(e) = choice.edit_head(r, Some(len)) else {
        return;
    };
    let body = match &r.body {
        Body::Empty => &[][..],
        Body::Static(b) => b,
        Body::Owned(b) => b.as_slice(),
        Body::Shared(b) => b.as_ref(),
        Body::File(_) => return,
    };
    let compressed = choice
        .encoder(e)
        .and_then(|mut enc| Ok(enc.finish_with(body)?.to_vec()));
    match compressed {
        Ok(out) => {
            count(stats, e, len, out.len() as u64);
            r.body = Body::Owned(out);
        }
        Err(_) => {
            // Only an allocation failure in zstd gets here: send the body as it is.
            stats.bump(Counter::CompressionFailures);
            r.remove_header("content-encoding");
        }
    }
}

/// One answer compressed with `e`, `bytes_in` → `bytes_out`.
pub(crate) fn count(stats: &WorkerStats, e: Encoding, bytes_in: u64, bytes_out: u64) {
    let [answers, inb, outb] = Counter::compressed(e);
    stats.bump(answers);
    stats.add(inb, bytes_in);
    stats.add(outb, bytes_out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(accept: &str) -> Choice {
        choice_for(&format!(
            "GET / HTTP/1.1\r\nHost: a\r\nAccept-Encoding: {accept}\r\n\r\n"
        ))
    }

    /// The choice for the request `raw` (a whole head).
    fn choice_for(raw: &str) -> Choice {
        let p = Policy::with_defaults(&[Encoding::Zstd, Encoding::Br, Encoding::Gzip]).unwrap();
        crate::testing::with_request(raw.as_bytes(), ([127, 0, 0, 1], 1).into(), false, |req| {
            Choice::new(Arc::new(p), req.head)
        })
    }

    fn page(len: usize) -> Response {
        Response::new(200)
            .with_header("Content-Type", "text/html")
            .with_header("ETag", "\"v1\"")
            .with_header("Vary", "Origin")
            .with_header("Accept-Ranges", "bytes")
            .with_body(Body::Owned(
                "<p>hello</p>\n".repeat(len / 13 + 1).into_bytes(),
            ))
    }

    #[test]
    fn a_fixed_answer_is_compressed_with_its_head_edited() {
        let stats = crate::stats::Stats::new(1);
        let mut r = page(4000);
        let original = match &r.body {
            Body::Owned(b) => b.clone(),
            _ => unreachable!(),
        };
        fixed(&mut r, &choice("gzip, br;q=0.5"), stats.worker(0));
        assert_eq!(r.header("content-encoding"), Some(&b"gzip"[..]));
        assert_eq!(r.header("vary"), Some(&b"Origin, Accept-Encoding"[..]));
        assert_eq!(r.header("etag"), Some(&b"W/\"v1\""[..]));
        assert_eq!(r.header("accept-ranges"), None);
        let Body::Owned(gz) = &r.body else {
            panic!("not owned")
        };
        let mut back = Vec::new();
        gunzip(gz, &mut back);
        assert_eq!(back, original);
        let snap = stats.snapshot();
        assert_eq!(snap.get(Counter::CompressedGzip), 1);
        assert_eq!(snap.get(Counter::CompressInGzip), original.len() as u64);
        assert_eq!(snap.get(Counter::CompressOutGzip), gz.len() as u64);
    }

    #[test]
    fn identity_clients_get_vary_only() {
        let stats = crate::stats::Stats::new(1);
        let mut r = page(4000);
        let len = r.body.len();
        fixed(&mut r, &choice("identity"), stats.worker(0));
        assert_eq!(r.header("content-encoding"), None);
        assert_eq!(r.header("vary"), Some(&b"Origin, Accept-Encoding"[..]));
        assert_eq!(r.header("etag"), Some(&b"\"v1\""[..]));
        assert_eq!(r.body.len(), len);
    }

    #[test]
    fn a_request_that_says_no_transform_gets_identity_with_vary() {
        let stats = crate::stats::Stats::new(1);
        for cc in [
            "no-transform",
            "max-age=0, No-Transform",
            "no-cache\r\nCache-Control: no-transform",
        ] {
            let mut r = page(4000);
            let len = r.body.len();
            let c = choice_for(&format!(
                "GET / HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\nCache-Control: {cc}\r\n\r\n"
            ));
            fixed(&mut r, &c, stats.worker(0));
            assert_eq!(r.header("content-encoding"), None, "{cc}");
            assert_eq!(
                r.header("vary"),
                Some(&b"Origin, Accept-Encoding"[..]),
                "{cc}"
            );
            assert_eq!(r.body.len(), len, "{cc}");
        }
        // Other directives do not stop it.
        let mut r = page(4000);
        let c = choice_for(
            "GET / HTTP/1.1\r\nHost: a\r\nAccept-Encoding: gzip\r\nCache-Control: no-cache, no-store\r\n\r\n",
        );
        fixed(&mut r, &c, stats.worker(0));
        assert_eq!(r.header("content-encoding"), Some(&b"gzip"[..]));
    }

    #[test]
    fn small_large_and_file_bodies_are_left_alone() {
        let stats = crate::stats::Stats::new(1);
        for mut r in [page(100), page(FIXED_MAX as usize + 1)] {
            let before = r.headers().to_vec();
            fixed(&mut r, &choice("gzip"), stats.worker(0));
            assert_eq!(r.headers(), &before[..]);
        }
        let file = tempfile::tempfile().unwrap();
        let mut r = page(10).with_body(Body::File(crate::response::FileBody {
            file: Arc::new(file),
            offset: 0,
            len: 10_000,
        }));
        let before = r.headers().to_vec();
        fixed(&mut r, &choice("gzip"), stats.worker(0));
        assert_eq!(r.headers(), &before[..]);
    }

    fn gunzip(gz: &[u8], out: &mut Vec<u8>) {
        let mut d = libdeflater::Decompressor::new();
        let mut buf = vec![0u8; 1 << 20];
        let n = d.gzip_decompress(gz, &mut buf).unwrap();
        out.extend_from_slice(&buf[..n]);
    }
}
