//! Where tern's own lines go: log events on stderr (text, or JSON with `--log-format json`),
//! the start-up line on stdout in the same format, and, when a stream is connected to the
//! systemd journal (`JOURNAL_STREAM` names it), each line prefixed with its syslog level
//! (`<3>` error, `<4>` warning, `<6>` info, `<7>` debug) so that `journalctl -p warning` finds
//! warnings and errors. journald strips the prefix (`SyslogLevelPrefix=yes`, the default), so
//! the JSON stays intact.

use std::io::{IsTerminal, Write};
use std::os::fd::AsFd;
use std::sync::OnceLock;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::MakeWriter;

/// `--log-format`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// What [`init`] found: the format, and which streams are the journal.
#[derive(Clone, Copy)]
struct Output {
    format: LogFormat,
    stdout_is_journal: bool,
    stderr_is_journal: bool,
}

static OUTPUT: OnceLock<Output> = OnceLock::new();

/// Sets up the log subscriber. Call once, first thing in `main`.
pub fn init(format: LogFormat) {
    let journal = std::env::var("JOURNAL_STREAM").ok();
    let is_journal = |fd: std::os::fd::BorrowedFd<'_>| {
        journal
            .as_deref()
            .is_some_and(|stream| names_stream(stream, fd))
    };
    let output = Output {
        format,
        stdout_is_journal: is_journal(std::io::stdout().as_fd()),
        stderr_is_journal: is_journal(std::io::stderr().as_fd()),
    };
    let _ = OUTPUT.set(output);
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TERN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(Stderr {
            journal: output.stderr_is_journal,
        })
        // Colour codes only for a person at a terminal, never into journals and log files.
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    match format {
        LogFormat::Text => logs.init(),
        // The event's fields (message included) at the top level of each object.
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
}

/// Whether `JOURNAL_STREAM` (`DEVICE:INODE`, as systemd sets it) names the stream on `fd`.
fn names_stream(journal_stream: &str, fd: std::os::fd::BorrowedFd<'_>) -> bool {
    let Some((dev, ino)) = journal_stream.split_once(':') else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    use std::os::unix::fs::MetadataExt;
    let Ok(owned) = fd.try_clone_to_owned() else {
        return false;
    };
    std::fs::File::from(owned)
        .metadata()
        .is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

/// The syslog level journald reads from a `<N>` prefix.
fn syslog_level(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// Writes one event on stderr; with `journal`, its level first.
struct Stderr {
    journal: bool,
}

impl<'a> MakeWriter<'a> for Stderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        self.make_line(&Level::INFO)
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Line {
        self.make_line(meta.level())
    }
}

impl Stderr {
    fn make_line(&self, level: &Level) -> Line {
        let mut buf = Vec::with_capacity(256);
        if self.journal {
            let _ = write!(buf, "<{}>", syslog_level(level));
        }
        Line { buf }
    }
}

/// One event, written to stderr in one call when dropped (so that the prefix and the line
/// are never split by another thread's line).
struct Line {
    buf: Vec<u8>,
}

impl Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        let _ = std::io::stderr().lock().write_all(&self.buf);
    }
}

/// Prints the start-up line on stdout: as it is in text, or as the JSON object of any other
/// info event (`timestamp`, `level`, `message`) with `--log-format json`.
pub fn print_startup_line(line: &str) {
    let output = OUTPUT.get().copied().unwrap_or(Output {
        format: LogFormat::Text,
        stdout_is_journal: false,
        stderr_is_journal: false,
    });
    let text = match output.format {
        LogFormat::Text => line.to_string(),
        LogFormat::Json => json_line("INFO", line),
    };
    let prefix = if output.stdout_is_journal { "<6>" } else { "" };
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{prefix}{text}");
    let _ = stdout.flush();
}

/// The reason tern stopped, as its last line on stderr: an error event in JSON, else
/// `tern: MESSAGE`; with the journal level for an error either way.
pub fn print_fatal(message: &str) {
    let output = OUTPUT.get().copied();
    if output.is_some_and(|o| o.format == LogFormat::Json) {
        // A log shipper reads stderr as JSON lines: the reason tern stopped is one too.
        tracing::error!("tern: {message}");
        return;
    }
    let prefix = if output.is_some_and(|o| o.stderr_is_journal) {
        "<3>"
    } else {
        ""
    };
    let _ = writeln!(std::io::stderr().lock(), "{prefix}tern: {message}");
}

/// A JSON log object as tracing-subscriber writes one (same timestamp format and keys).
fn json_line(level: &str, message: &str) -> String {
    let mut timestamp = String::new();
    let _ = tracing_subscriber::fmt::time::SystemTime.format_time(
        &mut tracing_subscriber::fmt::format::Writer::new(&mut timestamp),
    );
    // Keys in tracing's order (serde_json's map would sort them).
    let quoted = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "{{\"timestamp\":{},\"level\":{},\"message\":{}}}",
        quoted(&timestamp),
        quoted(level),
        quoted(message)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_names_the_stream_by_device_and_inode() {
        use std::os::unix::fs::MetadataExt;
        let file = tempfile::tempfile().unwrap();
        let (dev, ino) = (
            file.metadata().unwrap().dev(),
            file.metadata().unwrap().ino(),
        );
        assert!(names_stream(&format!("{dev}:{ino}"), file.as_fd()));
        assert!(!names_stream(&format!("{dev}:{}", ino + 1), file.as_fd()));
        assert!(!names_stream("", file.as_fd()));
        assert!(!names_stream("x:y", file.as_fd()));
    }

    #[test]
    fn json_start_up_line_is_an_info_event() {
        let v: serde_json::Value = serde_json::from_str(&json_line("INFO", "tern: up")).unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["message"], "tern: up");
        assert!(v["timestamp"].as_str().unwrap().ends_with('Z'));
        let quoted = json_line("WARN", "a \"quoted\"\nline");
        assert!(quoted.starts_with("{\"timestamp\":"), "{quoted}");
        let v: serde_json::Value = serde_json::from_str(&quoted).unwrap();
        assert_eq!(v["message"], "a \"quoted\"\nline");
    }
}
