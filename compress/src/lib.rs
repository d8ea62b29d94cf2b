//! On-the-fly compression of answers, sans-IO: which content coding a client gets
//! ([`negotiate`], RFC 9110 §12.5.3), whether an answer may be compressed at all
//! ([`Policy::decide`]), the header edits a compressed answer needs ([`weak_etag`],
//! [`vary_with_accept_encoding`]), and a streaming [`Encoder`] whose memory is bounded and
//! whose output can be flushed whenever the producer has nothing more for now.
//!
//! The server uses it for fixed answers and for proxied ones (`server/src/compression.rs`,
//! `server/src/conn/relay/answer.rs`); static files keep their cached variants
//! (`server/src/static_files/encoding.rs`), negotiated with the same [`negotiate`].

mod accept;
mod budget;
mod copies;
mod encoder;
mod policy;

pub use accept::negotiate;
pub use budget::{Budget, Charge};
pub use copies::EncodedCopies;
pub use encoder::{
    EncodeError, Encoder, Levels, BROTLI_LGWIN, BROTLI_QUALITY, GZIP_LEVEL, ZSTD_LEVEL,
    ZSTD_WINDOW_LOG,
};
pub use policy::{
    no_transform, vary_with_accept_encoding, weak_etag, Answer, Decision, Policy, DEFAULT_MIN_SIZE,
    DEFAULT_TYPES,
};

/// A content coding tern can produce on the fly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    Gzip,
    Br,
    Zstd,
}

impl Encoding {
    pub const ALL: [Encoding; 3] = [Encoding::Gzip, Encoding::Br, Encoding::Zstd];

    /// The token in Content-Encoding and Accept-Encoding (and in the config's list).
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Gzip => "gzip",
            Encoding::Br => "br",
            Encoding::Zstd => "zstd",
        }
    }

    /// The coding a config entry names (exactly as [`Encoding::name`] spells it).
    pub fn from_name(name: &str) -> Option<Encoding> {
        Encoding::ALL.into_iter().find(|e| e.name() == name)
    }

    /// A small index (0, 1, 2) for per-coding counters.
    pub fn index(self) -> usize {
        self as usize
    }
}
