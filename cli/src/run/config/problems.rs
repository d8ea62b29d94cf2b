//! The problems a check finds, each as `line N: what` (the line counting is `tern serve`'s
//! for its own file, in `crate::config`).

use toml::Spanned;

use crate::config::line_of;

/// Collects problems as `line N: what`.
pub(super) struct Problems<'t> {
    text: &'t str,
    /// The problems so far, in the order found.
    pub(super) list: Vec<String>,
}

impl<'t> Problems<'t> {
    pub(super) fn new(text: &'t str) -> Problems<'t> {
        Problems {
            text,
            list: Vec::new(),
        }
    }
}

impl Problems<'_> {
    pub(super) fn at(&mut self, offset: usize, what: impl std::fmt::Display) {
        self.list
            .push(format!("line {}: {what}", line_of(self.text, offset)));
    }

    pub(super) fn line(&self, offset: usize) -> usize {
        line_of(self.text, offset)
    }
}

/// Where a key's value starts in the file, if the key is there.
pub(super) fn at<T>(value: &Option<Spanned<T>>) -> Option<usize> {
    value.as_ref().map(|v| v.span().start)
}
