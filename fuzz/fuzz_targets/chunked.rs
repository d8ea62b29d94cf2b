//! ChunkedDecoder on arbitrary input under arbitrary fragmentation. The first byte says how many
//! of the following bytes are fragment lengths; the second picks the body limit; the rest is the
//! wire. Whatever the fragmentation, the outcome (payload, bytes used, or error) must be the
//! same as decoding the wire in one piece.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tern_codec::{ChunkedDecoder, RequestError};

#[derive(Debug, PartialEq)]
enum Outcome {
    Done { payload: Vec<u8>, used: usize },
    NeedMore { payload: Vec<u8> },
    Failed(RequestError),
}

fn decode(max_body: u64, wire: &[u8], frag_lens: &[u8]) -> Outcome {
    let mut dec = ChunkedDecoder::new(max_body);
    let mut payload = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut used = 0;
    let mut pos = 0;
    let mut lens = frag_lens.iter().cycle();
    while pos < wire.len() {
        let len = if frag_lens.is_empty() {
            wire.len()
        } else {
            usize::from(*lens.next().unwrap())
        };
        let end = (pos + len.max(1)).min(wire.len());
        pending.extend_from_slice(&wire[pos..end]);
        pos = end;
        while !pending.is_empty() {
            let step = match dec.decode(&pending) {
                Ok(step) => step,
                Err(e) => return Outcome::Failed(e),
            };
            assert!(step.consumed <= pending.len() && step.data.len() <= step.consumed);
            payload.extend_from_slice(step.data);
            assert!(
                payload.len() as u64 <= max_body,
                "payload beyond the body limit"
            );
            let (consumed, done) = (step.consumed, step.done);
            used += consumed;
            pending.drain(..consumed);
            if done {
                // Once done, the decoder stays done and takes nothing more.
                let again = dec.decode(b"0\r\n\r\n").unwrap();
                assert!(again.done && again.consumed == 0);
                return Outcome::Done { payload, used };
            }
            assert!(
                consumed > 0,
                "no progress on {} buffered bytes",
                pending.len()
            );
        }
    }
    Outcome::NeedMore { payload }
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 32).min(rest.len());
    let (frag_lens, rest) = rest.split_at(n);
    let Some((&limit, wire)) = rest.split_first() else {
        return;
    };
    let max_body = if limit == 0xff {
        u64::MAX
    } else {
        u64::from(limit) * 16
    };

    let whole = decode(max_body, wire, &[]);
    let fragmented = decode(max_body, wire, frag_lens);
    let bytewise = decode(max_body, wire, &[1]);
    assert_eq!(whole, fragmented);
    assert_eq!(whole, bytewise);
});
