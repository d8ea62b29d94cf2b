#!/usr/bin/env python3
"""The idle-rss client: open N keep-alive connections to 127.0.0.1:PORT, send
one request on each, read the whole response, and keep them all open and
idle. Prints `READY {json}` once every connection is idle (or failed), then
waits for a line on stdin, closes everything and prints `DONE {json}`.

    idle_client.py PORT CONNECTIONS PATH [--tls SNI] [--h2]

With --tls every connection first makes a full TLS handshake (SNI as given,
certificate not verified: the bench's answer check does that; no session is
offered). With --h2 it speaks HTTP/2 (over TLS it offers only ALPN h2, and a
connection that does not get h2 fails; without --tls, h2c with prior
knowledge): the client preface, SETTINGS and a WINDOW_UPDATE, the request as
stream 1, the server's SETTINGS acknowledged, then idle once stream 1 has
ended (harness/h2wire.py). Connections are opened at most `INFLIGHT` at a time
(connecting, handshaking or waiting for the answer) so the listen backlog
never overflows. Raises its own RLIMIT_NOFILE to the hard limit; bounded in
time.
"""

import errno
import json
import resource
import selectors
import socket
import ssl
import sys
import time

sys.dont_write_bytecode = True  # keep the tree clean
import h2wire  # noqa: E402  (harness/h2wire.py, next to this script)

INFLIGHT = 200
DEADLINE_S = 60


def tls_client(argv, h2):
    """(context, server name) for --tls NAME, else (None, None)."""
    if "--tls" not in argv:
        return None, None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if h2:
        context.set_alpn_protocols(["h2"])
    return context, argv[argv.index("--tls") + 1]


def main():
    port, total, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    h2 = "--h2" in sys.argv[4:]
    tls, sni = tls_client(sys.argv[4:], h2)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if total + 64 > hard:
        total = hard - 64
    request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    scheme, authority = ("https", f"{sni}:{port}") if tls else ("http", f"127.0.0.1:{port}")

    sel = selectors.DefaultSelector()
    idle, failed, started, inflight = [], 0, 0, 0
    bufs = {}  # HTTP/1.1: what has come of the answer so far; HTTP/2: the h2wire.Exchange
    exchanges = {}  # HTTP/2: the idle connections' h2wire.Exchange
    handshaking = set()  # TLS sockets whose handshake is not done
    t0 = time.monotonic()

    def fail(sock):
        nonlocal failed, inflight
        sel.unregister(sock)
        sock.close()
        failed += 1
        inflight -= 1

    def handshake(s):
        """Advance a TLS handshake; True once it is done (the request is then sent)."""
        try:
            s.do_handshake()
        except ssl.SSLWantReadError:
            sel.modify(s, selectors.EVENT_READ)
            return False
        except ssl.SSLWantWriteError:
            sel.modify(s, selectors.EVENT_WRITE)
            return False
        handshaking.discard(s)
        return True

    while (started < total or inflight) and time.monotonic() - t0 < DEADLINE_S:
        while started < total and inflight < INFLIGHT:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            err = s.connect_ex(("127.0.0.1", port))
            started += 1
            inflight += 1
            if err not in (0, errno.EINPROGRESS):
                sel.register(s, selectors.EVENT_WRITE)
                fail(s)
                continue
            sel.register(s, selectors.EVENT_WRITE)
        for key, ev in sel.select(timeout=1.0):
            s = key.fileobj
            if s in handshaking or (ev & selectors.EVENT_WRITE and s not in bufs):
                try:
                    if s not in handshaking:  # connected (or not)
                        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                            fail(s)
                            continue
                        if tls:
                            sel.unregister(s)
                            s = tls.wrap_socket(s, server_hostname=sni, do_handshake_on_connect=False)
                            sel.register(s, selectors.EVENT_WRITE)
                            handshaking.add(s)
                    if s in handshaking and not handshake(s):
                        continue
                    if h2:
                        if tls and s.selected_alpn_protocol() != "h2":
                            raise OSError("no ALPN h2")
                        bufs[s] = h2wire.Exchange(scheme, authority, path)
                        s.sendall(bufs[s].start())  # ≈ 120 bytes: fits the fresh socket's buffer
                    else:
                        s.send(request)
                except OSError:  # ssl.SSLError included
                    handshaking.discard(s)
                    bufs.pop(s, None)
                    fail(s)
                    continue
                if not h2:
                    bufs[s] = b""
                sel.modify(s, selectors.EVENT_READ)
                continue
            try:
                data = s.recv(65536)
                while tls and s.pending():  # decrypted bytes the selector cannot see
                    data += s.recv(65536)
            except ssl.SSLWantReadError:  # a record not yet complete, or only tickets
                continue
            except OSError:
                data = b""
            if not data:
                bufs.pop(s, None)
                fail(s)
                continue
            if h2:
                ex = bufs[s]
                try:
                    reply = ex.feed(data)
                    if reply:
                        s.sendall(reply)  # SETTINGS (and PING) acknowledgements: a few bytes
                except (OSError, h2wire.H2Error):
                    bufs.pop(s, None)
                    fail(s)
                    continue
                if not ex.done:
                    continue
                del bufs[s]
                if ex.status != 200:
                    fail(s)
                    continue
                sel.unregister(s)
                idle.append(s)
                exchanges[s] = ex  # to tell at the end whether the server sent GOAWAY
                inflight -= 1
                continue
            buf = bufs[s] + data
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                bufs[s] = buf
                continue
            head = buf[:end].split(b"\r\n")
            if head[0].split(b" ")[1:2] != [b"200"]:
                bufs.pop(s, None)
                fail(s)
                continue
            length = 0
            for line in head[1:]:
                k, _, v = line.partition(b":")
                if k.strip().lower() == b"content-length":
                    length = int(v)
            if len(buf) - end - 4 < length:
                bufs[s] = buf
                continue
            del bufs[s]
            sel.unregister(s)
            idle.append(s)
            inflight -= 1

    elapsed = time.monotonic() - t0
    failed = total - len(idle)  # includes anything unfinished at the deadline
    print("READY " + json.dumps({"open": len(idle), "failed": failed, "seconds": round(elapsed, 2)}),
          flush=True)
    sys.stdin.readline()
    # the server must still be holding them: a closed one reads as EOF now (over HTTP/2,
    # one that got GOAWAY is being closed too)
    dropped = 0
    for s in idle:
        s.setblocking(False)
        try:
            if not h2:
                if s.recv(1) == b"":
                    dropped += 1
            else:
                while True:
                    data = s.recv(65536)
                    if not data:
                        dropped += 1
                        break
                    exchanges[s].feed(data)
                    if exchanges[s].goaway:
                        dropped += 1
                        break
        except (BlockingIOError, ssl.SSLWantReadError):
            pass
        except (OSError, h2wire.H2Error):
            dropped += 1
        s.close()
    print("DONE " + json.dumps({"dropped_by_server": dropped}), flush=True)


if __name__ == "__main__":
    main()
