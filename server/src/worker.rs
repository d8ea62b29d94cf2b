use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use mio::event::Event;
use mio::{Interest, Token};
use tern_runtime::{Context, InboxSender, TimerKey, WorkerApp};

use crate::connection::{Conn, ConnCx, Status};
use crate::handler::WorkerMessage;
use crate::router::Router;
use crate::stats::{Counter, Stats};
use crate::ServerConfig;

/// What every worker shares, read-only (but for reloads).
pub(crate) struct Shared {
    pub router: Router,
    /// The start-up config.
    pub config: ServerConfig,
    pub stats: Stats,
    /// The config of the latest reload (its `runtime` part is the start-up one).
    pub live: ArcSwap<ServerConfig>,
    /// Bumped after `live` is stored; workers compare it once per loop turn.
    pub reloads: AtomicU64,
}

/// Connections of one worker, addressed by `generation << 32 | index`. The generation makes
/// a key (in a timer, a pending reply or a mio token) refer to one connection only, never to
/// a later one that reuses the slot. Connections are boxed so that the slot vector stays
/// small: growing it by doubling then copies 16-byte slots, not whole connections, and
/// leaves little freed-but-resident memory behind (idle connections are budgeted in bytes).
#[derive(Default)]
struct Slab {
    slots: Vec<(u32, Option<Box<Conn>>)>,
    free: Vec<u32>,
    len: usize,
}

impl Slab {
    fn insert(&mut self, make: impl FnOnce(u64) -> Conn) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.0 = slot.0.wrapping_add(1).max(1);
        let key = u64::from(slot.0) << 32 | u64::from(index);
        slot.1 = Some(Box::new(make(key)));
        self.len += 1;
        key
    }

    fn get_mut(&mut self, key: u64) -> Option<&mut Conn> {
        let (gen, conn) = self.slots.get_mut((key & 0xffff_ffff) as usize)?;
        if u64::from(*gen) == key >> 32 {
            conn.as_deref_mut()
        } else {
            None
        }
    }

    fn remove(&mut self, key: u64) -> Option<Box<Conn>> {
        let index = (key & 0xffff_ffff) as usize;
        let (gen, conn) = self.slots.get_mut(index)?;
        if u64::from(*gen) != key >> 32 {
            return None;
        }
        let conn = conn.take()?;
        self.free.push(index as u32);
        self.len -= 1;
        Some(conn)
    }

    fn keys(&self) -> Vec<u64> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, (_, c))| c.is_some())
            .map(|(i, (gen, _))| u64::from(*gen) << 32 | i as u64)
            .collect()
    }
}

/// The HTTP server on one worker thread.
pub(crate) struct HttpWorker {
    id: usize,
    shared: Arc<Shared>,
    inbox: InboxSender<WorkerMessage>,
    conns: Slab,
    /// Connections whose flush yielded to be fair to others; driven again next turn.
    yielded: Vec<u64>,
    near_limit_at: usize,
    /// This worker's copy of the settings in force (replaced on reload, between turns).
    config: Arc<ServerConfig>,
    /// The `Shared::reloads` value `config` reflects.
    seen_reloads: u64,
}

impl HttpWorker {
    pub fn new(id: usize, shared: Arc<Shared>, inbox: InboxSender<WorkerMessage>) -> HttpWorker {
        let seen_reloads = shared.reloads.load(Ordering::Acquire);
        let config = shared.live.load_full();
        let max = config.max_connections_per_worker;
        HttpWorker {
            id,
            inbox,
            conns: Slab::default(),
            yielded: Vec::new(),
            near_limit_at: max - max / 10,
            config,
            seen_reloads,
            shared,
        }
    }

    /// A reload happened since the last turn: take the new settings and drop this thread's
    /// static-file front caches (their files may come from an old root or old options).
    #[cold]
    fn apply_reload(&mut self, reloads: u64) {
        self.seen_reloads = reloads;
        self.config = self.shared.live.load_full();
        let max = self.config.max_connections_per_worker;
        self.near_limit_at = max - max / 10;
        crate::static_files::forget_thread_caches();
    }

    /// Runs `f` on the connection with its borrowed context, then applies the outcome:
    /// close it, queue it for another turn, or (re)arm its timer.
    fn with_conn(
        &mut self,
        cx: &mut Context<'_, WorkerMessage>,
        key: u64,
        f: impl FnOnce(&mut Conn, &mut ConnCx<'_>) -> Status,
    ) {
        let near_limit = self.conns.len >= self.near_limit_at;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let mut ccx = ConnCx {
            shared: &self.shared,
            config: &self.config,
            stats: self.shared.stats.worker(self.id),
            clock: cx.clock,
            buffers: cx.buffers,
            inbox: &self.inbox,
            worker_id: self.id,
            stopping: cx.stopping,
            draining: cx.draining,
            near_limit,
        };
        match f(conn, &mut ccx) {
            Status::Close => {
                self.close(cx, key);
                return;
            }
            Status::Yielded => self.yielded.push(key),
            Status::Open => {}
        }
        let (deadline, kind) = conn.next_deadline(&ccx);
        conn.deadline_ms = deadline;
        conn.mark_progress(kind);
        if deadline < conn.armed_ms {
            conn.armed_ms = deadline;
            cx.timers.schedule(key, deadline);
        }
    }

    fn close(&mut self, cx: &mut Context<'_, WorkerMessage>, key: u64) {
        if let Some(conn) = self.conns.remove(key) {
            // Dropping the stream closes the fd, which also removes it from epoll.
            conn.recycle(cx.buffers);
            self.shared
                .stats
                .worker(self.id)
                .bump(Counter::ConnectionsClosed);
        }
    }
}

impl WorkerApp for HttpWorker {
    type Message = WorkerMessage;

    fn on_accept(
        &mut self,
        cx: &mut Context<'_, WorkerMessage>,
        stream: mio::net::TcpStream,
        peer: SocketAddr,
    ) {
        let stats = self.shared.stats.worker(self.id);
        if self.conns.len >= self.config.max_connections_per_worker || cx.draining {
            stats.bump(Counter::ConnectionsRefused);
            return; // dropping the stream closes it
        }
        // Responses are written whole; Nagle would only delay the last segment.
        let _ = stream.set_nodelay(true);
        let key = self.conns.insert(|key| Conn::new(stream, peer, key));
        let conn = self.conns.get_mut(key).expect("just inserted");
        if let Err(e) = cx.registry.register(
            &mut conn.stream,
            Token(key as usize),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            tracing::warn!("register failed: {e}");
            self.conns.remove(key);
            return;
        }
        stats.bump(Counter::ConnectionsAccepted);
        // Arm the idle timer: a client that connects and sends nothing is cut off too.
        self.with_conn(cx, key, |_, _| Status::Open);
    }

    fn on_ready(&mut self, cx: &mut Context<'_, WorkerMessage>, event: &Event) {
        let key = event.token().0 as u64;
        let readable = event.is_readable() || event.is_read_closed() || event.is_error();
        self.with_conn(cx, key, |conn, ccx| conn.drive(readable, ccx));
    }

    fn on_timer(&mut self, cx: &mut Context<'_, WorkerMessage>, key: TimerKey, at_ms: u64) {
        let now = cx.clock.now_ms();
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.armed_ms != at_ms {
            return; // superseded by an earlier arm
        }
        conn.armed_ms = u64::MAX;
        if conn.deadline_ms > now {
            // The deadline moved later since this was armed: re-arm (lazy cancellation).
            conn.armed_ms = conn.deadline_ms;
            cx.timers.schedule(key, conn.deadline_ms);
            return;
        }
        self.with_conn(cx, key, |conn, ccx| {
            if conn.still_reading(ccx) {
                return Status::Open; // with_conn sets a fresh deadline and mark
            }
            conn.time_out(ccx);
            Status::Close
        });
    }

    fn on_message(&mut self, cx: &mut Context<'_, WorkerMessage>, msg: WorkerMessage) {
        match msg {
            WorkerMessage::Complete {
                conn,
                seq,
                response,
            } => {
                self.with_conn(cx, conn, |c, ccx| c.complete(seq, response, ccx));
            }
        }
    }

    fn on_shutdown(&mut self, cx: &mut Context<'_, WorkerMessage>) {
        for key in self.conns.keys() {
            if self.conns.get_mut(key).is_some_and(|c| c.begin_drain()) {
                self.close(cx, key);
            } else {
                // Reads what may be waiting (answering it with `Connection: close`), or
                // closes the connection if nothing was; busy connections just go on.
                self.with_conn(cx, key, |conn, ccx| conn.drive(false, ccx));
            }
        }
    }

    fn before_turn(&mut self, _cx: &mut Context<'_, WorkerMessage>) {
        // One uncontended load per turn (written only by a reload).
        let reloads = self.shared.reloads.load(Ordering::Acquire);
        if reloads != self.seen_reloads {
            self.apply_reload(reloads);
        }
    }

    fn after_turn(&mut self, cx: &mut Context<'_, WorkerMessage>) {
        if self.yielded.is_empty() {
            return;
        }
        for key in std::mem::take(&mut self.yielded) {
            self.with_conn(cx, key, |conn, ccx| conn.drive(true, ccx));
        }
    }

    fn wants_another_turn(&self) -> bool {
        !self.yielded.is_empty()
    }

    fn connections(&self) -> usize {
        self.conns.len
    }
}
