#!/usr/bin/env python3
"""A hostile HTTP/3 peer for tern's tests, on aioquic's sans-IO `QuicConnection` (the venv of
scripts/install-h3-test-deps; run by that venv's python, or by any python3, which then runs
itself again with the venv's). It speaks QUIC properly and HTTP/3 badly: the HTTP/3 frames,
stream types and QPACK field sections are written by hand here, so it can send what aioquic's
own H3Connection never would.

    h3hostile.py --ca FILE [--sni NAME] [--timeout S] ATTACK [--count N] [options]
                 https://127.0.0.1:PORT

One JSON object on stdout says what the client saw:

    {"attack": "...", "handshake": true, "close": {"code": C, "transport": bool,
     "frame_type": F or null, "reason": "..."} or null, "resets": {"<stream>": code},
     "stops": {"<stream>": code}, "answers": {"<stream>": status}, ...}

"close" is the CONNECTION_CLOSE the server sent (an application close, type 0x1d, has
"transport": false and no frame type), null if none came. "resets" and "stops" are the
RESET_STREAM and STOP_SENDING frames it sent, "answers" the status of each complete answer.
Each attack adds its own counts (see the functions below). Exit status 0 when the attack ran
(whatever the server did), 2 when it could not (no handshake, bad arguments).

Attacks (each function's docstring says what it sends and what it reports):
  protocol errors: second-control, data-before-headers, h2-frame (--where control|request,
    --frame-type T), settings-twice, bad-qpack, bad-pseudo, bad-path, malformed-loop;
  floods: streams (--over-limit, --uni), pings (--per-packet K), tiny-frames (--path P),
    sparse-frames, reset-loop, cancel-downloads (--path P), close-under-load (--path P),
    unknown-uni, cid-churn (--migrate);
  Initials that never continue: initial-no-reply (--seconds S), initial-flood.
"""

import argparse
import json
import os
import select
import socket
import sys
import time
from urllib.parse import urlsplit

VENV = os.environ.get("TERN_AIOQUIC_VENV") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
    "tern",
    "aioquic-venv",
)

try:
    import pylsqpack
    from aioquic.quic import events as qe
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection
    from aioquic.quic.packet import QuicFrameType
    from aioquic.quic.packet_builder import QuicPacketBuilderStop
except ImportError:
    python = os.path.join(VENV, "bin", "python")
    if os.path.exists(python) and os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])
    print(json.dumps({"error": f"aioquic is not installed (run scripts/install-h3-test-deps; venv {VENV})"}))
    sys.exit(2)

# HTTP/3 frame types, stream types and error codes (RFC 9114 §7.2, §6.2, §8.1).
DATA, HEADERS, SETTINGS = 0x00, 0x01, 0x04
CONTROL_STREAM = 0x00
H3_REQUEST_CANCELLED = 0x10C


def varint(n):
    if n < 0x40:
        return bytes([n])
    if n < 0x4000:
        return (n | 0x4000).to_bytes(2, "big")
    if n < 0x40000000:
        return (n | 0x80000000).to_bytes(4, "big")
    return (n | 0xC000000000000000).to_bytes(8, "big")


def read_varint(buf, at):
    """(value, next position), or None if buf ends first."""
    if at >= len(buf):
        return None
    n = 1 << (buf[at] >> 6)
    if at + n > len(buf):
        return None
    v = buf[at] & 0x3F
    for b in buf[at + 1 : at + n]:
        v = (v << 8) | b
    return v, at + n


def frame(kind, payload=b""):
    return varint(kind) + varint(len(payload)) + payload


def prefixed(value, bits, flags):
    """An HPACK/QPACK prefixed integer (RFC 7541 §5.1)."""
    limit = (1 << bits) - 1
    if value < limit:
        return bytes([flags | value])
    out = [flags | limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def section(fields):
    """A QPACK field section of literal lines with literal names: no table, no Huffman, so
    any name (upper case, unknown pseudo-headers) goes out exactly as given."""
    out = bytearray(b"\x00\x00")  # Required Insert Count 0, Delta Base 0
    for name, value in fields:
        out += prefixed(len(name), 3, 0x20) + name + prefixed(len(value), 7, 0x00) + value
    return bytes(out)


class Conn(QuicConnection):
    """aioquic's connection, noting the peer's CONNECTION_CLOSE, and able to put several PING
    frames in a packet."""

    pings_per_packet = 1
    peer_close = None
    # Never raise a stream's receive window (aioquic does as data arrives, read or not).
    hold_windows = False

    def _write_stream_limits(self, builder, space, stream):
        if not self.hold_windows:
            super()._write_stream_limits(builder, space, stream)

    def _handle_connection_close_frame(self, context, frame_type, buf):
        before = self._close_event
        super()._handle_connection_close_frame(context, frame_type, buf)
        if before is None and self._close_event is not None:
            e = self._close_event
            self.peer_close = {
                "code": e.error_code,
                "transport": e.frame_type is not None,
                "frame_type": e.frame_type,
                "reason": e.reason_phrase,
            }

    # Frames written by hand, (type, body), most recent last: as many as fit go into each
    # packet that carries a PING (so `send_ping` sends them).
    raw_frames = []

    def _write_ping_frame(self, builder, uids=[], comment=""):
        while self.raw_frames:
            kind, body = self.raw_frames[-1]
            try:
                # The capacity counts the type byte, and a byte is left for the PING.
                builder.start_frame(kind, capacity=len(body) + 2).push_bytes(body)
            except QuicPacketBuilderStop:
                break
            self.raw_frames.pop()
        for _ in range(self.pings_per_packet - 1):
            try:
                builder.start_frame(QuicFrameType.PING, capacity=1)
            except QuicPacketBuilderStop:
                break
        super()._write_ping_frame(builder, uids, comment)


class Exchange:
    def __init__(self):
        self.buf = bytearray()
        self.status = None
        self.body = bytearray()
        self.data_left = 0
        self.done = False


class Peer:
    def __init__(self, args, pings_per_packet=1):
        self.args = args
        self.addr = (args.host, args.port)
        config = QuicConfiguration(is_client=True, alpn_protocols=["h3"])
        config.server_name = args.sni
        config.load_verify_locations(cafile=args.ca)
        if args.attack == "cancel-downloads":
            # A small stream window, never raised: the large answer stops a little way in,
            # waiting for the client, as one does whose reader has gone.
            config.max_stream_data = 64 * 1024
        self.quic = Conn(configuration=config)
        self.quic.hold_windows = args.attack == "cancel-downloads"
        self.quic.pings_per_packet = pings_per_packet
        self.sock = self.new_socket()
        self.handshake = None
        self.terminated = None
        self.resets = {}
        self.stops = {}
        self.exchanges = {}
        self.pings_acked = 0
        self.datagrams_out = 0
        self.bytes_out = 0
        self.datagrams_in = 0
        self.decoder = pylsqpack.Decoder(0, 0)
        self.quic.connect(self.addr, now=time.monotonic())

    def new_socket(self):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.connect(self.addr)
        s.setblocking(False)
        return s

    @property
    def authority(self):
        return f"{self.args.host}:{self.args.port}".encode()

    def flush(self):
        for data, _ in self.quic.datagrams_to_send(now=time.monotonic()):
            try:
                self.sock.send(data)
            except (BlockingIOError, ConnectionRefusedError):
                continue
            self.datagrams_out += 1
            self.bytes_out += len(data)

    def receive(self, wait):
        ready, _, _ = select.select([self.sock], [], [], max(0.0, wait))
        if not ready:
            return
        while True:
            try:
                data = self.sock.recv(65536)
            except (BlockingIOError, ConnectionRefusedError):
                return
            self.datagrams_in += 1
            self.quic.receive_datagram(data, self.addr, now=time.monotonic())

    def events(self):
        while (e := self.quic.next_event()) is not None:
            if isinstance(e, qe.HandshakeCompleted):
                self.handshake = e
            elif isinstance(e, qe.ConnectionTerminated):
                self.terminated = e
            elif isinstance(e, qe.StreamReset):
                self.resets[e.stream_id] = e.error_code
            elif isinstance(e, qe.StopSendingReceived):
                self.stops[e.stream_id] = e.error_code
            elif isinstance(e, qe.PingAcknowledged):
                self.pings_acked += 1
            elif isinstance(e, qe.StreamDataReceived):
                self.on_data(e.stream_id, e.data, e.end_stream)

    def on_data(self, sid, data, fin):
        ex = self.exchanges.get(sid)
        if ex is None:  # the server's control and QPACK streams, or a stream we gave up
            return
        ex.buf += data
        while ex.buf:
            if ex.data_left:  # DATA payload is taken as it comes, not once whole
                n = min(ex.data_left, len(ex.buf))
                ex.body += ex.buf[:n]
                del ex.buf[:n]
                ex.data_left -= n
                continue
            kind = read_varint(ex.buf, 0)
            length = kind and read_varint(ex.buf, kind[1])
            if not length:
                break
            if kind[0] == DATA:
                del ex.buf[: length[1]]
                ex.data_left = length[0]
                continue
            if length[1] + length[0] > len(ex.buf):
                break
            payload = bytes(ex.buf[length[1] : length[1] + length[0]])
            del ex.buf[: length[1] + length[0]]
            if kind[0] == HEADERS and ex.status is None:
                _, fields = self.decoder.feed_header(sid, payload)
                ex.status = int(dict(fields)[b":status"])
        if fin:
            ex.done = True

    def closed(self):
        return self.terminated is not None or self.quic.peer_close is not None

    def pump(self, until=None, timeout=None):
        """Runs the connection until `until()` holds, it ends, or `timeout` (default: the
        run's) passes. True if `until()` held."""
        deadline = time.monotonic() + (self.args.timeout if timeout is None else timeout)
        while True:
            self.flush()
            self.events()
            if until is not None and until():
                return True
            if self.closed() and until is not None:
                return False
            now = time.monotonic()
            if now >= deadline:
                return False
            wait = deadline - now
            timer = self.quic.get_timer()
            if timer is not None:
                wait = min(wait, timer - now)
            self.receive(wait)
            timer = self.quic.get_timer()
            if timer is not None and time.monotonic() >= timer:
                self.quic.handle_timer(now=time.monotonic())

    def connect(self):
        if not self.pump(lambda: self.handshake is not None):
            fail("no handshake", self)
        # Our control stream, as every HTTP/3 client opens it: its type and an empty SETTINGS.
        self.control = self.quic.get_next_available_stream_id(is_unidirectional=True)
        self.quic.send_stream_data(self.control, varint(CONTROL_STREAM) + frame(SETTINGS))
        self.flush()

    def open(self, payload, fin=False):
        """A new request stream carrying `payload`; its id."""
        sid = self.quic.get_next_available_stream_id()
        self.exchanges[sid] = Exchange()
        self.quic.send_stream_data(sid, payload, end_stream=fin)
        return sid

    def head(self, path=b"/hello.txt", method=b"GET", extra=()):
        return [
            (b":method", method),
            (b":scheme", b"https"),
            (b":authority", self.authority),
            (b":path", path),
            *extra,
        ]

    def get(self, path=b"/hello.txt", timeout=None):
        """A well-formed GET, waited for: its status, or None if no whole answer came."""
        sid = self.open(frame(HEADERS, section(self.head(path))), fin=True)
        self.pump(lambda: self.exchanges[sid].done or sid in self.resets, timeout)
        ex = self.exchanges[sid]
        return ex.status if ex.done else None

    def sent_all(self, sid):
        """Everything written on `sid` has been put in packets."""
        stream = self.quic._streams.get(sid)
        return stream is None or len(stream.sender._pending) == 0

    def acked_all(self, sid):
        stream = self.quic._streams.get(sid)
        return stream is None or stream.sender._buffer_start == stream.sender._buffer_stop

    def report(self, **extra):
        out = {
            "attack": self.args.attack,
            "handshake": self.handshake is not None,
            "close": self.quic.peer_close,
            # How the connection ended on the client's side, if it did (after a close from
            # the server, or of the client's own doing: an error, the idle timeout).
            "ended": self.terminated and {"code": self.terminated.error_code,
                                          "reason": self.terminated.reason_phrase},
            "resets": {str(k): v for k, v in sorted(self.resets.items())},
            "stops": {str(k): v for k, v in sorted(self.stops.items())},
            "answers": {str(k): e.status for k, e in sorted(self.exchanges.items()) if e.done},
            "datagrams_out": self.datagrams_out,
            "datagrams_in": self.datagrams_in,
        }
        out.update(extra)
        print(json.dumps(out))
        sys.stdout.flush()


def fail(message, peer=None):
    out = {"error": message}
    if peer is not None:
        out["close"] = peer.quic.peer_close
    print(json.dumps(out))
    sys.exit(2)


# --- protocol errors: each should end the connection with the code RFC 9114 names ----------


def second_control(p):
    """A second control stream (§6.2.1): H3_STREAM_CREATION_ERROR."""
    sid = p.quic.get_next_available_stream_id(is_unidirectional=True)
    p.quic.send_stream_data(sid, varint(CONTROL_STREAM) + frame(SETTINGS))
    p.pump(p.closed)
    p.report()


def data_before_headers(p):
    """DATA first on a request stream (§4.1): H3_FRAME_UNEXPECTED."""
    p.open(frame(DATA, b"early"))
    p.pump(p.closed)
    p.report()


def h2_frame(p):
    """A frame type reserved for HTTP/2's PRIORITY, PING, WINDOW_UPDATE or CONTINUATION
    (§7.2.8): H3_FRAME_UNEXPECTED wherever it comes."""
    f = frame(p.args.frame_type, bytes(8))
    if p.args.where == "control":
        p.quic.send_stream_data(p.control, f)
    else:
        p.open(frame(HEADERS, section(p.head())) + f)
    p.pump(p.closed)
    p.report()


def settings_twice(p):
    """A second SETTINGS on the control stream (§7.2.4): H3_FRAME_UNEXPECTED."""
    p.quic.send_stream_data(p.control, frame(SETTINGS))
    p.pump(p.closed)
    p.report()


def bad_qpack(p):
    """A field section naming the dynamic table, which the server said is 0 bytes
    (RFC 9204 §2.2.3): QPACK_DECOMPRESSION_FAILED."""
    p.open(frame(HEADERS, b"\x00\x00\x80"), fin=True)
    p.pump(p.closed)
    p.report()


def bad_pseudo(p):
    """Malformed requests (§4.3, §4.2): each stream reset with H3_MESSAGE_ERROR, and the
    connection goes on (a good GET after them is answered)."""
    cases = {
        "unknown pseudo-header": p.head(extra=[(b":foo", b"bar")]),
        "no :path": [f for f in p.head() if f[0] != b":path"],
        "upper-case name": p.head(extra=[(b"Accept", b"*/*")]),
        "connection-specific field": p.head(extra=[(b"connection", b"close")]),
        "pseudo-header after a field": p.head()[:3] + [(b"x", b"y"), (b":path", b"/")],
        ":status in a request": [(b":status", b"200")] + p.head(),
    }
    report_resets(p, cases)


def bad_path(p):
    """A :path neither origin-form nor `*` on OPTIONS (§4.3.1): each stream reset with
    H3_MESSAGE_ERROR rather than served as its path on the site :authority names, and the
    connection goes on."""
    cases = {
        "absolute-form": p.head(path=b"http://other.test/hello.txt"),
        "absolute-form naming :authority": p.head(
            path=b"https://" + p.authority + b"/hello.txt"
        ),
        "* on a GET": p.head(path=b"*"),
    }
    report_resets(p, cases)


def report_resets(p, cases):
    """Sends each request of `cases` (name: fields) whole, waits until all are reset (or the
    run's timeout), then a good GET; reports each case's reset code (null: not reset) and the
    GET's status."""
    streams = {}
    for name, fields in cases.items():
        streams[name] = p.open(frame(HEADERS, section(fields)), fin=True)
    p.pump(lambda: all(s in p.resets for s in streams.values()))
    good = p.get()
    p.report(
        cases={name: p.resets.get(sid) for name, sid in streams.items()},
        good_after=good,
    )


def malformed_loop(p):
    """Malformed requests (an unknown pseudo-header) one after another, each waited for: the
    server resets each with H3_MESSAGE_ERROR, and how many it takes before it closes the
    connection instead."""
    sent = 0
    for _ in range(p.args.count):
        sid = p.open(frame(HEADERS, section(p.head(extra=[(b":foo", b"bar")]))), fin=True)
        sent += 1
        p.pump(lambda: sid in p.resets)
        if p.closed():
            break
    p.pump(p.closed, timeout=2)
    p.report(malformed_sent=sent, reset_codes=sorted(set(p.resets.values())))


# --- floods within budgets ---------------------------------------------------------------


def streams(p):
    """--count GETs at once. Politely, aioquic holds back the streams past the server's
    MAX_STREAMS (it sends STREAMS_BLOCKED instead), and the answer is how many were ever in
    flight at once. With --over-limit the client ignores MAX_STREAMS and sends them all, each
    a request head without its end (so none is answered and none gives its stream back
    before the last arrive): the server must close with STREAM_LIMIT_ERROR (RFC 9000 §4.6).
    --uni does the same with unidirectional streams (of an unknown type)."""
    limit_bidi = p.quic._remote_max_streams_bidi
    limit_uni = p.quic._remote_max_streams_uni
    if p.args.over_limit:
        p.quic._remote_max_streams_bidi = p.quic._remote_max_streams_uni = 1 << 40
    if p.args.uni:
        for i in range(p.args.count):
            sid = p.quic.get_next_available_stream_id(is_unidirectional=True)
            p.quic.send_stream_data(sid, varint(0x21 + 0x1F * i))
        p.pump(p.closed)
        p.report(limit_bidi=limit_bidi, limit_uni=limit_uni)
        return
    fin = not p.args.over_limit
    sids = [p.open(frame(HEADERS, section(p.head())), fin=fin) for _ in range(p.args.count)]
    if p.args.over_limit:
        p.pump(p.closed)
        p.report(limit_bidi=limit_bidi, limit_uni=limit_uni)
        return
    peak = 0

    def all_done():
        nonlocal peak
        in_flight = 0
        for sid in sids:
            stream = p.quic._streams.get(sid)
            sent = stream is None or not stream.is_blocked
            if sent and not p.exchanges[sid].done and sid not in p.resets:
                in_flight += 1
        peak = max(peak, in_flight)
        return all(p.exchanges[s].done or s in p.resets for s in sids)

    p.pump(all_done)
    p.report(
        limit_bidi=limit_bidi,
        limit_uni=limit_uni,
        peak_in_flight=peak,
        ok=sum(1 for s in sids if p.exchanges[s].status == 200),
    )


def pings(p):
    """--count packets of PING frames (--per-packet in each), each sent once the one before
    it went out; then a GET on the same connection."""
    for i in range(p.args.count):
        p.quic.send_ping(i)
        if not p.pump(lambda: not p.quic._ping_pending, timeout=2):
            break
    p.pump(lambda: p.pings_acked >= p.args.count, timeout=5)
    status = None if p.closed() else p.get()
    p.report(pings_sent=p.args.count, pings_acked=p.pings_acked, status_after=status)


def tiny_frames(p):
    """A POST whose --count body bytes go one STREAM frame of one byte each, in a packet of
    its own; then its answer."""
    n = p.args.count
    fields = p.head(p.args.path.encode(), b"POST", [(b"content-length", str(n).encode())])
    sid = p.open(frame(HEADERS, section(fields)) + varint(DATA) + varint(n))
    p.pump(lambda: p.sent_all(sid))
    before = p.datagrams_out
    frames = 0
    for i in range(n):
        p.quic.send_stream_data(sid, b"x", end_stream=i == n - 1)
        if not p.pump(lambda: p.sent_all(sid), timeout=2):
            break
        frames += 1
    p.pump(lambda: p.exchanges[sid].done or sid in p.resets)
    ex = p.exchanges[sid]
    p.report(
        one_byte_frames=frames,
        datagrams_for_body=p.datagrams_out - before,
        status=ex.status,
        body=ex.body.decode("utf-8", "replace"),
    )


def sparse_frames(p):
    """--count request streams, each with a request head that promises a body of one stream
    window, then one-byte STREAM frames at every other offset of that window (the first byte
    never sent, so nothing of it can be read): the most pieces the server's QUIC could be
    made to hold for a stream. How many frames there were to send, and what the server did."""
    window = p.quic._remote_max_stream_data_bidi_remote
    frames = 0
    for _ in range(p.args.count):
        fields = p.head(b"/hello.txt", b"POST", [(b"content-length", str(window).encode())])
        sid = p.open(frame(HEADERS, section(fields)) + varint(DATA) + varint(window))
        p.pump(lambda: p.sent_all(sid))
        start = p.quic._streams[sid].sender.highest_offset
        # Most recent last: the lowest offsets go first.
        offsets = range(start + 1, window, 2)
        p.quic.raw_frames = [(0x0E, varint(sid) + varint(o) + varint(1) + b"x")
                             for o in reversed(offsets)]
        frames += len(offsets)
        while p.quic.raw_frames and not p.closed():
            p.quic.send_ping(0)
            p.pump(lambda: not p.quic._ping_pending, timeout=2)
    p.pump(p.closed, timeout=2)
    status = None if p.closed() else p.get(timeout=3)
    p.report(frames=frames, window=window, status_after=status)


def close_under_load(p):
    """Four GETs of --path (a large file), then a pause with nothing read or acknowledged,
    so the server's congestion window fills with their answers; then a second SETTINGS, a
    connection error (H3_FRAME_UNEXPECTED): whether its CONNECTION_CLOSE reaches the client."""
    for _ in range(4):
        p.open(frame(HEADERS, section(p.head(p.args.path.encode()))), fin=True)
    p.flush()
    time.sleep(0.3)
    p.quic.send_stream_data(p.control, frame(SETTINGS))
    p.flush()
    p.pump(p.closed)
    p.report()


def reset_loop(p):
    """Streams opened with a request head whose body never comes, each reset by the client
    (RESET_STREAM, H3_REQUEST_CANCELLED) once the server has acknowledged the head, over and
    over: how many resets until the server closes the connection."""
    sent = 0
    for _ in range(p.args.count):
        fields = p.head(b"/hello.txt", b"POST", [(b"content-length", b"10")])
        sid = p.open(frame(HEADERS, section(fields)))
        p.flush()
        # A PING in a second packet: after two ack-eliciting packets the server acknowledges
        # at once (RFC 9000 §13.2.2) rather than after its ACK delay.
        p.quic.send_ping(sid)
        # Closed: the server's answer to the last reset came while this head was on its way
        # (aioquic then forgets the stream, which `acked_all` would take for acknowledged).
        if not p.pump(lambda: p.acked_all(sid), timeout=2) or p.closed():
            break
        p.quic.reset_stream(sid, H3_REQUEST_CANCELLED)
        sent += 1
        p.pump(lambda: p.sent_all(sid), timeout=2)
        if p.closed():
            break
    p.pump(p.closed, timeout=2)
    status = None if p.closed() else p.get(timeout=3)
    p.report(resets_sent=sent, status_after=status,
             max_streams_bidi=p.quic._remote_max_streams_bidi)


def cancel_downloads(p):
    """--count rounds of: a GET of --path (a large file), cancelled by the client with
    STOP_SENDING (H3_REQUEST_CANCELLED) once its first bytes arrive, then a GET of
    /hello.txt answered whole (which earns back what the cancelled one spent of the reset
    budget). How many rounds complete, and the server's stream limit at the end."""
    rounds = 0
    last = None
    for _ in range(p.args.count):
        sid = p.open(frame(HEADERS, section(p.head(p.args.path.encode()))), fin=True)
        ex = p.exchanges[sid]
        if not p.pump(lambda: ex.body or ex.done or sid in p.resets, timeout=3) or ex.done:
            break
        p.quic.stop_stream(sid, H3_REQUEST_CANCELLED)
        last = p.get(timeout=3)
        if last != 200:
            break
        rounds += 1
    p.report(rounds=rounds, last_status=last,
             max_streams_bidi=p.quic._remote_max_streams_bidi)


def unknown_uni(p):
    """Unidirectional streams of reserved types (0x1f * N + 0x21, RFC 9114 §6.2.3), opened
    one after another as the server's MAX_STREAMS allows, none of them ended by the client:
    how many until the server closes the connection, and what it said about each
    (STOP_SENDING)."""
    limit = p.quic._remote_max_streams_uni
    opened = 0
    for i in range(p.args.count):
        nxt = p.quic._local_next_stream_id_uni
        if not p.pump(lambda: nxt // 4 < p.quic._remote_max_streams_uni, timeout=2):
            break
        sid = p.quic.get_next_available_stream_id(is_unidirectional=True)
        p.quic.send_stream_data(sid, varint(0x21 + 0x1F * i))
        opened += 1
        # One at a time: the server's verdict on this one before the next.
        p.pump(lambda: sid in p.stops, timeout=2)
        if p.closed():
            break
    p.pump(p.closed, timeout=2)
    p.report(limit_uni=limit, opened=opened, stop_codes=sorted(set(p.stops.values())))


def cid_churn(p):
    """--count times: switch to a fresh connection id of the server's (retiring the old),
    then a GET; with --migrate, then moves to a new UDP port (a NAT rebinding) and GETs
    again."""
    used = {p.quic._peer_cid.cid}
    statuses = []
    for _ in range(p.args.count):
        p.pump(lambda: bool(p.quic._peer_cid_available), timeout=2)
        p.quic.change_connection_id()
        used.add(p.quic._peer_cid.cid)
        statuses.append(p.get())
    migrated = None
    if p.args.migrate:
        old = p.sock
        p.sock = p.new_socket()
        old.close()
        migrated = p.get()
    p.report(cids_used=len(used), statuses=statuses, after_migration=migrated)


# --- Initials that never complete (what a spoofed source address would look like) ----------


def drain(sock, got):
    """Appends the datagrams waiting on `sock` to `got`."""
    while True:
        try:
            got.append(sock.recv(65536))
        except (BlockingIOError, ConnectionRefusedError):
            return


def listen(sock, seconds, got=None, enough=lambda got: False):
    """The datagrams that arrive on `sock` in `seconds` (after those in `got`), or until
    `enough(got)`."""
    got = [] if got is None else got
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0 and not enough(got):
        ready, _, _ = select.select([sock], [], [], left)
        if not ready:
            continue
        try:
            got.append(sock.recv(65536))
        except (BlockingIOError, ConnectionRefusedError):
            continue
    return got


def long_header(d):
    """(packet type, destination connection id) of a long-header packet, or None (RFC 9000
    §17.2: type 0 Initial, 3 Retry)."""
    if len(d) < 6 or not d[0] & 0x80:
        return None
    n = d[5]
    return (d[0] >> 4) & 3, bytes(d[6 : 6 + n])


def initial_no_reply(args):
    """One client Initial, then silence: the bytes the server sends back in --seconds to an
    address that never answers (RFC 9000 §8.1 allows three times what it got before the
    address is validated), as it would to the victim of a spoofed source address."""
    p = Peer(args)
    p.flush()
    got = listen(p.sock, args.seconds)
    print(json.dumps({"attack": args.attack, "datagrams_out": p.datagrams_out,
                      "bytes_out": p.bytes_out, "datagrams_in": len(got),
                      "bytes_in": sum(len(d) for d in got)}))


def initial_flood(args):
    """--count client Initials, each a connection of its own, all from one UDP socket, none
    ever continued; then listening until each has had an answer, for --seconds at most. How
    many connections the server answered with a Retry (no state kept) and how many with its
    handshake."""
    config = QuicConfiguration(is_client=True, alpn_protocols=["h3"])
    config.server_name = args.sni
    config.load_verify_locations(cafile=args.ca)
    addr = (args.host, args.port)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.connect(addr)
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    bytes_out = 0
    got = []
    for _ in range(args.count):
        c = QuicConnection(configuration=config)
        c.connect(addr, now=time.monotonic())
        for data, _ in c.datagrams_to_send(now=time.monotonic()):
            sock.send(data)
            bytes_out += len(data)
        # Read as we go: the answers to hundreds of Initials overflow a socket's buffer.
        drain(sock, got)

    kinds = {}
    seen = 0

    def answered(got):
        nonlocal seen
        for d in got[seen:]:
            h = long_header(d)
            if h is not None:
                kinds.setdefault(h[0], set()).add(h[1])
        seen = len(got)
        return len(kinds.get(0, ())) + len(kinds.get(3, ())) >= args.count

    listen(sock, args.seconds, got, answered)
    answered(got)
    print(json.dumps({"attack": args.attack, "initials": args.count, "bytes_out": bytes_out,
                      "datagrams_in": len(got), "bytes_in": sum(len(d) for d in got),
                      "retried": len(kinds.get(3, ())), "handshaking": len(kinds.get(0, ()))}))


def main():
    ap = argparse.ArgumentParser(description="hostile HTTP/3 peer for tern's tests (aioquic)")
    ap.add_argument("--ca", required=True, metavar="FILE", help="trust the CAs in this PEM file")
    ap.add_argument("--sni", default="localhost", metavar="NAME")
    ap.add_argument("--timeout", type=float, default=10.0, metavar="S",
                    help="bound on each wait for the server")
    ap.add_argument("--count", type=int, default=1, metavar="N")
    ap.add_argument("--where", choices=["control", "request"], default="control")
    ap.add_argument("--frame-type", type=lambda s: int(s, 0), default=0x06, metavar="T")
    ap.add_argument("--over-limit", action="store_true")
    ap.add_argument("--uni", action="store_true")
    ap.add_argument("--per-packet", type=int, default=1, metavar="K")
    ap.add_argument("--path", default="/hello.txt", metavar="P")
    ap.add_argument("--seconds", type=float, default=2.0, metavar="S")
    ap.add_argument("--migrate", action="store_true")
    ap.add_argument("attack")
    ap.add_argument("url")
    args = ap.parse_args()
    u = urlsplit(args.url)
    if u.scheme != "https" or not u.hostname or not u.port:
        ap.error(f"{args.url}: not https://HOST:PORT")
    args.host, args.port = u.hostname, u.port

    attacks = {
        "second-control": second_control,
        "data-before-headers": data_before_headers,
        "h2-frame": h2_frame,
        "settings-twice": settings_twice,
        "bad-qpack": bad_qpack,
        "bad-pseudo": bad_pseudo,
        "bad-path": bad_path,
        "malformed-loop": malformed_loop,
        "streams": streams,
        "pings": pings,
        "tiny-frames": tiny_frames,
        "reset-loop": reset_loop,
        "close-under-load": close_under_load,
        "sparse-frames": sparse_frames,
        "cancel-downloads": cancel_downloads,
        "unknown-uni": unknown_uni,
        "cid-churn": cid_churn,
    }
    if args.attack == "initial-no-reply":
        return initial_no_reply(args)
    if args.attack == "initial-flood":
        return initial_flood(args)
    if args.attack not in attacks:
        ap.error(f"unknown attack {args.attack}")
    p = Peer(args, pings_per_packet=args.per_packet)
    p.connect()
    attacks[args.attack](p)


if __name__ == "__main__":
    main()
