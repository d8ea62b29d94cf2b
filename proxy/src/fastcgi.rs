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
//! What is never done: a script is run only if it exists as a file ending in `.php` (no
//! `cgi.fix_pathinfo` guessing, so `upload.jpg/x.php` runs nothing); a `.php` file is never
//! sent as a static file, whatever the case of its extension; a path with control characters
//! is refused (PATH_INFO with a newline broke PHP-FPM: CVE-2019-11043).

use std::sync::Arc;

use tern_fastcgi::{begin_request, http_param_name, Params, REQUEST_ID};
use tern_server::static_files::{FileBeneath, StaticFiles};
use tern_server::{
    Forward, Handler, HandlerContext, Method, Reply, Request, RequestHead, Response, UpstreamWire,
};

use crate::head;
use crate::{ProxyOptions, UpstreamGroup};

const SCRIPT_EXTENSION: &str = ".php";

/// How a folder's script is named, and what the scripts are told the server is called.
#[derive(Debug, Clone, Default)]
pub struct FastCgiOptions {
    /// The script a folder's path runs when it exists (nginx's `index index.php`).
    pub index: String,
    /// `SERVER_NAME`: the site's name from the config (empty for a site that has none).
    pub server_name: String,
}

/// A route's handler: scripts to the FastCGI group, other paths to `files`, the route's
/// static files, which also judge whether a script's file may run.
pub struct FastCgi {
    group: Arc<UpstreamGroup>,
    options: FastCgiOptions,
    proxy: ProxyOptions,
    files: StaticFiles,
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
        }
    }

    /// The script `path` (decoded, canonical) runs: the first `.php` segment end whose prefix
    /// is a file, then PATH_INFO is the rest; a folder's path runs its index script. A
    /// script's file is judged as the static files judge a file (see the module docs); the
    /// error is their answer for a path they refuse (a dotfile: 404). PATH_INFO is no file
    /// and is not judged (`/index.php/.well-known/x` runs `/index.php`).
    fn target(&self, path: &str, now_ms: u64) -> Result<Target, Response> {
        if path.ends_with('/') {
            let name = format!("{path}{}", self.options.index);
            if let Some(file) = self.files.file_beneath(&name, now_ms)? {
                return Ok(Target::Script(Script {
                    name,
                    file,
                    path_info: String::new(),
                }));
            }
            return Ok(Target::File);
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
            if let Some(file) = self.files.file_beneath(&path[..end], now_ms)? {
                return Ok(Target::Script(Script {
                    name: path[..end].to_string(),
                    file,
                    path_info: path[end..].to_string(),
                }));
            }
        }
        Ok(if any || names_php_source(path) {
            Target::MissingScript
        } else {
            Target::File
        })
    }

    fn forward(&self, req: &Request<'_>, script: &Script, cx: &mut HandlerContext<'_>) -> Reply {
        let built = head::build(req, &self.proxy, cx.identity(), cx.request_id());
        let mut params = Params::new();
        cgi_params(&mut params, req, script, &self.options.server_name);
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

/// The CGI/1.1 meta-variables (RFC 3875 §4.1) PHP reads, as nginx's `fastcgi_params` sets them
/// (with `$realpath_root` for the root, as for deploys that switch a symlink).
fn cgi_params(p: &mut Params, req: &Request<'_>, script: &Script, server_name: &str) {
    let head = req.head;
    let root = script.file.root.to_string_lossy();
    let file = script.file.path.to_string_lossy();
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
    // From the config and the listener, not the client's `Host` (which PHP still gets, as
    // HTTP_HOST): nginx passes its `server_name` and the port it accepted on.
    p.add(b"SERVER_NAME", server_name.as_bytes());
    p.add(
        b"SERVER_PORT",
        itoa::Buffer::new().format(req.local_port).as_bytes(),
    );
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
        match self.target(path, req.now_ms) {
            Ok(Target::Script(script)) => self.forward(req, &script, cx),
            Ok(Target::MissingScript) => Response::text(404, "not found\n").into(),
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
                index: "index.php".into(),
                server_name: "site.example".into(),
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
        h.target(path, 0)
            .unwrap_or_else(|r| panic!("{path}: refused with {}", r.status))
    }

    fn refusal(h: &FastCgi, path: &str) -> u16 {
        match h.target(path, 0) {
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
            let Ok(Target::Script(script)) = h.target(req.path(), 0) else {
                panic!("no script for {raw:?}");
            };
            let mut params = Params::new();
            cgi_params(&mut params, &req, &script, &h.options.server_name);
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
