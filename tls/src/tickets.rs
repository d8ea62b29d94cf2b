//! Session-ticket keys that rotate and survive restarts.
//!
//! rustls's own `Ticketer` rotates keys too, but keeps them in memory only, so every restart
//! would make every client do a full handshake again (Anubis and swad lost every session on
//! restart for the same reason). Here the keys also live in a 0600 file: a new process started
//! next to the old one (README's restart procedure) reads the same keys and resumes the old
//! process's sessions.
//!
//! A ticket is `key name (16) | nonce (12) | AES-256-GCM(state) | tag (16)`, with the key name
//! as additional data. A key encrypts for [`ROTATE_SECS`] and is accepted for
//! [`ACCEPT_SECS`] after it was made; older keys are erased (from memory and from the file),
//! which is what bounds the damage a stolen key can do to forward secrecy.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use rustls::server::ProducesTickets;

/// A new key is made this often.
pub const ROTATE_SECS: u64 = 6 * 3600;
/// A key is accepted this long after it was made (so every ticket lives at least 6 h).
pub const ACCEPT_SECS: u64 = 12 * 3600;
const NAME_LEN: usize = 16;
const TAG_LEN: usize = 16;
const FILE_HEADER: &str =
    "# tern session-ticket keys: created-unix-seconds name-hex key-hex; keep private (0600)";

struct Key {
    created: u64,
    name: [u8; NAME_LEN],
    secret: [u8; 32],
    aead: LessSafeKey,
}

impl Key {
    fn new(created: u64, name: [u8; NAME_LEN], secret: [u8; 32]) -> Key {
        let unbound = UnboundKey::new(&AES_256_GCM, &secret).expect("32-byte AES-256 key");
        Key {
            created,
            name,
            secret,
            aead: LessSafeKey::new(unbound),
        }
    }

    fn random(created: u64) -> Result<Key, String> {
        let rng = SystemRandom::new();
        let (mut name, mut secret) = ([0u8; NAME_LEN], [0u8; 32]);
        rng.fill(&mut name)
            .and_then(|_| rng.fill(&mut secret))
            .map_err(|_| "the system random generator failed".to_string())?;
        Ok(Key::new(created, name, secret))
    }
}

/// Newest first.
struct KeySet(Vec<Key>);

/// The ticket producer rustls calls (from every worker).
pub struct TicketKeys {
    keys: ArcSwap<KeySet>,
    /// Unix time at which the newest key is due for replacement (one load per ticket).
    rotate_at: AtomicU64,
    file: Option<PathBuf>,
    /// Held while rotating, so two workers do not both make a key.
    rotating: Mutex<()>,
}

impl fmt::Debug for TicketKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TicketKeys")
            .field("keys", &self.keys.load().0.len())
            .field("file", &self.file)
            .finish()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl TicketKeys {
    /// Keys kept in memory only: resumption works until the process exits.
    pub fn in_memory() -> Result<Arc<TicketKeys>, String> {
        Self::build(None, Vec::new(), now_secs())
    }

    /// Keys kept in `path` (created 0600 if missing). Expired keys are dropped and a fresh one
    /// is added when the newest is due, and the file is rewritten.
    pub fn with_file(path: &Path) -> Result<Arc<TicketKeys>, String> {
        let existing = match fs::read_to_string(path) {
            Ok(text) => parse(&text).map_err(|e| format!("{}: {e}", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        Self::build(Some(path.to_path_buf()), existing, now_secs())
    }

    fn build(file: Option<PathBuf>, keys: Vec<Key>, now: u64) -> Result<Arc<TicketKeys>, String> {
        let keys = refreshed(keys, now)?;
        if let Some(path) = &file {
            save(path, &keys)?;
        }
        let rotate_at = keys[0].created + ROTATE_SECS;
        Ok(Arc::new(TicketKeys {
            keys: ArcSwap::from_pointee(KeySet(keys)),
            rotate_at: AtomicU64::new(rotate_at),
            file,
            rotating: Mutex::new(()),
        }))
    }

    /// Rotates if the newest key is due. A failure to write the file is logged (the keys still
    /// rotate in memory; only resumption across a restart suffers).
    fn maybe_rotate(&self, now: u64) {
        if now < self.rotate_at.load(Ordering::Relaxed) {
            return;
        }
        let Ok(_guard) = self.rotating.try_lock() else {
            return; // another worker is rotating; the current key is still good meanwhile
        };
        let current = self.keys.load();
        if now < current.0[0].created + ROTATE_SECS {
            return;
        }
        let copy = current
            .0
            .iter()
            .map(|k| Key::new(k.created, k.name, k.secret))
            .collect();
        let keys = match refreshed(copy, now) {
            Ok(keys) => keys,
            Err(e) => {
                tracing::error!("session-ticket key rotation failed: {e}");
                return;
            }
        };
        if let Some(path) = &self.file {
            if let Err(e) = save(path, &keys) {
                tracing::error!("session-ticket keys rotated but not saved: {e}");
            }
        }
        self.rotate_at
            .store(keys[0].created + ROTATE_SECS, Ordering::Relaxed);
        self.keys.store(Arc::new(KeySet(keys)));
    }

    /// How many keys are held (newest first), for tests and logs.
    pub fn key_count(&self) -> usize {
        self.keys.load().0.len()
    }
}

/// Drops keys past their acceptance window, adds a key if none is young enough to encrypt.
fn refreshed(mut keys: Vec<Key>, now: u64) -> Result<Vec<Key>, String> {
    keys.retain(|k| k.created <= now && now - k.created < ACCEPT_SECS);
    keys.sort_by_key(|k| std::cmp::Reverse(k.created));
    if keys.first().is_none_or(|k| now - k.created >= ROTATE_SECS) {
        keys.insert(0, Key::random(now)?);
    }
    Ok(keys)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

fn parse(text: &str) -> Result<Vec<Key>, String> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_ascii_whitespace();
        let key = (|| {
            let created = parts.next()?.parse().ok()?;
            let name = unhex::<NAME_LEN>(parts.next()?)?;
            let secret = unhex::<32>(parts.next()?)?;
            parts
                .next()
                .is_none()
                .then(|| Key::new(created, name, secret))
        })();
        keys.push(key.ok_or_else(|| format!("line {}: not a ticket key", i + 1))?);
    }
    Ok(keys)
}

/// Writes the keys to a 0600 temp file beside `path`, then renames it over `path`, so a
/// reader (another tern starting) never sees half a file. Where that fails, as in a folder
/// tern may not write (a sandbox that allows only the file itself, a root-owned folder after
/// dropping to `--user`), the file is rewritten in place instead: a crash in that moment leaves a damaged
/// file, which the next start refuses loudly rather than resetting.
fn save(path: &Path, keys: &[Key]) -> Result<(), String> {
    let mut text = String::from(FILE_HEADER);
    text.push('\n');
    for k in keys {
        text.push_str(&format!(
            "{} {} {}\n",
            k.created,
            hex(&k.name),
            hex(&k.secret)
        ));
    }
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let _ = fs::remove_file(&tmp);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    };
    let in_place = || -> std::io::Result<()> {
        let mut f = OpenOptions::new().write(true).open(path)?;
        f.write_all(text.as_bytes())?;
        f.set_len(text.len() as u64)?;
        f.sync_all()
    };
    match write() {
        Err(_) if path.exists() => in_place(),
        other => other,
    }
    .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

impl ProducesTickets for TicketKeys {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        ROTATE_SECS as u32
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.maybe_rotate(now_secs());
        let keys = self.keys.load();
        let key = keys.0.first()?;
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(NAME_LEN + NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&key.name);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let mut body = out.split_off(NAME_LEN + NONCE_LEN);
        key.aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&key.name),
                &mut body,
            )
            .ok()?;
        out.extend_from_slice(&body);
        Some(out)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        // Attacker-controlled input: only checked slicing, no panics.
        if cipher.len() < NAME_LEN + NONCE_LEN + TAG_LEN {
            return None;
        }
        let (name, rest) = cipher.split_at(NAME_LEN);
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let now = now_secs();
        let keys = self.keys.load();
        let key = keys
            .0
            .iter()
            .find(|k| k.name == name && now.saturating_sub(k.created) < ACCEPT_SECS)?;
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let plain = key
            .aead
            .open_in_place(nonce, Aad::from(&key.name), &mut buf)
            .ok()?;
        let n = plain.len();
        buf.truncate(n);
        Some(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tickets_round_trip_and_tampering_is_refused() {
        let keys = TicketKeys::in_memory().unwrap();
        let t = keys.encrypt(b"session state").unwrap();
        assert_eq!(keys.decrypt(&t).unwrap(), b"session state");
        for i in 0..t.len() {
            let mut bad = t.clone();
            bad[i] ^= 1;
            assert!(keys.decrypt(&bad).is_none(), "flipped byte {i} accepted");
        }
        for n in 0..t.len() {
            assert!(keys.decrypt(&t[..n]).is_none());
        }
        let other = TicketKeys::in_memory().unwrap();
        assert!(other.decrypt(&t).is_none());
    }

    #[test]
    fn the_file_is_private_and_a_second_process_accepts_the_first_ones_tickets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ticket.keys");
        let first = TicketKeys::with_file(&path).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let t = first.encrypt(b"resume me").unwrap();
        let second = TicketKeys::with_file(&path).unwrap();
        assert_eq!(second.key_count(), 1, "a young key is reused, not replaced");
        assert_eq!(second.decrypt(&t).unwrap(), b"resume me");
    }

    #[test]
    fn keys_rotate_and_expire_on_schedule() {
        let t0 = 1_000_000;
        let keys = refreshed(Vec::new(), t0).unwrap();
        assert_eq!(keys.len(), 1);
        // Before 6 h: same key. At 6 h: a new one in front, the old one kept.
        let keys = refreshed(keys, t0 + ROTATE_SECS - 1).unwrap();
        assert_eq!(keys.len(), 1);
        let keys = refreshed(keys, t0 + ROTATE_SECS).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(keys[0].created, t0 + ROTATE_SECS);
        // At 12 h the first key is erased.
        let keys = refreshed(keys, t0 + ACCEPT_SECS).unwrap();
        assert!(keys.iter().all(|k| k.created != t0));
    }

    #[test]
    fn rotation_rewrites_the_file_in_place_where_no_temp_file_can_be_made() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        let first = TicketKeys::build(Some(path.clone()), Vec::new(), 1_000).unwrap();
        let before = fs::read_to_string(&path).unwrap();
        // The temp file cannot be made (a folder is in its way, which stops root too).
        fs::create_dir(path.with_extension("tmp")).unwrap();
        first.maybe_rotate(1_000 + ROTATE_SECS + 1);
        let after = fs::read_to_string(&path).unwrap();
        assert_ne!(before, after, "the rotated keys were saved");
        assert_eq!(parse(&after).unwrap().len(), first.key_count());
    }

    #[test]
    fn a_damaged_file_is_an_error_not_a_silent_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        fs::write(&path, "12 zz 00\n").unwrap();
        let err = TicketKeys::with_file(&path).unwrap_err();
        assert!(err.contains("line 1"), "{err}");
    }
}
