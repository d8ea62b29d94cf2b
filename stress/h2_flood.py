#!/usr/bin/env python3
"""HTTP/2 floods: rapid reset, CONTINUATION, PING and SETTINGS floods over h2c and over TLS
(ALPN h2), several connections of each kind at once, each reconnecting as soon as the server
closes it, plus connections that park a header block just under the size limit, while a
normal HTTP/2 client keeps making requests on one h2c connection. Shows that every flooding
connection is stopped by the session's budgets (GOAWAY ENHANCE_YOUR_CALM, then close), that
normal requests are still answered quickly, and that the memory the attack held is given
back.

The attackers (raw frames built by hand; every header field a literal without indexing):
  rapid-reset   HEADERS (a GET, END_STREAM) then RST_STREAM(CANCEL) on streams 1, 3, 5, ...,
                --streams-per-write pairs per write;
  continuation  HEADERS without END_HEADERS (the block ends inside a header value announced
                as 16 MiB long), then CONTINUATION frames without END_HEADERS forever, in
                turn per connection: empty ones (8 per write), 16 KiB ones (2 per write),
                or empty and 16 KiB alternately;
  ping          PING frames, 100 per write;
  settings      SETTINGS frames (one setting each), 100 per write;
  hold          (--hold per transport, opened at the start) HEADERS without END_HEADERS and
                two 16 KiB CONTINUATIONs: a 32.8 KiB block, under the 33 KiB limit, then
                nothing; the header timeout must cut it.
Each flooder writes as fast as it can, reads whatever the server sent between writes
(counting PING and SETTINGS ACKs and the GOAWAY's last stream id: how far it got), stops at
GOAWAY and waits for the close; TLS goes through a MemoryBIO so that a GOAWAY already
received is still read when the server resets the connection under a write. `--conns`
attacker processes per transport, each with a thread per kind, run at SCHED_IDLE: a real
attacker's CPU is not the server's (see README.md).

Goals: every flooding connection reads GOAWAY(ENHANCE_YOUR_CALM) and is then closed by the
server; http2_floods (/statusz) counts each of them once, and no other connection error;
every parked header block is cut (GOAWAY, close) within header-timeout + 2 s; normal-client
p99 < 10 ms during the attack and no normal request fails; RSS 3 s after the attack within
10 MiB of RSS at start; the server alive, no panic logged, SIGTERM exits 0.

The server is `tern demo` (the only command with /statusz; its --site is the stress page, so
the normal client's requests take the static-file path of `tern serve`), 2 workers,
--header-timeout 5 (quick: 3), with an h2c (--listen) and an HTTPS (--listen-tls) listener.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import select
import selectors
import signal
import socket
import ssl
import statistics
import struct
import sys
import threading
import time

import common
import h2wire as h2
from common import Report, mib

KINDS = ("rapid-reset", "continuation", "ping", "settings")
TRANSPORTS = ("h2c", "tls")
CONTINUATION_VARIANTS = ("empty", "16k", "mixed")
# What the server logs as the GOAWAY's reason for each kind (session.rs).
REASONS = {
    "rapid-reset": ("too many reset streams",),
    "continuation": ("too many CONTINUATION frames", "header block too large"),
    "ping": ("too many control frames",),
    "settings": ("too many control frames",),
}
# "2026-11-23T17:22:10.707819Z  INFO HTTP/2 connection error: ... peer=127.0.0.1:42718 ..."
LOG_LINE = re.compile(r"(\S+Z)\s.*HTTP/2 connection error: .* peer=[\d.]+:(\d+)")
GRACE_S = 5.0  # an attack connection still open this long after the attack window: not stopped
CLOSE_WAIT_S = 3.0  # how long an attacker waits for the close after the GOAWAY


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="6 s attack, 1 attacker process per transport, 150 held blocks each, "
                         "--header-timeout 3")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of attack")
    ap.add_argument("--conns", type=int, default=2,
                    help="attacker processes per transport, each with one connection per "
                         "kind at a time (quick: 1)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="which floods (default: all)")
    ap.add_argument("--transports", default=",".join(TRANSPORTS),
                    help="h2c (prior knowledge on --listen), tls (ALPN h2 on --listen-tls)")
    ap.add_argument("--header-timeout", type=int, default=5,
                    help="tern's --header-timeout (quick: 3): cuts the parked header blocks")
    ap.add_argument("--hold", type=int, default=300,
                    help="connections per transport that park a 32.8 KiB header block "
                         "(under the limit) until the header timeout")
    ap.add_argument("--streams-per-write", type=int, default=64,
                    help="rapid-reset: HEADERS+RST_STREAM pairs per write")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--p99-ms", type=float, default=10.0,
                    help="goal for the normal client's p99 during the attack")
    ap.add_argument("--rss-slack-mib", type=float, default=10.0)
    ap.add_argument("--pause", type=float, default=0.005,
                    help="seconds the normal client waits between requests")
    ap.add_argument("--attacker-sched", choices=("idle", "nice"), default="idle",
                    help="the attackers' CPU priority: SCHED_IDLE (default) or nice 10")
    a = ap.parse_args()
    if a.quick:
        a.duration, a.conns, a.hold = min(a.duration, 6.0), min(a.conns, 1), min(a.hold, 150)
        a.header_timeout = min(a.header_timeout, 3)
    kinds = [k for k in a.kinds.split(",") if k]
    transports = [t for t in a.transports.split(",") if t]
    if not kinds or any(k not in KINDS for k in kinds):
        sys.exit(f"h2_flood: --kinds takes some of {','.join(KINDS)}")
    if not transports or any(t not in TRANSPORTS for t in transports):
        sys.exit(f"h2_flood: --transports takes some of {','.join(TRANSPORTS)}")
    common.raise_nofile()

    tls = common.TlsFiles()
    srv = common.Tern(["--header-timeout", str(a.header_timeout)], workers=a.workers, tls=tls,
                      plain_too=True, demo=True)
    plain, secure = srv.listeners["http"], srv.listeners["https"]
    rep = Report(f"h2_flood: {', '.join(kinds)} over {' and '.join(transports)}, "
                 f"{a.conns} attacker(s) each, {a.hold} held blocks each, {a.duration:g} s, "
                 f"--header-timeout {a.header_timeout}")
    rep.add("server", f"pid {srv.pid}, tern demo, h2c http://{plain[0]}:{plain[1]}, "
            f"h2 https://{secure[0]}:{secure[1]}, {srv.workers} workers")

    # Warm up (page cache, buffer pool, both listeners, HTTP/2 on each), then the baseline.
    for _ in range(10):
        common.get_once(plain)
    for addr, ctx in ((plain, None), (secure, h2_context(tls.ca))):
        for _ in range(5):
            c = h2_connect(addr, ctx)
            for _ in range(4):
                status, body = c.get(common.PAGE_PATH)
                assert status == 200 and body == common.PAGE, (status, body)
            c.close()
    before = statusz(plain)
    time.sleep(0.5)
    rss_start = srv.rss_kb()
    sampler = common.RssSampler(srv.pid)
    probe = H2Probe(plain, pause=a.pause)
    time.sleep(0.5)

    attack_start = time.monotonic()
    stop_at = attack_start + a.duration
    cpu_start = cpu_seconds(srv.pid)
    attackers = [Attackers(t, plain if t == "h2c" else secure, kinds, a, stop_at, i)
                 for t in transports for i in range(a.conns)]
    records = [r for att in attackers for r in att.results(timeout=a.duration + GRACE_S + 20)]
    attack_end = max([stop_at] + [r["t_end"] for r in records])
    cpu_attack = cpu_seconds(srv.pid) - cpu_start

    # Let lingering closes (2 s) finish and the allocator purge, then take the after value.
    time.sleep(3.0)
    rss_after = srv.rss_kb()
    peak = sampler.stop()
    samples = probe.results()
    after = statusz(plain) if srv.alive() else {}
    during = common.latency_summary(samples, attack_start, attack_end)
    overall = common.latency_summary(samples)

    # ---- the attackers' view
    floods = [r for r in records if r["kind"] != "hold"]
    held = [r for r in records if r["kind"] == "hold"]
    every_kind = True
    for t in transports:
        for k in kinds:
            mine = [r for r in floods if r["transport"] == t and r["kind"] == k]
            every_kind &= bool(mine)
            rep.add(f"{k} / {t}", describe(mine, k, a.duration))
    for t in transports:
        mine = [r for r in held if r["transport"] == t]
        if a.hold:
            rep.add(f"hold / {t}", describe_hold(mine, attack_start))
    established = [r for r in floods if r["established"]]
    calm = sum(r["how"] == GOOD for r in floods)
    stopped = sum(closed_by_server(r) for r in floods)
    sent = sum(r["frames"] for r in floods)
    rep.add("floods", f"{len(floods)} connections ({len(established)} established), "
            f"{sent:,} frames, {sum(r['bytes'] for r in floods) / 2**20:.1f} MiB sent in "
            f"{attack_end - attack_start:.1f} s; GOAWAY(ENHANCE_YOUR_CALM) read on {calm}, "
            f"closed by the server after it {stopped}")

    # ---- the server's view
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in
             ("http2_floods", "http2_connection_errors", "http2_stream_errors",
              "http2_connections", 'timeouts{kind="header"}', "handler_panics",
              "connections_accepted")}
    rep.add("server counters (delta)", ", ".join(f"{k} {v}" for k, v in delta.items()))
    reasons: dict[str, int] = {}
    for line in srv.log_matching("HTTP/2 connection error: "):
        why = line.split("HTTP/2 connection error: ", 1)[1].split(" peer=")[0]
        reasons[why] = reasons.get(why, 0) + 1
    expected = {why for k in kinds for why in REASONS[k]}
    rep.add("server log reasons", ", ".join(
        f"{k} x{v}" + ("" if k in expected else " (unexpected)")
        for k, v in sorted(reasons.items())) + " (rate-limited lines)" if reasons else "none")
    rep.add("server detection", detection(srv.log_matching("HTTP/2 connection error: "),
                                          established))
    panics = [l for l in srv.log_lines if "panic" in l.lower()]
    if panics:
        rep.add("panic lines", panics[:3])
    rep.add("normal client (attack)", common.fmt_lat(during))
    rep.add("normal client (all)", common.fmt_lat(overall))
    if overall["first_errors"]:
        rep.add("first errors", overall["first_errors"])
    slow = [s for s in samples if s[2] is None and s[1] > 0.005 and
            attack_start <= s[0] <= attack_end]
    per_s = [0] * (int(attack_end - attack_start) + 1)
    for t0, *_ in slow:
        per_s[int(t0 - attack_start)] += 1
    rep.add("normal > 5 ms", f"{len(slow)} during the attack; per second of it: "
            + " ".join(map(str, per_s)))
    rep.add("server CPU", f"{cpu_attack:.1f} s in the {attack_end - attack_start:.1f} s "
            f"attack ({cpu_attack / (attack_end - attack_start):.2f} cores)")
    rep.add("RSS start / peak / after", f"{mib(rss_start)} / {mib(peak)} / {mib(rss_after)}")

    alive = srv.alive()
    rc = srv.terminate()
    rep.goal(alive, "server still running after the attack")
    rep.goal(every_kind and stopped == len(floods),
             "every attack connection read GOAWAY(ENHANCE_YOUR_CALM), then the server closed it")
    rep.goal(delta["http2_floods"] == len(established) > 0
             and delta["http2_connection_errors"] == 0,
             f"http2_floods counted each attack connection once ({delta['http2_floods']} for "
             f"{len(established)}), no other connection error")
    rep.goal(sum(r["established"] for r in held) == a.hold * len(transports),
             f"all {a.hold * len(transports)} hold connections parked their header block")
    rep.goal(all(hold_cut(r, a.header_timeout) for r in held),
             f"every parked header block cut by the server (GOAWAY, close) within "
             f"header-timeout + 2 s of its connect")
    rep.goal(during["errors"] == 0 and overall["errors"] == 0, "no normal request failed")
    rep.goal(during["requests"] > 0 and during["p99_ms"] < a.p99_ms,
             f"normal-client p99 during the attack < {a.p99_ms:g} ms")
    rep.goal(rss_after - rss_start <= a.rss_slack_mib * 1024,
             f"RSS {3.0:g} s after the attack within {a.rss_slack_mib:g} MiB of start")
    rep.goal(not panics and delta["handler_panics"] == 0, "no panic logged")
    rep.goal(rc == 0, f"SIGTERM exits 0 (exit {rc})")
    return rep.finish()


GOOD = "GOAWAY ENHANCE_YOUR_CALM"
CLOSES = ("EOF", "RST", "EPIPE")


def closed_by_server(r: dict) -> bool:
    """Stopped by GOAWAY(ENHANCE_YOUR_CALM), then closed: EOF, or a reset if we were still
    sending (the server discards at most 256 KiB after its GOAWAY, then resets)."""
    return r["how"] == GOOD and r["after"].split(" ")[0] in CLOSES


def describe(mine: list[dict], kind: str, duration: float) -> str:
    """One report line for the connections of one kind over one transport."""
    if not mine:
        return "no connection made"
    hows: dict[str, int] = {}
    for r in mine:
        how = r["how"] + (f", then {r['after']}" if r["after"] else "")
        hows[how] = hows.get(how, 0) + 1
    frames = sorted(r["frames"] for r in mine)
    stop_ms = sorted(r["t_stop"] * 1000 for r in mine if r["t_stop"] is not None)
    parts = [f"{len(mine)} conns ({len(mine) / duration:.0f}/s): "
             + ", ".join(f"{k} {v}" for k, v in sorted(hows.items(), key=lambda kv: -kv[1]))]
    calm = [r for r in mine if r["how"] == GOOD]
    if kind == "rapid-reset":
        got = sorted((r["last"] + 1) // 2 for r in calm)
        if got:
            parts.append(f"streams taken (GOAWAY last stream) {got[0]}-{got[-1]}")
    elif kind == "ping":
        acks = sorted(r["pings"] for r in calm)
        if acks:
            parts.append(f"PING ACKs before GOAWAY {acks[0]}-{acks[-1]}")
    elif kind == "settings":
        acks = sorted(r["settings"] for r in calm)
        if acks:
            parts.append(f"SETTINGS ACKs before GOAWAY {acks[0]}-{acks[-1]} (1 for the preface's)")
    parts.append(f"frames sent before the GOAWAY was read: median {statistics.median(frames):.0f}, "
                 f"max {frames[-1]}")
    if kind == "continuation":
        for v in CONTINUATION_VARIANTS:
            fs = sorted(r["frames"] for r in mine if r["variant"] == v)
            if fs:
                parts.append(f"{v} {len(fs)} conns, {fs[0]}-{fs[-1]} frames")
    if stop_ms:
        parts.append(f"GOAWAY read {statistics.median(stop_ms):.1f} ms after connect (median), "
                     f"max {stop_ms[-1]:.1f}")
    return "; ".join(parts)


def detection(lines: list[str], records: list[dict]) -> str:
    """When the server found each logged flood, from its log line's time stamp and peer port
    matched to the attack connection that had that port then: how long after the
    connection was ready (TLS: handshake done) the server gave up on it, and how long after
    that the attacker read the GOAWAY."""
    by_port: dict[int, list[dict]] = {}
    for r in records:
        by_port.setdefault(r.get("port", 0), []).append(r)
    found, lag = [], []
    for line in lines:
        m = LOG_LINE.match(line)
        if not m:
            continue
        ts = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        for r in by_port.get(int(m.group(2)), []):
            if r["wall_ready"] - 0.002 <= ts <= r["wall_end"] + 0.002:
                found.append((ts - r["wall_ready"]) * 1000)
                if "wall_goaway" in r:
                    lag.append((r["wall_goaway"] - ts) * 1000)
                break
    if not found:
        return "no log line matched an attack connection"
    found.sort()
    lag.sort()
    return (f"{len(found)} logged floods matched: GOAWAY decided {statistics.median(found):.1f} ms "
            f"(median), max {found[-1]:.1f} ms after the connection was ready; the attacker "
            f"read it {statistics.median(lag):.1f} ms (median), max {lag[-1]:.1f} ms later")


def hold_cut(r: dict, header_timeout: float) -> bool:
    """A parked header block the server cut (GOAWAY, then close) by header-timeout + 2 s."""
    return (r["how"].startswith("GOAWAY") and r["after"].split(" ")[0] in CLOSES
            and r["t_end"] - r["t0"] <= header_timeout + 2)


def describe_hold(mine: list[dict], attack_start: float) -> str:
    hows: dict[str, int] = {}
    for r in mine:
        how = r["how"] + (f", then {r['after']}" if r["after"] else "")
        hows[how] = hows.get(how, 0) + 1
    lives = sorted(r["t_end"] - r["t0"] for r in mine
                   if r["established"] and r["after"] != "closed by us")
    parked = sorted(r["t_parked"] - attack_start for r in mine if r["established"])
    return (f"{len(parked)} of {len(mine)} parked 32.8 KiB blocks"
            + (f" ({parked[0]:.1f}-{parked[-1]:.1f} s into the attack)" if parked else "")
            + ": " + ", ".join(f"{k} {v}" for k, v in sorted(hows.items(), key=lambda kv: -kv[1]))
            + (f"; closed {lives[0]:.1f}-{lives[-1]:.1f} s after connect" if lives else ""))


# ----------------------------------------------------------------------------- server side


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def statusz(addr) -> dict[str, int]:
    """/statusz of tern demo (`name: value` lines) over HTTP/1.1."""
    status, body = common.get_once(addr, path="/statusz")
    out = {}
    for line in body.decode().splitlines():
        name, _, value = line.rpartition(": ")
        try:
            out[name] = int(float(value))
        except ValueError:
            pass
    return out


def h2_context(ca: str | None) -> ssl.SSLContext:
    """A TLS client offering only ALPN h2; verifying the test CA if `ca` is given."""
    if ca is not None:
        ctx = ssl.create_default_context(cafile=ca)
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    ctx.set_alpn_protocols(["h2"])
    return ctx


def h2_connect(addr, ctx: ssl.SSLContext | None, timeout: float = 5.0) -> h2.H2Client:
    s = common.connect(addr, timeout=timeout)
    if ctx is None:
        return h2.H2Client(s, scheme="http")
    s = ctx.wrap_socket(s, server_hostname="localhost")
    if s.selected_alpn_protocol() != "h2":
        s.close()
        raise h2.H2Error(f"ALPN chose {s.selected_alpn_protocol()!r}, not h2")
    return h2.H2Client(s, scheme="https")


# ----------------------------------------------------------------------------- normal client


def _probe_main(addr, pause: float, stop, pipe) -> None:
    # A forked child: the parent's servers are not ours to kill.
    common._children.clear()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out: list = []
    client = None
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            if client is None:
                client = h2_connect(addr, None)
            status, body = client.get(common.PAGE_PATH)
            err = None if status == 200 and body == common.PAGE else \
                f"status {status}, {len(body)} bytes"
            out.append((t0, time.monotonic() - t0, err, "h2c"))
        except Exception as e:  # every error is a failed normal request here
            out.append((t0, time.monotonic() - t0, f"{type(e).__name__}: {e}", "h2c"))
            if client is not None:
                client.close()
                client = None
        if pause:
            time.sleep(pause)
    if client is not None:
        client.close()
    pipe.send(out)
    pipe.close()


class H2Probe(common.ProbeProcess):
    """The normal client in its own process: one h2c connection (prior knowledge), one GET of
    the stress page at a time, `pause` s between them; a new connection only after an error.
    `results()` stops it and returns [(t_start, latency_s, error|None, "h2c")]."""

    def __init__(self, addr, pause: float):
        super().__init__(_probe_main, (addr, pause))


# ----------------------------------------------------------------------------- attackers


def reset_batches(scheme: str, per_write: int):
    """rapid-reset: (bytes, frames) per write, HEADERS + RST_STREAM(CANCEL) for the next
    `per_write` streams each time. The first writes are the same for every connection."""
    block = h2.encode_request(scheme, "localhost", common.PAGE_PATH)
    cached = _RESET_CACHE.setdefault((scheme, per_write), [])
    i = 0
    while True:
        if i < len(cached):
            yield cached[i]
        else:
            first = 1 + 2 * per_write * i
            data = b"".join(h2.frame(h2.HEADERS, h2.END_HEADERS | h2.END_STREAM, sid, block)
                            + h2.rst_stream(sid, h2.CANCEL)
                            for sid in range(first, first + 2 * per_write, 2))
            if i < 16:
                cached.append((data, 2 * per_write))
            yield data, 2 * per_write
        i += 1


_RESET_CACHE: dict = {}


def continuation_batches(scheme: str, variant: str):
    """continuation: HEADERS without END_HEADERS on stream 1 whose block ends in a literal
    announced as 16 MiB long, then CONTINUATION frames without END_HEADERS, never ending."""
    block = (h2.encode_request(scheme, "localhost", common.PAGE_PATH)
             + b"\x00" + h2.encode_string("x-flood") + h2.encode_int(1 << 24, 7))
    yield h2.frame(h2.HEADERS, h2.END_STREAM, 1, block), 1
    empty = h2.frame(h2.CONTINUATION, 0, 1, b"")
    full = h2.frame(h2.CONTINUATION, 0, 1, b"a" * h2.MAX_FRAME)
    batch = {"empty": (empty * 8, 8), "16k": (full * 2, 2), "mixed": (empty + full, 2)}[variant]
    while True:
        yield batch


def control_batches(kind: str):
    if kind == "ping":
        one = h2.frame(h2.PING, 0, 0, b"flooding")
    else:
        one = h2.frame(h2.SETTINGS, 0, 0, struct.pack(">HI", h2.SETTINGS_ENABLE_PUSH, 0))
    batch = (one * 100, 100)
    while True:
        yield batch


class Wire:
    """An attack connection's bytes: plain TCP, or TLS through a MemoryBIO over the raw
    socket, so that after a failed send (the server reset the connection) whatever it sent
    before, GOAWAY included, can still be read from the kernel's receive queue."""

    def __init__(self, sock: socket.socket, ctx: ssl.SSLContext | None):
        self.sock, self.tls = sock, None
        if ctx is not None:
            self.inc, self.out = ssl.MemoryBIO(), ssl.MemoryBIO()
            self.tls = ctx.wrap_bio(self.inc, self.out, server_hostname="localhost")

    def handshake(self) -> str | None:
        """None, or the ALPN protocol chosen (over TLS); raises on failure."""
        if self.tls is None:
            return None
        while True:
            try:
                self.tls.do_handshake()
                self.sock.sendall(self.out.read())
                return self.tls.selected_alpn_protocol()
            except ssl.SSLWantReadError:
                self.sock.sendall(self.out.read())
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("EOF in the handshake")
                self.inc.write(data)

    def send(self, data: bytes) -> None:
        if self.tls is not None:
            self.tls.write(data)
            data = self.out.read()
        self.sock.sendall(data)

    def readable(self, timeout: float = 0.0) -> bool:
        if self.tls is not None and self.tls.pending():
            return True
        r, _, _ = select.select([self.sock], [], [], timeout)
        return bool(r)

    def recv(self) -> bytes | str:
        """Plaintext (maybe b"" while a TLS record is incomplete), or how the connection
        ended: "EOF", "RST", "error ..."."""
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return b""
        except ConnectionResetError:
            return "RST"
        except socket.timeout:
            return "recv timeout"
        except OSError as e:
            return f"error {type(e).__name__}"
        if not data:
            return "EOF"
        if self.tls is None:
            return data
        self.inc.write(data)
        plain = bytearray()
        try:
            while True:
                chunk = self.tls.read(65536)
                if not chunk:
                    return bytes(plain) if plain else "EOF"  # close_notify
                plain += chunk
        except ssl.SSLWantReadError:
            return bytes(plain)
        except ssl.SSLError as e:
            return f"TLS error {e.reason}"

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def attack_once(kind: str, variant: str, transport: str, addr, ctx, a, hard_stop: float) -> dict:
    """One attack connection, from connect to the server's close (or `hard_stop`)."""
    r = {"kind": kind, "transport": transport, "variant": variant, "frames": 0, "bytes": 0,
         "how": "", "after": "", "last": None, "pings": 0, "settings": 0, "t_stop": None,
         "t_end": 0.0, "established": False}
    t0 = time.monotonic()
    scheme = "https" if transport == "tls" else "http"
    try:
        sock = socket.create_connection(addr, timeout=5)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as e:
        r["how"], r["t_end"] = f"connect failed ({type(e).__name__})", time.monotonic()
        return r
    wire = Wire(sock, ctx)
    try:
        try:
            alpn = wire.handshake()
        except (OSError, ssl.SSLError) as e:
            r["how"] = f"TLS handshake failed ({type(e).__name__})"
            return r
        if ctx is not None and alpn != "h2":
            r["how"] = f"ALPN {alpn!r}, not h2"
            return r
        r["established"] = True
        r["port"], r["wall_ready"] = sock.getsockname()[1], time.time()
        if kind == "rapid-reset":
            batches = reset_batches(scheme, a.streams_per_write)
        elif kind == "continuation":
            batches = continuation_batches(scheme, variant)
        else:
            batches = control_batches(kind)
        buf = bytearray()
        state = {"goaway": None}

        def take(got) -> str:
            """Feeds received bytes to the frame splitter; returns how the connection ended
            ("" while it is open)."""
            if not isinstance(got, bytes):
                return f"{got} on read"
            buf.extend(got)
            for k, flags, _stream, payload in h2.split_frames(buf):
                if k == h2.GOAWAY and state["goaway"] is None:
                    last, code = struct.unpack(">II", payload[:8])
                    state["goaway"], r["last"] = code, last & 0x7FFFFFFF
                    r["t_stop"] = time.monotonic() - t0
                    r["wall_goaway"] = time.time()
                elif k == h2.PING and flags & h2.ACK:
                    r["pings"] += 1
                elif k == h2.SETTINGS and flags & h2.ACK:
                    r["settings"] += 1
            return ""

        ended = ""
        pending = h2.client_preface(windows=False)  # preface + SETTINGS (not counted)
        while state["goaway"] is None and not ended:
            if time.monotonic() > hard_stop:
                r["how"] = "not stopped"
                return r
            data, n = next(batches)
            try:
                wire.send(pending + data)
            except socket.timeout:
                ended = "send blocked 5 s"
                break
            except ConnectionResetError:
                ended = "RST on send"
            except BrokenPipeError:
                ended = "EPIPE on send"
            except OSError as e:
                ended = f"{type(e).__name__} on send"
            if ended:
                # The server reset the connection while we were sending: what it sent before
                # (its GOAWAY) may still wait in the receive queue.
                wire.sock.setblocking(False)
                while state["goaway"] is None and not isinstance(got := wire.recv(), str) \
                        and got:
                    take(got)
                break
            pending = b""
            r["frames"] += n
            r["bytes"] += len(data)
            # Read whatever the server sent meanwhile (ACKs, GOAWAY), without waiting.
            while state["goaway"] is None and not ended and wire.readable():
                ended = take(wire.recv())
        if state["goaway"] is None:
            r["how"] = f"{ended}, no GOAWAY"
            return r
        r["how"] = f"GOAWAY {h2.code_name(state['goaway'])}"
        if ended:
            r["after"] = f"{ended} (while still sending)"
            return r
        # Stop sending; the server must close now (after its lingering read).
        deadline = time.monotonic() + CLOSE_WAIT_S
        while not r["after"]:
            left = deadline - time.monotonic()
            if left <= 0 or not wire.readable(left):
                r["after"] = f"still open {CLOSE_WAIT_S:g} s later"
                break
            got = wire.recv()
            if isinstance(got, str):
                r["after"] = got
    finally:
        r["t_end"], r["wall_end"] = time.monotonic(), time.time()
        wire.close()
    return r


def hold(transport: str, addr, ctx, a, stop_at: float, out: list) -> None:
    """--hold connections that each park a header block just under the limit (HEADERS without
    END_HEADERS and two 16 KiB CONTINUATIONs: 32.8 KiB of the 33 KiB allowed) and send
    nothing more; each waits for the server to close it (the header timeout), at least until
    `stop_at` and at most header-timeout + 2.5 s after it was parked; then it is closed from
    this side."""
    scheme = "https" if transport == "tls" else "http"
    block = (h2.encode_request(scheme, "localhost", common.PAGE_PATH)
             + b"\x00" + h2.encode_string("x-held") + h2.encode_int(1 << 20, 7))
    park = (h2.client_preface(windows=False) + h2.frame(h2.HEADERS, h2.END_STREAM, 1, block)
            + h2.frame(h2.CONTINUATION, 0, 1, b"h" * h2.MAX_FRAME) * 2)
    sel = selectors.DefaultSelector()
    last_park = 0.0
    for _ in range(a.hold):
        if time.monotonic() >= stop_at:
            break
        r = {"kind": "hold", "transport": transport, "variant": "", "frames": 0, "bytes": 0,
             "how": "", "after": "", "last": None, "pings": 0, "settings": 0, "t_stop": None,
             "t_end": 0.0, "established": False, "t0": time.monotonic()}
        out.append(r)
        try:
            sock = socket.create_connection(addr, timeout=5)
        except OSError as e:
            r["how"], r["t_end"] = f"connect failed ({type(e).__name__})", time.monotonic()
            continue
        wire = Wire(sock, ctx)
        try:
            if wire.handshake() not in (None, "h2"):
                raise ConnectionError("no ALPN h2")
            wire.send(park)
        except (OSError, ssl.SSLError) as e:
            r["how"], r["t_end"] = f"set-up failed ({type(e).__name__})", time.monotonic()
            wire.close()
            continue
        r["established"], r["frames"], r["bytes"] = True, 3, len(park)
        last_park = r["t_parked"] = time.monotonic()
        sel.register(sock, selectors.EVENT_READ, (wire, r, bytearray()))
    until = lambda: max(stop_at, last_park + a.header_timeout + 2.5)  # noqa: E731
    while sel.get_map() and time.monotonic() < until():
        for key, _ in sel.select(min(0.1, max(0.0, until() - time.monotonic()))):
            wire, r, buf = key.data
            got = wire.recv()
            if isinstance(got, bytes):
                buf += got
                for k, _flags, _stream, payload in h2.split_frames(buf):
                    if k == h2.GOAWAY and not r["how"]:
                        r["how"] = f"GOAWAY {h2.code_name(struct.unpack('>II', payload[:8])[1])}"
                        r["t_stop"] = time.monotonic() - r["t0"]
                continue
            r["after"], r["t_end"] = got, time.monotonic()
            r["how"] = r["how"] or "no GOAWAY"
            sel.unregister(wire.sock)
            wire.close()
    for key in list(sel.get_map().values()):
        wire, r, _ = key.data
        r["how"], r["after"], r["t_end"] = r["how"] or "held to the end", "closed by us", \
            time.monotonic()
        sel.unregister(wire.sock)
        wire.close()


def _attacker_thread(kind, transport, addr, ctx, a, stop_at, hard_stop, index, out) -> None:
    n = 0
    while time.monotonic() < stop_at:
        variant = CONTINUATION_VARIANTS[(index + n) % 3] if kind == "continuation" else ""
        out.append(attack_once(kind, variant, transport, addr, ctx, a, hard_stop))
        n += 1


def _attackers_main(transport, addr, kinds, a, stop_at, index, pipe) -> None:
    common._children.clear()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if a.attacker_sched == "idle":  # threads started below inherit it
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    else:
        os.nice(10)
    ctx = h2_context(None) if transport == "tls" else None  # the attacker verifies nothing
    out: list = []
    threads = [threading.Thread(target=_attacker_thread,
                                args=(k, transport, addr, ctx, a, stop_at, stop_at + GRACE_S,
                                      index, out), daemon=True)
               for k in kinds]
    if index == 0 and a.hold:
        threads.append(threading.Thread(target=hold, args=(transport, addr, ctx, a, stop_at, out),
                                        daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(stop_at + GRACE_S + CLOSE_WAIT_S + 5 - time.monotonic())
    pipe.send(list(out))
    pipe.close()


class Attackers:
    """One process (SCHED_IDLE, or nice 10 with --attacker-sched nice) attacking over one
    transport: a thread per kind, each making attack connections one after another until
    `stop_at`, and in the first process of each transport the --hold connections. `--conns`
    of them per transport."""

    def __init__(self, transport, addr, kinds, a, stop_at, index):
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        self._rx, tx = ctx.Pipe(duplex=False)
        self._p = ctx.Process(target=_attackers_main,
                              args=(transport, addr, kinds, a, stop_at, index, tx),
                              daemon=True)
        self._p.start()
        tx.close()

    def results(self, timeout: float) -> list:
        out = self._rx.recv() if self._rx.poll(timeout) else []
        self._p.join(5)
        if self._p.is_alive():
            self._p.kill()
        return out


if __name__ == "__main__":
    sys.exit(main())
