//! Elastic lanes (spec §13) at the service: `mosaic lane lease|renew|leases`, and the TTL
//! worker the watchdog runs every tick. The decisions are `coordinator::leases`' CASes; this
//! sends the hosts their orders (make the lane, destroy the incarnation) and waits.
//!
//! **Never:** destroys a lane but through `decide_destroy` and its host's verified teardown;
//! retries a refused destruction with another snapshot than the one the database shows now.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use super::driver::LaneOrder;
use super::operator::OpError;
use super::Service;
use crate::coordinator::error::Category;
use crate::coordinator::leader::Leader;
use crate::coordinator::leases::{LeaseAsk, LeaseView};
use crate::coordinator::states::LeaseState;

/// How long `mosaic lane lease` waits for the host to make the lane.
const MADE_WITHIN: Duration = Duration::from_secs(30);

impl Service {
    /// `mosaic lane lease`: the lease, the host told to make its lane, and the answer once
    /// the lane is leased (or still waiting after `MADE_WITHIN`, said so).
    pub(crate) async fn lease_lane(
        &self,
        ask: &LeaseAsk,
        request_id: &str,
    ) -> Result<serde_json::Value, OpError> {
        ask.validate()
            .map_err(|e| OpError::new(Category::BadInput, e))?;
        let l = self.leader().await?;
        if !self.hosts.is_connected(&ask.host_id) {
            return Err(OpError::new(
                Category::HostUnreachable,
                format!(
                    "host {} is not connected: a lane is leased only on a host that can make it now",
                    ask.host_id
                ),
            ));
        }
        let r = self.store.lease_lane(&l, ask, request_id).await;
        let v = self.settled(&l, r).await?;
        self.push_lease_orders(&l, &v.host_id).await;
        self.bump();
        let deadline = tokio::time::Instant::now() + MADE_WITHIN;
        let mut changed = self.changed.subscribe();
        loop {
            let now = self.store.lease(&v.lease_id).await?;
            if let Some(now) = now.filter(|n| n.state != LeaseState::Requested) {
                return Ok(json!(now));
            }
            if tokio::time::timeout_at(deadline, changed.changed())
                .await
                .is_err()
            {
                let mut out = json!(v);
                out["pending"] = json!(
                    "the host has not made the lane yet; `mosaic lane leases` shows when it has"
                );
                return Ok(out);
            }
        }
    }

    /// `mosaic lane renew`.
    pub(crate) async fn renew_lease(
        &self,
        lease_id: &str,
        request_id: &str,
    ) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let r = self.store.renew_lease(&l, lease_id, request_id).await;
        let v = self.settled(&l, r).await?;
        self.bump();
        Ok(json!(v))
    }

    /// `mosaic lanes`: every current lane, an elastic one with its lease.
    pub(crate) async fn lanes_json(&self) -> Result<serde_json::Value, OpError> {
        let lanes = self.store.lanes().await?;
        let leases: BTreeMap<String, LeaseView> = self
            .store
            .leases()
            .await?
            .into_iter()
            .filter_map(|v| v.lane_incarnation_id.clone().map(|i| (i, v)))
            .collect();
        let out: Vec<serde_json::Value> = lanes
            .iter()
            .map(|lane| {
                let mut v = json!(lane);
                if let Some(lease) = leases.get(&lane.lane_incarnation_id) {
                    v["lease"] = json!({
                        "lease_id": lease.lease_id, "state": lease.state, "lease_epoch": lease.lease_epoch,
                        "renew_deadline": lease.renew_deadline, "max_deadline": lease.max_deadline,
                        "expired": lease.expired,
                    });
                }
                v
            })
            .collect();
        Ok(json!(out))
    }

    /// The TTL worker: every `ACTIVE` lease past its deadline on an idle lane is destroyed
    /// by the exact-snapshot CAS, and its host told. A refusal that says the snapshot was
    /// stale (renewed, work started) leaves the lease be; one that says the ownership or
    /// the lane does not match is a collision: the lease is quarantined.
    pub(super) async fn destroy_due_leases(&self, l: &Leader) {
        let due = match self.store.due_leases().await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "the TTL worker cannot read the leases");
                return;
            }
        };
        for snap in due {
            let host = snap.lane_id.split_once(':').map_or("", |(h, _)| h);
            match self.store.decide_destroy(l, &snap).await {
                Ok(_) => {
                    tracing::warn!(lane_id = %snap.lane_id, lease_id = %snap.lease_id,
                        lease_epoch = snap.lease_epoch, "elastic lane's lease ended: destroying the lane");
                    self.bump();
                    self.push_lease_orders(l, host).await;
                }
                Err(e) if e.category() == Some(Category::Mismatch) => {
                    tracing::error!(lane_id = %snap.lane_id, lease_id = %snap.lease_id, error = %e,
                        "the TTL destruction collided with the lease's ownership: quarantined for reconciliation");
                    let reason = format!("TTL destruction refused: {e}");
                    if let Err(q) = self
                        .store
                        .quarantine_lease(l, &snap.lease_id, &reason)
                        .await
                    {
                        self.note(l, &q).await;
                    }
                    self.bump();
                }
                Err(e) => {
                    self.note(l, &e).await;
                    tracing::debug!(lane_id = %snap.lane_id, error = %e, "lease not destroyed");
                }
            }
        }
    }

    /// `mosaic lane unlease`.
    pub(crate) async fn end_lease(
        &self,
        lease_id: &str,
        request_id: &str,
    ) -> Result<serde_json::Value, OpError> {
        let l = self.leader().await?;
        let r = self.store.end_lease(&l, lease_id, request_id).await;
        let r = self.settled(&l, r).await?;
        if let Some((host, _)) = r.body["lane_id"].as_str().and_then(|x| x.split_once(':')) {
            self.push_lease_orders(&l, host).await;
        }
        self.bump();
        let mut out = r.body.clone();
        out["receipt_id"] = json!(r.receipt_id);
        Ok(out)
    }

    /// Leases whose host never made their lane in time are quarantined (the host may
    /// still make it: nobody knows). `mosaic lane unlease` is the way out.
    pub(super) async fn quarantine_unmade_leases(&self, l: &Leader) {
        let unmade = match self.store.unmade_leases().await {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(error = %e, "the TTL worker cannot read the leases");
                return;
            }
        };
        for lease in unmade {
            let reason = "its host did not make the lane before the lease's deadline";
            match self.store.quarantine_lease(l, &lease, reason).await {
                Ok(_) => {
                    tracing::error!(lease_id = %lease, "{reason}: quarantined (mosaic lane unlease ends it)");
                    self.bump();
                }
                Err(e) => self.note(l, &e).await,
            }
        }
    }

    /// Sends the orders of every lease waiting on its host again (a lost or ignored order
    /// is never the end of it: the host's answer is its report).
    pub(super) async fn resend_lease_orders(&self, l: &Leader) {
        match self.store.hosts_with_lease_orders().await {
            Ok(hosts) => {
                for h in hosts {
                    if self.hosts.is_connected(&h) {
                        self.push_lease_orders(l, &h).await;
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot list the leases waiting on hosts"),
        }
    }

    /// Pushes a host its elastic-lane orders alone.
    pub(crate) async fn push_lease_orders(&self, l: &Leader, host: &str) {
        let mut orders: BTreeMap<String, LaneOrder> = BTreeMap::new();
        self.lease_orders(host, &mut orders).await;
        self.push_reconcile(l, host, &orders).await;
    }
}
