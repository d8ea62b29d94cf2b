"""Just enough HTTP/2 (RFC 9113) and HPACK (RFC 7541) for the stress scripts: frames built by
hand, a frame splitter, request header blocks made only of literals without indexing (no
Huffman coding, no table), an HPACK decoder for the server's answers (static and dynamic
table, Huffman), and `H2Client`, a blocking one-connection client for the normal client's
GETs (plain h2c with prior knowledge, or a TLS socket that negotiated ALPN h2).

The HPACK tables and decoder are bench/harness/h2wire.py's, loaded by path (one copy in the
repository). Python 3.11 standard library only.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE = 0x2, 0x4
WINDOW = 2**30 - 1
DEFAULT_WINDOW = 65535
HEADER_TABLE_SIZE = 4096  # the decoder's table: the default, not changed in our SETTINGS
MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE's default: the largest frame we may send
ERROR_CODES = ("NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR",
               "SETTINGS_TIMEOUT", "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM",
               "CANCEL", "COMPRESSION_ERROR", "CONNECT_ERROR", "ENHANCE_YOUR_CALM",
               "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED")
CANCEL, ENHANCE_YOUR_CALM = 0x8, 0xB


def code_name(code: int) -> str:
    return ERROR_CODES[code] if 0 <= code < len(ERROR_CODES) else f"error {code:#x}"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (struct.pack(">I", len(payload))[1:] + bytes((kind, flags))
            + struct.pack(">I", stream) + payload)


def client_preface(windows: bool = True) -> bytes:
    """Preface and SETTINGS (no push); with `windows`, stream windows of 2^30 - 1 and a
    connection WINDOW_UPDATE to 2^30 - 1, so that answers never wait for our WINDOW_UPDATE."""
    if not windows:
        return PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HI", SETTINGS_ENABLE_PUSH, 0))
    settings = struct.pack(">HIHI", SETTINGS_ENABLE_PUSH, 0, SETTINGS_INITIAL_WINDOW_SIZE, WINDOW)
    return (PREFACE + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", WINDOW - DEFAULT_WINDOW)))


def rst_stream(stream: int, code: int = CANCEL) -> bytes:
    return frame(RST_STREAM, 0, stream, struct.pack(">I", code))


def split_frames(buf: bytearray):
    """Takes every complete frame off the front of `buf`: yields (kind, flags, stream,
    payload)."""
    pos = 0
    while len(buf) - pos >= 9:
        n = int.from_bytes(buf[pos:pos + 3], "big")
        if len(buf) - pos < 9 + n:
            break
        kind, flags = buf[pos + 3], buf[pos + 4]
        stream = int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF
        payload = bytes(buf[pos + 9:pos + 9 + n])
        pos += 9 + n
        yield kind, flags, stream, payload
    del buf[:pos]


def encode_string(s: str | bytes) -> bytes:
    b = s.encode("latin-1") if isinstance(s, str) else s
    return encode_int(len(b), 7) + b


def literal(name: str, value: str | bytes) -> bytes:
    """One field as a literal without indexing, new name, no Huffman (RFC 7541 §6.2.2)."""
    return b"\x00" + encode_string(name) + encode_string(value)


def encode_request(scheme: str, authority: str, path: str, method: str = "GET",
                   headers: dict | None = None) -> bytes:
    """A request's header block, every field a literal without indexing."""
    out = bytearray()
    for name, value in ((":method", method), (":scheme", scheme), (":path", path),
                        (":authority", authority), *(headers or {}).items()):
        out += literal(name.lower(), value)
    return bytes(out)


# The HPACK tables, Huffman code and decoder are the bench's (bench/harness/h2wire.py), loaded
# by path so the repository keeps one copy of them (and so H2Error is one class in both).
def _load_bench_h2wire():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "bench", "harness", "h2wire.py")
    spec = importlib.util.spec_from_file_location("bench_h2wire", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_bench = _load_bench_h2wire()
H2Error, Decoder, encode_int = _bench.H2Error, _bench.Decoder, _bench._encode_int


class H2Client:
    """One HTTP/2 connection used like a keep-alive HTTP/1.1 one: `get(path)` sends a GET on
    the next stream and blocks until its answer ended, acknowledging the server's SETTINGS
    and PINGs on the way. Raises H2Error (GOAWAY, RST_STREAM, a broken answer), or OSError /
    socket.timeout; the connection is unusable afterwards."""

    def __init__(self, sock: socket.socket, scheme: str = "http", authority: str = "localhost"):
        self.sock, self.scheme, self.authority = sock, scheme, authority
        self.decoder = Decoder()
        self.buf = bytearray()
        self.next_stream = 1
        self.goaway: tuple[str, int] | None = None
        sock.sendall(client_preface())

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def _recv(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise H2Error("EOF" + (f" after GOAWAY {self.goaway[0]}" if self.goaway else ""))
        self.buf += data

    def get(self, path: str) -> tuple[int, bytes]:
        """(status, body) of one GET."""
        sid = self.next_stream
        self.next_stream += 2
        block = encode_request(self.scheme, self.authority, path)
        self.sock.sendall(frame(HEADERS, END_HEADERS | END_STREAM, sid, block))
        status, body, header_block, done = None, bytearray(), None, False
        while not done:
            self._recv()
            reply = bytearray()
            for kind, flags, stream, payload in split_frames(self.buf):
                if header_block is not None and kind != CONTINUATION:
                    raise H2Error("a header block interrupted by another frame")
                if kind == SETTINGS:
                    if not flags & ACK:
                        reply += frame(SETTINGS, ACK, 0)
                elif kind == PING:
                    if not flags & ACK:
                        reply += frame(PING, ACK, 0, payload)
                elif kind == GOAWAY:
                    last, code = struct.unpack(">II", payload[:8])
                    self.goaway = (code_name(code), last & 0x7FFFFFFF)
                    if code != 0 or (last & 0x7FFFFFFF) < sid:
                        raise H2Error(f"GOAWAY {code_name(code)} (last stream {last & 0x7FFFFFFF})")
                elif stream != sid:
                    continue  # WINDOW_UPDATE, leftovers of nothing we asked for
                elif kind == RST_STREAM:
                    raise H2Error(f"RST_STREAM {code_name(struct.unpack('>I', payload[:4])[0])}")
                elif kind in (HEADERS, CONTINUATION):
                    if kind == HEADERS:
                        if flags & PADDED:
                            payload = payload[1:len(payload) - payload[0]]
                        if flags & PRIORITY_FLAG:
                            payload = payload[5:]
                        header_block, end_stream = bytearray(payload), bool(flags & END_STREAM)
                    else:
                        if header_block is None:
                            raise H2Error("CONTINUATION without HEADERS")
                        header_block += payload
                    if flags & END_HEADERS:
                        fields = self.decoder.decode(bytes(header_block))
                        header_block = None
                        if status is None or status < 200:
                            value = dict(fields).get(":status", "")
                            if not value.isdigit():
                                raise H2Error(f"an answer without :status: {fields}")
                            status = int(value)
                        if end_stream and status >= 200:
                            done = True
                elif kind == DATA:
                    if status is None:
                        raise H2Error("DATA before HEADERS")
                    if flags & PADDED:
                        payload = payload[1:len(payload) - payload[0]]
                    body += payload
                    if flags & END_STREAM:
                        done = True
            if reply:
                self.sock.sendall(reply)
        return status, bytes(body)
