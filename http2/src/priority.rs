//! Extensible priorities (RFC 9218): the `priority` request field and PRIORITY_UPDATE frames
//! carry `u=<0..7>` (urgency, lower first) and `i` (incremental: share the connection with
//! others of the same urgency rather than finishing first).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Priority {
    pub urgency: u8,
    pub incremental: bool,
}

impl Default for Priority {
    /// RFC 9218 §4: urgency 3, not incremental.
    fn default() -> Priority {
        Priority {
            urgency: 3,
            incremental: false,
        }
    }
}

impl Priority {
    /// A stream whose client sent no priority at all: the default urgency, sharing the
    /// connection round-robin with the others (fair interleaving, as with RFC 7540's equal
    /// weights) rather than RFC 9218's one-after-another default.
    pub const UNSIGNALLED: Priority = Priority {
        urgency: 3,
        incremental: true,
    };

    /// Parses a Structured Fields dictionary loosely: unknown keys and bad values are ignored
    /// (§4: a field that cannot be parsed leaves the defaults).
    pub fn parse(value: &[u8], mut base: Priority) -> Priority {
        for member in value.split(|&b| b == b',') {
            // Parameters (";...") are ignored.
            let member = trim(member.split(|&b| b == b';').next().unwrap_or(member));
            let (key, val) = match member.iter().position(|&b| b == b'=') {
                Some(i) => (&member[..i], Some(&member[i + 1..])),
                None => (member, None),
            };
            match (key, val) {
                (b"u", Some([d @ b'0'..=b'7'])) => base.urgency = d - b'0',
                (b"i", None | Some(b"?1")) => base.incremental = true,
                (b"i", Some(b"?0")) => base.incremental = false,
                _ => {}
            }
        }
        base
    }
}

fn trim(b: &[u8]) -> &[u8] {
    let start = b
        .iter()
        .position(|&c| c != b' ' && c != b'\t')
        .unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|&c| c != b' ' && c != b'\t')
        .map_or(start, |i| i + 1);
    &b[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urgency_and_incremental() {
        let d = Priority::default();
        assert_eq!(
            Priority::parse(b"u=1, i", d),
            Priority {
                urgency: 1,
                incremental: true
            }
        );
        assert_eq!(Priority::parse(b"u=9", d), d);
        assert_eq!(Priority::parse(b"i=?0, u=0", d).urgency, 0);
        assert_eq!(Priority::parse(b"garbage,,=", d), d);
        assert!(Priority::parse(b"i;x=1", d).incremental);
    }
}
