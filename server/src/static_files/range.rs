//! `Range: bytes=…` (RFC 9110 §14): one range is served as 206; several ranges, other units or
//! a malformed header are ignored (a full 200); a well-formed but unsatisfiable range is 416.

use crate::response::Response;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeSpec {
    /// Answer the whole representation.
    Ignore,
    /// Inclusive byte positions, already clamped to the length.
    Satisfiable { start: u64, end: u64 },
    /// 416 with `Content-Range: bytes */len`.
    Unsatisfiable,
}

pub fn parse(value: &[u8], len: u64) -> RangeSpec {
    let v = tern_codec::trim_ows(value);
    let Some(eq) = v.iter().position(|&c| c == b'=') else {
        return RangeSpec::Ignore;
    };
    if !tern_codec::trim_ows(&v[..eq]).eq_ignore_ascii_case(b"bytes") {
        return RangeSpec::Ignore;
    }
    let spec = tern_codec::trim_ows(&v[eq + 1..]);
    if spec.contains(&b',') {
        // Multiple ranges (multipart/byteranges) are not worth their cost: send it all.
        return RangeSpec::Ignore;
    }
    let Some(dash) = spec.iter().position(|&c| c == b'-') else {
        return RangeSpec::Ignore;
    };
    let (first, last) = (
        tern_codec::trim_ows(&spec[..dash]),
        tern_codec::trim_ows(&spec[dash + 1..]),
    );
    match (first.is_empty(), last.is_empty()) {
        (true, true) => RangeSpec::Ignore,
        // suffix-range: the last n bytes.
        (true, false) => {
            let Some(n) = digits(last) else {
                return RangeSpec::Ignore;
            };
            if n == 0 || len == 0 {
                return RangeSpec::Unsatisfiable;
            }
            RangeSpec::Satisfiable {
                start: len - n.min(len),
                end: len - 1,
            }
        }
        (false, open_ended) => {
            let Some(start) = digits(first) else {
                return RangeSpec::Ignore;
            };
            let end = if open_ended {
                u64::MAX
            } else {
                match digits(last) {
                    Some(e) => e,
                    None => return RangeSpec::Ignore,
                }
            };
            if end < start || start >= len {
                return RangeSpec::Unsatisfiable;
            }
            RangeSpec::Satisfiable {
                start,
                end: end.min(len - 1),
            }
        }
    }
}

/// 1*DIGIT; values past u64 saturate (they are past any file's end anyway).
fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(s.iter().fold(0u64, |acc, &d| {
        acc.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

/// A 206's head (its `head_200` lines, which the caller passes) with `Content-Range` for
/// bytes `start..=end` of `len`; the caller gives it the body.
pub fn partial(head_200: &[u8], start: u64, end: u64, len: u64) -> Response {
    let mut r = Response::new(206);
    r.push_raw_headers(head_200);
    let mut buf = [0u8; 80];
    let n = content_range(&mut buf, Some((start, end)), len);
    r.push_header("Content-Range", &buf[..n]);
    r
}

/// The 416 for a range past the end of `len` bytes (`Content-Range: bytes */LEN`).
pub fn unsatisfiable(len: u64) -> Response {
    let mut r = Response::text(416, "range not satisfiable\n");
    let mut buf = [0u8; 80];
    let n = content_range(&mut buf, None, len);
    r.push_header("Content-Range", &buf[..n]);
    r
}

/// `Content-Range`'s value into `buf` (`bytes START-END/LEN`, or `bytes */LEN` for a 416),
/// formatted without allocating; its length.
fn content_range(buf: &mut [u8; 80], range: Option<(u64, u64)>, len: u64) -> usize {
    let mut n = 0;
    let mut put = |s: &[u8]| {
        buf[n..n + s.len()].copy_from_slice(s);
        n += s.len();
    };
    let mut num = itoa::Buffer::new();
    put(b"bytes ");
    match range {
        Some((start, end)) => {
            put(num.format(start).as_bytes());
            put(b"-");
            put(num.format(end).as_bytes());
        }
        None => put(b"*"),
    }
    put(b"/");
    put(num.format(len).as_bytes());
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use RangeSpec::*;

    fn p(s: &str, len: u64) -> RangeSpec {
        parse(s.as_bytes(), len)
    }

    #[test]
    fn single_ranges() {
        assert_eq!(p("bytes=0-9", 100), Satisfiable { start: 0, end: 9 });
        assert_eq!(p("bytes=10-", 100), Satisfiable { start: 10, end: 99 });
        assert_eq!(p("bytes=-10", 100), Satisfiable { start: 90, end: 99 });
        assert_eq!(p("bytes=-1000", 100), Satisfiable { start: 0, end: 99 });
        assert_eq!(p("bytes=50-1000", 100), Satisfiable { start: 50, end: 99 });
        assert_eq!(p("bytes=99-99", 100), Satisfiable { start: 99, end: 99 });
        assert_eq!(p("Bytes = 1-2 ", 100), Satisfiable { start: 1, end: 2 });
        assert_eq!(
            p("bytes=0-99999999999999999999999", 10),
            Satisfiable { start: 0, end: 9 }
        );
    }

    #[test]
    fn unsatisfiable() {
        assert_eq!(p("bytes=100-", 100), Unsatisfiable);
        assert_eq!(p("bytes=100-200", 100), Unsatisfiable);
        assert_eq!(p("bytes=-0", 100), Unsatisfiable);
        assert_eq!(p("bytes=5-2", 100), Unsatisfiable);
        assert_eq!(p("bytes=0-0", 0), Unsatisfiable);
        assert_eq!(p("bytes=-5", 0), Unsatisfiable);
        assert_eq!(p("bytes=99999999999999999999999-", 10), Unsatisfiable);
    }

    proptest::proptest! {
        #[test]
        fn satisfiable_ranges_lie_inside(value in "[bytes= 0-9,-]{0,24}", len in 0u64..2000) {
            if let Satisfiable { start, end } = parse(value.as_bytes(), len) {
                proptest::prop_assert!(start <= end && end < len);
            }
        }
    }

    #[test]
    fn ignored() {
        for s in [
            "bytes=0-1,3-4",
            "bytes=0-1,",
            "items=0-1",
            "bytes=",
            "bytes=-",
            "bytes=a-b",
            "bytes=1",
            "bytes=1-x",
            "bytes=--1",
            "bytes=+1-2",
            "",
            "0-1",
        ] {
            assert_eq!(p(s, 100), Ignore, "{s}");
        }
    }
}
