//! Starting a generation on a lane: validation before the lane is touched, then the
//! staged launch (`launch.rs`), and the coordinated generation's hand-off state.

use std::sync::Arc;

use super::*;

impl Supervisor {
    /// Starts a fresh generation on `lane`: stops and verifies-gone any previous one, then
    /// launches `runtime` with `directives` in a brand-new cgroup, and returns once the
    /// process identity is verified.
    pub async fn start(
        &self,
        lane: &str,
        runtime: &str,
        directives: &[String],
    ) -> Result<GenView, SupervisorError> {
        if self.inner.cfg.coordinator.is_some() {
            return Err(SupervisorError::Coordinated(
                "generations start only on its stage (assign through the coordinator)",
            ));
        }
        self.start_with(lane, runtime, directives, launch::Origin::Local, None)
            .await
    }

    /// Starts the coordinator-allocated `generation` of `lane` (whose current incarnation
    /// must be `incarnation`), handing its contract over `session`.
    pub async fn start_coordinated(
        &self,
        lane: &str,
        runtime: &str,
        incarnation: &str,
        generation: u64,
        session: Arc<lanesock::GenSession>,
        binding: state::CoordBinding,
    ) -> Result<GenView, SupervisorError> {
        session.keep_results_at(
            self.inner
                .store
                .continuation_results_path(incarnation, generation),
        );
        session.keep_conversation_at(self.inner.store.conversation_path(incarnation, generation));
        self.start_with(
            lane,
            runtime,
            &[],
            launch::Origin::Coordinated {
                generation,
                session,
                binding: Box::new(binding),
            },
            Some(incarnation),
        )
        .await
    }

    async fn start_with(
        &self,
        lane: &str,
        runtime: &str,
        directives: &[String],
        origin: launch::Origin,
        incarnation: Option<&str>,
    ) -> Result<GenView, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let slot = self.inner.slot(&name)?;
        let phases = launch::Phases::new();
        // Validate everything that can be validated before touching the lane.
        let plan = {
            let reg = self.inner.registry.clone();
            let rt = runtime.to_string();
            let d = directives.to_vec();
            let paths = crate::adapter::Paths {
                bin_dir: self.inner.cfg.bin_dir.clone(),
                harness_root: self.inner.cfg.harness_root.clone(),
            };
            let mut plan = tokio::task::spawn_blocking(move || {
                crate::adapter::plan_launch(&reg, &rt, &d, &paths)
            })
            .await
            .map_err(|e| SupervisorError::State {
                detail: format!("probe task failed: {e}"),
            })??;
            // A confined real harness has no network but the gateway: without a provider
            // it could reach no model, so it is refused before anything is made.
            if self.inner.cfg.confined(name.as_str())
                && plan.family != crate::adapter::Family::Fake
                && !self.inner.cfg.providers.contains_key(&plan.runtime.runtime)
            {
                return Err(SupervisorError::NoProvider {
                    lane: lane.to_string(),
                    runtime: plan.runtime.runtime.clone(),
                });
            }
            if matches!(origin, launch::Origin::Local)
                && plan.family.adapter().challenge_delivery()
                    != crate::adapter::ChallengeDelivery::SocketFetch
            {
                return Err(SupervisorError::Registry(
                    crate::adapter::RegistryError::Directives {
                        family: plan.family.name().into(),
                        detail: "a real harness runs only under the coordinator's chain (mosaic assign): its contract and ACK travel through it".into(),
                    },
                ));
            }
            if let Some(path) = self.inner.cfg.credentials.get(&plan.runtime.runtime) {
                plan.secret_env = crate::adapter::credentials::load(&plan.runtime.runtime, path)?;
            }
            plan
        };
        phases.mark("planned (registry, version probe, credentials)");
        let mut l = slot.lock().await;
        if let launch::Origin::Coordinated { generation, .. } = &origin {
            // A generation that already has a receipt ended for good (it ran, or it was
            // fenced as never started): a late stage cannot start it.
            let key =
                receipt::idempotency_key(&l.rec.lane_id, &l.rec.lane_incarnation_id, *generation);
            if self.inner.outbox.contains(&key) {
                return Err(SupervisorError::Launch {
                    lane: l.rec.lane_id.clone(),
                    generation: *generation,
                    detail: "this generation already ended (its receipt exists)".into(),
                });
            }
        }
        if let Some(inc) = incarnation {
            if inc != l.rec.lane_incarnation_id {
                return Err(SupervisorError::Launch {
                    lane: l.rec.lane_id.clone(),
                    generation: 0,
                    detail: format!(
                        "incarnation {inc} is not the lane's current {}",
                        l.rec.lane_incarnation_id
                    ),
                });
            }
        }
        match l.rec.status {
            LaneStatus::Active => {}
            LaneStatus::Destroyed => return Err(SupervisorError::NoSuchLane(lane.to_string())),
            LaneStatus::Quarantined => {
                return Err(SupervisorError::Quarantined {
                    lane: lane.to_string(),
                    reason: l.rec.quarantine_reason.clone().unwrap_or_default(),
                })
            }
        }
        if let Some(live) = l.live.take() {
            self.inner
                .metrics
                .replacements
                .get_or_create(&metrics::HostMetrics::lane(&l.rec.lane_id))
                .inc();
            let fin = generation::stop(live, StopCause::Replace).await?;
            l.apply_finish(&self.inner.store, &fin);
            if let Some(reason) = &fin.quarantine {
                return Err(SupervisorError::Quarantined {
                    lane: lane.to_string(),
                    reason: reason.clone(),
                });
            }
        }
        // Before anything is reserved: a confined lane on a host that cannot confine.
        super::confinement::check_host(
            &self.inner.cfg,
            &self.inner.confine_support,
            name.as_str(),
            lane,
        )?;
        // A lane recorded before lanes had their own uid gets one now, durably.
        if l.rec.uid.is_none() && self.inner.cfg.confined(name.as_str()) {
            let (store, range, ledger) = (
                self.inner.store.clone(),
                self.inner.cfg.lane_uids,
                self.inner.cfg.lane_uid_ledger.clone(),
            );
            let uid = tokio::task::spawn_blocking(move || store.allocate_uid(range, &ledger))
                .await
                .map_err(|e| SupervisorError::State {
                    detail: format!("uid allocation task failed: {e}"),
                })??;
            l.rec.uid = Some(uid);
            self.inner.store.save_lane(&l.rec)?;
        }
        let check = {
            let (inner, lane) = (self.inner.clone(), name.to_string());
            tokio::task::spawn_blocking(move || inner.tmux_check(&lane))
                .await
                .map_err(|e| SupervisorError::State {
                    detail: format!("tmux check task failed: {e}"),
                })?
        };
        match check {
            TmuxCheck::Ready => {}
            TmuxCheck::Unusable(e) => return Err(e),
            TmuxCheck::Gone => {
                let reason = "the lane's tmux server is gone";
                l.settle(&self.inner.store, None, Some(reason));
                return Err(SupervisorError::Quarantined {
                    lane: lane.to_string(),
                    reason: reason.into(),
                });
            }
        }
        phases.mark("lane checked (receipt, state, tmux server alive)");
        let live = match launch::launch(&self.inner, &mut l.rec, plan, origin, &phases).await {
            Ok(live) => live,
            Err(launch::LaunchError::Refused(e)) => return Err(e),
            Err(launch::LaunchError::Aborted { error, finished }) => {
                // The aborted generation has its receipt; the lane takes the next start
                // unless its cleanup or receipt was not provably complete.
                l.apply_finish(&self.inner.store, &finished);
                drop(l);
                self.publish_lanes().await;
                return Err(match finished.quarantine {
                    Some(reason) => SupervisorError::Quarantined {
                        lane: lane.to_string(),
                        reason,
                    },
                    None => error,
                });
            }
        };
        self.inner
            .metrics
            .generation_starts
            .get_or_create(&metrics::HostMetrics::lane(&l.rec.lane_id))
            .inc();
        self.inner
            .metrics
            .start_seconds
            .observe(phases.elapsed().as_secs_f64());

        let view = GenView::of(&live.record);
        spawn_applier(self.inner.clone(), name.to_string(), &live);
        l.live = Some(live);
        drop(l);
        self.publish_lanes().await;
        phases.mark("lane published");
        Ok(view)
    }

    /// The coordination binding of the lane's live `generation`, if it is a coordinated one.
    pub async fn binding(&self, lane: &str, generation: u64) -> Option<state::CoordBinding> {
        let name = LaneName::parse(lane).ok()?;
        let slot = self.inner.slot(&name).ok()?;
        let l = slot.lock().await;
        l.live
            .as_ref()
            .filter(|g| g.record.generation == generation)
            .and_then(|g| g.record.coord.clone())
    }

    /// The lane-socket hand-off state of the lane's live `generation`, if it has one.
    pub async fn session_of(
        &self,
        lane: &str,
        generation: u64,
    ) -> Option<Arc<lanesock::GenSession>> {
        let name = LaneName::parse(lane).ok()?;
        let slot = self.inner.slot(&name).ok()?;
        let mut l = slot.lock().await;
        l.live_gen(generation).and_then(|g| g.session.clone())
    }

    /// Records (durably) the chain fields of the lane's live `generation` once its contract
    /// is delivered, before the coordinator hears of it: a restarted supervisor serves the
    /// generation's lane socket again from them, activated or not. Returns false when that
    /// generation is not the live one, or is fenced; fields once recorded never change.
    pub async fn record_chain_fields(
        &self,
        lane: &str,
        generation: u64,
        chain_fields: serde_json::Value,
    ) -> Result<bool, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let slot = self.inner.slot(&name)?;
        let mut l = slot.lock().await;
        let Some(live) = l.live_gen(generation).filter(|g| !g.record.fenced) else {
            return Ok(false);
        };
        let Some(c) = live.record.coord.as_ref() else {
            return Ok(false);
        };
        if c.chain_fields.is_some() {
            return Ok(c.chain_fields.as_ref() == Some(&chain_fields));
        }
        // Saved first, then taken: a record that cannot be saved changes nothing here.
        let mut record = live.record.clone();
        if let Some(c) = record.coord.as_mut() {
            c.chain_fields = Some(chain_fields);
        }
        self.inner.store.save_gen(&record)?;
        live.record = record;
        Ok(true)
    }

    /// Records (durably, before the harness is told) that the coordinator activated the
    /// lane's live `generation`, with the chain fields its reports carry. Returns false
    /// when that generation is not the live one.
    pub async fn mark_activated(
        &self,
        lane: &str,
        generation: u64,
        chain_fields: Option<serde_json::Value>,
    ) -> Result<bool, SupervisorError> {
        let name = LaneName::parse(lane)?;
        let slot = self.inner.slot(&name)?;
        let mut l = slot.lock().await;
        let Some(live) = l.live_gen(generation) else {
            return Ok(false);
        };
        // Fenced meanwhile (the close holds this lock while it switches): not honoured.
        if live.record.coord.is_none() || live.record.fenced {
            return Ok(false);
        }
        // Its workspace writable before the activation is recorded: one that crashes
        // between the two is closed again at re-adoption (not activated), one that crashes
        // after is opened again. A workspace that cannot be opened fails the activation
        // here: the caller ends the generation.
        if !live.record.held {
            open_workspace(&live.record, true).await?;
        }
        let Some(c) = live.record.coord.as_mut() else {
            return Ok(false);
        };
        if !c.activated || (c.chain_fields.is_none() && chain_fields.is_some()) {
            c.activated = true;
            if c.chain_fields.is_none() {
                c.chain_fields = chain_fields;
            }
            self.inner.store.save_gen(&live.record)?;
        }
        drop(l);
        self.publish_lanes().await;
        Ok(true)
    }
}

/// Opens (`writable`) or closes the workspace of generation `g`, if it has one that
/// switches (a confined, coordinated generation with a recorded harness): whether it did.
/// Blocking work (a child entering its mount namespace) runs off the runtime's threads.
pub(crate) async fn open_workspace(
    g: &super::state::GenRecord,
    writable: bool,
) -> Result<bool, SupervisorError> {
    let (Some(path), Some((pid, start))) = (
        g.workspace.clone(),
        g.identity
            .as_ref()
            .and_then(|i| Some((i.harness_pid?, i.harness_start_time?))),
    ) else {
        return Ok(false);
    };
    let action = if writable { "open" } else { "close" };
    let done = tokio::task::spawn_blocking(move || {
        crate::confine::workspace::switch(pid, start, &path, writable)
    })
    .await
    .map_err(|e| SupervisorError::State {
        detail: format!("workspace switch task failed: {e}"),
    })?;
    done.map(|()| true)
        .map_err(|source| SupervisorError::Workspace {
            lane_id: g.lane_id.clone(),
            generation: g.generation,
            action,
            source,
        })
}

/// What the coordinator ordered about a live generation's workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceOrder {
    /// It is fenced: closed for good.
    Fence,
    /// Its work is offered to another lane: closed while the offer is open.
    Hold,
    /// The offer ended without moving the work: open again (unless fenced).
    Release,
}

impl WorkspaceOrder {
    fn as_str(self) -> &'static str {
        match self {
            Self::Fence => "fenced",
            Self::Hold => "held",
            Self::Release => "released",
        }
    }
}

impl Supervisor {
    /// Applies the coordinator's `order` to the workspace of `lane`'s live generation
    /// `generation` of incarnation `incarnation`: recorded first, then switched to what
    /// the record now says (`GenRecord::workspace_open`). When the kernel refuses a close
    /// (`EBUSY`: a write under way, or a file held open for writing), the generation's
    /// cgroup is frozen and the switch tried again: made, the generation is thawed;
    /// refused again (a file held open), or failing for any reason but the harness being
    /// gone, it stays frozen — until its stop kills it (fenced) or the hold is released.
    /// An open thaws it. Nothing for a generation that is not live or has no workspace that
    /// switches.
    pub async fn order_workspace(
        &self,
        lane: &str,
        incarnation: &str,
        generation: u64,
        order: WorkspaceOrder,
    ) -> Result<(), SupervisorError> {
        let name = LaneName::parse(lane)?;
        let slot = self.inner.slot(&name)?;
        // Held throughout: an activation arriving meanwhile waits, then sees the record.
        let mut l = slot.lock().await;
        let Some(live) = l.live.as_mut().filter(|g| {
            g.record.generation == generation && g.record.lane_incarnation_id == incarnation
        }) else {
            return Ok(());
        };
        let (fenced, held) = match order {
            WorkspaceOrder::Fence => (true, live.record.held),
            WorkspaceOrder::Hold => (live.record.fenced, true),
            WorkspaceOrder::Release => (live.record.fenced, false),
        };
        // Recorded even with no workspace to switch (an unconfined generation), so the
        // host's report says what the coordinator ordered instead of asking again.
        let changed = (fenced, held) != (live.record.fenced, live.record.held);
        if changed {
            live.record.fenced = fenced;
            live.record.held = held;
            // Writable again: what the hold's checkpoint took is no longer its tree (nor
            // are the workspace's files known equal to it any more).
            if !held && !fenced {
                live.record.handoff_checkpoint = None;
                if let Some(c) = &live.record.coord {
                    super::workspaces::unknown_files(&self.inner, &c.assignment_id).map_err(
                        |e| SupervisorError::Io {
                            what: "recording the workspace of",
                            path: super::workspaces::dir_of(&self.inner, &c.assignment_id),
                            source: std::io::Error::other(e),
                        },
                    )?;
                }
            }
            self.inner.store.save_gen(&live.record)?;
        }
        if live.record.workspace.is_none() {
            drop(l);
            if changed {
                self.publish_lanes().await;
            }
            return Ok(());
        }
        let rec = live.record.clone();
        let open = rec.workspace_open();
        let what = order.as_str();
        let cg = self.inner.tree.at_abs(&rec.cgroup);
        if open {
            // A held generation that could not be closed was frozen: thawed once open.
            open_workspace(&rec, true).await?;
            cg.thaw()?;
            drop(l);
            tracing::info!(lane_id = %rec.lane_id, generation, "the {what} generation's workspace is writable again");
            self.publish_lanes().await;
            return Ok(());
        }
        let first = match open_workspace(&rec, false).await {
            Ok(switched) => {
                if switched {
                    tracing::info!(lane_id = %rec.lane_id, generation,
                        "the {what} generation's workspace is read-only");
                }
                None
            }
            Err(SupervisorError::Workspace {
                source: crate::confine::workspace::SwitchError::Gone { .. },
                ..
            }) => None,
            Err(e) => Some(e),
        };
        if let Some(first) = first {
            let (tree, path) = (self.inner.tree.clone(), rec.cgroup.clone());
            tokio::task::spawn_blocking(move || tree.at_abs(&path).freeze_and_wait(FREEZE_TIMEOUT))
                .await
                .map_err(|e| SupervisorError::State {
                    detail: format!("freeze task failed: {e}"),
                })??;
            match open_workspace(&rec, false).await {
                Ok(_) => {
                    cg.thaw()?;
                    tracing::info!(lane_id = %rec.lane_id, generation,
                        "the {what} generation's workspace is read-only (after a write under way)");
                }
                Err(again) => {
                    tracing::warn!(lane_id = %rec.lane_id, generation, first = %first, error = %again,
                        "the {what} generation's workspace cannot be made read-only: it stays frozen");
                    tracing::info!(lane_id = %rec.lane_id, generation, "the {what} generation is frozen");
                }
            }
        }
        drop(l);
        self.publish_lanes().await;
        Ok(())
    }
}

/// How long a generation's cgroup may take to freeze.
const FREEZE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
