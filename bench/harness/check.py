"""Before a scenario is measured, every server answers its request once and the
answers are compared: a benchmark of a wrong answer is worthless. Status,
body length, Content-Encoding, the body itself (against the fixture), the
number of answers to a pipelined write and, for `close`, that the server
really closes, must all agree; otherwise the run fails naming the servers.
Over TLS the certificate must verify against the bench's CA for "localhost",
and every server must negotiate the same parameters with a default OpenSSL
client (bench/tlsload -m info)."""

import gzip
import json
import os
import socket
import ssl
import subprocess

from .servers import BenchError

TLS_NAME = "localhost"  # SNI and the name the certificate is checked for


def tls_context(tls):
    """A client context that trusts only the bench's CA (tls: prepare.TlsFiles)."""
    context = ssl.create_default_context(cafile=tls.ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


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
