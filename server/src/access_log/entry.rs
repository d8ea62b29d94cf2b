//! What an answer's line says of its request ([`LogEntry`], borrowing the request head), and
//! the copy kept while a reply is pending ([`SavedEntry`]).

use std::net::{IpAddr, SocketAddr};

use tern_codec::Version;

use crate::handler::LogTarget;
use crate::request_id::RequestId;

/// One request's part of a line. Borrows the request head.
#[derive(Clone, Copy)]
pub(crate) struct LogEntry<'a> {
    /// The log it goes to (a handler may choose: a site's own log).
    pub target: LogTarget,
    pub client: IpAddr,
    /// The worker clock's microseconds when the request was complete.
    pub start_us: u64,
    /// None: answered before a request was parsed (bad input, a timeout).
    pub request: Option<LogRequest<'a>>,
    /// Set by the handler when the request's site gives ids (`X-Request-Id`).
    pub request_id: Option<RequestId>,
    /// What a shared cache made of it ([`crate::response::Response::cache_outcome`]), on cached routes.
    pub cache: Option<crate::response::CacheOutcome>,
}

#[derive(Clone, Copy)]
pub(crate) struct LogRequest<'a> {
    pub method: &'a [u8],
    pub target: &'a [u8],
    pub version: Version,
    pub host: Option<&'a [u8]>,
    pub referer: Option<&'a [u8]>,
    pub user_agent: Option<&'a [u8]>,
}

impl<'a> LogEntry<'a> {
    /// An answer with no request (bad input refused by the codec, a timeout).
    pub fn bare(peer: SocketAddr, start_us: u64) -> LogEntry<'static> {
        LogEntry {
            target: LogTarget::DEFAULT,
            client: peer.ip().to_canonical(),
            start_us,
            request: None,
            request_id: None,
            cache: None,
        }
    }
}

/// A [`LogEntry`] kept while its reply is pending (the head it borrowed is gone by then).
/// Only deferred requests pay for this copy.
pub(crate) struct SavedEntry {
    target: LogTarget,
    client: IpAddr,
    start_us: u64,
    version: Version,
    request_id: Option<RequestId>,
    /// Set by the relay from the answer it sends (see [`LogEntry::cache`]).
    pub cache: Option<crate::response::CacheOutcome>,
    text: Vec<u8>,
    /// Method, target, host, referer, user agent: ranges of `text`.
    fields: [Option<(u32, u32)>; 5],
}

impl SavedEntry {
    /// None for an entry without a request (those are never deferred).
    pub fn save(e: &LogEntry<'_>) -> Option<Box<SavedEntry>> {
        let r = e.request?;
        let parts = [
            Some(r.method),
            Some(r.target),
            r.host,
            r.referer,
            r.user_agent,
        ];
        let mut text = Vec::with_capacity(parts.iter().flatten().map(|p| p.len()).sum());
        let fields = parts.map(|p| {
            p.map(|p| {
                let start = text.len() as u32;
                text.extend_from_slice(p);
                (start, text.len() as u32)
            })
        });
        Some(Box::new(SavedEntry {
            target: e.target,
            client: e.client,
            start_us: e.start_us,
            version: r.version,
            request_id: e.request_id,
            cache: e.cache,
            text,
            fields,
        }))
    }

    pub fn entry(&self) -> LogEntry<'_> {
        let field =
            |i: usize| self.fields[i].map(|(start, end)| &self.text[start as usize..end as usize]);
        LogEntry {
            target: self.target,
            client: self.client,
            start_us: self.start_us,
            request: Some(LogRequest {
                method: field(0).unwrap_or(b"-"),
                target: field(1).unwrap_or(b"-"),
                version: self.version,
                host: field(2),
                referer: field(3),
                user_agent: field(4),
            }),
            request_id: self.request_id,
            cache: self.cache,
        }
    }
}
