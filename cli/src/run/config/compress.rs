//! On-the-fly compression: `compress`, `compress_min_size`, `compress_types` and
//! `compress_level`, on a site (the default of its routes) or a route.

use std::collections::BTreeMap;

use toml::Spanned;

use super::file::{Codings, RouteFile, SiteFile};
use super::problems::Problems;

/// One level's compression keys (a site's or a route's): `compress = ["zstd", "br",
/// "gzip"]` (the server's preference; `true`: that list, `false`: off),
/// `compress_min_size = 512`, `compress_types = ["text/*", ...]`, `compress_level =
/// { gzip = 6, br = 5, zstd = 3 }`.
#[derive(Clone, Copy, Default)]
pub(super) struct CompressKeys<'a> {
    compress: Option<&'a Spanned<Codings>>,
    compress_min_size: Option<&'a Spanned<u64>>,
    compress_types: Option<&'a Spanned<Vec<String>>>,
    compress_level: Option<&'a Spanned<BTreeMap<String, u32>>>,
}

impl SiteFile {
    pub(super) fn compress_keys(&self) -> CompressKeys<'_> {
        CompressKeys {
            compress: self.compress.as_ref(),
            compress_min_size: self.compress_min_size.as_ref(),
            compress_types: self.compress_types.as_ref(),
            compress_level: self.compress_level.as_ref(),
        }
    }
}

impl RouteFile {
    pub(super) fn compress_keys(&self) -> CompressKeys<'_> {
        CompressKeys {
            compress: self.compress.as_ref(),
            compress_min_size: self.compress_min_size.as_ref(),
            compress_types: self.compress_types.as_ref(),
            compress_level: self.compress_level.as_ref(),
        }
    }
}

/// The server's order of preference when `compress = true`: zstd costs the server least for
/// a ratio like brotli's at these levels, gzip is what every client has.
const DEFAULT_CODINGS: [tern_compress::Encoding; 3] = [
    tern_compress::Encoding::Zstd,
    tern_compress::Encoding::Br,
    tern_compress::Encoding::Gzip,
];

/// Checks one level's compression keys (a site's or a route's); false when one is unusable.
pub(super) fn check_compress_keys(keys: CompressKeys<'_>, p: &mut Problems<'_>) -> bool {
    let mut ok = true;
    if let Some(c) = keys.compress {
        if let Codings::List(list) = c.get_ref() {
            if list.is_empty() {
                p.at(
                    c.span().start,
                    "compress = [] names no coding: write compress = false to turn it off",
                );
                ok = false;
            }
            for name in list {
                if tern_compress::Encoding::from_name(name).is_none() {
                    p.at(
                        c.span().start,
                        format!("compress: unknown coding {name:?}: the codings are \"zstd\", \"br\" and \"gzip\""),
                    );
                    ok = false;
                }
            }
            if ok {
                if let Err(e) = tern_compress::Policy::with_defaults(&codings(list)) {
                    p.at(c.span().start, format!("compress: {e}"));
                    ok = false;
                }
            }
        }
    }
    if let Some(types) = keys.compress_types {
        if let Err(e) = tern_compress::Policy::new(&DEFAULT_CODINGS, 0, types.get_ref()) {
            p.at(types.span().start, format!("compress_types: {e}"));
            ok = false;
        }
    }
    if let Some(levels) = keys.compress_level {
        if let Err(e) = levels_over(tern_compress::Levels::default(), levels.get_ref()) {
            p.at(levels.span().start, format!("compress_level: {e}"));
            ok = false;
        }
    }
    ok
}

/// `base` with the levels a `compress_level` table sets.
fn levels_over(
    mut base: tern_compress::Levels,
    table: &BTreeMap<String, u32>,
) -> Result<tern_compress::Levels, String> {
    for (name, level) in table {
        let coding = tern_compress::Encoding::from_name(name).ok_or_else(|| {
            format!("unknown coding {name:?}: the codings are \"zstd\", \"br\" and \"gzip\"")
        })?;
        base.set(coding, *level)?;
    }
    Ok(base)
}

fn codings(list: &[String]) -> Vec<tern_compress::Encoding> {
    list.iter()
        .filter_map(|n| tern_compress::Encoding::from_name(n))
        .collect()
}

/// The policy of checked keys, each taken from `own` if given there, else from `inherited`,
/// else the default; `None` when compression is off.
pub(super) fn compress_policy(
    own: CompressKeys<'_>,
    inherited: CompressKeys<'_>,
) -> Option<std::sync::Arc<tern_compress::Policy>> {
    let codings = match own.compress.or(inherited.compress)?.get_ref() {
        Codings::On(false) => return None,
        Codings::On(true) => DEFAULT_CODINGS.to_vec(),
        Codings::List(list) => codings(list),
    };
    let min = own
        .compress_min_size
        .or(inherited.compress_min_size)
        .map_or(tern_compress::DEFAULT_MIN_SIZE, |v| *v.get_ref());
    let types: Vec<String> = match own.compress_types.or(inherited.compress_types) {
        Some(t) => t.get_ref().clone(),
        None => tern_compress::DEFAULT_TYPES
            .iter()
            .map(|t| t.to_string())
            .collect(),
    };
    // The site's levels, then the route's own over them (checked already).
    let mut levels = tern_compress::Levels::default();
    for table in [inherited.compress_level, own.compress_level]
        .into_iter()
        .flatten()
    {
        levels = levels_over(levels, table.get_ref()).ok()?;
    }
    tern_compress::Policy::new(&codings, min, &types)
        .ok()
        .map(|p| std::sync::Arc::new(p.with_levels(levels)))
}

/// `compress_min_size` or `compress_types` where compression is off would do nothing: the
/// file probably meant something else.
pub(super) fn check_compress_off(keys: CompressKeys<'_>, on: bool, p: &mut Problems<'_>) {
    if on {
        return;
    }
    for (key, at) in [
        (
            "compress_min_size",
            keys.compress_min_size.map(|v| v.span().start),
        ),
        (
            "compress_types",
            keys.compress_types.map(|v| v.span().start),
        ),
        (
            "compress_level",
            keys.compress_level.map(|v| v.span().start),
        ),
    ] {
        if let Some(at) = at {
            p.at(
                at,
                format!("{key} does nothing here: compression is off (set compress)"),
            );
        }
    }
}
