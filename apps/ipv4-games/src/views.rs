//! The read side: JSON renderings of the latest claims and of the scores per window, rebuilt
//! off the request path and published as snapshots.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde::Serialize;
use tern_services::background::Yielder;
use tern_services::Snapshot;

use crate::land::{Claim, Land};

#[derive(Serialize)]
struct RecentJson<'a> {
    generated: u64,
    claims: Vec<RecentItem<'a>>,
}

#[derive(Serialize)]
struct RecentItem<'a> {
    ip: String,
    name: &'a str,
    time: u64,
}

pub fn recent_json<'a>(claims: impl Iterator<Item = &'a Claim>, now: u64) -> Vec<u8> {
    let json = RecentJson {
        generated: now,
        claims: claims
            .map(|c| RecentItem {
                ip: Ipv4Addr::from(c.ip).to_string(),
                name: &c.nick,
                time: c.created,
            })
            .collect(),
    };
    serde_json::to_vec(&json).expect("plain data serialises")
}

/// The score windows, longest first; `secs == 0` means all time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    All,
    Month,
    Week,
    Day,
    Hour,
}

impl Window {
    pub const ALL: [Window; 5] = [
        Window::All,
        Window::Month,
        Window::Week,
        Window::Day,
        Window::Hour,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Window::All => "all",
            Window::Month => "month",
            Window::Week => "week",
            Window::Day => "day",
            Window::Hour => "hour",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Window::All => "/score",
            Window::Month => "/score/month",
            Window::Week => "/score/week",
            Window::Day => "/score/day",
            Window::Hour => "/score/hour",
        }
    }

    pub fn secs(self) -> u64 {
        match self {
            Window::All => 0,
            Window::Month => 30 * 86_400,
            Window::Week => 7 * 86_400,
            Window::Day => 86_400,
            Window::Hour => 3_600,
        }
    }

    /// Short windows change faster, so they are rebuilt more often.
    pub fn is_short(self) -> bool {
        matches!(self, Window::Day | Window::Hour)
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// Counts per (name, /8) for several windows, filled in one pass over the rows.
pub struct Tally {
    now: u64,
    windows: Vec<Window>,
    names: HashMap<String, u32>,
    name_list: Vec<String>,
    /// `counts[w][block]`: name id → claims.
    counts: Vec<Vec<HashMap<u32, u64>>>,
}

const TOP_PER_BLOCK: usize = 5;
const LEADERBOARD: usize = 50;

/// Everything of a score rendering except its window and time; compared between rebuilds so
/// an unchanged board keeps its ETag (and clients their 304s).
#[derive(Serialize)]
struct ScoreContent<'a> {
    total: u64,
    blocks: Vec<BlockJson<'a>>,
    leaderboard: Vec<LeaderJson<'a>>,
}

/// One window's rendering: the JSON, and a hash of everything in it but `generated`.
pub struct Rendered {
    pub window: Window,
    pub json: Vec<u8>,
    pub content_hash: u64,
}

#[derive(Serialize)]
struct BlockJson<'a> {
    block: u8,
    total: u64,
    leaders: Vec<NameCount<'a>>,
}

#[derive(Serialize)]
struct NameCount<'a> {
    name: &'a str,
    count: u64,
}

#[derive(Serialize)]
struct LeaderJson<'a> {
    name: &'a str,
    count: u64,
    blocks: u32,
}

impl Tally {
    pub fn new(now: u64, windows: &[Window]) -> Tally {
        Tally {
            now,
            windows: windows.to_vec(),
            names: HashMap::new(),
            name_list: Vec::new(),
            counts: windows
                .iter()
                .map(|_| (0..256).map(|_| HashMap::new()).collect())
                .collect(),
        }
    }

    /// Counts one address by name (tests: `fill` counts by id).
    #[cfg(test)]
    pub fn add(&mut self, ip: u32, nick: &str, created: u64) {
        let id = match self.names.get(nick) {
            Some(&id) => id,
            None => {
                let id = self.name_list.len() as u32;
                self.names.insert(nick.to_string(), id);
                self.name_list.push(nick.to_string());
                id
            }
        };
        let block = (ip >> 24) as usize;
        for (w, window) in self.windows.iter().enumerate() {
            let secs = window.secs();
            if secs == 0 || created + secs >= self.now {
                *self.counts[w][block].entry(id).or_default() += 1;
            }
        }
    }

    /// Counts every held address: one pass over the state, a /16 at a time. Names are
    /// counted by id (an array index per address and window, no hashing), each /8's counts
    /// moved into the tally when the scan leaves it, and the ids resolved to names once at
    /// the end.
    /// `yielder`: the scan gives the CPU back through it (see `Land::scan_ids`).
    pub fn fill(&mut self, land: &Land, yielder: &mut Yielder) {
        let windows = self.windows.len();
        let since: Vec<u64> = self
            .windows
            .iter()
            .map(|w| match w.secs() {
                0 => 0,
                secs => self.now.saturating_sub(secs),
            })
            .collect();
        // Global name id → this tally's id + 1 (0: not seen yet).
        let mut local_of: Vec<u32> = Vec::new();
        let mut globals: Vec<u32> = Vec::new();
        let mut dense: Vec<Vec<u64>> = vec![Vec::new(); windows];
        let mut touched: Vec<Vec<u32>> = vec![Vec::new(); windows];
        let mut block: Option<usize> = None;
        let counts = &mut self.counts;
        let mut flush = |block: usize, dense: &mut [Vec<u64>], touched: &mut [Vec<u32>]| {
            for w in 0..windows {
                for &id in &touched[w] {
                    let n = std::mem::take(&mut dense[w][id as usize]);
                    counts[w][block].insert(id, n);
                }
                touched[w].clear();
            }
        };
        land.scan_ids(yielder, |ip, global, created| {
            let b = (ip >> 24) as usize;
            if block != Some(b) {
                if let Some(prev) = block {
                    flush(prev, &mut dense, &mut touched);
                }
                block = Some(b);
            }
            let g = global as usize;
            if local_of.len() <= g {
                local_of.resize(g + 1, 0);
            }
            if local_of[g] == 0 {
                globals.push(global);
                local_of[g] = globals.len() as u32;
            }
            let id = local_of[g] - 1;
            for w in 0..windows {
                if created >= since[w] {
                    let c = &mut dense[w];
                    if c.len() <= id as usize {
                        c.resize(globals.len(), 0);
                    }
                    if c[id as usize] == 0 {
                        touched[w].push(id);
                    }
                    c[id as usize] += 1;
                }
            }
        });
        if let Some(prev) = block {
            flush(prev, &mut dense, &mut touched);
        }
        self.name_list = land.names_of(&globals);
        self.names = self
            .name_list
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i as u32))
            .collect();
    }

    /// The JSON for each window of the tally, in the order given to `new`.
    pub fn render(&self) -> Vec<Rendered> {
        self.windows
            .iter()
            .enumerate()
            .map(|(w, &window)| self.render_window(w, window))
            .collect()
    }

    fn render_window(&self, w: usize, window: Window) -> Rendered {
        let mut blocks = Vec::new();
        let mut totals: HashMap<u32, (u64, u32)> = HashMap::new();
        let mut total = 0;
        for (block, counts) in self.counts[w].iter().enumerate() {
            if counts.is_empty() {
                continue;
            }
            let mut v: Vec<(u32, u64)> = counts.iter().map(|(&id, &n)| (id, n)).collect();
            let order = |a: &(u32, u64), b: &(u32, u64)| {
                b.1.cmp(&a.1)
                    .then_with(|| self.name_list[a.0 as usize].cmp(&self.name_list[b.0 as usize]))
            };
            // Only the block's leaders are shown: select them, sort only them.
            if v.len() > TOP_PER_BLOCK {
                v.select_nth_unstable_by(TOP_PER_BLOCK - 1, order);
                v[..TOP_PER_BLOCK].sort_unstable_by(order);
            } else {
                v.sort_unstable_by(order);
            }
            let block_total: u64 = v.iter().map(|x| x.1).sum();
            total += block_total;
            for &(id, n) in &v {
                totals.entry(id).or_default().0 += n;
            }
            totals.entry(v[0].0).or_default().1 += 1;
            blocks.push(BlockJson {
                block: block as u8,
                total: block_total,
                leaders: v
                    .iter()
                    .take(TOP_PER_BLOCK)
                    .map(|&(id, count)| NameCount {
                        name: &self.name_list[id as usize],
                        count,
                    })
                    .collect(),
            });
        }
        let mut board: Vec<(u32, u64, u32)> =
            totals.into_iter().map(|(id, (n, b))| (id, n, b)).collect();
        board.sort_unstable_by(|a, b| {
            b.1.cmp(&a.1)
                .then_with(|| self.name_list[a.0 as usize].cmp(&self.name_list[b.0 as usize]))
        });
        board.truncate(LEADERBOARD);
        let content = ScoreContent {
            total,
            blocks,
            leaderboard: board
                .iter()
                .map(|&(id, count, blocks)| LeaderJson {
                    name: &self.name_list[id as usize],
                    count,
                    blocks,
                })
                .collect(),
        };
        let content = serde_json::to_vec(&content).expect("plain data serialises");
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        content.hash(&mut hasher);
        // `{"window":…,"generated":…,` + the content object without its opening brace.
        let mut json = format!(
            "{{\"window\":\"{}\",\"generated\":{},",
            window.name(),
            self.now
        )
        .into_bytes();
        json.extend_from_slice(&content[1..]);
        Rendered {
            window,
            json,
            content_hash: hasher.finish(),
        }
    }
}

/// When each kind of pass runs: at least `base` apart, and never busier than one fifth of a
/// core (the interval stretches to five times the last pass's duration as the table grows).
pub struct Schedule {
    pub base: Duration,
    pub next: Instant,
}

impl Schedule {
    pub fn new(base: Duration) -> Schedule {
        Schedule {
            base,
            next: Instant::now(),
        }
    }

    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    pub fn done(&mut self, started: Instant, took: Duration) {
        self.next = started + self.base.max(took * 5);
    }
}

/// The snapshot for a rendering of a window; max-age is half the rebuild interval.
pub fn score_snapshot(json: Vec<u8>, now: u64, interval: Duration) -> Snapshot {
    Snapshot::new(
        "application/json",
        json,
        now,
        (interval.as_secs() / 2).max(1) as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(a: u8, b: u8) -> u32 {
        u32::from_be_bytes([a, b, 0, 1])
    }

    #[test]
    fn tally_counts_blocks_windows_and_leaders() {
        let now = 100_000_000;
        let mut t = Tally::new(now, &Window::ALL);
        t.add(ip(1, 1), "alice", now - 10);
        t.add(ip(1, 2), "alice", now - 10);
        t.add(ip(1, 3), "bob", now - 5000);
        t.add(ip(2, 1), "bob", now - 90_000);
        t.add(ip(3, 1), "carol", now - 40 * 86_400);
        let out = t.render();
        let parse = |w: Window| -> serde_json::Value {
            serde_json::from_slice(&out.iter().find(|r| r.window == w).unwrap().json).unwrap()
        };
        let all = parse(Window::All);
        assert_eq!(all["window"], "all");
        assert_eq!(all["total"], 5);
        assert_eq!(all["blocks"][0]["block"], 1);
        assert_eq!(all["blocks"][0]["leaders"][0]["name"], "alice");
        assert_eq!(all["blocks"][0]["leaders"][0]["count"], 2);
        assert_eq!(all["blocks"][0]["leaders"][1]["name"], "bob");
        assert_eq!(all["leaderboard"][0]["name"], "alice");
        // bob: 2 claims, leads block 2; alice: 2 claims, leads block 1; carol leads block 3.
        assert_eq!(all["leaderboard"][0]["blocks"], 1);
        assert_eq!(all["leaderboard"].as_array().unwrap().len(), 3);
        let hour = parse(Window::Hour);
        assert_eq!(hour["total"], 2);
        let day = parse(Window::Day);
        assert_eq!(day["total"], 3);
        let month = parse(Window::Month);
        assert_eq!(month["total"], 4);
    }

    #[test]
    fn a_fill_counts_every_held_address() {
        let land = Land::new();
        let now = 100_000_000u64;
        for i in 0..10_000u32 {
            let created = if i % 2 == 0 {
                now - 10
            } else {
                now - 2 * 86_400
            };
            land.apply(i.wrapping_mul(0x9E37_79B1), &format!("n{}", i % 5), created);
        }
        let mut t = Tally::new(now, &Window::ALL);
        t.fill(&land, &mut Yielder::new(Duration::MAX));
        let total = |w: Window| -> u64 {
            let out = t.render();
            let r = out.iter().find(|r| r.window == w).unwrap();
            serde_json::from_slice::<serde_json::Value>(&r.json).unwrap()["total"]
                .as_u64()
                .unwrap()
        };
        assert_eq!(total(Window::All), 10_000);
        assert_eq!(total(Window::Week), 10_000);
        assert_eq!(total(Window::Hour), 5_000);
        // The same boards as counting every address by name, one by one.
        let mut by_name = Tally::new(now, &Window::ALL);
        land.sorted_scan(|ip, nick, created| by_name.add(ip, nick, created));
        let json = |t: &Tally| t.render().into_iter().map(|r| r.json).collect::<Vec<_>>();
        assert_eq!(json(&t), json(&by_name));
    }

    #[test]
    fn content_hash_ignores_only_the_time() {
        let render = |now: u64, extra: bool| {
            let mut t = Tally::new(now, &[Window::All]);
            t.add(ip(1, 1), "alice", 5);
            if extra {
                t.add(ip(1, 2), "bob", 5);
            }
            t.render().remove(0)
        };
        let a = render(100, false);
        let b = render(200, false);
        let c = render(200, true);
        assert_eq!(a.content_hash, b.content_hash);
        assert_ne!(a.json, b.json);
        assert_ne!(b.content_hash, c.content_hash);
        let v: serde_json::Value = serde_json::from_slice(&b.json).unwrap();
        assert_eq!(v["window"], "all");
        assert_eq!(v["generated"], 200);
        assert_eq!(v["total"], 1);
    }

    #[test]
    fn recent_shape() {
        let c = [Claim {
            ip: u32::from_be_bytes([9, 8, 7, 6]),
            nick: "zed".into(),
            created: 42,
        }];
        let v: serde_json::Value = serde_json::from_slice(&recent_json(c.iter(), 50)).unwrap();
        assert_eq!(v["generated"], 50);
        assert_eq!(v["claims"][0]["ip"], "9.8.7.6");
        assert_eq!(v["claims"][0]["name"], "zed");
        assert_eq!(v["claims"][0]["time"], 42);
    }

    #[test]
    fn schedule_stretches_with_slow_passes() {
        let mut s = Schedule::new(Duration::from_secs(2));
        let t = Instant::now();
        s.done(t, Duration::from_millis(100));
        assert_eq!(s.next, t + Duration::from_secs(2));
        s.done(t, Duration::from_secs(1));
        assert_eq!(s.next, t + Duration::from_secs(5));
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// How long a full pass takes over 3 M addresses and 1000 names (run by hand:
    /// `cargo test --release -p tern-ipv4-games --lib -- --ignored --nocapture speed`).
    #[test]
    #[ignore = "a measurement, not a check"]
    fn a_full_pass_over_three_million_addresses() {
        let land = Land::new();
        let now = 100_000_000u64;
        for i in 0..3_000_000u32 {
            land.load(
                i.wrapping_mul(0x9E37_79B1),
                &format!("n{}", i % 1000),
                now - (i as u64 % 3_000_000),
            );
        }
        let started = Instant::now();
        let mut t = Tally::new(now, &Window::ALL);
        t.fill(&land, &mut Yielder::new(Duration::MAX));
        let filled = started.elapsed();
        let rendered = t.render();
        let render_took = started.elapsed() - filled;
        let by_name_started = Instant::now();
        let mut by_name = Tally::new(now, &Window::ALL);
        land.sorted_scan(|ip, nick, created| by_name.add(ip, nick, created));
        println!("counting by name instead: {:?}", by_name_started.elapsed());
        println!(
            "fill {:?} ({:.1} ns per address), render {:?}, {} bytes of JSON",
            filled,
            filled.as_nanos() as f64 / 3e6,
            render_took,
            rendered.iter().map(|r| r.json.len()).sum::<usize>()
        );
    }
}
