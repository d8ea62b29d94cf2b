#!/usr/bin/env python3
"""Linux's own race when a SO_REUSEPORT listener closes, with no tern involved.

Why this exists: `restart.py` once saw one new connection reset in ~230 000 requests with
net.ipv4.tcp_migrate_req=1, where migration promises none. This script shows the same with
plain Python listeners, so the cause is the kernel, not tern's shutdown path:

- a stable listener and, again and again, a second listener on the same port (SO_REUSEPORT),
  both answering every connection with a short HTTP response;
- the second one stops, accepts everything queued (as tern does at shutdown), and closes;
- six client processes connect, send a request and read the answer, without pause.

A connection whose handshake (or, with TCP_DEFER_ACCEPT, whose first bytes) the kernel is
turning into an accepted socket on the closing listener at the moment it closes is reset:
the child socket finds the listener no longer listening and is dropped with a RST
(`inet_csk_reqsk_queue_add` → `inet_child_forget`), before migration can move it. The
window is microseconds, so it takes many closes under load to see.

Runs as root in a fresh network namespace per setting (host sysctls untouched):
    python3 stress/reuseport_close_race.py [--closes 300]
Measured on the CI machine (2026-11-27): migrate=1: 2 failed of 93 744 (defer accept on),
2 of 99 574 (off); migrate=0: 71 of 109 390.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import threading
import time

PORT = 18080
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


def listener(defer: bool) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if defer:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, 1)
    s.bind(("127.0.0.1", PORT))
    s.listen(1024)
    return s


def answer(c: socket.socket) -> None:
    try:
        c.settimeout(5)
        got = b""
        while b"\r\n\r\n" not in got:
            more = c.recv(4096)
            if not more:
                break
            got += more
        c.sendall(ANSWER)
    except OSError:
        pass
    c.close()


def serve(s: socket.socket, stop: threading.Event) -> None:
    s.settimeout(0.05)
    while not stop.is_set():
        try:
            c, _ = s.accept()
        except OSError:
            continue
        threading.Thread(target=answer, args=(c,), daemon=True).start()


def client(stop, results) -> None:
    ok = failed = 0
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", PORT), timeout=5) as c:
                c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                got = b""
                while more := c.recv(4096):
                    got += more
            ok, failed = (ok + 1, failed) if got.endswith(b"ok") else (ok, failed + 1)
        except OSError:
            failed += 1
    results.put((ok, failed))


def inner(migrate: int, defer: bool, closes: int) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with open("/proc/sys/net/ipv4/tcp_migrate_req", "w") as f:
        f.write(str(migrate))
    stable = listener(defer)
    threading.Thread(target=serve, args=(stable, threading.Event()), daemon=True).start()
    stop, results = mp.Event(), mp.Queue()
    clients = [mp.Process(target=client, args=(stop, results)) for _ in range(6)]
    for p in clients:
        p.start()
    for _ in range(closes):
        closing = listener(defer)
        done = threading.Event()
        t = threading.Thread(target=serve, args=(closing, done))
        t.start()
        time.sleep(0.05)
        done.set()
        t.join()
        closing.setblocking(False)
        while True:  # take everything queued, then close: what tern does at shutdown
            try:
                c, _ = closing.accept()
            except BlockingIOError:
                break
            threading.Thread(target=answer, args=(c,), daemon=True).start()
        closing.close()
    stop.set()
    ok = failed = 0
    for _ in clients:
        a, b = results.get()
        ok, failed = ok + a, failed + b
    print(f"migrate={migrate} defer_accept={int(defer)} closes={closes}: "
          f"{failed} failed of {ok + failed} requests", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--closes", type=int, default=300)
    ap.add_argument("--inner", nargs=2, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.inner:
        inner(a.inner[0], bool(a.inner[1]), a.closes)
        return 0
    if os.geteuid() != 0:
        print("needs root (a fresh network namespace per setting)", file=sys.stderr)
        return 2
    for migrate, defer in ((1, 1), (1, 0), (0, 1)):
        subprocess.run(["unshare", "--net", "--", sys.executable, os.path.abspath(__file__),
                        "--closes", str(a.closes), "--inner", str(migrate), str(defer)],
                       check=True, timeout=300)
    return 0


if __name__ == "__main__":
    sys.exit(main())
