//! An `app` route: the IPv4 Games, at most one per server.

use std::path::Path;

use super::file::RouteFile;
use super::plan::{AppPlan, RouteKind};
use super::problems::Problems;
use super::route::{kind_keys, KindKey};

/// The keys of an app route besides `app`.
pub(super) const KEYS: &[KindKey] = kind_keys![data, store, pages];

pub(super) fn check_app(
    route: &RouteFile,
    dir: &Path,
    p: &mut Problems<'_>,
    app: &mut Option<(AppPlan, usize)>,
) -> Option<RouteKind> {
    let name = route.app.as_ref()?;
    let mut ok = true;
    if name.get_ref() != "ipv4-games" {
        p.at(
            name.span().start,
            format!(
                "unknown app {:?}: the one app is \"ipv4-games\"",
                name.get_ref()
            ),
        );
        ok = false;
    }
    if !route.path.get_ref().trim_end_matches('/').is_empty() {
        p.at(
            route.path.span().start,
            "the app answers absolute paths (/claim/NAME, /score...): give it path = \"/\"",
        );
        ok = false;
    }
    let store = match (&route.data, &route.store) {
        (None, None) => {
            p.at(
                name.span().start,
                "an app route needs `data` (the folder of its journal) or `store` (a postgres:// URL)",
            );
            return None;
        }
        (Some(_), Some(store)) => {
            p.at(
                store.span().start,
                "give an app route `data` or `store`, not both",
            );
            return None;
        }
        (_, Some(store)) => {
            let url = store.get_ref();
            let endpoints = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
                tern_ipv4_games::store::postgres::endpoints(url)
            } else {
                Err(format!("{url:?} is not a postgres:// URL"))
            };
            if let Err(e) = endpoints {
                p.at(store.span().start, format!("store: {e}"));
                ok = false;
            }
            Some(url.clone())
        }
        (Some(_), None) => None,
    };
    let pages = match &route.pages {
        Some(pages) => {
            let path = dir.join(pages.get_ref());
            if !path.is_dir() {
                p.at(
                    pages.span().start,
                    format!("pages {} is not a folder", path.display()),
                );
                ok = false;
            }
            path
        }
        None => tern_ipv4_games::bundled_site(),
    };
    let plan = AppPlan {
        data: route.data.as_ref().map(|d| dir.join(d.get_ref())),
        store,
        pages,
    };
    if let Some((_, line)) = app {
        p.at(
            name.span().start,
            format!("at most one app route: the IPv4 Games runs once per server (line {line})"),
        );
        return None;
    }
    *app = Some((plan, p.line(name.span().start)));
    ok.then_some(RouteKind::App)
}

#[cfg(test)]
mod tests {
    use super::super::testing::problems;

    #[test]
    fn app_routes_are_checked() {
        let e = problems("[[site]]\nname = \"g\"\nhosts = [\"g.test\"]\n[[site.route]]\npath = \"/game\"\napp = \"ipv4-games\"\ndata = \"d\"\n");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(
            e[0].starts_with("line 5: the app answers absolute paths"),
            "{e:?}"
        );
        let e = problems("[[site]]\nname = \"g\"\nhosts = [\"g.test\"]\n[[site.route]]\npath = \"/\"\napp = \"chess\"\n");
        assert!(e[0].starts_with("line 6: unknown app \"chess\""), "{e:?}");
        assert!(
            e[1].starts_with("line 6: an app route needs `data`"),
            "{e:?}"
        );
        let two = "[[site]]\nname = \"g\"\nhosts = [\"g.test\"]\n[[site.route]]\npath = \"/\"\napp = \"ipv4-games\"\ndata = \"d\"\n[[site]]\nname = \"h\"\nhosts = [\"h.test\"]\n[[site.route]]\npath = \"/\"\napp = \"ipv4-games\"\ndata = \"e\"\n";
        assert_eq!(
            problems(two),
            ["line 13: at most one app route: the IPv4 Games runs once per server (line 6)"]
        );
    }
}
