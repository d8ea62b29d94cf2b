//! The last answer head a connection encoded, and what it was made from. Answers on a
//! connection repeat (the same file, within the same second), so when everything that goes
//! into a head is what it was last time, last time's encoded block is sent again instead of
//! encoding each field: HTTP/2's HPACK block (while the encoder's table has not moved) and
//! HTTP/3's HEADERS frame. Kept only from a connection's second answer on: one that answers
//! once (most idle ones) holds nothing. Nothing is shared between connections.

/// What a head is made of, besides its status: the date, the content length, the response's
/// header lines and the connection's secure lines (HSTS, Alt-Svc).
pub(crate) struct HeadParts<'a> {
    pub status: u16,
    pub no_body: bool,
    pub date: &'a [u8],
    pub length: &'a [u8],
    pub headers: &'a [u8],
    pub secure: &'a [u8],
}

#[derive(Default)]
pub(crate) struct HeadMemo {
    answers: u8,
    valid: bool,
    /// What else the block depends on (HTTP/2: the HPACK encoder's generation).
    tag: u64,
    last_key: Vec<u8>,
    block: Vec<u8>,
    /// The key of the answer being written.
    key: Vec<u8>,
}

impl HeadMemo {
    /// The block to send again for `parts` if it is last time's, with the same `tag`. Call
    /// once per answer, before [`HeadMemo::remember`].
    pub fn lookup(&mut self, tag: u64, parts: &HeadParts<'_>) -> Option<&[u8]> {
        self.answers = self.answers.saturating_add(1);
        if self.answers < 2 {
            return None;
        }
        self.key.clear();
        self.key.extend_from_slice(&parts.status.to_be_bytes());
        self.key.push(u8::from(parts.no_body));
        for part in [parts.date, parts.length, parts.headers, parts.secure] {
            self.key
                .extend_from_slice(&(part.len() as u32).to_be_bytes());
            self.key.extend_from_slice(part);
        }
        let same = self.valid && self.tag == tag && self.key == self.last_key;
        same.then_some(&self.block[..])
    }

    /// Keeps `block`, encoded just now from the parts last given to [`HeadMemo::lookup`], with
    /// its `tag`.
    pub fn remember(&mut self, tag: u64, block: &[u8]) {
        if self.answers < 2 {
            return;
        }
        self.block.clear();
        self.block.extend_from_slice(block);
        std::mem::swap(&mut self.key, &mut self.last_key);
        self.tag = tag;
        self.valid = true;
    }

    /// Last time's block can no longer be sent again (HTTP/2: this head changed the table).
    pub fn forget(&mut self) {
        self.valid = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts<'a>(date: &'a [u8], headers: &'a [u8]) -> HeadParts<'a> {
        HeadParts {
            status: 200,
            no_body: false,
            date,
            length: b"953",
            headers,
            secure: b"",
        }
    }

    #[test]
    fn a_head_is_sent_again_only_when_every_part_and_the_tag_are_the_same() {
        let mut memo = HeadMemo::default();
        let p = parts(
            b"Thu, 03 Dec 2026 12:00:00 GMT",
            b"Content-Type: text/html\r\n",
        );
        // The first answer: nothing looked up, nothing kept.
        assert_eq!(memo.lookup(0, &p), None);
        memo.remember(0, b"block one");
        assert!(memo.block.is_empty() && memo.key.capacity() == 0);
        assert_eq!(memo.lookup(0, &p), None);
        memo.remember(0, b"block two");
        assert_eq!(memo.lookup(0, &p), Some(&b"block two"[..]));
        // Another tag (the HPACK table moved), another second, other lines: encoded anew.
        assert_eq!(memo.lookup(1, &p), None);
        let later = parts(
            b"Thu, 03 Dec 2026 12:00:01 GMT",
            b"Content-Type: text/html\r\n",
        );
        assert_eq!(memo.lookup(0, &later), None);
        let other = parts(
            b"Thu, 03 Dec 2026 12:00:00 GMT",
            b"Content-Type: text/css\r\n",
        );
        assert_eq!(memo.lookup(0, &other), None);
        let head = HeadParts {
            no_body: true,
            ..parts(
                b"Thu, 03 Dec 2026 12:00:00 GMT",
                b"Content-Type: text/html\r\n",
            )
        };
        assert_eq!(memo.lookup(0, &head), None);
        // Where one part ends counts: moving bytes between parts is another key.
        let a = HeadParts {
            length: b"95",
            headers: b"3X: y\r\n",
            ..p
        };
        let b = HeadParts {
            length: b"953",
            headers: b"X: y\r\n",
            ..p
        };
        assert_eq!(memo.lookup(0, &a), None);
        memo.remember(0, b"a");
        assert_eq!(memo.lookup(0, &b), None);
        assert_eq!(memo.lookup(0, &a), Some(&b"a"[..]));
        memo.forget();
        assert_eq!(memo.lookup(0, &a), None);
    }
}
