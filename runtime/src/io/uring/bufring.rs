//! The provided-buffer ring a worker's multishot receives take their buffers from: memory
//! tern allocates (not the kernel-allocated `IOU_PBUF_RING_MMAP` variant, whose mapping had
//! a use-after-free, CVE-2024-0582), registered with the ring, refilled as the worker is done
//! with each buffer. A buffer belongs to the kernel from the moment it is provided until a
//! completion hands it back, and is only read in between.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::IoUring;

/// The buffer group the receives select from.
pub(super) const GROUP: u16 = 0;

pub(super) struct BufRing {
    /// `count` ring entries (`struct io_uring_buf`, 16 bytes each), page-aligned.
    entries: *mut u8,
    entries_layout: Layout,
    /// `count` buffers of `size` bytes.
    memory: *mut u8,
    memory_layout: Layout,
    count: u16,
    size: u32,
    /// Our copy of the ring's tail: the next entry to fill.
    tail: u16,
    /// Buffers the kernel holds now (provided, not handed back).
    provided: u32,
}

// SAFETY: the pointers are owned allocations, used only by the thread that owns the ring
// (the ring is made on the starting thread and moved, with this, to its worker).
unsafe impl Send for BufRing {}

const ENTRY_SIZE: usize = 16;
/// The tail is the `resv` field of the first entry (`struct io_uring_buf_ring`).
const TAIL_OFFSET: usize = 14;

impl BufRing {
    /// `count` (a power of two, at most 32768) buffers of `size` bytes, all provided.
    pub(super) fn new(count: u16, size: u32) -> io::Result<BufRing> {
        assert!(count.is_power_of_two() && count <= 1 << 15);
        let entries_layout =
            Layout::from_size_align(count as usize * ENTRY_SIZE, 4096).map_err(io::Error::other)?;
        let memory_layout = Layout::from_size_align(count as usize * size as usize, 4096)
            .map_err(io::Error::other)?;
        // SAFETY: both layouts have a non-zero size; a null result is handled.
        let (entries, memory) =
            unsafe { (alloc_zeroed(entries_layout), alloc_zeroed(memory_layout)) };
        if entries.is_null() || memory.is_null() {
            // SAFETY: each pointer, if not null, came from `alloc_zeroed` with its layout.
            unsafe {
                if !entries.is_null() {
                    dealloc(entries, entries_layout);
                }
                if !memory.is_null() {
                    dealloc(memory, memory_layout);
                }
            }
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        let mut ring = BufRing {
            entries,
            entries_layout,
            memory,
            memory_layout,
            count,
            size,
            tail: 0,
            provided: 0,
        };
        for bid in 0..count {
            ring.write_entry(bid);
        }
        ring.publish();
        Ok(ring)
    }

    /// Registers the ring with `uring` (before it is enabled).
    pub(super) fn register(&self, uring: &IoUring) -> io::Result<()> {
        // SAFETY: the entries stay allocated, at this address, until `self` drops, which the
        // owner (`UringIo`) does after the ring it is registered with (field order there).
        unsafe {
            uring.submitter().register_buf_ring_with_flags(
                self.entries as u64,
                self.count,
                GROUP,
                0,
            )
        }
    }

    pub(super) fn size(&self) -> u32 {
        self.size
    }

    /// Buffers the kernel may fill now.
    pub(super) fn available(&self) -> u32 {
        self.provided
    }

    /// The kernel handed buffer `bid` back in a completion.
    pub(super) fn taken(&mut self) {
        self.provided -= 1;
    }

    /// Bytes `off..off + len` of buffer `bid`, which a completion handed back.
    pub(super) fn bytes(&self, bid: u16, off: u32, len: u32) -> &[u8] {
        assert!(bid < self.count && off + len <= self.size);
        // SAFETY: in bounds (asserted); the kernel handed this buffer back and gets it again
        // only through `give_back`, which takes `&mut self`, so nothing writes it while the
        // returned slice (borrowing `self`) lives.
        unsafe {
            std::slice::from_raw_parts(
                self.memory
                    .add(bid as usize * self.size as usize + off as usize),
                len as usize,
            )
        }
    }

    /// Provides buffer `bid` to the kernel again.
    pub(super) fn give_back(&mut self, bid: u16) {
        self.write_entry(bid);
        self.publish();
    }

    fn write_entry(&mut self, bid: u16) {
        let index = (self.tail & (self.count - 1)) as usize;
        let addr = self.memory as u64 + bid as u64 * self.size as u64;
        // SAFETY: `index < count`, so the 16-byte entry is inside the allocation; the kernel
        // reads entries only up to the published tail, and this one is past it until
        // `publish`. The tail field of entry 0 (bytes 14..16) is not touched here.
        unsafe {
            let entry = self.entries.add(index * ENTRY_SIZE);
            (entry as *mut u64).write_unaligned(addr);
            (entry.add(8) as *mut u32).write_unaligned(self.size);
            (entry.add(12) as *mut u16).write_unaligned(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        self.provided += 1;
    }

    fn publish(&self) {
        // SAFETY: offset 14 of the page-aligned allocation is 2-aligned and inside it; the
        // kernel reads the tail with acquire ordering, so the entries written before are
        // visible to it.
        let tail = unsafe { &*(self.entries.add(TAIL_OFFSET) as *const AtomicU16) };
        tail.store(self.tail, Ordering::Release);
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: both came from `alloc_zeroed` with these layouts, and the ring they were
        // registered with is gone (see `register`).
        unsafe {
            dealloc(self.entries, self.entries_layout);
            dealloc(self.memory, self.memory_layout);
        }
    }
}
