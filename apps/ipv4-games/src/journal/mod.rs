//! The game's files: an append-only claim journal in numbered segments, and snapshots that
//! fold closed segments away. Segment N is `journal-N.log`; `snapshot-N.snap` holds every
//! claim of the segments before N, so recovery is the newest snapshot, then segments N, N+1,
//! … in order. A journal frame is one worker turn's changed claims, written with one system
//! call; replaying frames in file order rebuilds exactly the state the game had, because
//! claims are decided and applied in that same order under the store's write lock.

pub mod compact;
pub mod frame;
pub mod snapshot;

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::land::Land;
use frame::{Damage, Kind, Reader};

/// One claim as the journal holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    pub ip: u32,
    pub created: u32,
    pub nick: &'a str,
}

impl Record<'_> {
    pub fn encode(&self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&self.ip.to_le_bytes());
        buf.extend_from_slice(&self.created.to_le_bytes());
        frame::put_name(buf, self.nick);
    }
}

/// The records of one journal frame, in order; `None` for a payload that does not parse
/// (its checksum matched, so a bug or a foreign writer, never a torn write).
pub fn records(payload: &[u8]) -> Option<Vec<Record<'_>>> {
    let mut r = Reader::new(payload);
    let mut out = Vec::new();
    while !r.is_empty() {
        out.push(Record {
            ip: r.u32()?,
            created: r.u32()?,
            nick: r.name()?,
        });
    }
    Some(out)
}

pub fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("journal-{n:010}.log"))
}

pub fn snapshot_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("snapshot-{n:010}.snap"))
}

/// What the data folder holds: segment and snapshot numbers, ascending.
#[derive(Debug, Default)]
pub struct Listing {
    pub segments: Vec<u64>,
    pub snapshots: Vec<u64>,
    /// Half-written snapshots (`.tmp`) left by a crash.
    pub leftovers: Vec<PathBuf>,
}

pub fn list(dir: &Path) -> io::Result<Listing> {
    let mut l = Listing::default();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let number = |prefix: &str, suffix: &str| {
            name.strip_prefix(prefix)?
                .strip_suffix(suffix)?
                .parse::<u64>()
                .ok()
        };
        if let Some(n) = number("journal-", ".log") {
            l.segments.push(n);
        } else if let Some(n) = number("snapshot-", ".snap") {
            l.snapshots.push(n);
        } else if name.starts_with("snapshot-") && name.ends_with(".tmp") {
            l.leftovers.push(entry.path());
        }
    }
    l.segments.sort_unstable();
    l.snapshots.sort_unstable();
    Ok(l)
}

/// Where appends go on after recovery.
#[derive(Debug)]
pub struct Recovered {
    /// The segment to append to (created if missing) and its length.
    pub segment: u64,
    pub length: u64,
    /// Claims read back: from the snapshot, and from the journal.
    pub from_snapshot: u64,
    pub from_journal: u64,
    /// A torn tail cut off: (file, length before, length after).
    pub cut: Option<(PathBuf, u64, u64)>,
}

/// One line for the operator about a file that stops the game from starting.
fn refuse(path: &Path, damage: &Damage) -> String {
    let what_to_do = match damage {
        Damage::FutureVersion(_) => "run the newer tern, or move the data folder aside".to_string(),
        Damage::Corrupt { offset, .. } => format!(
            "acknowledged claims may follow the damage: restore the file from a backup, or \
             truncate it to {offset} bytes to start without what follows"
        ),
        Damage::Truncated { .. } | Damage::WrongMagic => {
            "restore the file from a backup, or move it aside to start without its claims"
                .to_string()
        }
    };
    format!("{} {damage}; {what_to_do}", path.display())
}

/// Rebuilds `land` from the data folder: the newest snapshot, then every later segment. The
/// last segment may end in a torn write (a crash during a write, or a power cut after an
/// unsynced one), which is cut off and reported; any other damage is an error naming the
/// file, the offset and what to do.
pub fn recover(dir: &Path, land: &Land) -> Result<Recovered, String> {
    recover_with(dir, land, true)
}

/// `recover` without changing any file (an export beside a live server): a torn tail is
/// left out, not cut, and leftovers stay.
pub fn recover_read_only(dir: &Path, land: &Land) -> Result<Recovered, String> {
    recover_with(dir, land, false)
}

fn recover_with(dir: &Path, land: &Land, repair: bool) -> Result<Recovered, String> {
    let listing = list(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    if repair {
        for tmp in &listing.leftovers {
            let _ = std::fs::remove_file(tmp);
        }
    }
    let mut from_snapshot = 0;
    let first_segment = match listing.snapshots.last() {
        Some(&n) => {
            let path = snapshot_path(dir, n);
            let read = snapshot::read(&path, |ip, nick, created| {
                land.load(ip, nick, created as u64);
            })
            .map_err(|e| match e {
                snapshot::ReadError::Io(e) => format!("cannot read {}: {e}", path.display()),
                snapshot::ReadError::Damaged(d) => refuse(&path, &d),
            })?;
            land.set_recent(read.recent);
            from_snapshot = read.claims;
            // Older snapshots and segments folded into this one: a crash came between writing
            // it and removing them.
            if repair {
                for &old in listing.snapshots.iter().filter(|&&s| s < n) {
                    let _ = std::fs::remove_file(snapshot_path(dir, old));
                }
                for &old in listing.segments.iter().filter(|&&s| s < n) {
                    let _ = std::fs::remove_file(segment_path(dir, old));
                }
            }
            n
        }
        None => 1,
    };
    let segments: Vec<u64> = listing
        .segments
        .iter()
        .copied()
        .filter(|&s| s >= first_segment)
        .collect();
    // Segments follow each other without a gap, from the one the snapshot stops at: a
    // missing one would silently drop the claims it held.
    for (expected, &n) in (first_segment..).zip(&segments) {
        if n != expected {
            return Err(format!(
                "{} is missing (the journal in {} goes on at segment {n}); restore it from a \
                 backup, or move the later segments aside to start without them",
                segment_path(dir, expected).display(),
                dir.display()
            ));
        }
    }
    let mut from_journal = 0;
    let mut cut = None;
    let mut length = frame::HEADER_LEN as u64;
    for (i, &n) in segments.iter().enumerate() {
        let path = segment_path(dir, n);
        let mut bytes = Vec::new();
        File::open(&path)
            .and_then(|mut f| f.read_to_end(&mut bytes))
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let last = i + 1 == segments.len();
        if last && bytes.len() < frame::HEADER_LEN && bytes.iter().all(|&b| b == 0) {
            // Created, but its header never reached the disk (a power cut): rewrite it.
            if repair {
                std::fs::write(&path, frame::header(Kind::Journal))
                    .map_err(|e| format!("cannot repair {}: {e}", path.display()))?;
            }
            cut = Some((path, bytes.len() as u64, frame::HEADER_LEN as u64));
            length = frame::HEADER_LEN as u64;
            continue;
        }
        let (frames, end) = frame::frames(&bytes, Kind::Journal).map_err(|d| refuse(&path, &d))?;
        if end < bytes.len() && !frame::zero_tail(&bytes, end) {
            if !last {
                // A closed segment was complete (and synced) before the next one began.
                return Err(refuse(&path, &Damage::Truncated { offset: end as u64 }));
            }
            if repair {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
                f.set_len(end as u64)
                    .and_then(|()| f.sync_all())
                    .map_err(|e| format!("cannot cut the torn tail of {}: {e}", path.display()))?;
            }
            cut = Some((path.clone(), bytes.len() as u64, end as u64));
        }
        for (k, payload) in frames.iter().enumerate() {
            let Some(records) = records(payload) else {
                let offset = frame_offset(&frames, k);
                return Err(refuse(
                    &path,
                    &Damage::Corrupt {
                        offset,
                        why: "a record that does not parse",
                    },
                ));
            };
            for r in records {
                land.apply(r.ip, r.nick, r.created as u64);
                from_journal += 1;
            }
        }
        length = end as u64;
    }
    let segment = segments.last().copied().unwrap_or(first_segment);
    if segments.is_empty() {
        length = frame::HEADER_LEN as u64;
    }
    Ok(Recovered {
        segment,
        length,
        from_snapshot,
        from_journal,
        cut,
    })
}

/// The file offset of frame `k` (for an error message).
fn frame_offset(frames: &[&[u8]], k: usize) -> u64 {
    frame::HEADER_LEN as u64
        + frames[..k]
            .iter()
            .map(|f| (f.len() + frame::FRAME_OVERHEAD) as u64)
            .sum::<u64>()
}

/// Syncs a folder, so that files created or renamed in it survive a power cut.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write_segment(dir: &Path, n: u64, turns: &[&[(u32, &str, u32)]]) -> PathBuf {
        let mut buf = frame::header(Kind::Journal).to_vec();
        for turn in turns {
            let at = frame::begin_frame(&mut buf);
            for &(ip, nick, created) in *turn {
                Record { ip, created, nick }.encode(&mut buf);
            }
            frame::finish_frame(&mut buf, at);
        }
        let path = segment_path(dir, n);
        std::fs::write(&path, buf).unwrap();
        path
    }

    #[test]
    fn recovery_replays_segments_in_order() {
        let dir = tempfile::tempdir().unwrap();
        write_segment(
            dir.path(),
            1,
            &[&[(1, "a", 10), (2, "b", 11)], &[(1, "c", 12)]],
        );
        write_segment(dir.path(), 2, &[&[(1, "d", 13)]]);
        let land = Land::new();
        let r = recover(dir.path(), &land).unwrap();
        assert_eq!((r.segment, r.from_journal, r.from_snapshot), (2, 4, 0));
        assert_eq!(land.holder(1), Some(("d".into(), 13)));
        assert_eq!(land.holder(2), Some(("b".into(), 11)));
        assert!(r.cut.is_none());
    }

    #[test]
    fn a_torn_tail_of_the_last_segment_is_cut_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_segment(dir.path(), 1, &[&[(1, "a", 10)], &[(2, "b", 11)]]);
        let whole = std::fs::metadata(&path).unwrap().len();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"TFr1\x10\x00\x00\x00partial").unwrap();
        let land = Land::new();
        let r = recover(dir.path(), &land).unwrap();
        assert_eq!(r.cut, Some((path.clone(), whole + 15, whole)));
        assert_eq!(r.length, whole);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
        assert_eq!(land.claimed(), 2);
    }

    /// Zeros after the last frame (a segment filled ahead under `--sync full`) are a clean end
    /// in any segment, the last or a closed one: nothing cut, nothing refused. A torn write
    /// before the zeros is cut with them.
    #[test]
    fn a_tail_of_zeros_is_a_clean_end_and_a_torn_write_before_it_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let zeros = |path: &Path, extra: &[u8]| {
            let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
            f.write_all(extra).unwrap();
            f.write_all(&[0; 5000]).unwrap();
        };
        let first = write_segment(dir.path(), 1, &[&[(1, "a", 10)]]);
        let whole = std::fs::metadata(&first).unwrap().len();
        zeros(&first, b"");
        let last = write_segment(dir.path(), 2, &[&[(2, "b", 11)], &[(3, "c", 12)]]);
        let last_whole = std::fs::metadata(&last).unwrap().len();
        zeros(&last, b"");
        let land = Land::new();
        let r = recover(dir.path(), &land).unwrap();
        assert_eq!((r.segment, r.length, r.from_journal), (2, last_whole, 3));
        assert!(r.cut.is_none());
        assert_eq!(std::fs::metadata(&first).unwrap().len(), whole + 5000);
        assert_eq!(std::fs::metadata(&last).unwrap().len(), last_whole + 5000);
        // A partial frame, then the zeros: a torn write, cut with the zeros after it.
        let mut f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"TFr1\x10\x00\x00\x00part", last_whole)
            .unwrap();
        f.flush().unwrap();
        let r = recover(dir.path(), &Land::new()).unwrap();
        assert_eq!(r.cut, Some((last.clone(), last_whole + 5000, last_whole)));
        assert_eq!(std::fs::metadata(&last).unwrap().len(), last_whole);
        // Compaction reads the closed segment's zeros as its end too.
        let done = compact::compact(
            dir.path(),
            None,
            2,
            &mut tern_services::background::Yielder::new(std::time::Duration::MAX),
        )
        .unwrap();
        assert_eq!(done.claims, 1);
    }

    #[test]
    fn damage_in_a_closed_segment_or_mid_file_refuses_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_segment(dir.path(), 1, &[&[(1, "a", 10)], &[(2, "b", 11)]]);
        write_segment(dir.path(), 2, &[&[(3, "c", 12)]]);
        // The first segment cut short: it was closed, so it must be whole.
        let len = std::fs::metadata(&path).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 3)
            .unwrap();
        let err = recover(dir.path(), &Land::new()).unwrap_err();
        assert!(err.contains("journal-0000000001.log ends early"), "{err}");
        // A flipped byte in the middle of the last segment, with a whole frame after it.
        let dir = tempfile::tempdir().unwrap();
        let path = write_segment(dir.path(), 1, &[&[(1, "a", 10)], &[(2, "b", 11)]]);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[frame::HEADER_LEN + frame::FRAME_OVERHEAD + 1] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = recover(dir.path(), &Land::new()).unwrap_err();
        assert!(
            err.contains("is damaged at byte 16 (bad checksum)")
                && err.contains("truncate it to 16"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1);
    }

    #[test]
    fn a_missing_segment_refuses_to_start() {
        let dir = tempfile::tempdir().unwrap();
        write_segment(dir.path(), 1, &[&[(1, "a", 10)]]);
        write_segment(dir.path(), 3, &[&[(2, "b", 11)]]);
        let err = recover(dir.path(), &Land::new()).unwrap_err();
        assert!(err.contains("journal-0000000002.log is missing"), "{err}");
        // A folder whose first segment is gone, with no snapshot to stand for it.
        std::fs::remove_file(segment_path(dir.path(), 1)).unwrap();
        let err = recover(dir.path(), &Land::new()).unwrap_err();
        assert!(err.contains("journal-0000000001.log is missing"), "{err}");
    }

    #[test]
    fn a_future_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_segment(dir.path(), 1, &[&[(1, "a", 10)]]);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8] = 9;
        std::fs::write(&path, bytes).unwrap();
        let err = recover(dir.path(), &Land::new()).unwrap_err();
        assert!(err.contains("newer tern (format 9"), "{err}");
    }
}
