//! On-the-fly compression of one answer, as the exchange (fixed answers) and the relay
//! (proxied ones) apply it: the coding negotiated for the request, the head's edits
//! (`Vary`, `Content-Encoding`, a weak `ETag`, no `Accept-Ranges`), and a fixed body
//! compressed at once. The rules themselves are `tern_compress`'s.

use std::sync::Arc;

use tern_compress::{Answer, Budget, Decision, EncodeError, Encoder, Encoding, Policy};

use tern_codec::RequestHead;

use crate::response::{Body, Response};
use crate::stats::{Counter, WorkerStats};

/// The largest fixed body compressed (at once: it is in memory already, so its compressed
/// length is known and sent). Larger ones go as they are: at these levels 256 KiB costs a
/// worker 1–3 ms, about the most one answer should take from the others.
pub const FIXED_MAX: u64 = 256 * 1024;

/// The streaming-encoder state one connection's answers hold together (HTTP/2: all its
/// streams) beyond their first: one encoder at any level, or several while they fit (four
/// gzip answers, one brotli or zstd one at the default levels). A client that opens many
/// compressed answers and reads none holds about one encoder, not one per stream.
pub const CONN_ENCODER_BUDGET: usize = 2 << 20;

/// Where a streamed answer's encoder would be charged: its worker's budget, and what the
/// connection's other answers hold already.
pub(crate) struct EncoderRoom<'a> {
    pub worker: &'a Arc<Budget>,
    pub conn_held: usize,
}

/// How a streamed answer goes out, once its head is edited.
pub(crate) enum Streamed {
    AsIs,
    /// Compressed: with this encoder, or none when no body follows (a HEAD answer).
    Compressed(Option<Box<Encoder>>),
}

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
        let decision = self.decide(r, length);
        self.apply(r, decision)
    }

    /// As [`Choice::edit_head`] for an answer whose body is compressed as it streams: its
    /// encoder is made only if its state can be charged to `room` (none is needed for a
    /// HEAD answer: `room` is `None`). When it cannot, the answer goes as it is (with its
    /// `Vary`, as any answer a client may get uncompressed), counted.
    pub fn edit_streamed_head(
        &self,
        r: &mut Response,
        length: Option<u64>,
        room: Option<EncoderRoom<'_>>,
        stats: &WorkerStats,
    ) -> Result<Streamed, EncodeError> {
        let mut decision = self.decide(r, length);
        let mut encoder = None;
        if let (Decision::Compress(e), Some(room)) = (decision, room) {
            match self.charge(e, room) {
                Some(charge) => encoder = Some(Box::new(self.encoder(e)?.charged(charge))),
                None => {
                    stats.bump(Counter::CompressionSkippedMemory);
                    decision = Decision::VaryOnly;
                }
            }
        }
        Ok(match self.apply(r, decision) {
            Some(_) => Streamed::Compressed(encoder),
            None => Streamed::AsIs,
        })
    }

    /// The charge for an encoder of `e` at the route's levels: a connection holding none
    /// may always take one (if its worker's budget allows), else only while the connection's
    /// encoders stay within [`CONN_ENCODER_BUDGET`].
    fn charge(&self, e: Encoding, room: EncoderRoom<'_>) -> Option<tern_compress::Charge> {
        let bytes = Encoder::state_bytes(e, self.policy.levels());
        if room.conn_held > 0 && room.conn_held + bytes > CONN_ENCODER_BUDGET {
            return None;
        }
        room.worker.charge(bytes)
    }

    fn decide(&self, r: &Response, length: Option<u64>) -> Decision {
        let answer = Answer {
            status: r.status,
            content_type: r.header("content-type"),
            content_encoding: r.header("content-encoding"),
            cache_control: r.header("cache-control"),
            content_range: r.header("content-range").is_some(),
            length,
        };
        self.policy.decide(&answer, self.chosen)
    }

    /// The head's edits for `decision`; the coding the body gets, if any.
    fn apply(&self, r: &mut Response, decision: Decision) -> Option<Encoding> {
        let coding = match decision {
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
    if let Some(copy) = r.copies.as_ref().and_then(|c| c.get(e)) {
        count(stats, e, len, copy.len() as u64);
        r.body = Body::Shared(copy);
        return;
    }
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
            r.body = match r.copies.take() {
                Some(copies) => {
                    let out = bytes::Bytes::from(out);
                    copies.keep(e, &out);
                    Body::Shared(out)
                }
                None => Body::Owned(out),
            };
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

    /// A streamed answer's encoder is charged to its worker's budget and counted against
    /// its connection's: past either, the answer goes as it is, with its `Vary`, counted;
    /// a HEAD answer is edited as the GET's but charges nothing.
    #[test]
    fn a_kept_copy_is_sent_instead_of_compressing_and_a_new_one_is_offered() {
        use std::sync::Mutex;
        #[derive(Default)]
        struct Kept(Mutex<Vec<(Encoding, bytes::Bytes)>>);
        impl tern_compress::EncodedCopies for Kept {
            fn get(&self, coding: Encoding) -> Option<bytes::Bytes> {
                let kept = self.0.lock().unwrap();
                kept.iter()
                    .find(|(e, _)| *e == coding)
                    .map(|(_, b)| b.clone())
            }
            fn keep(&self, coding: Encoding, body: &bytes::Bytes) {
                self.0.lock().unwrap().push((coding, body.clone()));
            }
        }
        let kept = Arc::new(Kept::default());
        let stats = crate::stats::Stats::new(1);
        let stats = stats.worker(0);
        let mut first = page(4096);
        first.copies = Some(kept.clone());
        fixed(&mut first, &choice("gzip"), stats);
        let Body::Shared(made) = &first.body else {
            panic!("not shared")
        };
        assert_eq!(kept.0.lock().unwrap().len(), 1, "offered for keeping");
        // The next answer with the same copies gets the kept bytes, not a new compression.
        let mut second = page(4096);
        second.copies = Some(kept.clone());
        fixed(&mut second, &choice("gzip"), stats);
        let Body::Shared(sent) = &second.body else {
            panic!("not shared")
        };
        assert_eq!(sent.as_ptr(), made.as_ptr());
        assert_eq!(second.header("content-encoding"), Some(&b"gzip"[..]));
        assert_eq!(kept.0.lock().unwrap().len(), 1);
    }

    #[test]
    fn streamed_encoders_are_charged_or_the_answer_goes_as_it_is() {
        let stats = crate::stats::Stats::new(1);
        let w = stats.worker(0);
        let c = choice("br");
        let br = Encoder::state_bytes(Encoding::Br, &tern_compress::Levels::default());
        let room = |conn_held| {
            Some(EncoderRoom {
                worker: w.encoders(),
                conn_held,
            })
        };
        let streamed = |conn_held| {
            let mut r = page(100).with_header("Content-Length", "100000");
            let out = c
                .edit_streamed_head(&mut r, Some(100_000), room(conn_held), w)
                .unwrap();
            (out, r)
        };
        // The connection's first encoder, whatever its size.
        let (Streamed::Compressed(Some(first)), r) = streamed(0) else {
            panic!("not compressed")
        };
        assert_eq!(r.header("content-encoding"), Some(&b"br"[..]));
        assert_eq!((first.charged_bytes(), w.encoders().live()), (br, br));
        // A second one would take the connection past its budget: as it is, with Vary.
        let (Streamed::AsIs, r) = streamed(br) else {
            panic!("compressed past the connection's budget")
        };
        assert_eq!(r.header("content-encoding"), None);
        assert_eq!(r.header("content-length"), Some(&b"100000"[..]));
        assert_eq!(r.header("vary"), Some(&b"Origin, Accept-Encoding"[..]));
        assert_eq!(stats.snapshot().get(Counter::CompressionSkippedMemory), 1);
        assert_eq!(w.encoders().live(), br, "a skipped answer charges nothing");
        // Other connections take encoders until the worker's budget is spent.
        let mut held = vec![first];
        loop {
            match streamed(0) {
                (Streamed::Compressed(Some(e)), _) => held.push(e),
                (Streamed::AsIs, _) => break,
                _ => panic!("no encoder for a GET"),
            }
        }
        assert_eq!(held.len(), crate::stats::WORKER_ENCODER_BUDGET / br);
        assert_eq!(stats.snapshot().get(Counter::CompressionSkippedMemory), 2);
        // A HEAD answer (no room asked) says br, as its GET would, and charges nothing.
        let mut r = page(100);
        let out = c
            .edit_streamed_head(&mut r, Some(100_000), None, w)
            .unwrap();
        assert!(matches!(out, Streamed::Compressed(None)));
        assert_eq!(r.header("content-encoding"), Some(&b"br"[..]));
        // Ended or dropped, encoders give their charge back.
        let mut e = held.pop().unwrap();
        e.finish().unwrap();
        assert_eq!(e.charged_bytes(), 0);
        drop(held);
        assert_eq!(w.encoders().live(), 0);
        assert_eq!(stats.snapshot().encoder_bytes, 0);
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
