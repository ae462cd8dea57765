//! `vigia keys sweep`: SCAN + UNLINK in batches, never KEYS, literal prefix (library);
//! `--rate` and the Redis and prefix taken from the config (command line); on a Redis
//! Cluster, every master (library and command line).

use std::num::NonZeroU32;
use std::process::{Command, Output};
use std::time::Duration;

use vigia::sweep::{sweep, SweepError, SweepOptions, SweepProgress};

use crate::common::{free_port, RedisCluster, RedisServer};

const N: usize = 10_000;

/// Creates `n` keys `lt:...` of mixed types (strings, zsets, hashes) in one pipeline.
fn fill_lt(conn: &mut redis::Connection, n: usize) {
    let mut pipe = redis::pipe();
    for i in 0..n {
        match i % 3 {
            0 => pipe.cmd("SET").arg(format!("lt:s:{i}")).arg(i).ignore(),
            1 => pipe
                .cmd("ZADD")
                .arg(format!("lt:z:{i}"))
                .arg(i)
                .arg(format!("m{i}"))
                .ignore(),
            _ => pipe
                .cmd("HSET")
                .arg(format!("lt:h:{i}"))
                .arg("f")
                .arg(i)
                .ignore(),
        };
    }
    pipe.query::<()>(conn).expect("fill pipeline");
}

fn set(conn: &mut redis::Connection, key: &[u8]) {
    redis::cmd("SET")
        .arg(key)
        .arg("1")
        .query::<()>(conn)
        .expect("SET");
}

fn exists(conn: &mut redis::Connection, key: &[u8]) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<u64>(conn)
        .expect("EXISTS")
        == 1
}

fn dbsize(conn: &mut redis::Connection) -> u64 {
    redis::cmd("DBSIZE").query(conn).expect("DBSIZE")
}

const OUTSIDE: [&[u8]; 4] = [b"other:x", b"ltx:y", b"lt", b"LT:z"];

#[tokio::test]
async fn sweep_removes_exactly_the_prefix_with_scan_and_unlink_never_keys() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    fill_lt(&mut conn, N);
    for key in OUTSIDE {
        set(&mut conn, key);
    }
    assert_eq!(dbsize(&mut conn), (N + OUTSIDE.len()) as u64);

    let report = sweep(&server.url(), &SweepOptions::new("lt"), |_| {})
        .await
        .expect("sweep");

    assert!(!report.dry_run);
    assert_eq!(report.removed, N as u64);
    assert!(report.matched >= N as u64, "matched {}", report.matched);
    assert_eq!(dbsize(&mut conn), OUTSIDE.len() as u64);
    for key in OUTSIDE {
        assert!(
            exists(&mut conn, key),
            "{} was swept",
            String::from_utf8_lossy(key)
        );
    }

    let calls = server.command_calls();
    assert_eq!(
        calls.get("keys").copied().unwrap_or(0),
        0,
        "KEYS was sent: {calls:?}"
    );
    let scans = calls.get("scan").copied().unwrap_or(0);
    let unlinks = calls.get("unlink").copied().unwrap_or(0);
    assert!(scans > 1, "SCAN not batched: {calls:?}");
    assert!(unlinks > 1, "UNLINK not batched: {calls:?}");
    assert_eq!(scans, report.batches);
    assert_eq!(
        calls.get("del").copied().unwrap_or(0),
        0,
        "DEL was sent: {calls:?}"
    );
}

#[tokio::test]
async fn a_trailing_colon_means_the_same_prefix() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    fill_lt(&mut conn, 300);
    for key in OUTSIDE {
        set(&mut conn, key);
    }

    let report = sweep(&server.url(), &SweepOptions::new("lt:"), |_| {})
        .await
        .expect("sweep");

    assert_eq!(report.removed, 300);
    assert_eq!(dbsize(&mut conn), OUTSIDE.len() as u64);
}

#[tokio::test]
async fn a_sub_prefix_sweeps_only_its_scene() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    for i in 0..50 {
        set(&mut conn, format!("lt:coupon_claim:u{i}").as_bytes());
        set(&mut conn, format!("lt:coupon_claimx:u{i}").as_bytes());
        set(&mut conn, format!("lt:login:u{i}").as_bytes());
    }

    let report = sweep(&server.url(), &SweepOptions::new("lt:coupon_claim"), |_| {})
        .await
        .expect("sweep");

    assert_eq!(report.removed, 50);
    assert_eq!(dbsize(&mut conn), 100);
    assert!(exists(&mut conn, b"lt:coupon_claimx:u0"));
    assert!(exists(&mut conn, b"lt:login:u0"));
}

#[tokio::test]
async fn dry_run_counts_and_removes_nothing() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let n = 2_000;
    fill_lt(&mut conn, n);
    for key in OUTSIDE {
        set(&mut conn, key);
    }

    let opts = SweepOptions {
        dry_run: true,
        ..SweepOptions::new("lt")
    };
    let report = sweep(&server.url(), &opts, |_| {}).await.expect("dry run");

    assert!(report.dry_run);
    // Nothing changes during this scan, so SCAN returns no duplicates here.
    assert_eq!(report.matched, n as u64);
    assert_eq!(report.removed, 0);
    assert_eq!(dbsize(&mut conn), (n + OUTSIDE.len()) as u64);
    let calls = server.command_calls();
    assert_eq!(calls.get("unlink").copied().unwrap_or(0), 0, "{calls:?}");
    assert_eq!(calls.get("keys").copied().unwrap_or(0), 0, "{calls:?}");
}

/// (prefix, keys under it literally, bystanders the unescaped glob `PREFIX:*` would match)
type GlobCase = (
    &'static str,
    &'static [&'static [u8]],
    &'static [&'static [u8]],
);

#[tokio::test]
async fn glob_characters_in_the_prefix_match_only_literally() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let cases: [GlobCase; 4] = [
        (
            "lt*",
            &[b"lt*:1", b"lt*:2"],
            &[b"lt:1", b"ltx:1", b"ltabc:2"],
        ),
        ("l?", &[b"l?:1"], &[b"lt:1", b"lx:9"]),
        ("[a]", &[b"[a]:1"], &[b"a:1"]),
        (r"a\b", &[br"a\b:1"], &[b"ab:1"]),
    ];
    for (_, inside, outside) in cases {
        for key in inside.iter().chain(outside.iter()) {
            set(&mut conn, key);
        }
    }
    // Sanity: the unescaped glob really would match the bystanders.
    for (prefix, _, outside) in cases {
        let (_, found): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(0)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query(&mut conn)
            .expect("SCAN");
        for key in outside {
            assert!(
                found.iter().any(|k| k == key),
                "glob {prefix}:* misses a bystander"
            );
        }
    }

    for (prefix, inside, outside) in cases {
        let report = sweep(&server.url(), &SweepOptions::new(prefix), |_| {})
            .await
            .expect("sweep");
        assert_eq!(report.removed, inside.len() as u64, "prefix {prefix}");
        for key in inside {
            assert!(!exists(&mut conn, key), "prefix {prefix} left its own key");
        }
        for key in outside {
            assert!(
                exists(&mut conn, key),
                "prefix {prefix} swept {}",
                String::from_utf8_lossy(key)
            );
        }
    }
}

#[tokio::test]
async fn binary_key_names_are_swept() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let keys: [&[u8]; 3] = [b"lt:\xff\xfe", b"lt:\x00nul", b"lt:ok"];
    for key in keys {
        set(&mut conn, key);
    }
    set(&mut conn, b"\xfflt:x");

    let report = sweep(&server.url(), &SweepOptions::new("lt"), |_| {})
        .await
        .expect("sweep");

    assert_eq!(report.removed, 3);
    assert_eq!(dbsize(&mut conn), 1);
}

#[tokio::test]
async fn progress_is_reported_per_batch_and_ends_at_the_report() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    fill_lt(&mut conn, 3_000);

    let mut seen: Vec<SweepProgress> = Vec::new();
    let opts = SweepOptions {
        batch: 200,
        ..SweepOptions::new("lt")
    };
    let report = sweep(&server.url(), &opts, |p| seen.push(*p))
        .await
        .expect("sweep");

    assert!(seen.len() > 1, "progress called {} times", seen.len());
    let last = seen.last().expect("at least one progress call");
    assert_eq!(last.removed, report.removed);
    assert_eq!(last.matched, report.matched);
    assert_eq!(last.batches, report.batches);
    assert_eq!(report.removed, 3_000);
    assert_eq!(seen.len() as u64, report.batches);
    for pair in seen.windows(2) {
        assert_eq!(pair[1].batches, pair[0].batches + 1);
        assert!(pair[1].matched >= pair[0].matched);
        assert!(pair[1].removed >= pair[0].removed);
    }
}

#[tokio::test]
async fn an_empty_prefix_is_refused_before_connecting() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    set(&mut conn, b"lt:1");
    set(&mut conn, b":x");

    for prefix in ["", ":"] {
        let err = sweep(&server.url(), &SweepOptions::new(prefix), |_| {})
            .await
            .expect_err("empty prefix must be refused");
        assert!(matches!(err, SweepError::EmptyPrefix), "{err:?}");
    }
    assert_eq!(dbsize(&mut conn), 2);
    let calls = server.command_calls();
    assert_eq!(calls.get("scan").copied().unwrap_or(0), 0, "{calls:?}");
}

#[tokio::test]
async fn a_zero_batch_is_refused() {
    let opts = SweepOptions {
        batch: 0,
        ..SweepOptions::new("lt")
    };
    let err = sweep("redis://127.0.0.1:1", &opts, |_| {})
        .await
        .expect_err("zero batch");
    assert!(matches!(err, SweepError::ZeroBatch), "{err:?}");
}

#[tokio::test]
async fn an_unreachable_or_invalid_url_is_an_error_not_a_panic() {
    // Nothing listens on a freshly freed port.
    let url = format!("redis://:hunter2@127.0.0.1:{}", free_port());
    let err = sweep(&url, &SweepOptions::new("lt"), |_| {})
        .await
        .expect_err("unreachable Redis");
    assert!(matches!(err, SweepError::Connect { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("127.0.0.1"), "{msg}");
    assert!(!msg.contains("hunter2"), "password leaked: {msg}");

    let err = sweep("not a redis url", &SweepOptions::new("lt"), |_| {})
        .await
        .expect_err("invalid URL");
    assert!(matches!(err, SweepError::Connect { .. }), "{err:?}");
}

#[tokio::test]
async fn a_rated_sweep_removes_the_prefix_in_unlinks_no_bigger_than_the_rate() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    fill_lt(&mut conn, 400);
    for key in OUTSIDE {
        set(&mut conn, key);
    }

    // 400 keys at 200/s: about a second. Unrated, a batch of 5 000 would take them in one
    // SCAN and one UNLINK.
    let opts = SweepOptions {
        rate: NonZeroU32::new(200),
        batch: 5_000,
        ..SweepOptions::new("lt")
    };
    let report = sweep(&server.url(), &opts, |_| {})
        .await
        .expect("rated sweep");

    assert_eq!(report.removed, 400);
    assert_eq!(dbsize(&mut conn), OUTSIDE.len() as u64);
    let calls = server.command_calls();
    assert_eq!(calls.get("keys").copied().unwrap_or(0), 0, "{calls:?}");
    // No UNLINK carries more than a second's worth (200 keys).
    let unlinks = calls.get("unlink").copied().unwrap_or(0);
    assert!(unlinks >= 2, "an UNLINK exceeded the rate: {calls:?}");
}

// ---- The command line ----

fn vigia(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vigia"))
        .args(args)
        // The machine's own settings must not leak into these tests.
        .env_remove("VIGIA_REDIS_URL")
        .env_remove("VIGIA_KEY_PREFIX")
        .output()
        .expect("vigia runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `n` keys `PREFIX:i`.
fn fill(conn: &mut redis::Connection, prefix: &str, n: usize) {
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.cmd("SET").arg(format!("{prefix}:{i}")).arg(i).ignore();
    }
    pipe.query::<()>(conn).expect("fill pipeline");
}

fn count(conn: &mut redis::Connection, prefix: &str) -> usize {
    let mut cursor = 0u64;
    let mut n = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query(conn)
            .expect("SCAN");
        n += keys.len();
        cursor = next;
        if cursor == 0 {
            return n;
        }
    }
}

/// A config file holding `store`'s lines, in a temp folder kept alive by the caller.
fn config_file(store: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("vigia.toml");
    std::fs::write(&path, format!("[store]\n{store}\n")).expect("write config");
    let path = path.to_str().expect("utf-8 temp path").to_string();
    (dir, path)
}

/// A URL nothing listens on.
fn dead_url() -> String {
    format!("redis://127.0.0.1:{}", free_port())
}

#[test]
fn sweep_with_a_rate_runs_to_completion() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    fill(&mut conn, "lt", 1_000);
    fill(&mut conn, "keep", 10);

    let out = vigia(&[
        "keys",
        "sweep",
        "--redis",
        &server.url(),
        "--prefix",
        "lt",
        "--rate",
        "2000",
    ]);

    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(", removed 1000 in "),
        "{}",
        stdout(&out)
    );
    assert_eq!(count(&mut conn, "lt"), 0);
    assert_eq!(count(&mut conn, "keep"), 10);
}

#[test]
fn a_rate_that_is_zero_or_not_a_number_is_refused_naming_the_flag() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    fill(&mut conn, "lt", 10);

    for bad in ["0", "-5", "fast"] {
        let rate = format!("--rate={bad}");
        let out = vigia(&[
            "keys",
            "sweep",
            "--redis",
            &server.url(),
            "--prefix",
            "lt",
            &rate,
        ]);
        assert_eq!(out.status.code(), Some(2), "--rate {bad}");
        assert!(
            stderr(&out).contains("--rate"),
            "--rate {bad}: {}",
            stderr(&out)
        );
    }
    assert_eq!(count(&mut conn, "lt"), 10);
}

#[test]
fn without_flags_the_redis_and_prefix_come_from_the_config() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    fill(&mut conn, "cfg", 300);
    fill(&mut conn, "lt", 20);
    let (_dir, config) = config_file(&format!(
        "backend = \"redis\"\nredis_url = \"{}\"\nkey_prefix = \"cfg\"",
        server.url()
    ));

    let out = vigia(&["--config", &config, "keys", "sweep"]);

    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).starts_with("done: keys under cfg: "),
        "{}",
        stdout(&out)
    );
    assert_eq!(count(&mut conn, "cfg"), 0);
    assert_eq!(count(&mut conn, "lt"), 20, "another prefix was swept");
}

#[test]
fn each_flag_wins_over_its_config_key() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    fill(&mut conn, "cfg", 30);
    fill(&mut conn, "lt", 20);

    // --redis wins over the config's (dead) redis_url; the prefix is the config's.
    let (_dir, config) = config_file(&format!(
        "redis_url = \"{}\"\nkey_prefix = \"cfg\"",
        dead_url()
    ));
    let out = vigia(&[
        "keys",
        "sweep",
        "--config",
        &config,
        "--redis",
        &server.url(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(count(&mut conn, "cfg"), 0);
    assert_eq!(count(&mut conn, "lt"), 20);

    // --prefix wins over the config's key_prefix; the Redis is the config's.
    fill(&mut conn, "cfg", 30);
    let (_dir2, config) = config_file(&format!(
        "redis_url = \"{}\"\nkey_prefix = \"cfg\"",
        server.url()
    ));
    let out = vigia(&["keys", "sweep", "--config", &config, "--prefix", "lt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(count(&mut conn, "lt"), 0);
    assert_eq!(count(&mut conn, "cfg"), 30);
}

#[test]
fn vigia_redis_url_overrides_the_config_file_as_for_serve() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    fill(&mut conn, "lt", 50);
    let (_dir, config) = config_file(&format!("redis_url = \"{}\"", dead_url()));

    let out = Command::new(env!("CARGO_BIN_EXE_vigia"))
        .args(["keys", "sweep", "--config", &config])
        .env("VIGIA_REDIS_URL", server.url())
        .env_remove("VIGIA_KEY_PREFIX")
        .output()
        .expect("vigia runs");

    assert!(out.status.success(), "{}", stderr(&out));
    // The prefix is the config's default, `lt`.
    assert_eq!(count(&mut conn, "lt"), 0);
}

#[test]
fn no_redis_url_from_flag_or_config_is_an_error_naming_both() {
    let (_dir, config) = config_file("key_prefix = \"lt\"");

    let out = vigia(&["keys", "sweep", "--config", &config, "--dry-run"]);

    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("--redis"), "{err}");
    assert!(err.contains("redis_url"), "{err}");
    assert!(err.contains(&config), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(stdout(&out), "");
}

#[test]
fn a_missing_config_without_the_flags_is_an_error_naming_the_file() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    fill(&mut conn, "lt", 5);
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("absent.toml");
    let missing = missing.to_str().expect("utf-8 temp path");

    let out = vigia(&[
        "keys",
        "sweep",
        "--config",
        missing,
        "--redis",
        &server.url(),
    ]);

    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("--prefix not given"), "{err}");
    assert!(err.contains(missing), "{err}");
    assert_eq!(count(&mut conn, "lt"), 5);
}

// ---- Redis Cluster ----

/// Keys under `lt` on a cluster, as the service tags them: per entity
/// (`lt:coupon_claim:{uid:I}`, `lt:trust-points:{uid:I}`) and per scene
/// (`lt:{sceneI}:all`), so they spread over every master.
const CLUSTER_LT: usize = 300;
/// Keys under `keep`, and bystanders `ltx:{uid:I}`, that a sweep of `lt` must leave.
const CLUSTER_KEEP: usize = 30;

fn fill_cluster(cluster: &RedisCluster) {
    let mut pipe = redis::cluster::cluster_pipe();
    for i in 0..CLUSTER_LT {
        let key = match i % 3 {
            0 => format!("lt:coupon_claim:{{uid:{i}}}"),
            1 => format!("lt:trust-points:{{uid:{i}}}"),
            _ => format!("lt:{{scene{i}}}:all"),
        };
        pipe.cmd("SET").arg(key).arg(i).ignore();
    }
    for i in 0..CLUSTER_KEEP {
        pipe.cmd("SET")
            .arg(format!("keep:{{uid:{i}}}"))
            .arg(i)
            .ignore();
        pipe.cmd("SET")
            .arg(format!("ltx:{{uid:{i}}}"))
            .arg(i)
            .ignore();
    }
    pipe.query::<()>(&mut cluster.conn())
        .expect("fill the cluster");
}

/// Keys `PREFIX:*` on each master (SCAN on the node itself), in `cluster.masters()` order.
fn per_master(cluster: &RedisCluster, prefix: &str) -> Vec<usize> {
    cluster
        .masters()
        .into_iter()
        .map(|i| count(&mut cluster.nodes[i].conn(), prefix))
        .collect()
}

/// Checks the fill really spread over the three masters.
fn assert_spread(cluster: &RedisCluster) {
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "masters {masters:?}");
    for &i in &masters {
        assert!(
            dbsize(&mut cluster.nodes[i].conn()) > 0,
            "master {i} holds no key"
        );
    }
    let lt = per_master(cluster, "lt");
    assert!(lt.iter().all(|&n| n > 0), "lt keys per master: {lt:?}");
    assert_eq!(lt.iter().sum::<usize>(), CLUSTER_LT);
}

/// What was left of the bystanders: `keep:*` and `ltx:*` over all masters.
fn bystanders(cluster: &RedisCluster) -> (usize, usize) {
    (
        per_master(cluster, "keep").iter().sum(),
        per_master(cluster, "ltx").iter().sum(),
    )
}

/// A command's calls summed over every node of the cluster.
fn cluster_calls(cluster: &RedisCluster, command: &str) -> u64 {
    (0..cluster.nodes.len())
        .map(|i| calls(cluster, i, command))
        .sum()
}

/// A command's calls on node `i` (the tests' own SCANs, e.g. [`per_master`], included).
fn calls(cluster: &RedisCluster, i: usize, command: &str) -> u64 {
    cluster.nodes[i]
        .command_calls()
        .get(command)
        .copied()
        .unwrap_or(0)
}

#[tokio::test]
async fn a_cluster_sweep_scans_and_unlinks_on_every_master() {
    let cluster = RedisCluster::start();
    fill_cluster(&cluster);
    assert_spread(&cluster);

    let scans_before: Vec<u64> = (0..cluster.nodes.len())
        .map(|i| calls(&cluster, i, "scan"))
        .collect();
    let mut seen: Vec<SweepProgress> = Vec::new();
    let opts = SweepOptions {
        batch: 40,
        ..SweepOptions::new("lt")
    };
    let report = sweep(&cluster.urls(), &opts, |p| seen.push(*p))
        .await
        .expect("cluster sweep");

    assert!(report.cluster);
    assert_eq!(report.nodes, 3);
    assert_eq!(report.removed, CLUSTER_LT as u64);
    assert!(report.matched >= CLUSTER_LT as u64, "{report:?}");

    // The sweep's SCANs went to the masters only, each master scanned, one per batch;
    // each master unlinked; never KEYS nor DEL anywhere.
    let masters = cluster.masters();
    let scanned: Vec<u64> = (0..cluster.nodes.len())
        .map(|i| calls(&cluster, i, "scan") - scans_before[i])
        .collect();
    for (i, &n) in scanned.iter().enumerate() {
        assert_eq!(n > 0, masters.contains(&i), "SCANs per node: {scanned:?}");
    }
    assert_eq!(scanned.iter().sum::<u64>(), report.batches);
    for &i in &masters {
        assert!(calls(&cluster, i, "unlink") > 0, "no UNLINK on master {i}");
    }
    assert_eq!(cluster_calls(&cluster, "keys"), 0);
    assert_eq!(cluster_calls(&cluster, "del"), 0);

    assert_eq!(per_master(&cluster, "lt"), [0, 0, 0]);
    assert_eq!(bystanders(&cluster), (CLUSTER_KEEP, CLUSTER_KEEP));

    // Progress runs across the masters, in order, and ends at the report.
    assert_eq!(seen.len() as u64, report.batches);
    let last = seen.last().expect("progress reported");
    assert_eq!(
        (last.matched, last.removed, last.batches),
        (report.matched, report.removed, report.batches)
    );
    assert!(seen.iter().all(|p| p.nodes == 3));
    let mut nodes: Vec<usize> = seen.iter().map(|p| p.node).collect();
    assert!(nodes.windows(2).all(|w| w[0] <= w[1]), "{nodes:?}");
    nodes.dedup();
    assert_eq!(nodes, [1, 2, 3]);
    for pair in seen.windows(2) {
        assert!(pair[1].matched >= pair[0].matched);
        assert!(pair[1].removed >= pair[0].removed);
    }
}

#[tokio::test]
async fn a_cluster_dry_run_counts_every_master_and_removes_nothing() {
    let cluster = RedisCluster::start();
    fill_cluster(&cluster);
    assert_spread(&cluster);

    let opts = SweepOptions {
        dry_run: true,
        ..SweepOptions::new("lt")
    };
    let report = sweep(&cluster.urls(), &opts, |_| {})
        .await
        .expect("dry run");

    assert!(report.dry_run);
    assert!(report.cluster);
    // Nothing changes during this scan, so SCAN returns no duplicates here.
    assert_eq!(report.matched, CLUSTER_LT as u64);
    assert_eq!(report.removed, 0);
    assert_eq!(per_master(&cluster, "lt").iter().sum::<usize>(), CLUSTER_LT);

    // The command line, the cluster from the config.
    let (_dir, config) = config_file(&format!(
        "backend = \"redis_cluster\"\nredis_url = \"{}\"\nkey_prefix = \"lt\"",
        cluster.urls()
    ));
    let out = vigia(&["--config", &config, "keys", "sweep", "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(
        said.starts_with(&format!(
            "dry run: keys under lt: scanned {CLUSTER_LT}, would remove {CLUSTER_LT} in "
        )),
        "{said}"
    );
    assert!(said.contains(" on 3 cluster masters"), "{said}");

    assert_eq!(per_master(&cluster, "lt").iter().sum::<usize>(), CLUSTER_LT);
    assert_eq!(bystanders(&cluster), (CLUSTER_KEEP, CLUSTER_KEEP));
    assert_eq!(cluster_calls(&cluster, "unlink"), 0);
    assert_eq!(cluster_calls(&cluster, "keys"), 0);
}

#[test]
fn the_cli_sweeps_every_master_of_the_configured_cluster() {
    let cluster = RedisCluster::start();
    fill_cluster(&cluster);
    assert_spread(&cluster);
    let (_dir, config) = config_file(&format!(
        "backend = \"redis_cluster\"\nredis_url = \"{}\"\nkey_prefix = \"lt\"",
        cluster.urls()
    ));

    let out = vigia(&["--config", &config, "keys", "sweep", "--batch", "25"]);

    assert!(out.status.success(), "{}", stderr(&out));
    let said = stdout(&out);
    assert!(
        said.starts_with(&format!(
            "done: keys under lt: scanned {CLUSTER_LT}, removed {CLUSTER_LT} in "
        )),
        "{said}"
    );
    assert!(said.contains(" on 3 cluster masters"), "{said}");
    assert_eq!(per_master(&cluster, "lt"), [0, 0, 0]);
    assert_eq!(bystanders(&cluster), (CLUSTER_KEEP, CLUSTER_KEEP));
    assert_eq!(cluster_calls(&cluster, "keys"), 0);
}

#[tokio::test]
async fn any_one_reachable_seed_even_a_replica_leads_to_every_master() {
    let cluster = RedisCluster::start();
    fill_cluster(&cluster);
    assert_spread(&cluster);
    let masters = cluster.masters();
    let replica = (0..cluster.nodes.len())
        .find(|i| !masters.contains(i))
        .expect("a replica");

    // A dead seed first: the next one answers. One URL, a replica's: still a cluster.
    let seeds = format!("{},{}", dead_url(), cluster.nodes[replica].url());
    let report = sweep(&seeds, &SweepOptions::new("lt:coupon_claim"), |_| {})
        .await
        .expect("sweep through a replica");

    assert!(report.cluster);
    assert_eq!(report.nodes, 3);
    assert_eq!(report.removed, CLUSTER_LT.div_ceil(3) as u64);
    assert_eq!(per_master(&cluster, "lt:coupon_claim"), [0, 0, 0]);
    assert_eq!(
        per_master(&cluster, "lt").iter().sum::<usize>(),
        CLUSTER_LT - CLUSTER_LT.div_ceil(3)
    );

    let replica_scans = |cluster: &RedisCluster| -> u64 {
        (0..cluster.nodes.len())
            .filter(|i| !masters.contains(i))
            .map(|i| calls(cluster, i, "scan"))
            .sum()
    };
    let replica_scans_before = replica_scans(&cluster);
    let report = sweep(
        &cluster.nodes[replica].url(),
        &SweepOptions::new("lt"),
        |_| {},
    )
    .await
    .expect("sweep from one replica URL");
    assert!(report.cluster);
    assert_eq!(per_master(&cluster, "lt"), [0, 0, 0]);
    assert_eq!(bystanders(&cluster), (CLUSTER_KEEP, CLUSTER_KEEP));
    // Replicas are not scanned: they follow their masters.
    assert_eq!(replica_scans(&cluster), replica_scans_before);
}

#[tokio::test]
async fn a_rate_is_one_budget_for_the_whole_cluster() {
    let cluster = RedisCluster::start();
    fill_cluster(&cluster);
    assert_spread(&cluster);

    // 300 keys at 200/s over three masters of about 100 each: a rate per master would
    // never wait; one for the cluster waits at least (300 - 200) / 200 s before the last
    // UNLINK (none carries more than 200 keys).
    let opts = SweepOptions {
        rate: NonZeroU32::new(200),
        ..SweepOptions::new("lt")
    };
    let report = sweep(&cluster.urls(), &opts, |_| {})
        .await
        .expect("rated cluster sweep");

    assert_eq!(report.removed, CLUSTER_LT as u64);
    assert!(
        report.throttled >= Duration::from_millis(500),
        "waited only {:?} for the rate",
        report.throttled
    );
    assert!(report.elapsed >= report.throttled);
    assert_eq!(per_master(&cluster, "lt"), [0, 0, 0]);
}

#[tokio::test]
async fn several_urls_of_a_single_redis_are_refused_naming_the_node() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    fill(&mut conn, "lt", 20);

    let urls = format!("{},{}", server.url(), server.url());
    let err = sweep(&urls, &SweepOptions::new("lt"), |_| {})
        .await
        .expect_err("not a cluster");

    assert!(
        matches!(err, SweepError::NotACluster { seeds: 2, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains(&format!("127.0.0.1:{}", server.port)), "{msg}");
    let calls = server.command_calls();
    assert_eq!(calls.get("scan").copied().unwrap_or(0), 0, "{calls:?}");
    assert_eq!(count(&mut conn, "lt"), 20);
}

#[tokio::test]
async fn no_reachable_seed_is_a_connect_error_hiding_every_password() {
    let urls = format!(
        "redis://:first@127.0.0.1:{},redis://:second@127.0.0.1:{}",
        free_port(),
        free_port()
    );
    let err = sweep(&urls, &SweepOptions::new("lt"), |_| {})
        .await
        .expect_err("no seed answers");
    assert!(matches!(err, SweepError::Connect { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        !msg.contains("first") && !msg.contains("second"),
        "password leaked: {msg}"
    );
}
