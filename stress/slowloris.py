#!/usr/bin/env python3
"""Slowloris: thousands of connections dribble a request head one byte every 1-2 s while a
normal client makes keep-alive requests. Shows that slow heads neither slow down nor starve
normal clients, that the header timeout cuts every one of them, and that the memory they
held is given back.

Goals: normal-client p99 < 10 ms during the attack and no normal request fails; every slow
socket is closed by the server (EOF or RST) within header-timeout + slack; RSS after the cut
is within 10 MiB of RSS at start.
"""

from __future__ import annotations

import argparse
import errno
import os
import heapq
import random
import selectors
import socket
import sys
import time

import common
from common import Report, mib

# A head that never ends: after the prefix every byte extends one header value.
HEAD_PREFIX = b"GET /index.html HTTP/1.1\r\nHost: stress\r\nX-Slow: "


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2000 connections, 3 s header timeout")
    ap.add_argument("--conns", type=int, default=5000)
    ap.add_argument("--header-timeout", type=int, default=5)
    ap.add_argument("--min-gap", type=float, default=1.0, help="seconds between bytes, low")
    ap.add_argument("--max-gap", type=float, default=2.0, help="seconds between bytes, high")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--p99-ms", type=float, default=None,
                    help="goal for the normal client's p99 during the attack "
                         "(default 10; 20 with --quick, see README)")
    ap.add_argument("--rss-slack-mib", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.quick:
        a.conns, a.header_timeout = min(a.conns, 2000), min(a.header_timeout, 3)
    if a.p99_ms is None:
        # --quick runs in CI on 2 shared cores, where the 0.2 s connect burst alone has cost
        # the probe 13 ms at p99 once in ~10 runs; the full run keeps the 10 ms.
        a.p99_ms = 20.0 if a.quick else 10.0
    random.seed(a.seed)
    limit = common.raise_nofile()
    if limit < a.conns + 100:
        sys.exit(f"slowloris: fd limit {limit} too low for {a.conns} connections")

    srv = common.Tern(["--header-timeout", str(a.header_timeout)], workers=a.workers)
    rep = Report(f"slowloris: {a.conns} slow heads, --header-timeout {a.header_timeout}")
    rep.add("server", f"pid {srv.pid}, {srv.host}:{srv.port}, {srv.workers} workers")

    # Warm up (page cache, buffer pool, first connections), then take the baseline.
    for _ in range(20):
        common.get_once(srv.addr)
    time.sleep(0.5)
    rss_start = srv.rss_kb()
    sampler = common.RssSampler(srv.pid)
    probe = common.Probe(srv.addr, keep_alive_conns=2, pause=0.005)
    # A real attacker runs elsewhere; here it shares the 2 cores with tern and the probe, and
    # opening 5 000 sockets keeps Python at 100 % of a core for 0.3 s. Lower its priority (the
    # server and the probe, already started, keep theirs) so the probe measures tern rather
    # than this process's CPU use.
    os.nice(10)
    time.sleep(0.5)

    sel = selectors.DefaultSelector()
    socks: dict[int, socket.socket] = {}
    sent: dict[int, int] = {}
    closed_how: dict[int, str] = {}
    got_408 = 0
    connect_failed = 0
    due: list[tuple[float, int]] = []

    attack_start = time.monotonic()
    # Open all connections (non-blocking connect), a few hundred at a time, sending the first
    # byte as soon as each one is writable.
    for i in range(a.conns):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        rc = s.connect_ex(srv.addr)
        if rc not in (0, errno.EINPROGRESS):
            connect_failed += 1
            s.close()
            continue
        socks[s.fileno()] = s
        sent[s.fileno()] = 0
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
        if i % 200 == 199:
            _pump(sel, socks, sent, closed_how, due, 0.01, a)
    opened = time.monotonic()
    last_first_byte = opened

    def still_open() -> int:
        return len(socks) - len(closed_how)

    peak_open = 0
    deadline = opened + a.max_gap + a.header_timeout + 10
    while still_open() and time.monotonic() < deadline:
        now = time.monotonic()
        # Send the next byte on every socket whose turn has come.
        while due and due[0][0] <= now:
            _, fd = heapq.heappop(due)
            if fd in closed_how:
                continue
            _send_byte(sel, socks[fd], fd, sent, closed_how, due, a)
            if sent[fd] == 1:
                last_first_byte = now
        peak_open = max(peak_open, still_open())
        timeout = max(0.0, min(0.05, (due[0][0] - time.monotonic()) if due else 0.05))
        got_408 += _pump(sel, socks, sent, closed_how, due, timeout, a)
    attack_end = time.monotonic()

    unclosed = still_open()
    for s in socks.values():
        s.close()
    # Let lingering closes (2 s) finish and the allocator purge, then take the after value.
    time.sleep(3.0)
    rss_after = srv.rss_kb()
    peak = sampler.stop()
    samples = probe.results()
    during = common.latency_summary(samples, attack_start, attack_end)
    overall = common.latency_summary(samples)

    cut_after = attack_end - last_first_byte
    kinds = {}
    for how in closed_how.values():
        kinds[how] = kinds.get(how, 0) + 1
    rep.add("slow connections", f"{len(socks)} opened in {opened - attack_start:.1f} s "
            f"({connect_failed} connect errors), peak {peak_open} open at once")
    rep.add("closed by server", f"{len(closed_how)} ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); "
            f"{got_408} got a 408 first; still open at deadline: {unclosed}")
    rep.add("attack window", f"{attack_end - attack_start:.1f} s; last slow socket closed "
            f"{cut_after:.1f} s after the last first byte")
    rep.add("normal client (attack)", common.fmt_lat(during))
    rep.add("normal client (all)", common.fmt_lat(overall))
    if during["first_errors"]:
        rep.add("first errors", during["first_errors"])
    rep.add("RSS start / peak / after", f"{mib(rss_start)} / {mib(peak)} / {mib(rss_after)}")
    rep.add("peak per slow conn", f"{(peak - rss_start) * 1024 / max(1, peak_open):.0f} bytes")

    rep.goal(srv.alive(), "server still running")
    rep.goal(connect_failed == 0 and len(socks) == a.conns, f"all {a.conns} slow connections opened")
    rep.goal(unclosed == 0, "every slow socket closed by the server (EOF/RST)")
    rep.goal(during["errors"] == 0 and overall["errors"] == 0, "no normal request failed")
    rep.goal(during["requests"] > 0 and during["p99_ms"] < a.p99_ms,
             f"normal-client p99 during the attack < {a.p99_ms} ms")
    rep.goal(rss_after - rss_start <= a.rss_slack_mib * 1024,
             f"RSS after the cut within {a.rss_slack_mib} MiB of start")
    srv.terminate()
    return rep.finish()


def _send_byte(sel, s, fd, sent, closed_how, due, a) -> None:
    n = sent[fd]
    byte = HEAD_PREFIX[n : n + 1] if n < len(HEAD_PREFIX) else b"a"
    try:
        s.send(byte)
        sent[fd] = n + 1
        heapq.heappush(due, (time.monotonic() + random.uniform(a.min_gap, a.max_gap), fd))
    except BlockingIOError:
        heapq.heappush(due, (time.monotonic() + 0.1, fd))
    except (BrokenPipeError, ConnectionResetError):
        closed_how[fd] = "RST/EPIPE on send"
        sel.unregister(s)


def _pump(sel, socks, sent, closed_how, due, timeout, a) -> int:
    """Handles readiness: first-write (connected: send the first byte) and reads (the 408,
    EOF, RST). Returns how many 408 answers began arriving."""
    got_408 = 0
    for key, mask in sel.select(timeout):
        s = key.fileobj
        fd = key.fd
        if mask & selectors.EVENT_WRITE and sent[fd] == 0 and fd not in closed_how:
            sel.modify(s, selectors.EVENT_READ)
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                closed_how[fd] = f"connect error {errno.errorcode.get(err, err)}"
                sel.unregister(s)
                continue
            _send_byte(sel, s, fd, sent, closed_how, due, a)
        if mask & selectors.EVENT_READ and fd not in closed_how:
            try:
                while True:
                    data = s.recv(65536)
                    if not data:
                        closed_how[fd] = "EOF"
                        break
                    if data.startswith(b"HTTP/1.1 408"):
                        got_408 += 1
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed_how[fd] = "RST"
            if fd in closed_how:
                sel.unregister(s)
    return got_408


if __name__ == "__main__":
    sys.exit(main())
