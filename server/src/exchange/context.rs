//! What an exchange runs with: the context a connection lends it ([`ConnCx`], what it borrows
//! of its worker), the worker's clock with its `Date` line ([`WorkerClock`]), who the
//! connection is ([`Link`]), and what its answer needs to know of the request ([`Facts`]). A
//! leaf of the exchange layer: the other files of `exchange/` import it.

use std::net::{IpAddr, SocketAddr};
use std::ops::Deref;

use tern_codec::{format_date_line, DATE_LINE_LEN};
use tern_runtime::{BufPool, Clock, InboxSender};

use crate::access_log::WorkerLog;
use crate::bans::{self, BanCause, Bans};
use crate::config::ServerConfig;
use crate::handler::{ExchangeId, WorkerMessage};
use crate::router::Router;
use crate::stats::{Tally, WorkerStats};

/// Borrowed worker state a connection needs while it runs (the worker builds one per event).
pub(crate) struct ConnCx<'a> {
    pub router: &'a Router,
    /// Automatic HTTPS: HTTP-01 answers on plain listeners (`None` without ACME).
    pub acme: Option<&'a tern_tls::AcmeCerts>,
    /// Where strikes and dropped connections add bans (`Server::with_bans`).
    pub bans: Option<&'a Bans>,
    /// The lines answers over TLS carry: `Strict-Transport-Security: ...\r\n` (`--hsts`)
    /// and `Alt-Svc: h3=...\r\n` (HTTP/3 on), each ending in CRLF.
    pub secure_lines: Option<&'a [u8]>,
    /// The worker's settings in force (timeouts, limits; changed by reloads between turns).
    pub config: &'a ServerConfig,
    pub stats: &'a WorkerStats,
    pub clock: &'a WorkerClock<'a>,
    pub buffers: &'a mut BufPool,
    /// The worker's access log, if there is one: every answer is recorded there.
    pub access_log: Option<&'a mut WorkerLog>,
    pub inbox: &'a InboxSender<WorkerMessage>,
    pub worker_id: usize,
    /// A stop was requested: no answer keeps its connection alive.
    pub stopping: bool,
    pub draining: bool,
    /// The worker is near its connection limit: answer, but do not keep alive.
    pub near_limit: bool,
}

impl ConnCx<'_> {
    /// An answer with `status` is complete: its class and its duration are counted (one
    /// clock read, the same vDSO call as an access log's duration).
    #[inline]
    pub fn answered(&self, status: u16, tally: Tally) {
        self.stats.answered(status, tally, self.clock.precise_us());
    }

    /// A strike (slow request head) or a dropped connection from `ip`: may add a ban.
    pub fn record_ban(&self, ip: IpAddr, cause: BanCause) {
        if let Some(bans) = self.bans {
            bans::record(bans, self.stats, self.clock, ip, cause);
        }
    }
}

/// A worker's `Date: ...\r\n` line, formatted again only when the second changes (the
/// runtime's clock keeps time, and knows nothing of HTTP), so an answer never pays for date
/// formatting.
pub(crate) struct DateLine {
    unix_secs: u64,
    line: [u8; DATE_LINE_LEN],
}

impl DateLine {
    pub fn new(unix_secs: u64) -> DateLine {
        DateLine {
            unix_secs,
            line: format_date_line(unix_secs),
        }
    }

    /// The line for `unix_secs`, formatted if the second changed since the last call.
    #[inline]
    pub fn at(&mut self, unix_secs: u64) -> &DateLine {
        if unix_secs != self.unix_secs {
            *self = DateLine::new(unix_secs);
        }
        self
    }
}

/// The worker's clock as a connection sees it: the runtime's [`Clock`] (which it derefs to)
/// and the `Date` line of the clock's current second.
pub(crate) struct WorkerClock<'a> {
    pub clock: &'a Clock,
    pub date: &'a DateLine,
}

impl WorkerClock<'_> {
    /// The `Date: ...\r\n` line for the current second.
    #[inline]
    pub fn date_line(&self) -> &[u8] {
        debug_assert_eq!(self.date.unix_secs, self.clock.unix_secs());
        &self.date.line
    }

    /// The current second's date alone (what HTTP/2 and HTTP/3 send as `date`): the `Date`
    /// line without its name and CRLF.
    #[inline]
    pub fn date_value(&self) -> &[u8] {
        let line = self.date_line();
        &line[b"Date: ".len()..line.len() - 2]
    }
}

impl Deref for WorkerClock<'_> {
    type Target = Clock;

    fn deref(&self) -> &Clock {
        self.clock
    }
}

/// Who the connection is, for exchanges.
pub(crate) struct Link {
    pub peer: SocketAddr,
    pub key: u64,
    /// Over TLS (HSTS goes on answers).
    pub secure: bool,
    /// The bound port of the listener it came in on.
    pub local_port: u16,
    /// A `--redirect-http` listener: every request is answered 308 to this https port.
    pub redirect_to_https: Option<u16>,
}

impl Link {
    /// The lines answers on this connection carry over TLS (HSTS, Alt-Svc; see
    /// [`ConnCx::secure_lines`]).
    pub fn secure_lines<'s>(&self, cx: &ConnCx<'s>) -> Option<&'s [u8]> {
        cx.secure_lines.filter(|_| self.secure)
    }
}

/// What an exchange's answer needs to know of its request, whatever the protocol.
#[derive(Clone, Copy)]
pub(crate) struct Facts {
    pub id: ExchangeId,
    /// A HEAD request: the answer has no body.
    pub head_only: bool,
    /// The client may keep its connection for another exchange after this one (HTTP/2:
    /// always; its streams end on their own).
    pub keep_alive: bool,
    /// An HTTP/1.0 client (no chunking; keep-alive said explicitly).
    pub http10: bool,
    /// What its answer is counted under.
    pub tally: Tally,
}

impl Facts {
    /// An answer the server sends on its own (bad input, a timeout), after which the
    /// connection closes.
    pub fn own_answer(id: ExchangeId, now_us: u64) -> Facts {
        Facts {
            id,
            head_only: false,
            keep_alive: false,
            http10: false,
            tally: Tally::starting(now_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_line_follows_the_clock_second() {
        let mut clock = Clock::manual(1_000_000_000);
        let mut date = DateLine::new(0);
        let first = WorkerClock {
            clock: &clock,
            date: date.at(clock.unix_secs()),
        }
        .date_line()
        .to_vec();
        assert_eq!(first, format_date_line(1_000_000_000));
        assert!(first.starts_with(b"Date: ") && first.ends_with(b"\r\n"));
        clock.advance_ms(999);
        let line = date.at(clock.unix_secs()).line;
        assert_eq!(line[..], first[..], "still the same second");
        clock.advance_ms(1);
        let line = date.at(clock.unix_secs()).line;
        assert_eq!(line, format_date_line(1_000_000_001));
    }
}
