//! What one check of the shipped `coupon_claim` scene costs Redis: CPU per check and
//! memory per entity, for the whole decision (one EVALSHA of `lua/decide.lua`).
//!
//! Three variants of the shipped rules, each written to a temporary folder and loaded with
//! the service's loader, each run on an emptied private `redis-server`:
//! - `a` the shipped rules: 4 limits, 6 signals (4 shorthands, 2 grammar), the score, trust;
//! - `b` the same scene without signals and score: 4 limits and trust;
//! - `c` limits only: no signals, no score, no `[trust]`.
//!
//! Checks go through [`RedisDecider`] (not the `Checker`: its per-node gateway would cap the
//! scene at 2 000 checks/s), 16 in flight on the service's one multiplexed connection,
//! each built as the service builds it (`parse_check`, then `check::plan::plan`). Every
//! check has its own request id and its own user; devices are shared by ~2 users, IPs by
//! ~10, /24 networks by ~160. One user in 20 sends no `user_created_at` and is new (first
//! sighting now); the others were created a year ago. So nothing is a repeat, no limit is
//! full, and the mix does not depend on how fast the machine is.
//!
//! `cargo bench --bench redis_decide` prints, per variant: Redis CPU µs per check
//! (utime + stime of the redis-server process over the run / checks), the script's own µs
//! per call (`INFO commandstats`), client checks/s (wall) and client CPU µs per check, the
//! `used_memory` growth per check and the keys left per check; then the keys per check by
//! family with their mean `MEMORY USAGE`, and a fit of signal ZSETs' `MEMORY USAGE` into
//! bytes per key + bytes per member. Compare variants as ratios within one run: absolute
//! times drift between machines and runs. `VIGIA_BENCH_CHECKS` sets the checks per
//! variant (default 100 000).

#[allow(dead_code)]
#[path = "../tests/common/redis_server.rs"]
mod redis_server;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use serde_json::json;
use vigia::check::plan::plan;
use vigia::check::request::parse_check;
use vigia::decide::redis::RedisDecider;
use vigia::decide::{Decided, Decider, Outcome};
use vigia::keys::KeyPrefix;
use vigia::rules::{load_dir, RuleSet};
use vigia::store::redis::RedisStore;
use vigia::store::redis_link::Conn;

use redis_server::RedisServer;

const PREFIX: &str = "lt";
const SCENE: &str = "coupon_claim";
const IN_FLIGHT: usize = 16;
/// Keys per family whose `MEMORY USAGE` is read.
const SAMPLE: usize = 400;

struct Variant {
    tag: &'static str,
    label: &'static str,
    signals: bool,
    trust: bool,
}

const VARIANTS: [Variant; 3] = [
    Variant {
        tag: "a",
        label: "shipped: limits+signals+trust",
        signals: true,
        trust: true,
    },
    Variant {
        tag: "b",
        label: "limits+trust (no signals)",
        signals: false,
        trust: true,
    },
    Variant {
        tag: "c",
        label: "limits only",
        signals: false,
        trust: false,
    },
];

/// The shipped `common.toml` and `coupon_claim.toml`, minus what the variant leaves out,
/// in `dir`, loaded by the service's loader.
fn rules_for(v: &Variant, dir: &Path) -> RuleSet {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let read = |name: &str| -> toml::Table {
        std::fs::read_to_string(shipped.join(name))
            .expect("shipped rule file")
            .parse()
            .expect("shipped rule file is TOML")
    };
    let mut common = read("common.toml");
    let mut scene = read("coupon_claim.toml");
    if !v.signals {
        let s = scene["scene"][SCENE]
            .as_table_mut()
            .expect("[scene.coupon_claim]");
        for section in ["behaviour", "signals", "score"] {
            s.remove(section);
        }
    }
    if !v.trust {
        common.remove("trust");
    }
    let write = |name: &str, t: &toml::Table| {
        std::fs::write(dir.join(name), toml::to_string(t).expect("TOML")).expect("write rules")
    };
    write("common.toml", &common);
    write("coupon_claim.toml", &scene);
    let rules = load_dir(dir).unwrap_or_else(|e| panic!("variant {}: {e}", v.tag));
    let s = rules.scene(SCENE).expect("coupon_claim scene");
    assert_eq!(s.limits.len(), 4);
    assert_eq!(s.signals.len(), if v.signals { 6 } else { 0 });
    assert_eq!(s.score.is_some(), v.signals);
    assert_eq!(rules.trust.is_some(), v.trust);
    rules
}

/// splitmix64: a cheap, well-spread hash of the check number.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The i-th of n checks: its own request id and user; a device of n/2, an IP of n/10,
/// 16 IPs per /24.
fn body(tag: &str, i: u64, n: u64) -> serde_json::Value {
    let h = mix(i);
    let device = h % (n / 2).max(1);
    let ip = (h >> 32) % (n / 10).max(1);
    let (net, host) = (ip / 16, 1 + ip % 16);
    let mut body = json!({
        "scene": SCENE,
        "request_id": format!("{tag}-{i}"),
        "user_id": format!("u{tag}{i}"),
        "device_id": format!("d{device:010}"),
        "ip": format!("100.{}.{}.{host}", 64 + (net >> 8) % 64, net & 255),
    });
    if mix(i ^ 0x5EED) % 20 != 0 {
        body["user_created_at"] = json!("2025-01-01T00:00:00Z");
    }
    body
}

/// utime + stime of a process, in clock ticks (USER_HZ = 100 on Linux).
fn cpu_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

async fn cmd<T: redis::FromRedisValue>(conn: &mut Conn, args: &[&str]) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// `field:value` of an INFO section.
async fn info(conn: &mut Conn, section: &str) -> BTreeMap<String, String> {
    let text: String = cmd(conn, &["INFO", section]).await;
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// `(calls, usec)` of EVALSHA since the last `CONFIG RESETSTAT`.
async fn evalsha_stats(conn: &mut Conn) -> (u64, u64) {
    let stats = info(conn, "commandstats").await;
    let Some(line) = stats.get("cmdstat_evalsha") else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("calls="), field("usec="))
}

#[derive(Default)]
struct Counts {
    allowed: u64,
    denied: u64,
    score: u64,
    dup: u64,
    errors: u64,
}

/// Runs n checks of the variant, 16 in flight.
async fn drive(decider: &RedisDecider, rules: &RuleSet, tag: &str, n: u64) -> Counts {
    let now_ms = chrono::Utc::now().timestamp_millis() as u64;
    futures::stream::iter(0..n)
        .map(|i| {
            let req = parse_check(rules, &body(tag, i, n), now_ms).expect("valid check");
            assert!(!req.device_invalid);
            let (plan, _) = plan(
                &KeyPrefix::plain(PREFIX),
                rules,
                &req,
                vigia::config::DEFAULT_RECORD_HORIZON_MS,
            );
            async move { decider.decide(&plan).await }
        })
        .buffer_unordered(IN_FLIGHT)
        .fold(Counts::default(), |mut c, r| async move {
            match r {
                Ok(Decided::Duplicate { .. } | Decided::Held { .. }) => c.dup += 1,
                Ok(Decided::Judged(j)) => match j.outcome {
                    Outcome::Allowed { .. } => c.allowed += 1,
                    Outcome::Denied { .. } | Outcome::Challenged { .. } => c.denied += 1,
                    Outcome::ScoreDeny => c.score += 1,
                },
                Err(_) => c.errors += 1,
            }
            c
        })
        .await
}

/// The family of a key: the segment after the scene (and the signal's name), or the
/// trust key's kind.
fn family(key: &str) -> String {
    let parts: Vec<&str> = key.splitn(5, ':').collect();
    match parts.as_slice() {
        [_, scene, kind, rest @ ..] if *scene == SCENE => match *kind {
            "sg" | "sa" | "sl" | "fw" | "tb" => {
                format!("{kind}:{}", rest.first().copied().unwrap_or(""))
            }
            "req" | "idem" | "all" => (*kind).to_string(),
            dim => format!("sliding:{dim}"),
        },
        [_, kind, ..] => (*kind).to_string(),
        _ => key.to_string(),
    }
}

struct Family {
    keys: u64,
    sampled: u64,
    bytes: u64,
}

struct Census {
    families: BTreeMap<String, Family>,
    /// Signal ZSETs sampled: (family, key, members, encoding, MEMORY USAGE).
    zsets: Vec<(String, String, u64, String, u64)>,
}

/// Every key, by family; `MEMORY USAGE` of up to SAMPLE keys per family (every per-net
/// and scene-wide signal key), and ZCARD and encoding of the signal ZSETs among them.
async fn census(conn: &mut Conn) -> Census {
    let mut by_family: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cursor = "0".to_string();
    loop {
        let (next, keys): (String, Vec<String>) =
            cmd(conn, &["SCAN", &cursor, "COUNT", "2000"]).await;
        for k in keys {
            by_family.entry(family(&k)).or_default().push(k);
        }
        if next == "0" {
            break;
        }
        cursor = next;
    }
    let mut families = BTreeMap::new();
    let mut zsets = Vec::new();
    for (fam, keys) in &by_family {
        let mut f = Family {
            keys: keys.len() as u64,
            sampled: 0,
            bytes: 0,
        };
        let signal_zset = fam.starts_with("sg:") || fam.starts_with("sa:");
        // The few per-net and scene-wide keys are all read: they are the large sets.
        let take = if signal_zset && keys.len() <= 4 * SAMPLE {
            keys.len()
        } else {
            SAMPLE
        };
        for k in keys.iter().take(take) {
            let Some(bytes) =
                cmd::<Option<u64>>(conn, &["MEMORY", "USAGE", k, "SAMPLES", "0"]).await
            else {
                continue; // expired since the scan
            };
            f.sampled += 1;
            f.bytes += bytes;
            if signal_zset {
                let n: u64 = cmd(conn, &["ZCARD", k]).await;
                let enc: String = cmd(conn, &["OBJECT", "ENCODING", k]).await;
                zsets.push((fam.clone(), k.clone(), n, enc, bytes));
            }
        }
        families.insert(fam.clone(), f);
    }
    Census { families, zsets }
}

struct Measured {
    counts: Counts,
    wall_s: f64,
    redis_ticks: u64,
    client_ticks: u64,
    script_calls: u64,
    script_usec: u64,
    mem_bytes: i64,
    keys: u64,
    census: Census,
}

async fn run_variant(
    conn: &mut Conn,
    decider: &RedisDecider,
    redis_pid: &str,
    rules: &RuleSet,
    tag: &str,
    n: u64,
) -> Measured {
    let _: String = cmd(conn, &["FLUSHALL", "SYNC"]).await;
    let _: String = cmd(conn, &["CONFIG", "RESETSTAT"]).await;
    let mem = |i: &BTreeMap<String, String>| -> i64 { i["used_memory"].parse().unwrap() };
    let mem0 = mem(&info(conn, "memory").await);
    let (redis0, client0) = (cpu_ticks(redis_pid), cpu_ticks("self"));
    let started = Instant::now();
    let counts = drive(decider, rules, tag, n).await;
    let wall_s = started.elapsed().as_secs_f64();
    let (redis1, client1) = (cpu_ticks(redis_pid), cpu_ticks("self"));
    let (script_calls, script_usec) = evalsha_stats(conn).await;
    let mem1 = mem(&info(conn, "memory").await);
    let keys: u64 = cmd(conn, &["DBSIZE"]).await;
    let census = census(conn).await;
    Measured {
        counts,
        wall_s,
        redis_ticks: redis1 - redis0,
        client_ticks: client1 - client0,
        script_calls,
        script_usec,
        mem_bytes: mem1 - mem0,
        keys,
        census,
    }
}

/// Least squares `bytes = a + b * members`.
fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(sx, sy), (x, y)| (sx + x, sy + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    (sxx > 0.0).then(|| (my - sxy / sxx * mx, sxy / sxx))
}

fn report(n: u64, results: &[(&Variant, Measured)]) {
    let us = |ticks: u64| ticks as f64 * 10_000.0 / n as f64;
    println!();
    println!("{n} checks per variant, {IN_FLIGHT} in flight, one RedisDecider connection");
    println!(
        "{:<32} {:>7} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "variant",
        "allow",
        "deny",
        "score",
        "err",
        "redis µs",
        "script µs",
        "checks/s",
        "client µs",
        "mem B",
        "keys"
    );
    for (v, m) in results {
        let c = &m.counts;
        println!(
            "{:<32} {:>7} {:>6} {:>6} {:>6} {:>9.1} {:>9.1} {:>9.0} {:>9.1} {:>8.0} {:>8.2}",
            format!("{} {}", v.tag, v.label),
            c.allowed,
            c.denied,
            c.score,
            c.errors + c.dup,
            us(m.redis_ticks),
            m.script_usec as f64 / m.script_calls.max(1) as f64,
            n as f64 / m.wall_s,
            us(m.client_ticks),
            m.mem_bytes as f64 / n as f64,
            m.keys as f64 / n as f64,
        );
    }
    println!(
        "(per check: redis µs = redis-server utime+stime; script µs = INFO commandstats \
         evalsha usec/call; client µs = this process; mem B = used_memory growth; keys = DBSIZE)"
    );
    let c = &results[2].1;
    for (v, m) in &results[..2] {
        println!(
            "ratio {}/c: redis CPU {:.2}x, script {:.2}x, checks/s {:.2}x, memory {:.2}x, keys {:.2}x",
            v.tag,
            m.redis_ticks as f64 / c.redis_ticks.max(1) as f64,
            (m.script_usec as f64 / m.script_calls.max(1) as f64)
                / (c.script_usec as f64 / c.script_calls.max(1) as f64),
            c.wall_s / m.wall_s,
            m.mem_bytes as f64 / c.mem_bytes.max(1) as f64,
            m.keys as f64 / c.keys.max(1) as f64,
        );
    }

    println!();
    println!("keys per check by family (mean MEMORY USAGE per key, bytes)");
    let mut names: Vec<&String> = results
        .iter()
        .flat_map(|(_, m)| m.census.families.keys())
        .collect();
    names.sort();
    names.dedup();
    print!("{:<36}", "family");
    for (v, _) in results {
        print!(" {:>8} {:>6}", format!("{}/check", v.tag), "B");
    }
    println!();
    let mut totals = vec![(0u64, 0f64); results.len()];
    for name in names {
        print!("{name:<36}");
        for (i, (_, m)) in results.iter().enumerate() {
            match m.census.families.get(name) {
                Some(f) => {
                    let mean = f.bytes as f64 / f.sampled.max(1) as f64;
                    totals[i].0 += f.keys;
                    totals[i].1 += mean * f.keys as f64;
                    print!(" {:>8.3} {:>6.0}", f.keys as f64 / n as f64, mean);
                }
                None => print!(" {:>8} {:>6}", "-", "-"),
            }
        }
        println!();
    }
    print!("{:<36}", "total (B = est. bytes per check)");
    for (keys, bytes) in &totals {
        print!(
            " {:>8.3} {:>6.0}",
            *keys as f64 / n as f64,
            bytes / n as f64
        );
    }
    println!();

    // Signal ZSETs of the shipped variant: bytes per key and per member.
    let zsets = &results[0].1.census.zsets;
    println!();
    println!("signal ZSETs (variant a): MEMORY USAGE = bytes per key + bytes per member x N");
    let mut encodings: Vec<&String> = zsets.iter().map(|z| &z.3).collect();
    encodings.sort();
    encodings.dedup();
    for enc in encodings {
        let pts: Vec<(f64, f64)> = zsets
            .iter()
            .filter(|z| &z.3 == enc)
            .map(|z| (z.2 as f64, z.4 as f64))
            .collect();
        let (lo, hi) = pts
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), p| (lo.min(p.0), hi.max(p.0)));
        match fit(&pts) {
            Some((a, b)) => println!(
                "  {enc:<9} fit over {} keys, N {lo}..{hi}: {a:.0} B per key + {b:.1} B per member",
                pts.len()
            ),
            None => println!(
                "  {enc:<9} {} keys, all N = {lo}: {:.0} B each ({:.1} B per member)",
                pts.len(),
                pts.iter().map(|p| p.1).sum::<f64>() / pts.len() as f64,
                pts.iter().map(|p| p.1 / p.0).sum::<f64>() / pts.len() as f64,
            ),
        }
    }
    // Samples: the largest key of each signal set family, and a typical per-device one.
    let mut fams: Vec<&String> = zsets.iter().map(|z| &z.0).collect();
    fams.sort();
    fams.dedup();
    for fam in fams {
        let of: Vec<_> = zsets.iter().filter(|z| &z.0 == fam).collect();
        let big = of.iter().max_by_key(|z| (z.2, z.4)).expect("one key");
        let mean_n = of.iter().map(|z| z.2 as f64).sum::<f64>() / of.len() as f64;
        println!(
            "  {fam:<32} largest N={:<4} {:>6} B ({}); mean N {mean_n:.1} over {} sampled",
            big.2,
            big.4,
            big.3,
            of.len()
        );
    }
}

fn main() {
    let n: u64 = std::env::var("VIGIA_BENCH_CHECKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let server = RedisServer::start();
    assert_ne!(server.port, 6379);
    let pid = server.pid().to_string();
    let version = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("{version}, pid {pid}, port {}", server.port);

    let dirs: Vec<tempfile::TempDir> = VARIANTS
        .iter()
        .map(|_| tempfile::tempdir().expect("temp dir"))
        .collect();
    let rules: Vec<RuleSet> = VARIANTS
        .iter()
        .zip(&dirs)
        .map(|(v, d)| rules_for(v, d.path()))
        .collect();

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        // A generous deadline: the machine is shared, and a timeout is not what is measured.
        let store = RedisStore::connect(&server.url(), 10_000)
            .await
            .expect("connect");
        let link = store.link();
        let decider = RedisDecider::new(Arc::clone(&link), None, vigia::metrics::Metrics::new())
            .await
            .expect("load decide.lua");
        let mut conn = link.conn().await.expect("connected");
        // Warm up: the script, the allocator, the connection.
        let _: String = cmd(&mut conn, &["FLUSHALL", "SYNC"]).await;
        drive(&decider, &rules[0], "w", (n / 20).max(100)).await;
        let mut results = Vec::new();
        for (v, r) in VARIANTS.iter().zip(&rules) {
            let m = run_variant(&mut conn, &decider, &pid, r, v.tag, n).await;
            assert_eq!(m.counts.dup, 0, "variant {}: a repeat", v.tag);
            results.push((v, m));
        }
        report(n, &results);
    });
    drop(server);
}
