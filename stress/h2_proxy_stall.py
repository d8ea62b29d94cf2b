#!/usr/bin/env python3
"""HTTP/2 clients that stall proxied answers: each connection says SETTINGS_INITIAL_WINDOW_SIZE
= 0, opens as many streams as the server allows, each a GET of a large answer from an upstream
behind a proxy route, never opens a window, and sends a PING every write-timeout / 5 (reading
the ACKs), the way a client would keep an idle connection alive. Shows that such a client pins
neither memory nor upstream connections: tern holds a bounded budget per connection (not a
buffer per stream), opens a bounded number of upstream connections per client connection, and
closes the stalled connection at the write timeout counted from when the stall began (the
PINGs do not extend it), closing its upstream connections with it (issue #21, item 4).

The upstream (in this script, one thread per connection) answers every GET with a
--answer-kib body and counts its open connections. tern is `tern run` with one proxy route
and `write_timeout` = --write-timeout, --workers 2.

Goals: every attack connection reads GOAWAY and is closed by the server between
write-timeout - 0.5 s and write-timeout + 2 s after its streams were opened; the upstream never
has more than 16 connections per attack connection open (tern's MAX_UPSTREAMS_PER_CONN); tern's
RSS peak stays within --rss-per-conn-mib per attack connection (+ --rss-slack-mib) of its RSS
at start; every upstream connection is closed within 3 s after the attack connections are;
the server alive, no panic logged, SIGTERM exits 0.

With --compress CODING (issue #39, item 1) the route also compresses its answers with CODING
and the upstream's body is text that compresses about 3:1, so each answer would keep an
encoder busy (brotli at the default quality: about 2 MiB of state). The script first runs the
attack without an Accept-Encoding (the identity pass, its goals as above), then again with
`Accept-Encoding: CODING` on the same server. Goal of the compressed pass, besides the same
closing goals: tern's RSS peak within --rss-over-identity-mib per attack connection (+ 3 MiB,
and on io_uring the ring's pool, as in the identity bound) of the identity pass's peak; the encoders charged (`tern_compress_encoder_bytes` on /metrics)
never more than 2.1 MiB per attack connection (one encoder, or several within 2 MiB), and
none after. The issue asked for 2 MiB per connection over identity; gzip and zstd meet it,
brotli at its default quality 4 cannot, since its one encoder's state alone is 2.05 MiB (see
stress/README.md), hence the 2.5 used here.
"""

from __future__ import annotations

import argparse
import os
import select
import socket
import struct
import sys
import tempfile
import threading
import time

import common
import h2wire as h2
from common import Report, mib

MAX_UPSTREAMS_PER_CONN = 16
# io_uring's provided-buffer ring, per worker (runtime/src/io/uring/setup.rs: 512 x 4 KiB):
# a fixed pool, resident once a burst has touched it, so it is slack, not a per-connection cost.
URING_RING_MIB_PER_WORKER = 2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3


class Upstream:
    """An HTTP/1.1 app server on 127.0.0.1: every request head is answered 200 with a body of
    `size` bytes (written in 64 KiB pieces, so the writes block when tern stops reading);
    counts the connections open now and at most."""

    def __init__(self, body: bytes):
        self.body = body
        self.lock = threading.Lock()
        self.open = 0
        self.peak = 0
        self.accepted = 0
        self.requests = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.addr = self.sock.getsockname()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.open += 1
                self.accepted += 1
                self.peak = max(self.peak, self.open)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n\r\n" % len(self.body)
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                buf = buf[buf.index(b"\r\n\r\n") + 4:]
                with self.lock:
                    self.requests += 1
                conn.sendall(head)
                for at in range(0, len(self.body), 65536):
                    conn.sendall(self.body[at:at + 65536])
        except OSError:
            pass
        finally:
            conn.close()
            with self.lock:
                self.open -= 1

    def counts(self) -> tuple[int, int, int, int]:
        with self.lock:
            return self.open, self.peak, self.accepted, self.requests


class Staller(threading.Thread):
    """One attack connection: window 0, max streams of GET /big, a PING every `ping_every`
    seconds (the ACKs read), until the server closes the connection or `limit` passes."""

    def __init__(self, addr, ping_every: float, limit: float, headers: dict | None = None):
        super().__init__(daemon=True)
        self.addr, self.ping_every, self.limit = addr, ping_every, limit
        self.request_headers = headers
        self.streams = 0
        self.headers = 0
        self.data_bytes = 0
        self.pings_acked = 0
        self.goaway: str | None = None
        self.opened_at: float | None = None  # when its streams were all sent
        self.closed_at: float | None = None
        self.how = "open"
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # reported, not raised: one thread per connection
            self.error = f"{type(e).__name__}: {e}"

    def _run(self) -> None:
        s = socket.create_connection(self.addr, timeout=5)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = struct.pack(">HIHI", h2.SETTINGS_ENABLE_PUSH, 0, h2.SETTINGS_INITIAL_WINDOW_SIZE, 0)
        s.sendall(h2.PREFACE + h2.frame(h2.SETTINGS, 0, 0, settings))
        buf = bytearray()
        max_streams = None
        deadline = time.monotonic() + 5
        while max_streams is None:
            if time.monotonic() > deadline:
                raise RuntimeError("no SETTINGS from the server")
            data = s.recv(65536)
            if not data:
                raise RuntimeError("closed before SETTINGS")
            buf += data
            for kind, flags, _, payload in h2.split_frames(buf):
                if kind == h2.SETTINGS and not flags & h2.ACK:
                    values = dict(struct.unpack(">HI", payload[i:i + 6])
                                  for i in range(0, len(payload), 6))
                    max_streams = values.get(SETTINGS_MAX_CONCURRENT_STREAMS, 100)
                    s.sendall(h2.frame(h2.SETTINGS, h2.ACK, 0))
        block = h2.encode_request("http", "localhost", "/big", headers=self.request_headers)
        s.sendall(b"".join(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, 1 + 2 * i, block)
                           for i in range(max_streams)))
        self.streams = max_streams
        self.opened_at = time.monotonic()
        s.setblocking(False)
        next_ping = self.opened_at + self.ping_every
        while time.monotonic() - self.opened_at < self.limit:
            now = time.monotonic()
            if now >= next_ping:
                try:
                    s.sendall(h2.frame(h2.PING, 0, 0, b"stall..."))
                except OSError:
                    pass  # the server may have closed already: the read says how
                next_ping = now + self.ping_every
            ready, _, _ = select.select([s], [], [], max(0.0, next_ping - time.monotonic()))
            if not ready:
                continue
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                self.closed_at, self.how = time.monotonic(), "reset"
                break
            if not data:
                self.closed_at, self.how = time.monotonic(), "eof"
                break
            buf += data
            for kind, flags, _, payload in h2.split_frames(buf):
                if kind == h2.HEADERS:
                    self.headers += 1
                elif kind == h2.DATA:
                    self.data_bytes += len(payload)
                elif kind == h2.PING and flags & h2.ACK:
                    self.pings_acked += 1
                elif kind == h2.PING:
                    s.sendall(h2.frame(h2.PING, h2.ACK, 0, payload))
                elif kind == h2.GOAWAY:
                    self.goaway = h2.code_name(struct.unpack(">I", payload[4:8])[0])
        s.close()


def wordy_text(size: int) -> bytes:
    """`size` bytes of words drawn at random (seeded): compresses about 3:1 and never repeats
    within a compression window, so an encoder works through the whole answer."""
    import random
    words = [w.encode() + b" " for w in "tern gull skua puffin auk gannet shag petrel fulmar "
             "kittiwake razorbill guillemot eider scoter loon grebe".split()]
    rnd = random.Random(39)
    out = bytearray()
    while len(out) < size:
        out += rnd.choice(words)
        if rnd.random() < 0.1:
            out += b"%d " % rnd.getrandbits(24)
    return bytes(out[:size])


def metric(srv, name: str) -> float:
    """A value of tern's /metrics page (its first series whose line starts with `name`)."""
    s = common.connect(srv.addr)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    text = b""
    while chunk := s.recv(65536):
        text += chunk
    s.close()
    for line in text.decode(errors="replace").splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise RuntimeError(f"no {name} on /metrics")


class Attack:
    """One pass of `conns` stalling connections against `srv`, measured."""

    def __init__(self, srv, up: Upstream, a, headers: dict | None, watch_encoders: bool):
        self.rss_start = srv.rss_kb()
        sampler = common.RssSampler(srv.pid, interval=0.05)
        self.up_open_before, self.up_peak_before = up.counts()[:2]
        self.encoders_peak = 0.0
        limit = a.write_timeout + 10.0
        self.stallers = [Staller(srv.addr, a.write_timeout / 5, limit, headers)
                         for _ in range(a.conns)]
        for t in self.stallers:
            t.start()
        while watch_encoders and any(t.is_alive() for t in self.stallers):
            self.encoders_peak = max(self.encoders_peak, metric(srv, "tern_compress_encoder_bytes"))
            time.sleep(0.1)
        for t in self.stallers:
            t.join(limit + 5)
        # (The warm-up's connection may wait in tern's pool: it counts as before the attack.)
        self.up_drained = common_wait(lambda: up.counts()[0] <= self.up_open_before, 3.0)
        self.rss_peak = sampler.stop()
        time.sleep(0.5)
        self.rss_after = srv.rss_kb()
        self.encoders_after = metric(srv, "tern_compress_encoder_bytes") if watch_encoders else 0.0
        self.up_open, self.up_peak, self.up_accepted, self.up_requests = up.counts()
        self.errors = [t.error for t in self.stallers if t.error]
        self.cut_after = [t.closed_at - t.opened_at for t in self.stallers
                          if t.closed_at and t.opened_at]

    def report(self, rep: Report, name: str) -> None:
        st = self.stallers
        rep.add(f"{name}: attack", f"{sum(t.streams for t in st)} streams on {len(st)} "
                f"connections; answer heads read {sum(t.headers for t in st)}, DATA bytes "
                f"{sum(t.data_bytes for t in st)}, PING ACKs {sum(t.pings_acked for t in st)}")
        rep.add(f"{name}: closed", ", ".join(f"{t.how} {t.closed_at - t.opened_at:.2f} s GOAWAY {t.goaway}"
                                             if t.closed_at else f"{t.how} (GOAWAY {t.goaway})"
                                             for t in st))
        rep.add(f"{name}: upstream", f"{self.up_accepted} connections in all (peak open "
                f"{self.up_peak}, {self.up_open_before} before the attack), {self.up_requests} "
                f"requests; open after: {self.up_open}")
        rep.add(f"{name}: rss", f"start {mib(self.rss_start)}, peak {mib(self.rss_peak)} "
                f"(+{mib(self.rss_peak - self.rss_start)}), after {mib(self.rss_after)}")
        if self.errors:
            rep.add(f"{name}: errors", "; ".join(self.errors))

    def closing_goals(self, rep: Report, name: str, a, slack: float) -> None:
        rep.goal(not self.errors, f"{name}: every attack connection ran (no client error)")
        rep.goal(all(t.goaway is not None and t.closed_at is not None for t in self.stallers),
                 f"{name}: every stalled connection got GOAWAY and was closed by the server")
        rep.goal(len(self.cut_after) == a.conns
                 and all(a.write_timeout - 0.5 <= d <= a.write_timeout + 2 for d in self.cut_after),
                 f"{name}: closed at the write timeout from the stall's start "
                 f"({a.write_timeout} s, -0.5/+2 s), the PINGs notwithstanding")
        rep.goal(self.up_peak <= a.conns * MAX_UPSTREAMS_PER_CONN + self.up_peak_before,
                 f"{name}: upstream connections open at once <= {MAX_UPSTREAMS_PER_CONN} per "
                 f"client connection ({a.conns * MAX_UPSTREAMS_PER_CONN})")
        rep.goal(self.up_drained, f"{name}: every upstream connection closed within 3 s of the "
                 "attack's end")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="2 attack connections, --write-timeout 2 (a few seconds in all)")
    ap.add_argument("--conns", type=int, default=8, help="attack connections (quick: 2)")
    ap.add_argument("--write-timeout", type=int, default=4, help="tern's write_timeout (quick: 2)")
    ap.add_argument("--answer-kib", type=int, default=1024,
                    help="size of the upstream's answer (the issue used >= 320 KiB)")
    ap.add_argument("--rss-per-conn-mib", type=float, default=2.0,
                    help="goal: RSS growth per attack connection (see README.md)")
    ap.add_argument("--rss-slack-mib", type=float, default=4.0)
    ap.add_argument("--compress", choices=["gzip", "br", "zstd"],
                    help="a second pass with the route compressing (see above)")
    ap.add_argument("--rss-over-identity-mib", type=float, default=2.5,
                    help="goal of the compressed pass: RSS peak over the identity pass's, per "
                         "attack connection")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    if a.quick:
        a.conns, a.write_timeout = min(a.conns, 2), min(a.write_timeout, 2)
    common.raise_nofile()

    up = Upstream(wordy_text(a.answer_kib * 1024) if a.compress else b"p" * (a.answer_kib * 1024))
    compress = f'compress = ["{a.compress}"]\n' if a.compress else ""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", prefix="tern-stress-", delete=False) as f:
        f.write(f"write_timeout = {a.write_timeout}\n"
                "[[site]]\nname = \"app\"\ndefault = true\n"
                "[[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n"
                f"[[site.route]]\npath = \"/\"\nproxy = \"{up.addr[0]}:{up.addr[1]}\"\n{compress}")
        config = f.name
    try:
        srv = common.Tern(workers=a.workers, config=config)
    finally:
        os.unlink(config)
    coded = f", the route compressing with {a.compress}" if a.compress else ""
    rep = Report(f"h2_proxy_stall: {a.conns} connections with window 0 and max streams of a "
                 f"{a.answer_kib} KiB proxied answer, a PING every {a.write_timeout / 5:g} s, "
                 f"write_timeout {a.write_timeout}{coded}")
    rep.add("server", f"pid {srv.pid}, tern run, http://{srv.host}:{srv.port}, "
            f"{srv.workers} workers, upstream {up.addr[0]}:{up.addr[1]}")

    # Warm up: one proxied answer read whole, on HTTP/1.1.
    s = common.connect(srv.addr)
    s.sendall(b"GET /warm HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    got = 0
    while chunk := s.recv(65536):
        got += len(chunk)
    s.close()
    time.sleep(0.5)
    rep.add("warm-up", f"{got} bytes through the proxy on HTTP/1.1")

    identity = Attack(srv, up, a, None, False)
    identity.report(rep, "identity")
    slack = a.rss_slack_mib
    if srv.log_matching("sockets: io_uring"):
        slack += a.workers * URING_RING_MIB_PER_WORKER
    identity.closing_goals(rep, "identity", a, slack)
    bound = a.conns * a.rss_per_conn_mib + slack
    rep.goal((identity.rss_peak - identity.rss_start) / 1024 <= bound,
             f"identity: RSS peak within {bound:g} MiB of start ({a.rss_per_conn_mib:g} MiB per "
             f"connection + {slack:g})")
    if a.compress:
        coded = Attack(srv, up, a, {"accept-encoding": a.compress}, True)
        coded.report(rep, a.compress)
        rep.add(f"{a.compress}: encoders", f"charged at most {mib(coded.encoders_peak / 1024)}, "
                f"after {coded.encoders_after:g} bytes")
        coded.closing_goals(rep, a.compress, a, slack)
        # The fixed part: allocator noise (3 MiB), and on io_uring the ring's pool, which
        # one pass may have touched more of than the other (as in the identity bound).
        fixed = 3 + (slack - a.rss_slack_mib)
        over = a.conns * a.rss_over_identity_mib + fixed
        rep.goal((coded.rss_peak - identity.rss_peak) / 1024 <= over,
                 f"{a.compress}: RSS peak within {over:g} MiB of the identity pass's "
                 f"({a.rss_over_identity_mib:g} MiB per connection + {fixed:g}): "
                 f"{(coded.rss_peak - identity.rss_peak) / 1024:+.1f} MiB")
        # A connection's share: one encoder, or several within 2 MiB; at the default levels
        # the largest one is brotli's 2.1 MiB.
        rep.goal(coded.encoders_peak <= a.conns * 2.1 * 1024 * 1024,
                 f"{a.compress}: at most 2.1 MiB of encoders charged per attack connection")
        rep.goal(coded.encoders_after == 0, f"{a.compress}: no encoder charged after the attack")
    rep.goal(srv.alive(), "server alive")
    panics = srv.log_matching("panicked")
    rep.goal(not panics, f"no panic logged {panics[:1] if panics else ''}")
    code = srv.terminate()
    rep.goal(code == 0, f"SIGTERM exits 0 (exit {code})")
    return rep.finish()


def common_wait(cond, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


if __name__ == "__main__":
    sys.exit(main())
