//! The QUIC transport's settings, from the server's limits: what a client may open and send
//! before anything of it is answered (RFC 9000 §4 flow control, §18 transport parameters).

use std::sync::Arc;
use std::time::Duration;

use quinn_proto::crypto::rustls::QuicServerConfig;
use quinn_proto::{IdleTimeout, TransportConfig, VarInt};

use crate::config::ServerConfig;

/// Request streams a client may have open at once (h2o's and HTTP/2's 100).
const BIDI_STREAMS: u32 = 100;
/// Its control stream and the two QPACK streams: any other unidirectional stream is read
/// and dropped (RFC 9114 §6.2), so more are not needed.
const UNI_STREAMS: u32 = 3;
/// One stream's receive window: a request body may be this far ahead of what was read.
const STREAM_WINDOW: u32 = 256 * 1024;
/// The connection's receive window: 16 streams' worth, not the 100 streams' (quinn's own
/// default has no connection limit).
const CONN_WINDOW: u32 = 16 * STREAM_WINDOW;
/// Answer bytes buffered per connection ahead of the client's acknowledgements.
const SEND_WINDOW: u64 = 2 * 1024 * 1024;
/// Initials buffered for a handshake not yet accepted, per connection and in all.
const INCOMING_BUFFER: u64 = 64 * 1024;
const INCOMING_TOTAL: u64 = 8 * 1024 * 1024;
/// Handshakes queued in an endpoint before new ones are refused.
const MAX_INCOMING: usize = 4096;

/// The quinn server configuration for `tls` (TLS 1.3, ALPN `h3`, tern's certificates).
pub(crate) fn server_config(
    tls: Arc<rustls::ServerConfig>,
    config: &ServerConfig,
) -> Result<Arc<quinn_proto::ServerConfig>, String> {
    let crypto = QuicServerConfig::try_from(tls).map_err(|e| format!("HTTP/3: {e}"))?;
    let mut transport = TransportConfig::default();
    let idle = config.idle_timeout.min(Duration::from_secs(60));
    transport
        .max_concurrent_bidi_streams(VarInt::from_u32(BIDI_STREAMS))
        .max_concurrent_uni_streams(VarInt::from_u32(UNI_STREAMS))
        .stream_receive_window(VarInt::from_u32(STREAM_WINDOW))
        .receive_window(VarInt::from_u32(CONN_WINDOW))
        .send_window(SEND_WINDOW)
        .max_idle_timeout(IdleTimeout::try_from(idle).ok())
        // No unreliable DATAGRAM frames (RFC 9221): HTTP/3 here does not use them.
        .datagram_receive_buffer_size(None);
    let mut server = quinn_proto::ServerConfig::with_crypto(Arc::new(crypto));
    server
        .transport_config(Arc::new(transport))
        .max_incoming(MAX_INCOMING)
        .incoming_buffer_size(INCOMING_BUFFER)
        .incoming_buffer_size_total(INCOMING_TOTAL)
        .migration(true);
    Ok(Arc::new(server))
}
