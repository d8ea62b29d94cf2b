//! A `counters` route: the server's and the process's counters, for loopback and trusted
//! peers.

use super::file::RouteFile;
use super::plan::RouteKind;
use super::problems::Problems;
use super::route::{kind_keys, KindKey};

/// The keys of a counters route besides `counters`.
pub(super) const KEYS: &[KindKey] = kind_keys![trusted_proxies];

pub(super) fn check_counters(route: &RouteFile, p: &mut Problems<'_>) -> Option<RouteKind> {
    let kind = route.counters.as_ref()?;
    let prometheus = match kind.get_ref().as_str() {
        "statusz" => false,
        "metrics" => true,
        other => {
            p.at(
                kind.span().start,
                format!("counters {other:?}: use \"statusz\" (name: value lines) or \"metrics\" (Prometheus)"),
            );
            return None;
        }
    };
    let mut trusted = tern_services::TrustedProxies::default();
    if let Some(t) = &route.trusted_proxies {
        match tern_services::TrustedProxies::parse(t.get_ref()) {
            Ok(list) => trusted = list,
            Err(e) => {
                p.at(t.span().start, format!("trusted_proxies: {e}"));
                return None;
            }
        }
    }
    Some(RouteKind::Counters {
        prometheus,
        trusted,
    })
}
