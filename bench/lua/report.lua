-- Appended by bench/run to every wrk script (wrk runs one script per run);
-- bench/run also defines BENCH_CONNECTIONS above it. Prints one line that
-- bench/run parses; keep the BENCHJSON prefix.
--
-- Latency: wrk 4.1 "corrects" its histogram for coordinated omission after
-- the run (stats_correct in wrk.c adds synthetic samples below every sample
-- longer than twice the mean interval) and its percentile() then skips the
-- synthetic samples below the minimum, returning 0 for p99 in pipelined runs.
-- We undo that correction and report percentiles of the latencies wrk really
-- measured (as h2load does). Under pipelining wrk times one write of N
-- requests, so latency there is per batch. All times are in microseconds;
-- errors.status counts responses with status > 399.

local function raw_percentiles(summary, latency, ps)
  local buckets = #latency
  local lo, hi = latency.min, latency.max
  if buckets == 0 or buckets * (hi - lo + 1) > 3e9 then
    return nil -- too costly to walk (latency(i) is linear in i); caller falls back
  end
  local data, values = {}, {}
  for i = 1, buckets do
    local v, c = latency(i)
    data[v] = c
    values[i] = v
  end
  -- wrk: interval = runtime_us / (complete / connections), integer arithmetic
  local per_conn = math.floor(summary.requests / BENCH_CONNECTIONS)
  local e = per_conn > 0 and math.floor(summary.duration / per_conn) or 0
  local raw, corr, total = {}, {}, 0
  for i = buckets, 1, -1 do -- from the top down: corrections only flow downwards
    local v = values[i]
    local r = data[v] - (corr[v] or 0)
    raw[v] = r
    total = total + r
    if e > 0 and v >= 2 * e and r > 0 then
      local m = v - e
      while m > e and m >= lo do
        corr[m] = (corr[m] or 0) + r
        m = m - e
      end
    end
  end
  local out, acc, k = {}, 0, 1
  for i = 1, buckets do
    local v = values[i]
    acc = acc + raw[v]
    while k <= #ps and acc >= ps[k] / 100 * total do
      out[k] = v
      k = k + 1
    end
  end
  return out
end

done = function(summary, latency, requests)
  local e = summary.errors
  local p = raw_percentiles(summary, latency, { 50, 99 })
  local corrected = 0
  if not p then
    p = { latency:percentile(50), latency:percentile(99) }
    corrected = 1
  end
  io.write(string.format(
    'BENCHJSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d,' ..
    '"p50_us":%d,"p99_us":%d,"max_us":%d,"wrk_corrected":%d}\n',
    summary.requests, summary.duration, summary.bytes,
    e.connect, e.read, e.write, e.status, e.timeout,
    p[1] or 0, p[2] or 0, latency.max, corrected))
end
