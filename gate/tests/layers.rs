//! The files of `gate/src` form layers, and imports point down only: leaves that know nothing
//! of the gate (its config, keys, paths, prefixes), the mechanisms built on them (tokens,
//! challenges, limits, the policy, checkers, pages), the loaded state that holds them, the
//! handling of requests, and `lib.rs` on top. Checked by the server's layer checker
//! (`server/tests/support/layer_check.rs`): an import that points up, a cycle between files of
//! one layer, or a file not placed below fails the test.

#[path = "../../server/tests/support/layer_check.rs"]
mod layer_check;

use std::path::Path;

use layer_check::{check, Layer, Layers};

const GATE: Layers = Layers {
    layers: &[
        // Know nothing else of the gate.
        Layer {
            name: "leaves",
            uses: &[],
        },
        // What a client proves and what it is held to.
        Layer {
            name: "mechanisms",
            uses: &["leaves"],
        },
        // `Gate`: the loaded config with its keys, policy, limits and pool, and reloads.
        Layer {
            name: "state",
            uses: &["mechanisms", "leaves"],
        },
        // One request: the guard's decision, and the gate's own addresses.
        Layer {
            name: "requests",
            uses: &["state", "mechanisms", "leaves"],
        },
        Layer {
            name: "root",
            uses: &["requests", "state", "mechanisms", "leaves"],
        },
    ],
    files: &[
        ("config.rs", "leaves"),
        ("form.rs", "leaves"),
        ("keyring.rs", "leaves"),
        ("path.rs", "leaves"),
        ("prefix.rs", "leaves"),
        ("redirect.rs", "leaves"),
        ("stats.rs", "leaves"),
        ("checkers.rs", "mechanisms"),
        ("csrf.rs", "mechanisms"),
        ("limits.rs", "mechanisms"),
        ("pages.rs", "mechanisms"),
        ("policy.rs", "mechanisms"),
        ("pool.rs", "mechanisms"),
        ("pow.rs", "mechanisms"),
        ("token.rs", "mechanisms"),
        ("state.rs", "state"),
        ("guard.rs", "requests"),
        ("endpoints.rs", "requests"),
        ("lib.rs", "root"),
    ],
};

#[test]
fn imports_point_down_and_layers_have_no_cycles() {
    let problems = GATE.table_problems();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let problems = check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &GATE);
    assert!(
        problems.is_empty(),
        "gate/src breaks its layers ({} problems):\n{}",
        problems.len(),
        problems.join("\n")
    );
}
