use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread::JoinHandle;

use libc::c_int;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::backend::SignalDelivery;
use signal_hook::iterator::exfiltrator::SignalOnly;

/// What a delivered signal (or a wake-up) asks of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalAction {
    /// SIGINT / SIGTERM: stop accepting, finish in-flight requests, exit.
    Shutdown,
    /// SIGHUP: reload what can be reloaded.
    Reload,
    /// SIGUSR1: reopen the log files (after logrotate moved them away).
    ReopenLogs,
    /// Not a signal: after every wake-up of the thread (a signal's, or a
    /// [`SignalThreadWaker::wake`]), the moment to take what other threads queued for it.
    Woken,
}

/// The signals the thread turns into actions.
const SIGNALS: [c_int; 4] = [SIGINT, SIGTERM, SIGHUP, SIGUSR1];

/// The signal thread's self-pipe. The signals' handlers write a byte to it, and so does a
/// [`SignalThreadWaker`]. It is made before the thread (and before any handler is installed),
/// so that threads started earlier can be handed a waker: a wake-up sent before the thread
/// runs waits in the pipe.
#[derive(Debug)]
pub struct SignalPipe {
    read: UnixStream,
    write: UnixStream,
    waker: SignalThreadWaker,
}

impl SignalPipe {
    pub fn new() -> io::Result<SignalPipe> {
        let (read, write) = UnixStream::pair()?;
        let waker = SignalThreadWaker(Arc::new(write.try_clone()?));
        Ok(SignalPipe { read, write, waker })
    }

    /// A handle other threads wake the signal thread with.
    pub fn waker(&self) -> SignalThreadWaker {
        self.waker.clone()
    }
}

/// Wakes the signal thread, which then runs its [`SignalAction::Woken`]: the way another
/// thread hands it work (queue the work first, then wake), so that the work runs there, one
/// thing at a time with what signals ask for.
#[derive(Debug, Clone)]
pub struct SignalThreadWaker(Arc<UnixStream>);

impl SignalThreadWaker {
    pub fn wake(&self) {
        // MSG_DONTWAIT: a full pipe already holds a wake-up the thread has yet to see, so
        // EAGAIN loses nothing, and the caller never blocks. (The descriptor is shared with
        // the signals' handlers, which send the same way; its flags are left alone.)
        // SAFETY: a one-byte send from a live buffer on a descriptor this struct owns.
        unsafe {
            libc::send(
                self.0.as_raw_fd(),
                [1u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            );
        }
    }
}

/// Spawns a thread that turns signals into calls of `on_signal`, followed after each wake-up
/// by a call with [`SignalAction::Woken`]. Signal handlers themselves only write to the pipe
/// (signal-hook), so nothing unsafe runs in signal context; every call runs on this one
/// thread, so no two overlap.
pub fn spawn_signal_thread(
    pipe: SignalPipe,
    on_signal: impl FnMut(SignalAction) + Send + 'static,
) -> io::Result<JoinHandle<()>> {
    spawn_for(pipe, &SIGNALS, on_signal)
}

/// [`spawn_signal_thread`] for the given signals (the tests' own).
fn spawn_for(
    pipe: SignalPipe,
    signals: &[c_int],
    mut on_signal: impl FnMut(SignalAction) + Send + 'static,
) -> io::Result<JoinHandle<()>> {
    let SignalPipe { read, write, .. } = pipe;
    let mut delivery = SignalDelivery::with_pipe(read, write, SignalOnly, signals)?;
    std::thread::Builder::new()
        .name("tern-signals".into())
        .spawn(move || loop {
            // Blocks for the first byte; then takes every byte there is and the signals
            // that arrived. A waker's work was queued before its byte, so whatever was
            // queued before this point is seen by the `Woken` call below, and anything
            // queued later brings a byte of its own to the next turn.
            match delivery.poll_pending(&mut wait_for_byte) {
                Ok(Some(pending)) => {
                    for signal in pending {
                        on_signal(action(signal));
                    }
                    on_signal(SignalAction::Woken);
                }
                // Closed: nothing here closes it.
                Ok(None) => return,
                Err(e) => {
                    tracing::error!("the signal thread stopped: its pipe failed: {e}");
                    return;
                }
            }
        })
}

/// Waits for a byte on the self-pipe; false at its end (never: this process holds a writer).
fn wait_for_byte(read: &mut UnixStream) -> io::Result<bool> {
    loop {
        match read.read(&mut [0u8]) {
            Ok(n) => return Ok(n > 0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

fn action(sig: i32) -> SignalAction {
    match sig {
        SIGHUP => SignalAction::Reload,
        SIGUSR1 => SignalAction::ReopenLogs,
        _ => SignalAction::Shutdown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn each_signal_has_its_action() {
        assert_eq!(action(SIGHUP), SignalAction::Reload);
        assert_eq!(action(SIGUSR1), SignalAction::ReopenLogs);
        assert_eq!(action(SIGTERM), SignalAction::Shutdown);
        assert_eq!(action(SIGINT), SignalAction::Shutdown);
    }

    #[test]
    fn a_wake_up_sent_before_the_thread_runs_reaches_it_and_each_later_one_too() {
        let pipe = SignalPipe::new().unwrap();
        let waker = pipe.waker();
        // Before the thread exists: the byte waits in the pipe.
        waker.wake();
        let (seen, actions) = mpsc::channel();
        // No signals: this test must not take any from the test process.
        spawn_for(pipe, &[], move |a| {
            let _ = seen.send(a);
        })
        .unwrap();
        let next = || actions.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(next(), SignalAction::Woken);
        for _ in 0..3 {
            let waker = waker.clone();
            std::thread::spawn(move || waker.wake()).join().unwrap();
            assert_eq!(next(), SignalAction::Woken);
        }
        // Many wake-ups at once fold into fewer turns, never into none.
        for _ in 0..1000 {
            waker.wake();
        }
        assert_eq!(next(), SignalAction::Woken);
    }

    #[test]
    fn a_signal_comes_as_its_action_then_woken() {
        let pipe = SignalPipe::new().unwrap();
        let (seen, actions) = mpsc::channel();
        // SIGUSR1 only: no other test of this binary sends it, and its handler stays
        // installed, so the signal never falls to its default action (terminate).
        spawn_for(pipe, &[SIGUSR1], move |a| {
            let _ = seen.send(a);
        })
        .unwrap();
        signal_hook::low_level::raise(SIGUSR1).unwrap();
        let next = || actions.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(next(), SignalAction::ReopenLogs);
        assert_eq!(next(), SignalAction::Woken);
    }
}
