//! tern-gate: an auth gateway against AI scrapers (layer 5, sites and apps).
//!
//! Everything a client proves is carried in signed, stateless tokens: a session cookie after a
//! login or a solved challenge, a challenge for proof of work, a CSRF token for the login form.
//! They are MACed with a persistent keyring (`keyring.rs`), so sessions survive restarts and
//! several nodes sharing the key file accept each other's tokens.
//!
//! - `keyring.rs`: the 0600 key file, rotation with overlap, HMAC-SHA256 per purpose.
//! - `token.rs`: session tokens (realm, user, times, key id, realm version, client prefix,
//!   user agent, and the proof that earned them).
//! - `pow.rs`: proof-of-work and time-lock challenges, their verification, the replay set.
//! - `csrf.rs`: stateless login/logout form tokens and the Origin / Sec-Fetch-Site check.
//! - `redirect.rs`: the only places a login or a challenge may send a browser back to.
//! - `policy.rs`: the bot policy, ordered rules compiled once at load.
//! - `pages.rs` and `assets/`: the login, challenge, time-lock and deny pages and the solver.

pub mod checkers;
pub mod config;
pub mod csrf;
mod endpoints;
pub mod form;
mod guard;
pub mod keyring;
pub mod limits;
pub mod pages;
mod path;
pub mod policy;
pub mod pool;
pub mod pow;
mod prefix;
pub mod redirect;
mod state;
pub mod stats;
pub mod token;

pub use prefix::Prefix;
pub use state::{Gate, Loaded, Mode};
