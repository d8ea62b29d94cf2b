#!/usr/bin/env python3
"""An HTTP/3 client for tern's tests, on aioquic (PyPI, pinned and installed into its own venv
by scripts/install-h3-test-deps; run by that venv's python, or by any python3, which then runs
itself again with the venv's).

    h3client.py [--insecure | --ca FILE] [--sni NAME] [--header 'name: value']...
                [--method M] [--data-file F] [--repeat N] [--parallel N]
                [--session-ticket FILE] [--zero-rtt] [--rebind-after N] [--timeout S]
                https://127.0.0.1:PORT/path [more URLs on the same connection]

All URLs go over one QUIC connection (the same host and port). Requests are sent in rounds:
a round opens --parallel streams for each URL at once (default 1), in the order given, and
waits for all of their answers; --repeat rounds (default 1) follow one another on the same
connection. So `--repeat 3` is three requests in sequence, `--parallel 8` eight at once,
and both make --repeat × --parallel × URLs requests.

Output: one JSON object per request on stdout, in the order the requests were made:

    {"url": "...", "status": 200, "headers": [["name", "value"], ...], "body_len": N,
     "body_sha256": "<hex>", "body": "<the body as text if it is UTF-8 and under 64 KiB, else
     null>", "alpn": "h3", "resumed": bool, "early_data_accepted": bool, "local_port": N}

("headers" leaves out the pseudo-headers; trailers, if any, come as "trailers" in the same
form; interim 1xx answers are skipped), or, for a stream the server reset,
{"url": "...", "reset": CODE}. A connection error (handshake failure, CONNECTION_CLOSE from
the peer, idle timeout) or --timeout ends the run with one line {"error": "...", "code":
CODE or null} after the answers that were complete, and exit status 2. Exit status 0 when
every answer arrived whole (whatever its status code), 1 when some stream was reset, 2 on a
connection error or bad arguments.

--method defaults to GET, or POST with --data-file (whose contents are the request body,
sent with a content-length). A --header whose name starts with ':' replaces that
pseudo-header (:authority, :path, :method, :scheme). --sni sets the TLS server name (and the
name the certificate is checked against); by default it is the URL's host, and no SNI is sent
for an IP address. --session-ticket FILE loads a TLS session ticket from FILE (if it exists)
to resume, and saves the newest ticket the server sends there (waiting up to a second for
one). --zero-rtt sends the first round's requests as 0-RTT early data when the loaded ticket
allows it ("early_data_accepted" tells whether the server took them). --rebind-after N moves
the connection to a new UDP socket (a new local port, the same connection ID) after the Nth
round, as a NAT rebinding does: the server sees the connection come from a new address, and the
rounds after it go from there ("local_port" says which port a request's round left from).
--timeout (default 10 seconds) bounds the whole run.
"""

import argparse
import asyncio
import hashlib
import json
import os
import pickle
import socket
import ssl
import sys
from urllib.parse import urlsplit

VENV = os.environ.get("TERN_AIOQUIC_VENV") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "tern",
    "aioquic-venv",
)

try:
    from aioquic.asyncio import QuicConnectionProtocol, connect
    from aioquic.h3.connection import H3_ALPN, H3Connection
    from aioquic.h3.events import DataReceived, HeadersReceived
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, StreamReset
except ImportError:
    python = os.path.join(VENV, "bin", "python")
    if os.path.exists(python) and os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])
    print(json.dumps({"error": f"aioquic is not installed (run scripts/install-h3-test-deps; venv {VENV})",
                      "code": None}))
    sys.exit(2)

BODY_TEXT_MAX = 64 * 1024


class Exchange:
    """One request and what came back for it."""

    def __init__(self, url):
        self.url = url
        self.status = None
        self.headers = []
        self.trailers = None
        self.body = bytearray()
        self.reset = None
        self.done = asyncio.get_running_loop().create_future()

    def finish(self):
        if not self.done.done():
            self.done.set_result(None)


class ConnectionFailed(Exception):
    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def text(b):
    return b.decode("utf-8", "backslashreplace")


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.exchanges = {}
        self.handshake = None
        self.terminated = None
        self.closed = asyncio.get_running_loop().create_future()

    def request(self, exchange, headers, body):
        stream_id = self._quic.get_next_available_stream_id()
        self.exchanges[stream_id] = exchange
        self.h3.send_headers(stream_id, headers, end_stream=body is None)
        if body is not None:
            self.h3.send_data(stream_id, body, end_stream=True)
        self.transmit()

    def quic_event_received(self, event):
        if isinstance(event, HandshakeCompleted):
            self.handshake = event
        elif isinstance(event, StreamReset):
            ex = self.exchanges.get(event.stream_id)
            if ex is not None and not ex.done.done():
                ex.reset = event.error_code
                ex.finish()
        elif isinstance(event, ConnectionTerminated):
            self.terminated = event
            if not self.closed.done():
                self.closed.set_result(event)
        for h3_event in self.h3.handle_event(event):
            ex = self.exchanges.get(getattr(h3_event, "stream_id", None))
            if ex is None or ex.done.done():
                continue
            if isinstance(h3_event, HeadersReceived):
                fields = [(k, v) for k, v in h3_event.headers]
                status = next((v for k, v in fields if k == b":status"), None)
                regular = [[text(k), text(v)] for k, v in fields if not k.startswith(b":")]
                if ex.status is None and status is not None:
                    code = int(status)
                    if 100 <= code < 200:
                        continue  # interim answer
                    ex.status, ex.headers = code, regular
                else:
                    ex.trailers = regular
            elif isinstance(h3_event, DataReceived):
                ex.body += h3_event.data
            if h3_event.stream_ended:
                ex.finish()


def udp_socket():
    """A dual-stack UDP socket on a free port, as aioquic's connect() makes."""
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", 0, 0, 0))
    return sock


async def rebind(client):
    """Moves the connection to a new socket: what it sends from now on comes from a new port,
    and the old one is closed (so nothing the server still sends there is read)."""
    old = client._transport
    await asyncio.get_running_loop().create_datagram_endpoint(lambda: client, sock=udp_socket())
    old.close()


def local_port(client):
    return client._transport.get_extra_info("sockname")[1]


def result(ex, handshake, port):
    if ex.reset is not None:
        return {"url": ex.url, "reset": ex.reset}
    body = bytes(ex.body)
    shown = None
    if len(body) < BODY_TEXT_MAX:
        try:
            shown = body.decode("utf-8")
        except UnicodeDecodeError:
            pass
    out = {
        "url": ex.url,
        "status": ex.status,
        "headers": ex.headers,
        "body_len": len(body),
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "body": shown,
        "alpn": handshake.alpn_protocol if handshake else None,
        "resumed": bool(handshake and handshake.session_resumed),
        "early_data_accepted": bool(handshake and handshake.early_data_accepted),
        "local_port": port,
    }
    if ex.trailers is not None:
        out["trailers"] = ex.trailers
    return out


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def terminated_error(event):
    reason = event.reason_phrase or "connection closed"
    if event.frame_type is not None:
        reason += f" (frame type {event.frame_type:#x})"
    return ConnectionFailed(reason, event.error_code)


async def run(args, urls, host, port, base_headers, body):
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.server_name = args.sni or host
    if args.insecure:
        config.verify_mode = ssl.CERT_NONE
    elif args.ca:
        config.load_verify_locations(cafile=args.ca)
    if args.session_ticket and os.path.exists(args.session_ticket):
        try:
            with open(args.session_ticket, "rb") as f:
                config.session_ticket = pickle.load(f)
        except Exception as e:  # a stale or foreign file: a full handshake then
            print(f"h3client: ignoring the session ticket in {args.session_ticket}: {e}", file=sys.stderr)

    new_ticket = asyncio.get_running_loop().create_future()

    def save_ticket(ticket):
        if args.session_ticket:
            tmp = args.session_ticket + ".tmp"
            with open(tmp, "wb") as f:
                pickle.dump(ticket, f)
            os.replace(tmp, args.session_ticket)
        if not new_ticket.done():
            new_ticket.set_result(None)

    zero_rtt = args.zero_rtt and config.session_ticket is not None
    made = []  # the protocol, also when the handshake fails (connect() then yields none)

    def make(*a, **kw):
        made.append(Client(*a, **kw))
        return made[-1]

    exchanges = []
    try:
        async with connect(host, port, configuration=config, create_protocol=make,
                           session_ticket_handler=save_ticket,
                           wait_connected=not zero_rtt) as client:
            for done in range(args.repeat):
                if args.rebind_after and done == args.rebind_after:
                    await rebind(client)
                port = local_port(client)
                batch = []
                for u in urls:
                    for _ in range(args.parallel):
                        ex = Exchange(u.geturl())
                        client.request(ex, headers_for(u, base_headers), body)
                        batch.append(ex)
                exchanges += batch
                if zero_rtt and client.handshake is None:
                    # The first round went as early data; wait for the handshake as well.
                    await await_or_close(client, client.wait_connected())
                for ex in batch:  # each printed as soon as it and those before it are done
                    await await_or_close(client, ex.done)
                    emit(result(ex, client.handshake, port))
            if args.session_ticket and not new_ticket.done():
                try:
                    await asyncio.wait_for(asyncio.shield(new_ticket), 1.0)
                except asyncio.TimeoutError:
                    print("h3client: the server sent no session ticket", file=sys.stderr)
            client.close()
    except ConnectionFailed:
        raise
    except ConnectionError as e:
        if made and made[0].terminated is not None:
            raise terminated_error(made[0].terminated) from e
        raise ConnectionFailed(str(e) or "connection failed", None) from e
    return any(ex.reset is not None for ex in exchanges)


async def await_or_close(client, awaitable):
    """Waits for awaitable, or raises ConnectionFailed if the connection ends first."""
    task = asyncio.ensure_future(awaitable)
    await asyncio.wait({task, client.closed}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    raise terminated_error(client.terminated)


def headers_for(u, base):
    path = u.path or "/"
    if u.query:
        path += "?" + u.query
    pseudo = {b":method": None, b":scheme": b"https", b":authority": u.netloc.encode(), b":path": path.encode()}
    regular = []
    for name, value in base:
        if name.startswith(b":"):
            pseudo[name] = value
        else:
            regular.append((name, value))
    return [(k, v) for k, v in pseudo.items() if v is not None] + regular


def main():
    p = argparse.ArgumentParser(description="HTTP/3 client for tern's tests (aioquic)")
    trust = p.add_mutually_exclusive_group()
    trust.add_argument("--insecure", "-k", action="store_true", help="accept any server certificate")
    trust.add_argument("--ca", metavar="FILE", help="trust the CA certificates in this PEM file")
    p.add_argument("--sni", metavar="NAME", help="TLS server name (default: the URL's host)")
    p.add_argument("--header", "-H", action="append", default=[], metavar="'name: value'")
    p.add_argument("--method", "-X", metavar="M")
    p.add_argument("--data-file", metavar="F", help="request body (the method defaults to POST)")
    p.add_argument("--repeat", type=int, default=1, metavar="N", help="rounds, one after another")
    p.add_argument("--parallel", type=int, default=1, metavar="N", help="streams at once per URL in a round")
    p.add_argument("--session-ticket", metavar="FILE", help="load (if there) and save a TLS session ticket")
    p.add_argument("--zero-rtt", action="store_true", help="send the first round as 0-RTT early data")
    p.add_argument("--rebind-after", type=int, default=0, metavar="N",
                   help="move to a new local port after the Nth round (NAT rebinding)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S", help="bound on the whole run")
    p.add_argument("urls", nargs="+", metavar="URL")
    args = p.parse_args()
    if args.repeat < 1 or args.parallel < 1:
        p.error("--repeat and --parallel must be at least 1")
    if args.rebind_after < 0 or args.rebind_after >= args.repeat:
        p.error("--rebind-after must be below --repeat (rounds must follow the move)")

    urls = [urlsplit(u) for u in args.urls]
    for u in urls:
        if u.scheme != "https" or not u.hostname:
            p.error(f"{u.geturl()}: not an https:// URL")
        if (u.hostname, u.port) != (urls[0].hostname, urls[0].port):
            p.error("all URLs must name the same host and port (one connection)")
    host, port = urls[0].hostname, urls[0].port or 443

    base = []
    for h in args.header:
        name, sep, value = h[1:].partition(":") if h.startswith(":") else h.partition(":")
        if h.startswith(":"):
            name = ":" + name
        if not sep or not name.strip():
            p.error(f"--header {h!r}: not 'name: value'")
        base.append((name.strip().lower().encode(), value.strip().encode()))
    body = None
    if args.data_file:
        with open(args.data_file, "rb") as f:
            body = f.read()
    method = args.method or ("POST" if body is not None else "GET")
    base.insert(0, (b":method", method.encode()))
    if body is not None and not any(n == b"content-length" for n, _ in base):
        base.append((b"content-length", str(len(body)).encode()))

    try:
        any_reset = asyncio.run(asyncio.wait_for(run(args, urls, host, port, base, body), args.timeout))
    except ConnectionFailed as e:
        emit({"error": str(e), "code": e.code})
        sys.exit(2)
    except (asyncio.TimeoutError, TimeoutError):
        emit({"error": f"timeout: no complete answer within {args.timeout:g} s", "code": None})
        sys.exit(2)
    except OSError as e:
        emit({"error": str(e), "code": None})
        sys.exit(2)
    sys.exit(1 if any_reset else 0)


if __name__ == "__main__":
    main()
