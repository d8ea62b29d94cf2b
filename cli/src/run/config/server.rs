//! The file's top-level keys: the server keys (checked as `tern serve --config` checks its
//! own, in `crate::config`) and `[tls]`'s plain-HTTP redirect.

use super::file::RunFile;
use super::plan::ControlGroupPlan;
use super::problems::Problems;

/// The server keys' values and `[tls]`'s redirect keys.
pub(super) fn check_server_keys(file: &RunFile, p: &mut Problems<'_>) {
    let keys = file.server_keys();
    if let Some(tls) = keys.tls {
        if let Err(list) = tls.redirect_settings() {
            for (at, what) in list {
                p.at(at, format!("[tls] {what}"));
            }
        }
        if let Some(at) = tls.redirect_keys_without_listener() {
            p.at(
                at,
                "[tls] redirect_http_status and redirect_http_hosts need redirect_http (the \
                 plain listener that answers with them)",
            );
        }
    }
    for (at, what) in keys.problems() {
        p.at(at, what);
    }
}

/// `control_group`: a group name, for a socket there is (`control`). The group is looked up
/// at start-up, not here: a reload reads the file again, and after the drop of privileges
/// the sandbox may keep the group database out of reach.
pub(super) fn check_control_group(
    file: &RunFile,
    p: &mut Problems<'_>,
) -> Option<ControlGroupPlan> {
    let group = file.control_group.as_ref()?;
    let name = group.get_ref();
    let at = group.span().start;
    if file.control.is_none() {
        p.at(
            at,
            "control_group needs control (the socket it is the group of)",
        );
        return None;
    }
    if name.is_empty()
        || name
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == ':')
    {
        p.at(at, format!("control_group {name:?} is not a group name"));
        return None;
    }
    Some(ControlGroupPlan {
        name: name.clone(),
        line: p.line(at),
    })
}

#[cfg(test)]
mod tests {
    use super::super::{
        parse,
        testing::{dir, problems},
    };
    use crate::common::{CommonArgs, IoArg};

    #[test]
    fn server_keys_are_checked_and_flags_win() {
        let e = problems("workers = 0\nidle_timeout = 0\n[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\nrespond = \"\"\n");
        assert_eq!(
            e,
            [
                "line 2: idle_timeout must be at least 1 (seconds)",
                "line 1: workers must be at least 1"
            ]
        );
        assert_eq!(
            problems(""),
            ["no [[site]]: the file serves nothing (see examples/tern.toml)"]
        );
        let d = dir();
        let c = parse(
            "workers = 3\nidle_timeout = 9\n[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\nrespond = \"\"\n",
            d.path(),
        )
        .unwrap();
        let flags = CommonArgs {
            workers: Some(1),
            ..CommonArgs::default()
        };
        let merged = c.common(&flags);
        assert_eq!(merged.workers, Some(1));
        assert_eq!(merged.idle_timeout, Some(9));
        assert_eq!(c.default_site, Some(0));
    }

    #[test]
    fn control_group_needs_control_and_a_group_name_and_keeps_its_line() {
        const SITE: &str = "[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\nrespond = \"\"\n";
        assert_eq!(
            problems(&format!("control_group = \"daemon\"\n{SITE}")),
            ["line 1: control_group needs control (the socket it is the group of)"]
        );
        assert_eq!(
            problems(&format!(
                "control = \"c.sock\"\ncontrol_group = \"www data\"\n{SITE}"
            )),
            ["line 2: control_group \"www data\" is not a group name"]
        );
        let d = dir();
        let c = parse(
            &format!("control = \"c.sock\"\n\ncontrol_group = \"no-such-group\"\n{SITE}"),
            d.path(),
        )
        .unwrap();
        // Looked up at start-up, not while the file is read.
        let group = c.control_group.as_ref().unwrap();
        assert_eq!((group.name.as_str(), group.line), ("no-such-group", 3));
        assert_eq!(c.control(), Some(d.path().join("c.sock")));
    }

    #[test]
    fn io_is_read_as_tern_serve_reads_it_and_the_flag_wins() {
        let d = dir();
        let text = "io = \"uring\"\n[[site]]\nname = \"a\"\ndefault = true\n[[site.route]]\npath = \"/\"\nrespond = \"\"\n";
        let c = parse(text, d.path()).unwrap();
        assert_eq!(c.common(&CommonArgs::default()).io, Some(IoArg::Uring));
        let flags = CommonArgs {
            io: Some(IoArg::Epoll),
            ..CommonArgs::default()
        };
        assert_eq!(c.common(&flags).io, Some(IoArg::Epoll));
        let e = problems("io = \"kqueue\"\n[[site]]\nname = \"a\"\n");
        assert!(e[0].starts_with("line 1: io: "), "{e:?}");
    }

    #[test]
    fn redirect_http_keys_are_checked_with_their_lines() {
        let text = r#"[tls]
self_signed = true
redirect_http = "127.0.0.1:0"
redirect_http_status = 301
redirect_http_hosts = { "www.example.com" = "example.com", "*" = "example.com:8443" }
[[site]]
name = "a"
default = true
[[site.route]]
path = "/"
respond = "x"
"#;
        let d = dir();
        let c = parse(text, d.path()).unwrap();
        let plan = c.tls_plan().unwrap().unwrap();
        assert_eq!(plan.redirect.status, 301);
        assert_eq!(
            plan.redirect.hosts,
            [("www.example.com".to_string(), "example.com".to_string())]
        );
        assert_eq!(
            plan.redirect.target_for("WWW.example.com."),
            Some("example.com")
        );
        assert_eq!(
            plan.redirect.target_for("other.test"),
            Some("example.com:8443")
        );
        let bad = r#"[tls]
self_signed = true
redirect_http_status = 200
redirect_http_hosts = { "*.example.com" = "example.com", "a.test" = "b.test/x", "c.test" = "c.test:0" }
[[site]]
name = "a"
default = true
[[site.route]]
path = "/"
respond = "x"
"#;
        let e = problems(bad);
        let want = [
            "line 3: [tls] redirect_http_status 200 is not a redirect",
            "line 4: [tls] redirect_http_hosts: \"*.example.com\" is not a host name",
            "line 4: [tls] redirect_http_hosts: \"b.test/x\" is not a host name",
            "line 4: [tls] redirect_http_hosts: \"c.test:0\" is not a host name",
            "line 3: [tls] redirect_http_status and redirect_http_hosts need redirect_http",
        ];
        for w in want {
            assert!(
                e.iter().any(|p| p.starts_with(w)),
                "missing {w:?} in {e:#?}"
            );
        }
        assert_eq!(e.len(), want.len(), "{e:#?}");
    }
}
