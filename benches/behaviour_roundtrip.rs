//! The behaviour actors' round trip as a check sees it: one `Behaviours::signals` with the
//! coupon_claim scene's four `[behaviour]` signals (users per device, user switches on the
//! device, devices per user, users per IP), over pools of 100k users, 100k devices and
//! 10k IPs — the load test's mix. The four keys hash to up to four shards, asked
//! concurrently.
//!
//! `cargo bench --bench behaviour_roundtrip`. Prints p50/p99/max of the round trip with 1
//! caller and with 16 concurrent callers (an HTTP server's worth). This is the latency the
//! signal step adds to an embedded check.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vigia::behaviour::Behaviours;
use vigia::clock::{Clock, SystemClock};
use vigia::config::BehaviourConfig;
use vigia::decide::SignalPlan;
use vigia::metrics::Metrics;
use vigia::rules::Count;
use vigia::signal::entity_hash;
use vigia::signal::signal_cap;

const PER_CALLER: usize = 20_000;

fn hex(value: &str) -> String {
    format!("{:016x}", entity_hash(value))
}

/// One signal of the scene, as the check path plans it: `count` per `per` (its value in
/// the key), counting `counted`.
fn plan(
    name: &str,
    count: Count,
    per: &str,
    counted: &str,
    window_ms: u64,
    max: u64,
) -> SignalPlan {
    SignalPlan {
        name: name.into(),
        key: format!("vg:coupon_claim:sg:{name}:{}", hex(per)),
        all_key: None,
        last_key: (count == Count::UserSwitches)
            .then(|| format!("vg:coupon_claim:sl:{name}:{}", hex(per))),
        count,
        member: hex(counted),
        filter: None,
        window_ms,
        max,
        min_share: None,
        cap: signal_cap(max, None),
    }
}

fn plans(user: &str, device: &str, ip: &str) -> Vec<SignalPlan> {
    vec![
        plan(
            "accounts_per_device",
            Count::Users,
            device,
            user,
            86_400_000,
            3,
        ),
        plan(
            "account_switches",
            Count::UserSwitches,
            device,
            user,
            600_000,
            2,
        ),
        plan(
            "devices_per_user",
            Count::Devices,
            user,
            device,
            86_400_000,
            5,
        ),
        plan("accounts_per_ip", Count::Users, ip, user, 3_600_000, 50),
    ]
}

fn ids(i: u64) -> (String, String, String) {
    let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (
        format!("u{}", h % 100_000),
        format!("dev{}", (h >> 20) % 100_000),
        format!("10.{}.{}.1", (h >> 40) % 100, (h >> 50) % 100),
    )
}

async fn caller(b: Behaviours, seed: u64) -> Vec<Duration> {
    let applies = [true; 4];
    let mut out = Vec::with_capacity(PER_CALLER);
    for i in 0..PER_CALLER as u64 {
        let (user, device, ip) = ids(seed * 1_000_000 + i);
        let plans = plans(&user, &device, &ip);
        let now = SystemClock.now_ms();
        let started = Instant::now();
        let answered = b.signals(&plans, &applies, now, false).await;
        out.push(started.elapsed());
        assert!(answered.is_ok(), "{answered:?}");
    }
    out
}

fn report(label: &str, mut d: Vec<Duration>) {
    d.sort();
    let q = |p: f64| d[((d.len() as f64 * p) as usize).min(d.len() - 1)];
    println!(
        "{label:<22} n={:<7} p50={:>7.1?} p99={:>7.1?} max={:>7.1?}",
        d.len(),
        q(0.50),
        q(0.99),
        d[d.len() - 1]
    );
}

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let cfg = BehaviourConfig {
            // The bench measures the round trip, not the deadline.
            deadline_ms: 1_000,
            ..BehaviourConfig::default()
        };
        let b = Behaviours::start(&cfg, dir.path(), Arc::new(SystemClock), Metrics::new())
            .expect("behaviours start");
        // Warm up: fill the shards a little so the maps are not empty.
        caller(b.clone(), 99).await;
        report("1 caller", caller(b.clone(), 1).await);
        let tasks: Vec<_> = (0..16)
            .map(|s| tokio::spawn(caller(b.clone(), 100 + s)))
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("caller"));
        }
        report("16 concurrent callers", all);
        b.shutdown().await.expect("shutdown");
    });
}
