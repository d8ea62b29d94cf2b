//! The control socket (`control = PATH` in `tern run`'s file): a local Unix socket the
//! operator's commands reach the running server through, never the network. Today it takes
//! `tern cache purge`; nothing an HTTP client sends can purge.
//!
//! Made at start, before privileges are dropped and the sandbox is on: owned by the user tern
//! starts as, mode 0600 (root or that user may use it). One request line per connection,
//! one answer line back (`ok ...` or `error ...`):
//!
//! ```text
//! purge url https://example.com/blog/post?p=1 [cache NAME]
//! purge prefix https://example.com/blog/      [cache NAME]   (or a path alone: /blog/)
//! purge tag product-42                        [cache NAME]
//! purge all                                   [cache NAME]
//! ```

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use socket2::{Domain, SockAddr, Socket, Type};
use tern_cache::Purge;
use tern_server::StopSignal;

/// The path `tern cache purge` tries when given none (the Debian package's config names it).
pub const DEFAULT_PATH: &str = "/run/tern/control.sock";

/// The longest request line taken.
const MAX_LINE: u64 = 8 * 1024;

/// How long one client may take to send its line and read the answer: the thread serves one
/// at a time, so a client that stalls holds the others up for at most this.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// How often the accepting thread looks at its stop signal.
const STOP_POLL: Duration = Duration::from_millis(250);

/// A bound, listening control socket, not yet served.
#[derive(Debug)]
pub struct ControlSocket {
    socket: Socket,
    path: PathBuf,
}

/// Binds the control socket at `path`: a socket left there by a server that is gone is
/// replaced; one a running server answers on, or any other file, is an error.
pub fn bind(path: &Path) -> Result<ControlSocket, String> {
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
    let bound = || -> io::Result<Socket> {
        let socket = Socket::new(Domain::UNIX, Type::STREAM, None)?;
        socket.bind(&SockAddr::unix(path)?)?;
        // Private before it listens: until then a connect is refused, so no one gets in
        // through the mode the umask gave it.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        socket.listen(16)?;
        // accept() gives up after this (SO_RCVTIMEO), so the thread sees its stop signal.
        socket.set_read_timeout(Some(STOP_POLL))?;
        Ok(socket)
    };
    let socket = bound().map_err(|e| format!("control socket {shown}: {e}"))?;
    Ok(ControlSocket {
        socket,
        path: path.to_owned(),
    })
}

impl ControlSocket {
    /// Answers requests, one at a time, until `stop`; then removes the socket file (if the
    /// sandbox lets it: the next start replaces a stale one anyway).
    pub fn serve(self, stop: StopSignal) {
        tracing::info!("control socket {}: listening", self.path.display());
        while !stop.is_stopped() {
            match self.socket.accept() {
                Ok((client, _)) => {
                    if let Err(e) = answer_one(client.into()) {
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

fn answer_one(client: UnixStream) -> io::Result<()> {
    client.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    client.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut line = String::new();
    let read = BufReader::new((&client).take(MAX_LINE)).read_line(&mut line);
    let answer = match read {
        Ok(_) if !line.ends_with('\n') => {
            "error a request is one line, ending in a newline, of at most 8 KiB".to_owned()
        }
        Ok(_) => match handle(line.trim_end()) {
            Ok(done) => format!("ok {done}"),
            Err(why) => {
                tracing::warn!("control socket: refused {:?}: {why}", line.trim_end());
                format!("error {why}")
            }
        },
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            "error a request is UTF-8 text".to_owned()
        }
        Err(e) => return Err(e),
    };
    (&client).write_all(format!("{answer}\n").as_bytes())
}

/// Carries out one request line; what was done, or why not.
fn handle(line: &str) -> Result<String, String> {
    let words: Vec<&str> = line.split(' ').collect();
    let (what, cache) = match words.as_slice() {
        [what @ .., "cache", name] => (what, Some(*name)),
        what => (what, None),
    };
    let purge =
        match what {
            ["purge", "url", url] => Purge::of_url(url, false)?,
            ["purge", "prefix", prefix] => Purge::of_url(prefix, true)?,
            ["purge", "tag", tag] if !tag.is_empty() => Purge::Tag((*tag).to_owned()),
            ["purge", "all"] => Purge::All,
            _ => return Err(
                "unknown request: purge url URL | purge prefix URL | purge tag TAG | purge all, \
                 each with an optional `cache NAME`"
                    .to_owned(),
            ),
        };
    let purged = tern_proxy::cache::purge(&purge, cache)?;
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
             and is this the user it started as, or root?)"
        )
    };
    let mut stream = UnixStream::connect(path).map_err(unreachable)?;
    let mut talk = || -> io::Result<String> {
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        stream.write_all(format!("{line}\n").as_bytes())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer.trim_end().to_owned())
    };
    talk().map_err(|e| format!("control socket {shown}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_that_name_nothing_known_are_refused_with_the_grammar() {
        for bad in [
            "",
            "purge",
            "purge url",
            "purge everything",
            "purge tag ",
            "reload now",
            "purge url a b",
        ] {
            let e = handle(bad).unwrap_err();
            assert!(
                e.contains("unknown request") || e.contains("not an http"),
                "{bad:?}: {e}"
            );
        }
        assert!(handle("purge url https://example.com/%00").is_err());
        assert!(handle("purge all cache no-such-cache")
            .unwrap_err()
            .contains("no cache named"));
    }

    #[test]
    fn a_socket_answers_a_line_and_refuses_a_second_server_and_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let socket = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(bind(&path).unwrap_err().contains("another server answers"));
        let stop = StopSignal::default();
        let serving = {
            let stop = stop.clone();
            std::thread::spawn(move || socket.serve(stop))
        };
        let answer = request(&path, "purge all").unwrap();
        assert!(answer.starts_with("ok purged "), "{answer}");
        let answer = request(&path, "purge nothing").unwrap();
        assert!(answer.starts_with("error unknown request"), "{answer}");
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
        stop.raise();
        serving.join().unwrap();
        assert!(!path.exists(), "removed at the end");

        // A stale socket (no server) is replaced; a plain file is not.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        drop(bind(&path).unwrap());
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"x").unwrap();
        assert!(bind(&path).unwrap_err().contains("not a socket"));
    }
}
