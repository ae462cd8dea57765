//! How one check with trust, signals or a score is split over a Redis Cluster: which slot
//! group runs which signals and limits, which group reads which fact, and in which round
//! each group's script can run.
//!
//! A fact lives where its key lives: the user's points and first sighting in the user's
//! slot, the device's first sighting in the device's. A group whose signal or limit
//! depends on a fact held elsewhere (`where = "new_account"` on a network's signal, a
//! per-user limit's new-account share, a trust bonus) cannot decide before that fact is
//! read. So the groups run in rounds: the first round is every group that needs no
//! foreign fact (the facts' own groups among them, as their script reads them anyway);
//! the next, the groups whose facts are now known, given those facts as arguments. The
//! shipped coupon_claim takes two: the user, device and address groups, then the network
//! and the scene-wide groups, whose new-account signals need the user's age. Unless the
//! request gives `user_created_at`: the age is then that date's, and a group that needs
//! it reckons it itself, in the first round (one round trip for the shipped scene).
//!
//! When no group can go first (the user's group needs the device's age and the device's
//! group the user's), a prelude reads the facts in a dry run (writing nothing), and every
//! group then runs in one round. Pure: no I/O, so it is tested here on plans.

use super::redis::GivenFacts;
use super::{CheckPlan, Facts};
use crate::keys::{slot, slot_groups, SlotGroup};
use crate::rules::Filter;

/// A fact a group may read or need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fact {
    Points,
    NewAccount,
    NewDevice,
}

impl Fact {
    const ALL: [Fact; 3] = [Fact::Points, Fact::NewAccount, Fact::NewDevice];

    fn index(self) -> usize {
        self as usize
    }

    /// The fact a filter reads.
    fn of(filter: Filter) -> Fact {
        match filter {
            // A pass is kept with the points.
            Filter::Untrusted | Filter::Unverified => Fact::Points,
            Filter::NewAccount => Fact::NewAccount,
            Filter::NewDevice => Fact::NewDevice,
        }
    }
}

/// One slot group's share of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ClusterGroup {
    pub place: SlotGroup,
    /// The plan's indices of the signals and limits whose keys are in this slot.
    pub signals: Vec<usize>,
    pub limits: Vec<usize>,
    /// The trust keys in this slot: its script reads (and records) those facts.
    pub holds_points: bool,
    pub holds_user_seen: bool,
    pub holds_device_seen: bool,
    /// Facts read in another group that this one's signals or limits depend on.
    pub needs: Vec<Fact>,
    /// It depends on the user's age, held in another slot, and the request gave the
    /// user's creation date: it reckons the age itself (no need, no later round).
    pub age_from_created: bool,
    /// Its script is sent the trust block: it reads a fact, or something in it depends
    /// on one. Without it the script reads no points and no age, and a group that holds
    /// no trust key and nothing depending on one answers the same for less (no 11
    /// trust arguments, 3 stand-in keys, 2 arguments per limit).
    pub trust: bool,
}

/// How a check runs: its groups, and the rounds (indices into `groups`) in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Layout {
    pub groups: Vec<ClusterGroup>,
    /// Groups whose facts a dry run reads before the rounds (only when the groups'
    /// needs go round in a circle); empty otherwise.
    pub prelude: Vec<usize>,
    pub rounds: Vec<Vec<usize>>,
    /// The group whose script reads each fact ([`Fact`] order); `None` when no key
    /// holds it (no user, no device, or the rules never ask): every group then reads the
    /// same default (no points, age unknown).
    pub homes: [Option<usize>; 3],
}

impl Layout {
    /// Lays out `plan` over its slot groups. Errs naming a key without a hash tag, or a
    /// signal whose keys are not in one slot (keys on a cluster are placed by entity).
    pub fn of(plan: &CheckPlan) -> Result<Layout, String> {
        let trust = plan.trust.as_ref();
        let trust_keys: Vec<&str> = trust
            .map(|t| [&t.points_key, &t.user_seen_key, &t.device_seen_key])
            .into_iter()
            .flatten()
            .filter_map(|k| k.as_deref())
            .collect();
        for s in &plan.signals {
            for other in [&s.all_key, &s.last_key].into_iter().flatten() {
                if slot(other) != slot(&s.key) {
                    return Err(format!(
                        "signal {:?}: {other} and {} are in different slots",
                        s.name, s.key
                    ));
                }
            }
        }
        let keys = trust_keys
            .iter()
            .copied()
            .chain(plan.signals.iter().map(|s| s.key.as_str()))
            .chain(plan.limits.iter().map(|l| l.key.as_str()));
        let (n_trust, n_signals) = (trust_keys.len(), plan.signals.len());
        let mut groups: Vec<ClusterGroup> = slot_groups(&plan.records_key, keys)?
            .into_iter()
            .map(|place| {
                let mut g = ClusterGroup {
                    signals: Vec::new(),
                    limits: Vec::new(),
                    holds_points: false,
                    holds_user_seen: false,
                    holds_device_seen: false,
                    needs: Vec::new(),
                    age_from_created: false,
                    trust: false,
                    place,
                };
                for &m in &g.place.members {
                    if m < n_trust {
                        let key = Some(trust_keys[m].to_string());
                        let t = trust.expect("trust keys come from the trust plan");
                        g.holds_points |= t.points_key == key;
                        g.holds_user_seen |= t.user_seen_key == key;
                        g.holds_device_seen |= t.device_seen_key == key;
                    } else if m < n_trust + n_signals {
                        g.signals.push(m - n_trust);
                    } else {
                        g.limits.push(m - n_trust - n_signals);
                    }
                }
                g
            })
            .collect();

        let find = |pick: fn(&ClusterGroup) -> bool| groups.iter().position(pick);
        let homes = match trust {
            None => [None; 3],
            Some(t) => {
                let user = find(|g| g.holds_user_seen).or_else(|| find(|g| g.holds_points));
                [
                    find(|g| g.holds_points),
                    user.filter(|_| t.new_account.is_some()),
                    find(|g| g.holds_device_seen).filter(|_| t.new_device_ms.is_some()),
                ]
            }
        };
        let age_given = trust.is_some_and(|t| t.user_created_ms.is_some());
        for (i, g) in groups.iter_mut().enumerate() {
            let mut wants = [false; 3];
            for f in g.signals.iter().filter_map(|&s| plan.signals[s].filter) {
                wants[Fact::of(f).index()] = true;
            }
            for l in g.limits.iter().map(|&j| &plan.limits[j]) {
                if let Some(f) = l.filter {
                    wants[Fact::of(f).index()] = true;
                }
                wants[Fact::NewAccount.index()] |= l.per_user;
                wants[Fact::Points.index()] |= l.trust_bonus;
            }
            let foreign = |f: Fact| wants[f.index()] && homes[f.index()].is_some_and(|h| h != i);
            // A creation date in the request makes the user's age a sum anyone can do:
            // born = user_created_at, no sighting is read (as the user's slot does).
            g.age_from_created = foreign(Fact::NewAccount) && age_given;
            g.needs = Fact::ALL
                .into_iter()
                .filter(|&f| foreign(f) && !(f == Fact::NewAccount && age_given))
                .collect();
            g.trust = trust.is_some() && (homes.contains(&Some(i)) || wants.contains(&true));
        }

        let mut known = [false; 3];
        let mut left: Vec<usize> = (0..groups.len()).collect();
        let mut rounds = Vec::new();
        let mut prelude = Vec::new();
        while !left.is_empty() {
            let (ready, waiting): (Vec<usize>, Vec<usize>) = left
                .iter()
                .partition(|&&i| groups[i].needs.iter().all(|f| known[f.index()]));
            if ready.is_empty() {
                // A circle: read every fact first, then run everything at once.
                prelude = (0..groups.len())
                    .filter(|&i| homes.contains(&Some(i)))
                    .collect();
                rounds = vec![(0..groups.len()).collect()];
                break;
            }
            for f in Fact::ALL {
                if homes[f.index()].is_some_and(|h| ready.contains(&h)) {
                    known[f.index()] = true;
                }
            }
            rounds.push(ready);
            left = waiting;
        }
        Ok(Layout {
            groups,
            prelude,
            rounds,
            homes,
        })
    }

    /// What group `i` is given of `facts` (those read so far): every fact it needs and
    /// does not read itself.
    pub fn given(&self, i: usize, facts: &Known) -> GivenFacts {
        let g = &self.groups[i];
        let needs = |f: Fact| g.needs.contains(&f);
        GivenFacts {
            points: facts.points.filter(|_| needs(Fact::Points)),
            new_account: facts.new_account.filter(|_| needs(Fact::NewAccount)),
            new_device: facts.new_device.filter(|_| needs(Fact::NewDevice)),
            passed: facts.passed.filter(|_| needs(Fact::Points)),
            age_from_created: g.age_from_created,
        }
    }

    /// Takes the facts group `i` read (its script's answer) into `known`.
    pub fn learn(&self, i: usize, read: &Facts, known: &mut Known) {
        if self.homes[Fact::Points.index()] == Some(i) {
            known.points = Some(read.points);
            // Passes are kept with the points.
            known.passed = Some(read.passed);
        }
        if self.homes[Fact::NewAccount.index()] == Some(i) {
            known.new_account = Some(read.new_account);
        }
        if self.homes[Fact::NewDevice.index()] == Some(i) {
            known.new_device = Some(read.new_device);
        }
    }
}

/// The facts read so far in one check (`None`: not yet).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Known {
    pub points: Option<u32>,
    pub new_account: Option<Option<bool>>,
    pub new_device: Option<Option<bool>>,
    pub passed: Option<Option<bool>>,
}

impl Known {
    /// The check's facts: each as its group read it, the default where no group holds it.
    pub fn facts(&self) -> Facts {
        Facts {
            points: self.points.unwrap_or(0),
            new_account: self.new_account.flatten(),
            new_device: self.new_device.flatten(),
            passed: self.passed.flatten(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::check::plan::plan;
    use crate::check::request::parse_check;
    use crate::keys::KeyPrefix;
    use crate::rules::load_dir;

    /// The layout of one check of `scene` under the rules in `dir`, on a cluster.
    fn layout_of(dir: &Path, body: serde_json::Value) -> (CheckPlan, Layout) {
        let rules = load_dir(dir).expect("rules load");
        let req = parse_check(&rules, &body, 1_700_000_000_000).expect("a valid check");
        let (plan, _) = plan(&KeyPrefix::tagged("lt"), &rules, &req, 86_400_000);
        let layout = Layout::of(&plan).expect("a layout");
        (plan, layout)
    }

    /// The tag of each group in a round, to read layouts by entity.
    fn tags(layout: &Layout, round: &[usize]) -> Vec<String> {
        round
            .iter()
            .map(|&i| {
                let key = &layout.groups[i].place.records_key;
                crate::keys::hash_tag(key).unwrap_or(key).to_string()
            })
            .collect()
    }

    #[test]
    fn the_shipped_coupon_claim_waits_for_the_users_age_in_a_second_round() {
        let (plan, layout) = layout_of(
            Path::new("rules"),
            serde_json::json!({
                "scene": "coupon_claim", "request_id": "r1", "user_id": "10086",
                "device_id": "dev-12345678", "ip": "203.0.113.7",
            }),
        );
        assert!(layout.prelude.is_empty());
        assert_eq!(layout.rounds.len(), 2, "{layout:#?}");
        assert_eq!(
            tags(&layout, &layout.rounds[0]),
            ["uid:10086", "did:dev-12345678", "ip:203.0.113.7"]
        );
        assert_eq!(
            tags(&layout, &layout.rounds[1]),
            ["net:203.0.113.0%2F24", "coupon_claim"]
        );
        // The user's group reads the user's facts; the others are given them.
        let user = &layout.groups[0];
        assert!(user.place.main && user.holds_points && user.holds_user_seen);
        assert_eq!(layout.homes[Fact::NewAccount.index()], Some(0));
        for &i in &layout.rounds[1] {
            assert_eq!(layout.groups[i].needs, [Fact::NewAccount]);
        }
        // The trust block goes where a fact is read or used: not to the device's group
        // (no rule asks a device's age) nor the address's.
        let trusting: Vec<bool> = layout.groups.iter().map(|g| g.trust).collect();
        assert_eq!(trusting, [true, false, false, true, true]);
        // Every signal and limit is in exactly one group.
        let mut signals: Vec<usize> = layout
            .groups
            .iter()
            .flat_map(|g| g.signals.clone())
            .collect();
        let mut limits: Vec<usize> = layout
            .groups
            .iter()
            .flat_map(|g| g.limits.clone())
            .collect();
        signals.sort_unstable();
        limits.sort_unstable();
        assert_eq!(signals, (0..plan.signals.len()).collect::<Vec<_>>());
        assert_eq!(limits, (0..plan.limits.len()).collect::<Vec<_>>());

        // Given: only what a group needs, once read.
        let mut known = Known::default();
        let net = layout.rounds[1][0];
        assert_eq!(layout.given(net, &known), GivenFacts::default());
        let read = Facts {
            points: 2,
            new_account: Some(true),
            new_device: None,
            passed: None,
        };
        layout.learn(0, &read, &mut known);
        assert_eq!(
            layout.given(net, &known),
            GivenFacts {
                points: None,
                new_account: Some(Some(true)),
                new_device: None,
                passed: None,
                age_from_created: false,
            }
        );
        assert_eq!(known.facts(), read);
    }

    #[test]
    fn groups_needing_each_others_facts_read_them_first_then_run_at_once() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(
            dir.path().join("facts.toml"),
            include_str!("../../tests/fixtures/cluster/facts.toml"),
        )
        .expect("rules file");
        let (_, layout) = layout_of(
            dir.path(),
            serde_json::json!({
                "scene": "facts", "request_id": "r1", "user_id": "u1",
                "device_id": "dev-12345678", "ip": "203.0.113.7",
            }),
        );
        assert_eq!(
            layout.rounds,
            [(0..layout.groups.len()).collect::<Vec<_>>()]
        );
        let homes: Vec<usize> = layout.homes.iter().flatten().copied().collect();
        let mut prelude = layout.prelude.clone();
        prelude.sort_unstable();
        let mut expected = homes.clone();
        expected.sort_unstable();
        expected.dedup();
        assert_eq!(prelude, expected, "the user's and the device's groups");
        assert_eq!(
            tags(&layout, &layout.prelude),
            ["uid:u1", "did:dev-12345678"]
        );
    }

    #[test]
    fn without_a_users_keys_nothing_waits_for_an_age() {
        // The user's age is then unknown in every group alike: nobody waits for it.
        let (mut plan, _) = layout_of(
            Path::new("rules"),
            serde_json::json!({
                "scene": "coupon_claim", "request_id": "r1", "user_id": "10086",
                "device_id": "dev-12345678", "ip": "203.0.113.7",
            }),
        );
        let trust = plan.trust.as_mut().expect("[trust]");
        trust.points_key = None;
        trust.user_seen_key = None;
        let layout = Layout::of(&plan).expect("a layout");
        assert_eq!(layout.rounds.len(), 1, "{layout:#?}");
        assert!(layout.prelude.is_empty());
        assert_eq!(layout.homes[Fact::NewAccount.index()], None);
    }

    #[test]
    fn a_creation_date_in_the_request_lets_every_group_run_in_one_round() {
        let (_, layout) = layout_of(
            Path::new("rules"),
            serde_json::json!({
                "scene": "coupon_claim", "request_id": "r1", "user_id": "10086",
                "device_id": "dev-12345678", "ip": "203.0.113.7",
                "user_created_at": "2026-01-01T00:00:00Z",
            }),
        );
        assert!(layout.prelude.is_empty());
        assert_eq!(layout.rounds.len(), 1, "{layout:#?}");
        // The network's and the scene's groups reckon the age themselves; the user's
        // group still reads it (and reports it).
        assert_eq!(layout.homes[Fact::NewAccount.index()], Some(0));
        let reckoning: Vec<bool> = layout.groups.iter().map(|g| g.age_from_created).collect();
        assert_eq!(reckoning, [false, false, false, true, true]);
        assert!(layout.groups.iter().all(|g| g.needs.is_empty()));
        let given = layout.given(3, &Known::default());
        assert!(given.age_from_created && given.new_account.is_none());
    }
}
