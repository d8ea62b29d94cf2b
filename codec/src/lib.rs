//! tern-codec: the sans-IO HTTP/1.1 layer.
//!
//! Bytes in, events out. Nothing here touches a socket, a thread or a clock: the caller hands
//! in buffers (and the pre-formatted `Date` line), and gets back parsed request heads, decoded
//! body bytes, or a precise [`RequestError`] that says which status to answer with. Every rule
//! about bad input lives in this crate so that it can be unit-tested and fuzzed on byte slices.

mod body;
mod date;
mod error;
mod path;
mod request;
mod response;
mod upstream;

pub use body::{is_token, BodyDecoder, BodyKind, ChunkedDecoder, Decoded};
pub use date::{format_date_line, DATE_LINE_LEN};
pub use error::RequestError;
pub use path::{
    canonical_path, canonical_path_opaque_slash, decoded as decoded_path, has_encoded_slash,
    path_under, PathError,
};
pub use request::{
    first_line, head_from_fields, parse_request, trim_ows, FirstLine, Limits, Method, Parsed,
    RequestHead, Version, MAX_HEADERS_DEFAULT,
};
pub use response::{reason_phrase, ConnectionHeader, ResponseHead, CONTINUE_100};
pub use upstream::{
    connection_lists, parse_upstream_head, ResponseBody, UpstreamError, UpstreamHead,
};
