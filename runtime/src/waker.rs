//! A worker's wake-up: an eventfd that other threads write to and the worker's backend
//! watches (epoll reports it readable; io_uring keeps a read of it on the ring). Written here
//! rather than taken from `mio` so that a backend without an epoll can watch it too.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

pub struct Waker {
    /// The eventfd, as a file for plain reads and writes.
    file: File,
}

impl Waker {
    pub fn new() -> io::Result<Waker> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor that
        // nothing else owns.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned here alone.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Waker {
            file: File::from(owned),
        })
    }

    /// Wakes the worker (any thread).
    pub fn wake(&self) -> io::Result<()> {
        loop {
            match (&self.file).write(&1u64.to_ne_bytes()) {
                Ok(_) => return Ok(()),
                // The counter is full (only if nobody reads it): empty it and write again,
                // so the watcher sees a new write.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.reset(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Empties the counter (the io_uring backend reads it through the ring instead).
    pub fn reset(&self) {
        let mut buf = [0u8; 8];
        let _ = (&self.file).read(&mut buf);
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_makes_the_eventfd_readable_and_reset_empties_it() {
        let waker = Waker::new().unwrap();
        let mut buf = [0u8; 8];
        let empty = (&waker.file).read(&mut buf).unwrap_err();
        assert_eq!(empty.kind(), io::ErrorKind::WouldBlock);
        waker.wake().unwrap();
        waker.wake().unwrap();
        assert_eq!((&waker.file).read(&mut buf).unwrap(), 8);
        assert_eq!(u64::from_ne_bytes(buf), 2);
        waker.wake().unwrap();
        waker.reset();
        assert!((&waker.file).read(&mut buf).is_err());
    }
}
