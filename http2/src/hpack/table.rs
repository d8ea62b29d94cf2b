//! The static table (RFC 7541 Appendix A) and the dynamic table (§2.3.2, §4).
//!
//! The dynamic table keeps its entries' bytes (name then value, contiguous) in one ring buffer
//! of at least twice the table's maximum size, so inserting never allocates once the buffer
//! exists and lookups hand out plain slices. An entry that would straddle the end of the buffer
//! starts again at its beginning, leaving a gap; twice the maximum size is enough room for the
//! live bytes, one such gap and the new entry (each smaller than the maximum size), so a new
//! entry never overwrites a live one. Positions are virtual (ever-increasing, wrapping)
//! offsets; the buffer length is a power of two, so `position & mask` is the physical offset.

use std::collections::VecDeque;

use super::ENTRY_OVERHEAD;

/// Appendix A, index 1 first.
pub(crate) static STATIC_TABLE: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// The first static index (1-based) whose name is `name`.
fn static_name_index(name: &[u8]) -> Option<usize> {
    Some(match name {
        b":authority" => 1,
        b":method" => 2,
        b":path" => 4,
        b":scheme" => 6,
        b":status" => 8,
        b"accept-charset" => 15,
        b"accept-encoding" => 16,
        b"accept-language" => 17,
        b"accept-ranges" => 18,
        b"accept" => 19,
        b"access-control-allow-origin" => 20,
        b"age" => 21,
        b"allow" => 22,
        b"authorization" => 23,
        b"cache-control" => 24,
        b"content-disposition" => 25,
        b"content-encoding" => 26,
        b"content-language" => 27,
        b"content-length" => 28,
        b"content-location" => 29,
        b"content-range" => 30,
        b"content-type" => 31,
        b"cookie" => 32,
        b"date" => 33,
        b"etag" => 34,
        b"expect" => 35,
        b"expires" => 36,
        b"from" => 37,
        b"host" => 38,
        b"if-match" => 39,
        b"if-modified-since" => 40,
        b"if-none-match" => 41,
        b"if-range" => 42,
        b"if-unmodified-since" => 43,
        b"last-modified" => 44,
        b"link" => 45,
        b"location" => 46,
        b"max-forwards" => 47,
        b"proxy-authenticate" => 48,
        b"proxy-authorization" => 49,
        b"range" => 50,
        b"referer" => 51,
        b"refresh" => 52,
        b"retry-after" => 53,
        b"server" => 54,
        b"set-cookie" => 55,
        b"strict-transport-security" => 56,
        b"transfer-encoding" => 57,
        b"user-agent" => 58,
        b"vary" => 59,
        b"via" => 60,
        b"www-authenticate" => 61,
        _ => return None,
    })
}

/// Static-table match for a field: (index of an entry with this name, index of an entry with
/// this name and value), both 1-based.
pub(crate) fn static_find(name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
    let Some(first) = static_name_index(name) else {
        return (None, None);
    };
    // Entries sharing a name are adjacent.
    let exact = (first..=STATIC_TABLE.len())
        .take_while(|&i| STATIC_TABLE[i - 1].0 == name)
        .find(|&i| STATIC_TABLE[i - 1].1 == value);
    (Some(first), exact)
}

#[derive(Clone, Copy)]
struct Slot {
    /// Virtual position of the name's first byte; the value follows it.
    start: usize,
    name_len: u32,
    value_len: u32,
}

impl Slot {
    fn len(&self) -> usize {
        self.name_len as usize + self.value_len as usize
    }
}

/// The dynamic table: newest entry is index 0 (HPACK index 62).
pub(crate) struct DynTable {
    /// The ring, `cap` bytes once full-grown. Allocated at the first insertion; its length
    /// grows as entries are first written (rather than zeroing the whole ring up front).
    buf: Vec<u8>,
    /// 0 until the first insertion; then a power of two ≥ 2 × `max_size`.
    cap: usize,
    /// Oldest at the front.
    slots: VecDeque<Slot>,
    /// Virtual position where the next entry's bytes go.
    head: usize,
    /// Sum of entry sizes per §4.1 (name + value + 32).
    size: usize,
    max_size: usize,
}

impl DynTable {
    pub(crate) fn new(max_size: usize) -> DynTable {
        DynTable {
            buf: Vec::new(),
            cap: 0,
            slots: VecDeque::new(),
            head: 0,
            size: 0,
            max_size,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    pub(crate) fn max_size(&self) -> usize {
        self.max_size
    }

    fn slot_bytes(&self, s: &Slot) -> (&[u8], &[u8]) {
        let p = s.start & (self.cap.wrapping_sub(1));
        let n = s.name_len as usize;
        let bytes = &self.buf[p..p + s.len()];
        bytes.split_at(n)
    }

    /// Entry `i`, 0 being the newest.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<(&[u8], &[u8])> {
        let len = self.slots.len();
        if i >= len {
            return None;
        }
        Some(self.slot_bytes(&self.slots[len - 1 - i]))
    }

    /// §4.3: a new maximum evicts entries until the table fits.
    pub(crate) fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        while self.size > max_size {
            self.evict_oldest();
        }
    }

    fn evict_oldest(&mut self) {
        if let Some(s) = self.slots.pop_front() {
            self.size -= s.len() + ENTRY_OVERHEAD;
        }
    }

    /// §4.4: evicts until the entry fits, then adds it; an entry bigger than the whole table
    /// empties it and is not added. `name` and `value` must not point into this table (the
    /// entry they came from may be evicted and overwritten first).
    pub(crate) fn insert(&mut self, name: &[u8], value: &[u8]) {
        let len = name.len() + value.len();
        let size = len + ENTRY_OVERHEAD;
        if size > self.max_size {
            self.slots.clear();
            self.size = 0;
            return;
        }
        while self.size + size > self.max_size {
            self.evict_oldest();
        }
        self.reserve();
        if self.slots.is_empty() {
            self.head = 0;
        }
        let cap = self.cap;
        let mut start = self.head;
        let mut p = start & (cap - 1);
        if p + len > cap {
            start = start.wrapping_add(cap - p);
            p = 0;
        }
        if self.buf.len() < p + len {
            self.buf.resize(p + len, 0);
        }
        self.buf[p..p + name.len()].copy_from_slice(name);
        self.buf[p + name.len()..p + len].copy_from_slice(value);
        self.slots.push_back(Slot {
            start,
            name_len: name.len() as u32,
            value_len: value.len() as u32,
        });
        self.head = start.wrapping_add(len);
        self.size += size;
        debug_assert!(self.head.wrapping_sub(self.slots[0].start) <= cap);
    }

    /// Makes the ring at least 2 × `max_size`, moving live entries to the front of a new one.
    fn reserve(&mut self) {
        let need = self
            .max_size
            .saturating_mul(2)
            .checked_next_power_of_two()
            .unwrap_or(1 << (usize::BITS - 1))
            .max(64);
        if self.cap >= need {
            return;
        }
        // Reserved up front for the usual sizes; a huge table grows as it is used.
        let mut buf = Vec::with_capacity(need.min(1 << 16));
        for i in 0..self.slots.len() {
            let s = self.slots[i];
            let start = buf.len();
            let (n, v) = self.slot_bytes(&s);
            buf.extend_from_slice(n);
            buf.extend_from_slice(v);
            self.slots[i].start = start;
        }
        self.head = buf.len();
        self.buf = buf;
        self.cap = need;
    }

    /// The newest entries matching `name` (and `value`): (exact match, name match), 0-based.
    pub(crate) fn find(&self, name: &[u8], value: &[u8]) -> (Option<usize>, Option<usize>) {
        let mut by_name = None;
        for (i, s) in self.slots.iter().rev().enumerate() {
            if s.name_len as usize != name.len() {
                continue;
            }
            let (n, v) = self.slot_bytes(s);
            if n != name {
                continue;
            }
            if v == value {
                return (Some(i), Some(i));
            }
            by_name.get_or_insert(i);
        }
        (None, by_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn static_lookup() {
        assert_eq!(static_find(b":method", b"GET"), (Some(2), Some(2)));
        assert_eq!(static_find(b":method", b"POST"), (Some(2), Some(3)));
        assert_eq!(static_find(b":method", b"PUT"), (Some(2), None));
        assert_eq!(static_find(b":status", b"500"), (Some(8), Some(14)));
        assert_eq!(static_find(b":status", b"302"), (Some(8), None));
        assert_eq!(
            static_find(b"accept-encoding", b"gzip, deflate"),
            (Some(16), Some(16))
        );
        assert_eq!(static_find(b"accept", b""), (Some(19), Some(19)));
        assert_eq!(static_find(b"accept", b"*/*"), (Some(19), None));
        assert_eq!(static_find(b"www-authenticate", b"x"), (Some(61), None));
        assert_eq!(static_find(b"x-custom", b""), (None, None));
        // The name match agrees with the table for every entry.
        for (i, (n, v)) in STATIC_TABLE.iter().enumerate() {
            let (first, exact) = static_find(n, v);
            assert_eq!(STATIC_TABLE[first.unwrap() - 1].0, *n);
            assert_eq!(exact, Some(i + 1));
        }
    }

    #[test]
    fn eviction_by_size() {
        let mut t = DynTable::new(100);
        t.insert(b"aaaa", b"bbbb"); // 40
        t.insert(b"cccc", b"dddd"); // 80
        assert_eq!((t.len(), t.size()), (2, 80));
        t.insert(b"eeee", b"ffff"); // evicts the oldest
        assert_eq!((t.len(), t.size()), (2, 80));
        assert_eq!(t.get(0), Some((&b"eeee"[..], &b"ffff"[..])));
        assert_eq!(t.get(1), Some((&b"cccc"[..], &b"dddd"[..])));
        assert_eq!(t.get(2), None);
        // Exactly the maximum fits.
        t.insert(&[b'x'; 30], &[b'y'; 38]);
        assert_eq!((t.len(), t.size()), (1, 100));
        // One byte more empties the table.
        t.insert(&[b'x'; 30], &[b'y'; 39]);
        assert_eq!((t.len(), t.size()), (0, 0));
        t.insert(b"", b"");
        assert_eq!((t.len(), t.size()), (1, 32));
        t.set_max_size(31);
        assert_eq!((t.len(), t.size()), (0, 0));
    }

    proptest! {
        /// The ring buffer agrees with a plain list of owned entries under random inserts
        /// (of all sizes, including empty and too-big ones) and size changes.
        #[test]
        fn matches_model(ops in proptest::collection::vec(
            (0usize..6, proptest::collection::vec(any::<u8>(), 0..90), 0usize..90),
            1..200,
        )) {
            let mut t = DynTable::new(256);
            let mut model: VecDeque<(Vec<u8>, Vec<u8>)> = VecDeque::new();
            let mut max = 256;
            for (op, bytes, split) in ops {
                if op == 0 {
                    max = [0, 40, 100, 256, 300, 1000][split % 6];
                    t.set_max_size(max);
                } else {
                    let split = split.min(bytes.len());
                    let (n, v) = bytes.split_at(split);
                    t.insert(n, v);
                    model.push_front((n.to_vec(), v.to_vec()));
                }
                let size = |m: &VecDeque<(Vec<u8>, Vec<u8>)>| {
                    m.iter().map(|(n, v)| n.len() + v.len() + 32).sum::<usize>()
                };
                while size(&model) > max {
                    model.pop_back();
                }
                prop_assert_eq!(t.len(), model.len());
                prop_assert_eq!(t.size(), size(&model));
                for (i, (n, v)) in model.iter().enumerate() {
                    prop_assert_eq!(t.get(i), Some((&n[..], &v[..])));
                    let (exact, _) = t.find(n, v);
                    prop_assert!(exact.is_some_and(|e| e <= i));
                }
            }
        }
    }
}
