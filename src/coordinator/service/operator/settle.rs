//! What `mosaic stop --wait` waits for once its outcome is final: the lane the work held
//! out of RETIRING. The outcome is final with the receipt that proves the end; the lane is
//! IDLE_CLEAN one step later (its cleanup recorded as verified) — a separate transition, so
//! a stop that answered before it would leave an immediate assign on that lane refused.

use super::*;
use crate::coordinator::states::LaneState;

impl Service {
    /// `v` (a stop's answer, its outcome final) with `lane_state`: the state of lane
    /// incarnation `inc`, where the stop ended `assignment_id`'s generation, once it has
    /// left RETIRING (IDLE_CLEAN: usable at once; QUARANTINED: its cleanup was not
    /// verified; RETIRED), or as it is at `deadline` (with `pending`). Nothing is added
    /// when the lane is another assignment's by then, or cannot be read: the stop itself
    /// has succeeded.
    pub(super) async fn with_settled_lane(
        &self,
        mut v: serde_json::Value,
        inc: Option<&str>,
        assignment_id: &str,
        deadline: tokio::time::Instant,
    ) -> serde_json::Value {
        let Some(inc) = inc else { return v };
        let mut changed = self.changed.subscribe();
        let retiring = LaneState::Retiring.to_string();
        loop {
            let state = match self.store.lane_after_stop(inc, assignment_id).await {
                Ok(Some(s)) => s,
                Ok(None) | Err(_) => return v,
            };
            if state != retiring {
                v["lane_state"] = json!(state);
                return v;
            }
            if tokio::time::Instant::now() >= deadline {
                v["lane_state"] = json!(state);
                v["pending"] = json!("its lane's cleanup is not recorded as verified yet");
                return v;
            }
            tokio::select! {
                _ = changed.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}
