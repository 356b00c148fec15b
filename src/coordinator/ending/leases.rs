//! Effect leases of a RUNNING chain: renewal (a new lease epoch) and expiry (the chain
//! drains and the work goes to recovery).

use super::*;
use crate::coordinator::states::LaneState;
use const_format::concatcp;

impl Store {
    /// Extends the effect leases of a RUNNING chain (its host is connected). Each renewal
    /// bumps the lease epoch; a lease already expired is not revived.
    pub async fn renew_leases(
        &self,
        l: &Leader,
        c: &Chain,
        lease_ttl_ms: i64,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "renew-leases";
        let conn = self.pool.get().await?;
        let epoch: i64 = conn
            .query_opt(
                "SELECT max(lease_epoch) AS lease_epoch FROM leases WHERE reservation_id = $1",
                &[&c.reservation_id],
            )
            .await?
            .map(|r| r.col::<Option<i64>>("lease_epoch"))
            .transpose()?
            .flatten()
            .unwrap_or(0);
        drop(conn);
        let step = Step::new(
            OP,
            l,
            format!("renew-leases/{}/{epoch}", c.reservation_id),
            request_digest(
                OP,
                &[&c.key(), &epoch.to_string(), &lease_ttl_ms.to_string()],
            ),
        )
        .about(Some(&c.assignment_id), Some(&c.lane_incarnation_id));
        let c = c.clone();
        let ttl = format!("{} milliseconds", lease_ttl_ms.clamp(1000, 86_400_000));
        self.transition(
            &step,
            body!([c, ttl] |f| {
                let d = f.cas(
                    concatcp!("UPDATE lane_incarnations li SET state = ", LaneState::Running.sql(), " FROM reservations r \
                     WHERE li.lane_incarnation_id = $1 AND li.state = ", LaneState::Running.sql(), " AND li.retired_at IS NULL AND r.reservation_id = $2 \
                       AND r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL \
                       AND NOT EXISTS (SELECT 1 FROM leases s WHERE s.reservation_id = r.reservation_id AND s.released_at IS NULL \
                                       AND (s.expires_at <= clock_timestamp() OR s.lease_epoch <> $3)) \
                     RETURNING li.lane_incarnation_id"),
                    &[&c.lane_incarnation_id, &c.reservation_id, &epoch],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "not a RUNNING chain with unexpired leases of this epoch").await?),
                };
                let n = d.exec(
                    "UPDATE leases SET expires_at = clock_timestamp() + $2::text::interval, lease_epoch = lease_epoch + 1 \
                     WHERE reservation_id = $1 AND released_at IS NULL",
                    &[&c.reservation_id, &ttl],
                ).await?;
                d.decide(json!({ "chain": c, "leases_renewed": n, "lease_epoch": epoch + 1 }))
            }),
        )
        .await
    }

    /// A RUNNING chain whose effect lease expired (database time) ends in recovery: no
    /// lease is revived, the generation is to be stopped.
    pub async fn expire_leases(&self, l: &Leader, c: &Chain) -> Result<Receipt, AuthorityError> {
        const OP: &str = "lease-expired";
        let step = Step::new(
            OP,
            l,
            format!("lease-expired/{}", c.reservation_id),
            request_digest(OP, &[&c.key()]),
        )
        .about(Some(&c.assignment_id), Some(&c.lane_incarnation_id));
        let c = c.clone();
        self.transition(
            &step,
            body!([c] |f| {
                let d = f.cas(
                    concatcp!("UPDATE lane_incarnations li SET state = ", LaneState::Draining.sql(), " FROM reservations r \
                     WHERE li.lane_incarnation_id = $1 AND li.state = ", LaneState::Running.sql(), " AND li.retired_at IS NULL AND r.reservation_id = $2 \
                       AND r.lane_incarnation_id = li.lane_incarnation_id AND r.released_at IS NULL \
                       AND EXISTS (SELECT 1 FROM leases s WHERE s.reservation_id = r.reservation_id AND s.released_at IS NULL AND s.expires_at <= clock_timestamp()) \
                     RETURNING r.generation"),
                    &[&c.lane_incarnation_id, &c.reservation_id],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => return Err(u.reject(Category::WrongState, "not a RUNNING chain with an expired lease").await?),
                };
                let g: Option<i64> = d.row().col("generation")?;
                d.revoke_leases(&c.reservation_id).await?;
                d.request_stop(&c.lane_incarnation_id, g, "effect lease expired").await?;
                d.to_recovery(RecoveryOf::Assignment(&c.assignment_id), "resume on a fresh chain: its effect lease expired").await?;
                d.decide(json!({ "chain": c, "to": LaneState::Draining, "generation_to_stop": g }))
            }),
        )
        .await
    }
}
