//! The test side of HTTP/3 over sockets in memory: clients on quinn-proto's own client
//! endpoint, sans-IO like the server, and [`Net`], which moves datagrams between them and a
//! [`MemoryWorker`] (through its UDP socket's [`MemoryDatagramPeer`], which may lose, reorder
//! and re-address them) and moves the worker's manual clock, which the clients' QUIC reads
//! too, on to the next timer when nothing else is under way.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use quinn_proto::crypto::rustls::QuicClientConfig;
use quinn_proto::{
    ClientConfig, Connection, ConnectionError, ConnectionHandle, DatagramEvent, Dir, Endpoint,
    EndpointConfig, Event, StreamEvent, StreamId, TransportConfig, VarInt,
};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tern_http3::frame::{self, kind, stream_type};
use tern_http3::{qpack, varint};
use tern_runtime::io::{MemoryDatagramPeer, SentDatagram};

use crate::memory_worker::MemoryWorker;

/// Datagrams per transmit call of a client (split as GSO segments would be).
const MAX_DATAGRAMS: usize = 10;
/// Loop rounds of [`Net::run_until`] before it gives up: a network that never settles is a
/// bug the test should see, not a hang.
const MAX_ROUNDS: usize = 200_000;

/// Accepts only the certificate whose SHA-256 fingerprint it was given (the one tern's
/// `--tls-self-signed` made), with the handshake's signatures checked as usual.
#[derive(Debug)]
struct Pinned {
    fingerprint: String,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, end_entity.as_ref());
        let fingerprint: Vec<String> = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
        if fingerprint.join(":") == self.fingerprint {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General("not the pinned certificate".into()))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A QUIC client configuration offering `h3` that trusts the certificate of `fingerprint`.
/// It sets no idle timeout of its own, so the server's is the connection's.
fn client_config(fingerprint: &str) -> ClientConfig {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = Arc::new(Pinned {
        fingerprint: fingerprint.to_string(),
        algorithms: provider.signature_verification_algorithms,
    });
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = QuicClientConfig::try_from(Arc::new(tls)).expect("an initial cipher suite");
    let mut transport = TransportConfig::default();
    transport.max_idle_timeout(None);
    let mut config = ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    config
}

/// An answer read whole from its request stream.
#[derive(Debug)]
pub(super) struct Answer {
    pub status: u16,
    /// Its fields but `:status`, as sent (lowercase names).
    pub fields: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What one of the server's streams brought so far.
#[derive(Default)]
struct Incoming {
    bytes: Vec<u8>,
    finished: bool,
}

/// One HTTP/3 client: its own endpoint and connection, requests as HEADERS frames written
/// by hand (QPACK's static table and literals, as tern's encoder writes answers), answers
/// and the server's control stream read back.
pub(super) struct H3Client {
    endpoint: Endpoint,
    pub conn: Connection,
    handle: ConnectionHandle,
    /// The address it sends from; the NAT between may show another to the server.
    pub addr: SocketAddr,
    /// What the server sees it as since a rebinding ([`Net::rebind`]), and so where answers
    /// for it are addressed.
    seen_as: Option<SocketAddr>,
    /// Neither sends nor receives any more (a client gone, or a spoofed source address).
    pub unplugged: bool,
    /// Requests not yet opened (number, path, whether the head ends the stream): streams
    /// wait for the handshake to learn the server's limits.
    queued: Vec<(usize, String, bool)>,
    /// Each request's stream, by request number.
    requests: Vec<Option<StreamId>>,
    streams: HashMap<StreamId, Incoming>,
    /// The server's unidirectional streams, in the order they opened.
    uni: Vec<StreamId>,
    pub connected: bool,
    pub lost: Option<ConnectionError>,
    /// Datagrams received addressed to its rebound address (answers on the new path).
    pub received_rebound: usize,
}

impl H3Client {
    fn new(addr: SocketAddr, server: SocketAddr, config: ClientConfig, now: Instant) -> H3Client {
        let mut endpoint = Endpoint::new(Arc::new(EndpointConfig::default()), None, true, None);
        let (handle, conn) = endpoint
            .connect(now, config, server, "localhost")
            .expect("a connection to start");
        H3Client {
            endpoint,
            conn,
            handle,
            addr,
            seen_as: None,
            unplugged: false,
            queued: Vec::new(),
            requests: Vec::new(),
            streams: HashMap::new(),
            uni: Vec::new(),
            connected: false,
            lost: None,
            received_rebound: 0,
        }
    }

    /// Sends `GET path` (at once if connected, else once the handshake is over); its number
    /// for [`H3Client::answer`].
    pub fn get(&mut self, path: &str) -> usize {
        self.request(path, true)
    }

    /// As [`H3Client::get`], but the stream stays open after the head, as if a body were
    /// to follow.
    pub fn begin(&mut self, path: &str) -> usize {
        self.request(path, false)
    }

    fn request(&mut self, path: &str, end: bool) -> usize {
        let n = self.requests.len();
        self.requests.push(None);
        self.queued.push((n, path.to_string(), end));
        if self.connected {
            self.open_queued();
        }
        n
    }

    /// Abandons request `n` before its end (RESET_STREAM with H3_REQUEST_CANCELLED).
    pub fn cancel(&mut self, n: usize) {
        let id = self.requests[n].expect("a request sent");
        let code = tern_http3::ErrorCode::RequestCancelled.code();
        let code = VarInt::from_u64(code).expect("a varint");
        self.conn
            .send_stream(id)
            .reset(code)
            .expect("an open stream");
    }

    /// Bytes of request `n`'s stream received so far (frames and all).
    pub fn received(&self, n: usize) -> usize {
        let id = self.requests.get(n).copied().flatten();
        id.and_then(|id| self.streams.get(&id))
            .map_or(0, |s| s.bytes.len())
    }

    /// Wants no more of request `n`'s answer (STOP_SENDING with H3_REQUEST_CANCELLED).
    pub fn stop(&mut self, n: usize) {
        let id = self.requests[n].expect("a request sent");
        let code = tern_http3::ErrorCode::RequestCancelled.code();
        let code = VarInt::from_u64(code).expect("a varint");
        self.conn
            .recv_stream(id)
            .stop(code)
            .expect("an open stream");
    }

    /// Request `n`'s answer, once its stream has ended.
    pub fn answer(&self, n: usize) -> Option<Answer> {
        let id = self.requests.get(n).copied().flatten()?;
        let incoming = self.streams.get(&id).filter(|s| s.finished)?;
        let (mut status, mut fields, mut body) = (None, Vec::new(), Vec::new());
        let mut rest = &incoming.bytes[..];
        while let Some((ty, len, at)) = frame::parse_header(rest) {
            let end = at + len as usize;
            let payload = &rest[at..end];
            match ty {
                kind::HEADERS if status.is_none() => {
                    let mut scratch = Default::default();
                    qpack::decode_section(payload, usize::MAX, &mut scratch, |n, v| {
                        let (n, v) = (text(n), text(v));
                        match n.as_str() {
                            ":status" => status = v.parse().ok(),
                            _ => fields.push((n, v)),
                        }
                        Ok(())
                    })
                    .expect("a field section of the static table and literals");
                }
                kind::DATA => body.extend_from_slice(payload),
                _ => {}
            }
            rest = &rest[end..];
        }
        assert!(rest.is_empty(), "the stream ends inside a frame");
        Some(Answer {
            status: status.expect(":status"),
            fields,
            body,
        })
    }

    /// The GOAWAY frame's stream id, if the server's control stream carried one.
    pub fn goaway(&self) -> Option<u64> {
        let control = self.uni.iter().find_map(|id| {
            let bytes = &self.streams.get(id)?.bytes;
            match varint::decode(bytes) {
                Some((stream_type::CONTROL, n)) => Some(&bytes[n..]),
                _ => None,
            }
        })?;
        let mut rest = control;
        while let Some((ty, len, at)) = frame::parse_header(rest) {
            let end = at + len as usize;
            if end > rest.len() {
                break;
            }
            if ty == kind::GOAWAY {
                return frame::single_varint(&rest[at..end]);
            }
            rest = &rest[end..];
        }
        None
    }

    /// Closes the connection (H3_NO_ERROR), as a client done with it does.
    pub fn close(&mut self, now: Instant) {
        let code = VarInt::from_u64(tern_http3::ErrorCode::NoError.code()).expect("a varint");
        self.conn
            .close(now, code, bytes::Bytes::from_static(b"done"));
    }

    fn open_queued(&mut self) {
        for (n, path, end) in std::mem::take(&mut self.queued) {
            let id = self
                .conn
                .streams()
                .open(Dir::Bi)
                .expect("the server allows a request stream");
            let mut section = Vec::new();
            qpack::begin_section(&mut section);
            for (name, value) in [
                (":method", "GET"),
                (":scheme", "https"),
                (":authority", "localhost"),
                (":path", path.as_str()),
            ] {
                qpack::encode_field(name.as_bytes(), value.as_bytes(), false, &mut section);
            }
            let mut bytes = Vec::new();
            frame::write_header(&mut bytes, kind::HEADERS, section.len() as u64);
            bytes.extend(section);
            self.write_all(id, &bytes);
            if end {
                self.conn.send_stream(id).finish().expect("an open stream");
            }
            self.requests[n] = Some(id);
        }
    }

    /// A few bytes on a fresh stream: within any flow-control window.
    fn write_all(&mut self, id: StreamId, bytes: &[u8]) {
        let written = self.conn.send_stream(id).write(bytes).expect("writable");
        assert_eq!(
            written,
            bytes.len(),
            "a request head fits the stream's window"
        );
    }

    /// Its connection's news: the handshake's end (our control stream opens with empty
    /// SETTINGS, and queued requests go), streams' bytes, the end.
    fn process(&mut self) {
        while let Some(event) = self.conn.poll() {
            match event {
                Event::Connected => {
                    self.connected = true;
                    let control = self.conn.streams().open(Dir::Uni).expect("a uni stream");
                    let mut bytes = Vec::new();
                    varint::encode(stream_type::CONTROL, &mut bytes);
                    frame::write_settings(&mut bytes, &[]);
                    self.write_all(control, &bytes);
                    self.open_queued();
                }
                Event::ConnectionLost { reason } => self.lost = Some(reason),
                Event::Stream(StreamEvent::Opened { dir }) => {
                    while let Some(id) = self.conn.streams().accept(dir) {
                        if dir == Dir::Uni {
                            self.uni.push(id);
                        }
                        self.read(id);
                    }
                }
                Event::Stream(StreamEvent::Readable { id }) => self.read(id),
                _ => {}
            }
        }
    }

    fn read(&mut self, id: StreamId) {
        let incoming = self.streams.entry(id).or_default();
        let mut recv = self.conn.recv_stream(id);
        let Ok(mut chunks) = recv.read(true) else {
            return;
        };
        loop {
            match chunks.next(usize::MAX) {
                Ok(Some(chunk)) => incoming.bytes.extend_from_slice(&chunk.bytes),
                Ok(None) => {
                    incoming.finished = true;
                    break;
                }
                Err(_) => break,
            }
        }
        let _ = chunks.finalize();
    }

    /// A datagram from the server.
    fn receive(&mut self, now: Instant, datagram: SentDatagram) {
        if Some(datagram.to) == self.seen_as {
            self.received_rebound += 1;
        }
        let mut buf = Vec::new();
        let ecn = datagram
            .ecn
            .and_then(|e| quinn_proto::EcnCodepoint::from_bits(e as u8));
        let data = BytesMut::from(&datagram.bytes[..]);
        if let Some(DatagramEvent::ConnectionEvent(handle, event)) =
            self.endpoint
                .handle(now, datagram.from, None, ecn, data, &mut buf)
        {
            if handle == self.handle {
                self.conn.handle_event(event);
            }
        }
        self.endpoint_events();
    }

    fn endpoint_events(&mut self) {
        while let Some(event) = self.conn.poll_endpoint_events() {
            if let Some(back) = self.endpoint.handle_event(self.handle, event) {
                self.conn.handle_event(back);
            }
        }
    }

    /// What the connection has to send now, as datagrams.
    fn transmit(&mut self, now: Instant) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = Vec::new();
        while let Some(t) = self.conn.poll_transmit(now, MAX_DATAGRAMS, &mut buf) {
            let segment = t.segment_size.unwrap_or(t.size);
            out.extend(buf[..t.size].chunks(segment).map(<[u8]>::to_vec));
            buf.clear();
        }
        self.endpoint_events();
        out
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A worker serving HTTP/3, its UDP socket's other end, and the clients on it: the network
/// and time between them, moved by the test.
pub(super) struct Net {
    pub w: MemoryWorker,
    pub peer: MemoryDatagramPeer,
    pub server: SocketAddr,
    pub clients: Vec<H3Client>,
    config: ClientConfig,
    /// The `Instant` of the worker clock's zero, for the clients' QUIC.
    epoch: Instant,
    /// Datagrams from the worker addressed to no client (an address a NAT let go).
    pub strays: usize,
}

impl Net {
    /// Clients of `w` (made by [`MemoryWorker::with_http3`] at `server`, whose other end
    /// is `peer`) that trust the certificate of `fingerprint`.
    pub fn new(
        w: MemoryWorker,
        peer: MemoryDatagramPeer,
        server: SocketAddr,
        fingerprint: &str,
    ) -> Net {
        let epoch = Instant::now() - Duration::from_micros(w.now_us());
        Net {
            w,
            peer,
            server,
            clients: Vec::new(),
            config: client_config(fingerprint),
            epoch,
            strays: 0,
        }
    }

    /// Now, as the clients' QUIC counts: the worker's clock.
    pub fn now(&self) -> Instant {
        self.epoch + Duration::from_micros(self.w.now_us())
    }

    /// A new client at `addr` begins its handshake (its first datagrams go out on the next
    /// round); its index.
    pub fn connect(&mut self, addr: SocketAddr) -> usize {
        let client = H3Client::new(addr, self.server, self.config.clone(), self.now());
        self.clients.push(client);
        self.clients.len() - 1
    }

    /// A client's first flight from `addr`, and nothing more from there: a source address
    /// spoofed, or a client gone at once. The worker begins a handshake that never ends.
    pub fn spoof(&mut self, addr: SocketAddr) {
        let i = self.connect(addr);
        let now = self.now();
        for datagram in self.clients[i].transmit(now) {
            self.peer.send_to(addr, &datagram);
        }
        self.clients[i].unplugged = true;
        self.w.settle();
    }

    /// From now on the NAT in front of client `i` shows it to the server as `seen_as`.
    pub fn rebind(&mut self, i: usize, seen_as: SocketAddr) {
        let client = &mut self.clients[i];
        self.peer.rebind(client.addr, seen_as);
        client.seen_as = Some(seen_as);
    }

    /// Moves datagrams and time until `done` holds; panics if it never does (nothing left to
    /// happen, or `limit` of clock time gone by).
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Net) -> bool) {
        let start_ms = self.w.now_ms();
        let give_up_ms = start_ms + limit.as_millis() as u64;
        for _ in 0..MAX_ROUNDS {
            let moved = self.round();
            if done(self) {
                return;
            }
            if moved {
                continue;
            }
            let now_ms = self.w.now_ms();
            let next = self.next_timer_ms();
            assert!(
                next.is_some_and(|at| at <= give_up_ms),
                "not done after {} ms of clock time (next timer: {next:?})",
                now_ms - start_ms
            );
            let at = next.unwrap_or(now_ms);
            if at > now_ms {
                self.w.advance(Duration::from_millis(at - now_ms));
            }
        }
        panic!("not done in {MAX_ROUNDS} rounds");
    }

    /// Moves datagrams and time until the clock reads `at_ms`, never past it: time jumps to
    /// each timer of the worker or a client on the way, and stops at `at_ms` even if the next
    /// one is later.
    pub fn run_to_ms(&mut self, at_ms: u64) {
        for _ in 0..MAX_ROUNDS {
            let moved = self.round();
            let now_ms = self.w.now_ms();
            if now_ms >= at_ms {
                return;
            }
            if !moved {
                let next = self
                    .next_timer_ms()
                    .unwrap_or(at_ms)
                    .clamp(now_ms + 1, at_ms);
                self.w.advance(Duration::from_millis(next - now_ms));
            }
        }
        panic!("not at {at_ms} ms in {MAX_ROUNDS} rounds");
    }

    /// Moves datagrams until none is under way, without moving the clock.
    pub fn settle(&mut self) {
        for _ in 0..MAX_ROUNDS {
            if !self.round() {
                return;
            }
        }
        panic!("datagrams still under way after {MAX_ROUNDS} rounds");
    }

    /// One round: clients' timers and sends, the worker's turns, its sends to the clients.
    /// False if no datagram moved either way.
    fn round(&mut self) -> bool {
        let now = self.now();
        let mut moved = false;
        for c in self.clients.iter_mut().filter(|c| !c.unplugged) {
            if c.conn.poll_timeout().is_some_and(|at| at <= now) {
                c.conn.handle_timeout(now);
            }
            c.process();
            for datagram in c.transmit(now) {
                self.peer.send_to(c.addr, &datagram);
                moved = true;
            }
        }
        self.w.settle();
        while let Some(datagram) = self.peer.recv() {
            moved = true;
            let to = datagram.to;
            // Once rebound, the old address leads nowhere: the NAT let its mapping go.
            match self
                .clients
                .iter_mut()
                .find(|c| c.seen_as.unwrap_or(c.addr) == to)
            {
                Some(c) if !c.unplugged => {
                    c.receive(now, datagram);
                    c.process();
                }
                Some(_) => {}
                None => self.strays += 1,
            }
        }
        moved
    }

    /// The clock time (ms) of the earliest timer of the worker or of a client.
    fn next_timer_ms(&mut self) -> Option<u64> {
        let epoch = self.epoch;
        let clients = self
            .clients
            .iter_mut()
            .filter(|c| !c.unplugged)
            .filter_map(|c| c.conn.poll_timeout())
            .map(|at| {
                let us = at.saturating_duration_since(epoch).as_micros() as u64;
                us.div_ceil(1000)
            });
        clients.chain(self.w.wakes_at_ms()).min()
    }
}
