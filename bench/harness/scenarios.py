"""The scenario table. Every scenario is selectable by name on the command line
(`bench/run small-50 gzip`).

Adding one is adding a row:
  * a wrk scenario needs a path, headers and/or a Lua script under bench/lua/
    (the script must not define `done`: bench/lua/report.lua is appended to it);
  * `servers=(...)` restricts it to some servers; an application server
    (`app = True` in servers.py, e.g. tern-demo) takes part only in the
    scenarios that name it there;
  * an answer that is not a docroot file is checked with `expect_text` (a
    string its body must contain) instead of the fixture, and `check_headers`
    are sent with the check's request only (not by wrk);
  * `tls=True` runs it against each server's HTTPS listener (same certificate
    for all, made by prepare.make_certs): a wrk scenario then runs wrk over
    https; kind "tlsload" makes every request on a new connection with
    bench/tlsload (`handshake` "full" or "resume"), and kind "idle" holds TLS
    connections. Only servers with `tls = True` take part;
  * `h2=True` speaks HTTP/2: over TLS with ALPN h2 when `tls=True` (the
    servers' HTTPS listeners), else h2c with prior knowledge (their plain
    ones). Kind "h2load" runs h2load with `streams` concurrent streams per
    connection; kind "idle" holds HTTP/2 connections. A server that does not
    speak HTTP/2 there is left out with a note (never nginx or h2o);
  * `h3=True` (with `tls=True`) speaks HTTP/3 over QUIC on the UDP port of each
    server's HTTPS address: kind "h3load" runs bench/h3load with `streams`
    concurrent streams per connection, kind "idle" holds QUIC connections (h3load
    -idle). Only servers with `h3 = True` take part (tern, tern-uring, Caddy); a
    server with `h3_only = True` (Caddy) takes part in nothing else;
  * kind "claims" runs wrk against tern demo and adds the game's own account
    from /statusz; `sync` picks the tern demo process it runs against
    (`--sync normal` or `--sync full`, see servers.TernDemo);
  * a new load generator is a new `kind` plus a runner function registered
    in measure.RUNNERS.
Header values may use {etag}: it is replaced by the ETag each server itself
returned for `path` (servers make different ETags).
"""

from dataclasses import dataclass, field


@dataclass
class Scenario:
    name: str
    description: str
    kind: str = "wrk"  # wrk | tlsload | claims | idle | h2load | h3load (see measure.RUNNERS)
    path: str = "/index.html"
    connections: int = 50
    headers: dict = field(default_factory=dict)
    lua: str = ""  # file under bench/lua/
    pipeline: int = 1  # requests per write (the Lua script must agree)
    close: bool = False  # Connection: close; the server must close after answering
    floor: bool = False  # a canned answer is meaningful here, so the floor takes part
    servers: tuple = ()  # restrict to these servers (empty: all)
    expect_status: int = 200
    expect_encoding: str = ""  # Content-Encoding every server must answer with
    throughput: bool = False  # MB/s is the headline number
    expect_text: str = ""  # the body must contain this (not a docroot file: no fixture compare)
    check_headers: dict = field(default_factory=dict)  # added to the answer check's request only
    tls: bool = False  # over HTTPS, against each server's TLS listener
    handshake: str = ""  # tlsload: "full" (no session offered) or "resume" (every one resumes)
    h2: bool = False  # HTTP/2: h2 over TLS (ALPN) if tls, else h2c with prior knowledge
    streams: int = 1  # h2load / h3load -m: concurrent streams per connection
    h3: bool = False  # HTTP/3 over QUIC (with tls=True), on the UDP port of the HTTPS address
    sync: str = ""  # claims: tern demo with --sync normal, --sync full, or "pg" (--store postgres://)

    @property
    def unit(self):
        """What one counted request is: the tlsload scenarios count handshakes."""
        return "handshake" if self.kind == "tlsload" else "claim" if self.kind == "claims" else "request"

    def applies_to(self, server):
        if self.h3 and not server.h3:
            return False
        if server.h3_only and not self.h3:
            return False
        if self.tls and not server.tls:
            return False
        if self.servers:
            return server.name in self.servers
        if server.app:
            return False
        return self.floor or not server.canned


# What the two claims scenarios share: the load (lua/claims.lua) and the answer check.
CLAIMS = dict(
    kind="claims",
    path="/claim?name=bench-check",
    headers={"Accept": "text/plain"},
    check_headers={"X-Forwarded-For": "192.0.2.1"},
    expect_text="192.0.2.1 is now claimed by bench-check",
    lua="claims.lua",
    servers=("tern-demo",),
)

SCENARIOS = [
    Scenario(
        "small-50",
        "953-byte index.html, keep-alive, 50 connections",
        connections=50,
        floor=True,
    ),
    Scenario(
        "small-1000",
        "953-byte index.html, keep-alive, 1000 connections",
        connections=1000,
        floor=True,
    ),
    Scenario(
        "pipelined",
        "953-byte index.html, 16 requests per write (lua/pipeline.lua), 50 connections",
        lua="pipeline.lua",
        pipeline=16,
        floor=True,
    ),
    Scenario(
        "gzip",
        "index.html with Accept-Encoding: gzip; every server sends the precompressed index.html.gz",
        headers={"Accept-Encoding": "gzip"},
        expect_encoding="gzip",
    ),
    Scenario(
        "large",
        "1 MiB file (large.bin), keep-alive, 50 connections",
        path="/large.bin",
        throughput=True,
    ),
    Scenario(
        "not-modified",
        "If-None-Match with the server's own ETag, answered 304",
        headers={"If-None-Match": "{etag}"},
        expect_status=304,
    ),
    Scenario(
        "close",
        "Connection: close on every request: accept, answer, close (50 connections)",
        headers={"Connection": "close"},
        close=True,
        floor=True,
    ),
    Scenario(
        "tls-small-50",
        "HTTPS: 953-byte index.html, keep-alive, 50 connections (wrk over https)",
        tls=True,
    ),
    Scenario(
        "tls-handshake",
        "HTTPS, a full handshake per request (ECDSA P-256 certificate, x25519): new connection, "
        "no session offered, Connection: close, 50 connections (bench/tlsload)",
        kind="tlsload",
        headers={"Connection": "close"},
        close=True,
        tls=True,
        handshake="full",
    ),
    Scenario(
        "tls-resume",
        "HTTPS, a resumed TLS 1.3 session per request (ticket, psk_dhe_ke): new connection, "
        "Connection: close, 50 connections (bench/tlsload)",
        kind="tlsload",
        headers={"Connection": "close"},
        close=True,
        tls=True,
        handshake="resume",
    ),
    Scenario(
        "tls-large",
        "HTTPS: 1 MiB file (large.bin), keep-alive, 50 connections (wrk over https)",
        path="/large.bin",
        throughput=True,
        tls=True,
    ),
    Scenario(
        "h2-small",
        "HTTP/2 over TLS (ALPN h2): 953-byte index.html, 50 connections × 32 concurrent streams "
        "(h2load -c50 -m32)",
        kind="h2load",
        tls=True,
        h2=True,
        streams=32,
    ),
    Scenario(
        "h2c-small",
        "h2-small over cleartext HTTP/2 (h2c with prior knowledge) on the plain listener",
        kind="h2load",
        h2=True,
        streams=32,
    ),
    Scenario(
        "h2-large",
        "HTTP/2 over TLS: 1 MiB file (large.bin), 10 connections × 5 streams: as many in "
        "flight as tls-large's 50 (h2load -c10 -m5)",
        kind="h2load",
        path="/large.bin",
        connections=10,
        streams=5,
        throughput=True,
        tls=True,
        h2=True,
    ),
    Scenario(
        "h3-small",
        "HTTP/3 (QUIC, ALPN h3): 953-byte index.html, 50 connections × 32 concurrent streams "
        "(bench/h3load-quinn -c50 -m32): h2-small over QUIC",
        kind="h3load",
        tls=True,
        h3=True,
        streams=32,
    ),
    Scenario(
        "h3-large",
        "HTTP/3: 1 MiB file (large.bin), 10 connections × 5 streams, as h2-large "
        "(bench/h3load-quinn -c10 -m5)",
        kind="h3load",
        path="/large.bin",
        connections=10,
        streams=5,
        throughput=True,
        tls=True,
        h3=True,
    ),
    Scenario(
        "claims",
        "IPv4 Games (tern demo --sync normal): GET /claim?name=… from a fresh X-Forwarded-For "
        "address per request (lua/claims.lua), answered once written to the journal (one write "
        "per worker turn), 50 connections",
        sync="normal",
        **CLAIMS,
    ),
    Scenario(
        "claims-full",
        "claims against tern demo --sync full: answered only after an fdatasync covering the "
        "claim (one sync for all that was written meanwhile, on the claim-syncer thread)",
        sync="full",
        **CLAIMS,
    ),
    Scenario(
        "claims-pg",
        "claims against tern demo --store postgres://…: answered only after the PostgreSQL "
        "commit (synchronous_commit on, fsync on) of the group holding the claim, one "
        "transaction per group on the pg-writer thread; the database on the client CPU",
        sync="pg",
        **{**CLAIMS, "connections": 200},
    ),
    Scenario(
        "idle-rss",
        "10 000 keep-alive connections, one request each, then idle: server RSS per connection",
        kind="idle",
        connections=10000,
        floor=True,
    ),
    Scenario(
        "tls-idle-rss",
        "idle-rss over HTTPS: 10 000 TLS connections, one request each, then idle",
        kind="idle",
        connections=10000,
        tls=True,
    ),
    Scenario(
        "h2-idle-rss",
        "idle-rss over HTTP/2 (TLS, ALPN h2): 10 000 connections, preface + SETTINGS and one "
        "request each, then idle",
        kind="idle",
        connections=10000,
        tls=True,
        h2=True,
    ),
    Scenario(
        "h3-idle-rss",
        "idle-rss over HTTP/3: 2000 QUIC connections (a full handshake, the HTTP/3 control "
        "streams and one request each), then idle (bench/h3load -idle)",
        kind="idle",
        connections=2000,
        tls=True,
        h3=True,
    ),
]

BY_NAME = {s.name: s for s in SCENARIOS}
