"""The HTTP/3 load clients' command line and output: bench/h3load (quic-go; built by
scripts/install-h3-test-deps; the answer checks and h3-idle-rss) and bench/h3load-quinn (one
thread on quinn-proto, a workspace member; the load of h3-small and h3-large unless
--h3-client quic-go) take the same flags and print the same line (h3load-quinn: no -idle,
and its tls has no cipher).

    h3load -c C -m M -d Ss -ca CA -sni localhost https://127.0.0.1:PORT/PATH

It verifies the server's certificate against the bench's CA for the name `localhost` (the
handshakes happen before its clock starts), offers ALPN h3 and x25519 alone (as h2load's and
tlsload's OpenSSL 3.0 get everywhere), and prints one line of JSON: requests, ok, errors,
bytes (answer bodies), seconds, rps, p50_us, p99_us, cpu_seconds (its own CPU during the
window) and tls (what its first connection negotiated). `-idle D` instead holds -c idle
connections after one request each (h3-idle-rss), printing a line when they are open and
one when the hold ends (SIGTERM ends it early).
"""

import json


def argv(binary, port, path, connections, streams, ca, tls_name, duration=None, requests=None):
    """h3load against UDP 127.0.0.1:port (SNI and certificate name tls_name): -d duration
    seconds, or -n requests."""
    out = [binary, "-c", str(connections), "-m", str(streams)]
    out += ["-d", f"{duration}s"] if duration else ["-n", str(requests or 1)]
    return out + ["-ca", ca, "-sni", tls_name, f"https://127.0.0.1:{port}{path}"]


def idle_argv(binary, port, path, connections, ca, tls_name, hold_s):
    return [binary, "-c", str(connections), "-idle", f"{hold_s}s", "-ca", ca, "-sni", tls_name,
            f"https://127.0.0.1:{port}{path}"]


def parse(stdout):
    """h3load's result line as a dict, or None."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                out = json.loads(line)
            except ValueError:
                return None
            return out if "requests" in out else None
    return None


def as_run(out):
    """h3load's result in the shape of a BENCHJSON line (what measure._run_client reads):
    requests are the answers received whole with a 2xx status; `failed` the others (failed
    streams or connections, other statuses)."""
    return {
        "duration_us": out["seconds"] * 1e6,
        "requests": out["ok"],
        "failed": out["errors"],
        "bytes": out["bytes"],
        "p50_us": out["p50_us"],
        "p99_us": out["p99_us"],
        "wrk_corrected": 0,
        "client_cpu_s": out.get("cpu_seconds"),
        "tls": out.get("tls") or {},
    }
