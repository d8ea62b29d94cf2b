//! Relayed exchanges, in memory (tern_server::testing::MemoryConn: the real worker, socket
//! loop, relay and upstream pool over sockets in memory, the fuzzer playing both the client
//! and the upstream): arbitrary client bytes through the real HTTP/1.1 protocol and
//! `ForwardAll` handler, arbitrary upstream answers in arbitrary read sizes, with or without
//! the upstream closing. The upstream answers each request that reaches one of its
//! connections with the next of its answers, which may carry anything after the answer:
//! surplus bytes, or whole answers nobody asked for. Upstream connections are kept between
//! exchanges by the worker pool's rule.
//!
//! Nothing may panic; what the client receives must always read as well-formed HTTP/1.1
//! answers (an incomplete last one only if the connection closed or the answer is still being
//! relayed), so a broken upstream never desynchronises the client's connection; and bytes an
//! upstream sent in answer to one request are never read for another: a connection with
//! surplus bytes is never reused (`upstream_answers` panics if the pool hands one out with
//! bytes still unread in it).
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tern_server::testing::{parse_responses, ForwardAll, MemoryConn, MemoryUpstream};
use tern_server::Router;

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    // Client bytes, then the upstream's, split at the first 0xff; the upstream's answers to
    // successive requests are split at each 0xfe (single rare bytes: splits the fuzzer finds
    // easily).
    let split = rest.iter().position(|&b| b == 0xff).unwrap_or(rest.len());
    let (client, upstream) = (&rest[..split], rest.get(split + 1..).unwrap_or(&[]));
    let answers: Vec<&[u8]> = upstream.split(|&b| b == 0xfe).collect();
    let piece = 1 + (control & 0x3f) as usize * 7;
    let close = control & 0x40 != 0;
    let router = Router::new().fallback(ForwardAll(Arc::new(MemoryUpstream::default())));
    let mut c = MemoryConn::new(router, None).expect("a memory connection");
    c.feed(client);
    c.upstream_answers(&answers, piece, close);
    if control & 0x80 != 0 {
        c.feed_eof();
    }
    let out = c.take_output();
    // Which answers are to HEAD requests, in order (the client's requests as written).
    let heads: Vec<bool> = client
        .split(|&b| b == b'\n')
        .filter(|l| l.starts_with(b"GET ") || l.starts_with(b"HEAD ") || l.starts_with(b"POST ") || l.starts_with(b"PUT "))
        .map(|l| l.starts_with(b"HEAD "))
        .collect();
    if heads.iter().any(|&h| h) || client.starts_with(b"PRI ") {
        // HEAD answers carry a length without a body, and the HTTP/2 preface makes the
        // connection HTTP/2: neither is read by this checker (only the no-panic rule holds).
        return;
    }
    // An answer still being relayed may be incomplete so far; one that is over may not.
    let unfinished = c.is_closed() || c.relaying();
    if let Err(why) = parse_responses(&out, &heads, unfinished) {
        panic!("desync: {why}\nclient {:?}\nupstream {:?}\nout {:?}", String::from_utf8_lossy(client), String::from_utf8_lossy(upstream), String::from_utf8_lossy(&out));
    }
});
