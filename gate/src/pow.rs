//! Proof-of-work and time-lock challenges, stateless: everything a check needs travels in the
//! challenge, MACed, so issuing one stores nothing and checking an answer costs one MAC, one
//! SHA-256 and one insertion into the replay set.
//!
//! Layout before base64url: `1 | kid u32 | expires u64 | not_before u64 | prefix family u8 |
//! prefix 16 bytes | ua_hash u64 | rule u16 | difficulty u8 | realm_hint u8 | seconds u8 |
//! nonce 16 | tag 16`.
//! The work: a decimal counter `c` such that SHA-256(challenge ‖ c) starts with `difficulty`
//! zero bits. Difficulty 0 is a time-lock of `seconds`: no work, but not before `not_before`.

use std::sync::Mutex;

use aws_lc_rs::digest;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use crate::keyring::{Keyring, MacError, Purpose, TAG_LEN};
use crate::prefix::Prefix;

const VERSION: u8 = 2;
const BODY: usize = 1 + 4 + 8 + 8 + 1 + 16 + 8 + 2 + 1 + 1 + 1 + 16;
const RAW: usize = BODY + TAG_LEN;
/// Length of a challenge string.
pub const CHALLENGE_LEN: usize = (RAW * 4).div_ceil(3);
/// The largest counter a browser can count to exactly (2^53).
const MAX_COUNTER: u64 = 1 << 53;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChallengeSpec {
    pub expires: u64,
    pub not_before: u64,
    pub prefix: Prefix,
    pub ua_hash: u64,
    pub rule: u16,
    pub difficulty: u8,
    /// 0: a policy challenge; n: the guest login of realm n - 1.
    pub realm_hint: u8,
    /// A time-lock's wait (what its pass records; 0 for a proof of work).
    pub seconds: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowError {
    Malformed,
    UnknownKey,
    BadMac,
    Expired,
    TooEarly,
    WrongPrefix,
    WrongClient,
    TooEasy,
    Replayed,
    ReplayFull,
}

impl PowError {
    pub fn cause(&self) -> &'static str {
        match self {
            PowError::Malformed => "malformed",
            PowError::UnknownKey => "unknown_key",
            PowError::BadMac => "bad_mac",
            PowError::Expired => "expired",
            PowError::TooEarly => "too_early",
            PowError::WrongPrefix => "wrong_prefix",
            PowError::WrongClient => "wrong_client",
            PowError::TooEasy => "too_easy",
            PowError::Replayed => "replayed",
            PowError::ReplayFull => "replay_full",
        }
    }
}

/// What challenges and sessions are bound to of the user agent: the first 8 bytes of the
/// SHA-256 of its text without the characters of version numbers (digits, '.', '_'). A
/// browser that updates itself changes only those ("Firefox/132.0" to "Firefox/133.0.1",
/// "iPhone OS 17_0" to "17_1_2"), so its sessions survive the update; another browser,
/// another tool or no user agent at all is another client.
pub fn ua_hash(user_agent: &[u8]) -> u64 {
    let mut ctx = digest::Context::new(&digest::SHA256);
    for run in user_agent.split(|&b| b.is_ascii_digit() || b == b'.' || b == b'_') {
        ctx.update(run);
    }
    let d = ctx.finish();
    u64::from_be_bytes(d.as_ref()[..8].try_into().unwrap())
}

/// A fresh challenge (a new random nonce each time), signed with the current key.
pub fn issue(keyring: &Keyring, spec: &ChallengeSpec) -> String {
    let signer = keyring.signer();
    let mut raw = [0u8; RAW];
    raw[0] = VERSION;
    raw[1..5].copy_from_slice(&signer.kid().to_be_bytes());
    raw[5..13].copy_from_slice(&spec.expires.to_be_bytes());
    raw[13..21].copy_from_slice(&spec.not_before.to_be_bytes());
    raw[21] = spec.prefix.family;
    raw[22..38].copy_from_slice(&spec.prefix.bytes);
    raw[38..46].copy_from_slice(&spec.ua_hash.to_be_bytes());
    raw[46..48].copy_from_slice(&spec.rule.to_be_bytes());
    raw[48] = spec.difficulty;
    raw[49] = spec.realm_hint;
    raw[50] = spec.seconds;
    // A nonce the generator could not fill would make challenges repeat; then the replay set
    // refuses the second, which is safe.
    let _ = aws_lc_rs::rand::fill(&mut raw[51..67]);
    let tag = signer.sign(Purpose::Challenge, &raw[..BODY]);
    raw[BODY..].copy_from_slice(&tag);
    URL_SAFE_NO_PAD.encode(raw)
}

/// Leading zero bits of a digest.
fn zero_bits(d: &[u8]) -> u32 {
    let mut bits = 0;
    for &b in d {
        if b != 0 {
            return bits + b.leading_zeros();
        }
        bits += 8;
    }
    bits
}

/// Whether `counter` does the work for `challenge` at `difficulty`.
pub fn solves(challenge: &str, difficulty: u8, counter: u64) -> bool {
    let mut ctx = digest::Context::new(&digest::SHA256);
    ctx.update(challenge.as_bytes());
    ctx.update(itoa::Buffer::new().format(counter).as_bytes());
    zero_bits(ctx.finish().as_ref()) >= u32::from(difficulty)
}

/// The smallest counter that solves `challenge` (what a browser's workers search for).
pub fn solve(challenge: &str, difficulty: u8) -> u64 {
    (0..MAX_COUNTER)
        .find(|&c| solves(challenge, difficulty, c))
        .unwrap_or(0)
}

/// Checks an answer and spends the challenge: MAC, expiry, time-lock, client network and user
/// agent, the work, then the replay set (last, so only a correct answer takes a slot).
pub fn verify(
    keyring: &Keyring,
    challenge: &str,
    counter: &str,
    now: u64,
    prefix: Prefix,
    ua_hash: u64,
    replay: &ReplaySet,
) -> Result<ChallengeSpec, PowError> {
    if challenge.len() != CHALLENGE_LEN {
        return Err(PowError::Malformed);
    }
    let mut raw = [0u8; RAW + 2];
    let n = URL_SAFE_NO_PAD
        .decode_slice(challenge, &mut raw)
        .map_err(|_| PowError::Malformed)?;
    if n != RAW || raw[0] != VERSION {
        return Err(PowError::Malformed);
    }
    let kid = u32::from_be_bytes(raw[1..5].try_into().unwrap());
    keyring
        .verify(Purpose::Challenge, kid, &raw[..BODY], &raw[BODY..RAW])
        .map_err(|e| match e {
            MacError::UnknownKey => PowError::UnknownKey,
            MacError::BadMac => PowError::BadMac,
        })?;
    let u64_at = |i: usize| u64::from_be_bytes(raw[i..i + 8].try_into().unwrap());
    let mut bound = Prefix {
        family: raw[21],
        bytes: [0; 16],
    };
    bound.bytes.copy_from_slice(&raw[22..38]);
    let spec = ChallengeSpec {
        expires: u64_at(5),
        not_before: u64_at(13),
        prefix: bound,
        ua_hash: u64_at(38),
        rule: u16::from_be_bytes([raw[46], raw[47]]),
        difficulty: raw[48],
        realm_hint: raw[49],
        seconds: raw[50],
    };
    if now >= spec.expires {
        return Err(PowError::Expired);
    }
    if now < spec.not_before {
        return Err(PowError::TooEarly);
    }
    if spec.prefix != prefix {
        return Err(PowError::WrongPrefix);
    }
    if spec.ua_hash != ua_hash {
        return Err(PowError::WrongClient);
    }
    let valid_counter = !counter.is_empty()
        && counter.len() <= 16
        && counter.bytes().all(|b| b.is_ascii_digit())
        && (counter == "0" || !counter.starts_with('0'));
    let c: u64 = match counter.parse() {
        Ok(c) if valid_counter && c < MAX_COUNTER => c,
        _ => return Err(PowError::TooEasy),
    };
    if spec.difficulty > 0 && !solves(challenge, spec.difficulty, c) {
        return Err(PowError::TooEasy);
    }
    let mut nonce = [0u8; 16];
    nonce.copy_from_slice(&raw[51..67]);
    replay.spend(nonce, spec.expires, now)?;
    Ok(spec)
}

/// Challenges already answered, until they expire: each answer counts once.
///
/// Fixed memory: `SHARDS` open-addressed tables under their own locks, shared by the workers
/// (a per-worker set would let one answer be replayed once per worker, since the kernel
/// spreads a client's connections). An answer is rare per client, so the locks are never hot.
/// A shard full of unexpired entries refuses new answers (`ReplayFull`) rather than forget
/// one, which would reopen it to replay.
///
/// The bound: the gate's set has 2^17 slots (3 MiB); random nonces spread over them, and the
/// first refusals come past half of them filled (about 70 000 answers; see the test). Only
/// answers that passed every other check get in (the MAC, expiry, network, user agent, and
/// the work or the time-lock's wait), each stays until its challenge expires (at most
/// `challenge_minutes`), and the per-network challenge limit covers pages and answers alike.
/// So filling it takes that many solved challenges within one challenge lifetime, from many
/// networks (at the default 60 a minute, a pass costing a page and an answer, about 230
/// networks for ten minutes). What happens then: new answers get a 503 ("try again in a
/// minute", counted as `replay_full`) until entries expire; sessions already given out, and
/// every request that needs no new answer, are untouched.
pub struct ReplaySet {
    shards: Box<[Mutex<Shard>]>,
}

const SHARDS: usize = 16;
/// Probes before a shard counts as full around a slot.
const PROBES: usize = 32;

struct Shard {
    /// (nonce, expires); expires 0 marks a free slot.
    slots: Box<[([u8; 16], u64)]>,
}

impl ReplaySet {
    /// Room for about `capacity` unexpired answers.
    pub fn new(capacity: usize) -> ReplaySet {
        let per_shard = (capacity / SHARDS).max(PROBES).next_power_of_two();
        ReplaySet {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        slots: vec![([0u8; 16], 0u64); per_shard].into_boxed_slice(),
                    })
                })
                .collect(),
        }
    }

    /// Records `nonce` (random, so its own bytes are a fine hash) until `expires`; refuses it
    /// if it is already there.
    pub fn spend(&self, nonce: [u8; 16], expires: u64, now: u64) -> Result<(), PowError> {
        let h = u64::from_le_bytes(nonce[..8].try_into().unwrap());
        let shard = &self.shards[(h as usize) % SHARDS];
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        let mask = shard.slots.len() - 1;
        let start = (h >> 8) as usize;
        let mut free = None;
        for i in 0..PROBES {
            let at = (start + i) & mask;
            let (n, e) = shard.slots[at];
            if e > now && n == nonce {
                return Err(PowError::Replayed);
            }
            if e <= now && free.is_none() {
                free = Some(at);
            }
        }
        match free {
            Some(at) => {
                shard.slots[at] = (nonce, expires.max(1));
                Ok(())
            }
            None => Err(PowError::ReplayFull),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring() -> Keyring {
        Keyring::from_keys(vec![(3, 100, [4; 32])])
    }

    fn net() -> Prefix {
        Prefix::of("192.0.2.1".parse().unwrap(), 24, 48)
    }

    fn spec(difficulty: u8) -> ChallengeSpec {
        ChallengeSpec {
            expires: 2000,
            not_before: 1000,
            prefix: net(),
            ua_hash: ua_hash(b"Mozilla/5.0"),
            rule: 7,
            difficulty,
            realm_hint: 0,
            seconds: if difficulty == 0 { 3 } else { 0 },
        }
    }

    #[test]
    fn a_user_agent_is_itself_across_version_updates_only() {
        let firefox = |v: &str| {
            ua_hash(
                format!("Mozilla/5.0 (X11; Linux x86_64; rv:{v}) Gecko/20100101 Firefox/{v}")
                    .as_bytes(),
            )
        };
        assert_eq!(firefox("132.0"), firefox("133.0.1"));
        let iphone = |v: &str| {
            ua_hash(
                format!(
                    "Mozilla/5.0 (iPhone; CPU iPhone OS {v} like Mac OS X) AppleWebKit/605.1.15"
                )
                .as_bytes(),
            )
        };
        assert_eq!(iphone("17_0"), iphone("17_1_2"));
        assert_ne!(iphone("17_0"), firefox("132.0"));
        assert_ne!(
            firefox("132.0"),
            ua_hash(b"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36")
        );
        assert_ne!(ua_hash(b""), ua_hash(b"curl/8.5.0"));
        assert_ne!(ua_hash(b"curl/8.5.0"), ua_hash(b"Wget/1.21"));
    }

    fn check(
        ring: &Keyring,
        c: &str,
        counter: &str,
        now: u64,
        replay: &ReplaySet,
    ) -> Result<ChallengeSpec, PowError> {
        verify(
            ring,
            c,
            counter,
            now,
            net(),
            ua_hash(b"Mozilla/5.0"),
            replay,
        )
    }

    #[test]
    fn a_solved_challenge_passes_once() {
        let replay = ReplaySet::new(1024);
        let c = issue(&ring(), &spec(12));
        assert_eq!(c.len(), CHALLENGE_LEN);
        let answer = solve(&c, 12).to_string();
        assert_eq!(check(&ring(), &c, &answer, 1500, &replay), Ok(spec(12)));
        assert_eq!(
            check(&ring(), &c, &answer, 1500, &replay),
            Err(PowError::Replayed)
        );
        // Two challenges from the same spec differ (nonce), so each is its own.
        let d = issue(&ring(), &spec(12));
        assert_ne!(c, d);
        assert!(check(&ring(), &d, &solve(&d, 12).to_string(), 1500, &replay).is_ok());
    }

    #[test]
    fn every_failure_is_told_apart() {
        let replay = ReplaySet::new(1024);
        let c = issue(&ring(), &spec(8));
        let good = solve(&c, 8);
        let s = good.to_string();
        assert_eq!(
            check(&ring(), &c, &s, 2000, &replay),
            Err(PowError::Expired)
        );
        assert_eq!(
            check(&ring(), &c, &s, 999, &replay),
            Err(PowError::TooEarly)
        );
        let elsewhere = Prefix::of("198.51.100.1".parse().unwrap(), 24, 48);
        assert_eq!(
            verify(
                &ring(),
                &c,
                &s,
                1500,
                elsewhere,
                ua_hash(b"Mozilla/5.0"),
                &replay
            ),
            Err(PowError::WrongPrefix)
        );
        assert_eq!(
            verify(&ring(), &c, &s, 1500, net(), ua_hash(b"curl"), &replay),
            Err(PowError::WrongClient)
        );
        let bad = (0..).find(|&x| !solves(&c, 8, x)).unwrap();
        assert_eq!(
            check(&ring(), &c, &bad.to_string(), 1500, &replay),
            Err(PowError::TooEasy)
        );
        for junk in ["", "-1", "1e3", " 1", "0001", "99999999999999999", "x"] {
            assert_eq!(
                check(&ring(), &c, junk, 1500, &replay),
                Err(PowError::TooEasy),
                "{junk:?}"
            );
        }
        // Raising or lowering the difficulty (or any byte) breaks the MAC.
        let mut raw = URL_SAFE_NO_PAD.decode(&c).unwrap();
        for i in [5, 13, 22, 40, 46, 48, 49, 50, 60] {
            raw[i] ^= 1;
            let forged = URL_SAFE_NO_PAD.encode(&raw);
            assert_eq!(
                check(&ring(), &forged, &s, 1500, &replay),
                Err(PowError::BadMac),
                "byte {i}"
            );
            raw[i] ^= 1;
        }
        raw[2] ^= 1;
        assert_eq!(
            check(&ring(), &URL_SAFE_NO_PAD.encode(&raw), &s, 1500, &replay),
            Err(PowError::UnknownKey)
        );
        let rotated = Keyring::from_keys(vec![(4, 200, [5; 32])]);
        assert_eq!(
            check(&rotated, &c, &s, 1500, &replay),
            Err(PowError::UnknownKey)
        );
        assert_eq!(
            check(&ring(), "short", &s, 1500, &replay),
            Err(PowError::Malformed)
        );
        assert_eq!(
            check(&ring(), &"*".repeat(CHALLENGE_LEN), &s, 1500, &replay),
            Err(PowError::Malformed)
        );
        // A session MAC over the same bytes is no challenge's.
        let body = &URL_SAFE_NO_PAD.decode(&c).unwrap()[..BODY];
        let (_, tag) = ring().sign(Purpose::Session, body);
        let mut cross = body.to_vec();
        cross.extend_from_slice(&tag);
        assert_eq!(
            check(&ring(), &URL_SAFE_NO_PAD.encode(&cross), &s, 1500, &replay),
            Err(PowError::BadMac)
        );
        // After all that, the real answer still works once.
        assert!(check(&ring(), &c, &s, 1500, &replay).is_ok());
    }

    #[test]
    fn a_time_lock_needs_no_work_but_its_time() {
        let replay = ReplaySet::new(1024);
        let c = issue(&ring(), &spec(0));
        assert_eq!(
            check(&ring(), &c, "0", 999, &replay),
            Err(PowError::TooEarly)
        );
        assert!(check(&ring(), &c, "0", 1000, &replay).is_ok());
        assert_eq!(
            check(&ring(), &c, "0", 1001, &replay),
            Err(PowError::Replayed)
        );
    }

    #[test]
    fn the_replay_set_is_bounded_and_forgets_only_expired_answers() {
        let replay = ReplaySet::new(SHARDS * PROBES);
        let nonce = |i: u64| {
            let mut n = [0u8; 16];
            // All in shard 0, around one slot: the worst case.
            n[8..].copy_from_slice(&i.to_le_bytes());
            n
        };
        for i in 0..PROBES as u64 {
            assert_eq!(replay.spend(nonce(i), 100, 10), Ok(()));
        }
        assert_eq!(replay.spend(nonce(0), 100, 10), Err(PowError::Replayed));
        assert_eq!(replay.spend(nonce(999), 100, 10), Err(PowError::ReplayFull));
        // Once they expire, their slots are reused.
        assert_eq!(replay.spend(nonce(999), 200, 100), Ok(()));
        assert_eq!(
            replay.spend(nonce(0), 200, 100),
            Ok(()),
            "expired, so forgotten"
        );
    }

    #[test]
    fn the_replay_set_holds_most_of_its_capacity_before_refusing() {
        // Nonces are random, so they spread evenly; the first refusal comes when some slot's
        // neighbourhood (PROBES slots) is full. Deterministic "random" nonces: SHA-256 of i.
        let capacity = 1 << 17;
        let replay = ReplaySet::new(capacity);
        let nonce = |i: u64| {
            let d = digest::digest(&digest::SHA256, &i.to_le_bytes());
            let mut n = [0u8; 16];
            n.copy_from_slice(&d.as_ref()[..16]);
            n
        };
        let held = (0..)
            .take_while(|&i| replay.spend(nonce(i), 1000, 10).is_ok())
            .count();
        eprintln!("first refusal after {held} of {capacity}");
        assert!(held >= capacity / 2, "{held}");
        assert_eq!(replay.spend(nonce(0), 1000, 10), Err(PowError::Replayed));
    }

    #[test]
    fn racing_threads_spend_an_answer_once() {
        let replay = std::sync::Arc::new(ReplaySet::new(1 << 12));
        let c = issue(&ring(), &spec(4));
        let answer = solve(&c, 4).to_string();
        let wins: usize = (0..8)
            .map(|_| {
                let (replay, c, answer) = (replay.clone(), c.clone(), answer.clone());
                std::thread::spawn(move || {
                    check(&ring(), &c, &answer, 1500, &replay).is_ok() as usize
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .sum();
        assert_eq!(wins, 1);
    }

    #[test]
    fn zero_bits_are_counted_from_the_top() {
        assert_eq!(zero_bits(&[0, 0, 0x80]), 16);
        assert_eq!(zero_bits(&[0, 0x0f]), 12);
        assert_eq!(zero_bits(&[0xff]), 0);
        assert_eq!(zero_bits(&[0, 0]), 16);
    }
}
