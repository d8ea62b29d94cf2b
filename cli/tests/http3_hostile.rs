//! HTTP/3 against hostile peers, end to end: `testkit/h3hostile.py` (aioquic's sans-IO QUIC
//! connection, with HTTP/3 frames, stream types and QPACK written by hand) breaks RFC 9114's
//! rules over real QUIC against `tern run`, and the tests check the codes the client receives
//! (http3/src/tests.rs checks the same rules on the sans-IO session), that floods stay within
//! the budgets of `server/src/quic/settings.rs` and `http3/src/connection.rs`, and after each
//! attack that tern is alive, a fresh connection gets its page, and `/metrics` counted it.
//!
//! Spoofed source addresses cannot be sent from aioquic: what a victim of one would receive
//! (an Initial that never continues) and a flood of Initials that never continue are tested
//! from 127.0.0.1 instead.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::http3::{h3, h3client, App, Fixture};
use crate::support::*;
use serde_json::Value;

/// RFC 9114 §8.1 and RFC 9204 §6 codes, as the client receives them.
const H3_STREAM_CREATION_ERROR: u64 = 0x103;
const H3_FRAME_UNEXPECTED: u64 = 0x105;
const H3_EXCESSIVE_LOAD: u64 = 0x107;
const H3_MESSAGE_ERROR: u64 = 0x10e;
const QPACK_DECOMPRESSION_FAILED: u64 = 0x200;
/// RFC 9000 §20.1 transport codes.
const INTERNAL_ERROR: u64 = 0x01;
const STREAM_LIMIT_ERROR: u64 = 0x04;

/// `tern run` with HTTPS (so HTTP/3), a plain listener for `/metrics`, a static site (a small
/// page and a 1 MiB file) and `/api/` proxied to an echo server.
struct Target {
    script: PathBuf,
    client: (PathBuf, PathBuf),
    fx: Fixture,
    tern: Tern,
    _app: App,
}

impl Target {
    fn start() -> Option<Target> {
        let client = h3client()?;
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../testkit/h3hostile.py");
        let fx = Fixture::new();
        let app = App::start(Vec::new());
        let conf = fx.site.base().join("tern.toml");
        std::fs::write(
            &conf,
            format!(
                "listen = \"127.0.0.1:0\"\nworkers = 2\n\n\
                 [tls]\nlisten = \"127.0.0.1:0\"\n\
                 [[tls.certificates]]\ncert = {:?}\nkey = {:?}\n\n\
                 [[site]]\nname = \"main\"\ndefault = true\n\n\
                 [[site.route]]\npath = \"/metrics\"\ncounters = \"metrics\"\n\
                 [[site.route]]\npath = \"/api/\"\nproxy = \"{}\"\n\
                 [[site.route]]\npath = \"/\"\nstatic = {:?}\n",
                fx.cert.0, fx.cert.1, app.addr, fx.site.root
            ),
        )
        .unwrap();
        let tern = Tern::start_run(&conf);
        Some(Target {
            script,
            client,
            fx,
            tern,
            _app: app,
        })
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.tern.https().port())
    }

    /// Runs `h3hostile.py ATTACK ARGS...`: what it saw.
    fn attack(&self, attack: &str, args: &[&str]) -> Value {
        let mut cmd = Command::new(&self.client.0);
        cmd.arg(&self.script)
            .arg("--ca")
            .arg(&self.fx.ca_file)
            .args(args)
            .arg(attack)
            .arg(self.url());
        let out = run_to_end(&mut cmd, Duration::from_secs(60));
        assert!(
            out.status.success(),
            "{attack} {args:?}: {:?}\n{}\n{}",
            out.status,
            out.stdout,
            out.stderr
        );
        serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("{attack}: {e}: {}", out.stdout))
    }

    /// tern is alive and a fresh, well-behaved connection gets its page.
    fn still_serves(&mut self) {
        assert!(self.tern.alive(), "{}", self.tern.stderr_text());
        let url = format!("{}/hello.txt", self.url());
        let run = h3(&self.client, &self.fx.ca_file, &[&url]);
        assert_eq!(run.code, 0, "{:?}", run.lines);
        assert_eq!(run.answer(0)["status"], 200);
        assert_eq!(run.answer(0)["body"], "hello over quic\n");
    }

    fn metric(&self, series: &str) -> u64 {
        self.tern.metric(series)
    }
}

/// The server's CONNECTION_CLOSE as the client saw it: (code, a transport close or not).
fn close(seen: &Value) -> (u64, bool) {
    let c = &seen["close"];
    assert!(c.is_object(), "no CONNECTION_CLOSE from the server: {seen}");
    (
        c["code"].as_u64().unwrap(),
        c["transport"].as_bool().unwrap(),
    )
}

fn n(seen: &Value, key: &str) -> u64 {
    seen[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key}: {seen}"))
}

#[test]
fn protocol_errors_close_the_connection_with_the_rfc_codes() {
    let Some(mut t) = Target::start() else { return };
    let cases: [(&str, &[&str], u64); 8] = [
        ("second-control", &[], H3_STREAM_CREATION_ERROR),
        ("data-before-headers", &[], H3_FRAME_UNEXPECTED),
        ("settings-twice", &[], H3_FRAME_UNEXPECTED),
        // §7.2.8: HTTP/2's PRIORITY, PING, WINDOW_UPDATE and CONTINUATION types.
        (
            "h2-frame",
            &["--where", "control", "--frame-type", "0x06"],
            H3_FRAME_UNEXPECTED,
        ),
        (
            "h2-frame",
            &["--where", "control", "--frame-type", "0x08"],
            H3_FRAME_UNEXPECTED,
        ),
        (
            "h2-frame",
            &["--where", "request", "--frame-type", "0x02"],
            H3_FRAME_UNEXPECTED,
        ),
        (
            "h2-frame",
            &["--where", "request", "--frame-type", "0x09"],
            H3_FRAME_UNEXPECTED,
        ),
        ("bad-qpack", &[], QPACK_DECOMPRESSION_FAILED),
    ];
    for (attack, args, code) in cases {
        let seen = t.attack(attack, args);
        assert_eq!(
            close(&seen),
            (code, false),
            "{attack} {args:?}: want application close {code:#x}: {seen}"
        );
    }
    t.still_serves();
    assert_eq!(
        t.metric("tern_http3_connection_errors_total"),
        cases.len() as u64
    );
    assert_eq!(t.metric("tern_http3_stream_errors_total"), 0);
    assert_eq!(
        t.metric("tern_http3_connections_total"),
        cases.len() as u64 + 1
    );
}

#[test]
fn malformed_requests_are_reset_with_message_error_and_the_connection_goes_on() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack("bad-pseudo", &[]);
    assert!(seen["close"].is_null(), "{seen}");
    let cases = seen["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 6);
    for (case, code) in cases {
        assert_eq!(code, H3_MESSAGE_ERROR, "{case}: {seen}");
    }
    assert_eq!(seen["good_after"], 200, "{seen}");
    t.still_serves();
    assert_eq!(t.metric("tern_http3_stream_errors_total"), 6);
    assert_eq!(t.metric("tern_http3_connection_errors_total"), 0);
}

/// A `:path` neither origin-form nor `*` on OPTIONS (RFC 9114 §4.3.1), an absolute URI above
/// all, is malformed: reset with H3_MESSAGE_ERROR, never served as its path on the site
/// `:authority` names.
#[test]
fn a_path_not_in_origin_form_is_reset_with_message_error() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack("bad-path", &[]);
    assert!(seen["close"].is_null(), "{seen}");
    let cases = seen["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 3);
    for (case, code) in cases {
        assert_eq!(code, H3_MESSAGE_ERROR, "{case}: {seen}");
    }
    assert_eq!(
        seen["answers"].as_object().unwrap().len(),
        1,
        "only the good GET is answered: {seen}"
    );
    assert_eq!(seen["good_after"], 200, "{seen}");
    t.still_serves();
    assert_eq!(t.metric("tern_http3_stream_errors_total"), 3);
}

/// The reset budget (100, `tern_http3::Config::reset_budget`) also counts the streams the
/// peer makes us reset: the 101st malformed request closes the connection.
#[test]
fn the_101st_malformed_request_in_a_row_closes_with_excessive_load() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack("malformed-loop", &["--count", "300"]);
    assert_eq!(close(&seen), (H3_EXCESSIVE_LOAD, false), "{seen}");
    assert_eq!(n(&seen, "malformed_sent"), 101, "{seen}");
    assert_eq!(seen["reset_codes"], serde_json::json!([H3_MESSAGE_ERROR]));
    t.still_serves();
    // The 101st closed the connection rather than being reset.
    assert_eq!(t.metric("tern_http3_stream_errors_total"), 100);
    assert_eq!(t.metric("tern_http3_connection_errors_total"), 1);
}

/// 300 requests at once: QUIC's MAX_STREAMS holds the client to 100 in flight, and all are
/// answered. A client that ignores MAX_STREAMS (150 request heads at once, or four
/// unidirectional streams) is closed with STREAM_LIMIT_ERROR by quinn.
#[test]
fn max_streams_holds_a_client_to_100_requests_and_3_unidirectional_streams() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack("streams", &["--count", "300"]);
    assert!(seen["close"].is_null(), "{seen}");
    assert_eq!(n(&seen, "limit_bidi"), 100);
    assert_eq!(n(&seen, "limit_uni"), 3);
    assert_eq!(n(&seen, "peak_in_flight"), 100, "{seen}");
    assert_eq!(n(&seen, "ok"), 300);
    let over = t.attack("streams", &["--count", "150", "--over-limit"]);
    assert_eq!(close(&over), (STREAM_LIMIT_ERROR, true), "{over}");
    // The control stream and three more.
    let over_uni = t.attack("streams", &["--count", "3", "--over-limit", "--uni"]);
    assert_eq!(close(&over_uni), (STREAM_LIMIT_ERROR, true), "{over_uni}");
    t.still_serves();
    // Transport errors are quinn's: no HTTP/3 error is counted for them.
    assert_eq!(t.metric("tern_http3_connection_errors_total"), 0);
    assert_eq!(t.metric("tern_http3_connections_total"), 4);
}

#[test]
fn thousands_of_pings_are_acknowledged_and_the_connection_still_answers() {
    let Some(mut t) = Target::start() else { return };
    let one_each = t.attack("pings", &["--count", "3000"]);
    assert!(one_each["close"].is_null(), "{one_each}");
    assert_eq!(n(&one_each, "pings_acked"), 3000);
    assert_eq!(one_each["status_after"], 200);
    // 100 packets of about 1100 PING frames each.
    let packed = t.attack("pings", &["--count", "100", "--per-packet", "1000"]);
    assert!(packed["close"].is_null(), "{packed}");
    assert_eq!(n(&packed, "pings_acked"), 100);
    assert_eq!(packed["status_after"], 200);
    t.still_serves();
    assert!(t.metric("tern_quic_datagrams_total{direction=\"in\"}") >= 3100);
    assert_eq!(t.metric("tern_http3_connection_errors_total"), 0);
}

#[test]
fn a_body_in_3000_one_byte_stream_frames_arrives_whole() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack("tiny-frames", &["--count", "3000", "--path", "/api/tiny"]);
    assert!(seen["close"].is_null(), "{seen}");
    assert_eq!(n(&seen, "one_byte_frames"), 3000);
    assert!(n(&seen, "datagrams_for_body") >= 3000, "{seen}");
    assert_eq!(seen["status"], 200, "{seen}");
    // The echo server's count of what tern relayed.
    assert_eq!(seen["body"], "POST /api/tiny body=3000\n");
    t.still_serves();
    assert!(t.metric("tern_quic_datagrams_total{direction=\"in\"}") >= 3000);
}

/// One-byte STREAM frames at every other offset of a stream's window, so none can be read:
/// quinn keeps at most 1024 pieces of a stream (its assembler's MAX_CHUNKS) and closes the
/// connection past that, long before the window's 131072.
#[test]
fn out_of_order_one_byte_frames_are_cut_off_by_quinn() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack("sparse-frames", &["--count", "1"]);
    assert_eq!(close(&seen), (INTERNAL_ERROR, true), "{seen}");
    assert!(
        seen["close"]["reason"]
            .as_str()
            .unwrap()
            .contains("too many gaps"),
        "{seen}"
    );
    assert!(n(&seen, "datagrams_out") < 100, "{seen}");
    t.still_serves();
}

/// Unidirectional streams of unknown types are stopped (STOP_SENDING with
/// H3_STREAM_CREATION_ERROR, RFC 9114 §6.2) and each spends the overhead budget (1000): the
/// client may open them three at a time as the stops free them, and the 1001st closes the
/// connection.
#[test]
fn unknown_unidirectional_streams_are_stopped_and_budgeted() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack("unknown-uni", &["--count", "3000"]);
    assert_eq!(n(&seen, "limit_uni"), 3);
    assert_eq!(
        seen["stop_codes"],
        serde_json::json!([H3_STREAM_CREATION_ERROR])
    );
    assert_eq!(close(&seen), (H3_EXCESSIVE_LOAD, false), "{seen}");
    assert_eq!(n(&seen, "opened"), 1001, "{seen}");
    t.still_serves();
    assert_eq!(t.metric("tern_http3_connection_errors_total"), 1);
}

/// A connection error while the congestion window is full of answers not yet acknowledged:
/// the client should still get the CONNECTION_CLOSE.
#[test]
#[ignore = "quinn-proto 0.11.19 holds a CONNECTION_CLOSE behind congestion control while \
            stream data is pending (quinn issue #2785, fixed upstream by PR #2787): the close \
            never leaves, and the client hears nothing until its idle timeout"]
fn a_connection_error_with_the_congestion_window_full_still_reaches_the_client() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack(
        "close-under-load",
        &["--path", "/big.bin", "--timeout", "3"],
    );
    assert_eq!(close(&seen), (H3_FRAME_UNEXPECTED, false), "{seen}");
    t.still_serves();
    assert_eq!(t.metric("tern_http3_connection_errors_total"), 1);
}

/// Requests whose body never comes, each reset by the client once tern has the head: each
/// spends the reset budget (100), so the 101st should close the connection with
/// H3_EXCESSIVE_LOAD.
#[test]
fn streams_the_client_resets_spend_the_reset_budget() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack("reset-loop", &["--count", "300"]);
    assert_eq!(close(&seen), (H3_EXCESSIVE_LOAD, false), "{seen}");
    assert_eq!(n(&seen, "resets_sent"), 101, "{seen}");
    t.still_serves();
    assert_eq!(t.metric("tern_http3_connection_errors_total"), 1);
}

/// Downloads the client cancels (STOP_SENDING, H3_REQUEST_CANCELLED) part way, each followed
/// by a request answered whole (which earns back the reset budget the cancel spent): all 150
/// rounds should go through on one connection.
#[test]
fn cancelled_downloads_give_their_streams_back() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack(
        "cancel-downloads",
        &["--count", "150", "--path", "/big.bin", "--timeout", "3"],
    );
    assert!(seen["close"].is_null(), "{seen}");
    assert_eq!(n(&seen, "rounds"), 150, "{seen}");
    // RFC 9000 §3.5: a STOP_SENDING is answered with a RESET_STREAM.
    assert_eq!(seen["resets"].as_object().unwrap().len(), 150, "{seen}");
    t.still_serves();
}

/// A new connection id of the server's for each of 30 requests, then a move to another UDP
/// port (path validation): the connection goes on.
#[test]
fn connection_id_changes_and_a_new_port_keep_the_connection() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack("cid-churn", &["--count", "30", "--migrate"]);
    assert!(seen["close"].is_null(), "{seen}");
    assert_eq!(n(&seen, "cids_used"), 31, "{seen}");
    assert_eq!(seen["statuses"], serde_json::json!(vec![200; 30]));
    assert_eq!(seen["after_migration"], 200, "{seen}");
    t.still_serves();
}

/// What the victim of a spoofed source address would get: an Initial it never sent, and
/// nothing it answers. RFC 9000 §8.1 allows three times the bytes received before the
/// address is validated, retransmissions included.
#[test]
fn an_address_that_never_answers_gets_at_most_three_times_its_initial() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack("initial-no-reply", &["--seconds", "3"]);
    let (sent, got) = (n(&seen, "bytes_out"), n(&seen, "bytes_in"));
    assert!(sent >= 1200, "{seen}");
    assert!(got > 0 && got <= 3 * sent, "{seen}");
    t.still_serves();
    assert_eq!(t.metric("tern_quic_handshakes_failed_total"), 0);
}

/// Initials that never continue, 600 from one address (one worker's socket): past 256
/// handshakes in progress the worker answers with a Retry and keeps no state.
#[test]
fn past_256_unfinished_handshakes_a_worker_sends_retry() {
    let Some(mut t) = Target::start() else { return };
    let seen = t.attack("initial-flood", &["--count", "600", "--seconds", "10"]);
    let (retried, handshaking) = (n(&seen, "retried"), n(&seen, "handshaking"));
    assert_eq!(retried + handshaking, 600, "{seen}");
    // 256 on one worker; at most both workers' if the address's datagrams were spread.
    assert!((256..=512).contains(&handshaking), "{seen}");
    assert_eq!(t.metric("tern_quic_retries_total"), retried);
    assert_eq!(t.metric("tern_quic_connections_total"), handshaking);
    // The fresh connection may land on that worker and be retried too (aioquic follows it).
    t.still_serves();
}
