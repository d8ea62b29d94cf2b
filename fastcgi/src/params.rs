//! Name-value pairs (the `PARAMS` stream): what CGI calls meta-variables.

use crate::record::{stream, RecordType};

/// The longest name or value the encoding allows (31 bits).
const MAX_LEN: usize = 0x7fff_ffff;

/// The `PARAMS` stream of one request, built pair by pair and written as records at the end.
#[derive(Debug, Default)]
pub struct Params {
    bytes: Vec<u8>,
}

impl Params {
    pub fn new() -> Params {
        Params::default()
    }

    /// Adds one pair. Names and values longer than 2³¹−1 bytes cannot be encoded; no request
    /// tern accepts comes near (its head limit is far below), so they are cut, not refused.
    pub fn add(&mut self, name: &[u8], value: &[u8]) -> &mut Params {
        let name = &name[..name.len().min(MAX_LEN)];
        let value = &value[..value.len().min(MAX_LEN)];
        put_len(&mut self.bytes, name.len());
        put_len(&mut self.bytes, value.len());
        self.bytes.extend_from_slice(name);
        self.bytes.extend_from_slice(value);
        self
    }

    /// The encoded pairs so far (for tests and size checks).
    pub fn encoded(&self) -> &[u8] {
        &self.bytes
    }

    /// The value last added under `name` (for tests and checks: a linear search).
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        pairs(&self.bytes)
            .filter(|(n, _)| *n == name)
            .last()
            .map(|(_, value)| value)
    }

    /// Appends the pairs as `PARAMS` records and the empty record that ends them.
    pub fn write_records(&self, out: &mut Vec<u8>, request_id: u16) {
        if !self.bytes.is_empty() {
            stream(out, RecordType::Params, request_id, &self.bytes);
        }
        stream(out, RecordType::Params, request_id, &[]);
    }
}

/// Lengths under 128 take one byte; longer ones four, with the top bit set.
fn put_len(out: &mut Vec<u8>, len: usize) {
    if len < 0x80 {
        out.push(len as u8);
    } else {
        out.extend_from_slice(&((len as u32) | 0x8000_0000).to_be_bytes());
    }
}

/// The parameter a request header field becomes (`Accept-Language` → `HTTP_ACCEPT_LANGUAGE`),
/// or `None` for a field that must not be passed:
/// - a name with `_`: `X_Real_IP` and `X-Real-IP` would both become `HTTP_X_REAL_IP`, so a
///   client could forge a field a proxy in front set (nginx drops them by default too);
/// - `Proxy`: `HTTP_PROXY` is read as the outgoing proxy by many CGI libraries ("httpoxy",
///   CVE-2016-5385);
/// - `Content-Type` and `Content-Length`: passed as `CONTENT_TYPE` and `CONTENT_LENGTH`.
pub fn http_param_name(field: &[u8]) -> Option<Vec<u8>> {
    if field.is_empty()
        || field.contains(&b'_')
        || field.eq_ignore_ascii_case(b"proxy")
        || field.eq_ignore_ascii_case(b"content-type")
        || field.eq_ignore_ascii_case(b"content-length")
        || !tern_codec::is_token(field)
    {
        return None;
    }
    let mut name = Vec::with_capacity(5 + field.len());
    name.extend_from_slice(b"HTTP_");
    name.extend(field.iter().map(|&b| match b {
        b'-' => b'_',
        b => b.to_ascii_uppercase(),
    }));
    Some(name)
}

/// The pairs of an encoded `PARAMS` stream in order, up to the first one cut short.
pub fn pairs(mut bytes: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    std::iter::from_fn(move || {
        let (name_len, a) = read_len(bytes)?;
        let (value_len, b) = read_len(bytes.get(a..)?)?;
        let name_at = a + b;
        let value_at = name_at.checked_add(name_len)?;
        let end = value_at.checked_add(value_len)?;
        let pair = (bytes.get(name_at..value_at)?, bytes.get(value_at..end)?);
        bytes = &bytes[end..];
        Some(pair)
    })
}

/// Reads one length of the pair encoding (for the tests and the fuzz target's checks).
pub fn read_len(input: &[u8]) -> Option<(usize, usize)> {
    let first = *input.first()?;
    if first < 0x80 {
        return Some((first as usize, 1));
    }
    let four: [u8; 4] = input.get(..4)?.try_into().ok()?;
    Some(((u32::from_be_bytes(four) & 0x7fff_ffff) as usize, 4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Header, HEADER_LEN, MAX_CONTENT};

    fn all_pairs(bytes: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs(bytes)
            .map(|(n, v)| (n.to_vec(), v.to_vec()))
            .collect()
    }

    #[test]
    fn short_and_long_lengths_are_encoded_as_the_spec_says() {
        let long = vec![b'x'; 200];
        let mut p = Params::new();
        p.add(b"SCRIPT_NAME", b"/index.php")
            .add(b"HTTP_COOKIE", &long);
        assert_eq!(p.encoded()[0], 11);
        assert_eq!(p.encoded()[1], 10);
        let second = 2 + 11 + 10;
        assert_eq!(p.encoded()[second], 11);
        assert_eq!(&p.encoded()[second + 1..second + 5], &[0x80, 0, 0, 200]);
        assert_eq!(
            all_pairs(p.encoded()),
            vec![
                (b"SCRIPT_NAME".to_vec(), b"/index.php".to_vec()),
                (b"HTTP_COOKIE".to_vec(), long.clone())
            ]
        );
        assert_eq!(p.get(b"HTTP_COOKIE"), Some(&long[..]));
        assert_eq!(p.get(b"SCRIPT"), None);
        p.add(b"SCRIPT_NAME", b"/again.php");
        assert_eq!(p.get(b"SCRIPT_NAME"), Some(&b"/again.php"[..]));
        // A stream cut short yields the whole pairs before the cut, and no more.
        let cut = &p.encoded()[..p.encoded().len() - 1];
        assert_eq!(all_pairs(cut).len(), 2);
        assert_eq!(all_pairs(&[0x80, 0, 0]), vec![]);
    }

    #[test]
    fn params_longer_than_a_record_span_records_and_end_with_an_empty_one() {
        let big = vec![b'v'; MAX_CONTENT];
        let mut p = Params::new();
        p.add(b"HTTP_X", &big);
        let mut out = Vec::new();
        p.write_records(&mut out, 3);
        let first = Header::parse(out[..8].try_into().unwrap());
        assert_eq!(first.content_len as usize, MAX_CONTENT);
        let end = Header::parse(out[out.len() - 8..].try_into().unwrap());
        assert_eq!((end.content_len, end.request_id), (0, 3));
        assert_eq!(out.len(), 3 * HEADER_LEN + p.encoded().len());
    }

    #[test]
    fn header_fields_become_http_params_except_the_dangerous_ones() {
        assert_eq!(
            http_param_name(b"Accept-Language").as_deref(),
            Some(&b"HTTP_ACCEPT_LANGUAGE"[..])
        );
        assert_eq!(
            http_param_name(b"x-real-ip").as_deref(),
            Some(&b"HTTP_X_REAL_IP"[..])
        );
        assert_eq!(http_param_name(b"X_Real_IP"), None, "would alias X-Real-IP");
        assert_eq!(http_param_name(b"Proxy"), None, "httpoxy");
        assert_eq!(http_param_name(b"PROXY"), None);
        assert_eq!(http_param_name(b"Content-Type"), None);
        assert_eq!(http_param_name(b"content-length"), None);
        assert_eq!(http_param_name(b"bad name"), None);
        assert_eq!(http_param_name(b""), None);
    }
}
