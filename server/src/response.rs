use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;

/// A response body. The connection decides how each kind reaches the socket: small bodies are
/// copied next to the head so head and body leave in one write, large shared ones go out with
/// `writev` without copying, and files go out with `sendfile`.
#[derive(Debug, Default)]
pub enum Body {
    #[default]
    Empty,
    Static(&'static [u8]),
    Owned(Vec<u8>),
    Shared(Bytes),
    File(FileBody),
}

/// A byte range of an open file, sent with `sendfile` (zero copy) in bounded chunks.
#[derive(Debug, Clone)]
pub struct FileBody {
    pub file: Arc<File>,
    pub offset: u64,
    pub len: u64,
}

impl FileBody {
    /// The next [`PIECE`] bytes at most, read into memory (`pread`; the offset moves on): for answers that must hold their bytes (HTTP/3's streams keep them
    /// until acknowledged). The buffer comes from this thread's pool of pieces and goes back
    /// when the last `Bytes` of it is dropped. A fresh 64 KiB buffer costs a memset or, left
    /// unzeroed, page faults in the copy: either was 5–6 % of tern's CPU on h3-large. A file
    /// shorter than the body says is `UnexpectedEof`.
    pub fn read_piece(&mut self) -> io::Result<Bytes> {
        let n = usize::try_from(self.len).unwrap_or(usize::MAX).min(PIECE);
        if n == 0 {
            return Ok(Bytes::new());
        }
        let mut piece = Piece::take();
        self.file.read_exact_at(&mut piece.buf[..n], self.offset)?;
        piece.len = n;
        self.offset += n as u64;
        self.len -= n as u64;
        Ok(Bytes::from_owner(piece))
    }
}

/// The `(name, value)` fields of a block of `Name: value\r\n` lines (a response's
/// [`Response::headers`], the secure lines), as HTTP/2 and HTTP/3 send them: CR optional, a
/// line without a colon skipped. Lines are found with memchr: this runs for every answer.
pub fn header_fields(block: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let mut start = 0;
    memchr::memchr_iter(b'\n', block)
        .chain(std::iter::once(block.len()))
        .filter_map(move |end| {
            let line = &block[start.min(end)..end];
            start = end + 1;
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = memchr::memchr(b':', line)?;
            let value = &line[colon + 1..];
            Some((&line[..colon], value.strip_prefix(b" ").unwrap_or(value)))
        })
}

/// The most a piece of a file answer holds.
pub const PIECE: usize = 64 * 1024;
/// Pieces a thread keeps for reuse (2 MiB); more are freed.
const POOLED_PIECES: usize = 32;

thread_local! {
    static PIECES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A [`PIECE`]-byte buffer (zeroed once, when first made) holding `len` bytes of a file.
struct Piece {
    buf: Vec<u8>,
    len: usize,
}

impl Piece {
    fn take() -> Piece {
        let buf = PIECES
            .with(|p| p.borrow_mut().pop())
            .unwrap_or_else(|| vec![0; PIECE]);
        Piece { buf, len: 0 }
    }
}

impl AsRef<[u8]> for Piece {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        // (`try_with`: a piece dropped while its thread exits is just freed)
        let _ = PIECES.try_with(|p| {
            let mut pool = p.borrow_mut();
            if pool.len() < POOLED_PIECES {
                pool.push(buf);
            }
        });
    }
}

impl Body {
    pub fn len(&self) -> u64 {
        match self {
            Body::Empty => 0,
            Body::Static(b) => b.len() as u64,
            Body::Owned(b) => b.len() as u64,
            Body::Shared(b) => b.len() as u64,
            Body::File(f) => f.len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of a body held in memory (`None` for a file).
    pub fn as_memory(&self) -> Option<&[u8]> {
        match self {
            Body::Empty => Some(&[]),
            Body::Static(b) => Some(b),
            Body::Owned(b) => Some(b),
            Body::Shared(b) => Some(b),
            Body::File(_) => None,
        }
    }
}

/// What a shared cache made of a request, in nginx's `$upstream_cache_status` words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Answered from an entry (a miss that waited for another's fill, too).
    Hit,
    Miss,
    /// Sent past the cache (credentials, a cookie, an unsafe method).
    Bypass,
    /// A stale entry refreshed from the app.
    Expired,
    /// The app's 304 kept a stale entry.
    Revalidated,
    /// A stale entry served while another request refreshes it.
    Updating,
    /// A stale entry served because the app failed.
    Stale,
}

impl CacheOutcome {
    pub fn word(self) -> &'static str {
        match self {
            CacheOutcome::Hit => "HIT",
            CacheOutcome::Miss => "MISS",
            CacheOutcome::Bypass => "BYPASS",
            CacheOutcome::Expired => "EXPIRED",
            CacheOutcome::Revalidated => "REVALIDATED",
            CacheOutcome::Updating => "UPDATING",
            CacheOutcome::Stale => "STALE",
        }
    }
}

/// A response a handler returns: status, extra header lines, body. Date, Server,
/// Content-Length and Connection are added by the connection when the head is written.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    headers: Vec<u8>,
    pub body: Body,
    /// Close the connection after this response.
    pub close: bool,
    /// What a shared cache made of the request, for the access log.
    pub cache_outcome: Option<CacheOutcome>,
    /// Where its whole body's compressed copies are kept, if anywhere (a cache entry).
    pub copies: Option<Arc<dyn tern_compress::EncodedCopies>>,
}

impl Response {
    pub fn new(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Body::Empty,
            close: false,
            cache_outcome: None,
            copies: None,
        }
    }

    /// A short `text/plain` response, the shape every error answer takes.
    pub fn text(status: u16, body: &'static str) -> Response {
        Response::new(status)
            .with_header("Content-Type", "text/plain; charset=utf-8")
            .with_body(Body::Static(body.as_bytes()))
    }

    pub fn with_body(mut self, body: Body) -> Response {
        self.body = body;
        self
    }

    pub fn with_header(mut self, name: &str, value: &str) -> Response {
        self.push_header(name, value.as_bytes());
        self
    }

    /// Appends `name: value`. A name or value that could split the head (CR, LF, NUL, or a
    /// colon/space in the name) is refused and logged: header injection is never possible,
    /// even from a handler that copies client input into a header.
    pub fn push_header(&mut self, name: &str, value: &[u8]) {
        let bad_name =
            name.is_empty() || name.bytes().any(|b| !(b.is_ascii_graphic() && b != b':'));
        let bad_value = value.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0);
        if bad_name || bad_value {
            tracing::error!(
                header = name,
                "refusing a header that would corrupt the response head"
            );
            return;
        }
        self.headers.reserve(name.len() + value.len() + 4);
        self.headers.extend_from_slice(name.as_bytes());
        self.headers.extend_from_slice(b": ");
        self.headers.extend_from_slice(value);
        self.headers.extend_from_slice(b"\r\n");
    }

    /// Appends a field an HTTP parser has already checked (a token name, a value without
    /// CR, LF or NUL), such as one of an upstream's answer, without checking it again.
    pub(crate) fn push_parsed_header(&mut self, name: &str, value: &[u8]) {
        debug_assert!(!value.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0));
        self.headers.reserve(name.len() + value.len() + 4);
        self.headers.extend_from_slice(name.as_bytes());
        self.headers.extend_from_slice(b": ");
        self.headers.extend_from_slice(value);
        self.headers.extend_from_slice(b"\r\n");
    }

    /// Appends already-serialized header lines (each `Name: value\r\n`), e.g. a block a cache
    /// prepared once. The caller guarantees they are well-formed.
    pub fn push_raw_headers(&mut self, lines: &[u8]) {
        debug_assert!(lines.is_empty() || lines.ends_with(b"\r\n"));
        self.headers.extend_from_slice(lines);
    }

    /// Removes every `name:` line (name compared without regard to case), in place.
    pub fn remove_header(&mut self, name: &str) {
        let name = name.as_bytes();
        let lines = &mut self.headers;
        let (mut read, mut write) = (0, 0);
        while read < lines.len() {
            let end =
                memchr::memmem::find(&lines[read..], b"\r\n").map_or(lines.len(), |i| read + i + 2);
            let line = &lines[read..end];
            let matches = line.len() > name.len()
                && line[name.len()] == b':'
                && line[..name.len()].eq_ignore_ascii_case(name);
            if !matches {
                // Nothing removed yet: the line is where it stays.
                if read != write {
                    lines.copy_within(read..end, write);
                }
                write += end - read;
            }
            read = end;
        }
        lines.truncate(write);
    }

    /// The value of the first `name:` line (name compared without regard to case), trimmed.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        let name = name.as_bytes();
        self.headers.split(|&b| b == b'\n').find_map(|line| {
            let line = line.strip_suffix(b"\r")?;
            let matches = line.len() > name.len()
                && line[name.len()] == b':'
                && line[..name.len()].eq_ignore_ascii_case(name);
            matches.then(|| line[name.len() + 1..].trim_ascii())
        })
    }

    pub fn headers(&self) -> &[u8] {
        &self.headers
    }

    pub fn close(mut self) -> Response {
        self.close = true;
        self
    }
}

/// Statuses that never carry a body or Content-Length (RFC 9110 §6.4.1, §8.6).
pub fn status_has_no_body(status: u16) -> bool {
    (100..200).contains(&status) || status == 204 || status == 304
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_body_reads_in_pieces_from_its_offset_and_a_short_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let content: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let file = Arc::new(File::open(&path).unwrap());
        let mut body = FileBody {
            file: file.clone(),
            offset: 1000,
            len: 150_000,
        };
        let mut read = Vec::new();
        while body.len > 0 {
            let piece = body.read_piece().unwrap();
            assert!(piece.len() <= 64 * 1024 && !piece.is_empty());
            read.extend_from_slice(&piece);
        }
        assert_eq!(read, content[1000..151_000]);
        assert!(body.read_piece().unwrap().is_empty());

        // Pieces dropped go back to the pool and are read into again: the bytes are the new
        // read's, whatever the buffer held before.
        PIECES.with(|p| p.borrow_mut().clear());
        let mut again = FileBody {
            file: file.clone(),
            offset: 0,
            len: 64 * 1024 + 1000,
        };
        let first = again.read_piece().unwrap();
        drop(first);
        assert_eq!(PIECES.with(|p| p.borrow().len()), 1);
        let second = again.read_piece().unwrap();
        assert_eq!(
            PIECES.with(|p| p.borrow().len()),
            0,
            "the pooled buffer was taken"
        );
        assert_eq!(second, content[64 * 1024..64 * 1024 + 1000]);

        let mut past_the_end = FileBody {
            file,
            offset: 190_000,
            len: 20_000,
        };
        let e = past_the_end.read_piece().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn header_fields_split_lines_as_a_split_on_newline_does() {
        // Each line of `block` as the fields a split on '\n' gives.
        fn by_split(block: &[u8]) -> Vec<(&[u8], &[u8])> {
            block
                .split(|&b| b == b'\n')
                .filter_map(|line| {
                    let line = line.strip_suffix(b"\r").unwrap_or(line);
                    let colon = line.iter().position(|&b| b == b':')?;
                    let value = &line[colon + 1..];
                    Some((&line[..colon], value.strip_prefix(b" ").unwrap_or(value)))
                })
                .collect()
        }
        for block in [
            &b""[..],
            b"\n",
            b"A: 1\r\n",
            b"A: 1\r\nB-C: two\r\n",
            b"A: 1\r\nlast: x",
            b"\n\nx\nno colon\r\nY:z\n",
        ] {
            assert_eq!(header_fields(block).collect::<Vec<_>>(), by_split(block));
        }
        assert_eq!(
            header_fields(b"Content-Type: text/html\r\nETag: \"x\"\r\n").collect::<Vec<_>>(),
            [
                (&b"Content-Type"[..], &b"text/html"[..]),
                (&b"ETag"[..], &b"\"x\""[..])
            ]
        );
    }

    #[test]
    fn headers_serialize_in_order() {
        let r = Response::new(200)
            .with_header("A", "1")
            .with_header("B-C", "two");
        assert_eq!(r.headers(), b"A: 1\r\nB-C: two\r\n");
    }

    #[test]
    fn header_injection_is_refused() {
        let r = Response::new(200)
            .with_header("X", "a\r\nSet-Cookie: evil=1")
            .with_header("Bad Name", "v")
            .with_header("Nul", "a\0b")
            .with_header("Ok", "fine");
        assert_eq!(r.headers(), b"Ok: fine\r\n");
    }

    #[test]
    fn remove_header_drops_every_line_of_that_name_only() {
        let mut r = Response::new(200)
            .with_header("Cache-Control", "a")
            .with_header("X-Cache", "b")
            .with_header("cache-control", "c")
            .with_header("Cache-Control-Extra", "d");
        r.remove_header("CACHE-CONTROL");
        assert_eq!(r.headers(), b"X-Cache: b\r\nCache-Control-Extra: d\r\n");
        r.remove_header("nothing");
        r.remove_header("Cache-Control-Extra");
        r.remove_header("X-Cache");
        assert_eq!(r.headers(), b"");
    }

    #[test]
    fn header_lookup_ignores_case_and_spaces() {
        let r = Response::new(200)
            .with_header("Content-Type", "text/html")
            .with_header("X-Type", "no")
            .with_header("ETag", " \"a\" ");
        assert_eq!(r.header("content-type"), Some(&b"text/html"[..]));
        assert_eq!(r.header("ETAG"), Some(&b"\"a\""[..]));
        assert_eq!(r.header("Type"), None);
        assert_eq!(r.header("Vary"), None);
    }

    #[test]
    fn no_body_statuses() {
        assert!(status_has_no_body(304));
        assert!(status_has_no_body(204));
        assert!(status_has_no_body(101));
        assert!(!status_has_no_body(200));
        assert!(!status_has_no_body(404));
    }
}
