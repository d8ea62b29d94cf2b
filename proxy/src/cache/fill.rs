//! The fill of one entry as the relay writes a miss's answer, its refresh by a 304, and the
//! invalidation an unsafe method's success makes.

use std::sync::Arc;

use super::answer::{answer, Validators};
use super::counts::{Count, Counts};
use bytes::Bytes;
use tern_cache::policy::{self, invalidates};
use tern_cache::purge::{is_tag_field, tags_of};
use tern_cache::{
    judge_answer, AnswerFacts, Entry, Field, FillMark, Key, Rules, Spill, Store, StoredBody,
    Target, Uncacheable,
};
use tern_server::{AnswerTee, CacheOutcome, Response};

/// The fill of one entry, fed by the relay.
pub(super) struct Fill {
    pub(super) store: Arc<Store>,
    pub(super) rules: Arc<Rules>,
    pub(super) counts: Arc<Counts>,
    /// The worker whose relay feeds this fill (its counts block).
    pub(super) worker: usize,
    pub(super) key: Key,
    /// What the entry is for, and the store's purges when the fill began (one since: not
    /// stored, see `Store::insert_unless_purged`).
    pub(super) target: Arc<Target>,
    pub(super) purges: u64,
    pub(super) authorized: bool,
    /// The head kept, once judged storable.
    pub(super) kept: Option<Kept>,
    /// The key's fill in flight, which misses for it wait on: ended when this is dropped.
    pub(super) mark: Option<FillMark>,
    /// The stale entry a conditional refresh asked the app about: a 304 refreshes it.
    pub(super) refresh: Option<Arc<Entry>>,
    /// Writes `Cache-Status` on the answer it gives for a 304.
    pub(super) status_field: bool,
}

pub(super) struct Kept {
    pub(super) status: u16,
    pub(super) head: Vec<u8>,
    pub(super) tags: Vec<Box<str>>,
    pub(super) body: KeptBody,
    pub(super) freshness: tern_cache::Freshness,
    pub(super) etag: Option<Bytes>,
    pub(super) last_modified: Option<Bytes>,
}

/// The body as it comes: in memory up to the memory tier's largest object, then in a file
/// of the cache's folder, if it has one.
pub(super) enum KeptBody {
    Memory(Vec<u8>),
    Disk(Spill),
}

/// Fields of a serialised block (`Name: value\r\n` lines).
pub(super) fn fields_of(block: &[u8]) -> Vec<Field<'_>> {
    block
        .split(|&b| b == b'\n')
        .filter_map(|line| {
            let line = line.strip_suffix(b"\r")?;
            let colon = line.iter().position(|&b| b == b':')?;
            let name = std::str::from_utf8(&line[..colon]).ok()?;
            Some((name, line[colon + 1..].trim_ascii()))
        })
        .collect()
}

impl Fill {
    /// Moves the body to a file of the cache's folder with `data` after it (a body too
    /// large for memory); false when it cannot be (no folder, over its largest object, a
    /// failed write: counted, the entry given up, the client's answer unchanged).
    fn spill(&mut self, data: &[u8]) -> bool {
        let Some(kept) = self.kept.as_mut() else {
            return false;
        };
        let Some((tier, _)) = self.store.disk() else {
            self.kept = None;
            return self.refuse(Uncacheable::TooLarge);
        };
        let written = tier.create().and_then(|mut spill| {
            if let KeptBody::Memory(v) = &kept.body {
                spill.write(v)?;
            }
            spill.write(data)?;
            Ok(spill)
        });
        match written {
            Ok(spill) => {
                kept.body = KeptBody::Disk(spill);
                true
            }
            Err(e) => self.disk_failed(&e),
        }
    }

    /// A write to the cache's folder failed (full, gone, read-only): this answer is not
    /// stored, and says so once in the log.
    fn disk_failed(&mut self, e: &std::io::Error) -> bool {
        self.kept = None;
        self.counts.bump(self.worker, Count::DiskWriteFailed);
        if let Some((tier, _)) = self.store.disk() {
            tracing::warn!(
                "cache folder {}: {e}: the answer is sent, not stored",
                tier.folder().display()
            );
        }
        if let Some(mark) = self.mark.as_mut() {
            mark.not_stored();
        }
        false
    }

    fn refuse(&mut self, why: Uncacheable) -> bool {
        self.counts.bump(self.worker, Count::Uncacheable(why));
        if let Some(mark) = self.mark.as_mut() {
            mark.not_stored();
        }
        false
    }
}

impl AnswerTee for Fill {
    fn head(
        &mut self,
        head: &Response,
        content_length: Option<u64>,
        date: Option<&[u8]>,
        unix_secs: u64,
    ) -> bool {
        let mut fields = fields_of(head.headers());
        // Its Date, for its age when it came (and `Expires − Date`); not stored: each hit
        // goes out with the connection's own Date.
        if let Some(date) = date {
            fields.push(("date", date));
        }
        let facts = AnswerFacts {
            status: head.status,
            fields: &fields,
            content_length,
            authorized: self.authorized,
            now: unix_secs,
        };
        let freshness = match judge_answer(&self.rules, &facts) {
            Ok(f) => f,
            Err(why) => return self.refuse(why),
        };
        // Each hit writes its own Age (and the connection its own Date); the tags are kept
        // apart, for purges, and never sent.
        let mut stored = Vec::with_capacity(head.headers().len());
        for line in head.headers().split_inclusive(|&b| b == b'\n') {
            let name = line.split(|&b| b == b':').next().unwrap_or_default();
            if !name.eq_ignore_ascii_case(b"age") && !is_tag_field(name) {
                stored.extend_from_slice(line);
            }
        }
        let field = |name: &str| {
            policy::values(&fields, name)
                .next()
                .map(Bytes::copy_from_slice)
        };
        let in_memory = self.store.max_object();
        self.kept = Some(Kept {
            status: head.status,
            etag: field("etag"),
            last_modified: field("last-modified"),
            head: stored,
            tags: tags_of(fields.iter().copied()),
            body: KeptBody::Memory(Vec::with_capacity(
                content_length.unwrap_or(0).min(in_memory) as usize,
            )),
            freshness,
        });
        // A body announced too large for memory goes to the folder from its first byte.
        if content_length.is_some_and(|n| n > in_memory) {
            return self.spill(&[]);
        }
        true
    }

    fn body(&mut self, data: &[u8]) -> bool {
        let Some(kept) = self.kept.as_mut() else {
            return false;
        };
        let len = match &kept.body {
            KeptBody::Memory(v) => v.len() as u64,
            KeptBody::Disk(spill) => spill.len(),
        };
        // (rules.max_object is the largest object of either tier.)
        if len + data.len() as u64 > self.rules.max_object {
            self.kept = None;
            return self.refuse(Uncacheable::TooLarge);
        }
        match &mut kept.body {
            KeptBody::Memory(v) if len + data.len() as u64 <= self.store.max_object() => {
                v.extend_from_slice(data);
                true
            }
            KeptBody::Memory(_) => self.spill(data),
            KeptBody::Disk(spill) => match spill.write(data) {
                Ok(()) => true,
                Err(e) => self.disk_failed(&e),
            },
        }
    }

    fn not_modified(
        &mut self,
        head: &Response,
        date: Option<&[u8]>,
        unix_secs: u64,
    ) -> Option<Response> {
        let old = self.refresh.take()?;
        self.counts.bump(self.worker, Count::Revalidated);
        let status = self
            .status_field
            .then_some(&b"tern; fwd=stale; fwd-status=304"[..]);
        let none = Validators::kept(None, None);
        let Some(entry) = self.refreshed(&old, head, date, unix_secs) else {
            // Confirmed, but no longer to be kept (the 304 says no-store, say): this client
            // still gets the body the app confirmed.
            self.store.remove(&self.key);
            if let Some(mark) = self.mark.as_mut() {
                mark.not_stored();
            }
            return Some(answer(
                &none,
                &old,
                unix_secs,
                status,
                CacheOutcome::Revalidated,
                || {},
            ));
        };
        let r = answer(
            &none,
            &entry,
            unix_secs,
            status,
            CacheOutcome::Revalidated,
            || {},
        );
        self.counts.bump(self.worker, Count::Stored);
        self.store
            .insert_unless_purged(self.purges, self.key, entry);
        if let Some(mark) = self.mark.as_mut() {
            mark.stored();
        }
        Some(r)
    }

    fn unsized_body(&mut self) {
        // Not counted: nothing was judged. Waiters go to the app rather than take over a
        // fill that would end the same way.
        if let Some(mark) = self.mark.as_mut() {
            mark.not_stored();
        }
    }

    fn end(mut self: Box<Self>, _unix_secs: u64) {
        let Some(kept) = self.kept.take() else {
            return;
        };
        self.counts.bump(self.worker, Count::Stored);
        self.store.insert_unless_purged(
            self.purges,
            self.key,
            Entry {
                status: kept.status,
                head: Bytes::from(kept.head),
                body: match kept.body {
                    KeptBody::Memory(v) => StoredBody::Memory(Bytes::from(v)),
                    KeptBody::Disk(spill) => StoredBody::Disk(Arc::new(spill.finish())),
                },
                freshness: kept.freshness,
                etag: kept.etag,
                last_modified: kept.last_modified,
                target: self.target.clone(),
                tags: kept.tags.into(),
                copies: Arc::default(),
            },
        );
        // (The store may still refuse it, over its size: waiters then find no entry and go
        // to the app.)
        if let Some(mark) = self.mark.as_mut() {
            mark.stored();
        }
    }
}

impl Fill {
    /// `old` with the fields of the app's 304 (`head`) in place of its own of those names
    /// (RFC 9111 §4.3.4), its lifetime judged again from them; None: not to be kept.
    pub(super) fn refreshed(
        &self,
        old: &Entry,
        head: &Response,
        date: Option<&[u8]>,
        now: u64,
    ) -> Option<Entry> {
        let name_of = |line: &[u8]| -> Vec<u8> {
            let name = line.split(|&b| b == b':').next().unwrap_or_default();
            name.to_ascii_lowercase()
        };
        let new_names: Vec<Vec<u8>> = head
            .headers()
            .split_inclusive(|&b| b == b'\n')
            .map(name_of)
            .collect();
        let mut merged = Vec::with_capacity(old.head.len() + head.headers().len());
        for line in old.head.split_inclusive(|&b| b == b'\n') {
            if !new_names.contains(&name_of(line)) {
                merged.extend_from_slice(line);
            }
        }
        for line in head.headers().split_inclusive(|&b| b == b'\n') {
            let name = name_of(line);
            if name != b"age" && !is_tag_field(&name) {
                merged.extend_from_slice(line);
            }
        }
        // A 304 with tags tags the entry anew; one without keeps its tags.
        let new_tags = tags_of(fields_of(head.headers()).into_iter());
        let tags = match new_tags.is_empty() {
            true => old.tags.clone(),
            false => new_tags.into(),
        };
        let mut fields = fields_of(&merged);
        if let Some(date) = date {
            fields.push(("date", date));
        }
        let facts = AnswerFacts {
            status: old.status,
            fields: &fields,
            content_length: Some(old.body.len()),
            authorized: self.authorized,
            now,
        };
        let freshness = judge_answer(&self.rules, &facts).ok()?;
        let field = |name: &str| {
            policy::values(&fields, name)
                .next()
                .map(Bytes::copy_from_slice)
        };
        Some(Entry {
            status: old.status,
            etag: field("etag"),
            last_modified: field("last-modified"),
            head: Bytes::from(merged),
            body: old.body.clone(),
            freshness,
            target: old.target.clone(),
            tags,
            // The same body: its copies hold.
            copies: old.copies.clone(),
        })
    }

    /// The same fill, not begun.
    pub(super) fn clone_empty(&self) -> Fill {
        Fill {
            store: self.store.clone(),
            rules: self.rules.clone(),
            counts: self.counts.clone(),
            worker: self.worker,
            key: self.key,
            target: self.target.clone(),
            // It begins now: a purge before this has nothing of it to drop.
            purges: self.store.purges(),
            authorized: self.authorized,
            kept: None,
            mark: None,
            refresh: None,
            status_field: self.status_field,
        }
    }
}

/// An unsafe method's answer: a success drops the target's entry (RFC 9111 §4.4).
pub(super) struct Invalidation {
    pub(super) store: Arc<Store>,
    pub(super) counts: Arc<Counts>,
    pub(super) worker: usize,
    pub(super) key: Key,
}

impl AnswerTee for Invalidation {
    fn head(
        &mut self,
        head: &Response,
        _content_length: Option<u64>,
        _date: Option<&[u8]>,
        _unix_secs: u64,
    ) -> bool {
        if invalidates(head.status) {
            self.counts.bump(self.worker, Count::Invalidated);
            self.store.remove(&self.key);
        }
        false
    }

    fn body(&mut self, _data: &[u8]) -> bool {
        false
    }

    fn end(self: Box<Self>, _unix_secs: u64) {}
}
