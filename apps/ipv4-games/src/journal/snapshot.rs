//! Snapshots: every held address at one point of the journal, written once, sequentially,
//! to a `.tmp` file that is synced and renamed into place, so a snapshot is either whole or
//! absent. After the header come frames of one kind byte each: `N` (names, numbered in the
//! order they appear), `E` (address, name number, time: 12 bytes each), `R` (the latest
//! claims, for `/recent`), and last `Z` (how many addresses, to check against).
//!
//! A snapshot is read as a stream (never whole in memory: at 100 M claims it is over a GiB)
//! and any damage at all is an error: it was complete before it was renamed into place.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::frame::{self, Damage, Kind, Reader};
use crate::land::Claim;

/// Entries per `E` frame.
const ENTRIES_PER_FRAME: usize = 8192;

pub struct Writer {
    out: BufWriter<File>,
    tmp: PathBuf,
    path: PathBuf,
    names: HashMap<Box<str>, u32>,
    new_names: Vec<u8>,
    entries: Vec<u8>,
    in_frame: usize,
    claims: u64,
    bytes: u64,
}

impl Writer {
    /// Starts `path` (written as `path.tmp` until `finish`).
    pub fn create(path: &Path) -> io::Result<Writer> {
        let tmp = path.with_extension("snap.tmp");
        let mut out = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
        out.write_all(&frame::header(Kind::Snapshot))?;
        Ok(Writer {
            out,
            tmp,
            path: path.to_path_buf(),
            names: HashMap::new(),
            new_names: Vec::new(),
            entries: Vec::new(),
            in_frame: 0,
            claims: 0,
            bytes: frame::HEADER_LEN as u64,
        })
    }

    pub fn add(&mut self, ip: u32, nick: &str, created: u32) -> io::Result<()> {
        let id = match self.names.get(nick) {
            Some(&id) => id,
            None => {
                let id = self.names.len() as u32;
                self.names.insert(nick.into(), id);
                if self.new_names.is_empty() {
                    self.new_names.push(b'N');
                }
                frame::put_name(&mut self.new_names, nick);
                id
            }
        };
        if self.entries.is_empty() {
            self.entries.push(b'E');
        }
        self.entries.extend_from_slice(&ip.to_le_bytes());
        self.entries.extend_from_slice(&id.to_le_bytes());
        self.entries.extend_from_slice(&created.to_le_bytes());
        self.in_frame += 1;
        self.claims += 1;
        if self.in_frame == ENTRIES_PER_FRAME {
            self.flush_entries()?;
        }
        Ok(())
    }

    /// Addresses written so far.
    pub fn claims(&self) -> u64 {
        self.claims
    }

    fn flush_entries(&mut self) -> io::Result<()> {
        // The names an entry frame uses come before it.
        if !self.new_names.is_empty() {
            let names = std::mem::take(&mut self.new_names);
            self.frame(&names)?;
        }
        if !self.entries.is_empty() {
            let entries = std::mem::take(&mut self.entries);
            self.frame(&entries)?;
            self.entries = entries;
            self.entries.clear();
        }
        self.in_frame = 0;
        Ok(())
    }

    fn frame(&mut self, payload: &[u8]) -> io::Result<()> {
        let mut buf = Vec::with_capacity(payload.len() + frame::FRAME_OVERHEAD);
        let at = frame::begin_frame(&mut buf);
        buf.extend_from_slice(payload);
        frame::finish_frame(&mut buf, at);
        self.bytes += buf.len() as u64;
        self.out.write_all(&buf)
    }

    /// Writes the latest claims and the end, syncs, and renames the snapshot into place.
    /// Returns its size in bytes.
    pub fn finish(mut self, recent: &[Claim]) -> io::Result<u64> {
        self.flush_entries()?;
        let mut r = vec![b'R'];
        for c in recent {
            r.extend_from_slice(&c.ip.to_le_bytes());
            r.extend_from_slice(&(c.created.min(u32::MAX as u64) as u32).to_le_bytes());
            frame::put_name(&mut r, &c.nick);
        }
        self.frame(&r)?;
        let mut z = vec![b'Z'];
        z.extend_from_slice(&self.claims.to_le_bytes());
        self.frame(&z)?;
        self.out.flush()?;
        self.out.get_ref().sync_all()?;
        std::fs::rename(&self.tmp, &self.path)?;
        if let Some(dir) = self.path.parent() {
            super::sync_dir(dir)?;
        }
        Ok(self.bytes)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Unfinished (an error midway): leave nothing half-written behind.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

#[derive(Debug)]
pub enum ReadError {
    Io(io::Error),
    Damaged(Damage),
}

/// What a snapshot held besides its entries.
pub struct Contents {
    pub claims: u64,
    pub recent: Vec<Claim>,
}

/// Streams every entry of the snapshot at `path` to `entry(ip, name, time)`.
pub fn read(path: &Path, mut entry: impl FnMut(u32, &str, u32)) -> Result<Contents, ReadError> {
    let file = File::open(path).map_err(ReadError::Io)?;
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut header = [0u8; frame::HEADER_LEN];
    input
        .read_exact(&mut header)
        .map_err(|_| ReadError::Damaged(Damage::WrongMagic))?;
    frame::check_header(&header, Kind::Snapshot).map_err(ReadError::Damaged)?;
    let mut offset = frame::HEADER_LEN as u64;
    let mut names: Vec<Box<str>> = Vec::new();
    let mut claims = 0u64;
    let mut recent = Vec::new();
    let mut buf = Vec::new();
    loop {
        let damaged = |why| ReadError::Damaged(Damage::Corrupt { offset, why });
        buf.clear();
        let mut head = [0u8; frame::FRAME_OVERHEAD];
        match input.read_exact(&mut head) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(ReadError::Damaged(Damage::Truncated { offset }));
            }
            Err(e) => return Err(ReadError::Io(e)),
        }
        buf.extend_from_slice(&head);
        let len = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")) as usize;
        if len > frame::MAX_FRAME {
            return Err(damaged("impossible length"));
        }
        buf.resize(frame::FRAME_OVERHEAD + len, 0);
        match input.read_exact(&mut buf[frame::FRAME_OVERHEAD..]) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(ReadError::Damaged(Damage::Truncated { offset }));
            }
            Err(e) => return Err(ReadError::Io(e)),
        }
        let payload = frame::single_frame(&buf).map_err(damaged)?;
        let mut r = Reader::new(&payload[1..]);
        match payload.first() {
            Some(b'N') => {
                while !r.is_empty() {
                    names.push(r.name().ok_or_else(|| damaged("a bad name"))?.into());
                }
            }
            Some(b'E') => {
                while !r.is_empty() {
                    let (Some(ip), Some(id), Some(created)) = (r.u32(), r.u32(), r.u32()) else {
                        return Err(damaged("a cut entry"));
                    };
                    let nick = names
                        .get(id as usize)
                        .ok_or_else(|| damaged("an unknown name"))?;
                    entry(ip, nick, created);
                    claims += 1;
                }
            }
            Some(b'R') => {
                while !r.is_empty() {
                    let (Some(ip), Some(created), Some(nick)) = (r.u32(), r.u32(), r.name()) else {
                        return Err(damaged("a cut recent claim"));
                    };
                    recent.push(Claim {
                        ip,
                        nick: nick.to_string(),
                        created: created as u64,
                    });
                }
            }
            Some(b'Z') => {
                if r.u64() != Some(claims) {
                    return Err(damaged("a count that does not match its entries"));
                }
                return Ok(Contents { claims, recent });
            }
            _ => return Err(damaged("an unknown frame kind")),
        }
        offset += buf.len() as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_round_trip_and_refuse_any_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot-0000000002.snap");
        let mut w = Writer::create(&path).unwrap();
        for i in 0..20_000u32 {
            w.add(i * 7, ["ann", "ben", "cat"][i as usize % 3], i)
                .unwrap();
        }
        let recent = vec![Claim {
            ip: 7,
            nick: "ben".into(),
            created: 1,
        }];
        w.finish(&recent).unwrap();
        assert!(!dir.path().join("snapshot-0000000002.snap.tmp").exists());
        let mut seen = Vec::new();
        let r = read(&path, |ip, n, c| seen.push((ip, n.to_string(), c))).unwrap();
        assert_eq!(r.claims, 20_000);
        assert_eq!(r.recent, recent);
        assert_eq!(seen[3], (21, "ann".to_string(), 3));
        // Any flipped byte or a cut end is refused.
        let bytes = std::fs::read(&path).unwrap();
        for at in [20, bytes.len() / 2, bytes.len() - 3] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            std::fs::write(&path, &bad).unwrap();
            assert!(
                matches!(read(&path, |_, _, _| {}), Err(ReadError::Damaged(_))),
                "flip at {at}"
            );
        }
        std::fs::write(&path, &bytes[..bytes.len() - 5]).unwrap();
        assert!(matches!(
            read(&path, |_, _, _| {}),
            Err(ReadError::Damaged(Damage::Truncated { .. }))
        ));
    }
}
