//! The gate's pages: small, no inline script or style (so a strict Content-Security-Policy
//! holds), readable without colour or JavaScript, every value HTML-escaped.

/// The solver's page script and its worker, and the pages' style sheet.
pub const CHALLENGE_JS: &str = include_str!("../assets/challenge.js");
pub const WORKER_JS: &str = include_str!("../assets/worker.js");
pub const GATE_CSS: &str = include_str!("../assets/gate.css");

/// `s` safe inside HTML text and double- or single-quoted attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn layout(prefix: &str, title: &str, head_extra: &str, body: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"robots\" content=\"noindex\">{head_extra}\
         <title>{title}</title><link rel=\"stylesheet\" href=\"{p}/gate.css\"></head>\n\
         <body><main>\n<h1>{title}</h1>\n{body}</main></body></html>\n",
        title = escape(title),
        p = escape(prefix),
    )
}

pub struct LoginPage<'a> {
    pub prefix: &'a str,
    pub realm: &'a str,
    pub return_to: &'a str,
    pub csrf: &'a str,
    pub error: Option<&'a str>,
    /// Offer "continue as guest" (the realm has a guest-pow checker).
    pub guest: bool,
    /// Filled in again after a failed attempt.
    pub user: &'a str,
}

pub fn login_page(page: &LoginPage<'_>) -> String {
    let p = escape(page.prefix);
    let error = page
        .error
        .map(|e| format!("<p class=\"error\" role=\"alert\">{}</p>\n", escape(e)))
        .unwrap_or_default();
    let guest = if page.guest {
        format!(
            "<p>No account? <a href=\"{p}/guest?realm={}&amp;return={}\">Continue as a guest</a> \
             (your browser does a moment of work instead).</p>\n",
            escape(&crate::form::encode(page.realm)),
            escape(&crate::form::encode(page.return_to)),
        )
    } else {
        String::new()
    };
    let body = format!(
        "{error}<form method=\"post\" action=\"{p}/login\">\n\
         <input type=\"hidden\" name=\"realm\" value=\"{realm}\">\
         <input type=\"hidden\" name=\"return\" value=\"{ret}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\n\
         <label for=\"user\">User name</label>\
         <input id=\"user\" name=\"user\" autocomplete=\"username\" required value=\"{user}\">\n\
         <label for=\"password\">Password</label>\
         <input id=\"password\" name=\"password\" type=\"password\" autocomplete=\"current-password\" required>\n\
         <button type=\"submit\">Log in</button>\n</form>\n{guest}",
        realm = escape(page.realm),
        ret = escape(page.return_to),
        csrf = escape(page.csrf),
        user = escape(page.user),
    );
    layout(page.prefix, &format!("Log in to {}", page.realm), "", &body)
}

pub struct LoggedIn<'a> {
    pub prefix: &'a str,
    pub realm: &'a str,
    pub user: &'a str,
    pub csrf: &'a str,
    pub return_to: &'a str,
}

pub fn logged_in_page(page: &LoggedIn<'_>) -> String {
    let body = format!(
        "<p>You are logged in to {realm} as <strong>{user}</strong>.</p>\n\
         <p><a href=\"{ret}\">Continue</a></p>\n\
         <form method=\"post\" action=\"{p}/logout\">\
         <input type=\"hidden\" name=\"realm\" value=\"{realm}\">\
         <input type=\"hidden\" name=\"return\" value=\"{ret}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <button type=\"submit\">Log out</button></form>\n",
        p = escape(page.prefix),
        realm = escape(page.realm),
        user = escape(page.user),
        ret = escape(page.return_to),
        csrf = escape(page.csrf),
    );
    layout(page.prefix, "Logged in", "", &body)
}

pub struct ChallengePage<'a> {
    pub prefix: &'a str,
    pub challenge: &'a str,
    pub difficulty: u8,
    pub return_to: &'a str,
}

/// The proof-of-work page: the script finds the counter in Web Workers and posts the form.
pub fn challenge_page(page: &ChallengePage<'_>) -> String {
    let p = escape(page.prefix);
    let body = format!(
        "<p>This site checks that visitors are people, not bulk downloaders. Your browser is \
         doing a moment of work; the page you asked for follows by itself.</p>\n\
         <p id=\"status\" role=\"status\" aria-live=\"polite\">Checking your browser…</p>\n\
         <form id=\"pass\" method=\"post\" action=\"{p}/pass\" data-challenge=\"{c}\" data-difficulty=\"{d}\">\
         <input type=\"hidden\" name=\"challenge\" value=\"{c}\">\
         <input type=\"hidden\" name=\"counter\" value=\"\">\
         <input type=\"hidden\" name=\"return\" value=\"{ret}\">\
         <button type=\"submit\" id=\"continue\" hidden>Continue</button></form>\n\
         <noscript><p class=\"error\">This check needs JavaScript, which is off in this browser. \
         Turn it on for this site and reload, or ask the site's owner for an account.</p></noscript>\n\
         <script src=\"{p}/challenge.js\" defer></script>\n",
        c = escape(page.challenge),
        d = page.difficulty,
        ret = escape(page.return_to),
    );
    layout(page.prefix, "One moment…", "", &body)
}

pub struct TimeLockPage<'a> {
    pub prefix: &'a str,
    pub challenge: &'a str,
    pub seconds: u32,
    pub return_to: &'a str,
}

/// The no-JavaScript tier: the page continues by itself after a few seconds.
pub fn timelock_page(page: &TimeLockPage<'_>) -> String {
    let url = format!(
        "{}/pass?challenge={}&counter=0&return={}",
        page.prefix,
        crate::form::encode(page.challenge),
        crate::form::encode(page.return_to)
    );
    let head = format!(
        "<meta http-equiv=\"refresh\" content=\"{};url={}\">",
        page.seconds,
        escape(&url)
    );
    let body = format!(
        "<p>This site checks that visitors are people, not bulk downloaders. The page you \
         asked for follows in {s} seconds.</p>\n\
         <p>If nothing happens, wait {s} seconds and <a href=\"{u}\">continue</a>.</p>\n",
        s = page.seconds,
        u = escape(&url),
    );
    layout(page.prefix, "One moment…", &head, &body)
}

pub fn deny_page(prefix: &str) -> String {
    layout(
        prefix,
        "Access refused",
        "",
        "<p>This site does not serve automated clients of this kind. If you are a person and \
         see this, please tell the site's owner what browser you use.</p>\n",
    )
}

pub fn message_page(title: &str, text: &str) -> String {
    layout(
        "/.tern-gate",
        title,
        "",
        &format!("<p>{}</p>\n", escape(text)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(
            escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(escape("plain"), "plain");
    }

    #[test]
    fn pages_carry_their_fields_escaped_and_no_inline_script() {
        let evil = "/\"><script>alert(1)</script>";
        let pages = [
            login_page(&LoginPage {
                prefix: "/.tern-gate",
                realm: "staff",
                return_to: evil,
                csrf: "tok",
                error: Some("<b>bad</b>"),
                guest: true,
                user: "al\"ice",
            }),
            challenge_page(&ChallengePage {
                prefix: "/.tern-gate",
                challenge: "abc_-123",
                difficulty: 16,
                return_to: evil,
            }),
            timelock_page(&TimeLockPage {
                prefix: "/.tern-gate",
                challenge: "abc_-123",
                seconds: 3,
                return_to: evil,
            }),
            logged_in_page(&LoggedIn {
                prefix: "/.tern-gate",
                realm: "staff",
                user: "<alice>",
                csrf: "tok",
                return_to: evil,
            }),
            deny_page("/.tern-gate"),
            message_page("Busy", "<try again>"),
        ];
        for page in &pages {
            assert!(!page.contains("<script>"), "{page}");
            assert!(!page.contains("<b>"), "{page}");
            assert!(!page.contains("style="), "{page}");
            assert!(page.len() < 4096, "{} bytes", page.len());
            assert!(page.contains("lang=\"en\"") && page.contains("name=\"viewport\""));
        }
        let login = &pages[0];
        assert!(login.contains("action=\"/.tern-gate/login\""));
        assert!(login.contains("name=\"csrf\" value=\"tok\""));
        assert!(login.contains("value=\"al&quot;ice\""));
        assert!(login.contains("role=\"alert\""));
        assert!(login.contains("/.tern-gate/guest?realm=staff&amp;return="));
        let challenge = &pages[1];
        assert!(challenge.contains("data-challenge=\"abc_-123\" data-difficulty=\"16\""));
        assert!(challenge.contains("role=\"status\" aria-live=\"polite\""));
        assert!(challenge.contains("<noscript>"));
        assert!(challenge.contains("<script src=\"/.tern-gate/challenge.js\" defer></script>"));
        let timelock = &pages[2];
        assert!(timelock.contains("http-equiv=\"refresh\" content=\"3;url=/.tern-gate/pass?challenge=abc_-123&amp;counter=0&amp;return=/%22%3E%3Cscript"));
    }

    #[test]
    fn the_page_script_never_touches_cookies() {
        for js in [CHALLENGE_JS, WORKER_JS] {
            for api in [
                "document.cookie",
                "cookieStore",
                "localStorage",
                "sessionStorage",
            ] {
                assert!(
                    !js.contains(api),
                    "{api}: the solver must keep no state (Anubis's cookie loop)"
                );
            }
        }
    }

    /// The browser's solver (assets/worker.js, run by Node) finds counters that this side
    /// accepts, through its WebCrypto path and its pure-JS fallback.
    #[test]
    fn the_javascript_solver_agrees_with_the_server() {
        let node = std::process::Command::new("node").arg("--version").output();
        if node.is_err() {
            eprintln!("SKIPPED: node is not installed");
            return;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/test-solver.mjs");
        for (challenge, difficulty) in [("tern-test-challenge", 12u8), ("AbC_-xyz0123456789", 10)] {
            for mode in ["subtle", "fallback"] {
                let out = std::process::Command::new("node")
                    .args([script, challenge, &difficulty.to_string(), mode])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let counter: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
                assert!(
                    crate::pow::solves(challenge, difficulty, counter),
                    "{mode}: {counter}"
                );
                assert_eq!(
                    counter,
                    crate::pow::solve(challenge, difficulty),
                    "the smallest counter"
                );
            }
        }
    }
}
