//! Opening files strictly beneath the static root, and the `stat` identity the cache validates
//! against.
//!
//! On Linux every open goes through `openat2(root_fd, rel, RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)`: the kernel refuses any resolution (a `..` or a symlink, relative or
//! absolute) that would leave the root, atomically, so no race with a concurrent rename or
//! symlink swap can reach a file outside it. Without `openat2` (kernels before 5.6, and tern's
//! sandbox, whose seccomp filter answers ENOSYS because it cannot read `openat2`'s mode) the
//! same walk is done in user space, one name at a time with `openat(O_NOFOLLOW)` relative to
//! the folder before, which no rename or swap can lead out of either ([`Root::open_fallback`]).

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// Flags for every file we open to serve: read-only, never our controlling terminal, and
/// non-blocking so that opening a FIFO someone left in the root cannot hang a worker (we then
/// refuse it after `fstat`; for regular files O_NONBLOCK has no effect).
const OPEN_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;

/// Flags to resolve a file without reading it (no read right needed; `fstat` works on it).
/// `openat2` refuses any flag beside these with `O_PATH`.
const PATH_ONLY_FLAGS: libc::c_int = libc::O_PATH | libc::O_CLOEXEC;

/// Set once `openat2` answered ENOSYS; from then on the fallback is used directly.
static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    Dir,
    Other,
}

/// What `stat` says about a file: enough to notice any replacement or modification (inode,
/// size, mtime to the nanosecond) and to derive the ETag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileStat {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_sec: i64,
    pub mtime_nsec: i64,
    pub kind: Kind,
}

impl FileStat {
    // The stat field types differ between targets (e.g. 32-bit st_dev), hence the casts.
    #[allow(clippy::unnecessary_cast)]
    fn from_libc(st: &libc::stat) -> FileStat {
        let kind = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            _ => Kind::Other,
        };
        FileStat {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            size: st.st_size as u64,
            mtime_sec: st.st_mtime as i64,
            mtime_nsec: st.st_mtime_nsec as i64,
            kind,
        }
    }

    /// Modification time in whole seconds since the epoch (0 for pre-1970 times).
    pub fn mtime_secs(&self) -> u64 {
        self.mtime_sec.max(0) as u64
    }

    /// Modification time in nanoseconds, for the ETag.
    pub fn mtime_ns(&self) -> u128 {
        (self.mtime_sec as i128 * 1_000_000_000 + self.mtime_nsec as i128).max(0) as u128
    }
}

/// The static root: an open directory descriptor every lookup resolves against.
#[derive(Debug)]
pub(crate) struct Root {
    fd: OwnedFd,
    /// (dev, ino) of the directory, to notice when the configured path names another one.
    id: (u64, u64),
    /// The directory's path with no symlink in it (`current -> releases/N` resolved when it
    /// was opened), for programs that open its files by name (FastCGI scripts).
    real: std::path::PathBuf,
}

impl Root {
    pub fn open(path: &Path) -> io::Result<Root> {
        let ctx = |e: io::Error, what: &str| {
            io::Error::new(
                e.kind(),
                format!("static root {}: {what}: {e}", path.display()),
            )
        };
        // The directory is opened by its resolved path, so `real` names the one opened.
        let real = std::fs::canonicalize(path).map_err(|e| ctx(e, "cannot access"))?;
        let meta = std::fs::metadata(&real).map_err(|e| ctx(e, "cannot access"))?;
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("static root {}: not a directory", path.display()),
            ));
        }
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&real)
            .map_err(|e| ctx(e, "cannot open"))?;
        // Listing proves the directory is readable (opening alone does not need `x`).
        std::fs::read_dir(&real).map_err(|e| ctx(e, "cannot read"))?;
        let st = fstat(&dir).map_err(|e| ctx(e, "cannot stat"))?;
        Ok(Root {
            fd: OwnedFd::from(dir),
            id: (st.dev, st.ino),
            real,
        })
    }

    /// The root's path as opened, with no symlink in it.
    pub fn real_path(&self) -> &Path {
        &self.real
    }

    /// Whether `path` (followed through symlinks) still names this directory. False when it
    /// cannot be checked.
    pub fn is_still(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == self.id)
    }

    /// Opens `rel` (relative, no leading slash; `.` for the root itself) for reading, refusing
    /// anything that resolves outside the root.
    pub fn open_beneath(&self, rel: &CStr) -> io::Result<File> {
        self.open_beneath_with(rel, OPEN_FLAGS)
    }

    /// `stat` of what `rel` resolves to by the same rule as [`Root::open_beneath`] (nothing
    /// outside the root), without the right to read it: the file is opened `O_PATH`. For a
    /// file another program opens by name (a FastCGI script tern never reads).
    pub fn stat_beneath(&self, rel: &CStr) -> io::Result<FileStat> {
        let file = self.open_beneath_with(rel, PATH_ONLY_FLAGS)?;
        fstat(&file)
    }

    /// `flags` for the file itself: [`OPEN_FLAGS`] or [`PATH_ONLY_FLAGS`].
    fn open_beneath_with(&self, rel: &CStr, flags: libc::c_int) -> io::Result<File> {
        #[cfg(target_os = "linux")]
        if !OPENAT2_MISSING.load(Ordering::Relaxed) {
            match self.open_openat2(rel, flags) {
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                    // Expected in the sandbox and as safe: not worth a warning.
                    OPENAT2_MISSING.store(true, Ordering::Relaxed);
                    tracing::debug!(
                        "openat2 unavailable; static files are opened one name at a time"
                    );
                }
                other => return other,
            }
        }
        self.open_fallback(rel, flags)
    }

    /// `flags` for the file itself: [`OPEN_FLAGS`] or [`PATH_ONLY_FLAGS`].
    #[cfg(target_os = "linux")]
    fn open_openat2(&self, rel: &CStr, flags: libc::c_int) -> io::Result<File> {
        // `open_how` is non_exhaustive in libc, so build it zeroed and fill the fields in.
        // SAFETY: open_how is a plain C struct of three u64s; all-zero is a valid value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = flags as u64;
        how.mode = 0;
        how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: openat2(2) takes (dirfd, NUL-terminated path, *const open_how, size). `rel`
        // is a valid C string that outlives the call, `how` is a live, initialised open_how
        // and we pass its exact size; the root fd stays open for as long as `self` lives. The
        // kernel only reads these pointers. On success the returned fd is new and owned by
        // nobody else, so wrapping it in a File (which closes it) is sound.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.fd.as_raw_fd(),
                rel.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: see above: a fresh descriptor we now own.
        Ok(unsafe { File::from_raw_fd(ret as libc::c_int) })
    }

    /// `RESOLVE_BENEATH` in user space: one name at a time, each opened relative to the
    /// folder before it with `O_NOFOLLOW` (folders as `O_PATH`, which needs no read right,
    /// like a path walk), so nothing renamed or swapped in meanwhile can lead out. A symlink
    /// met on the way is read (`readlinkat`) and its target walked the same way: an absolute
    /// target, or a `..` above the root, fails with EXDEV, more than 40 links with ELOOP, as
    /// `openat2` does. `file_flags` for the file itself: [`OPEN_FLAGS`] or [`PATH_ONLY_FLAGS`].
    fn open_fallback(&self, rel: &CStr, file_flags: libc::c_int) -> io::Result<File> {
        const MAX_LINKS: usize = 40;
        let folder_flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // The folders walked into below the root (the root itself when empty), and the names
        // still to walk, the next one last.
        let mut folders: Vec<OwnedFd> = Vec::new();
        let mut names: Vec<Vec<u8>> = names_in(rel.to_bytes()).rev().collect();
        let mut links = 0;
        while let Some(name) = names.pop() {
            if name == b".." {
                if folders.pop().is_none() {
                    return Err(io::Error::from_raw_os_error(libc::EXDEV));
                }
                continue;
            }
            let at = folders.last().unwrap_or(&self.fd).as_raw_fd();
            let last = names.is_empty();
            let flags = if last {
                file_flags | libc::O_NOFOLLOW
            } else {
                folder_flags
            };
            let error = match open_at(at, &name, flags) {
                // `O_PATH | O_NOFOLLOW` opens a symlink itself where a read open fails with
                // ELOOP: followed below the same way.
                Ok(fd) if last && file_flags & libc::O_PATH != 0 && is_symlink(&fd)? => {
                    io::Error::from_raw_os_error(libc::ELOOP)
                }
                Ok(fd) if last => return Ok(File::from(fd)),
                Ok(fd) => {
                    folders.push(fd);
                    continue;
                }
                Err(e) => e,
            };
            // O_NOFOLLOW met a symlink: ELOOP, or ENOTDIR where a folder was asked for.
            if !matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) {
                return Err(error);
            }
            let Ok(target) = read_link_at(at, &name) else {
                return Err(error);
            };
            links += 1;
            if links > MAX_LINKS {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            if target.starts_with(b"/") {
                return Err(io::Error::from_raw_os_error(libc::EXDEV));
            }
            names.extend(names_in(&target).rev());
        }
        // `rel` was `.` (or led back to a folder by `..`): open that folder itself.
        let at = folders.last().unwrap_or(&self.fd).as_raw_fd();
        open_at(at, b".", file_flags).map(File::from)
    }

    /// `stat` of `rel` relative to the root, following symlinks like the open does. Used only
    /// to revalidate an entry that was opened safely: a changed resolution shows up as a
    /// different identity and sends the request back through `open_beneath`.
    pub fn stat_at(&self, rel: &CStr) -> io::Result<FileStat> {
        // SAFETY: all-zero is a valid `struct stat`; fstatat fills it in on success.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the dirfd is open for the life of `self`, `rel` is a valid C string and `st`
        // a writable stat buffer; the kernel writes only into `st`.
        let ret = unsafe { libc::fstatat(self.fd.as_raw_fd(), rel.as_ptr(), &mut st, 0) };
        if ret != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(FileStat::from_libc(&st))
    }
}

/// The names of a relative path, without empty ones (`a//b`) and `.`.
fn names_in(path: &[u8]) -> impl DoubleEndedIterator<Item = Vec<u8>> + '_ {
    path.split(|&b| b == b'/')
        .filter(|name| !name.is_empty() && *name != b".")
        .map(<[u8]>::to_vec)
}

/// `openat(at, name, flags)` for one name (no `/`).
fn open_at(at: libc::c_int, name: &[u8], flags: libc::c_int) -> io::Result<OwnedFd> {
    let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))?;
    // SAFETY: `at` is a descriptor the caller keeps open across the call, `name` a valid C
    // string that outlives it; the kernel only reads them. No O_CREAT, so no mode is read.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether `fd` (opened `O_PATH | O_NOFOLLOW`) is a symlink.
fn is_symlink(fd: &OwnedFd) -> io::Result<bool> {
    Ok(raw_fstat(fd)?.st_mode & libc::S_IFMT == libc::S_IFLNK)
}

/// The target of the symlink `name` in the folder `at`.
fn read_link_at(at: libc::c_int, name: &[u8]) -> io::Result<Vec<u8>> {
    let name = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::ENOENT))?;
    let mut target = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `at` stays open across the call, `name` is a valid C string, and the kernel
    // writes at most `target.len()` bytes into `target`.
    let n =
        unsafe { libc::readlinkat(at, name.as_ptr(), target.as_mut_ptr().cast(), target.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    target.truncate(n as usize);
    Ok(target)
}

pub(crate) fn fstat(file: &File) -> io::Result<FileStat> {
    raw_fstat(file).map(|st| FileStat::from_libc(&st))
}

/// `fstat(2)`; an `O_PATH` descriptor may be given too.
fn raw_fstat(fd: &impl AsRawFd) -> io::Result<libc::stat> {
    // SAFETY: all-zero is a valid `struct stat`; fstat fills it in on success.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the caller's borrow keeps the descriptor open across the call; `st` is
    // writable and the kernel writes only into it.
    let ret = unsafe { libc::fstat(fd.as_raw_fd(), &mut st) };
    if ret != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::io::Read;

    fn c(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    fn setup() -> (tempfile::TempDir, Root) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/in.txt"), "inside").unwrap();
        std::fs::write(tmp.path().join("secret.txt"), "secret").unwrap();
        std::os::unix::fs::symlink("../secret.txt", root.join("rel-out")).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("secret.txt"), root.join("abs-out")).unwrap();
        std::os::unix::fs::symlink("..", root.join("up")).unwrap();
        std::os::unix::fs::symlink("sub/in.txt", root.join("rel-in")).unwrap();
        std::os::unix::fs::symlink("/proc/self/root/etc/hostname", root.join("magic")).unwrap();
        let r = Root::open(&root).unwrap();
        (tmp, r)
    }

    fn read(f: io::Result<File>) -> io::Result<String> {
        let mut s = String::new();
        f?.read_to_string(&mut s)?;
        Ok(s)
    }

    fn check_escapes(open: impl Fn(&CStr) -> io::Result<File>) {
        assert_eq!(read(open(&c("sub/in.txt"))).unwrap(), "inside");
        assert_eq!(read(open(&c("rel-in"))).unwrap(), "inside");
        for bad in [
            "rel-out",
            "abs-out",
            "up/secret.txt",
            "../secret.txt",
            "magic",
            "/etc/passwd",
        ] {
            let r = read(open(&c(bad)));
            assert!(r.is_err(), "{bad} must not open: {r:?}");
        }
        assert!(open(&c("missing")).is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn openat2_refuses_everything_outside_the_root() {
        let (_tmp, root) = setup();
        check_escapes(|p| root.open_openat2(p, OPEN_FLAGS));
        let err = root.open_openat2(&c("rel-out"), OPEN_FLAGS).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EXDEV));
    }

    #[test]
    fn fallback_refuses_everything_outside_the_root() {
        let (_tmp, root) = setup();
        check_escapes(|p| root.open_fallback(p, OPEN_FLAGS));
        let err = root.open_fallback(&c("rel-out"), OPEN_FLAGS).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EXDEV));
    }

    /// The fallback follows links the way `openat2(RESOLVE_BENEATH)` does: through folders,
    /// with `..` that stays inside, not in a loop, and not through an absolute link on the
    /// way.
    #[cfg(target_os = "linux")]
    #[test]
    fn fallback_resolves_links_inside_the_root_like_openat2() {
        let (tmp, root) = setup();
        let base = tmp.path().join("root");
        std::os::unix::fs::symlink("sub", base.join("sub-link")).unwrap();
        std::os::unix::fs::symlink("../sub/in.txt", base.join("sub/back-in")).unwrap();
        std::os::unix::fs::symlink("loop", base.join("loop")).unwrap();
        std::fs::create_dir(base.join("moved")).unwrap();
        type Open = fn(&Root, &CStr, libc::c_int) -> io::Result<File>;
        let opens: [(&str, Open); 2] = [
            ("openat2", Root::open_openat2),
            ("fallback", Root::open_fallback),
        ];
        for (how, open) in opens {
            let open = |p: &str| open(&root, &c(p), OPEN_FLAGS);
            assert_eq!(read(open("sub-link/in.txt")).unwrap(), "inside", "{how}");
            assert_eq!(read(open("sub/back-in")).unwrap(), "inside", "{how}");
            assert_eq!(read(open("./sub//in.txt")).unwrap(), "inside", "{how}");
            let looped = open("loop").unwrap_err();
            assert_eq!(looped.raw_os_error(), Some(libc::ELOOP), "{how}");
            let through_a_file = open("sub/in.txt/x").unwrap_err();
            assert_eq!(through_a_file.raw_os_error(), Some(libc::ENOTDIR), "{how}");
        }
        // A folder replaced by an absolute link, here to the outside.
        std::fs::remove_dir(base.join("moved")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), base.join("moved")).unwrap();
        let replaced = root
            .open_fallback(&c("moved/secret.txt"), OPEN_FLAGS)
            .unwrap_err();
        assert_eq!(replaced.raw_os_error(), Some(libc::EXDEV));
    }

    /// Resolving without reading (`O_PATH`, a FastCGI script's check) keeps the same rule
    /// both ways, follows links that stay inside, and needs no right to read the file.
    #[test]
    fn stat_beneath_resolves_by_the_same_rule_without_reading() {
        use std::os::unix::fs::PermissionsExt;
        let (tmp, root) = setup();
        let base = tmp.path().join("root");
        std::fs::write(base.join("sealed.php"), "x").unwrap();
        let sealed = std::fs::Permissions::from_mode(0o000);
        std::fs::set_permissions(base.join("sealed.php"), sealed).unwrap();
        std::os::unix::fs::symlink("sub", base.join("sub-link")).unwrap();
        std::os::unix::fs::symlink("loop", base.join("loop")).unwrap();
        type Open = fn(&Root, &CStr, libc::c_int) -> io::Result<File>;
        let mut ways: Vec<(&str, Open)> = vec![("fallback", Root::open_fallback)];
        #[cfg(target_os = "linux")]
        ways.push(("openat2", Root::open_openat2));
        for (how, open) in ways {
            let stat = |p: &str| open(&root, &c(p), PATH_ONLY_FLAGS).and_then(|f| fstat(&f));
            let inside = stat("rel-in").unwrap();
            assert_eq!((inside.kind, inside.size), (Kind::File, 6), "{how}");
            assert_eq!(stat("sub-link/in.txt").unwrap().kind, Kind::File, "{how}");
            assert_eq!(stat("sub").unwrap().kind, Kind::Dir, "{how}");
            assert_eq!(stat(".").unwrap().kind, Kind::Dir, "{how}");
            assert_eq!(stat("sealed.php").unwrap().kind, Kind::File, "{how}");
            for bad in [
                "rel-out",
                "abs-out",
                "up/secret.txt",
                "../secret.txt",
                "magic",
                "/etc/passwd",
            ] {
                assert!(stat(bad).is_err(), "{how}: {bad} must not resolve");
            }
            let looped = stat("loop").unwrap_err();
            assert_eq!(looped.raw_os_error(), Some(libc::ELOOP), "{how}");
        }
        assert_eq!(root.stat_beneath(&c("rel-in")).unwrap().size, 6);
        let out = root.stat_beneath(&c("rel-out")).unwrap_err();
        assert_eq!(out.raw_os_error(), Some(libc::EXDEV));
    }

    #[test]
    fn a_root_opened_through_a_symlink_knows_its_real_path() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("releases/1")).unwrap();
        std::os::unix::fs::symlink("releases/1", tmp.path().join("current")).unwrap();
        let root = Root::open(&tmp.path().join("current")).unwrap();
        let real = std::fs::canonicalize(tmp.path().join("releases/1")).unwrap();
        assert_eq!(root.real_path(), real);
        assert!(root.is_still(&tmp.path().join("current")));
    }

    #[test]
    fn open_beneath_and_stat() {
        let (_tmp, root) = setup();
        check_escapes(|p| root.open_beneath(p));
        let f = root.open_beneath(&c("sub/in.txt")).unwrap();
        let a = fstat(&f).unwrap();
        let b = root.stat_at(&c("sub/in.txt")).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.kind, Kind::File);
        assert_eq!(a.size, 6);
        assert_eq!(root.stat_at(&c("sub")).unwrap().kind, Kind::Dir);
        assert_eq!(
            fstat(&root.open_beneath(&c(".")).unwrap()).unwrap().kind,
            Kind::Dir
        );
    }

    #[test]
    fn root_errors_are_clear() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = Root::open(&tmp.path().join("nope")).unwrap_err();
        assert!(missing.to_string().contains("nope"), "{missing}");
        std::fs::write(tmp.path().join("f"), "x").unwrap();
        let not_dir = Root::open(&tmp.path().join("f")).unwrap_err();
        assert!(not_dir.to_string().contains("not a directory"), "{not_dir}");
    }
}
