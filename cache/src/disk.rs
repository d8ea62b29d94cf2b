//! Bodies too large for memory, in files of a folder of the cache's own (`[cache.NAME]
//! disk`): written as the relay copies a miss's answer to its client, sent with `sendfile`
//! from the open file on each hit, and removed when their entry goes.
//!
//! Files are named `body-<pid>-<token>-<n>`: the token is drawn once per process, so two processes
//! on one folder (an upgrade's old and new server) never touch each other's files, and a
//! server that always gets the same pid (pid 1 in a container) still tells its own files
//! from a crashed predecessor's, which it removes when it opens the folder. Nothing survives
//! a restart: the entries that named the files are gone with the process.
//!
//! A body on disk keeps its file open (`Arc<File>`): a hit sends from it without an `open`,
//! and an entry dropped while a hit still sends its file only unlinks the name; the blocks
//! go back when the last send ends. Before each hit the file's length is checked
//! ([`DiskBody::intact`]), so a file cut short under the server is never sent as the answer.

use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// What every body file's name starts with.
pub const FILE_PREFIX: &str = "body-";

/// The process's file-name prefix: `body-<pid>-<token>-`.
fn own_prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| {
        // RandomState is seeded from the OS's randomness once per process.
        let token = std::hash::RandomState::new().build_hasher().finish() as u32;
        format!("{FILE_PREFIX}{}-{token:08x}-", std::process::id())
    })
}

/// Files made by this process, in any folder (so a store rebuilt on a reload never reuses a
/// name its predecessor's bodies still hold).
static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

/// A cache's folder: makes the files of bodies and counts their bytes.
#[derive(Debug)]
pub struct DiskTier {
    folder: PathBuf,
    /// Bytes in this tier's files now, written or being written, until each is removed.
    bytes: Arc<AtomicU64>,
}

impl DiskTier {
    /// Makes `folder` (0700) if it is missing and removes what earlier processes left in it:
    /// files named as tern names them whose process is gone (or is this one's pid before it
    /// was this process). Other files are left alone.
    pub fn open(folder: &Path) -> io::Result<DiskTier> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(folder)?;
        let own = own_prefix();
        for item in std::fs::read_dir(folder)? {
            let item = item?;
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            if left_behind(name, own) {
                // Another process may be removing it too (two servers starting together).
                match std::fs::remove_file(item.path()) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
        }
        Ok(DiskTier {
            folder: folder.to_path_buf(),
            bytes: Arc::default(),
        })
    }

    pub fn folder(&self) -> &Path {
        &self.folder
    }

    /// Bytes in the tier's files now.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// A new, empty body file (0600), to be written by one fill.
    pub fn create(&self) -> io::Result<Spill> {
        let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
        let path = self.folder.join(format!("{}{n}", own_prefix()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        Ok(Spill {
            body: DiskBody {
                file: Arc::new(file),
                path,
                len: 0,
                bytes: self.bytes.clone(),
            },
        })
    }
}

/// A file of this tool's naming whose process is gone, or an earlier process's of this pid.
fn left_behind(name: &str, own: &str) -> bool {
    let Some(rest) = name.strip_prefix(FILE_PREFIX) else {
        return false;
    };
    let mut parts = rest.splitn(3, '-');
    let (Some(pid), Some(token), Some(n)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ours = pid.parse::<u32>().is_ok()
        && token.len() == 8
        && token.bytes().all(|b| b.is_ascii_hexdigit())
        && n.parse::<u64>().is_ok();
    if !ours {
        return false;
    }
    if name.starts_with(own) {
        return false;
    }
    Some(pid)
        == own
            .strip_prefix(FILE_PREFIX)
            .and_then(|o| o.split('-').next())
        || !Path::new("/proc").join(pid).exists()
}

/// A body file being written by a fill.
#[derive(Debug)]
pub struct Spill {
    body: DiskBody,
}

impl Spill {
    /// Appends `data` (a failed write leaves the spill to be dropped: its file goes).
    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        (&*self.body.file).write_all(data)?;
        self.body.len += data.len() as u64;
        self.body
            .bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    pub fn len(&self) -> u64 {
        self.body.len
    }

    pub fn is_empty(&self) -> bool {
        self.body.len == 0
    }

    /// The whole body, written.
    pub fn finish(self) -> DiskBody {
        self.body
    }
}

/// A stored body in its file, open; the file is removed when this is dropped.
#[derive(Debug)]
pub struct DiskBody {
    file: Arc<File>,
    path: PathBuf,
    len: u64,
    bytes: Arc<AtomicU64>,
}

impl DiskBody {
    /// The open file, for `sendfile` (a send in progress keeps it open after the entry goes).
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file still holds the whole body: nothing cut it short since it was written (one
    /// `fstat`). A body that fails this must not be sent: its entry is dropped instead.
    pub fn intact(&self) -> bool {
        self.file.metadata().is_ok_and(|m| m.len() == self.len)
    }
}

impl Drop for DiskBody {
    fn drop(&mut self) {
        // Gone already (an operator's cleanup) is fine: the name was all that was left.
        let _ = std::fs::remove_file(&self.path);
        self.bytes.fetch_sub(self.len, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tern-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_body_is_written_counted_and_removed_with_its_last_holder() {
        let dir = folder("body");
        let tier = DiskTier::open(&dir).unwrap();
        let mut spill = tier.create().unwrap();
        spill.write(b"hello ").unwrap();
        spill.write(b"world").unwrap();
        assert_eq!((spill.len(), tier.bytes()), (11, 11));
        let body = Arc::new(spill.finish());
        assert!(body.intact());
        let path = body.path().to_path_buf();
        assert_eq!(std::fs::read(&path).unwrap(), b"hello world");
        let sending = body.file().clone();
        drop(body);
        assert!(!path.exists(), "the name goes with the entry");
        assert_eq!(tier.bytes(), 0);
        // A send under way still reads the whole body from its open file.
        let mut read = String::new();
        use std::io::{Read, Seek};
        (&*sending).seek(io::SeekFrom::Start(0)).unwrap();
        (&*sending).read_to_string(&mut read).unwrap();
        assert_eq!(read, "hello world");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_spill_dropped_unfinished_leaves_nothing() {
        let dir = folder("spill");
        let tier = DiskTier::open(&dir).unwrap();
        let mut spill = tier.create().unwrap();
        spill.write(&[7; 4096]).unwrap();
        drop(spill);
        assert_eq!(tier.bytes(), 0);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_cut_short_is_not_intact() {
        let dir = folder("cut");
        let tier = DiskTier::open(&dir).unwrap();
        let mut spill = tier.create().unwrap();
        spill.write(&[1; 1000]).unwrap();
        let body = spill.finish();
        std::fs::OpenOptions::new()
            .write(true)
            .open(body.path())
            .unwrap()
            .set_len(10)
            .unwrap();
        assert!(!body.intact());
        drop(body);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn opening_a_folder_removes_only_files_left_by_processes_that_are_gone() {
        let dir = folder("left");
        std::fs::create_dir_all(&dir).unwrap();
        let own = own_prefix();
        let own_pid = std::process::id();
        // No process has pid 4194304 + 1 (past Linux's pid_max).
        let gone = "body-4194305-0badf00d-3";
        let earlier_self = format!("body-{own_pid}-00000000-1");
        let live_other = "body-1-12345678-2"; // pid 1 is always there
        let mine = format!("{own}99");
        for name in [
            gone,
            &earlier_self,
            live_other,
            &mine,
            "index.html",
            "body-1-x-2",
            "4194305-0badf00d-3",
        ] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        let _tier = DiskTier::open(&dir).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut expected = vec![
            "body-1-12345678-2".to_owned(),
            "body-1-x-2".to_owned(),
            "index.html".to_owned(),
            "4194305-0badf00d-3".to_owned(),
            mine,
        ];
        expected.sort();
        assert_eq!(left, expected);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
