//! Builds `GET / HTTP/1.1` with one fuzzed header field and checks the header rules: a value
//! with NUL, CR or LF is never accepted; a well-formed field always is (unless its name gives
//! it framing or routing meaning), and reaches the handler trimmed but otherwise unchanged.
#![no_main]

use std::mem::MaybeUninit;

use libfuzzer_sys::fuzz_target;
use tern_codec::{parse_request, Limits, Parsed, MAX_HEADERS_DEFAULT};

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_field_byte(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80
}

fn trim(v: &[u8]) -> &[u8] {
    let s = v
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(v.len());
    let e = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(s, |e| e + 1);
    &v[s..e]
}

/// Fields whose value the codec interprets and may legitimately refuse.
const MEANINGFUL: [&str; 5] = [
    "host",
    "content-length",
    "transfer-encoding",
    "expect",
    "connection",
];

fuzz_target!(|data: &[u8]| {
    // Input: one byte giving the name's length, the name, then the value (the rest).
    let Some((&len, rest)) = data.split_first() else {
        return;
    };
    let (name, value) = rest.split_at(usize::from(len).min(rest.len()));
    let mut buf = b"GET / HTTP/1.1\r\nHost: example.com\r\n".to_vec();
    buf.extend_from_slice(name);
    buf.extend_from_slice(b": ");
    buf.extend_from_slice(value);
    buf.extend_from_slice(b"\r\n\r\n");

    let mut scratch = [MaybeUninit::uninit(); MAX_HEADERS_DEFAULT];
    let parsed = parse_request(&buf, &mut scratch, &Limits::default());

    // However the field is built, an accepted head never contains NUL, a bare CR or a bare LF,
    // and no value handed to a handler contains NUL, CR or LF.
    if let Ok(Parsed::Complete(head)) = &parsed {
        let raw = &buf[..head.head_len];
        for (i, &b) in raw.iter().enumerate() {
            assert_ne!(b, 0, "NUL accepted");
            if b == b'\n' {
                assert!(raw[i - 1] == b'\r', "bare LF accepted");
            }
            if b == b'\r' {
                assert_eq!(raw.get(i + 1), Some(&b'\n'), "bare CR accepted");
            }
        }
        for h in head.headers {
            assert!(
                !h.value.iter().any(|b| matches!(b, 0 | b'\r' | b'\n')),
                "{:?}",
                h.value
            );
            assert!(!h.name.is_empty() && h.name.bytes().all(is_tchar));
        }
    }

    let name_ok = !name.is_empty() && name.iter().all(|&b| is_tchar(b));
    if name_ok && !value.contains(&b'\n') {
        // One field line: NUL or CR in its value must be refused outright.
        if value.contains(&0) || value.contains(&b'\r') {
            assert!(parsed.is_err(), "NUL/CR in a value accepted: {value:?}");
        } else if value.iter().all(|&b| is_field_byte(b)) {
            let lower = String::from_utf8_lossy(name).to_ascii_lowercase();
            match &parsed {
                Ok(Parsed::Complete(head)) => {
                    assert_eq!(head.headers.len(), 2);
                    assert_eq!(head.headers[1].name.as_bytes(), name);
                    assert_eq!(head.headers[1].value, trim(value));
                }
                other => assert!(
                    MEANINGFUL.contains(&lower.as_str()),
                    "well-formed field refused: {other:?}"
                ),
            }
        } else {
            // Other control bytes (and DEL) are not field content either.
            assert!(
                parsed.is_err(),
                "control byte in a value accepted: {value:?}"
            );
        }
    }
});
