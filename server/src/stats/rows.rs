//! Rows of figures, kept per worker: the answers' rows (a site's or a route's: classes and a
//! duration histogram) and the upstream groups' rows, their bounds, the chunks they are
//! allocated in as names first need them, which rows have been given to which names, and the
//! [`Tally`] an answer is counted under.

use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

use super::counters::N_UPSTREAM;
use crate::handler::AnswerRow;

/// How many sites get figures of their own (answers by class, a duration histogram): the
/// first rows of answer figures ([`AnswerRow`]), one per site. Row 0 is for answers no site
/// took (a server without sites, bad input, a misdirected host); sites past the last row
/// share it ([`OTHER`]), which bounds the label's values.
pub const MAX_SITES: usize = 64;

/// How many rows of answer figures there are in all: the sites' ([`MAX_SITES`]), then the
/// routes'. Routes past the bound share the last row, reported as site and route [`OTHER`].
/// A worker holds memory only for the rows in use, a chunk of [`ANSWER_CHUNK`] at a time.
pub const MAX_ANSWER_ROWS: usize = 512;

/// Answer rows are allocated this many at a time (about 11.5 KiB a worker).
pub const ANSWER_CHUNK: usize = MAX_SITES;

/// How many upstream groups get counters of their own ([`UpstreamRow`]); row 0 is for
/// exchanges of no named group, the last is shared by the groups past the bound ([`OTHER`]).
pub const MAX_UPSTREAMS: usize = 256;

/// Upstream rows are allocated this many at a time (about 3.3 KiB a worker).
pub const UPSTREAM_CHUNK: usize = 32;

/// The name a shared last row reports: sites past [`MAX_SITES`], routes past
/// [`MAX_ANSWER_ROWS`], upstream groups past [`MAX_UPSTREAMS`].
pub const OTHER: &str = "_other";

/// The upper bounds of the request-duration histogram's buckets: microseconds, and the same
/// in seconds as Prometheus's `le` label shows it. One more bucket counts the rest (`+Inf`).
pub const DURATION_BOUNDS: [(u64, &str); 16] = [
    (100, "0.0001"),
    (250, "0.00025"),
    (500, "0.0005"),
    (1_000, "0.001"),
    (2_500, "0.0025"),
    (5_000, "0.005"),
    (10_000, "0.01"),
    (25_000, "0.025"),
    (50_000, "0.05"),
    (100_000, "0.1"),
    (250_000, "0.25"),
    (500_000, "0.5"),
    (1_000_000, "1"),
    (2_500_000, "2.5"),
    (5_000_000, "5"),
    (10_000_000, "10"),
];

/// Buckets of the duration histogram: one per bound, and `+Inf`.
pub const DURATION_BUCKETS: usize = DURATION_BOUNDS.len() + 1;

/// Answers are counted by class: 1xx to 5xx.
pub const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// What an answer is counted under: its row (site or route), and when its request was
/// complete (the worker clock's microseconds), for the duration histogram. One word (the row
/// in the top 16 bits, 48 bits of microseconds: 8.9 years of uptime), since every
/// connection's state carries one and an idle connection must stay small.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally(u64);

const START_BITS: u32 = 48;
pub(super) const START_MASK: u64 = (1 << START_BITS) - 1;

// The row must fit the 16 bits above the start.
const _: () = assert!(MAX_ANSWER_ROWS <= 1 << (64 - START_BITS));

impl Tally {
    pub fn starting(start_us: u64) -> Tally {
        Tally::new(AnswerRow::NONE, start_us)
    }

    pub fn new(row: AnswerRow, start_us: u64) -> Tally {
        Tally(u64::from(row.0) << START_BITS | (start_us & START_MASK))
    }

    pub fn row(self) -> AnswerRow {
        AnswerRow((self.0 >> START_BITS) as u16)
    }

    pub fn start_us(self) -> u64 {
        self.0 & START_MASK
    }

    pub fn set_row(&mut self, row: AnswerRow) {
        *self = Tally::new(row, self.start_us());
    }
}

/// One row's answer figures (a site's or a route's) in one worker's block.
#[derive(Default)]
pub(super) struct AnswerCells {
    pub classes: [AtomicU64; STATUS_CLASSES.len()],
    pub buckets: [AtomicU64; DURATION_BUCKETS],
    pub sum_us: AtomicU64,
}

/// One upstream group's counters in one worker's block.
#[derive(Default)]
pub(super) struct UpstreamCells(pub [AtomicU64; N_UPSTREAM]);

/// A chunk of rows, alone on its cache lines (each worker's are its own allocation).
#[repr(align(128))]
pub(super) struct Chunk<T, const N: usize>([T; N]);

fn new_chunk<T: Default, const N: usize>() -> Box<Chunk<T, N>> {
    Box::new(Chunk(std::array::from_fn(|_| T::default())))
}

/// One kind of rows in one worker's block: `N` rows always there, `MORE` chunks of `N`
/// allocated when a name first needs a row in them ([`Rows::reserve`], at start-up or a
/// reload, never on the request path), so a worker holds memory for the rows in use.
pub(super) struct Rows<T, const N: usize, const MORE: usize> {
    first: Box<Chunk<T, N>>,
    more: [OnceLock<Box<Chunk<T, N>>>; MORE],
}

impl<T: Default, const N: usize, const MORE: usize> Rows<T, N, MORE> {
    const CAPACITY: usize = N * (1 + MORE);

    pub fn new() -> Self {
        Rows {
            first: new_chunk(),
            more: std::array::from_fn(|_| OnceLock::new()),
        }
    }

    /// Row `i`, if its chunk is there.
    #[inline]
    pub fn get(&self, i: usize) -> Option<&T> {
        match i.checked_sub(N) {
            None => self.first.0.get(i),
            Some(past) => Some(&self.more.get(past / N)?.get()?.0[past % N]),
        }
    }

    /// Row `i` for counting into: row 0 if its chunk is not there, which cannot happen to a
    /// row a name was given (its chunk is reserved first, in every block).
    #[inline]
    pub fn counted(&self, i: usize) -> &T {
        self.get(i).unwrap_or(&self.first.0[0])
    }

    /// Makes sure row `i`'s chunk is there.
    pub fn reserve(&self, i: usize) {
        if let Some(chunk) = i.checked_sub(N).and_then(|past| self.more.get(past / N)) {
            chunk.get_or_init(new_chunk);
        }
    }

    /// The bytes this block's rows take now.
    pub fn bytes(&self) -> usize {
        let chunks = 1 + self.more.iter().filter(|c| c.get().is_some()).count();
        chunks * std::mem::size_of::<Chunk<T, N>>()
    }
}

pub(super) type AnswerRows =
    Rows<AnswerCells, ANSWER_CHUNK, { MAX_ANSWER_ROWS / ANSWER_CHUNK - 1 }>;
pub(super) type UpstreamRows =
    Rows<UpstreamCells, UPSTREAM_CHUNK, { MAX_UPSTREAMS / UPSTREAM_CHUNK - 1 }>;

const _: () = assert!(AnswerRows::CAPACITY == MAX_ANSWER_ROWS);
const _: () = assert!(UpstreamRows::CAPACITY == MAX_UPSTREAMS);

/// The bucket of a duration: the first whose bound it does not exceed. Most answers are
/// quick, so a scan from the smallest bound ends after a few compares.
#[inline]
pub(super) fn duration_bucket(us: u64) -> usize {
    DURATION_BOUNDS
        .iter()
        .position(|&(bound, _)| us <= bound)
        .unwrap_or(DURATION_BOUNDS.len())
}

/// Which rows have been given to which names. Only start-up, reloads and the pages take
/// its lock.
#[derive(Clone)]
pub(super) struct Names {
    /// The sites' names by row (row 0, no site, is ""), in the order they were first named.
    pub sites: Vec<String>,
    /// The routes' rows from [`MAX_SITES`] on: the row of their site, and their label.
    pub routes: Vec<(AnswerRow, String)>,
    /// The upstream groups' names by row (row 0, no named group, is "").
    pub upstreams: Vec<String>,
}

/// A marker in a route row's site: the shared last route row, whose site is [`OTHER`].
pub(super) const OTHER_ROW: u16 = u16::MAX;

/// The row of `name` in `rows` (bounded by `max`): the one it had, else the next free one,
/// else the shared last one, named [`OTHER`].
pub(super) fn name_row(rows: &mut Vec<String>, name: &str, max: usize) -> usize {
    match rows.iter().position(|n| n == name) {
        Some(i) => i,
        _ if rows.len() < max - 1 => {
            rows.push(name.to_owned());
            rows.len() - 1
        }
        _ => {
            if rows.len() < max {
                rows.push(OTHER.to_owned());
            }
            max - 1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_keeps_its_row_and_start() {
        let last = AnswerRow((MAX_ANSWER_ROWS - 1) as u16);
        let mut t = Tally::new(last, START_MASK);
        assert_eq!((t.row(), t.start_us()), (last, START_MASK));
        t.set_row(AnswerRow(5));
        assert_eq!((t.row(), t.start_us()), (AnswerRow(5), START_MASK));
        assert_eq!(Tally::starting(42).row(), AnswerRow::NONE);
        assert_eq!(std::mem::size_of::<Tally>(), 8);
    }

    #[test]
    fn bounds_rise_and_their_labels_say_the_same_in_seconds() {
        for pair in DURATION_BOUNDS.windows(2) {
            assert!(pair[0].0 < pair[1].0);
        }
        for (us, le) in DURATION_BOUNDS {
            assert_eq!(le.parse::<f64>().unwrap(), us as f64 / 1e6, "{le}");
        }
        assert_eq!(duration_bucket(0), 0);
        assert_eq!(duration_bucket(101), 1);
        assert_eq!(duration_bucket(10_000_000), DURATION_BOUNDS.len() - 1);
        assert_eq!(duration_bucket(10_000_001), DURATION_BOUNDS.len());
    }
}
