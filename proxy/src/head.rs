//! The request head an upstream sees. Fields that concern only the hop from the client
//! (RFC 9110 §7.6.1: Connection and the fields it names, Keep-Alive, TE, Trailer,
//! Transfer-Encoding, Upgrade, Proxy-*) are dropped, and so are the framing fields (the relay
//! writes its own) and Expect (tern answered `100 Continue` itself). The forwarding fields
//! are extended when the peer is a trusted proxy and replaced otherwise, so a client can
//! never put words in a proxy's mouth; the other fields in which proxies tell apps who the
//! client is (`X-Real-IP`, `X-Auth-User`, `X-Original-URL`...) are dropped, and
//! `X-Auth-User`/`X-Auth-Realm` come only from the gate in front of the route.
//! What a route changes of it is its [`ProxyOptions`].

use std::net::IpAddr;

use tern_cache::key::normal_host;
use tern_server::{connection_lists, trim_ows, Identity, Request, RequestId};
use tern_services::template::Values;
use tern_services::TrustedProxies;

/// How a proxy route rewrites requests.
#[derive(Debug, Clone, Default)]
pub struct ProxyOptions {
    /// The Host the upstream sees; None: the client's own.
    pub host: Option<String>,
    /// Peers whose `X-Forwarded-*`/`Forwarded` fields are extended rather than replaced.
    pub trusted: TrustedProxies,
    /// The gate's cookie name, when a gate runs on this server: its session cookies
    /// (`NAME`, `NAME.realm`, `__Host-` ones) are kept from the app, which has no use for
    /// them and could leak them (a log of request headers).
    pub gate_cookie: Option<String>,
    /// Edits of the request head the app gets (`add_request_headers`,
    /// `remove_request_headers`), after tern's own fields.
    pub request_headers: RequestEdits,
}

/// Fields set on (replacing any of the same name, the client's or tern's forwarding ones)
/// or removed from the request an app gets; values may hold `$client`, `$scheme`, `$host`,
/// `$request_id`.
#[derive(Debug, Clone, Default)]
pub struct RequestEdits {
    pub set: Vec<(String, tern_services::template::Template)>,
    pub remove: Vec<String>,
}

impl RequestEdits {
    fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }

    /// Whether the field `name` is dropped for an edit.
    fn replaces(&self, name: &str) -> bool {
        self.remove.iter().any(|n| n.eq_ignore_ascii_case(name))
            || self.set.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
}

/// Fields never forwarded as they came.
const DROPPED: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "expect",
    // The method the app would run instead of the one tern (and the gate) decided on:
    // Symfony, Laravel and Express honour these.
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Fields in which a proxy tells the app about the client: who it is, where it connected
/// from, what it asked for. Apps believe them, so only tern writes them (`X-Forwarded-For`,
/// `-Proto`, `-Host`, `Forwarded`, and `X-Auth-User`/`-Realm` from the gate's session);
/// copies sent to tern are dropped, even from a trusted proxy, whose word about the client
/// is taken through X-Forwarded-For and Forwarded only. Whole families by prefix, so a
/// variant nobody listed (`X-Forwarded-Uri`, `X-Auth-Request-Email`) is dropped too.
const CLAIM_PREFIXES: &[&str] = &["x-forwarded-", "x-original-", "x-auth-"];
const CLAIMS: &[&str] = &[
    "forwarded",
    "x-real-ip",
    "true-client-ip",
    "x-client-ip",
    "client-ip",
    "cf-connecting-ip",
    "fastly-client-ip",
    "x-cluster-client-ip",
    "x-rewrite-url",
    "remote-user",
    "x-remote-user",
];

fn is_claim(name: &str) -> bool {
    CLAIMS.iter().any(|c| name.eq_ignore_ascii_case(c))
        || CLAIM_PREFIXES
            .iter()
            .any(|p| name.len() > p.len() && name[..p.len()].eq_ignore_ascii_case(p))
}

pub struct Built {
    pub head: Vec<u8>,
    /// A WebSocket upgrade was asked for (and is passed on).
    pub upgrade: bool,
}

/// The head to send: request line, Host, the end-to-end fields, the forwarding fields, the
/// account a guard let the request through as (`identity`) and, for a WebSocket handshake,
/// `Connection: upgrade` and `Upgrade`.
/// With a request id (a site that gives them), `X-Request-Id` carries it and the client's own
/// is dropped (the site took it already when it came from a trusted proxy).
pub fn build(
    req: &Request<'_>,
    options: &ProxyOptions,
    identity: Option<&Identity>,
    request_id: Option<&RequestId>,
) -> Built {
    build_with(req, options, identity, request_id, None)
}

/// What a cached request keeps of the client's (`cache/mod.rs`): the query as keyed, and only
/// the fields named in the key.
pub struct Keyed<'k> {
    pub query: Option<&'k str>,
    pub fields: &'k [String],
}

/// The head of a cached request: as [`build`] makes it, but with the keyed query and none
/// of the client's fields but the keyed ones (so nothing unkeyed reaches the app), and no
/// identity (a request with one bypasses the cache).
pub fn build_keyed(
    req: &Request<'_>,
    options: &ProxyOptions,
    request_id: Option<&RequestId>,
    keyed: &Keyed<'_>,
) -> Built {
    build_with(req, options, None, request_id, Some(keyed))
}

/// The host a cached request's key holds: the client's, in the form the site was matched in.
/// On a keyed request everything the app can learn of the host (`Host` unless the route
/// names its own, `X-Forwarded-Host`, `Forwarded`'s `host=`) is this, never the client's
/// spelling or a trusted proxy's field, so two names of one site (a wildcard's, say) never
/// share an entry and no unkeyed spelling reaches the app.
pub fn key_host(req: &Request<'_>) -> Vec<u8> {
    let mut buf = [0u8; 264];
    normal_host(req.head.host.unwrap_or(b""), &mut buf).to_vec()
}

fn build_with(
    req: &Request<'_>,
    options: &ProxyOptions,
    identity: Option<&Identity>,
    request_id: Option<&RequestId>,
    keyed: Option<&Keyed<'_>>,
) -> Built {
    let head = req.head;
    let mut out = Vec::with_capacity(head.head_len + 160);
    out.extend_from_slice(head.method_str.as_bytes());
    out.push(b' ');
    // Origin form, even if the client sent an absolute URI.
    out.extend_from_slice(head.path.as_bytes());
    let query = match keyed {
        Some(k) => k.query,
        None => head.query,
    };
    if let Some(q) = query {
        out.push(b'?');
        out.extend_from_slice(q.as_bytes());
    }
    out.extend_from_slice(b" HTTP/1.1\r\n");

    let client_host = head.host.unwrap_or(b"");
    // The name the site was chosen by, in the form it was matched in (lower case, without a
    // trailing dot): an app serving several names cannot pick another one than tern did.
    let mut host_buf = [0u8; 264];
    let host: &[u8] = match &options.host {
        Some(h) => h.as_bytes(),
        None => normal_host(client_host, &mut host_buf),
    };
    // Always sent: HTTP/1.1 requires it, empty when the client named no authority.
    line(&mut out, "Host", &[host]);

    let has_connection = head
        .headers
        .iter()
        .any(|h| h.name.eq_ignore_ascii_case("connection"));
    let connection_named =
        |name: &str| has_connection && connection_lists(head.headers, name.as_bytes());
    for h in head.headers {
        let name = h.name;
        if DROPPED.iter().any(|d| name.eq_ignore_ascii_case(d))
            || is_claim(name)
            // CGI, FastCGI, WSGI and Rack turn `-` into `_`, so `X_Auth_User` would reach a
            // PHP or Python app as `X-Auth-User`; nginx drops such names too
            // (`underscores_in_headers off`).
            || name.contains('_')
            || name.len() > 6 && name[..6].eq_ignore_ascii_case("proxy-")
            || connection_named(name)
            || (request_id.is_some() && name.eq_ignore_ascii_case("x-request-id"))
            // HTTP/2 WebSockets carry no key: the relay sends one of its own and checks the
            // upstream's answer against it (a client's could make a stale 101 look right).
            || (head.protocol.is_some() && name.eq_ignore_ascii_case("sec-websocket-key"))
            || options.request_headers.replaces(name)
            || keyed.is_some_and(|k| !k.fields.iter().any(|f| f.eq_ignore_ascii_case(name)))
        {
            continue;
        }
        if let (Some(gate), true) = (&options.gate_cookie, name.eq_ignore_ascii_case("cookie")) {
            cookie_without_gate(&mut out, name, h.value, gate.as_bytes());
            continue;
        }
        line(&mut out, name, &[h.value]);
    }

    let trusted = options.trusted.is_trusted(req.peer.ip());
    // On a keyed request the forwarding fields hold only what tern decided, never text a
    // client wrote: the client is the one address the trusted proxies' list resolves to,
    // not the list (whose start the client writes, and which the app could put in a page
    // the cache then gives everyone).
    let peer = match keyed {
        Some(_) if trusted => options.trusted.client_ip(req.peer, head).to_canonical(),
        _ => req.peer.ip().to_canonical(),
    };
    let mut ip_text = [0u8; 64];
    let ip = ip_str(peer, &mut ip_text);
    let existing = |name: &'static str| {
        head.headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let proto: &[u8] = if req.secure { b"https" } else { b"http" };

    // X-Forwarded-For: the list so far (from a trusted proxy only), then this hop's client.
    out.extend_from_slice(b"X-Forwarded-For: ");
    if trusted && keyed.is_none() {
        for v in existing("x-forwarded-for") {
            out.extend_from_slice(v);
            out.extend_from_slice(b", ");
        }
    }
    out.extend_from_slice(ip);
    out.extend_from_slice(b"\r\n");
    // A trusted proxy's scheme and host go on, except on a keyed request: then only what the
    // key holds, tern's own scheme and the host in the form the site was matched in (see
    // `key_host`).
    let kept = |name| {
        (trusted && keyed.is_none())
            .then(|| existing(name).next())
            .flatten()
    };
    let mut keyed_host_buf = [0u8; 264];
    let keyed_host = keyed.map(|_| normal_host(client_host, &mut keyed_host_buf));
    line(
        &mut out,
        "X-Forwarded-Proto",
        &[kept("x-forwarded-proto").unwrap_or(proto)],
    );
    let forwarded_host = keyed_host.unwrap_or(client_host);
    if !forwarded_host.is_empty() || kept("x-forwarded-host").is_some() {
        line(
            &mut out,
            "X-Forwarded-Host",
            &[kept("x-forwarded-host").unwrap_or(forwarded_host)],
        );
    }
    // Forwarded (RFC 7239): addresses of IPv6 and hosts (which may carry a port) quoted.
    out.extend_from_slice(b"Forwarded: ");
    if trusted && keyed.is_none() {
        for v in existing("forwarded") {
            out.extend_from_slice(v);
            out.extend_from_slice(b", ");
        }
    }
    out.extend_from_slice(b"for=");
    if peer.is_ipv6() {
        out.extend_from_slice(b"\"[");
        out.extend_from_slice(ip);
        out.extend_from_slice(b"]\"");
    } else {
        out.extend_from_slice(ip);
    }
    out.extend_from_slice(b";proto=");
    out.extend_from_slice(proto);
    if is_plain_host(forwarded_host) {
        out.extend_from_slice(b";host=\"");
        out.extend_from_slice(forwarded_host);
        out.push(b'"');
    }
    out.extend_from_slice(b"\r\n");
    if let Some(id) = identity {
        line(&mut out, "X-Auth-User", &[id.user().as_bytes()]);
        line(&mut out, "X-Auth-Realm", &[id.realm().as_bytes()]);
    }

    if let Some(id) = request_id {
        line(&mut out, "X-Request-Id", &[id.as_str().as_bytes()]);
    }
    if !options.request_headers.is_empty() {
        edit_fields(&mut out, req, options, request_id);
    }

    let upgrade = wants_websocket(req);
    if upgrade {
        out.extend_from_slice(b"Connection: upgrade\r\nUpgrade: websocket\r\n");
    }
    Built { head: out, upgrade }
}

/// The route's own edits, last: tern's forwarding fields named by one are taken out again
/// (the route's word replaces them), then the set ones are added with their variables.
fn edit_fields(
    out: &mut Vec<u8>,
    req: &Request<'_>,
    options: &ProxyOptions,
    request_id: Option<&RequestId>,
) {
    let edits = &options.request_headers;
    // Only tern's own lines can still carry an edited name (the client's were skipped):
    // rebuilt without them, after the request line.
    let line_end = out.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut kept = out[..line_end].to_vec();
    for l in out[line_end..].split_inclusive(|&b| b == b'\n') {
        let name = l.split(|&b| b == b':').next().unwrap_or_default();
        let name = std::str::from_utf8(name).unwrap_or("");
        if !edits.replaces(name) {
            kept.extend_from_slice(l);
        }
    }
    *out = kept;
    let values = Values {
        client: req.peer.ip(),
        secure: req.secure,
        host: req.head.host.unwrap_or(b""),
        request_id: request_id.map(RequestId::as_str),
        uri: req.path(),
        captures: &[],
    };
    for (name, value) in &edits.set {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        value.render(out, &values);
        out.extend_from_slice(b"\r\n");
    }
}

/// A WebSocket handshake (RFC 6455 §4.1): GET with `Connection: upgrade` and
/// `Upgrade: websocket`, or its HTTP/2 form, an extended CONNECT with `:protocol websocket`
/// (RFC 8441, presented as that GET). Other upgrades (h2c) are not passed on.
fn wants_websocket(req: &Request<'_>) -> bool {
    if let Some(protocol) = req.head.protocol {
        return protocol.eq_ignore_ascii_case("websocket");
    }
    connection_lists(req.head.headers, b"upgrade")
        && req.method() == tern_server::Method::Get
        && req
            .header("upgrade")
            .is_some_and(|v| trim_ows(v).eq_ignore_ascii_case(b"websocket"))
}

/// A Cookie field without the gate's own cookies (`gate`, `gate.realm`, with or without
/// `__Host-`); nothing at all if only those were in it. Crumbs are kept byte for byte.
fn cookie_without_gate(out: &mut Vec<u8>, name: &str, value: &[u8], gate: &[u8]) {
    let is_gate = |crumb: &[u8]| {
        let cookie = trim_ows(crumb);
        let cookie_name = trim_ows(cookie.split(|&b| b == b'=').next().unwrap_or_default());
        let cookie_name = cookie_name.strip_prefix(b"__Host-").unwrap_or(cookie_name);
        cookie_name
            .strip_prefix(gate)
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'.')
    };
    if !value.split(|&b| b == b';').any(is_gate) {
        line(out, name, &[value]);
        return;
    }
    let start = out.len();
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    let values_at = out.len();
    for crumb in value.split(|&b| b == b';').filter(|c| !is_gate(c)) {
        if out.len() > values_at {
            out.extend_from_slice(b"; ");
        }
        out.extend_from_slice(trim_ows(crumb));
    }
    if out.len() == values_at {
        out.truncate(start);
    } else {
        out.extend_from_slice(b"\r\n");
    }
}

fn line(out: &mut Vec<u8>, name: &str, parts: &[&[u8]]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    for p in parts {
        out.extend_from_slice(p);
    }
    out.extend_from_slice(b"\r\n");
}

/// A Host value safe inside a quoted string (the codec has checked Host already; this
/// keeps quotes and backslashes out regardless).
fn is_plain_host(h: &[u8]) -> bool {
    !h.is_empty()
        && h.iter()
            .all(|&b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
}

fn ip_str(ip: IpAddr, buf: &mut [u8; 64]) -> &[u8] {
    use std::io::Write;
    if let IpAddr::V4(v4) = ip {
        // The common case, without the formatting machinery.
        let mut n = 0;
        for (i, octet) in v4.octets().iter().enumerate() {
            if i > 0 {
                buf[n] = b'.';
                n += 1;
            }
            let mut text = itoa::Buffer::new();
            let digits = text.format(*octet).as_bytes();
            buf[n..n + digits.len()].copy_from_slice(digits);
            n += digits.len();
        }
        return &buf[..n];
    }
    let mut cursor = std::io::Cursor::new(&mut buf[..]);
    let _ = write!(cursor, "{ip}");
    let n = cursor.position() as usize;
    &buf[..n]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;

    fn forwarded(raw: &str, peer: &str, trusted: &str, secure: bool) -> (String, bool) {
        forwarded_as(raw, peer, trusted, secure, None)
    }

    fn forwarded_as(
        raw: &str,
        peer: &str,
        trusted: &str,
        secure: bool,
        identity: Option<&Identity>,
    ) -> (String, bool) {
        forwarded_with(raw, peer, trusted, secure, identity, None)
    }

    fn forwarded_with(
        raw: &str,
        peer: &str,
        trusted: &str,
        secure: bool,
        identity: Option<&Identity>,
        gate_cookie: Option<&str>,
    ) -> (String, bool) {
        let options = ProxyOptions {
            host: None,
            trusted: tern_services::TrustedProxies::parse(trusted).unwrap(),
            gate_cookie: gate_cookie.map(str::to_string),
            request_headers: Default::default(),
        };
        let peer = peer.parse::<SocketAddr>().unwrap();
        let b = tern_server::testing::with_request(raw.as_bytes(), peer, secure, |req| {
            build(req, &options, identity, None)
        });
        (String::from_utf8(b.head).unwrap(), b.upgrade)
    }

    #[test]
    fn hop_by_hop_fields_are_dropped_and_end_to_end_ones_kept() {
        let (h, up) = forwarded(
            "POST /a/b?x=1 HTTP/1.1\r\nHost: example.org\r\nConnection: keep-alive, X-Secret\r\n\
             X-Secret: s\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nTrailer: X\r\n\
             Proxy-Authorization: Basic x\r\nProxy-Connection: keep-alive\r\nUpgrade: h2c\r\n\
             Expect: 100-continue\r\nContent-Length: 3\r\nAccept: */*\r\nCookie: a=1\r\n\r\nabc",
            "192.0.2.7:5000",
            "",
            false,
        );
        assert_eq!(
            h,
            "POST /a/b?x=1 HTTP/1.1\r\nHost: example.org\r\nAccept: */*\r\nCookie: a=1\r\n\
             X-Forwarded-For: 192.0.2.7\r\nX-Forwarded-Proto: http\r\n\
             X-Forwarded-Host: example.org\r\n\
             Forwarded: for=192.0.2.7;proto=http;host=\"example.org\"\r\n"
        );
        assert!(!up, "h2c is not passed on");
    }

    #[test]
    fn forwarding_fields_are_replaced_for_clients_and_extended_for_trusted_proxies() {
        let raw = "GET / HTTP/1.1\r\nHost: a.test\r\nX-Forwarded-For: 1.2.3.4\r\n\
                   X-Forwarded-Proto: https\r\nForwarded: for=1.2.3.4\r\n\r\n";
        let (h, _) = forwarded(raw, "198.51.100.9:1", "10.0.0.0/8", false);
        assert!(h.contains("X-Forwarded-For: 198.51.100.9\r\n"), "{h}");
        assert!(h.contains("X-Forwarded-Proto: http\r\n"), "{h}");
        assert!(h.contains("Forwarded: for=198.51.100.9;proto=http"), "{h}");
        assert!(!h.contains("1.2.3.4"), "a client's claims are dropped: {h}");

        let (h, _) = forwarded(raw, "10.1.2.3:1", "10.0.0.0/8", false);
        assert!(h.contains("X-Forwarded-For: 1.2.3.4, 10.1.2.3\r\n"), "{h}");
        assert!(h.contains("X-Forwarded-Proto: https\r\n"), "{h}");
        assert!(
            h.contains("Forwarded: for=1.2.3.4, for=10.1.2.3;proto=http"),
            "{h}"
        );

        let (h, _) = forwarded(
            "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "[2001:db8::1]:1",
            "",
            true,
        );
        assert!(h.contains("X-Forwarded-For: 2001:db8::1\r\n"), "{h}");
        assert!(
            h.contains("Forwarded: for=\"[2001:db8::1]\";proto=https"),
            "{h}"
        );
    }

    /// Fields an app may take as the proxy's word about who the client is, where it came
    /// from or what it asked for.
    const CLAIMS: &[&str] = &[
        "X-Auth-User: admin",
        "x-auth-realm: staff",
        "X-Auth-Request-Email: boss@example.org",
        "X-Real-IP: 10.9.9.9",
        "True-Client-IP: 10.9.9.8",
        "X-Client-IP: 10.9.9.7",
        "CF-Connecting-IP: 10.9.9.6",
        "X-Forwarded-Port: 443",
        "X-Forwarded-Prefix: /admin",
        "X-Forwarded-Server: internal",
        "X-Forwarded-User: root",
        "X-Original-URL: /admin/delete",
        "X-Original-URI: /admin/delete",
        "X-Rewrite-URL: /admin/delete",
        "Remote-User: root",
    ];

    #[test]
    fn claims_about_the_client_never_come_from_the_client() {
        let mut raw = String::from("GET /page HTTP/1.1\r\nHost: a.test\r\n");
        for c in CLAIMS {
            raw.push_str(c);
            raw.push_str("\r\n");
        }
        raw.push_str("Accept: */*\r\n\r\n");
        // Not from a client, and not from a trusted proxy either: what it says about the
        // client travels in X-Forwarded-For and Forwarded, which are checked.
        for trusted in ["", "127.0.0.0/8"] {
            let (h, _) = forwarded(&raw, "127.0.0.1:1", trusted, false);
            for c in CLAIMS {
                let name = c.split(':').next().unwrap().to_ascii_lowercase();
                assert!(
                    !h.to_ascii_lowercase().contains(&format!("\n{name}:")),
                    "{name} passed ({trusted:?}): {h}"
                );
            }
            assert!(h.contains("Accept: */*\r\n"), "{h}");
        }
        // The gate's session is what names the user.
        let alice = Identity::new("staff", "alice").unwrap();
        let (h, _) = forwarded_as(&raw, "198.51.100.9:1", "", false, Some(&alice));
        assert!(
            h.contains("X-Auth-User: alice\r\nX-Auth-Realm: staff\r\n"),
            "{h}"
        );
        assert!(!h.contains("admin") && !h.contains("root"), "{h}");
    }

    #[test]
    fn the_app_gets_the_host_the_site_was_chosen_by() {
        let host = |h: &str| {
            let mut buf = [0u8; 264];
            String::from_utf8(normal_host(h.as_bytes(), &mut buf).to_vec()).unwrap()
        };
        assert_eq!(host("Secure.Test."), "secure.test");
        assert_eq!(host("SECURE.test.:8080"), "secure.test:8080");
        assert_eq!(host("[::1]:80"), "[::1]:80");
        assert_eq!(host("[::1]"), "[::1]");
        assert_eq!(host(""), "");
        let (h, _) = forwarded(
            "GET / HTTP/1.0\r\nX-HTTP-Method-Override: DELETE\r\nX-Method-Override: PUT\r\n\r\n",
            "127.0.0.1:1",
            "",
            false,
        );
        assert!(
            h.contains("\r\nHost: \r\n"),
            "an HTTP/1.1 request always has a Host: {h}"
        );
        assert!(!h.contains("DELETE") && !h.contains("PUT"), "{h}");
    }

    #[test]
    fn the_gates_session_cookies_stay_with_the_gate() {
        let raw = "GET / HTTP/1.1\r\nHost: a.test\r\nCookie: app=1; tern_gate=pass; \
                   __Host-tern_gate.staff=s; tern_gatex=2\r\nCookie: tern_gate.ops=o\r\n\r\n";
        let (h, _) = forwarded(raw, "127.0.0.1:1", "", false);
        assert!(
            h.contains("tern_gate=pass"),
            "no gate here: cookies pass as they came: {h}"
        );
        let (h, _) = forwarded_with(raw, "127.0.0.1:1", "", false, None, Some("tern_gate"));
        assert!(h.contains("\r\nCookie: app=1; tern_gatex=2\r\n"), "{h}");
        assert!(
            !h.contains("pass") && !h.contains("=s") && !h.contains("=o"),
            "{h}"
        );
        assert!(
            !h.contains("Cookie: \r\n"),
            "a Cookie left empty is not sent: {h}"
        );
    }

    #[test]
    fn names_with_underscores_never_reach_the_app() {
        let (h, _) = forwarded(
            "GET / HTTP/1.1\r\nHost: a.test\r\nX_Auth_User: admin\r\nX-Auth_User: root\r\n\
             X_Forwarded_For: 6.6.6.6\r\nAccept: */*\r\n\r\n",
            "127.0.0.1:1",
            "",
            false,
        );
        assert!(
            !h.contains('_') && !h.contains("admin") && !h.contains("root"),
            "{h}"
        );
        assert!(!h.contains("6.6.6.6"), "{h}");
        assert!(h.contains("Accept: */*\r\n"), "{h}");
    }

    #[test]
    fn websocket_handshakes_are_passed_on() {
        let (h, up) = forwarded(
            "GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
            "127.0.0.1:1",
            "",
            false,
        );
        assert!(up);
        assert!(
            h.ends_with("Connection: upgrade\r\nUpgrade: websocket\r\n"),
            "{h}"
        );
        assert!(h.contains("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"));
    }

    #[test]
    fn request_edits_replace_client_and_tern_fields_and_render_variables() {
        use tern_services::template::{Template, HEADER_VARS};
        let t = |v: &str| Template::parse(v, HEADER_VARS, 0).unwrap();
        let options = ProxyOptions {
            request_headers: RequestEdits {
                set: vec![
                    ("X-Real-IP".into(), t("$client")),
                    ("X-Forwarded-Proto".into(), t("https")),
                    ("X-Trace".into(), t("$request_id@$host")),
                ],
                remove: vec!["Cookie".into(), "Forwarded".into()],
            },
            ..ProxyOptions::default()
        };
        let id = RequestId::parse(b"rid-7").unwrap();
        let raw = "GET /p HTTP/1.1\r\nHost: A.test\r\nCookie: s=1\r\nX-Real-IP: 6.6.6.6\r\n\
                   X-Request-Id: client-chosen\r\nX-Trace: old\r\nAccept: */*\r\n\r\n";
        let b = tern_server::testing::with_request(
            raw.as_bytes(),
            "198.51.100.9:1".parse().unwrap(),
            false,
            |req| build(req, &options, None, Some(&id)),
        );
        let h = String::from_utf8(b.head).unwrap();
        assert_eq!(
            h,
            "GET /p HTTP/1.1\r\nHost: a.test\r\nAccept: */*\r\n\
             X-Forwarded-For: 198.51.100.9\r\nX-Forwarded-Host: A.test\r\n\
             X-Request-Id: rid-7\r\nX-Real-IP: 198.51.100.9\r\nX-Forwarded-Proto: https\r\n\
             X-Trace: rid-7@a.test\r\n"
        );
    }

    #[test]
    fn a_keyed_head_carries_the_keys_host_and_tern_s_scheme_only() {
        // From a trusted proxy, with a host spelt in capitals and a trailing dot: uncached, the
        // proxy's fields and the client's spelling go on; keyed, only what the key holds.
        let raw = "GET /p?b=2&a=1 HTTP/1.1\r\nHost: WWW.Example.org.\r\nAccept: */*\r\n\
                   User-Agent: u\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.test\r\n\
                   Forwarded: for=1.2.3.4;host=evil.test\r\n\r\n";
        let options = ProxyOptions {
            trusted: tern_services::TrustedProxies::parse("10.0.0.0/8").unwrap(),
            ..ProxyOptions::default()
        };
        let peer: SocketAddr = "10.0.0.9:1".parse().unwrap();
        let plain = tern_server::testing::with_request(raw.as_bytes(), peer, false, |req| {
            build(req, &options, None, None)
        });
        let plain = String::from_utf8(plain.head).unwrap();
        assert!(plain.contains("X-Forwarded-Host: evil.test\r\n"), "{plain}");
        assert!(plain.contains("X-Forwarded-Proto: https\r\n"), "{plain}");
        let fields = ["accept".to_string()];
        let keyed = Keyed {
            query: Some("a=1&b=2"),
            fields: &fields,
        };
        let (head, key_host) =
            tern_server::testing::with_request(raw.as_bytes(), peer, false, |req| {
                (build_keyed(req, &options, None, &keyed).head, key_host(req))
            });
        let h = String::from_utf8(head).unwrap();
        assert_eq!(key_host, b"www.example.org");
        // The client is the one address the trusted proxy's fields resolve to (its
        // Forwarded for=), never its list.
        assert_eq!(
            h,
            "GET /p?a=1&b=2 HTTP/1.1\r\nHost: www.example.org\r\nAccept: */*\r\n\
             X-Forwarded-For: 1.2.3.4\r\nX-Forwarded-Proto: http\r\n\
             X-Forwarded-Host: www.example.org\r\n\
             Forwarded: for=1.2.3.4;proto=http;host=\"www.example.org\"\r\n"
        );
    }
}
