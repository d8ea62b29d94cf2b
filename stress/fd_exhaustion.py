#!/usr/bin/env python3
"""File-descriptor exhaustion: tern runs under RLIMIT_NOFILE=256 (soft and hard, so its own
raise cannot lift it); connections are opened and held until it cannot accept any more, and
then some more that wait in the kernel's accept queue.

Goals: the server stays up; a keep-alive connection opened before the flood is still served
while the server is out of descriptors; it does not spin (CPU while exhausted < 30 % of one
core) or flood its log (<= 6 accept warnings per worker per second: the
runtime's limiter allows 5 and one summary); once the flood closes, a
new request succeeds within 2 s and the descriptor count returns to its baseline.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time

import common
from common import Report, mib


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    import os

    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="hold the exhausted state 2 s, not 5 s")
    ap.add_argument("--nofile", type=int, default=256)
    ap.add_argument("--extra", type=int, default=200, help="connections beyond the limit")
    ap.add_argument("--hold", type=float, default=5.0, help="seconds to stay exhausted")
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    if a.quick:
        a.hold = min(a.hold, 2.0)
    common.raise_nofile()

    srv = common.Tern(workers=a.workers, nofile=a.nofile)
    rep = Report(f"fd_exhaustion: RLIMIT_NOFILE={a.nofile}, {a.workers} workers")
    with open(f"/proc/{srv.pid}/limits") as f:
        lim = next(l for l in f if l.startswith("Max open files")).split()[3:5]
    rep.add("server", f"pid {srv.pid}, {srv.host}:{srv.port}, open-file limit {'/'.join(lim)}")
    fd_base = srv.fd_count()

    # A keep-alive connection from before the flood.
    keeper = socket.create_connection(srv.addr, timeout=2)
    keeper.sendall(common.request_bytes())
    common.read_response(keeper)

    # Phase 1: connections that are accepted and served, until answers stop coming.
    t0 = time.monotonic()
    served: list[socket.socket] = []
    unanswered: list[socket.socket] = []
    while len(served) + len(unanswered) < a.nofile + 50:
        s = socket.create_connection(srv.addr, timeout=2)
        s.sendall(common.request_bytes())
        s.settimeout(0.3 if unanswered else 1.0)
        try:
            status, body, _ = common.read_response(s)
            if status != 200:
                raise RuntimeError(status)
            if unanswered:
                # Served after one was not: still room (a worker's fd back-off). Keep going.
                served.extend(unanswered)
                unanswered.clear()
            served.append(s)
        except (common.NoResponse, common.Truncated, OSError):
            unanswered.append(s)
            if len(unanswered) >= 5:
                break
    # Phase 2: more connections that can only wait in the accept queue.
    queued = unanswered
    for _ in range(a.extra):
        try:
            s = socket.create_connection(srv.addr, timeout=2)
            s.sendall(common.request_bytes())
            queued.append(s)
        except OSError:
            break
    fill_time = time.monotonic() - t0
    fd_full = srv.fd_count()

    # Hold the exhausted state; measure CPU and whether the old connection is still served.
    cpu0, w0 = cpu_seconds(srv.pid), time.monotonic()
    warn0 = len(srv.log_matching("accept:"))
    keeper_ok = 0
    keeper_err = None
    keeper_lat = []
    while time.monotonic() - w0 < a.hold:
        try:
            k0 = time.monotonic()
            keeper.sendall(common.request_bytes())
            status, body, _ = common.read_response(keeper)
            keeper_lat.append(time.monotonic() - k0)
            keeper_ok += status == 200 and body == common.PAGE
        except Exception as e:
            keeper_err = repr(e)
            break
        time.sleep(0.1)
    held = time.monotonic() - w0
    cpu_pct = (cpu_seconds(srv.pid) - cpu0) / held * 100
    warnings = len(srv.log_matching("accept:")) - warn0
    alive_full = srv.alive()
    rss_full = srv.rss_kb()

    # Release the flood and time the first new request that succeeds.
    for s in served + queued:
        s.close()
    recovered = common.wait_until_served(srv.addr, within=5.0)
    time.sleep(1.0)
    fd_after = srv.fd_count()

    rep.add("flood", f"{len(served)} connections accepted and served, then {len(queued)} "
            f"more left waiting in the accept queue ({fill_time:.1f} s)")
    rep.add("server fds", f"baseline {fd_base}, exhausted {fd_full}, after release {fd_after}")
    rep.add("while exhausted", f"{held:.1f} s: server CPU {cpu_pct:.1f} % of a core, "
            f"{warnings} 'accept: ... pausing' log lines, RSS {mib(rss_full)}")
    rep.add("old keep-alive conn", f"{keeper_ok} requests served while exhausted"
            + (f", max {max(keeper_lat) * 1000:.1f} ms" if keeper_lat else "")
            + (f"; error {keeper_err}" if keeper_err else ""))
    rep.add("recovery", "never (5 s)" if recovered is None
            else f"first new request served {recovered * 1000:.0f} ms after the flood closed")
    if srv.log_matching("accept:"):
        rep.add("sample log line", srv.log_matching("accept:")[0][-110:])

    rep.goal(alive_full and srv.alive(), "server process alive throughout")
    rep.goal(fd_full >= a.nofile - 5, f"server actually reached its fd limit ({fd_full}/{a.nofile})")
    rep.goal(keeper_ok > 0 and keeper_err is None, "existing keep-alive connection served while exhausted")
    rep.goal(cpu_pct < 30, "no busy loop while exhausted (CPU < 30 %)")
    rep.goal(warnings <= 6 * a.workers * (held + 1), "accept warnings rate-limited (<= 6/s per worker)")
    rep.goal(recovered is not None and recovered < 2.0, "new request served < 2 s after release")
    rep.goal(fd_after <= fd_base + 2, "descriptor count back to baseline")
    keeper.close()
    code = srv.terminate()
    rep.goal(code == 0, f"SIGTERM exit code 0 (got {code})")
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
