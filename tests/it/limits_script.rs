//! The scripts made per shape of limits (`store::limits_script`) against check.lua, the
//! general script they replace: the same random checks, across window edges, dry runs,
//! repeated ids and idempotency keys, through both on one Redis (each in a database of its
//! own, under the same key names: a request record names keys by a hash of their names),
//! must give the same answer every time and leave the same keys behind.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use redis::{Cmd, Script, Value};
use vigia::rules::Algorithm;
use vigia::store::limits_script::Shape;
use vigia::store::redis::{parse_check_reply, CheckCall, Stamp, CHECK_LUA};
use vigia::store::CheckOutcome;

use crate::common::RedisServer;

/// One limit of a test shape: the key's tail (prefix and user come in front), algorithm,
/// window, max, retain. Retains are minutes long, and so are the fixed windows and buckets
/// (whose keys expire with them): the test moves its own clock (`now`) but keys expire on
/// Redis's, and a key expiring between the two scripts' calls or dumps would be a difference
/// of timing, not of scripts.
type Spec = (&'static str, Algorithm, u64, u64, u64);

const SEC: u64 = 1000;

/// Shapes that cover each branch: every algorithm, sliding limits sharing a ZSET (with the
/// longer window second), a fixed window and a bucket over one key each, small maxes so
/// that denies and retry times come often.
fn shapes() -> Vec<Vec<Spec>> {
    use Algorithm::*;
    vec![
        // The bench scene.
        vec![
            ("uid", SlidingWindow, 10 * SEC, 3, 600 * SEC),
            ("did", SlidingWindow, 86_400 * SEC, 10, 86_400 * SEC),
            ("fw:ip", FixedWindow, 60 * SEC, 6, 600 * SEC),
            ("fw:act", FixedWindow, 60 * SEC, 100_000_000, 600 * SEC),
        ],
        vec![
            ("uid", SlidingWindow, 2 * SEC, 2, 600 * SEC),
            ("uid", SlidingWindow, 7 * SEC, 4, 900 * SEC),
            ("tb:uid", TokenBucket, 60 * SEC, 20, 600 * SEC),
        ],
        vec![
            ("tb:uid", TokenBucket, 60 * SEC, 15, 600 * SEC),
            ("fw:uid", FixedWindow, 60 * SEC, 12, 600 * SEC),
        ],
        vec![],
    ]
}

fn load(conn: &mut redis::Connection, text: &str) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(text)
        .query(conn)
        .expect("SCRIPT LOAD")
}

fn run(conn: &mut redis::Connection, cmd: &Cmd) -> Value {
    cmd.query(conn)
        .unwrap_or_else(|e| panic!("EVALSHA failed: {e}"))
}

/// Every key of the connection's database with its contents and whether it expires.
fn dump(conn: &mut redis::Connection) -> BTreeMap<String, (String, bool)> {
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).expect("KEYS");
    keys.into_iter()
        .map(|key| {
            let kind: String = redis::cmd("TYPE").arg(&key).query(conn).expect("TYPE");
            let contents = match kind.as_str() {
                "zset" => {
                    let v: Vec<(String, String)> = redis::cmd("ZRANGE")
                        .arg(&key)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query(conn)
                        .expect("ZRANGE");
                    format!("{v:?}")
                }
                "hash" => {
                    let v: BTreeMap<String, String> = redis::cmd("HGETALL")
                        .arg(&key)
                        .query(conn)
                        .expect("HGETALL");
                    format!("{v:?}")
                }
                "string" => redis::cmd("GET").arg(&key).query(conn).expect("GET"),
                other => panic!("{key}: unexpected type {other}"),
            };
            let pttl: i64 = redis::cmd("PTTL").arg(&key).query(conn).expect("PTTL");
            (key, (contents, pttl > 0))
        })
        .collect()
}

#[test]
fn a_script_made_for_a_shape_answers_and_writes_as_check_lua_does() {
    let server = RedisServer::start();
    let mut conn = server.conn();
    let mut shaped_db = server.conn();
    redis::cmd("SELECT")
        .arg(1)
        .exec(&mut shaped_db)
        .expect("SELECT 1");
    let general = load(&mut conn, CHECK_LUA);
    assert_eq!(general, Script::new(CHECK_LUA).get_hash());
    let mut rng = ChaCha8Rng::seed_from_u64(20261206);
    // Near the real time: expiries run on Redis's clock.
    let mut now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64;
    let mut answers: BTreeMap<String, u32> = BTreeMap::new();
    for (s, specs) in shapes().into_iter().enumerate() {
        let mut shaped: Option<String> = None;
        for step in 0..600 {
            // Steps that land on window edges (whole seconds) as often as between them.
            now += [0, 1, 499, 500, 999, 1000, 1001, 1500, 2000][rng.random_range(0..9)];
            let user = rng.random_range(0..3);
            let request_id = if rng.random_bool(0.1) && step > 0 {
                format!("r{s}-{}", step - 1)
            } else {
                format!("r{s}-{step}")
            };
            let idem = rng
                .random_bool(0.2)
                .then(|| format!("i{}", rng.random_range(0..4)));
            let dry_run = rng.random_bool(0.15);
            let id_given = rng.random_bool(0.5);
            // An attempt's stamp (a cluster's reservation, or one Redis's attempt): both must
            // end the record with it.
            let stamp = rng.random_bool(0.3).then(|| {
                if rng.random_bool(0.5) {
                    Stamp::Reservation(rng.random())
                } else {
                    Stamp::Attempt(rng.random())
                }
            });
            let mut answer = Vec::new();
            for general_db in [true, false] {
                let keys: Vec<String> = specs
                    .iter()
                    .map(|(tail, ..)| format!("t:{tail}:{user}"))
                    .collect();
                let records_key = format!("t:rq:uid:{user}");
                let idem_key = idem.as_ref().map(|i| format!("t:idem:{i}"));
                let call = CheckCall {
                    records_key: &records_key,
                    idempotency_key: idem_key.as_deref(),
                    request_id: &request_id,
                    dry_run,
                    id_given,
                    record_ttl_ms: 900 * SEC,
                    now: Some(now),
                    stamp,
                };
                let limits = specs
                    .iter()
                    .zip(&keys)
                    .map(|(&(_, a, w, m, r), k)| (k.as_str(), a, w, m, r));
                if general_db {
                    answer.push(run(&mut conn, &call.command(&general, limits)));
                } else {
                    // The shape does not depend on the user: its script is loaded once.
                    let sha = shaped.get_or_insert_with(|| {
                        let shape = Shape::of(limits.clone()).expect("a shape");
                        load(&mut conn, &shape.lua())
                    });
                    let cmd = vigia::store::limits_script::command(&call, sha, limits);
                    answer.push(run(&mut shaped_db, &cmd));
                }
            }
            // The two reply in different forms (an array, one string): compare what the
            // service reads from each.
            let answer: Vec<CheckOutcome> = answer
                .into_iter()
                .map(|reply| parse_check_reply(reply, specs.len()).expect("a readable reply"))
                .collect();
            assert_eq!(
                answer[0], answer[1],
                "shape {s}, step {step} (now {now}, user {user}, id {request_id}, idem {idem:?}, dry run {dry_run}): check.lua then the shaped script"
            );
            *answers.entry(kind(&answer[0])).or_default() += 1;
            if step % 50 == 49 {
                let (general, shaped) = (dump(&mut conn), dump(&mut shaped_db));
                let differ: Vec<_> = general
                    .keys()
                    .chain(shaped.keys())
                    .filter(|k| general.get(*k) != shaped.get(*k))
                    .map(|k| (k, general.get(k), shaped.get(k)))
                    .collect();
                assert!(
                    differ.is_empty(),
                    "shape {s}, after step {step}: the keys differ (key, check.lua, shaped): {differ:?}"
                );
            }
        }
    }
    assert_eq!(answers.values().sum::<u32>(), 2400);
    // The workload crossed every answer many times (a test of allows only would prove little).
    for kind in ["allow", "deny", "dup"] {
        assert!(
            answers.get(kind).copied().unwrap_or(0) >= 100,
            "{answers:?}"
        );
    }
}

/// allow, deny, dup or held.
fn kind(outcome: &CheckOutcome) -> String {
    match outcome {
        CheckOutcome::Allowed { .. } => "allow",
        CheckOutcome::Denied { .. } => "deny",
        CheckOutcome::Duplicate { .. } => "dup",
        CheckOutcome::Held { .. } => "held",
    }
    .to_owned()
}

/// A release takes the record of its own attempt only: another attempt under the same
/// request id (a retry after a 503, admitted meanwhile) keeps its count. On one Redis the
/// record counts at once (`~<digits>`), so it can be released but never committed.
#[tokio::test]
async fn a_release_takes_only_its_own_attempts_record() {
    use std::sync::Arc;
    use vigia::metrics::Metrics;
    use vigia::store::breaker::{Breaker, BreakerSettings};
    use vigia::store::redis::RELEASE_LUA;
    use vigia::store::redis_link::RedisLink;
    use vigia::store::release::{Release, Releaser, Settle};

    let server = RedisServer::start();
    let mut conn = server.conn();
    let check_lua = load(&mut conn, CHECK_LUA);
    let now = 1_000 * SEC;
    let key = "t:uid:u";
    let ttl = 900 * SEC;
    let call = CheckCall {
        records_key: "t:rq:uid:u",
        idempotency_key: None,
        request_id: "r1",
        dry_run: false,
        id_given: true,
        record_ttl_ms: ttl,
        now: Some(now),
        stamp: Some(Stamp::Attempt(7)),
    };
    let limits = [(key, Algorithm::SlidingWindow, 60 * SEC, 5, 60 * SEC)];
    let reply = run(&mut conn, &call.command(&check_lua, limits.into_iter()));
    let outcome = parse_check_reply(reply, 1).expect("a readable reply");
    assert_eq!(kind(&outcome), "allow");

    let breaker = Arc::new(Breaker::new("redis", BreakerSettings::default(), None));
    let link = RedisLink::open(&server.url(), 1_000, 1_000, breaker)
        .await
        .expect("link");
    let metrics = Metrics::new();
    let releaser = Releaser::start(link, Script::new(RELEASE_LUA), metrics.clone());
    let release = |stamp| Release {
        settle: Settle::Release,
        records_key: "t:rq:uid:u".into(),
        keys: vec![(key.into(), Algorithm::SlidingWindow)],
        request_id: "r1".into(),
        record_ttl_ms: ttl,
        idempotency_field: None,
        now: Some(now + SEC),
        stamp,
    };
    let count = |conn: &mut redis::Connection| -> u64 {
        redis::cmd("ZCARD").arg(key).query(conn).expect("ZCARD")
    };

    // Another attempt's stamp, and a reservation's with the same digits: nothing moves.
    releaser.release(release(Stamp::Attempt(8)));
    releaser.release(release(Stamp::Reservation(7)));
    releaser.settled().await;
    assert_eq!(
        count(&mut conn),
        1,
        "another attempt's release took r1's count"
    );
    // Its own: the unit and the record go.
    releaser.release(release(Stamp::Attempt(7)));
    releaser.settled().await;
    assert_eq!(
        count(&mut conn),
        0,
        "the attempt's own release gave nothing back"
    );
    let record: Option<String> = redis::cmd("HGET")
        .arg(format!("t:rq:uid:u:{}", now / ttl))
        .arg("r1")
        .query(&mut conn)
        .expect("HGET");
    assert_eq!(
        record, None,
        "the record is forgotten: r1 sent again is a new check"
    );
    let text = metrics.render();
    assert!(
        text.contains("vigia_store_releases_total{result=\"none\"} 2")
            && text.contains("vigia_store_releases_total{result=\"released\"} 1"),
        "{text}"
    );
}
