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

    def __init__(self, size: int):
        self.size = size
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
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n\r\n" % self.size
        piece = b"p" * 65536
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
                left = self.size
                while left:
                    n = min(left, len(piece))
                    conn.sendall(piece[:n])
                    left -= n
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

    def __init__(self, addr, ping_every: float, limit: float):
        super().__init__(daemon=True)
        self.addr, self.ping_every, self.limit = addr, ping_every, limit
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
        block = h2.encode_request("http", "localhost", "/big")
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
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    if a.quick:
        a.conns, a.write_timeout = min(a.conns, 2), min(a.write_timeout, 2)
    common.raise_nofile()

    up = Upstream(a.answer_kib * 1024)
    with tempfile.NamedTemporaryFile("w", suffix=".toml", prefix="tern-stress-", delete=False) as f:
        f.write(f"write_timeout = {a.write_timeout}\n"
                "[[site]]\nname = \"app\"\ndefault = true\n"
                f"[[site.route]]\npath = \"/\"\nproxy = \"{up.addr[0]}:{up.addr[1]}\"\n")
        config = f.name
    try:
        srv = common.Tern(workers=a.workers, config=config)
    finally:
        os.unlink(config)
    rep = Report(f"h2_proxy_stall: {a.conns} connections with window 0 and max streams of a "
                 f"{a.answer_kib} KiB proxied answer, a PING every {a.write_timeout / 5:g} s, "
                 f"write_timeout {a.write_timeout}")
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
    rss_start = srv.rss_kb()
    sampler = common.RssSampler(srv.pid, interval=0.05)
    up_open_before, up_peak_before = up.counts()[:2]

    limit = a.write_timeout + 10.0
    stallers = [Staller(srv.addr, a.write_timeout / 5, limit) for _ in range(a.conns)]
    for t in stallers:
        t.start()
    for t in stallers:
        t.join(limit + 5)
    # (The warm-up's connection may wait in tern's pool: it counts as before the attack.)
    up_drained = common_wait(lambda: up.counts()[0] <= up_open_before, 3.0)
    rss_peak = sampler.stop()
    time.sleep(0.5)
    rss_after = srv.rss_kb()
    up_open, up_peak, up_accepted, up_requests = up.counts()

    errors = [t.error for t in stallers if t.error]
    cut_after = [t.closed_at - t.opened_at for t in stallers if t.closed_at and t.opened_at]
    rep.add("warm-up", f"{got} bytes through the proxy on HTTP/1.1")
    rep.add("attack", f"{sum(t.streams for t in stallers)} streams on {a.conns} connections; "
            f"answer heads read {sum(t.headers for t in stallers)}, DATA bytes "
            f"{sum(t.data_bytes for t in stallers)}, PING ACKs {sum(t.pings_acked for t in stallers)}")
    rep.add("closed", ", ".join(f"{t.how} {t.closed_at - t.opened_at:.2f} s GOAWAY {t.goaway}"
                                if t.closed_at else f"{t.how} (GOAWAY {t.goaway})"
                                for t in stallers))
    rep.add("upstream", f"{up_accepted} connections in all (peak open {up_peak}, "
            f"{up_open_before} before the attack), {up_requests} requests; open after: {up_open}")
    rep.add("rss", f"start {mib(rss_start)}, peak {mib(rss_peak)} (+{mib(rss_peak - rss_start)}), "
            f"after {mib(rss_after)}")
    if errors:
        rep.add("errors", "; ".join(errors))

    rep.goal(not errors, "every attack connection ran (no client error)")
    rep.goal(all(t.goaway is not None and t.closed_at is not None for t in stallers),
             "every stalled connection got GOAWAY and was closed by the server")
    rep.goal(len(cut_after) == a.conns and all(a.write_timeout - 0.5 <= d <= a.write_timeout + 2
                                               for d in cut_after),
             f"closed at the write timeout from the stall's start ({a.write_timeout} s, "
             f"-0.5/+2 s), the PINGs notwithstanding")
    rep.goal(up_peak <= a.conns * MAX_UPSTREAMS_PER_CONN + up_peak_before,
             f"upstream connections open at once <= {MAX_UPSTREAMS_PER_CONN} per client "
             f"connection ({a.conns * MAX_UPSTREAMS_PER_CONN})")
    slack = a.rss_slack_mib
    if srv.log_matching("sockets: io_uring"):
        slack += a.workers * URING_RING_MIB_PER_WORKER
    bound = a.conns * a.rss_per_conn_mib + slack
    rep.goal((rss_peak - rss_start) / 1024 <= bound,
             f"RSS peak within {bound:g} MiB of start ({a.rss_per_conn_mib:g} MiB per connection "
             f"+ {slack:g})")
    rep.goal(up_drained, "every upstream connection closed within 3 s of the attack's end")
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
