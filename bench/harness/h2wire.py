"""Just enough HTTP/2 (RFC 9113) and HPACK (RFC 7541) for the bench's own
clients: the answer check of the HTTP/2 scenarios and the idle client of
h2-idle-rss make one GET on stream 1 of a new connection and read its answer.
No I/O here: `Exchange` turns the server's bytes into a response and says what
to send back (SETTINGS and PING acknowledgements). The load itself is h2load's.

The client preface is h2load's defaults (-w 30 -W 30): no push, stream and
connection windows of 2^30 - 1 bytes, so that a 1 MiB answer never waits for a
WINDOW_UPDATE. Requests are encoded without Huffman coding or indexing;
answers are decoded in full (static and dynamic table, Huffman).
"""

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_ENABLE_PUSH, SETTINGS_INITIAL_WINDOW_SIZE = 0x2, 0x4
SETTINGS_NAMES = {0x1: "header_table_size", 0x2: "enable_push", 0x3: "max_concurrent_streams",
                  0x4: "initial_window_size", 0x5: "max_frame_size", 0x6: "max_header_list_size",
                  0x8: "enable_connect_protocol"}
WINDOW = 2**30 - 1  # h2load's -w 30 and -W 30
DEFAULT_WINDOW = 65535
HEADER_TABLE_SIZE = 4096  # the decoder's table: the default, not changed in our SETTINGS
ERROR_CODES = ("NO_ERROR", "PROTOCOL_ERROR", "INTERNAL_ERROR", "FLOW_CONTROL_ERROR", "SETTINGS_TIMEOUT",
               "STREAM_CLOSED", "FRAME_SIZE_ERROR", "REFUSED_STREAM", "CANCEL", "COMPRESSION_ERROR",
               "CONNECT_ERROR", "ENHANCE_YOUR_CALM", "INADEQUATE_SECURITY", "HTTP_1_1_REQUIRED")


class H2Error(Exception):
    """The server broke the protocol, or ended the connection or the stream."""


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def client_preface():
    """Preface, SETTINGS (no push, stream window 2^30 - 1), connection WINDOW_UPDATE to 2^30 - 1."""
    settings = struct.pack(">HIHI", SETTINGS_ENABLE_PUSH, 0, SETTINGS_INITIAL_WINDOW_SIZE, WINDOW)
    return (PREFACE + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", WINDOW - DEFAULT_WINDOW)))


# RFC 7541 Appendix A
STATIC_TABLE = [
    (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"),
    (":path", "/index.html"), (":scheme", "http"), (":scheme", "https"), (":status", "200"),
    (":status", "204"), (":status", "206"), (":status", "304"), (":status", "400"),
    (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""),
    ("accept", ""), ("access-control-allow-origin", ""), ("age", ""), ("allow", ""),
    ("authorization", ""), ("cache-control", ""), ("content-disposition", ""),
    ("content-encoding", ""), ("content-language", ""), ("content-length", ""),
    ("content-location", ""), ("content-range", ""), ("content-type", ""), ("cookie", ""),
    ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
    ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
    ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""),
    ("max-forwards", ""), ("proxy-authenticate", ""), ("proxy-authorization", ""), ("range", ""),
    ("referer", ""), ("refresh", ""), ("retry-after", ""), ("server", ""), ("set-cookie", ""),
    ("strict-transport-security", ""), ("transfer-encoding", ""), ("user-agent", ""), ("vary", ""),
    ("via", ""), ("www-authenticate", ""),
]

# RFC 7541 Appendix B: the code lengths of symbols 0..255 and EOS (256). The code is
# canonical (codes assigned in order of length, then symbol), so the lengths define it.
HUFFMAN_LENGTHS = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5, 5,
    6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, 6,
    7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23,
    23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22, 21, 20, 22,
    22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22,
    23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19, 21, 26, 27,
    27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25,
    24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
]
EOS = 256


def _huffman_codes():
    """{(length, code): symbol}, built canonically from HUFFMAN_LENGTHS."""
    out, code, prev = {}, 0, None
    for sym in sorted(range(257), key=lambda s: (HUFFMAN_LENGTHS[s], s)):
        n = HUFFMAN_LENGTHS[sym]
        if prev is not None:
            code = (code + 1) << (n - prev)
        out[(n, code)] = sym
        prev = n
    return out


_HUFFMAN = _huffman_codes()


def huffman_decode(data):
    out, code, n = bytearray(), 0, 0
    for byte in data:
        for i in range(7, -1, -1):
            code, n = (code << 1) | ((byte >> i) & 1), n + 1
            sym = _HUFFMAN.get((n, code)) if n >= 5 else None
            if sym is not None:
                if sym == EOS:
                    raise H2Error("HPACK: EOS in a Huffman string")
                out.append(sym)
                code, n = 0, 0
            elif n > 30:
                raise H2Error("HPACK: bad Huffman code")
    if n > 7 or code != (1 << n) - 1:  # padding: fewer than 8 bits, all ones (EOS's prefix)
        raise H2Error("HPACK: bad Huffman padding")
    return bytes(out)


def _int(data, pos, prefix):
    """An HPACK integer with a `prefix`-bit prefix at data[pos]: (value, next pos)."""
    mask = (1 << prefix) - 1
    value = data[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos


def _string(data, pos):
    huffman = data[pos] & 0x80
    n, pos = _int(data, pos, 7)
    raw = bytes(data[pos:pos + n])
    if len(raw) != n:
        raise H2Error("HPACK: truncated string")
    return (huffman_decode(raw) if huffman else raw).decode("latin-1"), pos + n


def _encode_int(value, prefix, first=0):
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes((first | value,))
    out = bytearray((first | mask,))
    value -= mask
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _encode_string(s):
    b = s.encode("latin-1")
    return _encode_int(len(b), 7) + b


def encode_request(scheme, authority, path, headers=None):
    """A GET's header block: literals without indexing or Huffman, names from the
    static table where it has them."""
    out = bytearray(b"\x82" + (b"\x87" if scheme == "https" else b"\x86"))  # :method GET, :scheme
    out += _encode_int(4, 4) + _encode_string(path)  # :path
    out += _encode_int(1, 4) + _encode_string(authority)  # :authority
    for k, v in (headers or {}).items():
        out += b"\x00" + _encode_string(k.lower()) + _encode_string(v)
    return bytes(out)


class Decoder:
    """An HPACK decoder (one per connection: the dynamic table lives across blocks)."""

    def __init__(self):
        self.table, self.size, self.max_size = [], 0, HEADER_TABLE_SIZE

    def _evict(self):
        while self.size > self.max_size:
            name, value = self.table.pop()
            self.size -= len(name) + len(value) + 32

    def _entry(self, index):
        if 1 <= index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        if 0 <= index - len(STATIC_TABLE) - 1 < len(self.table):
            return self.table[index - len(STATIC_TABLE) - 1]
        raise H2Error(f"HPACK: no table entry {index}")

    def decode(self, block):
        """[(name, value)] of one complete header block."""
        out, pos = [], 0
        while pos < len(block):
            b = block[pos]
            if b & 0x80:  # indexed
                index, pos = _int(block, pos, 7)
                out.append(self._entry(index))
                continue
            if b & 0xE0 == 0x20:  # dynamic table size update
                self.max_size, pos = _int(block, pos, 5)
                if self.max_size > HEADER_TABLE_SIZE:
                    raise H2Error("HPACK: table size above the one we allowed")
                self._evict()
                continue
            indexing = b & 0xC0 == 0x40
            index, pos = _int(block, pos, 6 if indexing else 4)
            if index:
                name = self._entry(index)[0]
            else:
                name, pos = _string(block, pos)
            value, pos = _string(block, pos)
            out.append((name, value))
            if indexing:
                self.table.insert(0, (name, value))
                self.size += len(name) + len(value) + 32
                self._evict()
        return out


class Exchange:
    """One GET on stream 1 of a new connection. `start()`: the bytes to send first
    (preface, SETTINGS, WINDOW_UPDATE, the request's HEADERS). `feed(data)`: the
    server's bytes; returns what to send back (acknowledgements of its SETTINGS and
    PINGs). Then `done`, `status`, `headers` ({lower-case name: value}), `body`,
    `head_bytes` (the answer's header block, HPACK-compressed), `settings` (the
    server's first SETTINGS), `frames` (counts by type) and `goaway` (set once the
    server sent one: it is closing the connection)."""

    def __init__(self, scheme, authority, path, headers=None):
        self.request = encode_request(scheme, authority, path, headers)
        self.decoder = Decoder()
        self.buf = b""
        self.block, self.block_end_stream = None, False  # a header block awaiting CONTINUATION
        self.done, self.status, self.headers, self.body, self.head_bytes = False, None, {}, bytearray(), 0
        self.got_settings = False
        self.settings = {}  # the server's first SETTINGS, by name (what it did not send: default)
        self.goaway = None  # (error code name, last stream) once the server sent GOAWAY
        self.frames = {}

    def start(self):
        return client_preface() + frame(HEADERS, END_HEADERS | END_STREAM, 1, self.request)

    def feed(self, data):
        self.buf += data
        out = bytearray()
        while len(self.buf) >= 9:
            n = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + n:
                break
            kind, flags = self.buf[3], self.buf[4]
            stream = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            payload, self.buf = self.buf[9:9 + n], self.buf[9 + n:]
            self.frames[kind] = self.frames.get(kind, 0) + 1
            out += self._frame(kind, flags, stream, payload)
        return bytes(out)

    def _frame(self, kind, flags, stream, payload):
        if not self.got_settings and (kind != SETTINGS or flags & ACK):
            raise H2Error(f"the server's first frame is of type {kind}, not SETTINGS")
        if self.block is not None and kind != CONTINUATION:
            raise H2Error("a header block interrupted by another frame")
        if kind == SETTINGS:
            if flags & ACK:
                return b""
            if not self.got_settings:
                for i in range(0, len(payload) - 5, 6):
                    key, value = struct.unpack(">HI", payload[i:i + 6])
                    self.settings[SETTINGS_NAMES.get(key, f"{key:#x}")] = value
            self.got_settings = True
            return frame(SETTINGS, ACK, 0)
        if kind == PING:
            return b"" if flags & ACK else frame(PING, ACK, 0, payload)
        if kind == GOAWAY:
            last, code = struct.unpack(">II", payload[:8])
            self.goaway = (_code(code), last & 0x7FFFFFFF)
            if code == 0 and (self.done or last & 0x7FFFFFFF >= 1):  # stream 1 still gets its answer
                return b""
            raise H2Error(f"GOAWAY {_code(code)} (last stream {last & 0x7FFFFFFF}) {payload[8:200]!r}")
        if kind == RST_STREAM and stream == 1:
            raise H2Error(f"RST_STREAM {_code(struct.unpack('>I', payload[:4])[0])} on stream 1")
        if stream != 1:  # WINDOW_UPDATE, PRIORITY, …
            return b""
        if kind in (HEADERS, DATA) and flags & PADDED:
            pad = payload[0]
            payload = payload[1:len(payload) - pad]
        if kind == HEADERS:
            if flags & PRIORITY_FLAG:
                payload = payload[5:]
            self.block, self.block_end_stream = bytearray(payload), bool(flags & END_STREAM)
            if flags & END_HEADERS:
                self._headers()
        elif kind == CONTINUATION:
            if self.block is None:
                raise H2Error("CONTINUATION without HEADERS")
            self.block += payload
            if flags & END_HEADERS:
                self._headers()
        elif kind == DATA:
            if self.status is None:
                raise H2Error("DATA before HEADERS on stream 1")
            self.body += payload
            if flags & END_STREAM:
                self.done = True
        elif kind == PUSH_PROMISE:
            raise H2Error("PUSH_PROMISE though push is disabled")
        return b""

    def _headers(self):
        block, end_stream = bytes(self.block), self.block_end_stream
        self.block = None
        fields = self.decoder.decode(block)
        if self.status is None or self.status < 200:  # the answer's head (or an interim 1xx)
            self.head_bytes += len(block)
            status = dict(fields).get(":status")
            if status is None or not status.isdigit():
                raise H2Error(f"a response without :status: {fields}")
            self.status = int(status)
            self.headers = {}
            for name, value in fields:
                if not name.startswith(":"):
                    self.headers[name] = f"{self.headers[name]}, {value}" if name in self.headers else value
        if end_stream and self.status >= 200:  # (trailers, or an answer without a body)
            self.done = True


def _code(code):
    return ERROR_CODES[code] if code < len(ERROR_CODES) else f"error {code:#x}"
