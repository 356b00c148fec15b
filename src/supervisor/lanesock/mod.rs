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
        /// A block that ends by itself (a provider's rate limit): this long from now.
        resume_after_ms: Option<u64>,
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
    /// For a harness answering in its own turns: the phrase its handoff check carries
    /// (`adapter::handoff_phrase`), set when the handoff challenge arrives.
    pub handoff_phrase: watch::Sender<Option<String>>,
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
    /// Turns started so far (a real harness's own turn-start events): a continuation's
    /// result is the answer of a turn started after it was given.
    pub turns: watch::Sender<u64>,
    /// A turn runs (its start seen and its end not yet): a real harness's wait for a
    /// continuation is settled only while this is false.
    pub busy: watch::Sender<bool>,
    /// The continuations of offers waiting for this generation to settle, or for their
    /// acceptance to come back (`on_its_way`); one entry per offer.
    pub offers_in_flight: std::sync::Mutex<Vec<String>>,
    /// Continuations given in a row by block decisions, without a turn of its own between
    /// (Claude Code ends the turn itself after a few: `settled::MAX_BLOCKS_IN_A_ROW`).
    pub blocks_in_a_row: std::sync::atomic::AtomicU32,
    /// A turn is being typed to bring about a settled boundary (`CoordinatedHost::wake`).
    pub waking: std::sync::atomic::AtomicBool,
    /// The continuation made visible to a real harness whose result its next settled
    /// boundary brings (`settled::Awaiting`).
    pub awaiting: std::sync::Mutex<Option<settled::Awaiting>>,
    /// Continuations this process accepted. Only these are ever made visible: one accepted
    /// by a previous supervisor process may already have been shown (its visibility is
    /// unknown), so it is never shown again — the coordinator abandons it at its deadline and
    /// replaces the generation. This is what lets the set above live in memory.
    pub accepted_here: std::sync::Mutex<std::collections::HashSet<String>>,
    /// The result (evidence digest) the harness reported for each continuation, kept to
    /// answer the coordinator again if the first report was lost — on disk too
    /// (`results_path`), so a restarted supervisor answers with the result the harness gave
    /// its predecessor instead of losing it.
    pub results: std::sync::Mutex<std::collections::HashMap<String, String>>,
    /// Where `results` is kept for this generation (set at launch and at re-adoption).
    pub results_path: std::sync::OnceLock<std::path::PathBuf>,
    /// Where the conversation id a harness names at its first session is kept
    /// (`keep_conversation_at`), so a restarted supervisor binds the same one: the harness
    /// names it only once.
    conversation_path: std::sync::OnceLock<std::path::PathBuf>,
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
    /// What its pushes need (set at launch or re-adoption of a confined generation).
    pub push: std::sync::OnceLock<crate::supervisor::push::Shared>,
    /// The assignment it runs for (known from its stage; restored at re-adoption).
    pub assignment_id: std::sync::OnceLock<String>,
    /// The harness's checkpoint requests, each with where its answer goes, for the chain
    /// driver (which knows the generation's lane and chain).
    pub checkpoints: tokio::sync::mpsc::UnboundedSender<CheckpointAsk>,
    /// Asks the progress observer (`coordinated::observe`) to look now: the harness called
    /// `mosaic lane progress`.
    pub look: Arc<tokio::sync::Notify>,
    /// The provider's rate limit last seen by the gateway for this generation, until an
    /// answer ends it (`ratelimit`); reported as blocked work once.
    pub provider_limit: std::sync::Mutex<Option<ProviderLimit>>,
    /// The driver's end of `checkpoints` (taken once).
    pub checkpoints_rx:
        std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<CheckpointAsk>>>,
}

/// A provider's rate limit on a generation: when it was seen, what it said, and whether
/// the work was reported blocked for it (once per limit: an answer that succeeds ends it).
#[derive(Debug)]
pub struct ProviderLimit {
    pub since: std::time::Instant,
    pub limited: crate::supervisor::ratelimit::Limited,
    pub reported: bool,
}

/// A checkpoint request's answer channel: what was taken (and stored), or why not.
pub type CheckpointAsk = tokio::sync::oneshot::Sender<Result<serde_json::Value, String>>;

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
    /// Prompts the harness showed that wait for a human (reported as blocked work).
    pub waiting_for_input: u64,
    /// Turns that ended in an error instead of an answer (a provider's refusal).
    pub turns_failed: u64,
    /// ACK answers that did not bind the challenge (refused).
    pub ack_refused: u64,
    /// Hook events refused (wrong family, another conversation, a resumed session).
    pub refused_events: u64,
    /// Compactions the harness announced, each answered with the delivered contract.
    pub compactions: u64,
    /// Extension reloads in the same conversation, each answered with the delivered contract.
    pub reloads: u64,
    /// Attempts to replace the conversation (a new session, a resume, a fork) the harness's
    /// extension refused.
    pub replacements_refused: u64,
    pub session_end: Option<String>,
}

impl GenSession {
    pub fn new() -> Arc<Self> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (ctx, crx) = tokio::sync::mpsc::unbounded_channel();
        Arc::new(Self {
            contract: watch::channel(None).0,
            delivered: watch::channel(None).0,
            ack_requested: watch::channel(false).0,
            activation: watch::channel(None).0,
            handoff: watch::channel(None).0,
            handoff_ack_requested: watch::channel(false).0,
            handoff_phrase: watch::channel(None).0,
            challenged: watch::channel(false).0,
            settled: watch::channel(false).0,
            next: watch::channel(None).0,
            visible: std::sync::Mutex::new(std::collections::HashSet::new()),
            turns: watch::channel(0).0,
            busy: watch::channel(false).0,
            offers_in_flight: std::sync::Mutex::new(Vec::new()),
            waking: std::sync::atomic::AtomicBool::new(false),
            blocks_in_a_row: std::sync::atomic::AtomicU32::new(0),
            awaiting: std::sync::Mutex::new(None),
            accepted_here: std::sync::Mutex::new(std::collections::HashSet::new()),
            results: std::sync::Mutex::new(std::collections::HashMap::new()),
            results_path: std::sync::OnceLock::new(),
            conversation_path: std::sync::OnceLock::new(),
            reports: tx,
            reports_rx: std::sync::Mutex::new(Some(rx)),
            phrase: watch::channel(None).0,
            harness: std::sync::Mutex::new(None),
            observed: std::sync::Mutex::new(Observed::default()),
            answer_turns_after: std::sync::atomic::AtomicU64::new(u64::MAX),
            provider_limit: std::sync::Mutex::new(None),
            look: Arc::new(tokio::sync::Notify::new()),
            push: std::sync::OnceLock::new(),
            assignment_id: std::sync::OnceLock::new(),
            checkpoints: ctx,
            checkpoints_rx: std::sync::Mutex::new(Some(crx)),
        })
    }

    /// Keeps the results at `path` (a generation's own file): those a previous supervisor
    /// process kept there are loaded, and every new one is written there before the harness
    /// is answered.
    pub fn keep_results_at(&self, path: std::path::PathBuf) {
        if let Ok(bytes) = std::fs::read(&path) {
            match serde_json::from_slice::<std::collections::HashMap<String, String>>(&bytes) {
                Ok(kept) => {
                    if let Ok(mut r) = self.results.lock() {
                        r.extend(kept);
                    }
                }
                Err(e) => tracing::error!(path = %path.display(), error = %e,
                    "the kept continuation results do not decode; their continuations are abandoned at their deadline"),
            }
        }
        let _ = self.results_path.set(path);
    }

    /// Keeps the conversation id the harness names at `path` (and binds one kept there
    /// before, at `bind_harness`). Call before binding the harness.
    pub fn keep_conversation_at(&self, path: std::path::PathBuf) {
        let _ = self.conversation_path.set(path);
    }

    /// Binds the conversation the harness names, when none is bound yet (its first naming
    /// binds it; whether it did), and keeps it on disk (`keep_conversation`).
    pub fn name_conversation(&self, named: &str) -> bool {
        // An id as the harnesses make them (a UUID, `ses_…`): never blank, spaced or long,
        // so the one kept on disk reads back exactly.
        let well_formed = (1..=200).contains(&named.len())
            && named
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
        if !well_formed {
            return false;
        }
        let bound = match self.harness.lock() {
            Ok(mut h) => match h.as_mut() {
                Some((_, c @ None)) => {
                    *c = Some(named.to_string());
                    true
                }
                _ => false,
            },
            Err(_) => false,
        };
        if bound {
            self.keep_conversation(named);
        }
        bound
    }

    /// Writes the conversation id the harness just named where a restarted supervisor finds
    /// it. One that cannot be written stays bound in memory; only a restart before it is
    /// kept loses it (the harness's events are then refused as another conversation's, and
    /// the inactivity watchdog replaces the generation — never a guessed conversation).
    fn keep_conversation(&self, named: &str) {
        let Some(path) = self.conversation_path.get() else {
            return;
        };
        if let Err(e) = crate::util::durable::write_atomic(path, named.as_bytes()) {
            tracing::error!(path = %path.display(), error = %e,
                "cannot keep the harness's conversation id on disk; it is bound in memory");
        }
    }

    /// Records the harness's result for `continuation_id`: in memory, then on disk. A result
    /// that cannot be written is still held in memory and sent; only a restart before it is
    /// recorded loses it (the coordinator then abandons the continuation at its deadline and
    /// replaces the generation — never a guessed result).
    pub fn keep_result(&self, continuation_id: &str, evidence_digest: &str) {
        let Ok(mut r) = self.results.lock() else {
            return;
        };
        r.insert(continuation_id.to_string(), evidence_digest.to_string());
        let Some(path) = self.results_path.get() else {
            return;
        };
        let written = serde_json::to_vec(&*r)
            .map_err(|e| e.to_string())
            .and_then(|b| crate::util::durable::write_atomic(path, &b).map_err(|e| e.to_string()));
        if let Err(e) = written {
            tracing::error!(path = %path.display(), continuation_id, error = %e,
                "cannot keep the continuation's result on disk; it is held in memory and sent");
        }
    }

    /// Whether a continuation is on its way to the harness: an offer in flight, or one
    /// accepted here and not given yet. A Stop hook waits at its settled boundary only then.
    pub fn on_its_way(&self) -> bool {
        let offered: Vec<String> = self
            .offers_in_flight
            .lock()
            .map(|o| o.clone())
            .unwrap_or_default();
        offered.iter().any(|id| !self.given(id)) || self.on_its_way_accepted()
    }

    /// Whether a continuation accepted here waits to be given.
    pub fn on_its_way_accepted(&self) -> bool {
        self.next
            .borrow()
            .as_ref()
            .is_some_and(|c| !self.given(&c.continuation_id))
    }

    /// Whether `continuation_id` was already given to the harness.
    pub fn given(&self, continuation_id: &str) -> bool {
        self.visible
            .lock()
            .map(|v| v.contains(continuation_id))
            .unwrap_or(true)
    }

    /// Records which family runs here and its conversation id (at launch or re-adoption).
    pub fn bind_harness(&self, family: Family, conversation: Option<String>) {
        // One the harness named before a restart, kept (`keep_conversation`).
        let conversation = conversation.or_else(|| {
            let path = self.conversation_path.get()?;
            let named = std::fs::read_to_string(path).ok()?;
            (!named.is_empty()).then_some(named)
        });
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
    pub(crate) fn family(&self) -> Option<Family> {
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

    /// A turn ended (settled, or failed): the harness is idle again.
    fn turn_ended(&self, failed: bool) {
        self.observe(|o| {
            o.settled += 1;
            o.busy = false;
            o.turns_failed += u64::from(failed);
            o.last_settled_at = Some(crate::util::now_rfc3339());
        });
        self.busy.send_replace(false);
    }

    /// The advisory observations so far.
    pub fn observations(&self) -> Observed {
        self.observed.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// Takes `answer` as this generation's ACK if it binds the challenge. Returns whether it
    /// was taken; an answer given before the challenge, or one that does not carry the
    /// phrase, is refused (and counted).
    fn take_answer(&self, answer: &str) -> Result<(), &'static str> {
        self.take_check_answer(crate::adapter::Check::Activation, answer)
    }

    /// Takes `answer` as this generation's handoff ACK (a harness answering in its own
    /// turns) if it binds the handoff check; an activation answer never passes.
    fn take_handoff_answer(&self, answer: &str) -> Result<(), &'static str> {
        self.take_check_answer(crate::adapter::Check::Handoff, answer)
    }

    /// `answer` passes `check` only with that check's phrase and form and the contract key;
    /// refused (and counted) otherwise. Passing it is the harness's request to acknowledge.
    fn take_check_answer(
        &self,
        check: crate::adapter::Check,
        answer: &str,
    ) -> Result<(), &'static str> {
        use crate::adapter::Check;
        if self.delivered.borrow().is_none() {
            return Err("fetch the contract before acknowledging it");
        }
        let (phrase, asked) = match check {
            Check::Activation => (self.phrase.borrow().clone(), &self.ack_requested),
            Check::Handoff => (
                self.handoff_phrase.borrow().clone(),
                &self.handoff_ack_requested,
            ),
        };
        let Some(phrase) = phrase else {
            return Err("no such check has been issued to this generation yet");
        };
        let key = self
            .contract
            .borrow()
            .as_ref()
            .map(|c| c.key.clone())
            .unwrap_or_default();
        if key.is_empty() || !check.binds(answer, &phrase, &key) {
            self.observe(|o| o.ack_refused += 1);
            return Err("the answer does not bind this generation's check");
        }
        asked.send_replace(true);
        Ok(())
    }

    /// The provider answered this generation (`Broker::provider_answered`): a limit of
    /// [`ratelimit::BLOCK_AT_ONCE`](crate::supervisor::ratelimit::BLOCK_AT_ONCE) or longer
    /// blocks the work now; a shorter one waits for the harness's turn to end under it
    /// ([`GenSession::limit_at_settled`]); a successful answer ends it.
    pub fn provider_answered(&self, limited: Option<crate::supervisor::ratelimit::Limited>) {
        let Ok(mut g) = self.provider_limit.lock() else {
            return;
        };
        let Some(l) = limited else {
            *g = None;
            return;
        };
        // Reported while the limit it reported lasts; a 429 after that is a new limit.
        let reported = g
            .as_ref()
            .is_some_and(|p| p.reported && p.since.elapsed() < p.limited.wait);
        let at_once = l.wait >= crate::supervisor::ratelimit::BLOCK_AT_ONCE;
        if at_once && !reported {
            self.report_limit(&l.evidence, l.wait);
        }
        *g = Some(ProviderLimit {
            since: std::time::Instant::now(),
            limited: l,
            reported: reported || at_once,
        });
    }

    /// The harness's turn ended without an answer (it failed, or its last message is
    /// empty): a limit still in force and not reported yet (the harness gave up on it)
    /// blocks the work until it resets. A turn that answered is not blocked for a limit a
    /// side request met.
    pub fn limit_at_settled(&self) {
        let Ok(mut g) = self.provider_limit.lock() else {
            return;
        };
        if let Some(p) = g
            .as_mut()
            .filter(|p| !p.reported && p.since.elapsed() < p.limited.wait)
        {
            p.reported = true;
            let left = p.limited.wait.saturating_sub(p.since.elapsed());
            self.report_limit(&p.limited.evidence, left);
        }
    }

    fn report_limit(&self, evidence: &[u8], wait: std::time::Duration) {
        if !matches!(*self.activation.borrow(), Some(Ok(()))) {
            return; // before activation nothing reaches a provider
        }
        let ms = (wait.as_millis() as u64).clamp(
            1000,
            crate::coordinator::continuity::MAX_RESUME_AFTER_MS as u64,
        );
        tracing::warn!(
            resume_after_ms = ms,
            "the provider rate-limits this generation: reporting the work blocked until it resets"
        );
        let _ = self.reports.send(HarnessReport::Blocked {
            code: "rate-limited".into(),
            evidence_digest: evidence_digest("blocker", evidence),
            next_action: format!(
                "wait for the provider's rate limit to reset (in about {} s); Mosaic resumes the work then",
                ms.div_ceil(1000)
            ),
            resume_after_ms: Some(ms),
        });
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
    /// Push a bundle of the harness's branch to a configured repository (`supervisor::push`).
    Push(crate::supervisor::push::PushRequest),
    /// Checkpoint the workspace now (once RUNNING; answered once taken, and stored if the
    /// coordinator's store takes it soon).
    Checkpoint,
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
    /// What came of a push.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<crate::supervisor::push::PushAnswer>,
    /// A checkpoint taken at the harness's request: its number, digest and ids, and
    /// whether the coordinator's store holds it yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<serde_json::Value>,
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
            push: None,
            checkpoint: None,
        }
    }
}

mod serve;
pub(crate) mod settled;

pub(crate) use serve::*;

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
/// A generation's lane socket: `sock` in a directory of its own (`<tag>.lane/`), so that a
/// confined harness, which sees only that directory mounted into its namespace, sees the
/// socket a restarted supervisor binds there again (a socket file mounted on its own
/// would stay the dead one).
pub(crate) fn path_for(shim_socket: &Path) -> PathBuf {
    shim_socket.with_extension("lane").join("sock")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncReadExt;

    /// Removes its directory on drop, also when an assertion fails.
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn temp_dir() -> (PathBuf, Gone) {
        let dir =
            std::env::temp_dir().join(format!("mosaic-lanesock-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        (dir.clone(), Gone(dir))
    }

    /// The conversation a harness names binds once and is kept: a restarted supervisor's
    /// session for the same generation binds the same one (the harness never names it
    /// again), and a second naming changes neither.
    #[test]
    fn a_named_conversation_outlives_the_supervisor_process() {
        let (dir, _gone) = temp_dir();
        let path = dir.join("gen-1.conversation");
        let first = GenSession::new();
        first.keep_conversation_at(path.clone());
        first.bind_harness(crate::adapter::Family::Codex, None);
        assert!(first.name_conversation("thread-1"));
        assert!(!first.name_conversation("thread-2"));
        assert_eq!(first.conversation().as_deref(), Some("thread-1"));
        // A malformed id binds nothing.
        let blank = GenSession::new();
        blank.bind_harness(crate::adapter::Family::Codex, None);
        for bad in ["", " ", "a b", "x\n", &"y".repeat(201)] {
            assert!(!blank.name_conversation(bad), "{bad:?}");
        }
        assert_eq!(blank.conversation(), None);
        let restarted = GenSession::new();
        restarted.keep_conversation_at(path);
        restarted.bind_harness(crate::adapter::Family::Codex, None);
        assert_eq!(restarted.conversation().as_deref(), Some("thread-1"));
        assert!(!restarted.name_conversation("thread-2"));
        // Never kept where nothing asked for it.
        let elsewhere = GenSession::new();
        elsewhere.bind_harness(crate::adapter::Family::Codex, None);
        assert_eq!(elsewhere.conversation(), None);
    }

    /// A request still waiting when the generation's socket is ended (its server task
    /// aborted) ends with it: no connection task outlives the generation.
    #[test]
    fn ending_the_socket_ends_the_requests_still_waiting_on_it() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (dir, _gone) = temp_dir();
            let path = dir.join("lane.sock");
            let s = GenSession::new();
            s.bind_harness(crate::adapter::Family::Fake, None);
            // This process is the "generation": the peer check passes, so the request
            // waits (no contract is ever set).
            let own = crate::cgroup::cgroup_of(None)
                .expect("this test needs the host's cgroup v2 (as the supervisor does)");
            let server = serve(&path, own, s.clone(), None).unwrap();
            let mut c = tokio::net::UnixStream::connect(&path).await.unwrap();
            c.write_all(b"{\"op\":\"contract\"}\n").await.unwrap();
            let mut buf = Vec::new();
            let waiting =
                tokio::time::timeout(Duration::from_millis(300), c.read_to_end(&mut buf)).await;
            assert!(waiting.is_err(), "the request did not wait: {buf:?}");
            server.task.abort();
            let ended = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut buf))
                .await
                .expect("the waiting request outlived its socket");
            assert_eq!(ended.unwrap(), 0, "{buf:?}");
        });
    }

    /// A waiter at a settled boundary that goes away (its process killed, a hook past its
    /// timeout) is settled no longer: nothing is accepted for a harness nobody waits for.
    #[test]
    fn a_waiter_that_goes_away_is_no_longer_settled() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (dir, _gone) = temp_dir();
            let s = GenSession::new();
            s.bind_harness(crate::adapter::Family::Pi, Some("s1".into()));
            s.activation.send_replace(Some(Ok(())));
            let own = crate::cgroup::cgroup_of(None)
                .expect("this test needs the host's cgroup v2 (as the supervisor does)");
            let server = serve(&dir.join("lane.sock"), own, s.clone(), None).unwrap();
            let mut c = tokio::net::UnixStream::connect(dir.join("lane.sock"))
                .await
                .unwrap();
            c.write_all(b"{\"op\":\"hook\",\"family\":\"pi\",\"event\":\"next\",\"payload\":{\"session_id\":\"s1\"}}\n")
                .await
                .unwrap();
            let mut settled = s.settled.subscribe();
            tokio::time::timeout(Duration::from_secs(10), settled.wait_for(|v| *v))
                .await
                .expect("the waiter never became settled")
                .unwrap();
            drop(c);
            tokio::time::timeout(Duration::from_secs(10), settled.wait_for(|v| !*v))
                .await
                .expect("settled outlived its waiter")
                .unwrap();
            server.task.abort();
        });
    }
}
