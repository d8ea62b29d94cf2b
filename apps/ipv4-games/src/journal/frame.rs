//! The framing shared by journal segments and snapshots: a 16-byte file header (what the
//! file is, its format version), then frames of `magic, length, CRC-32 of length and
//! payload, payload`. The magic lets a reader that meets a damaged frame look for whole
//! frames after it, which tells a torn tail (nothing whole after the damage: the end of a
//! write cut short) from damage in the middle (whole frames after it: acknowledged claims
//! would be dropped by cutting there).

use std::fmt;

/// Format version of both file kinds; a file with a higher one was written by a newer tern.
pub const VERSION: u32 = 1;
pub const HEADER_LEN: usize = 16;
pub const FRAME_OVERHEAD: usize = 12;
const FRAME_MAGIC: [u8; 4] = *b"TFr1";
/// No frame is this long: a larger length field is damage.
pub const MAX_FRAME: usize = 64 << 20;

/// Which kind of file a header announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Journal,
    Snapshot,
}

impl Kind {
    fn magic(self) -> &'static [u8; 8] {
        match self {
            Kind::Journal => b"ternJRNL",
            Kind::Snapshot => b"ternSNAP",
        }
    }
}

pub fn header(kind: Kind) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..8].copy_from_slice(kind.magic());
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h
}

/// Why a file cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Damage {
    /// Not one of ours, or not this kind.
    WrongMagic,
    /// Written by a newer tern.
    FutureVersion(u32),
    /// A damaged frame at `offset` with whole frames after it.
    Corrupt { offset: u64, why: &'static str },
    /// The file ends inside a frame or a damaged last frame (where a file that must be
    /// complete, a snapshot or a closed segment, ends early).
    Truncated { offset: u64 },
}

impl fmt::Display for Damage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Damage::WrongMagic => write!(f, "is not a tern journal or snapshot (wrong magic)"),
            Damage::FutureVersion(v) => write!(
                f,
                "was written by a newer tern (format {v}; this one reads format {VERSION})"
            ),
            Damage::Corrupt { offset, why } => {
                write!(
                    f,
                    "is damaged at byte {offset} ({why}) with whole records after it"
                )
            }
            Damage::Truncated { offset } => write!(f, "ends early (at byte {offset})"),
        }
    }
}

pub fn check_header(bytes: &[u8], kind: Kind) -> Result<(), Damage> {
    if bytes.len() < HEADER_LEN || &bytes[..8] != kind.magic() {
        return Err(Damage::WrongMagic);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version > VERSION || version == 0 {
        return Err(Damage::FutureVersion(version));
    }
    Ok(())
}

/// Starts a frame in `buf`; `finish_frame` fills in its length and checksum.
pub fn begin_frame(buf: &mut Vec<u8>) -> usize {
    let at = buf.len();
    buf.extend_from_slice(&FRAME_MAGIC);
    buf.extend_from_slice(&[0; 8]);
    at
}

pub fn finish_frame(buf: &mut [u8], at: usize) {
    let len = (buf.len() - at - FRAME_OVERHEAD) as u32;
    buf[at + 4..at + 8].copy_from_slice(&len.to_le_bytes());
    let crc = checksum(&buf[at + 4..at + 8], &buf[at + FRAME_OVERHEAD..]);
    buf[at + 8..at + 12].copy_from_slice(&crc.to_le_bytes());
}

fn checksum(len: &[u8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(len);
    h.update(payload);
    h.finalize()
}

/// The frame at `at`, if one is whole and intact there: (payload, next offset).
fn frame_at(bytes: &[u8], at: usize) -> Result<(&[u8], usize), &'static str> {
    let head = bytes.get(at..at + FRAME_OVERHEAD).ok_or("cut short")?;
    if head[..4] != FRAME_MAGIC {
        return Err("no frame marker");
    }
    let len = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")) as usize;
    if len > MAX_FRAME {
        return Err("impossible length");
    }
    let end = at + FRAME_OVERHEAD + len;
    let payload = bytes.get(at + FRAME_OVERHEAD..end).ok_or("cut short")?;
    let crc = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    if checksum(&head[4..8], payload) != crc {
        return Err("bad checksum");
    }
    Ok((payload, end))
}

/// The payload of `bytes` when it is exactly one whole, intact frame.
pub fn single_frame(bytes: &[u8]) -> Result<&[u8], &'static str> {
    match frame_at(bytes, 0)? {
        (payload, end) if end == bytes.len() => Ok(payload),
        _ => Err("bytes after the frame"),
    }
}

/// The frames of a file (header checked). `Ok((frames, end))`: every whole frame, and the
/// offset where they end; `end < bytes.len()` means a torn tail after `end` (a write cut
/// short: nothing whole follows). Damage with whole frames after it is an error.
pub fn frames(bytes: &[u8], kind: Kind) -> Result<(Vec<&[u8]>, usize), Damage> {
    check_header(bytes, kind)?;
    let mut out = Vec::new();
    let mut at = HEADER_LEN;
    while at < bytes.len() {
        match frame_at(bytes, at) {
            Ok((payload, next)) => {
                out.push(payload);
                at = next;
            }
            Err(why) => {
                if whole_frame_after(bytes, at + 1).is_some() {
                    return Err(Damage::Corrupt {
                        offset: at as u64,
                        why,
                    });
                }
                return Ok((out, at));
            }
        }
    }
    Ok((out, at))
}

/// Whether everything from `end` on is zeros: the part of a segment filled with zeros ahead
/// of its writes (`--sync full`, see `store::journal`) and not written yet. That is a clean
/// end, not a torn write: no frame begins with a zero byte.
pub fn zero_tail(bytes: &[u8], end: usize) -> bool {
    bytes[end..].iter().all(|&b| b == 0)
}

/// The offset of the first whole, intact frame at or after `from`.
fn whole_frame_after(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(i) = memchr::memmem::find(bytes.get(at..)?, &FRAME_MAGIC) {
        if frame_at(bytes, at + i).is_ok() {
            return Some(at + i);
        }
        at += i + 1;
    }
    None
}

/// Reads the little-endian fields of a payload in order.
pub struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes }
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < n {
            return None;
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Some(head)
    }

    pub fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    /// A name: one length byte, then UTF-8.
    pub fn name(&mut self) -> Option<&'a str> {
        let len = self.u8()? as usize;
        std::str::from_utf8(self.take(len)?).ok()
    }
}

pub fn put_name(buf: &mut Vec<u8>, name: &str) {
    debug_assert!(name.len() <= u8::MAX as usize);
    buf.push(name.len() as u8);
    buf.extend_from_slice(name.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(payloads: &[&[u8]]) -> Vec<u8> {
        let mut buf = header(Kind::Journal).to_vec();
        for p in payloads {
            let at = begin_frame(&mut buf);
            buf.extend_from_slice(p);
            finish_frame(&mut buf, at);
        }
        buf
    }

    #[test]
    fn frames_round_trip() {
        let f = file(&[b"one", b"", b"three"]);
        let (frames, end) = frames(&f, Kind::Journal).unwrap();
        assert_eq!(frames, [&b"one"[..], b"", b"three"]);
        assert_eq!(end, f.len());
        assert_eq!(
            super::frames(&f, Kind::Snapshot).unwrap_err(),
            Damage::WrongMagic
        );
    }

    #[test]
    fn a_torn_tail_is_cut_at_the_last_whole_frame() {
        let f = file(&[b"one", b"two"]);
        let whole = file(&[b"one"]).len();
        for cut in whole + 1..f.len() {
            let (frames, end) = frames(&f[..cut], Kind::Journal).unwrap();
            assert_eq!((frames.len(), end), (1, whole), "cut at {cut}");
        }
        // A tail of zeros (a file extended but never written, after a power cut) too.
        let mut zeros = f.clone();
        zeros.extend_from_slice(&[0; 100]);
        assert_eq!(frames(&zeros, Kind::Journal).unwrap().1, f.len());
        // A last frame with a bad checksum and nothing after it.
        let mut bad = f.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(
            frames(&bad, Kind::Journal).unwrap(),
            (vec![&b"one"[..]], whole)
        );
    }

    #[test]
    fn damage_with_whole_frames_after_it_is_an_error() {
        let f = file(&[b"one", b"two", b"three"]);
        let second = file(&[b"one"]).len();
        let mut bad = f.clone();
        bad[second + FRAME_OVERHEAD] ^= 0x40; // a byte of "two"
        assert_eq!(
            frames(&bad, Kind::Journal).unwrap_err(),
            Damage::Corrupt {
                offset: second as u64,
                why: "bad checksum"
            }
        );
        let mut bad_len = f.clone();
        bad_len[second + 4] = 0xff;
        bad_len[second + 7] = 0xff;
        assert!(matches!(
            frames(&bad_len, Kind::Journal).unwrap_err(),
            Damage::Corrupt { .. }
        ));
    }

    #[test]
    fn future_versions_are_refused() {
        let mut f = file(&[b"x"]);
        f[8] = 2;
        assert_eq!(
            frames(&f, Kind::Journal).unwrap_err(),
            Damage::FutureVersion(2)
        );
        assert!(Damage::FutureVersion(2).to_string().contains("newer tern"));
    }
}
