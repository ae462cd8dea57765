//! The signal math on plain values: every count, the window edges, caps, shares, switches,
//! dry runs, shape changes and the snapshot encoding.

use super::*;
use crate::signal::{member_of, signal_cap};

const MIN: u64 = 60_000;
const T0: u64 = 1_700_000_000_000;

fn spec(count: Count, window_ms: u64, max: u64, min_share: Option<f64>) -> SignalSpec {
    let switches = count == Count::UserSwitches;
    SignalSpec {
        switches,
        shared: !switches && min_share.is_some(),
        window_ms,
        max,
        min_share,
        cap: signal_cap(max, min_share) as u32,
    }
}

fn distinct(window_ms: u64, max: u64) -> SignalSpec {
    spec(Count::Users, window_ms, max, None)
}

fn switches(window_ms: u64, max: u64) -> SignalSpec {
    spec(Count::UserSwitches, window_ms, max, None)
}

/// Records and returns the value.
fn see(s: &mut SignalState, spec: &SignalSpec, member: u64, now: u64) -> u64 {
    s.observe(spec, member, true, now).value
}

#[test]
fn spec_follows_the_plan_and_clamps_the_cap() {
    let plan = SignalPlan {
        name: "new_on_net".into(),
        key: "vg:s:sg:new_on_net:n".into(),
        all_key: Some("vg:s:sa:new_on_net:n".into()),
        last_key: None,
        count: Count::Users,
        member: "00000000000000aa".into(),
        filter: Some(crate::rules::Filter::NewAccount),
        window_ms: MIN,
        max: 5,
        min_share: Some(0.5),
        cap: 24,
    };
    let s = SignalSpec::of(&plan);
    assert!(s.shared && !s.switches);
    assert_eq!((s.window_ms, s.max, s.cap), (MIN, 5, 24));
    let huge = SignalSpec::of(&SignalPlan {
        cap: u64::MAX,
        ..plan.clone()
    });
    assert_eq!(u64::from(huge.cap), MAX_CAP);
    assert_eq!(SignalSpec::of(&SignalPlan { cap: 0, ..plan }).cap, 1);
}

#[test]
fn distinct_members_count_once_and_the_current_request_counts() {
    let sp = distinct(10 * MIN, 5);
    let mut s = SignalState::new();
    assert_eq!(see(&mut s, &sp, 1, T0), 1, "the request itself");
    assert_eq!(see(&mut s, &sp, 1, T0 + 1), 1, "a repeat adds nothing");
    assert_eq!(see(&mut s, &sp, 2, T0 + 2), 2);
    assert_eq!(see(&mut s, &sp, 1, T0 + 3), 2);
    assert_eq!(s.len(), 2);
}

#[test]
fn a_member_counts_until_it_is_window_old() {
    let sp = distinct(1_000, 5);
    let mut s = SignalState::new();
    see(&mut s, &sp, 1, 10_000);
    assert_eq!(
        see(&mut s, &sp, 2, 10_999),
        2,
        "1 is inside at window - 1 ms"
    );
    assert_eq!(see(&mut s, &sp, 3, 11_000), 2, "1 left exactly at window");
    // A repeat of an expired member is new again.
    assert_eq!(see(&mut s, &sp, 1, 11_000), 3);
    // A window reaching before time 0 counts everything.
    let mut early = SignalState::new();
    see(&mut early, &sp, 1, 0);
    assert_eq!(see(&mut early, &sp, 2, 999), 2);
    assert_eq!(see(&mut early, &sp, 3, 1_000), 2);
}

#[test]
fn a_refresh_keeps_a_repeat_visitor_inside() {
    let sp = distinct(1_000, 5);
    let mut s = SignalState::new();
    see(&mut s, &sp, 1, 0);
    see(&mut s, &sp, 2, 500);
    see(&mut s, &sp, 1, 900);
    assert_eq!(see(&mut s, &sp, 3, 1_400), 3, "1 was seen again at 900");
    assert_eq!(see(&mut s, &sp, 3, 1_500), 2, "2 (500) left");
}

#[test]
fn the_cap_saturates_and_evicts_the_least_recently_seen() {
    let sp = distinct(10 * MIN, 2); // cap 3
    assert_eq!(sp.cap, 3);
    let mut s = SignalState::new();
    let values: Vec<u64> = (1..=10).map(|m| see(&mut s, &sp, m, T0 + m)).collect();
    assert_eq!(values, [1, 2, 3, 3, 3, 3, 3, 3, 3, 3]);
    assert_eq!(s.len(), 3);
    assert!(
        s.peek(&sp, 11, true, T0 + 20).fired,
        "saturated is still over max"
    );
    // 8, 9, 10 are held: 8 is a repeat, 1 was evicted and is new again.
    assert_eq!(see(&mut s, &sp, 8, T0 + 21), 3);
    assert!(
        s.approx_bytes() <= size_of::<SignalState>() + 3 * 16,
        "never past the cap"
    );
}

#[test]
fn equal_times_evict_the_smallest_member_first_as_a_zset_does() {
    let sp = distinct(10 * MIN, 1); // cap 2
    let mut s = SignalState::new();
    for m in [0xc, 0xa, 0xb] {
        see(&mut s, &sp, m, T0);
    }
    let members = |s: &SignalState| -> Vec<u64> {
        let bytes = s.to_bytes();
        (0..s.len())
            .map(|i| {
                let at = 14 + 16 * i;
                u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
            })
            .collect()
    };
    // (T0, a), (T0, b), (T0, c) sort by member: b came in third and a left.
    assert_eq!(members(&s), [0xb, 0xc]);
    // A member smaller than all at the same time is itself the one that leaves (counted
    // first, as the script counts before its ZADD).
    assert_eq!(see(&mut s, &sp, 0x1, T0), 2);
    assert_eq!(members(&s), [0xb, 0xc]);
    assert_eq!(see(&mut s, &sp, 0xd, T0), 2);
    assert_eq!(members(&s), [0xc, 0xd]);
}

#[test]
fn a_signal_that_does_not_apply_has_no_value_and_records_nothing() {
    let sp = distinct(10 * MIN, 3);
    let mut s = SignalState::new();
    see(&mut s, &sp, 1, T0);
    let before = s.clone();
    let got = s.observe(&sp, 2, false, T0 + 1);
    assert_eq!(
        got,
        SignalValue {
            applies: false,
            value: 0,
            share: None,
            fired: false
        }
    );
    assert_eq!(s, before);
    assert_eq!(see(&mut s, &sp, 3, T0 + 2), 2, "2 was not counted");
}

#[test]
fn requests_count_every_request() {
    let sp = spec(Count::Requests, MIN, 2, None);
    let mut s = SignalState::new();
    let fired: Vec<bool> = (0..4)
        .map(|i| {
            s.observe(&sp, member_of(&format!("req-{i}")), true, T0)
                .fired
        })
        .collect();
    assert_eq!(fired, [false, false, true, true]);
    assert_eq!(s.peek(&sp, member_of("req-9"), true, T0 + MIN).value, 1);
}

/// Twenty new accounts on a network where almost nobody else signs in: they are the
/// network. Twenty new accounts on a campus among two hundred old ones: they are not.
#[test]
fn min_share_tells_a_farm_from_a_campus() {
    let sp = spec(Count::Users, 10 * MIN, 10, Some(0.5));
    assert_eq!(sp.cap, 44);
    let mut farm = SignalState::new();
    let mut last = None;
    for u in 0..20u64 {
        last = Some(farm.observe(&sp, u, true, T0 + u));
    }
    for old in 100..104u64 {
        farm.observe(&sp, old, false, T0 + old);
    }
    let got = farm.observe(&sp, 20, true, T0 + 200);
    assert_eq!(got.value, 21);
    assert_eq!(got.share, Some(share(21, 25)));
    assert!(got.fired);
    assert!(last.is_some_and(|v| v.fired), "20 of 20 fired too");

    let mut campus = SignalState::new();
    for old in 1_000..1_200u64 {
        campus.observe(&sp, old, false, T0 + old);
    }
    let mut got = None;
    for u in 0..21u64 {
        got = Some(campus.observe(&sp, u, true, T0 + 2_000 + u));
    }
    let got = got.expect("observed");
    assert_eq!(got.value, 21, "the same number of new accounts");
    // The all set keeps its cap, 44: the newest 44 are 21 new and 23 old.
    assert_eq!(got.share, Some(share(21, 44)));
    assert!(!got.fired, "21 of the 44 most recent is under half");

    // Interleaved, as a campus really is: new accounts are a small share of the recent.
    let mut mixed = SignalState::new();
    let mut got = None;
    let mut t = T0;
    for u in 0..21u64 {
        for old in 0..10u64 {
            t += 1;
            mixed.observe(&sp, 1_000 + u * 10 + old, false, t);
        }
        t += 1;
        got = Some(mixed.observe(&sp, u, true, t));
    }
    let got = got.expect("observed");
    assert_eq!(
        got.value, 4,
        "what left the all set left the signal's set too"
    );
    assert!(got.share.is_some_and(|s| s < 0.5));
    assert!(!got.fired);
}

#[test]
fn eviction_from_the_all_set_removes_from_both() {
    let sp = SignalSpec {
        cap: 3,
        ..spec(Count::Users, 10 * MIN, 1, Some(0.5))
    };
    let mut s = SignalState::new();
    s.observe(&sp, 1, true, T0);
    s.observe(&sp, 2, false, T0 + 1);
    s.observe(&sp, 3, false, T0 + 2);
    assert_eq!((s.len(), s.all_len()), (1, 3));
    // 4 pushes 1, the least recently seen, out of the all set: and out of the signal's.
    let got = s.observe(&sp, 4, false, T0 + 3);
    assert!(!got.applies);
    assert_eq!((s.len(), s.all_len()), (0, 3));
    let got = s.observe(&sp, 5, true, T0 + 4);
    assert_eq!(got.value, 1, "1 is gone, 5 is this one");
    assert_eq!(got.share, Some(share(1, 3)));
    assert!(!got.fired);
}

/// The recording evicts from a full all set (and so from the signal's set) before it
/// counts the signal's set; the dry run evicts nothing but leaves out of its count what
/// that eviction would take, so it answers the same (the script's dry run too).
#[test]
fn a_dry_run_foresees_the_eviction_from_the_all_set() {
    let sp = SignalSpec {
        cap: 3,
        ..spec(Count::Users, 10 * MIN, 1, Some(0.5))
    };
    let mut s = SignalState::new();
    s.observe(&sp, 1, true, T0);
    s.observe(&sp, 2, false, T0 + 1);
    s.observe(&sp, 3, false, T0 + 2);
    let before = s.clone();
    assert_eq!(s.peek(&sp, 4, true, T0 + 3).value, 1, "1 would leave");
    assert_eq!(s, before, "and has not");
    let recorded = s.observe(&sp, 4, true, T0 + 3);
    assert_eq!(
        recorded.value, 1,
        "recording 4 pushed 1 out of both sets first"
    );

    // Ties within one millisecond go by member, the new one included: recorded at the
    // time of the others and smaller than all, it is the one evicted, and 0xa stays.
    let mut s = SignalState::new();
    s.observe(&sp, 0xa, true, T0);
    s.observe(&sp, 0xb, false, T0);
    s.observe(&sp, 0xc, false, T0);
    let dry = s.peek(&sp, 0x1, true, T0);
    let recorded = s.observe(&sp, 0x1, true, T0);
    assert_eq!((recorded.value, recorded.share), (2, Some(share(2, 3))));
    assert_eq!(dry, recorded);
    assert_eq!(
        (s.len(), s.all_len()),
        (2, 3),
        "0x1 left the all set at once"
    );
    // 0xd sorts last: 0xa, the oldest, is evicted from both.
    assert_eq!(s.peek(&sp, 0xd, true, T0).value, 2, "0xa would leave");
    let recorded = s.observe(&sp, 0xd, true, T0);
    assert_eq!(recorded.value, 2, "0x1 and 0xd");
}

#[test]
fn share_without_an_all_set_is_zero() {
    let sp = SignalSpec {
        shared: false,
        ..spec(Count::Users, MIN, 0, Some(0.5))
    };
    let got = SignalState::new().observe(&sp, 1, true, T0);
    assert_eq!((got.value, got.share, got.fired), (1, Some(0.0), false));
}

#[test]
fn switches_aaba_is_two_and_leave_with_the_window() {
    let sp = switches(10 * MIN, 5);
    let mut s = SignalState::new();
    let values: Vec<u64> = [1, 1, 2, 1]
        .into_iter()
        .enumerate()
        .map(|(i, u)| see(&mut s, &sp, u, T0 + i as u64 * MIN))
        .collect();
    assert_eq!(values, [0, 0, 1, 2]);
    // Switches at T0+2m and T0+3m; the last user (1) was set at T0+3m.
    assert_eq!(s.peek(&sp, 1, true, T0 + 12 * MIN - 1).value, 2);
    assert_eq!(
        s.peek(&sp, 1, true, T0 + 12 * MIN).value,
        1,
        "the first left"
    );
    assert_eq!(s.peek(&sp, 1, true, T0 + 13 * MIN - 1).value, 1);
    assert_eq!(
        s.peek(&sp, 2, true, T0 + 13 * MIN - 1).value,
        2,
        "the last user is still remembered: 2 is a switch"
    );
    assert_eq!(
        s.peek(&sp, 2, true, T0 + 13 * MIN).value,
        0,
        "a window after the last user was set, both it and the last switch are gone"
    );
}

#[test]
fn a_switch_that_does_not_apply_changes_nothing() {
    let sp = switches(10 * MIN, 0);
    let mut s = SignalState::new();
    see(&mut s, &sp, 1, T0);
    let before = s.to_bytes();
    let got = s.observe(&sp, 2, false, T0 + 1);
    assert!(!got.applies && !got.fired && got.value == 0);
    assert_eq!(s.to_bytes(), before);
    let got = s.observe(&sp, 1, true, T0 + 2);
    assert_eq!(got.value, 0, "2 never became the last user");
    assert!(!got.fired);
    let got = s.observe(&sp, 3, true, T0 + 3);
    assert_eq!(got.value, 1);
    assert!(got.fired);
}

#[test]
fn switches_saturate_at_the_cap() {
    let sp = switches(10 * MIN, 2); // cap 3
    let mut s = SignalState::new();
    let mut last = 0;
    for i in 0..10u64 {
        last = see(&mut s, &sp, i % 2, T0 + i);
    }
    assert_eq!(last, 3);
    assert_eq!(s.len(), 3);
}

#[test]
fn a_dry_run_answers_as_observe_and_changes_nothing() {
    // Every shape, a pseudo-random walk over few members and small caps, so that sets
    // fill, evict and tie within a millisecond: with an all set of 14 (more than the six
    // members) and of 3 (which evicts, from both sets).
    let specs = [
        distinct(5_000, 3),
        spec(Count::Nets, 2_000, 1, Some(0.3)),
        SignalSpec {
            cap: 3,
            ..spec(Count::Nets, 2_000, 1, Some(0.3))
        },
        switches(3_000, 2),
    ];
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for sp in &specs {
        let mut s = SignalState::new();
        let mut now = T0;
        for _ in 0..2_000 {
            now += next() % 700 / 3;
            let (member, applies) = (next() % 6, next() % 3 != 0);
            let before = s.to_bytes();
            let dry = s.apply(sp, member, applies, now, true);
            assert_eq!(s.to_bytes(), before, "a dry run is byte-identical");
            let wet = s.apply(sp, member, applies, now, false);
            assert_eq!(dry, wet, "{sp:?} at {now}");
        }
    }
}

#[test]
fn a_changed_count_starts_afresh() {
    let users = distinct(MIN, 5);
    let sw = switches(MIN, 5);
    let mut s = SignalState::new();
    see(&mut s, &users, 1, T0);
    see(&mut s, &users, 2, T0);
    assert_eq!(s.peek(&sw, 3, true, T0).value, 0, "no last user yet");
    assert_eq!(see(&mut s, &sw, 3, T0), 0);
    assert_eq!(see(&mut s, &sw, 4, T0), 1);
    assert_eq!(s.peek(&users, 9, true, T0).value, 1);
    assert_eq!(see(&mut s, &users, 9, T0), 1);
    // Gaining an all set keeps the signal's set; losing it keeps the all set until it
    // empties, as the Redis keys would.
    let shared = spec(Count::Users, MIN, 5, Some(0.5));
    let got = s.observe(&shared, 10, true, T0 + 1);
    assert_eq!(got.value, 2);
    assert_eq!(
        got.share,
        Some(2.0),
        "the all set starts with this request; the signal's set predates it"
    );
    see(&mut s, &users, 11, T0 + 2);
    assert_eq!(s.all_len(), 1);
    s.trim(T0 + 1 + MIN);
    assert_eq!(s.all_len(), 0);
    assert!(!s.is_empty(), "11 is inside until T0 + 2 + window");
}

#[test]
fn trim_empties_by_the_last_recorded_window() {
    let mut s = SignalState::new();
    see(&mut s, &distinct(1_000, 5), 1, 0);
    see(&mut s, &distinct(1_000, 5), 2, 500);
    assert_eq!(s.window_ms(), 1_000);
    s.trim(1_000);
    assert_eq!(s.len(), 1);
    assert_eq!(s.last_seen(), Some(500));
    s.trim(1_500);
    assert!(s.is_empty());

    let sp = switches(1_000, 5);
    let mut sw = SignalState::new();
    see(&mut sw, &sp, 1, 0);
    see(&mut sw, &sp, 2, 100);
    see(&mut sw, &sp, 2, 800);
    sw.trim(1_100);
    assert_eq!(sw.len(), 0, "the switch at 100 left");
    assert!(!sw.is_empty(), "the last user (set at 800) is remembered");
    sw.trim(1_799);
    assert!(!sw.is_empty());
    sw.trim(1_800);
    assert!(sw.is_empty(), "forgotten a window after it was set");
}

fn samples() -> Vec<SignalState> {
    let mut distinct_state = SignalState::new();
    for m in [3u64, 1, 2, 1] {
        see(&mut distinct_state, &distinct(MIN, 9), m, T0 + m * 7);
    }
    let mut shared = SignalState::new();
    let sp = spec(Count::Ips, MIN, 3, Some(0.25));
    for m in 0..6u64 {
        shared.observe(&sp, m, m % 2 == 0, T0 + m);
    }
    let mut sw = SignalState::new();
    for (i, u) in [1u64, 2, 1, 1, 3].into_iter().enumerate() {
        see(&mut sw, &switches(MIN, 9), u, T0 + i as u64);
    }
    vec![SignalState::new(), distinct_state, shared, sw]
}

#[test]
fn snapshots_round_trip() {
    for s in samples() {
        let bytes = s.to_bytes();
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(bytes.len(), s.encoded_len());
        assert_eq!(SignalState::from_bytes(&bytes), Ok(s));
    }
}

#[test]
fn snapshots_refuse_truncated_long_and_foreign_bytes() {
    for s in samples() {
        let bytes = s.to_bytes();
        for n in 0..bytes.len() {
            assert_eq!(
                SignalState::from_bytes(&bytes[..n]),
                Err(DecodeError::Truncated),
                "prefix of {n} bytes"
            );
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(
            SignalState::from_bytes(&long),
            Err(DecodeError::TrailingBytes(1))
        );
        let mut v1 = bytes.clone();
        v1[0] = 1;
        assert_eq!(
            SignalState::from_bytes(&v1),
            Err(DecodeError::UnknownVersion(1))
        );
        let mut shape = bytes;
        shape[1] = b'D';
        assert!(matches!(
            SignalState::from_bytes(&shape),
            Err(DecodeError::Corrupt(_))
        ));
    }
    // A record of the removed per-device state (version 1, kind `D`) is refused by its
    // version.
    assert_eq!(
        SignalState::from_bytes(&[1, b'D', 0, 0, 0, 0]),
        Err(DecodeError::UnknownVersion(1))
    );
}

#[test]
fn snapshots_refuse_impossible_lengths_before_allocating() {
    let mut bytes = SignalState::new().to_bytes();
    bytes[10..14].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        SignalState::from_bytes(&bytes),
        Err(DecodeError::Corrupt(_))
    ));
    // Within the cap but not there: refused as truncated, before the Vec is made.
    bytes[10..14].copy_from_slice(&(MAX_CAP as u32).to_be_bytes());
    assert_eq!(SignalState::from_bytes(&bytes), Err(DecodeError::Truncated));
}

#[test]
fn snapshots_refuse_broken_invariants() {
    let sp = distinct(MIN, 9);
    let mut s = SignalState::new();
    see(&mut s, &sp, 1, T0);
    see(&mut s, &sp, 2, T0 + 1);
    let bytes = s.to_bytes();
    // Entries start at 14 (version, shape, window, length): member then time.
    let (first_at, second_at) = (14 + 8..14 + 16, 14 + 24..14 + 32);
    let mut unsorted = bytes.clone();
    let t1: [u8; 8] = bytes[first_at.clone()].try_into().expect("8 bytes");
    let t2: [u8; 8] = bytes[second_at.clone()].try_into().expect("8 bytes");
    unsorted[first_at].copy_from_slice(&t2);
    unsorted[second_at].copy_from_slice(&t1);
    assert_eq!(
        SignalState::from_bytes(&unsorted),
        Err(DecodeError::Corrupt(
            "set not sorted by last seen and member"
        ))
    );
    let mut twice = bytes;
    let m1: [u8; 8] = twice[14..22].try_into().expect("8 bytes");
    twice[30..38].copy_from_slice(&m1);
    assert_eq!(
        SignalState::from_bytes(&twice),
        Err(DecodeError::Corrupt("a member twice in one set"))
    );

    let mut sw = SignalState::new();
    for (i, u) in [1u64, 2, 1].into_iter().enumerate() {
        see(&mut sw, &switches(MIN, 9), u, T0 + i as u64);
    }
    let mut bytes = sw.to_bytes();
    // Times start at 30 (header 10, last user 16, length 4).
    let (a, b) = (30..38, 38..46);
    let ta: [u8; 8] = bytes[a.clone()].try_into().expect("8 bytes");
    let tb: [u8; 8] = bytes[b.clone()].try_into().expect("8 bytes");
    bytes[a].copy_from_slice(&tb);
    bytes[b].copy_from_slice(&ta);
    assert_eq!(
        SignalState::from_bytes(&bytes),
        Err(DecodeError::Corrupt("switch times not sorted"))
    );
}

#[test]
fn layout_sizes_are_as_documented() {
    assert_eq!(size_of::<Entry>(), 16);
    assert_eq!(size_of::<Sets>(), 48);
    assert_eq!(size_of::<SignalState>(), 56);
    let mut one = SignalState::new();
    see(&mut one, &distinct(MIN, 50), 1, T0);
    assert_eq!(one.approx_bytes(), 56 + 16, "one member, one slot");
    let mut sw = SignalState::new();
    see(&mut sw, &switches(MIN, 50), 1, T0);
    assert_eq!(
        sw.approx_bytes(),
        56,
        "the last user is inline; no switch yet"
    );
}
