#!/usr/bin/env python3
"""ACME renewals under load: tern gets a certificate from a real Pebble (Let's Encrypt's test
CA, installed by scripts/install-acme-test-deps), then renews it again and again (Pebble's
management API moves the ARI window into the past, SIGHUP makes tern look at once) while a
normal client makes keep-alive requests. Shows that issuing and renewing (TLS-ALPN-01
handshakes on the workers, certificate swaps in the resolver) do not move the normal
client's p99.

Goals: every renewal completes, and each new certificate is served; no normal request fails;
normal-client p99 during the renewals within --p99-slack-ms of the p99 before them (the
baseline window has the same length).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402


def tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    gopath = Path(os.environ.get("GOPATH", Path.home() / "go"))
    candidate = gopath / "bin" / name
    if candidate.exists():
        return str(candidate)
    sys.exit(f"acme_renew: {name} is missing: run scripts/install-acme-test-deps")


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def served_leaf(port: int) -> bytes:
    """The DER leaf tern shows for SNI a.test (not verified: only compared)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="a.test") as s:
            return s.getpeercert(binary_form=True)


def statusz(addr) -> str:
    sock = common.connect(addr, timeout=5)
    try:
        sock.sendall(b"GET /statusz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        _, body, _ = common.read_response(sock)
        return body.decode()
    finally:
        sock.close()


def valid_orders(addr) -> int:
    for line in statusz(addr).splitlines():
        if line.startswith('acme_orders{result="valid"}: '):
            return int(line.split(": ")[1])
    return 0


def wait_for(what: str, f, limit: float) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if f():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} not within {limit} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 renewals, 3 s windows")
    ap.add_argument("--renewals", type=int, default=10)
    ap.add_argument("--window", type=float, default=8.0,
                    help="seconds of baseline load (the renewal window is as long or longer)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--p99-slack-ms", type=float, default=5.0)
    a = ap.parse_args()
    if a.quick:
        a.renewals, a.window = 3, 3.0
    common.raise_nofile()
    pki = common.TlsFiles()
    work = tempfile.mkdtemp(prefix="tern-stress-acme-")
    directory, management, dns, dns_management, tls_port = free_ports(5)
    config = Path(work, "pebble.json")
    config.write_text(json.dumps({"pebble": {
        "listenAddress": f"127.0.0.1:{directory}",
        "managementListenAddress": f"127.0.0.1:{management}",
        "certificate": pki.cert, "privateKey": pki.key,
        "httpPort": 1, "tlsPort": tls_port, "ocspResponderURL": "",
        "externalAccountBindingRequired": False,
        "retryAfter": {"authz": 1, "order": 1}, "keyAlgorithm": "ecdsa",
        "profiles": {"default": {"description": "90 days", "validityPeriod": 7776000}},
    }}))
    common.track(subprocess.Popen(
        [tool("pebble-challtestsrv"), "-dnsserver", f"127.0.0.1:{dns}",
         "-management", f"127.0.0.1:{dns_management}", "-defaultIPv6", "",
         "-http01", "", "-https01", "", "-tlsalpn01", "", "-doh", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    common.track(subprocess.Popen(
        [tool("pebble"), "-config", str(config), "-dnsserver", f"127.0.0.1:{dns}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, PEBBLE_VA_NOSLEEP="1", PEBBLE_WFE_NONCEREJECT="0")))
    ca_ctx = ssl.create_default_context(cafile=pki.ca)

    def pebble_up() -> bool:
        try:
            req = urllib.request.Request(f"https://127.0.0.1:{directory}/dir",
                                         headers={"User-Agent": "tern-stress"})
            return urllib.request.urlopen(req, context=ca_ctx, timeout=2).status == 200
        except OSError:
            return False

    wait_for("Pebble", pebble_up, 15)
    started = time.monotonic()
    srv = common.Tern(args=[
        "--listen-tls", f"127.0.0.1:{tls_port}", "--acme", "a.test",
        "--acme-challenge", "tls-alpn-01", "--acme-state", str(Path(work, "state")),
        "--acme-directory", f"https://127.0.0.1:{directory}/dir", "--acme-ca-root", pki.ca,
    ], workers=a.workers)
    wait_for("the first certificate", lambda: valid_orders(srv.addr) >= 1, 30)
    issued_after = time.monotonic() - started
    rep = common.Report(f"ACME renewals under keep-alive load: {a.renewals} renewals by "
                        "TLS-ALPN-01 against Pebble")
    rep.add("server", f"pid {srv.pid}, http://{srv.host}:{srv.port}, {srv.workers} workers")
    rep.add("start to issued", f"{issued_after * 1000:.0f} ms")

    probe = common.Probe(srv.addr, keep_alive_conns=2, pause=0.002)
    base_start = time.monotonic()
    time.sleep(a.window)
    base_end = time.monotonic()
    renewed = 0
    changed = 0
    errors: list[str] = []
    for i in range(a.renewals):
        leaf = served_leaf(tls_port)
        pem = ssl.DER_cert_to_PEM_cert(leaf)
        now = time.time()
        window = {"suggestedWindow": {
            "start": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 3600)),
            "end": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 60))}}
        body = json.dumps({"Certificate": pem, "ARIResponse": json.dumps(window)}).encode()
        req = urllib.request.Request(f"https://127.0.0.1:{management}/set-renewal-info/",
                                     data=body, method="POST")
        urllib.request.urlopen(req, context=ca_ctx, timeout=5).read()
        before = valid_orders(srv.addr)
        os.kill(srv.pid, signal.SIGHUP)  # look at once
        try:
            wait_for(f"renewal {i + 1}", lambda: valid_orders(srv.addr) > before, 30)
            renewed += 1
            if served_leaf(tls_port) != leaf:
                changed += 1
        except RuntimeError as e:
            errors.append(str(e))
            break
    # As long a window as the baseline, at least.
    while time.monotonic() < base_end + a.window:
        time.sleep(0.05)
    during_end = time.monotonic()
    samples = probe.results()
    before = common.latency_summary(samples, base_start, base_end)
    during = common.latency_summary(samples, base_end, during_end)
    rep.add("normal client (before)", common.fmt_lat(before))
    rep.add("normal client (renewals)", common.fmt_lat(during))
    if errors:
        rep.add("renewal errors", errors)
    if during["first_errors"]:
        rep.add("first errors", during["first_errors"])
    rep.goal(renewed == a.renewals, f"{renewed}/{a.renewals} renewals completed")
    rep.goal(changed == renewed, f"{changed}/{renewed} renewed certificates served at once")
    rep.goal(before["errors"] == 0 and during["errors"] == 0, "no normal request failed")
    rep.goal(during["p99_ms"] <= before["p99_ms"] + a.p99_slack_ms,
             f"p99 during renewals within {a.p99_slack_ms} ms of before "
             f"({during['p99_ms']:.2f} vs {before['p99_ms']:.2f} ms)")
    rep.goal(srv.alive(), "server still running")
    code = srv.terminate()
    rep.goal(code == 0, f"SIGTERM exits 0 (got {code})")
    shutil.rmtree(work, ignore_errors=True)
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
