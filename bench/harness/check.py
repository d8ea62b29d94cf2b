"""Before a scenario is measured, every server answers its request once and the
answers are compared: a benchmark of a wrong answer is worthless. Status,
body length, Content-Encoding, the body itself (against the fixture), the
number of answers to a pipelined write and, for `close`, that the server
really closes, must all agree; otherwise the run fails naming the servers.
Over TLS the certificate must verify against the bench's CA for "localhost",
and every server must negotiate the same parameters with a default OpenSSL
client (bench/tlsload -m info). The HTTP/2 scenarios check the same over h2
(ALPN h2, certificate verified) or h2c with the bench's own client
(harness/h2wire.py), and h2load's first connection must negotiate the same
protocol, suite and key exchange with every server."""

import gzip
import hashlib
import json
import os
import socket
import ssl
import subprocess

from . import h2load, h2wire, h3load
from .servers import REFERENCES, BenchError

H3CLIENT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "testkit", "h3client.py")

TLS_NAME = "localhost"  # SNI and the name the certificate is checked for


def tls_context(tls, alpn=None):
    """A client context that trusts only the bench's CA (tls: prepare.TlsFiles),
    offering the ALPN protocols alpn (a list) if given."""
    context = ssl.create_default_context(cafile=tls.ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if alpn:
        context.set_alpn_protocols(alpn)
    return context


class NoHttp2(Exception):
    """The server does not speak HTTP/2 here (ALPN chose something else, or the
    cleartext preface got an HTTP/1 answer or none): it is left out of the scenario."""


class Response:
    def __init__(self, status, headers, body, head_bytes):
        self.status, self.headers, self.body, self.head_bytes = status, headers, body, head_bytes

    def header(self, name, default=""):
        return self.headers.get(name.lower(), default)


def build_request(port, path, headers, method="GET"):
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class _Reader:
    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def _more(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("connection closed mid-response")
        self.buf += data

    def until(self, marker):
        while marker not in self.buf:
            self._more()
        i = self.buf.index(marker) + len(marker)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def exactly(self, n):
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(self, method="GET"):
        head = self.until(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ConnectionError(f"bad status line {lines[0]!r}")
        status = int(parts[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            body = b""
        elif "content-length" in headers:
            body = self.exactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.until(b"\r\n").split(b";")[0].strip(), 16)
                if size == 0:
                    self.until(b"\r\n")  # no trailers expected
                    break
                body += self.exactly(size)
                self.exactly(2)
        else:
            raise ConnectionError("response without Content-Length or chunked body")
        return Response(status, headers, body, len(head))


def fetch(port, path, headers, count=1, expect_close=False, timeout=5.0, tls=None):
    """Send `count` identical requests in one write; return (responses, closed).
    With tls (an ssl.SSLContext) over HTTPS, the certificate verified."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        sock = tls.wrap_socket(raw, server_hostname=TLS_NAME) if tls else raw
        sock.sendall(build_request(port, path, headers) * count)
        reader = _Reader(sock)
        responses = [reader.read_response() for _ in range(count)]
        closed = None
        if expect_close:
            sock.settimeout(2.0)
            try:  # over TLS, close_notify or the bare end of the stream both read as b""
                closed = reader.buf == b"" and sock.recv(1) == b""
            except (socket.timeout, ConnectionResetError, ssl.SSLError):
                closed = False
        return responses, closed


def resolve_headers(scenario, server, port, tls=None):
    """The scenario's headers for this server ({etag} filled in from its own answer)."""
    headers = dict(scenario.headers)
    if any("{etag}" in v for v in headers.values()):
        (first,), _ = fetch(port, scenario.path, {}, tls=tls)
        etag = first.header("etag")
        if not etag:
            raise BenchError(f"{scenario.name}: {server.name} sent no ETag for {scenario.path}")
        headers = {k: v.replace("{etag}", etag) for k, v in headers.items()}
    return headers


def check_scenario(scenario, servers, docroot, tls=None):
    """Fetch the scenario's request from every server; return per-server facts
    (status, lengths, resolved headers) or raise BenchError naming who differs.
    tls: the certificate files (prepare.TlsFiles), for scenarios over HTTPS."""
    context = tls_context(tls) if scenario.tls else None
    expected_body = None
    if not scenario.expect_text:
        with open(os.path.join(docroot, scenario.path.lstrip("/")), "rb") as f:
            expected_body = f.read()
    facts, problems = {}, []
    for server in servers:
        port = server.port_for(scenario)
        try:
            headers = resolve_headers(scenario, server, port, context)
            responses, closed = fetch(
                port, scenario.path, {**headers, **scenario.check_headers},
                count=scenario.pipeline, expect_close=scenario.close, tls=context
            )
        except (OSError, ConnectionError, ValueError) as e:  # ssl.SSLError is an OSError
            problems.append(f"{server.name}: no valid answer ({e})")
            continue
        r = responses[0]
        enc = r.header("content-encoding")
        body = r.body
        if enc == "gzip":
            try:
                body = gzip.decompress(body)
            except OSError:
                problems.append(f"{server.name}: Content-Encoding gzip but the body is not gzip")
        facts[server.name] = {
            "status": r.status,
            "body_bytes": len(r.body),
            "head_bytes": r.head_bytes,
            "encoding": enc,
            "content_type": r.header("content-type"),
            "headers": headers,
        }
        if r.status != scenario.expect_status:
            problems.append(f"{server.name}: status {r.status}, expected {scenario.expect_status}")
        if enc != scenario.expect_encoding:
            problems.append(
                f"{server.name}: Content-Encoding {enc or 'none'!r}, "
                f"expected {scenario.expect_encoding or 'none'!r}"
            )
        if r.status == 200 and expected_body is not None and body != expected_body:
            problems.append(f"{server.name}: body differs from {scenario.path} ({len(body)} bytes)")
        if scenario.expect_text and scenario.expect_text.encode() not in body:
            problems.append(f"{server.name}: the answer does not contain {scenario.expect_text!r}: "
                            f"{body[:200]!r}")
        for i, other in enumerate(responses[1:], 2):
            if other.status != r.status or len(other.body) != len(r.body):
                problems.append(f"{server.name}: pipelined answer {i} differs from the first")
        if scenario.close and not closed:
            problems.append(f"{server.name}: did not close the connection after Connection: close")
    lengths = {n: (f["status"], f["body_bytes"]) for n, f in facts.items()}
    if len(set(lengths.values())) > 1:
        problems.append(
            "servers disagree on (status, body length): "
            + ", ".join(f"{n}={v}" for n, v in lengths.items())
        )
    if problems:
        raise BenchError(f"scenario {scenario.name}: the servers' answers are wrong or differ:\n  "
                         + "\n  ".join(problems))
    return facts


def fetch_h2(port, path, headers, tls=None, timeout=5.0):
    """GET path on stream 1 of a new HTTP/2 connection: over TLS (tls: an
    ssl.SSLContext offering h2 and http/1.1, certificate verified) or h2c with prior
    knowledge. Returns (Response, protocol), the Response with the server's SETTINGS
    as `settings`; raises NoHttp2 if the server does not answer in HTTP/2,
    h2wire.H2Error or ConnectionError if it answers wrongly."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        if tls:
            sock = tls.wrap_socket(raw, server_hostname=TLS_NAME)
            alpn = sock.selected_alpn_protocol()
            if alpn != "h2":
                raise NoHttp2(f"ALPN: offered h2 and http/1.1, it chose {alpn or 'none'}")
        else:
            sock = raw
        ex = h2wire.Exchange("https" if tls else "http", f"{TLS_NAME if tls else '127.0.0.1'}:{port}",
                             path, headers)
        sock.sendall(ex.start())
        first = True
        while not ex.done:
            data = sock.recv(65536)
            if first and not tls and data.startswith(b"HTTP/"):
                line = data.split(b"\r\n", 1)[0].decode("latin-1")
                raise NoHttp2(f"answered the h2c preface with {line!r}")
            if not data:
                if first and not tls:
                    raise NoHttp2("closed the connection on the h2c preface")
                raise ConnectionError("connection closed mid-response")
            first = False
            out = ex.feed(data)
            if out:
                sock.sendall(out)
        r = Response(ex.status, ex.headers, bytes(ex.body), ex.head_bytes)
        r.settings = ex.settings
        return r, "h2" if tls else "h2c"


# what h2load's first connection must negotiate alike with every server
H2LOAD_AGREE = ("protocol", "tls_protocol", "cipher", "temp_key")


def check_h2(scenario, servers, docroot, tls=None):
    """The answer check of an HTTP/2 scenario (h2 over TLS, or h2c): every server
    answers the scenario's GET once with the bench's own HTTP/2 client, which must
    get the fixture byte for byte (as check_scenario), and then once to h2load
    (-n1 -c1), whose negotiated protocol (and over TLS the suite and key exchange)
    must be the same for all. Returns (facts, skipped): a server that does not
    speak HTTP/2 there is skipped, {name: why}, unless it is a reference (nginx,
    h2o: configured for HTTP/2, so that is a harness failure)."""
    context = tls_context(tls, alpn=["h2", "http/1.1"]) if scenario.tls else None
    with open(os.path.join(docroot, scenario.path.lstrip("/")), "rb") as f:
        expected_body = f.read()
    facts, skipped, problems = {}, {}, []
    for server in servers:
        port = server.port_for(scenario)
        try:
            r, protocol = fetch_h2(port, scenario.path, scenario.headers, tls=context)
        except NoHttp2 as e:
            if server.name in REFERENCES:
                problems.append(f"{server.name}: no HTTP/2 ({e})")
            else:
                skipped[server.name] = f"no HTTP/2 {'over TLS' if scenario.tls else '(h2c)'}: {e}"
            continue
        except (OSError, ConnectionError, ValueError, h2wire.H2Error) as e:  # ssl.SSLError is an OSError
            problems.append(f"{server.name}: no valid HTTP/2 answer ({type(e).__name__}: {e})")
            continue
        enc = r.header("content-encoding")
        facts[server.name] = {
            "status": r.status,
            "body_bytes": len(r.body),
            "head_bytes": r.head_bytes,  # the HPACK-compressed header block
            "encoding": enc,
            "content_type": r.header("content-type"),
            "headers": dict(scenario.headers),
            "protocol": protocol,
            "settings": r.settings,  # the server's SETTINGS (max_concurrent_streams: h2load's -m cap)
        }
        if r.status != scenario.expect_status:
            problems.append(f"{server.name}: status {r.status}, expected {scenario.expect_status}")
        if enc != scenario.expect_encoding:
            problems.append(f"{server.name}: Content-Encoding {enc or 'none'!r}, "
                            f"expected {scenario.expect_encoding or 'none'!r}")
        if r.status == 200 and r.body != expected_body:
            problems.append(f"{server.name}: body differs from {scenario.path} ({len(r.body)} bytes)")
        if scenario.kind != "h2load":
            continue
        argv = h2load.argv(port, scenario.path, 1, 1, tls_name=TLS_NAME if scenario.tls else None)
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            problems.append(f"{server.name}: h2load -n1 hung")
            continue
        info = h2load.parse(out.stdout)
        if not info or info["requests"] != 1 or info["status"] or info["failed"]:
            problems.append(f"{server.name}: h2load -n1 did not get one good answer:\n    $ {' '.join(argv)}\n"
                            + (out.stdout + out.stderr)[-600:])
            continue
        facts[server.name]["h2load"] = {k: info[k] for k in H2LOAD_AGREE}
    lengths = {n: (f["status"], f["body_bytes"]) for n, f in facts.items()}
    if len(set(lengths.values())) > 1:
        problems.append("servers disagree on (status, body length): "
                        + ", ".join(f"{n}={v}" for n, v in lengths.items()))
    seen = {n: tuple(f["h2load"][k] for k in H2LOAD_AGREE) for n, f in facts.items() if "h2load" in f}
    if len(set(seen.values())) > 1:
        problems.append("h2load negotiated different parameters with different servers ("
                        + ", ".join(H2LOAD_AGREE) + "): "
                        + "; ".join(f"{n}={' / '.join(v)}" for n, v in seen.items()))
    if problems:
        raise BenchError(f"scenario {scenario.name}: the servers' HTTP/2 answers are wrong or differ:\n  "
                         + "\n  ".join(problems))
    return facts, skipped


def fetch_h3(python, port, path, headers, tls, timeout=10.0):
    """GET path over HTTP/3 on a new QUIC connection with testkit/h3client.py (aioquic; python:
    its venv's), the certificate verified against the bench's CA for "localhost". Returns
    h3client's answer (status, headers, body_len, body_sha256, alpn); raises ConnectionError
    when there is none (no QUIC on that UDP port, a failed handshake, a reset stream)."""
    argv = [python, "-B", H3CLIENT, "--ca", tls.ca, "--sni", TLS_NAME, "--timeout", str(timeout)]
    for k, v in headers.items():
        argv += ["-H", f"{k}: {v}"]
    argv.append(f"https://127.0.0.1:{port}{path}")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 20)
    except subprocess.TimeoutExpired:
        raise ConnectionError("testkit/h3client.py hung")
    answers = []
    for line in out.stdout.splitlines():
        try:
            answers.append(json.loads(line))
        except ValueError:
            pass
    r = answers[0] if answers else {}
    if "status" not in r:
        why = r.get("error") or r.get("reset") or (out.stdout + out.stderr).strip()[-300:]
        raise ConnectionError(f"no HTTP/3 answer: {why}")
    return r


# what h3load's first connection must negotiate alike with every server
H3LOAD_AGREE = ("version", "cipher", "group", "alpn")


def check_h3(scenario, servers, docroot, tls, python, h3load_bin):
    """The answer check of an HTTP/3 scenario: every server answers the scenario's GET once
    to testkit/h3client.py (aioquic, the certificate verified), whose body must be the
    fixture byte for byte (SHA-256) with the scenario's status and no Content-Encoding, and
    then once to h3load (-n1 -c1, the certificate verified too), which must get one whole 2xx
    answer and negotiate the same TLS version, suite, group and ALPN (h3) with every server.
    Only servers that serve HTTP/3 take part in these scenarios, so any failure fails the run.
    Returns the per-server facts."""
    with open(os.path.join(docroot, scenario.path.lstrip("/")), "rb") as f:
        expected = f.read()
    facts, problems = {}, []
    for server in servers:
        port = server.port_for(scenario)
        try:
            r = fetch_h3(python, port, scenario.path, scenario.headers, tls)
        except ConnectionError as e:
            problems.append(f"{server.name}: {e}")
            continue
        headers = {k.lower(): v for k, v in r.get("headers", [])}
        enc = headers.get("content-encoding", "")
        facts[server.name] = {
            "status": r["status"],
            "body_bytes": r["body_len"],
            "head_bytes": None,  # (h3client does not report the QPACK block's size)
            "encoding": enc,
            "content_type": headers.get("content-type", ""),
            "headers": dict(scenario.headers),
            "protocol": r.get("alpn"),
            "alt_svc": headers.get("alt-svc", ""),
        }
        if r.get("alpn") != "h3":
            problems.append(f"{server.name}: ALPN {r.get('alpn')!r}, not h3")
        if r["status"] != scenario.expect_status:
            problems.append(f"{server.name}: status {r['status']}, expected {scenario.expect_status}")
        if enc != scenario.expect_encoding:
            problems.append(f"{server.name}: Content-Encoding {enc or 'none'!r}, "
                            f"expected {scenario.expect_encoding or 'none'!r}")
        if r["status"] == 200 and (r["body_len"] != len(expected)
                                   or r["body_sha256"] != hashlib.sha256(expected).hexdigest()):
            problems.append(f"{server.name}: body differs from {scenario.path} ({r['body_len']} bytes)")
        if scenario.kind != "h3load":
            continue
        argv = h3load.argv(h3load_bin, port, scenario.path, 1, 1, tls.ca, TLS_NAME, requests=1)
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            problems.append(f"{server.name}: h3load -n1 hung")
            continue
        info = h3load.parse(out.stdout)
        if not info or info["ok"] != 1 or info["errors"]:
            problems.append(f"{server.name}: h3load -n1 did not get one good answer:\n    $ {' '.join(argv)}\n"
                            + (out.stdout + out.stderr)[-600:])
            continue
        facts[server.name]["h3load"] = {k: (info.get("tls") or {}).get(k, "?") for k in H3LOAD_AGREE}
    lengths = {n: (f["status"], f["body_bytes"]) for n, f in facts.items()}
    if len(set(lengths.values())) > 1:
        problems.append("servers disagree on (status, body length): "
                        + ", ".join(f"{n}={v}" for n, v in lengths.items()))
    seen = {n: tuple(f["h3load"][k] for k in H3LOAD_AGREE) for n, f in facts.items() if "h3load" in f}
    if len(set(seen.values())) > 1:
        problems.append("h3load negotiated different parameters with different servers ("
                        + ", ".join(H3LOAD_AGREE) + "): "
                        + "; ".join(f"{n}={' / '.join(map(str, v))}" for n, v in seen.items()))
    if problems:
        raise BenchError(f"scenario {scenario.name}: the servers' HTTP/3 answers are wrong or differ:\n  "
                         + "\n  ".join(problems))
    return facts


# what every server must negotiate alike with the same client (tlsload -m info)
TLS_AGREE = ("protocol", "cipher", "group", "signature", "key", "alpn")


def check_tls(scenario, servers, tlsload_bin, facts):
    """`tlsload -m info` against every server's HTTPS listener: a full handshake with
    OpenSSL's default client settings (wrk's), then one offering its session. The
    servers must agree on protocol, suite, group, signature and ALPN, and for a
    resumption scenario each must resume. Adds facts[name]["tls"]."""
    problems = []
    for server in servers:
        port = server.port_for(scenario)
        argv = [tlsload_bin, "-m", "info", "-n", TLS_NAME, str(port), scenario.path]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            problems.append(f"{server.name}: tlsload -m info hung")
            continue
        line = next((l for l in out.stdout.splitlines() if l.startswith("TLSINFO ")), None)
        if line is None:
            problems.append(f"{server.name}: no TLS handshake ({out.stderr.strip()[-300:]})")
            continue
        info = json.loads(line[len("TLSINFO "):])
        facts[server.name]["tls"] = info
        if info["status"] != scenario.expect_status:
            problems.append(f"{server.name}: status {info['status']} over TLS, expected {scenario.expect_status}")
        if scenario.handshake == "resume" and not info["resumed"]:
            problems.append(f"{server.name}: did not resume the session of its own ticket "
                            f"({info['tickets']} ticket(s) after a full handshake)")
    seen = {n: tuple(f["tls"].get(k) for k in TLS_AGREE) for n, f in facts.items() if "tls" in f}
    if len(set(seen.values())) > 1:
        problems.append("servers negotiated different TLS parameters with the same client ("
                        + ", ".join(TLS_AGREE) + "): "
                        + "; ".join(f"{n}={' '.join(map(str, v))}" for n, v in seen.items()))
    if problems:
        raise BenchError(f"scenario {scenario.name}: TLS check failed:\n  " + "\n  ".join(problems))
    return facts
