//! Connection IDs that name the worker whose endpoint made them, so that any worker can send a
//! datagram on to the connection's owner when SO_REUSEPORT brought it to the wrong one (the
//! client's address or port changed: NAT rebinding, migration).
//!
//! A CID is [`CID_LEN`] = 17 bytes: one cleartext byte naming the key (its generation), then
//! one AES-128 block over {worker index: 6 bytes, big-endian; nonce: 10 random bytes}. This is
//! QUIC-LB's single-pass block-cipher layout (draft-ietf-quic-load-balancers §5.4.1):
//! - AES needs its whole 16-byte block to decrypt, and one block is the least that hides the
//!   index: the 17 bytes fit QUIC's 20-byte limit, and every short-header packet pays 9 bytes
//!   more than quinn's 8-byte default for it (under 1% of a full datagram).
//! - The index field is wider than any worker count needs: its high bytes, always zero, are
//!   what make a forged or random block fail (it decrypts to an index in range with odds of
//!   `workers / 2^48`), so `validate` and [`CidKey::owner`] refuse garbage without a table.
//! - 80 random bits per CID: distinct plaintexts, hence CIDs an observer cannot link (RFC 9000
//!   §5.1), with collisions (which quinn retries) after about 2^40 CIDs.
//! - The generation byte lets a later key rotation tell its keys apart without a trial
//!   decryption; today it is random per process, so CIDs of an earlier tern are refused by one
//!   compare in 255 cases of 256.
//!
//! The key is made at start-up from the system's random source and never leaves the process:
//! outsiders cannot read a worker index, nor make a CID that names one.

use std::sync::Arc;

use aws_lc_rs::cipher::{
    DecryptingKey, DecryptionContext, EncryptingKey, UnboundCipherKey, AES_128,
};
use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};

/// The length of every CID tern's endpoints make.
pub(crate) const CID_LEN: usize = 1 + BLOCK;
const BLOCK: usize = 16;
/// The worker index's bytes at the start of the plaintext block.
const INDEX: usize = 6;

/// The process's CID key, shared by every worker's endpoints.
pub(crate) struct CidKey {
    generation: u8,
    seal: EncryptingKey,
    open: DecryptingKey,
    workers: usize,
}

impl CidKey {
    /// A new random key for CIDs of `workers` workers.
    pub fn random(workers: usize) -> CidKey {
        let mut bytes = [0u8; BLOCK + 1];
        random_fill(&mut bytes);
        let (generation, key) = (bytes[0], &bytes[1..]);
        let unbound = || UnboundCipherKey::new(&AES_128, key).expect("a 16-byte AES-128 key");
        CidKey {
            generation,
            seal: EncryptingKey::ecb(unbound()).expect("AES-128 supports ECB"),
            open: DecryptingKey::ecb(unbound()).expect("AES-128 supports ECB"),
            workers,
        }
    }

    /// A new CID naming `worker`.
    pub fn make(&self, worker: usize) -> [u8; CID_LEN] {
        let mut cid = [0u8; CID_LEN];
        cid[0] = self.generation;
        let block = &mut cid[1..];
        block[..INDEX].copy_from_slice(&(worker as u64).to_be_bytes()[8 - INDEX..]);
        random_fill(&mut block[INDEX..]);
        self.seal
            .encrypt(block)
            .expect("one whole block in ECB mode");
        cid
    }

    /// The worker that made `dcid`, if it is one of this key's CIDs (of this process).
    pub fn owner(&self, dcid: &[u8]) -> Option<usize> {
        if dcid.len() != CID_LEN || dcid[0] != self.generation {
            return None;
        }
        let mut block = [0u8; BLOCK];
        block.copy_from_slice(&dcid[1..]);
        let plain = self
            .open
            .decrypt(&mut block, DecryptionContext::None)
            .ok()?;
        let mut index = [0u8; 8];
        index[8 - INDEX..].copy_from_slice(&plain[..INDEX]);
        let index = u64::from_be_bytes(index);
        (index < self.workers as u64).then_some(index as usize)
    }

    /// The CID generator of `worker`'s endpoints.
    pub fn generator(self: &Arc<Self>, worker: usize) -> WorkerCids {
        WorkerCids {
            key: self.clone(),
            worker,
        }
    }
}

/// Fills `bytes` from aws-lc's random source. It aborts the process rather than return an
/// error on a broken entropy source; falling back to fixed bytes instead would give every
/// connection the same CID, which quinn's uniqueness retry would loop on forever.
fn random_fill(bytes: &mut [u8]) {
    aws_lc_rs::rand::fill(bytes).expect("the system's random source");
}

/// One worker's CIDs, for quinn's endpoints.
pub(crate) struct WorkerCids {
    key: Arc<CidKey>,
    worker: usize,
}

impl ConnectionIdGenerator for WorkerCids {
    fn generate_cid(&mut self) -> ConnectionId {
        ConnectionId::new(&self.key.make(self.worker))
    }

    /// Only this worker's own CIDs: quinn asks for a short-header packet of no connection it
    /// knows, and answers one that passes with a stateless reset. Another worker's CID gets
    /// here only when it could not be handed to its owner; with one reset key for every worker
    /// that reset would end a connection that lives, so the packet is dropped instead.
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        match self.key.owner(cid) {
            Some(w) if w == self.worker => Ok(()),
            _ => Err(InvalidCid),
        }
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

/// The destination CID of a QUIC datagram's first packet, when it could be one of ours: a
/// short header's first [`CID_LEN`] bytes after its first byte (its length is not on the
/// wire), or a long header's DCID when its length byte says [`CID_LEN`].
pub(crate) fn datagram_dcid(datagram: &[u8]) -> Option<&[u8]> {
    let first = *datagram.first()?;
    if first & 0x80 == 0 {
        return datagram.get(1..1 + CID_LEN);
    }
    // Long header: first byte, 4 bytes of version, the DCID's length, the DCID.
    if *datagram.get(5)? as usize != CID_LEN {
        return None;
    }
    datagram.get(6..6 + CID_LEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_index_comes_back_from_its_cids() {
        let workers = 300;
        let key = Arc::new(CidKey::random(workers));
        for w in 0..workers {
            let mut generator = key.generator(w);
            let cid = generator.generate_cid();
            assert_eq!(cid.len(), generator.cid_len());
            assert_eq!(key.owner(&cid), Some(w));
            assert!(generator.validate(&cid).is_ok());
        }
    }

    #[test]
    fn each_cid_is_new_and_hides_its_worker() {
        let key = CidKey::random(2);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            assert!(seen.insert(key.make(0)), "a CID came twice");
        }
        // The same worker's CIDs share nothing an observer could group them by: after the
        // generation byte, each byte position takes many values.
        let cids: Vec<_> = (0..256).map(|_| key.make(1)).collect();
        for at in 1..CID_LEN {
            let values: std::collections::HashSet<u8> = cids.iter().map(|c| c[at]).collect();
            assert!(
                values.len() > 100,
                "byte {at} takes {} values",
                values.len()
            );
        }
    }

    /// A random block decrypts to an index below `workers` with its 48-bit index field's
    /// odds, `workers / 2^48`, after the generation byte matched (1 in 256, set here so that
    /// the cipher's check is what is tested): over 10,000 tries with 2 workers, 7.1e-11
    /// expected acceptances. One acceptance would mean the check is broken.
    #[test]
    fn random_bytes_are_refused() {
        let key = Arc::new(CidKey::random(2));
        let generators = [key.generator(0), key.generator(1)];
        let mut cid = [0u8; CID_LEN];
        for _ in 0..10_000 {
            random_fill(&mut cid);
            cid[0] = key.generation;
            assert_eq!(key.owner(&cid), None, "{cid:02x?}");
            for g in &generators {
                assert!(g.validate(&ConnectionId::new(&cid)).is_err());
            }
        }
        // The wrong length or generation: refused before any decryption.
        let good = key.make(1);
        assert_eq!(key.owner(&good[..CID_LEN - 1]), None);
        let mut other_generation = good;
        other_generation[0] ^= 1;
        assert_eq!(key.owner(&other_generation), None);
    }

    #[test]
    fn a_worker_validates_its_own_cids_only() {
        let key = Arc::new(CidKey::random(2));
        let (mut zero, one) = (key.generator(0), key.generator(1));
        let cid = zero.generate_cid();
        assert!(zero.validate(&cid).is_ok());
        assert!(one.validate(&cid).is_err());
        assert_eq!(key.owner(&cid), Some(0));
    }

    #[test]
    fn each_process_key_is_its_own() {
        let (a, mut b) = (CidKey::random(4), CidKey::random(4));
        // The generation byte may match by chance (1 in 256): the blocks must still differ.
        b.generation = a.generation;
        for w in 0..4 {
            let cid = a.make(w);
            assert_eq!(b.owner(&cid), None);
        }
    }

    #[test]
    fn the_dcid_is_read_from_short_and_long_headers() {
        let cid = [7u8; CID_LEN];
        let mut short = vec![0x41];
        short.extend_from_slice(&cid);
        short.extend_from_slice(&[0; 20]);
        assert_eq!(datagram_dcid(&short), Some(&cid[..]));
        assert_eq!(datagram_dcid(&short[..CID_LEN]), None, "cut short");
        let mut long = vec![0xc3, 0, 0, 0, 1, CID_LEN as u8];
        long.extend_from_slice(&cid);
        long.extend_from_slice(&[8, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(datagram_dcid(&long), Some(&cid[..]));
        long[5] = 8; // a client's own 8-byte DCID (an Initial): not ours
        assert_eq!(datagram_dcid(&long), None);
        assert_eq!(datagram_dcid(&[]), None);
        assert_eq!(datagram_dcid(&[0xc0, 0, 0]), None);
    }
}
