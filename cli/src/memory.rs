//! How the process uses memory: mimalloc for Rust's allocations and for aws-lc's (the crypto
//! under rustls), freed memory returned to the OS at once, and no transparent huge pages.

use std::ffi::c_void;

// mimalloc: lower fragmentation and faster small allocations than the system allocator (swad
// fought RSS growth from fragmentation for weeks).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (not exported as a constant by libmimalloc-sys; its
/// place in mimalloc v2's `mi_option_e`).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Called first thing in `main`.
pub fn configure() {
    return_freed_memory_promptly();
    no_transparent_huge_pages();
}

/// Give memory freed after a burst (5 000 slowloris connections) back to the OS at once
/// instead of keeping it for reuse: measured with stress/slowloris.py, RSS otherwise stayed at
/// the attack's peak.
fn return_freed_memory_promptly() {
    // SAFETY: mi_option_set only stores an integer option; it is called before any other
    // thread exists, and purge_delay accepts any value (0 = purge immediately).
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

/// No transparent huge pages for this process. mimalloc asks for them on its arena
/// (MADV_HUGEPAGE, before `main` runs), so RSS grew in 2 MiB steps: whether a burst of 10 000
/// idle connections crossed into one more huge page decided between ~460 and ~670 bytes per
/// connection from run to run (bench idle-rss). A server's heap is small; predictable memory
/// matters more than the TLB.
fn no_transparent_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE only sets a flag on this process's memory map; the unused
    // arguments are 0 as prctl(2) requires.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc != 0 {
        eprintln!(
            "tern: warning: cannot disable transparent huge pages: {}",
            std::io::Error::last_os_error()
        );
    }
}

// aws-lc allocates with glibc's malloc unless the program defines these (weak symbols in
// aws-lc's crypto/mem.c). With glibc each worker thread that did handshakes kept an arena of
// ~3.6 MiB after a burst (stress/slowloris.py --tls); through mimalloc it is purged like the
// rest. aws-lc then leaves zeroing freed memory to us: keys and secrets live in it.

/// Counts aws-lc's allocations in tests, to prove the hook is the one linked in.
#[cfg(test)]
static AWS_LC_ALLOCATIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// aws-lc's allocation hook.
#[no_mangle]
extern "C" fn OPENSSL_memory_alloc(size: usize) -> *mut c_void {
    #[cfg(test)]
    AWS_LC_ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: mi_malloc has no preconditions; NULL on failure is what aws-lc expects.
    unsafe { libmimalloc_sys::mi_malloc(size) }
}

/// aws-lc's free hook: zero the whole block (secrets), then free it. Never called with NULL.
#[no_mangle]
extern "C" fn OPENSSL_memory_free(ptr: *mut c_void) {
    // SAFETY: aws-lc passes only pointers it got from OPENSSL_memory_alloc (mi_malloc), each
    // once; mi_usable_size is the block's full size, all of it writable until mi_free.
    unsafe {
        let size = libmimalloc_sys::mi_usable_size(ptr);
        std::ptr::write_bytes(ptr.cast::<u8>(), 0, size);
        // mi_free is opaque to the compiler, but keep the zeroing from being reordered past it.
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
        libmimalloc_sys::mi_free(ptr);
    }
}

/// aws-lc's size hook (its realloc copies this many bytes into the new block).
#[no_mangle]
extern "C" fn OPENSSL_memory_get_size(ptr: *mut c_void) -> usize {
    // SAFETY: as above, `ptr` came from mi_malloc and is live.
    unsafe { libmimalloc_sys::mi_usable_size(ptr) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn purge_delay_option_is_set() {
        return_freed_memory_promptly();
        // SAFETY: mi_option_get only reads an option value.
        let v = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(v, 0);
    }

    #[test]
    fn transparent_huge_pages_are_off() {
        no_transparent_huge_pages();
        // SAFETY: PR_GET_THP_DISABLE only reads the flag.
        let flag = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(flag, 1);
    }

    #[test]
    fn aws_lc_blocks_come_from_mimalloc_and_are_zeroed_on_free() {
        let p = OPENSSL_memory_alloc(100);
        assert!(!p.is_null());
        // SAFETY: mi_is_in_heap_region only inspects the address.
        assert!(unsafe { libmimalloc_sys::mi_is_in_heap_region(p) });
        let size = OPENSSL_memory_get_size(p);
        assert!(size >= 100);
        // SAFETY: the block is live and `size` bytes long.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0xAB, size) };
        OPENSSL_memory_free(p);
        // And the real path: aws-lc's own allocations (keys made for a certificate, ticket
        // keys) come through the hook.
        let before = AWS_LC_ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed);
        let acceptor = tern_server::TlsAcceptor::new(&tern_server::TlsOptions {
            self_signed: true,
            ..Default::default()
        });
        assert!(acceptor.is_ok());
        let after = AWS_LC_ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            after > before + 1,
            "aws-lc allocated {} times through the hook",
            after - before
        );
    }
}
