//! The figures of all workers summed at one moment ([`StatsSnapshot`]), for `/statusz` and
//! `/metrics`.

use std::sync::atomic::Ordering;

use tern_codec::RequestError;

use super::block::WorkerStats;
use super::counters::{Counter, UpstreamCounter, N_BAD, N_COUNTERS, N_UPSTREAM};
use super::rows::{Names, DURATION_BUCKETS, MAX_SITES, OTHER, OTHER_ROW, STATUS_CLASSES};

/// One row's figures summed over the workers: a site's own (`route` empty: answers of the
/// site no route took) or a route's.
#[derive(Debug, Clone)]
pub struct AnswerFigures {
    /// "" for answers no site took.
    pub site: String,
    /// "" for a site's own row.
    pub route: String,
    /// Answers by class ([`STATUS_CLASSES`]).
    pub responses: [u64; STATUS_CLASSES.len()],
    /// Answers by duration: bucket i holds those above bound i - 1 up to bound i
    /// ([`DURATION_BOUNDS`]), the last those above every bound. Not cumulative.
    pub buckets: [u64; DURATION_BUCKETS],
    /// The durations' sum in microseconds.
    pub sum_us: u64,
}

/// One upstream group's counters summed over the workers.
#[derive(Debug, Clone)]
pub struct UpstreamFigures {
    /// "" for exchanges of no named group.
    pub name: String,
    pub counts: [u64; N_UPSTREAM],
}

impl UpstreamFigures {
    pub fn get(&self, c: UpstreamCounter) -> u64 {
        self.counts[c as usize]
    }
}

/// A point-in-time sum over all workers.
#[derive(Debug, Clone)]
pub struct StatsSnapshot {
    pub counters: [u64; N_COUNTERS],
    pub bad_requests: [u64; N_BAD],
    /// Row 0 (no site) first, then every site named so far, then every route, in row order.
    pub answers: Vec<AnswerFigures>,
    /// Row 0 (no named group) first, then every upstream group named so far.
    pub upstreams: Vec<UpstreamFigures>,
    /// Streaming-encoder state charged now, over all workers, and what they may charge.
    pub encoder_bytes: u64,
    pub encoder_budget: u64,
}

impl StatsSnapshot {
    pub fn get(&self, c: Counter) -> u64 {
        self.counters[c as usize]
    }

    pub fn bad(&self, e: RequestError) -> u64 {
        self.bad_requests[e.index()]
    }

    pub fn open_connections(&self) -> u64 {
        self.get(Counter::ConnectionsAccepted)
            .saturating_sub(self.get(Counter::ConnectionsClosed))
    }

    /// Answers of status class `class` (1 to 5) over every row.
    pub fn responses(&self, class: usize) -> u64 {
        self.answers.iter().map(|s| s.responses[class - 1]).sum()
    }

    /// The figures of the route labelled `route` on `site` ("": the site's own row).
    pub fn answers_of(&self, site: &str, route: &str) -> Option<&AnswerFigures> {
        self.answers
            .iter()
            .find(|f| f.site == site && f.route == route)
    }

    /// `c` over every upstream group.
    pub fn upstream_total(&self, c: UpstreamCounter) -> u64 {
        self.upstreams.iter().map(|u| u.get(c)).sum()
    }

    /// `c` of the upstream group called `name` (0 if there is none).
    pub fn upstream(&self, name: &str, c: UpstreamCounter) -> u64 {
        self.upstreams
            .iter()
            .find(|u| u.name == name)
            .map_or(0, |u| u.get(c))
    }
}

impl StatsSnapshot {
    /// Sums `blocks` (every worker's, then the block of threads that are not workers, which
    /// counts neither answers nor upstream exchanges) under the rows' `names`.
    pub(super) fn sum(blocks: &[WorkerStats], names: Names) -> StatsSnapshot {
        let workers = &blocks[..blocks.len() - 1];
        let Names {
            sites,
            routes,
            upstreams,
        } = names;
        let figures = |row: usize, site: &str, route: &str| {
            AnswerFigures {
                site: site.to_owned(),
                route: route.to_owned(),
                responses: [0; STATUS_CLASSES.len()],
                buckets: [0; DURATION_BUCKETS],
                sum_us: 0,
            }
            .summed(row, workers)
        };
        let mut answers: Vec<AnswerFigures> = sites
            .iter()
            .enumerate()
            .map(|(row, site)| figures(row, site, ""))
            .collect();
        answers.extend(routes.iter().enumerate().map(|(i, (site, route))| {
            let site = if site.0 == OTHER_ROW {
                OTHER
            } else {
                sites.get(site.index()).map_or("", String::as_str)
            };
            figures(MAX_SITES + i, site, route)
        }));
        let upstreams = upstreams
            .into_iter()
            .enumerate()
            .map(|(row, name)| {
                let mut counts = [0; N_UPSTREAM];
                for w in workers {
                    if let Some(cells) = w.upstreams.get(row) {
                        for (sum, c) in counts.iter_mut().zip(&cells.0) {
                            *sum += c.load(Ordering::Relaxed);
                        }
                    }
                }
                UpstreamFigures { name, counts }
            })
            .collect();
        let mut s = StatsSnapshot {
            counters: [0; N_COUNTERS],
            bad_requests: [0; N_BAD],
            answers,
            upstreams,
            encoder_bytes: 0,
            encoder_budget: 0,
        };
        for w in workers {
            s.encoder_bytes += w.encoders.live() as u64;
            s.encoder_budget += w.encoders.limit() as u64;
        }
        for w in blocks {
            for (sum, c) in s.counters.iter_mut().zip(&w.counters) {
                *sum += c.load(Ordering::Relaxed);
            }
            for (sum, c) in s.bad_requests.iter_mut().zip(&w.bad_requests) {
                *sum += c.load(Ordering::Relaxed);
            }
        }
        s
    }
}

impl AnswerFigures {
    /// These figures plus row `row` of every block.
    fn summed(mut self, row: usize, blocks: &[WorkerStats]) -> AnswerFigures {
        for w in blocks {
            let Some(cells) = w.answers.get(row) else {
                continue;
            };
            for (sum, c) in self.responses.iter_mut().zip(&cells.classes) {
                *sum += c.load(Ordering::Relaxed);
            }
            for (sum, c) in self.buckets.iter_mut().zip(&cells.buckets) {
                *sum += c.load(Ordering::Relaxed);
            }
            self.sum_us += cells.sum_us.load(Ordering::Relaxed);
        }
        self
    }
}
