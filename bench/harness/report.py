"""Results: ratios and ranks, then latest.json, latest.md, latest.png and the
table in bench/README.md."""

import json
import os
import re

from .measure import DEMO_THREADS, NOISY_PCT
from .servers import REFERENCES

NA = "n/a"
CLIENT_BOUND_PCT = 95  # load generator (wrk, tlsload, h2load, h3load) CPU % from which the client is the bottleneck
SKIPPED = "skipped"  # the cell of a server left out of a scenario (no HTTP/2): see the notes


def _ratio(a, b):
    return round(a / b, 3) if a and b else None


def annotate(scenarios):
    """Add ×nginx / ×h2o ratios and ranks. A server with errors is marked, not
    ranked; the floor is the limit, not a contestant."""
    for sc in scenarios:
        res = sc["results"]
        idle = sc["kind"] == "idle"
        key = "bytes_per_conn" if idle else "req_s"
        for name, r in res.items():
            for ref in REFERENCES:
                ref_r = res.get(ref)
                ok = ref_r and ref_r["ok"] and ref != name and r["ok"]
                r[f"x_{ref}"] = _ratio(r[key], ref_r[key]) if ok else None
                if not idle:  # CPU per request relative to the reference: lower is better
                    r[f"cpu_x_{ref}"] = _ratio(r["cpu_us_per_req"], ref_r["cpu_us_per_req"]) if ok else None
        contestants = [n for n, r in res.items() if r["ok"] and n != "floor" and r[key] is not None]
        contestants.sort(key=lambda n: res[n][key], reverse=not idle)
        for n, r in res.items():
            r["rank"] = contestants.index(n) + 1 if n in contestants else None
    _annotate_claims(scenarios)


STATIC_REF_SCENARIO = "small-50"
# The claims targets (issue 45), by --sync mode: CPU per claim against the CPU per request
# of the static small-50 scenario of the same run (tern's own and nginx's), and p99; under
# --sync full the p99 of tern's own part of a claim's wait (the fdatasync time in it left
# out: the device's tail is reported apart).
CLAIMS_TARGETS = {
    "normal": {"cpu_x_tern": 1.0, "cpu_x_nginx": 0.6, "p99_ms": 0.5},
    "full": {"tern_wait_p99_ms": 2.0},
    # issue 23: tern's CPU per claim saved in PostgreSQL (the database's is reported apart)
    "pg": {"cpu_x_tern": 1.3},
}


def _claims_sync(sc):
    return sc.get("sync") or next(
        (r["claims"].get("sync") for r in sc["results"].values() if r.get("claims")), None) or "normal"


def _annotate_claims(scenarios):
    """Claims: CPU per claim ÷ tern's and nginx's small-50 CPU per request of the same run
    (and claims/s ÷ nginx's req/s, for the record), and each target of CLAIMS_TARGETS as
    met (True), missed (False) or not judged (None: no reference, or errors)."""
    small = next((sc for sc in scenarios if sc["name"] == STATIC_REF_SCENARIO), None)
    refs = {n: small["results"].get(n) if small else None for n in ("tern", "nginx")}
    for sc in scenarios:
        if sc["kind"] != "claims":
            continue
        sc["static_ref"] = {
            "scenario": STATIC_REF_SCENARIO,
            "ran": small is not None,
            **{n: {"ok": bool(ref and ref["ok"]),
                   "req_s": ref["req_s"] if ref else None,
                   "cpu_us_per_req": ref["cpu_us_per_req"] if ref else None}
               for n, ref in refs.items()},
        }
        limits = CLAIMS_TARGETS.get(_claims_sync(sc), {})
        for r in sc["results"].values():
            for n, ref in refs.items():
                ok = bool(ref and ref["ok"] and r["ok"])
                r[f"cpu_x_{n}_small_50"] = _ratio(r["cpu_us_per_req"], ref["cpu_us_per_req"]) if ok else None
            ok = bool(refs["nginx"] and refs["nginx"]["ok"] and r["ok"])
            r["x_nginx_small_50"] = _ratio(r["req_s"], refs["nginx"]["req_s"]) if ok else None
            targets = []
            for key, limit in limits.items():
                if key == "p99_ms":
                    value = r["p99_ms"] if r["ok"] else None
                elif key == "tern_wait_p99_ms":
                    value = (r.get("claims") or {}).get(key) if r["ok"] else None
                else:
                    value = r.get(f"{key}_small_50")
                targets.append({"target": key, "limit": limit, "value": value,
                                "met": None if value is None else value <= limit})
            r["targets"] = targets


def _k(v):
    if v is None:
        return "–"
    if v >= 100_000:
        return f"{v / 1000:.0f}k"
    if v >= 1000:
        return f"{v / 1000:.1f}k"
    return f"{v:.0f}"


def _x(v):
    return f"{v:.2f}×" if v else "–"


def _errs(r):
    return ", ".join(f"{v} {k}" for k, v in r["errors"].items()) if r["errors"] else ""


def _mib(b):
    return f"{b / 2**20:.1f}"


def markdown(doc):
    m = doc["machine"]
    servers = doc["servers"]
    h3 = any(sc.get("h3") for sc in doc["scenarios"])
    lines = [
        f"**{doc['date']}** · mode `{doc['mode']}` · {m['cores']} cores ({m['cpu']}), "
        f"Linux {m['kernel']}, {m['os']}",
        "",
        f"Command: `{doc['command']}` · servers pinned to CPU 0, wrk (`-t1`), tlsload"
        + (", h2load (`-t1`) and h3load" if h3 else " and h2load (`-t1`)") + " to CPU 1 · "
        f"{doc['settings']['rounds']} interleaved round(s) of {doc['settings']['duration_s']} s "
        f"per server and scenario, medians shown · "
        + ", ".join(f"{n} {v}" for n, v in doc["versions"].items()),
        "",
    ]
    noise = max((r.get("other_cpu_pct", 0) for sc in doc["scenarios"] for r in sc["results"].values()),
                default=0)
    if noise > NOISY_PCT:
        lines += [f"⚠ other processes used up to {noise:.0f} % of a core during some of the runs "
                  "these numbers come from: they are disturbed.", ""]
    lines += [f"Note: {t}." for t in doc.get("notes", [])] + ([""] if doc.get("notes") else [])
    # request scenarios in one table: wrk's (over http or https), tlsload's (handshakes) and
    # h2load's (HTTP/2)
    wrk = [s for s in doc["scenarios"] if s["kind"] in ("wrk", "tlsload", "h2load", "h3load")]
    claims = [s for s in doc["scenarios"] if s["kind"] == "claims"]
    idle = [s for s in doc["scenarios"] if s["kind"] == "idle"]
    # app servers (tern-demo) have their own table: no column of n/a in the static ones
    servers = [n for n in doc["servers"]
               if any(n in sc["results"] or n in sc.get("skipped", {}) for sc in wrk + idle)]
    if wrk:
        refs = [r for r in REFERENCES if "tern" in servers and r in servers]
        ratio_cols = [f"tern/{r} req/s" for r in refs] + [f"tern/{r} CPU" for r in refs]
        mb = [sc["name"] for sc in wrk if sc["throughput"]]
        hs = [sc["name"] for sc in wrk if sc.get("unit") == "handshake"]
        units = ([f"MB/s for {' and '.join(mb)}"] if mb else []) + (
            [f"handshakes/s and CPU µs per handshake for {' and '.join(hs)}"] if hs else [])
        units = f" ({'; '.join(units)})" if units else ""
        lines += [
            f"req/s{units}, median of the rounds, and server CPU "
            f"µs per request. † = the load generator (wrk, tlsload, h2load{' or h3load' if h3 else ''}) was at "
            f"≥ {CLIENT_BOUND_PCT} % "
            "of its core: it, not the server, was the limit, so compare CPU µs/request. ✗ = had "
            f"errors, not ranked; {SKIPPED} = does not speak the scenario's protocol (see the notes). "
            "tern/X req/s: higher is better; tern/X CPU (per request): lower is better.",
            "",
            "| " + " | ".join(["scenario", *servers, *ratio_cols]) + " |",
            "|---" * (1 + len(servers) + len(ratio_cols)) + "|",
        ]
        for sc in wrk:
            cells = []
            for n in servers:
                r = sc["results"].get(n)
                if r is None:
                    cells.append(SKIPPED if n in sc.get("skipped", {}) else NA)
                    continue
                cell = f"{r['mb_s']:.0f} MB/s" if sc["throughput"] else _k(r["req_s"])
                if r["cpu_us_per_req"]:
                    cell += f" · {r['cpu_us_per_req']:.1f} µs"
                if r.get("wrk_cpu_pct", 0) >= CLIENT_BOUND_PCT:
                    cell += " †"
                if not r["ok"]:
                    cell += " ✗"
                cells.append(cell)
            t = sc["results"].get("tern")
            rcells = [_x(t and t.get(f"x_{ref}")) for ref in refs] + \
                [_x(t and t.get(f"cpu_x_{ref}")) for ref in refs]
            lines.append(f"| {sc['name']} | " + " | ".join(cells + rcells) + " |")
        extra = [r for r in REFERENCES if r not in ("nginx", "h2o") and r in servers]  # (caddy)
        lines += [
            "",
            "<details><summary>details: latency, CPU, memory, errors</summary>",
            "",
            "| scenario | server | req/s | MB/s | p50 ms | p99 ms | CPU µs/req | server CPU % "
            "| peak RSS MiB | ×nginx | ×h2o | " + "".join(f"×{r} | " for r in extra)
            + "rank | errors | client CPU % |",
            "|---" * (14 + len(extra)) + "|",
        ]
        for sc in wrk:
            for n in servers:
                r = sc["results"].get(n)
                if r is None:
                    continue
                rank = "limit" if n == "floor" else (str(r["rank"]) if r["rank"] else "✗ not ranked")
                cpu = r["cpu_us_per_req"]
                server_cpu = r.get("server_cpu_pct")
                lines.append(
                    f"| {sc['name']} | {n} | {_k(r['req_s'])} | {r['mb_s']:.0f} | {r['p50_ms']:.2f} "
                    f"| {r['p99_ms']:.2f} | {f'{cpu:.2f}' if cpu else '–'} "
                    f"| {f'{server_cpu:.0f}' if server_cpu is not None else '–'} | {_mib(r['peak_rss'])} "
                    f"| {_x(r.get('x_nginx'))} | {_x(r.get('x_h2o'))} | "
                    + "".join(f"{_x(r.get(f'x_{ref}'))} | " for ref in extra)
                    + f"{rank} | {_errs(r)} | {r['wrk_cpu_pct']:.0f} |"
                )
        lines += ["", "</details>", ""]
        lines += _tls_notes([sc for sc in wrk if sc.get("tls") and not sc.get("h2") and not sc.get("h3")], servers)
        lines += _h2_notes([sc for sc in wrk if sc.get("h2")], servers)
        lines += _h3_notes([sc for sc in wrk if sc.get("h3")], servers, doc["scenarios"])
    if claims:
        lines += _claims_markdown(claims)
    for sc in idle:
        extra = [r for r in REFERENCES if r not in ("nginx", "h2o") and r in sc["results"]]  # (caddy)
        what = "QUIC connections (HTTP/3)" if sc.get("h3") else "keep-alive connections"
        lines += [
            f"Idle {what} ({sc['name']}): RSS of a fresh server before and after "
            "the connections, each after one request:",
            "",
            "| server | connections | RSS before MiB | RSS after MiB | bytes/conn | ×nginx | ×h2o | "
            + "".join(f"×{r} | " for r in extra) + "errors |",
            "|---" * (8 + len(extra)) + "|",
        ]
        for n in servers:
            r = sc["results"].get(n)
            if r is None:
                if n in sc.get("skipped", {}):
                    lines.append(f"| {n} | {SKIPPED}: {sc['skipped'][n]} |" + " |" * 6)
                continue
            bpc = r["bytes_per_conn"]
            lines.append(
                f"| {n} | {r['connections']} | {_mib(r['rss_before'])} | {_mib(r['rss_after'])} "
                f"| {f'{bpc:.0f}' if bpc is not None else '–'} | {_x(r.get('x_nginx'))} "
                f"| {_x(r.get('x_h2o'))} | " + "".join(f"{_x(r.get(f'x_{ref}'))} | " for ref in extra)
                + f"{_errs(r)} |"
            )
        lines.append("")
        if sc.get("h3"):
            lines += _h3_notes([sc], servers, doc["scenarios"])[:-1]
            lines += [f"- {sc['name']}: bench/h3load -idle, a UDP socket and a full handshake "
                      "(x25519, no session offered) per connection, at most 200 in flight; each sends "
                      "the HTTP/3 SETTINGS and one GET, then nothing (no PINGs); at the end each makes "
                      "one more request, and one that fails counts as dropped.", ""]
    return "\n".join(lines)


def _tls_notes(scs, servers):
    """What the TLS rows ran with: the negotiated parameters (the answer check's
    OpenSSL client, i.e. wrk's) and tlsload's handshake counts."""
    if not scs:
        return []
    facts = scs[0]["answers"]
    notes = []
    first = next((f["tls"] for f in facts.values() if "tls" in f), None)
    if first:
        notes.append(
            "TLS rows: one ECDSA P-256 certificate for every server (a leaf for localhost/127.0.0.1 "
            "from a CA the harness makes); OpenSSL's default client, as wrk in the keep-alive TLS "
            f"rows, negotiates {first['protocol']} {first['cipher']}, {first['group']}, "
            f"{first['signature']}, ALPN {first['alpn'] or 'none'} with every server (checked alike "
            "before each TLS scenario); session tickets sent after a full handshake / after a resumption: "
            + ", ".join(f"{n} {facts[n]['tls']['tickets']}/{facts[n]['tls']['tickets_on_resumption']}"
                        for n in servers if "tls" in facts.get(n, {})) + ".")
    for sc in scs:
        if sc["kind"] != "tlsload":
            continue
        counts = ", ".join(
            f"{n} {r['handshakes']['handshakes']} ({r['handshakes']['resumed']} resumed)"
            for n in servers if (r := sc["results"].get(n)) and "handshakes" in r)
        notes.append(
            f"{sc['name']}: bench/tlsload, a new connection per request, {sc['connections']} at a time; "
            "TLS 1.3, TLS_AES_128_GCM_SHA256, x25519; "
            + ("no session offered: full handshakes only" if sc.get("handshake") != "resume" else
               "every connection offers the session ticket of one earlier connection (psk_dhe_ke: "
               "an x25519 exchange still) and must resume")
            + f". Handshakes over all runs: {counts}.")
    return [f"- {t}" for t in notes] + [""]


def _h2_notes(scs, servers):
    """How the HTTP/2 rows ran: h2load's settings and what its first connection
    negotiated (the same with every server: checked before each scenario), and who
    was left out for not speaking HTTP/2."""
    if not scs:
        return []
    notes = []
    for sc in scs:
        h = next((f["h2load"] for f in sc["answers"].values() if "h2load" in f), None)
        if h and h["tls_protocol"]:
            got = f"{h['tls_protocol']} {h['cipher']}, {h['temp_key']}, ALPN {h['protocol']}"
        else:
            got = f"{h['protocol']} with prior knowledge" if h else "?"
        answers = {n: sc["answers"][n] for n in servers if n in sc["answers"]}
        heads = ", ".join(f"{n} {f['head_bytes']} B" for n, f in answers.items())
        caps = ", ".join(f"{n} {f.get('settings', {}).get('max_concurrent_streams', 'unlimited')}"
                         for n, f in answers.items())
        notes.append(
            f"{sc['name']}: h2load -t1 -c{sc['connections']} -m{sc.get('streams', 1)}"
            f"{' --npn-list=h2' if sc.get('tls') else ''} (windows 2^30 - 1) for the run's duration; "
            f"negotiated {got} with every server; p50/p99 from h2load's per-request log; "
            f"HPACK-compressed answer head: {heads}; concurrent streams the servers allow "
            f"(SETTINGS, h2load's -m is capped by it): {caps}.")
    for sc in scs:
        for n, why in sc.get("skipped", {}).items():
            notes.append(f"{sc['name']}: {n} {SKIPPED}, {why}.")
    return [f"- {t}" for t in notes] + [""]


def _h3_notes(scs, servers, everything=()):
    """How the HTTP/3 rows ran: h3load's settings, what its first connection negotiated
    (the same with every server: checked before each scenario), and its own CPU: on 2
    cores h3load is the limit long before a fast server is, so the CPU per request of the
    server is the figure that compares. With the HTTP/2 twin of a row in the same run
    (h2-small, h2-large, h2-idle-rss), each server's HTTP/3 cost ÷ its HTTP/2 cost."""
    if not scs:
        return []
    notes = []
    for sc in scs:
        twin = next((t for t in everything if t["name"] == sc["name"].replace("h3-", "h2-", 1)), None)
        if not twin:
            continue
        key = "bytes_per_conn" if sc["kind"] == "idle" else "cpu_us_per_req"
        what = "bytes per idle connection" if sc["kind"] == "idle" else "CPU µs per request"
        pairs = [(n, sc["results"][n][key], twin["results"][n][key]) for n in servers
                 if n in sc["results"] and n in twin["results"]
                 and sc["results"][n][key] and twin["results"][n][key]]
        if pairs:
            fmt = "{:.0f}" if sc["kind"] == "idle" else "{:.1f}"
            notes.append(f"{sc['name']} ÷ {twin['name']} ({what}, HTTP/3 over HTTP/2 in this run): " + ", ".join(
                f"{n} {fmt.format(a)} ÷ {fmt.format(b)} = {a / b:.2f}×" for n, a, b in pairs) + ".")
    for sc in scs:
        if sc["kind"] != "h3load":
            continue
        h = next((f["h3load"] for f in sc["answers"].values() if "h3load" in f), None)
        got = f"{h['version']} {h['cipher']}, {h['group']}, ALPN {h['alpn']}" if h else "?"
        client = ", ".join(
            f"{n} {r['client_cpu_us_per_req']:.1f} µs ({r.get('client_window_cpu_pct') or 0:.0f} % of its core)"
            for n in servers if (r := sc["results"].get(n)) and r.get("client_cpu_us_per_req"))
        notes.append(
            f"{sc['name']}: {sc.get('h3_client', 'bench/h3load (quic-go')}; a UDP socket per "
            f"connection; windows 64 MiB per stream, 1 GiB per connection) -c{sc['connections']} "
            f"-m{sc.get('streams', 1)} for the run's "
            f"duration, the certificate verified; negotiated {got} with every server (bench/h3load's "
            "check); p50/p99 from the client's histogram; MB/s from the answer bodies only (no frame "
            f"or header bytes, unlike h2load's). The client's own CPU per answer in its window: "
            f"{client or '–'}: at ≈ 100 % the "
            "client was the limit, so compare the servers' CPU µs per request, not req/s.")
    return [f"- {t}" for t in notes] + [""]


def _f(v, fmt="{:.1f}"):
    return "–" if v is None else fmt.format(v)


TARGET_TEXT = {
    "cpu_x_tern": "CPU per claim ÷ tern's {ref} CPU per request",
    "cpu_x_nginx": "CPU per claim ÷ nginx's {ref} CPU per request",
    "p99_ms": "p99 at {conns} connections",
    "tern_wait_p99_ms": "tern's part of a claim's wait (the fdatasyncs in it left out), p99 at "
                        "{conns} connections",
}


def _thread_columns(c):
    """CPU µs per claim: the workers, each helper thread, and the rest (e.g. the main thread)."""
    by = c.get("cpu_us_per_claim_by_thread") or {}
    workers = sum(v for t, v in by.items() if t.startswith("tern-worker"))
    named = [by.get(t) for t in DEMO_THREADS]
    rest = sum(v for t, v in by.items() if not t.startswith("tern-worker") and t not in DEMO_THREADS)
    return [workers if by else None, *named, rest if by else None]


def _claims_markdown(scs):
    """The claims scenarios (--sync normal and full) in three tables (load, the write path,
    CPU by thread) and the targets, met or missed, with their ratios."""
    ref = next((sc.get("static_ref") for sc in scs if sc.get("static_ref")), None) or {}
    conns = scs[0]["connections"]
    lines = [
        "IPv4 Games claims: `tern demo --workers 1`, the whole process (worker, claim-syncer, "
        "compactor, score-views, player-lookup) on CPU 0; each request claims a fresh address "
        "(X-Forwarded-For from a trusted loopback proxy), "
        f"{conns} connections. The claims a worker took in one event-loop turn are written to the "
        "journal with one write; `--sync normal` answers them in that turn (in the page cache: "
        "survives the process being killed), `--sync full` once the claim-syncer's fdatasync "
        "covers them (survives power loss). Turns, writes and syncs from the server's /statusz "
        f"over the claims runs; ×small-50 CPU = CPU µs per claim ÷ CPU µs per request of "
        f"{ref.get('scenario', STATIC_REF_SCENARIO)} in this run; † = wrk was at ≥ {CLIENT_BOUND_PCT} % of "
        "its core (the client, not the server, was the limit: compare CPU µs/claim).",
        "",
        "| scenario | sync | claims/s | p50 ms | p99 ms | CPU µs/claim | ×tern small-50 CPU "
        "| ×nginx small-50 CPU | saved | acknowledged | errors | wrk CPU % |",
        "|---" * 12 + "|",
    ]
    rows = [(sc, n, r) for sc in scs for n, r in sc["results"].items()]

    def label(sc, n):
        return sc["name"] if n == "tern-demo" else f"{sc['name']} ({n})"

    for sc, n, r in rows:
        c = r.get("claims") or {}
        bound = " †" if r.get("wrk_cpu_pct", 0) >= CLIENT_BOUND_PCT else ""
        lines.append(
            f"| {label(sc, n)} | {_claims_sync(sc)} | {_k(r['req_s'])}{bound} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
            f"| {_f(r['cpu_us_per_req'], '{:.2f}')} | {_x(r.get('cpu_x_tern_small_50'))} "
            f"| {_x(r.get('cpu_x_nginx_small_50'))} | {c.get('saved', '–')} | {c.get('acknowledged', '–')} "
            f"| {_errs(r)} | {r['wrk_cpu_pct']:.0f} |")
    lines += [
        "",
        "The write path: claims per worker turn, journal writes (one per turn with changed claims) "
        "and claims per write, bytes appended per claim; under `--sync full` the fdatasync calls, "
        "claims answered per sync, the mean, p99 and longest fdatasync (the longest since start; "
        "the device's part of a claim's wait) and the p99 of tern's own part (a claim's wait from "
        "the end of its worker turn until its answer goes back to the worker, less the fdatasync "
        "time in it); the p99s are histogram bucket bounds (≤).",
        "",
        "| scenario | turns | claims/turn | journal writes | claims/write | B/claim written | fdatasyncs "
        "| claims/sync | mean fdatasync µs | p99 fdatasync ms | longest fdatasync ms | tern's part p99 ms "
        "| refused (full) | compactions |",
        "|---" * 14 + "|",
    ]
    for sc, n, r in rows:
        c = r.get("claims") or {}
        syncs = c.get("syncs")
        lines.append(
            f"| {label(sc, n)} | {c.get('turns', '–')} | {_f(c.get('claims_per_turn'))} "
            f"| {c.get('writes', '–')} | {_f(c.get('claims_per_write'))} "
            f"| {_f(c.get('bytes_per_claim_written'))} | {syncs if syncs is not None else '–'} "
            f"| {_f(c.get('claims_per_sync'))} | {_f(c.get('sync_mean_us'), '{:.0f}')} "
            f"| {_f(c.get('sync_p99_ms'), '≤ {:.2f}')} "
            f"| {_f(c.get('sync_max_seconds') * 1000 if syncs and c.get('sync_max_seconds') is not None else None, '{:.2f}')} "
            f"| {_f(c.get('tern_wait_p99_ms'), '≤ {:.2f}')} "
            f"| {c.get('refused_full', '–')} | {c.get('compactions', '–')} |")
    pg_rows = [(sc, n, r) for sc, n, r in rows if (r.get("claims") or {}).get("pg_groups")]
    if pg_rows:
        lines += [
            "",
            "PostgreSQL (claims-pg): claims go to the pg-writer thread, which saves everything "
            "queued meanwhile as one group: one transaction (advisory lock, one upsert statement "
            "that also appends the changed rows to claim_log, commit). Mean transaction time from "
            "the writer's clock; the database's CPU is its whole cluster's (postmaster and "
            "backends, /proc), on CPU 1 with wrk.",
            "",
            "| scenario | PostgreSQL | groups | claims/group | mean transaction ms | tern CPU µs/claim "
            "| PostgreSQL CPU µs/claim | refused busy | refused down | unknown outcome |",
            "|---" * 10 + "|",
        ]
        for sc, n, r in pg_rows:
            c = r["claims"]
            pg = c.get("pg") or {}
            lines.append(
                f"| {label(sc, n)} | {pg.get('server_version', '?')}, synchronous_commit "
                f"{pg.get('synchronous_commit', '?')}, fsync {pg.get('fsync', '?')} | {c['pg_groups']} "
                f"| {_f(c.get('claims_per_group'))} | {_f(c.get('pg_commit_mean_ms'), '{:.2f}')} "
                f"| {_f(r['cpu_us_per_req'], '{:.2f}')} | {_f(r.get('companion_cpu_us_per_req'), '{:.2f}')} "
                f"| {c.get('refused_busy', '–')} | {c.get('refused_down', '–')} | {c.get('outcome_unknown', '–')} |")
    threads = DEMO_THREADS
    lines += [
        "",
        "Server CPU µs per saved claim by thread, over all the claims runs (/proc/PID/task, "
        "10 ms resolution per thread): the workers (`tern-worker-N`), each helper thread (– = the "
        "process has no such thread), and the rest (the main thread).",
        "",
        "| scenario | all threads | workers | " + " | ".join(threads) + " | other |",
        "|---" * (4 + len(threads)) + "|",
    ]
    for sc, n, r in rows:
        c = r.get("claims") or {}
        cols = _thread_columns(c)
        lines.append(f"| {label(sc, n)} | {_f(c.get('cpu_us_per_claim_threads_total'), '{:.2f}')} | "
                     + " | ".join(_f(v, "{:.2f}") for v in cols) + " |")
    notes = []
    for sc, n, r in rows:
        c = r.get("claims") or {}
        who = label(sc, n)
        if not ref.get("ran"):
            notes.append(f"{who}: {STATIC_REF_SCENARIO} was not run in this invocation, so there are no "
                         f"CPU ratios (run `bench/run {STATIC_REF_SCENARIO} {sc['name']}`).")
        for t in r.get("targets", []):
            what = TARGET_TEXT.get(t["target"], t["target"]).format(
                ref=ref.get("scenario", STATIC_REF_SCENARIO), conns=sc["connections"])
            if t["target"] in ("p99_ms", "tern_wait_p99_ms"):
                at_most = "≤ " if t["target"] == "tern_wait_p99_ms" else ""  # (a bucket's bound)
                got = f"{at_most}{t['value']:.2f} ms" if t["value"] is not None else "–"
                limit = f"≤ {t['limit']:g} ms"
            else:
                base = (ref.get(t["target"][len("cpu_x_"):]) or {}).get("cpu_us_per_req")
                got = (f"{r['cpu_us_per_req']:.2f} ÷ {base:.2f} µs = **{t['value']:.2f}×**"
                       if t["value"] is not None and base else "–")
                limit = f"≤ {t['limit']:.1f}×"
            verdict = {True: "**met**", False: "**missed**", None: "not judged (no reference or errors)"}[t["met"]]
            notes.append(f"{who} target: {what} {limit}: {got}: {verdict}.")
        if c.get("syncs"):
            notes.append(
                f"{who}: {c['syncs']} fdatasync calls took {c['sync_seconds'] * 1000:.1f} ms in all: "
                f"**{c['sync_mean_us']:.0f} µs** each on average, {c['claims_per_sync']:.1f} claims "
                f"answered per sync (data on {c.get('data_fs', '?')}).")
        if c:
            notes.append(
                f"{who}: saved − acknowledged = {c.get('unacknowledged', '–')} over {c.get('wrk_runs', '–')} "
                "wrk run(s): claims in flight when wrk stopped are saved and answered after it stopped "
                f"counting (at most one per connection per run, ≤ {c.get('in_flight_bound', '–')}); "
                "saved < acknowledged would fail the run. "
                + (f"Data in PostgreSQL (its folder on {(c.get('pg') or {}).get('data_fs', '?')})."
                   if c.get("sync") == "pg" else f"Data on {c.get('data_fs', '?')}, `--sync {c.get('sync', '?')}`."))
    lines += [""] + [f"- {t}" for t in notes] + [""]
    return lines


COLORS = {"nginx": "#2e7d32", "h2o": "#1565c0", "tern": "#e65100", "floor": "#9e9e9e",
          "tern-demo": "#6a1b9a", "caddy": "#00838f"}


def chart(doc, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scs = [sc for sc in doc["scenarios"] if sc["results"]]  # (all servers skipped: nothing to draw)
    servers = doc["servers"]
    if not scs:
        return
    fig, axes = plt.subplots(2, len(scs), figsize=(2.0 * len(scs) + 1.5, 5.6), squeeze=False)
    for i, sc in enumerate(scs):
        idle = sc["kind"] == "idle"
        names = [n for n in servers if n in sc["results"]]
        colors = [COLORS.get(n, "#555555") for n in names]
        res = [sc["results"][n] for n in names]
        if idle:
            rows = [([r["bytes_per_conn"] or 0 for r in res], "bytes / idle conn"),
                    ([r["rss_after"] / 2**20 for r in res], f"RSS MiB, {res[0]['connections']} idle")]
        else:
            unit = {"claim": "claim", "handshake": "handshake"}.get(
                sc.get("unit") or ("claim" if sc["kind"] == "claims" else ""), "req")
            top = ([r["mb_s"] for r in res], "MB/s") if sc["throughput"] else (
                [r["req_s"] / 1000 for r in res], f"k {unit}s/s" if unit == "handshake" else f"k {unit}/s")
            rows = [top, ([r["cpu_us_per_req"] or 0 for r in res], f"CPU µs / {unit}")]
        for j, (vals, unit) in enumerate(rows):
            ax = axes[j][i]
            bars = ax.bar(range(len(names)), vals, color=colors)
            for b, r in zip(bars, res):
                if not r["ok"]:
                    b.set_hatch("xx")
                    b.set_edgecolor("red")
            for k, v in enumerate(vals):
                ax.text(k, v, f"{v:.0f}" if v >= 10 else f"{v:.1f}", ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels(names, fontsize=7, rotation=30)
            ax.tick_params(axis="y", labelsize=7)
            ax.set_ylim(0, max(vals + [1e-9]) * 1.18)
            ax.set_title(sc["name"] if j == 0 else "", fontsize=9)
            ax.set_ylabel(unit, fontsize=7)
            ax.spines[["top", "right"]].set_visible(False)
    m = doc["machine"]
    fig.suptitle(
        f"tern bench {doc['date']} ({doc['mode']}) · {m['cores']} cores, Linux {m['kernel']} · "
        "servers on CPU 0, load on CPU 1 · hatched = had errors",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)


CHART_SKIPPED = "chart skipped"  # how the note of a run without matplotlib begins


def matplotlib_missing():
    """Why the chart cannot be drawn here (the ImportError's text), or "" when it can. It
    imports what chart() imports, so a broken install is found before anything is written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except ImportError as e:
        return str(e) or "matplotlib cannot be imported"
    return ""


def write_all(doc, out_dir, png=True, redraw=""):
    """Writes latest.json, latest.md and (when matplotlib is importable) latest.png; returns
    the markdown and whether a chart was drawn. Without matplotlib (`--no-install` on a
    machine without it) the chart is skipped with a note instead of failing after the run,
    and a chart left from an earlier run is removed so nothing shows stale numbers.
    redraw: the command that draws the chart later from latest.json (for the note)."""
    os.makedirs(out_dir, exist_ok=True)
    png_path = os.path.join(out_dir, "latest.png")
    json_path = os.path.join(out_dir, "latest.json")
    redraw = redraw or f"bench/run --render {os.path.relpath(json_path)}"
    # (a results file redrawn with --render may carry the note of the run that wrote it)
    doc["notes"] = [t for t in doc.get("notes", []) if not t.startswith(CHART_SKIPPED)]
    missing = matplotlib_missing() if png else ""
    drawn = png and not missing
    if missing:
        doc["notes"].append(
            f"{CHART_SKIPPED}: matplotlib cannot be imported ({missing}); install it (`python3 -m "
            f"pip install matplotlib`, as bench/run does without --no-install) and redraw with "
            f"`{redraw}`")
        print(f"note: {doc['notes'][-1]}", flush=True)
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    md = markdown(doc)
    with open(os.path.join(out_dir, "latest.md"), "w") as f:
        f.write("# tern bench: latest results\n\n" + md + ("\n![chart](latest.png)\n" if drawn else ""))
    if drawn:
        chart(doc, png_path)
    elif os.path.exists(png_path):
        os.remove(png_path)
    return md, drawn


BEGIN, END = "<!-- latest-results:begin -->", "<!-- latest-results:end -->"


def update_readme(readme, md, chart=True):
    """Replace the block between the markers in bench/README.md."""
    with open(readme) as f:
        text = f.read()
    image = "\n![req/s and CPU µs per request](results/latest.png)" if chart else ""
    block = f"{BEGIN}\n{md}{image}\n{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text += "\n" + block + "\n"
    with open(readme, "w") as f:
        f.write(text)
