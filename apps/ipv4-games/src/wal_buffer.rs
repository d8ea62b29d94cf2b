//! A VFS shim that gathers SQLite's WAL appends into one `pwrite` per commit.
//!
//! Why: SQLite writes every WAL frame with two `pwrite`s (the 24-byte frame header, then the
//! page). Random claims dirty two or three 1 KiB pages each, so a batch of 30 claims cost
//! some 180 small buffered writes, and each costs ext4 about 2.7 µs whatever its size: under
//! the claims benchmark `__x64_sys_pwrite64` was 24-28 % of the whole process (`perf`, SQLite
//! 3.50), more than the B-tree work itself. Gathered, a batch is one write of ~70 KiB.
//!
//! How it stays correct: the shim wraps the default (unix) VFS and changes nothing but the
//! timing of WAL writes, never their order or content. Writes to a WAL file are appended to a
//! per-file buffer while each one starts where the buffer ends; any other write, and every
//! read, sync, truncate, size query, file control or close of that file, first writes the
//! buffer out. Readers (other connections, other processes) learn about new frames only from
//! the wal-index header, which SQLite publishes with `xShmBarrier` on the *database* file
//! between its two copies of the header; the shim writes the buffer out in that barrier, so
//! no reader can be told about a frame that is not yet in the kernel. The same happens on
//! every `xShmLock` (the write lock is released through it). A commit is therefore in the
//! kernel before `COMMIT` returns: it survives the process being killed, exactly as without
//! the shim (`synchronous=FULL` still syncs: `xSync` writes the buffer out first).
//!
//! Errors: the buffer is normally written out in `xWrite` itself, right after the page of a
//! commit frame (its header carries the database size), so a failed write fails the commit
//! the usual way. The barrier is the safety net; it cannot report an error, so if writing
//! there fails the process aborts rather than publish frames the file does not hold (the
//! commit was not acknowledged, and recovery drops it). `flushes()` counts both paths; tests
//! check that the barrier never has anything left to write.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use rusqlite::ffi;

/// The name to open connections with (`Connection::open_with_flags_and_vfs`).
pub const VFS_NAME: &str = "tern-wal-buffer";
const VFS_NAME_C: &CStr = c"tern-wal-buffer";

/// A buffer this large is written out even mid-transaction (a huge transaction, a cache
/// spill), so memory stays bounded.
const BUFFER_LIMIT: usize = 1 << 20;

/// The unix VFS writes at most 128 KiB - 1 per call (`seekAndWriteFd` masks the length with
/// 0x1ffff), so the buffer goes out in pieces no larger than this.
const WRITE_PIECE: usize = 124 * 1024;

/// A WAL frame header: page number, database size (non-zero only on a commit frame), salts
/// and checksums.
const FRAME_HEADER: usize = 24;

static COMMIT_FLUSHES: AtomicU64 = AtomicU64::new(0);
static BARRIER_FLUSHES: AtomicU64 = AtomicU64::new(0);
static WRITES: AtomicU64 = AtomicU64::new(0);

/// (buffer written out after a commit frame, buffer written out by the barrier, WAL writes
/// SQLite asked for) over the process's life.
pub fn flushes() -> (u64, u64, u64) {
    (
        COMMIT_FLUSHES.load(Ordering::Relaxed),
        BARRIER_FLUSHES.load(Ordering::Relaxed),
        WRITES.load(Ordering::Relaxed),
    )
}

/// The WAL files now open, by the database name they belong to. SQLite passes both the
/// database's and the WAL's xOpen a name from the same allocation, and
/// `sqlite3_filename_database` maps the WAL's name to the database's pointer, so the pointer
/// identifies one connection's pair. Looked up a few times per transaction.
struct Registry(Vec<(usize, usize)>);
static OPEN_WALS: Mutex<Registry> = Mutex::new(Registry(Vec::new()));

/// Our file: SQLite sees `base`; the default VFS's own file follows at `INNER_OFFSET`.
#[repr(C)]
struct File {
    base: ffi::sqlite3_file,
    inner_methods: *const ffi::sqlite3_io_methods,
    /// The database name pointer this file belongs to (see `Registry`).
    db_key: usize,
    wal: Option<Box<WalBuffer>>,
}

#[derive(Default)]
struct WalBuffer {
    bytes: Vec<u8>,
    /// File offset of `bytes[0]`.
    at: i64,
    /// The last write was a commit frame's header: its page comes next.
    commit_page_next: bool,
}

const INNER_OFFSET: usize = std::mem::size_of::<File>().next_multiple_of(16);

fn inner(f: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    // SAFETY (for callers): `f` is one of our files, allocated by SQLite with the shim's
    // szOsFile, which reserves INNER_OFFSET bytes for `File` ahead of the default VFS's file.
    unsafe { (f as *mut u8).add(INNER_OFFSET) as *mut ffi::sqlite3_file }
}

/// Registers the shim once per process; later calls return the first answer.
pub fn register() -> bool {
    static DONE: OnceLock<bool> = OnceLock::new();
    *DONE.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find only reads SQLite's VFS list (initialising SQLite if
        // needed); the default VFS lives for the whole process.
        let default = unsafe { ffi::sqlite3_vfs_find(ptr::null()) };
        if default.is_null() {
            return false;
        }
        // SAFETY: `default` is a valid, never-freed sqlite3_vfs.
        let d = unsafe { &*default };
        let vfs = Box::new(ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: (INNER_OFFSET as c_int) + d.szOsFile,
            mxPathname: d.mxPathname,
            pNext: ptr::null_mut(),
            zName: VFS_NAME_C.as_ptr(),
            pAppData: default as *mut c_void,
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: None,
            xDlError: None,
            xDlSym: None,
            xDlClose: None,
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        });
        // SAFETY: the struct is leaked, so it outlives every connection; registering only
        // links it into SQLite's list (not as the default).
        unsafe { ffi::sqlite3_vfs_register(Box::into_raw(vfs), 0) == ffi::SQLITE_OK }
    })
}

fn default_vfs(vfs: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY (for callers): `vfs` is our registered struct, whose pAppData is the default VFS.
    unsafe { (*vfs).pAppData as *mut ffi::sqlite3_vfs }
}

static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let real = default_vfs(vfs);
    let f = file as *mut File;
    // SAFETY: SQLite hands us szOsFile writable bytes at `file`; we initialise our part
    // before the default VFS fills its own, and SQLite only calls xClose when pMethods is set.
    unsafe {
        ptr::write(
            f,
            File {
                base: ffi::sqlite3_file {
                    pMethods: ptr::null(),
                },
                inner_methods: ptr::null(),
                db_key: 0,
                wal: None,
            },
        );
        let rc = ((*real).xOpen.expect("default VFS has xOpen"))(
            real,
            name,
            inner(file),
            flags,
            out_flags,
        );
        let methods = (*inner(file)).pMethods;
        if methods.is_null() {
            return rc; // failed: no xClose will come
        }
        (*f).inner_methods = methods;
        (*f).base.pMethods = &METHODS;
        if rc != ffi::SQLITE_OK {
            return rc; // SQLite will call xClose, which forwards
        }
        if !name.is_null() {
            if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 {
                (*f).db_key = name as usize;
            } else if flags & ffi::SQLITE_OPEN_WAL != 0 {
                let key = ffi::sqlite3_filename_database(name) as usize;
                (*f).db_key = key;
                (*f).wal = Some(Box::default());
                lock_registry().0.push((key, f as usize));
            }
        }
        rc
    }
}

fn lock_registry() -> std::sync::MutexGuard<'static, Registry> {
    OPEN_WALS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The forwarding target of one of our files.
macro_rules! forward {
    ($file:expr, $method:ident $(, $arg:expr)*) => {{
        let f = $file as *mut File;
        // SAFETY: `f` is one of our opened files (SQLite only calls methods after a
        // successful xOpen set pMethods), so `inner_methods` is the default VFS's table for
        // the inner file.
        #[allow(unused_unsafe)] // also used inside unsafe blocks
        let rc = unsafe {
            match (*(*f).inner_methods).$method {
                Some(m) => m(inner($file) $(, $arg)*),
                None => ffi::SQLITE_IOERR,
            }
        };
        rc
    }};
}

/// Writes out what the WAL file `f` holds back. Returns an SQLite code.
///
/// SAFETY: `f` must be one of our open files, used by no other thread right now (SQLite
/// uses a connection, and so its files, from one thread at a time).
unsafe fn flush(f: *mut File) -> c_int {
    // SAFETY: per the contract above.
    unsafe {
        let Some(w) = (*f).wal.as_mut() else {
            return ffi::SQLITE_OK;
        };
        if w.bytes.is_empty() {
            return ffi::SQLITE_OK;
        }
        let write = (*(*f).inner_methods)
            .xWrite
            .expect("default VFS has xWrite");
        let mut rc = ffi::SQLITE_OK;
        let mut at = w.at;
        for piece in w.bytes.chunks(WRITE_PIECE) {
            rc = write(
                inner(f as *mut ffi::sqlite3_file),
                piece.as_ptr() as *const c_void,
                piece.len() as c_int,
                at,
            );
            if rc != ffi::SQLITE_OK {
                break;
            }
            at += piece.len() as i64;
        }
        w.bytes.clear();
        w.commit_page_next = false;
        if w.bytes.capacity() > BUFFER_LIMIT * 2 {
            w.bytes.shrink_to(BUFFER_LIMIT);
        }
        rc
    }
}

/// Writes out the WAL buffer of the connection whose database file is `db`, if any.
///
/// SAFETY: `db` must be one of our open files; the WAL found belongs to the same connection,
/// so it is used by this thread only.
unsafe fn flush_wal_of(db: *mut ffi::sqlite3_file) {
    // SAFETY: per the contract above.
    let key = unsafe { (*(db as *mut File)).db_key };
    if key == 0 {
        return;
    }
    let wal = {
        let reg = lock_registry();
        match reg.0.iter().find(|(k, _)| *k == key) {
            Some(&(_, wal)) => wal as *mut File,
            None => return,
        }
    };
    // SAFETY: registered WAL files stay valid until their xClose removes them, which
    // happens on this same connection's thread.
    unsafe {
        let pending = (*wal).wal.as_ref().is_some_and(|w| !w.bytes.is_empty());
        if !pending {
            return;
        }
        BARRIER_FLUSHES.fetch_add(1, Ordering::Relaxed);
        if flush(wal) != ffi::SQLITE_OK {
            // Going on would publish frames the file does not hold.
            eprintln!("tern: writing the SQLite WAL failed at a commit barrier; aborting");
            std::process::abort();
        }
    }
}

unsafe extern "C" fn x_close(file: *mut ffi::sqlite3_file) -> c_int {
    let f = file as *mut File;
    // SAFETY: xClose is the last call on an opened file; we drop our part after the default
    // VFS closed its own.
    unsafe {
        let flushed = flush(f);
        if (*f).wal.is_some() {
            let me = f as usize;
            lock_registry().0.retain(|&(_, w)| w != me);
        }
        let rc = forward!(file, xClose);
        ptr::drop_in_place(f);
        if flushed != ffi::SQLITE_OK {
            flushed
        } else {
            rc
        }
    }
}

unsafe extern "C" fn x_read(
    file: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: `file` is ours; SQLite calls it from the connection's thread.
    let rc = unsafe { flush(file as *mut File) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    forward!(file, xRead, buf, amt, off)
}

unsafe extern "C" fn x_write(
    file: *mut ffi::sqlite3_file,
    data: *const c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    let f = file as *mut File;
    // SAFETY: `file` is ours and used by this thread only; `data` holds `amt` bytes.
    unsafe {
        let Some(w) = (*f).wal.as_mut() else {
            return forward!(file, xWrite, data, amt, off);
        };
        WRITES.fetch_add(1, Ordering::Relaxed);
        let bytes = std::slice::from_raw_parts(data as *const u8, amt.max(0) as usize);
        if !w.bytes.is_empty() && off != w.at + w.bytes.len() as i64 {
            let rc = flush(f);
            if rc != ffi::SQLITE_OK {
                return rc;
            }
        }
        let w = (*f).wal.as_mut().expect("still a WAL");
        if w.bytes.is_empty() {
            w.at = off;
        }
        w.bytes.extend_from_slice(bytes);
        let commit_page = w.commit_page_next;
        w.commit_page_next = bytes.len() == FRAME_HEADER && bytes[4..8] != [0; 4];
        if commit_page {
            COMMIT_FLUSHES.fetch_add(1, Ordering::Relaxed);
            return flush(f);
        }
        if w.bytes.len() >= BUFFER_LIMIT {
            return flush(f);
        }
        ffi::SQLITE_OK
    }
}

unsafe extern "C" fn x_truncate(file: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    // SAFETY: `file` is ours; SQLite calls it from the connection's thread.
    let rc = unsafe { flush(file as *mut File) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    forward!(file, xTruncate, size)
}

unsafe extern "C" fn x_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    // SAFETY: `file` is ours; SQLite calls it from the connection's thread.
    let rc = unsafe { flush(file as *mut File) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    forward!(file, xSync, flags)
}

unsafe extern "C" fn x_file_size(
    file: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    // SAFETY: `file` is ours; SQLite calls it from the connection's thread.
    let rc = unsafe { flush(file as *mut File) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    forward!(file, xFileSize, size)
}

unsafe extern "C" fn x_lock(file: *mut ffi::sqlite3_file, lock: c_int) -> c_int {
    forward!(file, xLock, lock)
}

unsafe extern "C" fn x_unlock(file: *mut ffi::sqlite3_file, lock: c_int) -> c_int {
    forward!(file, xUnlock, lock)
}

unsafe extern "C" fn x_check_reserved_lock(file: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    forward!(file, xCheckReservedLock, out)
}

unsafe extern "C" fn x_file_control(
    file: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: `file` is ours; SQLite calls it from the connection's thread.
    let rc = unsafe { flush(file as *mut File) };
    if rc != ffi::SQLITE_OK {
        return rc;
    }
    forward!(file, xFileControl, op, arg)
}

unsafe extern "C" fn x_sector_size(file: *mut ffi::sqlite3_file) -> c_int {
    let f = file as *mut File;
    // SAFETY: `file` is ours.
    unsafe {
        match (*(*f).inner_methods).xSectorSize {
            Some(m) => m(inner(file)),
            None => 4096,
        }
    }
}

unsafe extern "C" fn x_device_characteristics(file: *mut ffi::sqlite3_file) -> c_int {
    let f = file as *mut File;
    // SAFETY: `file` is ours.
    unsafe {
        match (*(*f).inner_methods).xDeviceCharacteristics {
            Some(m) => m(inner(file)),
            None => 0,
        }
    }
}

unsafe extern "C" fn x_shm_map(
    file: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward!(file, xShmMap, region, size, extend, out)
}

unsafe extern "C" fn x_shm_lock(
    file: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: `file` is ours (a database file: only those get shm calls).
    unsafe { flush_wal_of(file) };
    forward!(file, xShmLock, offset, n, flags)
}

unsafe extern "C" fn x_shm_barrier(file: *mut ffi::sqlite3_file) {
    let f = file as *mut File;
    // SAFETY: `file` is ours (a database file: only those get shm calls).
    unsafe {
        flush_wal_of(file);
        if let Some(m) = (*(*f).inner_methods).xShmBarrier {
            m(inner(file));
        }
    }
}

unsafe extern "C" fn x_shm_unmap(file: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    // SAFETY: `file` is ours (a database file).
    unsafe { flush_wal_of(file) };
    forward!(file, xShmUnmap, delete)
}

unsafe extern "C" fn x_fetch(
    file: *mut ffi::sqlite3_file,
    off: ffi::sqlite3_int64,
    amt: c_int,
    out: *mut *mut c_void,
) -> c_int {
    forward!(file, xFetch, off, amt, out)
}

unsafe extern "C" fn x_unfetch(
    file: *mut ffi::sqlite3_file,
    off: ffi::sqlite3_int64,
    page: *mut c_void,
) -> c_int {
    forward!(file, xUnfetch, off, page)
}

// The VFS-level calls go straight to the default VFS.

unsafe extern "C" fn x_delete(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync: c_int,
) -> c_int {
    let real = default_vfs(vfs);
    // SAFETY: the default VFS is valid for the process's life.
    unsafe { ((*real).xDelete.expect("xDelete"))(real, name, sync) }
}

unsafe extern "C" fn x_access(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    let real = default_vfs(vfs);
    // SAFETY: as above.
    unsafe { ((*real).xAccess.expect("xAccess"))(real, name, flags, out) }
}

unsafe extern "C" fn x_full_pathname(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    let real = default_vfs(vfs);
    // SAFETY: as above.
    unsafe { ((*real).xFullPathname.expect("xFullPathname"))(real, name, n, out) }
}

unsafe extern "C" fn x_randomness(vfs: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
    let real = default_vfs(vfs);
    // SAFETY: as above.
    unsafe { ((*real).xRandomness.expect("xRandomness"))(real, n, out) }
}

unsafe extern "C" fn x_sleep(vfs: *mut ffi::sqlite3_vfs, micros: c_int) -> c_int {
    let real = default_vfs(vfs);
    // SAFETY: as above.
    unsafe { ((*real).xSleep.expect("xSleep"))(real, micros) }
}

unsafe extern "C" fn x_current_time(vfs: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    let real = default_vfs(vfs);
    // SAFETY: as above.
    unsafe { ((*real).xCurrentTime.expect("xCurrentTime"))(real, out) }
}

unsafe extern "C" fn x_get_last_error(
    vfs: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    let real = default_vfs(vfs);
    // SAFETY: as above.
    unsafe {
        match (*real).xGetLastError {
            Some(m) => m(real, n, out),
            None => 0,
        }
    }
}

unsafe extern "C" fn x_current_time_int64(
    vfs: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    let real = default_vfs(vfs);
    // SAFETY: as above.
    unsafe { ((*real).xCurrentTimeInt64.expect("xCurrentTimeInt64"))(real, out) }
}
