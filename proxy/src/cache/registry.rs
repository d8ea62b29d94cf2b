//! The named caches of the process: one store each, shared by the routes that name it and
//! kept across reloads; purges and /metrics read them here.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use super::counts::{Count, Counts};
use tern_cache::{Bypass, DiskTier, Keyer, Purge, Store, Uncacheable};

/// The process's key secret: drawn once, kept across reloads (so entries stay valid).
pub(super) fn keyer() -> &'static Keyer {
    static KEYER: OnceLock<Keyer> = OnceLock::new();
    KEYER.get_or_init(Keyer::new)
}

/// A cache's sizes and folder: its store is kept across a reload while these stay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreShape {
    pub memory: u64,
    pub max_object: u64,
    /// The folder for bodies over `max_object`, its size and its largest body.
    pub disk: Option<(PathBuf, u64, u64)>,
}

type Named = HashMap<String, (StoreShape, Arc<Store>, Arc<Counts>)>;

fn named() -> std::sync::MutexGuard<'static, Named> {
    static STORES: OnceLock<Mutex<Named>> = OnceLock::new();
    STORES
        .get_or_init(|| {
            tern_services::metrics::add_metrics_source(metrics);
            Default::default()
        })
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// A named cache and its counts: the same across reloads while its shape stays the same
/// (`workers`: the server's, which a reload does not change). A folder that cannot be made
/// or cleared is an error.
pub fn shared_store(
    name: &str,
    shape: &StoreShape,
    workers: usize,
) -> Result<(Arc<Store>, Arc<Counts>), String> {
    let mut stores = named();
    if let Some((kept, store, counts)) = stores.get(name) {
        if kept == shape {
            return Ok((store.clone(), counts.clone()));
        }
    }
    let mut store = Store::new(shape.memory, shape.max_object);
    if let Some((folder, size, max_object)) = &shape.disk {
        let tier = DiskTier::open(folder)
            .map_err(|e| format!("cache {name:?}: folder {}: {e}", folder.display()))?;
        store = store.with_disk(tier, *size, *max_object);
    }
    let store = Arc::new(store);
    let counts = Arc::new(Counts::new(workers));
    stores.insert(
        name.to_owned(),
        (shape.clone(), store.clone(), counts.clone()),
    );
    Ok((store, counts))
}

/// Drops what `purge` names from the cache called `name`, or from every cache; how many
/// entries each lost, by name. An unknown name is an error (a typo must not look like a
/// purge that found nothing).
pub fn purge(purge: &Purge, name: Option<&str>) -> Result<Vec<(String, u64)>, String> {
    let stores = named();
    if let Some(name) = name {
        if !stores.contains_key(name) {
            let mut known: Vec<&str> = stores.keys().map(String::as_str).collect();
            known.sort_unstable();
            return Err(format!(
                "no cache named {name:?} (this server has: {})",
                if known.is_empty() {
                    "none".to_owned()
                } else {
                    known.join(", ")
                }
            ));
        }
    }
    let mut purged: Vec<(String, u64)> = stores
        .iter()
        .filter(|(n, _)| name.is_none_or(|name| name == n.as_str()))
        .map(|(n, (_, store, _))| (n.clone(), store.purge(purge)))
        .collect();
    purged.sort_unstable();
    Ok(purged)
}

/// Every named cache's figures for /metrics (`tern_cache_*{cache="NAME"}`), the series of
/// one name together.
pub(super) fn metrics() -> Vec<tern_services::metrics::Metric> {
    use tern_services::metrics::Metric;
    let stores = named();
    let mut caches: Vec<(&String, &Arc<Store>, &Arc<Counts>)> =
        stores.iter().map(|(n, (_, s, c))| (n, s, c)).collect();
    caches.sort_by(|a, b| a.0.cmp(b.0));
    let mut out = Vec::new();
    type Figures<'a> = &'a dyn Fn(&Arc<Store>, &Arc<Counts>) -> Vec<Metric>;
    let mut each = |make: Figures<'_>| {
        for (name, store, counts) in &caches {
            out.extend(
                make(store, counts)
                    .into_iter()
                    .map(|m| m.with_label("cache", (*name).clone())),
            );
        }
    };
    const LOOKUPS: &str = "cached requests looked up, by result: hit (not_modified: a hit \
                           answered 304), miss (expired: a stale entry found)";
    each(&|_, c| {
        [
            (Count::Hit, "hit"),
            (Count::NotModified, "not_modified"),
            (Count::Miss, "miss"),
            (Count::Expired, "expired"),
        ]
        .into_iter()
        .map(|(k, result)| {
            Metric::counter("cache_lookups", LOOKUPS, c.total(k)).with_label("result", result)
        })
        .collect()
    });
    each(&|_, c| {
        Bypass::ALL
            .into_iter()
            .map(|b| {
                Metric::counter(
                    "cache_bypassed",
                    "requests sent past the cache, by cause",
                    c.total(Count::Bypassed(b)),
                )
                .with_label("cause", b.name())
            })
            .collect()
    });
    each(&|_, c| {
        Uncacheable::ALL
            .into_iter()
            .map(|u| {
                Metric::counter(
                    "cache_uncacheable",
                    "answers to misses not stored, by cause",
                    c.total(Count::Uncacheable(u)),
                )
                .with_label("cause", u.name())
            })
            .collect()
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_stored",
            "answers stored",
            c.total(Count::Stored),
        )]
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_invalidations",
            "entries dropped by a successful unsafe method on their target",
            c.total(Count::Invalidated),
        )]
    });
    each(&|_, c| {
        [
            (Count::StaleUpdating, "updating"),
            (Count::StaleError, "error"),
        ]
        .into_iter()
        .map(|(k, reason)| {
            Metric::counter(
                "cache_stale_served",
                "stale entries served, by reason: another request refreshing it, the app failing",
                c.total(k),
            )
            .with_label("reason", reason)
        })
        .collect()
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_revalidated",
            "stale entries the app confirmed (304 to a conditional refresh), refreshed in place",
            c.total(Count::Revalidated),
        )]
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_waits",
            "misses that waited for another request's fill of their key",
            c.total(Count::Waited),
        )]
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_coalesced",
            "misses answered from the fill of another request for their key, which they waited for",
            c.total(Count::Coalesced),
        )]
    });
    each(&|_, c| {
        vec![Metric::counter(
            "cache_lock_timeouts",
            "misses that waited the lock time for another request's fill, then went to the app uncached",
            c.total(Count::LockTimeout),
        )]
    });
    each(&|s, _| {
        vec![
            Metric::counter("cache_purges", "purges run (tern cache purge)", s.purges()),
            Metric::counter(
                "cache_purged",
                "entries dropped by purges",
                s.purged_entries(),
            ),
        ]
    });
    each(&|s, _| {
        vec![Metric::counter(
            "cache_evictions",
            "entries evicted to make room",
            s.evictions(),
        )]
    });
    each(&|s, _| {
        vec![Metric::gauge(
            "cache_memory_bytes",
            "bytes the entries take (heads, bodies, overhead)",
            s.bytes() as f64,
        )]
    });
    each(&|s, c| {
        const DISK_ERRORS: &str = "failures of the cache's folder, by operation: a write (the \
                                   answer sent, not stored), a read (a file cut short: its entry \
                                   dropped, the request sent to the app)";
        let mut out = vec![
            Metric::counter(
                "cache_disk_errors",
                DISK_ERRORS,
                c.total(Count::DiskWriteFailed),
            )
            .with_label("op", "write"),
            Metric::counter("cache_disk_errors", DISK_ERRORS, s.damaged_files())
                .with_label("op", "read"),
        ];
        if s.disk().is_some() {
            out.push(Metric::gauge(
                "cache_disk_bytes",
                "bytes of bodies in the cache's folder (being written, and dropped but still being sent, included)",
                s.disk_bytes() as f64,
            ));
        }
        out
    });
    each(&|s, _| {
        vec![Metric::gauge(
            "cache_entries",
            "entries held",
            s.len() as f64,
        )]
    });
    out
}
