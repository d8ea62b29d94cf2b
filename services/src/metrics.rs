//! Counters for `/statusz` (plain `key: value` lines) and `/metrics` (Prometheus text format).
//!
//! Counting is per worker (each on its own cache lines, single writer, no locked instruction);
//! the pages sum on demand, which is rare next to the increments.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_utils::CachePadded;
use tern_server::{
    Counter, RequestError, StatsSnapshot, UpstreamCounter, DURATION_BOUNDS, DURATION_BUCKETS,
    STATUS_CLASSES,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    /// One sample of a histogram: a bucket, the sum or the count ([`Metric::histogram`]).
    Histogram,
}

/// A label's value; made at run time for some (a policy rule's name, a site's), hence the
/// `Cow`.
pub type LabelValue = std::borrow::Cow<'static, str>;

/// One value for the pages. `name` is the name without `tern_` and, for a counter, without
/// `_total`: Prometheus's page adds both (a name that already ends in `_total` keeps one),
/// `/statusz` shows it as given. `labels` tell the values of one name apart (`with_label`).
#[derive(Debug, Clone)]
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricKind,
    pub labels: Vec<(&'static str, LabelValue)>,
    /// What follows the name in a histogram's sample (`_bucket`, `_sum`, `_count`); empty
    /// for counters and gauges.
    pub suffix: &'static str,
    pub value: f64,
    /// Shown on `/statusz` only: a total of series `/metrics` shows by label (Prometheus
    /// sums them itself, and a total beside its parts in one family would count twice).
    pub statusz_only: bool,
}

impl Metric {
    pub fn counter(name: &'static str, help: &'static str, value: u64) -> Metric {
        Metric {
            name,
            help,
            kind: MetricKind::Counter,
            labels: Vec::new(),
            suffix: "",
            value: value as f64,
            statusz_only: false,
        }
    }

    /// A counter of a quantity that is not a whole number (seconds spent).
    pub fn counter_f64(name: &'static str, help: &'static str, value: f64) -> Metric {
        Metric {
            kind: MetricKind::Counter,
            ..Metric::gauge(name, help, value)
        }
    }

    pub fn gauge(name: &'static str, help: &'static str, value: f64) -> Metric {
        Metric {
            name,
            help,
            kind: MetricKind::Gauge,
            labels: Vec::new(),
            suffix: "",
            value,
            statusz_only: false,
        }
    }

    /// Adds a `key="value"` label (after those already there). Keep the values few and
    /// fixed (causes, classes, configured names), never from requests: each one is a series
    /// Prometheus keeps.
    pub fn with_label(mut self, key: &'static str, value: impl Into<LabelValue>) -> Metric {
        self.labels.push((key, value.into()));
        self
    }

    /// The samples of one histogram series: a `_bucket` per upper bound (`le`, cumulative,
    /// then `+Inf`), `_sum` and `_count`. `bounds` are the `le` texts, `counts` the
    /// non-cumulative counts of each bucket (one more than `bounds`: the last is above every
    /// bound), `labels` the series' own (a site).
    pub fn histogram(
        name: &'static str,
        help: &'static str,
        labels: &[(&'static str, LabelValue)],
        bounds: &[&'static str],
        counts: &[u64],
        sum: f64,
    ) -> Vec<Metric> {
        debug_assert_eq!(counts.len(), bounds.len() + 1);
        let sample = |suffix: &'static str, value: f64| Metric {
            name,
            help,
            kind: MetricKind::Histogram,
            labels: labels.to_vec(),
            suffix,
            value,
            statusz_only: false,
        };
        let mut out = Vec::with_capacity(counts.len() + 2);
        let mut cumulative = 0;
        for (i, &n) in counts.iter().enumerate() {
            cumulative += n;
            let le = bounds.get(i).copied().unwrap_or("+Inf");
            out.push(sample("_bucket", cumulative as f64).with_label("le", le));
        }
        out.push(sample("_sum", sum));
        out.push(sample("_count", cumulative as f64));
        out
    }

    /// Shows the value on `/statusz` only ([`Metric::statusz_only`]).
    pub fn statusz_only(mut self) -> Metric {
        self.statusz_only = true;
        self
    }

    /// The name Prometheus's page gives its samples after `tern_` (a counter's with
    /// `_total`), without the histogram's suffix.
    fn family_name(&self) -> std::borrow::Cow<'static, str> {
        match self.kind {
            MetricKind::Counter if !self.name.ends_with("_total") => {
                format!("{}_total", self.name).into()
            }
            _ => self.name.into(),
        }
    }

    /// The name `/statusz` shows: the name as given (without the `_total` Prometheus's page
    /// adds) and the histogram sample's suffix.
    fn plain_name(&self) -> std::borrow::Cow<'static, str> {
        if self.suffix.is_empty() {
            self.name.into()
        } else {
            format!("{}{}", self.name, self.suffix).into()
        }
    }
}

fn write_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        let _ = write!(out, "{}", v as i64);
    } else {
        // The shortest text that reads back as the same number (no exponent).
        let _ = write!(out, "{v}");
    }
}

/// `{key="value",...}`, with `\`, `"` and line breaks escaped as the text format asks; nothing
/// without labels.
fn write_labels(out: &mut String, labels: &[(&'static str, LabelValue)]) {
    if labels.is_empty() {
        return;
    }
    out.push('{');
    for (i, (key, value)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(key);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

/// `name: value` per line, with the same names and labels as Prometheus's page but without
/// `tern_` and the `_total` it adds (`requests: 5`, `responses{class="2xx"}: 5`). Of a histogram only the
/// `_count` and `_sum` lines: its buckets are for Prometheus.
pub fn render_statusz(metrics: &[Metric]) -> String {
    let mut out = String::with_capacity(metrics.len() * 32);
    for m in metrics {
        if m.suffix == "_bucket" {
            continue;
        }
        out.push_str(&m.plain_name());
        write_labels(&mut out, &m.labels);
        out.push_str(": ");
        write_value(&mut out, m.value);
        out.push('\n');
    }
    out
}

/// Prometheus text exposition format 0.0.4: `# HELP` and `# TYPE` once per metric name
/// (the series of one name must be adjacent), names prefixed with `prefix`, counters ending
/// in `_total`.
pub fn render_prometheus(prefix: &str, metrics: &[Metric]) -> String {
    let mut out = String::with_capacity(metrics.len() * 96);
    let mut last: Option<&str> = None;
    // One HELP and TYPE per family, its samples together (the text format requires it),
    // whatever order the sources gave them in (e.g. two figures per certificate, one
    // certificate after the other): families in the order they first appear.
    let mut first_seen: Vec<&str> = Vec::new();
    for m in metrics {
        if !first_seen.contains(&m.name) {
            first_seen.push(m.name);
        }
    }
    let mut ordered: Vec<&Metric> = metrics.iter().filter(|m| !m.statusz_only).collect();
    ordered.sort_by_key(|m| first_seen.iter().position(|n| *n == m.name));
    for m in ordered {
        let family = m.family_name();
        if last != Some(m.name) {
            let kind = match m.kind {
                MetricKind::Counter => "counter",
                MetricKind::Gauge => "gauge",
                MetricKind::Histogram => "histogram",
            };
            let _ = writeln!(out, "# HELP {prefix}{family} {}", m.help);
            let _ = writeln!(out, "# TYPE {prefix}{family} {kind}");
            last = Some(m.name);
        }
        out.push_str(prefix);
        out.push_str(&family);
        out.push_str(m.suffix);
        write_labels(&mut out, &m.labels);
        out.push(' ');
        write_value(&mut out, m.value);
        out.push('\n');
    }
    out
}

/// A page of the server's and the process's counters, for a server without an app of its
/// own (a `counters` route of `tern run`): `name: value` lines, or Prometheus's format. Only
/// loopback peers and `trusted` ones see it; the counters tell an attacker which of its
/// tricks are caught.
pub struct CountersPage {
    stats: tern_server::Stats,
    started: Instant,
    prometheus: bool,
    trusted: crate::TrustedProxies,
    /// Figures of components above this crate (the proxy's health checks).
    more: Option<fn(&mut Vec<Metric>)>,
}

impl CountersPage {
    pub fn new(
        stats: tern_server::Stats,
        prometheus: bool,
        trusted: crate::TrustedProxies,
    ) -> CountersPage {
        CountersPage {
            stats,
            started: Instant::now(),
            prometheus,
            trusted,
            more: None,
        }
    }

    /// Adds the figures `more` appends to the page.
    pub fn with_more(self, more: fn(&mut Vec<Metric>)) -> CountersPage {
        CountersPage {
            more: Some(more),
            ..self
        }
    }
}

/// Whether `req` may read the counters: it comes from this machine or from a trusted proxy
/// itself, judged by the client's address through the trusted proxies (X-Forwarded-For,
/// Forwarded), never by the peer alone: a proxy on this machine relays the whole world's
/// requests from a loopback address. A request relayed by a peer that is not trusted (it
/// names someone it forwards for) is refused, since its client cannot be known.
pub fn may_read_counters(req: &tern_server::Request<'_>, trusted: &crate::TrustedProxies) -> bool {
    let peer = req.peer.ip().to_canonical();
    if !trusted.is_trusted(peer) {
        let relayed = ["x-forwarded-for", "forwarded", "x-real-ip"]
            .iter()
            .any(|name| req.header(name).is_some());
        return peer.is_loopback() && !relayed;
    }
    let client = trusted.client_ip(req.peer, req.head);
    client.is_loopback() || trusted.is_trusted(client)
}

/// The answer to a request [`may_read_counters`] refuses.
pub fn counters_refused() -> tern_server::Response {
    tern_server::Response::text(403, "counters are for this machine only\n")
}

impl tern_server::Handler for CountersPage {
    fn handle(
        &self,
        req: &tern_server::Request<'_>,
        _: &mut tern_server::HandlerContext<'_>,
    ) -> tern_server::Reply {
        if !may_read_counters(req, &self.trusted) {
            return counters_refused().into();
        }
        let mut all = server_metrics(&self.stats.snapshot());
        if let Some(more) = self.more {
            more(&mut all);
        }
        all.extend(process_metrics(self.started));
        page(&all, self.prometheus).into()
    }
}

/// A counters page: `name: value` lines (`/statusz`) or Prometheus's format (`/metrics`),
/// never cached.
pub fn page(metrics: &[Metric], prometheus: bool) -> tern_server::Response {
    let text = if prometheus {
        render_prometheus("tern_", metrics)
    } else {
        render_statusz(metrics)
    };
    tern_server::Response::new(200)
        .with_header("Content-Type", "text/plain; charset=utf-8")
        .with_header("Cache-Control", "no-store")
        .with_body(tern_server::Body::Owned(text.into_bytes()))
}

/// The server layer's counters: connections, requests, timeouts, bad requests by cause, the
/// upstream exchanges by group, and answers by site, route and class with the
/// request-duration histogram of each route.
pub fn server_metrics(s: &StatsSnapshot) -> Vec<Metric> {
    // Counters of one name are adjacent in `Counter::ALL`, as the page needs.
    let mut out: Vec<Metric> = Counter::ALL
        .iter()
        .map(|&c| {
            let m = Metric::counter(c.name(), c.help(), s.get(c));
            match c.label() {
                Some((key, value)) => m.with_label(key, value),
                None => m,
            }
        })
        .collect();
    out.push(Metric::gauge(
        "connections_open",
        "TCP connections open now",
        s.open_connections() as f64,
    ));
    out.push(Metric::gauge(
        "compress_encoder_bytes",
        "state of the streaming encoders in flight (answers compressed on the fly), as \
         charged to the workers' budgets",
        s.encoder_bytes as f64,
    ));
    out.push(Metric::gauge(
        "compress_encoder_budget_bytes",
        "the most streaming-encoder state the workers hold at once",
        s.encoder_budget as f64,
    ));
    for e in RequestError::ALL {
        out.push(
            Metric::counter(
                "bad_requests",
                "requests refused as malformed, by cause",
                s.bad(e),
            )
            .with_label("cause", e.name()),
        );
    }
    out.extend(upstream_metrics(s));
    out.extend(answer_metrics(s));
    out
}

/// The upstream counters by group (`upstream="SITE ROUTE"`, as the health figures). A
/// server without named groups shows one unlabelled series per counter; with groups,
/// `/statusz` also shows the process's total as the unlabelled line it always had.
/// Exchanges of no named group (none in `tern run`) show as `upstream=""` once there are some.
fn upstream_metrics(s: &StatsSnapshot) -> Vec<Metric> {
    let labelled = s.upstreams.len() > 1;
    let mut out = Vec::with_capacity(UpstreamCounter::ALL.len() * (s.upstreams.len() + 1));
    for c in UpstreamCounter::ALL {
        let with_cause = |m: Metric| match c.label() {
            Some((key, value)) => m.with_label(key, value),
            None => m,
        };
        if labelled {
            out.push(
                with_cause(Metric::counter(c.name(), c.help(), s.upstream_total(c))).statusz_only(),
            );
        }
        for (row, group) in s.upstreams.iter().enumerate() {
            let n = group.get(c);
            if !labelled {
                out.push(with_cause(Metric::counter(c.name(), c.help(), n)));
            } else if row > 0 || group.counts.iter().any(|&n| n > 0) {
                let m = Metric::counter(c.name(), c.help(), n)
                    .with_label("upstream", group.name.clone());
                out.push(with_cause(m));
            }
        }
    }
    out
}

/// Answers by class and the duration histogram, per route (each row of figures: a route's,
/// or a site's own for its answers no route took, `route=""`). A server without sites (`tern
/// serve`, `tern demo`) has only the row of no site and shows neither label; with sites
/// (`tern run`) every row has both, `site=""` for answers no site took (bad input, a host no
/// site serves). `/statusz` also shows each site's sums, the lines it had before routes.
fn answer_metrics(s: &StatsSnapshot) -> Vec<Metric> {
    const RESPONSES_HELP: &str = "answers sent, by site, route and status class";
    const DURATION_HELP: &str = "time from a request's arrival to its answer being ready to \
                                 send (a proxied answer: to the upstream's last byte), by site \
                                 and route";
    let bounds = DURATION_BOUNDS.map(|(_, le)| le);
    if s.answers.len() <= 1 {
        let mut out = Vec::new();
        for figures in &s.answers {
            for (class, &n) in STATUS_CLASSES.iter().zip(&figures.responses) {
                out.push(
                    Metric::counter("responses", RESPONSES_HELP, n).with_label("class", *class),
                );
            }
            out.extend(Metric::histogram(
                "request_duration_seconds",
                DURATION_HELP,
                &[],
                &bounds,
                &figures.buckets,
                figures.sum_us as f64 / 1e6,
            ));
        }
        return out;
    }
    // Sites in the order their rows come, each followed by its routes.
    let mut sites: Vec<&str> = Vec::new();
    for f in &s.answers {
        if !sites.contains(&f.site.as_str()) {
            sites.push(&f.site);
        }
    }
    fn rows_of<'a>(
        s: &'a StatsSnapshot,
        site: &'a str,
    ) -> impl Iterator<Item = &'a tern_server::AnswerFigures> {
        s.answers.iter().filter(move |f| f.site == site)
    }
    let mut out = Vec::with_capacity(
        (s.answers.len() + sites.len()) * (STATUS_CLASSES.len() + DURATION_BUCKETS + 2),
    );
    for &site in &sites {
        let mut sum = [0; STATUS_CLASSES.len()];
        for f in rows_of(s, site) {
            for (total, n) in sum.iter_mut().zip(f.responses) {
                *total += n;
            }
        }
        for (class, &n) in STATUS_CLASSES.iter().zip(&sum) {
            out.push(
                Metric::counter("responses", RESPONSES_HELP, n)
                    .with_label("site", site.to_owned())
                    .with_label("class", *class)
                    .statusz_only(),
            );
        }
        for f in rows_of(s, site) {
            for (class, &n) in STATUS_CLASSES.iter().zip(&f.responses) {
                out.push(
                    Metric::counter("responses", RESPONSES_HELP, n)
                        .with_label("site", f.site.clone())
                        .with_label("route", f.route.clone())
                        .with_label("class", *class),
                );
            }
        }
    }
    for &site in &sites {
        let mut buckets = [0; DURATION_BUCKETS];
        let mut sum_us = 0;
        for f in rows_of(s, site) {
            for (total, n) in buckets.iter_mut().zip(f.buckets) {
                *total += n;
            }
            sum_us += f.sum_us;
        }
        out.extend(
            Metric::histogram(
                "request_duration_seconds",
                DURATION_HELP,
                &[("site", site.to_owned().into())],
                &bounds,
                &buckets,
                sum_us as f64 / 1e6,
            )
            .into_iter()
            .map(Metric::statusz_only),
        );
        for f in rows_of(s, site) {
            out.extend(Metric::histogram(
                "request_duration_seconds",
                DURATION_HELP,
                &[
                    ("site", f.site.clone().into()),
                    ("route", f.route.clone().into()),
                ],
                &bounds,
                &f.buckets,
                f.sum_us as f64 / 1e6,
            ));
        }
    }
    out
}

/// Process-wide values a higher layer adds to [`process_metrics`] (the binary adds the
/// sandbox's refused system calls), set once at start-up.
static PROCESS_COUNTERS: std::sync::OnceLock<Vec<fn() -> Metric>> = std::sync::OnceLock::new();

/// Adds `counters` to every [`process_metrics`]; only the first call counts.
pub fn add_process_metrics(counters: Vec<fn() -> Metric>) {
    let _ = PROCESS_COUNTERS.set(counters);
}

type MetricsSource = Box<dyn Fn() -> Vec<Metric> + Send + Sync>;

/// Components that bring their own counters to every page (the gateway guarding a site whose
/// app serves /statusz), added at start-up.
static SOURCES: std::sync::Mutex<Vec<MetricsSource>> = std::sync::Mutex::new(Vec::new());

/// Adds a component's counters to every [`process_metrics`].
pub fn add_metrics_source(source: impl Fn() -> Vec<Metric> + Send + Sync + 'static) {
    SOURCES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Box::new(source));
}

/// Uptime, resident memory, and what [`add_process_metrics`] and [`add_metrics_source`]
/// added.
pub fn process_metrics(started: Instant) -> Vec<Metric> {
    vec![
        Metric::gauge(
            "uptime_seconds",
            "seconds since the server started",
            started.elapsed().as_secs() as f64,
        ),
        Metric::gauge(
            "resident_memory_bytes",
            "resident set size of the process",
            rss_bytes() as f64,
        ),
    ]
    .into_iter()
    .chain(PROCESS_COUNTERS.get().into_iter().flatten().map(|c| c()))
    .chain(
        SOURCES
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .flat_map(|source| source()),
    )
    .collect()
}

/// Resident set size from /proc/self/statm (0 where unavailable). The file is opened once,
/// on the first call (before a sandbox hides /proc), and read with `pread` after that.
pub fn rss_bytes() -> u64 {
    use std::os::unix::fs::FileExt;
    static STATM: std::sync::OnceLock<Option<std::fs::File>> = std::sync::OnceLock::new();
    let Some(file) = STATM.get_or_init(|| std::fs::File::open("/proc/self/statm").ok()) else {
        return 0;
    };
    let mut buf = [0u8; 128];
    let Ok(n) = file.read_at(&mut buf, 0) else {
        return 0;
    };
    let pages: u64 = std::str::from_utf8(&buf[..n])
        .unwrap_or("")
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no memory-safety preconditions; it only reads a constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page.max(0) as u64
}

/// An app's own counters: `N` named values per slot (one slot per worker, plus any for
/// background threads), each slot written by one thread only.
pub struct AppCounters<const N: usize> {
    names: &'static [(&'static str, &'static str); N],
    slots: Arc<[CachePadded<[AtomicU64; N]>]>,
}

impl<const N: usize> Clone for AppCounters<N> {
    fn clone(&self) -> Self {
        AppCounters {
            names: self.names,
            slots: self.slots.clone(),
        }
    }
}

impl<const N: usize> AppCounters<N> {
    /// `names` are (metric name, help) pairs; index `i` of `add` is `names[i]`.
    pub fn new(names: &'static [(&'static str, &'static str); N], slots: usize) -> Self {
        AppCounters {
            names,
            slots: (0..slots.max(1))
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }

    /// Adds `n` to counter `index` of `slot`. Only one thread may write a given slot.
    #[inline]
    pub fn add(&self, slot: usize, index: usize, n: u64) {
        let a = &self.slots[slot][index];
        a.store(a.load(Ordering::Relaxed) + n, Ordering::Relaxed);
    }

    /// Sets counter `index` of `slot` (for a gauge such as the last batch size).
    pub fn set(&self, slot: usize, index: usize, v: u64) {
        self.slots[slot][index].store(v, Ordering::Relaxed);
    }

    pub fn sum(&self, index: usize) -> u64 {
        self.slots
            .iter()
            .map(|s| s[index].load(Ordering::Relaxed))
            .sum()
    }

    pub fn metrics(&self) -> Vec<Metric> {
        self.names
            .iter()
            .enumerate()
            .map(|(i, (name, help))| Metric::counter(name, help, self.sum(i)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static NAMES: [(&str, &str); 2] = [("claims", "claims committed"), ("batches", "batches")];

    /// A source that gives two figures per certificate, one certificate after the other:
    /// each family still gets one HELP and TYPE, and its samples stay together.
    #[test]
    fn interleaved_families_are_grouped() {
        let metrics: Vec<Metric> = ["a.test", "b.test"]
            .iter()
            .flat_map(|n| {
                [
                    Metric::gauge("expiry_seconds", "to expiry", 1.0).with_label("name", *n),
                    Metric::gauge("renewal_seconds", "to renewal", 2.0).with_label("name", *n),
                ]
            })
            .collect();
        let page = render_prometheus("tern_", &metrics);
        assert_eq!(
            page.matches("# HELP tern_expiry_seconds ").count(),
            1,
            "{page}"
        );
        assert_eq!(
            page.matches("# HELP tern_renewal_seconds ").count(),
            1,
            "{page}"
        );
        let lines: Vec<&str> = page.lines().filter(|l| !l.starts_with('#')).collect();
        assert!(
            lines[0].starts_with("tern_expiry_seconds{name=\"a.test\"}"),
            "{page}"
        );
        assert!(
            lines[1].starts_with("tern_expiry_seconds{name=\"b.test\"}"),
            "{page}"
        );
        assert!(
            lines[2].starts_with("tern_renewal_seconds{name=\"a.test\"}"),
            "{page}"
        );
    }

    #[test]
    fn counters_sum_over_slots() {
        let c = AppCounters::new(&NAMES, 3);
        c.add(0, 0, 2);
        c.add(2, 0, 3);
        c.add(1, 1, 1);
        assert_eq!(c.sum(0), 5);
        assert_eq!(c.sum(1), 1);
        c.set(1, 1, 7);
        assert_eq!(c.sum(1), 7);
    }

    #[test]
    fn slots_do_not_share_cache_lines() {
        let c = AppCounters::new(&NAMES, 2);
        let a = &c.slots[0] as *const _ as usize;
        let b = &c.slots[1] as *const _ as usize;
        assert!(b - a >= 64);
    }

    #[test]
    fn counters_are_for_this_machine_judged_through_trusted_proxies() {
        let may = |peer: &str, trusted: &str, extra: &str| {
            let raw = format!("GET /statusz HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
            let trusted = crate::TrustedProxies::parse(trusted).unwrap();
            tern_server::testing::with_request(
                raw.as_bytes(),
                peer.parse().unwrap(),
                false,
                |req| may_read_counters(req, &trusted),
            )
        };
        let nginx = "127.0.0.1, ::1";
        // This machine, asking directly.
        assert!(may("127.0.0.1:5", "", ""));
        assert!(may("[::1]:5", nginx, ""));
        assert!(!may("203.0.113.9:5", "", ""));
        // Through a trusted proxy: whoever it says the client is.
        assert!(!may(
            "127.0.0.1:5",
            nginx,
            "X-Forwarded-For: 203.0.113.9\r\n"
        ));
        assert!(!may(
            "127.0.0.1:5",
            nginx,
            "X-Forwarded-For: 127.0.0.1, 203.0.113.9\r\n"
        ));
        assert!(!may("127.0.0.1:5", nginx, "Forwarded: for=203.0.113.9\r\n"));
        assert!(may("127.0.0.1:5", nginx, "X-Forwarded-For: 127.0.0.1\r\n"));
        // A monitoring host listed as trusted may ask itself.
        assert!(may("10.0.0.5:5", "10.0.0.5", ""));
        assert!(!may(
            "10.0.0.5:5",
            "10.0.0.5",
            "X-Forwarded-For: 198.51.100.1\r\n"
        ));
        // A proxy on this machine that is not trusted: its client is unknown, so no.
        for relayed in [
            "X-Forwarded-For: 127.0.0.1\r\n",
            "Forwarded: for=127.0.0.1\r\n",
            "X-Real-IP: 127.0.0.1\r\n",
        ] {
            assert!(!may("127.0.0.1:5", "", relayed), "{relayed}");
        }
    }

    #[test]
    fn pages_render() {
        let m = vec![
            Metric::counter("requests", "requests served", 42),
            Metric::counter("bad_requests", "by cause", 1).with_label("cause", "bare_lf"),
            Metric::counter("bad_requests", "by cause", 2).with_label("cause", "no_host"),
            Metric::counter_f64("sync_seconds_total", "time syncing", 0.25),
            Metric::gauge("uptime_seconds", "uptime", 1.5),
        ];
        assert_eq!(
            render_statusz(&m),
            "requests: 42\nbad_requests{cause=\"bare_lf\"}: 1\n\
             bad_requests{cause=\"no_host\"}: 2\nsync_seconds_total: 0.25\nuptime_seconds: 1.5\n"
        );
        let p = render_prometheus("tern_", &m);
        assert!(p.starts_with(
            "# HELP tern_requests_total requests served\n# TYPE tern_requests_total counter\n\
             tern_requests_total 42\n"
        ));
        assert_eq!(
            p.matches("# TYPE tern_bad_requests_total counter").count(),
            1
        );
        assert!(p.contains("tern_bad_requests_total{cause=\"no_host\"} 2\n"));
        // A name that already says `_total` keeps one.
        assert!(
            p.contains("# TYPE tern_sync_seconds_total counter\ntern_sync_seconds_total 0.25\n")
        );
        assert!(p.contains("# TYPE tern_uptime_seconds gauge\ntern_uptime_seconds 1.5\n"));
    }

    #[test]
    fn labels_are_escaped_and_listed_in_order() {
        let m = [Metric::gauge("g", "h", 1.0)
            .with_label("site", "a\"b\\c\nd")
            .with_label("class", "2xx")];
        assert_eq!(
            render_prometheus("t_", &m).lines().last(),
            Some(r#"t_g{site="a\"b\\c\nd",class="2xx"} 1"#)
        );
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_a_sum_and_a_count() {
        let site = [("site", LabelValue::from("blog"))];
        let mut m = Metric::histogram(
            "latency_seconds",
            "h",
            &site,
            &["0.1", "1"],
            &[2, 3, 4],
            7.5,
        );
        m.extend(Metric::histogram(
            "latency_seconds",
            "h",
            &[],
            &["0.1", "1"],
            &[0, 0, 0],
            0.0,
        ));
        let p = render_prometheus("tern_", &m);
        assert_eq!(
            p,
            "# HELP tern_latency_seconds h\n# TYPE tern_latency_seconds histogram\n\
             tern_latency_seconds_bucket{site=\"blog\",le=\"0.1\"} 2\n\
             tern_latency_seconds_bucket{site=\"blog\",le=\"1\"} 5\n\
             tern_latency_seconds_bucket{site=\"blog\",le=\"+Inf\"} 9\n\
             tern_latency_seconds_sum{site=\"blog\"} 7.5\n\
             tern_latency_seconds_count{site=\"blog\"} 9\n\
             tern_latency_seconds_bucket{le=\"0.1\"} 0\n\
             tern_latency_seconds_bucket{le=\"1\"} 0\n\
             tern_latency_seconds_bucket{le=\"+Inf\"} 0\n\
             tern_latency_seconds_sum 0\n\
             tern_latency_seconds_count 0\n"
        );
        // /statusz: the count and the sum, no buckets.
        assert_eq!(
            render_statusz(&m[..5]),
            "latency_seconds_sum{site=\"blog\"}: 7.5\nlatency_seconds_count{site=\"blog\"}: 9\n"
        );
    }

    #[test]
    fn server_figures_are_labelled_by_site_and_route_only_when_there_are_sites() {
        let stats = tern_server::Stats::new(1);
        let plain = server_metrics(&stats.snapshot());
        let classes: Vec<_> = plain.iter().filter(|m| m.name == "responses").collect();
        assert_eq!(classes.len(), 5);
        assert!(classes
            .iter()
            .all(|m| m.labels.len() == 1 && m.labels[0].0 == "class"));
        let page = render_prometheus("tern_", &plain);
        assert!(
            page.contains("tern_request_duration_seconds_count 0\n"),
            "{page}"
        );
        assert!(page.contains("tern_upstream_connects_total 0\n"), "{page}");
        assert!(page.contains("tern_upstream_retries_total{cause=\"status\"} 0\n"));
        assert_eq!(
            render_statusz(&plain).matches("upstream_connects").count(),
            1
        );

        let blog = stats.site("blog");
        stats.route(blog, "/");
        stats.route(blog, "api");
        let sited = server_metrics(&stats.snapshot());
        let page = render_prometheus("tern_", &sited);
        assert!(
            page.contains("tern_responses_total{site=\"\",route=\"\",class=\"2xx\"} 0\n"),
            "{page}"
        );
        assert!(page.contains("tern_responses_total{site=\"blog\",route=\"\",class=\"4xx\"} 0\n"));
        assert!(
            page.contains("tern_responses_total{site=\"blog\",route=\"api\",class=\"5xx\"} 0\n")
        );
        assert!(page.contains(
            "tern_request_duration_seconds_bucket{site=\"blog\",route=\"/\",le=\"+Inf\"} 0\n"
        ));
        // No site-only series beside the routes' on /metrics: they would count twice.
        assert!(!page.contains("{site=\"blog\",class="), "{page}");
        assert!(!page.contains("_count{site=\"blog\"}"), "{page}");
        assert!(page.contains("tern_timeouts_total{kind=\"header\"} 0\n"));
        assert!(page.contains("tern_tls_handshake_failures_total{cause=\"plain_http\"} 0\n"));
        // Each name's HELP and TYPE once: its series are adjacent.
        for line in page.lines().filter(|l| l.starts_with("# TYPE")) {
            assert_eq!(page.matches(&format!("{line}\n")).count(), 1, "{line}");
        }
    }

    #[test]
    fn statusz_keeps_the_sites_sums_beside_the_routes() {
        let stats = tern_server::Stats::new(1);
        let blog = stats.site("blog");
        let shop = stats.site("shop");
        stats.route(blog, "/");
        stats.route(shop, "/api");
        stats.route(blog, "/feed");
        let page = render_statusz(&server_metrics(&stats.snapshot()));
        let lines: Vec<&str> = page
            .lines()
            .filter(|l| l.starts_with("responses{") && l.contains("class=\"2xx\""))
            .collect();
        assert_eq!(
            lines,
            [
                "responses{site=\"\",class=\"2xx\"}: 0",
                "responses{site=\"\",route=\"\",class=\"2xx\"}: 0",
                "responses{site=\"blog\",class=\"2xx\"}: 0",
                "responses{site=\"blog\",route=\"\",class=\"2xx\"}: 0",
                "responses{site=\"blog\",route=\"/\",class=\"2xx\"}: 0",
                "responses{site=\"blog\",route=\"/feed\",class=\"2xx\"}: 0",
                "responses{site=\"shop\",class=\"2xx\"}: 0",
                "responses{site=\"shop\",route=\"\",class=\"2xx\"}: 0",
                "responses{site=\"shop\",route=\"/api\",class=\"2xx\"}: 0",
            ]
        );
        assert!(page.contains("\nrequest_duration_seconds_count{site=\"blog\"}: 0\n"));
        assert!(page.contains("\nrequest_duration_seconds_sum{site=\"blog\",route=\"/feed\"}: 0\n"));
    }

    #[test]
    fn upstream_counters_are_labelled_by_group_with_totals_on_statusz() {
        let stats = tern_server::Stats::new(2);
        let api = stats.upstream("shop /api");
        let wiki = stats.upstream("wiki /");
        // What the relay counts for a group: a worker's single-writer cells.
        let counted = [
            (0, api, tern_server::UpstreamCounter::Connects),
            (1, api, tern_server::UpstreamCounter::Connects),
            (1, wiki, tern_server::UpstreamCounter::Connects),
            (0, wiki, tern_server::UpstreamCounter::RetriesConnect),
        ];
        for (worker, row, c) in counted {
            stats.worker(worker).bump_upstream(row, c);
        }
        let metrics = server_metrics(&stats.snapshot());
        let page = render_prometheus("tern_", &metrics);
        assert!(
            page.contains("\ntern_upstream_connects_total{upstream=\"shop /api\"} 2\n"),
            "{page}"
        );
        assert!(page.contains("\ntern_upstream_connects_total{upstream=\"wiki /\"} 1\n"));
        assert!(page
            .contains("\ntern_upstream_retries_total{upstream=\"wiki /\",cause=\"connect\"} 1\n"));
        assert!(page.contains(
            "\ntern_upstream_tls_failures_total{upstream=\"shop /api\",cause=\"unknown_ca\"} 0\n"
        ));
        // Neither a total nor the row of no group (empty) beside the groups.
        assert!(!page.contains("\ntern_upstream_connects_total "), "{page}");
        assert!(!page.contains("upstream=\"\""), "{page}");
        let statusz = render_statusz(&metrics);
        for line in [
            "upstream_connects: 3",
            "upstream_connects{upstream=\"shop /api\"}: 2",
            "upstream_retries{cause=\"connect\"}: 1",
            "upstream_retries{upstream=\"wiki /\",cause=\"connect\"}: 1",
        ] {
            assert!(statusz.lines().any(|l| l == line), "{line}:\n{statusz}");
        }
        // Counted without a named group: shown, as upstream="".
        stats.worker(0).bump_upstream(
            tern_server::UpstreamRow::NONE,
            tern_server::UpstreamCounter::Reuses,
        );
        let page = render_prometheus("tern_", &server_metrics(&stats.snapshot()));
        assert!(
            page.contains("\ntern_upstream_reuses_total{upstream=\"\"} 1\n"),
            "{page}"
        );
        assert!(page.contains("\ntern_upstream_connects_total{upstream=\"\"} 0\n"));
    }

    #[test]
    fn rss_is_measured() {
        assert!(rss_bytes() > 1024 * 1024);
    }
}
