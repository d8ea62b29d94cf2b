//! A fixed-bucket histogram of durations, for `/metrics` (Prometheus buckets; `/statusz`
//! shows the count and sum): the `--sync full` write path's tail, split into the device's
//! part (each `fdatasync`) and tern's own part (a claim's wait less the syncs in it).

use std::sync::atomic::{AtomicU64, Ordering};

use tern_services::metrics::Metric;

/// Upper bounds of the buckets, in nanoseconds and as the `le` texts (seconds). Fine below
/// 5 ms, where the targets are (tern's part ≤ 2 ms), coarse above.
const BOUNDS_NS: [u64; 22] = [
    50_000,
    100_000,
    150_000,
    200_000,
    300_000,
    400_000,
    500_000,
    750_000,
    1_000_000,
    1_500_000,
    2_000_000,
    3_000_000,
    4_000_000,
    5_000_000,
    7_500_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
];
const BOUNDS: [&str; 22] = [
    "0.00005", "0.0001", "0.00015", "0.0002", "0.0003", "0.0004", "0.0005", "0.00075", "0.001",
    "0.0015", "0.002", "0.003", "0.004", "0.005", "0.0075", "0.01", "0.025", "0.05", "0.1", "0.25",
    "0.5", "1",
];

pub struct Histogram {
    /// One more than the bounds: the last counts what is above them all.
    counts: [AtomicU64; BOUNDS_NS.len() + 1],
    sum_nanos: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Counts `n` samples of `nanos` each.
    pub fn record(&self, nanos: u64, n: u64) {
        let bucket = BOUNDS_NS.partition_point(|&b| b < nanos);
        self.counts[bucket].fetch_add(n, Ordering::Relaxed);
        self.sum_nanos
            .fetch_add(nanos.saturating_mul(n), Ordering::Relaxed);
    }

    pub fn metrics(&self, name: &'static str, help: &'static str) -> Vec<Metric> {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        Metric::histogram(name, help, &[], &BOUNDS, &counts, sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_land_in_the_bucket_of_their_upper_bound() {
        let h = Histogram::default();
        h.record(50_000, 1); // exactly a bound: that bucket (le is "less or equal")
        h.record(50_001, 2);
        h.record(2_000_000_000, 1); // above every bound
        let m = h.metrics("x", "y");
        let bucket = |le: &str| {
            m.iter()
                .find(|m| m.suffix == "_bucket" && m.labels.iter().any(|(_, v)| v == le))
                .map(|m| m.value)
        };
        assert_eq!(bucket("0.00005"), Some(1.0));
        assert_eq!(bucket("0.0001"), Some(3.0)); // cumulative
        assert_eq!(bucket("1"), Some(3.0));
        assert_eq!(bucket("+Inf"), Some(4.0));
        let count = m.iter().find(|m| m.suffix == "_count").unwrap().value;
        assert_eq!(count, 4.0);
        let sum = m.iter().find(|m| m.suffix == "_sum").unwrap().value;
        assert!((sum - (50_000.0 + 100_002.0 + 2e9) / 1e9).abs() < 1e-9);
        assert_eq!(BOUNDS.len(), BOUNDS_NS.len());
        for (s, ns) in BOUNDS.iter().zip(BOUNDS_NS) {
            assert_eq!((s.parse::<f64>().unwrap() * 1e9).round() as u64, ns);
        }
    }
}
