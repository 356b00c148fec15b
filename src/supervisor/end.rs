//! Ending generations on request: the coordinator's end order, a never-started receipt
//! for a number never begun here, and an operator's stop.

use super::*;

impl Supervisor {
    /// Ends generation `generation` of incarnation `incarnation` of `lane` on the
    /// coordinator's order: stops it if it runs; if it never ran here and has no receipt,
    /// writes a `never-started` receipt so the number is fenced for good (a late stage is
    /// refused) and the coordinator learns it ended.
    pub async fn end_generation(
        &self,
        lane: &str,
        incarnation: &str,
        generation: u64,
        runtime: &str,
    ) -> Result<EndOutcome, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let lane_id = self.inner.cfg.host.lane_id(&name);
        let key = receipt::idempotency_key(&lane_id, incarnation, generation);
        let slot = self.inner.slot(&name).ok();
        if let Some(slot) = slot {
            let mut l = slot.lock().await;
            if l.rec.lane_incarnation_id == incarnation {
                if l.live
                    .as_ref()
                    .is_some_and(|g| g.record.generation == generation)
                {
                    let live = l
                        .live
                        .take()
                        .ok_or_else(|| SupervisorError::NoLiveGeneration(lane.to_string()))?;
                    let fin = generation::stop(live, StopCause::Coordinator).await?;
                    l.apply_finish(&self.inner.store, &fin);
                    drop(l);
                    self.publish_lanes().await;
                    return Ok(EndOutcome::Stopped);
                }
                if self.already_ended(&key) {
                    return Ok(EndOutcome::AlreadyEnded);
                }
                // Fence the number before anything else can use it.
                if generation >= l.rec.next_generation {
                    l.rec.next_generation = generation + 1;
                    self.inner.store.save_lane(&l.rec)?;
                }
                self.write_never_started(
                    &lane_id,
                    incarnation,
                    generation,
                    runtime,
                    "the coordinator ended it before it started here",
                )?;
                return Ok(EndOutcome::FencedNeverStarted);
            }
        }
        if self.already_ended(&key) {
            return Ok(EndOutcome::AlreadyEnded);
        }
        self.write_never_started(
            &lane_id,
            incarnation,
            generation,
            runtime,
            "no such lane incarnation on this host",
        )?;
        Ok(EndOutcome::FencedNeverStarted)
    }

    /// Whether this host already ended the generation of receipt `key`: its receipt is
    /// held until the filesystem takes it (it is sent once durable), or is in the outbox
    /// (sent again: the coordinator asking means it lacks it).
    fn already_ended(&self, key: &str) -> bool {
        if self.inner.unwritten.contains(key) {
            return true;
        }
        if self.inner.outbox.contains(key) {
            self.resend_receipt(key);
            return true;
        }
        false
    }

    /// The coordinator asks to end a generation this host already ended: it never got (or
    /// lost) the receipt, so the receipt goes back to the outbox to be sent again.
    fn resend_receipt(&self, key: &str) {
        match self.inner.outbox.resend(key) {
            Ok(true) => tracing::warn!(key, "the coordinator lacks this receipt; sending it again"),
            Ok(false) => {}
            Err(e) => {
                tracing::error!(receipt_key = %key, error = %e, "cannot queue the receipt again")
            }
        }
    }

    /// The host refuses to start a staged generation: a `never-started` receipt ends the
    /// coordinator's chain at once (instead of letting its reservation run out).
    pub fn refuse_generation(
        &self,
        lane_id: &str,
        incarnation: &str,
        generation: u64,
        runtime: &str,
        why: &str,
    ) -> Result<(), SupervisorError> {
        self.write_never_started(lane_id, incarnation, generation, runtime, why)
    }

    fn write_never_started(
        &self,
        lane_id: &str,
        incarnation: &str,
        generation: u64,
        runtime: &str,
        why: &str,
    ) -> Result<(), SupervisorError> {
        // A generation begun here has a record; its receipt may say only what was observed
        // of it (a launch abort or its watcher writes it, or a restart finds it). Writing
        // "never started" over a generation that did start would be a guess.
        let key = receipt::idempotency_key(lane_id, incarnation, generation);
        if self.inner.outbox.contains(&key) || self.inner.unwritten.contains(&key) {
            return Ok(());
        }
        if self.inner.store.gen_exists(incarnation, generation) {
            return Err(SupervisorError::State {
                detail: format!(
                    "generation {generation} of {incarnation} was begun here; only its observed receipt may end it"
                ),
            });
        }
        let r = receipt::never_started(
            self.inner.cfg.host.as_str(),
            lane_id,
            incarnation,
            generation,
            runtime,
            why,
        );
        match self.inner.outbox.write(&r)? {
            outbox::Written::New => {
                self.inner.metrics.count_receipt(&r);
                tracing::warn!(
                    lane_id,
                    incarnation,
                    generation,
                    why,
                    "generation fenced as never started"
                );
            }
            outbox::Written::AlreadyPresent => {}
        }
        Ok(())
    }

    /// Gracefully stops the lane's live generation and returns its receipt once the cgroup
    /// is verified empty and removed.
    pub async fn stop(&self, lane: &str) -> Result<TerminationReceipt, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let slot = self.inner.slot(&name)?;
        let mut l = slot.lock().await;
        let live = l
            .live
            .take()
            .ok_or_else(|| SupervisorError::NoLiveGeneration(lane.to_string()))?;
        let fin = generation::stop(live, StopCause::Operator).await?;
        l.apply_finish(&self.inner.store, &fin);
        // Stopped, but nobody is told of a receipt before it is durable.
        if self.inner.unwritten.contains(&fin.receipt.idempotency_key) {
            return Err(SupervisorError::ReceiptNotDurable {
                lane: lane.to_string(),
                generation: fin.receipt.generation,
            });
        }
        Ok(fin.receipt.clone())
    }
}
