//! The state folder: one account per CA, one certificate per name, one lock per name.
//!
//! ```text
//! STATE/<ca>/account.json               the account's id and key (0600)
//! STATE/<ca>/certs/<name>/cert.pem      the chain, leaf first, then the key (0600)
//! STATE/<ca>/certs/<name>/meta.json     ARI window, chosen instant, failures
//! STATE/<ca>/locks/<name>.lock          flock'd while a node orders for <name>
//! ```
//!
//! `<ca>` is made from the directory URL (`acme-v02.api.letsencrypt.org-directory`), so a
//! change of CA starts a new account instead of using a foreign one. Every file is written
//! to a temporary name in the same folder, synced, then renamed over the old one: a crash or a
//! full disk leaves the old file. The chain and its key are one file so they can never be a
//! mismatched pair.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What the helper remembers about a certificate besides the certificate itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// The CA's last ARI window (Unix seconds) and the instant chosen inside it.
    pub ari_window: Option<(i64, i64)>,
    pub ari_selected: Option<i64>,
    /// When ARI may be asked again (its Retry-After).
    pub ari_next_poll: i64,
    /// Failed orders in a row, and when to try again.
    pub failures: u32,
    pub next_attempt: i64,
    pub last_error: Option<String>,
}

/// A stored certificate.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The chain's PEM blocks, then the key's.
    pub pem: String,
    pub meta: Meta,
}

impl Stored {
    /// The chain's certificates only.
    pub fn chain_pem(&self) -> String {
        pem_blocks(&self.pem, "CERTIFICATE")
    }

    /// The private key's PEM block.
    pub fn key_pem(&self) -> String {
        pem_blocks(&self.pem, "PRIVATE KEY")
    }
}

fn pem_blocks(pem: &str, label_ends: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in pem.lines() {
        if line.starts_with("-----BEGIN ") {
            inside = line.trim_end_matches('-').ends_with(label_ends);
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
        if line.starts_with("-----END ") {
            inside = false;
        }
    }
    out
}

/// The state folder of one CA.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// A held per-name lock; released when dropped (and by the kernel if the process dies).
#[derive(Debug)]
pub struct NameLock {
    _file: File,
}

impl Store {
    /// Opens (creating, 0700) the folder for `directory` under `root`.
    pub fn open(root: &Path, directory: &str) -> Result<Store, String> {
        let dir = root.join(ca_folder(directory));
        for sub in ["certs", "locks"] {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir.join(sub))
                .map_err(|e| format!("cannot create {}: {e}", dir.join(sub).display()))?;
        }
        Ok(Store { dir })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn load_account(&self) -> Option<String> {
        fs::read_to_string(self.dir.join("account.json")).ok()
    }

    pub fn save_account(&self, json: &str) -> Result<(), String> {
        write_atomic(&self.dir.join("account.json"), json.as_bytes(), 0o600)
    }

    fn cert_dir(&self, name: &str) -> PathBuf {
        self.dir.join("certs").join(name)
    }

    /// The stored certificate of `name`, if there is one that can be read.
    pub fn load(&self, name: &str) -> Option<Stored> {
        let dir = self.cert_dir(name);
        let pem = fs::read_to_string(dir.join("cert.pem")).ok()?;
        let meta = fs::read(dir.join("meta.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Some(Stored { pem, meta })
    }

    /// Stores a new certificate (chain and key in one file) with fresh meta data.
    pub fn save_cert(
        &self,
        name: &str,
        chain_pem: &str,
        key_pem: &str,
        meta: &Meta,
    ) -> Result<(), String> {
        let dir = self.cert_dir(name);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut pem = String::with_capacity(chain_pem.len() + key_pem.len() + 1);
        pem.push_str(chain_pem.trim_end());
        pem.push('\n');
        pem.push_str(key_pem.trim_end());
        pem.push('\n');
        write_atomic(&dir.join("cert.pem"), pem.as_bytes(), 0o600)?;
        self.save_meta(name, meta)
    }

    pub fn save_meta(&self, name: &str, meta: &Meta) -> Result<(), String> {
        let dir = self.cert_dir(name);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let json = serde_json::to_vec_pretty(meta).expect("meta serializes");
        write_atomic(&dir.join("meta.json"), &json, 0o600)
    }

    /// Takes the lock of `name` without waiting: `None` while another process (a node sharing
    /// the folder) holds it.
    pub fn try_lock(&self, name: &str) -> Result<Option<NameLock>, String> {
        let path = self.dir.join("locks").join(format!("{name}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(Some(NameLock { _file: file }));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        Err(format!("cannot lock {}: {err}", path.display()))
    }
}

/// `https://acme-v02.api.letsencrypt.org/directory` → `acme-v02.api.letsencrypt.org-directory`.
pub fn ca_folder(directory: &str) -> String {
    let rest = directory
        .strip_prefix("https://")
        .or_else(|| directory.strip_prefix("http://"))
        .unwrap_or(directory);
    let mut out: String = rest
        .chars()
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '-' | '_' => c,
            _ => '-',
        })
        .collect();
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() || out.starts_with('.') {
        out.insert_str(0, "ca");
    }
    out
}

/// Writes `data` to a temporary file beside `path`, syncs it, renames it over `path` and
/// syncs the folder. On any error the old file is left as it was.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    result.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        format!("cannot write {}: {e}", path.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn ca_folders_are_plain_names() {
        assert_eq!(
            ca_folder("https://acme-v02.api.letsencrypt.org/directory"),
            "acme-v02.api.letsencrypt.org-directory"
        );
        assert_eq!(
            ca_folder("https://127.0.0.1:14000/dir"),
            "127.0.0.1-14000-dir"
        );
        assert_eq!(ca_folder("https://../../x"), "ca..-..-x");
        assert!(!ca_folder("https://a/../../b").contains('/'));
    }

    #[test]
    fn certificates_round_trip_with_private_modes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), "https://ca.test/dir").unwrap();
        assert!(store.load("a.test").is_none());
        let chain = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n";
        let key = "-----BEGIN PRIVATE KEY-----\nKKKK\n-----END PRIVATE KEY-----\n";
        let meta = Meta {
            failures: 2,
            ..Meta::default()
        };
        store.save_cert("a.test", chain, key, &meta).unwrap();
        let got = store.load("a.test").unwrap();
        assert_eq!(got.chain_pem(), chain);
        assert_eq!(got.key_pem(), key);
        assert_eq!(got.meta, meta);
        let file = store.dir().join("certs/a.test/cert.pem");
        let mode = fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        store.save_account("{}").unwrap();
        let mode = fs::metadata(store.dir().join("account.json"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(store.load_account().as_deref(), Some("{}"));
        // No temporary file is left behind.
        let left: Vec<_> = fs::read_dir(store.dir().join("certs/a.test"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
    }

    #[test]
    fn a_name_is_locked_by_one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), "https://ca.test/dir").unwrap();
        let held = store.try_lock("a.test").unwrap().expect("free");
        // flock locks belong to open file descriptions: a second open is a second holder.
        assert!(store.try_lock("a.test").unwrap().is_none());
        assert!(store.try_lock("b.test").unwrap().is_some());
        drop(held);
        assert!(store.try_lock("a.test").unwrap().is_some());
    }
}
