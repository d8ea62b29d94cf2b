use std::net::SocketAddr;

use tern_codec::{Method, RequestHead};
use tern_runtime::InboxSender;

use crate::response::Response;

/// What a handler sees of a request: the parsed head (borrowing the read buffer), the complete
/// body, the peer address, and the worker's cached time.
pub struct Request<'a> {
    pub head: &'a RequestHead<'a>,
    pub body: &'a [u8],
    pub peer: SocketAddr,
    /// Arrived over TLS (so cookies can be `Secure`, `__Host-`).
    pub secure: bool,
    /// The port of the listener it arrived on (what the client's `Host` says may differ).
    pub local_port: u16,
    /// Wall-clock seconds (the worker's per-turn clock; no syscall).
    pub unix_secs: u64,
    /// Monotonic milliseconds of the worker's clock.
    pub now_ms: u64,
}

impl<'a> Request<'a> {
    pub fn method(&self) -> Method {
        self.head.method
    }

    /// The canonical path ([`RequestHead::path`]): what routes, guards and files are chosen
    /// by and what a proxy forwards. Still percent-encoded apart from unreserved characters.
    pub fn path(&self) -> &'a str {
        &self.head.path
    }

    pub fn query(&self) -> Option<&'a str> {
        self.head.query
    }

    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.head.header(name)
    }
}

/// A handler's answer: a response now, or a promise that a [`Pending`] taken from the context
/// will deliver one later (from any thread).
pub enum Reply {
    Now(Response),
    Later,
    /// Close the connection at once without answering (answers already sent for earlier
    /// pipelined requests still go out). For clients far over a rate limit: an answer would
    /// cost us more than it is worth to them.
    Drop,
    /// Relay the request to an upstream server (the reverse proxy): the connection sends
    /// the head given here, streams the body, and relays the answer.
    Forward(Box<crate::upstream::Forward>),
}

impl From<Response> for Reply {
    fn from(r: Response) -> Reply {
        Reply::Now(r)
    }
}

/// A forwarding route's way to take a request back from its app (nginx's `X-Accel-Redirect`,
/// and `proxy_intercept_errors` with `error_page CODE = /path`), given with
/// [`HandlerContext::hand_back`] beside its `Reply::Forward`: when the app's answer names
/// another path, the relay drops that answer and has the route answer the request with the
/// path instead (`conn/relay/handoff.rs` says how).
pub struct Handback {
    /// The app's `X-Accel-Redirect: /path[?query]` is followed.
    pub x_accel_redirect: bool,
    /// App answers with these statuses are replaced by the answer for the path
    /// (`reroute_status`), which may hold a query.
    pub reroute_status: std::sync::Arc<[(u16, Box<str>)]>,
    /// Answers the request again, with the path the app named (see [`Reenter`]).
    pub reenter: Reenter,
}

/// Made by the route that forwarded, owning what it needs of the request: called once, on the
/// worker, when the app hands the request back. It builds the re-routed request (the same
/// head, with the path and query of [`Handoff`], GET unless it was HEAD) and has `run` answer
/// it with the handler of its choice (its site, routed again).
pub type Reenter = Box<dyn FnOnce(&Handoff<'_>, &mut dyn Rerun) + Send>;

/// Where the app sent a request it handed back.
pub struct Handoff<'a> {
    /// Canonical (as [`tern_codec::canonical_path`] makes it; see
    /// [`crate::upstream::handoff_target`]).
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// The worker's clock now, for the request's `unix_secs` and `now_ms`.
    pub unix_secs: u64,
    pub now_ms: u64,
}

/// Runs a re-routed request's handler as any exchange's is run (its own context, under
/// `catch_unwind`, its answer compressed and counted as its route says), in place of the app's
/// answer.
pub trait Rerun {
    fn answer(
        &mut self,
        req: &Request<'_>,
        handler: &dyn Fn(&Request<'_>, &mut HandlerContext<'_>) -> Reply,
    );
}

/// One exchange (a request and its answer) of a connection, whatever the protocol: an
/// HTTP/1.1 connection's request count, an HTTP/2 stream id. 64 bits, as QUIC stream ids
/// (62 bits) will need.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExchangeId(pub u64);

/// A message a worker receives in its inbox.
pub enum WorkerMessage {
    /// A pending reply is ready for exchange `exchange` of connection `conn`.
    Complete {
        conn: u64,
        exchange: ExchangeId,
        response: Response,
    },
    /// Exchange `exchange` of connection `conn` is held (`Forward::hold`) and its hold may
    /// answer now: it is asked at once rather than at its next timer.
    Wake { conn: u64, exchange: ExchangeId },
    /// A datagram another worker's socket received for a QUIC connection of this worker (its
    /// connection ID says so: the client's address changed). Boxed: most messages are
    /// replies, and the inbox's slots are as large as its largest message.
    Datagram(Box<QuicDatagram>),
}

/// A datagram one of the HTTP/3 sockets received, with what the socket said of it.
pub struct QuicDatagram {
    /// Which of the QUIC addresses' sockets: the same index on every worker.
    pub(crate) socket: usize,
    pub(crate) remote: SocketAddr,
    /// The address it was sent to (a socket bound to a wildcard address has many).
    pub(crate) local_ip: Option<std::net::IpAddr>,
    /// The ECN bits of its IP header.
    pub(crate) ecn: Option<u8>,
    pub(crate) bytes: bytes::BytesMut,
}

/// Which of the server's access logs a line goes to (index in the order they were given),
/// or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogTarget(pub(crate) u16);

impl LogTarget {
    /// The first log (the server's only one, for `tern serve`).
    pub const DEFAULT: LogTarget = LogTarget(0);
    /// No line for this answer.
    pub const OFF: LogTarget = LogTarget(u16::MAX);

    /// The log at `index` (as given to `Server::with_access_logs`).
    pub fn log(index: usize) -> LogTarget {
        LogTarget(u16::try_from(index).unwrap_or(u16::MAX))
    }
}

/// Which row of the server's answer figures (answers by class, a duration histogram) an
/// answer is counted in: a site's own (`Stats::site`: the site's answers no route took) or a
/// route's (`Stats::route`); a handler chooses it with [`HandlerContext::count_as`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AnswerRow(pub(crate) u16);

impl AnswerRow {
    /// Answers no site took.
    pub const NONE: AnswerRow = AnswerRow(0);

    pub(crate) fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// Handed to a handler for one request. `defer()` turns the reply into a pending one.
pub struct HandlerContext<'a> {
    pub(crate) inbox: &'a InboxSender<WorkerMessage>,
    pub(crate) conn: u64,
    pub(crate) exchange: ExchangeId,
    pub(crate) deferred: bool,
    pub worker_id: usize,
    /// The access log this request's line goes to.
    pub(crate) log: LogTarget,
    /// The row of figures (its site's, its route's) this request's answer is counted in.
    pub(crate) counted_as: AnswerRow,
    /// Who a guard in front let the request through as (set by [`crate::Guarded`] only).
    pub(crate) identity: Option<crate::identity::Identity>,
    /// The request's id, when its site gives requests one (written to the access log).
    pub(crate) request_id: Option<crate::request_id::RequestId>,
    /// On-the-fly compression of this request's answer (fixed or proxied), if its site or
    /// route asks for it.
    pub(crate) compress: Option<std::sync::Arc<tern_compress::Policy>>,
    /// Why a limit in front of the handler refused the request, to be counted.
    pub(crate) refused: Option<Refusal>,
    /// What the route does when the app its `Reply::Forward` reaches hands the request back.
    pub(crate) handback: Option<Box<Handback>>,
}

/// A request a route's own limit refused (counted like the server's own refusals).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Over a rate limit: 429.
    RateLimited,
    /// A body over the route's own `max_body`: 413.
    BodyTooLarge,
    /// A path the route cannot take (an encoded slash where it is not allowed): 400,
    /// counted as the codec's `bad_path`.
    BadPath,
}

impl HandlerContext<'_> {
    /// Sends this request's access-log line to another of the server's logs (a site's own),
    /// or nowhere ([`LogTarget::OFF`]).
    pub fn log_to(&mut self, target: LogTarget) {
        self.log = target;
    }

    /// Counts the request as refused by a limit of the route's (its answer says so already).
    pub fn count_refusal(&mut self, why: Refusal) {
        self.refused = Some(why);
    }

    /// Counts this request's answer (its class, its duration) in a row of `Stats::site` or
    /// `Stats::route` rather than under no site; the last call wins.
    pub fn count_as(&mut self, row: AnswerRow) {
        self.counted_as = row;
    }

    /// The account a guard in front of this handler established, if any: a handler can
    /// trust it, since only a guard sets it (never the client).
    pub fn identity(&self) -> Option<&crate::identity::Identity> {
        self.identity.as_ref()
    }

    /// Gives the request an id: the access log writes it, and a proxy forwards it.
    pub fn set_request_id(&mut self, id: crate::request_id::RequestId) {
        self.request_id = Some(id);
    }

    /// Compresses this request's answer by `policy` (its codings, minimum size and types),
    /// or not (`None`). Deferred answers are not compressed.
    pub fn compress_with(&mut self, policy: Option<std::sync::Arc<tern_compress::Policy>>) {
        self.compress = policy;
    }

    pub fn request_id(&self) -> Option<&crate::request_id::RequestId> {
        self.request_id.as_ref()
    }

    /// With a `Reply::Forward`: the app may hand the request back (see [`Handback`]); the
    /// last call wins, and any other reply drops it.
    pub fn hand_back(&mut self, handback: Box<Handback>) {
        self.handback = Some(handback);
    }

    /// A handle that wakes this request's relay while it is held ([`HoldWaker`]).
    pub fn hold_waker(&self) -> HoldWaker {
        HoldWaker {
            inbox: self.inbox.clone(),
            conn: self.conn,
            exchange: self.exchange,
        }
    }

    /// Takes a handle that completes this request later; the handler must then return
    /// [`Reply::Later`]. The connection stays parked (no further pipelined request is
    /// processed) until the reply arrives, so answers stay in order.
    pub fn defer(&mut self) -> Pending {
        self.deferred = true;
        Pending {
            inbox: Some(self.inbox.clone()),
            conn: self.conn,
            exchange: self.exchange,
        }
    }
}

/// Wakes a held relay (`Forward::hold`) from any thread, so that its hold is asked at once
/// (a fill another request was making ended) rather than at its next timer, which stays as
/// the backstop. A wake that finds nothing held, or a full inbox, does nothing.
#[derive(Clone)]
pub struct HoldWaker {
    inbox: InboxSender<WorkerMessage>,
    conn: u64,
    exchange: ExchangeId,
}

impl HoldWaker {
    pub fn wake(&self) {
        let _ = self.inbox.send(WorkerMessage::Wake {
            conn: self.conn,
            exchange: self.exchange,
        });
    }
}

/// A reply to be completed from any thread. Dropping it unanswered sends a 500, so a
/// forgotten or panicking completion never leaves a client hanging.
pub struct Pending {
    inbox: Option<InboxSender<WorkerMessage>>,
    conn: u64,
    /// Which exchange of the connection this answers, so a stale reply is never mistaken
    /// for the answer to a later request.
    exchange: ExchangeId,
}

impl Pending {
    /// (Only the in-memory harness makes one outside a worker.)
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn new(
        inbox: InboxSender<WorkerMessage>,
        conn: u64,
        exchange: ExchangeId,
    ) -> Pending {
        Pending {
            inbox: Some(inbox),
            conn,
            exchange,
        }
    }

    /// Delivers the response to the connection's worker. Returns the response if the worker's
    /// inbox is full (the caller may retry; dropping the `Pending` would then answer 500).
    pub fn complete(mut self, response: Response) -> Result<(), (Pending, Response)> {
        let inbox = self.inbox.take().expect("pending reply completed twice");
        match inbox.send(WorkerMessage::Complete {
            conn: self.conn,
            exchange: self.exchange,
            response,
        }) {
            Ok(()) => Ok(()),
            Err(WorkerMessage::Complete { response, .. }) => {
                self.inbox = Some(inbox);
                Err((self, response))
            }
            Err(_) => unreachable!("the message sent comes back"),
        }
    }

    /// The request this reply answers, for the worker that owns it to complete it in place
    /// (no inbox message): see [`TurnEnd`].
    pub(crate) fn into_local(mut self) -> (u64, ExchangeId) {
        self.inbox = None;
        (self.conn, self.exchange)
    }

    /// Gives the reply back to the handler: for a handler that deferred, then found it can
    /// answer at once after all (a full queue) and returns `Reply::Now` instead.
    pub fn cancel(mut self) {
        self.inbox = None;
    }

    /// Completes, retrying (with a yield) while the worker's inbox is full. For background
    /// threads that must not lose an acknowledged result. An inbox that stays full for two
    /// seconds belongs to a worker that has exited (shutdown grace expired) or is wedged; the
    /// reply is then given up rather than spinning forever.
    pub fn complete_retrying(self, response: Response) {
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let mut state = (self, response);
        loop {
            match state.0.complete(state.1) {
                Ok(()) => return,
                Err(back) => {
                    if std::time::Instant::now() > give_up {
                        let (mut pending, _) = back;
                        pending.inbox = None;
                        tracing::warn!("a worker's inbox stayed full for 2 s; reply dropped");
                        return;
                    }
                    state = back;
                    std::thread::yield_now();
                }
            }
        }
    }
}

/// Work an app does at the end of each event-loop turn of each worker, after the turn's
/// events, timers and messages: the place to act once on what the turn's handlers staged
/// (write a turn's claims with one system call) and to answer those requests. Answers pushed
/// to `answers` must come from [`Pending`]s taken on this same worker (`worker`); they are
/// delivered in place, with no inbox message and no wake-up. Called once per turn, so an app
/// with nothing staged should return at once.
pub trait TurnEnd: Send + Sync + 'static {
    fn end_turn(&self, worker: usize, answers: &mut Vec<(Pending, Response)>);
}

/// Completes many replies, waking each worker once at the end rather than once per reply: a
/// writer thread finishing a batch of commits while sharing a core with the workers would
/// otherwise be preempted after every reply. Like [`Pending::complete_retrying`], it waits
/// (waking the worker) while an inbox is full, and gives a reply up after two seconds.
pub fn complete_all(replies: impl IntoIterator<Item = (Pending, Response)>) {
    let mut woken: Vec<InboxSender<WorkerMessage>> = Vec::new();
    for (mut pending, response) in replies {
        let inbox = pending.inbox.take().expect("pending reply completed twice");
        let mut msg = WorkerMessage::Complete {
            conn: pending.conn,
            exchange: pending.exchange,
            response,
        };
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while let Err(back) = inbox.send_quiet(msg) {
            if std::time::Instant::now() > give_up {
                tracing::warn!("a worker's inbox stayed full for 2 s; reply dropped");
                break;
            }
            inbox.wake();
            std::thread::yield_now();
            msg = back;
        }
        if !woken.iter().any(|w| w.same_inbox(&inbox)) {
            woken.push(inbox);
        }
    }
    for inbox in woken {
        inbox.wake();
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(inbox) = self.inbox.take() {
            let response = Response::text(500, "reply was never completed\n").close();
            let _ = inbox.send(WorkerMessage::Complete {
                conn: self.conn,
                exchange: self.exchange,
                response,
            });
        }
    }
}

/// A request handler. Runs on a worker thread: it must never block, never do disk or database
/// I/O; anything slow goes to a background thread through `cx.defer()`.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply;

    /// True if this handler takes a request body as a stream: it is then called as soon as
    /// the head is in (with an empty `body`) and must answer `Reply::Forward`, which relays
    /// the body; any other answer closes the connection after it, the body unread. Handlers
    /// that want the whole body (the default) get it in `Request::body`, up to `max_body`.
    fn streams_body(&self, _head: &RequestHead<'_>) -> bool {
        false
    }
}

/// A shared handler is a handler (a route table's entries wrapped again, e.g. in a guard).
impl Handler for std::sync::Arc<dyn Handler> {
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        (**self).handle(req, cx)
    }

    fn streams_body(&self, head: &RequestHead<'_>) -> bool {
        (**self).streams_body(head)
    }
}

impl<F> Handler for F
where
    F: Fn(&Request<'_>, &mut HandlerContext<'_>) -> Reply + Send + Sync + 'static,
{
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        self(req, cx)
    }
}
