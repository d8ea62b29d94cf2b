use std::io;
use std::thread::JoinHandle;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// What a delivered signal asks of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalAction {
    /// SIGINT / SIGTERM: stop accepting, finish in-flight requests, exit.
    Shutdown,
    /// SIGHUP: reload what can be reloaded.
    Reload,
}

/// Spawns a thread that turns signals into calls of `on_signal`. Signal handlers themselves
/// only write to a pipe (signal-hook), so nothing unsafe runs in signal context.
pub fn spawn_signal_thread(
    mut on_signal: impl FnMut(SignalAction) + Send + 'static,
) -> io::Result<JoinHandle<()>> {
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("tern-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                on_signal(if sig == SIGHUP {
                    SignalAction::Reload
                } else {
                    SignalAction::Shutdown
                });
            }
        })
}
