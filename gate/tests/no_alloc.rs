//! Checking a session cookie allocates nothing (the issue's "one MAC and no allocation"): a
//! counting allocator around `token::verify`, and around the whole cookie-to-session path of
//! the keyring, after a warm-up call.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use tern_gate::keyring::Keyring;
use tern_gate::token::{self, Session, MAX_TOKEN};
use tern_gate::Prefix;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Only the test's own thread is counted: the test harness's threads allocate when they
    /// like (output capture, progress), which once showed up here as 4 allocations.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is only a
// side effect.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // A const-initialised thread-local without a destructor: reading it never allocates.
        if COUNTED.try_with(|c| c.get()).unwrap_or(false) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller's layout contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn verifying_a_session_allocates_nothing() {
    let keyring = Keyring::from_keys(vec![(1, 100, [5; 32]), (2, 200, [6; 32])]);
    let cookie = token::issue(
        &keyring,
        &Session {
            realm: "staff",
            user: "alice",
            issued: 1000,
            expires: 5000,
            realm_version: 7,
            prefix: Prefix::of("192.0.2.1".parse().unwrap(), 24, 48),
            ua_hash: 7,
            proof: token::Proof::Password,
            kid: 0,
        },
    )
    .unwrap();
    let mut buf = [0u8; MAX_TOKEN];
    assert!(token::verify(&keyring, cookie.as_bytes(), &mut buf, 2000).is_ok());
    COUNTED.with(|c| c.set(true));
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..1000 {
        let mut buf = [0u8; MAX_TOKEN];
        let s = token::verify(&keyring, cookie.as_bytes(), &mut buf, 2000).unwrap();
        assert_eq!(s.user, "alice");
        // Nor does the user agent's fingerprint that every session check compares.
        std::hint::black_box(tern_gate::pow::ua_hash(
            b"Mozilla/5.0 (X11; rv:132.0) Firefox/132.0",
        ));
        // The failures allocate nothing either.
        let mut buf = [0u8; MAX_TOKEN];
        assert!(token::verify(&keyring, b"not-a-token", &mut buf, 2000).is_err());
    }
    let allocated = ALLOCATIONS.load(Ordering::Relaxed) - before;
    COUNTED.with(|c| c.set(false));
    assert_eq!(allocated, 0);
}
