//! The client's address: the socket peer, or — only when the peer is a trusted proxy — the
//! right-most address in X-Forwarded-For (or Forwarded `for=`) that is not itself a trusted
//! proxy. Everything left of that hop was written by the client and could be forged.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use tern_server::RequestHead;

#[derive(Debug, Clone, Default)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    pub fn new(nets: Vec<IpNet>) -> TrustedProxies {
        TrustedProxies { nets }
    }

    /// Parses a comma-separated list of CIDRs or single addresses, e.g.
    /// `"127.0.0.1, 10.0.0.0/8, ::1"`.
    pub fn parse(list: &str) -> Result<TrustedProxies, String> {
        let mut nets = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let net = match item.parse::<IpNet>() {
                Ok(n) => n,
                Err(_) => match item.parse::<IpAddr>() {
                    Ok(ip) => IpNet::from(ip),
                    Err(_) => return Err(format!("not an address or CIDR: {item:?}")),
                },
            };
            nets.push(net);
        }
        Ok(TrustedProxies { nets })
    }

    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    pub fn into_nets(self) -> Vec<IpNet> {
        self.nets
    }

    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// The address to attribute the request to.
    pub fn client_ip(&self, peer: SocketAddr, head: &RequestHead<'_>) -> IpAddr {
        let peer = peer.ip().to_canonical();
        if !self.is_trusted(peer) {
            return peer;
        }
        // Several header lines form one list, in order (RFC 9110 §5.3); walking them from the
        // last line backwards, each split from the right, visits the hops right to left
        // without collecting them (this runs on every request from a proxy).
        let lines = |name: &'static str| {
            head.headers
                .iter()
                .rev()
                .filter(move |h| h.name.eq_ignore_ascii_case(name))
                .map(|h| h.value)
        };
        if lines("x-forwarded-for").next().is_some() {
            let hops = lines("x-forwarded-for")
                .flat_map(|line| line.rsplit(|&b| b == b','))
                .map(parse_xff_hop);
            return self.walk(peer, hops);
        }
        if lines("forwarded").next().is_some() {
            let hops = lines("forwarded")
                .flat_map(|line| line.rsplit(|&b| b == b','))
                .map(parse_forwarded_for);
            return self.walk(peer, hops);
        }
        peer
    }

    /// Walks hops given right to left: the first one we do not trust is the client. An
    /// unparsable hop ends the walk at the last address we trust (we cannot look past it).
    fn walk(&self, peer: IpAddr, hops: impl Iterator<Item = Option<IpAddr>>) -> IpAddr {
        let mut current = peer;
        for hop in hops {
            let Some(ip) = hop else {
                return current;
            };
            current = ip.to_canonical();
            if !self.is_trusted(current) {
                return current;
            }
        }
        current
    }
}

fn trim(s: &[u8]) -> &[u8] {
    tern_server::trim_ows(s)
}

/// An X-Forwarded-For element: a bare address, or one with a port (`1.2.3.4:5`, `[v6]:5`).
fn parse_xff_hop(raw: &[u8]) -> Option<IpAddr> {
    parse_node(trim(raw))
}

fn parse_node(s: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(s).ok()?;
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(sa.ip());
    }
    // `[v6]` without a port.
    s.strip_prefix('[')?.strip_suffix(']')?.parse().ok()
}

/// The `for=` parameter of one Forwarded element (RFC 7239), e.g. `for="[2001:db8::1]:80";proto=https`.
fn parse_forwarded_for(element: &[u8]) -> Option<IpAddr> {
    for pair in element.split(|&b| b == b';') {
        let pair = trim(pair);
        if pair.len() > 4 && pair[..4].eq_ignore_ascii_case(b"for=") {
            let mut v = &pair[4..];
            if v.len() >= 2 && v[0] == b'"' && v[v.len() - 1] == b'"' {
                v = &v[1..v.len() - 1];
            }
            return parse_node(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;
    use tern_server::{Limits, RequestHead};

    fn client(trusted: &str, peer: &str, extra: &str) -> IpAddr {
        let raw = format!("GET / HTTP/1.1\r\nHost: x\r\n{extra}\r\n");
        let mut headers = [MaybeUninit::uninit(); 32];
        let head: RequestHead<'_> =
            match tern_server::parse_request(raw.as_bytes(), &mut headers, &Limits::default())
                .unwrap()
            {
                tern_server::Parsed::Complete(h) => h,
                _ => panic!("partial"),
            };
        let proxies = TrustedProxies::parse(trusted).unwrap();
        proxies.client_ip(peer.parse().unwrap(), &head)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn untrusted_peers_cannot_spoof() {
        let spoof = "X-Forwarded-For: 1.1.1.1\r\nForwarded: for=2.2.2.2\r\n";
        assert_eq!(
            client("10.0.0.0/8", "203.0.113.5:9", spoof),
            ip("203.0.113.5")
        );
        assert_eq!(client("", "127.0.0.1:9", spoof), ip("127.0.0.1"));
    }

    #[test]
    fn trusted_proxy_gives_the_rightmost_untrusted_hop() {
        let t = "127.0.0.1, 10.0.0.0/8";
        // The client forged the left entry; the proxy appended the real one.
        let xff = "X-Forwarded-For: 6.6.6.6, 198.51.100.7\r\n";
        assert_eq!(client(t, "127.0.0.1:1", xff), ip("198.51.100.7"));
        // A chain of trusted proxies is skipped.
        let xff = "X-Forwarded-For: 6.6.6.6, 198.51.100.7, 10.1.2.3\r\n";
        assert_eq!(client(t, "127.0.0.1:1", xff), ip("198.51.100.7"));
        // Several header lines are one list.
        let xff = "X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-For: 198.51.100.8\r\n";
        assert_eq!(client(t, "127.0.0.1:1", xff), ip("198.51.100.8"));
        // Ports and brackets.
        let xff = "X-Forwarded-For: [2001:db8::5]:443\r\n";
        assert_eq!(client(t, "127.0.0.1:1", xff), ip("2001:db8::5"));
        // All hops trusted: the left-most.
        let xff = "X-Forwarded-For: 10.9.9.9, 10.1.1.1\r\n";
        assert_eq!(client(t, "127.0.0.1:1", xff), ip("10.9.9.9"));
    }

    #[test]
    fn garbage_stops_at_the_last_trusted_address() {
        let t = "127.0.0.1, 10.0.0.0/8";
        let xff = "X-Forwarded-For: 198.51.100.7, nonsense, 10.1.2.3\r\n";
        assert_eq!(client(t, "127.0.0.1:1", xff), ip("10.1.2.3"));
        let xff = "X-Forwarded-For: nonsense\r\n";
        assert_eq!(client(t, "127.0.0.1:1", xff), ip("127.0.0.1"));
    }

    #[test]
    fn forwarded_header() {
        let t = "127.0.0.1";
        let f = "Forwarded: for=6.6.6.6, for=\"[2001:db8::9]:80\";proto=https\r\n";
        assert_eq!(client(t, "127.0.0.1:1", f), ip("2001:db8::9"));
        let f = "Forwarded: proto=http;FOR=198.51.100.1\r\n";
        assert_eq!(client(t, "127.0.0.1:1", f), ip("198.51.100.1"));
        let f = "Forwarded: for=unknown\r\n";
        assert_eq!(client(t, "127.0.0.1:1", f), ip("127.0.0.1"));
    }

    #[test]
    fn mapped_v4_peers_are_canonical() {
        assert_eq!(
            client(
                "127.0.0.1",
                "[::ffff:127.0.0.1]:5",
                "X-Forwarded-For: 9.9.9.9\r\n"
            ),
            ip("9.9.9.9")
        );
    }

    #[test]
    fn bad_lists_are_errors() {
        assert!(TrustedProxies::parse("10.0.0.0/8, banana").is_err());
        assert!(TrustedProxies::parse("").unwrap().is_empty());
    }
}
