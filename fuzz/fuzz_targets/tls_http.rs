//! A whole server connection over TLS, in memory (tern_server::testing::MemoryConn: the real
//! worker, socket loop, transport, HTTP/1.1 protocol and handlers, over sockets in memory). Two ways in, chosen by the first byte:
//! - raw: the bytes go straight to the server's TLS session, in pieces (record framing,
//!   ClientHello parsing, alerts, plain HTTP on the TLS port);
//! - through a real handshake: an in-memory rustls client connects, then sends the bytes as
//!   application data, so the HTTP layer behind TLS sees arbitrary requests.
//! Nothing may panic, and a dead connection must stay dead.
#![no_main]

use std::io::Write;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};
use tern_server::testing::MemoryConn;
use tern_server::{HandlerContext, Request, Response, Router, TlsAcceptor, TlsOptions};
use tern_testkit::AnyCert;

struct Fixture {
    acceptor: Arc<TlsAcceptor>,
    client: Arc<ClientConfig>,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let acceptor = TlsAcceptor::new(&TlsOptions {
            self_signed: true,
            alpn: vec![b"http/1.1".to_vec()],
            ..TlsOptions::default()
        })
        .expect("acceptor");
        let mut client = ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        // The server's certificate is made at start-up: the client trusts whatever it shows.
        .with_custom_certificate_verifier(Arc::new(AnyCert::new()))
        .with_no_client_auth();
        client.alpn_protocols = vec![b"http/1.1".to_vec()];
        Fixture {
            acceptor: Arc::new(acceptor),
            client: Arc::new(client),
        }
    })
}

fn router() -> Router {
    Router::new()
        .get("/", |_: &Request<'_>, _: &mut HandlerContext<'_>| {
            Response::text(200, "ok\n").into()
        })
        .prefix(
            tern_server::Method::Post,
            "/echo",
            |req: &Request<'_>, _: &mut HandlerContext<'_>| {
                Response::new(200)
                    .with_body(tern_server::Body::Owned(req.body.to_vec()))
                    .into()
            },
        )
}

/// Moves records between the client and the server until neither has anything to say.
fn exchange(client: &mut ClientConnection, server: &mut MemoryConn) -> bool {
    for _ in 0..16 {
        let mut to_server = Vec::new();
        while client.wants_write() {
            if client.write_tls(&mut to_server).is_err() {
                return false;
            }
        }
        if !to_server.is_empty() {
            server.feed(&to_server);
        }
        let from_server = server.take_output();
        if from_server.is_empty() && to_server.is_empty() {
            return true;
        }
        let mut rest = &from_server[..];
        while !rest.is_empty() {
            match client.read_tls(&mut rest) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if client.process_new_packets().is_err() {
                        return false;
                    }
                }
            }
        }
        let mut sink = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut client.reader(), &mut sink) {
            if n == 0 {
                break;
            }
        }
        if server.is_closed() {
            return false;
        }
    }
    true
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let f = fixture();
    let mut server = MemoryConn::new(router(), Some(f.acceptor.clone())).expect("conn");
    if mode & 1 == 0 {
        let piece = usize::from(mode >> 1).max(1);
        for chunk in rest.chunks(piece) {
            server.feed(chunk);
        }
        server.feed_eof();
    } else {
        let name = ServerName::try_from("localhost").unwrap();
        let mut client = ClientConnection::new(f.client.clone(), name).unwrap();
        if !exchange(&mut client, &mut server) || client.is_handshaking() {
            panic!("the handshake with a well-behaved client failed");
        }
        if client.writer().write_all(rest).is_err() {
            return;
        }
        exchange(&mut client, &mut server);
        server.feed_eof();
    }
    let closed = server.is_closed();
    server.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    if closed {
        assert!(server.take_output().is_empty() || server.is_closed());
    }
});
