//! The end-to-end suites: the real `tern` binary (built with the test-only fault hook) started
//! on ephemeral ports and driven over real sockets by HTTP/1.1, TLS and HTTP/2 clients, next
//! to nginx, Caddy, PHP-FPM, PostgreSQL, Pebble and promtool where a suite needs them.
//!
//! One test binary (`cargo test -p tern --test e2e`), each suite a module of it, so that
//! tokio, h2, rustls and postgres are linked once rather than once a suite; run one suite
//! with a filter, `cargo test -p tern --test e2e proxy::`. Every tern a test starts is a
//! child process of its own; no test changes this process's environment, working folder or
//! limits, so the suites share the binary safely.

/// HTTP/2 clients: the h2 crate on tokio, and frames written by hand.
#[path = "support/h2.rs"]
mod h2_support;
/// PHP-FPM pools for the FastCGI suites.
#[path = "support/php.rs"]
mod php_support;
mod support;
/// Test certificates, rustls client configurations, tern with an HTTPS listener.
#[path = "support/tls.rs"]
mod tls_support;

mod accel;
mod access_log;
mod acme;
mod bans;
mod cache;
mod cache_php;
mod cache_poisoning;
mod compress;
mod demo;
mod fastcgi;
mod gate;
mod grafana;
mod http;
mod http2;
mod http3;
mod http3_hostile;
mod http3_netns;
mod https;
mod metrics;
mod panics;
mod pg;
mod php_apps;
mod process;
mod proxy;
mod proxy_abuse;
mod published_configs;
mod reload;
mod restart;
mod routing;
mod run;
mod sandbox;
mod seams;
mod systemd;
mod three_sites;
mod upstream_tls;
mod upstreams;
mod websocket_h2;
