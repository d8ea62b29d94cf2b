"""Getting ready: Debian packages, matplotlib, the floor, tern, the docroot."""

import gzip
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

from . import procs
from .servers import BenchError

# command -> Debian package that provides it
PACKAGES = {
    "wrk": "wrk",
    "nginx": "nginx-light",
    "h2o": "h2o",
    "h2load": "nghttp2-client",  # the HTTP/2 scenarios' load generator
    "gcc": "gcc",
    "taskset": "util-linux",
    "openssl": "openssl",  # makes the TLS scenarios' certificates
    "caddy": "caddy",  # the HTTP/3 scenarios' other server (2.6.2 in Debian 12)
}
# file -> Debian package that provides it (build dependencies without a command)
FILES = {
    "/usr/include/openssl/ssl.h": "libssl-dev",  # bench/tlsload/tlsload.c
    "/usr/include/liburing.h": "liburing-dev",  # bench/floor/floor-uring.c
}

INDEX_SIZE = 953
LARGE_SIZE = 1 << 20
FIXED_MTIME = 1767225600  # 2026-01-01: stable Last-Modified and ETags across runs


def log(msg):
    print(msg, flush=True)


def _apt_has(pkg):
    out = subprocess.run(["apt-cache", "policy", pkg], capture_output=True, text=True)
    return "Candidate:" in out.stdout and "Candidate: (none)" not in out.stdout


def _missing():
    return sorted({pkg for cmd, pkg in PACKAGES.items() if shutil.which(cmd) is None}
                  | {pkg for path, pkg in FILES.items() if not os.path.exists(path)})


def ensure_packages():
    missing = _missing()
    if not missing:
        return
    if os.geteuid() != 0:
        raise BenchError(f"missing {', '.join(missing)}: run `apt-get install -y {' '.join(missing)}` as root")
    log(f"installing {' '.join(missing)} (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    # nginx-light is gone from newer Debian releases; plain nginx has gzip_static too
    missing = [p if p != "nginx-light" or _apt_has(p) else "nginx" for p in missing]
    subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                   check=True, env=env, stdout=subprocess.DEVNULL)
    still = _missing()
    if still:
        raise BenchError(f"still missing after apt-get: {', '.join(still)}")


def _cache_dir():
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def h3load_path():
    """bench/h3load as scripts/install-h3-test-deps builds it (None if it is not there)."""
    path = os.path.join(_cache_dir(), "tern", "bin", "h3load")
    return path if os.access(path, os.X_OK) else None


def aioquic_python():
    """The python of aioquic's venv (testkit/h3client.py, the HTTP/3 answer check), or None."""
    venv = os.environ.get("TERN_AIOQUIC_VENV") or os.path.join(_cache_dir(), "tern", "aioquic-venv")
    path = os.path.join(venv, "bin", "python")
    return path if os.access(path, os.X_OK) else None


def ensure_h3_tools(repo_dir):
    """scripts/install-h3-test-deps: bench/h3load (built with Go, again when its sources
    changed) and aioquic's venv (the HTTP/3 answer check's client). False, with the reason
    printed, when it failed (no Go, no network…): the HTTP/3 scenarios are then left out."""
    script = os.path.join(repo_dir, "scripts", "install-h3-test-deps")
    r = subprocess.run([script], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        log(f"scripts/install-h3-test-deps failed (exit {r.returncode}):\n{r.stderr[-1500:]}")
        return False
    return True


def h3load_version(repo_dir):
    """quic-go's version, from bench/h3load/go.mod (the binary was built from it)."""
    try:
        with open(os.path.join(repo_dir, "bench", "h3load", "go.mod")) as f:
            for line in f:
                if "github.com/quic-go/quic-go " in line:
                    return "bench/h3load, quic-go " + line.split()[1]
    except OSError:
        pass
    return "bench/h3load"


def ensure_matplotlib():
    """matplotlib draws the PNG; pip-install it for this interpreter if missing. If that fails
    the run goes on without the chart (report.write_all notes it): the numbers need no chart."""
    try:
        import matplotlib  # noqa: F401
        return
    except ImportError:
        pass
    log("installing matplotlib (pip)")
    base = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "matplotlib"]
    for extra in ([], ["--user", "--break-system-packages"]):
        if subprocess.run(base + extra).returncode == 0:
            break
    import importlib
    import site

    importlib.invalidate_caches()
    user_site = site.getusersitepackages()
    if os.path.isdir(user_site) and user_site not in sys.path:
        sys.path.append(user_site)
    try:
        import matplotlib  # noqa: F401,F811
    except ImportError as e:
        print(f"warning: matplotlib could not be installed ({e}): the chart will be skipped", flush=True)


def build_floor(bench_dir, out_dir):
    out = os.path.join(out_dir, "floor")
    subprocess.run(
        ["gcc", "-O2", "-Wall", "-o", out, os.path.join(bench_dir, "floor", "floor.c")], check=True
    )
    return out


def build_floor_uring(bench_dir, out_dir):
    out = os.path.join(out_dir, "floor-uring")
    subprocess.run(
        ["gcc", "-O2", "-Wall", "-o", out, os.path.join(bench_dir, "floor", "floor-uring.c"), "-luring"],
        check=True,
    )
    return out


def build_tlsload(bench_dir, out_dir):
    out = os.path.join(out_dir, "tlsload")
    subprocess.run(
        ["gcc", "-O2", "-Wall", "-o", out, os.path.join(bench_dir, "tlsload", "tlsload.c"), "-lssl", "-lcrypto"],
        check=True,
    )
    return out


@dataclass
class TlsFiles:
    """The TLS scenarios' certificate: a self-made CA and a leaf for localhost and
    127.0.0.1 signed by it, both ECDSA P-256, shared by every server."""

    ca: str  # the CA certificate: what clients that verify trust
    cert: str  # the leaf alone (servers send it; the CA is the trust anchor)
    key: str  # the leaf's private key, PKCS#8 PEM


def make_certs(workdir):
    """Generate the CA and the leaf with the openssl CLI into WORKDIR/tls."""
    d = os.path.join(workdir, "tls")
    os.makedirs(d, exist_ok=True)

    def p(name):
        return os.path.join(d, name)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    with open(p("leaf.ext"), "w") as f:
        f.write("basicConstraints = critical, CA:FALSE\n"
                "keyUsage = critical, digitalSignature\n"
                "extendedKeyUsage = serverAuth\n"
                "subjectAltName = DNS:localhost, IP:127.0.0.1\n"
                "subjectKeyIdentifier = hash\n"
                "authorityKeyIdentifier = keyid\n")
    steps = [
        ["openssl", "req", "-x509", "-new", *ec, "-keyout", p("ca.key"), "-out", p("ca.pem"),
         "-subj", "/CN=tern bench CA", "-days", "30",
         "-addext", "basicConstraints = critical, CA:TRUE",
         "-addext", "keyUsage = critical, keyCertSign, cRLSign"],
        ["openssl", "req", "-new", *ec, "-keyout", p("leaf.key"), "-out", p("leaf.csr"), "-subj", "/CN=localhost"],
        ["openssl", "x509", "-req", "-in", p("leaf.csr"), "-CA", p("ca.pem"), "-CAkey", p("ca.key"),
         "-CAcreateserial", "-days", "30", "-extfile", p("leaf.ext"), "-out", p("leaf.pem")],
        ["openssl", "verify", "-CAfile", p("ca.pem"), p("leaf.pem")],
    ]
    for argv in steps:
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            raise BenchError(f"making the TLS certificate failed:\n  $ {' '.join(argv)}\n{r.stdout}{r.stderr}")
    for name in ("ca.key", "leaf.key"):
        os.chmod(p(name), 0o600)
    return TlsFiles(ca=p("ca.pem"), cert=p("leaf.pem"), key=p("leaf.key"))


def build_tern(repo_dir):
    if not os.path.exists(os.path.join(repo_dir, "cli", "Cargo.toml")):
        raise BenchError("cli/Cargo.toml does not exist yet: tern cannot be built "
                         "(bench without it: --servers nginx,h2o,floor)")
    log("building tern (cargo build --release -p tern)")
    target = os.path.join(repo_dir, "target")
    r = subprocess.run(["cargo", "build", "--release", "-p", "tern", "--target-dir", target], cwd=repo_dir)
    if r.returncode != 0:
        raise BenchError("cargo build --release -p tern failed (bench without it: --servers nginx,h2o,floor)")
    return os.path.join(target, "release", "tern")


def build_h3load_quinn(repo_dir):
    """bench/h3load-quinn, the HTTP/3 rows' load client (a workspace member: it shares tern's
    dependencies and target folder)."""
    log("building bench/h3load-quinn (cargo build --release -p h3load-quinn)")
    target = os.path.join(repo_dir, "target")
    r = subprocess.run(["cargo", "build", "--release", "-p", "h3load-quinn", "--target-dir", target],
                       cwd=repo_dir)
    if r.returncode != 0:
        raise BenchError("cargo build --release -p h3load-quinn failed (or run with --h3-client quic-go)")
    return os.path.join(target, "release", "h3load-quinn")


def h3_client_version(repo_dir, client):
    """The HTTP/3 rows' load client, with its QUIC library's version."""
    if client == "quic-go":
        return h3load_version(repo_dir)
    try:
        with open(os.path.join(repo_dir, "Cargo.lock")) as f:
            lock = f.read()
        i = lock.index('name = "quinn-proto"')
        version = lock[i:].split("\n")[1].split('"')[1]
        return f"bench/h3load-quinn, quinn-proto {version}"
    except (OSError, ValueError, IndexError):
        return "bench/h3load-quinn"


def _index_html():
    """A plausible small page, padded to exactly INDEX_SIZE bytes."""
    head = (
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        "<title>tern bench</title>\n<link rel=\"stylesheet\" href=\"/style.css\">\n</head>\n<body>\n"
        "<header><h1>tern</h1><nav><a href=\"/\">home</a> <a href=\"/about\">about</a></nav></header>\n"
        "<main>\n<p>One binary that lets a single cheap machine serve a popular site: static files "
        "faster than nginx and h2o per core, and a write-heavy game on embedded SQLite.</p>\n"
        "<p>This page is the benchmark's small file. Every server sends exactly these bytes.</p>\n"
    )
    tail = "</main>\n<footer>tern bench fixture</footer>\n</body>\n</html>\n"
    pad = INDEX_SIZE - len(head) - len(tail) - len("<!--  -->\n")
    text = head + "<!-- " + ("padding " * 200)[:pad] + " -->\n" + tail
    data = text.encode()
    assert len(data) == INDEX_SIZE, len(data)
    return data


def make_docroot(path):
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o755)
    index = _index_html()
    files = {
        "index.html": index,
        "index.html.gz": gzip.compress(index, compresslevel=9, mtime=0),
        # incompressible, deterministic
        "large.bin": random.Random(1).randbytes(LARGE_SIZE),
    }
    for name, data in files.items():
        p = os.path.join(path, name)
        with open(p, "wb") as f:
            f.write(data)
        os.chmod(p, 0o644)
        os.utime(p, (FIXED_MTIME, FIXED_MTIME))


def machine_info():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    osname = "?"
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    osname = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    b0 = procs.machine_busy_seconds()
    time.sleep(1.0)
    busy_pct = 100 * (procs.machine_busy_seconds() - b0)
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "kernel": platform.release(),
        "os": osname,
        "loadavg_start": " ".join(load),
        "busy_pct_start": round(busy_pct, 1),  # % of one core busy in the second before the run
    }


def tool_versions():
    def first(argv, strip=""):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
            return (out.stdout + out.stderr).strip().splitlines()[0].replace(strip, "").strip()
        except (OSError, IndexError, subprocess.SubprocessError):
            return "?"

    return {
        "wrk": first(["wrk", "-v"]).split(" [")[0].replace("wrk ", ""),
        "h2load": first(["h2load", "--version"], strip="h2load"),  # the HTTP/2 scenarios' client
        # libssl of nginx, h2o, wrk and tlsload (Debian's; tern has rustls)
        "openssl": first(["openssl", "version"]),
    }
