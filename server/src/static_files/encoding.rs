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
/// does). Highest q wins; ties prefer the smaller coding (br, then gzip, then identity). An
/// identity that the header does not mention (and no `*`) is the fallback, below any coding
/// with q > 0. When nothing acceptable exists we still send identity (RFC 9110 §12.5.3 allows
/// ignoring the header rather than answering 406).
pub(crate) fn choose(accept_encoding: Option<&[u8]>, available: [bool; 3]) -> usize {
    let Some(header) = accept_encoding else {
        return IDENTITY;
    };
    if !available[GZIP] && !available[BR] {
        return IDENTITY;
    }
    // q in thousandths; None = not mentioned.
    let (mut br, mut gzip, mut identity, mut star) = (None, None, None, None);
    // One pass, no iterator adaptors: this runs on every request that sends the header.
    let h = header;
    let n = h.len();
    let mut i = 0;
    while i < n {
        while i < n && CLASS[h[i] as usize] == SEP {
            i += 1;
        }
        let start = i;
        while i < n && CLASS[h[i] as usize] == TOKEN {
            i += 1;
        }
        let coding = &h[start..i];
        // Parameters up to the next comma; only `q` matters (RFC 9110 §12.4.2).
        let mut q = 1000u16;
        while i < n && h[i] != b',' {
            if h[i] != b';' {
                i += 1;
                continue;
            }
            i += 1;
            while i < n && (h[i] == b' ' || h[i] == b'\t') {
                i += 1;
            }
            if i + 1 < n && h[i] | 0x20 == b'q' && h[i + 1] == b'=' {
                i += 2;
                let value = i;
                while i < n && CLASS[h[i] as usize] == TOKEN {
                    i += 1;
                }
                q = parse_q(&h[value..i]).unwrap_or(0);
            }
        }
        let slot = match coding.len() {
            1 if coding[0] == b'*' => &mut star,
            2 if coding.eq_ignore_ascii_case(b"br") => &mut br,
            4 if coding.eq_ignore_ascii_case(b"gzip") => &mut gzip,
            6 if coding.eq_ignore_ascii_case(b"x-gzip") => &mut gzip,
            8 if coding.eq_ignore_ascii_case(b"identity") => &mut identity,
            _ => continue,
        };
        // A coding listed twice keeps its highest q.
        *slot = Some(slot.map_or(q, |old: u16| old.max(q)));
    }
    let q_of = |explicit: Option<u16>| i32::from(explicit.or(star).unwrap_or(0));
    // Identity's q when the header gives one (directly or via `*`); when it does not,
    // identity is the fallback that loses to any coding with q > 0.
    let mut best = IDENTITY;
    let mut best_q = identity.or(star).map_or(0, i32::from);
    // Ties go to the later, smaller coding: gzip beats identity, br beats gzip.
    for (idx, q) in [(GZIP, q_of(gzip)), (BR, q_of(br))] {
        if available[idx] && q > 0 && q >= best_q {
            best = idx;
            best_q = q;
        }
    }
    best
}

const TOKEN: u8 = 0;
/// OWS and `,`: skipped before a coding.
const SEP: u8 = 1;
/// `;`: starts a parameter.
const SEMI: u8 = 2;

/// Byte classes for the Accept-Encoding scanner.
static CLASS: [u8; 256] = {
    let mut t = [TOKEN; 256];
    t[b' ' as usize] = SEP;
    t[b'\t' as usize] = SEP;
    t[b',' as usize] = SEP;
    t[b';' as usize] = SEMI;
    t
};

fn parse_q(s: &[u8]) -> Option<u16> {
    match s {
        [b'1'] | [b'1', b'.'] => Some(1000),
        [b'1', b'.', rest @ ..] if rest.len() <= 3 && rest.iter().all(|&c| c == b'0') => Some(1000),
        [b'0'] | [b'0', b'.'] => Some(0),
        [b'0', b'.', rest @ ..] if rest.len() <= 3 && rest.iter().all(u8::is_ascii_digit) => {
            let mut v = 0u16;
            for i in 0..3 {
                v = v * 10 + rest.get(i).map_or(0, |&c| u16::from(c - b'0'));
            }
            Some(v)
        }
        _ => None,
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
    fn q_values() {
        assert_eq!(parse_q(b"1"), Some(1000));
        assert_eq!(parse_q(b"1.000"), Some(1000));
        assert_eq!(parse_q(b"0.5"), Some(500));
        assert_eq!(parse_q(b"0.123"), Some(123));
        assert_eq!(parse_q(b"0"), Some(0));
        assert_eq!(parse_q(b"0.1234"), None);
        assert_eq!(parse_q(b"1.5"), None);
        assert_eq!(parse_q(b"2"), None);
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
