//! Request times in µs, log-linear: exact under 128, then 64 buckets per power of two (so a
//! percentile is within about 1.6 %), the same buckets as bench/h3load's, so the two clients'
//! p50 and p99 read alike.

const EXACT: usize = 128;
const PER_OCTAVE: usize = 64;
const BUCKETS: usize = EXACT + PER_OCTAVE * 57;

pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
}

fn bucket_of(us: u64) -> usize {
    if us < EXACT as u64 {
        return us as usize;
    }
    let shift = (64 - us.leading_zeros()) as usize - 7;
    EXACT + (shift - 1) * PER_OCTAVE + (us >> shift) as usize - PER_OCTAVE
}

/// The middle of bucket `i`.
fn value_of(i: usize) -> u64 {
    if i < EXACT {
        return i as u64;
    }
    let k = i - EXACT;
    let shift = k / PER_OCTAVE + 1;
    ((((k % PER_OCTAVE) + PER_OCTAVE) as u64) << shift) + (1u64 << shift) / 2
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
        }
    }

    pub fn record(&mut self, us: u64) {
        self.counts[bucket_of(us)] += 1;
        self.total += 1;
    }

    /// The `p`th percentile (0 < p ≤ 100), 0 when nothing was recorded.
    pub fn percentile(&self, p: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((p * self.total as f64 / 100.0 + 0.5) as u64).max(1);
        let mut seen = 0;
        for (i, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return value_of(i);
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_are_exact_and_large_ones_within_two_percent() {
        for v in [0, 1, 127] {
            assert_eq!(value_of(bucket_of(v)), v);
        }
        for v in [128u64, 129, 1000, 4097, 123_456, 10_000_000, u64::MAX / 3] {
            let back = value_of(bucket_of(v)) as f64;
            assert!(
                (back - v as f64).abs() / (v as f64) < 0.016,
                "{v} read as {back}"
            );
        }
        assert!(bucket_of(u64::MAX) < BUCKETS);
    }

    #[test]
    fn percentiles_rank_the_recorded_values() {
        let mut h = Histogram::new();
        assert_eq!(h.percentile(99.0), 0);
        for v in 1..=100 {
            h.record(v);
        }
        assert_eq!(h.percentile(50.0), 50);
        assert_eq!(h.percentile(99.0), 99);
        assert_eq!(h.percentile(100.0), 100);
    }
}
