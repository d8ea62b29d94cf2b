//! tern-cache: the shared HTTP cache (RFC 9111) of proxy and FastCGI routes. [`policy`]:
//! the rules on heads (what bypasses, what is stored, freshness, `Age`); [`key`]: which entry
//! a request names; [`store`]: entries in memory, bounded in bytes, with [`encoded`]: their
//! bodies' compressed copies, and [`disk`]: bodies too large for memory in a folder; [`flight`]: the fills under
//! way, which concurrent misses for one key wait for; [`purge`]: which entries an operator's
//! purge drops. The proxy handler looks up and fills through these; the server's relay only
//! copies an answer out as it writes it.

pub mod disk;
pub mod encoded;
pub mod flight;
mod front;
pub mod key;
pub mod policy;
pub mod purge;
pub mod store;

pub use disk::{DiskBody, DiskTier, Spill};
pub use encoded::Copies;
pub use flight::{FillMark, Flight, FlightState, Flights, Join};
pub use key::{Key, KeyParts, Keyer};
pub use policy::{
    judge_answer, judge_request, AnswerFacts, Bypass, CookiePattern, CookieRule, Field, Freshness,
    KeyQuery, MethodClass, RequestFacts, RequestVerdict, Rules, Uncacheable,
};
pub use purge::{Purge, Target};
pub use store::{Entry, Store, StoredBody};
