//! Static files: `tern serve DIR`.
//!
//! A request goes: method check → path decode/normalise (`path.rs`) → this worker's front cache
//! (`cache.rs`). A hit whose entry was checked less than 500 ms ago is answered from memory:
//! pre-serialised header blocks, a body handle (`Bytes` or an open file for sendfile), the
//! Accept-Encoding choice, conditionals and ranges evaluated on the request's pre-extracted
//! header values. No syscall, no lock, one small allocation (the response's header vector).
//!
//! Otherwise the file is opened with `openat2(RESOLVE_BENEATH)` (`fs.rs`), matched against the
//! shared map (so each file is read and compressed once for all workers), built if needed
//! (`entry.rs`) and put in the front cache.
//!
//! Freshness: a cached entry is re-`stat`ed (the file and its `.gz`/`.br` siblings: inode, size,
//! mtime in ns) when a request finds it unchecked for 500 ms on that worker's clock; misses are
//! never cached, so new files are served at once. The root path itself is re-checked every
//! 500 ms (on misses/revalidations) and re-opened when it names another directory, so a deploy
//! that switches a `current -> releases/N` symlink is followed.
//!
//! Reload (`SIGHUP`): [`StaticFiles::reload`] re-opens the root (possibly a new path) and takes
//! new options; the shared map is emptied and tagged with a new generation, so nothing built
//! under the old settings is found again. Each worker drops its front caches at its next loop
//! turn ([`forget_thread_caches`], called by the server worker); a thread that is not a tern
//! worker notices the new generation on its next miss or revalidation.
//!
//! Known limits: a large file rewritten *in place* (same inode) may be sent with its old length
//! during the ≤ 500 ms before revalidation (deploys that write a new file and rename it over the
//! old one are always safe); absolute symlinks inside the root are refused (RESOLVE_BENEATH),
//! relative ones that stay inside are followed.

mod budget;
mod cache;
pub(crate) mod conditional;
pub(crate) mod encoding;
mod entry;
mod fs;
mod options;
mod path;
/// `Range` (RFC 9110 §14), also for answers from the proxy's cache.
pub mod range;

#[cfg(test)]
mod tests;

use std::ffi::CString;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;

use tern_codec::Method;

use crate::handler::{Handler, HandlerContext, Reply, Request};
use crate::response::{Body, FileBody, Response};

pub use cache::CacheStats;
use cache::{Front, Shared, Slot, REVALIDATE_MS};
use encoding::{BR, GZIP, IDENTITY};
use entry::{BuildOpts, Entry, Found, Source};
use fs::{fstat, Kind, Root};
use options::Settings;
pub use options::StaticOptions;
pub use path::normalize_path; // doc-hidden: the path_normalize fuzz target, and the gate's policy path
use path::PathError;
use range::RangeSpec;

/// How often (at most) the root path is checked for naming another directory.
const ROOT_CHECK_MS: u64 = 500;

/// The open root directory and the path it was opened from.
struct Rooted {
    path: PathBuf,
    dir: Root,
}

/// Serves the files under a directory. See the module docs for the request path.
pub struct StaticFiles {
    /// Distinguishes instances in the per-thread front caches.
    id: u64,
    /// Options, replaced whole by [`reload`](Self::reload). Workers read their front cache's
    /// snapshot of it, never this, on a cache hit.
    settings: ArcSwap<Settings>,
    /// The open root directory. Re-opened when the configured path comes to name another
    /// directory (a `current -> releases/N` symlink switched by a deploy), or on reload.
    root: ArcSwap<Rooted>,
    started: Instant,
    /// Milliseconds after `started` of the last check of the root path.
    root_checked_ms: AtomicU64,
    shared: Shared,
    /// Serialises reloads (signal thread only; never taken on the request path).
    reload_lock: Mutex<()>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl std::fmt::Debug for StaticFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticFiles")
            .field("opts", &self.settings.load().opts)
            .finish_non_exhaustive()
    }
}

/// Checks and normalises options (an empty Cache-Control means none).
fn validate(mut opts: StaticOptions) -> io::Result<StaticOptions> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    let idx = &opts.index_file;
    if idx.is_empty() || idx == "." || idx == ".." || idx.contains(['/', '\\', '\0']) {
        return Err(invalid(format!(
            "index file {idx:?} must be a plain file name"
        )));
    }
    if opts.cache_control.as_deref().is_some_and(str::is_empty) {
        opts.cache_control = None;
    }
    if let Some(cc) = &opts.cache_control {
        if cc.bytes().any(|b| b.is_ascii_control()) {
            return Err(invalid(format!(
                "Cache-Control value {cc:?} has control characters"
            )));
        }
    }
    Ok(opts)
}

/// A regular file beneath a static root, for a program that opens it by name itself (a
/// FastCGI server running a script).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileBeneath {
    /// The root's path with no symlink in it, as last opened: a deploy that switches a
    /// `current -> releases/N` link is followed as for the files served.
    pub root: PathBuf,
    /// The file: `root`, then the request's path below it.
    pub path: PathBuf,
}

impl StaticFiles {
    /// Opens the root directory. Fails with a message naming the path when it is missing,
    /// unreadable or not a directory, or when an option is unusable.
    pub fn new(opts: StaticOptions) -> io::Result<StaticFiles> {
        Self::with_cache_limits(
            opts,
            cache::DEFAULT_MAX_CACHE_BYTES,
            cache::DEFAULT_MAX_OPEN_FILES,
        )
    }

    /// Like [`new`](Self::new) with explicit bounds on the cache: bytes held in memory (bodies,
    /// compressed variants, header blocks; default 256 MiB) and descriptors of large files kept
    /// open (default 1024).
    pub fn with_cache_limits(
        opts: StaticOptions,
        max_cache_bytes: u64,
        max_open_files: u64,
    ) -> io::Result<StaticFiles> {
        let opts = validate(opts)?;
        let dir = Root::open(&opts.root)?;
        Ok(StaticFiles {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            root: ArcSwap::from_pointee(Rooted {
                path: opts.root.clone(),
                dir,
            }),
            settings: ArcSwap::from_pointee(Settings { gen: 0, opts }),
            started: Instant::now(),
            root_checked_ms: AtomicU64::new(0),
            shared: Shared::new(max_cache_bytes, max_open_files),
            reload_lock: Mutex::new(()),
        })
    }

    /// The options in force (a copy: a reload may replace them at any time).
    pub fn options(&self) -> StaticOptions {
        self.settings.load().opts.clone()
    }

    /// Takes new options (`SIGHUP`), callable from any thread while requests are served.
    /// The root is re-opened and checked first: if it is unusable, or an option is, nothing
    /// changes and the error (naming the path) is returned. Otherwise every cached file is
    /// dropped, even when nothing changed, so a directory replaced under the same path is seen
    /// at once. Responses already under way keep the files they hold.
    pub fn reload(&self, opts: StaticOptions) -> io::Result<()> {
        let _serial = self.reload_lock.lock().unwrap_or_else(|p| p.into_inner());
        let opts = validate(opts)?;
        let dir = Root::open(&opts.root)?;
        let gen = self.settings.load().gen + 1;
        // The shared map first: from here on, entries built under older settings are neither
        // found nor cached (their generation differs), whichever thread built them.
        self.shared.clear(gen);
        self.root.store(Arc::new(Rooted {
            path: opts.root.clone(),
            dir,
        }));
        self.settings.store(Arc::new(Settings { gen, opts }));
        Ok(())
    }

    /// The regular file `key` names beneath the root, judged by the rules a request for it
    /// meets here: the same path and dotfile rules, the same resolution that refuses `..`
    /// and any symlink leading out of the root. `key` is decoded from the canonical path the
    /// request was routed by ([`crate::decoded_path`]), e.g. `/blog/index.php`. The file is
    /// resolved, not opened for reading (`O_PATH`): tern needs no right to read a script it
    /// never sends.
    ///
    /// `Ok(None)`: no regular file there (missing, a folder, or outside the root: a request
    /// for it finds nothing either). `Err`: the answer a request for it gets instead (404
    /// for a dotfile while dotfiles are not served, like the file itself; 400; 403; 503).
    pub fn file_beneath(&self, key: &str, now_ms: u64) -> Result<Option<FileBeneath>, Response> {
        let rel = &key[1.min(key.len())..];
        if rel.is_empty() || rel.ends_with('/') {
            self.check_key(key)?;
            return Ok(None); // a folder
        }
        let rooted = self.root();
        match self.kind_beneath(&rooted, key, now_ms)? {
            Some(Kind::File) => {
                let root = rooted.dir.real_path();
                Ok(Some(FileBeneath {
                    root: root.to_path_buf(),
                    path: root.join(rel),
                }))
            }
            _ => Ok(None),
        }
    }

    /// Whether `key`, a folder's path (`/apps/files/`), names a folder beneath the root,
    /// judged as [`StaticFiles::file_beneath`] judges a file (`Err`: the answer a request
    /// for it gets instead). The root itself is one.
    pub fn folder_beneath(&self, key: &str, now_ms: u64) -> Result<bool, Response> {
        if key.trim_start_matches('/').is_empty() {
            self.check_key(key)?;
            return Ok(true);
        }
        let rooted = self.root();
        Ok(self.kind_beneath(&rooted, key.trim_end_matches('/'), now_ms)? == Some(Kind::Dir))
    }

    fn check_key(&self, key: &str) -> Result<(), Response> {
        match path::check_key(key.as_bytes(), self.settings.load().opts.serve_dotfiles) {
            Ok(()) => Ok(()),
            Err(PathError::BadRequest) => Err(bad_request()),
            Err(PathError::NotFound) => Err(not_found()),
        }
    }

    /// What `key` (not the root) is beneath the root, resolved without reading it; `None`
    /// when there is nothing there.
    fn kind_beneath(
        &self,
        rooted: &Rooted,
        key: &str,
        now_ms: u64,
    ) -> Result<Option<Kind>, Response> {
        self.check_key(key)?;
        // `check_key` refused NUL.
        let Ok(rel_c) = CString::new(&key[1..]) else {
            return Err(bad_request());
        };
        match rooted.dir.stat_beneath(&rel_c) {
            Ok(stat) => Ok(Some(stat.kind)),
            Err(e) if entry::is_absent(&e) => Ok(None),
            Err(e) => Err(io_failure(&e, now_ms)),
        }
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.shared.stats()
    }

    /// Answers a request. GET and HEAD get the same response (the connection omits HEAD's
    /// body); other methods get 405.
    pub fn serve(&self, req: &Request<'_>) -> Response {
        let method = req.method();
        if method != Method::Get && method != Method::Head {
            return method_not_allowed();
        }
        cache::with_front(
            self.id,
            || self.settings.load_full(),
            |front| self.serve_from(front, req, true),
        )
    }

    /// `may_refresh`: the front's settings were not yet compared with the latest reload.
    fn serve_from(&self, front: &mut Front, req: &Request<'_>, may_refresh: bool) -> Response {
        let key = match path::file_key(req.path(), front.settings.opts.serve_dotfiles) {
            Ok(k) => k,
            Err(PathError::BadRequest) => return bad_request(),
            Err(PathError::NotFound) => return not_found(),
        };
        if let Some(slot) = front.map.get_mut(&key[..]) {
            if req.now_ms.saturating_sub(slot.checked_ms) < REVALIDATE_MS {
                return respond(slot, req);
            }
        }
        // Off the hit path (a revalidation or a miss, both about to make syscalls): follow a
        // reload this thread has not seen yet (workers normally drop their fronts first).
        if may_refresh {
            let current = self.settings.load();
            if current.gen != front.settings.gen {
                front.reset(arc_swap::Guard::into_inner(current));
                return self.serve_from(front, req, false);
            }
        }
        if let Some(slot) = front.map.get_mut(&key[..]) {
            if slot.entry.still_valid(&self.root().dir) {
                slot.checked_ms = req.now_ms;
                return respond(slot, req);
            }
            if let Some(stale) = front.map.remove(&key[..]) {
                self.shared.forget(&stale.entry);
            }
        }
        self.miss(front, &key, req)
    }

    fn miss(&self, front: &mut Front, key: &[u8], req: &Request<'_>) -> Response {
        front.sweep(self.shared.epoch());
        match self.lookup(key, &front.settings, req.now_ms) {
            Lookup::Found(entry, true) => {
                let slot = Slot::new(entry, req.now_ms);
                let resp = respond(&slot, req);
                front.map.insert(key.into(), slot);
                resp
            }
            Lookup::Found(entry, false) => respond(&Slot::transient(entry), req),
            Lookup::Redirect => redirect(key, req.query()),
            Lookup::Fail(resp) => resp,
        }
    }

    /// The root directory, re-checking (at most every [`ROOT_CHECK_MS`], by one thread) that
    /// the configured path still names it. Called on misses and revalidations only.
    fn root(&self) -> arc_swap::Guard<Arc<Rooted>> {
        let now = self.started.elapsed().as_millis() as u64;
        let last = self.root_checked_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= ROOT_CHECK_MS
            && self
                .root_checked_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let current = self.root.load_full();
            if !current.dir.is_still(&current.path) {
                match Root::open(&current.path) {
                    Ok(dir) => {
                        let new = Arc::new(Rooted {
                            path: current.path.clone(),
                            dir,
                        });
                        // Only if no reload replaced the root meanwhile.
                        let prev = self.root.compare_and_swap(&current, new);
                        if Arc::ptr_eq(&prev, &current) {
                            let root = current.path.display();
                            tracing::info!(%root, "static root changed; reopened");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "static root changed but cannot be opened")
                    }
                }
            }
        }
        self.root.load()
    }

    /// Resolves a key on disk (safely) and finds or builds its entry.
    fn lookup(&self, key: &[u8], settings: &Settings, now_ms: u64) -> Lookup {
        let rooted = self.root();
        let root = &rooted.dir;
        let opts = &settings.opts;
        let dir_request = key.len() > 1 && key.ends_with(b"/");
        let rel = if key.len() == 1 { &b"."[..] } else { &key[1..] };
        let Ok(rel_c) = CString::new(rel) else {
            return Lookup::Fail(bad_request());
        };
        let (mut file, mut stat) = match open(root, &rel_c, now_ms) {
            Ok(x) => x,
            Err(resp) => return Lookup::Fail(resp),
        };
        let mut served = rel_c;
        match stat.kind {
            Kind::File if !dir_request => {}
            Kind::Dir if !dir_request && key.len() > 1 => return Lookup::Redirect,
            Kind::Dir => {
                let mut index = if key.len() == 1 {
                    Vec::new()
                } else {
                    rel.to_vec()
                };
                index.extend_from_slice(opts.index_file.as_bytes());
                let Ok(index) = CString::new(index) else {
                    return Lookup::Fail(bad_request());
                };
                (file, stat) = match open(root, &index, now_ms) {
                    Ok(x) if x.1.kind == Kind::File => x,
                    Ok(_) => return Lookup::Fail(not_found()),
                    Err(resp) => return Lookup::Fail(resp),
                };
                served = index;
            }
            _ => return Lookup::Fail(not_found()),
        }

        let siblings = if served.as_bytes().ends_with(b".gz") || served.as_bytes().ends_with(b".br")
        {
            None
        } else {
            Some([
                sibling(root, &served, b".gz"),
                sibling(root, &served, b".br"),
            ])
        };
        let mut stats = vec![Some(stat)];
        if let Some(s) = &siblings {
            stats.extend(s.iter().map(|f| f.stat));
        }
        if let Some(entry) = self.shared.find(served.as_bytes(), &stats, settings.gen) {
            return Lookup::Found(entry, true);
        }
        let build = BuildOpts {
            max_cached_size: opts.max_cached_size,
            cache_control: opts.cache_control.as_deref(),
        };
        let main = Found {
            rel: served,
            file: Some(file),
            stat: Some(stat),
        };
        match Entry::build(main, siblings, &build, &self.shared.compressions) {
            Ok(entry) => {
                let rel = entry.watch[0].rel.clone();
                let (entry, cached) = self.shared.insert(rel.as_bytes(), entry, settings.gen);
                Lookup::Found(entry, cached)
            }
            Err(e) => Lookup::Fail(io_failure(&e, now_ms)),
        }
    }
}

fn open(
    root: &Root,
    rel: &CString,
    now_ms: u64,
) -> Result<(std::fs::File, fs::FileStat), Response> {
    let file = root.open_beneath(rel).map_err(|e| io_failure(&e, now_ms))?;
    let stat = fstat(&file).map_err(|e| io_failure(&e, now_ms))?;
    Ok((file, stat))
}

/// `rel` + suffix if it exists as a regular file; otherwise a candidate with no file (still
/// watched, so that adding it later is noticed).
fn sibling(root: &Root, rel: &CString, suffix: &[u8]) -> Found {
    let mut name = rel.as_bytes().to_vec();
    name.extend_from_slice(suffix);
    // A C string plus a suffix without NUL is still a valid C string.
    let rel = CString::new(name).unwrap_or_default();
    match root
        .open_beneath(&rel)
        .and_then(|f| fstat(&f).map(|s| (f, s)))
    {
        Ok((f, s)) if s.kind == Kind::File => Found {
            rel,
            file: Some(f),
            stat: Some(s),
        },
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Found {
            rel,
            file: None,
            stat: None,
        },
        _ => {
            // There but not servable (unreadable, a symlink out of the root, a directory):
            // record what revalidation's `stat` will see so it does not count as a change.
            let stat = root.stat_at(&rel).ok().filter(|s| s.kind == Kind::File);
            Found {
                rel,
                file: None,
                stat,
            }
        }
    }
}

/// Drops every front cache of the calling thread (all `StaticFiles` instances). A worker calls
/// this at its first loop turn after a reload, so that no cache hit serves an old file.
pub(crate) fn forget_thread_caches() {
    cache::forget_thread_fronts();
}

impl Drop for StaticFiles {
    fn drop(&mut self) {
        cache::drop_front(self.id);
    }
}

impl Handler for StaticFiles {
    fn handle(&self, req: &Request<'_>, _cx: &mut HandlerContext<'_>) -> Reply {
        Reply::Now(self.serve(req))
    }
}

enum Lookup {
    /// The entry, and whether it is cached (else serve it once).
    Found(Arc<Entry>, bool),
    /// A directory requested without its trailing slash.
    Redirect,
    Fail(Response),
}

/// The hot path: everything here works on memory this worker already has.
fn respond(slot: &Slot, req: &Request<'_>) -> Response {
    let e = &*slot.entry;
    let head = req.head;
    let v = if e.has_encodings() {
        encoding::choose(head.accept_encoding, e.available())
    } else {
        IDENTITY
    };
    let variant = e.variant(v);

    // RFC 9110 §13.2.2: If-None-Match, else If-Modified-Since.
    let not_modified = match head.if_none_match {
        Some(inm) => conditional::none_match_hits(inm, &variant.etag),
        None => head.if_modified_since.is_some_and(|ims| {
            conditional::not_modified_since(ims, &e.last_modified, e.mtime_secs)
        }),
    };
    if not_modified {
        let mut r = Response::new(304);
        r.push_raw_headers(&variant.head_304);
        return r;
    }

    // Ranges: GET only (RFC 9110 §14.2), always on the identity representation.
    if req.method() == Method::Get {
        if let Some(range) = head.range {
            let id = &e.identity;
            let honoured = head.if_range.is_none_or(|ir| {
                conditional::if_range_allows(ir, &id.etag, &e.last_modified, e.mtime_secs)
            });
            if honoured {
                match range::parse(range, id.len) {
                    RangeSpec::Ignore => {}
                    RangeSpec::Satisfiable { start, end } => {
                        let mut r = range::partial(&id.head_200, start, end, id.len);
                        r.body = body(slot, IDENTITY, start, end - start + 1);
                        return r;
                    }
                    RangeSpec::Unsatisfiable => return range::unsatisfiable(id.len),
                }
            }
        }
    }

    let mut r = Response::new(200);
    r.push_raw_headers(&variant.head_200);
    r.body = body(slot, v, 0, variant.len);
    r
}

fn body(slot: &Slot, v: usize, offset: u64, len: u64) -> Body {
    match (&slot.entry.variant(v).source, &slot.bodies[v]) {
        (Source::Memory(_), Some(local)) => {
            if offset == 0 && len == local.len() as u64 {
                Body::Shared(local.clone())
            } else {
                Body::Shared(local.slice(offset as usize..(offset + len) as usize))
            }
        }
        (Source::Memory(shared), None) => {
            Body::Shared(shared.slice(offset as usize..(offset + len) as usize))
        }
        (Source::File(file), _) => Body::File(FileBody {
            file: file.clone(),
            offset,
            len,
        }),
    }
}

const NOT_FOUND_HTML: &str = "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">\
<title>404 Not Found</title></head>\n<body><h1>404 Not Found</h1>\n\
<p>The requested URL was not found on this server.</p>\n<hr><p>tern</p></body></html>\n";

fn not_found() -> Response {
    let mut r = Response::new(404).with_body(Body::Static(NOT_FOUND_HTML.as_bytes()));
    r.push_raw_headers(b"Content-Type: text/html; charset=utf-8\r\n");
    r
}

fn bad_request() -> Response {
    Response::text(400, "bad request\n")
}

fn method_not_allowed() -> Response {
    let mut r = Response::text(405, "method not allowed\n");
    r.push_raw_headers(b"Allow: GET, HEAD\r\n");
    r
}

fn redirect(key: &[u8], query: Option<&str>) -> Response {
    let loc = path::directory_location(key, query);
    let mut r = Response::text(301, "moved permanently\n");
    r.push_header("Location", &loc);
    r
}

/// Maps a filesystem error to an answer. Absence (including an escape attempt refused by
/// `openat2`, EXDEV, or a symlink loop) is a plain 404 so that probing learns nothing.
/// Unexpected errors are logged, rate-limited (requests choose how often they happen).
fn io_failure(e: &io::Error, now_ms: u64) -> Response {
    if entry::is_absent(e) {
        return not_found();
    }
    match e.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => Response::text(403, "forbidden\n"),
        Some(libc::ENXIO | libc::ENODEV | libc::EISDIR) => not_found(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EAGAIN) => {
            let mut r = Response::text(503, "service unavailable\n");
            r.push_raw_headers(b"Retry-After: 1\r\n");
            r
        }
        _ => {
            if tern_runtime::ratelog::admit("static_lookup_failed", now_ms) {
                tracing::warn!(error = %e, "static file lookup failed");
            }
            Response::text(500, "internal server error\n")
        }
    }
}

// The variant indices are used as array positions in `Slot::bodies`.
const _: () = assert!(IDENTITY == 0 && GZIP == 1 && BR == 2);
