//! The CGI response head at the start of `STDOUT` (RFC 3875 §6): header lines ended by an
//! empty line, `Status: 404 Not Found` for the status, `Location` alone meaning a redirect.
//! The head is judged like an upstream's HTTP head: what could split or smuggle an answer
//! (bare CR, NUL, folded lines, conflicting lengths) is refused, hop-by-hop fields dropped.

/// The largest head accepted (PHP sends a few hundred bytes; cookies can make it kilobytes).
pub const MAX_HEAD: usize = 64 * 1024;

/// A parsed head: the status and the fields to answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgiHead {
    pub status: u16,
    /// In the application's order, `Status` and hop-by-hop fields removed.
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
    /// The application's `Content-Length`, if it gave one.
    pub content_length: Option<u64>,
}

impl CgiHead {
    pub fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v.as_slice())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgiError {
    TooLarge,
    /// A line without `:`, a name that is not a token, a folded line.
    BadField,
    /// CR not before LF, NUL or another control byte in a value.
    BadByte,
    BadStatus,
    BadContentLength,
    /// `STDOUT` ended before the head did.
    Incomplete,
}

impl CgiError {
    pub fn message(self) -> &'static str {
        match self {
            CgiError::TooLarge => "FastCGI answer head too large",
            CgiError::BadField => "malformed header field in FastCGI answer",
            CgiError::BadByte => "forbidden byte in FastCGI answer head",
            CgiError::BadStatus => "bad Status in FastCGI answer",
            CgiError::BadContentLength => "bad Content-Length in FastCGI answer",
            CgiError::Incomplete => "FastCGI answer ended inside its head",
        }
    }
}

/// Fields a gateway answers for itself, never passed from the application.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Collects `STDOUT` bytes until the head is complete.
#[derive(Debug, Default)]
pub struct CgiHeadParser {
    /// Bytes of an incomplete head from earlier pieces.
    held: Vec<u8>,
}

impl CgiHeadParser {
    pub fn new() -> CgiHeadParser {
        CgiHeadParser::default()
    }

    /// Takes the next `STDOUT` bytes. `Ok(Some((head, used)))` once the head is complete:
    /// `input[used..]` is the start of the body.
    pub fn feed(&mut self, input: &[u8]) -> Result<Option<(CgiHead, usize)>, CgiError> {
        if self.held.is_empty() {
            // The usual case: the whole head in the first piece, parsed where it lies.
            return match head_end(input) {
                Some(end) => Ok(Some((parse(&input[..end])?, end))),
                None => self.hold(input).map(|_| None),
            };
        }
        let before = self.held.len();
        self.hold(input)?;
        match head_end(&self.held) {
            Some(end) => {
                let head = parse(&self.held[..end])?;
                self.held = Vec::new();
                Ok(Some((head, end - before)))
            }
            None => Ok(None),
        }
    }

    fn hold(&mut self, input: &[u8]) -> Result<(), CgiError> {
        // Enough is kept to find the end; more than the limit is refused.
        if self.held.len() + input.len() > MAX_HEAD + 4 {
            return Err(CgiError::TooLarge);
        }
        self.held.extend_from_slice(input);
        Ok(())
    }
}

/// Where the head ends (just past the empty line), if it does.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    for nl in memchr::memchr_iter(b'\n', bytes) {
        let line = &bytes[line_start..nl];
        if line.is_empty() || line == b"\r" {
            return Some(nl + 1);
        }
        line_start = nl + 1;
    }
    None
}

fn parse(head: &[u8]) -> Result<CgiHead, CgiError> {
    if head.len() > MAX_HEAD {
        return Err(CgiError::TooLarge);
    }
    let mut status = None;
    let mut location = false;
    let mut content_length: Option<u64> = None;
    let mut fields = Vec::new();
    for line in head.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            break;
        }
        if line[0] == b' ' || line[0] == b'\t' {
            return Err(CgiError::BadField); // obsolete folding
        }
        let colon = memchr::memchr(b':', line).ok_or(CgiError::BadField)?;
        let name = &line[..colon];
        if !tern_codec::is_token(name) {
            return Err(CgiError::BadField);
        }
        let value = tern_codec::trim_ows(&line[colon + 1..]);
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(CgiError::BadByte);
        }
        if name.eq_ignore_ascii_case(b"status") {
            if status.is_some() {
                return Err(CgiError::BadStatus);
            }
            status = Some(parse_status(value)?);
            continue;
        }
        if HOP_BY_HOP
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
        {
            continue;
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = parse_length(value)?;
            if content_length.is_some_and(|m| m != n) {
                return Err(CgiError::BadContentLength);
            }
            if content_length.is_some() {
                continue; // the same length twice: once is enough
            }
            content_length = Some(n);
        }
        location |= name.eq_ignore_ascii_case(b"location");
        fields.push((name.to_vec(), value.to_vec()));
    }
    let status = match status {
        Some(s) => s,
        // RFC 3875 §6.2.3/§6.2.4: a Location without a Status is a redirect.
        None if location => 302,
        None => 200,
    };
    Ok(CgiHead {
        status,
        fields,
        content_length,
    })
}

/// `404 Not Found` → 404. Interim (1xx) statuses cannot be a CGI script's final answer.
fn parse_status(value: &[u8]) -> Result<u16, CgiError> {
    let code = value.get(..3).ok_or(CgiError::BadStatus)?;
    if !code.iter().all(u8::is_ascii_digit) || value.get(3).is_some_and(|&b| b != b' ') {
        return Err(CgiError::BadStatus);
    }
    let n = code.iter().fold(0u16, |n, &d| n * 10 + u16::from(d - b'0'));
    if !(200..=599).contains(&n) {
        return Err(CgiError::BadStatus);
    }
    Ok(n)
}

fn parse_length(value: &[u8]) -> Result<u64, CgiError> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return Err(CgiError::BadContentLength);
    }
    Ok(value
        .iter()
        .fold(0u64, |n, &d| n * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(bytes: &[u8]) -> Result<(CgiHead, usize), CgiError> {
        CgiHeadParser::new()
            .feed(bytes)
            .map(|r| r.expect("complete"))
    }

    #[test]
    fn status_fields_and_the_start_of_the_body() {
        let wire =
            b"Status: 404 Not Found\r\nContent-Type: text/html\r\nX-Powered-By: PHP\r\n\r\n<h1>";
        let (h, used) = head(wire).unwrap();
        assert_eq!(h.status, 404);
        assert_eq!(h.field("content-type"), Some(&b"text/html"[..]));
        assert_eq!(h.fields.len(), 2, "Status is not a field of the answer");
        assert_eq!(&wire[used..], b"<h1>");
    }

    #[test]
    fn bare_lf_lines_are_accepted_as_cgi_allows() {
        let (h, used) = head(b"Content-Type: text/plain\n\nbody").unwrap();
        assert_eq!((h.status, used), (200, 26));
    }

    #[test]
    fn location_alone_is_a_redirect_and_an_explicit_status_wins() {
        assert_eq!(head(b"Location: /login\r\n\r\n").unwrap().0.status, 302);
        assert_eq!(
            head(b"Status: 301\r\nLocation: https://x/\r\n\r\n")
                .unwrap()
                .0
                .status,
            301
        );
    }

    #[test]
    fn a_head_split_across_pieces_is_found_and_the_body_offset_is_of_the_last_piece() {
        let mut p = CgiHeadParser::new();
        assert_eq!(p.feed(b"Content-Type: te").unwrap(), None);
        assert_eq!(p.feed(b"xt/plain\r").unwrap(), None);
        assert_eq!(p.feed(b"\n\r").unwrap(), None);
        let (h, used) = p.feed(b"\nrest").unwrap().unwrap();
        assert_eq!(h.field("Content-Type"), Some(&b"text/plain"[..]));
        assert_eq!(used, 1);
    }

    #[test]
    fn what_could_split_or_smuggle_an_answer_is_refused() {
        assert_eq!(head(b"X: a\rb\r\n\r\n").unwrap_err(), CgiError::BadByte);
        assert_eq!(head(b"X: a\0b\r\n\r\n").unwrap_err(), CgiError::BadByte);
        assert_eq!(head(b"X: a\r\n b\r\n\r\n").unwrap_err(), CgiError::BadField);
        assert_eq!(
            head(b"Bad Name: a\r\n\r\n").unwrap_err(),
            CgiError::BadField
        );
        assert_eq!(head(b"no colon\r\n\r\n").unwrap_err(), CgiError::BadField);
        assert_eq!(
            head(b"Content-Length: 5\r\nContent-Length: 6\r\n\r\n").unwrap_err(),
            CgiError::BadContentLength
        );
        assert_eq!(
            head(b"Content-Length: -1\r\n\r\n").unwrap_err(),
            CgiError::BadContentLength
        );
        assert_eq!(
            head(b"Status: 99\r\n\r\n").unwrap_err(),
            CgiError::BadStatus
        );
        assert_eq!(
            head(b"Status: 100 Continue\r\n\r\n").unwrap_err(),
            CgiError::BadStatus
        );
        assert_eq!(
            head(b"Status: 2000\r\n\r\n").unwrap_err(),
            CgiError::BadStatus
        );
        assert_eq!(
            head(b"Status: 200\r\nStatus: 500\r\n\r\n").unwrap_err(),
            CgiError::BadStatus
        );
    }

    #[test]
    fn hop_by_hop_fields_are_dropped_and_one_length_is_kept() {
        let (h, _) = head(
            b"Transfer-Encoding: chunked\r\nConnection: close\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
        )
        .unwrap();
        assert_eq!(h.content_length, Some(3));
        assert_eq!(h.fields, vec![(b"Content-Length".to_vec(), b"3".to_vec())]);
    }

    #[test]
    fn an_endless_head_is_refused() {
        let mut p = CgiHeadParser::new();
        let line = b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
        let mut err = None;
        for _ in 0..2000 {
            if let Err(e) = p.feed(line) {
                err = Some(e);
                break;
            }
        }
        assert_eq!(err, Some(CgiError::TooLarge));
    }
}
