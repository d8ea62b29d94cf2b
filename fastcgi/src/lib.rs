//! FastCGI 1.0 as a client in the responder role (what PHP-FPM speaks), without I/O: the
//! caller's bytes go in, records come out into its buffers, and the application's records
//! are read into events. Hand-written because the protocol is small and the crates that speak
//! it are async (tokio) clients, while tern drives every upstream from its own event loop.
//!
//! - [`record`]: the 8-byte record header and the request's records (`BEGIN_REQUEST`,
//!   `PARAMS`, `STDIN`), split at the 65 535-byte record limit.
//! - [`params`]: name-value pairs, and which HTTP header fields become `HTTP_*` parameters
//!   (never `Proxy`, never a name with `_`: two spellings must not become one parameter).
//! - [`answer`]: the application's records in, `STDOUT`/`STDERR` bytes and the end out,
//!   streamed (a record's content is handed on as it arrives, never buffered whole).
//! - [`cgi`]: the CGI response head at the start of `STDOUT` (RFC 3875 §6): `Status`,
//!   `Location`, header fields checked like an upstream's.
//! - [`http1`]: the whole answer re-expressed as HTTP/1.1 bytes as it arrives (a sized body
//!   as it is, an unsized one chunked), for the proxy's one answer path.
//!
//! The spec: <https://fastcgi-archives.github.io/FastCGI_Specification.html>.

pub mod answer;
pub mod cgi;
pub mod http1;
pub mod params;
pub mod record;

pub use answer::{AnswerError, AnswerReader, Event, ProtocolStatus};
pub use cgi::{CgiError, CgiHead, CgiHeadParser};
pub use http1::{Http1Answer, TranslateError};
pub use params::{http_param_name, Params};
pub use record::{abort_request, begin_request, stdin, RecordType, HEADER_LEN, MAX_CONTENT};

/// The request id a client uses when it sends one request per connection at a time (as tern
/// does: PHP-FPM does not multiplex either).
pub const REQUEST_ID: u16 = 1;
