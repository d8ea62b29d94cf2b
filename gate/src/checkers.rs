//! Password checks, run on the gate's pool threads (never on a worker): htpasswd-style files
//! with bcrypt or argon2id hashes, and exec'd programs.
//!
//! An unknown user costs the same hash as a known one (the password is checked against a
//! real entry of the same file and the answer thrown away), so response times do not tell
//! which names exist. Hash comparisons are the crates' own constant-time ones.

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, Stdio};
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

/// Tries the realm's password checkers in order; the first that accepts wins.
pub fn check(realm: &RealmConfig, user: &str, password: &[u8]) -> Verdict {
    let mut trouble = None;
    for checker in &realm.checkers {
        let outcome = match checker {
            CheckerSpec::File(path) => check_file(path, user, password),
            CheckerSpec::Exec(program) => check_exec(program, user, password, realm.exec_timeout),
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

/// Whether a user name can be checked at all: 1 to 64 bytes, no control characters and no
/// ':' (the file separator).
pub fn valid_user(user: &str) -> bool {
    !user.is_empty() && user.len() <= 64 && !user.chars().any(|c| c.is_control() || c == ':')
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
        assert_eq!(check(&r, "alice", b"hunter2"), Verdict::Accepted);
        assert_eq!(check(&r, "alice", b"hunter3"), Verdict::Refused);
        assert_eq!(check(&r, "bob", b"correct horse"), Verdict::Accepted);
        assert_eq!(check(&r, "bob", b"hunter2"), Verdict::Refused);
        assert_eq!(check(&r, "mallory", b"hunter2"), Verdict::Refused);
        assert!(matches!(check(&r, "carol", b"x"), Verdict::Unavailable(_)));
        let missing = realm(vec![CheckerSpec::File(dir.path().join("nope"))]);
        assert!(matches!(
            check(&missing, "alice", b"x"),
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
        assert_eq!(check(&r, "alice", b"s3cret"), Verdict::Accepted);
        assert_eq!(check(&r, "alice", b"wrong"), Verdict::Refused);
        assert_eq!(check(&r, "bob", b"s3cret"), Verdict::Refused);
        let slow = dir.path().join("slow");
        std::fs::write(&slow, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
        let r = realm(vec![CheckerSpec::Exec(slow)]);
        let started = Instant::now();
        assert!(matches!(check(&r, "alice", b"x"), Verdict::Unavailable(_)));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "killed, not waited for"
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
        assert_eq!(check(&r, "alice", b"one"), Verdict::Accepted);
        assert_eq!(check(&r, "alice", b"two"), Verdict::Accepted);
        assert_eq!(check(&r, "alice", b"three"), Verdict::Refused);
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
    }
}
