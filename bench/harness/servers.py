"""The servers under test. Each one is started once, pinned to CPU 0, on its own
free loopback port, with an equivalent configuration (one worker, no access
log, sendfile and an open-file cache where the server has them, precompressed
gzip only). To add a server: subclass Server, give it `name`, `start()` and
`version()`, and list it in SERVERS."""

import os
import signal
import socket
import subprocess
import tempfile
import time

from . import procs

SERVER_CPU = "0"  # every server runs here
CLIENT_CPU = "1"  # wrk, h2load, the idle client and this harness run here


class BenchError(Exception):
    """A failure that must stop the run loudly (wrong answers, dead servers)."""


_handed_out = set()


def free_port():
    """A free loopback port, never the same one twice in a run."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


class Instance:
    """One running process (tree) of a server, listening on one port."""

    def __init__(self, name, argv, port, workdir, env=None):
        self.name, self.argv, self.port = name, argv, port
        self.env = env  # variables added to the harness's environment (None: it as is)
        self.log_path = os.path.join(workdir, f"{name}.log")
        self.proc = None

    def start(self):
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            ["taskset", "-c", SERVER_CPU, *self.argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: we stop exactly what we started
            env={**os.environ, **self.env} if self.env else None,
        )
        log.close()
        if not procs.wait_port(self.port, self.proc):
            self.stop()
            raise BenchError(
                f"{self.name} did not start on port {self.port}:\n  $ {' '.join(self.argv)}\n"
                + self.log_tail()
            )

    def log_tail(self, n=15):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def pids(self):
        return procs.process_tree(self.proc.pid)

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group we created for it
            self.proc.wait(timeout=5)
        # nginx's worker may linger a moment after the master exits
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)


class Server:
    name = "?"
    canned = False  # True for the floor: takes part only where a canned answer is meaningful
    app = False  # True for an application (tern demo): takes part only where a scenario names it
    tls = False  # speaks HTTPS: has a "tls" instance when ctx.tls (the certificate) is set
    h3 = False  # speaks HTTP/3: has an "h3" instance (UDP) when an HTTP/3 scenario is selected
    h3_only = False  # takes part in the HTTP/3 scenarios only (Caddy)

    def __init__(self, ctx):
        self.ctx = ctx
        self.instances = {}

    def instance(self, scenario):
        return self.instances["tls" if scenario.tls else "main"]

    def port_for(self, scenario):
        return self.instance(scenario).port

    def start(self):
        for inst in self.instances.values():
            inst.start()

    def stop(self):
        for inst in self.instances.values():
            inst.stop()

    def restart(self):
        self.stop()
        self.instances = {}
        self.setup()
        self.start()

    def setup(self):
        raise NotImplementedError

    def version(self):
        return ""


def _render(template_path, out_path, values):
    with open(template_path) as f:
        text = f.read()
    for k, v in values.items():
        text = text.replace(f"@{k}@", str(v))
    with open(out_path, "w") as f:
        f.write(text)


def _first_line(argv):
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (out.stdout + out.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "?"


def _tls_values(ctx):
    return {"CERT": ctx.tls.cert, "KEY": ctx.tls.key}


class Nginx(Server):
    """conf/nginx.conf. Two processes: tcp_nopush on (Debian's default, nginx's best
    for plain requests) and off for pipelined scenarios, where TCP_CORK + pipelining
    trips Nagle and delayed ACKs (40 ms stalls): nginx gets its best in each. A third
    one speaks only HTTPS (conf/nginx-tls.conf) for the TLS scenarios. For the HTTP/2
    scenarios, `listen … http2`: a fourth with `ssl http2` (ALPN h2, preferred, and
    http/1.1), and a fifth with a plain `http2` listener, which in nginx 1.22 speaks
    only h2c with prior knowledge; the HTTP/1.1 ones stay as they were."""

    name = "nginx"
    tls = True

    def _instance(self, label, nopush, tls=False, http2=False):
        port = free_port()
        d = os.path.join(self.ctx.workdir, label)
        os.makedirs(d, exist_ok=True)
        conf = os.path.join(d, "nginx.conf")
        values = {"PORT": port, "DOCROOT": self.ctx.docroot, "WORKDIR": d, "TCP_NOPUSH": nopush,
                  "LISTEN": " http2" if http2 else "", "TLS": ""}
        if tls:
            tls_conf = os.path.join(d, "tls.conf")
            _render(os.path.join(self.ctx.bench_dir, "conf", "nginx-tls.conf"), tls_conf, _tls_values(self.ctx))
            values.update(LISTEN=" ssl" + values["LISTEN"], TLS=f"        include {tls_conf};")
        _render(os.path.join(self.ctx.bench_dir, "conf", "nginx.conf"), conf, values)
        argv = ["nginx", "-p", d, "-c", conf, "-e", os.path.join(d, "nginx-error.log")]
        return Instance(label, argv, port, self.ctx.workdir)

    def setup(self):
        self.instances = {
            "main": self._instance("nginx", "on"),
            "pipelined": self._instance("nginx-nopush-off", "off"),
        }
        if self.ctx.tls:
            self.instances["tls"] = self._instance("nginx-tls", "on", tls=True)
        if self.ctx.tls and "h2" in self.ctx.h2:
            self.instances["h2"] = self._instance("nginx-h2", "on", tls=True, http2=True)
        if "h2c" in self.ctx.h2:
            self.instances["h2c"] = self._instance("nginx-h2c", "on", http2=True)

    def instance(self, scenario):
        if scenario.h2:
            return self.instances["h2" if scenario.tls else "h2c"]
        if scenario.tls:
            return self.instances["tls"]
        return self.instances["pipelined" if scenario.pipeline > 1 else "main"]

    def version(self):
        return _first_line(["nginx", "-v"]).replace("nginx version: ", "")


class H2o(Server):
    """conf/h2o.conf; for the TLS scenarios a second h2o whose listener has the
    `ssl:` mapping of conf/h2o-tls.conf, which also serves the HTTP/2 scenarios over
    TLS: h2o offers ALPN h2 (preferred) by default. For h2c a third h2o with
    `http1-upgrade-to-http2: ON`: h2o 2.2 takes h2c with prior knowledge on a plain
    listener only then (the HTTP/1.1 one keeps it OFF, as before)."""

    name = "h2o"
    tls = True

    def _instance(self, label, tls=False, h2c=False):
        port = free_port()
        d = os.path.join(self.ctx.workdir, label)
        os.makedirs(d, exist_ok=True)
        conf = os.path.join(d, "h2o.conf")
        values = {"PORT": port, "DOCROOT": self.ctx.docroot, "WORKDIR": d, "SSL": "",
                  "H2C": "ON" if h2c else "OFF"}
        if tls:
            ssl = os.path.join(d, "tls.yaml")
            _render(os.path.join(self.ctx.bench_dir, "conf", "h2o-tls.conf"), ssl, _tls_values(self.ctx))
            values["SSL"] = f"  ssl: !file {ssl}"
        _render(os.path.join(self.ctx.bench_dir, "conf", "h2o.conf"), conf, values)
        return Instance(label, ["h2o", "-c", conf], port, self.ctx.workdir)

    def setup(self):
        self.instances = {"main": self._instance("h2o")}
        if self.ctx.tls:
            self.instances["tls"] = self._instance("h2o-tls", tls=True)
        if "h2c" in self.ctx.h2:
            self.instances["h2c"] = self._instance("h2o-h2c", h2c=True)

    def instance(self, scenario):
        if scenario.h2 and not scenario.tls:
            return self.instances["h2c"]
        return super().instance(scenario)

    def version(self):
        return _first_line(["h2o", "--version"]).replace("h2o version ", "")


class Tern(Server):
    """`tern serve`; for the TLS scenarios a second process with only an HTTPS
    listener (--listen-tls), if this binary has one. The HTTP/2 scenarios use the
    same two (ALPN h2 on the TLS one, h2c with prior knowledge on the plain one);
    a tern without HTTP/2 is left out of them with a note. tern serves HTTP/3 on its
    HTTPS port by default (--no-http3 turns it off): the TLS process runs with
    --no-http3, so that the HTTP/1.1 and HTTP/2 rows keep answers without Alt-Svc,
    and the HTTP/3 scenarios get a third process, HTTPS with QUIC on the UDP port of
    its --listen-tls address."""

    name = "tern"

    @property
    def tls(self):
        return tern_has_tls(self.ctx.tern_bin)

    @property
    def h3(self):
        return tern_has_flag(self.ctx.tern_bin, "--no-http3")

    def setup(self):
        port = free_port()
        argv = [
            self.ctx.tern_bin, "serve", self.ctx.docroot,
            "--listen", f"127.0.0.1:{port}", "--workers", "1",
        ]
        self.instances = {"main": Instance("tern", argv, port, self.ctx.workdir)}
        if self.ctx.tls and self.tls:
            port = free_port()
            argv = [
                self.ctx.tern_bin, "serve", self.ctx.docroot,
                "--listen-tls", f"127.0.0.1:{port}",
                "--tls-cert", self.ctx.tls.cert, "--tls-key", self.ctx.tls.key, "--workers", "1",
            ] + (["--no-http3"] if self.h3 else [])
            self.instances["tls"] = Instance("tern-tls", argv, port, self.ctx.workdir)
        if self.ctx.tls and getattr(self.ctx, "h3", False) and self.h3:
            port = free_port()
            argv = [
                self.ctx.tern_bin, "serve", self.ctx.docroot,
                "--listen-tls", f"127.0.0.1:{port}",
                "--tls-cert", self.ctx.tls.cert, "--tls-key", self.ctx.tls.key, "--workers", "1",
            ]
            self.instances["h3"] = Instance("tern-h3", argv, port, self.ctx.workdir)

    def instance(self, scenario):
        if getattr(scenario, "h3", False):
            return self.instances["h3"]
        return super().instance(scenario)

    def version(self):
        rev = subprocess.run(
            ["git", "-C", self.ctx.repo_dir, "describe", "--always", "--dirty"],
            capture_output=True, text=True,
        ).stdout.strip()
        return rev or "?"


class TernUring(Tern):
    """`tern serve --io uring`: the same server on the io_uring backend (one ring per
    worker), side by side with tern on epoll."""

    name = "tern-uring"

    def setup(self):
        super().setup()
        for key, inst in list(self.instances.items()):
            name = "tern-uring" if key == "main" else f"tern-uring-{key}"
            argv = [*inst.argv, "--io", "uring"]
            self.instances[key] = Instance(name, argv, inst.port, self.ctx.workdir)


_tern_help = {}


def tern_has_flag(tern_bin, flag):
    """Whether `tern serve --help` of this binary names the flag."""
    if tern_bin not in _tern_help:
        try:
            out = subprocess.run([tern_bin, "serve", "--help"], capture_output=True, text=True, timeout=10)
            _tern_help[tern_bin] = out.stdout + out.stderr
        except (OSError, subprocess.SubprocessError):
            _tern_help[tern_bin] = ""
    return flag in _tern_help[tern_bin]


def tern_has_tls(tern_bin):
    """Whether this tern binary serves HTTPS (`tern serve --help` names --listen-tls)."""
    return tern_has_flag(tern_bin, "--listen-tls")


class TernDemo(Tern):
    """`tern demo`, the IPv4 Games: a claim is decided against the state in memory,
    written to the append-only journal with one write per worker turn, and answered in
    that turn (`--sync normal`) or after an fdatasync that covers it, run by the
    claim-syncer thread (`--sync full`). One process per sync mode the selected claims
    scenarios use ("main": --sync normal, always started; "full": --sync full, when a
    scenario with sync="full" is selected). Each whole process (worker, claim-syncer,
    compactor, score-views and player-lookup threads) is pinned to CPU 0, so the helper
    threads share the worker's one core: that is the "one core" of the claims targets.
    Each start gets a fresh data folder under the workdir; X-Forwarded-For from loopback
    is believed (--trusted-proxies 127.0.0.1), so wrk can claim any address.
    "pg" (claims-pg): `tern demo --store postgres://…` on a fresh PostgreSQL cluster
    (harness/pg.py) that runs on the client CPU; its CPU time is the run's "companion"
    CPU, reported apart from tern's."""

    name = "tern-demo"
    app = True
    tls = False  # (claims is over plain HTTP)
    SYNCS = ("normal", "full", "pg")

    def setup(self):
        syncs = {"normal", *getattr(self.ctx, "demo_syncs", ())}
        self.argvs, self.data_dirs, self.instances = {}, {}, {}
        self.pg = None
        for sync in self.SYNCS:
            if sync not in syncs:
                continue
            port = free_port()
            label = "main" if sync == "normal" else sync
            data_dir = tempfile.mkdtemp(prefix=f"tern-demo-{sync}-data-", dir=self.ctx.workdir)
            argv = [
                self.ctx.tern_bin, "demo",
                "--listen", f"127.0.0.1:{port}", "--workers", "1",
                "--data", data_dir, "--trusted-proxies", "127.0.0.1",
            ]
            if sync == "pg":
                from .pg import PgCluster  # (pg imports this module)

                self.pg = PgCluster(self.ctx.workdir)
                argv += ["--store", self.pg.url]
            else:
                argv += ["--sync", sync]
            name = "tern-demo" if sync == "normal" else f"tern-demo-{sync}"
            self.instances[label] = Instance(name, argv, port, self.ctx.workdir)
            self.argvs[label], self.data_dirs[label] = argv, data_dir

    def _label(self, scenario):
        sync = getattr(scenario, "sync", "") or "normal"
        return "main" if sync == "normal" else sync

    def instance(self, scenario):
        label = self._label(scenario)
        if label not in self.instances:
            raise BenchError(f"tern-demo was not started with --sync {scenario.sync}")
        return self.instances[label]

    def start(self):
        if self.pg:
            self.pg.start()
        super().start()
        # every thread (the syncer and compactor too) must be confined to the servers' CPU
        for label, inst in self.instances.items():
            for pid in inst.pids():
                for tid, cpus in procs.thread_cpus(pid).items():
                    if cpus != SERVER_CPU:
                        self.stop()
                        raise BenchError(f"tern-demo ({label}) thread {tid} may run on CPUs {cpus}, "
                                         f"not only {SERVER_CPU}")

    def stop(self):
        super().stop()
        if getattr(self, "pg", None):
            self.pg.stop()

    def companion_cpu_seconds(self, scenario):
        """CPU time of the database a scenario's claims are saved in (0: none)."""
        return self.pg.cpu_seconds() if self._label(scenario) == "pg" and self.pg else 0.0

    def setting(self, scenario):
        """How the process a scenario ran against was started, for the results."""
        label = self._label(scenario)
        out = {"argv": self.argvs[label][1:], "sync": "pg" if label == "pg" else self.argvs[label][-1],
               "data_fs": procs.fs_type(self.data_dirs[label])}
        if label == "pg":
            out["pg"] = {s: self.pg.setting(s) for s in ("server_version", "synchronous_commit", "fsync")}
            out["pg"]["data_fs"] = procs.fs_type(self.pg.dir)
        return out


class Floor(Server):
    """bench/floor/floor.c: canned bytes, no parsing. A second instance sends
    `Connection: close` and closes, for the `close` scenario."""

    name = "floor"
    canned = True

    def setup(self):
        body = os.path.join(self.ctx.docroot, "index.html")
        ka, cl = free_port(), free_port()
        self.instances = {
            "main": Instance("floor", [self.ctx.floor_bin, str(ka), body], ka, self.ctx.workdir),
            "close": Instance(
                "floor-close", [self.ctx.floor_bin, str(cl), body, "--close"], cl, self.ctx.workdir
            ),
        }

    def instance(self, scenario):
        return self.instances["close" if scenario.close else "main"]

    def version(self):
        return "bench/floor/floor.c"


class FloorUring(Floor):
    """bench/floor/floor-uring.c: floor.c's canned bytes through one io_uring (multishot
    accept and receive from a buffer ring, sends from the canned bytes, one enter per
    turn): the limit for `tern-uring`, as `floor` is tern's on epoll."""

    name = "floor-uring"

    def setup(self):
        body = os.path.join(self.ctx.docroot, "index.html")
        ka, cl = free_port(), free_port()
        bin_ = self.ctx.floor_uring_bin
        self.instances = {
            "main": Instance("floor-uring", [bin_, str(ka), body], ka, self.ctx.workdir),
            "close": Instance(
                "floor-uring-close", [bin_, str(cl), body, "--close"], cl, self.ctx.workdir
            ),
        }

    def version(self):
        return "bench/floor/floor-uring.c"


class Caddy(Server):
    """Caddy (Debian's `caddy`, 2.6.2), for the HTTP/3 scenarios only: nginx 1.22 and
    h2o 2.2 in Debian 12 have no HTTP/3, and Caddy serves it (quic-go) by default on its
    HTTPS port. `caddy run` with conf/Caddyfile from the workdir: the admin endpoint off,
    automatic HTTPS off (the bench's certificate given with `tls`, nothing issued, no
    redirect listener, nothing installed in a trust store), no access log, `file_server`
    with precompressed gzip; XDG_DATA_HOME and XDG_CONFIG_HOME (its storage and autosaved
    config) and HOME in the workdir. Never the packaged systemd service. Pinned to CPU 0
    like the others, so Go's runtime runs it with GOMAXPROCS 1: one core, as the others'
    one worker."""

    name = "caddy"
    tls = True
    h3 = True
    h3_only = True

    def setup(self):
        port = free_port()
        d = os.path.join(self.ctx.workdir, "caddy")
        for sub in ("data", "config", "home"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        conf = os.path.join(d, "Caddyfile")
        _render(os.path.join(self.ctx.bench_dir, "conf", "Caddyfile"), conf,
                {"PORT": port, "DOCROOT": self.ctx.docroot, **_tls_values(self.ctx)})
        env = {"XDG_DATA_HOME": os.path.join(d, "data"), "XDG_CONFIG_HOME": os.path.join(d, "config"),
               "HOME": os.path.join(d, "home")}
        argv = ["caddy", "run", "--config", conf, "--adapter", "caddyfile"]
        self.instances = {"main": Instance("caddy", argv, port, self.ctx.workdir, env=env)}

    def instance(self, scenario):
        return self.instances["main"]  # (HTTPS over TCP and HTTP/3 over UDP on one port)

    def version(self):
        return _first_line(["caddy", "version"])


# Display and interleaving order. nginx and h2o are the references for ratios; Caddy is the
# reference of the HTTP/3 rows, where neither of them takes part.
SERVERS = {cls.name: cls for cls in (Nginx, H2o, Tern, TernUring, Floor, FloorUring, TernDemo, Caddy)}
REFERENCES = ("nginx", "h2o", "caddy")
