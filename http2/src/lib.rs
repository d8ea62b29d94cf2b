//! Sans-IO HTTP/2 for tern (RFC 9113, RFC 7541, RFC 9218): bytes in, events out, frames
//! written into caller buffers. No sockets, threads or clocks; every rule about bad input
//! lives here.

pub mod frame;
pub mod hpack;
pub mod priority;
pub mod request;
pub mod session;

pub use frame::{ErrorCode, PREFACE};
pub use priority::Priority;
pub use request::{Malformed, RequestData, MAX_FIELDS};
pub use session::{Config, ConnError, Event, ResponseHeaders, Session};

#[cfg(test)]
mod tests;
