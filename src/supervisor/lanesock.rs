//! The harness's side door: a per-generation Unix socket for `mosaic lane …`, through which
//! a harness fetches its contract and acknowledges its challenge.
//!
//! **Owns:** the per-generation hand-off points between the coordinator chain and the
//! harness (contract, challenge, activation), and the peer check on every connection.
//!
//! **Never:** answers a process outside the generation's cgroup, hands out a contract or
//! challenge of another generation, or lets the harness see a key.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::watch;

/// The contract as delivered to the harness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contract {
    pub task_text: String,
    pub contracts_digest: String,
    /// The generation's contract key (`adapter::contract_key`): the activation answer must
    /// repeat it.
    #[serde(default)]
    pub key: String,
}

/// What a RUNNING harness reports through its socket. The evidence digest is computed here,
/// by the supervisor, from the evidence bytes the harness handed over (never a digest the
/// harness typed), so a report without new evidence cannot count as progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HarnessReport {
    Progress {
        kind: String,
        evidence_digest: String,
        next_action: Option<String>,
    },
    Blocked {
        code: String,
        evidence_digest: String,
        next_action: String,
    },
    /// The result of a continuation the harness was given.
    ContinuationResult {
        continuation_id: String,
        evidence_digest: String,
    },
}

/// A continuation made visible to the harness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Continuation {
    pub continuation_id: String,
    pub next_action: String,
}

use crate::adapter::{ChallengeDelivery, ContractInjection, Family, HookEvent};
use crate::protocol::work::{self, evidence_digest, MAX_EVIDENCE_BYTES};

/// One generation's hand-off state, shared by the socket server and the chain driver.
#[derive(Debug)]
pub struct GenSession {
    pub contract: watch::Sender<Option<Contract>>,
    /// Set when the harness fetched the contract (the digest it was given).
    pub delivered: watch::Sender<Option<String>>,
    /// Set when the harness asked to acknowledge.
    pub ack_requested: watch::Sender<bool>,
    /// `Some(Ok)` once activated (RUNNING), `Some(Err)` if the chain failed.
    pub activation: watch::Sender<Option<Result<(), String>>>,
    /// Set when a handoff challenge for this generation arrived (its id).
    pub handoff: watch::Sender<Option<String>>,
    /// Set when the harness asked to acknowledge the handoff challenge.
    pub handoff_ack_requested: watch::Sender<bool>,
    /// Set when this generation's activation challenge arrived (for a handoff target: the
    /// handoff was accepted).
    pub challenged: watch::Sender<bool>,
    /// True while the harness waits in `mosaic lane next`: it is settled (nothing queued, no
    /// turn running) — the only time a continuation is accepted for it.
    pub settled: watch::Sender<bool>,
    /// The continuation to hand to the waiting harness (its acceptance is committed).
    pub next: watch::Sender<Option<Continuation>>,
    /// Continuations already made visible: each at most once.
    pub visible: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Continuations this process accepted. Only these are ever made visible: one accepted
    /// by a previous supervisor process may already have been shown (its visibility is
    /// unknown), so it is never shown again — the coordinator abandons it at its deadline and
    /// replaces the generation. This is what lets the set above live in memory.
    pub accepted_here: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The result (evidence digest) the harness reported for each continuation, kept to
    /// answer the coordinator again if the first report was lost.
    pub results: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// Reports of the RUNNING harness, for the chain driver to sign and send.
    pub reports: tokio::sync::mpsc::UnboundedSender<HarnessReport>,
    /// The driver's end of `reports` (taken once).
    pub reports_rx: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<HarnessReport>>>,
    /// The phrase the harness must answer, derived from this generation's activation
    /// challenge (`adapter::ack_phrase`); set when the challenge arrives.
    pub phrase: watch::Sender<Option<String>>,
    /// The harness family and the conversation id it was started with.
    pub harness: std::sync::Mutex<Option<(Family, Option<String>)>>,
    /// Advisory observations from the harness's own events (never used for termination).
    pub observed: std::sync::Mutex<Observed>,
    /// For a harness answering in its own turns: the number of turns started before the
    /// activation check was submitted. Only a turn started after it answers the challenge
    /// (`u64::MAX` until then: no turn end is judged).
    pub answer_turns_after: std::sync::atomic::AtomicU64,
}

/// What the harness's hooks reported, as the supervisor's status shows it. Advisory: no
/// hook runs on SIGKILL, so none of this ever decides an ending.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Observed {
    /// Turn starts (a prompt taken) seen.
    pub turns_started: u64,
    /// A turn started and has not ended yet (the last turn event was a start).
    pub busy: bool,
    /// Turn ends (Stop / idle / settled events) seen.
    pub settled: u64,
    pub last_settled_at: Option<String>,
    /// ACK answers that did not bind the challenge (refused).
    pub ack_refused: u64,
    /// Hook events refused (wrong family, another conversation, a resumed session).
    pub refused_events: u64,
    /// Compactions the harness announced, each answered with the delivered contract.
    pub compactions: u64,
    pub session_end: Option<String>,
}

impl GenSession {
    pub fn new() -> Arc<Self> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        Arc::new(Self {
            contract: watch::channel(None).0,
            delivered: watch::channel(None).0,
            ack_requested: watch::channel(false).0,
            activation: watch::channel(None).0,
            handoff: watch::channel(None).0,
            handoff_ack_requested: watch::channel(false).0,
            challenged: watch::channel(false).0,
            settled: watch::channel(false).0,
            next: watch::channel(None).0,
            visible: std::sync::Mutex::new(std::collections::HashSet::new()),
            accepted_here: std::sync::Mutex::new(std::collections::HashSet::new()),
            results: std::sync::Mutex::new(std::collections::HashMap::new()),
            reports: tx,
            reports_rx: std::sync::Mutex::new(Some(rx)),
            phrase: watch::channel(None).0,
            harness: std::sync::Mutex::new(None),
            observed: std::sync::Mutex::new(Observed::default()),
            answer_turns_after: std::sync::atomic::AtomicU64::new(u64::MAX),
        })
    }

    /// Records which family runs here and its conversation id (at launch or re-adoption).
    pub fn bind_harness(&self, family: Family, conversation: Option<String>) {
        if let Ok(mut h) = self.harness.lock() {
            *h = Some((family, conversation));
        }
    }

    /// The conversation id bound to this generation (chosen at launch, or named by the
    /// harness at its first session).
    pub fn conversation(&self) -> Option<String> {
        self.harness
            .lock()
            .ok()
            .and_then(|h| h.as_ref().and_then(|(_, c)| c.clone()))
    }

    /// The bound family; `None` (nothing bound) refuses every family-specific request.
    fn family(&self) -> Option<Family> {
        self.harness
            .lock()
            .ok()
            .and_then(|h| h.as_ref().map(|(f, _)| *f))
    }

    fn observe(&self, f: impl FnOnce(&mut Observed)) {
        if let Ok(mut o) = self.observed.lock() {
            f(&mut o);
        }
    }

    /// The advisory observations so far.
    pub fn observations(&self) -> Observed {
        self.observed.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// Takes `answer` as this generation's ACK if it binds the challenge. Returns whether it
    /// was taken; an answer given before the challenge, or one that does not carry the
    /// phrase, is refused (and counted).
    fn take_answer(&self, answer: &str) -> Result<(), &'static str> {
        if self.delivered.borrow().is_none() {
            return Err("fetch the contract before acknowledging it");
        }
        let phrase = self.phrase.borrow().clone();
        let Some(phrase) = phrase else {
            return Err("no activation challenge has been issued to this generation yet");
        };
        let key = self
            .contract
            .borrow()
            .as_ref()
            .map(|c| c.key.clone())
            .unwrap_or_default();
        if key.is_empty() || !crate::adapter::answer_binds(answer, &phrase, &key) {
            self.observe(|o| o.ack_refused += 1);
            return Err("the answer does not bind this generation's challenge");
        }
        self.ack_requested.send_replace(true);
        Ok(())
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LaneRequest {
    Contract,
    /// Wait for the activation challenge (families that fetch it over this socket).
    Challenge,
    /// Answer the challenge: `response` must carry `mosaic-ack:<phrase>`.
    Ack {
        response: String,
    },
    /// One event of the harness's own lifecycle, forwarded unchanged by its hook assets.
    Hook {
        family: String,
        event: String,
        payload: serde_json::Value,
    },
    /// Acknowledge this generation's handoff challenge (spec §8.1); answered once the
    /// handoff was accepted (the activation challenge arrived) or the generation ended.
    HandoffAck,
    /// Progress with its evidence: the bytes of a file (hex), or a commit id.
    Progress {
        kind: String,
        evidence_hex: String,
        #[serde(default)]
        next_action: Option<String>,
    },
    /// Blocked: a canonical code, the evidence file's bytes (hex), the unblock action.
    Blocked {
        code: String,
        evidence_hex: String,
        next_action: String,
    },
    /// The harness is settled and waits for the coordinator's next continuation.
    Next,
    /// The result of a continuation, with its evidence bytes (hex).
    ContinuationResult {
        continuation_id: String,
        evidence_hex: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub struct LaneResponse {
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub contract: Option<Contract>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continuation: Option<Continuation>,
    /// The activation check to answer (`mosaic-challenge:<phrase>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<String>,
    /// What a hook prints for its harness (e.g. the contract as additional context).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl LaneResponse {
    fn ok(state: &str) -> Self {
        Self {
            ok: true,
            contract: None,
            state: Some(state.into()),
            error: None,
            continuation: None,
            challenge: None,
            output: None,
        }
    }
}

/// Serves the socket at `path` until the task is aborted. Only peers whose cgroup is
/// `cgroup_rel` are answered.
pub(crate) fn serve(
    path: &Path,
    cgroup_rel: String,
    s: Arc<GenSession>,
) -> Result<tokio::task::JoinHandle<()>, super::SupervisorError> {
    let listener: UnixListener = super::generation::bind_socket(path)?;
    Ok(tokio::spawn(async move {
        // Every connection is a task of this set, owned by the server task: when the
        // generation's socket is ended (its task aborted), every request still waiting on
        // it (a `lane next` waiting settled, a challenge) ends with it.
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    // Out of descriptors, an aborted connection: transient. Ending here
                    // would end every request still waiting on this socket.
                    Err(e) => {
                        tracing::warn!(error = %e, "lane socket accept failed; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            };
            let peer_ok = stream
                .peer_cred()
                .ok()
                .and_then(|c| c.pid())
                .and_then(|pid| crate::cgroup::cgroup_of(Some(pid)).ok())
                .is_some_and(|cg| cg == cgroup_rel);
            let s = s.clone();
            conns.spawn(async move {
                let (r, mut w) = stream.into_split();
                // One request line, bounded: evidence (hex) or a hook event at most.
                let cap = (2 * MAX_EVIDENCE_BYTES).max(1 << 20) as u64 + 65_536;
                let mut lines = BufReader::new(tokio::io::AsyncReadExt::take(r, cap)).lines();
                let Ok(Some(line)) = lines.next_line().await else {
                    return;
                };
                let resp = if !peer_ok {
                    err("this socket only answers processes of its own generation")
                } else {
                    match serde_json::from_str::<LaneRequest>(&line) {
                        Ok(LaneRequest::Contract) => contract(&s).await,
                        Ok(LaneRequest::Challenge) => challenge(&s).await,
                        Ok(LaneRequest::Ack { response }) => ack(&s, &response).await,
                        Ok(LaneRequest::Hook {
                            family,
                            event,
                            payload,
                        }) => hook(&s, &family, &event, &payload).await,
                        Ok(LaneRequest::HandoffAck) => handoff_ack(&s).await,
                        Ok(LaneRequest::Next) => next(&s).await,
                        Ok(
                            r @ (LaneRequest::Progress { .. }
                            | LaneRequest::Blocked { .. }
                            | LaneRequest::ContinuationResult { .. }),
                        ) => report(&s, r),
                        Err(e) => err(&format!("bad request: {e}")),
                    }
                };
                if let Ok(mut out) = serde_json::to_vec(&resp) {
                    out.push(b'\n');
                    let _ = w.write_all(&out).await;
                }
            });
        }
    }))
}

fn err(msg: &str) -> LaneResponse {
    LaneResponse {
        ok: false,
        contract: None,
        state: None,
        error: Some(msg.into()),
        continuation: None,
        challenge: None,
        output: None,
    }
}

async fn wait_contract(s: &GenSession) -> Result<Contract, LaneResponse> {
    let mut rx = s.contract.subscribe();
    let c = match rx.wait_for(|c| c.is_some()).await {
        Ok(c) => c.clone(),
        Err(_) => return Err(err("the generation ended")),
    };
    c.ok_or_else(|| err("no contract"))
}

async fn contract(s: &GenSession) -> LaneResponse {
    match s.family() {
        Some(f) if f.adapter().surfaces().0 == ContractInjection::SocketFetch => {}
        Some(_) => {
            return err("this harness receives its contract through its own session-start surface")
        }
        None => return err("no harness is bound to this generation"),
    }
    match wait_contract(s).await {
        Ok(c) => {
            s.delivered.send_replace(Some(c.contracts_digest.clone()));
            LaneResponse {
                contract: Some(c),
                state: None,
                ..LaneResponse::ok("")
            }
        }
        Err(e) => e,
    }
}

/// Waits for the activation challenge and hands over the phrase to answer (families that
/// fetch it here; the others get it as a turn in their pane).
async fn challenge(s: &GenSession) -> LaneResponse {
    match s.family() {
        Some(f) if f.adapter().challenge_delivery() == ChallengeDelivery::SocketFetch => {}
        Some(_) => return err("this harness receives its activation check in its pane, not here"),
        None => return err("no harness is bound to this generation"),
    }
    if matches!(*s.activation.borrow(), Some(Ok(()))) {
        // Already active (a restarted supervisor serving an activated generation again).
        return LaneResponse::ok("active");
    }
    if s.delivered.borrow().is_none() {
        return err("fetch the contract before asking for the challenge");
    }
    let mut rx = s.phrase.subscribe();
    let mut act = s.activation.subscribe();
    tokio::select! {
        r = rx.wait_for(|p| p.is_some()) => match r.map(|p| p.clone()) {
            Ok(Some(p)) => LaneResponse {
                challenge: Some(crate::adapter::ackline::challenge(&p)),
                ..LaneResponse::ok("challenged")
            },
            _ => err("the generation ended"),
        },
        r = act.wait_for(|a| matches!(a, Some(Err(_)))) => match r.map(|v| v.clone()) {
            Ok(Some(Err(e))) => err(&e),
            _ => err("the generation ended"),
        },
    }
}

async fn ack(s: &GenSession, response: &str) -> LaneResponse {
    match s.family() {
        Some(f) if f.adapter().challenge_delivery() == ChallengeDelivery::SocketFetch => {}
        Some(_) => return err("this harness acknowledges through its own turn, not here"),
        None => return err("no harness is bound to this generation"),
    }
    if let Err(e) = s.take_answer(response) {
        return err(e);
    }
    let mut rx = s.activation.subscribe();
    let v = match rx.wait_for(|a| a.is_some()).await {
        Ok(v) => v.clone(),
        Err(_) => return err("the generation ended"),
    };
    match v {
        Some(Ok(())) => LaneResponse::ok("active"),
        Some(Err(e)) => err(&e),
        None => err("no activation"),
    }
}

/// One event from the harness's hook assets: interpreted by its family's adapter, checked
/// against the generation's conversation id; never waits for the chain.
async fn hook(
    s: &GenSession,
    family: &str,
    event: &str,
    payload: &serde_json::Value,
) -> LaneResponse {
    let bound = s.harness.lock().ok().and_then(|h| h.clone());
    let Some((fam, conversation)) = bound else {
        return err("no harness is bound to this generation");
    };
    if Family::parse(family) != Some(fam) {
        s.observe(|o| o.refused_events += 1);
        return err(&format!(
            "this generation runs {}, not {family}",
            fam.name()
        ));
    }
    let adapter = fam.adapter();
    // A harness that names its own conversation: its first naming binds it.
    let conversation = match (conversation, adapter.names_conversation(event, payload)) {
        (None, Some(named)) => {
            if let Ok(mut h) = s.harness.lock() {
                if let Some((_, c @ None)) = h.as_mut() {
                    *c = Some(named.clone());
                }
            }
            s.conversation()
        }
        (c, _) => c,
    };
    let ev = match adapter.hook(event, payload, conversation.as_deref()) {
        Ok(ev) => ev,
        Err(e) => {
            s.observe(|o| o.refused_events += 1);
            return err(&e);
        }
    };
    match ev {
        HookEvent::SessionStart => {
            if s.delivered.borrow().is_some() {
                s.observe(|o| o.refused_events += 1);
                return err("the contract was already delivered to this generation");
            }
            let c = match wait_contract(s).await {
                Ok(c) => c,
                Err(e) => return e,
            };
            let text = crate::adapter::contract_context(&c.task_text, &c.contracts_digest, &c.key);
            let output = adapter.render_contract(&text);
            s.delivered.send_replace(Some(c.contracts_digest.clone()));
            LaneResponse {
                output: Some(output),
                ..LaneResponse::ok("contract delivered")
            }
        }
        HookEvent::ContextCompacted => {
            // Only the contract this generation already received, never a first delivery
            // (that is SessionStart's, checked before any challenge).
            let Some(delivered) = s.delivered.borrow().clone() else {
                s.observe(|o| o.refused_events += 1);
                return err("a compaction before any contract was delivered");
            };
            let c = match wait_contract(s).await {
                Ok(c) => c,
                Err(e) => return e,
            };
            if c.contracts_digest != delivered {
                s.observe(|o| o.refused_events += 1);
                return err("the contract changed since it was delivered");
            }
            let text = crate::adapter::contract_context(&c.task_text, &c.contracts_digest, &c.key);
            s.observe(|o| o.compactions += 1);
            LaneResponse {
                output: Some(adapter.render_contract(&text)),
                ..LaneResponse::ok("contract delivered again after a compaction")
            }
        }
        HookEvent::TurnStarted => {
            s.observe(|o| {
                o.turns_started += 1;
                o.busy = true;
            });
            LaneResponse::ok("turn started")
        }
        HookEvent::Settled { last_message } => {
            s.observe(|o| {
                o.settled += 1;
                o.busy = false;
                o.last_settled_at = Some(crate::util::now_rfc3339());
            });
            // Only the end of a turn that started after the activation check was submitted
            // answers it (a turn already running then, like Codex's bootstrap, does not).
            let after = s
                .answer_turns_after
                .load(std::sync::atomic::Ordering::SeqCst);
            let answering = s.observations().turns_started > after;
            let unacked = s.phrase.borrow().is_some() && !*s.ack_requested.borrow();
            if let (true, true, Some(m)) = (unacked, answering, last_message) {
                if let Err(e) = s.take_answer(&m) {
                    tracing::warn!(
                        reason = e,
                        "a harness turn ended without acknowledging its challenge"
                    );
                    return LaneResponse::ok(
                        "settled; the answer did not acknowledge the challenge",
                    );
                }
                return LaneResponse::ok("settled; acknowledged");
            }
            LaneResponse::ok("settled")
        }
        HookEvent::SessionEnd { reason } => {
            s.observe(|o| o.session_end = Some(reason));
            LaneResponse::ok("session end noted")
        }
        HookEvent::Conversation { id } => {
            let bound = match s.harness.lock() {
                Ok(mut h) => match h.as_mut() {
                    Some((_, c @ None)) => {
                        *c = Some(id);
                        true
                    }
                    _ => false,
                },
                Err(_) => false,
            };
            if bound {
                LaneResponse::ok("conversation bound")
            } else {
                s.observe(|o| o.refused_events += 1);
                err("this generation's conversation is already bound")
            }
        }
        HookEvent::Ignored => LaneResponse::ok("noted"),
    }
}

/// The harness is settled: it waits here until a continuation's acceptance is committed,
/// then gets it — each continuation once.
async fn next(s: &GenSession) -> LaneResponse {
    if !matches!(*s.activation.borrow(), Some(Ok(()))) {
        return err("only an active generation takes continuations");
    }
    let mut rx = s.next.subscribe();
    // "Waiting settled" lasts exactly as long as this request: a guard clears it however
    // the wait ends (answered, the connection's task aborted with the generation's socket).
    struct Waiting<'a>(&'a watch::Sender<bool>);
    impl Drop for Waiting<'_> {
        fn drop(&mut self) {
            self.0.send_replace(false);
        }
    }
    s.settled.send_replace(true);
    let waiting = Waiting(&s.settled);
    let got = rx
        .wait_for(|c| {
            c.as_ref().is_some_and(|c| {
                s.visible
                    .lock()
                    .map(|v| !v.contains(&c.continuation_id))
                    .unwrap_or(false)
            })
        })
        .await
        .map(|c| c.clone());
    drop(waiting);
    match got {
        Ok(Some(c)) => {
            // Visible exactly once: recorded before the harness sees it.
            match s.visible.lock() {
                Ok(mut v) => {
                    if !v.insert(c.continuation_id.clone()) {
                        return err("that continuation was already given");
                    }
                }
                Err(_) => return err("internal: continuation record poisoned"),
            }
            LaneResponse {
                continuation: Some(c),
                ..LaneResponse::ok("continuation")
            }
        }
        _ => err("the generation ended"),
    }
}

async fn handoff_ack(s: &GenSession) -> LaneResponse {
    if s.delivered.borrow().is_none() {
        return err("fetch the contract before acknowledging a handoff");
    }
    s.handoff_ack_requested.send_replace(true);
    let mut rx = s.challenged.subscribe();
    let mut act = s.activation.subscribe();
    tokio::select! {
        r = rx.wait_for(|c| *c) => match r {
            Ok(_) => LaneResponse::ok("responsibility accepted; acknowledge the activation challenge next (mosaic lane ack)"),
            Err(_) => err("the generation ended"),
        },
        r = act.wait_for(|a| matches!(a, Some(Err(_)))) => match r {
            Ok(v) => match v.clone() {
                Some(Err(e)) => err(&e),
                _ => err("the generation ended"),
            },
            Err(_) => err("the generation ended"),
        },
    }
}

/// A report of the RUNNING harness: checked, digested here, and queued for the coordinator.
fn report(s: &GenSession, r: LaneRequest) -> LaneResponse {
    if !matches!(*s.activation.borrow(), Some(Ok(()))) {
        return err("only an active generation reports progress or a blocker");
    }
    let decode = |h: &str| -> Result<Vec<u8>, String> {
        if h.len() > 2 * MAX_EVIDENCE_BYTES {
            return Err(format!("evidence is limited to {MAX_EVIDENCE_BYTES} bytes"));
        }
        match hex::decode(h) {
            Ok(b) if !b.is_empty() => Ok(b),
            _ => Err("evidence is required (non-empty)".into()),
        }
    };
    let report = match r {
        LaneRequest::Progress {
            kind,
            evidence_hex,
            next_action,
        } => {
            if !work::EVIDENCE_KINDS.contains(&kind.as_str()) {
                return err(&format!(
                    "unknown evidence kind {kind:?}; known: {}",
                    work::EVIDENCE_KINDS.join(", ")
                ));
            }
            let bytes = match decode(&evidence_hex) {
                Ok(b) => b,
                Err(e) => return err(&e),
            };
            if kind == "commit" && !work::commit_id_ok(&bytes) {
                return err("a commit id is 40 or 64 lower-case hex digits");
            }
            if next_action
                .as_deref()
                .is_some_and(|n| !work::next_action_ok(n))
            {
                return err("a next action is one non-blank line of at most 1000 bytes");
            }
            HarnessReport::Progress {
                evidence_digest: evidence_digest(&kind, &bytes),
                kind,
                next_action,
            }
        }
        LaneRequest::Blocked {
            code,
            evidence_hex,
            next_action,
        } => {
            if !work::code_ok(&code) {
                return err("a blocker code is lower-case words joined by dashes");
            }
            if !work::next_action_ok(&next_action) {
                return err("blocked needs an executable next action (one non-blank line)");
            }
            let bytes = match decode(&evidence_hex) {
                Ok(b) => b,
                Err(e) => return err(&e),
            };
            HarnessReport::Blocked {
                evidence_digest: evidence_digest("blocker", &bytes),
                code,
                next_action,
            }
        }
        LaneRequest::ContinuationResult {
            continuation_id,
            evidence_hex,
        } => {
            if !crate::protocol::report::id_ok(&continuation_id) {
                return err("malformed continuation id");
            }
            let bytes = match decode(&evidence_hex) {
                Ok(b) => b,
                Err(e) => return err(&e),
            };
            HarnessReport::ContinuationResult {
                evidence_digest: evidence_digest("continuation-result", &bytes),
                continuation_id,
            }
        }
        LaneRequest::Contract
        | LaneRequest::Challenge
        | LaneRequest::Ack { .. }
        | LaneRequest::Hook { .. }
        | LaneRequest::HandoffAck
        | LaneRequest::Next => return err("not a report"),
    };
    if s.reports.send(report).is_err() {
        return err("the generation ended");
    }
    LaneResponse::ok("submitted")
}

/// Client side, for `mosaic lane …`: one request, one response.
pub fn call(socket: &Path, req: &LaneRequest) -> Result<LaneResponse, std::io::Error> {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket)?;
    let mut line = serde_json::to_vec(req).map_err(std::io::Error::other)?;
    line.push(b'\n');
    s.write_all(&line)?;
    let mut out = String::new();
    std::io::BufReader::new(s).read_line(&mut out)?;
    serde_json::from_str(&out).map_err(std::io::Error::other)
}

/// The path a generation's lane socket lives at (beside its shim socket).
pub(crate) fn path_for(shim_socket: &Path) -> PathBuf {
    shim_socket.with_extension("lane.sock")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    /// A request still waiting when the generation's socket is ended (its server task
    /// aborted) ends with it: no connection task outlives the generation.
    #[test]
    fn ending_the_socket_ends_the_requests_still_waiting_on_it() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let dir = std::env::temp_dir()
                .join(format!("mosaic-lanesock-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&dir).unwrap();
            // Removed also when an assertion below fails.
            struct Gone(PathBuf);
            impl Drop for Gone {
                fn drop(&mut self) {
                    let _ = std::fs::remove_dir_all(&self.0);
                }
            }
            let _gone = Gone(dir.clone());
            let path = dir.join("lane.sock");
            let s = GenSession::new();
            s.bind_harness(crate::adapter::Family::Fake, None);
            // This process is the "generation": the peer check passes, so the request
            // waits (no contract is ever set).
            let own = crate::cgroup::cgroup_of(None)
                .expect("this test needs the host's cgroup v2 (as the supervisor does)");
            let server = serve(&path, own, s.clone()).unwrap();
            let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
            c.write_all(b"{\"op\":\"contract\"}\n").await.unwrap();
            let mut buf = Vec::new();
            let waiting =
                tokio::time::timeout(Duration::from_millis(300), c.read_to_end(&mut buf)).await;
            assert!(waiting.is_err(), "the request did not wait: {buf:?}");
            server.abort();
            let ended = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut buf))
                .await
                .expect("the waiting request outlived its socket");
            assert_eq!(ended.unwrap(), 0, "{buf:?}");
        });
    }
}
