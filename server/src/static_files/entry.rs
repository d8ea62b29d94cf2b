//! A cache entry: one servable file with its variants (identity, gzip, br), each with its body
//! and the header blocks serialised once, plus what is needed to revalidate it.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;

use super::budget::Charge;
use super::encoding::{self, BR, GZIP};
use super::fs::{fstat, FileStat, Kind, Root};

/// Where a variant's bytes live.
pub(crate) enum Source {
    /// Small files and their compressed forms, shared by every worker.
    Memory(Bytes),
    /// Large files (and large precompressed siblings): sent with sendfile.
    File(Arc<File>),
}

pub(crate) struct Variant {
    pub len: u64,
    pub source: Source,
    /// Quoted, e.g. `"5f1a-17e4c3a2b1d00000-3b9"`, with `-gz`/`-br` for compressed variants.
    pub etag: Box<[u8]>,
    /// Content-Type, ETag, Last-Modified, Cache-Control, Vary, Content-Encoding, Accept-Ranges.
    pub head_200: Box<[u8]>,
    /// ETag, Last-Modified, Cache-Control, Vary.
    pub head_304: Box<[u8]>,
}

/// A file the entry depends on, with the identity it had when loaded (None: absent).
pub(crate) struct Watched {
    pub rel: CString,
    pub stat: Option<FileStat>,
}

pub(crate) struct Entry {
    pub identity: Variant,
    pub gzip: Option<Variant>,
    pub br: Option<Variant>,
    /// `Last-Modified` value (IMF-fixdate), also what a browser echoes in If-Modified-Since.
    pub last_modified: Box<[u8]>,
    pub mtime_secs: u64,
    /// The served file first, then (when looked for) its `.gz` and `.br` siblings.
    pub watch: Vec<Watched>,
    /// Set when the shared map dropped this entry (replaced, removed or evicted); fronts then
    /// drop it at their next revalidation or sweep.
    pub evicted: AtomicBool,
    pub charge: Option<Charge>,
}

/// One candidate file as found by the lookup.
pub(crate) struct Found {
    pub rel: CString,
    pub file: Option<File>,
    pub stat: Option<FileStat>,
}

/// What building needs from the options.
pub(crate) struct BuildOpts<'a> {
    pub max_cached_size: u64,
    pub cache_control: Option<&'a str>,
}

impl Entry {
    pub fn variant(&self, idx: usize) -> &Variant {
        let v = match idx {
            GZIP => self.gzip.as_ref(),
            BR => self.br.as_ref(),
            _ => None,
        };
        v.unwrap_or(&self.identity)
    }

    pub fn available(&self) -> [bool; 3] {
        [true, self.gzip.is_some(), self.br.is_some()]
    }

    pub fn has_encodings(&self) -> bool {
        self.gzip.is_some() || self.br.is_some()
    }

    /// The identities of the watched files, in `watch` order.
    pub fn same_files(&self, stats: &[Option<FileStat>]) -> bool {
        self.watch.len() == stats.len() && self.watch.iter().zip(stats).all(|(w, s)| w.stat == *s)
    }

    /// Re-`stat`s every watched file: true if nothing was changed, added or removed.
    pub fn still_valid(&self, root: &Root) -> bool {
        if self.evicted.load(Ordering::Acquire) {
            return false;
        }
        self.watch.iter().all(|w| match root.stat_at(&w.rel) {
            Ok(st) if st.kind == Kind::File => w.stat == Some(st),
            Ok(_) => w.stat.is_none(),
            Err(e) if is_absent(&e) => w.stat.is_none(),
            Err(_) => false,
        })
    }

    /// Memory held (bodies + header blocks + bookkeeping) and descriptors held.
    pub fn cost(&self) -> (u64, u64) {
        let mut bytes = 512 + self.last_modified.len() as u64;
        let mut files = 0;
        for v in [Some(&self.identity), self.gzip.as_ref(), self.br.as_ref()]
            .into_iter()
            .flatten()
        {
            bytes += (v.etag.len() + v.head_200.len() + v.head_304.len()) as u64 + 64;
            match v.source {
                Source::Memory(_) => bytes += v.len,
                Source::File(_) => files += 1,
            }
        }
        bytes += self
            .watch
            .iter()
            .map(|w| w.rel.as_bytes().len() as u64 + 48)
            .sum::<u64>();
        (bytes, files)
    }

    /// Loads the file (reading it if small, keeping the descriptor if large), takes or builds
    /// its compressed variants and serialises every header block.
    /// `siblings` are the `.gz` and `.br` candidates, if they were looked for.
    pub fn build(
        main: Found,
        siblings: Option<[Found; 2]>,
        opts: &BuildOpts<'_>,
        compressions: &std::sync::atomic::AtomicU64,
    ) -> io::Result<Entry> {
        let (Some(file), Some(stat)) = (main.file, main.stat) else {
            return Err(io::Error::from_raw_os_error(libc::ENOENT));
        };
        let (stat, data) = read_consistent(&file, stat, opts.max_cached_size)?;
        let name = std::path::Path::new(OsStr::from_bytes(main.rel.as_bytes()));
        let (content_type, mime) = encoding::content_type(name);
        let base_tag = etag_base(&stat);

        let identity_source = match data {
            Some(bytes) => Source::Memory(Bytes::from(bytes)),
            None => Source::File(Arc::new(file)),
        };

        let mut watch = vec![Watched {
            rel: main.rel,
            stat: Some(stat),
        }];
        let mut encoded: [Option<(u64, Source, String)>; 2] = [None, None];
        let suffixes = ["gz", "br"];
        if let Some(sibs) = siblings {
            for (i, sib) in sibs.into_iter().enumerate() {
                let mut sib_stat = sib.stat;
                if let (Some(f), Some(st)) = (sib.file, sib.stat) {
                    let (st, data) = read_consistent(&f, st, opts.max_cached_size)?;
                    sib_stat = Some(st);
                    let source = match data {
                        Some(bytes) => Source::Memory(Bytes::from(bytes)),
                        None => Source::File(Arc::new(f)),
                    };
                    encoded[i] = Some((
                        st.size,
                        source,
                        format!("{}-{}", etag_base(&st), suffixes[i]),
                    ));
                }
                watch.push(Watched {
                    rel: sib.rel,
                    stat: sib_stat,
                });
            }
        }
        if let Source::Memory(body) = &identity_source {
            if encoding::compressible(mime) && body.len() >= 128 {
                for (i, slot) in encoded.iter_mut().enumerate() {
                    if slot.is_some() {
                        continue;
                    }
                    compressions.fetch_add(1, Ordering::Relaxed);
                    let out = if i == 0 {
                        encoding::gzip(body)
                    } else {
                        encoding::brotli(body)
                    };
                    if !out.is_empty() && encoding::worth_it(body.len(), out.len()) {
                        let tag = format!("{base_tag}-{}", suffixes[i]);
                        *slot = Some((out.len() as u64, Source::Memory(Bytes::from(out)), tag));
                    }
                }
            }
        }

        // The newest of the files the representations come from, so that replacing only a
        // precompressed sibling still fails an If-Modified-Since.
        let mtime_secs = watch
            .iter()
            .filter_map(|w| w.stat)
            .map(|s| s.mtime_secs())
            .max();
        let mtime_secs = mtime_secs.unwrap_or_else(|| stat.mtime_secs());
        let last_modified = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(mtime_secs))
            .into_bytes()
            .into_boxed_slice();
        let vary = encoded.iter().any(Option::is_some);
        let blocks = Blocks {
            content_type: &content_type,
            last_modified: &last_modified,
            cache_control: opts.cache_control,
            vary,
        };
        let identity = blocks.variant(stat.size, identity_source, base_tag.clone(), None);
        let [gz, br] = encoded;
        let gzip = gz.map(|(len, src, tag)| blocks.variant(len, src, tag, Some("gzip")));
        let br = br.map(|(len, src, tag)| blocks.variant(len, src, tag, Some("br")));
        Ok(Entry {
            identity,
            gzip,
            br,
            mtime_secs,
            last_modified,
            watch,
            evicted: AtomicBool::new(false),
            charge: None,
        })
    }
}

/// `inode-mtime_ns-size` in hex: changes whenever the file is replaced or modified.
fn etag_base(st: &FileStat) -> String {
    format!("\"{:x}-{:x}-{:x}", st.ino, st.mtime_ns(), st.size)
}

struct Blocks<'a> {
    content_type: &'a str,
    last_modified: &'a [u8],
    cache_control: Option<&'a str>,
    vary: bool,
}

impl Blocks<'_> {
    /// `tag` is the unterminated quoted tag (`"…`); the closing quote is added here.
    fn variant(&self, len: u64, source: Source, tag: String, coding: Option<&str>) -> Variant {
        let mut etag = tag.into_bytes();
        etag.push(b'"');
        let mut h304 = Vec::with_capacity(160);
        line(&mut h304, "ETag", &etag);
        line(&mut h304, "Last-Modified", self.last_modified);
        if let Some(cc) = self.cache_control {
            line(&mut h304, "Cache-Control", cc.as_bytes());
        }
        if self.vary {
            line(&mut h304, "Vary", b"Accept-Encoding");
        }
        let mut h200 = Vec::with_capacity(h304.len() + 96);
        line(&mut h200, "Content-Type", self.content_type.as_bytes());
        h200.extend_from_slice(&h304);
        match coding {
            Some(c) => line(&mut h200, "Content-Encoding", c.as_bytes()),
            // Ranges are served from the identity representation only, so only it says so.
            None => line(&mut h200, "Accept-Ranges", b"bytes"),
        }
        Variant {
            len,
            source,
            etag: etag.into_boxed_slice(),
            head_200: h200.into_boxed_slice(),
            head_304: h304.into_boxed_slice(),
        }
    }
}

fn line(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Errors that mean "there is no such file" rather than "something is wrong".
pub(crate) fn is_absent(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::EXDEV | libc::ENAMETOOLONG)
    )
}

/// Reads a file of at most `max` bytes whole, making sure it did not change meanwhile (stat
/// before and after agree and the byte count matches). Larger files are not read: `None`.
fn read_consistent(
    file: &File,
    mut stat: FileStat,
    max: u64,
) -> io::Result<(FileStat, Option<Vec<u8>>)> {
    for _ in 0..3 {
        if stat.size > max {
            return Ok((stat, None));
        }
        // One byte extra so growth since the stat is noticed.
        let mut data = vec![0u8; stat.size as usize + 1];
        let mut n = 0;
        while n < data.len() {
            match file.read_at(&mut data[n..], n as u64) {
                Ok(0) => break,
                Ok(r) => n += r,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let after = fstat(file)?;
        if after == stat && n as u64 == stat.size {
            data.truncate(n);
            return Ok((stat, Some(data)));
        }
        stat = after;
    }
    // Being rewritten right now: let the client retry.
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}
