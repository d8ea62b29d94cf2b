//! The client address of an access-log line as text, cached for the next line.

use std::net::IpAddr;

/// The last client address and its text: a keep-alive connection's requests share it.
#[derive(Default)]
pub(super) struct IpCache {
    ip: Option<IpAddr>,
    text: Vec<u8>,
}

impl IpCache {
    pub fn text(&mut self, ip: IpAddr) -> &[u8] {
        if self.ip != Some(ip) {
            self.ip = Some(ip);
            self.text.clear();
            push_ip(&mut self.text, ip);
        }
        &self.text
    }
}

/// An address as `Display` writes it (RFC 5952 for IPv6), without a formatter.
pub(super) fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip.to_canonical() {
        IpAddr::V4(a) => {
            for (i, octet) in a.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                out.extend_from_slice(itoa::Buffer::new().format(octet).as_bytes());
            }
        }
        IpAddr::V6(a) => {
            let seg = a.segments();
            // The longest run of two or more zero groups (the first of equals) becomes `::`.
            let (mut best_at, mut best_len) = (8, 0);
            let mut i = 0;
            while i < 8 {
                let start = i;
                while i < 8 && seg[i] == 0 {
                    i += 1;
                }
                if i - start > best_len {
                    (best_at, best_len) = (start, i - start);
                }
                i += 1;
            }
            if best_len < 2 {
                (best_at, best_len) = (8, 0);
            }
            let mut i = 0;
            while i < 8 {
                if i == best_at {
                    out.extend_from_slice(b"::");
                    i += best_len;
                    continue;
                }
                if i > 0 && i != best_at + best_len {
                    out.push(b':');
                }
                let g = seg[i];
                let mut started = false;
                for shift in [12, 8, 4, 0] {
                    let nibble = (g >> shift) & 15;
                    if started || nibble != 0 || shift == 0 {
                        started = true;
                        out.push(b"0123456789abcdef"[usize::from(nibble)]);
                    }
                }
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use super::*;

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let mut samples: Vec<IpAddr> = vec![
            "0.0.0.0".parse().unwrap(),
            "255.255.255.255".parse().unwrap(),
            "::".parse().unwrap(),
            "::1".parse().unwrap(),
            "1::".parse().unwrap(),
            "2001:db8::1:0:0:1".parse().unwrap(),
            "2001:0:0:1::1".parse().unwrap(),
            "1:0:1:0:1:0:1:0".parse().unwrap(),
            "fe80::abcd:ef01:2345:6789".parse().unwrap(),
        ];
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..2000 {
            let mut seg = [0u16; 8];
            for s in &mut seg {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Many zero groups, so runs of every length and position occur.
                *s = if x & 3 == 0 { (x >> 20) as u16 } else { 0 };
            }
            samples.push(IpAddr::V6(Ipv6Addr::from(seg)));
        }
        for ip in samples {
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                ip.to_canonical().to_string(),
                "{ip:?}"
            );
        }
    }
}
