//! Compressed copies of a body kept by whoever made the body (a cache entry), so that an
//! answer sent to many clients is compressed once per coding.

use bytes::Bytes;

use crate::Encoding;

/// Where a body's compressed copies are kept: the compression of a fixed answer sends a
/// kept copy instead of compressing, and offers the copy it makes for keeping.
pub trait EncodedCopies: Send + Sync {
    fn get(&self, coding: Encoding) -> Option<Bytes>;
    /// Keeps `body` as the copy in `coding`, if there is room and none is kept yet.
    fn keep(&self, coding: Encoding, body: &Bytes);
}

impl std::fmt::Debug for dyn EncodedCopies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EncodedCopies")
    }
}
