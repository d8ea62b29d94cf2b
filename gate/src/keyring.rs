//! The signing keys: a 0600 file of keys, the newest current, older ones still verifying.
//!
//! One line per key: `<key id> <active from, unix seconds> <64 hex digits>`; `#` starts a
//! comment. A rotated-in key is written `ACTIVATION_DELAY` before it becomes active.
//! Keys are rotated on a schedule and kept long enough that every token signed with an old key
//! expires before the key is dropped, so rotation never logs anyone out. Several nodes may
//! share the file: rotation happens under `flock`, re-reading the file first, so it happens
//! once. Every MAC is HMAC-SHA256 over a purpose byte and the data, truncated to 128 bits: a
//! token of one kind can never pass as another.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::hmac;

/// Bytes of a MAC (HMAC-SHA256 truncated to 128 bits).
pub const TAG_LEN: usize = 16;

/// A new key is written this long before it starts signing, so every node sharing the file
/// (each re-reads it at least every 30 s) knows it before any token signed with it arrives.
pub const ACTIVATION_DELAY: u64 = 120;

/// What a MAC is for; its byte goes first into every MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    Session = 1,
    Challenge = 2,
    Csrf = 3,
}

/// When keys change: a new current key every `rotate_every`; a replaced key keeps verifying
/// for `keep_for`, which must be at least the longest lifetime of anything it signs.
#[derive(Debug, Clone)]
pub struct Rotation {
    pub rotate_every: Duration,
    pub keep_for: Duration,
}

#[derive(Debug)]
pub enum KeyringError {
    Io(std::io::Error),
    /// Group or others may read or write the file.
    Exposed(u32),
    Malformed {
        line: usize,
        why: &'static str,
    },
    Empty,
}

impl fmt::Display for KeyringError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyringError::Io(e) => write!(f, "{e}"),
            KeyringError::Exposed(mode) => write!(
                f,
                "mode {mode:o} lets others read or change the signing keys; chmod 600 it"
            ),
            KeyringError::Malformed { line, why } => write!(f, "line {line}: {why}"),
            KeyringError::Empty => write!(f, "the file holds no key"),
        }
    }
}

impl From<std::io::Error> for KeyringError {
    fn from(e: std::io::Error) -> Self {
        KeyringError::Io(e)
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum MacError {
    UnknownKey,
    BadMac,
}

struct Key {
    id: u32,
    created: u64,
    hmac: hmac::Key,
}

/// The keys in force; cheap to share behind an `Arc`, swapped whole when the file changes.
pub struct Keyring {
    /// Newest first; the newest already active signs.
    keys: Vec<Key>,
    rotate_every: u64,
}

impl Keyring {
    /// Keys of tests and benches: (id, created, secret).
    pub fn from_keys(keys: Vec<(u32, u64, [u8; 32])>) -> Keyring {
        let mut keys: Vec<Key> = keys
            .into_iter()
            .map(|(id, created, secret)| Key {
                id,
                created,
                hmac: hmac::Key::new(hmac::HMAC_SHA256, &secret),
            })
            .collect();
        keys.sort_by(|a, b| b.created.cmp(&a.created).then(b.id.cmp(&a.id)));
        Keyring {
            keys,
            rotate_every: u64::MAX,
        }
    }

    /// Opens the key file, creating it with one fresh key (mode 0600) if missing, and rotates
    /// it if the current key is older than `rotate_every`.
    pub fn load_or_create(
        path: &Path,
        rotation: &Rotation,
        now: u64,
    ) -> Result<Keyring, KeyringError> {
        if !path.exists() {
            create_whole(path, &render(&[(1, now, random_secret()?)]))?;
        }
        let mut file = OpenOptions::new().read(true).write(true).open(path)?;
        let mode = file.metadata()?.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyringError::Exposed(mode));
        }
        let rotate_every = rotation.rotate_every.as_secs().max(1);
        let mut keys = parse(&read_all(&mut file)?)?;
        if now >= newest(&keys) + rotate_every {
            // Another node may be rotating the same file: take the lock, read again, and
            // rotate only if it is still due.
            lock(&file)?;
            keys = parse(&read_all(&mut file)?)?;
            if now >= newest(&keys) + rotate_every {
                let next = keys.iter().map(|k| k.0).max().unwrap_or(0) + 1;
                let keep_until = rotate_every + rotation.keep_for.as_secs();
                keys.retain(|k| k.1 + keep_until > now);
                keys.push((next, now + ACTIVATION_DELAY, random_secret()?));
                write_keys(path, &mut file, &render(&keys))?;
            }
            // Closing the file drops the lock.
        }
        let mut ring = Keyring::from_keys(keys);
        ring.rotate_every = rotate_every;
        Ok(ring)
    }

    /// The key that signs at `now`: the newest whose activation time has come (the oldest
    /// if none has, which only a clock set back can cause).
    fn signing_key(&self, now: u64) -> &Key {
        self.keys
            .iter()
            .find(|k| k.created <= now)
            .unwrap_or(&self.keys[self.keys.len() - 1])
    }

    pub fn current_kid(&self) -> u32 {
        self.signing_key(unix_now()).id
    }

    /// The signing key as of now, fixed: its id goes into a token before the token is signed
    /// with it.
    pub fn signer(&self) -> Signer<'_> {
        Signer {
            key: self.signing_key(unix_now()),
        }
    }

    /// Unix seconds when the current key is due to be replaced.
    pub fn next_rotation(&self) -> u64 {
        self.keys[0].created.saturating_add(self.rotate_every)
    }

    /// MACs `data` for `purpose` with the current key.
    pub fn sign(&self, purpose: Purpose, data: &[u8]) -> (u32, [u8; TAG_LEN]) {
        self.sign_at(purpose, data, unix_now())
    }

    /// [`sign`](Self::sign) as at `now`.
    pub fn sign_at(&self, purpose: Purpose, data: &[u8], now: u64) -> (u32, [u8; TAG_LEN]) {
        let key = self.signing_key(now);
        (key.id, mac(&key.hmac, purpose, data))
    }

    /// Checks `tag` over `data` with key `kid`, in constant time; allocates nothing.
    pub fn verify(
        &self,
        purpose: Purpose,
        kid: u32,
        data: &[u8],
        tag: &[u8],
    ) -> Result<(), MacError> {
        let key = self
            .keys
            .iter()
            .find(|k| k.id == kid)
            .ok_or(MacError::UnknownKey)?;
        let expected = mac(&key.hmac, purpose, data);
        aws_lc_rs::constant_time::verify_slices_are_equal(&expected, tag)
            .map_err(|_| MacError::BadMac)
    }

    /// The key ids in force, newest first.
    pub fn kids(&self) -> Vec<u32> {
        self.keys.iter().map(|k| k.id).collect()
    }
}

/// One key chosen to sign (see [`Keyring::signer`]).
pub struct Signer<'k> {
    key: &'k Key,
}

impl Signer<'_> {
    pub fn kid(&self) -> u32 {
        self.key.id
    }

    pub fn sign(&self, purpose: Purpose, data: &[u8]) -> [u8; TAG_LEN] {
        mac(&self.key.hmac, purpose, data)
    }
}

fn mac(key: &hmac::Key, purpose: Purpose, data: &[u8]) -> [u8; TAG_LEN] {
    let mut ctx = hmac::Context::with_key(key);
    ctx.update(&[purpose as u8]);
    ctx.update(data);
    let full = ctx.sign();
    let mut tag = [0u8; TAG_LEN];
    tag.copy_from_slice(&full.as_ref()[..TAG_LEN]);
    tag
}

fn random_secret() -> Result<[u8; 32], KeyringError> {
    let mut secret = [0u8; 32];
    aws_lc_rs::rand::fill(&mut secret)
        .map_err(|_| KeyringError::Io(std::io::Error::other("no random numbers")))?;
    Ok(secret)
}

fn newest(keys: &[(u32, u64, [u8; 32])]) -> u64 {
    keys.iter().map(|k| k.1).max().unwrap_or(0)
}

fn read_all(file: &mut File) -> std::io::Result<String> {
    file.rewind()?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(text)
}

fn lock(file: &File) -> std::io::Result<()> {
    // SAFETY: flock only reads the descriptor number, which `file` keeps open meanwhile.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Replaces the file's contents: a new file renamed over it (never half written), or, where
/// the folder cannot take a new file (a sandbox that allows only this file), in place.
fn write_keys(path: &Path, file: &mut File, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("keys-new");
    let renamed = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if renamed.is_ok() {
        return Ok(());
    }
    let _ = std::fs::remove_file(&tmp);
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// Creates the key file with `text` in it, unless another process creates it first (then
/// theirs stands). The file appears whole or not at all: it is written under a name of its
/// own and linked into place, so a process starting at the same moment never reads it empty.
fn create_whole(path: &Path, text: &str) -> std::io::Result<()> {
    let mut unique = [0u8; 8];
    let _ = aws_lc_rs::rand::fill(&mut unique);
    let tmp = path.with_extension(format!(
        "keys-new-{}-{:016x}",
        std::process::id(),
        u64::from_le_bytes(unique)
    ));
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        // link(2) never replaces: exactly one of the racing processes puts its key in place.
        match std::fs::hard_link(&tmp, path) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    })();
    let _ = std::fs::remove_file(&tmp);
    written
}

fn render(keys: &[(u32, u64, [u8; 32])]) -> String {
    let mut out = String::from(
        "# tern gate signing keys: id, created (unix seconds), secret. Keep private.\n",
    );
    for (id, created, secret) in keys {
        out.push_str(&format!("{id} {created} "));
        for b in secret {
            out.push_str(&format!("{b:02x}"));
        }
        out.push('\n');
    }
    out
}

fn parse(text: &str) -> Result<Vec<(u32, u64, [u8; 32])>, KeyringError> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why| KeyringError::Malformed { line: i + 1, why };
        let mut parts = line.split_whitespace();
        let id: u32 = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| bad("bad key id"))?;
        let created: u64 = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| bad("bad creation time"))?;
        let hex = parts.next().ok_or_else(|| bad("no secret"))?;
        if hex.len() != 64 || parts.next().is_some() {
            return Err(bad("the secret must be 64 hex digits"));
        }
        let mut secret = [0u8; 32];
        for (j, byte) in secret.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * j..2 * j + 2], 16)
                .map_err(|_| bad("the secret must be 64 hex digits"))?;
        }
        if keys.iter().any(|k: &(u32, u64, [u8; 32])| k.0 == id) {
            return Err(bad("a key id appears twice"));
        }
        keys.push((id, created, secret));
    }
    if keys.is_empty() {
        return Err(KeyringError::Empty);
    }
    Ok(keys)
}

/// Seconds since the Unix epoch: when keys are made, sign, and are due to rotate.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const DAY: u64 = 86_400;

    fn rotation() -> Rotation {
        Rotation {
            rotate_every: Duration::from_secs(7 * DAY),
            keep_for: Duration::from_secs(2 * DAY),
        }
    }

    #[test]
    fn a_new_file_is_private_and_reloads_to_the_same_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gate.keys");
        let t = 1_800_000_000;
        let a = Keyring::load_or_create(&path, &rotation(), t).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = Keyring::load_or_create(&path, &rotation(), t + 10).unwrap();
        assert_eq!(a.kids(), b.kids());
        let (kid, tag) = a.sign(Purpose::Session, b"hello");
        assert_eq!(b.verify(Purpose::Session, kid, b"hello", &tag), Ok(()));
        assert_eq!(a.sign(Purpose::Csrf, b"x"), b.sign(Purpose::Csrf, b"x"));
        assert_eq!(a.next_rotation(), t + 7 * DAY);
    }

    #[test]
    fn processes_creating_the_file_at_once_all_get_its_one_key() {
        // Several nodes (or a restart racing a `--check`) start on a new key file together:
        // none may see the file before its key is in it, and all must end with the same key.
        let threads = 4;
        for round in 0..200 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("gate.keys");
            let start = std::sync::Barrier::new(threads);
            let kids: Vec<Result<Vec<u32>, String>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|_| {
                        s.spawn(|| {
                            start.wait();
                            Keyring::load_or_create(&path, &rotation(), 1_800_000_000)
                                .map(|k| {
                                    let (kid, tag) = k.sign(Purpose::Session, b"x");
                                    assert_eq!(kid, 1);
                                    tag[0] as u32
                                })
                                .map(|t| vec![t])
                                .map_err(|e| e.to_string())
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let first = kids[0].clone();
            for k in &kids {
                assert!(k.is_ok(), "round {round}: {k:?}");
                assert_eq!(k, &first, "round {round}: two different keys");
            }
            let leftovers: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(leftovers, vec![std::ffi::OsString::from("gate.keys")]);
        }
    }

    #[test]
    fn a_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gate.keys");
        Keyring::load_or_create(&path, &rotation(), 1).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Keyring::load_or_create(&path, &rotation(), 1)
            .err()
            .unwrap();
        assert!(matches!(e, KeyringError::Exposed(0o644)), "{e}");
    }

    #[test]
    fn malformed_files_are_refused_with_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gate.keys");
        let write = |text: &str| {
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            Keyring::load_or_create(&path, &rotation(), 1)
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(
            write("# nothing\n").as_deref(),
            Some("the file holds no key")
        );
        assert!(write("# c\n1 2 abc\n").unwrap().starts_with("line 2"));
        assert!(
            write(&format!("1 2 {}\n1 3 {}\n", "a".repeat(64), "b".repeat(64)))
                .unwrap()
                .contains("twice")
        );
        assert!(write(&format!("x 2 {}\n", "a".repeat(64)))
            .unwrap()
            .contains("key id"));
        assert!(write(&format!("1 2 {}\n", "g".repeat(64)))
            .unwrap()
            .contains("hex"));
    }

    #[test]
    fn rotation_adds_a_key_and_keeps_old_ones_for_their_overlap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gate.keys");
        let t = 1_800_000_000;
        let first = Keyring::load_or_create(&path, &rotation(), t).unwrap();
        let (k1, tag) = first.sign(Purpose::Session, b"x");
        // Not due yet.
        assert_eq!(
            Keyring::load_or_create(&path, &rotation(), t + DAY)
                .unwrap()
                .kids(),
            vec![k1]
        );
        // Due: a new key, published now and signing only after ACTIVATION_DELAY, so nodes
        // sharing the file learn it first; the old one still verifies.
        let now = t + 7 * DAY;
        let second = Keyring::load_or_create(&path, &rotation(), now).unwrap();
        assert_eq!(second.kids().len(), 2);
        let k2 = second.kids()[0];
        assert!(k2 > k1, "ids only grow");
        assert_eq!(second.sign_at(Purpose::Session, b"x", now).0, k1);
        let (signer, new_tag) = second.sign_at(Purpose::Session, b"x", now + ACTIVATION_DELAY);
        assert_eq!(signer, k2);
        assert_eq!(second.verify(Purpose::Session, k2, b"x", &new_tag), Ok(()));
        assert_eq!(second.verify(Purpose::Session, k1, b"x", &tag), Ok(()));
        // Two more rotations later the first key is gone (7 + 2 days after it was replaced).
        let third =
            Keyring::load_or_create(&path, &rotation(), t + 14 * DAY + ACTIVATION_DELAY).unwrap();
        assert_eq!(third.kids().len(), 2);
        assert_eq!(
            third.verify(Purpose::Session, k1, b"x", &tag),
            Err(MacError::UnknownKey)
        );
        assert!(third.kids().iter().all(|&k| k > k1));
    }

    #[test]
    fn macs_are_bound_to_purpose_data_and_key() {
        let ring = Keyring::from_keys(vec![(1, 10, [1; 32]), (2, 20, [2; 32])]);
        assert_eq!(ring.current_kid(), 2);
        let (kid, tag) = ring.sign(Purpose::Challenge, b"data");
        assert_eq!(ring.verify(Purpose::Challenge, kid, b"data", &tag), Ok(()));
        assert_eq!(
            ring.verify(Purpose::Session, kid, b"data", &tag),
            Err(MacError::BadMac)
        );
        assert_eq!(
            ring.verify(Purpose::Challenge, kid, b"date", &tag),
            Err(MacError::BadMac)
        );
        assert_eq!(
            ring.verify(Purpose::Challenge, 1, b"data", &tag),
            Err(MacError::BadMac)
        );
        assert_eq!(
            ring.verify(Purpose::Challenge, 9, b"data", &tag),
            Err(MacError::UnknownKey)
        );
        assert_eq!(
            ring.verify(Purpose::Challenge, kid, b"data", &tag[..8]),
            Err(MacError::BadMac)
        );
    }
}
