//! h3load-quinn: an HTTP/3 load generator for tern's benchmark (rows h3-small and h3-large) on
//! quinn-proto, in one thread, so that one core of load can saturate one core of server.
//! bench/h3load (quic-go) spends 17–25 µs of its core per small answer, more than tern
//! spends serving one, so it could not: this client drives every connection from one event
//! loop, reads datagrams with recvmmsg and GRO, sends with GSO, frames its requests once, and
//! reads each answer's frames in place (only `:status` decoded, the body counted).
//!
//!     h3load-quinn [-c connections] [-m streams] [-d duration | -n requests] -ca FILE
//!                  [-sni NAME] [-H 'name: value']... [-timeout D] [-no-gro] URL [URL...]
//!
//! Its command line and its one line of JSON on stdout are bench/h3load's (see its main.go):
//! requests, ok, errors, bytes, seconds, rps, p50_us, p99_us, cpu_seconds, tls. The
//! handshakes are made before the clock starts; with -d, requests ending after the deadline
//! are not counted; a connection that ends is dialled again. TLS 1.3 with x25519 alone, ALPN
//! h3, the server's certificate checked against -ca. It pins no CPU: run it under taskset.
//! -no-gro turns the kernel's UDP GRO off on its sockets, to see what receiving each
//! datagram apart costs (on loopback, the sender pays for splitting its GSO batches then).

mod answer;
mod client;
mod histogram;

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use quinn_proto::crypto::rustls::QuicClientConfig;
use quinn_proto::{ClientConfig, IdleTimeout, TransportConfig, VarInt};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use tern_http3::frame::{self, kind};
use tern_http3::qpack;

use client::{Client, Load, RecvBuffers};
use histogram::Histogram;

/// What the run counted.
pub struct Tally {
    /// Requests end inside the run's window only after `start` and before `deadline`.
    start: Option<Instant>,
    deadline: Option<Instant>,
    requests: u64,
    ok: u64,
    errors: u64,
    /// Answer body bytes received while the run was on, also those of answers it cut.
    pub bytes: u64,
    times: Histogram,
    reported: u32,
}

impl Tally {
    /// Whether `now` is inside the run's window.
    pub fn counting(&self, now: Instant) -> bool {
        self.start.is_some() && self.deadline.is_none_or(|d| now <= d)
    }

    /// A request opened at `started` ended at `now`: `Ok` with a 2xx answer read whole,
    /// else why not (the first 10 are told on stderr).
    pub fn finish(&mut self, outcome: Result<(), String>, started: Instant, now: Instant) {
        if !self.counting(now) {
            return;
        }
        self.requests += 1;
        match outcome {
            Ok(()) => {
                self.ok += 1;
                self.times
                    .record(now.duration_since(started).as_micros() as u64);
            }
            Err(why) => {
                self.errors += 1;
                if self.reported < 10 {
                    self.reported += 1;
                    eprintln!("h3load-quinn: a request failed: {why}");
                }
            }
        }
    }
}

struct Args {
    connections: usize,
    streams: usize,
    duration: Option<Duration>,
    requests: Option<u64>,
    ca: String,
    sni: Option<String>,
    headers: Vec<(String, String)>,
    timeout: Duration,
    /// -no-gro: the kernel's UDP GRO off (on by default, as quinn-udp sets it).
    gro: bool,
    urls: Vec<String>,
}

const USAGE: &str = "usage: h3load-quinn [-c N] [-m N] [-d DURATION | -n N] -ca FILE [-sni NAME] \
                     [-H 'name: value']... [-timeout D] [-no-gro] URL [URL...]";

fn duration(s: &str) -> Option<Duration> {
    let (n, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = n.parse().ok()?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return None,
    };
    (secs >= 0.0).then(|| Duration::from_secs_f64(secs))
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        connections: 1,
        streams: 1,
        duration: None,
        requests: None,
        ca: String::new(),
        sni: None,
        headers: Vec::new(),
        timeout: Duration::from_secs(30),
        gro: true,
        urls: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if !a.starts_with('-') {
            args.urls.push(a);
            continue;
        }
        if a.trim_start_matches('-') == "no-gro" {
            args.gro = false;
            continue;
        }
        let value = it.next().ok_or(format!("{a} needs a value"))?;
        let bad = || format!("{a} {value:?}: not a valid value");
        match a.trim_start_matches('-') {
            "c" => args.connections = value.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?,
            "m" => args.streams = value.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?,
            "d" => args.duration = Some(duration(&value).ok_or_else(bad)?),
            "n" => args.requests = Some(value.parse().ok().filter(|&n| n > 0).ok_or_else(bad)?),
            "ca" => args.ca = value,
            "sni" => args.sni = Some(value),
            "timeout" => args.timeout = duration(&value).ok_or_else(bad)?,
            "H" => {
                let (name, v) = value.split_once(':').ok_or_else(bad)?;
                args.headers
                    .push((name.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
            _ => return Err(format!("unknown flag {a}")),
        }
    }
    if args.urls.is_empty() || args.ca.is_empty() {
        return Err("a URL and -ca are needed".into());
    }
    if args.duration.is_some() && args.requests.is_some() {
        return Err("-d and -n exclude each other".into());
    }
    if args.duration.is_none() && args.requests.is_none() {
        args.requests = Some(1);
    }
    Ok(args)
}

/// `https://authority/path` → (authority, path).
fn split_url(url: &str) -> Result<(&str, &str), String> {
    let rest = url
        .strip_prefix("https://")
        .ok_or(format!("{url:?}: not an https:// URL"))?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if authority.is_empty() {
        return Err(format!("{url:?}: no host"));
    }
    Ok((authority, if path.is_empty() { "/" } else { path }))
}

/// A GET's HEADERS frame, made once and sent as is for every request to that URL.
fn request_frame(authority: &str, path: &str, headers: &[(String, String)]) -> Vec<u8> {
    let mut section = Vec::new();
    qpack::begin_section(&mut section);
    let mut fields = vec![
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", authority),
        (":path", path),
    ];
    if !headers.iter().any(|(n, _)| n == "user-agent") {
        fields.push(("user-agent", "h3load-quinn"));
    }
    fields.extend(headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    for (name, value) in fields {
        qpack::encode_field(name.as_bytes(), value.as_bytes(), false, &mut section);
    }
    let mut out = Vec::new();
    frame::write_header(&mut out, kind::HEADERS, section.len() as u64);
    out.extend(section);
    out
}

/// TLS 1.3, x25519 alone (as h2load's and tlsload's OpenSSL 3.0 and bench/h3load offer), ALPN
/// h3, the server checked against `ca`; flow-control windows a server never waits on (64 MiB
/// per stream, 1 GiB per connection, as bench/h3load's and h2load's -w30 -W30).
fn client_config(ca: &str, timeout: Duration) -> Result<ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).map_err(|e| format!("{ca}: {e}"))? {
        roots
            .add(cert.map_err(|e| format!("{ca}: {e}"))?)
            .map_err(|e| format!("{ca}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{ca}: no PEM certificate"));
    }
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.kx_groups = vec![rustls::crypto::aws_lc_rs::kx_group::X25519];
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let crypto = QuicClientConfig::try_from(Arc::new(tls)).map_err(|e| e.to_string())?;
    let mut transport = TransportConfig::default();
    transport.stream_receive_window(VarInt::from_u32(64 << 20));
    transport.receive_window(VarInt::from_u32(1 << 30));
    transport.max_concurrent_bidi_streams(VarInt::from_u32(0));
    transport.max_concurrent_uni_streams(VarInt::from_u32(16));
    transport.max_idle_timeout(Some(
        IdleTimeout::try_from(timeout).map_err(|e| e.to_string())?,
    ));
    let mut config = ClientConfig::new(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    Ok(config)
}

/// This process's CPU time so far (it runs one thread: the scheduler's count of it, in ns).
fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn fail_json(message: &str) -> ExitCode {
    println!("{{\"error\":{:?}}}", message);
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("h3load-quinn: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(code) => code,
        Err(e) => fail_json(&e),
    }
}

fn run(args: &Args) -> Result<ExitCode, String> {
    let mut authority = None;
    let mut requests = Vec::new();
    for url in &args.urls {
        let (a, path) = split_url(url)?;
        if authority.is_some_and(|first| first != a) {
            return Err("all URLs must name the same host and port".into());
        }
        authority = Some(a);
        requests.push(request_frame(a, path, &args.headers));
    }
    let authority = authority.expect("a URL");
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| !p.contains(']'))
    {
        authority.to_string()
    } else {
        format!("{authority}:443")
    };
    let server: SocketAddr = with_port
        .to_socket_addrs()
        .map_err(|e| format!("{authority}: {e}"))?
        .next()
        .ok_or(format!("{authority}: no address"))?;
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    let server_name = args.sni.clone().unwrap_or_else(|| host.to_string());
    let config = client_config(&args.ca, args.timeout)?;

    let load = Load::new(requests, args.streams, args.requests);
    let tally = Tally {
        start: None,
        deadline: None,
        requests: 0,
        ok: 0,
        errors: 0,
        bytes: 0,
        times: Histogram::new(),
        reported: 0,
    };
    let poll = Poll::new().map_err(|e| e.to_string())?;
    let now = Instant::now();
    let mut clients = Vec::with_capacity(args.connections);
    for i in 0..args.connections {
        let mut c = Client::connect(config.clone(), server, &server_name, args.gro, now)
            .map_err(|e| format!("connecting: {e}"))?;
        poll.registry()
            .register(&mut c.socket, Token(i), Interest::READABLE)
            .map_err(|e| e.to_string())?;
        clients.push(c);
    }
    let mut run = Run {
        poll,
        events: Events::with_capacity(1024),
        clients,
        rx: RecvBuffers::new(),
        load,
        tally,
    };
    let io_err = |e: io::Error| e.to_string();

    // The handshakes, all at once, before the clock starts.
    let handshake_end = now + args.timeout;
    run.drive_all(now).map_err(io_err)?;
    while !run.clients.iter().all(|c| c.connected) {
        let now = Instant::now();
        if now > handshake_end {
            return Err("connecting: handshakes not done within -timeout".into());
        }
        run.turn(handshake_end)?;
        if let Some(why) = run.clients.iter().find_map(|c| c.lost.clone()) {
            return Err(format!("connecting: {why}"));
        }
    }
    let alpn = run.clients[0].alpn().unwrap_or_default();

    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let end_by = start + args.duration.unwrap_or(args.timeout);
    run.tally.start = Some(start);
    run.tally.deadline = args.duration.map(|d| start + d);
    run.load.running = true;
    run.drive_all(start).map_err(io_err)?;
    let mut redials = 0u64;
    let end = loop {
        let now = Instant::now();
        if now >= end_by {
            break end_by.min(now);
        }
        if args.requests.is_some_and(|n| run.tally.requests >= n) {
            break now;
        }
        run.turn(end_by)?;
        redials += run.redial_lost().map_err(io_err)?;
    };
    let cpu = cpu_seconds() - cpu0;
    let now = Instant::now();
    for c in &mut run.clients {
        c.close(now);
    }
    let Run { mut tally, .. } = run;
    if redials > 0 {
        eprintln!("h3load-quinn: {redials} reconnections");
    }
    if let Some(n) = args.requests.filter(|&n| tally.requests < n) {
        eprintln!(
            "h3load-quinn: {} requests unfinished after -timeout",
            n - tally.requests
        );
        tally.errors += n - tally.requests;
        tally.requests = n;
    }
    let secs = end.duration_since(start).as_secs_f64();
    println!(
        "{{\"requests\":{},\"ok\":{},\"errors\":{},\"bytes\":{},\"seconds\":{},\"rps\":{},\
         \"p50_us\":{},\"p99_us\":{},\"cpu_seconds\":{},\"tls\":{{\"version\":\"TLSv1.3\",\
         \"group\":\"x25519\",\"alpn\":{:?}}}}}",
        tally.requests,
        tally.ok,
        tally.errors,
        tally.bytes,
        round3(secs),
        round3(tally.ok as f64 / secs.max(1e-9)),
        tally.times.percentile(50.0),
        tally.times.percentile(99.0),
        round3(cpu),
        alpn,
    );
    Ok(if tally.ok == 0 && tally.errors > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The connections and what they share: the poll, the receive buffers, the requests still to
/// send (`load`) and the counts and times of the answers (`tally`).
struct Run {
    poll: Poll,
    events: Events,
    clients: Vec<Client>,
    rx: RecvBuffers,
    load: Load,
    tally: Tally,
}

impl Run {
    /// Lets every connection send what it can at `now`.
    fn drive_all(&mut self, now: Instant) -> io::Result<()> {
        for c in &mut self.clients {
            c.drive(now, &mut self.load, &mut self.tally)?;
        }
        Ok(())
    }

    /// One turn of the loop: waits for datagrams or the earliest timer (at most until
    /// `until`), reads what came, and drives each connection that had news or a timer due.
    fn turn(&mut self, until: Instant) -> Result<(), String> {
        let now = Instant::now();
        let next = self
            .clients
            .iter_mut()
            .filter_map(|c| c.timeout())
            .min()
            .unwrap_or(until)
            .min(until);
        self.poll
            .poll(&mut self.events, Some(next.saturating_duration_since(now)))
            .map_err(|e| e.to_string())?;
        let now = Instant::now();
        let mut touched = vec![false; self.clients.len()];
        for event in self.events.iter() {
            let i = event.token().0;
            self.clients[i]
                .receive(now, &mut self.rx)
                .map_err(|e| e.to_string())?;
            touched[i] = true;
        }
        for (c, touched) in self.clients.iter_mut().zip(touched) {
            if touched || c.timeout().is_some_and(|t| t <= now) {
                c.drive(now, &mut self.load, &mut self.tally)
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Dials again each connection the server closed or that failed, and lets it send: how
    /// many.
    fn redial_lost(&mut self) -> io::Result<u64> {
        let mut redials = 0;
        for c in self.clients.iter_mut().filter(|c| c.lost.is_some()) {
            redials += 1;
            let now = Instant::now();
            c.redial(now, &mut self.tally)?;
            c.drive(now, &mut self.load, &mut self.tally)?;
        }
        Ok(redials)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_urls_read_as_bench_h3load_reads_them() {
        assert_eq!(duration("3s"), Some(Duration::from_secs(3)));
        assert_eq!(duration("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(duration("3"), None);
        assert_eq!(
            split_url("https://127.0.0.1:8443/index.html").unwrap(),
            ("127.0.0.1:8443", "/index.html")
        );
        assert_eq!(
            split_url("https://[::1]:8443").unwrap(),
            ("[::1]:8443", "/")
        );
        assert!(split_url("http://127.0.0.1/").is_err());
    }

    #[test]
    fn the_request_frame_decodes_to_the_get_it_names() {
        let bytes = request_frame(
            "localhost:8443",
            "/x?y=1",
            &[("accept".into(), "*/*".into())],
        );
        let (ty, len, at) = frame::parse_header(&bytes).unwrap();
        assert_eq!((ty, at + len as usize), (kind::HEADERS, bytes.len()));
        let mut fields = Vec::new();
        qpack::decode_section(&bytes[at..], usize::MAX, &mut Default::default(), |n, v| {
            fields.push((
                String::from_utf8(n.to_vec()).unwrap(),
                String::from_utf8(v.to_vec()).unwrap(),
            ));
            Ok(())
        })
        .unwrap();
        let want: Vec<(String, String)> = [
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", "localhost:8443"),
            (":path", "/x?y=1"),
            ("user-agent", "h3load-quinn"),
            ("accept", "*/*"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
        assert_eq!(fields, want);
    }
}
