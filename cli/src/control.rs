//! The control socket (`control = PATH` in `tern run`'s file): a local Unix socket the
//! operator's commands reach the running server through, never the network. It takes
//! `tern reload` and `tern cache purge`; nothing an HTTP client sends can reload or purge.
//!
//! Made at start, before privileges are dropped and the sandbox is on: owned by the user tern
//! starts as, mode 0600 (root or that user may use it), or with `control_group = GROUP` given
//! to that group and mode 0660, so that its members (an app's deploy hook) may use it too. One
//! request line per connection, one answer line back (`ok ...` or `error ...`):
//!
//! ```text
//! reload                                      (as SIGHUP: what changed, or why nothing did)
//! purge url https://example.com/blog/post?p=1 [cache NAME]
//! purge prefix https://example.com/blog/      [cache NAME]   (or a path alone: /blog/)
//! purge tag product-42                        [cache NAME]
//! purge all                                   [cache NAME]
//! ```
//!
//! A reload is not run here: it is handed to the signal thread, which runs SIGHUP's, so that
//! the two never overlap and take one code path (`common::ReloadRequester`).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use socket2::{Domain, SockAddr, Socket, Type};
use tern_cache::Purge;
use tern_server::StopSignal;

use crate::common::ReloadRequester;

/// The path `tern cache purge` tries when given none (the Debian package's config names it).
pub const DEFAULT_PATH: &str = "/run/tern/control.sock";

/// The longest request line taken.
const MAX_LINE: u64 = 8 * 1024;

/// How long one client may take to send its line and read the answer: the thread serves one
/// at a time, so a client that stalls holds the others up for at most this.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// How often the accepting thread looks at its stop signal.
const STOP_POLL: Duration = Duration::from_millis(250);

/// How long a `reload` request waits for the signal thread's outcome. A reload re-opens every
/// static root and re-reads the certificates, which takes well under a second; the bound is
/// for a file system that hangs, and stays below the client's own wait ([`CLIENT_WAIT`]),
/// so the client gets an answer rather than a timeout.
const RELOAD_WAIT: Duration = Duration::from_secs(20);

/// How long a client waits for the server's answer.
const CLIENT_WAIT: Duration = Duration::from_secs(30);

/// The group given the control socket (`control_group`), looked up at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlGroup {
    pub name: String,
    pub gid: u32,
}

impl ControlGroup {
    /// The group named `name`; an unknown name is an error.
    pub fn lookup(name: &str) -> Result<ControlGroup, String> {
        Ok(ControlGroup {
            name: name.to_owned(),
            gid: tern_sandbox::account::group_id(name)?,
        })
    }
}

/// A bound, listening control socket, not yet served.
#[derive(Debug)]
pub struct ControlSocket {
    socket: Socket,
    path: PathBuf,
}

/// Binds the control socket at `path`, for its owner only or also for the members of
/// `group`: a socket left there by a server that is gone is replaced; one a running server
/// answers on, or any other file, is an error.
pub fn bind(path: &Path, group: Option<&ControlGroup>) -> Result<ControlSocket, String> {
    let shown = path.display();
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                return Err(format!(
                    "control socket {shown}: another server answers on it"
                ));
            }
            std::fs::remove_file(path)
                .map_err(|e| format!("control socket {shown}: cannot remove the old one: {e}"))?;
        }
        Ok(_) => {
            return Err(format!(
                "control socket {shown}: exists and is not a socket"
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("control socket {shown}: {e}")),
    }
    let failed = |e: io::Error| format!("control socket {shown}: {e}");
    let socket = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(failed)?;
    socket
        .bind(&SockAddr::unix(path).map_err(failed)?)
        .map_err(failed)?;
    // Its owner and mode are set before it listens: until then a connect is refused, so no
    // one gets in through the group and mode the umask gave it. The group first, then the
    // mode that lets the group in.
    let mode = match group {
        None => 0o600,
        Some(group) => {
            std::os::unix::fs::chown(path, None, Some(group.gid)).map_err(|e| {
                format!(
                    "control socket {shown}: cannot give it to group {} (control_group): {e} \
                     (unless it starts as root, tern must be a member of the group)",
                    group.name
                )
            })?;
            0o660
        }
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(failed)?;
    socket.listen(16).map_err(failed)?;
    // accept() gives up after this (SO_RCVTIMEO), so the thread sees its stop signal.
    socket.set_read_timeout(Some(STOP_POLL)).map_err(failed)?;
    Ok(ControlSocket {
        socket,
        path: path.to_owned(),
    })
}

impl ControlSocket {
    /// Answers requests, one at a time, until `stop`, handing reloads to `reloads`; then
    /// removes the socket file (if the sandbox lets it: the next start replaces a stale one
    /// anyway).
    pub fn serve(self, reloads: &ReloadRequester, stop: StopSignal) {
        tracing::info!("control socket {}: listening", self.path.display());
        while !stop.is_stopped() {
            match self.socket.accept() {
                Ok((client, _)) => {
                    if let Err(e) = answer_one(client.into(), reloads) {
                        tracing::warn!("control socket: a client failed: {e}");
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => {
                    tracing::error!("control socket: accept failed: {e}");
                    std::thread::sleep(STOP_POLL);
                }
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn answer_one(client: UnixStream, reloads: &ReloadRequester) -> io::Result<()> {
    client.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    client.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut line = String::new();
    let read = BufReader::new((&client).take(MAX_LINE)).read_line(&mut line);
    let answer = match read {
        Ok(_) if !line.ends_with('\n') => {
            "error a request is one line, ending in a newline, of at most 8 KiB".to_owned()
        }
        Ok(_) => match handle(line.trim_end(), reloads) {
            Ok(done) => format!("ok {done}"),
            Err(why) => format!("error {why}"),
        },
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            "error a request is UTF-8 text".to_owned()
        }
        Err(e) => return Err(e),
    };
    (&client).write_all(format!("{answer}\n").as_bytes())
}

/// Carries out one request line; what was done, or why not.
fn handle(line: &str, reloads: &ReloadRequester) -> Result<String, String> {
    if line == "reload" {
        // Its outcome is logged where it runs.
        return reloads.reload(RELOAD_WAIT);
    }
    let outcome = purge(line);
    if let Err(why) = &outcome {
        tracing::warn!("control socket: refused {line:?}: {why}");
    }
    outcome
}

/// A `purge` request line; what was purged, or why nothing was.
fn purge(line: &str) -> Result<String, String> {
    let words: Vec<&str> = line.split(' ').collect();
    let (what, cache) = match words.as_slice() {
        [what @ .., "cache", name] => (what, Some(*name)),
        what => (what, None),
    };
    let asked = match what {
        ["purge", "url", url] => Purge::of_url(url, false)?,
        ["purge", "prefix", prefix] => Purge::of_url(prefix, true)?,
        ["purge", "tag", tag] if !tag.is_empty() => Purge::Tag((*tag).to_owned()),
        ["purge", "all"] => Purge::All,
        _ => {
            return Err(
                "unknown request: reload | purge url URL | purge prefix URL | purge tag TAG | \
                 purge all, each purge with an optional `cache NAME`"
                    .to_owned(),
            )
        }
    };
    let purged = tern_proxy::cache::purge(&asked, cache)?;
    let total: u64 = purged.iter().map(|(_, n)| n).sum();
    let each: Vec<String> = purged
        .iter()
        .map(|(name, n)| format!("{name}: {n}"))
        .collect();
    let done = format!(
        "purged {total} entr{} ({})",
        if total == 1 { "y" } else { "ies" },
        if each.is_empty() {
            "no caches".to_owned()
        } else {
            each.join(", ")
        }
    );
    tracing::info!("cache purge ({}): {done}", &line["purge ".len()..]);
    Ok(done)
}

/// Sends one request line to the server at `path`; its answer, `ok ...` or `error ...`.
pub fn request(path: &Path, line: &str) -> Result<String, String> {
    let shown = path.display();
    let unreachable = |e: io::Error| {
        format!(
            "cannot reach a server's control socket at {shown}: {e} (is `control` set in its config, \
             and is this the user it started as, root, or a member of its `control_group`?)"
        )
    };
    let mut stream = UnixStream::connect(path).map_err(unreachable)?;
    let mut talk = || -> io::Result<String> {
        stream.set_read_timeout(Some(CLIENT_WAIT))?;
        stream.write_all(format!("{line}\n").as_bytes())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer.trim_end().to_owned())
    };
    talk().map_err(|e| format!("control socket {shown}: {e}"))
}

/// [`request`], its answer split: what was done (`ok ...`), or why not (`error ...`, or no
/// answer at all).
pub fn ask(path: &Path, line: &str) -> Result<String, String> {
    let answer = request(path, line)?;
    match answer.split_once(' ') {
        Some(("ok", done)) => Ok(done.to_owned()),
        Some(("error", why)) => Err(why.to_owned()),
        _ if answer.is_empty() => Err(format!(
            "control socket {}: the server closed it without an answer",
            path.display()
        )),
        _ => Err(format!(
            "control socket {}: an answer that is neither ok nor error: {answer:?}",
            path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn requests_that_name_nothing_known_are_refused_with_the_grammar() {
        for bad in [
            "",
            "purge",
            "purge url",
            "purge everything",
            "purge tag ",
            "reload now",
            "reload cache main",
            "purge url a b",
        ] {
            let e = purge(bad).unwrap_err();
            assert!(
                e.contains("unknown request: reload | purge url URL") || e.contains("not an http"),
                "{bad:?}: {e}"
            );
        }
        assert!(purge("purge url https://example.com/%00").is_err());
        assert!(purge("purge all cache no-such-cache")
            .unwrap_err()
            .contains("no cache named"));
    }

    /// Serves `socket` on a thread, its reloads answered by `run` in place of the signal
    /// thread; stopped and joined by the returned closure.
    fn serving(
        socket: ControlSocket,
        run: impl FnMut() -> crate::common::ReloadOutcome + Send + 'static,
    ) -> impl FnOnce() {
        let (requester, queue) = crate::common::reload_queue().unwrap();
        let answering = queue.answer_in_place_of_the_signal_thread(run);
        let stop = StopSignal::default();
        let serving = {
            let stop = stop.clone();
            std::thread::spawn(move || socket.serve(&requester, stop))
        };
        move || {
            stop.raise();
            serving.join().unwrap();
            // The requester went with the serving thread: the answering one ends.
            answering.join().unwrap();
        }
    }

    #[test]
    fn a_socket_answers_a_line_and_refuses_a_second_server_and_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let socket = bind(&path, None).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(bind(&path, None)
            .unwrap_err()
            .contains("another server answers"));
        let stop = serving(socket, || Ok("nothing".into()));
        let answer = request(&path, "purge all").unwrap();
        assert!(answer.starts_with("ok purged "), "{answer}");
        let answer = request(&path, "purge nothing").unwrap();
        assert!(answer.starts_with("error unknown request"), "{answer}");
        assert_eq!(
            ask(&path, "purge nothing").unwrap_err(),
            purge("purge nothing").unwrap_err()
        );
        // A line without its end, then silence: answered when the client gives up writing.
        let mut half = UnixStream::connect(&path).unwrap();
        half.write_all(b"purge all").unwrap();
        half.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        half.read_to_string(&mut answer).unwrap();
        assert!(
            answer.starts_with("error a request is one line"),
            "{answer}"
        );
        stop();
        assert!(!path.exists(), "removed at the end");

        // A stale socket (no server) is replaced; a plain file is not.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        drop(bind(&path, None).unwrap());
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"x").unwrap();
        assert!(bind(&path, None).unwrap_err().contains("not a socket"));
    }

    #[test]
    fn a_reload_request_gets_the_outcome_of_one_reload_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let reloads = Arc::new(AtomicUsize::new(0));
        let stop = {
            let reloads = reloads.clone();
            serving(bind(&path, None).unwrap(), move || {
                match reloads.fetch_add(1, Ordering::SeqCst) {
                    0 => Ok("1 site (2 routes); cached files dropped".into()),
                    _ => Err("config tern.toml: line 3: unknown key \"rooot\"".into()),
                }
            })
        };
        assert_eq!(
            request(&path, "reload").unwrap(),
            "ok 1 site (2 routes); cached files dropped"
        );
        assert_eq!(
            ask(&path, "reload").unwrap_err(),
            "config tern.toml: line 3: unknown key \"rooot\""
        );
        assert_eq!(reloads.load(Ordering::SeqCst), 2);
        // Not a reload: refused without one.
        assert!(request(&path, "reload now")
            .unwrap()
            .starts_with("error unknown request"));
        assert_eq!(reloads.load(Ordering::SeqCst), 2);
        stop();
    }

    #[test]
    fn a_group_socket_is_the_groups_with_mode_0660_and_an_unknown_group_is_refused() {
        assert_eq!(
            ControlGroup::lookup("no-such-group-tern-test").unwrap_err(),
            "no such group: no-such-group-tern-test"
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        // A group this process is in (its own) can always be given, root or not.
        let own = std::fs::metadata(dir.path()).unwrap().gid();
        let group = ControlGroup {
            name: format!("gid {own}"),
            gid: own,
        };
        let socket = bind(&path, Some(&group)).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o660);
        assert_eq!(meta.gid(), own);
        drop(socket);
        // Another group: root may give it; anyone else gets one line naming the cause.
        std::fs::remove_file(&path).unwrap();
        let daemon = ControlGroup::lookup("daemon").unwrap();
        match bind(&path, Some(&daemon)) {
            Ok(_) => {
                assert_eq!(std::fs::metadata(&path).unwrap().gid(), daemon.gid);
            }
            Err(e) => assert!(
                e.contains("cannot give it to group daemon (control_group)"),
                "{e}"
            ),
        }
    }
}
