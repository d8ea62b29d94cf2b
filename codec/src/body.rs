use crate::error::RequestError;

/// How the body of a request is framed, as decided from its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    None,
    Length(u64),
    Chunked,
}

/// One step of body decoding: `consumed` input bytes were used, of which `data` is payload
/// (possibly empty), and `done` says the body is complete.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded<'a> {
    pub consumed: usize,
    pub data: &'a [u8],
    pub done: bool,
}

/// Decodes a request body of either framing, without copying: payload comes back as slices of
/// the input. Feed it what has arrived; call again with the unconsumed rest.
#[derive(Debug, Clone)]
pub enum BodyDecoder {
    Length { remaining: u64 },
    Chunked(ChunkedDecoder),
    Done,
}

impl BodyDecoder {
    pub fn new(kind: BodyKind, max_body: u64) -> BodyDecoder {
        match kind {
            BodyKind::None | BodyKind::Length(0) => BodyDecoder::Done,
            BodyKind::Length(n) => BodyDecoder::Length { remaining: n },
            BodyKind::Chunked => BodyDecoder::Chunked(ChunkedDecoder::new(max_body)),
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self, BodyDecoder::Done)
    }

    pub fn decode<'a>(&mut self, input: &'a [u8]) -> Result<Decoded<'a>, RequestError> {
        match self {
            BodyDecoder::Done => Ok(Decoded {
                consumed: 0,
                data: &[],
                done: true,
            }),
            BodyDecoder::Length { remaining } => {
                let take = (*remaining).min(input.len() as u64) as usize;
                *remaining -= take as u64;
                let done = *remaining == 0;
                if done {
                    *self = BodyDecoder::Done;
                }
                Ok(Decoded {
                    consumed: take,
                    data: &input[..take],
                    done,
                })
            }
            BodyDecoder::Chunked(c) => {
                let step = c.decode(input)?;
                if step.done {
                    *self = BodyDecoder::Done;
                }
                Ok(step)
            }
        }
    }
}

/// Longest chunk-size line we accept (size + extensions), and all trailers together. Generous
/// for real clients, small enough that nobody can make us buffer or scan much.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 8192;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Reading hex digits of the chunk size.
    Size,
    /// After the digits: optional whitespace, extensions, then CR.
    Extension,
    /// Saw CR after the size line; expect LF.
    SizeLf,
    /// Inside chunk payload.
    Data,
    /// After payload: expect CR then LF.
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer field name, up to its colon.
    TrailerName,
    /// Inside a trailer field value, up to CR.
    Trailer,
    TrailerLf,
    /// Saw CR of the final empty line; expect LF.
    FinalLf,
    Done,
}

/// Where the decoder is inside the extensions of a chunk-size line (RFC 9112 §7.1.1):
/// `chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )`, with whitespace
/// also tolerated before the CR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ext {
    /// After the size digits, before any `;`.
    None,
    /// After `;`: a name must follow.
    BeforeName,
    Name,
    AfterName,
    /// After `=`: a token or a quoted string must follow.
    BeforeValue,
    Token,
    Quoted,
    /// Just saw a backslash inside a quoted string.
    Escape,
    AfterValue,
}

/// Incremental decoder for `Transfer-Encoding: chunked` (RFC 9112 §7.1). Extensions are
/// checked against their grammar and ignored, trailers are checked to be field lines and
/// skipped, bare LF is refused, and sizes are capped.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: ChunkState,
    chunk_remaining: u64,
    size_digits: u8,
    line_len: usize,
    trailer_len: usize,
    total: u64,
    max_body: u64,
    ext: Ext,
}

impl ChunkedDecoder {
    pub fn new(max_body: u64) -> ChunkedDecoder {
        ChunkedDecoder {
            state: ChunkState::Size,
            chunk_remaining: 0,
            size_digits: 0,
            line_len: 0,
            trailer_len: 0,
            total: 0,
            max_body,
            ext: Ext::None,
        }
    }

    /// Decodes as much as possible, stopping at the end of the first payload run so the data
    /// can be returned as a borrowed slice.
    pub fn decode<'a>(&mut self, input: &'a [u8]) -> Result<Decoded<'a>, RequestError> {
        use ChunkState::*;
        let mut i = 0;
        while i < input.len() {
            let b = input[i];
            match self.state {
                Size => {
                    if let Some(d) = hex_value(b) {
                        // 15 hex digits is already 1 EiB; more is an overflow attempt.
                        if self.size_digits >= 15 {
                            return Err(RequestError::BadChunk);
                        }
                        self.chunk_remaining = self.chunk_remaining << 4 | u64::from(d);
                        self.size_digits += 1;
                    } else if self.size_digits == 0 {
                        return Err(RequestError::BadChunk);
                    } else {
                        self.state = Extension;
                        continue; // re-examine this byte as part of the extension area
                    }
                    self.line_len += 1;
                }
                Extension => {
                    self.line_len += 1;
                    if self.line_len > MAX_CHUNK_LINE {
                        return Err(RequestError::BadChunk);
                    }
                    // Anything the grammar does not allow is refused rather than skipped: "5x"
                    // or "5 5" must not be read as a size of 5, a bare `;` or `;=v` is no
                    // extension, and only CRLF (never a CR or LF inside a quoted string) ends
                    // the line. Whitespace before the CR is tolerated.
                    use Ext::*;
                    let ws = b == b' ' || b == b'\t';
                    self.ext = match (self.ext, b) {
                        (None | AfterName | AfterValue | Name | Token, b'\r') => {
                            self.state = SizeLf;
                            None
                        }
                        (None | BeforeName | AfterName | BeforeValue | AfterValue, _) if ws => {
                            self.ext
                        }
                        (Name | Token, _) if ws => {
                            if self.ext == Name {
                                AfterName
                            } else {
                                AfterValue
                            }
                        }
                        (None | Name | AfterName | Token | AfterValue, b';') => BeforeName,
                        (BeforeName | Name, _) if is_tchar(b) => Name,
                        (Name | AfterName, b'=') => BeforeValue,
                        (BeforeValue | Token, _) if is_tchar(b) => Token,
                        (BeforeValue, b'"') => Quoted,
                        (Quoted, b'"') => AfterValue,
                        (Quoted, b'\\') => Escape,
                        // qdtext, and after a backslash any HTAB / SP / VCHAR / obs-text
                        // (quoted-pair, RFC 9110 §5.6.4): `\"` does not end the string.
                        (Quoted | Escape, b'\t' | b' '..=b'~' | 0x80..=0xff) => Quoted,
                        _ => return Err(RequestError::BadChunk),
                    };
                }
                SizeLf => {
                    if b != b'\n' {
                        return Err(RequestError::BadChunk);
                    }
                    self.total = self.total.saturating_add(self.chunk_remaining);
                    if self.total > self.max_body {
                        return Err(RequestError::BodyTooLarge);
                    }
                    self.size_digits = 0;
                    self.line_len = 0;
                    self.ext = Ext::None;
                    self.state = if self.chunk_remaining == 0 {
                        TrailerStart
                    } else {
                        Data
                    };
                }
                Data => {
                    let take = self.chunk_remaining.min((input.len() - i) as u64) as usize;
                    self.chunk_remaining -= take as u64;
                    if self.chunk_remaining == 0 {
                        self.state = DataCr;
                    }
                    return Ok(Decoded {
                        consumed: i + take,
                        data: &input[i..i + take],
                        done: false,
                    });
                }
                DataCr => {
                    if b != b'\r' {
                        return Err(RequestError::BadChunk);
                    }
                    self.state = DataLf;
                }
                DataLf => {
                    if b != b'\n' {
                        return Err(RequestError::BadChunk);
                    }
                    self.state = Size;
                }
                TrailerStart => match b {
                    b'\r' => self.state = FinalLf,
                    // A trailer line is a field line: `token ":" value`. Anything else (a
                    // request line, obs-fold, a space before the colon) is refused, not
                    // skipped: a front end that ended the body at `0\r\n` would otherwise
                    // read those bytes as a request we silently swallowed.
                    _ if is_tchar(b) => {
                        self.state = TrailerName;
                        continue;
                    }
                    _ => return Err(RequestError::BadChunk),
                },
                TrailerName | Trailer => {
                    self.trailer_len += 1;
                    if self.trailer_len > MAX_TRAILERS {
                        return Err(RequestError::BadChunk);
                    }
                    match (self.state, b) {
                        (TrailerName, b':') => self.state = Trailer,
                        (TrailerName, _) if is_tchar(b) => {}
                        (Trailer, b'\r') => self.state = TrailerLf,
                        // field-vchar, SP, HTAB, obs-text: the same bytes header values allow.
                        (Trailer, b'\t' | b' '..=b'~' | 0x80..=0xff) => {}
                        _ => return Err(RequestError::BadChunk),
                    }
                }
                TrailerLf => {
                    if b != b'\n' {
                        return Err(RequestError::BadChunk);
                    }
                    self.state = TrailerStart;
                }
                FinalLf => {
                    if b != b'\n' {
                        return Err(RequestError::BadChunk);
                    }
                    self.state = Done;
                    return Ok(Decoded {
                        consumed: i + 1,
                        data: &[],
                        done: true,
                    });
                }
                Done => {
                    return Ok(Decoded {
                        consumed: i,
                        data: &[],
                        done: true,
                    })
                }
            }
            i += 1;
        }
        Ok(Decoded {
            consumed: i,
            data: &[],
            done: self.state == Done,
        })
    }
}

/// tchar (RFC 9110 §5.6.2): the bytes of a token such as a field or extension name.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A token (RFC 9110 §5.6.2): one or more tchars, as a method or a field name is.
pub fn is_token(bytes: &[u8]) -> bool {
    !bytes.is_empty() && bytes.iter().all(|&b| is_tchar(b))
}

/// The value of one hex digit (chunk sizes, percent escapes).
pub(crate) fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn tokens_are_one_or_more_tchars() {
        for ok in [&b"GET"[..], b"x-request-id", b"!#$%&'*+-.^_`|~09az"] {
            assert!(is_token(ok), "{ok:?}");
        }
        for bad in [&b""[..], b"a b", b"a:b", b"caf\xc3\xa9", b"(x)", b"a/b"] {
            assert!(!is_token(bad), "{bad:?}");
        }
    }

    use super::*;

    /// Decodes `input` in one go; `Ok(None)` means it needs more input.
    fn run(input: &[u8], max_body: u64) -> Result<Option<Vec<u8>>, RequestError> {
        let mut d = ChunkedDecoder::new(max_body);
        let mut rest = input;
        let mut out = Vec::new();
        loop {
            let step = d.decode(rest)?;
            out.extend_from_slice(step.data);
            rest = &rest[step.consumed..];
            if step.done {
                return Ok(Some(out));
            }
            if step.consumed == 0 {
                return Ok(None);
            }
        }
    }

    #[test]
    fn hex_digits() {
        for (b, v) in [
            (b'0', 0),
            (b'9', 9),
            (b'a', 10),
            (b'f', 15),
            (b'A', 10),
            (b'F', 15),
        ] {
            assert_eq!(hex_value(b), Some(v));
        }
        for b in [b'g', b'G', b'x', b' ', b'/', b':', b'@', b'`'] {
            assert_eq!(hex_value(b), None);
        }
    }

    #[test]
    fn size_line_length_cap_is_exact() {
        // The size line, digits through CR, may be MAX_CHUNK_LINE bytes long.
        let pad = MAX_CHUNK_LINE - "1;\r".len();
        let ok = format!("1;{}\r\nx\r\n0\r\n\r\n", "a".repeat(pad));
        assert_eq!(run(ok.as_bytes(), 100), Ok(Some(b"x".to_vec())));
        let over = format!("1;{}\r\nx\r\n0\r\n\r\n", "a".repeat(pad + 1));
        assert_eq!(run(over.as_bytes(), 100), Err(RequestError::BadChunk));
    }

    #[test]
    fn size_digit_cap_is_fifteen() {
        let fifteen = format!("{}1\r\nx\r\n0\r\n\r\n", "0".repeat(14));
        assert_eq!(run(fifteen.as_bytes(), 100), Ok(Some(b"x".to_vec())));
        let sixteen = format!("{}1\r\nx\r\n0\r\n\r\n", "0".repeat(15));
        assert_eq!(run(sixteen.as_bytes(), 100), Err(RequestError::BadChunk));
        // The largest 15-digit size fits a u64 and only trips the body limit.
        assert_eq!(run(b"fffffffffffffff\r\n", u64::MAX), Ok(None));
        assert_eq!(run(b"fffffffffffffff\r\n", u64::MAX - 1), Ok(None));
    }

    #[test]
    fn trailer_cap_is_exact() {
        // MAX_TRAILERS counts every trailer byte including each line's CR.
        let line = format!("X: {}\r\n", "a".repeat(MAX_TRAILERS - "X: \r".len()));
        let ok = format!("0\r\n{line}\r\n");
        assert_eq!(run(ok.as_bytes(), 100), Ok(Some(Vec::new())));
        let line = format!("X: {}\r\n", "a".repeat(MAX_TRAILERS - "X: \r".len() + 1));
        let over = format!("0\r\n{line}\r\n");
        assert_eq!(run(over.as_bytes(), 100), Err(RequestError::BadChunk));
    }

    #[test]
    fn quote_and_escape_state_reset_between_size_lines() {
        let body = b"1;a=\"\\\\\";b=\"\\\"\"\r\nx\r\n1;c\r\ny\r\n0\r\n\r\n";
        assert_eq!(run(body, 100), Ok(Some(b"xy".to_vec())));
        let d = ChunkedDecoder::new(100);
        assert_eq!(d.ext, Ext::None);
    }

    #[test]
    fn payload_is_returned_per_run_without_copying() {
        let input = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let mut d = ChunkedDecoder::new(100);
        let first = d.decode(input).unwrap();
        assert_eq!(
            (first.consumed, first.data, first.done),
            (6, &b"abc"[..], false)
        );
        assert_eq!(first.data.as_ptr(), input[3..].as_ptr());
        let second = d.decode(&input[6..]).unwrap();
        assert_eq!(
            (second.consumed, second.data, second.done),
            (7, &b"de"[..], false)
        );
        let last = d.decode(&input[13..]).unwrap();
        assert_eq!((last.consumed, last.data, last.done), (7, &b""[..], true));
    }
}
