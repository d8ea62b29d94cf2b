"""h2load (nghttp2's HTTP/2 load generator): its command line and its output.

    h2load -t1 -cC -mM -D S --log-file=F URL

Over TLS (https://localhost:PORT/…, so that SNI is the certificate's name) it offers
only ALPN h2 (--npn-list=h2): a server that does not choose h2 fails the run
instead of being measured over HTTP/1.1. On http:// it speaks h2c with prior
knowledge (its default, -p h2c). Stream and connection windows are its
defaults, 2^30 - 1 bytes (-w 30 -W 30): flow control never holds a server back.

h2load prints min/max/mean/sd of request times but no percentiles, so p50 and
p99 come from --log-file (one line per request: start µs, status, µs to the end
of the response; status -1 for a failed stream). h2load appends to that file, so
every run gets a new one.
"""

import re


def argv(port, path, connections, streams, tls_name=None, duration=None, requests=None, log_file=None):
    """h2load against 127.0.0.1:port; over TLS (h2) when tls_name is given, as the URL's
    host (so the SNI), else h2c. -D duration seconds, or -n requests."""
    out = ["h2load", "-t1", f"-c{connections}", f"-m{streams}"]
    out += [f"-D{duration}"] if duration else [f"-n{requests or 1}"]
    if tls_name:
        out.append("--npn-list=h2")
    if log_file:
        out.append(f"--log-file={log_file}")
    origin = f"https://{tls_name}" if tls_name else "http://127.0.0.1"
    return out + [f"{origin}:{port}{path}"]


def _duration_us(text):
    """h2load's durations: 1.00s, 31.43ms, 483us."""
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if not m:
        raise ValueError(f"unknown h2load duration {text!r}")
    return float(m.group(1)) * {"us": 1, "ms": 1e3, "s": 1e6}[m.group(2)]


def parse(stdout):
    """h2load's summary as a dict (None without one): requests (answers received:
    done - failed), duration_us, bytes (all it read, frames included), failed,
    errored, timed_out, status (4xx + 5xx), mean_us (request time), and the first
    connection's TLS and application protocol."""
    out = {}
    m = re.search(r"^finished in (\S+), ", stdout, re.M)
    r = re.search(r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
                  r"(\d+) errored, (\d+) timeout", stdout, re.M)
    s = re.search(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", stdout, re.M)
    t = re.search(r"^traffic: \S+ \((\d+)\) total", stdout, re.M)
    if not (m and r and s and t):
        return None
    done, failed = int(r.group(3)), int(r.group(5))
    out.update(
        duration_us=_duration_us(m.group(1).rstrip(",")),
        requests=done - failed,
        failed=failed,
        errored=int(r.group(6)),  # of the failed: streams ended with an error
        timed_out=int(r.group(7)),  # of the failed: timed out
        status=int(s.group(3)) + int(s.group(4)),
        bytes=int(t.group(1)),
    )
    lat = re.search(r"^time for request:\s+(\S+)\s+(\S+)\s+(\S+)", stdout, re.M)
    if lat:
        out["mean_us"] = _duration_us(lat.group(3))
    for key, label in (("tls_protocol", "TLS Protocol"), ("cipher", "Cipher"),
                       ("temp_key", "Server Temp Key"), ("protocol", "Application protocol")):
        f = re.search(rf"^{label}: (.*)$", stdout, re.M)
        out[key] = f.group(1).strip() if f else ""
    return out


def percentiles(log_file, ps=(50, 99)):
    """Percentiles (µs) of the request times of the successful requests in a log file,
    and how many there were."""
    with open(log_file) as f:
        fields = f.read().split()  # start, status, time; start, status, time; …
    times = [int(t) for status, t in zip(fields[1::3], fields[2::3]) if status != "-1"]
    if not times:
        return [0 for _ in ps], 0
    times.sort()
    return [times[min(len(times) - 1, max(0, -(-p * len(times) // 100) - 1))] for p in ps], len(times)
