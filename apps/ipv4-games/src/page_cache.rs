//! SQLite's own page cache, wrapped to skip truncations that cannot drop a page.
//!
//! Why: when SQLite's B-tree balancer (`balance_nonroot`) splits a page it may swap two
//! pages' numbers through a temporary number, the locking page (1 GiB / page size + 1). The
//! default page cache (`pcache1`) remembers the largest page number it has ever held, and
//! every commit ends by truncating the cache to the database's size. With that remembered
//! number far above the database, `pcache1` walks its *whole* hash table, every cached page,
//! on the next commit. Random claims split a page in nearly every batch, so with a 64 MiB
//! cache and a million rows that walk was 36 % of the writer's time (`perf`, SQLite 3.50);
//! a small cache walks less but then reads every leaf again from the kernel.
//!
//! The wrapper forwards every call to the default cache and keeps an upper bound on the
//! page numbers it holds (ignoring the balancer's temporary number once the swap is over).
//! A truncation that could not drop anything is then skipped; any other is forwarded. The
//! cache's content and behaviour are otherwise the default's.

use std::ffi::{c_int, c_uint};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use rusqlite::ffi;

/// SQLite's locking byte offset (PENDING_BYTE): the page holding it is never used for data,
/// which is why the balancer borrows its number as a temporary.
const PENDING_BYTE: u32 = 0x4000_0000;

/// The default page cache's methods, saved when the wrapper is installed.
struct Default(ffi::sqlite3_pcache_methods2);
// SAFETY: the struct holds function pointers and SQLite's own `pArg`, which SQLite's default
// cache ignores; both are fixed once installed and only ever read.
unsafe impl Send for Default {}
unsafe impl Sync for Default {}

static DEFAULT: OnceLock<Option<Default>> = OnceLock::new();

/// Truncations skipped (nothing to drop) and forwarded, over the process's life.
static SKIPPED: AtomicU64 = AtomicU64::new(0);
static FORWARDED: AtomicU64 = AtomicU64::new(0);

/// One cache (one per connection and page size): the default cache plus what it holds.
struct Cache {
    inner: *mut ffi::sqlite3_pcache,
    /// The balancer's temporary page number for this page size.
    temp_key: c_uint,
    /// No page held, other than `temp_page`, has a larger number.
    max_key: c_uint,
    /// The page currently numbered `temp_key`, if any.
    temp_page: *mut ffi::sqlite3_pcache_page,
}

/// Installs the wrapper. Must run before SQLite is first used in the process (the first
/// connection opened); returns false, changing nothing, when that moment has passed or
/// SQLite refuses. Every later call returns the first call's answer.
pub fn install() -> bool {
    DEFAULT
        .get_or_init(|| {
            let mut default = ffi::sqlite3_pcache_methods2 {
                iVersion: 0,
                pArg: ptr::null_mut(),
                xInit: None,
                xShutdown: None,
                xCreate: None,
                xCachesize: None,
                xPagecount: None,
                xFetch: None,
                xUnpin: None,
                xRekey: None,
                xTruncate: None,
                xDestroy: None,
                xShrink: None,
            };
            // SAFETY: GETPCACHE2 copies the configured methods into the struct we pass; it
            // only reads global configuration and fails (MISUSE) once SQLite is initialised.
            let rc = unsafe {
                ffi::sqlite3_config(
                    ffi::SQLITE_CONFIG_GETPCACHE2,
                    &mut default as *mut ffi::sqlite3_pcache_methods2,
                )
            };
            if rc != ffi::SQLITE_OK || default.xCreate.is_none() {
                // Something opened a database first: commits then walk the whole page
                // cache after splits (slower, still correct).
                tracing::info!("SQLite already in use; its page cache is not wrapped");
                return None;
            }
            let wrapper = ffi::sqlite3_pcache_methods2 {
                iVersion: default.iVersion,
                pArg: default.pArg,
                xInit: default.xInit,
                xShutdown: default.xShutdown,
                xCreate: Some(create),
                xCachesize: Some(cachesize),
                xPagecount: Some(pagecount),
                xFetch: Some(fetch),
                xUnpin: Some(unpin),
                xRekey: Some(rekey),
                xTruncate: Some(truncate),
                xDestroy: Some(destroy),
                xShrink: Some(shrink),
            };
            // SAFETY: PCACHE2 copies the struct (SQLite keeps its own copy), so a local is
            // fine. It succeeds only before initialisation, when no connection (and so no
            // cache) exists yet: every cache is then created by `create` below.
            let rc = unsafe {
                ffi::sqlite3_config(
                    ffi::SQLITE_CONFIG_PCACHE2,
                    &wrapper as *const ffi::sqlite3_pcache_methods2,
                )
            };
            if rc != ffi::SQLITE_OK {
                return None;
            }
            Some(Default(default))
        })
        .is_some()
}

/// (skipped, forwarded) truncations so far: for tests and diagnostics.
pub fn truncations() -> (u64, u64) {
    (
        SKIPPED.load(Ordering::Relaxed),
        FORWARDED.load(Ordering::Relaxed),
    )
}

fn methods() -> &'static ffi::sqlite3_pcache_methods2 {
    // Only reachable through a cache made by `create`, i.e. after a successful install.
    match DEFAULT.get() {
        Some(Some(d)) => &d.0,
        _ => unreachable!("page cache wrapper called before it was installed"),
    }
}

// The callbacks. SQLite calls each with a cache pointer that `create` returned and that
// `destroy` has not yet freed, and uses one cache from one thread at a time (its connection's),
// so the `Cache` behind it may be read and written without further locking. Every default
// method exists (pcache1 fills them all; `install` checked xCreate).

unsafe extern "C" fn create(
    sz_page: c_int,
    sz_extra: c_int,
    purgeable: c_int,
) -> *mut ffi::sqlite3_pcache {
    let m = methods();
    // SAFETY: forwarding SQLite's own arguments to the default cache.
    let inner = unsafe { (m.xCreate.unwrap())(sz_page, sz_extra, purgeable) };
    if inner.is_null() {
        return ptr::null_mut();
    }
    let cache = Box::new(Cache {
        inner,
        temp_key: PENDING_BYTE / sz_page.max(1) as u32 + 1,
        max_key: 0,
        temp_page: ptr::null_mut(),
    });
    Box::into_raw(cache).cast()
}

/// SAFETY: `p` must be a pointer `create` returned and `destroy` has not freed, used by one
/// thread at a time (SQLite's contract for a cache, see above).
unsafe fn cache<'a>(p: *mut ffi::sqlite3_pcache) -> &'a mut Cache {
    unsafe { &mut *p.cast::<Cache>() }
}

unsafe extern "C" fn cachesize(p: *mut ffi::sqlite3_pcache, n: c_int) {
    // SAFETY: see `cache`; forwarding to the default cache's own object.
    unsafe { (methods().xCachesize.unwrap())(cache(p).inner, n) }
}

unsafe extern "C" fn pagecount(p: *mut ffi::sqlite3_pcache) -> c_int {
    // SAFETY: as above.
    unsafe { (methods().xPagecount.unwrap())(cache(p).inner) }
}

unsafe extern "C" fn fetch(
    p: *mut ffi::sqlite3_pcache,
    key: c_uint,
    create: c_int,
) -> *mut ffi::sqlite3_pcache_page {
    // SAFETY: as above.
    let c = unsafe { cache(p) };
    let page = unsafe { (methods().xFetch.unwrap())(c.inner, key, create) };
    if !page.is_null() {
        c.note_key(page, key);
    }
    page
}

unsafe extern "C" fn unpin(
    p: *mut ffi::sqlite3_pcache,
    page: *mut ffi::sqlite3_pcache_page,
    discard: c_int,
) {
    // SAFETY: as above.
    let c = unsafe { cache(p) };
    if discard != 0 && page == c.temp_page {
        c.temp_page = ptr::null_mut();
    }
    unsafe { (methods().xUnpin.unwrap())(c.inner, page, discard) }
}

unsafe extern "C" fn rekey(
    p: *mut ffi::sqlite3_pcache,
    page: *mut ffi::sqlite3_pcache_page,
    old: c_uint,
    new: c_uint,
) {
    // SAFETY: as above.
    let c = unsafe { cache(p) };
    unsafe { (methods().xRekey.unwrap())(c.inner, page, old, new) };
    if page == c.temp_page {
        c.temp_page = ptr::null_mut();
    }
    c.note_key(page, new);
}

unsafe extern "C" fn truncate(p: *mut ffi::sqlite3_pcache, limit: c_uint) {
    // SAFETY: as above.
    let c = unsafe { cache(p) };
    if c.temp_page.is_null() && c.max_key < limit {
        // No page numbered `limit` or more is held: the default cache would drop nothing
        // (but, having once seen the temporary number, would walk every page to find so).
        SKIPPED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    FORWARDED.fetch_add(1, Ordering::Relaxed);
    unsafe { (methods().xTruncate.unwrap())(c.inner, limit) };
    c.max_key = c.max_key.min(limit.saturating_sub(1));
    if limit <= c.temp_key {
        c.temp_page = ptr::null_mut();
    }
}

unsafe extern "C" fn destroy(p: *mut ffi::sqlite3_pcache) {
    // SAFETY: `p` came from `Box::into_raw` in `create`; SQLite destroys a cache once and
    // never uses it afterwards.
    let c = unsafe { Box::from_raw(p.cast::<Cache>()) };
    unsafe { (methods().xDestroy.unwrap())(c.inner) }
}

unsafe extern "C" fn shrink(p: *mut ffi::sqlite3_pcache) {
    // SAFETY: see `cache`.
    unsafe { (methods().xShrink.unwrap())(cache(p).inner) }
}

impl Cache {
    /// Records that `page` is now held under `key`.
    fn note_key(&mut self, page: *mut ffi::sqlite3_pcache_page, key: c_uint) {
        if key == self.temp_key {
            self.temp_page = page;
        } else {
            self.max_key = self.max_key.max(key);
        }
    }
}
