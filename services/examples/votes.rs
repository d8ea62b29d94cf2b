//! A complete tern app in about 30 lines: `GET /vote/NAME` is answered only after a background
//! thread has counted it; `GET /votes` serves the tally as a snapshot (gzip, ETag, 304).
//!
//!     cargo run --release -p tern-services --example votes   # then: curl localhost:8080/vote/ada
use std::{collections::BTreeMap, sync::Arc, time::Duration};
use tern_server::{HandlerContext as Cx, Pending, Reply, Request, Response, Router, Server};
use tern_services::{handoff, Snapshot, SnapshotCell};

fn main() -> std::io::Result<()> {
    let (votes, queue) = handoff::<(String, Pending)>(10_000);
    let tally = Arc::new(SnapshotCell::new(Snapshot::new(
        "text/plain",
        b"{}\n".to_vec(),
        0,
        1,
    )));
    let shown = tally.clone();
    let router = Router::new()
        .get("/votes", move |req: &Request<'_>, _: &mut Cx<'_>| {
            shown.respond(req).into()
        })
        .prefix(
            tern_server::Method::Get,
            "/vote/",
            move |req: &Request<'_>, cx: &mut Cx<'_>| {
                match votes.offer((req.path()[6..].to_string(), cx.defer())) {
                    Ok(()) => Reply::Later, // answered by the counting thread below
                    Err(_) => Response::text(503, "busy, try again\n")
                        .with_header("Retry-After", "1")
                        .into(),
                }
            },
        );
    let mut server = Server::new(Default::default(), router);
    server.background("counter", move |stop| {
        let (mut counts, mut batch) = (BTreeMap::<String, u64>::new(), Vec::new());
        while !stop.is_stopped() {
            batch.clear();
            if queue.recv_batch(&mut batch, 1024, Duration::from_millis(100)) == Some(0) {
                continue;
            }
            for (name, pending) in batch.drain(..) {
                *counts.entry(name).or_default() += 1; // a real app would commit here
                pending.complete_retrying(Response::text(200, "counted\n"));
            }
            let now = std::time::UNIX_EPOCH.elapsed().unwrap().as_secs();
            tally.store(Snapshot::new(
                "text/plain",
                format!("{counts:?}\n").into_bytes(),
                now,
                1,
            ));
        }
    });
    let running = server.start()?;
    println!("votes on http://{}", running.local_addr());
    running.join();
    Ok(())
}
