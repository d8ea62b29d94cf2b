#!/usr/bin/env python3
"""Garbage flood: waves of connections send random bytes, oversized junk, HTTP/2 prefaces,
half-valid heads followed by garbage, heads that never end, and bad chunked bodies; some
clients abort (close or RST) right after sending. A normal client keeps making keep-alive
and new-connection requests throughout.

Goals: the server stays up; every connection that waited was closed by the server (EOF or
RST) within header-timeout + linger + slack; no normal request fails during or after the
flood; peak RSS stays within --rss-budget-mib of the start.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import struct
import sys
import time

import common
from common import Report, mib

HEAD = b"GET /index.html HTTP/1.1\r\nHost: stress\r\n"


def printable(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(0x21, 0x7F) for _ in range(n))


def junk(rng: random.Random, n: int) -> bytes:
    return rng.randbytes(n)


# (name, weight, payload maker). Every payload is either invalid at once or a head that never
# completes (the header timeout must end it).
KINDS = [
    ("random-small", 25, lambda r: junk(r, r.randrange(1, 4096))),
    ("random-large", 10, lambda r: junk(r, r.randrange(16 << 10, 96 << 10))),
    ("random+crlfcrlf", 10, lambda r: junk(r, r.randrange(1, 2048)) + b"\r\n\r\n"),
    ("head+garbage", 20, lambda r: HEAD + junk(r, r.randrange(1, 8192))),
    ("h2-preface", 5, lambda r: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + junk(r, 64)),
    ("bad-chunked", 10, lambda r: b"POST / HTTP/1.1\r\nHost: s\r\nTransfer-Encoding: chunked"
                                  b"\r\n\r\n" + printable(r, 40) + b"\r\n" + junk(r, 500)),
    ("endless-head", 5, lambda r: HEAD + b"X-Junk: " + printable(r, r.randrange(1, 2000))),
    ("huge-head", 5, lambda r: HEAD + b"X-Junk: " + printable(r, 40 << 10)),
    ("bare-lf", 10, lambda r: b"GET / HTTP/1.1\nHost: s\n\n" + junk(r, 100)),
]


async def attacker(i: int, addr, rng: random.Random, abort: str | None, wait_s: float, out):
    kind_names = [k[0] for k in KINDS]
    weights = [k[1] for k in KINDS]
    kind = rng.choices(kind_names, weights)[0]
    payload = dict((k[0], k[2]) for k in KINDS)[kind](rng)
    t0 = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(*addr), 5)
    except Exception as e:
        out.append((kind, "connect-error", repr(e), 0.0))
        return
    sock = writer.get_extra_info("socket")
    first = b""
    how = None
    try:
        writer.write(payload)
        if abort:
            if abort == "rst":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.close()
            out.append((kind, f"aborted-by-client-{abort}", "", 0.0))
            return
        await asyncio.wait_for(writer.drain(), wait_s)
        deadline = t0 + wait_s
        while True:
            data = await asyncio.wait_for(reader.read(65536), max(0.01, deadline - time.monotonic()))
            if not data:
                how = "EOF"
                break
            if len(first) < 12:
                first += data[: 12 - len(first)]
    except (ConnectionResetError, BrokenPipeError):
        how = "RST"
    except asyncio.TimeoutError:
        how = "still-open"
    except OSError as e:
        how = f"error {e!r}"
    finally:
        writer.close()
    status = first[9:12].decode(errors="replace") if first.startswith(b"HTTP/1.1 ") else "-"
    out.append((kind, how, status, time.monotonic() - t0))


async def flood(addr, n: int, wave: int, gap: float, wait_s: float, seed: int, out):
    rng = random.Random(seed)
    tasks = []
    for start in range(0, n, wave):
        for i in range(start, min(n, start + wave)):
            r = random.Random(rng.random())
            x = r.random()
            abort = "close" if x < 0.05 else "rst" if x < 0.10 else None
            tasks.append(asyncio.create_task(attacker(i, addr, r, abort, wait_s, out)))
        await asyncio.sleep(gap)
    await asyncio.gather(*tasks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="600 connections")
    ap.add_argument("--conns", type=int, default=2000)
    ap.add_argument("--wave", type=int, default=250, help="connections opened at once")
    ap.add_argument("--gap", type=float, default=0.3, help="seconds between waves")
    ap.add_argument("--header-timeout", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rss-budget-mib", type=float, default=64.0)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    if a.quick:
        a.conns = min(a.conns, 600)
    common.raise_nofile()

    srv = common.Tern(["--header-timeout", str(a.header_timeout)], workers=a.workers)
    rep = Report(f"garbage_flood: {a.conns} connections in waves of {a.wave}, seed {a.seed}")
    rep.add("server", f"pid {srv.pid}, {srv.host}:{srv.port}, {srv.workers} workers, "
            f"--header-timeout {a.header_timeout}")
    for _ in range(20):
        common.get_once(srv.addr)
    time.sleep(0.5)
    rss_start = srv.rss_kb()
    sampler = common.RssSampler(srv.pid, 0.05)
    probe = common.Probe(srv.addr, keep_alive_conns=2, new_conn_clients=1, pause=0.01)
    time.sleep(0.3)

    out: list = []
    # The server must close each socket: 400/431/505 then a lingering close (<= 2 s), or
    # a 408 at the header timeout.
    wait_s = a.header_timeout + 2 + 5
    t0 = time.monotonic()
    asyncio.run(flood(srv.addr, a.conns, a.wave, a.gap, wait_s, a.seed, out))
    t1 = time.monotonic()
    time.sleep(0.5)
    samples = probe.results()
    peak = sampler.stop()
    after_ok = sum(
        1 for _ in range(20) if common.get_once(srv.addr) == (200, common.PAGE)
    )
    time.sleep(1.0)
    rss_after = srv.rss_kb()

    by_how: dict[str, int] = {}
    by_status: dict[str, int] = {}
    by_kind: dict[str, list] = {}
    for kind, how, status, dur in out:
        by_how[how] = by_how.get(how, 0) + 1
        if not how.startswith("aborted"):
            by_status[status] = by_status.get(status, 0) + 1
            by_kind.setdefault(kind, []).append(dur)
    waited = sum(v for k, v in by_how.items() if not k.startswith("aborted"))
    closed = by_how.get("EOF", 0) + by_how.get("RST", 0)
    during = common.latency_summary(samples, t0, t1)
    rep.add("flood", f"{len(out)} connections in {t1 - t0:.1f} s; "
            + ", ".join(f"{k} {v}" for k, v in sorted(by_how.items())))
    rep.add("first status seen", ", ".join(f"{k} {v}" for k, v in sorted(by_status.items())))
    rep.add("time to close p50/max", ", ".join(
        f"{k} {sorted(v)[len(v) // 2]:.2f}/{max(v):.2f}s" for k, v in sorted(by_kind.items())))
    rep.add("normal client (flood)", common.fmt_lat(during))
    if during["first_errors"]:
        rep.add("first errors", during["first_errors"])
    rep.add("after the flood", f"{after_ok}/20 new-connection requests served")
    rep.add("RSS start / peak / after", f"{mib(rss_start)} / {mib(peak)} / {mib(rss_after)}")

    rep.goal(srv.alive(), "server still running")
    rep.goal(len(out) == a.conns and by_how.get("connect-error", 0) == 0, "every connection opened")
    rep.goal(closed == waited, f"every waiting socket closed by the server ({closed}/{waited})")
    rep.goal(during["errors"] == 0 and during["requests"] > 0, "no normal request failed during the flood")
    rep.goal(after_ok == 20, "normal requests served after the flood")
    rep.goal(peak - rss_start <= a.rss_budget_mib * 1024,
             f"peak RSS within {a.rss_budget_mib:.0f} MiB of start")
    code = srv.terminate()
    rep.goal(code == 0, f"SIGTERM exit code 0 (got {code})")
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
