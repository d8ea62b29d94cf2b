/// A fixed-size, already-initialised read buffer with a window of unconsumed bytes. Reads go
/// into `spare_mut()`, the parser looks at `data()`, and `consume` advances the window, so no
/// bytes move until `compact` is needed.
pub struct ReadBuf {
    bytes: Box<[u8]>,
    start: usize,
    end: usize,
}

impl ReadBuf {
    fn with_capacity(size: usize) -> ReadBuf {
        ReadBuf {
            bytes: vec![0; size].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    pub fn data(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.end]
    }

    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    pub fn capacity(&self) -> usize {
        self.bytes.len()
    }

    /// The free tail to read into. Moves unconsumed bytes to the front first if the tail is
    /// empty but there is room at the front.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        if self.end == self.bytes.len() && self.start > 0 {
            self.compact();
        }
        &mut self.bytes[self.end..]
    }

    /// Records that `n` bytes were written into `spare_mut()`.
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.bytes.len());
    }

    pub fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    pub fn compact(&mut self) {
        if self.start > 0 {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Grows the buffer (keeping its data) to at least `size` bytes, for heads that do not fit
    /// in a standard buffer. Grown buffers are not returned to the pool.
    pub fn grow_to(&mut self, size: usize) {
        if size > self.bytes.len() {
            let mut bigger = vec![0; size].into_boxed_slice();
            let len = self.len();
            bigger[..len].copy_from_slice(self.data());
            self.bytes = bigger;
            self.start = 0;
            self.end = len;
        }
    }
}

/// The size of a block: output built in place (TLS records), a batch at a time.
pub const BLOCK_SIZE: usize = 64 * 1024;
/// A big block, for a peer that takes whole blocks as fast as they are made: a quarter of
/// the sends (and file reads) per byte.
pub const BIG_BLOCK_SIZE: usize = 256 * 1024;
/// Big blocks out at once per worker: a peer that reads fast and then stops holds one until
/// its connection ends, so their number is bounded (16 MiB of them per worker); past it,
/// blocks are the standard size.
const MAX_BIG_BLOCKS_OUT: usize = 64;

/// Per-worker pool of read buffers, output vectors and blocks. Idle keep-alive connections
/// hand their buffers back here, so memory scales with active connections, not open ones.
pub struct BufPool {
    read: Vec<ReadBuf>,
    write: Vec<Vec<u8>>,
    /// Initialised once, so what is built in them is never zeroed first.
    blocks: Vec<ReadBuf>,
    big_blocks: Vec<ReadBuf>,
    /// Big blocks taken and not given back.
    big_out: usize,
    read_size: usize,
    write_size: usize,
    max_free: usize,
}

impl BufPool {
    pub fn new(read_size: usize, write_size: usize, max_free: usize) -> BufPool {
        BufPool {
            read: Vec::new(),
            write: Vec::new(),
            blocks: Vec::new(),
            big_blocks: Vec::new(),
            big_out: 0,
            read_size,
            write_size,
            max_free,
        }
    }

    pub fn take_read(&mut self) -> ReadBuf {
        self.read
            .pop()
            .unwrap_or_else(|| ReadBuf::with_capacity(self.read_size))
    }

    pub fn give_read(&mut self, mut buf: ReadBuf) {
        if buf.capacity() == self.read_size && self.read.len() < self.max_free {
            buf.start = 0;
            buf.end = 0;
            self.read.push(buf);
        }
    }

    pub fn take_write(&mut self) -> Vec<u8> {
        self.write
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(self.write_size))
    }

    /// Takes back an output vector; oversized ones (a big pipelined burst) are dropped so the
    /// pool does not pin peak memory forever.
    pub fn give_write(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() <= self.write_size * 4 && self.write.len() < self.max_free {
            buf.clear();
            self.write.push(buf);
        }
    }

    /// A [`BLOCK_SIZE`] buffer (or a [`BIG_BLOCK_SIZE`] one if asked for and fewer than
    /// [`MAX_BIG_BLOCKS_OUT`] are out), empty: build into `spare_mut`, send `data`,
    /// `consume` what was sent.
    pub fn take_block(&mut self, big: bool) -> ReadBuf {
        if big && self.big_out < MAX_BIG_BLOCKS_OUT {
            self.big_out += 1;
            return self
                .big_blocks
                .pop()
                .unwrap_or_else(|| ReadBuf::with_capacity(BIG_BLOCK_SIZE));
        }
        self.blocks
            .pop()
            .unwrap_or_else(|| ReadBuf::with_capacity(BLOCK_SIZE))
    }

    /// Takes a block back (kept for reuse while the pool has room; big ones fewer).
    pub fn give_block(&mut self, mut buf: ReadBuf) {
        let (list, keep) = match buf.capacity() {
            BLOCK_SIZE => (&mut self.blocks, self.max_free),
            BIG_BLOCK_SIZE => {
                self.big_out = self.big_out.saturating_sub(1);
                (&mut self.big_blocks, self.max_free / 4)
            }
            _ => return,
        };
        if list.len() < keep {
            buf.start = 0;
            buf.end = 0;
            list.push(buf);
        }
    }

    pub fn read_size(&self) -> usize {
        self.read_size
    }

    /// Buffers currently parked in the pool (read, write).
    pub fn idle(&self) -> (usize, usize) {
        (self.read.len(), self.write.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn big_blocks_out_at_once_are_bounded() {
        let mut pool = BufPool::new(8, 8, 32);
        let big: Vec<ReadBuf> = (0..MAX_BIG_BLOCKS_OUT)
            .map(|_| pool.take_block(true))
            .collect();
        assert!(big.iter().all(|b| b.capacity() == BIG_BLOCK_SIZE));
        assert_eq!(
            pool.take_block(true).capacity(),
            BLOCK_SIZE,
            "past the bound"
        );
        for b in big {
            pool.give_block(b);
        }
        assert_eq!(
            pool.take_block(true).capacity(),
            BIG_BLOCK_SIZE,
            "given back"
        );
    }

    #[test]
    fn read_window_consumes_and_compacts() {
        let mut pool = BufPool::new(8, 8, 4);
        let mut b = pool.take_read();
        b.spare_mut()[..5].copy_from_slice(b"hello");
        b.filled(5);
        assert_eq!(b.data(), b"hello");
        b.consume(2);
        assert_eq!(b.data(), b"llo");
        b.spare_mut()[..3].copy_from_slice(b"abc");
        b.filled(3);
        assert_eq!(b.data(), b"lloabc");
        // Tail is full, front has room: spare_mut compacts.
        assert_eq!(b.spare_mut().len(), 2);
        assert_eq!(b.data(), b"lloabc");
        b.consume(6);
        assert!(b.is_empty());
        pool.give_read(b);
        assert_eq!(pool.idle().0, 1);
    }

    #[test]
    fn grown_buffers_keep_data_and_are_not_pooled() {
        let mut pool = BufPool::new(4, 4, 4);
        let mut b = pool.take_read();
        b.spare_mut().copy_from_slice(b"abcd");
        b.filled(4);
        b.grow_to(16);
        assert_eq!(b.data(), b"abcd");
        assert_eq!(b.spare_mut().len(), 12);
        pool.give_read(b);
        assert_eq!(pool.idle().0, 0);
    }

    #[test]
    fn oversized_write_buffers_are_dropped() {
        let mut pool = BufPool::new(4, 16, 4);
        pool.give_write(Vec::with_capacity(16));
        pool.give_write(Vec::with_capacity(1024));
        assert_eq!(pool.idle().1, 1);
    }
}
