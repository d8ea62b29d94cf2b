//! The files of `proxy/src` form layers, and imports point down only: the upstream groups and
//! their health checks, the request head an upstream sees, the handlers built on both
//! (FastCGI), and `lib.rs` (with the proxy's own handler) on top. Checked by the server's
//! layer checker (`server/tests/support/layer_check.rs`): an import that points up, a cycle
//! between files of one layer, or a file not placed below fails the test.

#[path = "../../server/tests/support/layer_check.rs"]
mod layer_check;

use std::path::Path;

use layer_check::{check, Layer, Layers};

const PROXY: Layers = Layers {
    layers: &[
        // Which server takes a request; the checker thread that marks servers down.
        Layer {
            name: "upstreams",
            uses: &[],
        },
        // What the upstream is sent.
        Layer {
            name: "heads",
            uses: &[],
        },
        // The shared cache's parts: a hit's answer, a fill, a held miss, the counts and the
        // named stores.
        Layer {
            name: "cache parts",
            uses: &[],
        },
        // The cache's lookup, used by both handlers.
        Layer {
            name: "cache",
            uses: &["cache parts"],
        },
        Layer {
            name: "handlers",
            uses: &["cache", "heads", "upstreams"],
        },
        Layer {
            name: "root",
            uses: &["cache", "handlers", "heads", "upstreams"],
        },
    ],
    files: &[
        ("group.rs", "upstreams"),
        ("health.rs", "upstreams"),
        ("head.rs", "heads"),
        ("fastcgi.rs", "handlers"),
        ("cache/answer.rs", "cache parts"),
        ("cache/counts.rs", "cache parts"),
        ("cache/fill.rs", "cache parts"),
        ("cache/registry.rs", "cache parts"),
        ("cache/wait.rs", "cache parts"),
        ("cache/mod.rs", "cache"),
        ("lib.rs", "root"),
    ],
};

#[test]
fn imports_point_down_and_layers_have_no_cycles() {
    let problems = PROXY.table_problems();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let problems = check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &PROXY);
    assert!(
        problems.is_empty(),
        "proxy/src breaks its layers ({} problems):\n{}",
        problems.len(),
        problems.join("\n")
    );
}
