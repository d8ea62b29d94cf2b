//! `--ban-nft-set`: bans also go to an nftables set, so the kernel drops those peers before
//! tern sees a packet.
//!
//! Everything privileged happens here, before `Server::start`: the set is checked with one
//! `nft list set`, and one long-lived `nft -i` child is started (it applies each line it reads
//! from its stdin at once). After that tern may run privilege-dropped and sandboxed (no
//! execve, no new sockets): a thread writes one `add element` line per ban into the child's
//! pipe. Workers never wait for it: they offer bans to a bounded queue and count a failure
//! when it is full. nft's errors are counted (`ban_nft_failures`) and logged, rate-limited.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tern_server::{BanConfig, BanNotice, Bans, Counter, Server, Stats};

/// Bans waiting for nft; past this a worker counts a failure instead of waiting.
const NFT_QUEUE: usize = 1024;

/// One `--ban-nft-set`, checked against the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftSet {
    pub family: String,
    pub table: String,
    pub set: String,
    /// `type ipv6_addr` (else `ipv4_addr`).
    pub v6: bool,
}

/// Gives `server` a ban set; with `nft_sets`, checks them and starts the feeder.
pub fn install(
    mut server: Server,
    config: BanConfig,
    nft_sets: &[String],
) -> Result<Server, String> {
    let mut bans = Bans::new(config);
    if !nft_sets.is_empty() {
        let mut sets = Vec::new();
        for spec in nft_sets {
            let set = probe(spec, bans.config().ipv4_prefix)
                .map_err(|e| format!("--ban-nft-set {spec}: {e}"))?;
            if sets.iter().any(|s: &NftSet| s.v6 == set.v6) {
                return Err(format!(
                    "--ban-nft-set {spec}: a second {} set; give at most one per address family",
                    if set.v6 { "ipv6_addr" } else { "ipv4_addr" }
                ));
            }
            sets.push(set);
        }
        bans = bans.with_sink(start_feeder(&mut server, sets)?);
    }
    Ok(server.with_bans(Arc::new(bans)))
}

/// `FAMILY/TABLE/SET`. Names are plain identifiers, so nothing a flag holds can change the
/// meaning of the lines written to nft.
pub fn parse_spec(spec: &str) -> Result<(String, String, String), String> {
    let parts: Vec<&str> = spec.split('/').collect();
    let [family, table, set] = parts[..] else {
        return Err("want FAMILY/TABLE/SET, e.g. inet/filter/tern_bans".into());
    };
    if !matches!(family, "ip" | "ip6" | "inet") {
        return Err(format!("family {family:?}: want ip, ip6 or inet"));
    }
    for name in [table, set] {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            return Err(format!(
                "{name:?} is not a plain name (letters, digits, _ and -)"
            ));
        }
    }
    Ok((family.into(), table.into(), set.into()))
}

/// Checks that the set exists and can hold tern's bans: `type ipv4_addr` or `ipv6_addr`,
/// `flags timeout`, and `interval` where bans are prefixes (IPv4 /24, IPv6 /64).
fn probe(spec: &str, ipv4_prefix: u8) -> Result<NftSet, String> {
    let (family, table, set) = parse_spec(spec)?;
    let out = Command::new(nft_binary())
        .args(["list", "set", &family, &table, &set])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run nft ({e}); install nftables"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or("").trim();
        return Err(format!("nft list set failed: {first}"));
    }
    parse_listing(&String::from_utf8_lossy(&out.stdout), ipv4_prefix).map(|v6| NftSet {
        family,
        table,
        set,
        v6,
    })
}

/// From `nft list set` output: true for an IPv6 set, or why the set cannot take bans.
fn parse_listing(listing: &str, ipv4_prefix: u8) -> Result<bool, String> {
    let field = |name: &str| {
        listing
            .lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    let v6 = match field("type ") {
        Some("ipv4_addr") => false,
        Some("ipv6_addr") => true,
        other => {
            return Err(format!(
                "set type {}: want ipv4_addr or ipv6_addr",
                other.unwrap_or("unknown (typeof?)")
            ))
        }
    };
    let flags: Vec<&str> = field("flags ")
        .map(|f| f.split(',').map(str::trim).collect())
        .unwrap_or_default();
    if !flags.contains(&"timeout") {
        return Err("the set needs `flags timeout` (bans expire)".into());
    }
    let prefixes = v6 || ipv4_prefix < 32;
    if prefixes && !flags.contains(&"interval") {
        return Err(format!(
            "the set needs `flags interval,timeout`: bans cover a /{}",
            if v6 { 64 } else { ipv4_prefix }
        ));
    }
    Ok(v6)
}

/// `nft` from PATH, else from the sbin folders a non-root PATH may lack.
fn nft_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join("nft"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("nft"))
}

/// Starts `nft -i` now (before privileges are dropped and the sandbox forbids execve); the
/// threads that feed it and read its errors are the server's background threads, started
/// after the lockdown like every other thread.
fn start_feeder(server: &mut Server, sets: Vec<NftSet>) -> Result<SyncSender<BanNotice>, String> {
    let mut child = Command::new(nft_binary())
        .arg("-i")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("--ban-nft-set: cannot start nft -i: {e}"))?;
    let stdin = child.stdin.take().expect("piped stdin");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = sync_channel(NFT_QUEUE);
    let stats = server.stats();
    let feeder_stats = stats.clone();
    // Joined first at shutdown: closing nft's stdin lets it exit, which ends its stderr.
    server.background("ban-nft", move |stop| {
        feed(rx, stdin, &sets, &feeder_stats, || stop.is_stopped());
        let _ = child.wait();
    });
    server.background("ban-nft-errors", move |_| {
        let started = Instant::now();
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            // nft prints `Error: ...`, then the command and a marker line.
            if line.starts_with("Error:") {
                stats.aux().bump_shared(Counter::BanNftFailures);
                let now = started.elapsed().as_millis() as u64;
                if tern_runtime::ratelog::admit("ban_nft_error", now) {
                    tracing::warn!("--ban-nft-set: nft: {line}");
                }
            }
        }
    });
    Ok(tx)
}

/// The `add element` line for a ban, if one of the sets holds its family.
fn command_for(sets: &[NftSet], notice: &BanNotice) -> Option<String> {
    let v6 = matches!(notice.net, ipnet::IpNet::V6(_));
    let s = sets.iter().find(|s| s.v6 == v6)?;
    // A /32 (or /128) is written as a plain address: a set without `interval` takes only those.
    let element = match notice.net.prefix_len() == notice.net.max_prefix_len() {
        true => notice.net.addr().to_string(),
        false => notice.net.to_string(),
    };
    Some(format!(
        "add element {} {} {} {{ {element} timeout {}s }}\n",
        s.family, s.table, s.set, notice.seconds
    ))
}

/// Writes each ban to nft until the server stops (the queue's senders live as long as the
/// server, so the end is the stop signal, checked between waits).
fn feed(
    rx: Receiver<BanNotice>,
    mut stdin: ChildStdin,
    sets: &[NftSet],
    stats: &Stats,
    stopped: impl Fn() -> bool,
) {
    let started = Instant::now();
    while !stopped() {
        let notice = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(notice) => notice,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let Some(line) = command_for(sets, &notice) else {
            continue; // no set for this family: the ban stays tern's own
        };
        if let Err(e) = stdin.write_all(line.as_bytes()) {
            stats.aux().bump_shared(Counter::BanNftFailures);
            let now = started.elapsed().as_millis() as u64;
            if tern_runtime::ratelog::admit("ban_nft_gone", now) {
                tracing::warn!("--ban-nft-set: cannot write to nft ({e}); bans stay tern's own");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        assert_eq!(
            parse_spec("inet/filter/tern_bans").unwrap(),
            ("inet".into(), "filter".into(), "tern_bans".into())
        );
        assert!(parse_spec("ip6/t/s-6").is_ok());
        for bad in [
            "",
            "inet/filter",
            "inet/filter/set/x",
            "arp/t/s",
            "inet//s",
            "inet/t/9s",
            "inet/t/s }; flush ruleset",
            "inet/t/s;x",
        ] {
            assert!(parse_spec(bad).is_err(), "{bad:?} accepted");
        }
    }

    const V4: &str = "table inet t {\n\tset s {\n\t\ttype ipv4_addr\n\t\tflags timeout\n\t}\n}\n";
    const V6: &str =
        "table inet t {\n\tset s {\n\t\ttype ipv6_addr\n\t\tflags interval,timeout\n\t}\n}\n";

    #[test]
    fn listings() {
        assert_eq!(parse_listing(V4, 32), Ok(false));
        assert!(parse_listing(V4, 24).unwrap_err().contains("interval"));
        assert_eq!(parse_listing(V6, 32), Ok(true));
        let no_timeout = V4.replace("flags timeout", "flags interval");
        assert!(parse_listing(&no_timeout, 32)
            .unwrap_err()
            .contains("timeout"));
        let typeof_ = V4.replace("type ipv4_addr", "typeof ip saddr");
        assert!(parse_listing(&typeof_, 32).is_err());
        let v6_no_interval = V6.replace("interval,", "");
        assert!(parse_listing(&v6_no_interval, 32).is_err());
    }

    #[test]
    fn commands() {
        let sets = [NftSet {
            family: "inet".into(),
            table: "t".into(),
            set: "s4".into(),
            v6: false,
        }];
        let n = |net: &str| BanNotice {
            net: net.parse().unwrap(),
            seconds: 60,
        };
        assert_eq!(
            command_for(&sets, &n("192.0.2.7/32")).unwrap(),
            "add element inet t s4 { 192.0.2.7 timeout 60s }\n"
        );
        assert_eq!(
            command_for(&sets, &n("192.0.2.0/24")).unwrap(),
            "add element inet t s4 { 192.0.2.0/24 timeout 60s }\n"
        );
        assert_eq!(command_for(&sets, &n("2001:db8::/64")), None);
    }
}
