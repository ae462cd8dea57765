//! How fast `vigia simulate` replays: a million checks of the shipped `coupon_claim`
//! scene (four limits, four behaviour signals, trust and new accounts) through the real
//! check path, on one thread.
//!
//! The traffic is a scenario (the generator `vigia scenario` uses): a day of 300 000
//! users claiming three times each, a tenth double-clicking, 30 % with a payment event,
//! and a device farm — about 1.0 million checks and 90 000 events. The file is written
//! once to a temporary folder; the replay is timed on its own.
//!
//! `cargo bench --bench simulate_replay` prints the checks, the wall time, the CPU time
//! of the whole process (from `/proc/self/stat`, every thread) and checks per second.
//! CPU time over wall time near 1.0 is the replay running on one core. Set
//! `VIGIA_BENCH_USERS` for another size (checks ≈ 3.3 × users).

use std::path::Path;
use std::time::Instant;

use vigia::simulate::scenario::{self, Scenario};

/// utime + stime of this process, in seconds (all threads).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    // Clock ticks: USER_HZ, which Linux fixes at 100 for user space.
    ticks / 100.0
}

fn scenario_text(users: u64) -> String {
    format!(
        r#"
seed = 1
scene = "coupon_claim"
start = "2026-12-24T00:00:00Z"
span = "24h"
activity_id = "bench"

[honest]
users = {users}
claims = 3
paid_share = 0.3
new_share = 0.05
double_click_share = 0.1
networks = {networks}

[[attacker]]
label = "attacker/farm"
accounts = 3000
devices = 100
proxies = {{ cidrs = ["203.0.113.0/24"] }}
tries = 3
interval = "11s"
account_age = "2d"
arrive_within = "1h"
"#,
        networks = users / 2,
    )
}

fn main() {
    let users: u64 = std::env::var("VIGIA_BENCH_USERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let traffic = dir.path().join("traffic.jsonl");
    let scenario = Scenario::parse("bench.toml", &scenario_text(users)).expect("scenario");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&traffic).expect("file"));
    let summary = scenario::write(&scenario, scenario.seed, &mut out).expect("write");
    drop(out);
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
    let opts = vigia::simulate::Options {
        rules_dir: rules,
        traffic: traffic.clone(),
        stock: Some(2000),
        out: None,
    };

    let cpu_before = cpu_seconds();
    let started = Instant::now();
    let report = actix_web::rt::System::new()
        .block_on(async { vigia::simulate::run(&opts, &mut |_| {}).await })
        .expect("replay");
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu_before;

    assert_eq!(report.checks, summary.checks);
    println!(
        "simulate_replay: {} checks + {} events of coupon_claim (4 limits, 4 signals, trust)",
        report.checks, report.events
    );
    println!(
        "simulate_replay: wall {wall:.1} s, process CPU {cpu:.1} s ({:.2} cores), {:.0} checks/s, {:.1} µs CPU per check",
        cpu / wall,
        report.checks as f64 / wall,
        cpu * 1e6 / report.checks as f64
    );
}
