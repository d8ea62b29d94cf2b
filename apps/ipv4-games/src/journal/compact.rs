//! Compaction: folds the closed journal segments into a new snapshot, off the claim path.
//! It works from the files alone (the old snapshot, sorted by address, merged with the
//! segments' claims sorted the same way), never from the live state, so it needs no lock the
//! workers take and its result is exactly what recovery would rebuild from those files.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use tern_services::background::Yielder;

use super::frame::{self, Kind};
use super::{records, segment_path, snapshot, snapshot_path};
use crate::land::{Claim, RECENT_LEN};

/// What one compaction did.
#[derive(Debug, Clone, Copy)]
pub struct Compacted {
    /// The new snapshot covers segments before this one.
    pub covers: u64,
    pub claims: u64,
    pub bytes: u64,
    pub segments: usize,
}

/// Merges snapshot `old` (if any) and segments `old.unwrap_or(1) .. upto` into
/// `snapshot-{upto}`, then removes what it replaced. `yielder` is given a point per frame, per
/// row and per slice of the sort: the compactor shares a core with the workers.
pub fn compact(
    dir: &Path,
    old: Option<u64>,
    upto: u64,
    yielder: &mut Yielder,
) -> Result<Compacted, String> {
    let first = old.unwrap_or(1);
    // The segments' claims, last one per address wins: (address, order) sorted.
    let mut names: Vec<Box<str>> = Vec::new();
    let mut name_ids: HashMap<Box<str>, u32> = HashMap::new();
    let mut claims: Vec<(u32, u32, u32)> = Vec::new(); // address, created, name id
    let mut recent_tail: Vec<(u32, u32, u32)> = Vec::new();
    let mut segments = 0;
    for n in first..upto {
        let path = segment_path(dir, n);
        let mut bytes = Vec::new();
        File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        segments += 1;
        let (frames, end) =
            frame::frames(&bytes, Kind::Journal).map_err(|d| format!("{} {d}", path.display()))?;
        if end != bytes.len() && !frame::zero_tail(&bytes, end) {
            return Err(format!("{} ends early (at byte {end})", path.display()));
        }
        for payload in frames {
            yielder.point();
            let recs = records(payload)
                .ok_or_else(|| format!("{} holds a record that does not parse", path.display()))?;
            for r in recs {
                let id = match name_ids.get(r.nick) {
                    Some(&id) => id,
                    None => {
                        let id = names.len() as u32;
                        names.push(r.nick.into());
                        name_ids.insert(r.nick.into(), id);
                        id
                    }
                };
                claims.push((r.ip, r.created, id));
            }
        }
    }
    recent_tail.extend(claims.iter().rev().take(RECENT_LEN).copied());
    // Stable: for one address, the order of the journal is kept; the last change wins.
    let claims = sort_by_address(claims, yielder);
    let mut latest: Vec<(u32, u32, u32)> = Vec::with_capacity(claims.len());
    for c in claims {
        match latest.last_mut() {
            Some(last) if last.0 == c.0 => *last = c,
            _ => latest.push(c),
        }
    }

    let out_path = snapshot_path(dir, upto);
    let mut out = snapshot::Writer::create(&out_path)
        .map_err(|e| format!("cannot create {}: {e}", out_path.display()))?;
    let mut next = latest.iter().peekable();
    let mut failed: Option<String> = None;
    let mut last_ip: Option<u32> = None;
    let mut old_recent = Vec::new();
    if let Some(n) = old {
        let path = snapshot_path(dir, n);
        let read = snapshot::read(&path, |ip, nick, created| {
            if failed.is_some() {
                return;
            }
            if last_ip.is_some_and(|l| l >= ip) {
                failed = Some(format!("{} is not in address order", path.display()));
                return;
            }
            last_ip = Some(ip);
            yielder.point();
            while let Some(&&(nip, ncreated, nid)) = next.peek() {
                if nip > ip {
                    break;
                }
                next.next();
                if let Err(e) = out.add(nip, &names[nid as usize], ncreated) {
                    failed = Some(format!("cannot write {}: {e}", out_path.display()));
                    return;
                }
                if nip == ip {
                    return; // the journal's claim replaces the snapshot's
                }
            }
            if let Err(e) = out.add(ip, nick, created) {
                failed = Some(format!("cannot write {}: {e}", out_path.display()));
            }
        })
        .map_err(|e| match e {
            snapshot::ReadError::Io(e) => format!("cannot read {}: {e}", path.display()),
            snapshot::ReadError::Damaged(d) => format!("{} {d}", path.display()),
        })?;
        old_recent = read.recent;
    }
    if let Some(e) = failed {
        return Err(e);
    }
    for &(ip, created, id) in next {
        yielder.point();
        out.add(ip, &names[id as usize], created)
            .map_err(|e| format!("cannot write {}: {e}", out_path.display()))?;
    }
    // Newest first: the segments' latest changes, then the old snapshot's list.
    let recent: Vec<Claim> = recent_tail
        .iter()
        .map(|&(ip, created, id)| Claim {
            ip,
            nick: names[id as usize].to_string(),
            created: created as u64,
        })
        .chain(old_recent)
        .take(RECENT_LEN)
        .collect();
    let claims = out.claims();
    let bytes = out
        .finish(&recent)
        .map_err(|e| format!("cannot write {}: {e}", out_path.display()))?;
    // The new snapshot is in place and synced: what it replaces can go.
    if let Some(n) = old {
        let _ = std::fs::remove_file(snapshot_path(dir, n));
    }
    for n in first..upto {
        let _ = std::fs::remove_file(segment_path(dir, n));
    }
    Ok(Compacted {
        covers: upto,
        claims,
        bytes,
        segments,
    })
}

/// Claims sorted by address, stably (for one address, the journal's order is kept): a radix
/// sort in two passes of 16 bits, with a yield point every `SORT_SLICE` claims. A single call
/// of the standard library's stable sort cannot give the CPU back, and holds it for 135 ms
/// over 4 M claims (a 64 MiB segment's worth); the radix passes take 104 ms (release build,
/// this machine, 2026-12-03).
fn sort_by_address(claims: Vec<(u32, u32, u32)>, yielder: &mut Yielder) -> Vec<(u32, u32, u32)> {
    const SORT_SLICE: usize = 4096;
    let mut from = claims;
    let mut to = vec![(0, 0, 0); from.len()];
    let mut counts = vec![0usize; 1 << 16];
    for shift in [0u32, 16] {
        let digit = |c: &(u32, u32, u32)| ((c.0 >> shift) & 0xffff) as usize;
        counts.fill(0);
        for chunk in from.chunks(SORT_SLICE) {
            yielder.point();
            for c in chunk {
                counts[digit(c)] += 1;
            }
        }
        let mut at = 0;
        for n in counts.iter_mut() {
            (*n, at) = (at, at + *n);
        }
        for chunk in from.chunks(SORT_SLICE) {
            yielder.point();
            for c in chunk {
                let d = digit(c);
                to[counts[d]] = *c;
                counts[d] += 1;
            }
        }
        std::mem::swap(&mut from, &mut to);
    }
    from
}

#[cfg(test)]
mod tests {
    fn no_yields() -> Yielder {
        Yielder::new(std::time::Duration::MAX)
    }

    /// The radix sort is the standard library's stable sort by address, with yield points.
    #[test]
    fn the_address_sort_is_stable_and_yields() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        // Few distinct addresses among many claims (repeats must keep their order), spread
        // over both halves of the address.
        let claims: Vec<(u32, u32, u32)> = (0..100_000u32)
            .map(|i| {
                let r = next();
                (
                    (r as u32 % 5000).wrapping_mul(0x9E37_79B1),
                    i,
                    (r >> 40) as u32,
                )
            })
            .collect();
        let mut expected = claims.clone();
        expected.sort_by_key(|c| c.0);
        let mut yielder = Yielder::new(std::time::Duration::ZERO);
        assert_eq!(sort_by_address(claims, &mut yielder), expected);
        assert!(yielder.yields() > 0);
        assert!(sort_by_address(Vec::new(), &mut no_yields()).is_empty());
    }

    use super::super::{recover, Record};
    use super::*;
    use crate::land::Land;

    fn segment(dir: &Path, n: u64, claims: &[(u32, &str, u32)]) {
        let mut buf = frame::header(Kind::Journal).to_vec();
        for &(ip, nick, created) in claims {
            let at = frame::begin_frame(&mut buf);
            Record { ip, created, nick }.encode(&mut buf);
            frame::finish_frame(&mut buf, at);
        }
        std::fs::write(segment_path(dir, n), buf).unwrap();
    }

    fn state(dir: &Path) -> Vec<(u32, String, u64)> {
        let land = Land::new();
        recover(dir, &land).unwrap();
        let mut v = Vec::new();
        land.sorted_scan(|ip, n, c| v.push((ip, n.to_string(), c)));
        v
    }

    #[test]
    fn compaction_keeps_exactly_what_recovery_would_rebuild() {
        let dir = tempfile::tempdir().unwrap();
        segment(dir.path(), 1, &[(5, "a", 1), (3, "b", 2), (5, "c", 3)]);
        segment(dir.path(), 2, &[(9, "d", 4), (3, "e", 5)]);
        segment(dir.path(), 3, &[(1, "f", 6)]); // the open segment: not folded
        let before = state(dir.path());
        let c = compact(dir.path(), None, 3, &mut no_yields()).unwrap();
        assert_eq!((c.covers, c.claims, c.segments), (3, 3, 2));
        assert!(!segment_path(dir.path(), 1).exists());
        assert!(segment_path(dir.path(), 3).exists());
        assert_eq!(state(dir.path()), before);
        // A second round merges the snapshot with newer segments.
        segment(dir.path(), 4, &[(3, "g", 7), (2, "h", 8)]);
        let c = compact(dir.path(), Some(3), 5, &mut no_yields()).unwrap();
        assert_eq!(c.claims, 5);
        assert!(!snapshot_path(dir.path(), 3).exists());
        let after = state(dir.path());
        assert_eq!(
            after,
            vec![
                (1, "f".into(), 6),
                (2, "h".into(), 8),
                (3, "g".into(), 7),
                (5, "c".into(), 3),
                (9, "d".into(), 4)
            ]
        );
        let land = Land::new();
        recover(dir.path(), &land).unwrap();
        let recent: Vec<_> = land.recent().into_iter().map(|c| c.nick).collect();
        assert_eq!(recent, ["h", "g", "f", "e", "d", "c", "b", "a"]);
    }
}
