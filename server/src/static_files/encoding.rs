//! Content types, content codings: which types get a charset and which are worth compressing,
//! Accept-Encoding negotiation with q-values, and the compressors.

use std::cell::RefCell;

/// Variant slots of an entry. Identity always exists.
pub(crate) const IDENTITY: usize = 0;
pub(crate) const GZIP: usize = 1;
pub(crate) const BR: usize = 2;

// Levels measured on 64 KiB of real JS / HTML / Rust source (release build, this machine):
//   libdeflate 6: 0.6–1.0 ms, 8: 1.3–1.7 ms (1 % smaller), 12: 9–13 ms (4 % smaller).
//   brotli 5: 1.4–1.7 ms, 6: 1.4–1.8 ms, 7: 1.8–2.7 ms, 8: 2.5–4.7 ms, 9: 17–24 ms.
// Both together stay under ~5 ms for the largest cached file (default 64 KiB), which a worker
// pays once per file change.

/// libdeflate compression level.
pub(crate) const GZIP_LEVEL: i32 = 8;
/// Brotli quality.
pub(crate) const BROTLI_QUALITY: i32 = 7;

/// The Content-Type value for a file name: by extension, `; charset=utf-8` on text types,
/// `application/octet-stream` when unknown.
pub(crate) fn content_type(file_name: &std::path::Path) -> (String, &'static str) {
    let mime = mime_guess::from_path(file_name)
        .first_raw()
        .unwrap_or("application/octet-stream");
    let value = if wants_charset(mime) {
        format!("{mime}; charset=utf-8")
    } else {
        mime.to_owned()
    };
    (value, mime)
}

fn wants_charset(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/javascript"
                | "application/json"
                | "application/xml"
                | "image/svg+xml"
                | "application/xhtml+xml"
                | "application/manifest+json"
                | "application/ld+json"
                | "application/rss+xml"
                | "application/atom+xml"
        )
}

/// Types that shrink under gzip/brotli. Already-compressed formats (images, audio, video,
/// archives, woff2) are left alone.
pub(crate) fn compressible(mime: &str) -> bool {
    mime.starts_with("text/")
        || mime.ends_with("+json")
        || mime.ends_with("+xml")
        || matches!(
            mime,
            "application/javascript"
                | "application/x-javascript"
                | "application/ecmascript"
                | "application/json"
                | "application/xml"
                | "application/wasm"
                | "application/x-sh"
                | "application/toml"
                | "application/yaml"
                | "application/x-yaml"
                | "application/rtf"
                | "application/x-tar"
                | "application/vnd.ms-fontobject"
                | "application/x-font-ttf"
                | "application/x-font-otf"
                | "font/ttf"
                | "font/otf"
                | "font/sfnt"
                | "image/bmp"
                | "image/x-icon"
                | "image/vnd.microsoft.icon"
        )
}

/// Whether a compressed body is worth sending: it must save at least 5 % and 64 bytes.
pub(crate) fn worth_it(original: usize, compressed: usize) -> bool {
    compressed + 64 <= original && compressed * 100 <= original * 95
}

/// Picks the variant to send. `available[i]` says whether variant `i` exists (identity always
/// does). The one Accept-Encoding parser (`tern_compress::negotiate`) decides: highest q
/// wins, ties prefer the smaller coding (br, then gzip, then identity), an identity the
/// header does not mention is the fallback, and nothing acceptable still sends identity.
pub(crate) fn choose(accept_encoding: Option<&[u8]>, available: [bool; 3]) -> usize {
    use tern_compress::Encoding;
    let offered: &[Encoding] = match (available[BR], available[GZIP]) {
        (true, true) => &[Encoding::Br, Encoding::Gzip],
        (true, false) => &[Encoding::Br],
        (false, true) => &[Encoding::Gzip],
        (false, false) => return IDENTITY,
    };
    match tern_compress::negotiate(accept_encoding, offered) {
        Some(Encoding::Br) => BR,
        Some(Encoding::Gzip) => GZIP,
        _ => IDENTITY,
    }
}

thread_local! {
    // A libdeflate compressor allocates its match-finder tables; keep one per thread.
    static DEFLATE: RefCell<Option<libdeflater::Compressor>> = const { RefCell::new(None) };
}

pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
    DEFLATE.with(|cell| {
        let mut slot = cell.borrow_mut();
        let c = slot.get_or_insert_with(|| {
            let lvl = libdeflater::CompressionLvl::new(GZIP_LEVEL).unwrap_or_default();
            libdeflater::Compressor::new(lvl)
        });
        let mut out = vec![0u8; c.gzip_compress_bound(data.len())];
        // The bound guarantees room; an error would be a libdeflate bug.
        let n = c.gzip_compress(data, &mut out).unwrap_or(0);
        out.truncate(n);
        out
    })
}

pub(crate) fn brotli(data: &[u8]) -> Vec<u8> {
    // A window just large enough for the input keeps the encoder's memory small.
    let bits = usize::BITS - data.len().max(1).leading_zeros();
    let params = brotli::enc::BrotliEncoderParams {
        quality: BROTLI_QUALITY,
        lgwin: (bits as i32).clamp(10, 22),
        size_hint: data.len(),
        ..Default::default()
    };
    let mut out = Vec::with_capacity(data.len() / 3 + 64);
    let mut input = data;
    if brotli::BrotliCompress(&mut input, &mut out, &params).is_err() {
        out.clear();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    const ALL: [bool; 3] = [true, true, true];

    fn c(h: &str) -> usize {
        choose(Some(h.as_bytes()), ALL)
    }

    #[test]
    fn negotiation() {
        assert_eq!(choose(None, ALL), IDENTITY);
        assert_eq!(c(""), IDENTITY);
        assert_eq!(c("gzip"), GZIP);
        assert_eq!(c("gzip, deflate, br"), BR);
        assert_eq!(c("gzip, deflate, br, zstd"), BR);
        assert_eq!(c("br;q=0, gzip"), GZIP);
        assert_eq!(c("gzip;q=0.5, br;q=0.4"), GZIP);
        assert_eq!(c("gzip;q=0.4, br;q=0.5"), BR);
        assert_eq!(c("gzip;q=1.0, br;q=1"), BR);
        assert_eq!(c("*"), BR);
        assert_eq!(c("*;q=0.5, br;q=0.1"), GZIP);
        assert_eq!(c("identity;q=0, gzip;q=0.1"), GZIP);
        assert_eq!(c("identity, gzip;q=0.5"), IDENTITY);
        assert_eq!(c("identity;q=0.5, gzip;q=0.5"), GZIP);
        assert_eq!(c("gzip;q=0, br;q=0"), IDENTITY);
        assert_eq!(c("*;q=0"), IDENTITY);
        assert_eq!(c("deflate"), IDENTITY);
        assert_eq!(c("GZIP"), GZIP);
        assert_eq!(c("x-gzip"), GZIP);
        assert_eq!(c("gzip ; q=0.8 , br ; q=0.9"), BR);
        assert_eq!(c("gzip;q=bogus, br;q=0"), IDENTITY);
        assert_eq!(c("gzip;q=0.001"), GZIP);
        assert_eq!(choose(Some(b"br"), [true, true, false]), IDENTITY);
        assert_eq!(choose(Some(b"br, gzip"), [true, true, false]), GZIP);
        assert_eq!(choose(Some(b"gzip"), [true, false, true]), IDENTITY);
    }

    proptest::proptest! {
        #[test]
        fn choice_is_always_available(
            header in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
            gz in proptest::bool::ANY,
            br in proptest::bool::ANY,
        ) {
            let v = choose(Some(&header), [true, gz, br]);
            proptest::prop_assert!([true, gz, br][v]);
        }
    }

    #[test]
    fn types() {
        let ct = |n: &str| content_type(std::path::Path::new(n)).0;
        assert_eq!(ct("a.html"), "text/html; charset=utf-8");
        assert_eq!(ct("a.css"), "text/css; charset=utf-8");
        assert!(ct("a.js").ends_with("javascript; charset=utf-8"));
        assert_eq!(ct("a.json"), "application/json; charset=utf-8");
        assert_eq!(ct("a.svg"), "image/svg+xml; charset=utf-8");
        assert_eq!(ct("a.png"), "image/png");
        assert_eq!(ct("a.wasm"), "application/wasm");
        assert_eq!(ct("noext"), "application/octet-stream");
        assert_eq!(ct("a.unknownext"), "application/octet-stream");
        assert_eq!(ct("A.HTML"), "text/html; charset=utf-8");
        assert!(compressible("text/html"));
        assert!(compressible("application/wasm"));
        assert!(compressible("image/svg+xml"));
        assert!(!compressible("image/png"));
        assert!(!compressible("application/gzip"));
        assert!(!compressible("application/octet-stream"));
    }

    #[test]
    fn compressors_round_trip() {
        let data = "hello tern, hello static files. ".repeat(200);
        let gz = gzip(data.as_bytes());
        assert!(worth_it(data.len(), gz.len()));
        let mut back = String::new();
        flate_decode(&gz, &mut back);
        assert_eq!(back, data);

        let br = brotli(data.as_bytes());
        assert!(worth_it(data.len(), br.len()));
        let mut back = String::new();
        brotli::Decompressor::new(&br[..], 4096)
            .read_to_string(&mut back)
            .unwrap();
        assert_eq!(back, data);
        assert!(brotli(b"").len() < 16);
        assert!(!worth_it(1000, 960));
        assert!(!worth_it(100, 50));
        assert!(worth_it(1000, 900));
    }

    pub(crate) fn flate_decode(gz: &[u8], out: &mut String) {
        let mut d = libdeflater::Decompressor::new();
        let mut buf = vec![0u8; 1 << 20];
        let n = d.gzip_decompress(gz, &mut buf).unwrap();
        out.push_str(std::str::from_utf8(&buf[..n]).unwrap());
    }
}
