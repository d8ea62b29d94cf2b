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
        Layer {
            name: "handlers",
            uses: &["heads", "upstreams"],
        },
        Layer {
            name: "root",
            uses: &["handlers", "heads", "upstreams"],
        },
    ],
    files: &[
        ("group.rs", "upstreams"),
        ("health.rs", "upstreams"),
        ("head.rs", "heads"),
        ("fastcgi.rs", "handlers"),
        // The shared cache's lookup and fill, used by both handlers.
        ("cache.rs", "handlers"),
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
