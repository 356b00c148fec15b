//! What `mosaic stop --wait` waits for once its outcome is final: the stopped chain's lane
//! out of RETIRING. The outcome is final with the receipt that proves the end; the lane is
//! IDLE_CLEAN one step later (its cleanup recorded as verified) — a separate transition, so
//! a stop that answered before it would leave an immediate assign on that lane refused.

use super::*;
use crate::coordinator::states::LaneState;

impl Service {
    /// `v` (a stop's answer, its outcome final) with `lane_state`: the state of lane
    /// incarnation `inc` once it has left RETIRING (IDLE_CLEAN: usable at once;
    /// QUARANTINED: its cleanup was not verified), or as it is at `deadline`.
    pub(super) async fn with_settled_lane(
        &self,
        mut v: serde_json::Value,
        inc: Option<&str>,
        deadline: tokio::time::Instant,
    ) -> Result<serde_json::Value, OpError> {
        let Some(inc) = inc else { return Ok(v) };
        let mut changed = self.changed.subscribe();
        loop {
            let state = self.store.incarnation_state(inc).await?;
            let settled = state != Some(LaneState::Retiring);
            if settled || tokio::time::Instant::now() >= deadline {
                v["lane_state"] = json!(state.map(|s| s.to_string()));
                return Ok(v);
            }
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}
