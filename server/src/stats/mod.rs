//! The server's counters: every worker counts into a block of its own, with no lock or
//! shared write on the request path, and the pages sum the blocks when asked.
//!
//! - `counters.rs`: the catalogue ([`Counter`], [`UpstreamCounter`]), one table each.
//! - `rows.rs`: the rows counted per site, route and upstream group, their bounds and names.
//! - `block.rs`: one worker's block ([`WorkerStats`]).
//! - `snapshot.rs`: all blocks summed ([`StatsSnapshot`]).
//! - here: [`Stats`], the blocks of every worker and the names given to rows.

mod block;
mod counters;
mod rows;
mod snapshot;

use std::sync::{Arc, Mutex};

pub use self::block::WorkerStats;
#[cfg(test)]
pub(crate) use self::block::WORKER_ENCODER_BUDGET;
pub use self::counters::{Counter, UpstreamCounter};
pub(crate) use self::rows::Tally;
pub use self::rows::{
    ANSWER_CHUNK, DURATION_BOUNDS, DURATION_BUCKETS, MAX_ANSWER_ROWS, MAX_SITES, MAX_UPSTREAMS,
    OTHER, STATUS_CLASSES, UPSTREAM_CHUNK,
};
pub use self::snapshot::{AnswerFigures, StatsSnapshot, UpstreamFigures};
pub use crate::handler::AnswerRow;
pub use crate::upstream::UpstreamRow;

use self::rows::{name_row, Names, OTHER_ROW};

/// All workers' counters; cheap to clone, summed on demand for /statusz and /metrics.
#[derive(Clone)]
pub struct Stats {
    workers: Arc<[WorkerStats]>,
    names: Arc<Mutex<Names>>,
}

impl Stats {
    pub fn new(workers: usize) -> Stats {
        Stats {
            // One block more than workers: `aux`, for a thread that is not a worker.
            workers: (0..workers.max(1) + 1)
                .map(|_| WorkerStats::new())
                .collect(),
            names: Arc::new(Mutex::new(Names {
                sites: vec![String::new()],
                routes: Vec::new(),
                upstreams: vec![String::new()],
            })),
        }
    }

    /// The block for threads that are not workers (the nftables ban feeder); they count
    /// with `bump_shared`, since there may be several.
    pub fn aux(&self) -> &WorkerStats {
        &self.workers[self.workers.len() - 1]
    }

    pub fn worker(&self, id: usize) -> &WorkerStats {
        &self.workers[id]
    }

    /// The workers' blocks: every block but `aux`, which counts neither answers nor
    /// upstream exchanges.
    fn worker_blocks(&self) -> &[WorkerStats] {
        &self.workers[..self.workers.len() - 1]
    }

    fn names(&self) -> std::sync::MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The row of the site called `name`: the one it had if it was named before (a reload
    /// keeps a site's figures), else the next free one; once all are taken, the shared last
    /// one, reported as [`OTHER`]. Not for the request path (it takes a lock).
    pub fn site(&self, name: &str) -> AnswerRow {
        let mut names = self.names();
        AnswerRow(name_row(&mut names.sites, name, MAX_SITES) as u16)
    }

    /// The row of the route labelled `label` on the site of row `site` (a route's `name`, or
    /// its path as written): the one it had if it was named before, else the next free one,
    /// its chunk reserved in every worker's block; once all are taken, the shared last one,
    /// reported as site and route [`OTHER`]. Routes of one site with one label share a row.
    /// Not for the request path (it takes a lock, and may allocate a chunk).
    pub fn route(&self, site: AnswerRow, label: &str) -> AnswerRow {
        let mut names = self.names();
        let site = AnswerRow(site.index().min(MAX_SITES - 1) as u16);
        let routes = &mut names.routes;
        let last = MAX_ANSWER_ROWS - MAX_SITES - 1;
        let index = match routes.iter().position(|(s, l)| *s == site && l == label) {
            Some(i) => i,
            None if routes.len() < last => {
                routes.push((site, label.to_owned()));
                routes.len() - 1
            }
            None => {
                if routes.len() == last {
                    routes.push((AnswerRow(OTHER_ROW), OTHER.to_owned()));
                }
                last
            }
        };
        let row = MAX_SITES + index;
        for w in self.worker_blocks() {
            w.answers.reserve(row);
        }
        AnswerRow(row as u16)
    }

    /// The row of the upstream group called `name` (`"SITE ROUTE"` in `tern run`, as its
    /// health figures are labelled): as [`Stats::site`], with its chunk reserved in every
    /// worker's block. Not for the request path.
    pub fn upstream(&self, name: &str) -> UpstreamRow {
        let mut names = self.names();
        let row = name_row(&mut names.upstreams, name, MAX_UPSTREAMS);
        for w in self.worker_blocks() {
            w.upstreams.reserve(row);
        }
        UpstreamRow(row as u16)
    }

    /// The bytes one worker's block takes now (every worker holds the same chunks).
    pub fn worker_bytes(&self) -> usize {
        self.worker(0).bytes()
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        // The names are copied so the lock is not held while the blocks are summed.
        let names = self.names().clone();
        StatsSnapshot::sum(&self.workers, names)
    }
}

#[cfg(test)]
mod tests {
    use super::rows::{AnswerCells, Chunk, UpstreamCells};
    use super::*;
    use tern_codec::RequestError;

    #[test]
    fn snapshot_sums_workers() {
        let stats = Stats::new(3);
        stats.worker(0).bump(Counter::Requests);
        stats.worker(2).bump(Counter::Requests);
        stats.worker(1).answered(404, Tally::starting(0), 10);
        stats.worker(1).bad_request(RequestError::BareLf);
        stats.aux().bump_shared(Counter::Requests);
        let s = stats.snapshot();
        assert_eq!(s.get(Counter::Requests), 3);
        assert_eq!(s.responses(4), 1);
        assert_eq!(s.responses(2), 0);
        assert_eq!(s.bad(RequestError::BareLf), 1);
    }

    #[test]
    fn answers_are_counted_per_site_with_their_duration() {
        let stats = Stats::new(2);
        let a = stats.site("a");
        let b = stats.site("b");
        assert_eq!(stats.site("a"), a, "a site named again keeps its row");
        let at = Tally::new;
        stats.worker(0).answered(200, at(a, 1_000), 1_050); // 50 µs: the first bucket
        stats.worker(1).answered(200, at(a, 1_000), 1_100); // on the bound: still the first
        stats.worker(1).answered(503, at(a, 0), 20_000_000); // past every bound
        stats.worker(0).answered(301, at(b, 0), 3_000); // 3 ms: (2.5 ms, 5 ms]
        stats.worker(0).answered(400, Tally::starting(0), 0);
        let s = stats.snapshot();
        let names: Vec<(&str, &str)> = s
            .answers
            .iter()
            .map(|f| (f.site.as_str(), f.route.as_str()))
            .collect();
        assert_eq!(names, [("", ""), ("a", ""), ("b", "")]);
        let (none, a, b) = (&s.answers[0], &s.answers[1], &s.answers[2]);
        assert_eq!(a.responses, [0, 2, 0, 0, 1]);
        assert_eq!(a.buckets[0], 2);
        assert_eq!(a.buckets[DURATION_BUCKETS - 1], 1);
        assert_eq!(a.buckets.iter().sum::<u64>(), 3);
        assert_eq!(a.sum_us, 50 + 100 + 20_000_000);
        assert_eq!(b.responses, [0, 0, 1, 0, 0]);
        assert_eq!(b.buckets[5], 1);
        assert_eq!(none.responses, [0, 0, 0, 1, 0]);
        assert_eq!(s.responses(2), 2);
    }

    #[test]
    fn routes_get_rows_of_their_own_that_know_their_site() {
        let stats = Stats::new(2);
        let blog = stats.site("blog");
        let shop = stats.site("shop");
        let posts = stats.route(blog, "/posts");
        let api = stats.route(shop, "api");
        let shop_root = stats.route(shop, "/");
        let blog_root = stats.route(blog, "/");
        assert_eq!(
            posts,
            AnswerRow(MAX_SITES as u16),
            "route rows follow the sites'"
        );
        assert_eq!(
            stats.route(shop, "api"),
            api,
            "a route named again keeps its row"
        );
        assert_ne!(shop_root, blog_root, "one label on two sites: two rows");
        let at = Tally::new;
        stats.worker(0).answered(200, at(posts, 0), 40);
        stats.worker(1).answered(200, at(posts, 0), 300); // (250 µs, 500 µs]
        stats.worker(1).answered(502, at(api, 0), 7_000);
        stats.worker(0).answered(404, at(shop, 0), 10);
        let s = stats.snapshot();
        let rows: Vec<(&str, &str)> = s
            .answers
            .iter()
            .map(|f| (f.site.as_str(), f.route.as_str()))
            .collect();
        assert_eq!(
            rows,
            [
                ("", ""),
                ("blog", ""),
                ("shop", ""),
                ("blog", "/posts"),
                ("shop", "api"),
                ("shop", "/"),
                ("blog", "/"),
            ]
        );
        assert_eq!(s.answers[3].responses, [0, 2, 0, 0, 0]);
        assert_eq!(s.answers[3].buckets[0], 1);
        assert_eq!(s.answers[3].buckets[2], 1);
        assert_eq!(s.answers[3].sum_us, 340);
        assert_eq!(s.answers[4].responses, [0, 0, 0, 0, 1]);
        assert_eq!(s.answers[4].buckets[6], 1);
        assert_eq!(s.answers[2].responses, [0, 0, 0, 1, 0]);
        assert_eq!(s.answers[5].responses, [0; 5]);
        assert_eq!(s.responses(2), 2);
    }

    #[test]
    fn route_rows_are_bounded_and_the_rest_share_one() {
        let stats = Stats::new(2);
        let site = stats.site("big");
        let rows: Vec<AnswerRow> = (0..MAX_ANSWER_ROWS)
            .map(|i| stats.route(site, &format!("/r{i}")))
            .collect();
        let own = MAX_ANSWER_ROWS - MAX_SITES - 1;
        let other = AnswerRow((MAX_ANSWER_ROWS - 1) as u16);
        assert_eq!(rows[own - 1], AnswerRow((MAX_ANSWER_ROWS - 2) as u16));
        assert!(
            rows[own..].iter().all(|&r| r == other),
            "past the bound: one row"
        );
        assert_eq!(stats.route(site, "/r0"), rows[0], "rows given stay");
        stats.worker(1).answered(200, Tally::new(other, 0), 0);
        stats
            .worker(0)
            .answered(200, Tally::new(rows[own - 1], 0), 0);
        let s = stats.snapshot();
        assert_eq!(
            s.answers.len(),
            2 + MAX_ANSWER_ROWS - MAX_SITES,
            "no site, big, routes"
        );
        let last = s.answers.last().unwrap();
        assert_eq!((last.site.as_str(), last.route.as_str()), (OTHER, OTHER));
        assert_eq!(last.responses[1], 1);
        let before = &s.answers[s.answers.len() - 2];
        assert_eq!(before.route, format!("/r{}", own - 1));
        assert_eq!(before.responses[1], 1);
        // Every chunk is there now, and only then.
        let chunk = std::mem::size_of::<Chunk<AnswerCells, ANSWER_CHUNK>>();
        assert_eq!(
            stats.worker(0).answers.bytes(),
            MAX_ANSWER_ROWS / ANSWER_CHUNK * chunk
        );
    }

    #[test]
    fn chunks_are_allocated_for_the_rows_in_use_only() {
        let stats = Stats::new(2);
        let answers = std::mem::size_of::<Chunk<AnswerCells, ANSWER_CHUNK>>();
        let upstreams = std::mem::size_of::<Chunk<UpstreamCells, UPSTREAM_CHUNK>>();
        let base = std::mem::size_of::<WorkerStats>() + answers + upstreams;
        assert_eq!(
            stats.worker_bytes(),
            base,
            "the sites' rows and row 0 of upstreams"
        );
        let site = stats.site("a");
        stats.route(site, "/");
        assert_eq!(stats.worker_bytes(), base + answers);
        for i in 0..ANSWER_CHUNK {
            stats.route(site, &format!("/{i}"));
        }
        assert_eq!(
            stats.worker_bytes(),
            base + 2 * answers,
            "a second chunk of routes"
        );
        for i in 0..UPSTREAM_CHUNK {
            stats.upstream(&format!("a /{i}"));
        }
        assert_eq!(stats.worker_bytes(), base + 2 * answers + upstreams);
        assert_eq!(
            stats.worker(1).bytes(),
            stats.worker_bytes(),
            "every worker alike"
        );
        assert_eq!(
            stats.aux().bytes(),
            base,
            "the aux block counts neither answers nor upstreams"
        );
        // The figures of the rows reported in the report's words.
        assert!(answers <= 64 * 192, "{answers}");
        assert!(upstreams <= 32 * 112, "{upstreams}");
    }

    #[test]
    fn upstream_counters_are_kept_per_group() {
        let stats = Stats::new(2);
        let api = stats.upstream("shop /api");
        let wiki = stats.upstream("wiki /");
        assert_eq!(stats.upstream("shop /api"), api);
        stats
            .worker(0)
            .bump_upstream(api, UpstreamCounter::Connects);
        stats
            .worker(1)
            .bump_upstream(api, UpstreamCounter::Connects);
        stats
            .worker(1)
            .bump_upstream(api, UpstreamCounter::RetriesStatus);
        stats
            .worker(0)
            .bump_upstream(wiki, UpstreamCounter::tls_failure("unknown_ca"));
        stats
            .worker(0)
            .bump_upstream(UpstreamRow::NONE, UpstreamCounter::Reuses);
        let s = stats.snapshot();
        let names: Vec<&str> = s.upstreams.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["", "shop /api", "wiki /"]);
        assert_eq!(s.upstream("shop /api", UpstreamCounter::Connects), 2);
        assert_eq!(s.upstream("shop /api", UpstreamCounter::RetriesStatus), 1);
        assert_eq!(s.upstream("wiki /", UpstreamCounter::TlsFailUnknownCa), 1);
        assert_eq!(s.upstream("wiki /", UpstreamCounter::Connects), 0);
        assert_eq!(s.upstream("", UpstreamCounter::Reuses), 1);
        assert_eq!(s.upstream_total(UpstreamCounter::Connects), 2);
        assert_eq!(s.upstream_total(UpstreamCounter::Reuses), 1);
    }

    #[test]
    fn upstream_rows_are_bounded_and_the_rest_share_one() {
        let stats = Stats::new(1);
        let rows: Vec<UpstreamRow> = (0..MAX_UPSTREAMS + 5)
            .map(|i| stats.upstream(&format!("s /{i}")))
            .collect();
        let other = UpstreamRow((MAX_UPSTREAMS - 1) as u16);
        assert_eq!(rows[0], UpstreamRow(1));
        assert!(rows[MAX_UPSTREAMS - 2..].iter().all(|&r| r == other));
        stats
            .worker(0)
            .bump_upstream(rows[MAX_UPSTREAMS], UpstreamCounter::Timeouts);
        let s = stats.snapshot();
        assert_eq!(s.upstreams.len(), MAX_UPSTREAMS);
        assert_eq!(s.upstream(OTHER, UpstreamCounter::Timeouts), 1);
    }

    #[test]
    fn odd_statuses_fall_into_the_nearest_class() {
        let stats = Stats::new(1);
        stats.worker(0).answered(99, Tally::starting(0), 0);
        stats.worker(0).answered(600, Tally::starting(0), 0);
        let s = stats.snapshot();
        assert_eq!(s.answers[0].responses, [1, 0, 0, 0, 1]);
    }

    #[test]
    fn site_rows_are_bounded_and_the_rest_share_one() {
        let stats = Stats::new(1);
        let rows: Vec<AnswerRow> = (0..MAX_SITES + 10)
            .map(|i| stats.site(&format!("site{i}")))
            .collect();
        let other = AnswerRow((MAX_SITES - 1) as u16);
        assert_eq!(rows[MAX_SITES - 3], AnswerRow((MAX_SITES - 2) as u16));
        assert!(rows[MAX_SITES - 2..].iter().all(|&s| s == other));
        stats.worker(0).answered(200, Tally::new(other, 0), 0);
        // A route of a site past the bound is the shared site's.
        let route = stats.route(rows[MAX_SITES + 5], "/");
        let s = stats.snapshot();
        assert_eq!(s.answers.len(), MAX_SITES + 1);
        assert_eq!(s.answers[MAX_SITES - 1].site, OTHER);
        assert_eq!(s.answers[MAX_SITES - 1].responses[1], 1);
        assert_eq!(s.answers[MAX_SITES].route, "/");
        assert_eq!(s.answers[MAX_SITES].site, OTHER);
        assert_eq!(route, AnswerRow(MAX_SITES as u16));
    }

    /// Counts the allocations of the thread that asks for it, so that the request path's
    /// share of the counting can be shown to allocate nothing.
    mod counting {
        use std::alloc::{GlobalAlloc, Layout, System};
        use std::cell::Cell;

        pub struct Counting;

        thread_local! {
            pub static ALLOCATIONS: Cell<Option<u64>> = const { Cell::new(None) };
        }

        // SAFETY: every call is forwarded unchanged to the system allocator; counting is a
        // side effect on a const-initialised thread-local (no allocation, no destructor).
        unsafe impl GlobalAlloc for Counting {
            unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
                let _ = ALLOCATIONS.try_with(|c| c.set(c.get().map(|n| n + 1)));
                // SAFETY: the caller's layout contract is passed on as is.
                unsafe { System.alloc(layout) }
            }

            unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
                // SAFETY: `ptr` came from `System.alloc` above with this layout.
                unsafe { System.dealloc(ptr, layout) }
            }
        }

        #[global_allocator]
        static GLOBAL: Counting = Counting;
    }

    #[test]
    fn counting_an_answer_allocates_nothing() {
        let stats = Stats::new(2);
        let site = stats.site("blog");
        let route = stats.route(site, "/");
        let group = stats.upstream("blog /");
        let worker = stats.worker(1);
        counting::ALLOCATIONS.with(|c| c.set(Some(0)));
        drop(std::hint::black_box(Box::new(7u64)));
        let control = counting::ALLOCATIONS.with(|c| c.replace(Some(0)));
        assert_eq!(
            control,
            Some(1),
            "the allocator counts this thread's allocations"
        );
        for i in 0..10_000u64 {
            let status = [200, 304, 404, 503][i as usize % 4];
            worker.answered(status, Tally::new(route, i), i * 3);
            worker.bump_upstream(group, UpstreamCounter::Reuses);
        }
        let allocations = counting::ALLOCATIONS.with(|c| c.replace(None));
        assert_eq!(allocations, Some(0));
        assert_eq!(
            stats
                .snapshot()
                .answers_of("blog", "/")
                .unwrap()
                .buckets
                .iter()
                .sum::<u64>(),
            10_000
        );
    }
}
