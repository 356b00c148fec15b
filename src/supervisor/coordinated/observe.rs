//! Progress a RUNNING real harness earns, as the supervisor sees it in its working
//! directory (`supervisor::progress`): observed at each of its settled boundaries and
//! once a minute while a turn runs, each piece of new evidence sent as a progress report
//! of the generation — digested here, never the harness's word.
//!
//! **Never:** observes before the coordinator activated the generation (its workspace is
//! read-only and its baseline is the activation's) or after it was ordered ended; keeps the
//! generation or its chain alive (it holds neither).

use std::sync::Weak;
use std::time::Duration;

use super::*;
use crate::supervisor::progress::Observer;

/// How often a running turn's working directory is looked at between settled boundaries.
const EVERY: Duration = Duration::from_secs(60);
/// The least time between two looks, however often turns end or the harness asks (its
/// hook events can be forged by its own tools): a harness cannot keep the supervisor
/// scanning.
const MIN_GAP: Duration = Duration::from_secs(5);

impl CoordinatedHost {
    /// Starts observing the activated generation of `ctx` (a real harness's).
    pub(super) fn observe_progress(
        self: &Arc<Self>,
        ctx: &Arc<ChainCtx>,
        session: &Arc<GenSession>,
    ) {
        if !session
            .family()
            .is_some_and(|f| f.adapter().observes_progress())
        {
            return;
        }
        if ctx
            .observing
            .swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return; // already observed (an activation re-sent, a re-adoption)
        }
        let inner = &self.sup.inner;
        let b = &ctx.binding;
        let dir = if b.repository.is_some() {
            super::super::workspaces::dir_of(inner, &b.assignment_id)
        } else {
            super::super::generation::harness_dir(inner, &ctx.lane_incarnation_id, ctx.generation)
                .join("work")
        };
        let kept = inner
            .store
            .progress_path(&ctx.lane_incarnation_id, ctx.generation);
        let (weak_ctx, weak_session): (Weak<ChainCtx>, Weak<GenSession>) =
            (Arc::downgrade(ctx), Arc::downgrade(session));
        let mut busy = session.busy.subscribe();
        let look = session.look.clone();
        let generation = ctx.generation;
        tokio::spawn(async move {
            // Until it can start (its baseline written) or the generation is gone: given up
            // after one failure (a full state disk), the generation went unobserved for its
            // whole life, and its progress was never reported.
            let mut observer = loop {
                let (d, k) = (dir.clone(), kept.clone());
                match tokio::task::spawn_blocking(move || Observer::start(&d, &k)).await {
                    Ok(Ok(o)) => break o,
                    Ok(Err(e)) => {
                        tracing::warn!(generation, error = %e, "cannot observe the generation's progress yet; trying again");
                    }
                    Err(_) => return,
                }
                if weak_session.upgrade().is_none() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            };
            let mut last = std::time::Instant::now();
            loop {
                tokio::select! {
                    r = busy.changed() => {
                        if r.is_err() {
                            return; // the generation's session is gone
                        }
                        if *busy.borrow() {
                            continue; // a turn started: its end is the next look
                        }
                    }
                    _ = look.notified() => {}
                    _ = tokio::time::sleep(EVERY) => {}
                }
                if let Some(rest) = MIN_GAP.checked_sub(last.elapsed()) {
                    tokio::time::sleep(rest).await;
                }
                last = std::time::Instant::now();
                let (Some(ctx), Some(session)) = (weak_ctx.upgrade(), weak_session.upgrade())
                else {
                    return;
                };
                if ctx.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                drop(ctx);
                let looked = tokio::task::spawn_blocking(move || {
                    let r = observer.observe();
                    (observer, r)
                })
                .await;
                let Ok((o, r)) = looked else { return };
                observer = o;
                match r {
                    Ok(evidence) => {
                        for e in evidence {
                            tracing::info!(
                                generation,
                                kind = e.kind,
                                "progress observed in the working directory"
                            );
                            let _ = session.reports.send(HarnessReport::Progress {
                                evidence_digest: crate::protocol::work::evidence_digest(
                                    e.kind, &e.bytes,
                                ),
                                kind: e.kind.to_string(),
                                next_action: None,
                            });
                        }
                    }
                    Err(e) => {
                        tracing::warn!(generation, error = %e, "cannot observe the generation's progress")
                    }
                }
            }
        });
    }
}
