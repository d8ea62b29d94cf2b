//! The modules of `server/src` form layers, and imports point down only: the handler API imports
//! nothing else of the crate; the exchange layer knows the API; connections know exchanges;
//! drivers know connections; the worker puts them together; `lib.rs` sits on top. The
//! checker (`support/layer_check.rs`, shared with gate's and proxy's layer tests) fails on an
//! import that points up, on a cycle between files of one layer, and on a file the table below
//! does not place. Test modules (`#[cfg(test)]` items) and comments do not count.

#[path = "support/layer_check.rs"]
mod layer_check;

use std::fs;
use std::path::Path;

use layer_check::{check, Layer, Layers};

/// Bottom to top. Each layer may import only layers listed before it.
const LAYERS: &[Layer] = &[
    // What handlers see: Handler, Request, Reply, Response, Router, Guard, Forward. It imports
    // nothing else of the crate, so apps depend on it alone.
    Layer {
        name: "api",
        uses: &[],
    },
    // Leaves a worker lends to its connections that know nothing of connections, workers or
    // the crate root: counters, bans, the slab, access logs, the server's settings.
    Layer {
        name: "support",
        uses: &["api"],
    },
    // Handlers built on the API alone (static files, content negotiation). Only the crate root
    // wires them in: the event loop never names one.
    Layer {
        name: "handlers",
        uses: &["api"],
    },
    // One request and its answer, whatever the protocol: route, run the handler, say what to do
    // with the outcome. Also the context a connection runs with (`ConnCx`), built by the worker.
    Layer {
        name: "exchange",
        uses: &["api", "support"],
    },
    // One connection, sans-IO: transport (plain or TLS) under protocol (HTTP/1.1, HTTP/2), the
    // relay of forwarded exchanges, the output queue.
    Layer {
        name: "conn",
        uses: &["exchange", "support", "api"],
    },
    // The only code holding sockets: client sockets, upstream sockets and their pool.
    Layer {
        name: "driver",
        uses: &["conn", "exchange", "support", "api"],
    },
    // One worker thread's server (slab, timers, inbox, reloads), and the in-memory harness that
    // stands in for it.
    Layer {
        name: "worker",
        uses: &["driver", "conn", "exchange", "support", "api"],
    },
    // `lib.rs`: the public API, `Server::start`; it may name everything, nothing names it.
    Layer {
        name: "root",
        uses: &[
            "worker", "driver", "conn", "exchange", "handlers", "support", "api",
        ],
    },
];

/// The layer of every file under `server/src`: a file, or a folder (ending in `/`) for all of
/// its files. A new file fails the test until it is placed here.
const FILES: &[(&str, &str)] = &[
    ("handler.rs", "api"),
    ("response.rs", "api"),
    ("router.rs", "api"),
    ("guard.rs", "api"),
    ("identity.rs", "api"),
    ("request_id.rs", "api"),
    ("upstream.rs", "api"),
    ("answer_tee.rs", "api"),
    ("stats/", "support"),
    ("compression.rs", "support"),
    ("slab.rs", "support"),
    ("head_memo.rs", "support"),
    ("bans.rs", "support"),
    ("access_log/", "support"),
    ("config.rs", "support"),
    ("fault.rs", "support"),
    ("static_files/", "handlers"),
    ("negotiate.rs", "handlers"),
    ("exchange/", "exchange"),
    ("conn/", "conn"),
    ("driver/", "driver"),
    // HTTP/3: the worker's UDP sockets and QUIC endpoints (driver), one connection's streams
    // and exchanges (conn), the transport's settings from the server's and the connection IDs
    // that name their worker (support). Its `#[cfg(test)]` files (`test_client.rs`, `tests.rs`:
    // clients on the memory worker) are test code, which the check skips.
    ("quic/", "driver"),
    ("quic/conn.rs", "conn"),
    ("quic/conn/", "conn"),
    ("quic/settings.rs", "support"),
    ("quic/cid.rs", "support"),
    ("worker.rs", "worker"),
    ("testing.rs", "worker"),
    ("memory_worker.rs", "worker"),
    ("lib.rs", "root"),
];

const SERVER: Layers = Layers {
    layers: LAYERS,
    files: FILES,
};

#[test]
fn imports_point_down_and_layers_have_no_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let problems = check(&src, &SERVER);
    assert!(
        problems.is_empty(),
        "server/src breaks its layers ({} problems):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_layer_table_points_down() {
    let problems = SERVER.table_problems();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The checker itself, on a small tree: what it must see, and what it must not.
#[test]
fn the_checker_finds_upward_imports_cycles_and_unplaced_files() {
    let src = std::env::temp_dir().join(format!("tern-layers-{}", std::process::id()));
    let _ = fs::remove_dir_all(&src);
    fs::create_dir_all(src.join("conn")).unwrap();
    let files = [
        (
            "lib.rs",
            "mod conn;\nmod handler;\nmod stray;\npub use handler::Handler;\n",
        ),
        (
            "handler.rs",
            "//! Not `use crate::worker::W;` in a comment.\n\
             use crate::conn::{Conn, http1::Http1};\n\
             const S: &str = \"crate::worker::W\";\n\
             fn f<'a>(c: char) -> bool { c == '\"' || c == '\\'' }\n\
             #[cfg(test)]\nmod tests {\n    use crate::worker::W;\n}\n",
        ),
        (
            "conn/mod.rs",
            "mod http1;\nuse http1::Http1;\npub struct Conn;\n",
        ),
        ("conn/http1.rs", "pub struct Http1(super::Conn);\n"),
        ("stray.rs", "use crate::handler::Handler;\n"),
    ];
    for (name, text) in files {
        fs::write(src.join(name), text).unwrap();
    }
    let problems = check(&src, &SERVER);
    let _ = fs::remove_dir_all(&src);
    let expected = [
        "handler.rs (api) imports `crate::conn::Conn` from conn/mod.rs (conn): that points up",
        "handler.rs (api) imports `crate::conn::http1::Http1` from conn/http1.rs (conn): that \
         points up",
        "stray.rs: not placed in a layer (add it to FILES)",
        "import cycle: conn/http1.rs -> conn/mod.rs (`super::Conn`), conn/mod.rs -> conn/http1.rs \
         (`http1::Http1`)",
    ];
    let mut problems = problems;
    problems.sort();
    let mut expected: Vec<String> = expected.iter().map(|e| e.to_string()).collect();
    expected.sort();
    assert_eq!(problems, expected);
}
