use std::io;
use std::thread::JoinHandle;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

/// What a delivered signal asks of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalAction {
    /// SIGINT / SIGTERM: stop accepting, finish in-flight requests, exit.
    Shutdown,
    /// SIGHUP: reload what can be reloaded.
    Reload,
    /// SIGUSR1: reopen the log files (after logrotate moved them away).
    ReopenLogs,
}

/// Spawns a thread that turns signals into calls of `on_signal`. Signal handlers themselves
/// only write to a pipe (signal-hook), so nothing unsafe runs in signal context.
pub fn spawn_signal_thread(
    mut on_signal: impl FnMut(SignalAction) + Send + 'static,
) -> io::Result<JoinHandle<()>> {
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP, SIGUSR1])?;
    std::thread::Builder::new()
        .name("tern-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                on_signal(action(sig));
            }
        })
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

    #[test]
    fn each_signal_has_its_action() {
        assert_eq!(action(SIGHUP), SignalAction::Reload);
        assert_eq!(action(SIGUSR1), SignalAction::ReopenLogs);
        assert_eq!(action(SIGTERM), SignalAction::Shutdown);
        assert_eq!(action(SIGINT), SignalAction::Shutdown);
    }
}
