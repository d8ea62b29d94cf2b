//! Compaction: folds the closed journal segments into a new snapshot, off the claim path.
//! It works from the files alone (the old snapshot, sorted by address, merged with the
//! segments' claims sorted the same way), never from the live state, so it needs no lock the
//! workers take and its result is exactly what recovery would rebuild from those files.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::Path;

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
/// `snapshot-{upto}`, then removes what it replaced.
pub fn compact(dir: &Path, old: Option<u64>, upto: u64) -> Result<Compacted, String> {
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
    claims.sort_by_key(|c| c.0);
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

#[cfg(test)]
mod tests {
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
        let c = compact(dir.path(), None, 3).unwrap();
        assert_eq!((c.covers, c.claims, c.segments), (3, 3, 2));
        assert!(!segment_path(dir.path(), 1).exists());
        assert!(segment_path(dir.path(), 3).exists());
        assert_eq!(state(dir.path()), before);
        // A second round merges the snapshot with newer segments.
        segment(dir.path(), 4, &[(3, "g", 7), (2, "h", 8)]);
        let c = compact(dir.path(), Some(3), 5).unwrap();
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
