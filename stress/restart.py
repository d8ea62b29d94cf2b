#!/usr/bin/env python3
"""Restart under load with zero failed requests.

A load generator (keep-alive clients and one-request-per-connection clients, no pauses) runs
while tern is restarted several times by the documented procedure: start a NEW tern on the
same port (SO_REUSEPORT lets it bind), wait for its start-up line, send SIGTERM to the OLD one,
wait for it to exit 0.

Counting: a request is a failure if its connection is refused or reset on a NEW connection,
if the response is truncated, if the status or body is wrong, or if it times out. A keep-alive
connection that the server ends between requests (EOF or RST before any byte of the response
to a request sent on an already used connection) is retried once on a new connection, as
browsers do for idempotent requests; the retry is counted, and its own failure is a failure.

When run as root the test runs three times, each inside a fresh network namespace
(`unshare --net`, `lo` up) so the host's sysctls are never touched:
  - held: one listening socket bound here and handed to every tern as a service manager would
    (socket activation), tcp_migrate_req=0: goal zero failures (no listener ever closes);
  - net.ipv4.tcp_migrate_req=1 and =0, each process binding its own SO_REUSEPORT listeners:
    for information. Closing a listener races in Linux itself (a connection completing on it
    in the same microseconds is reset even with migration; reuseport_close_race.py shows it
    with no tern), so zero failures cannot be promised there.
Without root (or with --no-netns) it runs held (the goal) and own-listeners (information) in
the current namespace.

--tls: the same over HTTPS (Python's ssl module: TLS 1.3, the test CA, SNI localhost). Every
process gets the same certificate and the same --tls-ticket-keys file, so a session ticket
issued by one process is accepted by the next. Each client keeps its latest session and offers
it on every new connection (as browsers do); a TLS handshake that fails on a new connection is
a failed request. Counted: new connections, how many offered a session, how many resumed it
(goal: all). And, made deterministic: before each restart the orchestrator takes 20 sessions
(10 TLS 1.3, 10 TLS 1.2) from the old process while it is the only one listening, and after
the old process has exited offers them to the new one (goal: all resumed).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import common
from common import NoResponse, Report, Truncated

SYSCTL = Path("/proc/sys/net/ipv4/tcp_migrate_req")


RACE_NOTE = (
    "held is the goal; migrate=1 and migrate=0 (every process binds its own SO_REUSEPORT "
    "listeners and the old one closes them) are information: closing a listener races in "
    "Linux itself, where a connection whose handshake completes in the same microseconds is "
    "reset even with tcp_migrate_req=1 (stress/reuseport_close_race.py shows it with no tern: "
    "plain Python listeners)")


# ----------------------------------------------------------------------------- load


def _client(addr, keep_alive: bool, stop, counts: dict, lock: threading.Lock, failures: list,
            tls: common.ClientTls | None = None, misses: list | None = None):
    """One client thread. Whatever goes wrong in it (even a bug of this script) is a failed
    request, never a thread that silently stops counting."""
    try:
        _client_loop(addr, keep_alive, stop, counts, lock, failures, tls, misses)
    except BaseException as e:
        with lock:
            counts["failed"] += 1
            counts["client_crashed"] = counts.get("client_crashed", 0) + 1
            failures.append(f"{time.monotonic():.3f} client thread crashed: {e!r}")


def _client_loop(addr, keep_alive, stop, counts, lock, failures, tls, misses):
    sock = None
    used = False  # the connection has carried at least one full response
    session = None  # over TLS: the latest session with a ticket, offered on new connections

    def fail(why: str):
        with lock:
            counts["failed"] += 1
            if len(failures) < 20:
                failures.append(f"{time.monotonic():.3f} {why}")

    def new_conn():
        nonlocal session
        s = common.connect(addr, timeout=5, tls=tls, session=session)
        if tls is not None:
            with lock:
                counts["tls_conns"] += 1
                if session is not None:
                    counts["tls_offered"] += 1
                    if s.session_reused:
                        counts["tls_resumed"] += 1
                    elif misses is not None and len(misses) < 20:
                        misses.append(f"{time.monotonic():.3f} {s.version()}")
        return s

    def keep_session():
        # After a response the server's tickets have been read; keep the newest session.
        nonlocal session
        if tls is not None and sock is not None:
            latest = sock.session
            if latest is not None and latest.has_ticket:
                session = latest

    while not stop.is_set():
        attempt_reused = sock is not None and used
        try:
            if sock is None:
                try:
                    sock = new_conn()
                except OSError as e:
                    fail(f"connect: {e!r}")
                    continue
                used = False
            sock.sendall(common.request_bytes(close=not keep_alive))
            status, body, closes = common.read_response(sock)
        except (NoResponse, OSError) as e:
            sock.close()
            sock = None
            if not attempt_reused:
                fail(f"new connection, no response: {e!r}")
                continue
            # Closed between requests: retry once on a new connection.
            with lock:
                counts["retried"] += 1
            try:
                sock = new_conn()
                used = False
                sock.sendall(common.request_bytes(close=not keep_alive))
                status, body, closes = common.read_response(sock)
            except (NoResponse, Truncated, OSError) as e2:
                fail(f"retry on new connection: {e2!r}")
                if sock is not None:
                    sock.close()
                sock = None
                continue
        except Truncated as e:
            fail(f"truncated response: {e}")
            sock.close()
            sock = None
            continue
        if status != 200 or body != common.PAGE:
            fail(f"status {status}, {len(body)} bytes")
        else:
            with lock:
                counts["ok"] += 1
        if not used:
            keep_session()
        used = True
        if closes or not keep_alive:
            with lock:
                counts["server_close" if keep_alive else "closed_by_us"] += 1
            sock.close()
            sock = None
    if sock is not None:
        sock.close()


def _load_main(addr, keep_alive: int, new_conn: int, stop, pipe, tls=None):
    common._children.clear()  # forked: the parent's servers are not ours to kill
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    counts = {"ok": 0, "failed": 0, "retried": 0, "server_close": 0, "closed_by_us": 0,
              "tls_conns": 0, "tls_offered": 0, "tls_resumed": 0}
    failures: list = []
    misses: list = []  # over TLS: when a session was offered and not resumed
    lock = threading.Lock()
    threads = [
        threading.Thread(target=_client,
                         args=(addr, ka, stop, counts, lock, failures, tls, misses))
        for ka in [True] * keep_alive + [False] * new_conn
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pipe.send((counts, failures, misses))


class Load:
    """Two processes (keep-alive clients, new-connection clients) so neither waits on the
    other's GIL and the orchestrator stays responsive."""

    def __init__(self, addr, keep_alive: int, new_conn: int, tls=None):
        ctx = mp.get_context("fork")
        self.stop = ctx.Event()
        self.parts = []
        for ka, nc in ((keep_alive, 0), (0, new_conn)):
            rx, tx = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_load_main, args=(addr, ka, nc, self.stop, tx, tls),
                            daemon=True)
            p.start()
            tx.close()
            self.parts.append((p, rx))

    def finish(self):
        self.stop.set()
        total: dict = {}
        failures: list = []
        misses: list = []
        for p, rx in self.parts:
            if rx.poll(20):
                counts, f, m = rx.recv()
                for k, v in counts.items():
                    total[k] = total.get(k, 0) + v
                failures += f
                misses += m
            else:
                total["load_process_hung"] = total.get("load_process_hung", 0) + 1
            p.join(5)
            if p.is_alive():
                p.kill()
        return total, failures, misses


# ----------------------------------------------------------------------------- cross-process


class CrossProcess:
    """Sessions taken from the old process while it alone listens, offered to the new one once
    the old has exited: resumption across a restart, made deterministic (TLS 1.3 and 1.2)."""

    def __init__(self, tls: common.TlsFiles, per_version: int):
        self.clients = {"TLSv1.3": tls.client(),
                        "TLSv1.2": tls.client(max_version=ssl.TLSVersion.TLSv1_2)}
        self.per_version = per_version
        self.held: list = []
        self.tried = {v: 0 for v in self.clients}
        self.resumed = {v: 0 for v in self.clients}
        self.failed: list[str] = []

    def _request(self, addr, client, session=None):
        with common.connect(addr, timeout=5, tls=client, session=session) as s:
            s.sendall(common.request_bytes(close=True))
            status, body, _ = common.read_response(s)
            if status != 200 or body != common.PAGE:
                raise RuntimeError(f"status {status}, {len(body)} bytes")
            return s.version(), s.session_reused, s.session

    def take(self, addr) -> None:
        self.held = []
        for want, client in self.clients.items():
            for _ in range(self.per_version):
                try:
                    version, _, session = self._request(addr, client)
                    if version != want or not session.has_ticket:
                        self.failed.append(f"take: {version}, ticket {session.has_ticket}")
                        continue
                    self.held.append((want, client, session))
                except Exception as e:
                    self.failed.append(f"take: {e!r}")

    def offer(self, addr) -> None:
        for want, client, session in self.held:
            self.tried[want] += 1
            try:
                _, reused, _ = self._request(addr, client, session)
                self.resumed[want] += reused
            except Exception as e:
                self.failed.append(f"offer: {e!r}")
        self.held = []


# ----------------------------------------------------------------------------- one run


def run_once(a, held: bool = False) -> dict:
    """Starts tern, loads it, restarts it `a.restarts` times; returns the numbers."""
    common.raise_nofile()
    migrate = SYSCTL.read_text().strip() if SYSCTL.exists() else "absent"
    site = common.make_site()
    args = ["--shutdown-grace", "5"]
    tls = common.TlsFiles() if a.tls else None
    if tls is not None:
        # Every process gets the same ticket-key file (created 0600 by the first one).
        args += ["--tls-ticket-keys", tls.ticket_keys]
    cross = CrossProcess(tls, per_version=10) if tls else None
    # Held: one listening socket, bound here and handed to every process as a service manager
    # would (socket activation), so no listener is ever closed.
    holder = None
    if held:
        holder = socket.socket()
        holder.bind(("127.0.0.1", 0))
        holder.listen(1024)
    first_listen = f"127.0.0.1:{holder.getsockname()[1]}" if holder else "127.0.0.1:0"
    old = common.Tern(args, listen=first_listen, workers=a.workers, site=site, tls=tls,
                      inherit=holder)
    port = old.port
    hint_seen = [bool(old.log_matching("tcp_migrate_req"))]
    load = Load(old.addr, a.keep_alive, a.new_conn, tls=tls.client() if tls else None)
    time.sleep(a.interval)
    exits, stop_ms, restart_times = [], [], []
    for _ in range(a.restarts):
        if cross:
            cross.take(old.addr)  # the old process is the only one listening
        new = common.Tern(args, listen=f"127.0.0.1:{port}", workers=a.workers, site=site,
                          tls=tls, inherit=holder)
        hint_seen.append(bool(new.log_matching("tcp_migrate_req")))
        t0 = time.monotonic()
        exits.append(old.terminate(timeout=15))
        stop_ms.append((time.monotonic() - t0) * 1000)
        restart_times.append(f"{t0:.3f}-{time.monotonic():.3f}")
        old = new
        if cross:
            cross.offer(old.addr)  # the old one has exited: only the new one listens
        time.sleep(a.interval)
    counts, failures, misses = load.finish()
    old.terminate()
    if cross:
        counts["failed"] += len(cross.failed)
        failures += [f"cross-process check: {f}" for f in cross.failed]
    if holder:
        holder.close()
    return {
        "held": held,
        "tls": bool(tls),
        "cross_tried": cross.tried if cross else {},
        "cross_resumed": cross.resumed if cross else {},
        "tcp_migrate_req": migrate,
        "restarts": a.restarts,
        "exit_codes": exits,
        "old_exit_ms_max": round(max(stop_ms), 1) if stop_ms else 0,
        "hint_lines": hint_seen,
        "counts": counts,
        "failures": failures,
        "not_resumed": misses,
        "restart_times": restart_times,
    }


def inner(a) -> int:
    """Runs inside a fresh network namespace: lo up, sysctl set, one run, JSON on stdout."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    SYSCTL.write_text(str(a.migrate))
    print("RESULT " + json.dumps(run_once(a, held=a.held)), flush=True)
    return 0


def in_netns(a, migrate: int, held: bool = False) -> dict:
    cmd = [
        "unshare", "--net", "--", sys.executable, os.path.abspath(__file__), "--inner",
        *(["--held"] if held else []), "--migrate", str(migrate),
        "--restarts", str(a.restarts), "--interval", str(a.interval),
        "--keep-alive", str(a.keep_alive), "--new-conn", str(a.new_conn),
        "--workers", str(a.workers), *(["--tls"] if a.tls else []),
    ]
    env = dict(os.environ, TERN_BIN=common.tern_binary())
    p = common.track(subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, text=True))
    out, _ = p.communicate(timeout=a.restarts * (a.interval + 20) + 30)
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"netns run (tcp_migrate_req={migrate}) gave no result (rc {p.returncode})")


def describe(rep: Report, label: str, r: dict) -> None:
    c = r["counts"]
    total = c.get("ok", 0) + c.get("failed", 0)
    rep.add(f"{label}", f"{r['restarts']} restarts, {total} requests, {c.get('failed', 0)} failed, "
            f"{c.get('retried', 0)} retried after a keep-alive close")
    rep.add(f"{label} exits", f"old processes exited {r['exit_codes']}, slowest "
            f"{r['old_exit_ms_max']} ms after SIGTERM; start-up hint logged: "
            f"{'yes' if any(r['hint_lines']) else 'no'}")
    if r.get("tls"):
        conns, offered = c.get("tls_conns", 0), c.get("tls_offered", 0)
        rep.add(f"{label} TLS", f"{conns} new connections, {offered} offered a session, "
                f"{c.get('tls_resumed', 0)} resumed (the other {conns - offered} had no session "
                "yet: each client's first)")
        tried, resumed = r["cross_tried"], r["cross_resumed"]
        rep.add(f"{label} cross-process", "sessions from the old process resumed on the new "
                "one: " + ", ".join(f"{v} {resumed[v]}/{tried[v]}" for v in tried))
    for f in r["failures"][:5]:
        rep.add(f"{label} failure", f)
    if r.get("not_resumed"):
        rep.add(f"{label} not resumed", f"at {r['not_resumed'][:5]}; old processes stopped "
                f"at {r['restart_times']}")


def tls_goals(rep: Report, r: dict) -> None:
    c = r["counts"]
    rep.goal(c.get("tls_offered", 0) > 0 and c.get("tls_resumed", 0) == c.get("tls_offered", 0),
             "every new HTTPS connection that offered a session resumed it (shared ticket keys)")
    tried, resumed = r["cross_tried"], r["cross_resumed"]
    rep.goal(sum(tried.values()) > 0 and resumed == tried,
             "every session taken from an old process resumed on its successor (TLS 1.3, 1.2)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 restarts instead of 8")
    ap.add_argument("--restarts", type=int, default=8)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between restarts")
    ap.add_argument("--keep-alive", type=int, default=6, help="keep-alive client threads")
    ap.add_argument("--new-conn", type=int, default=6, help="new-connection client threads")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tls", action="store_true",
                    help="over HTTPS, every process with the same --tls-ticket-keys file")
    ap.add_argument("--no-netns", action="store_true", help="run once in this namespace")
    ap.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--migrate", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--held", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.quick:
        a.restarts = min(a.restarts, 3)
    if a.inner:
        return inner(a)

    rep = Report(f"restart{' over TLS' if a.tls else ''}: {a.restarts} restarts under load "
                 f"({a.keep_alive} keep-alive + {a.new_conn} new-connection "
                 f"{'HTTPS ' if a.tls else ''}clients)")
    use_netns = not a.no_netns and os.geteuid() == 0 and SYSCTL.exists()
    if use_netns:
        held = in_netns(a, 0, held=True)
        on = in_netns(a, 1)
        off = in_netns(a, 0)
        rep.add("mode", "fresh network namespace per run (unshare --net); host sysctl untouched")
        describe(rep, "held", held)
        describe(rep, "migrate=1", on)
        describe(rep, "migrate=0", off)
        rep.goal(held["counts"].get("failed", 1) == 0 and held["counts"].get("ok", 0) > 0,
                 "zero failed requests with the listening socket held across restarts "
                 "(socket activation; tcp_migrate_req=0)")
        rep.goal(all(c == 0 for c in held["exit_codes"] + on["exit_codes"] + off["exit_codes"]),
                 "every old process exited 0 after SIGTERM")
        rep.goal(not any(on["hint_lines"] + held["hint_lines"]) and all(off["hint_lines"]),
                 "tcp_migrate_req hint logged exactly when the sysctl is 0 and tern binds "
                 "its own listeners")
        if a.tls:
            tls_goals(rep, held)
        rep.add("note", RACE_NOTE)
    else:
        held = run_once(a, held=True)
        r = run_once(a)
        rep.add("mode", f"current namespace, tcp_migrate_req={r['tcp_migrate_req']} "
                "(run as root for the runs in fresh network namespaces)")
        describe(rep, "held", held)
        describe(rep, "reuseport", r)
        rep.goal(held["counts"].get("failed", 1) == 0 and held["counts"].get("ok", 0) > 0,
                 "zero failed requests with the listening socket held across restarts")
        rep.goal(all(c == 0 for c in held["exit_codes"] + r["exit_codes"]),
                 "every old process exited 0 after SIGTERM")
        if a.tls:
            tls_goals(rep, held)
        rep.add("note", RACE_NOTE)
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
