#!/usr/bin/env python3
"""SIGKILL under load, again and again: no acknowledged claim of the IPv4 Games is ever lost.

Each round starts `tern demo` on the same data folder, claims from several keep-alive clients
(every claim a fresh address, via X-Forwarded-For, with its own name), and SIGKILLs the
process at a random moment. Journal segments are made tiny (64 KiB) so that segment rotation
and compaction into snapshots run all the time, racing with the claims and with the kill.
After the last round, `tern demo export` writes what the data folder holds to SQLite, and every
claim any round saw answered 200 must be there under its name.

Two passes:
  --sync normal: the kill is all that happens (the journal's page cache survives it).
  --sync full:   after each kill the power is "cut" too: the journal is truncated to what the
                 server last reported synced (the hidden --test-sync-mark hook), and journal
                 segments after that are removed, as a power cut would lose what was written
                 but not synced. Nothing answered under full may be lost even so.

Counted per pass: rounds, claims answered, torn tails cut at start-up, snapshots written.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import common
from common import NoResponse, Report, Truncated

CLIENTS = 6
SEGMENT_BYTES = 64 << 10


def claim_request(ip: str, name: str) -> bytes:
    return (
        f"GET /claim/{name} HTTP/1.1\r\nHost: stress\r\nX-Forwarded-For: {ip}\r\n"
        "Accept: text/plain\r\n\r\n"
    ).encode()


def client(addr, rnd: int, cid: int, stop: threading.Event, acked: list, errors: list):
    """Claims until told to stop or the server dies; records what was answered 200."""
    i = 0
    sock = None
    while not stop.is_set():
        try:
            if sock is None:
                sock = socket.create_connection(addr, timeout=5)
            # A fresh address per claim: round, client and counter spread over the octets.
            ip = f"{10 + rnd}.{cid * 32 + (i >> 16)}.{(i >> 8) & 255}.{i & 255}"
            name = f"r{rnd}c{cid}n{i}"
            sock.sendall(claim_request(ip, name))
            status, body, _ = common.read_response(sock)
        except (NoResponse, Truncated, OSError):
            return  # the kill (or, before it, a failure the checks below will show)
        if status == 200:
            want = f"{ip} is now claimed by {name}\n".encode()
            if body != want:
                errors.append(f"claim {name}: answer {body!r}")
                return
            acked.append((ip, name))
        else:
            errors.append(f"claim {name}: status {status} {body[:80]!r}")
            return
        i += 1


def cut_power(data: Path, rng: random.Random, report_lines: list) -> None:
    """What a power cut may do to what was written but not synced: any part of it may be
    gone. Keeps the journal up to the last synced length plus a random part of the unsynced
    tail (which may end inside a frame: a torn write), and removes later segments."""
    mark = data / "synced-mark"
    if not mark.exists():
        return
    segment, length = (int(x) for x in mark.read_text().split())
    for f in data.glob("journal-*.log"):
        n = int(f.name[len("journal-"):-len(".log")])
        size = f.stat().st_size
        if n > segment:
            f.unlink()
        elif n == segment and size > length:
            keep = length if rng.random() < 0.5 else rng.randint(length, size)
            os.truncate(f, keep)
            report_lines.append(keep)


def export(data: Path) -> dict[str, str]:
    out = Path(tempfile.mkdtemp(prefix="tern-stress-export-")) / "claims.sqlite"
    subprocess.run(
        [common.tern_binary(), "demo", "export", "--data", str(data), str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    db = sqlite3.connect(out)
    rows = {}
    for ip, nick in db.execute("SELECT ip, nick FROM land"):
        rows[socket.inet_ntoa(int(ip).to_bytes(4, "big"))] = nick
    db.close()
    return rows


def run_pass(sync: str, rounds: int, report: Report) -> None:
    data = Path(tempfile.mkdtemp(prefix=f"tern-stress-claims-{sync}-"))
    args = [
        "--trusted-proxies", "127.0.0.1",
        "--rate-exempt", "0.0.0.0/0",
        "--test-segment-bytes", str(SEGMENT_BYTES),
        "--sync", sync,
    ]
    if sync == "full":
        args += ["--test-sync-mark", str(data / "synced-mark")]
    acked: list[tuple[str, str]] = []
    errors: list[str] = []
    torn = cuts = 0
    snapshots: set[str] = set()
    rng = random.Random(20261126)
    for rnd in range(rounds):
        tern = common.Tern(args=args, demo=True, data=str(data), log_level="info")
        torn += len(tern.log_matching("cut a torn write"))
        stop = threading.Event()
        threads = [
            threading.Thread(target=client, args=(tern.addr, rnd, c, stop, acked, errors))
            for c in range(CLIENTS)
        ]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.3, 1.2))
        tern.kill()  # SIGKILL
        stop.set()
        for t in threads:
            t.join()
        snapshots.update(p.name for p in data.glob("snapshot-*.snap"))
        if sync == "full":
            lines: list = []
            cut_power(data, rng, lines)
            cuts += len(lines)
        snapshots.update(p.name for p in data.glob("snapshot-*.snap"))
    # One more start to recover what the last round left (torn tails are cut here too).
    tern = common.Tern(args=args, demo=True, data=str(data))
    torn += len(tern.log_matching("cut a torn write"))
    tern.terminate()
    held = export(data)
    lost = [(ip, name, held.get(ip)) for ip, name in acked if held.get(ip) != name]
    report.add(f"{sync}: rounds", rounds)
    report.add(f"{sync}: claims answered 200", len(acked))
    report.add(f"{sync}: claims in the data folder", len(held))
    report.add(f"{sync}: torn tails cut at start-up", torn)
    if sync == "full":
        report.add(f"{sync}: power cuts that dropped unsynced bytes", cuts)
    report.add(f"{sync}: snapshots written by compaction", len(snapshots))
    report.goal(len(snapshots) > 0, f"{sync}: compaction ran during the rounds")
    report.goal(not errors, f"{sync}: every answer before the kill was right ({errors[:3]})")
    report.goal(len(acked) > rounds * 50, f"{sync}: claims were answered in every round")
    report.goal(not lost, f"{sync}: no acknowledged claim lost ({len(lost)} lost, e.g. {lost[:3]})")
    common._rmtree(str(data))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 rounds per pass (CI)")
    ap.add_argument("--rounds", type=int, default=None)
    a = ap.parse_args()
    rounds = a.rounds or (20 if a.quick else 40)
    report = Report("claims_kill: SIGKILL (and power cuts) under load lose no acknowledged claim")
    run_pass("normal", rounds, report)
    run_pass("full", rounds, report)
    return report.finish()


if __name__ == "__main__":
    raise SystemExit(main())
