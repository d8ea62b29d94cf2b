//! WebSocket over HTTP/2 (RFC 8441 extended CONNECT) through `tern run`'s reverse proxy to an
//! HTTP/1.1 WebSocket upstream: the `h2` crate as the browser's side, a small RFC 6455 server
//! (handshake, echo of frames) as the app. Messages both ways, a message larger than the
//! flow-control windows, closes from each side, RST_STREAM, an upstream that refuses, a
//! wrong accept value, the gate refusing, other routes refusing, and SETTINGS without
//! ENABLE_CONNECT_PROTOCOL when no route can relay a WebSocket or `http2_websocket = false`
//! (then a `:protocol` request is a stream error and WebSockets take HTTP/1.1).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::{h2_support, support};
use base64::Engine;
use bytes::Bytes;
use h2::{RecvStream, SendStream};
use h2_support::{
    within, H2Conn, RawH2, ACK, GOAWAY, H2_TIMEOUT, HEADERS, PROTOCOL_ERROR, RST_STREAM, SETTINGS,
};
use support::*;

/// What the upstream saw: each handshake's head, and each connection's end.
#[derive(Default)]
struct Seen {
    heads: Vec<String>,
}

/// What happened on an upstream connection after its handshake.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The upstream read the connection's end (tern shut its write side or closed it), and
    /// tried a last word ("bye", which reaches a client only through a half-close).
    Eof,
    /// A write failed: the connection was gone.
    Closed,
    /// The upstream closed it after a Close frame exchange.
    CloseFrame,
}

struct WsUpstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Seen>>,
    ends: tokio::sync::mpsc::UnboundedReceiver<End>,
}

fn accept_for(key: &str) -> String {
    let mut input = key.as_bytes().to_vec();
    input.extend_from_slice(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &input);
    base64::engine::general_purpose::STANDARD.encode(d.as_ref())
}

fn field<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// One RFC 6455 frame: (FIN+opcode byte, payload), unmasked.
fn read_frame(s: &mut impl Read) -> Option<(u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    s.read_exact(&mut h).ok()?;
    let mut len = u64::from(h[1] & 0x7f);
    if len == 126 {
        let mut b = [0u8; 2];
        s.read_exact(&mut b).ok()?;
        len = u64::from(u16::from_be_bytes(b));
    } else if len == 127 {
        let mut b = [0u8; 8];
        s.read_exact(&mut b).ok()?;
        len = u64::from_be_bytes(b);
    }
    let mut mask = [0u8; 4];
    let masked = h[1] & 0x80 != 0;
    if masked {
        s.read_exact(&mut mask).ok()?;
    }
    let mut payload = vec![0u8; len as usize];
    s.read_exact(&mut payload).ok()?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Some((h[0], payload))
}

/// A frame; masked as a client must send it (RFC 6455 §5.3), or not, as a server does.
fn frame(first: u8, payload: &[u8], mask: Option<[u8; 4]>) -> Vec<u8> {
    let mut v = vec![first];
    let bit = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => v.push(bit | n as u8),
        n if n < 65536 => {
            v.push(bit | 126);
            v.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            v.push(bit | 127);
            v.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(m) => {
            v.extend_from_slice(&m);
            v.extend(payload.iter().enumerate().map(|(i, b)| b ^ m[i % 4]));
        }
        None => v.extend_from_slice(payload),
    }
    v
}

const TEXT: u8 = 0x81;
const BINARY: u8 = 0x82;
const CLOSE: u8 = 0x88;

impl WsUpstream {
    fn start() -> WsUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, ends) = tokio::sync::mpsc::unbounded_channel();
        let seen2 = seen.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { return };
                let seen = seen2.clone();
                let tx = tx.clone();
                std::thread::spawn(move || serve(s, &seen, &tx));
            }
        });
        WsUpstream { addr, seen, ends }
    }

    fn heads(&self) -> Vec<String> {
        self.seen.lock().unwrap().heads.clone()
    }

    /// How the next upstream connection ended (awaited: the client's frames go out meanwhile).
    async fn next_end(&mut self) -> End {
        within(H2_TIMEOUT, "an upstream connection's end", self.ends.recv())
            .await
            .expect("the upstream thread lives")
    }
}

fn serve(mut s: TcpStream, seen: &Mutex<Seen>, ends: &tokio::sync::mpsc::UnboundedSender<End>) {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).unwrap_or(0) == 0 {
            return;
        }
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    seen.lock().unwrap().heads.push(head.clone());
    let path = head.split(' ').nth(1).unwrap_or("").to_string();
    if path.starts_with("/refuse") {
        let _ = s.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 7\r\n\r\nno way\n");
        return;
    }
    if path.starts_with("/plain") {
        // Took the handshake for a GET.
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        return;
    }
    let key = field(&head, "sec-websocket-key").unwrap_or("");
    let accept = if path.starts_with("/wrong-accept") {
        accept_for("dGhlIHNhbXBsZSBub25jZQ==")
    } else {
        accept_for(key)
    };
    let mut answer = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\n"
    );
    if let Some(p) = field(&head, "sec-websocket-protocol") {
        let first = p.split(',').next().unwrap().trim();
        answer.push_str(&format!("Sec-WebSocket-Protocol: {first}\r\n"));
    }
    answer.push_str("\r\n");
    s.write_all(answer.as_bytes()).unwrap();
    if path.starts_with("/server-closes") {
        let _ = s.write_all(&frame(CLOSE, &1000u16.to_be_bytes(), None));
        let _ = ends.send(End::CloseFrame);
        return;
    }
    // Echo every frame; a Close is answered and ends the connection.
    loop {
        match read_frame(&mut s) {
            Some((CLOSE, payload)) => {
                let _ = s.write_all(&frame(CLOSE, &payload, None));
                let _ = ends.send(End::CloseFrame);
                return;
            }
            Some((first, payload)) => {
                if s.write_all(&frame(first, &payload, None)).is_err() {
                    let _ = ends.send(End::Closed);
                    return;
                }
            }
            None => {
                let _ = s.write_all(&frame(TEXT, b"bye", None));
                let _ = ends.send(End::Eof);
                return;
            }
        }
    }
}

/// The client side of one tunnel.
struct Tunnel {
    send: SendStream<Bytes>,
    recv: RecvStream,
    buf: Vec<u8>,
}

impl Tunnel {
    fn send(&mut self, first: u8, payload: &[u8]) {
        self.send
            .send_data(
                Bytes::from(frame(first, payload, Some([1, 2, 3, 4]))),
                false,
            )
            .unwrap();
    }

    /// The next frame from the upstream; None at the stream's end.
    async fn next(&mut self) -> Option<(u8, Vec<u8>)> {
        loop {
            let mut cursor = std::io::Cursor::new(&self.buf[..]);
            if let Some(f) = read_frame(&mut cursor) {
                let used = cursor.position() as usize;
                self.buf.drain(..used);
                return Some(f);
            }
            let chunk = within(H2_TIMEOUT, "tunnel DATA", self.recv.data()).await?;
            let chunk = chunk.expect("DATA");
            let _ = self.recv.flow_control().release_capacity(chunk.len());
            self.buf.extend_from_slice(&chunk);
        }
    }
}

/// Opens a WebSocket on `path` (with `extra` fields); the response and, when it is 200, the
/// tunnel.
async fn open(
    h2: &mut H2Conn,
    path: &str,
    extra: &[(&str, &str)],
) -> (http::response::Parts, Option<Tunnel>, Vec<u8>) {
    let mut req = h2.request("CONNECT", path, extra);
    req.headers_mut()
        .insert("sec-websocket-version", "13".parse().unwrap());
    req.extensions_mut()
        .insert(h2::ext::Protocol::from_static("websocket"));
    let mut sender = h2.send.clone().ready().await.unwrap();
    let (resp, send) = sender.send_request(req, false).unwrap();
    let resp = within(H2_TIMEOUT, "the CONNECT's answer", resp)
        .await
        .unwrap();
    let (parts, mut recv) = resp.into_parts();
    if parts.status == 200 {
        return (
            parts,
            Some(Tunnel {
                send,
                recv,
                buf: Vec::new(),
            }),
            Vec::new(),
        );
    }
    let mut body = Vec::new();
    while let Some(chunk) = within(H2_TIMEOUT, "refusal body", recv.data()).await {
        body.extend_from_slice(&chunk.unwrap());
    }
    (parts, None, body)
}

/// An HTTP/2 connection on which the server's SETTINGS have surely arrived (they come before
/// any answer).
async fn connect(tern: &Tern) -> H2Conn {
    let mut h2 = H2Conn::h2c(tern.addr()).await;
    h2.get("/statusz", &[]).await;
    h2
}

fn start(dir: &Path, config: &str) -> Tern {
    let path = dir.join("tern.toml");
    std::fs::write(&path, config).unwrap();
    let tern = Tern::start_run(&path);
    assert!(tern.line.starts_with("tern: running "), "{}", tern.line);
    tern
}

const OPENED_HTTP1: &str = "websocket_tunnels_opened{protocol=\"http1\"}";
const OPENED_HTTP2: &str = "websocket_tunnels_opened{protocol=\"http2\"}";
/// RFC 8441's SETTINGS parameter.
const ENABLE_CONNECT_PROTOCOL: u16 = 0x8;

const POLICY: &str =
    "[[rule]]\nname = \"private\"\naction = \"deny\"\npath_prefix = \"/private\"\n";

#[tokio::test(flavor = "current_thread")]
async fn websockets_over_http2_reach_an_http1_upstream_and_back() {
    let mut up = WsUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("site/files")).unwrap();
    std::fs::write(dir.path().join("site/files/index.html"), "hi\n").unwrap();
    std::fs::write(dir.path().join("policy.toml"), POLICY).unwrap();
    std::fs::write(
        dir.path().join("gate.toml"),
        "keyring = \"gate.keys\"\npolicy = \"policy.toml\"\n",
    )
    .unwrap();
    let tern = start(
        dir.path(),
        &format!(
            "gate = \"gate.toml\"\n\n[[site]]\nname = \"app\"\ndefault = true\n\n\
             [[site.route]]\npath = \"/\"\nproxy = \"{}\"\ngate = true\n\n\
             [[site.route]]\npath = \"/files\"\nstatic = \"site\"\n\n\
             [[site.route]]\npath = \"/statusz\"\ncounters = \"statusz\"\n",
            up.addr
        ),
    );
    let mut h2 = connect(&tern).await;
    assert!(h2.send.is_extended_connect_protocol_enabled());

    // The handshake: the upstream gets the GET an HTTP/1.1 browser would send, with a key of
    // tern's (never the client's) and the client's subprotocols.
    let (parts, tunnel, _) = open(
        &mut h2,
        "/chat/../chat?room=1",
        &[
            ("sec-websocket-protocol", "chat, superchat"),
            ("sec-websocket-key", "Y2xpZW50J3Mgb3duIGtleQ=="),
        ],
    )
    .await;
    assert_eq!(parts.status, 200, "{}", tern.stderr_text());
    assert_eq!(parts.headers["sec-websocket-protocol"], "chat");
    assert!(parts.headers.get("sec-websocket-accept").is_none());
    assert!(parts.headers.get("content-length").is_none());
    let mut t = tunnel.unwrap();
    let head = up.heads().pop().unwrap();
    assert!(head.starts_with("GET /chat?room=1 HTTP/1.1\r\n"), "{head}");
    assert_eq!(field(&head, "connection"), Some("upgrade"), "{head}");
    assert_eq!(field(&head, "upgrade"), Some("websocket"), "{head}");
    assert_eq!(field(&head, "sec-websocket-version"), Some("13"), "{head}");
    assert_eq!(
        field(&head, "sec-websocket-protocol"),
        Some("chat, superchat")
    );
    let key = field(&head, "sec-websocket-key").unwrap().to_string();
    assert_ne!(
        key, "Y2xpZW50J3Mgb3duIGtleQ==",
        "the client's key never goes up"
    );
    assert_eq!(head.matches("Sec-WebSocket-Key").count(), 1, "{head}");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(&key)
        .unwrap();
    assert_eq!(decoded.len(), 16);

    // Messages both ways, and one of 1 MiB: more than the client's stream window (64 KiB),
    // tern's (128 KiB) and the relay's buffers, so it crosses them all in steps.
    t.send(TEXT, b"hello");
    assert_eq!(t.next().await, Some((TEXT, b"hello".to_vec())));
    let big: Vec<u8> = (0..1 << 20).map(|i| (i * 7 % 251) as u8).collect();
    t.send(BINARY, &big);
    t.send(TEXT, b"after");
    assert_eq!(t.next().await, Some((BINARY, big)));
    assert_eq!(t.next().await, Some((TEXT, b"after".to_vec())));

    // A second tunnel on the same connection gets a key of its own.
    let (parts, t2, _) = open(&mut h2, "/chat", &[]).await;
    assert_eq!(parts.status, 200);
    let key2 = field(&up.heads().pop().unwrap(), "sec-websocket-key")
        .unwrap()
        .to_string();
    assert_ne!(key, key2);
    let mut t2 = t2.unwrap();

    // The client closes with a Close frame: echoed, then the upstream closes, and the
    // stream ends (END_STREAM).
    t.send(CLOSE, &1000u16.to_be_bytes());
    assert_eq!(
        t.next().await,
        Some((CLOSE, 1000u16.to_be_bytes().to_vec()))
    );
    assert_eq!(t.next().await, None);
    assert_eq!(up.next_end().await, End::CloseFrame);

    // END_STREAM from the client half-closes the upstream: it reads its end, answers, closes.
    t2.send(TEXT, b"last");
    assert_eq!(t2.next().await, Some((TEXT, b"last".to_vec())));
    t2.send.send_data(Bytes::new(), true).unwrap();
    assert_eq!(t2.next().await, Some((TEXT, b"bye".to_vec())));
    assert_eq!(t2.next().await, None);
    assert_eq!(up.next_end().await, End::Eof);

    // The upstream closes first: its Close frame, then the stream ends.
    let (_, t3, _) = open(&mut h2, "/server-closes", &[]).await;
    let mut t3 = t3.unwrap();
    assert_eq!(
        t3.next().await,
        Some((CLOSE, 1000u16.to_be_bytes().to_vec()))
    );
    assert_eq!(t3.next().await, None);
    assert_eq!(up.next_end().await, End::CloseFrame);

    // RST_STREAM from the client closes the upstream connection.
    let (_, t4, _) = open(&mut h2, "/chat", &[]).await;
    let mut t4 = t4.unwrap();
    t4.send(TEXT, b"x");
    assert_eq!(t4.next().await, Some((TEXT, b"x".to_vec())));
    t4.send.send_reset(h2::Reason::CANCEL);
    let end = up.next_end().await;
    assert!(matches!(end, End::Eof | End::Closed), "{end:?}");

    // An upstream that refuses: its status and body, and the stream ends.
    let (parts, t, body) = open(&mut h2, "/refuse", &[]).await;
    assert_eq!(parts.status, 403);
    assert!(t.is_none());
    assert_eq!(body, b"no way\n");
    // One whose 101 carries the wrong accept value, or that answers as to a GET: 502.
    let (parts, _, body) = open(&mut h2, "/wrong-accept", &[]).await;
    assert_eq!(parts.status, 502, "{}", String::from_utf8_lossy(&body));
    let (parts, _, _) = open(&mut h2, "/plain", &[]).await;
    assert_eq!(parts.status, 502);

    // The gate judges the same path the upstream would get: refused without reaching it.
    let before = up.heads().len();
    for path in ["/private/ws", "/chat/../private/ws", "/%70rivate/ws"] {
        let (parts, t, _) = open(&mut h2, path, &[]).await;
        assert!(t.is_none());
        assert_eq!(parts.status, 403, "{path}");
    }
    assert_eq!(up.heads().len(), before);
    // A static route has no tunnel to give.
    let (parts, t, body) = open(&mut h2, "/files/index.html", &[]).await;
    assert!(t.is_none());
    assert_eq!(parts.status, 501, "{}", String::from_utf8_lossy(&body));

    // The connection is still good for ordinary requests, and the tunnels were counted.
    let r = h2.get("/files/index.html", &[]).await;
    assert_eq!(r.text(), "hi\n");
    assert!(!h2.ended());
    assert_eq!(tern.counter_at("/statusz", OPENED_HTTP2), 4);
    assert_eq!(tern.counter_at("/statusz", OPENED_HTTP1), 0);
    assert!(eventually(Duration::from_secs(5), || tern
        .counter_at("/statusz", "websocket_tunnels_closed")
        == 4));
}

#[tokio::test(flavor = "current_thread")]
async fn without_a_proxy_route_extended_connect_is_not_offered() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("site")).unwrap();
    let tern = start(
        dir.path(),
        "[[site]]\nname = \"s\"\ndefault = true\n\n[[site.route]]\npath = \"/\"\nstatic = \"site\"\n\n\
         [[site.route]]\npath = \"/statusz\"\ncounters = \"statusz\"\n",
    );
    let h2 = connect(&tern).await;
    assert!(!h2.send.is_extended_connect_protocol_enabled());
}

/// A WebSocket over HTTP/1.1 through tern on `path`: the handshake (the upstream computes the
/// accept value from the client's key, which an HTTP/1.1 upgrade passes on), one message
/// echoed, and a Close frame exchange.
fn http1_websocket(tern: &Tern, path: &str) {
    let mut s = TcpStream::connect(tern.addr()).unwrap();
    s.set_read_timeout(Some(H2_TIMEOUT)).unwrap();
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    s.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\n\
             Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).unwrap(), 1, "the head ended early: {head:?}");
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
    assert_eq!(
        field(&head, "sec-websocket-accept"),
        Some(accept_for(key).as_str())
    );
    s.write_all(&frame(TEXT, b"over HTTP/1.1", Some([9, 8, 7, 6])))
        .unwrap();
    assert_eq!(read_frame(&mut s), Some((TEXT, b"over HTTP/1.1".to_vec())));
    s.write_all(&frame(CLOSE, &1000u16.to_be_bytes(), Some([1, 1, 1, 1])))
        .unwrap();
    assert_eq!(
        read_frame(&mut s),
        Some((CLOSE, 1000u16.to_be_bytes().to_vec()))
    );
}

#[tokio::test(flavor = "current_thread")]
async fn with_http2_websocket_off_websockets_take_http1() {
    let mut up = WsUpstream::start();
    let dir = tempfile::tempdir().unwrap();
    let tern = start(
        dir.path(),
        &format!(
            "http2_websocket = false\n\n[[site]]\nname = \"app\"\ndefault = true\n\n\
             [[site.route]]\npath = \"/\"\nproxy = \"{}\"\n\n\
             [[site.route]]\npath = \"/statusz\"\ncounters = \"statusz\"\n",
            up.addr
        ),
    );
    // A proxy route, yet the SETTINGS do not offer extended CONNECT.
    let h2 = connect(&tern).await;
    assert!(!h2.send.is_extended_connect_protocol_enabled());
    drop(h2);

    // By hand (the h2 crate will not send a `:protocol` unoffered): the SETTINGS lack the
    // parameter, and such a request is a stream error (RFC 8441 §3: a malformed request),
    // never reaching the app; the connection goes on.
    let mut raw = RawH2::connect(tern.addr(), &[]);
    let settings = raw.until("the server's SETTINGS", |f| {
        f.ty == SETTINGS && f.flags & ACK == 0
    });
    assert!(
        settings
            .settings()
            .iter()
            .all(|(id, _)| *id != ENABLE_CONNECT_PROTOCOL),
        "{settings:?}"
    );
    raw.request(
        1,
        "CONNECT",
        "/chat",
        &[(":protocol", "websocket"), ("sec-websocket-version", "13")],
        true,
    );
    let f = raw.until("stream 1's reset", |f| f.stream == 1 || f.ty == GOAWAY);
    assert_eq!(f.ty, RST_STREAM, "{f:?}; frames: {:?}", raw.seen);
    assert_eq!(f.error_code(), Some(PROTOCOL_ERROR), "{f:?}");
    raw.request(3, "GET", "/statusz", &[], false);
    let f = raw.until("stream 3's answer", |f| f.stream == 3 || f.ty == GOAWAY);
    assert_eq!(f.ty, HEADERS, "{f:?}; frames: {:?}", raw.seen);
    assert!(up.heads().is_empty(), "{:?}", up.heads());

    // WebSockets still work, over HTTP/1.1.
    http1_websocket(&tern, "/chat");
    assert_eq!(up.next_end().await, End::CloseFrame);
    assert_eq!(tern.counter_at("/statusz", OPENED_HTTP1), 1);
    assert_eq!(tern.counter_at("/statusz", OPENED_HTTP2), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn http2_websocket_true_offers_it_without_a_proxy_route() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("site")).unwrap();
    std::fs::write(dir.path().join("site/index.html"), "hi\n").unwrap();
    let tern = start(
        dir.path(),
        "http2_websocket = true\n\n[[site]]\nname = \"s\"\ndefault = true\n\n\
         [[site.route]]\npath = \"/\"\nstatic = \"site\"\n\n\
         [[site.route]]\npath = \"/statusz\"\ncounters = \"statusz\"\n",
    );
    let mut h2 = connect(&tern).await;
    assert!(h2.send.is_extended_connect_protocol_enabled());
    // No route relays one: refused as a static route refuses it.
    let (parts, t, _) = open(&mut h2, "/index.html", &[]).await;
    assert!(t.is_none());
    assert_eq!(parts.status, 501);
}
