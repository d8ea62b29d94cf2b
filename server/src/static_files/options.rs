//! A [`StaticFiles`](super::StaticFiles) handler's options, and the settings in force (options
//! plus the reload that set them), which the handler and its caches both read.

use std::path::PathBuf;

/// Configuration of a [`StaticFiles`] handler.
#[derive(Debug, Clone)]
pub struct StaticOptions {
    /// The directory served. Nothing outside it is ever reachable.
    pub root: PathBuf,
    /// Serve files and directories whose name starts with `.` (default: 404 for them).
    pub serve_dotfiles: bool,
    /// `Cache-Control` value sent on 200, 206 and 304 answers.
    pub cache_control: Option<String>,
    /// Files up to this size are held in memory (with gzip/br variants); larger ones are sent
    /// from disk with sendfile.
    pub max_cached_size: u64,
    /// File served for a directory request (`/dir/`).
    pub index_file: String,
}

impl StaticOptions {
    pub fn new(root: impl Into<PathBuf>) -> StaticOptions {
        StaticOptions {
            root: root.into(),
            ..StaticOptions::default()
        }
    }
}

impl Default for StaticOptions {
    fn default() -> Self {
        StaticOptions {
            root: PathBuf::from("."),
            serve_dotfiles: false,
            cache_control: None,
            max_cached_size: 64 * 1024,
            index_file: "index.html".to_owned(),
        }
    }
}

/// The options in force and the reload that set them (0: the constructor's).
pub(crate) struct Settings {
    pub gen: u64,
    pub opts: StaticOptions,
}
