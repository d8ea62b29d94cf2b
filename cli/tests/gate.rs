//! The auth gateway over real sockets: `tern serve --gate` (the guard in front of a site) and
//! `tern gate` (nginx's auth_request backend), with clients that solve the proof of work, log
//! in, wait out a time-lock, replay, forge and flood.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support;
use support::*;

const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:132.0) Gecko/20100101 Firefox/132.0";

/// A temp folder with a site, a gate config, a policy and a password file.
struct Setup {
    tmp: tempfile::TempDir,
}

impl Setup {
    /// `policy`: the policy file's text ("" for the shipped default policy).
    fn new(policy: &str, extra_config: &str) -> Setup {
        let tmp = tempfile::tempdir().unwrap();
        let site = tmp.path().join("site");
        std::fs::create_dir_all(site.join("private")).unwrap();
        std::fs::write(site.join("index.html"), "<p>the guarded page</p>\n").unwrap();
        std::fs::write(site.join("robots.txt"), "User-agent: *\n").unwrap();
        std::fs::write(site.join("private/secret.txt"), "for staff only\n").unwrap();
        let hash = bcrypt::hash("hunter2", 4).unwrap();
        std::fs::write(tmp.path().join("staff.htpasswd"), format!("alice:{hash}\n")).unwrap();
        let policy_line = if policy.is_empty() {
            String::new()
        } else {
            std::fs::write(tmp.path().join("policy.toml"), policy).unwrap();
            "policy = \"policy.toml\"\n".to_string()
        };
        std::fs::write(
            tmp.path().join("gate.toml"),
            format!(
                "keyring = \"gate.keys\"\n{policy_line}trusted_proxies = [\"127.0.0.1\"]\n{extra_config}\n\
                 [[realm]]\nname = \"staff\"\ncheckers = [\"file:staff.htpasswd\", \"guest-pow\"]\n\
                 guest_difficulty = 8\n"
            ),
        )
        .unwrap();
        Setup { tmp }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    fn serve(&self, extra: &[&str]) -> Tern {
        let config = self.path("gate.toml");
        let mut args = vec!["--gate", config.to_str().unwrap()];
        args.extend_from_slice(extra);
        Tern::start(&self.path("site"), &args)
    }

    fn gate(&self) -> Tern {
        let mut cmd = Command::new(TERN);
        cmd.arg("gate")
            .arg("--config")
            .arg(self.path("gate.toml"))
            .args(LISTEN)
            .args(["--workers", "2", "--sandbox", "on"]);
        Tern::spawn(cmd)
    }
}

/// A policy: staff pages need a login, everything else a proof of work for browsers.
const POLICY: &str = r#"
[[rule]]
name = "robots"
action = "allow"
path_prefix = "/robots.txt"

[[rule]]
name = "staff"
action = "login"
path_prefix = "/private/"
realm = "staff"

[[rule]]
name = "slow-readers"
action = "timelock"
path_prefix = "/slow/"
seconds = 2

[[rule]]
name = "browsers"
action = "challenge"
user_agent = "Mozilla"
difficulty = 10
"#;

/// The value of attribute `name="..."` or `data-name="..."` in `html` (HTML-unescaped).
fn attr(html: &str, name: &str) -> Option<String> {
    let start = html.find(&format!("{name}=\""))? + name.len() + 2;
    let end = html[start..].find('"')? + start;
    Some(
        html[start..end]
            .replace("&amp;", "&")
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&lt;", "<")
            .replace("&gt;", ">"),
    )
}

/// The value of the hidden form field `name`.
fn field(html: &str, name: &str) -> Option<String> {
    let at = html.find(&format!("name=\"{name}\""))?;
    // The input's own tag, whichever order its attributes come in.
    let tag_start = html[..at].rfind('<')?;
    let tag_end = html[at..].find('>')? + at;
    attr(&html[tag_start..tag_end], "value")
}

/// `name=value` of the response's Set-Cookie.
fn cookie_of(r: &Resp) -> String {
    let set = r.header("set-cookie").expect("a Set-Cookie header");
    set.split(';').next().unwrap().to_string()
}

fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn post_form(tern: &Tern, path: &str, fields: &[(&str, &str)], headers: &[(&str, &str)]) -> Resp {
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect();
    let body = body.join("&");
    let mut c = tern.client();
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    c.send(head.as_bytes());
    c.send(body.as_bytes());
    c.read_response(false)
}

/// Solves a challenge page like a browser would and posts the answer: the session cookie.
fn solve_and_pass(tern: &Tern, page: &Resp, ua: &str) -> Resp {
    let html = page.text();
    let challenge = attr(&html, "data-challenge").expect("a challenge on the page");
    let difficulty: u8 = attr(&html, "data-difficulty").unwrap().parse().unwrap();
    let return_to = field(&html, "return").unwrap_or_else(|| "/".into());
    let counter = tern_gate::pow::solve(&challenge, difficulty);
    post_form(
        tern,
        "/.tern-gate/pass",
        &[
            ("challenge", &challenge),
            ("counter", &counter.to_string()),
            ("return", &return_to),
        ],
        &[("User-Agent", ua)],
    )
}

#[test]
fn a_browser_solves_the_proof_of_work_once_and_then_passes() {
    let setup = Setup::new(POLICY, "");
    let tern = setup.serve(&[]);
    // Tools the policy lets through see the page at once; robots.txt is never challenged.
    assert_eq!(
        tern.get_with("/", &[("User-Agent", "curl/8.5.0")]).status,
        200
    );
    assert_eq!(
        tern.get_with("/robots.txt", &[("User-Agent", FIREFOX)])
            .status,
        200
    );
    // A browser gets the challenge page instead of the page, never cached or indexed.
    let page = tern.get_with("/index.html?x=1", &[("User-Agent", FIREFOX)]);
    assert_eq!(page.status, 403, "{}", page.text());
    assert!(page.has("cache-control", "no-store"));
    assert!(page.header("x-robots-tag").unwrap().contains("noindex"));
    assert!(page
        .header("content-security-policy")
        .unwrap()
        .contains("script-src 'self'"));
    assert!(!page.text().contains("the guarded page"));
    assert!(
        page.header("set-cookie").is_none(),
        "a challenge never touches cookies"
    );
    let passed = solve_and_pass(&tern, &page, FIREFOX);
    assert_eq!(passed.status, 303, "{}", passed.text());
    assert_eq!(passed.header("location"), Some("/index.html?x=1"));
    let set = passed.header("set-cookie").unwrap();
    for attribute in ["Path=/", "HttpOnly", "SameSite=Lax", "Max-Age=86400"] {
        assert!(set.contains(attribute), "{set}");
    }
    assert!(!set.contains("Secure"), "plain HTTP: {set}");
    let cookie = cookie_of(&passed);
    let page = tern.get_with("/", &[("User-Agent", FIREFOX), ("Cookie", &cookie)]);
    assert_eq!(page.status, 200);
    assert_eq!(page.text(), "<p>the guarded page</p>\n");
    // Other cookies beside it do not matter.
    let both = format!("theme=dark; {cookie}; other=1");
    assert_eq!(
        tern.get_with("/", &[("User-Agent", FIREFOX), ("Cookie", &both)])
            .status,
        200
    );
    // A forged cookie is a challenge again.
    let mut forged = cookie.clone();
    forged.pop();
    forged.push(if cookie.ends_with('A') { 'B' } else { 'A' });
    assert_eq!(
        tern.get_with("/", &[("User-Agent", FIREFOX), ("Cookie", &forged)])
            .status,
        403
    );
    // Non-GET requests that would need a check are refused, never turned into a GET.
    let mut c = tern.client();
    let r = c.request(
        "POST",
        "/form",
        &[("User-Agent", FIREFOX), ("Content-Length", "0")],
    );
    assert_eq!(r.status, 403);
    assert!(tern.counter_at("/.tern-gate/statusz", "gate_challenges_passed") >= 1);
}

#[test]
fn a_solution_is_single_use_and_bound_to_its_client() {
    let setup = Setup::new(POLICY, "");
    let tern = setup.serve(&[]);
    let page = tern.get_with("/", &[("User-Agent", FIREFOX)]);
    assert_eq!(solve_and_pass(&tern, &page, FIREFOX).status, 303);
    let again = solve_and_pass(&tern, &page, FIREFOX);
    assert_eq!(again.status, 403, "replayed: {}", again.text());
    // Solved for one browser, presented by another user agent.
    let page = tern.get_with("/", &[("User-Agent", FIREFOX)]);
    let other = solve_and_pass(&tern, &page, "Mozilla/5.0 (Other)");
    assert_eq!(other.status, 403);
    // A counter that does not solve it.
    let html = tern.get_with("/", &[("User-Agent", FIREFOX)]).text();
    let challenge = attr(&html, "data-challenge").unwrap();
    let wrong = (0..u64::MAX)
        .find(|c| !tern_gate::pow::solves(&challenge, 10, *c))
        .unwrap();
    let r = post_form(
        &tern,
        "/.tern-gate/pass",
        &[
            ("challenge", &challenge),
            ("counter", &wrong.to_string()),
            ("return", "/"),
        ],
        &[("User-Agent", FIREFOX)],
    );
    assert_eq!(r.status, 403);
    assert!(
        tern.counter_at(
            "/.tern-gate/statusz",
            "gate_challenges_failed{cause=\"replayed\"}"
        ) >= 1
    );
    assert!(
        tern.counter_at(
            "/.tern-gate/statusz",
            "gate_challenges_failed{cause=\"wrong_client\"}"
        ) >= 1
    );
    assert!(
        tern.counter_at(
            "/.tern-gate/statusz",
            "gate_challenges_failed{cause=\"too_easy\"}"
        ) >= 1
    );
}

#[test]
fn staff_log_in_with_a_password_and_a_flood_locks_out_only_its_network() {
    let setup = Setup::new(POLICY, "");
    let tern = setup.serve(&[]);
    let page = tern.get_with("/private/secret.txt", &[("User-Agent", FIREFOX)]);
    assert_eq!(page.status, 401);
    let html = page.text();
    let csrf = field(&html, "csrf").expect("a CSRF token in the form");
    assert_eq!(
        field(&html, "return").as_deref(),
        Some("/private/secret.txt")
    );
    assert!(
        html.contains("/.tern-gate/guest?"),
        "the realm offers a guest login"
    );
    let login = |password: &str, csrf: &str, headers: &[(&str, &str)]| {
        // The browser that will use the session logs in.
        let mut headers = headers.to_vec();
        headers.push(("User-Agent", FIREFOX));
        post_form(
            &tern,
            "/.tern-gate/login",
            &[
                ("realm", "staff"),
                ("user", "alice"),
                ("password", password),
                ("return", "/private/secret.txt"),
                ("csrf", csrf),
            ],
            &headers,
        )
    };
    // A form posted from another site is refused before any password is hashed.
    let r = login("hunter2", &csrf, &[("Origin", "http://evil.example")]);
    assert_eq!(r.status, 403);
    let r = login("hunter2", "forged-token", &[]);
    assert_eq!(r.status, 403);
    let r = login("wrong", &csrf, &[("Origin", "http://127.0.0.1")]);
    assert_eq!(r.status, 401);
    assert!(r.text().contains("Wrong user name or password"));
    let r = login("hunter2", &csrf, &[("Sec-Fetch-Site", "same-origin")]);
    assert_eq!(r.status, 303, "{}", r.text());
    assert_eq!(r.header("location"), Some("/private/secret.txt"));
    let cookie = cookie_of(&r);
    assert!(cookie.starts_with("tern_gate.staff="), "{cookie}");
    let page = tern.get_with(
        "/private/secret.txt",
        &[("User-Agent", FIREFOX), ("Cookie", &cookie)],
    );
    assert_eq!(page.status, 200);
    assert_eq!(page.text(), "for staff only\n");
    // A staff session also settles the browser check elsewhere.
    assert_eq!(
        tern.get_with("/", &[("User-Agent", FIREFOX), ("Cookie", &cookie)])
            .status,
        200
    );
    // Five wrong passwords from this network: it must wait; the right one is refused too.
    for _ in 0..5 {
        assert_eq!(login("wrong", &csrf, &[]).status, 401);
    }
    let r = login("hunter2", &csrf, &[]);
    assert_eq!(r.status, 429, "{}", r.text());
    // Another network (a trusted proxy says who) can still log in as alice.
    let r = login("hunter2", &csrf, &[("X-Forwarded-For", "198.51.100.7")]);
    // The CSRF token is bound to the network it was given to.
    assert_eq!(r.status, 403);
    let other_page = tern.get_with(
        "/private/secret.txt",
        &[("User-Agent", FIREFOX), ("X-Forwarded-For", "198.51.100.7")],
    );
    let other_csrf = field(&other_page.text(), "csrf").unwrap();
    let r = login(
        "hunter2",
        &other_csrf,
        &[("X-Forwarded-For", "198.51.100.7")],
    );
    assert_eq!(r.status, 303, "{}", r.text());
    assert!(tern.counter_at("/.tern-gate/statusz", "gate_logins{outcome=\"locked_out\"}") >= 1);
    assert!(tern.counter_at("/.tern-gate/statusz", "gate_logins{outcome=\"forged\"}") >= 2);
    // Logging out clears the cookie.
    let r = post_form(
        &tern,
        "/.tern-gate/logout",
        &[("realm", "staff"), ("csrf", &csrf), ("return", "/")],
        &[("Cookie", &cookie)],
    );
    assert_eq!(r.status, 303);
    assert!(r.header("set-cookie").unwrap().contains("Max-Age=0"));
}

#[test]
fn a_guest_login_costs_a_proof_of_work() {
    let setup = Setup::new(POLICY, "");
    let tern = setup.serve(&[]);
    let page = tern.get_with(
        "/.tern-gate/guest?realm=staff&return=%2Fprivate%2Fsecret.txt",
        &[("User-Agent", FIREFOX)],
    );
    assert_eq!(page.status, 403, "{}", page.text());
    let passed = solve_and_pass(&tern, &page, FIREFOX);
    assert_eq!(passed.status, 303, "{}", passed.text());
    assert_eq!(passed.header("location"), Some("/private/secret.txt"));
    let cookie = cookie_of(&passed);
    assert!(cookie.starts_with("tern_gate.staff="));
    let page = tern.get_with(
        "/private/secret.txt",
        &[("User-Agent", FIREFOX), ("Cookie", &cookie)],
    );
    assert_eq!(page.status, 200);
    // A browser pass is not a login: spelling the path another way does not change that.
    let page = tern.get_with("/", &[("User-Agent", FIREFOX)]);
    let pass = cookie_of(&solve_and_pass(&tern, &page, FIREFOX));
    for path in [
        "/%70rivate/secret.txt",
        "/x/../private/secret.txt",
        "//private/secret.txt",
        "/./private/secret.txt",
    ] {
        let r = tern.get_with(path, &[("User-Agent", FIREFOX), ("Cookie", &pass)]);
        assert_eq!(r.status, 401, "{path} must ask for the login");
    }
}

#[test]
fn a_client_without_javascript_waits_out_the_time_lock() {
    let setup = Setup::new(POLICY, "");
    let tern = setup.serve(&[]);
    let page = tern.get_with("/slow/x", &[("User-Agent", "Lynx/2.9")]);
    assert_eq!(page.status, 403);
    let html = page.text();
    let at = html.find("http-equiv=\"refresh\"").expect("a meta refresh");
    let refresh = attr(&html[at..], "content").unwrap();
    let (seconds, url) = refresh
        .split_once(";url=")
        .or_else(|| refresh.split_once("; url="))
        .unwrap();
    assert_eq!(seconds.trim(), "2");
    // Too early.
    let r = tern.get_with(url, &[("User-Agent", "Lynx/2.9")]);
    assert_eq!(r.status, 403, "{}", r.text());
    std::thread::sleep(Duration::from_millis(2100));
    let r = tern.get_with(url, &[("User-Agent", "Lynx/2.9")]);
    assert_eq!(r.status, 303, "{}", r.text());
    assert_eq!(r.header("location"), Some("/slow/x"));
    assert!(
        tern.counter_at(
            "/.tern-gate/statusz",
            "gate_challenges_failed{cause=\"too_early\"}"
        ) >= 1
    );
}

#[test]
fn sessions_survive_a_restart() {
    let setup = Setup::new(POLICY, "");
    let cookie = {
        let tern = setup.serve(&[]);
        let page = tern.get_with("/", &[("User-Agent", FIREFOX)]);
        cookie_of(&solve_and_pass(&tern, &page, FIREFOX))
    };
    let meta = std::fs::metadata(setup.path("gate.keys")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let tern = setup.serve(&[]);
    let page = tern.get_with("/", &[("User-Agent", FIREFOX), ("Cookie", &cookie)]);
    assert_eq!(page.status, 200, "{}", page.text());
}

#[test]
fn tern_gate_answers_nginx_auth_requests() {
    let setup = Setup::new(POLICY, "");
    let gate = setup.gate();
    let auth = |uri: &str, method: &str, extra: &[(&str, &str)]| {
        let mut headers = vec![
            ("User-Agent", FIREFOX),
            ("X-Original-URI", uri),
            ("X-Original-Method", method),
        ];
        headers.extend_from_slice(extra);
        gate.get_with("/auth", &headers)
    };
    assert_eq!(auth("/robots.txt", "GET", &[]).status, 204);
    let r = auth("/docs/a%20b?x=1&y=2", "GET", &[]);
    assert_eq!(r.status, 401);
    let location = r.header("x-gate-location").unwrap().to_string();
    assert_eq!(
        location,
        "/.tern-gate/enter?return=/docs/a%2520b%3Fx%3D1%26y%3D2"
    );
    // A challenged POST is refused, not redirected.
    assert_eq!(auth("/form", "POST", &[]).status, 403);
    // The redirect target serves the challenge for the original page.
    let page = gate.get_with(&location, &[("User-Agent", FIREFOX)]);
    assert_eq!(page.status, 403);
    let passed = solve_and_pass(&gate, &page, FIREFOX);
    assert_eq!(passed.status, 303);
    assert_eq!(passed.header("location"), Some("/docs/a%20b?x=1&y=2"));
    let cookie = cookie_of(&passed);
    let r = auth("/docs/", "GET", &[("Cookie", &cookie)]);
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("x-auth-user"),
        None,
        "a browser check names no account"
    );
    // Staff pages want a staff login; the guest pass is not one.
    assert_eq!(
        auth("/private/secret.txt", "GET", &[("Cookie", &cookie)]).status,
        401
    );
    // Counters are for this machine.
    assert_eq!(gate.get("/statusz").status, 200);
    assert!(gate
        .get("/metrics")
        .text()
        .contains("tern_gate_challenges_passed_total 1"));
}

#[test]
fn bad_gate_configs_stop_the_start_with_one_line() {
    let setup = Setup::new("[[rule]]\nname = \"x\"\naction = \"jump\"\n", "");
    let failed = Tern::start_failing(
        &setup.path("site"),
        &["--gate", setup.path("gate.toml").to_str().unwrap()],
    );
    assert!(!failed.status.success());
    assert!(
        failed.stderr.contains("policy.toml") && failed.stderr.contains("line 3"),
        "{}",
        failed.stderr
    );
    let setup = Setup::new("", "cookie_name = \"x\"");
    let failed = Tern::start_failing(
        &setup.path("site"),
        &["--gate", setup.path("gate.toml").to_str().unwrap()],
    );
    assert!(
        failed.stderr.contains("gate.toml: line 3"),
        "{}",
        failed.stderr
    );
    let ok = Command::new(TERN)
        .args(["gate", "--check", "--config"])
        .arg(Setup::new(POLICY, "").path("gate.toml"))
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("is valid: 1 realm(s), "));
}

/// A gate whose password pool has one thread and `queue` places, the per-network limits out
/// of the way, and alice's password hashed at bcrypt `cost`.
fn flood_setup(queue: usize, cost: u32) -> Setup {
    let setup = Setup::new(
        POLICY,
        &format!(
            "[pool]\nthreads = 1\nqueue = {queue}\n[limits]\nlogin_per_minute = 100000\n\
             login_burst = 100000\nfailures_per_user = 100000\n"
        ),
    );
    let hash = bcrypt::hash("hunter2", cost).unwrap();
    std::fs::write(setup.path("staff.htpasswd"), format!("alice:{hash}\n")).unwrap();
    setup
}

/// Posts alice's login with a wrong password (from `net`, named through the trusted loopback
/// proxy, if given) and returns the status.
fn wrong_login(addr: std::net::SocketAddr, csrf: &str, net: Option<&str>) -> u16 {
    let body = format!(
        "realm=staff&user=alice&password=wrong&return=%2F&csrf={}",
        enc(csrf)
    );
    let forwarded = net.map_or(String::new(), |n| format!("X-Forwarded-For: {n}\r\n"));
    let mut c = Client::connect(addr);
    c.send(
        format!(
            "POST /.tern-gate/login HTTP/1.1\r\nHost: x\r\n{forwarded}\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    c.read_response(false).status
}

#[test]
fn a_login_flood_never_slows_the_site() {
    // One hash thread, a short queue: most of the flood is turned away at once (503), and
    // hashing runs off the workers, so a static client keeps its speed.
    // A realistic cost (bcrypt 10: tens of milliseconds a hash, more in the debug build the
    // tests run), so the pool is really busy. Behind twelve flooders a hash on a worker would
    // stall pages for several hashes' time, far beyond the bound below, while a loaded
    // machine's scheduling noise stays under it (10 ms, the bound before, was not: it failed
    // once with the load average at 5): the assertion tells where hashing runs, not how fast
    // this machine is.
    let setup = flood_setup(4, 10);
    let tern = setup.serve(&[]);
    let html = tern
        .get_with("/private/x", &[("User-Agent", FIREFOX)])
        .text();
    let csrf = field(&html, "csrf").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flooders: Vec<_> = (0..12)
        .map(|_| {
            let stop = stop.clone();
            let addr = tern.addr();
            let csrf = csrf.clone();
            std::thread::spawn(move || {
                let mut statuses = std::collections::HashMap::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    *statuses
                        .entry(wrong_login(addr, &csrf, None))
                        .or_insert(0u32) += 1;
                }
                statuses
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut c = tern.client();
    let mut times = Vec::new();
    for _ in 0..400 {
        let t = Instant::now();
        let r = c.get("/robots.txt", &[]);
        times.push(t.elapsed());
        assert_eq!(r.status, 200);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut seen = std::collections::HashMap::new();
    for f in flooders {
        for (k, v) in f.join().unwrap() {
            *seen.entry(k).or_insert(0) += v;
        }
    }
    times.sort();
    let p99 = times[times.len() * 99 / 100];
    assert!(
        seen.get(&401).copied().unwrap_or(0) > 0,
        "some passwords were checked: {seen:?}"
    );
    assert!(
        seen.get(&503).copied().unwrap_or(0) > 0,
        "a full queue answers 503: {seen:?}"
    );
    assert!(
        p99 < Duration::from_millis(250),
        "p99 {p99:?} during the flood ({seen:?})"
    );
}

/// nginx (the Debian package; scripts/install-gate-test-deps) in front, with the configuration
/// the README gives, serving the site itself and asking `tern gate` about every request.
struct Nginx {
    child: std::process::Child,
    port: u16,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nginx_binary() -> Option<PathBuf> {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

fn start_nginx(setup: &Setup, gate: std::net::SocketAddr) -> Option<Nginx> {
    let Some(nginx) = nginx_binary() else {
        eprintln!("SKIPPED: nginx is not installed (scripts/install-gate-test-deps installs it)");
        return None;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tmp = setup.path("nginx");
    std::fs::create_dir_all(&tmp).unwrap();
    let t = tmp.display();
    let conf = format!(
        r#"daemon off;
master_process off;
worker_processes 1;
error_log {t}/error.log;
pid {t}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {t}/body;
    proxy_temp_path {t}/proxy;
    fastcgi_temp_path {t}/fastcgi;
    uwsgi_temp_path {t}/uwsgi;
    scgi_temp_path {t}/scgi;
    {upstream}
    server {{
        listen 127.0.0.1:{port};
        root {site};
{snippet}
    }}
}}
"#,
        site = setup.path("site").display(),
        snippet = NGINX_SNIPPET,
        upstream = NGINX_UPSTREAM.replace("127.0.0.1:9000", &gate.to_string()),
    );
    let path = tmp.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    let child = Command::new(nginx)
        .arg("-c")
        .arg(&path)
        .arg("-p")
        .arg(&tmp)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nginx did not start: {:?}",
            std::fs::read_to_string(tmp.join("error.log"))
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(Nginx { child, port })
}

/// The `http` block line of the README's nginx configuration: kept-alive connections to the
/// gate, so an auth question costs no connection set-up.
const NGINX_UPSTREAM: &str = "upstream tern_gate { server 127.0.0.1:9000; keepalive 128; }";

/// The `server` block lines of the README's nginx configuration (kept identical to it: a
/// test below checks that the README holds them).
const NGINX_SNIPPET: &str = r#"        # Every request asks tern gate first.
        location / {
            auth_request /.tern-gate-auth;
            auth_request_set $gate_location $upstream_http_x_gate_location;
            auth_request_set $gate_user $upstream_http_x_auth_user;
            error_page 401 = @tern_gate;
            # For an app behind nginx: proxy_set_header X-Auth-User $gate_user;
            add_header X-Auth-User $gate_user;
        }
        # The question: is the original request allowed?
        location = /.tern-gate-auth {
            internal;
            proxy_pass http://tern_gate/auth;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
            proxy_set_header X-Original-Method $request_method;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
        }
        # Not yet: to the challenge or the login form, with the original address.
        location @tern_gate {
            return 303 $gate_location;
        }
        # The gate's own pages: login form, challenge, its scripts.
        location /.tern-gate/ {
            proxy_pass http://tern_gate;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
        }
"#;

/// A client of nginx (the support `Client` talks to any address).
fn via(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut c = Client::connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        head.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    c.send(head.as_bytes());
    c.send(body.as_bytes());
    c.read_response(method == "HEAD")
}

/// The path part of an absolute Location nginx sends.
fn local(location: &str) -> String {
    match location.split_once("://") {
        Some((_, rest)) => rest[rest.find('/').unwrap_or(rest.len())..].to_string(),
        None => location.to_string(),
    }
}

#[test]
fn nginx_in_front_sends_browsers_through_the_challenge_and_the_login() {
    let setup = Setup::new(POLICY, "");
    let gate = setup.gate();
    let Some(nginx) = start_nginx(&setup, gate.addr()) else {
        return;
    };
    let port = nginx.port;
    let ua = ("User-Agent", FIREFOX);
    // Protected page → challenge → page.
    let r = via(port, "GET", "/index.html", &[ua], "");
    assert_eq!(r.status, 303, "{}", r.text());
    let enter = local(r.header("location").unwrap());
    assert!(enter.starts_with("/.tern-gate/enter?return="), "{enter}");
    let page = via(port, "GET", &enter, &[ua], "");
    assert_eq!(page.status, 403, "{}", page.text());
    let html = page.text();
    let challenge = attr(&html, "data-challenge").unwrap();
    let difficulty: u8 = attr(&html, "data-difficulty").unwrap().parse().unwrap();
    let counter = tern_gate::pow::solve(&challenge, difficulty).to_string();
    let body = format!(
        "challenge={}&counter={counter}&return={}",
        enc(&challenge),
        enc(&field(&html, "return").unwrap())
    );
    let passed = via(port, "POST", "/.tern-gate/pass", &[ua], &body);
    assert_eq!(passed.status, 303, "{}", passed.text());
    assert_eq!(local(passed.header("location").unwrap()), "/index.html");
    let cookie = cookie_of(&passed);
    let r = via(port, "GET", "/index.html", &[ua, ("Cookie", &cookie)], "");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "<p>the guarded page</p>\n");
    assert_eq!(
        r.header("x-auth-user"),
        None,
        "a browser check names no account"
    );
    // Protected page → login page → log in → page.
    let r = via(port, "GET", "/private/secret.txt", &[ua], "");
    assert_eq!(r.status, 303);
    let login_page = via(
        port,
        "GET",
        &local(r.header("location").unwrap()),
        &[ua],
        "",
    );
    assert_eq!(login_page.status, 401);
    let html = login_page.text();
    let body = format!(
        "realm=staff&user=alice&password=hunter2&return={}&csrf={}",
        enc(&field(&html, "return").unwrap()),
        enc(&field(&html, "csrf").unwrap())
    );
    let r = via(
        port,
        "POST",
        "/.tern-gate/login",
        &[ua, ("Origin", &format!("http://127.0.0.1:{port}"))],
        &body,
    );
    assert_eq!(r.status, 303, "{}", r.text());
    assert_eq!(local(r.header("location").unwrap()), "/private/secret.txt");
    let staff = cookie_of(&r);
    let r = via(
        port,
        "GET",
        "/private/secret.txt",
        &[ua, ("Cookie", &staff)],
        "",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "for staff only\n");
    assert_eq!(r.header("x-auth-user"), Some("alice"));
    // nginx never treats a refusal as success: a challenged POST is refused.
    let r = via(port, "POST", "/index.html", &[ua], "");
    assert_eq!(r.status, 403);
    // The gate's pages are proxied, its counters are not for the world: nginx relays every
    // client from loopback, and says for whom. (The test's clients are all on this machine;
    // one elsewhere is played by a proxy in front of nginx naming it.)
    let elsewhere = ("X-Forwarded-For", "203.0.113.9");
    for page in ["/.tern-gate/statusz", "/.tern-gate/metrics"] {
        assert_eq!(
            via(port, "GET", page, &[ua, elsewhere], "").status,
            403,
            "{page}"
        );
    }
    assert_eq!(
        via(port, "GET", "/.tern-gate/statusz", &[ua], "").status,
        200,
        "this machine"
    );
}

#[test]
fn the_readme_holds_the_tested_nginx_configuration() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    for line in NGINX_SNIPPET
        .lines()
        .chain([NGINX_UPSTREAM])
        .filter(|l| !l.trim().is_empty())
    {
        assert!(
            readme.contains(line.trim()),
            "README lacks {:?}",
            line.trim()
        );
    }
}

#[test]
fn sighup_swaps_in_a_new_policy_and_a_bad_one_changes_nothing() {
    let setup = Setup::new(POLICY, "");
    let tern = setup.serve(&[]);
    assert_eq!(tern.get_with("/", &[("User-Agent", FIREFOX)]).status, 403);
    let page = tern.get_with("/", &[("User-Agent", FIREFOX)]);
    let cookie = cookie_of(&solve_and_pass(&tern, &page, FIREFOX));
    // Browsers now get in without a check; the session from before still counts where one
    // is needed.
    std::fs::write(
        setup.path("policy.toml"),
        POLICY.replace(
            "name = \"browsers\"\naction = \"challenge\"\nuser_agent = \"Mozilla\"\ndifficulty = 10",
            "name = \"browsers\"\naction = \"allow\"\nuser_agent = \"Mozilla\"",
        ),
    )
    .unwrap();
    tern.reload(2);
    assert!(
        tern.log_lines("reload (SIGHUP): gate: config, 5 policy rules")
            .len()
            == 1,
        "{}",
        tern.stderr_text()
    );
    assert_eq!(tern.get_with("/", &[("User-Agent", FIREFOX)]).status, 200);
    // A broken policy: one line, and the running one stays.
    std::fs::write(
        setup.path("policy.toml"),
        "[[rule]]\nname = \"x\"\naction = \"jump\"\n",
    )
    .unwrap();
    tern.reload(4);
    let failed = tern.log_lines("gate unchanged");
    assert_eq!(failed.len(), 1, "{}", tern.stderr_text());
    assert!(failed[0].contains("line 3"), "{}", failed[0]);
    assert_eq!(tern.get_with("/", &[("User-Agent", FIREFOX)]).status, 200);
    assert_eq!(
        tern.get_with(
            "/private/secret.txt",
            &[("User-Agent", FIREFOX), ("Cookie", &cookie)]
        )
        .status,
        401,
        "a pass is not a staff login"
    );
}

#[test]
fn the_demo_behind_the_gate_counts_in_its_statusz() {
    let setup = Setup::new(POLICY, "");
    let data = setup.path("data");
    let config = setup.path("gate.toml");
    let tern = Tern::start_demo(&data, &["--gate", config.to_str().unwrap()]);
    let page = tern.get_with("/", &[("User-Agent", FIREFOX)]);
    assert_eq!(page.status, 403);
    let passed = solve_and_pass(&tern, &page, FIREFOX);
    assert_eq!(passed.status, 303);
    let cookie = cookie_of(&passed);
    let r = tern.get_with("/ip", &[("User-Agent", FIREFOX), ("Cookie", &cookie)]);
    assert_eq!(r.status, 200);
    // curl is let through by the policy, and the game's /statusz carries the gate's counters.
    assert_eq!(tern.statusz("gate_challenges_passed"), 1);
    assert!(tern.statusz("gate_challenges_issued{kind=\"pow\"}") >= 1);
}

#[test]
fn tern_run_puts_the_gate_in_front_of_the_routes_that_ask_for_it() {
    let setup = Setup::new(POLICY, "");
    std::fs::create_dir_all(setup.path("public")).unwrap();
    std::fs::write(setup.path("public/open.txt"), "open to all\n").unwrap();
    let config = setup.path("tern.toml");
    std::fs::write(
        &config,
        format!(
            "gate = \"gate.toml\"\n\n[[site]]\nname = \"main\"\ndefault = true\n\n\
             [[site.route]]\npath = \"/\"\nstatic = {site:?}\ngate = true\n\n\
             [[site.route]]\npath = \"/public\"\nstatic = {root:?}\n",
            site = setup.path("site"),
            root = setup.tmp.path(),
        ),
    )
    .unwrap();
    let mut cmd = Command::new(TERN);
    cmd.args(["run", "--config"])
        .arg(&config)
        .args(LISTEN)
        .args(["--workers", "2", "--sandbox", "on"]);
    let tern = Tern::spawn(cmd);
    let ua = ("User-Agent", FIREFOX);
    assert_eq!(tern.get_with("/public/open.txt", &[ua]).status, 200);
    let page = tern.get_with("/index.html", &[ua]);
    assert_eq!(page.status, 403);
    let cookie = cookie_of(&solve_and_pass(&tern, &page, FIREFOX));
    let r = tern.get_with("/index.html", &[ua, ("Cookie", &cookie)]);
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "<p>the guarded page</p>\n");
    // A guarded route without a gate config is a checked error with its line.
    std::fs::write(
        &config,
        "[[site]]\nname = \"main\"\ndefault = true\n[[site.route]]\npath = \"/\"\nrespond = \"x\"\ngate = true\n",
    )
    .unwrap();
    let out = Command::new(TERN)
        .args(["run", "--check", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("line 7: gate = true needs a gate config"),
        "{err}"
    );
    assert!(
        err.contains("gate = true is for static, app and proxy routes"),
        "{err}"
    );
}

#[test]
fn exec_checkers_run_in_helpers_outside_the_sandbox() {
    use std::os::unix::fs::PermissionsExt;
    let setup = Setup::new(
        "[[rule]]\nname = \"ops\"\naction = \"login\"\nrealm = \"ops\"\npath_prefix = \"/private/\"\n",
        "[[realm]]\nname = \"ops\"\ncheckers = [\"exec:check-password\"]\nexec_timeout_ms = 2000\n",
    );
    let script = setup.path("check-password");
    std::fs::write(
        &script,
        "#!/bin/sh\nread pw\n[ \"$1\" = bob ] && [ \"$pw\" = 'sw0rd fish' ]\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    // The suite runs with --sandbox on: seccomp forbids the workers to start programs, so a
    // login that works proves the helper ran it (and the sandbox refused nothing: the test
    // fails on any refusal when `tern` is dropped).
    let tern = setup.serve(&[]);
    let page = tern.get_with("/private/secret.txt", &[("User-Agent", FIREFOX)]);
    assert_eq!(page.status, 401);
    let csrf = field(&page.text(), "csrf").unwrap();
    let login = |password: &str| {
        post_form(
            &tern,
            "/.tern-gate/login",
            &[
                ("realm", "ops"),
                ("user", "bob"),
                ("password", password),
                ("return", "/private/secret.txt"),
                ("csrf", &csrf),
            ],
            &[],
        )
    };
    assert_eq!(login("wrong").status, 401);
    let r = login("sw0rd fish");
    assert_eq!(r.status, 303, "{}", r.text());
    let cookie = cookie_of(&r);
    assert!(cookie.starts_with("tern_gate.ops="));
    assert_eq!(
        tern.get_with("/private/secret.txt", &[("Cookie", &cookie)])
            .status,
        200
    );
}

/// The seams review (issue 21 item 2): nginx decodes `%2F` and resolves dot segments before it
/// picks a file, while the gate hears the raw `$request_uri`. No spelling of a staff page gets
/// its bytes out: the gate judges the canonical path, and one that has none (an encoded slash
/// that nginx would turn into a separator) is refused, never judged as sent. Prefix rules hold
/// on segment boundaries (`/robots.txt` does not cover `/robots.txt.bak`).
#[test]
fn nginx_in_front_cannot_be_walked_past_the_gate_by_spelling() {
    let setup = Setup::new(POLICY, "");
    std::fs::write(setup.path("site/robots.txt.bak"), "old robots\n").unwrap();
    let gate = setup.gate();
    let Some(nginx) = start_nginx(&setup, gate.addr()) else {
        return;
    };
    let curl = ("User-Agent", "curl/8.5.0");
    assert_eq!(
        via(nginx.port, "GET", "/robots.txt", &[curl], "").status,
        200
    );
    for path in [
        "/robots.txt%2F..%2Fprivate/secret.txt",
        "/robots.txt%2f..%2fprivate%2fsecret.txt",
        "/.well-known/..%2Fprivate/secret.txt",
        "/private%2Fsecret.txt",
        "/%70rivate/secret.txt",
        "//private/secret.txt",
        "/robots.txt/../private/secret.txt",
        "/robots.txt/%2e%2e/private/secret.txt",
        // nginx ends the path at a raw `#`; the gate must not resolve the dots after it.
        "/private/secret.txt#/../../robots.txt",
        "http://localhost/private/secret.txt#/../../robots.txt",
    ] {
        let r = via(nginx.port, "GET", path, &[curl], "");
        assert!(
            !r.text().contains("for staff only"),
            "{path}: {} {}",
            r.status,
            r.text()
        );
        assert_ne!(r.status, 200, "{path}");
    }
    let r = via(
        nginx.port,
        "GET",
        "/robots.txt.bak",
        &[("User-Agent", FIREFOX)],
        "",
    );
    assert_eq!(r.status, 303, "a browser is challenged for /robots.txt.bak");
    assert!(gate.counter_at("/statusz", "gate_paths_refused") >= 5);
}

/// A policy with three prices: a time-lock for clients without a user agent, a light proof
/// of work for browsers, a heavier one under /hard/, and one more for no-UA clients under
/// /work/.
const TIERS: &str = r#"
[[rule]]
name = "work-for-all"
action = "challenge"
path_prefix = "/work/"
difficulty = 4

[[rule]]
name = "hard"
action = "challenge"
path_prefix = "/hard/"
difficulty = 12

[[rule]]
name = "staff"
action = "login"
path_prefix = "/private/"
realm = "staff"

[[rule]]
name = "no-user-agent"
action = "timelock"
user_agent = "^$"
seconds = 1

[[rule]]
name = "browsers"
action = "challenge"
user_agent = "Mozilla"
difficulty = 4
"#;

/// Waits out a time-lock page like a client without JavaScript: the refresh URL, after the
/// page's seconds (and half a second for the whole-second clocks). The session cookie.
fn wait_out_time_lock(tern: &Tern, page: &Resp, headers: &[(&str, &str)]) -> String {
    let html = page.text();
    let at = html.find("http-equiv=\"refresh\"").expect("a meta refresh");
    let refresh = attr(&html[at..], "content").unwrap();
    let (seconds, url) = refresh
        .split_once(";url=")
        .or_else(|| refresh.split_once("; url="))
        .unwrap();
    let seconds: u64 = seconds.trim().parse().unwrap();
    std::thread::sleep(Duration::from_millis(seconds * 1000 + 500));
    let r = tern.get_with(url, headers);
    assert_eq!(r.status, 303, "{}", r.text());
    cookie_of(&r)
}

#[test]
fn a_session_settles_only_what_it_paid_for_and_only_for_its_user_agent() {
    let setup = Setup::new(TIERS, "");
    let tern = setup.serve(&[]);
    // No user agent: a time-lock, waited out.
    let page = tern.get("/index.html");
    assert_eq!(page.status, 403);
    let waited = wait_out_time_lock(&tern, &page, &[]);
    assert_eq!(
        tern.get_with("/index.html", &[("Cookie", &waited)]).status,
        200
    );
    // The wait is not a proof of work, with or without a user agent.
    let r = tern.get_with("/work/x", &[("Cookie", &waited)]);
    assert_eq!(r.status, 403, "a time-lock pass settled a challenge");
    assert!(r.text().contains("data-challenge"));
    let r = tern.get_with(
        "/index.html",
        &[("User-Agent", FIREFOX), ("Cookie", &waited)],
    );
    assert_eq!(r.status, 403, "a time-lock pass worked for a browser");
    // A browser's proof of work: good for that browser, at its own and lower prices ...
    let page = tern.get_with("/index.html", &[("User-Agent", FIREFOX)]);
    let work = cookie_of(&solve_and_pass(&tern, &page, FIREFOX));
    let firefox = [("User-Agent", FIREFOX), ("Cookie", work.as_str())];
    assert_eq!(tern.get_with("/index.html", &firefox).status, 200);
    assert_eq!(tern.get_with("/work/x", &firefox).status, 404);
    // ... and after the browser updates itself (only the version numbers change) ...
    let updated = FIREFOX.replace("132.0", "133.0.1");
    assert_eq!(
        tern.get_with(
            "/index.html",
            &[("User-Agent", &updated), ("Cookie", &work)]
        )
        .status,
        200
    );
    // ... but not for a dearer rule, another user agent, or none.
    let r = tern.get_with("/hard/x", &firefox);
    assert_eq!(r.status, 403, "a 4-bit pass settled a 12-bit rule");
    let chrome = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36";
    assert_eq!(
        tern.get_with("/index.html", &[("User-Agent", chrome), ("Cookie", &work)])
            .status,
        403,
        "a pass moved to another browser"
    );
    assert_eq!(
        tern.get_with("/index.html", &[("Cookie", &work)]).status,
        403,
        "a pass used without a user agent"
    );
    // A guest login is a proof of work too: not a password login's equal elsewhere, and
    // bound to its browser like any session.
    let page = tern.get_with(
        "/.tern-gate/guest?realm=staff&return=%2Fprivate%2Fsecret.txt",
        &[("User-Agent", FIREFOX)],
    );
    let guest = cookie_of(&solve_and_pass(&tern, &page, FIREFOX));
    assert_eq!(
        tern.get_with(
            "/private/secret.txt",
            &[("User-Agent", FIREFOX), ("Cookie", &guest)]
        )
        .status,
        200
    );
    assert_eq!(
        tern.get_with(
            "/private/secret.txt",
            &[("User-Agent", chrome), ("Cookie", &guest)]
        )
        .status,
        401
    );
    assert_eq!(
        tern.get_with("/hard/x", &[("User-Agent", FIREFOX), ("Cookie", &guest)])
            .status,
        403,
        "an 8-bit guest pass settled a 12-bit rule"
    );
    assert!(
        tern.counter_at(
            "/.tern-gate/statusz",
            "gate_sessions_refused{cause=\"wrong_client\"}"
        ) >= 1
    );
    assert!(
        tern.counter_at(
            "/.tern-gate/statusz",
            "gate_sessions_refused{cause=\"too_weak\"}"
        ) >= 1
    );
}

#[test]
fn the_default_policy_judges_writes_like_reads() {
    const GPTBOT: &str = "Mozilla/5.0 AppleWebKit/537.36 (KHTML, like Gecko; compatible; GPTBot/1.2; +https://openai.com/gptbot)";
    let setup = Setup::new("", "");
    let tern = setup.serve(&[]);
    let post = |ua: &str, cookie: Option<&str>| {
        let mut headers = vec![("User-Agent", ua), ("Content-Length", "0")];
        if let Some(c) = cookie {
            headers.push(("Cookie", c));
        }
        tern.client().request("POST", "/form", &headers)
    };
    // A refused crawler is refused whatever it sends, and may still read robots.txt.
    assert_eq!(post(GPTBOT, None).status, 403);
    assert_eq!(
        tern.get_with("/favicon.ico", &[("User-Agent", GPTBOT)])
            .status,
        403
    );
    assert_eq!(
        tern.get_with("/robots.txt", &[("User-Agent", GPTBOT)])
            .status,
        200
    );
    // A browser's post needs the session its reads need; the site sees it only then.
    assert_eq!(post(FIREFOX, None).status, 403);
    let page = tern.get_with("/", &[("User-Agent", FIREFOX)]);
    let cookie = cookie_of(&solve_and_pass(&tern, &page, FIREFOX));
    let r = post(FIREFOX, Some(&cookie));
    assert!(r.status != 403, "{} {}", r.status, r.text());
    // Tools the policy lets in by name (spoofable, and it says so) may post.
    assert_ne!(post("curl/8.5.0", None).status, 403);
}

/// An app server on 127.0.0.1 that answers every request `200 ok` and keeps the heads it
/// was sent (GETs without bodies).
struct HeadRecorder {
    addr: std::net::SocketAddr,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl HeadRecorder {
    fn start() -> HeadRecorder {
        use std::io::{BufRead, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = heads.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let kept = kept.clone();
                std::thread::spawn(move || {
                    let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
                    loop {
                        let mut head = String::new();
                        loop {
                            let mut line = String::new();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return;
                            }
                            head.push_str(&line);
                            if line == "\r\n" {
                                break;
                            }
                        }
                        kept.lock().unwrap().push(head);
                        let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
                    }
                });
            }
        });
        HeadRecorder { addr, heads }
    }

    /// The head of the last request that reached the app.
    fn last(&self) -> String {
        self.heads
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or_default()
    }
}

/// `name: value` lines of `head` for `name` (any case).
fn fields(head: &str, name: &str) -> Vec<String> {
    head.lines()
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
        .collect()
}

#[test]
fn a_proxied_app_learns_the_user_from_the_gate_and_never_from_the_client() {
    let setup = Setup::new(POLICY, "");
    let app = HeadRecorder::start();
    let config = setup.path("tern.toml");
    std::fs::write(
        &config,
        format!(
            "gate = \"gate.toml\"\n\n[[site]]\nname = \"main\"\ndefault = true\n\n\
             [[site.route]]\npath = \"/\"\nproxy = \"{}\"\ngate = true\n",
            app.addr
        ),
    )
    .unwrap();
    let mut cmd = Command::new(TERN);
    cmd.args(["run", "--config"])
        .arg(&config)
        .args(LISTEN)
        .args(["--workers", "2", "--sandbox", "on"]);
    let tern = Tern::spawn(cmd);
    let lies = [
        ("X-Auth-User", "admin"),
        ("X-Auth-Realm", "staff"),
        ("X-Real-IP", "10.0.0.1"),
        ("True-Client-IP", "10.0.0.1"),
        ("X-Forwarded-Port", "443"),
        ("X-Forwarded-Prefix", "/admin"),
        ("X-Original-URL", "/admin/delete"),
    ];
    // A tool the policy lets through, claiming to be someone: the app hears none of it.
    let mut headers = vec![("User-Agent", "curl/8.5.0")];
    headers.extend_from_slice(&lies);
    assert_eq!(tern.get_with("/page", &headers).status, 200);
    let head = app.last();
    assert!(head.starts_with("GET /page "), "{head}");
    for (name, _) in lies {
        assert_eq!(fields(&head, name), Vec::<String>::new(), "{name}: {head}");
    }
    // Alice logs in; behind the login rule the app hears her name, from her session.
    let page = tern.get_with("/private/x", &[("User-Agent", FIREFOX)]);
    assert_eq!(page.status, 401);
    let csrf = field(&page.text(), "csrf").unwrap();
    let r = post_form(
        &tern,
        "/.tern-gate/login",
        &[
            ("realm", "staff"),
            ("user", "alice"),
            ("password", "hunter2"),
            ("return", "/private/x"),
            ("csrf", &csrf),
        ],
        &[("User-Agent", FIREFOX)],
    );
    assert_eq!(r.status, 303, "{}", r.text());
    let cookie = cookie_of(&r);
    let cookies = format!("theme=dark; {cookie}");
    let mut headers = vec![("User-Agent", FIREFOX), ("Cookie", cookies.as_str())];
    headers.extend_from_slice(&lies);
    assert_eq!(tern.get_with("/private/x", &headers).status, 200);
    let head = app.last();
    assert!(head.starts_with("GET /private/x "), "{head}");
    // The session cookie stays with the gate: the app gets its own cookies only.
    assert_eq!(
        fields(&head, "cookie"),
        vec!["theme=dark".to_string()],
        "{head}"
    );
    assert_eq!(
        fields(&head, "x-auth-user"),
        vec!["alice".to_string()],
        "{head}"
    );
    assert_eq!(
        fields(&head, "x-auth-realm"),
        vec!["staff".to_string()],
        "{head}"
    );
    // Her session names her on the pages the policy lets anyone see, too.
    let r = tern.get_with(
        "/robots.txt",
        &[("User-Agent", FIREFOX), ("Cookie", &cookie)],
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        fields(&app.last(), "x-auth-user"),
        vec!["alice".to_string()]
    );
    // A guest of the realm (it offers guest logins) passes its login rule, but is nobody's
    // account: the app cannot take it for one.
    let page = tern.get_with(
        "/.tern-gate/guest?realm=staff&return=%2Fprivate%2Fx",
        &[("User-Agent", FIREFOX)],
    );
    let guest = cookie_of(&solve_and_pass(&tern, &page, FIREFOX));
    let mut headers = vec![("User-Agent", FIREFOX), ("Cookie", guest.as_str())];
    headers.extend_from_slice(&lies);
    assert_eq!(tern.get_with("/private/x", &headers).status, 200);
    let head = app.last();
    assert!(head.starts_with("GET /private/x "), "{head}");
    assert_eq!(fields(&head, "x-auth-user"), Vec::<String>::new(), "{head}");
    assert_eq!(
        fields(&head, "x-auth-realm"),
        Vec::<String>::new(),
        "{head}"
    );
}

#[test]
fn a_network_with_no_failures_logs_in_under_a_distributed_flood() {
    // One hash thread and eight places in its queue, against 40 networks (each within the
    // per-network limits, which are set out of the way) posting wrong passwords without
    // pause: far more claims than places. Every legitimate login from a network that has
    // not failed must still get in.
    let setup = flood_setup(8, 6);
    let tern = setup.serve(&[]);
    let form = |net: &str| -> String {
        let page = tern.get_with(
            "/private/x",
            &[("User-Agent", FIREFOX), ("X-Forwarded-For", net)],
        );
        assert_eq!(page.status, 401);
        field(&page.text(), "csrf").unwrap()
    };
    const FLOOD_NETS: usize = 40;
    let flood: Vec<(String, String)> = (0..FLOOD_NETS)
        .map(|i| {
            let net = format!("10.0.{i}.1");
            let csrf = form(&net);
            (net, csrf)
        })
        .collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Which flood networks have had a wrong password checked (and so recorded) yet.
    let failed: std::sync::Arc<Vec<std::sync::atomic::AtomicBool>> = std::sync::Arc::new(
        (0..FLOOD_NETS)
            .map(|_| std::sync::atomic::AtomicBool::new(false))
            .collect(),
    );
    let flooders: Vec<_> = (0..24)
        .map(|t| {
            let (stop, failed, flood, addr) =
                (stop.clone(), failed.clone(), flood.clone(), tern.addr());
            std::thread::spawn(move || {
                let mut i = t;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let n = i % FLOOD_NETS;
                    i += 24;
                    let (net, csrf) = &flood[n];
                    let status = wrong_login(addr, csrf, Some(net));
                    assert!(matches!(status, 401 | 503), "{status}");
                    if status == 401 {
                        failed[n].store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // The flood is in full swing once each of its networks has failed at least once.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !failed
        .iter()
        .all(|f| f.load(std::sync::atomic::Ordering::Relaxed))
    {
        assert!(Instant::now() < deadline, "the flood never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut statuses = Vec::new();
    for i in 0..19 {
        let net = format!("172.16.{i}.1");
        let csrf = form(&net);
        let r = post_form(
            &tern,
            "/.tern-gate/login",
            &[
                ("realm", "staff"),
                ("user", "alice"),
                ("password", "hunter2"),
                ("return", "/"),
                ("csrf", &csrf),
            ],
            &[("User-Agent", FIREFOX), ("X-Forwarded-For", &net)],
        );
        statuses.push(r.status);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    assert_eq!(statuses, vec![303; 19], "legitimate logins under the flood");
    assert!(tern.counter_at("/.tern-gate/statusz", "gate_logins{outcome=\"busy\"}") > 0);
}
