"""Running the load: wrk for request scenarios (over https for TLS ones; and for
claims, with the app's own account from /statusz), bench/tlsload for the TLS
handshake scenarios, h2load for the HTTP/2 ones, bench/h3load for the HTTP/3 ones,
the idle client for idle-rss (h3load -idle over HTTP/3).
Each run records the server's CPU time (utime+stime of its process tree) before
and after, and samples its RSS while the load runs."""

import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from . import h2load, h3load, procs
from .check import (TLS_NAME, NoHttp2, check_h2, check_h3, check_scenario, check_tls, fetch, fetch_h2, fetch_h3,
                    tls_context)
from .h2wire import H2Error
from .servers import CLIENT_CPU, BenchError

HERE = os.path.dirname(os.path.abspath(__file__))


def log(msg):
    print(msg, flush=True)


_wrk_runs = itertools.count()


def _wrk_script(scenario, ctx):
    """wrk takes one script: the scenario's Lua (if any) followed by report.lua.
    BENCH_RUN numbers the wrk runs of this invocation (lua/claims.lua gives each
    run its own addresses)."""
    path = os.path.join(ctx.workdir, f"wrk-{scenario.name}.lua")
    parts = []
    if scenario.lua:
        parts.append(os.path.join(ctx.bench_dir, "lua", scenario.lua))
    parts.append(os.path.join(ctx.bench_dir, "lua", "report.lua"))
    with open(path, "w") as out:
        out.write(f"BENCH_CONNECTIONS = {scenario.connections}\n")
        out.write(f"BENCH_RUN = {next(_wrk_runs)}\n")
        for p in parts:
            with open(p) as f:
                out.write(f.read() + "\n")
    return path


def run_wrk(scenario, server, headers, duration, ctx):
    inst = server.instance(scenario)
    argv = [
        "taskset", "-c", CLIENT_CPU,
        "wrk", "-t1", f"-c{scenario.connections}", f"-d{duration}s", "--timeout", "5s",
        "-s", _wrk_script(scenario, ctx),
    ]
    for k, v in headers.items():
        argv += ["-H", f"{k}: {v}"]
    # over TLS, "localhost" so that wrk sends it as SNI (the name of the certificate)
    origin = f"https://{TLS_NAME}" if scenario.tls else "http://127.0.0.1"
    argv.append(f"{origin}:{inst.port}{scenario.path}")
    run, _ = _run_client(scenario, server, argv, duration, "wrk")
    return run


def run_tlsload(scenario, server, headers, duration, ctx):
    """bench/tlsload: every request on a new TLS connection, `scenario.handshake`
    full or resumed; it counts each connection's kind of handshake, and one of the
    wrong kind fails the run."""
    inst = server.instance(scenario)
    argv = [
        "taskset", "-c", CLIENT_CPU,
        ctx.tlsload_bin, "-m", scenario.handshake, "-c", str(scenario.connections),
        "-d", str(duration), "-t", "5", "-n", TLS_NAME,
    ]
    for k, v in headers.items():
        argv += ["-H", f"{k}: {v}"]
    argv += [str(inst.port), scenario.path]
    run, out = _run_client(scenario, server, argv, duration, "tlsload")
    run["handshakes"] = {k: out[k] for k in ("handshakes", "resumed", "not_resumed", "tickets")}
    if scenario.handshake == "full" and out["resumed"]:
        raise BenchError(f"{scenario.name}: {out['resumed']} of {out['handshakes']} handshakes with "
                         f"{server.name} resumed a session, though tlsload offered none")
    if scenario.handshake == "resume" and (out["not_resumed"] or not out["handshakes"]):
        raise BenchError(f"{scenario.name}: {server.name} did not resume {out['not_resumed']} of "
                         f"{out['handshakes']} sessions offered (a ticket it issued seconds before)")
    return run


_h2load_runs = itertools.count()


def run_h2load(scenario, server, headers, duration, ctx):
    """h2load -t1 -cC -mM for `duration` seconds (harness/h2load.py); p50/p99 from
    its per-request log."""
    inst = server.instance(scenario)
    log_file = os.path.join(ctx.workdir, f"h2load-{scenario.name}-{server.name}-{next(_h2load_runs)}.tsv")
    argv = ["taskset", "-c", CLIENT_CPU, *h2load.argv(
        inst.port, scenario.path, scenario.connections, scenario.streams,
        tls_name=TLS_NAME if scenario.tls else None, duration=duration, log_file=log_file)]
    for k, v in headers.items():
        argv += ["-H", f"{k}: {v}"]
    run, out = _run_client(scenario, server, argv, duration, "h2load", parse=lambda o: _h2load_result(o, log_file))
    run["h2load_mean_ms"] = out.get("mean_us", 0) / 1000
    run["protocol"] = out["protocol"]
    if out["protocol"] != ("h2" if scenario.tls else "h2c"):
        raise BenchError(f"{scenario.name}: h2load spoke {out['protocol'] or 'nothing'} with {server.name}")
    return run


def run_h3load(scenario, server, headers, duration, ctx):
    """The HTTP/3 load client (bench/h3load-quinn, or bench/h3load: one command line and one
    output, harness/h3load.py) -c C -m M for `duration` seconds; its own CPU during its
    window (cpu_seconds) is kept beside the harness's measure of it."""
    inst = server.instance(scenario)
    argv = ["taskset", "-c", CLIENT_CPU, *h3load.argv(
        ctx.h3_load_bin, inst.port, scenario.path, scenario.connections, scenario.streams,
        ctx.tls.ca, TLS_NAME, duration=duration)]
    for k, v in headers.items():
        argv[-1:-1] = ["-H", f"{k}: {v}"]  # (flags before the URL)

    def parse(stdout):
        out = h3load.parse(stdout)
        return h3load.as_run(out) if out else None

    run, out = _run_client(scenario, server, argv, duration, "h3load", parse=parse)
    secs = out["duration_us"] / 1e6
    cpu = out.get("client_cpu_s")
    run["client_cpu_s"] = cpu
    run["client_cpu_us_per_req"] = cpu * 1e6 / run["requests"] if cpu is not None and run["requests"] else None
    run["client_window_cpu_pct"] = round(100 * cpu / secs, 1) if cpu is not None and secs else None
    run["tls"] = out["tls"]
    return run


def _h2load_result(stdout, log_file):
    """h2load's output in the shape of a BENCHJSON line, p50/p99 from its log file
    (then deleted: a 3 s run logs some 300 000 lines)."""
    w = h2load.parse(stdout)
    if w is None:
        return None
    p50 = p99 = 0
    if os.path.exists(log_file):  # (h2load writes it unless it failed at the start)
        (p50, p99), _ = h2load.percentiles(log_file)
        os.unlink(log_file)
    return {**w, "p50_us": p50, "p99_us": p99, "wrk_corrected": 0}


def _benchjson(stdout):
    line = next((l for l in stdout.splitlines() if l.startswith("BENCHJSON ")), None)
    return json.loads(line[len("BENCHJSON "):]) if line else None


def _run_client(scenario, server, argv, duration, what, parse=_benchjson):
    """Run a load generator against one server: one that prints BENCHJSON (wrk with
    lua/report.lua, or tlsload), or h2load with its own `parse`; returns (the run's
    numbers, the parsed result)."""
    inst = server.instance(scenario)
    pids = inst.pids()
    t0 = time.monotonic()
    busy0, self0 = procs.machine_busy_seconds(), procs.self_cpu_seconds()
    wrk0, cpu0 = procs.children_cpu_seconds(), procs.cpu_seconds(pids)
    # a database the server saves into (claims-pg): counted apart, not as disturbance
    companion = getattr(server, "companion_cpu_seconds", lambda _: 0.0)
    comp0 = companion(scenario)
    with procs.RssSampler(pids) as rss:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 60)
        except subprocess.TimeoutExpired:
            raise BenchError(f"{what} hung against {server.name} in {scenario.name}")
    cpu = procs.cpu_seconds(pids) - cpu0
    wrk_cpu = procs.children_cpu_seconds() - wrk0
    companion_cpu = companion(scenario) - comp0
    wall = time.monotonic() - t0
    # CPU time that neither the server (and its database), wrk nor this harness used:
    # something else was busy on the machine during the run, and the numbers are suspect
    others = (procs.machine_busy_seconds() - busy0 - cpu - wrk_cpu - companion_cpu
              - (procs.self_cpu_seconds() - self0))
    if not inst.alive():
        raise BenchError(f"{server.name} died during {scenario.name}:\n{inst.log_tail()}")
    w = parse(out.stdout)
    if w is None:
        raise BenchError(
            f"{what} gave no result for {server.name} in {scenario.name} (exit {out.returncode}):\n"
            f"  $ {' '.join(argv)}\n{out.stdout[-1500:]}{out.stderr[-1500:]}"
        )
    secs = w["duration_us"] / 1e6
    reqs = w["requests"]
    # wrk's and tlsload's kinds of errors, and h2load's failed requests (errored and
    # timed-out streams included)
    errors = ("connect", "handshake", "read", "write", "timeout", "status", "failed")
    return {
        "requests": reqs,
        "req_s": reqs / secs if secs else 0.0,
        "mb_s": w["bytes"] / secs / 1e6 if secs else 0.0,
        "p50_ms": w["p50_us"] / 1000,
        "p99_ms": w["p99_us"] / 1000,
        "latency_wrk_corrected": bool(w["wrk_corrected"]),
        "cpu_s": round(cpu, 3),
        "companion_cpu_s": round(companion_cpu, 3),
        "cpu_us_per_req": cpu * 1e6 / reqs if reqs else None,
        "server_cpu_pct": round(100 * cpu / wall, 1),
        "peak_rss": rss.peak,
        "wrk_cpu_pct": round(100 * wrk_cpu / wall, 1),  # the load generator's (wrk or tlsload)
        "other_cpu_pct": max(0.0, round(100 * others / wall, 1)),
        "errors": {k: w[k] for k in errors if k in w},
    }, w


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


NOISY_PCT = 10  # a run during which other processes used more than this % of a core is disturbed


def _clean(runs):
    return [r for r in runs if r["other_cpu_pct"] <= NOISY_PCT]


def _enough_clean(runs):
    """At least half of the rounds (and at least one) were undisturbed."""
    n = len(_clean(runs))
    return n > 0 and 2 * n >= len(runs)


def summarize(runs):
    """Medians over the undisturbed rounds when they are the majority (over all rounds
    otherwise); errors summed over all rounds; every round kept for the record."""
    used = _clean(runs) if _enough_clean(runs) else runs
    errors = {}
    for r in runs:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {
        "req_s": _median([r["req_s"] for r in used]),
        "mb_s": _median([r["mb_s"] for r in used]),
        "p50_ms": _median([r["p50_ms"] for r in used]),
        "p99_ms": _median([r["p99_ms"] for r in used]),
        "cpu_us_per_req": _median([r["cpu_us_per_req"] for r in used]),
        # the database's CPU per request (claims-pg), when the server has one
        "companion_cpu_us_per_req": _median([r["companion_cpu_s"] * 1e6 / r["requests"]
                                             for r in used if r.get("companion_cpu_s") and r["requests"]]),
        "peak_rss": max(r["peak_rss"] for r in runs),
        "server_cpu_pct": _median([r["server_cpu_pct"] for r in used]),
        "wrk_cpu_pct": _median([r["wrk_cpu_pct"] for r in used]),
        "other_cpu_pct": max(r["other_cpu_pct"] for r in used),
        "rounds_used": len(used),
        "requests": sum(r["requests"] for r in runs),
        "errors": {k: v for k, v in errors.items() if v},
        "ok": not any(errors.values()),
        "rounds_req_s": [round(r["req_s"]) for r in runs],
        "rounds_p99_ms": [round(r["p99_ms"], 2) for r in runs],
        "rounds_cpu_us_per_req": [
            round(r["cpu_us_per_req"], 2) if r["cpu_us_per_req"] else None for r in runs
        ],
        "rounds_other_cpu_pct": [r["other_cpu_pct"] for r in runs],
        # h3load's own account of its CPU in its window: per answer, and as % of its core
        **({"client_cpu_us_per_req": _median([r["client_cpu_us_per_req"] for r in used]),
            "client_window_cpu_pct": _median([r["client_window_cpu_pct"] for r in used])}
           if "client_cpu_us_per_req" in runs[0] else {}),
        **({"handshakes": {k: sum(r["handshakes"][k] for r in runs) for k in runs[0]["handshakes"]}}
           if "handshakes" in runs[0] else {}),
    }


def _fmt_k(v):
    return f"{v / 1000:.1f}k" if v >= 1000 else f"{v:.0f}"


def _check(scenario, servers, ctx):
    facts = check_scenario(scenario, servers, ctx.docroot, ctx.tls)
    log(f"  answers agree: " + ", ".join(
        f"{n} {f['status']}/{f['body_bytes']}B (head {f['head_bytes']}B)" for n, f in facts.items()))
    if scenario.tls:
        check_tls(scenario, servers, ctx.tlsload_bin, facts)
        t = next(iter(facts.values()))["tls"]
        log(f"  TLS agrees (OpenSSL client defaults): {t['protocol']} {t['cipher']} {t['group']} "
            f"{t['signature']}, ALPN {t['alpn'] or 'none'}; tickets after a full handshake / a resumption: "
            + ", ".join(f"{n} {f['tls']['tickets']}/{f['tls']['tickets_on_resumption']}"
                        + ("" if f["tls"]["resumed"] else " (no resumption)") for n, f in facts.items()))
    return facts


def wrk_scenario(scenario, servers, settings, ctx):
    facts = _check(scenario, servers, ctx)
    results, _ = _wrk_rounds(scenario, servers, facts, settings, ctx)
    return {"facts": facts, "results": results}


def tlsload_scenario(scenario, servers, settings, ctx):
    """Handshakes: bench/tlsload instead of wrk, otherwise as a wrk scenario."""
    facts = _check(scenario, servers, ctx)
    results, _ = _wrk_rounds(scenario, servers, facts, settings, ctx, run=run_tlsload)
    return {"facts": facts, "results": results}


def h2load_scenario(scenario, servers, settings, ctx):
    """HTTP/2: check_h2 (a server without HTTP/2 is skipped), then h2load in
    interleaved rounds as wrk."""
    facts, skipped = check_h2(scenario, servers, ctx.docroot, ctx.tls)
    _log_h2_check(scenario, facts, skipped)
    servers = [s for s in servers if s.name in facts]
    results = {}
    if servers:
        results, _ = _wrk_rounds(scenario, servers, facts, settings, ctx, run=run_h2load)
    return {"facts": facts, "results": results, "skipped": skipped}


def h3load_scenario(scenario, servers, settings, ctx):
    """HTTP/3: check_h3, then h3load in interleaved rounds as wrk."""
    facts = check_h3(scenario, servers, ctx.docroot, ctx.tls, ctx.h3_python, ctx.h3load_bin)
    _log_h3_check(facts)
    results, _ = _wrk_rounds(scenario, servers, facts, settings, ctx, run=run_h3load)
    return {"facts": facts, "results": results}


def _log_h3_check(facts):
    log("  answers agree: " + ", ".join(
        f"{n} {f['protocol']} {f['status']}/{f['body_bytes']}B" for n, f in facts.items()))
    h = next((f["h3load"] for f in facts.values() if "h3load" in f), None)
    if h:
        log(f"  h3load negotiates alike: {h['version']} {h['cipher']} {h['group']}, ALPN {h['alpn']}")


def _log_h2_check(scenario, facts, skipped):
    if facts:
        log("  answers agree: " + ", ".join(
            f"{n} {f['protocol']} {f['status']}/{f['body_bytes']}B (HPACK head {f['head_bytes']}B)"
            for n, f in facts.items()))
    h = next((f["h2load"] for f in facts.values() if "h2load" in f), None)
    if h:
        log(f"  h2load negotiates alike: {h['protocol']}"
            + (f", {h['tls_protocol']} {h['cipher']} {h['temp_key']}" if h["tls_protocol"] else ""))
    if facts:
        log("  their SETTINGS: " + "; ".join(
            f"{n} " + (", ".join(f"{k} {v}" for k, v in f["settings"].items()) or "none (defaults)")
            for n, f in facts.items()))
    for n, f in facts.items():
        cap = f["settings"].get("max_concurrent_streams")
        if scenario.kind == "h2load" and cap is not None and cap < scenario.streams:
            log(f"  warning: {n} allows {cap} concurrent streams: h2load runs {cap}, not {scenario.streams}, "
                "per connection there")
    for n, why in skipped.items():
        log(f"  {n}: skipped, {why}")


def _wrk_rounds(scenario, servers, facts, settings, ctx, run=run_wrk):
    """Warm-up, then interleaved rounds; returns (summaries, every run incl. warm-up)."""
    warmups = {s.name: [] for s in servers}
    if settings.warmup:
        for s in servers:
            warmups[s.name].append(run(scenario, s, facts[s.name]["headers"], settings.warmup, ctx))
    runs = {s.name: [] for s in servers}
    planned, extra = settings.rounds, settings.extra_rounds
    r = 0
    while r < planned or (extra and not all(_enough_clean(rs) for rs in runs.values())):
        if r >= planned:
            extra -= 1
            log("  disturbed by other processes: one more round")
        r += 1
        for s in servers:  # interleaved: A B C D, A B C D, ...
            runs[s.name].append(run(scenario, s, facts[s.name]["headers"], settings.duration, ctx))
        label = f"round {r}/{planned}" if r <= planned else f"round {r} (extra)"
        log(f"  {label}: " + "  ".join(
            f"{n} {_fmt_k(rs[-1]['req_s'])}/s {rs[-1]['cpu_us_per_req'] or 0:.1f}µs"
            + ("" if not any(rs[-1]["errors"].values()) else " (errors)")
            + (f" (others {rs[-1]['other_cpu_pct']:.0f}%)" if rs[-1]["other_cpu_pct"] > NOISY_PCT else "")
            for n, rs in runs.items()))
    results = {n: summarize(rs) for n, rs in runs.items()}
    return results, {n: warmups[n] + rs for n, rs in runs.items()}


def read_statusz(port):
    """/statusz of tern demo as {name: number} (`name: value` lines)."""
    (r,), _ = fetch(port, "/statusz", {})
    if r.status != 200:
        raise BenchError(f"/statusz answered {r.status}")
    out = {}
    for line in r.body.decode("utf-8", "replace").splitlines():
        k, sep, v = line.partition(": ")
        if sep:
            try:
                out[k.strip()] = float(v)
            except ValueError:
                pass
    return out


def read_histograms(port):
    """/metrics histograms (cumulative bucket counts by upper bound, seconds):
    {name without tern_: [(le, count), ...]}, for the --sync full write path's tail
    (journal_fdatasync_seconds, claim_tern_wait_seconds)."""
    (r,), _ = fetch(port, "/metrics", {})
    out = {}
    if r.status != 200:
        return out
    for line in r.body.decode("utf-8", "replace").splitlines():
        name, sep, rest = line.partition('_bucket{le="')
        if not sep or not name.startswith("tern_"):
            continue
        le, _, value = rest.partition('"} ')
        try:
            out.setdefault(name[len("tern_"):], []).append(
                (float("inf") if le == "+Inf" else float(le), float(value)))
        except ValueError:
            pass
    return out


def histogram_quantile(before, after, q):
    """The upper bound (seconds) of the bucket that holds quantile q of the samples added
    between two readings of a cumulative histogram; None without samples."""
    earlier = dict(before or [])
    rows = [(le, n - earlier.get(le, 0)) for le, n in after or []]
    total = rows[-1][1] if rows else 0
    if total <= 0:
        return None
    return next((le for le, n in rows if n >= q * total), None)


# --sync full: /metrics histograms whose p99 over the rounds is recorded (bucket bounds:
# the p99 is "at most" that bound)
CLAIM_HISTOGRAMS = {
    "claim_tern_wait_seconds": "tern_wait_p99_ms",  # a claim's wait less the fdatasyncs in it
    "journal_fdatasync_seconds": "sync_p99_ms",  # each fdatasync: the device's tail
}


def _settled_statusz(port, timeout=5.0):
    """/statusz once the game is idle: the claims still in flight when wrk stopped are
    saved and answered (claims_saved unchanged over 0.2 s; under --sync full the
    claim-syncer answers them after its last fdatasync)."""
    last = read_statusz(port)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = read_statusz(port)
        if now.get("claims_saved") == last.get("claims_saved"):
            return now
        last = now
    return last


# /statusz counters of tern demo recorded for the claims rounds (differences over the
# rounds), under the names the results use
CLAIM_COUNTERS = {
    "claims_received": "received",  # claims staged by the handler (valid, not rate-limited)
    "claim_turns": "turns",  # worker turns that had claims to save
    "claims_saved": "saved",  # answered 200 once durable (full: once synced)
    "journal_writes": "writes",  # one write per worker turn with changed claims
    "journal_written_bytes": "written_bytes",
    "claims_changed": "changed",  # written to the journal
    "claims_unchanged": "unchanged",  # the holder again within the hour: nothing written
    "journal_write_errors": "write_errors",
    "claims_refused_full": "refused_full",  # new addresses past --max-claims (503)
    "claims_refused_stopped": "refused_stopped",  # after a failed fdatasync (503)
    "claims_rate_limited": "rate_limited",
    "claims_rate_dropped": "rate_dropped",
    "claims_invalid_name": "invalid_names",
    "journal_syncs": "syncs",  # fdatasync calls (--sync full)
    "journal_sync_seconds_total": "sync_seconds",
    "compactions": "compactions",
    "pg_groups": "pg_groups",  # claims-pg: transactions committed (one per group)
    "pg_commit_seconds_total": "pg_commit_seconds",  # their time, statement to commit
    "claims_refused_busy": "refused_busy",  # claims-pg: the writer's queue was full (503)
    "claims_refused_down": "refused_down",  # claims-pg: PostgreSQL unreachable (503)
    "claims_outcome_unknown": "outcome_unknown",  # claims-pg: commit failed (503)
}
FLOAT_COUNTERS = {"sync_seconds", "pg_commit_seconds"}
# the /statusz counters each kind of store must have
REQUIRED_COUNTERS = {
    "journal": ("claims_saved", "claims_received", "claim_turns", "journal_writes", "claims_changed",
                "journal_syncs", "journal_sync_seconds_total"),
    "pg": ("claims_saved", "claims_received", "claim_turns", "claims_changed", "pg_groups",
           "pg_commit_seconds_total"),
}
# /statusz gauges recorded as read once the rounds are over
CLAIM_GAUGES = {
    "journal_sync_seconds_max": "sync_max_seconds",  # since the server started
    "claimed_addresses": "claimed_addresses",
    "journal_bytes": "journal_bytes",
    "snapshot_bytes": "snapshot_bytes",
    "recovery_seconds": "recovery_seconds",
}
# threads of tern demo (comm names), in the order the report shows them; the workers are
# tern-worker-0, -1, …
DEMO_THREADS = ("claim-syncer", "compactor", "score-views", "player-lookup", "pg-writer", "pg-follower")


def _per(a, b, scale=1.0):
    return a * scale / b if a is not None and b else None


def claims_scenario(scenario, servers, settings, ctx):
    """A wrk scenario against tern demo, plus the game's own account: /statusz is read
    after the answer check and again once the game is idle after the rounds, and the
    difference gives the claims saved, the worker turns and journal writes they took
    (claims per write), the bytes written, and under --sync full the fdatasync calls,
    their total time (the mean cost of one) and the claims each covered. Server CPU per
    claim is also split by thread (tern-worker-N, claim-syncer, compactor, score-views,
    player-lookup). Sanity: every claim wrk saw acknowledged (2xx) must have been saved,
    so saved ≥ acknowledged; saved may exceed it by the claims in flight when wrk stopped
    each run (at most one per connection per run), which the server saves and answers
    after wrk stopped counting."""
    facts = _check(scenario, servers, ctx)
    before = {s.name: read_statusz(s.port_for(scenario)) for s in servers}
    hist0 = {s.name: read_histograms(s.port_for(scenario)) for s in servers}
    threads0 = {s.name: procs.thread_cpu_seconds(s.instance(scenario).pids()) for s in servers}
    results, all_runs = _wrk_rounds(scenario, servers, facts, settings, ctx)
    for s in servers:
        after = _settled_statusz(s.port_for(scenario))
        threads = procs.thread_cpu_seconds(s.instance(scenario).pids())
        store = "pg" if scenario.sync == "pg" else "journal"
        missing = [k for k in REQUIRED_COUNTERS[store] if k not in after]
        if missing:
            raise BenchError(f"{s.name}: /statusz lacks {', '.join(missing)}")
        runs = all_runs[s.name]
        # wrk counts every complete response; errors.status those with status > 399
        acked = sum(r["requests"] - r["errors"]["status"] for r in runs)
        d = {}
        for k, v in CLAIM_COUNTERS.items():
            diff = after.get(k, 0) - before[s.name].get(k, 0)
            d[v] = round(diff, 6) if v in FLOAT_COUNTERS else int(diff)
        gauges = {v: after[k] for k, v in CLAIM_GAUGES.items() if k in after}
        hist = read_histograms(s.port_for(scenario))
        for name, key in CLAIM_HISTOGRAMS.items():
            q = histogram_quantile(hist0[s.name].get(name), hist.get(name), 0.99)
            if q is not None:
                gauges[key] = q * 1000
        slack = len(runs) * scenario.connections
        spent = {t: sec - threads0[s.name].get(t, 0) for t, sec in threads.items()}
        by_thread = {
            t: round(sec * 1e6 / d["saved"], 2)
            for t, sec in sorted(spent.items(), key=lambda kv: -kv[1])
            if d["saved"]
        }
        c = {
            **d,
            **gauges,
            "acknowledged": acked,
            "unacknowledged": d["saved"] - acked,
            "in_flight_bound": slack,
            "wrk_runs": len(runs),
            "claims_per_turn": _per(d["received"], d["turns"]),
            "claims_per_write": _per(d["changed"], d["writes"]),
            "bytes_per_claim_written": _per(d["written_bytes"], d["changed"]),
            "claims_per_sync": _per(d["saved"], d["syncs"]),
            "sync_mean_us": _per(d["sync_seconds"], d["syncs"], 1e6),
            "claims_per_group": _per(d["saved"], d["pg_groups"]),
            "pg_commit_mean_ms": _per(d["pg_commit_seconds"], d["pg_groups"], 1e3),
            # server CPU per saved claim by thread (tern-worker-0, claim-syncer, …), over all
            # the claims runs (warm-up included); CLK_TCK resolution (10 ms per thread over the
            # whole scenario)
            "cpu_us_per_claim_by_thread": by_thread,
            "cpu_us_per_claim_threads_total": round(sum(spent.values()) * 1e6 / d["saved"], 2)
            if d["saved"] else None,
        }
        if hasattr(s, "setting"):
            c.update(s.setting(scenario))
        results[s.name]["claims"] = c
        sync = (f", {d['syncs']} fdatasync ({c['claims_per_sync'] or 0:.1f} claims each, "
                f"mean {c['sync_mean_us'] or 0:.0f} µs, p99 ≤ {c.get('sync_p99_ms', 0):.2f} ms; "
                f"tern's part of a claim's wait p99 ≤ {c.get('tern_wait_p99_ms', 0):.2f} ms)") if d["syncs"] else ""
        if store == "pg":
            sync = (f", {d['pg_groups']} PostgreSQL transactions ({c['claims_per_group'] or 0:.1f} claims "
                    f"each, {c['pg_commit_mean_ms'] or 0:.2f} ms each); {d['refused_busy']} refused busy, "
                    f"{d['refused_down']} down, {d['outcome_unknown']} unknown outcome")
        log(f"  {s.name}: {d['saved']} claims saved, {acked} acknowledged by wrk; {d['turns']} turns "
            f"({c['claims_per_turn'] or 0:.1f} claims each), {d['writes']} journal writes "
            f"({c['claims_per_write'] or 0:.1f} claims each){sync}; {d['refused_full']} refused full; "
            "CPU µs/claim by thread: "
            + ", ".join(f"{t} {v:.1f}" for t, v in by_thread.items() if v >= 0.05))
        if d["saved"] < acked:
            raise BenchError(
                f"{scenario.name}: {s.name} acknowledged {acked} claims but saved only {d['saved']}: "
                "answers went out for claims that are not durable (or it answered non-2xx statuses "
                "below 400, which wrk does not count as errors)")
        if d["unchanged"]:
            log(f"  warning: {d['unchanged']} claims changed nothing: lua/claims.lua repeated addresses")
        if d["saved"] > acked + slack:
            log(f"  warning: {s.name} saved {d['saved'] - acked} claims more than wrk saw "
                f"acknowledged, more than the {slack} that can be in flight when wrk stops")
    return {"facts": facts, "results": results}


class IdleClient:
    """harness/idle_client.py on CPU 1: `with IdleClient(...) as c:` holds c.opened
    idle keep-alive connections (each after one request, over TLS if tls) until the
    block ends."""

    def __init__(self, server, port, n, path, tls=False, h2=False):
        self.server, self.argv = server, [
            "taskset", "-c", CLIENT_CPU, sys.executable, "-B", os.path.join(HERE, "idle_client.py"),
            str(port), str(n), path, *(["--tls", TLS_NAME] if tls else []), *(["--h2"] if h2 else []),
        ]

    def __enter__(self):
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        if not ready.startswith("READY "):
            self._kill()
            raise BenchError(f"idle client failed against {self.server}: {ready!r}")
        r = json.loads(ready[6:])
        self.opened, self.failed, self.seconds = r["open"], r["failed"], r["seconds"]
        self.dropped = 0
        return self

    def __exit__(self, *exc):
        try:
            self.proc.stdin.write("close\n")
            self.proc.stdin.flush()
            done = self.proc.stdout.readline()
            if done.startswith("DONE "):
                self.dropped = json.loads(done[5:])["dropped_by_server"]
            self.proc.wait(timeout=60)
        finally:
            self._kill()

    def _kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class H3IdleClient:
    """bench/h3load -idle on CPU 1, with IdleClient's interface: `with H3IdleClient(...) as
    c:` holds c.opened idle QUIC connections (each after one request) until the block ends;
    then SIGTERM ends h3load's hold, and it tries one more request on each (one that fails
    was dropped by the server) and closes them."""

    HOLD_S = 600  # (the block ends it sooner)

    def __init__(self, server, port, n, path, ctx):
        self.server = server
        self.argv = ["taskset", "-c", CLIENT_CPU,
                     *h3load.idle_argv(ctx.h3load_bin, port, path, n, ctx.tls.ca, TLS_NAME, self.HOLD_S)]

    def __enter__(self):
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        ready = self.proc.stdout.readline()
        try:
            r = json.loads(ready)
            self.opened, self.failed, self.seconds = r["idle"], r["failed"], r["seconds"]
        except (ValueError, KeyError):
            self._kill()
            err = self.proc.stderr.read()[-600:]
            hint = " (h3load has no -idle: run scripts/install-h3-test-deps)" if "-idle" in err else ""
            raise BenchError(f"h3load -idle failed against {self.server}{hint}: {ready!r}\n{err}")
        self.dropped = 0
        return self

    def __exit__(self, *exc):
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            done = self.proc.stdout.readline()
            try:
                self.dropped = json.loads(done)["dropped"]
            except (ValueError, KeyError):
                pass
            self.proc.wait(timeout=120)
        finally:
            self._kill()

    def _kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


IDLE_WARMUP = 1000


def _settled_rss(inst, timeout=5.0):
    """The server's RSS once it has stopped changing (two equal readings 0.25 s apart)."""
    time.sleep(0.5)
    last = procs.rss_bytes(inst.pids())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = procs.rss_bytes(inst.pids())
        if now == last:
            break
        last = now
    return last


def idle_scenario(scenario, servers, settings, ctx):
    """RSS per idle keep-alive connection (HTTP/1.1, or HTTP/2 if scenario.h2, or QUIC
    with HTTP/3 if scenario.h3), on freshly restarted servers."""
    n = min(settings.idle_connections, scenario.connections)
    for s in servers:
        s.restart()  # fresh processes: earlier scenarios' buffers don't hide the cost
    skipped = {}

    def client(s, port, count):
        if scenario.h3:
            return H3IdleClient(s.name, port, count, scenario.path, ctx)
        return IdleClient(s.name, port, count, scenario.path, scenario.tls, scenario.h2)

    if scenario.h3:
        facts = check_h3(scenario, servers, ctx.docroot, ctx.tls, ctx.h3_python, ctx.h3load_bin)
        _log_h3_check(facts)
    elif scenario.h2:
        facts, skipped = check_h2(scenario, servers, ctx.docroot, ctx.tls)
        _log_h2_check(scenario, facts, skipped)
        servers = [s for s in servers if s.name in facts]
        context = tls_context(ctx.tls, alpn=["h2"]) if scenario.tls else None
    else:
        facts = check_scenario(scenario, servers, ctx.docroot, ctx.tls)
        context = tls_context(ctx.tls) if scenario.tls else None
    results = {}
    for s in servers:
        inst = s.instance(scenario)
        # Warm-up: 1000 connections (no more than are measured) come and go first, so
        # start-up transients (lazily built caches, allocator purges) are over before the
        # baseline is read.
        with client(s, inst.port, min(IDLE_WARMUP, n)):
            pass
        before = _settled_rss(inst)
        with client(s, inst.port, n) as c:
            after = _settled_rss(inst)
        if not inst.alive():
            raise BenchError(f"{s.name} died during {scenario.name}:\n{inst.log_tail()}")
        time.sleep(0.2)
        try:  # still answering after the crowd left?
            if scenario.h3:
                fetch_h3(ctx.h3_python, inst.port, scenario.path, {}, ctx.tls)
            elif scenario.h2:
                fetch_h2(inst.port, scenario.path, {}, tls=context)
            else:
                fetch(inst.port, scenario.path, {}, tls=context)
        except (OSError, ConnectionError, ValueError, NoHttp2, H2Error) as e:
            raise BenchError(f"{s.name} no longer answers after {scenario.name}'s idle connections: "
                             f"{type(e).__name__}: {e}")
        errors = {k: v for k, v in (("failed", c.failed), ("dropped", c.dropped)) if v}
        bpc = (after - before) / c.opened if c.opened else None
        results[s.name] = {
            "connections": c.opened,
            "rss_before": before,
            "rss_after": after,
            "bytes_per_conn": bpc,
            "connect_seconds": c.seconds,
            "errors": errors,
            "ok": not errors,
        }
        log(f"  {s.name}: {c.opened} idle connections, RSS {before / 2**20:.1f} → {after / 2**20:.1f} MiB"
            f" = {bpc or 0:.0f} B/conn" + (f"  errors {errors}" if errors else ""))
    return {"facts": facts, "results": results, "skipped": skipped}


RUNNERS = {"wrk": wrk_scenario, "tlsload": tlsload_scenario, "claims": claims_scenario, "idle": idle_scenario,
           "h2load": h2load_scenario, "h3load": h3load_scenario}
