//! Password checks, run on the gate's pool threads (never on a worker): htpasswd-style files
//! with bcrypt or argon2id hashes, and exec'd programs.
//!
//! An unknown user costs the same hash as a known one (the password is checked against a
//! real entry of the same file and the answer thrown away), so response times do not tell
//! which names exist. Hash comparisons are the crates' own constant-time ones.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::{CheckerSpec, RealmConfig};

/// What the realm's checkers said about a user and password.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Accepted,
    Refused,
    /// No checker could give an answer (unreadable file, program missing or timed out): the
    /// login is refused, and the reason logged for the operator.
    Unavailable(String),
}

/// Tries the realm's password checkers in order; the first that accepts wins. `helpers`
/// runs the `exec:` ones when the server is sandboxed (see [`ExecHelpers`]).
pub fn check(
    realm: &RealmConfig,
    user: &str,
    password: &[u8],
    helpers: Option<&ExecHelpers>,
) -> Verdict {
    // Checked here too, not only by the login form: an `exec:` program gets the name as its
    // argument, where "--help" or "-c" would be an option.
    if !valid_user(user) {
        return Verdict::Refused;
    }
    let mut trouble = None;
    for checker in &realm.checkers {
        let outcome = match checker {
            CheckerSpec::File(path) => check_file(path, user, password),
            CheckerSpec::Exec(program) => match helpers {
                Some(h) => h.check(program, user, password, realm.exec_timeout),
                None => check_exec(program, user, password, realm.exec_timeout),
            },
            CheckerSpec::GuestPow => continue,
        };
        match outcome {
            Verdict::Accepted => return Verdict::Accepted,
            Verdict::Refused => {}
            Verdict::Unavailable(why) => trouble = Some(why),
        }
    }
    match trouble {
        Some(why) => Verdict::Unavailable(why),
        None => Verdict::Refused,
    }
}

/// A bcrypt hash at the default cost, made once: what an unknown user is checked against
/// when the file has no entry to borrow.
fn fallback_hash() -> &'static str {
    static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HASH.get_or_init(|| {
        bcrypt::hash("no user has this password", bcrypt::DEFAULT_COST).unwrap_or_default()
    })
}

fn check_file(path: &Path, user: &str, password: &[u8]) -> Verdict {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return Verdict::Unavailable(format!("cannot read {}: {e}", path.display())),
    };
    let mut first_hash: Option<String> = None;
    let mut found: Option<String> = None;
    for line in std::io::BufReader::new(file).lines() {
        let Ok(line) = line else {
            return Verdict::Unavailable(format!("cannot read {}", path.display()));
        };
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, hash)) = line.split_once(':') else {
            continue;
        };
        // htpasswd files may carry more fields after the hash.
        let hash = hash.split(':').next().unwrap_or("");
        if first_hash.is_none() && is_supported(hash) {
            first_hash = Some(hash.to_string());
        }
        if name == user {
            found = Some(hash.to_string());
            break;
        }
    }
    match found {
        Some(hash) if is_supported(&hash) => {
            if verify_hash(&hash, password) {
                Verdict::Accepted
            } else {
                Verdict::Refused
            }
        }
        Some(_) => Verdict::Unavailable(format!(
            "{}: the entry for {user:?} is not a bcrypt or argon2id hash",
            path.display()
        )),
        None => {
            // Same cost as a real user: the answer is ignored.
            let decoy = match &first_hash {
                Some(h) => h.as_str(),
                None => fallback_hash(),
            };
            let _ = verify_hash(decoy, password);
            Verdict::Refused
        }
    }
}

fn is_supported(hash: &str) -> bool {
    hash.starts_with("$2a$")
        || hash.starts_with("$2b$")
        || hash.starts_with("$2y$")
        || hash.starts_with("$argon2id$")
}

fn verify_hash(hash: &str, password: &[u8]) -> bool {
    if hash.starts_with("$argon2id$") {
        use argon2::password_hash::{PasswordHash, PasswordVerifier};
        return match PasswordHash::new(hash) {
            Ok(parsed) => argon2::Argon2::default()
                .verify_password(password, &parsed)
                .is_ok(),
            Err(_) => false,
        };
    }
    bcrypt::verify(password, hash).unwrap_or(false)
}

/// `exec:` checkers for a sandboxed server, whose seccomp filter forbids starting programs:
/// small helper processes (`tern gate-exec-helper`), started before the sandbox as the
/// account tern runs as, run them instead. A helper runs only the programs it was given at
/// start, by index, so a compromised worker cannot make it run anything else. One helper per
/// pool thread; a request and its answer are length-prefixed on the helper's stdin/stdout.
pub struct ExecHelpers {
    programs: Vec<PathBuf>,
    idle: Mutex<Vec<Helper>>,
}

struct Helper {
    child: Child,
    to: ChildStdin,
    from: ChildStdout,
}

impl ExecHelpers {
    /// Starts `count` helpers with `command` (the program and its arguments, account
    /// settings included), each told `programs`.
    pub fn start(
        programs: Vec<PathBuf>,
        count: usize,
        mut command: impl FnMut() -> Command,
    ) -> std::io::Result<ExecHelpers> {
        let mut idle = Vec::with_capacity(count);
        for _ in 0..count.max(1) {
            let mut cmd = command();
            for p in &programs {
                cmd.arg(p);
            }
            let mut child = cmd
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()?;
            let to = child.stdin.take().expect("piped stdin");
            let from = child.stdout.take().expect("piped stdout");
            idle.push(Helper { child, to, from });
        }
        Ok(ExecHelpers {
            programs,
            idle: Mutex::new(idle),
        })
    }

    fn check(&self, program: &Path, user: &str, password: &[u8], timeout: Duration) -> Verdict {
        let Some(index) = self.programs.iter().position(|p| p == program) else {
            return Verdict::Unavailable(format!(
                "{} was not given to the exec helpers at start-up (restart tern to add it)",
                program.display()
            ));
        };
        let helper = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let Some(mut helper) = helper else {
            return Verdict::Unavailable("no exec helper is free".into());
        };
        let answer = ask(&mut helper, index, user, password, timeout);
        if answer.is_ok() {
            self.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(helper);
        } else {
            // Out of step or gone: never reuse it.
            let _ = helper.child.kill();
            let _ = helper.child.wait();
        }
        answer.unwrap_or_else(|e| Verdict::Unavailable(format!("exec helper: {e}")))
    }
}

fn ask(
    helper: &mut Helper,
    index: usize,
    user: &str,
    password: &[u8],
    timeout: Duration,
) -> std::io::Result<Verdict> {
    let mut request = Vec::with_capacity(16 + user.len() + password.len());
    request.extend_from_slice(&(index as u32).to_be_bytes());
    request.extend_from_slice(&(timeout.as_millis() as u32).to_be_bytes());
    request.extend_from_slice(&(user.len() as u32).to_be_bytes());
    request.extend_from_slice(user.as_bytes());
    request.extend_from_slice(&(password.len() as u32).to_be_bytes());
    request.extend_from_slice(password);
    helper.to.write_all(&request)?;
    helper.to.flush()?;
    let mut head = [0u8; 5];
    helper.from.read_exact(&mut head)?;
    let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
    if len > 4096 {
        return Err(std::io::Error::other("answer too long"));
    }
    let mut message = vec![0u8; len];
    helper.from.read_exact(&mut message)?;
    Ok(match head[0] {
        0 => Verdict::Accepted,
        1 => Verdict::Refused,
        _ => Verdict::Unavailable(String::from_utf8_lossy(&message).into_owned()),
    })
}

/// The helper's side (`tern gate-exec-helper PROGRAM...`): answers requests on stdin until
/// it closes (the server is gone).
pub fn exec_helper_main(programs: &[PathBuf]) -> std::io::Result<()> {
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    loop {
        let mut head = [0u8; 12];
        match input.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let index = u32::from_be_bytes(head[0..4].try_into().unwrap()) as usize;
        let timeout = Duration::from_millis(u64::from(u32::from_be_bytes(
            head[4..8].try_into().unwrap(),
        )));
        let user_len = u32::from_be_bytes(head[8..12].try_into().unwrap()) as usize;
        if user_len > 64 {
            return Err(std::io::Error::other("user name too long"));
        }
        let mut user = vec![0u8; user_len];
        input.read_exact(&mut user)?;
        let mut len = [0u8; 4];
        input.read_exact(&mut len)?;
        let password_len = u32::from_be_bytes(len) as usize;
        if password_len > 4096 {
            return Err(std::io::Error::other("password too long"));
        }
        let mut password = vec![0u8; password_len];
        input.read_exact(&mut password)?;
        let user = String::from_utf8_lossy(&user);
        let verdict = match programs.get(index) {
            Some(program) if valid_user(&user) => check_exec(
                program,
                &user,
                &password,
                timeout.min(Duration::from_secs(60)),
            ),
            Some(_) => Verdict::Refused,
            None => Verdict::Unavailable(format!("no program {index}")),
        };
        let (code, message) = match verdict {
            Verdict::Accepted => (0u8, String::new()),
            Verdict::Refused => (1, String::new()),
            Verdict::Unavailable(why) => (2, why),
        };
        let message = &message.as_bytes()[..message.len().min(4096)];
        let mut answer = vec![code];
        answer.extend_from_slice(&(message.len() as u32).to_be_bytes());
        answer.extend_from_slice(message);
        output.write_all(&answer)?;
        output.flush()?;
    }
}

/// Runs `program USER` with the password on stdin; exit status 0 accepts. The program gets
/// an empty environment, and is killed when it outlives `timeout`.
fn check_exec(program: &Path, user: &str, password: &[u8], timeout: Duration) -> Verdict {
    let mut child = match Command::new(program)
        .arg(user)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return Verdict::Unavailable(format!("cannot run {}: {e}", program.display())),
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A program that exits without reading gives EPIPE: its exit status still decides.
        let _ = stdin.write_all(password);
        let _ = stdin.write_all(b"\n");
    }
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Verdict::Accepted,
            Ok(Some(_)) => return Verdict::Refused,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Verdict::Unavailable(format!(
                    "{} took longer than {} ms and was killed",
                    program.display(),
                    timeout.as_millis()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Verdict::Unavailable(format!("{}: {e}", program.display())),
        }
    }
}

/// An argon2id hash (the crate's recommended parameters, a random salt) for a `file:` line.
pub fn hash_password(password: &str) -> Result<String, String> {
    use argon2::password_hash::{PasswordHasher, SaltString};
    let mut salt = [0u8; 16];
    aws_lc_rs::rand::fill(&mut salt).map_err(|_| "no random numbers for a salt".to_string())?;
    let salt = SaltString::encode_b64(&salt).map_err(|e| e.to_string())?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| format!("cannot hash: {e}"))
}

/// Whether a user name can be checked at all: 1 to 64 bytes, no control characters, no ':'
/// (the file separator), and no leading '-', so an `exec:` program, which gets the name as
/// its only argument, can never take it for an option. (No `--` goes before it: that would
/// move the name to argv[2] and break every checker written for `PROGRAM USER`.)
pub fn valid_user(user: &str) -> bool {
    !user.is_empty()
        && user.len() <= 64
        && !user.starts_with('-')
        && !user.chars().any(|c| c.is_control() || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn realm(checkers: Vec<CheckerSpec>) -> RealmConfig {
        RealmConfig {
            name: "staff".into(),
            checkers,
            guest_difficulty: 16,
            exec_timeout: Duration::from_millis(500),
            version: 1,
        }
    }

    #[test]
    fn file_checker_takes_bcrypt_and_argon2id() {
        use argon2::password_hash::{PasswordHasher, SaltString};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users");
        let bcrypt_hash = bcrypt::hash("hunter2", 4).unwrap();
        let salt = SaltString::encode_b64(b"saltsaltsaltsalt").unwrap();
        let argon_hash = argon2::Argon2::default()
            .hash_password(b"correct horse", &salt)
            .unwrap()
            .to_string();
        std::fs::write(
            &path,
            format!("# staff\nalice:{bcrypt_hash}\nbob:{argon_hash}:Bob B.\ncarol:$apr1$x$y\n"),
        )
        .unwrap();
        let r = realm(vec![CheckerSpec::File(path)]);
        assert_eq!(check(&r, "alice", b"hunter2", None), Verdict::Accepted);
        assert_eq!(check(&r, "alice", b"hunter3", None), Verdict::Refused);
        assert_eq!(check(&r, "bob", b"correct horse", None), Verdict::Accepted);
        assert_eq!(check(&r, "bob", b"hunter2", None), Verdict::Refused);
        assert_eq!(check(&r, "mallory", b"hunter2", None), Verdict::Refused);
        assert!(matches!(
            check(&r, "carol", b"x", None),
            Verdict::Unavailable(_)
        ));
        let missing = realm(vec![CheckerSpec::File(dir.path().join("nope"))]);
        assert!(matches!(
            check(&missing, "alice", b"x", None),
            Verdict::Unavailable(_)
        ));
    }

    #[test]
    fn exec_checker_gets_user_and_password_and_is_killed_when_slow() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("check");
        std::fs::write(
            &script,
            "#!/bin/sh\nread pw\n[ \"$1\" = alice ] && [ \"$pw\" = s3cret ]\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let r = realm(vec![CheckerSpec::Exec(script)]);
        assert_eq!(check(&r, "alice", b"s3cret", None), Verdict::Accepted);
        assert_eq!(check(&r, "alice", b"wrong", None), Verdict::Refused);
        assert_eq!(check(&r, "bob", b"s3cret", None), Verdict::Refused);
        let slow = dir.path().join("slow");
        std::fs::write(&slow, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
        let r = realm(vec![CheckerSpec::Exec(slow)]);
        let started = Instant::now();
        assert!(matches!(
            check(&r, "alice", b"x", None),
            Verdict::Unavailable(_)
        ));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "killed, not waited for"
        );
    }

    #[test]
    fn a_user_name_never_reaches_a_program_as_an_option() {
        // A program that, like many, takes options: "-a" or "--help" accepts whoever asks.
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("check");
        std::fs::write(
            &script,
            "#!/bin/sh\ncase \"$1\" in -*) exit 0;; esac\nread pw\n[ \"$1\" = alice ] && [ \"$pw\" = s3cret ]\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let r = realm(vec![CheckerSpec::Exec(script)]);
        for user in ["--help", "-c", "-", "--"] {
            assert_eq!(check(&r, user, b"x", None), Verdict::Refused, "{user}");
        }
        assert_eq!(check(&r, "alice", b"s3cret", None), Verdict::Accepted);
        assert_eq!(
            check(&r, "al-ice", b"s3cret", None),
            Verdict::Refused,
            "a dash inside a name is only a name"
        );
    }

    #[test]
    fn checkers_are_tried_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("users");
        std::fs::write(
            &path,
            format!("alice:{}\n", bcrypt::hash("one", 4).unwrap()),
        )
        .unwrap();
        let script = dir.path().join("check");
        std::fs::write(&script, "#!/bin/sh\nread pw\n[ \"$pw\" = two ]\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let r = realm(vec![
            CheckerSpec::GuestPow,
            CheckerSpec::File(path),
            CheckerSpec::Exec(script),
        ]);
        assert_eq!(check(&r, "alice", b"one", None), Verdict::Accepted);
        assert_eq!(check(&r, "alice", b"two", None), Verdict::Accepted);
        assert_eq!(check(&r, "alice", b"three", None), Verdict::Refused);
    }

    #[test]
    fn made_hashes_check() {
        let hash = hash_password("pa ss").unwrap();
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_hash(&hash, b"pa ss"));
        assert!(!verify_hash(&hash, b"pass"));
        assert_ne!(hash, hash_password("pa ss").unwrap(), "salted");
    }

    #[test]
    fn user_names() {
        assert!(valid_user("alice"));
        assert!(valid_user("Ünïcode"));
        assert!(!valid_user(""));
        assert!(!valid_user("a:b"));
        assert!(!valid_user("a\nb"));
        assert!(!valid_user(&"x".repeat(65)));
        assert!(!valid_user("-alice"));
        assert!(valid_user("alice-b"));
    }
}
