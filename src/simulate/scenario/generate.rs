//! Generating: a validated [`Scenario`] and a seed become traffic lines.
//!
//! Every population draws from its own ChaCha8 stream (the seed, with a stream number
//! made of the population's kind and position), so adding an attacker cohort leaves the
//! honest users' traffic exactly as it was: comparing two scenarios compares the attack,
//! not a reshuffled crowd. Whether each check's sender passes a challenge, and how long
//! solving it takes, is drawn when the line is written, from a second stream of its
//! population's: a file that gives no `rush` makes the same claims, at the same times, as
//! before challenges were modelled.
//!
//! A sender who passes takes [`SOLVE_MIN_MS`] to [`SOLVE_MAX_MS`]: a person reading a
//! captcha, or a solving service's queue. A double click's copy never answers a challenge:
//! the person answers the one on their screen, for the click it copies.
//!
//! Lines are kept as compact [`Record`]s (56 bytes, no strings) until they are
//! sorted; only then is each turned into JSON and written, one at a time, so a million
//! checks never exist as a million `serde_json::Value`s.

use std::collections::BTreeMap;
use std::io::{self, BufWriter, Write};
use std::net::IpAddr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};

use super::net;
use super::spec::{share_of, Attacker, Devices, Habits, Proxies, Scenario};
use crate::clock::rfc3339;
use crate::simulate::traffic::{Cohort, Entry, Line, OnChallenge};

const SECOND: u64 = 1_000;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;
const DAY: u64 = 24 * HOUR;

/// The quickest a challenge is passed, ms.
pub const SOLVE_MIN_MS: u64 = 4 * SECOND;
/// The slowest a challenge is passed, ms.
pub const SOLVE_MAX_MS: u64 = 40 * SECOND;

/// What was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// All lines: cohort lines, checks and events.
    pub lines: u64,
    /// Cohort lines: one per label with a cost.
    pub cohorts: u64,
    pub checks: u64,
    pub events: u64,
    /// Checks per population label (cohorts sharing a label add up).
    pub by_label: BTreeMap<String, u64>,
}

/// Writes the traffic of `scenario` for `seed` to `out`, in time order; returns what was
/// written. The same scenario and seed always give the same bytes.
pub fn write(scenario: &Scenario, seed: u64, out: &mut impl Write) -> io::Result<Summary> {
    let (populations, mut records) = generate(scenario, seed);
    // Stable: lines at the same instant keep their generation order. At one instant an
    // event goes before a check, so a payment delivered with a claim counts for it.
    records.sort_by_key(|r| (r.at_ms, matches!(r.kind, Kind::Check(_))));
    let mut out = BufWriter::new(out);
    let mut summary = Summary::default();
    for cohort in cohorts(scenario) {
        out.write_all(Entry::Cohort(cohort).to_json().as_bytes())?;
        out.write_all(b"\n")?;
        summary.lines += 1;
        summary.cohorts += 1;
    }
    // A population's own lines keep their order in the sorted file whatever else is in
    // it, so drawing from its stream in file order is as reproducible as at generation.
    let mut challenge_rngs: Vec<ChaCha8Rng> = populations
        .iter()
        .map(|p| rng_for(seed, CHALLENGES + p.stream.0, p.stream.1))
        .collect();
    for record in &records {
        let index = usize::from(record.population);
        let population = &populations[index];
        let entry = to_entry(scenario, population, record, &mut challenge_rngs[index]);
        out.write_all(entry.to_json().as_bytes())?;
        out.write_all(b"\n")?;
        summary.lines += 1;
        match record.kind {
            Kind::Check(_) => {
                summary.checks += 1;
                // Look up before inserting: one allocation per label, not per line.
                match summary.by_label.get_mut(population.label) {
                    Some(n) => *n += 1,
                    None => {
                        summary.by_label.insert(population.label.to_string(), 1);
                    }
                }
            }
            Kind::Payment => summary.events += 1,
        }
    }
    out.flush()?;
    Ok(summary)
}

/// A device as a record keeps it; its id is spelt out only when written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Device {
    /// A fingerprint of its own: `d` and 16 hex digits.
    Random(u64),
    /// Phone `k` of the population's farm.
    Farm(u32),
}

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A claim from this device.
    Check(Device),
    /// The user's `payment_succeeded` event.
    Payment,
}

/// One line before it is written.
#[derive(Debug, Clone, Copy)]
struct Record {
    at_ms: u64,
    /// A check's `user_created_at`, or a payment's `occurred_at`.
    when_ms: u64,
    kind: Kind,
    /// Unused by payments.
    ip: IpAddr,
    /// A double click's copy: how long after the click it copies, in 4 ms steps (0: not
    /// a copy). One byte keeps a record at 56 bytes.
    copy_after: u8,
    /// Index into the populations table.
    population: u16,
    user: u32,
}

/// What a record needs from its population to be written.
struct Population<'a> {
    label: &'a str,
    id_prefix: &'a str,
    /// Its stream: kind and position.
    stream: (u64, usize),
    /// The chance its members pass a challenge.
    challenge_pass: f64,
    /// The attacker cohort, which names its farm devices.
    cohort: usize,
    /// Real users' claims carry an idempotency key, `<user>-<ms of the click>`: each
    /// claim is one action of theirs, and a double click's copy carries its original's
    /// key, as the seed asks of a backend, so it is answered as that claim's repeat and
    /// consumes nothing. A script's tries are each a new action: no key.
    actions_keyed: bool,
}

/// Stream numbers: the population kind in the high half, its position in the low half.
const HONEST: u64 = 0;
const NAT: u64 = 1;
const ATTACKER: u64 = 2;
/// Added to a population's kind: the stream its challenge answers are drawn from.
const CHALLENGES: u64 = 3;

fn rng_for(seed: u64, kind: u64, index: usize) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream((kind << 32) | index as u64);
    rng
}

fn generate(scenario: &Scenario, seed: u64) -> (Vec<Population<'_>>, Vec<Record>) {
    let capacity = usize::try_from(scenario.checks()).unwrap_or(0);
    let mut records = Vec::with_capacity(capacity);
    let mut populations = Vec::new();
    if let Some(h) = &scenario.honest {
        let mut rng = rng_for(seed, HONEST, 0);
        let networks = net::residential_networks(&mut rng, h.networks);
        let home = |rng: &mut ChaCha8Rng| {
            let network = *pick(rng, &networks);
            net::home_address(rng, network)
        };
        let p = Crowd {
            scenario,
            population: populations.len() as u16,
            users: h.users,
            habits: &h.habits,
        };
        p.generate(&mut rng, home, &mut records);
        populations.push(Population {
            label: &h.label,
            id_prefix: &h.id_prefix,
            stream: (HONEST, 0),
            challenge_pass: h.habits.challenge_pass,
            cohort: 0,
            actions_keyed: true,
        });
    }
    for (i, n) in scenario.nats.iter().enumerate() {
        let mut rng = rng_for(seed, NAT, i);
        // Only as many addresses as there are users can ever be used.
        let shared = u128::from(n.addresses.min(n.users));
        let addresses: Vec<IpAddr> = net::sample_distinct(&mut rng, net::size(&n.cidr), shared)
            .into_iter()
            .map(|offset| net::nth(&n.cidr, offset))
            .collect();
        let shared = |rng: &mut ChaCha8Rng| *pick(rng, &addresses);
        let p = Crowd {
            scenario,
            population: populations.len() as u16,
            users: n.users,
            habits: &n.habits,
        };
        p.generate(&mut rng, shared, &mut records);
        populations.push(Population {
            label: &n.label,
            id_prefix: &n.id_prefix,
            stream: (NAT, i),
            challenge_pass: n.habits.challenge_pass,
            cohort: 0,
            actions_keyed: true,
        });
    }
    for (i, a) in scenario.attackers.iter().enumerate() {
        let mut rng = rng_for(seed, ATTACKER, i);
        attack(
            scenario,
            a,
            populations.len() as u16,
            &mut rng,
            &mut records,
        );
        populations.push(Population {
            label: &a.label,
            id_prefix: &a.id_prefix,
            stream: (ATTACKER, i),
            challenge_pass: a.challenge_pass,
            cohort: a.cohort,
            actions_keyed: false,
        });
    }
    (populations, records)
}

/// Honest users or a NAT's: people claiming from home or from behind one shared range.
struct Crowd<'a> {
    scenario: &'a Scenario,
    population: u16,
    users: u64,
    habits: &'a Habits,
}

impl Crowd<'_> {
    /// Appends the crowd's checks and payments; `address` gives a user's fixed address.
    fn generate(
        &self,
        rng: &mut ChaCha8Rng,
        mut address: impl FnMut(&mut ChaCha8Rng) -> IpAddr,
        out: &mut Vec<Record>,
    ) {
        let s = self.scenario;
        let h = self.habits;
        let n = self.users;
        let new = mask(rng, n, share_of(n, h.new_share));
        let double = mask(rng, n, share_of(n, h.double_click_share));
        // A payment weeks before the drop needs an account older than that: draw paid
        // users among the established ones only.
        let established: Vec<u32> = (0..n as u32).filter(|&u| !new[u as usize]).collect();
        let mut paid = vec![false; n as usize];
        let k = share_of(n, h.paid_share).min(established.len() as u64);
        for i in net::sample_distinct(rng, established.len() as u128, u128::from(k)) {
            paid[established[i as usize] as usize] = true;
        }
        // Drawn last, and only with a rush: a file without one keeps its stream as it was.
        let rushing = match &h.rush {
            Some(r) => mask(rng, n, share_of(n, r.share)),
            None => vec![false; n as usize],
        };
        let mut times = Vec::with_capacity(h.claims as usize);
        for user in 0..n as u32 {
            let u = user as usize;
            let ip = address(rng);
            let device = Device::Random(rng.random());
            // A rusher's claims all fall in the opening minutes.
            let within = match &h.rush {
                Some(r) if rushing[u] => r.within_ms,
                _ => s.span_ms,
            };
            times.clear();
            times.extend((0..h.claims).map(|_| s.start_ms + rng.random_range(0..within)));
            let first = times.iter().copied().min().unwrap_or(s.start_ms);
            let created_ms = if new[u] {
                first.saturating_sub(rng.random_range(10 * MINUTE..=DAY))
            } else {
                s.start_ms
                    .saturating_sub(rng.random_range(60 * DAY..=3 * 365 * DAY))
            };
            let check = |at_ms, copy_after| Record {
                at_ms,
                when_ms: created_ms,
                kind: Kind::Check(device),
                copy_after,
                ip,
                population: self.population,
                user,
            };
            for &at in &times {
                out.push(check(at, 0));
                if double[u] {
                    // Same body and idempotency key; the replayer gives each its own
                    // request id.
                    // 152 to 600 ms later.
                    let after = rng.random_range(38..=150u8);
                    out.push(check(at + 4 * u64::from(after), after));
                }
            }
            if paid[u] {
                let occurred = s.start_ms.saturating_sub(rng.random_range(DAY..=25 * DAY));
                out.push(payment(s, self.population, user, occurred));
            }
        }
    }
}

/// Appends an attacker cohort's tries and payments.
fn attack(
    s: &Scenario,
    a: &Attacker,
    population: u16,
    rng: &mut ChaCha8Rng,
    out: &mut Vec<Record>,
) {
    let paid = mask(rng, a.accounts, share_of(a.accounts, a.paid_share));
    let pool = match &a.proxies {
        Proxies::RandomNetworks(n) => net::residential_networks(rng, *n),
        Proxies::Cidrs(_) | Proxies::Addresses(_) => Vec::new(),
    };
    let deliver = s.start_ms.saturating_sub(HOUR);
    for account in 0..a.accounts as u32 {
        let device = match a.devices {
            Devices::Farm(phones) => Device::Farm((u64::from(account) % phones) as u32),
            Devices::PerAccount => Device::Random(rng.random()),
        };
        let age = a.account_age_ms as f64 * rng.random_range(0.9..1.1);
        let created_ms = s.start_ms.saturating_sub(age as u64);
        let mut at = s.start_ms + rng.random_range(0..a.arrive_within_ms);
        for attempt in 0..a.tries {
            if attempt > 0 {
                at += a.interval_ms + rng.random_range(0..SECOND);
            }
            out.push(Record {
                at_ms: at,
                when_ms: created_ms,
                kind: Kind::Check(device),
                copy_after: 0,
                ip: proxy(rng, &a.proxies, &pool),
                population,
                user: account,
            });
        }
        if paid[account as usize] {
            // A farm buying something cheap to look trusted: after the account exists,
            // before the batch is delivered (validation keeps that interval non-empty).
            let occurred = rng.random_range(created_ms..deliver.max(created_ms + 1));
            out.push(payment(s, population, account, occurred));
        }
    }
}

/// The address one attacker try comes from.
fn proxy(rng: &mut ChaCha8Rng, proxies: &Proxies, pool: &[u32]) -> IpAddr {
    match proxies {
        Proxies::Cidrs(nets) => {
            let net = pick(rng, nets);
            net::random_in(rng, net)
        }
        Proxies::Addresses(addresses) => *pick(rng, addresses),
        Proxies::RandomNetworks(_) => {
            let network = *pick(rng, pool);
            net::home_address(rng, network)
        }
    }
}

/// A payment event, delivered with all the others an hour before the drop opens.
fn payment(s: &Scenario, population: u16, user: u32, occurred_ms: u64) -> Record {
    Record {
        at_ms: s.start_ms.saturating_sub(HOUR),
        when_ms: occurred_ms,
        kind: Kind::Payment,
        ip: IpAddr::from([0, 0, 0, 0]),
        copy_after: 0,
        population,
        user,
    }
}

/// A uniformly random element of `items`, which validation keeps non-empty (every list
/// a population draws from has at least one entry). Drawn as a `u64` so the stream is
/// the same on 32- and 64-bit targets.
fn pick<'a, T>(rng: &mut ChaCha8Rng, items: &'a [T]) -> &'a T {
    &items[rng.random_range(0..items.len() as u64) as usize]
}

/// `k` of `n` members, chosen at random.
fn mask(rng: &mut ChaCha8Rng, n: u64, k: u64) -> Vec<bool> {
    let mut chosen = vec![false; n as usize];
    for i in net::sample_distinct(rng, u128::from(n), u128::from(k)) {
        chosen[i as usize] = true;
    }
    chosen
}

/// One cohort line per label with a cost, in file order (validation gives cohorts that
/// share a label one cost).
fn cohorts(s: &Scenario) -> Vec<Cohort> {
    let mut out: Vec<Cohort> = Vec::new();
    for a in &s.attackers {
        if let Some(cost) = a.cost {
            if !out.iter().any(|c| c.label == a.label) {
                out.push(Cohort {
                    label: a.label.clone(),
                    cost,
                });
            }
        }
    }
    out
}

/// A record as a line, with its sender's answer to a challenge drawn from `rng`.
fn to_entry(s: &Scenario, p: &Population<'_>, r: &Record, rng: &mut ChaCha8Rng) -> Entry {
    let line = to_line(s, p, r);
    let on_challenge = match r.kind {
        Kind::Payment => None,
        Kind::Check(_) if r.copy_after > 0 => Some(OnChallenge::GiveUp),
        Kind::Check(_) => Some(if rng.random_bool(p.challenge_pass) {
            OnChallenge::Pass {
                solve_ms: rng.random_range(SOLVE_MIN_MS..=SOLVE_MAX_MS),
            }
        } else {
            OnChallenge::GiveUp
        }),
    };
    Entry::Happens { line, on_challenge }
}

fn to_line(s: &Scenario, p: &Population<'_>, r: &Record) -> Line {
    let user_id = format!("{}-{:06}", p.id_prefix, r.user);
    match r.kind {
        Kind::Check(device) => {
            let device_id = match device {
                Device::Random(bits) => format!("d{bits:016x}"),
                Device::Farm(k) => format!("farm{}-{k:05}", p.cohort),
            };
            // Inserted in the order a backend would write them; serde_json keeps keys
            // sorted unless built with `preserve_order`, and either order is stable.
            let mut check = Map::new();
            check.insert("scene".into(), Value::String(s.scene.clone()));
            check.insert("user_id".into(), Value::String(user_id.clone()));
            check.insert("device_id".into(), Value::String(device_id));
            check.insert("ip".into(), Value::String(r.ip.to_string()));
            check.insert("user_created_at".into(), Value::String(rfc3339(r.when_ms)));
            if let Some(activity) = &s.activity_id {
                check.insert("activity_id".into(), Value::String(activity.clone()));
            }
            if p.actions_keyed {
                let original = r.at_ms - 4 * u64::from(r.copy_after);
                check.insert(
                    "idempotency_key".into(),
                    Value::String(format!("{user_id}-{original}")),
                );
            }
            Line::Check {
                at_ms: r.at_ms,
                label: Some(p.label.to_string()),
                check: Value::Object(check),
                decision: None,
            }
        }
        Kind::Payment => Line::Event {
            at_ms: r.at_ms,
            event: json!({
                "event_id": format!("pay-{user_id}"),
                "type": "payment_succeeded",
                "user_id": user_id,
                "occurred_at": rfc3339(r.when_ms),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_records_stay_compact() {
        // The in-memory cost of a line while sorting; MAX_CHECKS is sized by it.
        assert!(
            std::mem::size_of::<Record>() <= 56,
            "{}",
            std::mem::size_of::<Record>()
        );
    }
}
