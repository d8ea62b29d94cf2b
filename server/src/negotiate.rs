//! Content negotiation and conditional requests for responses built outside the static file
//! handler (app snapshots), with exactly the rules static files use.

use tern_codec::RequestHead;

use crate::static_files::{conditional, encoding};

/// True when the client's Accept-Encoding makes gzip better than identity (q-values honoured).
pub fn prefers_gzip(accept_encoding: Option<&[u8]>) -> bool {
    encoding::choose(accept_encoding, [true, true, false]) == encoding::GZIP
}

/// True when the request's validators say the client's copy is current (answer 304).
/// If-None-Match wins over If-Modified-Since (RFC 9110 §13.2.2). `etag` is quoted;
/// `last_modified` is the IMF-fixdate we send for `modified_secs`.
pub fn not_modified(
    head: &RequestHead<'_>,
    etag: &[u8],
    last_modified: &[u8],
    modified_secs: u64,
) -> bool {
    match (head.if_none_match, head.if_modified_since) {
        (Some(inm), _) => conditional::none_match_hits(inm, etag),
        (None, Some(ims)) => conditional::not_modified_since(ims, last_modified, modified_secs),
        (None, None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzip_preference_follows_q_values() {
        assert!(prefers_gzip(Some(b"gzip, deflate, br")));
        assert!(!prefers_gzip(Some(b"gzip;q=0")));
        assert!(!prefers_gzip(None));
        assert!(!prefers_gzip(Some(b"identity")));
    }
}
