//! A handoff offer holds its source's workspace (spec §6.1 `RUNNING → HANDOFF_PENDING`):
//! the offer's compare-and-swap closes the source's effect admission in the database, and
//! the source's host is told to make its workspace read-only while the generation runs on.
//! An offer that ends without moving the work (its target released or expired) releases
//! it; an accepted one ends the source, whose end order closes it for good.
//!
//! Two paths keep the host in step, both idempotent on the host:
//! - edge: right after an offer commits, and on every watchdog tick, the running sources
//!   with an open offer are compared with the ones this process told to hold (`held`); new
//!   ones are held, gone ones released if their chain runs on as the work's own;
//! - level: every host report lists each generation's `held`, and a report that disagrees
//!   with the database is answered with the order (this covers a restarted or new
//!   coordinator process, whose `held` starts empty).

use std::collections::{BTreeMap, BTreeSet};

use super::driver::LaneOrder;
use super::Service;
use crate::coordinator::leader::Leader;
use crate::coordinator::model::ChainRow;

/// A source generation told to hold its workspace.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    host_id: String,
    lane_id: String,
    lane_incarnation_id: String,
    generation: i64,
}

impl Held {
    fn of(c: &ChainRow) -> Option<Self> {
        Some(Self {
            host_id: c.host_id.clone(),
            lane_id: c.chain.lane_id.clone(),
            lane_incarnation_id: c.chain.lane_incarnation_id.clone(),
            generation: c.generation?,
        })
    }
}

impl Service {
    /// Holds every source whose work is now offered away and releases every one this
    /// process held whose work came back.
    pub(crate) async fn sync_holds(&self, l: &Leader) {
        let want: BTreeMap<String, Held> = match self.store.held_sources().await {
            Ok(v) => v
                .iter()
                .filter_map(|c| Some((c.chain.reservation_id.clone(), Held::of(c)?)))
                .collect(),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the held sources");
                return;
            }
        };
        let told = match self.driver.held.lock() {
            Ok(h) => h.clone(),
            Err(_) => return,
        };
        for (res, h) in &want {
            if !told.contains_key(res) {
                tracing::info!(lane_id = %h.lane_id, generation = h.generation,
                    "the work is offered to another lane: its source's workspace is held");
                self.push_workspace(l, h, true).await;
            }
        }
        for (res, h) in &told {
            if want.contains_key(res) {
                continue;
            }
            // Released only if it runs on as the work's own; an accepted handoff's source
            // is ended instead (its end order closes it for good).
            let back = self
                .store
                .chain_by_reservation(res)
                .await
                .ok()
                .flatten()
                .is_some_and(|c| c.workspace_releasable());
            if back {
                tracing::info!(lane_id = %h.lane_id, generation = h.generation,
                    "the offer ended without moving the work: its source's workspace is released");
                self.push_workspace(l, h, false).await;
            }
        }
        // A host not connected now hears it from its next report's reconciliation.
        if let Ok(mut held) = self.driver.held.lock() {
            *held = want;
        }
    }

    async fn push_workspace(&self, l: &Leader, h: &Held, hold: bool) {
        let gens = BTreeSet::from([h.generation]);
        let order = LaneOrder {
            incarnation: h.lane_incarnation_id.clone(),
            hold: if hold { gens.clone() } else { BTreeSet::new() },
            release: if hold { BTreeSet::new() } else { gens },
            ..LaneOrder::default()
        };
        let lanes = BTreeMap::from([(h.lane_id.clone(), order)]);
        self.push_reconcile(l, &h.host_id, &lanes).await;
    }
}
