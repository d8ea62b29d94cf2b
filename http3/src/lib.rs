//! Sans-IO HTTP/3 for tern (RFC 9114, RFC 9204 without a dynamic table, RFC 9220): stream
//! bytes in, events out, frames written into caller buffers. No QUIC, sockets, threads or
//! clocks: the QUIC layer (quinn-proto, see /work/shared/notes/http3.md) owns streams and
//! hands their bytes here; every rule about bad input lives here.

pub mod connection;
pub mod frame;
pub mod qpack;
pub mod varint;

pub use connection::{Config, ConnError, Connection, Event};
pub use frame::ErrorCode;

#[cfg(test)]
mod tests;
