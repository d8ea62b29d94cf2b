//! A request's fields as HPACK decodes them, checked against RFC 9113 §8 as they arrive, and
//! turned into the same [`RequestHead`] an HTTP/1.1 request gives handlers. tern-http3 uses
//! them too: RFC 9114 §4.2-4.3 are these rules, word for word.

use std::ops::Range;

use tern_codec::{head_from_fields, Limits, RequestError, RequestHead};

/// Why a header block cannot be a request (each is a stream error of type PROTOCOL_ERROR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    BadName,
    BadValue,
    UnknownPseudo,
    PseudoAfterRegular,
    DuplicatePseudo,
    PseudoInTrailers,
    ConnectionSpecific,
    BadTe,
    MissingPseudo,
    EmptyPath,
    BadPath,
    BadContentLength,
    ContentLengthMismatch,
    BadMethod,
    BadScheme,
    ProtocolNotEnabled,
    ProtocolWithoutConnect,
    BadProtocol,
}

impl Malformed {
    pub fn reason(self) -> &'static str {
        match self {
            Malformed::BadName => "field name not lowercase or not a token",
            Malformed::BadValue => "field value with a control byte or surrounding whitespace",
            Malformed::UnknownPseudo => "unknown or response pseudo-header",
            Malformed::PseudoAfterRegular => "pseudo-header after a regular field",
            Malformed::DuplicatePseudo => "pseudo-header repeated",
            Malformed::PseudoInTrailers => "pseudo-header in trailers",
            Malformed::ConnectionSpecific => "connection-specific field",
            Malformed::BadTe => "te other than trailers",
            Malformed::MissingPseudo => "required pseudo-header missing",
            Malformed::EmptyPath => "empty :path",
            Malformed::BadPath => ":path neither origin-form nor * (OPTIONS)",
            Malformed::BadContentLength => "bad content-length",
            Malformed::ContentLengthMismatch => "content-length disagrees with DATA",
            Malformed::BadMethod => ":method not a token",
            Malformed::BadScheme => ":scheme not a URI scheme",
            Malformed::ProtocolNotEnabled => ":protocol without SETTINGS_ENABLE_CONNECT_PROTOCOL",
            Malformed::ProtocolWithoutConnect => ":protocol on a method other than CONNECT",
            Malformed::BadProtocol => ":protocol not a token",
        }
    }
}

/// The decoded fields of one request, in one arena (reused between requests).
#[derive(Default)]
pub struct Fields {
    arena: Vec<u8>,
    /// Regular fields: name range, value range.
    regular: Vec<(Range<u32>, Range<u32>)>,
    method: Option<Range<u32>>,
    scheme: Option<Range<u32>>,
    path: Option<Range<u32>>,
    authority: Option<Range<u32>>,
    /// RFC 8441's `:protocol` (extended CONNECT).
    protocol: Option<Range<u32>>,
    pub(crate) content_length: Option<u64>,
    cookies: u32,
    /// Set once a field broke a rule; later fields are not stored.
    pub(crate) malformed: Option<Malformed>,
    /// More fields than the limit (answered 431).
    pub(crate) too_many: bool,
}

impl Fields {
    /// Empties the fields for the next request (buffers kept).
    pub fn clear(&mut self) {
        self.arena.clear();
        self.regular.clear();
        self.method = None;
        self.scheme = None;
        self.path = None;
        self.authority = None;
        self.protocol = None;
        self.content_length = None;
        self.cookies = 0;
        self.malformed = None;
        self.too_many = false;
    }

    fn store(&mut self, bytes: &[u8]) -> Range<u32> {
        let start = self.arena.len() as u32;
        self.arena.extend_from_slice(bytes);
        start..self.arena.len() as u32
    }

    /// Takes one decoded field of a request head. Err: stop storing (the block is malformed).
    // `Err(())` is the decoders' "stop handing me fields" (HPACK's and QPACK's callbacks);
    // why is kept in the fields and reported by `finish`.
    #[allow(clippy::result_unit_err)]
    pub fn push(&mut self, name: &[u8], value: &[u8], max_fields: usize) -> Result<(), ()> {
        if let Err(m) = self.check(name, value, max_fields) {
            self.malformed = Some(m);
            return Err(());
        }
        Ok(())
    }

    fn check(&mut self, name: &[u8], value: &[u8], max_fields: usize) -> Result<(), Malformed> {
        check_value(value)?;
        if let Some(pseudo) = name.strip_prefix(b":") {
            if !self.regular.is_empty() {
                return Err(Malformed::PseudoAfterRegular);
            }
            let slot = match pseudo {
                b"method" => &mut self.method,
                b"scheme" => &mut self.scheme,
                b"path" => &mut self.path,
                b"authority" => &mut self.authority,
                b"protocol" => &mut self.protocol,
                _ => return Err(Malformed::UnknownPseudo),
            };
            if slot.is_some() {
                return Err(Malformed::DuplicatePseudo);
            }
            let start = self.arena.len() as u32;
            self.arena.extend_from_slice(value);
            *slot = Some(start..self.arena.len() as u32);
            return Ok(());
        }
        check_regular_name(name)?;
        match name {
            b"te" if value != b"trailers" => return Err(Malformed::BadTe),
            b"content-length" => {
                let n = parse_length(value).ok_or(Malformed::BadContentLength)?;
                if self.content_length.is_some_and(|prev| prev != n) {
                    return Err(Malformed::BadContentLength);
                }
                self.content_length = Some(n);
            }
            b"cookie" => self.cookies += 1,
            _ => {}
        }
        if self.regular.len() >= max_fields {
            self.too_many = true;
            return Ok(());
        }
        let n = self.store(name);
        let v = self.store(value);
        self.regular.push((n, v));
        Ok(())
    }

    /// A request whose target is a URI (every method but plain CONNECT, and an extended
    /// CONNECT too) needs a `:scheme` and a `:path` in origin form, or `*` for OPTIONS
    /// (RFC 9113 §8.3.1, RFC 9114 §4.3.1). Anything else (an absolute URI) would name an
    /// authority of its own beside `:authority`, the one routing looks at.
    fn require_path_and_scheme(&self, method: &[u8]) -> Result<(), Malformed> {
        match &self.path {
            None => return Err(Malformed::MissingPseudo),
            Some(p) if p.is_empty() => return Err(Malformed::EmptyPath),
            Some(p) => {
                let path = self.get(p);
                let asterisk = path == b"*" && method == b"OPTIONS";
                if !path.starts_with(b"/") && !asterisk {
                    return Err(Malformed::BadPath);
                }
            }
        }
        if self.scheme.is_none() {
            return Err(Malformed::MissingPseudo);
        }
        Ok(())
    }

    /// The block is complete: are the required pseudo-headers there (RFC 9113 §8.3.1, and
    /// RFC 8441 §4 for a `:protocol`, which only counts when `extended_connect` was
    /// advertised)?
    pub fn finish(&mut self, extended_connect: bool) -> Result<(), Malformed> {
        if let Some(m) = self.malformed {
            return Err(m);
        }
        let Some(method) = &self.method else {
            return Err(Malformed::MissingPseudo);
        };
        // The method becomes the request line a proxied request is sent with: a space, a tab
        // or a URI in it would let the upstream read another request than the one routed.
        let method = self.get(method);
        if method.is_empty() || !method.iter().all(|&b| METHOD_BYTE[b as usize]) {
            return Err(Malformed::BadMethod);
        }
        if let Some(scheme) = &self.scheme {
            if !valid_scheme(self.get(scheme)) {
                return Err(Malformed::BadScheme);
            }
        }
        if let Some(protocol) = &self.protocol {
            // Extended CONNECT (RFC 8441 §4): the target is a URI like a GET's, so :scheme
            // and :path are required; :authority is as for any request.
            if !extended_connect {
                return Err(Malformed::ProtocolNotEnabled);
            }
            if method != b"CONNECT" {
                return Err(Malformed::ProtocolWithoutConnect);
            }
            let protocol = self.get(protocol);
            let tchar = |&b: &u8| NAME_BYTE[b as usize] || METHOD_BYTE[b as usize];
            if protocol.is_empty() || !protocol.iter().all(tchar) {
                return Err(Malformed::BadProtocol);
            }
            self.require_path_and_scheme(method)?;
        } else if method == b"CONNECT" {
            // CONNECT names only an authority (§8.5); tern routes it (and refuses it) like
            // any other method.
            if self.authority.is_none() || self.scheme.is_some() || self.path.is_some() {
                return Err(Malformed::MissingPseudo);
            }
        } else {
            self.require_path_and_scheme(method)?;
        }
        if self.cookies > 1 {
            self.join_cookies();
        }
        Ok(())
    }

    /// HTTP/2 may split Cookie into one field per crumb (§8.2.3); handlers expect one field,
    /// so they are joined with "; " as an HTTP/1.1 request would carry them.
    fn join_cookies(&mut self) {
        let mut joined = Vec::new();
        self.regular.retain(|(n, v)| {
            if &self.arena[n.start as usize..n.end as usize] != b"cookie" {
                return true;
            }
            if !joined.is_empty() {
                joined.extend_from_slice(b"; ");
            }
            joined.extend_from_slice(&self.arena[v.start as usize..v.end as usize]);
            false
        });
        let n = self.store(b"cookie");
        let v = self.store(&joined);
        self.regular.push((n, v));
    }

    fn get(&self, r: &Range<u32>) -> &[u8] {
        &self.arena[r.start as usize..r.end as usize]
    }

    /// The regular fields, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.regular.iter().map(|(n, v)| (self.get(n), self.get(v)))
    }

    pub fn field_count(&self) -> usize {
        self.regular.len()
    }

    /// The request's declared `content-length`, if any.
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }

    /// More fields arrived than `push` was allowed to keep (answered 431).
    pub fn too_many(&self) -> bool {
        self.too_many
    }

    /// `:scheme`, if the request carried one.
    pub fn scheme(&self) -> Option<&[u8]> {
        self.scheme.as_ref().map(|r| self.get(r))
    }

    /// `:authority`, if the request carried one.
    pub fn authority(&self) -> Option<&[u8]> {
        self.authority.as_ref().map(|r| self.get(r))
    }

    /// An extended CONNECT's `:protocol` (RFC 8441), e.g. `websocket`.
    pub fn protocol(&self) -> Option<&[u8]> {
        self.protocol.as_ref().map(|r| self.get(r))
    }
}

/// Checks a trailer field (no pseudo-headers; the values are not kept).
pub fn check_trailer(name: &[u8], value: &[u8]) -> Result<(), Malformed> {
    if name.starts_with(b":") {
        return Err(Malformed::PseudoInTrailers);
    }
    check_value(value)?;
    check_regular_name(name)
}

/// Bytes allowed in a field name: lowercase tchar (RFC 9113 §8.2.1, RFC 9110 §5.6.2).
const NAME_BYTE: [bool; 256] = tchar_table(false);

/// Bytes allowed in a method: tchar without lower-case letters (RFC 9110 §9.1; lower case is
/// refused as in HTTP/1.1, see `tern_codec`'s request parser: apps upper-case methods).
const METHOD_BYTE: [bool; 256] = tchar_table(true);

/// tchar with lower-case letters only (`upper == false`) or upper-case letters only.
const fn tchar_table(upper: bool) -> [bool; 256] {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        t[b] = (if upper {
            c.is_ascii_uppercase()
        } else {
            c.is_ascii_lowercase()
        }) || c.is_ascii_digit()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    t
}

/// `scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )` (RFC 3986 §3.1).
fn valid_scheme(s: &[u8]) -> bool {
    s.first().is_some_and(u8::is_ascii_alphabetic)
        && s.iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
}

fn check_regular_name(name: &[u8]) -> Result<(), Malformed> {
    if name.is_empty() || !name.iter().all(|&b| NAME_BYTE[b as usize]) {
        return Err(Malformed::BadName);
    }
    // §8.2.2: fields that only mean something to one HTTP/1.1 connection.
    match name {
        b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding" | b"upgrade" => {
            Err(Malformed::ConnectionSpecific)
        }
        _ => Ok(()),
    }
}

/// RFC 9113 §8.2.1 forbids NUL, CR, LF and surrounding whitespace; tern also refuses every
/// other control byte but HTAB, as RFC 9110 §5.5 and its HTTP/1.1 parser do, so a field
/// forwarded to an HTTP/1.1 upstream is one its parser accepts too.
fn check_value(value: &[u8]) -> Result<(), Malformed> {
    let bad_edge = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    // A fold without early exit, so the compiler checks 16 or 32 bytes per instruction (a
    // short-circuiting `any` goes byte by byte: 5 % of an HTTP/2 request's instructions).
    let control = value.iter().fold(false, |bad, &b| {
        bad | ((b < 0x20) & (b != b'\t')) | (b == 0x7f)
    });
    if bad_edge(value.first()) || bad_edge(value.last()) || control {
        return Err(Malformed::BadValue);
    }
    Ok(())
}

fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        v.iter()
            .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0')),
    )
}

/// A complete request taken from its stream: fields and body. Give it back with
/// `Session::recycle` so its buffers are reused.
#[derive(Default)]
pub struct RequestData {
    pub stream: u32,
    pub fields: Fields,
    pub body: Vec<u8>,
}

/// Most header fields a request may carry (the HTTP/1.1 default too).
pub const MAX_FIELDS: usize = tern_codec::MAX_HEADERS_DEFAULT;

impl RequestData {
    /// The request as handlers see it. `headers` is the caller's scratch array for the field
    /// list (on its stack: no allocation per request); it must hold
    /// [`Fields::field_count`] entries.
    pub fn head<'a>(
        &'a self,
        headers: &'a mut [httparse::Header<'a>],
        limits: &Limits,
    ) -> Result<RequestHead<'a>, RequestError> {
        let f = &self.fields;
        let text = |r: &Option<Range<u32>>| -> Result<&'a str, RequestError> {
            let bytes = r.as_ref().map_or(&b""[..], |r| f.get(r));
            std::str::from_utf8(bytes).map_err(|_| RequestError::BadRequestLine)
        };
        let protocol = match &f.protocol {
            Some(_) => Some(text(&f.protocol)?),
            None => None,
        };
        // An extended CONNECT is the GET its HTTP/1.1 handshake would be (RFC 8441 §5: the
        // same resource, `:protocol` in place of Upgrade): routes, guards, logs and the
        // request a proxy sends all see that one request, with `protocol` saying a tunnel
        // was asked for.
        let method = match protocol {
            Some(_) => "GET",
            None => text(&f.method)?,
        };
        // CONNECT's target is its authority (authority-form).
        let target = match &f.path {
            Some(_) => text(&f.path)?,
            None => text(&f.authority)?,
        };
        let authority = f.authority.as_ref().map(|r| f.get(r));
        let mut n = 0;
        if headers.len() < f.regular.len() {
            return Err(RequestError::TooManyHeaders);
        }
        for (name, value) in &f.regular {
            // Names were checked to be lowercase ASCII tokens.
            let name = std::str::from_utf8(f.get(name)).map_err(|_| RequestError::BadHeader)?;
            headers[n] = httparse::Header {
                name,
                value: f.get(value),
            };
            n += 1;
        }
        let mut head = head_from_fields(method, target, authority, &headers[..n], limits)?;
        head.protocol = protocol;
        Ok(head)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(list: &[(&str, &str)]) -> Result<Fields, Malformed> {
        let mut f = Fields::default();
        for (n, v) in list {
            if f.push(n.as_bytes(), v.as_bytes(), MAX_FIELDS).is_err() {
                return Err(f.malformed.unwrap());
            }
        }
        f.finish(false)?;
        Ok(f)
    }

    const BASE: [(&str, &str); 4] = [
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/a?b=1"),
        (":authority", "example.org"),
    ];

    #[test]
    fn a_request_becomes_a_head() {
        let mut list = BASE.to_vec();
        list.push(("accept-encoding", "gzip"));
        list.push(("cookie", "a=1"));
        list.push(("cookie", "b=2"));
        let data = RequestData {
            stream: 1,
            fields: fields(&list).unwrap(),
            body: Vec::new(),
        };
        let mut hs = [httparse::EMPTY_HEADER; MAX_FIELDS];
        let head = data.head(&mut hs, &Limits::default()).unwrap();
        assert_eq!(head.method, tern_codec::Method::Get);
        assert_eq!(head.path, "/a");
        assert_eq!(head.query, Some("b=1"));
        assert_eq!(head.host, Some(&b"example.org"[..]));
        assert_eq!(head.accept_encoding, Some(&b"gzip"[..]));
        assert_eq!(head.header("cookie"), Some(&b"a=1; b=2"[..]));
        assert_eq!(head.version, tern_codec::Version::Http2);
    }

    #[test]
    fn rules_of_section_8() {
        let with = |extra: (&str, &str)| {
            let mut l = BASE.to_vec();
            l.push(extra);
            fields(&l).err()
        };
        assert_eq!(with(("Accept", "x")), Some(Malformed::BadName));
        assert_eq!(
            with(("connection", "close")),
            Some(Malformed::ConnectionSpecific)
        );
        assert_eq!(with(("te", "gzip")), Some(Malformed::BadTe));
        assert_eq!(with(("te", "trailers")), None);
        assert_eq!(with(("x", " padded")), Some(Malformed::BadValue));
        assert_eq!(with(("x", "a\nb")), Some(Malformed::BadValue));
        assert_eq!(with((":path", "/again")), Some(Malformed::DuplicatePseudo));
        let mut l = BASE[..3].to_vec();
        l.push(("x", "y"));
        l.push((":authority", "h"));
        assert_eq!(fields(&l).err(), Some(Malformed::PseudoAfterRegular));
        assert_eq!(
            with(("content-length", "1x")),
            Some(Malformed::BadContentLength)
        );
        let mut l = vec![(":status", "200")];
        l.extend(BASE);
        assert_eq!(fields(&l).err(), Some(Malformed::UnknownPseudo));
        let mut l = BASE.to_vec();
        l.insert(1, (":method", "GET"));
        assert_eq!(fields(&l).err(), Some(Malformed::DuplicatePseudo));
        assert_eq!(
            fields(&BASE[..2]).err(),
            Some(Malformed::MissingPseudo),
            "no :path"
        );
        let l = [(":method", "GET"), (":scheme", "https"), (":path", "")];
        assert_eq!(fields(&l).err(), Some(Malformed::EmptyPath));
        assert_eq!(
            check_trailer(b":path", b"/"),
            Err(Malformed::PseudoInTrailers)
        );
    }

    /// What an HTTP/1.1 upstream would read as another request line or field must never get
    /// that far (the seams review: `:method` with spaces, control bytes in values).
    #[test]
    fn downgrade_hazards_are_malformed() {
        let with_method = |m: &str| {
            let mut l = BASE.to_vec();
            l[0] = (":method", m);
            fields(&l).err()
        };
        for m in [
            "GET /admin HTTP/1.1",
            "GET /admin?",
            "G\tET",
            "",
            "http://x/",
        ] {
            assert_eq!(with_method(m), Some(Malformed::BadMethod), "{m:?}");
        }
        assert_eq!(with_method("PROPFIND"), None);
        assert_eq!(with_method("X-CUSTOM"), None);
        for m in ["post", "Post", "get", "x-custom"] {
            assert_eq!(with_method(m), Some(Malformed::BadMethod), "{m:?}");
        }
        let with = |extra: (&str, &str)| {
            let mut l = BASE.to_vec();
            l.push(extra);
            fields(&l).err()
        };
        for v in [
            "a\x01b", "a\x08", "a\x0bb", "a\x0cb", "a\x1fb", "a\x7fb", "a\rb", "a\0b",
        ] {
            assert_eq!(with(("x", v)), Some(Malformed::BadValue), "{v:?}");
        }
        assert_eq!(
            with(("x", "a\tb c")),
            None,
            "HTAB and SP inside a value are fine"
        );
        let mut l = BASE.to_vec();
        l[1] = (":scheme", "ht tp");
        assert_eq!(fields(&l).err(), Some(Malformed::BadScheme));
    }

    /// `:path` is origin-form, or `*` on OPTIONS; an absolute URI would otherwise be served
    /// as its path on the site `:authority` names (RFC 9113 §8.3.1, RFC 9114 §4.3.1).
    #[test]
    fn path_must_be_origin_form_or_an_options_asterisk() {
        let with = |method: &str, path: &str| {
            let mut l = BASE.to_vec();
            l[0] = (":method", method);
            l[2] = (":path", path);
            fields(&l).err()
        };
        for path in [
            "http://other.test/",
            "https://example.org/a",
            "other.test/",
            "a",
            "?q",
            "#f",
            "*/",
            "**",
        ] {
            assert_eq!(with("GET", path), Some(Malformed::BadPath), "{path:?}");
        }
        assert_eq!(
            with("GET", "*"),
            Some(Malformed::BadPath),
            "* is OPTIONS' only"
        );
        assert_eq!(with("POST", "*"), Some(Malformed::BadPath));
        assert_eq!(with("OPTIONS", "*"), None);
        assert_eq!(
            with("OPTIONS", "http://other.test/"),
            Some(Malformed::BadPath)
        );
        for path in ["/", "/a?b=1", "//other.test/", "/*"] {
            assert_eq!(with("GET", path), None, "{path:?}");
        }
        // Extended CONNECT has a :path (RFC 8441 §4), held to the same rule; plain CONNECT
        // has none.
        let connect = |path: &str| {
            let mut f = Fields::default();
            let l = [
                (":method", "CONNECT"),
                (":protocol", "websocket"),
                (":scheme", "https"),
                (":path", path),
                (":authority", "example.org"),
            ];
            for (n, v) in l {
                f.push(n.as_bytes(), v.as_bytes(), MAX_FIELDS).unwrap();
            }
            f.finish(true).err()
        };
        assert_eq!(connect("/chat"), None);
        assert_eq!(connect("http://other.test/chat"), Some(Malformed::BadPath));
        assert_eq!(connect("*"), Some(Malformed::BadPath));
        let l = [(":method", "CONNECT"), (":authority", "example.org:443")];
        assert_eq!(fields(&l).err(), None);
    }

    #[test]
    fn host_must_agree_with_authority() {
        let head_with_host = |host: &str| {
            let mut list = BASE.to_vec();
            list.push(("host", host));
            let data = RequestData {
                stream: 1,
                fields: fields(&list).unwrap(),
                body: Vec::new(),
            };
            let mut hs = [httparse::EMPTY_HEADER; MAX_FIELDS];
            data.head(&mut hs, &Limits::default())
                .map(|h| h.host.map(<[u8]>::to_vec))
        };
        assert_eq!(
            head_with_host("admin.internal"),
            Err(RequestError::BadHeader)
        );
        assert_eq!(
            head_with_host("EXAMPLE.org"),
            Ok(Some(b"example.org".to_vec())),
            "the same name in another case is the same authority"
        );
    }

    #[test]
    fn field_count_is_capped() {
        let mut f = Fields::default();
        for (n, v) in BASE {
            f.push(n.as_bytes(), v.as_bytes(), 2).unwrap();
        }
        for _ in 0..3 {
            f.push(b"x", b"y", 2).unwrap();
        }
        assert!(f.too_many);
        assert_eq!(f.field_count(), 2);
    }
}
