//! The network a client address belongs to, which passes are bound to.

use std::net::IpAddr;

/// The network a client address belongs to (IPv4 /24, IPv6 /48 by default): what sessions
/// and challenges are bound to, so a client that changes address inside its network (CGNAT,
/// IPv6 privacy addresses) keeps its pass, and one that moves to another network does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Prefix {
    /// 4 for IPv4, 6 for IPv6, 0 for "not bound".
    pub family: u8,
    /// The address with every bit past the prefix length cleared.
    pub bytes: [u8; 16],
}

impl Prefix {
    pub const UNBOUND: Prefix = Prefix {
        family: 0,
        bytes: [0; 16],
    };

    pub fn of(ip: IpAddr, v4_bits: u8, v6_bits: u8) -> Prefix {
        let mut bytes = [0u8; 16];
        match ip.to_canonical() {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4) & mask32(v4_bits);
                bytes[..4].copy_from_slice(&bits.to_be_bytes());
                Prefix { family: 4, bytes }
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6) & mask128(v6_bits);
                bytes.copy_from_slice(&bits.to_be_bytes());
                Prefix { family: 6, bytes }
            }
        }
    }
}

fn mask32(bits: u8) -> u32 {
    match bits.min(32) {
        0 => 0,
        b => u32::MAX << (32 - b),
    }
}

fn mask128(bits: u8) -> u128 {
    match bits.min(128) {
        0 => 0,
        b => u128::MAX << (128 - b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_clear_host_bits() {
        let a = Prefix::of("192.0.2.7".parse().unwrap(), 24, 48);
        let b = Prefix::of("192.0.2.200".parse().unwrap(), 24, 48);
        let c = Prefix::of("192.0.3.7".parse().unwrap(), 24, 48);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mapped = Prefix::of("::ffff:192.0.2.9".parse().unwrap(), 24, 48);
        assert_eq!(a, mapped);
        let v6a = Prefix::of("2001:db8:1:2::1".parse().unwrap(), 24, 48);
        let v6b = Prefix::of("2001:db8:1:ffff::1".parse().unwrap(), 24, 48);
        assert_eq!(v6a, v6b);
        assert_eq!(Prefix::of("10.1.2.3".parse().unwrap(), 0, 0).bytes, [0; 16]);
    }
}
