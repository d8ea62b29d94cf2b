//! Running under a service manager (systemd, or anything speaking its protocols): socket
//! activation (`LISTEN_FDS`) and notifications (`NOTIFY_SOCKET`: ready, reloading, stopping,
//! watchdog).
//!
//! [`init`] reads the environment once, in `main` before any thread exists: it takes the
//! inherited sockets and connects the notification socket there, because after start-up tern
//! runs in a sandbox that may create and connect no socket; later notifications only `send`.
//!
//! Inherited sockets become tern's listeners as follows ([`plan_inherited`]):
//! - tern listens on exactly the inherited sockets; configured listen addresses (`--listen`,
//!   `--listen-tls`, `--redirect-http`, the defaults) decide only what each socket serves
//!   and are not bound themselves;
//! - a socket bound to a configured address serves what that address would have served;
//! - else its name (`FileDescriptorName=`) decides: `https` or `tls` is HTTPS (a certificate
//!   must be configured), `http` is plain HTTP (or the `--redirect-http` redirect when that is
//!   the only plain listener configured);
//! - else, if only one kind of listener is configured, that kind;
//! - anything else, a name contradicting the address, or a certificate no socket uses, is a
//!   start-up error.

use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use socket2::{Domain, Socket, Type};
use tern_server::{ListenerKind, ServerConfig};

/// The first inherited descriptor (`SD_LISTEN_FDS_START`); the others follow it.
const FIRST_INHERITED_FD: RawFd = 3;
/// What systemd calls a descriptor that was given no name.
const UNNAMED: &str = "unknown";
/// How long a notification may wait for room in the manager's queue before it is dropped.
const NOTIFY_SEND_TIMEOUT: Duration = Duration::from_secs(1);

/// What [`init`] found in the environment.
struct ServiceEnv {
    /// Taken by [`adopt_inherited_sockets`].
    sockets: Mutex<Vec<InheritedSocket>>,
    notify: Option<UnixDatagram>,
    /// How often the manager wants `WATCHDOG=1`.
    watchdog: Option<Duration>,
    /// Set when shutdown began: the watchdog stops (workers are about to exit).
    stopping: AtomicBool,
}

static SERVICE: OnceLock<ServiceEnv> = OnceLock::new();

/// A listening socket passed by the service manager.
struct InheritedSocket {
    listener: std::net::TcpListener,
    addr: SocketAddr,
    name: String,
}

/// Reads and clears `LISTEN_PID`/`LISTEN_FDS`/`LISTEN_FDNAMES`, takes the inherited sockets,
/// and connects to `NOTIFY_SOCKET`. Call once, from `main`, before any other thread exists
/// (it changes the environment). Errors are one line for the start-up message.
pub fn init() -> Result<(), String> {
    let var = |name| std::env::var(name).ok();
    let names = parse_listen_env(
        var("LISTEN_PID").as_deref(),
        var("LISTEN_FDS").as_deref(),
        var("LISTEN_FDNAMES").as_deref(),
        std::process::id(),
    );
    // Cleared whatever they said, so nothing started later takes them for its own.
    for name in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(name);
    }
    let sockets = take_inherited(names?)?;
    let notify = var("NOTIFY_SOCKET").and_then(|value| match connect_notify(&value) {
        Ok(socket) => Some(socket),
        Err(e) => {
            tracing::warn!(
                "NOTIFY_SOCKET={value}: {e}; the service manager will not hear from tern"
            );
            None
        }
    });
    let watchdog = watchdog_interval(
        var("WATCHDOG_USEC").as_deref(),
        var("WATCHDOG_PID").as_deref(),
        std::process::id(),
    );
    let env = ServiceEnv {
        sockets: Mutex::new(sockets),
        notify,
        watchdog,
        stopping: AtomicBool::new(false),
    };
    SERVICE
        .set(env)
        .map_err(|_| "service environment read twice".to_string())
}

/// The names of the descriptors `LISTEN_FDS` passes to this process (`unknown` where
/// `LISTEN_FDNAMES` gives none); empty when they are meant for another process.
fn parse_listen_env(
    pid: Option<&str>,
    fds: Option<&str>,
    names: Option<&str>,
    our_pid: u32,
) -> Result<Vec<String>, String> {
    let Some(fds) = fds else {
        return Ok(Vec::new());
    };
    // Set by the manager for the process it started; a child that inherited the variables
    // by mistake must not take descriptors it was never given.
    if pid.and_then(|p| p.trim().parse::<u32>().ok()) != Some(our_pid) {
        return Ok(Vec::new());
    }
    let count: usize = fds
        .trim()
        .parse()
        .map_err(|_| format!("LISTEN_FDS={fds:?} is not a number"))?;
    match names {
        None => Ok(vec![UNNAMED.to_string(); count]),
        Some(names) => {
            let names: Vec<String> = names.split(':').map(str::to_string).collect();
            if names.len() != count {
                return Err(format!(
                    "LISTEN_FDNAMES names {} sockets but LISTEN_FDS passes {count}",
                    names.len()
                ));
            }
            Ok(names)
        }
    }
}

/// Owns descriptors 3, 4, ... (one per name) and checks that each is a listening TCP socket.
fn take_inherited(names: Vec<String>) -> Result<Vec<InheritedSocket>, String> {
    let mut sockets = Vec::with_capacity(names.len());
    for (i, name) in names.into_iter().enumerate() {
        let fd = FIRST_INHERITED_FD + i as RawFd;
        // SAFETY: F_GETFD only reads the descriptor's flags; on a closed number it fails.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            return Err(format!(
                "inherited socket {name} (descriptor {fd}) is not open"
            ));
        }
        // SAFETY: the descriptor is open (checked above), and LISTEN_PID named this process,
        // so the manager passed it for us to own. Nothing else in tern knows its number, and
        // `init` runs once (the variables are cleared), so it is owned once.
        let socket = Socket::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let tcp = socket.r#type().ok() == Some(Type::STREAM)
            && socket.is_listener().unwrap_or(false)
            && matches!(socket.domain(), Ok(d) if d == Domain::IPV4 || d == Domain::IPV6);
        if !tcp {
            return Err(format!(
                "inherited socket {name} (descriptor {fd}) is not a listening TCP socket \
                 (tern takes ListenStream= sockets on IP addresses)"
            ));
        }
        // The manager may pass them blocking and inheritable; tern's own sockets are neither.
        let prepared = socket
            .set_cloexec(true)
            .and_then(|()| socket.set_nonblocking(true));
        let addr = socket.local_addr().map(|a| a.as_socket());
        let (Ok(()), Ok(Some(addr))) = (prepared, addr) else {
            return Err(format!(
                "inherited socket {name} (descriptor {fd}): cannot prepare it"
            ));
        };
        sockets.push(InheritedSocket {
            listener: socket.into(),
            addr,
            name,
        });
    }
    Ok(sockets)
}

/// Replaces the configured listeners by the inherited sockets, if there are any (see the
/// module comment for which socket serves what).
pub fn adopt_inherited_sockets(config: &mut ServerConfig) -> Result<(), String> {
    let Some(env) = SERVICE.get() else {
        return Ok(());
    };
    let sockets = std::mem::take(&mut *env.sockets.lock().unwrap_or_else(|e| e.into_inner()));
    if sockets.is_empty() {
        return Ok(());
    }
    let configured: Vec<(SocketAddr, ListenerKind)> = config
        .runtime
        .listen
        .iter()
        .enumerate()
        .map(|(i, &addr)| {
            let kind = config.listener_kinds.get(i).copied();
            (addr, kind.unwrap_or(ListenerKind::Http))
        })
        .collect();
    let offered: Vec<(SocketAddr, &str)> =
        sockets.iter().map(|s| (s.addr, s.name.as_str())).collect();
    let kinds = plan_inherited(&configured, &offered)?;
    tracing::info!(
        "socket activation: serving {} inherited socket{} ({}); configured listen addresses are not bound",
        sockets.len(),
        if sockets.len() == 1 { "" } else { "s" },
        offered
            .iter()
            .map(|(addr, name)| format!("{name} {addr}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    config.runtime.listen = sockets.iter().map(|s| s.addr).collect();
    config.listener_kinds = kinds;
    config.runtime.inherited = sockets
        .into_iter()
        .map(|s| Some(Arc::new(s.listener)))
        .collect();
    Ok(())
}

/// What each offered socket `(address, name)` serves, given the configured listeners.
fn plan_inherited(
    configured: &[(SocketAddr, ListenerKind)],
    offered: &[(SocketAddr, &str)],
) -> Result<Vec<ListenerKind>, String> {
    use ListenerKind::{Http, Https, RedirectToHttps};
    let has = |kind| configured.iter().any(|&(_, k)| k == kind);
    let mut kinds = Vec::with_capacity(offered.len());
    for &(addr, name) in offered {
        let wants_tls = match name {
            "https" | "tls" => Some(true),
            "http" => Some(false),
            _ => None,
        };
        let by_address = configured
            .iter()
            .find(|&&(a, _)| a == addr)
            .map(|&(_, k)| k);
        let kind = match (by_address, wants_tls) {
            (Some(kind), None) => kind,
            (Some(kind), Some(tls)) if (kind == Https) == tls => kind,
            (Some(kind), Some(_)) => {
                return Err(format!(
                    "inherited socket {name} ({addr}) is named for {} but tern is configured to serve {} there",
                    if wants_tls == Some(true) { "HTTPS" } else { "plain HTTP" },
                    if kind == Https { "HTTPS" } else { "plain HTTP" },
                ))
            }
            (None, Some(true)) if has(Https) => Https,
            (None, Some(true)) => {
                return Err(format!(
                    "inherited socket {name} ({addr}) is for HTTPS but no certificate is configured \
                     (--tls-cert/--tls-key or --tls-self-signed)"
                ))
            }
            (None, Some(false)) => match (has(Http), has(RedirectToHttps)) {
                (true, true) => {
                    return Err(format!(
                        "inherited socket {name} ({addr}) could be the --listen or the --redirect-http \
                         listener; give the one it is meant for its address ({addr})"
                    ))
                }
                (false, true) => RedirectToHttps,
                _ => Http,
            },
            (None, None) => match configured.first() {
                Some(&(_, only)) if configured.iter().all(|&(_, k)| k == only) => only,
                _ => {
                    return Err(format!(
                        "inherited socket {name} ({addr}) matches no configured listen address \
                         and tern serves several kinds; name it http or https \
                         (FileDescriptorName= in the socket unit)"
                    ))
                }
            },
        };
        kinds.push(kind);
    }
    if has(Https) && !kinds.contains(&Https) {
        return Err(
            "a certificate is configured but no inherited socket is for HTTPS; name one https \
             (FileDescriptorName=https in the socket unit; the shipped units: systemctl stop \
             tern && systemctl enable --now tern-https.socket)"
                .into(),
        );
    }
    if kinds.contains(&RedirectToHttps) && !kinds.contains(&Https) {
        return Err("the redirect to HTTPS needs an inherited socket for HTTPS".into());
    }
    Ok(kinds)
}

/// Where `NOTIFY_SOCKET` points: a path, or `@name` in the abstract namespace.
#[derive(Debug, PartialEq, Eq)]
enum NotifyAddress<'a> {
    Path(&'a str),
    Abstract(&'a [u8]),
}

fn notify_address(value: &str) -> Result<NotifyAddress<'_>, String> {
    match value.as_bytes() {
        [b'@', name @ ..] if !name.is_empty() => Ok(NotifyAddress::Abstract(name)),
        [b'/', ..] => Ok(NotifyAddress::Path(value)),
        _ => Err("not an absolute path or @abstract name".into()),
    }
}

/// An unbound datagram socket connected to the manager's socket.
fn connect_notify(value: &str) -> Result<UnixDatagram, String> {
    let address = notify_address(value)?;
    let socket = UnixDatagram::unbound().map_err(|e| e.to_string())?;
    match address {
        NotifyAddress::Path(path) => socket.connect(path),
        NotifyAddress::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|addr| socket.connect_addr(&addr))
        }
    }
    .map_err(|e| e.to_string())?;
    // A manager too busy to read must not hold up a reload or the shutdown for long.
    socket
        .set_write_timeout(Some(NOTIFY_SEND_TIMEOUT))
        .map_err(|e| e.to_string())?;
    Ok(socket)
}

/// The watchdog interval, when `WATCHDOG_USEC` asks for one and `WATCHDOG_PID` (if set) is us.
fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, our_pid: u32) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(our_pid) {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Sends one notification (`KEY=VALUE` lines) if a manager listens; failures are logged.
fn notify(state: &str) {
    let Some(socket) = SERVICE.get().and_then(|env| env.notify.as_ref()) else {
        return;
    };
    if let Err(e) = socket.send(state.as_bytes()) {
        let what = state.lines().next().unwrap_or_default();
        tracing::warn!("telling the service manager {what} failed: {e}");
    }
}

/// Start-up finished (the start-up line is printed): `READY=1`, with the line as status.
pub fn notify_ready(status: &str) {
    notify(&format!("READY=1\nSTATUS={status}"));
}

/// A reload (`SIGHUP`) begins; [`notify_reloaded`] ends it.
pub fn notify_reloading() {
    notify(&format!("RELOADING=1\nMONOTONIC_USEC={}", monotonic_usec()));
}

/// A reload ended (applied or not): back to `READY=1`.
pub fn notify_reloaded() {
    notify("READY=1");
}

/// Shutdown began: `STOPPING=1`, and the watchdog stops.
pub fn notify_stopping() {
    if let Some(env) = SERVICE.get() {
        env.stopping.store(true, Ordering::Relaxed);
    }
    notify("STOPPING=1");
}

/// `CLOCK_MONOTONIC` in microseconds, the clock systemd compares `MONOTONIC_USEC` with
/// (`Instant` uses it too but does not show its value).
fn monotonic_usec() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the variable passed; CLOCK_MONOTONIC
    // always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000
}

/// If the manager asked for a watchdog, starts a thread that sends `WATCHDOG=1` every half
/// interval while `alive` (the workers' liveness probe) says every event loop is turning, and
/// stops when shutdown begins. A stuck worker thus gets the service restarted.
pub fn start_watchdog(mut alive: impl FnMut() -> bool + Send + 'static) -> Result<(), String> {
    let Some(env) = SERVICE.get() else {
        return Ok(());
    };
    let (Some(interval), Some(_)) = (env.watchdog, env.notify.as_ref()) else {
        return Ok(());
    };
    let period = interval / 2;
    std::thread::Builder::new()
        .name("tern-watchdog".into())
        .spawn(move || {
            let mut was_alive = true;
            loop {
                std::thread::sleep(period);
                if env.stopping.load(Ordering::Relaxed) {
                    return;
                }
                let now_alive = alive();
                if now_alive {
                    notify("WATCHDOG=1");
                } else if was_alive {
                    tracing::error!(
                        "watchdog: a worker's event loop has not turned for {} ms; \
                         not telling the service manager that tern is alive",
                        period.as_millis()
                    );
                }
                was_alive = now_alive;
            }
        })
        .map(drop)
        .map_err(|e| format!("cannot start the watchdog thread: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ListenerKind::{Http, Https, RedirectToHttps};

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn listen_fds_are_ours_only_with_our_pid() {
        let named = parse_listen_env(Some("42"), Some("2"), Some("http:https"), 42).unwrap();
        assert_eq!(named, ["http", "https"]);
        let unnamed = parse_listen_env(Some("42"), Some("1"), None, 42).unwrap();
        assert_eq!(unnamed, ["unknown"]);
        // Another process's, or no pid at all: not ours, whatever else they say.
        assert!(parse_listen_env(Some("41"), Some("2"), None, 42)
            .unwrap()
            .is_empty());
        assert!(parse_listen_env(None, Some("2"), None, 42)
            .unwrap()
            .is_empty());
        assert!(parse_listen_env(Some("x"), Some("bad"), None, 42)
            .unwrap()
            .is_empty());
        assert!(parse_listen_env(Some("42"), None, None, 42)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn malformed_listen_fds_are_errors() {
        let e = parse_listen_env(Some("42"), Some("two"), None, 42).unwrap_err();
        assert!(e.contains("LISTEN_FDS"), "{e}");
        let e = parse_listen_env(Some("42"), Some("2"), Some("http"), 42).unwrap_err();
        assert!(e.contains("LISTEN_FDNAMES names 1"), "{e}");
    }

    #[test]
    fn notify_addresses_are_paths_or_abstract_names() {
        assert_eq!(
            notify_address("/run/systemd/notify"),
            Ok(NotifyAddress::Path("/run/systemd/notify"))
        );
        assert_eq!(
            notify_address("@tern-test"),
            Ok(NotifyAddress::Abstract(b"tern-test"))
        );
        assert!(notify_address("@").is_err());
        assert!(notify_address("relative/path").is_err());
        assert!(notify_address("").is_err());
    }

    #[test]
    fn notifications_reach_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("tern-notify-test-{}", std::process::id());
        let listener = UnixDatagram::bind_addr(
            &std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap(),
        )
        .unwrap();
        let sender = connect_notify(&format!("@{name}")).unwrap();
        sender.send(b"READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        assert!(connect_notify("@tern-nobody-listens-here").is_err());
    }

    #[test]
    fn watchdog_only_for_us_and_a_positive_interval() {
        assert_eq!(
            watchdog_interval(Some("200000"), None, 7),
            Some(Duration::from_millis(200))
        );
        assert_eq!(
            watchdog_interval(Some("200000"), Some("7"), 7),
            Some(Duration::from_millis(200))
        );
        assert_eq!(watchdog_interval(Some("200000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
        assert_eq!(watchdog_interval(None, None, 7), None);
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let a = monotonic_usec();
        std::thread::sleep(Duration::from_millis(2));
        let b = monotonic_usec();
        assert!(a > 0 && b >= a + 2_000, "{a} {b}");
    }

    #[test]
    fn a_socket_serves_what_its_address_is_configured_for() {
        let configured = [(addr("0.0.0.0:80"), Http), (addr("0.0.0.0:443"), Https)];
        let kinds = plan_inherited(
            &configured,
            &[
                (addr("0.0.0.0:443"), "tern.socket"),
                (addr("0.0.0.0:80"), "unknown"),
            ],
        )
        .unwrap();
        assert_eq!(kinds, [Https, Http]);
        let e = plan_inherited(&configured, &[(addr("0.0.0.0:80"), "https")]).unwrap_err();
        assert!(e.contains("named for HTTPS"), "{e}");
    }

    #[test]
    fn names_decide_for_sockets_on_other_addresses() {
        let tls_only = [(addr("127.0.0.1:8443"), Https)];
        let kinds = plan_inherited(
            &tls_only,
            &[(addr("[::]:80"), "http"), (addr("[::]:443"), "tls")],
        )
        .unwrap();
        assert_eq!(kinds, [Http, Https]);
        let with_redirect = [
            (addr("127.0.0.1:8443"), Https),
            (addr("127.0.0.1:8081"), RedirectToHttps),
        ];
        let kinds = plan_inherited(
            &with_redirect,
            &[(addr("[::]:80"), "http"), (addr("[::]:443"), "https")],
        )
        .unwrap();
        assert_eq!(kinds, [RedirectToHttps, Https]);
        let plain_only = [(addr("127.0.0.1:8080"), Http)];
        let e = plan_inherited(&plain_only, &[(addr("[::]:443"), "https")]).unwrap_err();
        assert!(e.contains("no certificate"), "{e}");
    }

    #[test]
    fn unnamed_sockets_take_the_only_configured_kind_or_fail() {
        let plain_only = [(addr("127.0.0.1:8080"), Http)];
        let kinds = plan_inherited(
            &plain_only,
            &[(addr("[::]:80"), "unknown"), (addr("0.0.0.0:81"), "web")],
        )
        .unwrap();
        assert_eq!(kinds, [Http, Http]);
        let both = [
            (addr("127.0.0.1:8080"), Http),
            (addr("127.0.0.1:8443"), Https),
        ];
        let e = plan_inherited(&both, &[(addr("[::]:80"), "unknown")]).unwrap_err();
        assert!(e.contains("name it http or https"), "{e}");
        let plain_and_redirect = [
            (addr("127.0.0.1:8080"), Http),
            (addr("127.0.0.1:8443"), Https),
            (addr("127.0.0.1:8081"), RedirectToHttps),
        ];
        let e = plan_inherited(
            &plain_and_redirect,
            &[(addr("[::]:80"), "http"), (addr("[::]:443"), "https")],
        )
        .unwrap_err();
        assert!(e.contains("--redirect-http"), "{e}");
    }

    #[test]
    fn a_certificate_no_socket_uses_is_an_error() {
        let both = [
            (addr("127.0.0.1:8080"), Http),
            (addr("127.0.0.1:8443"), Https),
        ];
        let e = plan_inherited(&both, &[(addr("[::]:80"), "http")]).unwrap_err();
        assert!(e.contains("no inherited socket is for HTTPS"), "{e}");
    }
}
