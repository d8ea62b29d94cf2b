use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::time::{Duration, Instant};

use super::*;

fn pair(io: &mut UringIo) -> (UringSock, std::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ours = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    ours.set_nonblocking(true).unwrap();
    let (theirs, _) = listener.accept().unwrap();
    (io.adopt(ours), theirs)
}

/// Turns of the loop until `done` says so (or 5 s pass).
fn turn_until(io: &mut UringIo, mut done: impl FnMut(&mut UringIo, &[Readiness]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut ready = Vec::new();
    loop {
        ready.clear();
        io.wait(Some(Duration::from_millis(10)), &mut ready)
            .unwrap();
        if done(io, &ready) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out");
    }
}

fn send_all(io: &mut UringIo, sock: &mut UringSock, bytes: &[u8]) {
    let mut off = 0;
    while off < bytes.len() {
        let iov = [IoSlice::new(&bytes[off..])];
        let what = Transmit::Memory {
            iov: &iov,
            more: false,
        };
        match io.send(sock, &what).unwrap() {
            Some(n) => off += n,
            None => turn_until(io, |_, r| r.iter().any(|r| r.writable)),
        }
    }
}

/// Reads every socket, in `piece`-byte reads, until each gave `bytes`, and checks that socket
/// `i`'s byte `n` is `pattern(i, n)`.
fn read_all_in_order(
    io: &mut UringIo,
    socks: &mut [UringSock],
    bytes: usize,
    pattern: impl Fn(usize, usize) -> u8,
    piece: usize,
) {
    let mut got = vec![Vec::new(); socks.len()];
    let mut buf = vec![0u8; piece];
    turn_until(io, |io, _| {
        for (i, s) in socks.iter_mut().enumerate() {
            while let Ok(n @ 1..) = io.recv(s, &mut buf) {
                got[i].extend_from_slice(&buf[..n]);
            }
        }
        got.iter().all(|g| g.len() == bytes)
    });
    for (i, g) in got.iter().enumerate() {
        assert!(
            g.iter().enumerate().all(|(n, &b)| b == pattern(i, n)),
            "socket {i}"
        );
    }
}

/// Every call against a real socket: a send through the ring, a multishot receive read in
/// pieces, a peek, a file range, the write shutdown after the bytes on the ring, the end.
#[test]
fn sends_receives_peeks_and_shuts_down_through_the_ring() {
    let mut io = UringIo::on_this_thread().unwrap();
    let (mut sock, mut peer) = pair(&mut io);
    io.watch(&mut sock, 40).unwrap();

    send_all(&mut io, &mut sock, b"head and body");
    // Queued: the loop's next turn hands it to the kernel.
    turn_until(&mut io, |io, _| io.slots[sock.slot as usize].send.is_none());
    let mut got = [0u8; 13];
    peer.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"head and body");

    let mut buf = [0u8; 4];
    assert_eq!(
        io.recv(&mut sock, &mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    peer.write_all(b"hello world").unwrap();
    turn_until(&mut io, |_, r| {
        r.iter().any(|r| r.token == 40 && r.readable)
    });
    assert_eq!(io.peek(&mut sock), Waiting::Bytes);
    assert_eq!(io.recv(&mut sock, &mut buf).unwrap(), 4);
    assert!(!io.short_read_drains(&sock), "bytes are still queued");
    let mut rest = [0u8; 64];
    assert_eq!(io.recv(&mut sock, &mut rest).unwrap(), 7);
    assert_eq!(&rest[..7], b"o world");
    assert!(io.short_read_drains(&sock));

    let mut file = tempfile::tempfile().unwrap();
    file.write_all(b"0123456789").unwrap();
    let range = Transmit::File {
        fd: file.as_raw_fd(),
        offset: 2,
        len: 5,
    };
    assert_eq!(io.send(&mut sock, &range).unwrap(), Some(5));
    let mut got = [0u8; 5];
    peer.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"23456");

    // Shut down while a send is on the ring: the peer gets the bytes, then the end.
    let iov = [IoSlice::new(b"last")];
    let last = Transmit::Memory {
        iov: &iov,
        more: false,
    };
    assert_eq!(io.send(&mut sock, &last).unwrap(), Some(4));
    io.shutdown_write(&mut sock).unwrap();
    turn_until(&mut io, |io, _| io.slots[sock.slot as usize].send.is_none());
    let mut tail = Vec::new();
    peer.read_to_end(&mut tail).unwrap();
    assert_eq!(tail, b"last");

    drop(peer);
    turn_until(&mut io, |_, r| r.iter().any(|r| r.read_closed));
    assert_eq!(io.peek(&mut sock), Waiting::Closed);
    assert_eq!(io.recv(&mut sock, &mut buf).unwrap(), 0);
    assert_eq!(io.unacked_bytes(&sock).unwrap(), 0);

    // Dropped: the descriptor closes once the ring is done with it, and the slot is reused.
    let slot = sock.slot;
    drop(sock);
    turn_until(&mut io, |io, _| io.free.contains(&slot));
    let s = io.stats();
    assert!(
        s.submissions > 0 && s.completions > 0 && s.enters > 0,
        "{s:?}"
    );
}

#[test]
fn connects_and_reports_the_connection_writable() {
    let mut io = UringIo::on_this_thread().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut s = io
        .connect(Peer::Tcp(listener.local_addr().unwrap()))
        .unwrap();
    io.watch(&mut s, 41).unwrap();
    let (mut theirs, _) = listener.accept().unwrap();
    turn_until(&mut io, |_, r| {
        r.iter().any(|r| r.token == 41 && r.writable)
    });
    assert!(io.connected(&mut s).unwrap());
    theirs.write_all(b"hi").unwrap();
    turn_until(&mut io, |_, r| {
        r.iter().any(|r| r.token == 41 && r.readable)
    });
    let mut buf = [0u8; 8];
    assert_eq!(io.recv(&mut s, &mut buf).unwrap(), 2);
}

/// Many clients sending at once to a worker that does not read: each socket's receive
/// pauses at its cap, the buffer ring runs dry for the rest (counted), and once the worker
/// reads, every byte arrives, in order, on every socket.
#[test]
fn buffer_exhaustion_loses_nothing() {
    let mut io = UringIo::on_this_thread().unwrap();
    const SOCKETS: usize = 100;
    const BYTES: usize = 100 * 1024;
    let mut socks = Vec::new();
    let mut peers = Vec::new();
    for i in 0..SOCKETS {
        let (mut s, p) = pair(&mut io);
        io.watch(&mut s, 100 + i).unwrap();
        socks.push(s);
        peers.push(p);
    }
    let pattern = |i: usize, n: usize| ((i * 7 + n) % 251) as u8;
    let writers: Vec<_> = peers
        .into_iter()
        .enumerate()
        .map(|(i, mut p)| {
            std::thread::spawn(move || {
                let bytes: Vec<u8> = (0..BYTES).map(|n| pattern(i, n)).collect();
                p.write_all(&bytes).unwrap();
                p
            })
        })
        .collect();
    // Turns without reading, until the ring has run dry.
    turn_until(&mut io, |io, _| io.stats().buffers_exhausted > 0);
    read_all_in_order(&mut io, &mut socks, BYTES, pattern, 16 * 1024);
    let peers: Vec<_> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    assert!(io.stats().rearms > 0);
    drop(peers);
}

/// The ring refuses what it was not allowed (here an open, which would bypass seccomp and
/// Landlock's view of `openat`), with `EACCES`; the same operation on a ring without the
/// restrictions succeeds, so the refusal is the restriction's doing.
#[test]
fn an_operation_outside_the_allow_list_is_refused() {
    let path = c"/dev/null";
    let open = opcode::OpenAt::new(types::Fd(libc::AT_FDCWD), path.as_ptr())
        .flags(libc::O_RDONLY | libc::O_CLOEXEC)
        .build()
        .user_data(7);

    let mut io = UringIo::on_this_thread().unwrap();
    io.push(open.clone());
    io.enter(Some(Duration::from_millis(100))).unwrap();
    let cqe = io.ring.completion().next().expect("a completion");
    assert_eq!(cqe.result(), -libc::EACCES);

    let mut plain = IoUring::new(8).unwrap();
    // SAFETY: the path is a static C string; no buffer is involved.
    unsafe { plain.submission().push(&open).unwrap() };
    plain.submit_and_wait(1).unwrap();
    let cqe = plain.completion().next().unwrap();
    assert!(cqe.result() >= 0, "control: {}", cqe.result());
    // SAFETY: the result is a descriptor the open made, owned by nothing else.
    drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(cqe.result()) });
}

/// A socket whose app stops reading is held at the cap (its receive cancelled), and starts
/// again once the app read it down, even when the app drains it before the cancel is in.
#[test]
fn a_held_receive_starts_again_once_read() {
    let mut io = UringIo::on_this_thread().unwrap();
    let (mut sock, mut peer) = pair(&mut io);
    io.watch(&mut sock, 42).unwrap();
    const BYTES: usize = 1 << 20;
    let writer = std::thread::spawn(move || {
        peer.write_all(&vec![7u8; BYTES]).unwrap();
        peer
    });
    turn_until(&mut io, |io, _| io.slots[sock.slot as usize].recv_held);
    assert!(io.slots[sock.slot as usize].rx_bytes as usize >= RX_CAP);
    let mut got = 0;
    let mut buf = vec![0u8; 256 * 1024];
    turn_until(&mut io, |io, _| {
        while let Ok(n @ 1..) = io.recv(&mut sock, &mut buf) {
            assert!(buf[..n].iter().all(|&b| b == 7));
            got += n;
        }
        got == BYTES
    });
    drop(writer.join().unwrap());
}

/// Bytes offered while a send is under way wait behind it, in order, and a socket dropped
/// right after (a GOAWAY queued just before a close) still delivers both, then its end.
#[test]
fn bytes_offered_during_a_send_follow_it_even_through_a_close() {
    let mut io = UringIo::on_this_thread().unwrap();
    let (mut sock, mut peer) = pair(&mut io);
    io.watch(&mut sock, 43).unwrap();
    for part in [&b"first "[..], b"second ", b"third"] {
        let iov = [IoSlice::new(part)];
        let what = Transmit::Memory {
            iov: &iov,
            more: false,
        };
        assert_eq!(io.send(&mut sock, &what).unwrap(), Some(part.len()));
    }
    assert!(
        io.unacked_bytes(&sock).unwrap() >= 12,
        "the queued bytes count as unsent"
    );
    let slot = sock.slot;
    drop(sock);
    turn_until(&mut io, |io, _| io.free.contains(&slot));
    let mut got = Vec::new();
    peer.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"first second third");
}

/// A dropped socket whose peer reads nothing gives its descriptor back once its send has
/// stalled, long before the overall limit (a reading peer gets everything:
/// `bytes_offered_during_a_send_follow_it_even_through_a_close`).
#[test]
fn a_dropped_socket_whose_peer_stopped_reading_is_closed_once_it_stalls() {
    let mut io = UringIo::on_this_thread().unwrap();
    io.set_orphan_stall(Duration::from_millis(300));
    let (mut sock, peer) = pair(&mut io);
    io.watch(&mut sock, 44).unwrap();
    // Fill the kernel's buffers until a send stays on the ring.
    let chunk = vec![7u8; 64 * 1024];
    let mut offered = 0;
    let start = Instant::now();
    loop {
        let iov = [IoSlice::new(&chunk)];
        let what = Transmit::Memory {
            iov: &iov,
            more: false,
        };
        match io.send(&mut sock, &what).unwrap() {
            Some(n) => offered += n,
            None => break,
        }
        let mut ready = Vec::new();
        io.wait(Some(Duration::from_millis(1)), &mut ready).unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "never filled ({offered} bytes)"
        );
    }
    let slot = sock.slot;
    drop(sock);
    let dropped = Instant::now();
    turn_until(&mut io, |io, _| io.free.contains(&slot));
    let took = dropped.elapsed();
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "closed after {took:?}"
    );
    drop(peer);
}

/// Sockets whose app never reads them (each held at its cap) take every buffer of the ring;
/// once a receive finds it dry, their bytes are copied out and the buffers given back, so a
/// socket the app does read still receives, and the held ones lose nothing.
#[test]
fn unread_sockets_do_not_starve_the_others() {
    let mut io = UringIo::on_this_thread().unwrap();
    let ring_bytes = setup::BUFFERS as usize * setup::BUFFER_SIZE as usize;
    let held = ring_bytes / RX_CAP + 8;
    const BYTES: usize = RX_CAP + 16 * 1024;
    let pattern = |i: usize, n: usize| ((i * 13 + n) % 251) as u8;
    let mut socks = Vec::new();
    let mut writers = Vec::new();
    for i in 0..held {
        let (mut s, mut p) = pair(&mut io);
        io.watch(&mut s, 200 + i).unwrap();
        socks.push(s);
        writers.push(std::thread::spawn(move || {
            let bytes: Vec<u8> = (0..BYTES).map(|n| pattern(i, n)).collect();
            p.write_all(&bytes).unwrap();
            p
        }));
    }
    // Turns without reading any of them, until the ring has run dry.
    turn_until(&mut io, |io, _| io.stats().buffers_exhausted > 0);

    let (mut fresh, mut peer) = pair(&mut io);
    io.watch(&mut fresh, 199).unwrap();
    peer.write_all(b"ping").unwrap();
    let mut buf = [0u8; 16];
    turn_until(&mut io, |io, _| {
        matches!(io.recv(&mut fresh, &mut buf), Ok(4))
    });
    assert_eq!(&buf[..4], b"ping");
    assert!(io.stats().buffers_reclaimed > 0);

    read_all_in_order(&mut io, &mut socks, BYTES, pattern, 5000);
    assert!(socks
        .iter()
        .all(|s| io.slots[s.slot as usize].set_aside.is_none()));
    drop(
        writers
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect::<Vec<_>>(),
    );
}

/// An app with no room for a socket's input holds it: the ring stops receiving for it (what
/// comes next waits in the kernel), and its next `recv`, even one that finds nothing, starts
/// the receive again.
#[test]
fn held_input_waits_in_the_kernel_until_the_app_reads() {
    let mut io = UringIo::on_this_thread().unwrap();
    let (mut sock, mut peer) = pair(&mut io);
    io.watch(&mut sock, 43).unwrap();
    let slot = sock.slot as usize;
    let a_few_turns = |io: &mut UringIo| {
        let mut ready = Vec::new();
        for _ in 0..20 {
            io.wait(Some(Duration::from_millis(5)), &mut ready).unwrap();
        }
    };

    peer.write_all(&[1; 1000]).unwrap();
    turn_until(&mut io, |io, _| io.slots[slot].rx_bytes == 1000);
    io.hold_input(&mut sock);
    turn_until(&mut io, |io, _| !io.slots[slot].recv_armed);
    peer.write_all(&[2; 1000]).unwrap();
    a_few_turns(&mut io);
    assert_eq!(
        io.slots[slot].rx_bytes, 1000,
        "the second write stays in the kernel"
    );

    let mut buf = [0u8; 4096];
    assert_eq!(io.recv(&mut sock, &mut buf).unwrap(), 1000);
    assert!(buf[..1000].iter().all(|&b| b == 1));
    turn_until(&mut io, |io, _| io.slots[slot].rx_bytes == 1000);
    assert_eq!(io.recv(&mut sock, &mut buf).unwrap(), 1000);
    assert!(buf[..1000].iter().all(|&b| b == 2));

    // Held with nothing unread: a `recv` that says WouldBlock starts it again too.
    io.hold_input(&mut sock);
    turn_until(&mut io, |io, _| !io.slots[slot].recv_armed);
    peer.write_all(&[3; 10]).unwrap();
    a_few_turns(&mut io);
    assert_eq!(io.slots[slot].rx_bytes, 0);
    assert_eq!(
        io.recv(&mut sock, &mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    turn_until(&mut io, |io, _| io.slots[slot].rx_bytes == 10);
    assert_eq!(io.recv(&mut sock, &mut buf).unwrap(), 10);
}

/// A send offered more than a chunk at once takes up to a big send (a TLS transport's
/// 256 KiB block goes out whole), at most `MAX_BIG_SENDS_OUT` of them under way per worker;
/// past that, sends are a chunk again. Every big buffer comes back.
#[test]
fn big_sends_are_bounded_per_worker() {
    let mut io = UringIo::on_this_thread().unwrap();
    let block = vec![5u8; BIG_SEND + 1000];
    let mut socks = Vec::new();
    let mut readers = Vec::new();
    for i in 0..=MAX_BIG_SENDS_OUT {
        let (mut s, mut p) = pair(&mut io);
        io.watch(&mut s, 300 + i).unwrap();
        let iov = [IoSlice::new(&block)];
        let what = Transmit::Memory {
            iov: &iov,
            more: false,
        };
        // All in one turn: none has completed yet.
        let taken = io.send(&mut s, &what).unwrap().unwrap();
        let want = if i < MAX_BIG_SENDS_OUT {
            BIG_SEND
        } else {
            SEND_CHUNK
        };
        assert_eq!(taken, want, "send {i}");
        socks.push(s);
        readers.push(std::thread::spawn(move || {
            let mut got = vec![0u8; want];
            p.read_exact(&mut got).unwrap();
            assert!(got.iter().all(|&b| b == 5));
            p
        }));
    }
    assert_eq!(io.big_sends_out, MAX_BIG_SENDS_OUT);
    turn_until(&mut io, |io, _| io.slots.iter().all(|s| s.send.is_none()));
    assert_eq!(io.big_sends_out, 0);
    assert!(io.spare_big_sends.len() <= SPARE_BIG_SENDS);
    drop(
        readers
            .into_iter()
            .map(|r| r.join().unwrap())
            .collect::<Vec<_>>(),
    );
}

/// A panic inside one of the backend's calls marks it poisoned (its tables may be
/// half-updated, so a worker must not contain the panic and go on); calls that return, or
/// a panic outside them, do not.
#[test]
fn a_panic_inside_a_call_poisons_the_backend_and_nothing_else_does() {
    let mut io = UringIo::on_this_thread().unwrap();
    let (mut sock, _peer) = pair(&mut io);
    io.watch(&mut sock, 7).unwrap();
    send_all(&mut io, &mut sock, b"ok");
    assert!(!io.poisoned());
    let outside = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = io.peek(&mut sock);
        panic!("in the app, between calls");
    }));
    assert!(outside.is_err());
    assert!(
        !io.poisoned(),
        "a panic between calls leaves the backend sound"
    );
    // A socket the backend never made: its slot is out of the table, and the call panics.
    let mut stranger = UringSock {
        slot: u32::MAX,
        generation: 0,
        fd: None,
        dropped: io.dropped.clone(),
    };
    let inside =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| io.watch(&mut stranger, 8)));
    assert!(inside.is_err());
    assert!(io.poisoned());
}

fn bound_datagram(io: &mut UringIo) -> (UringDatagram, std::net::SocketAddr) {
    let bound = crate::bind_datagram_reuseport("127.0.0.1:0".parse().unwrap()).unwrap();
    let local = bound.local_addr().unwrap();
    (io.adopt_datagram(bound).unwrap(), local)
}

/// Every datagram waiting, as (metadata, bytes).
fn recv_datagrams_now(io: &mut UringIo, sock: &mut UringDatagram) -> Vec<(RecvMeta, Vec<u8>)> {
    let mut storage = vec![[0u8; 2048]; 4];
    let mut bufs: Vec<IoSliceMut<'_>> = storage.iter_mut().map(|b| IoSliceMut::new(b)).collect();
    let mut meta = [RecvMeta::default(); 4];
    let mut got = Vec::new();
    loop {
        match io.recv_datagrams(sock, &mut bufs, &mut meta) {
            Ok(n) => got.extend((0..n).map(|i| (meta[i], bufs[i][..meta[i].len].to_vec()))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return got,
            Err(e) => panic!("{e}"),
        }
    }
}

/// A UDP socket watched through the ring's multishot poll: reported writable when watched,
/// readable for each arrival by the one poll, answered by sendmsg; room after a full send
/// buffer comes from a one-shot poll.
#[test]
fn datagrams_are_reported_by_the_ring_and_answered() {
    let mut io = UringIo::on_this_thread().unwrap();
    let (mut sock, local) = bound_datagram(&mut io);
    assert_eq!(io.datagram_local_addr(&sock), local);
    assert!(io.max_gso_segments(&sock) >= 1 && io.gro_segments(&sock) >= 1);
    io.watch_datagram(&mut sock, 60).unwrap();
    turn_until(&mut io, |_, r| {
        r.iter().any(|r| r.token == 60 && r.writable)
    });

    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let submitted = io.stats().submissions;
    for round in 0..3u8 {
        client.send_to(&[round; 5], local).unwrap();
        turn_until(&mut io, |_, r| {
            r.iter().any(|r| r.token == 60 && r.readable)
        });
        let got = recv_datagrams_now(&mut io, &mut sock);
        assert_eq!(got.len(), 1, "round {round}");
        let (meta, bytes) = &got[0];
        assert_eq!(bytes, &[round; 5]);
        assert_eq!(meta.addr, client.local_addr().unwrap());
        assert_eq!(meta.dst_ip, Some(local.ip()));
        let answer = DatagramTransmit {
            destination: meta.addr,
            ecn: None,
            contents: b"answer",
            segment_size: None,
            src_ip: meta.dst_ip,
        };
        assert!(io.send_datagram(&mut sock, &answer).unwrap());
        let mut buf = [0u8; 16];
        let (n, from) = client.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&b"answer"[..], local));
    }
    assert_eq!(
        io.stats().submissions,
        submitted,
        "one poll saw every arrival"
    );
    // What `send_datagram` arms when the socket has no room (loopback never runs out: its
    // sends leave the socket's buffer at once): the poll's completion reports it writable.
    io.arm_poll_out(sock.sock.slot);
    turn_until(&mut io, |_, r| {
        r.iter().any(|r| r.token == 60 && r.writable && !r.readable)
    });
    assert_eq!(
        io.slots[sock.sock.slot as usize].owed, 1,
        "only the read poll"
    );
}

/// A socket dropped while its poll fires is never reported again, not under its own token
/// and not under the next socket's in its slot; its descriptor closes once the ring let go.
#[test]
fn a_dropped_datagram_socket_is_not_reported_and_its_slot_is_reused() {
    let mut io = UringIo::on_this_thread().unwrap();
    let (mut first, first_addr) = bound_datagram(&mut io);
    io.watch_datagram(&mut first, 61).unwrap();
    turn_until(&mut io, |_, r| r.iter().any(|r| r.token == 61));
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(b"late", first_addr).unwrap();
    let slot = first.sock.slot;
    drop(first);
    let mut seen = Vec::new();
    turn_until(&mut io, |io, r| {
        seen.extend(r.iter().map(|r| r.token));
        io.free.contains(&slot)
    });
    assert!(!seen.contains(&61), "{seen:?}");
    std::net::UdpSocket::bind(first_addr).expect("the descriptor is closed");

    let (mut second, second_addr) = bound_datagram(&mut io);
    assert_eq!(second.sock.slot, slot, "the slot is reused");
    io.watch_datagram(&mut second, 62).unwrap();
    client.send_to(b"new", second_addr).unwrap();
    let mut seen = Vec::new();
    turn_until(&mut io, |_, r| {
        seen.extend(r.iter().copied());
        seen.iter().any(|r| r.token == 62 && r.readable)
    });
    assert!(seen.iter().all(|r| r.token == 62), "{seen:?}");
    assert_eq!(recv_datagrams_now(&mut io, &mut second)[0].1, b"new");
}
