//! Placement (spec §5.4): which lane an assignment that names none goes to, decided by a
//! versioned, deterministic policy over the declared roster and the lanes' current states.
//!
//! The roster is a declaration — per host its capacity, per lane the runtimes it is meant
//! for, its labels and the roles it is eligible for — and never authority: a placed
//! assignment is reserved by the same fenced CAS as one whose lane the operator named, and
//! that CAS alone decides whether the lane is free. The policy is a pure function of its
//! inputs (`select`); the inputs, their digest and the policy's digest are recorded with
//! the reservation (`placements`, migration 0028), so an audit recomputes the choice.
//!
//! **Never:** reads a clock or a random source (the same inputs select the same lane);
//! treats the roster or a host's word as permission to run; places on a lane the roster
//! does not declare.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The policy this build places by. A change to its rules is a new version.
pub const POLICY: &str = "placement@2";

/// What `placement@1` did, word for word (kept so its records are audited still).
const RULES_1: &str = "placement@1: a candidate is a lane the roster declares whose current \
incarnation the coordinator knows; it is eligible when its host is connected, advertises the \
requested runtime exactly, and the roster declares the runtime (or its family) for the lane; \
every requested label is declared on the lane with the same value; the requested role, if \
any, is among the lane's roles; the lane is reservable (IDLE_CLEAN, not retired, no recreate \
or host quarantine pending, no unreconciled receipt, no unended generation); and its host's \
busy lanes (neither IDLE_CLEAN nor QUARANTINED) are fewer than the host's declared capacity. \
Among the eligible, the one whose host has the fewest busy lanes wins; ties go to the \
smallest lane id.";

/// What `placement@2` does: `placement@1` over a candidate set that also holds the elastic
/// lanes of ACTIVE leases (their runtime, labels and role are their lease's), each
/// reservable only while its lease admits work.
const RULES_2: &str = "placement@2: a candidate is a lane the roster declares whose current \
incarnation the coordinator knows, or the lane of an ACTIVE lease on a host the roster \
declares (its runtime, labels and role are the lease's); it is eligible when its host is \
connected, advertises the requested runtime exactly, and the roster (or the lease) declares \
the runtime (or its family) for the lane; every requested label is declared on the lane with \
the same value; the requested role, if any, is among the lane's roles; the lane is reservable \
(IDLE_CLEAN, not retired, no recreate or host quarantine pending, no unreconciled receipt, no \
unended generation, a lease if any ACTIVE and unexpired); and its host's busy lanes (neither \
IDLE_CLEAN nor QUARANTINED) are fewer than the host's declared capacity. Among the eligible, \
the one whose host has the fewest busy lanes wins; ties go to the smallest lane id. With \
elastic placement and no eligible lane, a lane is leased on the first host the roster \
declares, by fewest busy lanes then host id, that is connected and whose lease the \
coordinator admits, and the policy decides again.";

/// The digest of a policy's rules (`None`: a policy this build does not know).
pub fn policy_digest_of(policy: &str) -> Option<String> {
    let rules = match policy {
        "placement@1" => RULES_1,
        "placement@2" => RULES_2,
        _ => return None,
    };
    Some(format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/placement-policy/v1", &[rules.as_bytes()])
    ))
}

/// The digest of `POLICY`'s rules.
pub fn policy_digest() -> String {
    policy_digest_of(POLICY).unwrap_or_default()
}

/// The declared roster: what each host's lanes are for. A declaration, never authority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Roster {
    #[serde(default)]
    pub hosts: Vec<RosterHost>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RosterHost {
    pub host_id: String,
    /// How many of its lanes may hold work at once.
    pub capacity: u32,
    #[serde(default)]
    pub lanes: Vec<RosterLane>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RosterLane {
    /// The lane's name on its host (`w1`: the lane id is `HOST:w1`).
    pub lane: String,
    /// Runtimes it is meant for: a family (`claude-code`) or an exact `family@version`.
    pub runtimes: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub roles: Vec<String>,
}

/// A name in a roster: a host id, lane name, label key or value, role.
pub(crate) fn name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A runtime as the roster or a request names it: `family` or `family@version`.
pub(crate) fn runtime_ok(s: &str) -> bool {
    match s.split_once('@') {
        None => name_ok(s),
        Some((family, version)) => {
            name_ok(family)
                && !version.is_empty()
                && version.len() <= 63
                && version.bytes().all(|b| b.is_ascii_graphic() && b != b'@')
        }
    }
}

impl Roster {
    /// Checks the declaration before anything is written; the first problem, named.
    pub fn validate(&self) -> Result<(), String> {
        let mut hosts = BTreeSet::new();
        for h in &self.hosts {
            if !name_ok(&h.host_id) {
                return Err(format!(
                    "host id {:?}: 1–63 of A-Z a-z 0-9 - _ .",
                    h.host_id
                ));
            }
            if !hosts.insert(&h.host_id) {
                return Err(format!("host {} is declared twice", h.host_id));
            }
            if !(1..=1024).contains(&h.capacity) {
                return Err(format!("host {}: capacity must be 1..1024", h.host_id));
            }
            let mut lanes = BTreeSet::new();
            for l in &h.lanes {
                let at = format!("lane {}:{}", h.host_id, l.lane);
                if !name_ok(&l.lane) {
                    return Err(format!("{at}: a lane name is 1–63 of A-Z a-z 0-9 - _ ."));
                }
                if !lanes.insert(&l.lane) {
                    return Err(format!("{at} is declared twice"));
                }
                if l.runtimes.is_empty() || !l.runtimes.iter().all(|r| runtime_ok(r)) {
                    return Err(format!(
                        "{at}: runtimes are a non-empty list of family or family@version"
                    ));
                }
                if !l.labels.iter().all(|(k, v)| name_ok(k) && name_ok(v)) {
                    return Err(format!(
                        "{at}: label keys and values are 1–63 of A-Z a-z 0-9 - _ ."
                    ));
                }
                if !l.roles.iter().all(|r| name_ok(r)) {
                    return Err(format!("{at}: roles are 1–63 of A-Z a-z 0-9 - _ ."));
                }
            }
        }
        Ok(())
    }

    /// The declared lane `lane_id` (`HOST:NAME`) and its host.
    pub fn lane(&self, lane_id: &str) -> Option<(&RosterHost, &RosterLane)> {
        let (host, name) = lane_id.split_once(':')?;
        let h = self.hosts.iter().find(|h| h.host_id == host)?;
        Some((h, h.lanes.iter().find(|l| l.lane == name)?))
    }
}

/// What an assignment placed by policy asks of its lane.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlacementAsk {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticAsk>,
}

/// `--elastic`: with no eligible lane, lease one (spec §13) for this long.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElasticAsk {
    pub ttl_ms: u64,
    pub max_lifetime_ms: u64,
}

impl PlacementAsk {
    pub fn validate(&self) -> Result<(), String> {
        if !self.labels.iter().all(|(k, v)| name_ok(k) && name_ok(v)) {
            return Err("label keys and values are 1–63 of A-Z a-z 0-9 - _ .".into());
        }
        if self.role.as_deref().is_some_and(|r| !name_ok(r)) {
            return Err("a role is 1–63 of A-Z a-z 0-9 - _ .".into());
        }
        Ok(())
    }
}

/// One lane the policy looks at: what the roster declares for it and what the coordinator
/// knows of it now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    pub lane_id: String,
    pub host_id: String,
    pub lane_incarnation_id: String,
    pub state: super::states::LaneState,
    /// Every predicate of the reserve CAS but the request's own holds.
    pub reservable: bool,
    pub host_connected: bool,
    /// What the host's registry advertises (observed at its hello).
    pub host_runtimes: Vec<String>,
    pub host_busy: u32,
    pub host_capacity: u32,
    /// Declared by the roster.
    pub runtimes: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub roles: Vec<String>,
    /// The lease of an elastic lane (whose runtimes, labels and roles are its lease's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
}

/// Everything `select` decides from. Recorded whole with the reservation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inputs {
    pub policy: String,
    pub runtime: String,
    pub ask: PlacementAsk,
    pub roster_version: i64,
    pub roster_digest: String,
    /// Sorted by lane id.
    pub candidates: Vec<Candidate>,
}

impl Inputs {
    /// The SHA-256 of the inputs' canonical encoding.
    pub fn digest(&self) -> Result<String, String> {
        let v = serde_json::to_value(self).map_err(|e| e.to_string())?;
        let c = crate::protocol::canonical::from_json(&v).map_err(|e| e.to_string())?;
        Ok(format!(
            "sha256:{}",
            crate::util::sha256_hex(
                "mosaic/placement-inputs/v1",
                &[&crate::protocol::canonical::encode(&c)]
            )
        ))
    }
}

/// Why a candidate is not eligible (the first rule it fails), for a refusal that says why.
fn ineligible(c: &Candidate, runtime: &str, ask: &PlacementAsk) -> Option<String> {
    let family = runtime.split_once('@').map_or(runtime, |(f, _)| f);
    if !c.host_connected {
        return Some(format!("host {} is not connected", c.host_id));
    }
    if !c.host_runtimes.iter().any(|r| r == runtime) {
        return Some(format!("host {} does not advertise {runtime}", c.host_id));
    }
    if !c.runtimes.iter().any(|r| r == runtime || r == family) {
        return Some(format!("the roster does not declare {runtime} for it"));
    }
    for (k, v) in &ask.labels {
        if c.labels.get(k) != Some(v) {
            return Some(format!("label {k}={v} is not declared on it"));
        }
    }
    if let Some(role) = &ask.role {
        if !c.roles.contains(role) {
            return Some(format!("role {role} is not among its roles"));
        }
    }
    if !c.reservable {
        return Some(format!("it is {} and not reservable", c.state));
    }
    if c.host_busy >= c.host_capacity {
        return Some(format!(
            "host {} is at its capacity ({} busy of {})",
            c.host_id, c.host_busy, c.host_capacity
        ));
    }
    None
}

/// The policy over `inputs` (`placement@1` and `@2` choose alike; they differ in the
/// candidates gathered): the chosen candidate, or why each lane was passed over.
pub fn select(inputs: &Inputs) -> Result<&Candidate, Vec<(String, String)>> {
    let mut best: Option<&Candidate> = None;
    let mut why = Vec::new();
    for c in &inputs.candidates {
        if let Some(reason) = ineligible(c, &inputs.runtime, &inputs.ask) {
            why.push((c.lane_id.clone(), reason));
            continue;
        }
        best = match best {
            Some(b) if (b.host_busy, &b.lane_id) <= (c.host_busy, &c.lane_id) => Some(b),
            _ => Some(c),
        };
    }
    best.ok_or(why)
}

/// A placement decided: recorded with the reservation it made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub policy: String,
    pub policy_digest: String,
    pub inputs: Inputs,
    pub inputs_digest: String,
    /// With `--elastic`, when no lane was eligible: how the host of the lane leased for it
    /// was chosen (the decision above is taken again after the lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<ElasticChoice>,
}

/// How `--elastic` chose the host it leased a lane on — recorded whole with the placement,
/// so an audit recomputes it like the lane choice: the inputs under which no lane was
/// eligible, every host the roster declares (its busy lanes, from those inputs, and whether
/// it had a session), the hosts that refused a lease in the order tried, and the lease.
/// The rule: connected hosts by fewest busy lanes, then host id; the first that admits
/// the lease is the one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElasticChoice {
    pub first_inputs: Inputs,
    pub first_inputs_digest: String,
    /// In the roster's order.
    pub hosts: Vec<ElasticHost>,
    /// The hosts tried before the leased one, in order, with their refusals.
    pub refused: Vec<ElasticRefusal>,
    pub leased_host: String,
    pub lease_id: String,
    pub lane_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElasticHost {
    pub host_id: String,
    pub busy: u32,
    pub connected: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElasticRefusal {
    pub host_id: String,
    pub why: String,
}

impl ElasticChoice {
    /// A host's busy lanes as the first inputs saw them (0 for a host with none known).
    pub fn busy_in(inputs: &Inputs, host: &str) -> u32 {
        inputs
            .candidates
            .iter()
            .filter(|c| c.host_id == host)
            .map(|c| c.host_busy)
            .max()
            .unwrap_or(0)
    }

    /// The order hosts are tried in: the connected ones, by fewest busy lanes, then id.
    pub fn order(hosts: &[ElasticHost]) -> Vec<String> {
        let mut v: Vec<(u32, &str)> = hosts
            .iter()
            .filter(|h| h.connected)
            .map(|h| (h.busy, h.host_id.as_str()))
            .collect();
        v.sort();
        v.into_iter().map(|(_, h)| h.to_string()).collect()
    }

    /// Whether the decision `d` recorded with this choice took the leased lane: the same
    /// runtime, ask and roster version as the inputs that found nothing, and the lease's
    /// lane, on the leased host, chosen.
    pub fn led_to(&self, d: &Decision) -> bool {
        !self.lease_id.is_empty()
            && d.lane_id == self.lane_id
            && d.inputs.runtime == self.first_inputs.runtime
            && d.inputs.ask == self.first_inputs.ask
            && d.inputs.roster_version == self.first_inputs.roster_version
            && d.inputs.candidates.iter().any(|c| {
                c.lane_id == self.lane_id
                    && c.host_id == self.leased_host
                    && c.lease_id.as_deref() == Some(self.lease_id.as_str())
            })
    }

    /// Whether the hosts it weighed are exactly the hosts `roster` declares, in its order
    /// (the roster version its inputs name): none left out, none added.
    pub fn weighed_all_of(&self, roster: &Roster) -> bool {
        self.hosts
            .iter()
            .map(|h| h.host_id.as_str())
            .eq(roster.hosts.iter().map(|h| h.host_id.as_str()))
    }

    /// Whether the record is the rule applied to its own facts: its first inputs are the
    /// ones digested and chose no lane; each host's busy count is theirs; the refused hosts
    /// are the order's first ones and the leased host the next.
    pub fn agrees(&self) -> bool {
        let order = Self::order(&self.hosts);
        let tried: Vec<&str> = self
            .refused
            .iter()
            .map(|r| r.host_id.as_str())
            .chain([self.leased_host.as_str()])
            .collect();
        self.first_inputs
            .digest()
            .is_ok_and(|d| d == self.first_inputs_digest)
            && select(&self.first_inputs).is_err()
            && self
                .hosts
                .iter()
                .all(|h| h.busy == Self::busy_in(&self.first_inputs, &h.host_id))
            && order.len() >= tried.len()
            && order.iter().zip(&tried).all(|(a, b)| a == b)
    }
}

impl Decision {
    /// Decides by `POLICY`: `Err` says why no lane is eligible.
    pub fn decide(inputs: Inputs) -> Result<Self, String> {
        let chosen = match select(&inputs) {
            Ok(c) => c.clone(),
            Err(why) if why.is_empty() => {
                return Err("the roster declares no lane the coordinator knows".into())
            }
            Err(why) => {
                let list: Vec<String> = why.iter().map(|(l, w)| format!("{l}: {w}")).collect();
                return Err(format!("no eligible lane ({})", list.join("; ")));
            }
        };
        Ok(Self {
            lane_id: chosen.lane_id,
            lane_incarnation_id: chosen.lane_incarnation_id,
            policy: POLICY.into(),
            policy_digest: policy_digest(),
            inputs_digest: inputs.digest()?,
            inputs,
            elastic: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(lane: &str, busy: u32) -> Candidate {
        Candidate {
            lane_id: lane.into(),
            host_id: lane.split(':').next().unwrap_or_default().into(),
            lane_incarnation_id: format!("li-{lane}"),
            state: crate::coordinator::states::LaneState::IdleClean,
            reservable: true,
            host_connected: true,
            host_runtimes: vec!["fake@1.0.0".into()],
            host_busy: busy,
            host_capacity: 2,
            runtimes: vec!["fake".into()],
            labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
            roles: vec!["worker".into()],
            lease_id: None,
        }
    }

    fn inputs(c: Vec<Candidate>, ask: PlacementAsk) -> Inputs {
        Inputs {
            policy: POLICY.into(),
            runtime: "fake@1.0.0".into(),
            ask,
            roster_version: 1,
            roster_digest: "sha256:00".into(),
            candidates: c,
        }
    }

    /// Each rule excludes, on its own, the one candidate that breaks it.
    #[test]
    fn every_rule_excludes_what_breaks_it() {
        type Break = (&'static str, fn(&mut Candidate), PlacementAsk);
        let plain = PlacementAsk::default();
        let zone_b = PlacementAsk {
            labels: BTreeMap::from([("zone".to_string(), "b".to_string())]),
            role: None,
            elastic: None,
        };
        let lead = PlacementAsk {
            labels: BTreeMap::new(),
            role: Some("lead".into()),
            elastic: None,
        };
        let cases: Vec<Break> = vec![
            ("not connected", |c| c.host_connected = false, plain.clone()),
            (
                "does not advertise",
                |c| c.host_runtimes = vec!["fake@2".into()],
                plain.clone(),
            ),
            (
                "does not declare",
                |c| c.runtimes = vec!["pi".into()],
                plain.clone(),
            ),
            ("label zone=b", |_| {}, zone_b),
            ("role lead", |_| {}, lead),
            ("not reservable", |c| c.reservable = false, plain.clone()),
            ("capacity", |c| c.host_busy = 2, plain.clone()),
        ];
        for (why, breaks, ask) in cases {
            let mut c = cand("h1:w1", 0);
            breaks(&mut c);
            let i = inputs(vec![c, cand("h2:w9", 1)], ask.clone());
            let label_or_role = ask != PlacementAsk::default();
            match select(&i) {
                Ok(c) if !label_or_role => assert_eq!(c.lane_id, "h2:w9", "{why}"),
                Ok(c) => panic!("{why}: chose {}", c.lane_id),
                Err(w) => {
                    assert!(label_or_role, "{why}: nothing eligible: {w:?}");
                    assert!(w[0].1.contains(why), "{why}: {w:?}");
                }
            }
        }
    }

    /// The fewest busy lanes on the host wins, then the smallest lane id; the order the
    /// candidates come in changes nothing.
    #[test]
    fn the_choice_is_a_function_of_the_inputs() {
        let a = vec![cand("h1:w2", 1), cand("h2:w1", 0), cand("h2:w0", 0)];
        let mut b = a.clone();
        b.reverse();
        let (ia, ib) = (
            inputs(a, PlacementAsk::default()),
            inputs(b, PlacementAsk::default()),
        );
        assert_eq!(select(&ia).map(|c| &c.lane_id), Ok(&"h2:w0".to_string()));
        assert_eq!(select(&ib).map(|c| &c.lane_id), Ok(&"h2:w0".to_string()));
        let d = Decision::decide(ia.clone()).unwrap();
        assert_eq!(d.inputs_digest, ia.digest().unwrap());
        assert_ne!(
            d.inputs_digest,
            ib.digest().unwrap(),
            "the digest covers the inputs as given"
        );
    }

    #[test]
    fn a_roster_is_checked_before_it_is_written() {
        let ok: Roster = toml::from_str(
            "[[hosts]]\nhost_id = \"h1\"\ncapacity = 2\n[[hosts.lanes]]\nlane = \"w1\"\nruntimes = [\"fake\", \"claude-code@2.1.3\"]\nlabels = { zone = \"a\" }\n",
        )
        .unwrap();
        ok.validate().unwrap();
        let mut twice = ok.clone();
        let again = twice.hosts[0].lanes[0].clone();
        twice.hosts[0].lanes.push(again);
        assert!(twice.validate().unwrap_err().contains("declared twice"));
        let mut none = ok.clone();
        none.hosts[0].lanes[0].runtimes.clear();
        assert!(none.validate().unwrap_err().contains("runtimes"));
        let mut zero = ok.clone();
        zero.hosts[0].capacity = 0;
        assert!(zero.validate().unwrap_err().contains("capacity"));
        let mut bad = ok;
        bad.hosts[0].lanes[0]
            .labels
            .insert("a b".into(), "x".into());
        assert!(bad.validate().unwrap_err().contains("label"));
    }

    /// An elastic choice agrees only with the rule applied to its own facts: each row
    /// breaks one of them and must be caught.
    #[test]
    fn an_elastic_choice_agrees_only_with_its_own_facts() {
        let mut busy = cand("h1:w0", 2);
        busy.reservable = false;
        let first = inputs(vec![busy, cand("h2:w0", 1)], PlacementAsk::default());
        let first = Inputs {
            candidates: first
                .candidates
                .into_iter()
                .map(|mut c| {
                    c.reservable = false;
                    c
                })
                .collect(),
            ..first
        };
        let host = |h: &str, busy: u32, connected: bool| ElasticHost {
            host_id: h.into(),
            busy,
            connected,
        };
        let good = ElasticChoice {
            first_inputs_digest: first.digest().unwrap(),
            first_inputs: first.clone(),
            hosts: vec![
                host("h1", 2, true),
                host("h2", 1, true),
                host("h3", 0, false),
            ],
            refused: vec![ElasticRefusal {
                host_id: "h2".into(),
                why: "its capacity is used".into(),
            }],
            leased_host: "h1".into(),
            lease_id: "ll-1".into(),
            lane_id: "h1:e-1".into(),
        };
        assert_eq!(ElasticChoice::order(&good.hosts), ["h2", "h1"]);
        assert!(good.agrees());
        type Break = (&'static str, fn(&mut ElasticChoice));
        let rows: [Break; 6] = [
            ("leased a host out of order", |c| {
                c.refused.clear();
            }),
            ("leased a disconnected host", |c| {
                c.leased_host = "h3".into();
            }),
            ("a busy count not the inputs'", |c| c.hosts[0].busy = 0),
            ("a digest not the inputs'", |c| {
                c.first_inputs_digest = format!("sha256:{}", "0".repeat(64))
            }),
            ("a lane was eligible after all", |c| {
                c.first_inputs.candidates[1].reservable = true;
                c.first_inputs_digest = c.first_inputs.digest().unwrap();
            }),
            ("more hosts tried than connected", |c| {
                c.hosts[0].connected = false;
            }),
        ];
        for (what, f) in rows {
            let mut bad = good.clone();
            f(&mut bad);
            assert!(!bad.agrees(), "{what}");
        }

        // The hosts weighed are exactly the roster version's, in its order.
        let declared = |ids: &[&str]| Roster {
            hosts: ids
                .iter()
                .map(|h| RosterHost {
                    host_id: h.to_string(),
                    capacity: 2,
                    lanes: Vec::new(),
                })
                .collect(),
        };
        assert!(good.weighed_all_of(&declared(&["h1", "h2", "h3"])));
        for (what, ids) in [
            ("a declared host left out", &["h1", "h2", "h3", "h4"][..]),
            ("a host the version does not declare", &["h1", "h2"][..]),
            ("another order", &["h2", "h1", "h3"][..]),
        ] {
            assert!(!good.weighed_all_of(&declared(ids)), "{what}");
        }

        // The decision after the lease takes the leased lane, and only that one.
        let mut leased = cand("h1:e-1", 1);
        leased.lease_id = Some("ll-1".into());
        let mut after = first.clone();
        after.candidates.push(leased);
        let d = Decision::decide(after).unwrap();
        assert!(good.led_to(&d));
        type Off = (&'static str, fn(&mut Decision));
        let off: [Off; 4] = [
            ("another lane", |d| d.lane_id = "h2:w0".into()),
            ("another lease", |d| {
                d.inputs.candidates[2].lease_id = Some("ll-2".into())
            }),
            ("another roster", |d| d.inputs.roster_version += 1),
            ("another host", |d| {
                d.inputs.candidates[2].host_id = "h2".into()
            }),
        ];
        for (what, f) in off {
            let mut bad = d.clone();
            f(&mut bad);
            assert!(!good.led_to(&bad), "{what}");
        }
    }
}
