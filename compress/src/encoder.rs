//! A streaming encoder per coding, fed in pieces and flushed whenever its producer has
//! nothing more for now, so a slow app's partial answer reaches the client decodable.
//!
//! Parameters are chosen for a server compressing many answers at once: memory per
//! in-flight answer (measured by `tests::memory_is_bounded`, see the README's figures) and
//! CPU per byte stay small, at some cost in ratio against the maxima. The state is made
//! when an answer starts being compressed and freed when it ends.

use std::io::Write;

use crate::budget::Charge;
use crate::Encoding;

/// flate2 level: nginx's `gzip_comp_level` is 1 by default, Caddy's 5. The backend is
/// zlib-rs (the workspace's flate2 feature), not miniz_oxide: at level 5 it took 11 % less CPU
/// per proxied 16 KiB answer in `bench/proxy proxy-gzip` (95 against 106 µs; nginx's zlib
/// 85 µs), for about 60 KiB more state per answer.
pub const GZIP_LEVEL: u32 = 5;
/// Brotli quality 4 keeps it near gzip's speed (5 and up switch to slower match finders;
/// the Rust encoder's q5 hasher also takes far more memory).
pub const BROTLI_QUALITY: u32 = 4;
/// Brotli window: 2^18 = 256 KiB (the default 22 would allow 4 MiB per answer).
pub const BROTLI_LGWIN: u32 = 18;
/// zstd's level 3 is its default.
pub const ZSTD_LEVEL: i32 = 3;
/// zstd window: 2^18 = 256 KiB (level 3 would take up to 2 MiB).
pub const ZSTD_WINDOW_LOG: u32 = 18;

/// The level of each coding, as a site or route sets them (`compress_level`); checked
/// against [`Levels::RANGES`] by [`Levels::set`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Levels {
    pub gzip: u32,
    pub br: u32,
    pub zstd: u32,
}

impl Default for Levels {
    fn default() -> Levels {
        Levels {
            gzip: GZIP_LEVEL,
            br: BROTLI_QUALITY,
            zstd: ZSTD_LEVEL as u32,
        }
    }
}

impl Levels {
    /// The levels a config may choose: gzip's whole range (its state does not grow with the
    /// level: about 410 KiB), brotli up to quality 6 and zstd up to level 6 (3.6 MiB per
    /// answer at most). One step above, the match finders take 9.8 MiB (brotli 7) and
    /// 6.2 MiB (zstd 7) per answer in flight, and CPU per byte climbs past what compressing
    /// on the fly should cost; precompress such files instead (static files keep their
    /// `.br`/`.zst` variants). Measured by `tests::memory_is_bounded_at_every_level`.
    pub const RANGES: [(Encoding, u32, u32); 3] = [
        (Encoding::Gzip, 1, 9),
        (Encoding::Br, 0, 6),
        (Encoding::Zstd, 1, 6),
    ];

    pub fn get(&self, encoding: Encoding) -> u32 {
        match encoding {
            Encoding::Gzip => self.gzip,
            Encoding::Br => self.br,
            Encoding::Zstd => self.zstd,
        }
    }

    /// Sets one coding's level, refusing one outside its range with the range.
    pub fn set(&mut self, encoding: Encoding, level: u32) -> Result<(), String> {
        let (_, low, high) = Levels::RANGES
            .into_iter()
            .find(|(e, _, _)| *e == encoding)
            .expect("every coding has a range");
        if !(low..=high).contains(&level) {
            return Err(format!(
                "{} level {level} is outside {low}..={high}",
                encoding.name()
            ));
        }
        match encoding {
            Encoding::Gzip => self.gzip = level,
            Encoding::Br => self.br = level,
            Encoding::Zstd => self.zstd = level,
        }
        Ok(())
    }
}

/// The output sink every encoder writes into; drained by the caller after each call.
type Sink = Vec<u8>;

enum Inner {
    Gzip(flate2::write::GzEncoder<Sink>),
    Br(Box<brotli::CompressorWriter<Sink>>),
    Zstd(zstd::stream::write::Encoder<'static, Sink>),
}

/// One answer's encoder. Each call returns the bytes ready for the client (possibly none);
/// they stay valid until the next call.
pub struct Encoder {
    /// The streaming state: made on first use (see `fresh`), dropped by `finish`.
    inner: Option<Inner>,
    /// Not used yet: `inner` is still to be made.
    fresh: bool,
    levels: Levels,
    /// The output of the last `finish` (the sink taken out of a consumed encoder).
    last: Sink,
    encoding: Encoding,
    /// Bytes were written since the last flush (a flush without them would only add
    /// empty blocks).
    dirty: bool,
    bytes_in: u64,
    bytes_out: u64,
    /// What the state was charged to its producer's budget: given back when it is freed.
    charge: Option<Charge>,
}

/// The encoder failed (out of memory in zstd, say): the answer cannot be completed.
#[derive(Debug)]
pub struct EncodeError;

impl Encoder {
    /// An encoder at the default levels.
    pub fn new(encoding: Encoding) -> Result<Encoder, EncodeError> {
        Encoder::with_levels(encoding, &Levels::default())
    }

    /// An encoder at `levels`. Its state is made on first use, so an answer compressed at
    /// once ([`Encoder::finish_with`]) never makes the streaming one.
    pub fn with_levels(encoding: Encoding, levels: &Levels) -> Result<Encoder, EncodeError> {
        Ok(Encoder {
            inner: None,
            fresh: true,
            levels: *levels,
            last: Sink::new(),
            encoding,
            dirty: false,
            bytes_in: 0,
            bytes_out: 0,
            charge: None,
        })
    }

    /// The most memory the streaming state of `encoding` at `levels` takes, measured with the
    /// relay's 64 KiB pieces and a flush after each (`tests::memory_is_bounded_at_every_level`
    /// holds every allowed level to it, within a quarter). What a producer charges its budget
    /// for one answer in flight.
    pub fn state_bytes(encoding: Encoding, levels: &Levels) -> usize {
        const KIB: usize = 1024;
        match encoding {
            // zlib-rs's window, hash chains and pending buffer do not grow with the level.
            Encoding::Gzip => 420 * KIB,
            Encoding::Br => match levels.br {
                0 => 300 * KIB,
                1 => 760 * KIB,
                2..=3 => 1_180 * KIB,
                4 => 2_100 * KIB,
                5 => 2_700 * KIB,
                _ => 3_700 * KIB,
            },
            Encoding::Zstd => match levels.zstd {
                0..=1 => 1_180 * KIB,
                2 => 1_380 * KIB,
                3 => 1_900 * KIB,
                4 => 3_200 * KIB,
                _ => 3_700 * KIB,
            },
        }
    }

    /// This encoder's state is charged `charge` (given back when the state is freed: at the
    /// end of the answer, or when the encoder is dropped).
    pub fn charged(mut self, charge: Charge) -> Encoder {
        self.charge = Some(charge);
        self
    }

    /// The bytes this encoder is charged now.
    pub fn charged_bytes(&self) -> usize {
        self.charge.as_ref().map_or(0, Charge::bytes)
    }

    /// The streaming state, made now if this is its first use; an error once finished.
    fn state(&mut self) -> Result<&mut Inner, EncodeError> {
        if std::mem::take(&mut self.fresh) {
            self.inner = Some(new_inner(self.encoding, &self.levels)?);
        }
        self.inner.as_mut().ok_or(EncodeError)
    }

    pub fn encoding(&self) -> Encoding {
        self.encoding
    }

    /// Body bytes taken so far.
    pub fn bytes_in(&self) -> u64 {
        self.bytes_in
    }

    /// Coded bytes given out so far.
    pub fn bytes_out(&self) -> u64 {
        self.bytes_out
    }

    /// Compresses `data`; returns what is ready (the coder may hold bytes back until a
    /// flush or the end). The work is proportional to `data`: callers feed bounded pieces.
    pub fn write(&mut self, data: &[u8]) -> Result<&[u8], EncodeError> {
        self.bytes_in += data.len() as u64;
        self.dirty |= !data.is_empty();
        let inner = self.state()?;
        sink(inner).clear();
        let done = match inner {
            Inner::Gzip(w) => w.write_all(data),
            Inner::Br(w) => w.write_all(data),
            Inner::Zstd(w) => w.write_all(data),
        };
        done.map_err(|_| EncodeError)?;
        Ok(self.drained())
    }

    /// Everything taken so far, made decodable by the client now (a sync flush: the stream
    /// goes on after it). Nothing when nothing was written since the last one.
    pub fn flush(&mut self) -> Result<&[u8], EncodeError> {
        if !std::mem::take(&mut self.dirty) {
            if !self.fresh && self.inner.is_none() {
                return Err(EncodeError); // finished
            }
            if let Some(inner) = self.inner.as_mut() {
                sink(inner).clear();
            }
            return Ok(&[]);
        }
        let inner = self.state()?;
        sink(inner).clear();
        let done = match inner {
            Inner::Gzip(w) => w.flush(),
            Inner::Br(w) => w.flush(),
            Inner::Zstd(w) => w.flush(),
        };
        done.map_err(|_| EncodeError)?;
        Ok(self.drained())
    }

    /// Ends the stream: the last bytes (trailer, end of frame). The state is freed here.
    pub fn finish(&mut self) -> Result<&[u8], EncodeError> {
        self.state()?;
        let inner = self.inner.take().ok_or(EncodeError)?;
        self.charge = None;
        let mut out = match inner {
            Inner::Gzip(mut w) => {
                let taken = std::mem::take(w.get_mut());
                let mut rest = w.finish().map_err(|_| EncodeError)?;
                // Bytes a previous call left in the sink were already given out.
                drop(taken);
                std::mem::take(&mut rest)
            }
            Inner::Br(mut w) => {
                w.get_mut().clear();
                w.into_inner()
            }
            Inner::Zstd(mut w) => {
                w.get_mut().clear();
                w.finish().map_err(|_| EncodeError)?
            }
        };
        self.bytes_out += out.len() as u64;
        std::mem::swap(&mut self.last, &mut out);
        Ok(&self.last)
    }

    /// `data` is the rest of the body and the end: compresses it and ends the stream in one
    /// call. A gzip answer that comes whole (nothing written before) is compressed by
    /// libdeflate in one pass: at the same level it takes about 40 % less CPU than the
    /// streaming deflate (16 KiB of HTML: 41 against 66 µs at level 5) for no larger output,
    /// and makes no streaming state at all; anything else streams as usual.
    pub fn finish_with(&mut self, data: &[u8]) -> Result<&[u8], EncodeError> {
        if !(self.fresh && self.encoding == Encoding::Gzip) {
            let mut out = self.write(data)?.to_vec();
            out.extend_from_slice(self.finish()?);
            self.last = out;
            return Ok(&self.last);
        }
        self.fresh = false;
        self.charge = None;
        self.bytes_in += data.len() as u64;
        self.last = whole::gzip(data, self.levels.gzip)?;
        self.bytes_out += self.last.len() as u64;
        Ok(&self.last)
    }

    fn drained(&mut self) -> &[u8] {
        let Some(inner) = self.inner.as_mut() else {
            return &[];
        };
        let out = sink(inner);
        self.bytes_out += out.len() as u64;
        out
    }
}

fn new_inner(encoding: Encoding, levels: &Levels) -> Result<Inner, EncodeError> {
    let sink = Sink::new();
    Ok(match encoding {
        Encoding::Gzip => Inner::Gzip(flate2::write::GzEncoder::new(
            sink,
            flate2::Compression::new(levels.gzip),
        )),
        Encoding::Br => {
            let params = brotli::enc::BrotliEncoderParams {
                quality: levels.br as i32,
                lgwin: BROTLI_LGWIN as i32,
                ..Default::default()
            };
            Inner::Br(Box::new(brotli::CompressorWriter::with_params(
                sink, 4096, &params,
            )))
        }
        Encoding::Zstd => {
            let mut z = zstd::stream::write::Encoder::new(sink, levels.zstd as i32)
                .map_err(|_| EncodeError)?;
            z.window_log(ZSTD_WINDOW_LOG).map_err(|_| EncodeError)?;
            z.include_checksum(false).map_err(|_| EncodeError)?;
            Inner::Zstd(z)
        }
    })
}

/// One-pass compression of a whole body.
mod whole {
    use std::cell::RefCell;

    use super::EncodeError;

    thread_local! {
        // A libdeflate compressor allocates its match finder's tables once; keep one per
        // thread and level (a worker uses the few levels its config names).
        static DEFLATE: RefCell<Vec<(u32, libdeflater::Compressor)>> = const { RefCell::new(Vec::new()) };
    }

    pub fn gzip(data: &[u8], level: u32) -> Result<Vec<u8>, EncodeError> {
        DEFLATE.with(|cell| {
            let mut compressors = cell.borrow_mut();
            let i = match compressors.iter().position(|(l, _)| *l == level) {
                Some(i) => i,
                None => {
                    let lvl =
                        libdeflater::CompressionLvl::new(level as i32).map_err(|_| EncodeError)?;
                    compressors.push((level, libdeflater::Compressor::new(lvl)));
                    compressors.len() - 1
                }
            };
            let c = &mut compressors[i].1;
            let mut out = vec![0u8; c.gzip_compress_bound(data.len())];
            let n = c.gzip_compress(data, &mut out).map_err(|_| EncodeError)?;
            out.truncate(n);
            Ok(out)
        })
    }
}

fn sink(inner: &mut Inner) -> &mut Sink {
    match inner {
        Inner::Gzip(w) => w.get_mut(),
        Inner::Br(w) => w.get_mut(),
        Inner::Zstd(w) => w.get_mut(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn decode(encoding: Encoding, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        match encoding {
            Encoding::Gzip => {
                flate2::read::GzDecoder::new(data)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Encoding::Br => {
                brotli::Decompressor::new(data, 4096)
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Encoding::Zstd => {
                out = zstd::stream::decode_all(data).unwrap();
            }
        }
        out
    }

    /// What a decoder makes of a stream that has not ended yet: every byte it can decode.
    fn decode_partial(encoding: Encoding, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        match encoding {
            Encoding::Gzip => {
                let mut d = flate2::read::GzDecoder::new(data);
                while let Ok(n @ 1..) = d.read(&mut buf) {
                    out.extend_from_slice(&buf[..n]);
                }
            }
            Encoding::Br => {
                let mut d = brotli::Decompressor::new(data, 4096);
                while let Ok(n @ 1..) = d.read(&mut buf) {
                    out.extend_from_slice(&buf[..n]);
                }
            }
            Encoding::Zstd => {
                let mut d = zstd::stream::read::Decoder::new(data).unwrap();
                while let Ok(n @ 1..) = d.read(&mut buf) {
                    out.extend_from_slice(&buf[..n]);
                }
            }
        }
        out
    }

    fn text(len: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(len);
        let mut i = 0u64;
        while v.len() < len {
            v.extend_from_slice(
                format!("{{\"id\":{i},\"name\":\"item {}\"}},\n", i * 7 % 13).as_bytes(),
            );
            i += 1;
        }
        v.truncate(len);
        v
    }

    #[test]
    fn streaming_round_trip_in_pieces() {
        let body = text(300_000);
        for e in Encoding::ALL {
            let mut enc = Encoder::new(e).unwrap();
            let mut wire = Vec::new();
            for piece in body.chunks(7_001) {
                wire.extend_from_slice(enc.write(piece).unwrap());
            }
            wire.extend_from_slice(enc.finish().unwrap());
            assert_eq!(decode(e, &wire), body, "{e:?}");
            assert_eq!(enc.bytes_in(), body.len() as u64);
            assert_eq!(enc.bytes_out(), wire.len() as u64);
            assert!(wire.len() * 4 < body.len(), "{e:?}: {} bytes", wire.len());
            // Done: no more calls.
            assert!(enc.write(b"x").is_err());
        }
    }

    #[test]
    fn a_flush_makes_everything_so_far_decodable() {
        let first = text(5_000);
        let second = b"and the rest, later".to_vec();
        for e in Encoding::ALL {
            let mut enc = Encoder::new(e).unwrap();
            let mut wire = enc.write(&first).unwrap().to_vec();
            wire.extend_from_slice(enc.flush().unwrap());
            // The client decodes the first half before the second exists.
            assert_eq!(decode_partial(e, &wire), first, "{e:?}");
            wire.extend_from_slice(enc.write(&second).unwrap());
            wire.extend_from_slice(enc.flush().unwrap());
            wire.extend_from_slice(enc.finish().unwrap());
            let mut whole = first.clone();
            whole.extend_from_slice(&second);
            assert_eq!(decode(e, &wire), whole, "{e:?}");
        }
    }

    #[test]
    fn empty_and_tiny_bodies() {
        for e in Encoding::ALL {
            let mut enc = Encoder::new(e).unwrap();
            let wire = enc.finish().unwrap().to_vec();
            assert_eq!(decode(e, &wire), b"", "{e:?}");
            let mut enc = Encoder::new(e).unwrap();
            let mut wire = enc.write(b"a").unwrap().to_vec();
            wire.extend_from_slice(enc.flush().unwrap());
            assert!(
                enc.flush().unwrap().is_empty(),
                "{e:?}: a flush with nothing new"
            );
            wire.extend_from_slice(enc.finish().unwrap());
            assert_eq!(decode(e, &wire), b"a", "{e:?}");
        }
    }

    /// Allocations on this thread: live bytes and the peak since the last reset.
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        pub struct Counting;

        thread_local! {
            static LIVE: Cell<isize> = const { Cell::new(0) };
            static PEAK: Cell<isize> = const { Cell::new(0) };
        }

        fn note(delta: isize) {
            let _ = LIVE.try_with(|l| {
                let now = l.get() + delta;
                l.set(now);
                let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
            });
        }

        pub fn reset() -> isize {
            let live = LIVE.with(Cell::get);
            PEAK.with(|p| p.set(live));
            live
        }

        pub fn peak() -> isize {
            PEAK.with(Cell::get)
        }

        pub fn live() -> isize {
            LIVE.with(Cell::get)
        }

        // SAFETY: forwards to the system allocator unchanged; only counts sizes.
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                note(layout.size() as isize);
                // SAFETY: the caller's layout contract is passed on as is.
                unsafe { System.alloc(layout) }
            }
            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                note(-(layout.size() as isize));
                // SAFETY: `ptr` came from `System` through this allocator, with this layout.
                unsafe { System.dealloc(ptr, layout) }
            }
            unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
                note(new as isize - layout.size() as isize);
                // SAFETY: as for `dealloc`, and the caller's contract for `new` is passed on.
                unsafe { System.realloc(ptr, layout, new) }
            }
        }
    }

    #[global_allocator]
    static ALLOC: counting::Counting = counting::Counting;

    /// Peak memory of one answer's encoder, fed 64 KiB pieces (the relay's read size) of a
    /// 1 MiB body and flushed after each: the figures the README states. Everything is
    /// given back at the end.
    #[test]
    fn memory_is_bounded() {
        let body = text(1 << 20);
        for (e, limit) in [
            (Encoding::Gzip, 450 << 10),
            (Encoding::Br, 2300 << 10),
            (Encoding::Zstd, 2000 << 10),
        ] {
            let before = counting::reset();
            let mut enc = Encoder::new(e).unwrap();
            for piece in body.chunks(64 << 10) {
                enc.write(piece).unwrap();
                enc.flush().unwrap();
            }
            enc.finish().unwrap();
            drop(enc);
            let (peak, live) = (counting::peak() - before, counting::live());
            assert_eq!(live, before, "{e:?} kept memory");
            eprintln!("{e:?}: peak {} KiB", peak >> 10);
            assert!(peak < limit, "{e:?}: peak {peak} bytes");
        }
    }

    /// The most memory any allowed level takes, so [`Levels::RANGES`] is what bounds a
    /// config's answers (the README's figures).
    #[test]
    fn memory_is_bounded_at_every_level() {
        let body = text(1 << 20);
        for (e, low, high) in Levels::RANGES {
            for level in low..=high {
                let mut levels = Levels::default();
                levels.set(e, level).unwrap();
                let before = counting::reset();
                let mut enc = Encoder::with_levels(e, &levels).unwrap();
                for piece in body.chunks(64 << 10) {
                    enc.write(piece).unwrap();
                    enc.flush().unwrap();
                }
                let out = enc.finish().unwrap().len();
                drop(enc);
                let peak = (counting::peak() - before) as usize;
                let charged = Encoder::state_bytes(e, &levels);
                eprintln!(
                    "{e:?} {level}: peak {} KiB, charged {} KiB, last piece {out}",
                    peak >> 10,
                    charged >> 10
                );
                assert!(peak < 3800 << 10, "{e:?} {level}: peak {peak} bytes");
                // What a budget is charged covers the state, and not by much more.
                assert!(peak <= charged, "{e:?} {level}: {peak} > {charged}");
                assert!(
                    charged <= peak + peak / 4,
                    "{e:?} {level}: {charged} ≫ {peak}"
                );
            }
        }
    }

    /// A body compressed at once: gzip's in one pass (libdeflate), the others streamed;
    /// each decodes to the body, and the counts are right.
    #[test]
    fn a_whole_body_is_compressed_in_one_call() {
        let body = text(64 << 10);
        for e in Encoding::ALL {
            let mut enc = Encoder::new(e).unwrap();
            let out = enc.finish_with(&body).unwrap().to_vec();
            assert_eq!(decode(e, &out), body, "{e:?}");
            assert_eq!(enc.bytes_in(), body.len() as u64);
            assert_eq!(enc.bytes_out(), out.len() as u64);
            assert!(enc.write(b"more").is_err(), "{e:?}: ended");
        }
        // After a piece was streamed, the rest still ends the same stream.
        let mut enc = Encoder::new(Encoding::Gzip).unwrap();
        let mut out = enc.write(&body[..1000]).unwrap().to_vec();
        out.extend_from_slice(enc.finish_with(&body[1000..]).unwrap());
        assert_eq!(decode(Encoding::Gzip, &out), body);
        // The level reaches the one-pass compressor too.
        let size = |level| {
            let levels = Levels {
                gzip: level,
                ..Levels::default()
            };
            let mut enc = Encoder::with_levels(Encoding::Gzip, &levels).unwrap();
            enc.finish_with(&body).unwrap().len()
        };
        assert!(size(9) < size(1));
        // An empty body is a valid empty stream.
        let mut enc = Encoder::new(Encoding::Gzip).unwrap();
        assert_eq!(decode(Encoding::Gzip, enc.finish_with(b"").unwrap()), b"");
    }

    #[test]
    fn levels_outside_their_range_are_refused() {
        let mut l = Levels::default();
        assert!(l.set(Encoding::Gzip, 0).is_err());
        assert!(l.set(Encoding::Gzip, 10).is_err());
        assert!(l.set(Encoding::Br, 7).is_err());
        assert!(l.set(Encoding::Zstd, 0).is_err());
        assert_eq!(
            l.set(Encoding::Zstd, 7).unwrap_err(),
            "zstd level 7 is outside 1..=6"
        );
        l.set(Encoding::Br, 0).unwrap();
        assert_eq!(
            l,
            Levels {
                br: 0,
                ..Levels::default()
            }
        );
    }

    /// A higher level gives a smaller answer on text (the level reaches the encoder).
    #[test]
    fn the_level_reaches_the_encoder() {
        let body = text(256 << 10);
        for e in Encoding::ALL {
            let (_, low, high) = Levels::RANGES.into_iter().find(|r| r.0 == e).unwrap();
            let size = |level| {
                let mut levels = Levels::default();
                levels.set(e, level).unwrap();
                let mut enc = Encoder::with_levels(e, &levels).unwrap();
                let mut n = enc.write(&body).unwrap().len();
                n += enc.finish().unwrap().len();
                n
            };
            assert!(size(high) < size(low), "{e:?}");
        }
    }
}
