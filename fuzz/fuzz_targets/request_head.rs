//! parse_request on arbitrary bytes; when a head is complete, the rest is decoded as its body.
//! Checks the invariants of every accepted head and that the verdict does not depend on how the
//! bytes were segmented.
#![no_main]

use std::mem::MaybeUninit;

use libfuzzer_sys::fuzz_target;
use tern_codec::{
    parse_request, BodyDecoder, BodyKind, Limits, Parsed, RequestError, MAX_HEADERS_DEFAULT,
};

/// Small limits so that the 431 and 413 paths are reachable with libFuzzer's default input size.
const LIMITS: Limits = Limits {
    max_head: 2048,
    max_headers: 32,
    max_body: 4096,
    allow_encoded_slash: false,
};

/// Status of the verdict, or 0 for Partial and 1 for Complete with the given head length.
fn verdict(buf: &[u8]) -> (u16, usize) {
    let mut scratch = [MaybeUninit::uninit(); MAX_HEADERS_DEFAULT];
    match parse_request(buf, &mut scratch, &LIMITS) {
        Ok(Parsed::Partial) => (0, 0),
        Ok(Parsed::Complete(h)) => (1, h.head_len),
        Err(e) => (e.status(), 0),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut scratch = [MaybeUninit::uninit(); MAX_HEADERS_DEFAULT];
    let parsed = parse_request(data, &mut scratch, &LIMITS);
    match parsed {
        Ok(Parsed::Partial) => {
            assert!(
                data.len() < LIMITS.max_head,
                "Partial at or beyond the head limit"
            );
            // Any prefix of a Partial input is Partial too.
            assert_eq!(verdict(&data[..data.len() / 2]), (0, 0));
        }
        Err(e) => {
            assert!(matches!(e.status(), 400 | 413 | 417 | 431 | 505), "{e:?}");
            assert!(e.message().ends_with('\n'));
            // A prefix is Partial or already answered with the same status.
            let (s, _) = verdict(&data[..data.len() / 2]);
            assert!(
                s == 0 || s == e.status(),
                "prefix {s} vs whole {}",
                e.status()
            );
        }
        Ok(Parsed::Complete(head)) => {
            let n = head.head_len;
            assert!(n > 0 && n <= data.len() && n <= LIMITS.max_head);
            let raw = &data[..n];
            assert!(raw.ends_with(b"\r\n\r\n"));
            for (i, &b) in raw.iter().enumerate() {
                assert_ne!(b, 0, "NUL in an accepted head");
                if b == b'\n' {
                    assert!(i > 0 && raw[i - 1] == b'\r', "bare LF in an accepted head");
                }
                if b == b'\r' {
                    assert_eq!(raw.get(i + 1), Some(&b'\n'), "bare CR in an accepted head");
                }
            }
            for h in head.headers {
                assert!(!h.value.iter().any(|b| matches!(b, 0 | b'\r' | b'\n')));
            }
            assert!(!head.target.contains('#'));
            assert!(head.headers.len() <= LIMITS.max_headers);
            assert!(!head.expect_continue || head.body != BodyKind::None);
            if let BodyKind::Length(len) = head.body {
                assert!(len > 0 && len <= LIMITS.max_body);
            }
            // Every shorter prefix is Partial; the whole head alone parses the same.
            assert_eq!(verdict(&data[..n - 1]), (0, 0));
            assert_eq!(verdict(raw), (1, n));

            let mut dec = BodyDecoder::new(head.body, LIMITS.max_body);
            let mut rest = &data[n..];
            let mut total = 0u64;
            loop {
                match dec.decode(rest) {
                    Ok(step) => {
                        assert!(step.consumed <= rest.len());
                        assert!(step.data.len() <= step.consumed);
                        total += step.data.len() as u64;
                        assert!(total <= LIMITS.max_body);
                        rest = &rest[step.consumed..];
                        if step.done {
                            if let BodyKind::Length(len) = head.body {
                                assert_eq!(total, len);
                            }
                            break;
                        }
                        if step.consumed == 0 {
                            assert!(rest.is_empty(), "decoder stalled on available input");
                            break;
                        }
                    }
                    Err(e) => {
                        assert!(head.body == BodyKind::Chunked);
                        assert!(matches!(
                            e,
                            RequestError::BadChunk | RequestError::BodyTooLarge
                        ));
                        break;
                    }
                }
            }
        }
    }
});
