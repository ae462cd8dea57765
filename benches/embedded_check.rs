//! One check with the four limits of the `bench` scene (user 3/10 s sliding, device 10/day
//! sliding, IP 100/min fixed, activity fixed) against the embedded store, on 1 and 2
//! threads. Users and devices come from pools of 100k and IPs from 10k, as in
//! `../shared/bench/wrk-check.lua`, so the mix of allows and denies is the load test's.
//!
//! `cargo bench --bench embedded_check`. Compare the two thread counts as a ratio; absolute
//! times drift between machines and runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use vigia::clock::SystemClock;
use vigia::rules::Algorithm;
use vigia::store::embedded::EmbeddedStore;
use vigia::store::{CheckOp, LimitOp, WindowStore};

fn limit(key: String, algorithm: Algorithm, window_ms: u64, max: u64) -> LimitOp {
    LimitOp {
        key,
        algorithm,
        window_ms,
        max,
        retain_ms: window_ms,
    }
}

/// The i-th request: a cheap deterministic spread over the pools. With `shared`, the
/// activity limit every request counts in (one hot key) is included.
fn op(i: u64, shared: bool) -> CheckOp {
    let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let user = h % 100_000;
    let device = (h >> 20) % 100_000;
    let ip = (h >> 40) % 10_000;
    let mut op = CheckOp {
        record_key: format!("lt:bench:req:uid:u{user}:r{i}"),
        // Redis only: the embedded store keeps one record per request id.
        records_key: String::new(),
        idempotency_key: None,
        request_id: format!("r{i}"),
        // As in the load test: the service makes the ids, so no repeat is looked for.
        id_given: false,
        record_ttl_ms: 86_400_000,
        dry_run: false,
        limits: vec![
            limit(
                format!("lt:bench:uid:u{user}"),
                Algorithm::SlidingWindow,
                10_000,
                3,
            ),
            limit(
                format!("lt:bench:did:dev{device}"),
                Algorithm::SlidingWindow,
                86_400_000,
                10,
            ),
            limit(
                format!("lt:bench:fw:ip_60s:ip:10.0.{}.{}", ip / 250, ip % 250),
                Algorithm::FixedWindow,
                60_000,
                100,
            ),
        ],
    };
    if shared {
        op.limits.push(limit(
            "lt:bench:fw:activity_60s:aid:a1".into(),
            Algorithm::FixedWindow,
            60_000,
            100_000_000,
        ));
    }
    op
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = EmbeddedStore::open(dir.path(), Arc::new(SystemClock)).expect("open");
    store.start_reaper();
    let next = Arc::new(AtomicU64::new(0));
    // With the activity limit (the bench scene), and without it: the hot key every check
    // shares serialises callers, as it does on Redis; without it the shards run apart.
    for (name, shared) in [
        ("4_limits_shared_activity", true),
        ("3_limits_per_entity", false),
    ] {
        let mut group = c.benchmark_group(format!("embedded_check_{name}"));
        group.throughput(Throughput::Elements(1));
        group.measurement_time(Duration::from_secs(5));
        for threads in [1u64, 2] {
            group.bench_with_input(
                BenchmarkId::from_parameter(threads),
                &threads,
                |b, &threads| {
                    b.iter_custom(|iters| {
                        let per = iters.div_ceil(threads);
                        let started = Instant::now();
                        std::thread::scope(|s| {
                            for _ in 0..threads {
                                let store = store.clone();
                                let next = next.clone();
                                s.spawn(move || {
                                    for _ in 0..per {
                                        let o = op(next.fetch_add(1, Ordering::Relaxed), shared);
                                        let _ = futures::executor::block_on(store.check(&o));
                                    }
                                });
                            }
                        });
                        // Time per check as the callers saw it: total work over total wall time.
                        started
                            .elapsed()
                            .mul_f64(iters as f64 / (per * threads) as f64)
                    })
                },
            );
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
