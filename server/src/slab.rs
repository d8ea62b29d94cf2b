//! A worker's table of connections (client or upstream), addressed by `tag | generation << 32
//! | index`. The generation makes a key (in a timer, a pending reply or a mio token) refer to
//! one occupant only, never to a later one that reuses the slot. Generations stay below 2^30,
//! so a tag in one of the top two bits tells the tables' keys apart (upstream connections
//! carry bit 63, QUIC connections bit 62).

pub(crate) struct Slab<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
    pub len: usize,
    tag: u64,
}

impl<T> Slab<T> {
    /// A table whose keys all have `tag` set (0, bit 63 or bit 62).
    pub fn new(tag: u64) -> Slab<T> {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
            tag,
        }
    }

    /// Stores what `make` returns for its key.
    pub fn insert(&mut self, make: impl FnOnce(u64) -> T) -> u64 {
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[index as usize];
        slot.0 = (slot.0.wrapping_add(1) & 0x3fff_ffff).max(1);
        let key = self.tag | u64::from(slot.0) << 32 | u64::from(index);
        slot.1 = Some(make(key));
        self.len += 1;
        key
    }

    fn slot(&mut self, key: u64) -> Option<&mut (u32, Option<T>)> {
        let slot = self.slots.get_mut((key & 0xffff_ffff) as usize)?;
        (u64::from(slot.0) == (key & !self.tag) >> 32).then_some(slot)
    }

    pub fn get_mut(&mut self, key: u64) -> Option<&mut T> {
        self.slot(key)?.1.as_mut()
    }

    pub fn remove(&mut self, key: u64) -> Option<T> {
        let taken = self.slot(key)?.1.take()?;
        self.free.push((key & 0xffff_ffff) as u32);
        self.len -= 1;
        Some(taken)
    }

    pub fn keys(&self) -> Vec<u64> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, (_, c))| c.is_some())
            .map(|(i, (gen, _))| self.tag | u64::from(*gen) << 32 | i as u64)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_never_reused_for_a_later_occupant() {
        let mut s: Slab<&str> = Slab::new(1 << 63);
        let a = s.insert(|_| "a");
        assert_ne!(a & (1 << 63), 0, "the tag is in every key");
        assert_eq!(s.remove(a), Some("a"));
        let b = s.insert(|_| "b");
        assert_eq!(a & 0xffff_ffff, b & 0xffff_ffff, "the slot is reused");
        assert!(s.get_mut(a).is_none(), "the old key finds nothing");
        assert_eq!(s.get_mut(b), Some(&mut "b"));
        assert_eq!(s.keys(), [b]);
        assert_eq!(s.len, 1);
    }
}
