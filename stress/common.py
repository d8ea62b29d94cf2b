"""Shared helpers for the stress scripts: find/build the binary, start tern (`serve`, or `demo`
for its /statusz) on an ephemeral port (plain HTTP, HTTPS with a throwaway PKI from
scripts/tls-test-certs, or both), read its RSS, make HTTP/1.1 requests over raw sockets or
Python's ssl module, and make sure every child process dies when the script ends (normally,
by an exception, or by SIGINT/SIGTERM).

Python 3.11 standard library only.
"""

from __future__ import annotations

import atexit
import os
import re
import resource
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# "tern: serving DIR on http://A:1 and https://B:2 with 2 workers[; self-signed ...]"
START_LINE = re.compile(r"tern: .* on (.+?) with (\d+) workers?")
LISTENER = re.compile(r"(https?)://(\S+?):(\d+)")

# A small page the normal clients fetch; its length is checked on every response.
PAGE = b"<!doctype html><title>stress</title><p>hello from the stress suite</p>\n"
PAGE_PATH = "/index.html"

_children: list[subprocess.Popen] = []


# ----------------------------------------------------------------------------- processes


def _kill_children() -> None:
    for p in _children:
        if p.poll() is None:
            try:
                p.kill()
            except OSError:
                pass
    for p in _children:
        try:
            p.wait(timeout=5)
        except Exception:
            pass


def _on_signal(signum, _frame):
    _kill_children()
    sys.exit(128 + signum)


atexit.register(_kill_children)
signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGINT, _on_signal)


def track(p: subprocess.Popen) -> subprocess.Popen:
    """Registers a child so that it is killed when this script exits, whatever the reason."""
    _children.append(p)
    return p


def raise_nofile() -> int:
    """Raises this process's soft RLIMIT_NOFILE to its hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def tern_binary() -> str:
    """$TERN_BIN if set; else the release binary under $CARGO_TARGET_DIR or REPO/target,
    building it with `cargo build --release` if neither exists."""
    env = os.environ.get("TERN_BIN")
    if env:
        if not os.access(env, os.X_OK):
            sys.exit(f"stress: TERN_BIN={env} is not an executable file")
        return env
    candidates = []
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "release" / "tern")
    candidates.append(REPO / "target" / "release" / "tern")
    for c in candidates:
        if os.access(c, os.X_OK):
            return str(c)
    print("stress: no release binary found; running cargo build --release", file=sys.stderr)
    subprocess.run(["cargo", "build", "--release", "-p", "tern"], cwd=REPO, check=True)
    for c in candidates:
        if os.access(c, os.X_OK):
            return str(c)
    sys.exit("stress: cargo build finished but no release/tern found; set TERN_BIN")


def make_site() -> str:
    d = tempfile.mkdtemp(prefix="tern-stress-")
    Path(d, "index.html").write_bytes(PAGE)
    atexit.register(lambda: _rmtree(d))
    return d


def _rmtree(d: str) -> None:
    import shutil

    shutil.rmtree(d, ignore_errors=True)


# ----------------------------------------------------------------------------- TLS


class TlsFiles:
    """A throwaway PKI made by scripts/tls-test-certs (root CA -> intermediate -> ECDSA P-256
    leaf for localhost, 127.0.0.1 and ::1), removed when the script ends. `ticket_keys` is a
    path for --tls-ticket-keys (tern creates it 0600 on first use)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tern-stress-tls-")
        atexit.register(lambda: _rmtree(self.dir))
        subprocess.run(
            [str(REPO / "scripts" / "tls-test-certs"), self.dir],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.ca = os.path.join(self.dir, "ca.pem")
        self.cert = os.path.join(self.dir, "leaf-fullchain.pem")
        self.key = os.path.join(self.dir, "leaf.key")
        self.ticket_keys = os.path.join(self.dir, "tls-ticket-keys")

    def server_args(self) -> list[str]:
        return ["--tls-cert", self.cert, "--tls-key", self.key]

    def client(self, max_version: ssl.TLSVersion | None = None) -> "ClientTls":
        return ClientTls(self.ca, max_version=max_version)


_CTX_LOCK = threading.Lock()


class ClientTls:
    """How a normal client speaks TLS: trusts the test CA, verifies the name `localhost`
    (sent as SNI), offers ALPN http/1.1. Picklable; the SSLContext is made lazily once per
    process (so a forked client does not share the parent's), and a session can only be
    offered on a connection made from the context that made it."""

    def __init__(self, ca: str, hostname: str = "localhost",
                 max_version: ssl.TLSVersion | None = None):
        self.ca, self.hostname, self.max_version = ca, hostname, max_version
        self._ctx: ssl.SSLContext | None = None
        self._pid = 0

    def __getstate__(self):
        return {"ca": self.ca, "hostname": self.hostname, "max_version": self.max_version,
                "_ctx": None, "_pid": 0}

    def context(self) -> ssl.SSLContext:
        with _CTX_LOCK:  # one context per process, even when threads ask at once
            if self._ctx is None or self._pid != os.getpid():
                ctx = ssl.create_default_context(cafile=self.ca)
                ctx.set_alpn_protocols(["http/1.1"])
                if self.max_version is not None:
                    ctx.maximum_version = self.max_version
                self._ctx, self._pid = ctx, os.getpid()
            return self._ctx

    def wrap(self, sock: socket.socket, session: ssl.SSLSession | None = None) -> ssl.SSLSocket:
        """Handshakes on a connected blocking socket (closing it if the handshake fails)."""
        try:
            return self.context().wrap_socket(sock, server_hostname=self.hostname,
                                              session=session)
        except BaseException:
            sock.close()
            raise


def connect(addr, timeout: float = 5.0, tls: ClientTls | None = None,
            session: ssl.SSLSession | None = None) -> socket.socket:
    """A new connection with TCP_NODELAY; over TLS, handshaken (offering `session` if given)."""
    s = socket.create_connection(addr, timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return tls.wrap(s, session) if tls is not None else s


class Tern:
    """One running `tern serve` process. With `tls` (a TlsFiles) it listens only for HTTPS
    (`--listen-tls LISTEN` and the test certificate; `args` may add --tls-ticket-keys etc.)
    and `addr` is the HTTPS listener; `scheme` says which. `plain_too` adds a plain listener
    (`--listen 127.0.0.1:0`) beside the HTTPS one. `listeners` maps each scheme in the
    start-up line to its (host, port).

    `demo=True` runs `tern demo` instead (the same site as `--site`, its data in `data` or a
    throwaway `--data` folder): the only command with /statusz and /metrics. `config` runs
    `tern run --config CONFIG` instead (sites, routes and the reverse proxy from the file)."""

    def __init__(
        self,
        args: list[str] | None = None,
        listen: str = "127.0.0.1:0",
        workers: int = 2,
        site: str | None = None,
        nofile: int | None = None,
        start_timeout: float = 10.0,
        log_level: str = "info",
        tls: TlsFiles | None = None,
        plain_too: bool = False,
        demo: bool = False,
        config: str | None = None,
        data: str | None = None,
        inherit: socket.socket | None = None,
    ):
        """`inherit`: a listening socket handed over as a service manager would (descriptor 3,
        `LISTEN_FDS=1`); `listen` should then be its address."""
        self.site = site or make_site()
        self.scheme = "https" if tls is not None else "http"
        listen_args = (
            ["--listen-tls", listen, *tls.server_args()] if tls is not None else ["--listen", listen]
        )
        if tls is not None and plain_too:
            listen_args += ["--listen", "127.0.0.1:0"]
        if demo:
            if data is None:
                data = tempfile.mkdtemp(prefix="tern-stress-data-")
                atexit.register(lambda: _rmtree(data))
            command = ["demo", "--site", self.site, "--data", data]
        elif config is not None:
            command = ["run", "--config", config]
        else:
            command = ["serve", self.site]
        cmd = [
            tern_binary(),
            *command,
            *listen_args,
            "--workers",
            str(workers),
            *(args or []),
        ]
        if "--sandbox" not in cmd:
            # Under attack inside the sandbox, as in production; refuse to run without it.
            cmd += ["--sandbox", "on"]
        def preexec():  # runs in the child between fork and exec
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
            if inherit is not None:
                os.dup2(inherit.fileno(), 3)  # SD_LISTEN_FDS_START; dup2 clears close-on-exec

        env = dict(os.environ, TERN_LOG=log_level)
        pass_fds: tuple = ()
        if inherit is not None:
            # LISTEN_PID must be tern's own pid: a shell sets it to its own, then execs tern.
            cmd = ["/bin/sh", "-c", 'export LISTEN_PID=$$; exec "$0" "$@"', *cmd]
            env["LISTEN_FDS"] = "1"
            pass_fds = (3,)
        self.log_lines: list[str] = []
        self.proc = track(
            subprocess.Popen(
                cmd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=preexec,
                pass_fds=pass_fds,
                env=env,
            )
        )
        self.pid = self.proc.pid
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        line = self._read_start_line(start_timeout)
        m = START_LINE.search(line)
        found = LISTENER.findall(m.group(1)) if m else []
        self.listeners = {scheme: (host, int(port)) for scheme, host, port in found}
        listeners = [l for l in found if l[0] == self.scheme]
        if not listeners:
            self.kill()
            raise RuntimeError(f"unexpected start-up line {line!r}; log: {self.log_lines}")
        _, self.host, port = listeners[0]
        self.port, self.workers = int(port), int(m.group(2))
        self.addr = (self.host, self.port)
        threading.Thread(target=self._drain_stdout, daemon=True).start()

    def _read_start_line(self, timeout: float) -> str:
        result: list[str] = []

        def read():
            result.append(self.proc.stdout.readline().decode(errors="replace"))

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(timeout)
        if not result or not result[0]:
            self.kill()
            raise RuntimeError(f"tern did not start within {timeout}s; log: {self.log_lines}")
        return result[0]

    def _drain_stderr(self) -> None:
        for raw in self.proc.stderr:
            line = ANSI.sub("", raw.decode(errors="replace").rstrip())
            self.log_lines.append(line)

    def _drain_stdout(self) -> None:
        for _ in self.proc.stdout:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def rss_kb(self) -> int:
        return rss_kb(self.pid)

    def fd_count(self) -> int:
        try:
            return len(os.listdir(f"/proc/{self.pid}/fd"))
        except OSError:
            return -1

    def terminate(self, timeout: float = 15.0) -> int | None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None
        refused = self.log_matching("sandbox: refused")
        if refused:
            # A system call the server needed under attack is missing from the allow-list.
            raise RuntimeError(f"the sandbox refused system calls: {refused}")
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def log_matching(self, needle: str) -> list[str]:
        return [l for l in self.log_lines if needle in l]


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


class RssSampler:
    """Samples a process's RSS every `interval` seconds on a thread; keeps the peak."""

    def __init__(self, pid: int, interval: float = 0.1):
        self.pid, self.interval = pid, interval
        self.peak = rss_kb(pid)
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_kb(self.pid))

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return self.peak


# ----------------------------------------------------------------------------- HTTP client


def request_bytes(path: str = PAGE_PATH, close: bool = False) -> bytes:
    conn = "Connection: close\r\n" if close else ""
    return f"GET {path} HTTP/1.1\r\nHost: stress\r\n{conn}\r\n".encode()


class Truncated(Exception):
    """The response ended (EOF or error) after at least one byte of it arrived."""


class NoResponse(Exception):
    """The connection ended (EOF or error) before any byte of the response arrived."""


def read_response(sock: socket.socket) -> tuple[int, bytes, bool]:
    """Reads one response with a Content-Length body. Returns (status, body, server_closes).
    Raises NoResponse if nothing arrived, Truncated if the response was cut short."""
    buf = b""
    got_any = False
    try:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise (Truncated if got_any else NoResponse)("EOF")
            got_any = True
            buf += chunk
            if len(buf) > 65536:
                raise Truncated("head too large")
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        closes = False
        for l in lines[1:]:
            name, _, value = l.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value.strip())
            elif name == "connection" and value.strip().lower() == "close":
                closes = True
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                raise Truncated("EOF in body")
            rest += chunk
        return status, rest[:length], closes
    except (ConnectionError, socket.timeout, OSError) as e:
        if isinstance(e, (Truncated, NoResponse)):
            raise
        raise (Truncated if got_any else NoResponse)(repr(e)) from e


def get_once(addr, timeout: float = 2.0, path: str = PAGE_PATH,
             tls: ClientTls | None = None) -> tuple[int, bytes]:
    """One request on a new connection (Connection: close); over TLS if `tls` is given."""
    with connect(addr, timeout=timeout, tls=tls) as s:
        s.sendall(request_bytes(path, close=True))
        status, body, _ = read_response(s)
        return status, body


def wait_until_served(addr, within: float, tls: ClientTls | None = None) -> float | None:
    """Tries a fresh request every 50 ms; returns seconds until the first success, or None."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < within:
        try:
            status, body = get_once(addr, timeout=0.5, tls=tls)
            if status == 200 and body == PAGE:
                return time.monotonic() - t0
        except Exception:
            pass
        time.sleep(0.05)
    return None


# ----------------------------------------------------------------------------- reporting


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, int(round(p / 100 * (len(sorted_values) - 1)))))
    return sorted_values[k]


class Report:
    """Collects `name: value` lines and goal checks, prints one block, returns an exit code."""

    def __init__(self, title: str):
        self.title = title
        self.lines: list[tuple[str, str]] = []
        self.failures: list[str] = []

    def add(self, name: str, value) -> None:
        self.lines.append((name, str(value)))

    def goal(self, ok: bool, text: str) -> None:
        self.lines.append(("goal", f"{'PASS' if ok else 'FAIL'}  {text}"))
        if not ok:
            self.failures.append(text)

    def finish(self) -> int:
        width = max((len(n) for n, _ in self.lines), default=4)
        print(f"== {self.title} ==")
        for n, v in self.lines:
            print(f"  {n:<{width}}  {v}")
        verdict = "PASS" if not self.failures else f"FAIL ({len(self.failures)} goal(s) missed)"
        print(f"  {'result':<{width}}  {verdict}")
        sys.stdout.flush()
        return 0 if not self.failures else 1


def mib(kb: int) -> str:
    return f"{kb / 1024:.1f} MiB"


# ----------------------------------------------------------------------------- probe


def _probe_thread(addr, keep_alive: bool, pause: float, stop, out: list, tls=None) -> None:
    """Makes requests until `stop` is set; appends (t_start, latency_s, error_or_None, kind)
    where kind is "keep-alive" or "new-conn". Over TLS a new connection makes a full handshake
    (no session is kept: the costliest normal client), counted in its request's latency."""
    kind = "keep-alive" if keep_alive else "new-conn"
    sock = None
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            if sock is None:
                sock = connect(addr, timeout=5, tls=tls)
            sock.sendall(request_bytes(close=not keep_alive))
            status, body, closes = read_response(sock)
            lat = time.monotonic() - t0
            err = None if status == 200 and body == PAGE else f"status {status}, {len(body)} bytes"
            out.append((t0, lat, err, kind))
            if closes or not keep_alive:
                sock.close()
                sock = None
        except Exception as e:  # every error is a probe failure here
            out.append((t0, time.monotonic() - t0, f"{type(e).__name__}: {e}", kind))
            if sock is not None:
                sock.close()
                sock = None
        if pause:
            time.sleep(pause)
    if sock is not None:
        sock.close()


def _probe_main(addr, keep_alive_conns: int, new_conn_clients: int, pause: float, tls, stop,
                pipe):
    # A forked child: the parent's servers are not ours to kill.
    _children.clear()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out: list = []
    threads = [
        threading.Thread(target=_probe_thread, args=(addr, True, pause, stop, out, tls))
        for _ in range(keep_alive_conns)
    ] + [
        threading.Thread(target=_probe_thread, args=(addr, False, pause, stop, out, tls))
        for _ in range(new_conn_clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pipe.send(out)
    pipe.close()


class ProbeProcess:
    """A normal client running `target(*args, stop, pipe)` in its own process (so the
    attacker's Python loop does not add GIL waits to its latencies); `target` sends its
    results down `pipe` once `stop` is set. `results()` stops it and returns them."""

    def __init__(self, target, args: tuple):
        import multiprocessing as mp

        ctx = mp.get_context("fork")
        self._stop = ctx.Event()
        self._rx, tx = ctx.Pipe(duplex=False)
        self._p = ctx.Process(target=target, args=(*args, self._stop, tx), daemon=True)
        self._p.start()
        tx.close()

    def results(self, timeout: float = 15.0) -> list:
        self._stop.set()
        out = self._rx.recv() if self._rx.poll(timeout) else []
        self._p.join(5)
        if self._p.is_alive():
            self._p.kill()
        return out


class Probe(ProbeProcess):
    """`keep_alive_conns` connections making keep-alive requests and `new_conn_clients` making
    one request per new connection, each pausing `pause` s between requests, over TLS if `tls`
    (a ClientTls) is given. `results()` returns [(t_start_monotonic, latency_s, error|None,
    kind)]."""

    def __init__(self, addr, keep_alive_conns=2, new_conn_clients=0, pause=0.005, tls=None):
        super().__init__(_probe_main, (addr, keep_alive_conns, new_conn_clients, pause, tls))


def latency_summary(samples: list, since: float = 0.0, until: float = float("inf"),
                    kind: str | None = None) -> dict:
    """Summary of the samples started in [since, until] (of one kind: "keep-alive" or
    "new-conn", if given)."""
    window = [s for s in samples
              if since <= s[0] <= until and (kind is None or len(s) < 4 or s[3] == kind)]
    ok = sorted(s[1] for s in window if s[2] is None)
    errors = [s[2] for s in window if s[2] is not None]
    return {
        "requests": len(window),
        "errors": len(errors),
        "first_errors": errors[:3],
        "p50_ms": percentile(ok, 50) * 1000,
        "p99_ms": percentile(ok, 99) * 1000,
        "max_ms": (ok[-1] * 1000) if ok else float("nan"),
    }


def fmt_lat(s: dict) -> str:
    return (
        f"{s['requests']} requests, {s['errors']} errors; "
        f"p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms, max {s['max_ms']:.2f} ms"
    )
