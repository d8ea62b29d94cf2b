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
//! What is never done: a script is run only if it exists as a file ending in `.php` (no
//! `cgi.fix_pathinfo` guessing, so `upload.jpg/x.php` runs nothing); a `.php` file is never
//! sent as a static file, whatever the case of its extension; a path with control characters
//! is refused (PATH_INFO with a newline broke PHP-FPM: CVE-2019-11043).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tern_fastcgi::{begin_request, http_param_name, Params, REQUEST_ID};
use tern_server::{
    Forward, Handler, HandlerContext, Method, Reply, Request, RequestHead, Response, UpstreamWire,
};

use crate::head;
use crate::{ProxyOptions, UpstreamGroup};

const SCRIPT_EXTENSION: &str = ".php";

/// Where the scripts are and how a folder's script is named.
#[derive(Debug, Clone)]
pub struct FastCgiOptions {
    /// The document root (absolute): scripts and static files live under it.
    pub root: PathBuf,
    /// The script a folder's path runs when it exists (nginx's `index index.php`).
    pub index: String,
}

/// A route's handler: scripts to the FastCGI group, other paths to `files`.
pub struct FastCgi {
    group: Arc<UpstreamGroup>,
    options: FastCgiOptions,
    proxy: ProxyOptions,
    files: Box<dyn Handler>,
}

/// The script a path names: its URL path and file, and what follows it.
#[derive(Debug, PartialEq, Eq)]
struct Script {
    name: String,
    file: PathBuf,
    path_info: String,
}

/// What a path asks for.
#[derive(Debug, PartialEq, Eq)]
enum Target {
    Script(Script),
    /// A `.php` path with no such script: 404 (never the file itself).
    MissingScript,
    /// Not a script: a static file (or not found).
    File,
}

impl FastCgi {
    pub fn new(
        group: Arc<UpstreamGroup>,
        options: FastCgiOptions,
        proxy: ProxyOptions,
        files: Box<dyn Handler>,
    ) -> FastCgi {
        FastCgi {
            group,
            options,
            proxy,
            files,
        }
    }

    /// The script `path` (decoded, canonical) runs: the first `.php` segment end whose prefix
    /// is a file, then PATH_INFO is the rest; a folder's path runs its index script.
    fn target(&self, path: &str) -> Target {
        if path.ends_with('/') {
            let name = format!("{path}{}", self.options.index);
            if let Some(file) = self.script_file(&name) {
                return Target::Script(Script {
                    name,
                    file,
                    path_info: String::new(),
                });
            }
            return Target::File;
        }
        let mut any = false;
        let mut from = 0;
        while let Some(at) = path[from..].find(SCRIPT_EXTENSION) {
            let end = from + at + SCRIPT_EXTENSION.len();
            from = end;
            if end < path.len() && path.as_bytes()[end] != b'/' {
                continue; // `/x.phpfoo`: not the extension
            }
            any = true;
            if let Some(file) = self.script_file(&path[..end]) {
                return Target::Script(Script {
                    name: path[..end].to_string(),
                    file,
                    path_info: path[end..].to_string(),
                });
            }
        }
        if any || names_php_source(path) {
            Target::MissingScript
        } else {
            Target::File
        }
    }

    /// The file of script `name` (a URL path) if it is a regular file under the root.
    fn script_file(&self, name: &str) -> Option<PathBuf> {
        let file = self.options.root.join(name.trim_start_matches('/'));
        std::fs::metadata(&file)
            .is_ok_and(|m| m.is_file())
            .then_some(file)
    }

    fn forward(&self, req: &Request<'_>, script: &Script, cx: &mut HandlerContext<'_>) -> Reply {
        let built = head::build(req, &self.proxy, cx.identity(), cx.request_id());
        let mut params = Params::new();
        cgi_params(&mut params, req, script, &self.options.root);
        if let Some(id) = cx.identity() {
            params.add(b"REMOTE_USER", id.user().as_bytes());
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
            edit: None,
            own_answers: None,
            max_body: u64::MAX,
            wire: UpstreamWire::FastCgi,
        }))
    }
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

/// The CGI/1.1 meta-variables (RFC 3875 §4.1) PHP reads, as nginx's `fastcgi_params` sets them.
fn cgi_params(p: &mut Params, req: &Request<'_>, script: &Script, root: &Path) {
    let head = req.head;
    let root = root.to_string_lossy();
    let file = script.file.to_string_lossy();
    p.add(b"GATEWAY_INTERFACE", b"CGI/1.1")
        .add(b"SERVER_SOFTWARE", b"tern")
        .add(b"SERVER_PROTOCOL", protocol(head))
        .add(b"REQUEST_METHOD", head.method_str.as_bytes())
        .add(
            b"REQUEST_SCHEME",
            if req.secure { b"https" } else { b"http" },
        )
        .add(b"SCRIPT_FILENAME", file.as_bytes())
        .add(b"SCRIPT_NAME", script.name.as_bytes())
        .add(b"DOCUMENT_ROOT", root.as_bytes())
        .add(b"DOCUMENT_URI", script.name.as_bytes())
        .add(b"QUERY_STRING", head.query.unwrap_or("").as_bytes())
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
    let asked = head.target.split('?').next().unwrap_or("");
    let canonical = tern_server::canonical_path(asked).unwrap_or(std::borrow::Cow::Borrowed(asked));
    let mut uri = canonical.into_owned();
    if let Some(q) = head.query {
        uri.push('?');
        uri.push_str(q);
    }
    p.add(b"REQUEST_URI", uri.as_bytes());
    if req.secure {
        p.add(b"HTTPS", b"on");
    }
    let host = head.host.map(tern_server::trim_ows).unwrap_or(b"");
    let (name, port) = split_host(host);
    p.add(b"SERVER_NAME", name);
    let default_port: &[u8] = if req.secure { b"443" } else { b"80" };
    p.add(b"SERVER_PORT", port.unwrap_or(default_port));
    if let Some(t) = head.header("content-type") {
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
        _ => b"HTTP/2.0",
    }
}

/// `example.org:8080` → (`example.org`, `8080`); `[::1]:80` → (`[::1]`, `80`).
fn split_host(host: &[u8]) -> (&[u8], Option<&[u8]>) {
    match host.iter().rposition(|&b| b == b':') {
        Some(i) if !host.starts_with(b"[") || host[..i].ends_with(b"]") => {
            (&host[..i], Some(&host[i + 1..]))
        }
        _ => (host, None),
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
        match self.target(path) {
            Target::Script(script) => self.forward(req, &script, cx),
            Target::MissingScript => Response::text(404, "not found\n").into(),
            Target::File => self.files.handle(req, cx),
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

    /// A handler over a root with `index.php`, `app.php`, `blog/index.php`, `img.jpg`.
    fn handler() -> (tempfile::TempDir, FastCgi) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        std::fs::create_dir(root.join("blog")).unwrap();
        for f in ["index.php", "app.php", "blog/index.php", "img.jpg"] {
            std::fs::write(root.join(f), "x").unwrap();
        }
        std::fs::create_dir(root.join("dir.php")).unwrap();
        let group = UpstreamGroup::new(
            crate::GroupOptions {
                servers: vec![crate::group::UpstreamServer::new(
                    tern_server::UpstreamAddr::Unix(dir.path().join("php.sock")),
                )],
                ..Default::default()
            },
            1,
        );
        let files: Box<dyn Handler> = Box::new(|_: &Request<'_>, _: &mut HandlerContext<'_>| {
            Reply::Now(Response::text(404, "not found\n"))
        });
        let h = FastCgi::new(
            Arc::new(group),
            FastCgiOptions {
                root,
                index: "index.php".into(),
            },
            ProxyOptions::default(),
            files,
        );
        (dir, h)
    }

    fn script(h: &FastCgi, name: &str, path_info: &str) -> Target {
        Target::Script(Script {
            name: name.into(),
            file: h.options.root.join(name.trim_start_matches('/')),
            path_info: path_info.into(),
        })
    }

    #[test]
    fn a_path_runs_the_first_script_that_exists_and_the_rest_is_path_info() {
        let (_d, h) = handler();
        assert_eq!(h.target("/app.php"), script(&h, "/app.php", ""));
        assert_eq!(h.target("/app.php/a/b"), script(&h, "/app.php", "/a/b"));
        assert_eq!(h.target("/"), script(&h, "/index.php", ""));
        assert_eq!(h.target("/blog/"), script(&h, "/blog/index.php", ""));
        // A folder named like a script is not one.
        assert_eq!(h.target("/dir.php"), Target::MissingScript);
    }

    #[test]
    fn nothing_runs_that_is_not_a_php_file_and_no_script_is_a_file() {
        let (_d, h) = handler();
        assert_eq!(h.target("/img.jpg/x.php"), Target::MissingScript);
        assert_eq!(h.target("/img.jpg"), Target::File);
        assert_eq!(h.target("/app.PHP"), Target::MissingScript);
        assert_eq!(h.target("/app.phpx"), Target::MissingScript);
        for copy in [
            "/app.php.bak",
            "/app.php~",
            "/.app.php.swp",
            "/app.PHP.orig",
            "/app.php5",
            "/lib/view.phtml",
            "/tool.phar",
        ] {
            assert_eq!(h.target(copy), Target::MissingScript, "{copy}");
        }
        assert_eq!(h.target("/php/readme.txt"), Target::File);
        assert_eq!(h.target("/phpinfo.txt"), Target::File);
        assert_eq!(h.target("/nope.php/x"), Target::MissingScript);
        assert_eq!(h.target("/nofolder/"), Target::File);
    }

    #[test]
    fn host_and_port_are_split_for_server_name_and_port() {
        assert_eq!(
            split_host(b"example.org:8080"),
            (&b"example.org"[..], Some(&b"8080"[..]))
        );
        assert_eq!(split_host(b"example.org"), (&b"example.org"[..], None));
        assert_eq!(split_host(b"[::1]:80"), (&b"[::1]"[..], Some(&b"80"[..])));
        assert_eq!(split_host(b"[::1]"), (&b"[::1]"[..], None));
    }
}
