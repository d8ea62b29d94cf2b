//! A route's `rate_limit`: requests per second by client network, a burst, a queue (for
//! routes to an upstream), exemptions and the proxies trusted to name the client.

use toml::Spanned;

use super::file::{RateLimitFile, RouteFile};
use super::problems::Problems;

/// Per-route rate-limit buckets per worker: one byte each, so 16 KiB per worker and route.
const ROUTE_RATE_BUCKETS: usize = 1 << 14;

/// A route's `rate_limit` table, checked; `None` when it is refused (each problem recorded).
pub(super) fn check_rate_limit(
    limit: &Spanned<RateLimitFile>,
    route: &RouteFile,
    p: &mut Problems<'_>,
) -> Option<tern_services::RateLimitConfig> {
    let mut ok = true;
    let l = limit.get_ref();
    let burst = l.burst.unwrap_or(l.per_second.saturating_mul(2).max(1));
    if l.per_second == 0 || burst == 0 {
        p.at(
            limit.span().start,
            "rate_limit: per_second and burst must be at least 1",
        );
        ok = false;
    }
    let (v4, v6) = (l.ipv4_prefix.unwrap_or(24), l.ipv6_prefix.unwrap_or(48));
    if v4 > 32 || v6 > 128 {
        p.at(
            limit.span().start,
            "rate_limit: ipv4_prefix is at most 32 and ipv6_prefix at most 128",
        );
        ok = false;
    }
    let queue = l.queue.unwrap_or(0);
    if queue > 0 && route.proxy.is_none() && route.fastcgi.is_none() {
        // Only a request on its way to an upstream is held (on the connection's timer);
        // an answer tern makes itself costs less to give than to hold.
        p.at(
            limit.span().start,
            "rate_limit: queue is for proxy and PHP (fastcgi) routes: only a request \
             going to an app waits its turn",
        );
        ok = false;
    }
    if queue > 240 {
        p.at(limit.span().start, "rate_limit: queue is at most 240");
        ok = false;
    }
    let (exempt, exempt_loopback) = match &l.exempt {
        None => (Vec::new(), true),
        Some(list) => match tern_services::TrustedProxies::parse(list) {
            Ok(nets) => (nets.into_nets(), false),
            Err(e) => {
                p.at(limit.span().start, format!("rate_limit: exempt: {e}"));
                ok = false;
                (Vec::new(), false)
            }
        },
    };
    let trusted_list = l
        .trusted_proxies
        .as_deref()
        .or(route.trusted_proxies.as_ref().map(|t| t.get_ref().as_str()));
    let trusted = match trusted_list.map(tern_services::TrustedProxies::parse) {
        None => tern_services::TrustedProxies::default(),
        Some(Ok(list)) => list,
        Some(Err(e)) => {
            p.at(
                limit.span().start,
                format!("rate_limit: trusted_proxies: {e}"),
            );
            ok = false;
            tern_services::TrustedProxies::default()
        }
    };
    let config = tern_services::RateLimitConfig {
        per_second: l.per_second,
        burst,
        queue,
        ipv4_prefix: v4,
        ipv6_prefix: v6,
        exempt,
        exempt_loopback,
        trusted,
        buckets: ROUTE_RATE_BUCKETS,
    };
    ok.then_some(config)
}

#[cfg(test)]
mod tests {
    use super::super::{
        parse,
        testing::{dir, problems},
    };

    #[test]
    fn rate_limit_queue_exempt_and_trusted_proxies_become_a_plan_or_are_refused() {
        let good = r#"[[site]]
name = "a"
default = true
[[site.route]]
path = "/login"
proxy = "127.0.0.1:9"
trusted_proxies = "10.0.0.0/8"
rate_limit = { per_second = 5, burst = 1, queue = 10, exempt = "" }
[[site.route]]
path = "/api"
proxy = "127.0.0.1:9"
rate_limit = { per_second = 5, exempt = "192.0.2.0/24", trusted_proxies = "127.0.0.1" }
[[site.route]]
path = "/"
static = "site"
rate_limit = { per_second = 5 }
"#;
        let d = dir();
        let c = parse(good, d.path()).unwrap();
        let limit = |i: usize| c.sites[0].routes[i].options.rate_limit.clone().unwrap();
        let login = limit(0);
        assert_eq!((login.queue, login.exempt_loopback), (10, false));
        assert!(login.exempt.is_empty());
        // The route's trusted proxies are the limit's unless it names its own.
        assert!(login.trusted.is_trusted("10.1.2.3".parse().unwrap()));
        let api = limit(1);
        assert_eq!((api.queue, api.exempt_loopback), (0, false));
        assert_eq!(
            api.exempt,
            ["192.0.2.0/24".parse::<ipnet::IpNet>().unwrap()]
        );
        assert!(api.trusted.is_trusted("127.0.0.1".parse().unwrap()));
        let files = limit(2);
        assert!(files.exempt_loopback && files.trusted.is_empty());

        let bad = r#"[[site]]
name = "a"
default = true
[[site.route]]
path = "/"
static = "site"
rate_limit = { per_second = 5, queue = 3 }
[[site.route]]
path = "/p"
proxy = "127.0.0.1:9"
rate_limit = { per_second = 5, queue = 241, exempt = "nowhere" }
[[site.route]]
path = "/q"
proxy = "127.0.0.1:9"
rate_limit = { per_second = 5, trusted_proxies = "a proxy" }
"#;
        let e = problems(bad);
        let want = [
            "line 7: rate_limit: queue is for proxy and PHP (fastcgi) routes",
            "line 11: rate_limit: queue is at most 240",
            "line 11: rate_limit: exempt: not an address or CIDR: \"nowhere\"",
            "line 15: rate_limit: trusted_proxies: not an address or CIDR: \"a proxy\"",
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
