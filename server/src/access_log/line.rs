//! One access-log line, in nginx's `combined` format or as one JSON object, appended to a
//! buffer without a general formatter: bytes appended, numbers written by `itoa`, hostile
//! bytes escaped the way each format wants.

use tern_codec::Version;

use super::entry::LogEntry;

/// The line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// nginx's `combined`, then `"$host" $duration_us $upstream_us`, then `cache=OUTCOME` on
    /// cached routes and the request id on sites that give ids.
    Combined,
    /// One JSON object per line.
    Json,
}

/// The fields of one line.
pub(super) struct Line<'a> {
    /// The timestamp, formatted for this line's format (`stamp.rs`).
    pub stamp: &'a [u8],
    /// The client address as text (`ip_cache.rs`).
    pub client: &'a [u8],
    pub entry: &'a LogEntry<'a>,
    pub status: u16,
    pub bytes: u64,
    pub duration_us: u64,
    pub upstream_us: Option<u64>,
}

impl Line<'_> {
    /// `$remote_addr - - [$time_local] "$request" $status $body_bytes_sent "$http_referer"
    /// "$http_user_agent" "$host" $duration_us $upstream_us`, escaped as nginx does.
    pub fn push_combined(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.client);
        out.extend_from_slice(b" - - [");
        out.extend_from_slice(self.stamp);
        out.extend_from_slice(b"] \"");
        let r = self.entry.request;
        match r {
            Some(r) => {
                push_nginx(out, r.method);
                out.push(b' ');
                push_nginx(out, r.target);
                out.push(b' ');
                out.extend_from_slice(protocol(r.version));
            }
            None => out.push(b'-'),
        }
        out.extend_from_slice(b"\" ");
        out.extend_from_slice(itoa::Buffer::new().format(self.status).as_bytes());
        out.push(b' ');
        out.extend_from_slice(itoa::Buffer::new().format(self.bytes).as_bytes());
        for field in [
            r.and_then(|r| r.referer),
            r.and_then(|r| r.user_agent),
            r.and_then(|r| r.host),
        ] {
            out.extend_from_slice(b" \"");
            match field {
                Some(v) => push_nginx(out, v),
                None => out.push(b'-'),
            }
            out.push(b'"');
        }
        out.push(b' ');
        out.extend_from_slice(itoa::Buffer::new().format(self.duration_us).as_bytes());
        out.push(b' ');
        match self.upstream_us {
            Some(us) => out.extend_from_slice(itoa::Buffer::new().format(us).as_bytes()),
            None => out.push(b'-'),
        }
        // Only on cached routes, named so it cannot be taken for a request id; tern's own
        // words, which need no escaping.
        if let Some(cache) = self.entry.cache {
            out.extend_from_slice(b" cache=");
            out.extend_from_slice(cache.word().as_bytes());
        }
        // Only on sites that give ids, so other lines keep their shape. Its characters
        // need no escaping (see `RequestId::parse`).
        if let Some(id) = &self.entry.request_id {
            out.push(b' ');
            out.extend_from_slice(id.as_str().as_bytes());
        }
        out.push(b'\n');
    }

    pub fn push_json(&self, out: &mut Vec<u8>) {
        let r = self.entry.request;
        out.extend_from_slice(b"{\"time\":\"");
        out.extend_from_slice(self.stamp);
        out.extend_from_slice(b"\",\"client\":\"");
        out.extend_from_slice(self.client);
        out.extend_from_slice(b"\",\"method\":");
        push_json_opt(out, r.map(|r| r.method));
        out.extend_from_slice(b",\"target\":");
        push_json_opt(out, r.map(|r| r.target));
        out.extend_from_slice(b",\"protocol\":");
        match r {
            Some(r) => {
                out.push(b'"');
                out.extend_from_slice(protocol(r.version));
                out.push(b'"');
            }
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"status\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.status).as_bytes());
        out.extend_from_slice(b",\"bytes\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.bytes).as_bytes());
        out.extend_from_slice(b",\"duration_us\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.duration_us).as_bytes());
        out.extend_from_slice(b",\"referer\":");
        push_json_opt(out, r.and_then(|r| r.referer));
        out.extend_from_slice(b",\"user_agent\":");
        push_json_opt(out, r.and_then(|r| r.user_agent));
        out.extend_from_slice(b",\"host\":");
        push_json_opt(out, r.and_then(|r| r.host));
        out.extend_from_slice(b",\"upstream_us\":");
        match self.upstream_us {
            Some(us) => out.extend_from_slice(itoa::Buffer::new().format(us).as_bytes()),
            None => out.extend_from_slice(b"null"),
        }
        if let Some(cache) = self.entry.cache {
            out.extend_from_slice(b",\"cache\":\"");
            out.extend_from_slice(cache.word().as_bytes());
            out.push(b'"');
        }
        if let Some(id) = &self.entry.request_id {
            out.extend_from_slice(b",\"request_id\":\"");
            out.extend_from_slice(id.as_str().as_bytes());
            out.push(b'"');
        }
        out.extend_from_slice(b"}\n");
    }
}

fn protocol(v: Version) -> &'static [u8] {
    match v {
        Version::Http10 => b"HTTP/1.0",
        Version::Http11 => b"HTTP/1.1",
        // As nginx writes it (`$server_protocol`), which log analysers expect.
        Version::Http2 => b"HTTP/2.0",
        Version::Http3 => b"HTTP/3.0",
    }
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Printable ASCII that needs no escape in either format.
#[inline]
fn plain(b: u8) -> bool {
    (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\'
}

fn push_hex_byte(out: &mut Vec<u8>, prefix: &[u8], b: u8) {
    out.extend_from_slice(prefix);
    out.push(HEX[usize::from(b >> 4)]);
    out.push(HEX[usize::from(b & 15)]);
}

/// nginx's escaping (`log_format` default): `"`, `\`, control characters and bytes above
/// 0x7e become `\xHH`.
fn push_nginx(out: &mut Vec<u8>, s: &[u8]) {
    if s.iter().all(|&b| plain(b)) {
        out.extend_from_slice(s);
        return;
    }
    for &b in s {
        if plain(b) {
            out.push(b);
        } else {
            push_hex_byte(out, b"\\x", b);
        }
    }
}

/// A JSON string, or `null`. Valid UTF-8 stays as it is; `"` and control characters get
/// JSON escapes; a backslash and each byte that is not UTF-8 become the text `\xHH` (as in
/// the combined format), so the decoded string tells a client's `\xFF` from a 0xFF byte.
fn push_json_opt(out: &mut Vec<u8>, s: Option<&[u8]>) {
    let Some(s) = s else {
        out.extend_from_slice(b"null");
        return;
    };
    out.push(b'"');
    if s.iter().all(|&b| plain(b)) {
        out.extend_from_slice(s);
    } else {
        for chunk in s.utf8_chunks() {
            for &b in chunk.valid().as_bytes() {
                match b {
                    b'"' => out.extend_from_slice(b"\\\""),
                    b'\\' => out.extend_from_slice(b"\\\\x5C"),
                    0..=0x1f | 0x7f => push_hex_byte(out, b"\\u00", b),
                    _ => out.push(b),
                }
            }
            for &b in chunk.invalid() {
                push_hex_byte(out, b"\\\\x", b);
            }
        }
    }
    out.push(b'"');
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::access_log::entry::{LogRequest, SavedEntry};
    use crate::access_log::ip_cache::push_ip;
    use crate::access_log::stamp::Stamp;
    use crate::handler::LogTarget;
    use crate::request_id::RequestId;

    pub(crate) fn request<'a>(target: &'a [u8], ua: Option<&'a [u8]>) -> LogEntry<'a> {
        LogEntry {
            target: LogTarget::DEFAULT,
            client: "192.0.2.7".parse().unwrap(),
            start_us: 0,
            request: Some(LogRequest {
                method: b"GET",
                target,
                version: Version::Http11,
                host: Some(b"example.org"),
                referer: None,
                user_agent: ua,
            }),
            request_id: None,
            cache: None,
        }
    }

    fn line(format: AccessLogFormat, e: &LogEntry<'_>, secs: u64) -> String {
        let mut stamp = Stamp::new(format);
        stamp.refresh(secs);
        let mut client = Vec::new();
        push_ip(&mut client, e.client);
        let l = Line {
            stamp: stamp.text(),
            client: &client,
            entry: e,
            status: 200,
            bytes: 1234,
            duration_us: 56,
            upstream_us: None,
        };
        let mut out = Vec::new();
        match format {
            AccessLogFormat::Combined => l.push_combined(&mut out),
            AccessLogFormat::Json => l.push_json(&mut out),
        }
        String::from_utf8(out).expect("a log line is UTF-8")
    }

    #[test]
    fn combined_line_is_nginx_combined_plus_host_and_times() {
        let e = request(b"/a?b=1", Some(b"curl/8.5"));
        assert_eq!(
            line(AccessLogFormat::Combined, &e, 784_111_777),
            "192.0.2.7 - - [06/Nov/1994:08:49:37 +0000] \"GET /a?b=1 HTTP/1.1\" 200 1234 \"-\" \"curl/8.5\" \"example.org\" 56 -\n"
        );
        let bare = LogEntry::bare("[2001:db8::1]:5".parse().unwrap(), 0);
        assert_eq!(
            line(AccessLogFormat::Combined, &bare, 0),
            "2001:db8::1 - - [01/Jan/1970:00:00:00 +0000] \"-\" 200 1234 \"-\" \"-\" \"-\" 56 -\n"
        );
    }

    #[test]
    fn json_line_has_every_field() {
        let e = request(b"/", None);
        let text = line(AccessLogFormat::Json, &e, 1_795_468_328);
        assert_eq!(
            text,
            "{\"time\":\"2026-11-23T21:12:08Z\",\"client\":\"192.0.2.7\",\"method\":\"GET\",\"target\":\"/\",\"protocol\":\"HTTP/1.1\",\"status\":200,\"bytes\":1234,\"duration_us\":56,\"referer\":null,\"user_agent\":null,\"host\":\"example.org\",\"upstream_us\":null}\n"
        );
        let bare = LogEntry::bare("10.0.0.1:1".parse().unwrap(), 0);
        let text = line(AccessLogFormat::Json, &bare, 0);
        assert!(
            text.contains("\"method\":null,\"target\":null,\"protocol\":null,"),
            "{text}"
        );
    }

    const HOSTILE: &[u8] = b"a\"b\\c\x01\td\x7f\xff\xc3\xa9 \"\n-";

    #[test]
    fn combined_escapes_hostile_bytes_like_nginx() {
        let e = request(b"/x\"y\\z", Some(HOSTILE));
        let text = line(AccessLogFormat::Combined, &e, 0);
        assert!(text.contains("\"GET /x\\x22y\\x5Cz HTTP/1.1\""), "{text}");
        assert!(
            text.contains("\"a\\x22b\\x5Cc\\x01\\x09d\\x7F\\xFF\\xC3\\xA9 \\x22\\x0A-\""),
            "{text}"
        );
        // One line, and every quote that is left delimits a field.
        assert_eq!(text.matches('\n').count(), 1);
        assert_eq!(text.matches('"').count(), 8, "{text}");
    }

    #[test]
    fn json_escapes_hostile_bytes_into_valid_json() {
        let e = request(b"/x\"y\\z", Some(HOSTILE));
        let text = line(AccessLogFormat::Json, &e, 0);
        assert_eq!(text.matches('\n').count(), 1);
        assert!(text.contains("\"target\":\"/x\\\"y\\\\x5Cz\""), "{text}");
        assert!(
            text.contains(
                "\"user_agent\":\"a\\\"b\\\\x5Cc\\u0001\\u0009d\\u007F\\\\xFF\u{e9} \\\"\\u000A-\""
            ),
            "{text}"
        );
        // A strict parser (with the value decoded) agrees.
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).expect("valid JSON");
        assert_eq!(v["user_agent"], "a\"b\\x5Cc\u{1}\td\u{7f}\\xFF\u{e9} \"\n-");
        assert_eq!(v["target"], "/x\"y\\x5Cz");
        assert_eq!(v["upstream_us"], serde_json::Value::Null);
        assert_eq!(v["duration_us"], 56);
    }

    #[test]
    fn saved_entries_give_back_what_they_saved() {
        let e = request(b"/t?q", Some(b"ua"));
        let saved = SavedEntry::save(&e).unwrap();
        let back = saved.entry();
        assert_eq!(
            line(AccessLogFormat::Json, &back, 5),
            line(AccessLogFormat::Json, &e, 5)
        );
        assert!(SavedEntry::save(&LogEntry::bare("1.2.3.4:5".parse().unwrap(), 0)).is_none());
    }

    #[test]
    fn a_cached_routes_line_says_what_the_cache_did_before_the_request_id() {
        let mut e = request(b"/", None);
        e.cache = Some(crate::response::CacheOutcome::Hit);
        let combined = line(AccessLogFormat::Combined, &e, 0);
        assert!(
            combined.ends_with("\"example.org\" 56 - cache=HIT\n"),
            "{combined}"
        );
        e.request_id = RequestId::parse(b"abc-1");
        let combined = line(AccessLogFormat::Combined, &e, 0);
        assert!(combined.ends_with(" 56 - cache=HIT abc-1\n"), "{combined}");
        let json = line(AccessLogFormat::Json, &e, 0);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (v["cache"].as_str(), v["request_id"].as_str()),
            (Some("HIT"), Some("abc-1"))
        );
        // Saved while a reply is pending, and given back.
        let mut saved = SavedEntry::save(&request(b"/", None)).unwrap();
        saved.cache = Some(crate::response::CacheOutcome::Stale);
        assert_eq!(
            saved.entry().cache,
            Some(crate::response::CacheOutcome::Stale)
        );
    }

    #[test]
    fn a_request_id_ends_the_line_when_there_is_one() {
        let mut e = request(b"/", None);
        e.request_id = RequestId::parse(b"abc-1");
        let combined = line(AccessLogFormat::Combined, &e, 0);
        assert!(
            combined.ends_with("\"example.org\" 56 - abc-1\n"),
            "{combined}"
        );
        let json = line(AccessLogFormat::Json, &e, 0);
        assert!(
            json.ends_with(",\"upstream_us\":null,\"request_id\":\"abc-1\"}\n"),
            "{json}"
        );
        let back = SavedEntry::save(&e).unwrap();
        assert_eq!(line(AccessLogFormat::Json, &back.entry(), 0), json);
    }
}
