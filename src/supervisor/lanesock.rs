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
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LaneRequest {
    Contract,
    Ack,
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
        while let Ok((stream, _)) = listener.accept().await {
            let peer_ok = stream
                .peer_cred()
                .ok()
                .and_then(|c| c.pid())
                .and_then(|pid| crate::cgroup::cgroup_of(Some(pid)).ok())
                .is_some_and(|cg| cg == cgroup_rel);
            let s = s.clone();
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut lines = BufReader::new(r).lines();
                let Ok(Some(line)) = lines.next_line().await else {
                    return;
                };
                let resp = if !peer_ok {
                    err("this socket only answers processes of its own generation")
                } else {
                    match serde_json::from_str::<LaneRequest>(&line) {
                        Ok(LaneRequest::Contract) => contract(&s).await,
                        Ok(LaneRequest::Ack) => ack(&s).await,
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
    }
}

async fn contract(s: &GenSession) -> LaneResponse {
    let mut rx = s.contract.subscribe();
    let c = match rx.wait_for(|c| c.is_some()).await {
        Ok(c) => c.clone(),
        Err(_) => return err("the generation ended"),
    };
    match c {
        Some(c) => {
            s.delivered.send_replace(Some(c.contracts_digest.clone()));
            LaneResponse {
                ok: true,
                contract: Some(c),
                state: None,
                error: None,
                continuation: None,
            }
        }
        None => err("no contract"),
    }
}

async fn ack(s: &GenSession) -> LaneResponse {
    if s.delivered.borrow().is_none() {
        return err("fetch the contract before acknowledging it");
    }
    s.ack_requested.send_replace(true);
    let mut rx = s.activation.subscribe();
    let v = match rx.wait_for(|a| a.is_some()).await {
        Ok(v) => v.clone(),
        Err(_) => return err("the generation ended"),
    };
    match v {
        Some(Ok(())) => LaneResponse {
            ok: true,
            contract: None,
            state: Some("active".into()),
            error: None,
            continuation: None,
        },
        Some(Err(e)) => err(&e),
        None => err("no activation"),
    }
}

/// The harness is settled: it waits here until a continuation's acceptance is committed,
/// then gets it — each continuation once.
async fn next(s: &GenSession) -> LaneResponse {
    if !matches!(*s.activation.borrow(), Some(Ok(()))) {
        return err("only an active generation takes continuations");
    }
    let mut rx = s.next.subscribe();
    s.settled.send_replace(true);
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
    s.settled.send_replace(false);
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
                ok: true,
                contract: None,
                state: Some("continuation".into()),
                error: None,
                continuation: Some(c),
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
            Ok(_) => LaneResponse {
                ok: true,
                contract: None,
                state: Some("responsibility accepted; acknowledge the activation challenge next (mosaic lane ack)".into()),
                error: None,
                continuation: None,
            },
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
        LaneRequest::Contract | LaneRequest::Ack | LaneRequest::HandoffAck | LaneRequest::Next => {
            return err("not a report")
        }
    };
    if s.reports.send(report).is_err() {
        return err("the generation ended");
    }
    LaneResponse {
        ok: true,
        contract: None,
        state: Some("submitted".into()),
        error: None,
        continuation: None,
    }
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
