//! The server side of a client's TLS connection, driven without I/O over the connection's
//! own buffers. rustls's unbuffered connection runs the handshake on the bytes where they
//! were read (a plaintext handshake message cut into several records is gathered first, see
//! `gather.rs`). Once it completes, rustls hands over the traffic secrets and keeps only the key
//! schedule (`KernelConnection`, for key updates), and [`RecordLayer`] seals and opens the
//! records in place. An established session holds no buffer of its own.

use std::mem;
use std::ops::Range;
use std::sync::Arc;

use rustls::kernel::KernelConnection;
use rustls::server::{ServerConnectionData, UnbufferedServerConnection};
use rustls::unbuffered::{ConnectionState, EncodeError, InsufficientSizeError};
use rustls::{ProtocolVersion, ServerConfig, SupportedCipherSuite};

use crate::record::{
    self, alert, content, level, Protection, RecordError, RecordLayer, HEADER, MAX_PLAINTEXT,
    MAX_RECORD,
};
use crate::TlsFailure;

mod gather;
mod post_handshake;

use gather::Gathered;
use post_handshake::{Message, PostHandshake};

/// Key updates or renegotiation requests a peer may send without data in between: each
/// costs a key derivation or an alert, and a record (rustls allows as many key updates).
const CONTROL_WITHOUT_DATA: u8 = 32;

/// The most received bytes a handshake may hold in the read buffer, from its front: the
/// records of one handshake message rustls is joining (encrypted ones; plaintext messages
/// are gathered, see `gather.rs`), and one record more. A client's encrypted handshake
/// messages are a Finished of at most 52 bytes, so this is far more than any needs.
pub const MAX_HANDSHAKE_INPUT: usize = 4 * MAX_RECORD;

/// What the front of the received bytes held, once processed.
#[derive(Debug, PartialEq, Eq)]
pub enum Received {
    /// Nothing for the application until more arrives: consume `taken` bytes (handshake
    /// messages, key updates, empty records). `want`: how many bytes from the front (after
    /// `taken`) the next step needs, when known.
    More { taken: usize, want: Option<usize> },
    /// Application data, decrypted in place at `data` (offsets into the input given);
    /// consume `taken` bytes, which end with its record, once the data is read.
    Data { data: Range<usize>, taken: usize },
    /// The peer's close_notify came: nothing more will (consume `taken`).
    Closed { taken: usize },
}

/// What one step of rustls's handshake asked for.
enum Step {
    Again,
    NeedsInput,
    MaySend,
    PeerClosed,
    Failed(rustls::Error),
}

/// One client's TLS session (made by [`crate::TlsAcceptor::accept`]).
pub struct TlsSession {
    phase: Phase,
    /// Records for the peer that are not the application's (handshake flights, alerts, key
    /// updates, close_notify), in order: the connection takes them before its next records.
    control: Vec<u8>,
    /// How many bytes at the input's front rustls has been shown during the handshake: one
    /// whole record more each time it has handled what it saw, so it never reads past the
    /// handshake's last record (what follows is opened here, not by rustls).
    shown: usize,
    /// Plaintext handshake messages gathered out of their records (see `gather.rs`): while
    /// whole ones are ready, rustls is shown those instead of the input. Only while some are
    /// (an idle session stays small).
    gathered: Option<Box<Gathered>>,
    /// The client sent ChangeCipherSpec: under TLS 1.2 its handshake records are encrypted
    /// from then on, and are not gathered.
    ccs_seen: bool,
    /// rustls has made records for the client (so our alerts may have to be encrypted).
    spoke: bool,
    alpn: Option<Box<[u8]>>,
    resumed: bool,
    peer_closed: bool,
    close_queued: bool,
}

enum Phase {
    Handshake(Box<UnbufferedServerConnection>),
    Traffic(Box<Traffic>),
    /// Failed: nothing more is read or sealed (an alert may still wait in `control`).
    Dead,
}

struct Traffic {
    kernel: KernelConnection<ServerConnectionData>,
    records: RecordLayer,
    /// A handshake message under way (it may span records).
    post_handshake: PostHandshake,
    /// Key updates and renegotiation requests since the last data.
    control_without_data: u8,
}

impl TlsSession {
    pub(crate) fn new(config: Arc<ServerConfig>) -> TlsSession {
        let conn = UnbufferedServerConnection::new(config).expect("a valid server config");
        TlsSession {
            phase: Phase::Handshake(Box::new(conn)),
            control: Vec::new(),
            shown: 0,
            gathered: None,
            ccs_seen: false,
            spoke: false,
            alpn: None,
            resumed: false,
            peer_closed: false,
            close_queued: false,
        }
    }

    /// Processes the bytes received (`input`, from the front of what is not yet consumed).
    /// Application data is opened one record at a time, only when asked for; during the
    /// handshake this returns once it completes. On an error the session is dead and an
    /// alert for the peer may wait in [`Self::take_control`].
    pub fn receive(&mut self, input: &mut [u8]) -> Result<Received, TlsFailure> {
        if matches!(self.phase, Phase::Handshake(_)) {
            return self.handshake(input);
        }
        let mut taken = 0;
        loop {
            let Phase::Traffic(traffic) = &mut self.phase else {
                return Ok(Received::More {
                    taken: input.len(),
                    want: None,
                });
            };
            if self.peer_closed {
                // Nothing after close_notify counts.
                return Ok(Received::Closed { taken: input.len() });
            }
            let rest = &mut input[taken..];
            let len = match record::record_len(rest) {
                Some(len) if len > MAX_RECORD => return Err(self.fail(RecordError::Overflow)),
                Some(len) if len <= rest.len() => len,
                want => return Ok(Received::More { taken, want }),
            };
            let opened = match traffic.records.open(&mut rest[..len]) {
                Ok(opened) => opened,
                Err(e) => return Err(self.fail(e)),
            };
            let payload = &rest[opened.payload.clone()];
            if opened.content_type != content::HANDSHAKE && traffic.post_handshake.is_partial() {
                // Handshake messages must not be interleaved with other records (§5.1).
                return Err(self.fail(RecordError::Unexpected));
            }
            match opened.content_type {
                content::APPLICATION_DATA if payload.is_empty() => {}
                content::APPLICATION_DATA => {
                    traffic.control_without_data = 0;
                    return Ok(Received::Data {
                        data: taken + opened.payload.start..taken + opened.payload.end,
                        taken: taken + len,
                    });
                }
                content::ALERT if payload == [1, alert::CLOSE_NOTIFY] => {
                    self.peer_closed = true;
                    return Ok(Received::Closed { taken: taken + len });
                }
                content::ALERT if payload.len() == 2 => {
                    self.phase = Phase::Dead;
                    return Err(TlsFailure::PeerAlert);
                }
                content::HANDSHAKE => {
                    let tls13 = traffic.records.protection() == Protection::Tls13;
                    let done = match traffic.post_handshake.read(tls13, payload) {
                        Ok(message) => message,
                        Err(e) => return Err(self.fail(e)),
                    };
                    if let Some(message) = done {
                        if let Err(e) = post_handshake(traffic, message, &mut self.control) {
                            return Err(self.fail(e));
                        }
                    }
                }
                // A malformed alert, anything else.
                _ => return Err(self.fail(RecordError::Unexpected)),
            }
            taken += len;
        }
    }

    /// Sends `alert` (when keys allow) and kills the session.
    fn fail(&mut self, e: RecordError) -> TlsFailure {
        if let Phase::Traffic(traffic) = &mut self.phase {
            if !traffic.records.tx_exhausted() {
                traffic.records.seal_to(
                    content::ALERT,
                    &[level::FATAL, e.alert()],
                    &mut self.control,
                );
            }
        }
        self.phase = Phase::Dead;
        TlsFailure::BadRecord
    }

    fn handshake(&mut self, input: &mut [u8]) -> Result<Received, TlsFailure> {
        let mut taken = 0;
        loop {
            let Phase::Handshake(conn) = &mut self.phase else {
                unreachable!("handshake after the handshake")
            };
            // Gathered messages while whole ones are ready, else the records shown so far.
            let mut from_gathered = false;
            let status = match self.gathered.as_deref_mut().filter(|g| g.has_ready()) {
                Some(gathered) => {
                    from_gathered = true;
                    conn.process_tls_records(gathered.ready_mut())
                }
                None => conn.process_tls_records(&mut input[taken..taken + self.shown]),
            };
            let discard = status.discard;
            let step = match status.state {
                Err(e) => Step::Failed(e),
                Ok(ConnectionState::EncodeTlsData(mut data)) => {
                    self.spoke = true;
                    encode(&mut data, &mut self.control);
                    Step::Again
                }
                // Records are sent in the order they were made: what was encoded goes out
                // before anything made later.
                Ok(ConnectionState::TransmitTlsData(data)) => {
                    data.done();
                    Step::Again
                }
                Ok(ConnectionState::WriteTraffic(_)) => Step::MaySend,
                Ok(ConnectionState::BlockedHandshake) => Step::NeedsInput,
                Ok(ConnectionState::PeerClosed | ConnectionState::Closed) => Step::PeerClosed,
                // Data before the handshake completed: never shown to rustls, no 0-RTT.
                Ok(_) => Step::Failed(rustls::Error::General("data in the handshake".into())),
            };
            if let Some(gathered) = self.gathered.as_mut().filter(|_| from_gathered) {
                gathered.discard(discard);
                if gathered.is_empty() {
                    self.gathered = None;
                }
            } else {
                taken += discard;
                self.shown -= discard;
            }
            let needs_input = match step {
                Step::Again => false,
                Step::NeedsInput => true,
                // While handshaking, 0.5-RTT data may be sent but the client's Finished has
                // not come yet.
                Step::MaySend if conn.is_handshaking() => true,
                Step::MaySend => {
                    self.establish()?;
                    return Ok(Received::More { taken, want: None });
                }
                Step::PeerClosed => {
                    self.phase = Phase::Dead;
                    return Ok(Received::Closed { taken: input.len() });
                }
                Step::Failed(e) => return Err(self.handshake_failed(&e)),
            };
            if needs_input {
                if self.gathered.as_ref().is_some_and(|g| g.has_ready()) {
                    // rustls waits for more of a message it was given whole: cannot happen.
                    self.phase = Phase::Dead;
                    return Err(TlsFailure::Other);
                }
                if let Some(wait) = self.next_input(input, &mut taken)? {
                    return Ok(wait);
                }
            }
        }
    }

    /// Readies what rustls is shown next: the next whole record, or (plaintext handshake
    /// records) the record's payload gathered, and the message it completes if any. `Some`:
    /// wait for more input.
    fn next_input(
        &mut self,
        input: &mut [u8],
        taken: &mut usize,
    ) -> Result<Option<Received>, TlsFailure> {
        loop {
            let before = *taken;
            if let Some(wait) = self.next_record(input, taken)? {
                return Ok(Some(wait));
            }
            // A record gathered that completes no message gives rustls nothing new to look
            // at: on to the next (a hello in 1-byte records is not 64 Ki turns of rustls).
            let gathered_only =
                *taken > before && self.gathered.as_ref().is_some_and(|g| !g.has_ready());
            if !gathered_only {
                return Ok(None);
            }
        }
    }

    /// One step of [`Self::next_input`]: the next record shown or gathered.
    fn next_record(
        &mut self,
        input: &mut [u8],
        taken: &mut usize,
    ) -> Result<Option<Received>, TlsFailure> {
        let at = *taken + self.shown;
        let Some(len) = record::record_len(&input[at..]) else {
            let want = Some(self.shown + HEADER);
            return Ok(Some(Received::More {
                taken: *taken,
                want,
            }));
        };
        let Phase::Handshake(conn) = &self.phase else {
            unreachable!()
        };
        let tls13 = conn.protocol_version() == Some(ProtocolVersion::TLSv1_3);
        let content_type = input[at];
        let body = len - HEADER;
        // Plaintext handshake records are gathered, unless rustls holds part of a record
        // already (TLS 1.3's are never encrypted under this type; TLS 1.2's are after CCS).
        let gather = self.shown == 0
            && content_type == content::HANDSHAKE
            && (1..=MAX_PLAINTEXT).contains(&body)
            && (tls13 || !self.ccs_seen);
        let gathering = self.gathered.is_some();
        if !gather && gathering {
            // Another record inside a message (RFC 8446 §5.1, RFC 5246 §6.2.1).
            return Err(self.refuse(alert::UNEXPECTED_MESSAGE, &mut input[*taken..]));
        }
        if !gather && len > MAX_RECORD {
            // rustls refuses an oversized record by its header, with the right alert.
            self.shown = input.len() - *taken;
            return Ok(None);
        }
        if !gather && self.shown + len > MAX_HANDSHAKE_INPUT {
            // A message cut into so many records that they would not fit: refused as rustls
            // refuses a record too long to hold.
            return Err(self.refuse(alert::DECODE_ERROR, &mut input[*taken..]));
        }
        if at + len > input.len() {
            let want = Some(self.shown + len);
            return Ok(Some(Received::More {
                taken: *taken,
                want,
            }));
        }
        let record = &input[at..at + len];
        if !gather {
            self.ccs_seen |= content_type == content::CHANGE_CIPHER_SPEC;
            self.shown += len;
            return Ok(None);
        }
        let payload = &record[HEADER..];
        if !gathering && gather::whole_messages(payload) {
            // The usual case: whole messages in their record, which rustls takes as it is.
            self.shown += len;
            return Ok(None);
        }
        let gathered = self.gathered.get_or_insert_with(Box::default);
        if gathered.push([record[1], record[2]], payload).is_err() {
            return Err(self.refuse(alert::DECODE_ERROR, &mut input[*taken..]));
        }
        *taken += len;
        Ok(None)
    }

    /// Refuses the handshake with `description`. Before rustls has sent anything no keys are
    /// in use, and the alert goes in plaintext. After, only rustls can seal it: it is shown
    /// the next record's header (at `input[shown..]`) made oversized, and refuses that with
    /// decode_error, sealed as its keys require.
    fn refuse(&mut self, description: u8, input: &mut [u8]) -> TlsFailure {
        if !self.spoke {
            self.control
                .extend_from_slice(&plaintext_alert(description));
            self.phase = Phase::Dead;
            return TlsFailure::BadRecord;
        }
        let header = self.shown..self.shown + HEADER;
        input[header.start + 3..header.end].copy_from_slice(&[0xff, 0xff]);
        if let Phase::Handshake(conn) = &mut self.phase {
            if let Err(e) = conn.process_tls_records(&mut input[..header.end]).state {
                return self.handshake_failed(&e);
            }
        }
        self.phase = Phase::Dead;
        TlsFailure::BadRecord
    }

    /// Collects the alert rustls queued on a failed handshake, then kills the session.
    /// Only while something is queued: rustls hands that out before it looks at any input,
    /// and looking at input again after an error would process it a second time. Some of
    /// rustls's refusals queue no alert (a handshake message over its size limit, records
    /// interleaved with a message, a run of empty records): while nothing was sent yet, the
    /// alert goes in plaintext from here.
    fn handshake_failed(&mut self, error: &rustls::Error) -> TlsFailure {
        let mut alerted = false;
        if let Phase::Handshake(conn) = &mut self.phase {
            while conn.wants_write() {
                match conn.process_tls_records(&mut []).state {
                    Ok(ConnectionState::EncodeTlsData(mut data)) => {
                        alerted = true;
                        encode(&mut data, &mut self.control)
                    }
                    _ => break,
                }
            }
        }
        if !alerted && !self.spoke {
            let description = match error {
                rustls::Error::InvalidMessage(_) => Some(alert::DECODE_ERROR),
                rustls::Error::PeerMisbehaved(_) => Some(alert::UNEXPECTED_MESSAGE),
                _ => None,
            };
            if let Some(description) = description {
                self.control
                    .extend_from_slice(&plaintext_alert(description));
            }
        }
        self.phase = Phase::Dead;
        TlsFailure::of(error)
    }

    /// The handshake completed and everything rustls had to say is in `control`: rustls
    /// keeps the key schedule, the records are ours.
    fn establish(&mut self) -> Result<(), TlsFailure> {
        let Phase::Handshake(conn) = mem::replace(&mut self.phase, Phase::Dead) else {
            unreachable!()
        };
        self.alpn = conn.alpn_protocol().map(Box::from);
        self.resumed = conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        let (secrets, kernel) = conn
            .dangerous_into_kernel_connection()
            .map_err(|e| TlsFailure::of(&e))?;
        let protection = match (kernel.protocol_version(), &secrets.tx.1) {
            (ProtocolVersion::TLSv1_3, _) => Protection::Tls13,
            (_, rustls::ConnectionTrafficSecrets::Chacha20Poly1305 { .. }) => {
                Protection::Tls12ChaCha
            }
            _ => Protection::Tls12Gcm,
        };
        let limit = match kernel.negotiated_cipher_suite() {
            SupportedCipherSuite::Tls13(suite) => suite.common.confidentiality_limit,
            SupportedCipherSuite::Tls12(suite) => suite.common.confidentiality_limit,
        };
        let records = RecordLayer::new(protection, secrets.tx, secrets.rx, limit)
            .map_err(|_| TlsFailure::NoSharedParams)?;
        self.phase = Phase::Traffic(Box::new(Traffic {
            kernel,
            records,
            post_handshake: PostHandshake::default(),
            control_without_data: 0,
        }));
        Ok(())
    }

    /// Moves the control records waiting (see [`Self::wants_write`]) into `out`, as many
    /// bytes as fit; returns how many.
    pub fn take_control(&mut self, out: &mut [u8]) -> usize {
        let n = self.control.len().min(out.len());
        out[..n].copy_from_slice(&self.control[..n]);
        if n == self.control.len() {
            // Handshake flights are kilobytes: an established session keeps no buffer.
            self.control = Vec::new();
        } else {
            self.control.drain(..n);
        }
        n
    }

    /// Control records wait to be sent.
    pub fn wants_write(&self) -> bool {
        !self.control.is_empty()
    }

    /// The room a record of application data needs before and after its plaintext, while
    /// the session may seal one (established, not closed, keys not exhausted).
    pub fn record_frame(&self) -> Option<(usize, usize)> {
        match &self.phase {
            Phase::Traffic(t) if !self.close_queued && !t.records.tx_exhausted() => {
                Some((t.records.front(), t.records.back()))
            }
            _ => None,
        }
    }

    /// Seals the record of application data laid out at `record`'s start, as
    /// [`Self::record_frame`] says, with `len` bytes of plaintext (at most
    /// [`record::MAX_PLAINTEXT`]); returns its length. Call [`Self::take_control`] after: a
    /// key that reaches its limit is updated here, and the update must follow this record.
    pub fn seal(&mut self, record: &mut [u8], len: usize) -> usize {
        let Phase::Traffic(traffic) = &mut self.phase else {
            panic!("sealing without keys")
        };
        let n = traffic.records.seal(content::APPLICATION_DATA, record, len);
        if traffic.records.tx_update_due() && traffic.records.protection() == Protection::Tls13 {
            // Our own key update; TLS 1.2 cannot, and stops sealing (the connection closes).
            if send_key_update(traffic, &mut self.control).is_err() {
                self.phase = Phase::Dead;
            }
        }
        n
    }

    /// Queues close_notify (once, established sessions only); it goes out with the control
    /// records.
    pub fn close(&mut self) {
        if let Phase::Traffic(t) = &mut self.phase {
            if !self.close_queued && !t.records.tx_exhausted() {
                t.records
                    .seal_to(content::ALERT, &[1, alert::CLOSE_NOTIFY], &mut self.control);
            }
        }
        self.close_queued = true;
    }

    pub fn is_handshaking(&self) -> bool {
        matches!(self.phase, Phase::Handshake(_))
    }

    /// The ALPN protocol agreed on, if any (known once established).
    pub fn alpn(&self) -> Option<&[u8]> {
        self.alpn.as_deref()
    }

    /// True when this session was resumed from a ticket.
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    #[cfg(test)]
    pub(crate) fn set_tx_limit(&mut self, limit: u64) {
        if let Phase::Traffic(t) = &mut self.phase {
            t.records.set_tx_limit(limit);
        }
    }
}

/// A fatal alert record in plaintext (before any keys are in use).
fn plaintext_alert(description: u8) -> [u8; HEADER + 2] {
    [content::ALERT, 3, 3, 0, 2, level::FATAL, description]
}

/// Encodes a handshake flight (or an alert) into `control`.
fn encode(
    data: &mut rustls::unbuffered::EncodeTlsData<'_, ServerConnectionData>,
    control: &mut Vec<u8>,
) {
    let at = control.len();
    let need = match data.encode(&mut []) {
        Err(EncodeError::InsufficientSize(InsufficientSizeError { required_size })) => {
            required_size
        }
        _ => return,
    };
    control.resize(at + need, 0);
    match data.encode(&mut control[at..]) {
        Ok(n) => control.truncate(at + n),
        Err(_) => control.truncate(at),
    }
}

/// Acts on a whole post-handshake message: a key update (ours too if asked), or a declined
/// renegotiation (a warning, RFC 5246 §7.2.2: the connection goes on).
fn post_handshake(
    traffic: &mut Traffic,
    message: Message,
    control: &mut Vec<u8>,
) -> Result<(), RecordError> {
    traffic.control_without_data += 1;
    if traffic.control_without_data > CONTROL_WITHOUT_DATA {
        return Err(RecordError::Unexpected);
    }
    let also_ours = match message {
        Message::KeyUpdate { also_ours } => also_ours,
        Message::Renegotiation => {
            if !traffic.records.tx_exhausted() {
                traffic.records.seal_to(
                    content::ALERT,
                    &[level::WARNING, alert::NO_RENEGOTIATION],
                    control,
                );
            }
            return Ok(());
        }
    };
    let rx = traffic
        .kernel
        .update_rx_secret()
        .map_err(|_| RecordError::Unexpected)?;
    traffic
        .records
        .set_rx(rx)
        .map_err(|_| RecordError::Unexpected)?;
    if also_ours {
        send_key_update(traffic, control)?;
    }
    Ok(())
}

/// Seals a KeyUpdate (not asking for the peer's) under the current key, then changes it
/// (RFC 8446 §4.6.3).
fn send_key_update(traffic: &mut Traffic, control: &mut Vec<u8>) -> Result<(), RecordError> {
    traffic
        .records
        .seal_to(content::HANDSHAKE, &[24, 0, 0, 1, 0], control);
    let tx = traffic
        .kernel
        .update_tx_secret()
        .map_err(|_| RecordError::Unexpected)?;
    traffic
        .records
        .set_tx(tx)
        .map_err(|_| RecordError::Unexpected)
}

#[cfg(test)]
mod tests;
