//! What the kernel knows about a socket's output, for deciding whether a slow client is still
//! reading.

use std::io;
use std::os::fd::AsRawFd;

/// Bytes written to a TCP socket that the peer has not yet acknowledged (`SIOCOUTQ`). A
/// client that reads, however slowly, makes this shrink; one that has stopped reading leaves
/// it where it was.
pub fn unacked_bytes(socket: &impl AsRawFd) -> io::Result<u32> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (== TIOCOUTQ on Linux) writes one int through the pointer, which
    // points at a live local; the fd is borrowed from an open socket for the call.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn shrinks_when_the_peer_reads() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut writer = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut reader, _) = listener.accept().unwrap();
        assert_eq!(unacked_bytes(&writer).unwrap(), 0);
        // More than the peer's receive buffer can take, so some stays queued with us.
        writer.set_nonblocking(true).unwrap();
        let chunk = vec![7u8; 64 * 1024];
        let mut written = 0usize;
        while written < 64 << 20 {
            match writer.write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        let before = unacked_bytes(&writer).unwrap();
        assert!(before > 0, "nothing queued after {written} bytes");
        let mut sink = vec![0u8; 64 * 1024];
        let mut read = 0;
        while read < written / 2 {
            read += reader.read(&mut sink).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        let after = unacked_bytes(&writer).unwrap();
        assert!(after < before, "{after} >= {before} after reading {read}");
    }
}
