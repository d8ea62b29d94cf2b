//! One connection of the load: a UDP socket of its own (so a server spreading flows over
//! SO_REUSEPORT sockets sees one flow per connection, as with h2load's TCP connections), a
//! quinn-proto endpoint on it, and its requests, each on a stream of its own, kept at the
//! run's number in flight.

use std::collections::HashMap;
use std::io::{self, IoSliceMut};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use quinn_proto::{
    ClientConfig, Connection, ConnectionHandle, DatagramEvent, Dir, Endpoint, EndpointConfig,
    Event, ReadError, StreamEvent, StreamId, VarInt,
};
use quinn_udp::{RecvMeta, Transmit, UdpSockRef, UdpSocketState};
use tern_http3::frame::{self, stream_type};
use tern_http3::varint;

use crate::answer::AnswerReader;
use crate::Tally;

/// Socket buffers asked for: room for a burst of a server's GSO batches while the client is
/// busy. The kernel caps them at net.core.rmem_max and wmem_max (often about 208 KiB).
const SOCKET_BUFFER: usize = 4 << 20;
/// H3_NO_ERROR, for the close at the end.
const NO_ERROR: u32 = 0x100;
/// H3_REQUEST_CANCELLED.
const H3_REQUEST_CANCELLED: u32 = 0x10c;

/// What every connection of the run shares: the requests to send (HEADERS frames, sent in
/// turn), and whether the clock runs.
pub struct Load {
    pub requests: Vec<Vec<u8>>,
    pub streams: usize,
    /// Requests are sent only while the run is on (after the handshakes, before its end).
    pub running: bool,
    /// -n: requests not yet opened.
    pub left: Option<u64>,
    next: usize,
}

impl Load {
    pub fn new(requests: Vec<Vec<u8>>, streams: usize, limit: Option<u64>) -> Load {
        Load {
            requests,
            streams,
            running: false,
            left: limit,
            next: 0,
        }
    }

    /// Whether the run wants one more request.
    fn wants(&self) -> bool {
        self.running && self.left != Some(0)
    }

    /// The next request to send (the run wants it: [`Load::wants`]).
    fn peek(&self) -> &[u8] {
        &self.requests[self.next]
    }

    /// The next request was sent.
    fn take(&mut self) {
        if let Some(left) = &mut self.left {
            *left -= 1;
        }
        self.next = (self.next + 1) % self.requests.len();
    }
}

/// Buffers for one `recvmmsg`, reused by every connection.
pub struct RecvBuffers {
    bufs: Vec<Vec<u8>>,
    meta: Vec<RecvMeta>,
}

impl RecvBuffers {
    pub fn new() -> RecvBuffers {
        RecvBuffers {
            bufs: vec![vec![0; 64 << 10]; quinn_udp::BATCH_SIZE],
            meta: vec![RecvMeta::default(); quinn_udp::BATCH_SIZE],
        }
    }
}

pub struct Client {
    pub socket: mio::net::UdpSocket,
    udp: UdpSocketState,
    endpoint: Endpoint,
    config: ClientConfig,
    server: SocketAddr,
    server_name: String,
    conn: Connection,
    handle: ConnectionHandle,
    pub connected: bool,
    /// Why the connection ended, if it did (the run then dials again).
    pub lost: Option<String>,
    /// Requests in flight: when each was opened, and its answer so far.
    in_flight: HashMap<StreamId, (Instant, AnswerReader)>,
    transmit_buf: Vec<u8>,
}

impl Client {
    /// A connection from a new socket. `gro`: let the kernel coalesce datagrams (quinn-udp
    /// turns GRO on where it can; false turns it off again, for comparison).
    pub fn connect(
        config: ClientConfig,
        server: SocketAddr,
        server_name: &str,
        gro: bool,
        now: Instant,
    ) -> io::Result<Client> {
        let domain = socket2::Domain::for_address(server);
        let sock = socket2::Socket::new(domain, socket2::Type::DGRAM, None)?;
        sock.set_recv_buffer_size(SOCKET_BUFFER)?;
        sock.set_send_buffer_size(SOCKET_BUFFER)?;
        let any: SocketAddr = match server {
            SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
            SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        sock.bind(&any.into())?;
        let std_sock: std::net::UdpSocket = sock.into();
        // GRO, ECN and packet info on, non-blocking (quinn-udp's set-up, as tern's worker's).
        let udp = UdpSocketState::new(UdpSockRef::from(&std_sock))?;
        if !gro {
            set_gro(&std_sock, false)?;
        }
        let socket = mio::net::UdpSocket::from_std(std_sock);
        let mut endpoint = Endpoint::new(Arc::new(EndpointConfig::default()), None, true, None);
        let (handle, conn) = endpoint
            .connect(now, config.clone(), server, server_name)
            .map_err(|e| io::Error::other(format!("connect: {e}")))?;
        Ok(Client {
            socket,
            udp,
            endpoint,
            config,
            server,
            server_name: server_name.to_string(),
            conn,
            handle,
            connected: false,
            lost: None,
            in_flight: HashMap::new(),
            transmit_buf: Vec::new(),
        })
    }

    /// Dials again after the connection ended; what was in flight on it failed.
    pub fn redial(&mut self, now: Instant, tally: &mut Tally) -> io::Result<()> {
        let why = format!(
            "the connection ended: {}",
            self.lost.as_deref().unwrap_or("?")
        );
        for (_, (started, _)) in self.in_flight.drain() {
            tally.finish(Err(why.clone()), started, now);
        }
        // A new endpoint: the old connection is dropped undrained, and with it whatever the
        // old endpoint kept for it.
        self.endpoint = Endpoint::new(Arc::new(EndpointConfig::default()), None, true, None);
        let (handle, conn) = self
            .endpoint
            .connect(now, self.config.clone(), self.server, &self.server_name)
            .map_err(|e| io::Error::other(format!("connect: {e}")))?;
        (self.handle, self.conn, self.connected, self.lost) = (handle, conn, false, None);
        Ok(())
    }

    /// When its connection next needs [`Client::drive`] without a datagram.
    pub fn timeout(&mut self) -> Option<Instant> {
        self.conn.poll_timeout()
    }

    /// Reads every datagram waiting on the socket (the poll is edge-triggered) into the
    /// connection.
    pub fn receive(&mut self, now: Instant, rx: &mut RecvBuffers) -> io::Result<()> {
        let mut response = Vec::new();
        loop {
            let mut slices: Vec<IoSliceMut<'_>> =
                rx.bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            let n = match self
                .udp
                .recv(UdpSockRef::from(&self.socket), &mut slices, &mut rx.meta)
            {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for (meta, buf) in rx.meta[..n].iter().zip(&rx.bufs) {
                let ecn = meta
                    .ecn
                    .and_then(|e| quinn_proto::EcnCodepoint::from_bits(e as u8));
                for datagram in buf[..meta.len].chunks(meta.stride.max(1)) {
                    let event = self.endpoint.handle(
                        now,
                        meta.addr,
                        meta.dst_ip,
                        ecn,
                        BytesMut::from(datagram),
                        &mut response,
                    );
                    if let Some(DatagramEvent::ConnectionEvent(handle, event)) = event {
                        if handle == self.handle {
                            self.conn.handle_event(event);
                        }
                    }
                    response.clear();
                }
            }
        }
    }

    /// Runs the connection's timers and news (answers read, new requests opened while the
    /// load wants them), then sends what it has to.
    pub fn drive(&mut self, now: Instant, load: &mut Load, tally: &mut Tally) -> io::Result<()> {
        if self.conn.poll_timeout().is_some_and(|t| t <= now) {
            self.conn.handle_timeout(now);
        }
        while let Some(event) = self.conn.poll_endpoint_events() {
            if let Some(back) = self.endpoint.handle_event(self.handle, event) {
                self.conn.handle_event(back);
            }
        }
        while let Some(event) = self.conn.poll() {
            match event {
                Event::Connected => {
                    self.connected = true;
                    self.open_control()?;
                }
                Event::ConnectionLost { reason } => self.lost = Some(reason.to_string()),
                Event::Stream(StreamEvent::Opened { dir }) => {
                    while let Some(id) = self.conn.streams().accept(dir) {
                        self.read(id, now, tally);
                    }
                }
                Event::Stream(StreamEvent::Readable { id }) => self.read(id, now, tally),
                _ => {}
            }
        }
        if self.connected && self.lost.is_none() {
            self.fill(now, load)?;
        }
        self.transmit(now)
    }

    /// Opens requests until the load's number is in flight (or the server's stream limit
    /// says wait: quinn then reports the stream available).
    pub fn fill(&mut self, now: Instant, load: &mut Load) -> io::Result<()> {
        while self.in_flight.len() < load.streams && load.wants() {
            let Some(id) = self.conn.streams().open(Dir::Bi) else {
                return Ok(());
            };
            let mut send = self.conn.send_stream(id);
            match send.write(load.peek()) {
                Ok(n) if n == load.peek().len() => {}
                // Held back (the connection's flow control, or a head larger than a stream's
                // window): the stream is dropped unsent and the request tried again later.
                _ => {
                    let _ = send.reset(VarInt::from_u32(H3_REQUEST_CANCELLED));
                    return Ok(());
                }
            }
            send.finish().map_err(io::Error::other)?;
            load.take();
            self.in_flight.insert(id, (now, AnswerReader::default()));
        }
        Ok(())
    }

    /// Our control stream: its type and empty SETTINGS (no dynamic table, no extensions).
    fn open_control(&mut self) -> io::Result<()> {
        let id = self
            .conn
            .streams()
            .open(Dir::Uni)
            .ok_or_else(|| io::Error::other("the server allows no unidirectional stream"))?;
        let mut bytes = Vec::new();
        varint::encode(stream_type::CONTROL, &mut bytes);
        frame::write_settings(&mut bytes, &[]);
        self.conn
            .send_stream(id)
            .write(&bytes)
            .map_err(io::Error::other)?;
        Ok(())
    }

    /// Reads what stream `id` has: an answer's next piece, or (a stream of the server's
    /// own: control, QPACK) bytes that are read and dropped.
    fn read(&mut self, id: StreamId, now: Instant, tally: &mut Tally) {
        let load_on = tally.counting(now);
        let mut recv = self.conn.recv_stream(id);
        let Ok(mut chunks) = recv.read(true) else {
            return;
        };
        let mut answer = self.in_flight.get_mut(&id);
        // Some(outcome) once the answer has ended, one way or another.
        let mut ended: Option<Result<(), String>> = None;
        loop {
            match chunks.next(usize::MAX) {
                Ok(Some(chunk)) => {
                    if let Some((_, reader)) = answer.as_mut() {
                        let body = reader.body;
                        let fed = reader.feed(&chunk.bytes);
                        if load_on {
                            tally.bytes += reader.body - body;
                        }
                        if let Err(e) = fed {
                            ended = Some(Err(e.to_string()));
                            break;
                        }
                    }
                }
                Ok(None) => {
                    ended = answer.as_ref().map(|(_, r)| match (r.finish(), r.status) {
                        (Err(e), _) => Err(e.to_string()),
                        (Ok(()), Some(200..=299)) => Ok(()),
                        (Ok(()), status) => Err(format!("status {}", status.unwrap_or(0))),
                    });
                    break;
                }
                Err(ReadError::Blocked) => break,
                Err(ReadError::Reset(code)) => {
                    ended = Some(Err(format!("the stream was reset (code {code})")));
                    break;
                }
            }
        }
        let _ = chunks.finalize();
        let Some(outcome) = ended else {
            return;
        };
        if let Some((started, reader)) = self.in_flight.remove(&id) {
            let cut = outcome.is_err() && reader.finish().is_err();
            tally.finish(outcome, started, now);
            if cut {
                let code = VarInt::from_u32(H3_REQUEST_CANCELLED);
                let _ = self.conn.recv_stream(id).stop(code);
            }
        }
    }

    fn transmit(&mut self, now: Instant) -> io::Result<()> {
        let segments = self.udp.max_gso_segments();
        loop {
            self.transmit_buf.clear();
            let Some(t) = self
                .conn
                .poll_transmit(now, segments, &mut self.transmit_buf)
            else {
                return Ok(());
            };
            let transmit = Transmit {
                destination: t.destination,
                ecn: t
                    .ecn
                    .and_then(|e| quinn_udp::EcnCodepoint::from_bits(e as u8)),
                contents: &self.transmit_buf[..t.size],
                segment_size: t.segment_size,
                src_ip: t.src_ip,
            };
            match self.udp.try_send(UdpSockRef::from(&self.socket), &transmit) {
                Ok(()) => {}
                // A full socket buffer: lost, as on the way, and QUIC sends it again.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if quinn_udp::is_msg_size_err(&e) => {} // an MTU probe too large
                Err(e) => return Err(e),
            }
        }
    }

    /// Closes the connection (H3_NO_ERROR) and sends the close.
    pub fn close(&mut self, now: Instant) {
        self.conn
            .close(now, VarInt::from_u32(NO_ERROR), bytes::Bytes::new());
        let _ = self.transmit(now);
    }

    /// The ALPN the handshake agreed, once connected.
    pub fn alpn(&self) -> Option<String> {
        let data = self.conn.crypto_session().handshake_data()?;
        let data = data
            .downcast::<quinn_proto::crypto::rustls::HandshakeData>()
            .ok()?;
        data.protocol
            .map(|p| String::from_utf8_lossy(&p).into_owned())
    }
}

/// Turns the kernel's UDP GRO on or off for `sock`.
pub fn set_gro(sock: &std::net::UdpSocket, on: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let value = libc::c_int::from(on);
    // SAFETY: a setsockopt on a socket this borrow keeps open, with a pointer to a c_int
    // that lives through the call and its exact size.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_GRO,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the kernel coalesces on `sock`, read back with getsockopt.
    fn gro(sock: &std::net::UdpSocket) -> bool {
        use std::os::fd::AsRawFd;
        let mut value: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `value`, a c_int of that size
        // living through the call, and its length into `len`.
        let r = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_UDP,
                libc::UDP_GRO,
                (&raw mut value).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        value != 0
    }

    #[test]
    fn gro_goes_off_and_on() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        set_gro(&sock, true).unwrap();
        assert!(gro(&sock));
        set_gro(&sock, false).unwrap();
        assert!(!gro(&sock));
    }
}
