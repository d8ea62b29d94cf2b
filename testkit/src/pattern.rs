//! The bytes of large test files: a pseudo-random pattern with a prime period, so that any
//! window of a file (a range, a chunk, a resumed transfer) can be checked against its offset,
//! and no power-of-two shift (page, buffer or sendfile step) of the data lines up with itself.

use std::io::Write;
use std::path::Path;

/// Period of the pattern: a prime.
const PERIOD: usize = 65_521;

/// Two periods of pseudo-random bytes, so that any window of up to one period is one slice.
fn table() -> &'static [u8] {
    static TABLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut t: Vec<u8> = (0..PERIOD)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        t.extend_from_within(..);
        t
    })
}

/// The pattern byte at file offset `i`.
pub fn pattern_byte(i: u64) -> u8 {
    table()[(i % PERIOD as u64) as usize]
}

/// The pattern bytes at file offsets `start..start + len`.
pub fn pattern(start: u64, len: usize) -> Vec<u8> {
    let t = table();
    let mut out = Vec::with_capacity(len);
    let mut at = (start % PERIOD as u64) as usize;
    while out.len() < len {
        let n = (len - out.len()).min(PERIOD);
        out.extend_from_slice(&t[at..at + n]);
        at = (at + n) % PERIOD;
    }
    out
}

/// Writes `len` patterned bytes to `path` (in 1 MiB steps).
pub fn write_pattern_file(path: &Path, len: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut at = 0;
    while at < len {
        let n = (len - at).min(1 << 20);
        f.write_all(&pattern(at, n as usize)).unwrap();
        at += n;
    }
    f.flush().unwrap();
}

/// Compares `got` with the pattern starting at `start`, naming the first differing offset.
pub fn check_pattern(got: &[u8], start: u64) {
    let want = pattern(start, got.len());
    if got != want.as_slice() {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap();
        panic!(
            "byte {} (file offset {}) is {:#04x}, expected {:#04x}",
            at,
            start + at as u64,
            got[at],
            want[at]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_window_is_the_bytes_at_its_offsets() {
        let whole = pattern(0, 3 * PERIOD + 17);
        for start in [
            0,
            1,
            PERIOD as u64 - 1,
            PERIOD as u64 + 5,
            2 * PERIOD as u64,
        ] {
            let window = pattern(start, PERIOD + 3);
            assert_eq!(window, &whole[start as usize..start as usize + PERIOD + 3]);
            assert_eq!(window[0], pattern_byte(start));
        }
        check_pattern(&whole[1000..2000], 1000);
        let bad = std::panic::catch_unwind(|| check_pattern(&whole[1000..2000], 1001));
        assert!(bad.is_err(), "a window checked at the wrong offset passes");
    }
}
