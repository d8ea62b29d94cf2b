"""Hostile and unusual TLS handshakes against tern, sent by a third-party TLS library
(tlslite-ng), each checked for the exact answer and that it comes within a second (issue 39).

Run through scripts/tls-hostile, which installs tlslite-ng and starts no server itself: this
script starts `tern serve DIR --listen-tls 127.0.0.1:0 --tls-self-signed --workers 1` from
$TERN_BIN (with `--io $TERN_IO` if that is set) and reads its port from the start-up line.

Cases: ClientHellos of 4 KB to 64 KiB - 1 in records of 7 bytes to 16 KiB (answered with a
ServerHello), whole handshakes with every message cut into small records, a ClientHello over
64 KiB (decode_error, no reset), a record interleaved in a ClientHello (unexpected_message);
after a TLS 1.3 handshake a KeyUpdate split across records (taken: the session goes on), one
asking for request_update 2 (illegal_parameter) and a truncated one (decode_error); after a
TLS 1.2 handshake a renegotiating ClientHello (a warning no_renegotiation, the session goes on).
"""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

from tlslite import HandshakeSettings, TLSConnection
from tlslite.constants import (
    AlertDescription,
    AlertLevel,
    CipherSuite,
    ContentType,
    ECPointFormat,
    GroupName,
    HandshakeType,
    HashAlgorithm,
    KeyUpdateMessageType,
    SignatureAlgorithm,
)
from tlslite.extensions import (
    ECPointFormatsExtension,
    PaddingExtension,
    SignatureAlgorithmsExtension,
    SupportedGroupsExtension,
)
from tlslite.messages import ClientHello, Message, RecordHeader3
from tlslite.utils.codec import Parser

LIMIT = 1.0  # seconds within which every answer must come
MAX_HANDSHAKE_MESSAGE = 0xFFFF  # rustls's limit on a handshake message's body


def start_tern(site):
    binary = os.environ.get("TERN_BIN") or os.path.join(
        os.path.dirname(__file__), "..", "target", "release", "tern"
    )
    args = [binary, "serve", site, "--listen-tls", "127.0.0.1:0", "--tls-self-signed", "--workers", "1"]
    if os.environ.get("TERN_IO"):
        args += ["--io", os.environ["TERN_IO"]]  # epoll or uring, as the integration suites
    print("# starting:", " ".join(args))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        found = re.search(r"https://127\.0\.0\.1:(\d+)", line)
        if found:
            return proc, int(found.group(1))
    sys.exit("tls-hostile: tern exited before it listened")


def client_hello(padding):
    """A TLS 1.2 ClientHello (ECDHE, the suites tern's self-signed ECDSA certificate allows),
    made by tlslite-ng, with a padding extension of `padding` bytes: its handshake message."""
    extensions = [
        SupportedGroupsExtension().create([GroupName.x25519, GroupName.secp256r1]),
        ECPointFormatsExtension().create([ECPointFormat.uncompressed]),
        SignatureAlgorithmsExtension().create(
            [(HashAlgorithm.sha256, SignatureAlgorithm.ecdsa), (HashAlgorithm.sha384, SignatureAlgorithm.ecdsa)]
        ),
        PaddingExtension().create(padding),
    ]
    hello = ClientHello().create(
        (3, 3),
        bytearray(os.urandom(32)),
        bytearray(0),
        [
            CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            CipherSuite.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        ],
        extensions=extensions,
    )
    return bytes(hello.write())


def records(content_type, payload, size):
    """`payload` cut into records of at most `size` bytes."""
    out = bytearray()
    for at in range(0, len(payload), size):
        piece = payload[at : at + size]
        out += bytes([content_type, 3, 1]) + len(piece).to_bytes(2, "big") + piece
    return bytes(out)


def read_exactly(sock, n, deadline):
    got = bytearray()
    while len(got) < n:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise AssertionError("the server closed after {0!r}".format(bytes(got)))
        got += chunk
    return bytes(got)


def first_record(sock, start):
    """The server's first record as (content type, payload), parsed by tlslite, and when it came."""
    deadline = start + LIMIT
    try:
        header = RecordHeader3().parse(Parser(bytearray(read_exactly(sock, 5, deadline))))
        payload = read_exactly(sock, header.length, deadline)
    except socket.timeout:
        raise AssertionError("no answer within {0} s".format(LIMIT))
    return header.type, payload, time.monotonic() - start


def expect_server_hello(port, wire):
    sock = socket.create_connection(("127.0.0.1", port))
    start = time.monotonic()
    sock.sendall(wire)
    content_type, payload, took = first_record(sock, start)
    sock.close()
    assert content_type == ContentType.handshake and payload[0] == HandshakeType.server_hello, (
        "expected a ServerHello, got type {0} {1!r}".format(content_type, payload[:8])
    )
    return "ServerHello in {0:.3f} s".format(took)


def expect_fatal_alert(port, wire, description):
    sock = socket.create_connection(("127.0.0.1", port))
    start = time.monotonic()
    sock.sendall(wire)
    content_type, payload, took = first_record(sock, start)
    assert (content_type, list(payload)) == (ContentType.alert, [AlertLevel.fatal, description]), (
        "expected a fatal {0}, got type {1} {2!r}".format(AlertDescription.toStr(description), content_type, payload)
    )
    # Then the server closes (after a moment of reading what it will not use).
    sock.shutdown(socket.SHUT_WR)
    sock.settimeout(5)
    assert sock.recv(100) == b"", "nothing after the alert"
    sock.close()
    return "fatal {0} in {1:.3f} s".format(AlertDescription.toStr(description), took)


def connect(port, version, record_size=None):
    """A tlslite-ng client session, TLS 1.3 or 1.2 (`version`: (3, 4) or (3, 3))."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(5)
    conn = TLSConnection(sock)
    if record_size:
        conn.recordSize = record_size
    settings = HandshakeSettings()
    settings.minVersion = settings.maxVersion = version
    settings.keyShares = ["x25519"]
    conn.handshakeClientCert(settings=settings, serverName="localhost")
    return conn


def get(conn):
    conn.write(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    answer = bytearray()
    while not answer.startswith(b"HTTP/1.1") or b"\r\n\r\n" not in answer:
        chunk = conn.read(max=4096)
        if not chunk:
            break
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), "expected a 200, got {0!r}".format(bytes(answer[:40]))


def send_records(conn, content_type, pieces):
    """Each of `pieces` as its own record, sealed under the session's current keys."""
    for piece in pieces:
        for _ in conn._sendMsgThroughSocket(Message(content_type, bytearray(piece))):
            pass


def next_record(conn, start):
    """The next record the server sends, decrypted, past its session tickets: (content type,
    payload, seconds)."""
    while True:
        conn.sock.settimeout(max(start + LIMIT - time.monotonic(), 0.001))
        result = None
        try:
            for result in conn._recordLayer.recvRecord():
                if result not in (0, 1):
                    break
        except socket.timeout:
            raise AssertionError("nothing within {0} s".format(LIMIT))
        header, parser = result
        payload = bytes(parser.bytes)
        if header.type == ContentType.handshake and payload[0] == HandshakeType.new_session_ticket:
            continue
        return header.type, payload, time.monotonic() - start


def key_update_split(port):
    conn = connect(port, (3, 4))
    start = time.monotonic()
    # KeyUpdate(update_requested) in two records (RFC 8446 §5.1 lets it span them).
    send_records(conn, ContentType.handshake, [b"\x18\x00", b"\x00\x01\x01"])
    # Our own key changes after it, as tlslite does for a KeyUpdate it sends.
    conn.session.cl_app_secret, conn.session.sr_app_secret = conn._recordLayer.calcTLS1_3KeyUpdate_reciever(
        conn.session.cipherSuite, conn.session.cl_app_secret, conn.session.sr_app_secret
    )
    # The server answers with its own KeyUpdate (read and applied by tlslite), then a 200.
    get(conn)
    took = time.monotonic() - start
    conn.close()
    return "taken; the server updated its key and answered in {0:.3f} s".format(took)


def bad_key_update(port, pieces, description):
    conn = connect(port, (3, 4))
    start = time.monotonic()
    send_records(conn, ContentType.handshake, pieces)
    content_type, payload, took = next_record(conn, start)
    assert (content_type, list(payload)) == (ContentType.alert, [AlertLevel.fatal, description]), (
        "expected a fatal {0}, got type {1} {2!r}".format(AlertDescription.toStr(description), content_type, payload)
    )
    conn.sock.close()
    return "fatal {0} in {1:.3f} s".format(AlertDescription.toStr(description), took)


def renegotiation(port):
    conn = connect(port, (3, 3))
    start = time.monotonic()
    hello = client_hello(0)
    send_records(conn, ContentType.handshake, [hello[:40], hello[40:]])
    content_type, payload, took = next_record(conn, start)
    expected = [AlertLevel.warning, AlertDescription.no_renegotiation]
    assert (content_type, list(payload)) == (ContentType.alert, expected), (
        "expected a warning no_renegotiation, got type {0} {1!r}".format(content_type, payload)
    )
    get(conn)
    conn.close()
    return "warning no_renegotiation in {0:.3f} s; the session goes on (200)".format(took)


def full_handshake(port, version, record_size):
    start = time.monotonic()
    conn = connect(port, version, record_size)
    get(conn)
    conn.close()
    return "completed and served in {0:.3f} s".format(time.monotonic() - start)


def main():
    site = tempfile.mkdtemp(prefix="tern-tls-hostile.")
    with open(os.path.join(site, "index.html"), "w") as f:
        f.write("<!doctype html><title>tls-hostile</title>\n")
    proc, port = start_tern(site)
    base = len(client_hello(0)) - 4  # the message's body without padding
    over = MAX_HANDSHAKE_MESSAGE - base + 1  # padding making it one byte too long
    cases = [
        ("ClientHello of 4 KB in 7-byte records", lambda: expect_server_hello(port, records(22, client_hello(4000), 7))),
        ("ClientHello of 5 KB in 100-byte records", lambda: expect_server_hello(port, records(22, client_hello(5000), 100))),
        ("ClientHello of 20 KB in full records", lambda: expect_server_hello(port, records(22, client_hello(20000), 16384))),
        ("ClientHello of 20 KB in 1000-byte records", lambda: expect_server_hello(port, records(22, client_hello(20000), 1000))),
        (
            "ClientHello of 64 KiB - 1 in full records",
            lambda: expect_server_hello(port, records(22, client_hello(over - 1), 16384)),
        ),
        (
            "ClientHello of 64 KiB - 1 in 512-byte records",
            lambda: expect_server_hello(port, records(22, client_hello(over - 1), 512)),
        ),
        (
            "ClientHello of 64 KiB in full records (over rustls's limit)",
            lambda: expect_fatal_alert(port, records(22, client_hello(over), 16384), AlertDescription.decode_error),
        ),
        (
            "ClientHello of 64 KiB in 1000-byte records",
            lambda: expect_fatal_alert(port, records(22, client_hello(over), 1000), AlertDescription.decode_error),
        ),
        (
            "half a ClientHello, then a ChangeCipherSpec record",
            lambda: expect_fatal_alert(
                port,
                records(22, client_hello(100)[:60], 16384) + records(20, b"\x01", 1),
                AlertDescription.unexpected_message,
            ),
        ),
        ("TLS 1.3 handshake, every message in 7-byte records", lambda: full_handshake(port, (3, 4), 7)),
        ("TLS 1.2 handshake, every message in 7-byte records", lambda: full_handshake(port, (3, 3), 7)),
        ("TLS 1.3 KeyUpdate split across two records", lambda: key_update_split(port)),
        (
            "TLS 1.3 KeyUpdate with request_update 2",
            lambda: bad_key_update(port, [b"\x18\x00\x00\x01\x02"], AlertDescription.illegal_parameter),
        ),
        (
            "TLS 1.3 KeyUpdate truncated (no request_update)",
            lambda: bad_key_update(port, [b"\x18\x00\x00\x00"], AlertDescription.decode_error),
        ),
        ("TLS 1.2 renegotiation (a ClientHello in two records)", lambda: renegotiation(port)),
    ]
    if sys.argv[1:]:
        # Only the cases whose names contain one of the arguments.
        cases = [(name, case) for name, case in cases if any(word in name for word in sys.argv[1:])]
    failed = 0
    try:
        for name, case in cases:
            try:
                print("ok    {0}: {1}".format(name, case()))
            except Exception as e:  # every case runs; the failures are counted
                failed += 1
                print("FAIL  {0}: {1}: {2}".format(name, type(e).__name__, e))
            if proc.poll() is not None:
                print("FAIL  tern exited ({0}) during {1}".format(proc.returncode, name))
                failed += 1
                break
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(site)
    print("tls-hostile: {0} of {1} cases passed".format(len(cases) - failed, len(cases)))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
