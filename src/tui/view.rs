//! The lane table as the view shows it, computed from one `watch` answer, and which lanes
//! need the operator (the marks). Pure: no I/O, so every mark is unit-tested.

use std::collections::BTreeMap;

use serde_json::Value;

/// Why a lane is marked. `Needs` waits on the operator; `Note` is worth seeing but resolves
/// without them (a handoff on offer, a rate limit the watchdog waits out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Mark {
    Needs(String),
    Note(String),
}

impl Mark {
    pub(super) fn text(&self) -> &str {
        match self {
            Mark::Needs(t) | Mark::Note(t) => t,
        }
    }
}

/// One row of the lane table.
#[derive(Debug, Clone, Default)]
pub(super) struct LaneRow {
    pub lane_id: String,
    pub host_id: String,
    pub state: String,
    pub runtime: String,
    pub generation: String,
    pub assignment: String,
    pub lifecycle: String,
    /// The work record's status where it says more than the lifecycle: blocked (with its
    /// code), handoff, or the watchdog's step.
    pub work: String,
    pub owner: String,
    pub since: String,
    pub last_receipt: String,
    pub mark: Option<Mark>,
}

#[derive(Default)]
pub(super) struct Snapshot {
    pub rows: Vec<LaneRow>,
    pub leadership: String,
    pub hosts: String,
    pub receipts: Vec<String>,
    /// Set when the coordinator answered but could not read its database.
    pub unreachable: Option<String>,
}

impl Snapshot {
    pub(super) fn needing(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| matches!(r.mark, Some(Mark::Needs(_))))
            .count()
    }
}

pub(super) fn s(v: &Value) -> String {
    match v {
        Value::String(x) => x.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The time of day of a database timestamp (`…THH:MM:SS…`), for a narrow column.
fn clock(v: &Value) -> String {
    s(v).get(11..19).unwrap_or("").to_string()
}

/// Seconds since the epoch of a database timestamp (`…Z`).
fn epoch(v: &Value) -> Option<f64> {
    let t = humantime::parse_rfc3339_weak(v.as_str()?.trim_end_matches('Z')).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
}

/// How long past its end a block the watchdog should have resumed is still taken as on its
/// way (its scan runs every few seconds), before it is shown as waiting on the operator.
const RESUME_GRACE_S: f64 = 60.0;

/// Whether the lane (and the assignment holding it, if any) waits on the operator, at
/// `now` (seconds since the epoch, the view's clock).
///
/// The order is the order of urgency: a quarantined lane or host first (nothing runs there
/// until an operator clears it), then work in recovery (it waits for `resume` or `stop`),
/// then blocked work, then a handoff on offer.
pub(super) fn mark(lane: &Value, holding: Option<&Value>, now: f64) -> Option<Mark> {
    if lane["state"] == "QUARANTINED" {
        return Some(Mark::Needs("lane quarantined".into()));
    }
    if !lane["host_quarantine_reason"].is_null() {
        return Some(Mark::Needs("host quarantined".into()));
    }
    let a = holding?;
    if a["state"] == "RECOVERY" {
        return Some(Mark::Needs("recovery: resume or stop".into()));
    }
    match s(&a["work_status"]).as_str() {
        "blocked" => {
            let code = s(&a["blocker_code"]);
            let until = &a["blocked_until"];
            // The end in UTC, with its date (a weekly cap is not later today).
            let shown = s(until).get(..16).unwrap_or("").replace('T', " ") + "Z";
            Some(match code.as_str() {
                "waiting-for-input" => Mark::Needs("waiting for input".into()),
                // Only a block with an end resolves itself: the watchdog resumes it then.
                _ if epoch(until).is_some_and(|u| now <= u + RESUME_GRACE_S) => {
                    Mark::Note(format!("{code} until {shown}"))
                }
                _ if !until.is_null() => Mark::Needs(format!("{code}: not resumed since {shown}")),
                _ => Mark::Needs(format!("blocked: {code}")),
            })
        }
        "handoff" => Some(Mark::Note("handoff offered".into())),
        _ => None,
    }
}

/// The lane table of one `watch` answer, marked as of `now` (seconds since the epoch).
pub(super) fn snapshot(v: &Value, now: f64) -> Snapshot {
    let mut by_lane: BTreeMap<String, (LaneRow, &Value, Option<&Value>)> = BTreeMap::new();
    for l in v["lanes"].as_array().into_iter().flatten() {
        let id = s(&l["lane_id"]);
        let row = LaneRow {
            lane_id: id.clone(),
            host_id: s(&l["host_id"]),
            state: s(&l["state"]),
            generation: s(&l["unended_generation"]),
            since: clock(&l["since"]),
            ..Default::default()
        };
        by_lane.insert(id, (row, l, None));
    }
    // Work in recovery no row shows (the lane went on to other work, or more than one):
    // counted per lane, so it is never hidden.
    let mut recovering: BTreeMap<String, usize> = BTreeMap::new();
    // The assignment holding each lane (its lane_state is set only while it does).
    for a in v["assignments"].as_array().into_iter().flatten() {
        let Some((row, _, holding)) = by_lane.get_mut(&s(&a["lane_id"])) else {
            continue;
        };
        if a["state"] == "RECOVERY" {
            *recovering.entry(s(&a["lane_id"])).or_default() += 1;
        }
        let holds = !a["lane_state"].is_null();
        let recovering = a["state"] == "RECOVERY";
        if holds || (recovering && row.assignment.is_empty()) {
            *holding = Some(a);
            row.assignment = s(&a["assignment_id"]);
            row.lifecycle = s(&a["state"]);
            row.work = match (
                s(&a["work_status"]).as_str(),
                s(&a["watchdog_step"]).as_str(),
            ) {
                ("blocked", _) => format!("blocked: {}", s(&a["blocker_code"])),
                ("handoff", _) => format!("handoff → {}", s(&a["pending_target"])),
                (_, "none" | "") => String::new(),
                (_, step) => step.to_string(),
            };
            row.runtime = s(&a["runtime_id"]);
            row.owner = s(&a["execution_owner"]);
            if row.generation.is_empty() && holds {
                row.generation = s(&a["generation"]);
            }
        }
    }
    for r in v["last_receipts"].as_array().into_iter().flatten() {
        if let Some((row, _, _)) = by_lane.get_mut(&s(&r["lane_id"])) {
            row.last_receipt = format!(
                "gen {} {} ({})",
                s(&r["generation"]),
                s(&r["reason"]),
                s(&r["reconciliation"])
            );
        }
    }
    let lead = &v["leadership"];
    Snapshot {
        rows: by_lane
            .into_values()
            .map(|(mut row, lane, holding)| {
                row.mark = mark(lane, holding, now);
                let shown = usize::from(holding.is_some_and(|a| a["state"] == "RECOVERY"));
                let unshown = recovering.get(&row.lane_id).copied().unwrap_or(0) - shown;
                if unshown > 0 {
                    row.mark = Some(Mark::Needs(match &row.mark {
                        Some(Mark::Needs(t)) => format!("{t} (+{unshown} more in recovery)"),
                        _ => format!("{unshown} in recovery: resume or stop"),
                    }));
                }
                row
            })
            .collect(),
        leadership: format!(
            "{} epoch {} (losses {})",
            s(&lead["state"]),
            s(&v["coordinator_epoch"]),
            s(&lead["losses"])
        ),
        hosts: v["hosts_connected"]
            .as_array()
            .map(|h| h.iter().map(s).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
        receipts: v["last_receipts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                format!(
                    "{}  {}  gen {}  {} / {}  → {}",
                    s(&r["at"]),
                    s(&r["lane_id"]),
                    s(&r["generation"]),
                    s(&r["source"]),
                    s(&r["reason"]),
                    s(&r["reconciliation"])
                )
            })
            .collect(),
        unreachable: v["database_unreachable"].as_str().map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// 2026-12-05T01:00:00Z.
    const NOW: f64 = 1796432400.0;

    fn lane(id: &str, state: &str) -> Value {
        json!({ "lane_id": id, "host_id": "h1", "state": state, "host_quarantine_reason": null })
    }

    fn holding(id: &str, extra: Value) -> Value {
        let mut a = json!({ "assignment_id": "asg-1", "lane_id": id, "state": "ACTIVE",
                            "lane_state": "RUNNING", "work_status": "active",
                            "watchdog_step": "none", "blocked_until": null });
        for (k, v) in extra.as_object().unwrap() {
            a[k] = v.clone();
        }
        a
    }

    fn marks(lanes: Vec<Value>, assignments: Vec<Value>) -> Vec<(String, Option<Mark>)> {
        let v = json!({ "lanes": lanes, "assignments": assignments });
        snapshot(&v, NOW)
            .rows
            .into_iter()
            .map(|r| (r.lane_id, r.mark))
            .collect()
    }

    #[test]
    fn running_and_idle_lanes_are_not_marked() {
        let m = marks(
            vec![lane("a", "RUNNING"), lane("b", "IDLE_CLEAN")],
            vec![holding("a", json!({}))],
        );
        assert_eq!(m, vec![("a".into(), None), ("b".into(), None)]);
    }

    #[test]
    fn each_state_that_waits_on_the_operator_is_marked_as_needing_them() {
        let m = marks(
            vec![
                lane("a", "QUARANTINED"),
                lane("b", "RUNNING"),
                lane("c", "RUNNING"),
                lane("d", "RUNNING"),
                lane("e", "RUNNING"),
                json!({ "lane_id": "f", "state": "IDLE_CLEAN", "host_quarantine_reason": "stale" }),
            ],
            vec![
                holding(
                    "b",
                    json!({ "work_status": "blocked", "blocker_code": "waiting-for-input" }),
                ),
                holding(
                    "c",
                    json!({ "work_status": "blocked", "blocker_code": "needs-review" }),
                ),
                holding("d", json!({ "state": "RECOVERY", "lane_state": null })),
                holding(
                    "e",
                    json!({ "work_status": "blocked", "blocker_code": "rate-limited" }),
                ),
            ],
        );
        let needs = |t: &str| Some(Mark::Needs(t.into()));
        assert_eq!(
            m,
            vec![
                ("a".into(), needs("lane quarantined")),
                ("b".into(), needs("waiting for input")),
                ("c".into(), needs("blocked: needs-review")),
                ("d".into(), needs("recovery: resume or stop")),
                // A rate limit with no end the watchdog knows of waits on the operator.
                ("e".into(), needs("blocked: rate-limited")),
                ("f".into(), needs("host quarantined")),
            ]
        );
    }

    #[test]
    fn what_resolves_by_itself_is_noted_not_needed() {
        let m = marks(
            vec![lane("a", "RUNNING"), lane("b", "RUNNING")],
            vec![
                holding(
                    "a",
                    json!({ "work_status": "blocked", "blocker_code": "rate-limited",
                            "blocked_until": "2026-12-05T01:02:03.000000Z" }),
                ),
                holding(
                    "b",
                    json!({ "work_status": "handoff", "pending_target": "x" }),
                ),
            ],
        );
        assert_eq!(
            m,
            vec![
                (
                    "a".into(),
                    Some(Mark::Note("rate-limited until 2026-12-05 01:02Z".into()))
                ),
                ("b".into(), Some(Mark::Note("handoff offered".into()))),
            ]
        );
        let v = json!({ "lanes": [lane("a", "RUNNING")], "assignments": [holding("a", json!({
            "work_status": "blocked", "blocker_code": "needs-review" }))] });
        assert_eq!(snapshot(&v, NOW).needing(), 1);
    }

    #[test]
    fn a_block_not_resumed_well_after_its_end_needs_the_operator() {
        let m = marks(
            vec![lane("a", "RUNNING")],
            vec![holding(
                "a",
                json!({ "work_status": "blocked", "blocker_code": "rate-limited",
                        "blocked_until": "2026-12-05T00:58:00.000000Z" }),
            )],
        );
        assert_eq!(
            m,
            vec![(
                "a".into(),
                Some(Mark::Needs(
                    "rate-limited: not resumed since 2026-12-05 00:58Z".into()
                ))
            )]
        );
    }

    #[test]
    fn recovery_work_is_never_hidden_behind_newer_work_on_its_lane() {
        let recovering = |id: &str| {
            let mut a = holding("a", json!({ "state": "RECOVERY", "lane_state": null }));
            a["assignment_id"] = json!(id);
            a
        };
        // The lane runs newer work; two older assignments wait in recovery.
        let m = marks(
            vec![lane("a", "RUNNING")],
            vec![recovering("r1"), recovering("r2"), holding("a", json!({}))],
        );
        assert_eq!(
            m,
            vec![(
                "a".into(),
                Some(Mark::Needs("2 in recovery: resume or stop".into()))
            )]
        );
        // Idle, with two in recovery: one shown on the row, the other counted.
        let m = marks(
            vec![lane("a", "IDLE_CLEAN")],
            vec![recovering("r1"), recovering("r2")],
        );
        assert_eq!(
            m,
            vec![(
                "a".into(),
                Some(Mark::Needs(
                    "recovery: resume or stop (+1 more in recovery)".into()
                ))
            )]
        );
    }

    #[test]
    fn an_assignment_that_let_go_of_its_lane_marks_nothing() {
        // Done work (lane_state null, not in recovery) no longer holds the lane.
        let m = marks(
            vec![lane("a", "IDLE_CLEAN")],
            vec![holding(
                "a",
                json!({ "state": "COMPLETED", "lane_state": null, "work_status": "blocked",
                        "blocker_code": "x" }),
            )],
        );
        assert_eq!(m, vec![("a".into(), None)]);
    }
}
