//! HPACK (RFC 7541): header compression for HTTP/2. Written by hand from the RFC: see
//! ARCHITECTURE.md for why.
//!
//! - [`Decoder`]: one per connection for the peer's header blocks; hands fields to a callback
//!   as borrowed slices and keeps its dynamic table in step even when it refuses a block.
//! - [`Encoder`]: one per connection for our header blocks.
//! - [`huffman`]: the string code of Appendix B.
//!
//! Tables: `table.rs` holds the static table (Appendix A) and the dynamic table, a ring buffer
//! evicting by the RFC's entry size (name + value + [`ENTRY_OVERHEAD`]).

mod decoder;
mod encoder;
pub mod huffman;
mod table;

pub use decoder::{DecodeError, Decoded, Decoder};
pub use encoder::{Encoder, Indexing};

/// RFC 7541 §4.1: an entry's size is name + value + 32.
pub const ENTRY_OVERHEAD: usize = 32;

/// The initial SETTINGS_HEADER_TABLE_SIZE (RFC 9113 §6.5.2), and the most our encoder uses.
pub(crate) const DEFAULT_TABLE_SIZE: usize = 4096;
