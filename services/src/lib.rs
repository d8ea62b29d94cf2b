//! tern-services: the shared services apps build on (layer 4 in ARCHITECTURE.md's map).
//!
//! - [`snapshot`]: bytes many requests read, rebuilt off the request path and swapped
//!   atomically, with a gzip variant made once, ETag/Last-Modified and 304s.
//! - [`handoff`]: a bounded queue from workers to a background thread whose full state the
//!   handler sees at once (answer 503, never wait for room).
//! - [`ratelimit`]: token buckets per network prefix (/24, /48), one byte each.
//! - [`client_addr`]: the client's address, trusting forwarding headers only from configured
//!   proxies.
//! - [`template`]: values with variables (`$client`, `$uri`...) for `tern run`'s config.
//! - [`metrics`]: /statusz and /metrics pages from per-worker counters.

pub mod background;
pub mod client_addr;
pub mod handoff;
pub mod metrics;
pub mod ratelimit;
pub mod snapshot;
pub mod template;

pub use client_addr::TrustedProxies;
pub use handoff::{handoff, HandoffReceiver, HandoffSender};
pub use metrics::{AppCounters, Metric, MetricKind};
pub use ratelimit::{PrefixLimiter, RateDecision, RateLimitConfig, RateVerdict};
pub use snapshot::{Snapshot, SnapshotCell};
