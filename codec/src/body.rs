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
    /// Inside a trailer line, skipping to CR.
    Trailer,
    TrailerLf,
    /// Saw CR of the final empty line; expect LF.
    FinalLf,
    Done,
}

/// Incremental decoder for `Transfer-Encoding: chunked` (RFC 9112 §7.1). Extensions are
/// validated and ignored, trailers are skipped, bare LF is refused, and sizes are capped.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: ChunkState,
    chunk_remaining: u64,
    size_digits: u8,
    line_len: usize,
    trailer_len: usize,
    total: u64,
    max_body: u64,
    in_quote: bool,
    in_ext: bool,
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
            in_quote: false,
            in_ext: false,
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
                    match b {
                        b'\r' if !self.in_quote => self.state = SizeLf,
                        // Between the digits and the first ';' only whitespace (BWS) may appear:
                        // "5x" or "5 5" must not be read as a size of 5.
                        b' ' | b'\t' if !self.in_ext => {}
                        b';' if !self.in_ext => self.in_ext = true,
                        _ if !self.in_ext => return Err(RequestError::BadChunk),
                        b'"' => self.in_quote = !self.in_quote,
                        b'\t' | b' '..=b'~' | 0x80..=0xff => {}
                        _ => return Err(RequestError::BadChunk),
                    }
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
                    self.in_ext = false;
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
                    b'\n' => return Err(RequestError::BadChunk),
                    _ => {
                        self.state = Trailer;
                        continue;
                    }
                },
                Trailer => {
                    self.trailer_len += 1;
                    if self.trailer_len > MAX_TRAILERS {
                        return Err(RequestError::BadChunk);
                    }
                    match b {
                        b'\r' => self.state = TrailerLf,
                        b'\n' | 0 => return Err(RequestError::BadChunk),
                        _ => {}
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

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}
