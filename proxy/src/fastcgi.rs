//! PHP (and any FastCGI responder) behind a site: requests for `*.php` scripts that exist
//! under the route's root are relayed to a FastCGI server (PHP-FPM), everything else is the
//! route's static files, as nginx's `location ~ \.php$ { fastcgi_pass ...; }` beside a root
//! or Caddy's `php_fastcgi` do.
//!
//! One view of the request: the script is chosen on the same canonical, decoded path as the
//! route, the guard and the files, and the `HTTP_*` parameters are the fields an HTTP app
//! behind this proxy would get ([`crate::head::build`]: hop-by-hop fields and the client's
//! claims about itself dropped, `X-Forwarded-*`, `Forwarded`, `X-Auth-User` written by tern).
//! `REQUEST_URI` is the canonical path the gate judged, not the raw target.
//!
//! One rule for the files: a script is found by the route's own static files
//! ([`StaticFiles::file_beneath`]), so it meets the rules a request for the file itself
//! would: nothing through `..` or a symlink that leads out of the root (resolved with
//! `openat2(RESOLVE_BENEATH)` or its walk), no dotfile unless the route serves them (the
//! same 404). What the server is called comes from the config, never from the client:
//! `SERVER_NAME` is the site's name, `SERVER_PORT` the port of the listener the request came
//! in on (a `Host` claims both, and apps build absolute links, password resets among them,
//! from these two).
//!
//! How a path is split (nginx's `fastcgi_split_path_info ^(.+?\.php)(/.*)$`): the first
//! `.php` segment that names a script wins, wherever it is, and the rest is `PATH_INFO`, so
//! `/remote.php/dav/files/admin/` (every WebDAV client lists folders with a trailing slash)
//! runs `/remote.php`; only a path with no script in it is a folder, whose `index` names are
//! tried in order and then, if the route has one, its front controller runs.
//!
//! What the config may add (`fastcgi_params`): parameters of its own and overrides of those
//! tern sets only by convention (`HTTPS`, `SERVER_NAME`...), never the ones that say which
//! script runs and for whom (`SCRIPT_FILENAME`, `DOCUMENT_ROOT`, `REMOTE_ADDR`...), see
//! [`check_param`].
//!
//! What is never done: a script is run only if it exists as a file ending in `.php` (no
//! `cgi.fix_pathinfo` guessing, so `upload.jpg/x.php` runs nothing); a `.php` file is never
//! sent as a static file, whatever the case of its extension; a path with control characters
//! is refused (PATH_INFO with a newline broke PHP-FPM: CVE-2019-11043).

use std::borrow::Cow;
use std::sync::Arc;

use tern_fastcgi::{begin_request, http_param_name, Params, REQUEST_ID};
use tern_server::static_files::{FileBeneath, StaticFiles};
use tern_server::{
    Forward, Handler, HandlerContext, Method, Reply, Request, RequestHead, Response, UpstreamWire,
};

use tern_services::template::{Template, Values, Var};

use crate::cache::{Forwarding, Lookup, RouteCache};
use crate::group::UpstreamGroup;
use crate::head::{self, ProxyOptions};

const SCRIPT_EXTENSION: &str = ".php";

/// What a folder's path runs, what the scripts are told the server is called, and the
/// parameters the config adds.
#[derive(Debug, Clone, Default)]
pub struct FastCgiOptions {
    /// What a folder's path runs or serves (nginx's `index`).
    pub index: Index,
    /// `SERVER_NAME`: the site's name from the config (empty for a site that has none).
    pub server_name: String,
    /// Parameters set or overridden by the config (nginx's `fastcgi_param`), checked by
    /// [`check_param`].
    pub params: Vec<Param>,
}

/// nginx's `index index.php index.html /index.php$request_uri`: file names tried in order
/// in a folder (a `.php` name runs, another is sent as a file), then, for a folder none of
/// them is in, the front controller: a script's path, maybe with `$uri`.
#[derive(Debug, Clone)]
pub struct Index {
    pub names: Vec<String>,
    pub front_controller: Option<Template>,
}

impl Default for Index {
    fn default() -> Index {
        Index {
            names: vec![DEFAULT_INDEX.to_string()],
            front_controller: None,
        }
    }
}

/// The script a folder's path runs when the config names none.
pub const DEFAULT_INDEX: &str = "index.php";
/// At most this many `index` entries: each costs a lookup for a folder's path.
const MAX_INDEX: usize = 8;

/// Checks an `index` list (see [`Index`]); the error says what is wrong with which entry.
pub fn check_index(list: &[String]) -> Result<Index, String> {
    if list.is_empty() || list.len() > MAX_INDEX {
        return Err(format!("index takes 1 to {MAX_INDEX} entries"));
    }
    let (last, before) = list.split_last().expect("not empty");
    let (names, front_controller) = if last.starts_with('/') {
        (before, Some(check_front_controller(last)?))
    } else {
        (list, None)
    };
    for name in names {
        let plain = !name.is_empty()
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|b| b.is_ascii_graphic() && !b"/\\?#%$".contains(&b));
        if !plain {
            return Err(format!(
                "index {name:?} must be a file name (no `/`, not a dotfile) or, last, a script's path such as \"/index.php$uri\""
            ));
        }
        if !name.ends_with(SCRIPT_EXTENSION) && names_php_source(name) {
            return Err(format!(
                "index {name:?} is PHP source under another name: it would be sent as a file"
            ));
        }
    }
    Ok(Index {
        names: names.to_vec(),
        front_controller,
    })
}

/// The front controller: a path whose fixed start (before any variable) names a script,
/// `/index.php` or `/index.php$uri`, so it can only run that script.
fn check_front_controller(entry: &str) -> Result<Template, String> {
    let fixed = &entry[..entry.find('$').unwrap_or(entry.len())];
    let names_script = script_end(fixed).is_some();
    if !names_script || fixed.starts_with("//") || fixed.contains(['?', '#', '\\']) {
        return Err(format!(
            "index {entry:?}: the front controller must be a script's path such as \"/index.php\" or \"/index.php$uri\""
        ));
    }
    Template::parse(entry, &[Var::Uri], 0).map_err(|e| format!("index: {e}"))
}

/// One `fastcgi_params` entry: a CGI parameter and its value.
#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub value: Template,
}

/// At most this many `fastcgi_params` per route.
pub const MAX_PARAMS: usize = 64;

/// The variables a parameter's value may hold.
pub const PARAM_VARS: &[Var] = &[
    Var::Client,
    Var::Scheme,
    Var::Host,
    Var::RequestId,
    Var::Uri,
];

/// What tern decides from the request it judged: which script runs, on which path, for
/// whom, with which body. Overriding one would run a script the static files never judged
/// (`SCRIPT_FILENAME`, or `PATH_TRANSLATED`, which PHP-FPM reads when the former is
/// missing), tell the app another client or user than the gate saw, or break the body's
/// framing.
const DECIDED_PARAMS: &[&str] = &[
    "SCRIPT_FILENAME",
    "PATH_TRANSLATED",
    "SCRIPT_NAME",
    "PATH_INFO",
    "DOCUMENT_ROOT",
    "DOCUMENT_URI",
    "REQUEST_URI",
    "QUERY_STRING",
    "REQUEST_METHOD",
    "REMOTE_ADDR",
    "REMOTE_PORT",
    "REMOTE_USER",
    "AUTH_TYPE",
    "CONTENT_TYPE",
    "CONTENT_LENGTH",
    "SERVER_PROTOCOL",
    "GATEWAY_INTERFACE",
];

/// Set from the config only, never from a request's variables: what the server is called
/// (apps build absolute links, password resets among them, from these; `$host` here would
/// be the Host header attack of nginx set-ups with `fastcgi_param SERVER_NAME $host`) and
/// PHP's ini settings (a request must not choose `auto_prepend_file`...).
const CONSTANT_PARAMS: &[&str] = &[
    "SERVER_NAME",
    "SERVER_PORT",
    "SERVER_ADDR",
    "HTTPS",
    "REQUEST_SCHEME",
    "PHP_VALUE",
    "PHP_ADMIN_VALUE",
];

/// Checks one `fastcgi_params` entry: a name of letters, digits and `_` (not one tern
/// decides, not `HTTP_*`, which are the request's fields), a value without control
/// characters (PHP's ini parameters may hold newlines between settings) whose variables
/// are [`PARAM_VARS`], none in [`CONSTANT_PARAMS`].
pub fn check_param(name: &str, value: &str) -> Result<Param, String> {
    let word = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !word {
        return Err(format!(
            "fastcgi_params: {name:?} is not a parameter name (letters, digits and _)"
        ));
    }
    let upper = name.to_ascii_uppercase();
    if DECIDED_PARAMS.contains(&upper.as_str()) {
        return Err(format!(
            "fastcgi_params: {name} is decided by tern from the request (which script runs, for whom), never by the config"
        ));
    }
    if upper.starts_with("HTTP_") {
        return Err(format!(
            "fastcgi_params: {name}: HTTP_* parameters are the request's header fields"
        ));
    }
    let ini = upper == "PHP_VALUE" || upper == "PHP_ADMIN_VALUE";
    let control = |b: u8| (b < 0x20 && !(ini && b == b'\n')) || b == 0x7f;
    if value.len() > 4096 || value.bytes().any(control) {
        return Err(format!(
            "fastcgi_params: the value of {name} must be at most 4096 bytes with no control characters"
        ));
    }
    let template = Template::parse(value, PARAM_VARS, 0)
        .map_err(|e| format!("fastcgi_params: {name}: {e}"))?;
    if CONSTANT_PARAMS.contains(&upper.as_str()) && template.has_vars() {
        return Err(format!(
            "fastcgi_params: {name} takes a fixed value: a request must not choose it"
        ));
    }
    Ok(Param {
        name: name.to_string(),
        value: template,
    })
}

/// A route's handler: scripts to the FastCGI group, other paths to `files`, the route's
/// static files, which also judge whether a script's file may run.
pub struct FastCgi {
    group: Arc<UpstreamGroup>,
    options: FastCgiOptions,
    proxy: ProxyOptions,
    files: StaticFiles,
    cache: Option<RouteCache>,
}

/// The script a path names: its URL path and file, and what follows it.
#[derive(Debug, PartialEq, Eq)]
struct Script {
    name: String,
    file: FileBeneath,
    path_info: String,
}

/// What a path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    Script(Script),
    /// A `.php` path with no such script: 404 (never the file itself).
    MissingScript,
    /// A folder's index that is not a script: this name in the folder, sent as a file.
    IndexFile(String),
    /// Not a script: a static file (or not found).
    File,
}

impl FastCgi {
    /// The document root is `files`' root.
    pub fn new(
        group: Arc<UpstreamGroup>,
        options: FastCgiOptions,
        proxy: ProxyOptions,
        files: StaticFiles,
    ) -> FastCgi {
        FastCgi {
            group,
            options,
            proxy,
            files,
            cache: None,
        }
    }

    /// Scripts' answers are served from and stored in a shared cache (`cache/`, as a
    /// proxy route's); static files never go through it.
    pub fn with_cache(mut self, cache: RouteCache) -> FastCgi {
        self.cache = Some(cache);
        self
    }

    /// What `path` (decoded, canonical) asks for: the script of its first `.php` segment
    /// that names one (PATH_INFO is the rest, a trailing slash included), else for a
    /// folder's path its index, else a static file. `uri`: the same path as routed (still
    /// encoded), for the front controller's `$uri`. A script's file is judged as the static
    /// files judge a file (see the module docs); the error is their answer for a path they
    /// refuse (a dotfile: 404). PATH_INFO is no file and is not judged
    /// (`/index.php/.well-known/x` runs `/index.php`).
    fn target(&self, path: &str, uri: &str, now_ms: u64) -> Result<Target, Response> {
        let (script, any) = self.split(path, now_ms)?;
        if let Some(script) = script {
            return Ok(Target::Script(script));
        }
        if path.ends_with('/') {
            return self.folder(path, uri, now_ms);
        }
        Ok(if any || names_php_source(path) {
            Target::MissingScript
        } else {
            Target::File
        })
    }

    /// nginx's `fastcgi_split_path_info ^(.+?\.php)(/.*)$`, but only on a script that
    /// exists: the first `.php` segment end whose prefix is a file. The flag says whether
    /// the path had a `.php` segment at all.
    fn split(&self, path: &str, now_ms: u64) -> Result<(Option<Script>, bool), Response> {
        let mut any = false;
        let mut from = 0;
        while let Some(end) = script_end(&path[from..]).map(|end| from + end) {
            from = end;
            any = true;
            if let Some(file) = self.files.file_beneath(&path[..end], now_ms)? {
                let script = Script {
                    name: path[..end].to_string(),
                    file,
                    path_info: path[end..].to_string(),
                };
                return Ok((Some(script), true));
            }
        }
        Ok((None, any))
    }

    /// A folder's path: the first `index` name in it (a script runs, another file is sent),
    /// else, if the folder exists, the front controller, else the static side's answer.
    fn folder(&self, path: &str, uri: &str, now_ms: u64) -> Result<Target, Response> {
        let index = &self.options.index;
        for name in &index.names {
            let candidate = format!("{path}{name}");
            if let Some(file) = self.files.file_beneath(&candidate, now_ms)? {
                if !name.ends_with(SCRIPT_EXTENSION) {
                    return Ok(Target::IndexFile(name.clone()));
                }
                return Ok(Target::Script(Script {
                    name: candidate,
                    file,
                    path_info: String::new(),
                }));
            }
        }
        // As nginx's index: the front controller for a folder that exists, nothing else.
        let Some(front) = &index.front_controller else {
            return Ok(Target::File);
        };
        if !self.files.folder_beneath(path, now_ms)? {
            return Ok(Target::File);
        }
        let mut rendered = Vec::with_capacity(uri.len() + 16);
        front.render(&mut rendered, &uri_values(uri));
        let rendered = String::from_utf8_lossy(&rendered);
        let Ok(canonical) = tern_server::canonical_path(&rendered) else {
            return Err(Response::text(400, "bad request\n"));
        };
        let decoded = tern_server::decoded_path(&canonical);
        let Ok(decoded) = std::str::from_utf8(&decoded) else {
            return Err(Response::text(400, "bad request: the path is not UTF-8\n"));
        };
        // The script its fixed start names (checked by `check_index`), or 404: never a
        // script further on in the client's part, never `folder` again.
        let Some(end) = script_end(decoded) else {
            return Ok(Target::MissingScript);
        };
        Ok(match self.files.file_beneath(&decoded[..end], now_ms)? {
            Some(file) => Target::Script(Script {
                name: decoded[..end].to_string(),
                file,
                path_info: decoded[end..].to_string(),
            }),
            None => Target::MissingScript,
        })
    }

    fn forward(&self, req: &Request<'_>, script: &Script, cx: &mut HandlerContext<'_>) -> Reply {
        let asked = asked_path(req.head);
        // On a cached route the key holds everything the script is told of the target:
        // the path asked for (REQUEST_URI), the script it resolved to and its PATH_INFO,
        // besides what a proxy route's key holds.
        let host = self
            .cache
            .as_ref()
            .map(|_| head::key_host(req))
            .unwrap_or_default();
        let f = match &self.cache {
            None => Forwarding::plain(),
            Some(c) => {
                let target = [&*asked, script.name.as_str(), script.path_info.as_str()];
                match c.lookup(req, &host, &target, cx) {
                    Lookup::Hit(answer) => return Reply::Now(answer),
                    Lookup::Forward(f) => f,
                }
            }
        };
        let (mut built, query) = match (&self.cache, f.keyed) {
            (Some(c), true) => {
                let query = tern_cache::policy::keyed_query(&c.rules().key_query, req.query());
                let keyed = head::Keyed {
                    query: query.as_deref(),
                    fields: &c.rules().key_headers,
                };
                let built = head::build_keyed(req, &self.proxy, cx.request_id(), &keyed);
                (built, query)
            }
            _ => (
                head::build(req, &self.proxy, cx.identity(), cx.request_id()),
                req.head.query.map(Cow::Borrowed),
            ),
        };
        // A stale entry's validators become HTTP_IF_* parameters with the other fields.
        built.head.extend_from_slice(&f.validators);
        let mut params = Params::new();
        let mut sink = Sink {
            params: &mut params,
            set: &self.options.params,
        };
        let target = CgiTarget {
            script,
            asked: &asked,
            query: query.as_deref(),
            keyed: f.keyed,
        };
        cgi_params(&mut sink, req, &target, &self.options.server_name);
        // A keyed request has no identity (it bypasses the cache).
        if let (Some(id), false) = (cx.identity(), f.keyed) {
            params.add(b"REMOTE_USER", id.user().as_bytes());
        }
        // The config's own, after tern's (which `Sink` left out where they are overridden).
        let values = Values {
            client: req.peer.ip(),
            secure: req.secure,
            // The client's Host as it came, unless the key holds it in the form the site
            // was matched in: that form then, as HTTP_HOST.
            host: match f.keyed {
                true => &host,
                false => req.head.host.unwrap_or(b""),
            },
            request_id: cx.request_id().map(|id| id.as_str()),
            uri: req.path(),
            captures: &[],
        };
        let mut value = Vec::new();
        for param in &self.options.params {
            value.clear();
            param.value.render(&mut value, &values);
            params.add(param.name.as_bytes(), &value);
        }
        // The fields an HTTP app would get, as HTTP_* parameters (after the request line).
        let fields = built
            .head
            .split(|&b| b == b'\n')
            .skip(1)
            .filter_map(|line| {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let colon = line.iter().position(|&b| b == b':')?;
                Some((&line[..colon], tern_server::trim_ows(&line[colon + 1..])))
            });
        for (name, value) in fields {
            if let Some(param) = http_param_name(name) {
                params.add(&param, value);
            }
        }
        let mut records = Vec::with_capacity(params.encoded().len() + 64);
        begin_request(&mut records, REQUEST_ID, true);
        params.write_records(&mut records, REQUEST_ID);
        Reply::Forward(Box::new(Forward {
            upstreams: self.group.clone(),
            head: records,
            idempotent: matches!(
                req.method(),
                Method::Get | Method::Head | Method::Put | Method::Delete | Method::Options
            ),
            upgrade: false,
            not_before_ms: f.not_before_ms(req.now_ms),
            edit: f.edit,
            own_answers: None,
            max_body: u64::MAX,
            wire: UpstreamWire::FastCgi,
            tee: f.tee,
            hold: f.hold,
            fallback: f.fallback,
        }))
    }
}

/// Where the first `.php` segment of `path` ends (`/x.php` or `/x.php/...`, not `/x.phpfoo`).
fn script_end(path: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(at) = path[from..].find(SCRIPT_EXTENSION) {
        let end = from + at + SCRIPT_EXTENSION.len();
        if end == path.len() || path.as_bytes()[end] == b'/' {
            return Some(end);
        }
        from = end;
    }
    None
}

/// The last segment is PHP source under some name, never sent as a static file: `.php` in
/// any case, and anything that still has `.php` inside its name (an editor's or a deploy's
/// copy: `config.php.bak`, `index.php~`, `.index.php.swp`, `app.php5`) or ends in `.phtml`
/// or `.phar`. nginx and Caddy send such copies as plain files, with the source and the
/// passwords in it.
fn names_php_source(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    name.contains(SCRIPT_EXTENSION) || name.ends_with(".phtml") || name.ends_with(".phar")
}

/// `$uri` alone, for the front controller.
fn uri_values(uri: &str) -> Values<'_> {
    Values {
        client: std::net::Ipv4Addr::UNSPECIFIED.into(),
        secure: false,
        host: b"",
        request_id: None,
        uri,
        captures: &[],
    }
}

/// tern's parameters, less those the config sets itself (only names [`check_param`] lets
/// it set: never one that says which script runs).
struct Sink<'a> {
    params: &'a mut Params,
    set: &'a [Param],
}

impl Sink<'_> {
    fn add(&mut self, name: &[u8], value: &[u8]) -> &mut Self {
        if !self.set.iter().any(|p| p.name.as_bytes() == name) {
            self.params.add(name, value);
        }
        self
    }
}

/// The path the client asked for, canonical, before a `try_files` fallback chose the
/// script (REQUEST_URI's).
fn asked_path<'a>(head: &'a RequestHead<'_>) -> Cow<'a, str> {
    let asked = head.target.split('?').next().unwrap_or("");
    tern_server::canonical_path(asked).unwrap_or(Cow::Borrowed(asked))
}

/// What a script is told of the request's target.
struct CgiTarget<'a> {
    script: &'a Script,
    /// [`asked_path`].
    asked: &'a str,
    /// The query as sent: as keyed on a keyed request.
    query: Option<&'a str>,
    /// Only what the cache key holds may reach the script (see `cache/mod.rs`).
    keyed: bool,
}

/// The CGI/1.1 meta-variables (RFC 3875 §4.1) PHP reads, as nginx's `fastcgi_params` sets them
/// (with `$realpath_root` for the root, as for deploys that switch a symlink).
fn cgi_params(p: &mut Sink<'_>, req: &Request<'_>, target: &CgiTarget<'_>, server_name: &str) {
    let head = req.head;
    let script = target.script;
    let root = script.file.root.to_string_lossy();
    let file = script.file.path.to_string_lossy();
    p.add(b"GATEWAY_INTERFACE", b"CGI/1.1")
        .add(b"SERVER_SOFTWARE", b"tern")
        // A keyed request is the same whatever the client spoke (as a proxy route sends
        // every request as HTTP/1.1).
        .add(
            b"SERVER_PROTOCOL",
            match target.keyed {
                true => b"HTTP/1.1",
                false => protocol(head),
            },
        )
        .add(b"REQUEST_METHOD", head.method_str.as_bytes())
        .add(
            b"REQUEST_SCHEME",
            if req.secure { b"https" } else { b"http" },
        )
        .add(b"SCRIPT_FILENAME", file.as_bytes())
        .add(b"SCRIPT_NAME", script.name.as_bytes())
        .add(b"DOCUMENT_ROOT", root.as_bytes())
        .add(b"DOCUMENT_URI", script.name.as_bytes())
        .add(b"QUERY_STRING", target.query.unwrap_or("").as_bytes())
        .add(
            b"REMOTE_ADDR",
            req.peer.ip().to_canonical().to_string().as_bytes(),
        )
        .add(b"REMOTE_PORT", req.peer.port().to_string().as_bytes())
        // PHP built with --enable-force-cgi-redirect wants it; harmless otherwise.
        .add(b"REDIRECT_STATUS", b"200");
    // Empty when the path has none, as nginx passes it.
    p.add(b"PATH_INFO", script.path_info.as_bytes());
    // REQUEST_URI: the canonical path of what the client asked for (before a try_files
    // fallback chose the script), with its query.
    let mut uri = target.asked.to_owned();
    if let Some(q) = target.query {
        uri.push('?');
        uri.push_str(q);
    }
    p.add(b"REQUEST_URI", uri.as_bytes());
    if req.secure {
        p.add(b"HTTPS", b"on");
    }
    // From the config and the listener, not the client's `Host` (which PHP still gets, as
    // HTTP_HOST): nginx passes its `server_name` and the port it accepted on.
    p.add(b"SERVER_NAME", server_name.as_bytes());
    p.add(
        b"SERVER_PORT",
        itoa::Buffer::new().format(req.local_port).as_bytes(),
    );
    // A keyed request has no body (one with a body bypasses the cache), so no field says
    // what it is: a client's Content-Type on a GET is no key's part.
    if let (Some(t), false) = (head.header("content-type"), target.keyed) {
        p.add(b"CONTENT_TYPE", t);
    }
    if let tern_server::BodyKind::Length(n) = head.body {
        p.add(b"CONTENT_LENGTH", n.to_string().as_bytes());
    } else if !req.body.is_empty() {
        p.add(b"CONTENT_LENGTH", req.body.len().to_string().as_bytes());
    }
}

fn protocol(head: &RequestHead<'_>) -> &'static [u8] {
    match head.version {
        tern_server::Version::Http10 => b"HTTP/1.0",
        tern_server::Version::Http11 => b"HTTP/1.1",
        tern_server::Version::Http3 => b"HTTP/3.0",
        _ => b"HTTP/2.0",
    }
}

impl Handler for FastCgi {
    fn handle(&self, req: &Request<'_>, cx: &mut HandlerContext<'_>) -> Reply {
        if matches!(req.method(), Method::Trace | Method::Connect) {
            return Response::text(405, "method not allowed\n").into();
        }
        let decoded = tern_server::decoded_path(req.path());
        let Ok(path) = std::str::from_utf8(&decoded) else {
            return Response::text(400, "bad request: the path is not UTF-8\n").into();
        };
        if path.bytes().any(|b| b < 0x20 || b == 0x7f) {
            return Response::text(400, "bad request: control characters in the path\n").into();
        }
        match self.target(path, req.path(), req.now_ms) {
            Ok(Target::Script(script)) => self.forward(req, &script, cx),
            Ok(Target::MissingScript) => Response::text(404, "not found\n").into(),
            Ok(Target::IndexFile(name)) => {
                let head = req
                    .head
                    .with_path(Cow::Owned(format!("{}{name}", req.path())));
                let index = Request {
                    head: &head,
                    body: req.body,
                    peer: req.peer,
                    secure: req.secure,
                    local_port: req.local_port,
                    unix_secs: req.unix_secs,
                    now_ms: req.now_ms,
                };
                self.files.handle(&index, cx)
            }
            Ok(Target::File) => self.files.handle(req, cx),
            Err(refused) => refused.into(),
        }
    }

    /// A body of declared length streams through to the application. One of unknown length
    /// (chunked) is read whole first, within the server's `max_body`, as nginx does: PHP
    /// needs `CONTENT_LENGTH` to read a form.
    fn streams_body(&self, head: &RequestHead<'_>) -> bool {
        matches!(head.body, tern_server::BodyKind::Length(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};
    use tern_server::static_files::StaticOptions;

    /// A handler over `www/` with `index.php`, `app.php`, `blog/index.php`, `img.jpg`, a
    /// folder `dir.php`, and `outside/` beside it with `evil.php` and `index.php`.
    fn handler() -> (tempfile::TempDir, FastCgi) {
        handler_with(|_| {})
    }

    fn handler_with(edit: impl FnOnce(&mut StaticOptions)) -> (tempfile::TempDir, FastCgi) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("www");
        let outside = dir.path().join("outside");
        for folder in [root.join("blog"), root.join("dir.php"), outside.clone()] {
            std::fs::create_dir_all(folder).unwrap();
        }
        for f in ["index.php", "app.php", "blog/index.php", "img.jpg"] {
            std::fs::write(root.join(f), "x").unwrap();
        }
        for f in ["evil.php", "index.php"] {
            std::fs::write(outside.join(f), "x").unwrap();
        }
        let mut files = StaticOptions::new(&root);
        edit(&mut files);
        let h = fastcgi_over(files);
        (dir, h)
    }

    /// A handler for the files of `files`, its scripts to a socket nobody listens on.
    fn fastcgi_over(files: StaticOptions) -> FastCgi {
        fastcgi_with(files, FastCgiOptions::default())
    }

    fn fastcgi_with(files: StaticOptions, options: FastCgiOptions) -> FastCgi {
        let group = UpstreamGroup::new(
            crate::GroupOptions {
                servers: vec![crate::group::UpstreamServer::new(
                    tern_server::UpstreamAddr::Unix(files.root.join("php.sock")),
                )],
                ..Default::default()
            },
            1,
        );
        FastCgi::new(
            Arc::new(group),
            FastCgiOptions {
                server_name: "site.example".into(),
                ..options
            },
            ProxyOptions::default(),
            StaticFiles::new(files).unwrap(),
        )
    }

    /// The root as scripts are given it: its path with no symlink in it.
    fn real_root(dir: &tempfile::TempDir) -> PathBuf {
        std::fs::canonicalize(dir.path().join("www")).unwrap()
    }

    fn target(h: &FastCgi, path: &str) -> Target {
        h.target(path, path, 0)
            .unwrap_or_else(|r| panic!("{path}: refused with {}", r.status))
    }

    fn refusal(h: &FastCgi, path: &str) -> u16 {
        match h.target(path, path, 0) {
            Ok(t) => panic!("{path}: {t:?}"),
            Err(r) => r.status,
        }
    }

    fn script(dir: &tempfile::TempDir, name: &str, path_info: &str) -> Target {
        let root = real_root(dir);
        Target::Script(Script {
            name: name.into(),
            file: FileBeneath {
                path: root.join(name.trim_start_matches('/')),
                root,
            },
            path_info: path_info.into(),
        })
    }

    #[test]
    fn a_path_runs_the_first_script_that_exists_and_the_rest_is_path_info() {
        let (d, h) = handler();
        assert_eq!(target(&h, "/app.php"), script(&d, "/app.php", ""));
        assert_eq!(target(&h, "/app.php/a/b"), script(&d, "/app.php", "/a/b"));
        assert_eq!(target(&h, "/"), script(&d, "/index.php", ""));
        assert_eq!(target(&h, "/blog/"), script(&d, "/blog/index.php", ""));
        // A folder named like a script is not one.
        assert_eq!(target(&h, "/dir.php"), Target::MissingScript);
        // PATH_INFO names no file: a dot segment in it is the app's business.
        assert_eq!(
            target(&h, "/index.php/.well-known/x"),
            script(&d, "/index.php", "/.well-known/x")
        );
    }

    #[test]
    fn nothing_runs_that_is_not_a_php_file_and_no_script_is_a_file() {
        let (_d, h) = handler();
        assert_eq!(target(&h, "/img.jpg/x.php"), Target::MissingScript);
        assert_eq!(target(&h, "/img.jpg"), Target::File);
        assert_eq!(target(&h, "/app.PHP"), Target::MissingScript);
        assert_eq!(target(&h, "/app.phpx"), Target::MissingScript);
        for copy in [
            "/app.php.bak",
            "/app.php~",
            "/app.PHP.orig",
            "/app.php5",
            "/lib/view.phtml",
            "/tool.phar",
        ] {
            assert_eq!(target(&h, copy), Target::MissingScript, "{copy}");
        }
        assert_eq!(target(&h, "/php/readme.txt"), Target::File);
        assert_eq!(target(&h, "/phpinfo.txt"), Target::File);
        assert_eq!(target(&h, "/nope.php/x"), Target::MissingScript);
        assert_eq!(target(&h, "/nofolder/"), Target::File);
    }

    /// A script is judged as the static files judge a file: a symlink that leads out of the
    /// root, or a folder that does, runs nothing; one that stays inside runs its target.
    #[test]
    fn no_script_runs_through_a_symlink_out_of_the_root() {
        let (d, h) = handler();
        let root = d.path().join("www");
        let outside = d.path().join("outside");
        symlink("../outside/evil.php", root.join("rel-out.php")).unwrap();
        symlink(outside.join("evil.php"), root.join("abs-out.php")).unwrap();
        symlink("../outside", root.join("linked")).unwrap();
        symlink(&outside, root.join("abs-linked")).unwrap();
        symlink("..", root.join("up")).unwrap();
        symlink("app.php", root.join("alias.php")).unwrap();
        symlink("blog", root.join("blog-link")).unwrap();
        for escape in [
            "/rel-out.php",
            "/abs-out.php",
            "/linked/evil.php",
            "/abs-linked/evil.php",
            "/up/outside/evil.php",
            "/linked/evil.php/more",
        ] {
            assert_eq!(target(&h, escape), Target::MissingScript, "{escape}");
        }
        // A folder's index script outside the root: the static side answers for the folder.
        assert_eq!(target(&h, "/linked/"), Target::File);
        // Links that stay beneath the root run, under the name asked for.
        assert_eq!(target(&h, "/alias.php/x"), script(&d, "/alias.php", "/x"));
        assert_eq!(
            target(&h, "/blog-link/"),
            script(&d, "/blog-link/index.php", "")
        );
    }

    /// The root itself may be a symlink (a deploy's `current -> releases/N`): scripts are
    /// named under the folder it resolves to, as nginx's `$realpath_root` gives them.
    #[test]
    fn a_root_behind_a_symlink_names_scripts_under_its_real_path() {
        let dir = tempfile::tempdir().unwrap();
        let release = dir.path().join("releases/1");
        std::fs::create_dir_all(&release).unwrap();
        std::fs::write(release.join("index.php"), "x").unwrap();
        symlink("releases/1", dir.path().join("current")).unwrap();
        let h = fastcgi_over(StaticOptions::new(dir.path().join("current")));
        let real = std::fs::canonicalize(&release).unwrap();
        let Target::Script(s) = target(&h, "/index.php") else {
            panic!("no script");
        };
        assert_eq!(s.file.root, real);
        assert_eq!(s.file.path, real.join("index.php"));
    }

    /// Dotfiles are refused as the static side refuses them (404), wherever the dot is in the
    /// script's path, unless the route serves dotfiles.
    #[test]
    fn dotfile_scripts_are_refused_like_dotfiles() {
        let (d, h) = handler();
        let root = d.path().join("www");
        std::fs::create_dir_all(root.join(".git")).unwrap();
        for f in [".hidden.php", ".git/x.php", ".git/index.php"] {
            std::fs::write(root.join(f), "x").unwrap();
        }
        for path in ["/.hidden.php", "/.git/x.php", "/.git/x.php/info", "/.git/"] {
            assert_eq!(refusal(&h, path), 404, "{path}");
        }
        // Missing ones too: nothing tells a probe which exist.
        assert_eq!(refusal(&h, "/.nope.php"), 404);

        let (d, h) = handler_with(|o| o.serve_dotfiles = true);
        let root = d.path().join("www");
        std::fs::create_dir_all(root.join(".git")).unwrap();
        std::fs::write(root.join(".git/x.php"), "x").unwrap();
        assert_eq!(target(&h, "/.git/x.php"), script(&d, "/.git/x.php", ""));
    }

    /// A `.php` segment wins over a trailing slash, as nginx's `fastcgi_split_path_info
    /// ^(.+?\.php)(/.*)$`: WebDAV clients list folders as `/remote.php/dav/files/admin/`.
    #[test]
    fn a_script_segment_wins_over_a_trailing_slash() {
        let (d, h) = handler();
        assert_eq!(
            target(&h, "/app.php/dav/files/admin/"),
            script(&d, "/app.php", "/dav/files/admin/")
        );
        assert_eq!(target(&h, "/index.php/"), script(&d, "/index.php", "/"));
        assert_eq!(
            target(&h, "/index.php/apps/files/"),
            script(&d, "/index.php", "/apps/files/")
        );
        // No script in the path: a folder still, and a missing one stays missing.
        assert_eq!(target(&h, "/blog/"), script(&d, "/blog/index.php", ""));
        assert_eq!(target(&h, "/nope.php/x/"), Target::File);
        // A folder named like a script is a folder: its own index runs.
        std::fs::write(d.path().join("www/dir.php/index.php"), "x").unwrap();
        assert_eq!(
            target(&h, "/dir.php/"),
            script(&d, "/dir.php/index.php", "")
        );
        // A dotfile on the way is refused before anything runs.
        assert_eq!(refusal(&h, "/.git/x.php/a/"), 404);
    }

    fn index(list: &[&str]) -> Index {
        check_index(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    /// `index` as nginx's: names in order (a script runs, another file is sent), then the
    /// front controller with the folder's path, which only ever runs a script.
    #[test]
    fn index_names_are_tried_in_order_then_the_front_controller() {
        let (d, _) = handler();
        let root = d.path().join("www");
        std::fs::create_dir_all(root.join("docs")).unwrap();
        std::fs::create_dir_all(root.join("apps/files")).unwrap();
        std::fs::create_dir_all(root.join("a b")).unwrap();
        std::fs::write(root.join("docs/index.html"), "x").unwrap();
        let h = fastcgi_with(
            StaticOptions::new(&root),
            FastCgiOptions {
                index: index(&["index.php", "index.html", "/index.php$uri"]),
                ..Default::default()
            },
        );
        assert_eq!(target(&h, "/blog/"), script(&d, "/blog/index.php", ""));
        assert_eq!(target(&h, "/docs/"), Target::IndexFile("index.html".into()));
        assert_eq!(
            target(&h, "/apps/files/"),
            script(&d, "/index.php", "/apps/files/")
        );
        // An encoded path reaches the front controller decoded, once.
        assert_eq!(
            h.target("/a b/", "/a%20b/", 0).unwrap(),
            script(&d, "/index.php", "/a b/")
        );
        // No such folder: no front controller (nginx's index answers 404), the static side.
        assert_eq!(target(&h, "/nowhere/"), Target::File);
        assert_eq!(target(&h, "/img.jpg/"), Target::File);
        // Without its script, the front controller is a missing script, never a loop, and
        // never a script named in the part the client chose.
        std::fs::remove_file(root.join("index.php")).unwrap();
        assert_eq!(target(&h, "/apps/files/"), Target::MissingScript);
        std::fs::create_dir_all(root.join("x.php")).unwrap();
        std::fs::create_dir_all(root.join("index.php")).unwrap();
        std::fs::write(root.join("index.php/x.php"), "x").unwrap();
        assert_eq!(target(&h, "/x.php/"), Target::MissingScript);

        let h = fastcgi_with(
            StaticOptions::new(&root),
            FastCgiOptions {
                index: index(&["default.php"]),
                ..Default::default()
            },
        );
        // Not named: the static side answers for the folder.
        assert_eq!(target(&h, "/blog/"), Target::File);
    }

    #[test]
    fn index_lists_are_checked() {
        let bad = |list: &[&str]| {
            check_index(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap_err()
        };
        assert!(bad(&[]).contains("1 to 8"));
        assert!(bad(&["../x.php"]).contains("file name"));
        assert!(bad(&[".index.php"]).contains("file name"));
        assert!(bad(&["a/index.php"]).contains("file name"));
        assert!(bad(&["index.php.bak"]).contains("PHP source"));
        assert!(bad(&["index.phtml"]).contains("PHP source"));
        // The front controller names a script, last only.
        assert!(bad(&["/index.html"]).contains("front controller"));
        assert!(bad(&["/$uri"]).contains("front controller"));
        assert!(bad(&["//evil.php"]).contains("front controller"));
        assert!(bad(&["/index.php?x=$uri"]).contains("front controller"));
        assert!(bad(&["/index.php$host"]).contains("$host"));
        assert!(bad(&["/index.php", "index.php"]).contains("file name"));
        let i = index(&["index.php", "index.html", "/index.php$uri"]);
        assert_eq!(i.names, ["index.php", "index.html"]);
        assert!(i.front_controller.is_some());
        assert!(index(&["/index.php"]).names.is_empty());
    }

    #[test]
    fn params_that_choose_the_script_or_the_client_are_refused() {
        for name in [
            "SCRIPT_FILENAME",
            "script_filename",
            "PATH_TRANSLATED",
            "DOCUMENT_ROOT",
            "SCRIPT_NAME",
            "PATH_INFO",
            "REMOTE_ADDR",
            "REMOTE_USER",
            "CONTENT_LENGTH",
            "REQUEST_METHOD",
        ] {
            let e = check_param(name, "/etc/passwd").unwrap_err();
            assert!(e.contains("decided by tern"), "{name}: {e}");
        }
        assert!(check_param("HTTP_HOST", "x")
            .unwrap_err()
            .contains("header"));
        assert!(check_param("HTTP_PROXY", "")
            .unwrap_err()
            .contains("header"));
        for name in ["", "A-B", "1X", "a b", "É"] {
            assert!(check_param(name, "x").is_err(), "{name:?}");
        }
        // What names the server, and PHP's ini settings: fixed values only.
        for name in ["SERVER_NAME", "HTTPS", "PHP_VALUE", "php_admin_value"] {
            let e = check_param(name, "$host").unwrap_err();
            assert!(e.contains("fixed value"), "{name}: {e}");
        }
        assert!(check_param("X", "a\nb").is_err());
        assert!(check_param("PHP_VALUE", "a=1\nb=2").is_ok());
        assert!(check_param("APP_ENV", &"x".repeat(4097)).is_err());
        assert!(check_param("X", "$remote_addr")
            .unwrap_err()
            .contains("unknown"));
        for (name, value) in [
            ("front_controller_active", "true"),
            ("modHeadersAvailable", "true"),
            ("HTTPS", "on"),
            ("SERVER_PORT", "443"),
            ("APP_CLIENT", "$client $scheme $host $request_id $uri $$"),
        ] {
            assert!(check_param(name, value).is_ok(), "{name}");
        }
    }

    /// The config's parameters are added, and replace tern's of the same name (one pair
    /// each: PHP would take the last, other FastCGI servers the first).
    #[test]
    fn params_from_the_config_are_added_or_override() {
        let (_d, h) = handler();
        let params: Vec<Param> = [
            ("HTTPS", "on"),
            ("SERVER_PORT", "443"),
            ("front_controller_active", "true"),
        ]
        .iter()
        .map(|(n, v)| check_param(n, v).unwrap())
        .collect();
        let peer = "192.0.2.7:5555".parse().unwrap();
        tern_server::testing::with_request(
            b"GET /app.php HTTP/1.1\r\nHost: a\r\n\r\n",
            peer,
            false,
            |req| {
                let Ok(Target::Script(script)) = h.target(req.path(), req.path(), 0) else {
                    panic!("no script");
                };
                let mut p = Params::new();
                let mut sink = Sink {
                    params: &mut p,
                    set: &params,
                };
                let asked = asked_path(req.head);
                let target = unkeyed(&script, &asked, req);
                cgi_params(&mut sink, req, &target, "site.example");
                // Left for the config's: not sent by tern.
                assert_eq!(p.get(b"SERVER_PORT"), None);
                assert_eq!(p.get(b"SERVER_NAME"), Some(&b"site.example"[..]));
                assert_eq!(p.get(b"HTTPS"), None, "plain HTTP: tern sends none");
            },
        );
    }

    /// A route without a cache's view of the target.
    fn unkeyed<'a>(script: &'a Script, asked: &'a str, req: &'a Request<'_>) -> CgiTarget<'a> {
        CgiTarget {
            script,
            asked,
            query: req.head.query,
            keyed: false,
        }
    }

    /// The CGI parameters of `raw`, which must name a script, and the site's folder.
    fn params_for(raw: &str, local_port: u16, secure: bool) -> (tempfile::TempDir, Params) {
        let (d, h) = handler();
        let peer = "192.0.2.7:5555".parse().unwrap();
        tern_server::testing::with_request(raw.as_bytes(), peer, secure, |req| {
            let req = Request {
                head: req.head,
                body: req.body,
                peer: req.peer,
                secure: req.secure,
                local_port,
                unix_secs: req.unix_secs,
                now_ms: req.now_ms,
            };
            let Ok(Target::Script(script)) = h.target(req.path(), req.path(), 0) else {
                panic!("no script for {raw:?}");
            };
            let mut params = Params::new();
            let mut sink = Sink {
                params: &mut params,
                set: &[],
            };
            let asked = asked_path(req.head);
            let target = unkeyed(&script, &asked, &req);
            cgi_params(&mut sink, &req, &target, &h.options.server_name);
            (d, params)
        })
    }

    /// What the server is called comes from the config and the listener, never from `Host`.
    #[test]
    fn server_name_and_port_are_the_sites_and_the_listeners() {
        let (_d, p) = params_for(
            "GET /app.php HTTP/1.1\r\nHost: evil.example:6666\r\n\r\n",
            8080,
            false,
        );
        assert_eq!(p.get(b"SERVER_NAME"), Some(&b"site.example"[..]));
        assert_eq!(p.get(b"SERVER_PORT"), Some(&b"8080"[..]));
        let (_d, p) = params_for("GET /app.php HTTP/1.1\r\nHost: [::1]\r\n\r\n", 8443, true);
        assert_eq!(p.get(b"SERVER_NAME"), Some(&b"site.example"[..]));
        assert_eq!(p.get(b"SERVER_PORT"), Some(&b"8443"[..]));
        assert_eq!(p.get(b"HTTPS"), Some(&b"on"[..]));
    }

    #[test]
    fn the_script_is_named_by_the_root_it_was_found_under() {
        let (d, p) = params_for("GET /app.php/x?q=1 HTTP/1.1\r\nHost: a\r\n\r\n", 80, false);
        let file = p.get(b"SCRIPT_FILENAME").unwrap();
        let root = p.get(b"DOCUMENT_ROOT").unwrap();
        let (file, root) = (
            Path::new(std::str::from_utf8(file).unwrap()),
            Path::new(std::str::from_utf8(root).unwrap()),
        );
        assert_eq!(root, real_root(&d));
        assert_eq!(file, root.join("app.php"));
        assert_eq!(p.get(b"SCRIPT_NAME"), Some(&b"/app.php"[..]));
        assert_eq!(p.get(b"PATH_INFO"), Some(&b"/x"[..]));
        assert_eq!(p.get(b"QUERY_STRING"), Some(&b"q=1"[..]));
    }
}
