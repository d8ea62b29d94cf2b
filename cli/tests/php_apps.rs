//! Published PHP set-ups, run as a new user would (issue 41): the nginx configuration an app's
//! own documentation gives, translated to `tern.toml`, both in front of the same PHP-FPM and
//! the same files, and the same requests answered the same way, answer by answer, as
//! `cli/tests/fastcgi.rs` does for a plain PHP site. The apps are small stand-ins (scripts that
//! echo what they were told), laid out as the real apps are where it matters: WordPress's
//! `wp-admin/` folder and its front controller; Nextcloud's `remote.php` WebDAV endpoint, its
//! `index.php` front controller with `PATH_INFO`, folders without an index (`apps/files/`),
//! and the paths it hides.
//!
//! What a migrating user still misses here is left out of the comparison and said where it is:
//! Nextcloud's legacy rewrite (a negative lookahead) and its assets' `immutable` by query,
//! and nginx's 403 for a folder with no index (tern goes on to the fallback). The README's
//! Caddyfile for each app must pass `caddy validate`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use crate::{php_support, support};
use php_support::PhpFpm;
use support::*;

/// One request both servers get.
struct Ask {
    method: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    body: &'static str,
}

/// The answer both must give: the status, and the body and `Location` when given (a
/// `Location` compared by its path: nginx writes absolute ones, `http://host:port/...`), and
/// fields it must carry with this value, or not at all (`None`).
struct Answer {
    status: u16,
    text: Option<&'static str>,
    location: Option<&'static str>,
    fields: &'static [(&'static str, Option<&'static str>)],
}

impl Answer {
    const fn with(self, fields: &'static [(&'static str, Option<&'static str>)]) -> Answer {
        Answer { fields, ..self }
    }
}

const fn get(path: &'static str) -> Ask {
    Ask {
        method: "GET",
        path,
        headers: &[],
        body: "",
    }
}

const fn status(status: u16) -> Answer {
    Answer {
        status,
        text: None,
        location: None,
        fields: &[],
    }
}

const fn text(status: u16, text: &'static str) -> Answer {
    Answer {
        status,
        text: Some(text),
        location: None,
        fields: &[],
    }
}

const fn moved(location: &'static str) -> Answer {
    Answer {
        status: 301,
        text: None,
        location: Some(location),
        fields: &[],
    }
}

fn send(addr: SocketAddr, ask: &Ask) -> Resp {
    let mut c = Client::connect(addr);
    c.chunked_ok = true;
    let mut headers = vec![("Connection", "close")];
    headers.extend_from_slice(ask.headers);
    let len = ask.body.len().to_string();
    if !ask.body.is_empty() {
        headers.push(("Content-Length", &len));
    }
    let mut req = request_bytes(ask.method, ask.path, &headers);
    req.extend_from_slice(ask.body.as_bytes());
    c.send(&req);
    c.read_response(ask.method == "HEAD")
}

/// A `Location`'s path and query: an absolute one loses its scheme and authority.
fn location_path(location: &str) -> &str {
    match location.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |at| &rest[at..]),
        None => location,
    }
}

fn check(addr: SocketAddr, who: &str, cases: &[(Ask, Answer)]) {
    for (ask, answer) in cases {
        let what = format!("{who}: {} {}", ask.method, ask.path);
        let r = send(addr, ask);
        assert_eq!(r.status, answer.status, "{what}: {}", r.text());
        if let Some(text) = answer.text {
            assert_eq!(r.text(), text, "{what}");
        }
        if let Some(location) = answer.location {
            let got = r.header("location").map(location_path);
            assert_eq!(got, Some(location), "{what}");
        }
        for (name, value) in answer.fields {
            assert_eq!(r.header(name), *value, "{what}: {name}: {r:?}");
        }
    }
}

/// Writes `files` (path, content) under `dir/www`.
fn site(dir: &Path, files: &[(&str, &str)]) -> PathBuf {
    let www = dir.join("www");
    for (rel, text) in files {
        let p = www.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    www
}

/// The same requests to tern with `tern_toml`, then to nginx with `nginx_http` (its
/// `{port}` filled in), in front of one PHP-FPM; `None` when php-fpm is missing (skipped).
fn both(
    files: &[(&str, &str)],
    tern_toml: impl Fn(&Path, &Path) -> String,
    nginx_http: impl Fn(&Path, &Path, u16) -> String,
    cases: &[(Ask, Answer)],
) -> Option<(tempfile::TempDir, PhpFpm, PathBuf)> {
    let tmp = tempfile::tempdir().unwrap();
    let fpm = PhpFpm::start(tmp.path())?;
    let www = site(tmp.path(), files);
    let conf = tmp.path().join("tern.toml");
    std::fs::write(&conf, tern_toml(&www, &fpm.socket)).unwrap();
    let check_out = run_to_end(
        std::process::Command::new(TERN)
            .args(["run", "--check", "--config"])
            .arg(&conf),
        std::time::Duration::from_secs(10),
    );
    assert!(check_out.status.success(), "{}", check_out.stderr);
    let tern = Tern::start_run(&conf);
    check(tern.addr(), "tern", cases);
    drop(tern);

    let port = free_port();
    let http = nginx_http(&www, &fpm.socket, port);
    if let Some(nginx) = Nginx::start(&tmp.path().join("nginx"), &http, port) {
        check(nginx.addr, "nginx", cases);
    }
    Some((tmp, fpm, www))
}

// ---------------------------------------------------------------------------------------
// WordPress

/// A WordPress stand-in: the front controller, the dashboard in `wp-admin/`, the login form,
/// uploads (one a script that must never run), a theme's stylesheet.
const WORDPRESS: &[(&str, &str)] = &[
    (
        "index.php",
        "<?php header('Content-Type: text/plain');\n\
         echo 'wp uri=', $_SERVER['REQUEST_URI'], ' script=', $_SERVER['SCRIPT_NAME'],\n\
         ' q=', $_SERVER['QUERY_STRING'], ' p=', $_GET['p'] ?? '-', \"\\n\";\n",
    ),
    (
        "wp-admin/index.php",
        "<?php header('Content-Type: text/plain');\n\
         echo 'dashboard script=', $_SERVER['SCRIPT_NAME'], ' uri=', $_SERVER['REQUEST_URI'], \"\\n\";\n",
    ),
    ("wp-admin/css/dashboard.css", "#wpadminbar { color: #fff }\n"),
    (
        "wp-login.php",
        "<?php header('Content-Type: text/plain');\n\
         echo 'login ', $_POST['log'] ?? '?', ' via ', $_SERVER['REQUEST_METHOD'], \"\\n\";\n",
    ),
    (
        "wp-config.php",
        "<?php define('DB_PASSWORD', 'hunter2');\n",
    ),
    (
        "wp-content/uploads/2024/01/shell.php",
        "<?php echo 'uploaded code ran';\n",
    ),
    ("wp-content/uploads/2024/01/photo.jpg", "JPEG"),
    (
        "wp-content/themes/twentytwentyfour/style.css",
        "body { margin: 0 }\n",
    ),
    (".htaccess", "# Apache's rules, never served\n"),
];

/// WordPress's recommended nginx server block: the "WordPress single site rules" of the
/// "Nginx" page of WordPress's Advanced Administration Handbook
/// (<https://developer.wordpress.org/advanced-administration/server/web-server/nginx/>,
/// "Global restrictions file" included), with the PHP upstream on the test's socket and
/// Debian's `fastcgi_params` by its full path.
fn wordpress_nginx(www: &Path, socket: &Path, port: u16) -> String {
    format!(
        r#"
upstream php {{
    server unix:{socket};
}}
server {{
    listen 127.0.0.1:{port};
    server_name domain.tld;
    root {www};
    index index.php;

    # global restrictions
    location = /favicon.ico {{ log_not_found off; access_log off; }}
    location = /robots.txt {{ allow all; log_not_found off; access_log off; }}
    location ~ /\. {{ deny all; }}
    location ~* /(?:uploads|files)/.*\.php$ {{ deny all; }}

    location / {{
        try_files $uri $uri/ /index.php?$args;
    }}
    location ~ \.php$ {{
        include /etc/nginx/fastcgi_params;
        fastcgi_intercept_errors on;
        fastcgi_pass php;
        fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
    }}
    location ~* \.(js|css|png|jpg|jpeg|gif|ico)$ {{
        expires max;
        log_not_found off;
    }}
}}
"#,
        www = www.display(),
        socket = socket.display()
    )
}

const WORDPRESS_SECTION: &str = "### WordPress in tern, nginx and Caddy";

/// The same in tern: the README's block (its WordPress section), so the README shows what
/// this test runs. The restrictions are routes with path patterns, the assets have no
/// front controller (nginx's asset location has no `try_files`), the rest is the PHP route.
fn wordpress_tern(www: &Path, socket: &Path) -> String {
    readme_block(WORDPRESS_SECTION, "toml")
        .replace("/var/www/wordpress", www.to_str().unwrap())
        .replace("/run/php/php8.2-fpm.sock", socket.to_str().unwrap())
}

/// nginx's `expires max`.
const EXPIRES_MAX: &[(&str, Option<&str>)] = &[
    ("Expires", Some("Thu, 31 Dec 2037 23:55:55 GMT")),
    ("Cache-Control", Some("max-age=315360000")),
];

const WORDPRESS_CASES: &[(Ask, Answer)] = &[
    (get("/"), text(200, "wp uri=/ script=/index.php q= p=-\n")),
    (
        get("/?p=123"),
        text(200, "wp uri=/?p=123 script=/index.php q=p=123 p=123\n"),
    ),
    // Pretty permalinks: no such file or folder, so the front controller.
    (
        get("/2024/01/hello-world/"),
        text(
            200,
            "wp uri=/2024/01/hello-world/ script=/index.php q= p=-\n",
        ),
    ),
    (
        get("/2024/01/hello-world/?replytocom=5"),
        text(
            200,
            "wp uri=/2024/01/hello-world/?replytocom=5 script=/index.php q=replytocom=5 p=-\n",
        ),
    ),
    // The dashboard's folder asked for without its slash: redirected to it (its page's
    // relative links need the slash), the query kept.
    (get("/wp-admin"), moved("/wp-admin/")),
    (get("/wp-admin?lang=fr"), moved("/wp-admin/?lang=fr")),
    (
        get("/wp-admin/"),
        text(200, "dashboard script=/wp-admin/index.php uri=/wp-admin/\n"),
    ),
    (
        get("/wp-admin/?lang=fr"),
        text(
            200,
            "dashboard script=/wp-admin/index.php uri=/wp-admin/?lang=fr\n",
        ),
    ),
    (
        get("/wp-admin/css/dashboard.css"),
        text(200, "#wpadminbar { color: #fff }\n").with(EXPIRES_MAX),
    ),
    (
        Ask {
            method: "POST",
            path: "/wp-login.php",
            headers: &[("Content-Type", "application/x-www-form-urlencoded")],
            body: "log=admin&pwd=secret",
        },
        text(200, "login admin via POST\n"),
    ),
    (get("/wp-config.php"), text(200, "")),
    // Code in the uploads never runs; the uploads themselves are files.
    (get("/wp-content/uploads/2024/01/shell.php"), status(403)),
    (
        get("/wp-content/uploads/2024/01/photo.jpg"),
        text(200, "JPEG").with(EXPIRES_MAX),
    ),
    (
        get("/wp-content/themes/twentytwentyfour/style.css"),
        text(200, "body { margin: 0 }\n"),
    ),
    // `expires` leaves errors alone.
    (
        get("/wp-content/themes/twentytwentyfour/gone.css"),
        status(404).with(&[("Expires", None)]),
    ),
    (get("/.htaccess"), status(403)),
];

#[test]
fn wordpress_recommended_nginx_config_and_its_tern_toml_answer_alike() {
    both(WORDPRESS, wordpress_tern, wordpress_nginx, WORDPRESS_CASES);
}

// ---------------------------------------------------------------------------------------
// Nextcloud

/// A Nextcloud stand-in: `remote.php` answers WebDAV as the real one's status codes go
/// (207 for PROPFIND, 201 for MKCOL and PUT) and echoes what it was told; `index.php` is the
/// front controller; `apps/files/` is a folder with no index; `config/` and `data/` hold what
/// must never be served.
const NEXTCLOUD: &[(&str, &str)] = &[
    (
        "index.php",
        "<?php header('Content-Type: text/plain');\n\
         echo 'nc script=', $_SERVER['SCRIPT_NAME'], ' info=', $_SERVER['PATH_INFO'] ?? 'unset',\n\
         ' uri=', $_SERVER['REQUEST_URI'], ' q=', $_SERVER['QUERY_STRING'],\n\
         ' fca=', $_SERVER['front_controller_active'] ?? '-',\n\
         ' mha=', $_SERVER['modHeadersAvailable'] ?? '-', ' https=', $_SERVER['HTTPS'] ?? '-', \"\\n\";\n",
    ),
    (
        "remote.php",
        "<?php $m = $_SERVER['REQUEST_METHOD'];\n\
         $body = file_get_contents('php://input');\n\
         http_response_code(['PROPFIND' => 207, 'MKCOL' => 201, 'PUT' => 201][$m] ?? 200);\n\
         header('Content-Type: text/plain');\n\
         echo 'dav ', $m, ' script=', $_SERVER['SCRIPT_NAME'], ' info=', $_SERVER['PATH_INFO'] ?? 'unset',\n\
         ' depth=', $_SERVER['HTTP_DEPTH'] ?? '-', ' body=', strlen($body),\n\
         ' fca=', $_SERVER['front_controller_active'] ?? '-', ' https=', $_SERVER['HTTPS'] ?? '-', \"\\n\";\n",
    ),
    (
        "status.php",
        "<?php header('Content-Type: application/json');\n\
         echo '{\"installed\":true,\"maintenance\":false}';\n",
    ),
    (
        "ocs/v2.php",
        "<?php header('Content-Type: text/plain');\n\
         echo 'ocs info=', $_SERVER['PATH_INFO'] ?? 'unset', ' q=', $_SERVER['QUERY_STRING'], \"\\n\";\n",
    ),
    ("apps/files/js/files.js", "OCA.Files = {};\n"),
    ("core/css/server.css", "#body-user { color: #000 }\n"),
    ("robots.txt", "User-agent: *\nDisallow: /\n"),
    ("config/config.php", "<?php $CONFIG = ['dbpassword' => 'hunter2'];\n"),
    ("data/admin/files/secret.txt", "private\n"),
    (".htaccess", "# Apache's rules\n"),
    ("occ", "#!/usr/bin/env php\n"),
];

/// Nextcloud's `nginx-root.conf.sample` (the admin manual's "NGINX configuration", from
/// <https://github.com/nextcloud/documentation>,
/// `admin_manual/installation/nginx-root.conf.sample`, version 2024-07-17): its HTTPS server
/// block on plain HTTP here (TLS and the port-80 redirect left out: tern's `[tls]` covers
/// them), gzip and the body limits left out, the upstream on the test's socket.
fn nextcloud_nginx(www: &Path, socket: &Path, port: u16) -> String {
    format!(
        r#"
upstream php-handler {{
    server unix:{socket};
}}
map $arg_v $asset_immutable {{
    "" "";
    default ", immutable";
}}
server {{
    listen 127.0.0.1:{port};
    server_name cloud.example.com;
    root {www};

    add_header Referrer-Policy "no-referrer" always;
    add_header X-Content-Type-Options "nosniff" always;
    add_header X-Frame-Options "SAMEORIGIN" always;
    add_header X-Permitted-Cross-Domain-Policies "none" always;
    add_header X-Robots-Tag "noindex, nofollow" always;
    add_header X-XSS-Protection "1; mode=block" always;
    fastcgi_hide_header X-Powered-By;

    index index.php index.html /index.php$request_uri;

    location = / {{
        if ( $http_user_agent ~ ^DavClnt ) {{
            return 302 /remote.php/webdav/$is_args$args;
        }}
    }}
    location = /robots.txt {{ allow all; log_not_found off; access_log off; }}
    location ^~ /.well-known {{
        absolute_redirect off;
        location = /.well-known/carddav {{ return 301 /remote.php/dav/; }}
        location = /.well-known/caldav  {{ return 301 /remote.php/dav/; }}
        location /.well-known/acme-challenge {{ try_files $uri $uri/ =404; }}
        location /.well-known/pki-validation {{ try_files $uri $uri/ =404; }}
        return 301 /index.php$request_uri;
    }}
    location ~ ^/(?:build|tests|config|lib|3rdparty|templates|data)(?:$|/) {{ return 404; }}
    location ~ ^/(?:\.|autotest|occ|issue|indie|db_|console) {{ return 404; }}

    location ~ \.php(?:$|/) {{
        rewrite ^/(?!index|remote|public|cron|core\/ajax\/update|status|ocs\/v[12]|updater\/.+|ocs-provider\/.+|.+\/richdocumentscode(_arm64)?\/proxy) /index.php$request_uri;
        fastcgi_split_path_info ^(.+?\.php)(/.*)$;
        set $path_info $fastcgi_path_info;
        try_files $fastcgi_script_name =404;
        include /etc/nginx/fastcgi_params;
        fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;
        fastcgi_param PATH_INFO $path_info;
        fastcgi_param HTTPS on;
        fastcgi_param modHeadersAvailable true;
        fastcgi_param front_controller_active true;
        fastcgi_pass php-handler;
        fastcgi_intercept_errors on;
        fastcgi_request_buffering off;
        fastcgi_max_temp_file_size 0;
    }}
    location ~ \.(?:css|js|mjs|svg|gif|ico|jpg|png|webp|wasm|tflite|map|ogg|flac)$ {{
        try_files $uri /index.php$request_uri;
        add_header Cache-Control "public, max-age=15778463$asset_immutable";
        access_log off;
    }}
    location ~ \.(otf|woff2?)$ {{
        try_files $uri /index.php$request_uri;
        expires 7d;
        access_log off;
    }}
    location /remote {{
        return 301 /remote.php$request_uri;
    }}
    location / {{
        try_files $uri $uri/ /index.php$request_uri;
    }}
}}
"#,
        www = www.display(),
        socket = socket.display()
    )
}

const NEXTCLOUD_SECTION: &str = "### Nextcloud in tern, nginx and Caddy";

/// The same in tern: the README's block (its Nextcloud section). The hidden paths
/// are routes with path patterns (the first of the `/` routes whose pattern matches wins, as
/// nginx's first matching regex location); the `/.well-known` routes are longer prefixes, so
/// they win over those patterns as `^~` does; `index` ends with the front controller and
/// `fastcgi_params` adds Nextcloud's two flags and `HTTPS`.
fn nextcloud_tern(www: &Path, socket: &Path) -> String {
    readme_block(NEXTCLOUD_SECTION, "toml")
        .replace("/var/www/nextcloud", www.to_str().unwrap())
        .replace("/run/php/php8.2-fpm.sock", socket.to_str().unwrap())
}

const PROPFIND_BODY: &str = "<?xml version=\"1.0\"?>\n<d:propfind xmlns:d=\"DAV:\"><d:prop><d:getlastmodified/></d:prop></d:propfind>\n";

/// The server block's `add_header ... always`: on every answer, tern's own included.
const SECURITY: &[(&str, Option<&str>)] = &[
    ("Referrer-Policy", Some("no-referrer")),
    ("X-Content-Type-Options", Some("nosniff")),
    ("X-Frame-Options", Some("SAMEORIGIN")),
    ("X-Permitted-Cross-Domain-Policies", Some("none")),
    ("X-Robots-Tag", Some("noindex, nofollow")),
    ("X-XSS-Protection", Some("1; mode=block")),
    ("X-Powered-By", None),
];
/// The assets' location (without `?v=`, whose `immutable` tern cannot add).
const ASSET: &[(&str, Option<&str>)] = &[("Cache-Control", Some("public, max-age=15778463"))];

const NEXTCLOUD_CASES: &[(Ask, Answer)] = &[
    // WebDAV: clients list folders with a trailing slash; the script is remote.php.
    (
        Ask {
            method: "PROPFIND",
            path: "/remote.php/dav/files/admin/",
            headers: &[("Depth", "1"), ("Content-Type", "application/xml")],
            body: PROPFIND_BODY,
        },
        text(
            207,
            "dav PROPFIND script=/remote.php info=/dav/files/admin/ depth=1 body=100 fca=true https=on\n",
        ),
    ),
    (
        Ask {
            method: "PROPFIND",
            path: "/remote.php/webdav/",
            headers: &[("Depth", "0")],
            body: "",
        },
        text(
            207,
            "dav PROPFIND script=/remote.php info=/webdav/ depth=0 body=0 fca=true https=on\n",
        ),
    ),
    (
        Ask {
            method: "MKCOL",
            path: "/remote.php/dav/files/admin/Photos/",
            headers: &[],
            body: "",
        },
        text(
            201,
            "dav MKCOL script=/remote.php info=/dav/files/admin/Photos/ depth=- body=0 fca=true https=on\n",
        ),
    ),
    (
        Ask {
            method: "PUT",
            path: "/remote.php/dav/files/admin/Photos/a.txt",
            headers: &[("Content-Type", "text/plain")],
            body: "hello",
        },
        text(
            201,
            "dav PUT script=/remote.php info=/dav/files/admin/Photos/a.txt depth=- body=5 fca=true https=on\n",
        ),
    ),
    (
        get("/remote.php/dav/files/admin/"),
        text(
            200,
            "dav GET script=/remote.php info=/dav/files/admin/ depth=- body=0 fca=true https=on\n",
        ),
    ),
    // `location = /` with `if ($http_user_agent ~ ^DavClnt)`: a header pattern.
    (
        Ask {
            method: "GET",
            path: "/",
            headers: &[("User-Agent", "DavClnt")],
            body: "",
        },
        Answer {
            status: 302,
            text: None,
            location: Some("/remote.php/webdav/"),
            fields: SECURITY,
        },
    ),
    (
        Ask {
            method: "GET",
            path: "/",
            headers: &[("User-Agent", "Mozilla/5.0 DavClnt")],
            body: "",
        },
        text(
            200,
            "nc script=/index.php info= uri=/ q= fca=true mha=true https=on\n",
        ),
    ),
    // The front controller: pretty URLs, with PATH_INFO; a folder with no index too.
    (
        get("/"),
        text(
            200,
            "nc script=/index.php info= uri=/ q= fca=true mha=true https=on\n",
        )
        .with(SECURITY),
    ),
    (
        get("/apps/files/"),
        text(
            200,
            "nc script=/index.php info=/apps/files/ uri=/apps/files/ q= fca=true mha=true https=on\n",
        ),
    ),
    (get("/apps/files"), moved("/apps/files/").with(SECURITY)),
    (
        get("/index.php/apps/files/"),
        text(
            200,
            "nc script=/index.php info=/apps/files/ uri=/index.php/apps/files/ q= fca=true mha=true https=on\n",
        ),
    ),
    (
        get("/login"),
        text(
            200,
            "nc script=/index.php info=/login uri=/login q= fca=true mha=true https=on\n",
        ),
    ),
    (
        get("/apps/dashboard/"),
        text(
            200,
            "nc script=/index.php info=/apps/dashboard/ uri=/apps/dashboard/ q= fca=true mha=true https=on\n",
        ),
    ),
    // A missing asset goes to the front controller too (nginx: its asset location's
    // try_files; tern: the PHP route's).
    (
        get("/core/img/missing.png"),
        text(
            200,
            "nc script=/index.php info=/core/img/missing.png uri=/core/img/missing.png q= fca=true mha=true https=on\n",
        ),
    ),
    (
        get("/ocs/v2.php/cloud/capabilities?format=json"),
        text(200, "ocs info=/cloud/capabilities q=format=json\n"),
    ),
    (
        get("/status.php"),
        text(200, "{\"installed\":true,\"maintenance\":false}"),
    ),
    (
        get("/apps/files/js/files.js"),
        text(200, "OCA.Files = {};\n").with(ASSET),
    ),
    (
        get("/core/css/server.css"),
        text(200, "#body-user { color: #000 }\n").with(ASSET),
    ),
    (get("/robots.txt"), text(200, "User-agent: *\nDisallow: /\n")),
    // `.well-known`: the service discovery redirects.
    (
        get("/.well-known/carddav"),
        moved("/remote.php/dav/").with(SECURITY),
    ),
    (get("/.well-known/caldav"), moved("/remote.php/dav/")),
    (
        get("/.well-known/webfinger?resource=acct:admin@cloud.example.com"),
        moved("/index.php/.well-known/webfinger?resource=acct:admin@cloud.example.com"),
    ),
    (get("/remote/dav"), moved("/remote.php/remote/dav")),
    // What Nextcloud hides.
    (get("/config/config.php"), status(404).with(SECURITY)),
    (get("/config/"), status(404)),
    (get("/data/admin/files/secret.txt"), status(404)),
    (get("/.htaccess"), status(404)),
    (get("/occ"), status(404)),
    (get("/console.php"), status(404)),
];

#[test]
fn nextcloud_nginx_root_conf_sample_and_its_tern_toml_answer_alike() {
    let Some((tmp, fpm, www)) = both(NEXTCLOUD, nextcloud_tern, nextcloud_nginx, NEXTCLOUD_CASES)
    else {
        return;
    };
    // One answer differs on purpose: nginx's `index` fallback `/index.php$request_uri`
    // redirects internally without splitting off the query, so PHP gets it in PATH_INFO
    // (`/apps/files/?dir=/Photos`) as well as in QUERY_STRING; tern's `$uri` is the path.
    let conf = tmp.path().join("tern.toml");
    std::fs::write(&conf, nextcloud_tern(&www, &fpm.socket)).unwrap();
    let tern = Tern::start_run(&conf);
    let cases = [(
        get("/apps/files/?dir=/Photos"),
        text(
            200,
            "nc script=/index.php info=/apps/files/ uri=/apps/files/?dir=/Photos q=dir=/Photos fca=true mha=true https=on\n",
        ),
    )];
    check(tern.addr(), "tern", &cases);
}

/// `index` alone, with no `try_files` (nginx's `index ... /index.php$request_uri` in a
/// server with no `location /` fallback): a folder with an index script runs it, one with
/// an `index.html` gets the file, any other folder the front controller with its path.
#[test]
fn index_ends_with_the_front_controller() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(fpm) = PhpFpm::start(tmp.path()) else {
        return;
    };
    let mut files = NEXTCLOUD.to_vec();
    files.push((
        "updater/index.php",
        "<?php echo 'updater ', $_SERVER['SCRIPT_NAME'];\n",
    ));
    files.push(("docs/index.html", "<h1>docs</h1>\n"));
    let www = site(tmp.path(), &files);
    let conf = tmp.path().join("tern.toml");
    std::fs::write(
        &conf,
        format!(
            r#"
[[site]]
name = "cloud"
default = true

[[site.route]]
path = "/"
static = "{www}"
fastcgi = "unix:{socket}"
index = ["index.php", "index.html", "/index.php$uri"]
"#,
            www = www.display(),
            socket = fpm.socket.display()
        ),
    )
    .unwrap();
    let tern = Tern::start_run(&conf);
    let cases = [
        (get("/updater/"), text(200, "updater /updater/index.php")),
        (get("/docs/"), text(200, "<h1>docs</h1>\n")),
        (
            get("/apps/files/"),
            text(
                200,
                "nc script=/index.php info=/apps/files/ uri=/apps/files/ q= fca=- mha=- https=-\n",
            ),
        ),
        // A folder that does not exist is no folder: the static side's 404.
        (get("/nowhere/"), status(404)),
        (get("/apps/files"), moved("/apps/files/")),
    ];
    check(tern.addr(), "tern", &cases);
}

/// The README's Caddyfiles for WordPress and Nextcloud, with the test's folder and socket.
#[test]
fn the_readme_wordpress_and_nextcloud_caddyfiles_are_valid() {
    for (section, root) in [
        (WORDPRESS_SECTION, "/var/www/wordpress"),
        (NEXTCLOUD_SECTION, "/var/www/nextcloud"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let www = site(tmp.path(), &[("index.php", "<?php echo 'x';\n")]);
        let socket = tmp.path().join("php.sock");
        let file = tmp.path().join("Caddyfile");
        let caddyfile = readme_block(section, "caddy")
            .replace(root, www.to_str().unwrap())
            .replace("/run/php/php8.2-fpm.sock", socket.to_str().unwrap());
        std::fs::write(&file, caddyfile).unwrap();
        if let Some(Err(e)) = caddy_validate(&file, tmp.path()) {
            panic!("{section}: {e}");
        }
    }
}
