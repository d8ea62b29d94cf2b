//! Helpers for background threads that share cores with the workers.

/// Lowers the calling thread's scheduling priority to the weakest (nice 19), so rebuilding
/// snapshots only uses CPU the workers leave idle. Best effort: failure is logged and ignored.
pub fn lower_priority() {
    // SAFETY: gettid has no preconditions; setpriority on our own thread id only changes this
    // thread's nice value (Linux applies PRIO_PROCESS with a tid to that one thread).
    let rc = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19)
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!("could not lower a background thread's priority: {e}");
    }
}

/// This thread's nice value.
pub fn current_nice() -> i32 {
    // SAFETY: as above; getpriority only reads. errno is cleared first because -1 is also a
    // valid nice value.
    unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn lowers_only_the_calling_thread() {
        let before = super::current_nice();
        let inside = std::thread::spawn(|| {
            super::lower_priority();
            super::current_nice()
        })
        .join()
        .unwrap();
        assert_eq!(inside, 19);
        assert_eq!(super::current_nice(), before);
    }
}
