//! The behaviour actors' round trip as a check sees it: one `Behaviours::observe` asking
//! the device, user and IP shards concurrently (the coupon_claim scene's four signals),
//! over pools of 100k users, 100k devices and 10k IPs — the load test's mix.
//!
//! `cargo bench --bench behaviour_roundtrip`. Prints p50/p99/max of the round trip with 1
//! caller and with 16 concurrent callers (an HTTP server's worth). This is the latency the
//! behaviour stage adds to a check; the trust read runs beside it, not after it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vigia::behaviour::state::StateBounds;
use vigia::behaviour::{Behaviours, Observation};
use vigia::clock::SystemClock;
use vigia::config::BehaviourConfig;
use vigia::metrics::Metrics;
use vigia::rules::{Behaviour, SignalRule};

const PER_CALLER: usize = 20_000;

fn behaviour() -> Behaviour {
    let rule = |window_ms, max| Some(SignalRule { window_ms, max });
    Behaviour {
        accounts_per_device: rule(86_400_000, 3),
        account_switches: rule(600_000, 2),
        devices_per_user: rule(86_400_000, 5),
        accounts_per_ip: rule(3_600_000, 50),
    }
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
    let behaviour = behaviour();
    let bounds = StateBounds::from_behaviours([&behaviour]);
    let mut out = Vec::with_capacity(PER_CALLER);
    for i in 0..PER_CALLER as u64 {
        let (user, device, ip) = ids(seed * 1_000_000 + i);
        let started = Instant::now();
        let observed = b
            .observe(Observation {
                user: Some(&user),
                device: Some(&device),
                ip: Some(&ip),
                behaviour: &behaviour,
                bounds,
                dry_run: false,
            })
            .await;
        out.push(started.elapsed());
        assert!(observed.unanswered.is_empty() || observed.unanswered.len() <= 3);
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
