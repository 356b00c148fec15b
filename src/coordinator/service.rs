//! `mosaic coordinator`: the authority core served to hosts over the authenticated
//! WebSocket, and to operators over a local socket.
//!
//! **Owns:** the leadership loop (acquire, renew, take over after expiry), driving each
//! assignment's chain with the store's transitions as hosts report back, and the raw fence
//! tokens of chains in flight (in memory only: a restarted coordinator cannot activate a
//! chain it did not reserve, and that chain expires — fail closed).
//!
//! **Never:** mutates anything except through `Store` transitions; trusts a host message
//! that failed verification or whose issuer is not the session's TLS peer (the transport
//! refuses those before this module sees them).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch, RwLock};

use super::chain::{AckClaim, Activation, Chain, Outcome, ReserveRequest, Reserved};
use super::error::AuthorityError;
use super::leader::{Candidate, Leader};
use super::lifecycle::Reconciliation;
use super::secret::{CoordinatorSecret, FenceToken};
use super::store::Store;
use crate::protocol::canonical::{self, Value};
use crate::protocol::envelope::{n, s, Signer};
use crate::protocol::schema::MessageType;
use crate::protocol::transport::{self, Handler, ServerParams, TlsIdentity};
use crate::protocol::{Envelope, TrustRegistry, Verified};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// This coordinator's name; its principal is `coordinator:<name>`.
    pub name: String,
    pub trust_domain: String,
    /// TCP address for host sessions (mutual TLS).
    pub listen: String,
    pub database_url: String,
    /// File holding the coordinator secret (64 hex digits).
    pub secret_file: PathBuf,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub trust_registry: PathBuf,
    /// Ed25519 seeds (64 hex digits) of this coordinator's session and ordinary keys; key
    /// ids are `<principal>/session` and `<principal>/ordinary`.
    pub session_key: PathBuf,
    pub ordinary_key: PathBuf,
    /// Operator socket (mode 0600).
    pub operator_socket: PathBuf,
    pub lease_ms: Option<i64>,
    /// How long a reservation may take to reach RUNNING (default 120000 ms).
    pub reservation_ttl_ms: Option<i64>,
    /// Optional TCP address for remote operators: mutual TLS, and the client certificate
    /// must name an `operator:` principal (`mosaic pki issue-operator`).
    pub operator_listen: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Authority(#[from] AuthorityError),
    #[error(transparent)]
    Transport(#[from] transport::TransportError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub fn read_seed(path: &Path) -> Result<[u8; 32], ServiceError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ServiceError::Config(format!("{}: {e}", path.display())))?;
    let mut b = [0u8; 32];
    hex::decode_to_slice(text.trim(), &mut b)
        .map_err(|_| ServiceError::Config(format!("{}: expected 64 hex digits", path.display())))?;
    Ok(b)
}

/// A chain in flight, driven by host reports.
struct Driver {
    reserved: Reserved,
    host: String,
    task_text: String,
    target: String,
    runtime: String,
    scope: String,
    holds: String,
    policy: String,
    generation: Option<i64>,
    identity: Option<serde_json::Value>,
    contracts_digest: Option<String>,
    challenge: Option<String>,
    running: watch::Sender<Option<Result<serde_json::Value, String>>>,
}

pub struct Service {
    pub store: Store,
    leader: RwLock<Leader>,
    registry: Arc<TrustRegistry>,
    principal: String,
    domain: String,
    session: Signer,
    ordinary: Signer,
    sessions: Mutex<HashMap<String, mpsc::Sender<Vec<u8>>>>,
    drivers: Mutex<HashMap<String, Driver>>,
    reservation_ttl_ms: i64,
}

/// Scope, holds and completion-policy digests for an assignment. The operator API does not
/// take scope or holds yet: the scope binds the lane, there are no holds, and completion is
/// an operator's confirmed stop.
fn assignment_digests(lane_id: &str) -> (String, String, String) {
    let d = |domain: &str, parts: &[&[u8]]| {
        format!("sha256:{}", crate::util::sha256_hex(domain, parts))
    };
    (
        d("mosaic/scope/v1", &[lane_id.as_bytes()]),
        d("mosaic/holds/v1", &[]),
        d("mosaic/completion-policy/v1", &[b"operator-confirmed-stop"]),
    )
}

/// `issued_at` / `expires_at` of a coordinator-issued envelope: both primary-database times
/// (the deciding transition's `decided_at`, and the deadline that bounds the message).
fn issued(at: &str, until: &str) -> [(&'static str, Value); 2] {
    [("issued_at", s(at)), ("expires_at", s(until))]
}

fn key(tag: &str) -> String {
    format!("{tag}-{}", uuid::Uuid::new_v4().simple())
}

impl Service {
    /// Connects, migrates, and waits until this process leads.
    pub async fn start(cfg: &CoordinatorConfig) -> Result<Arc<Self>, ServiceError> {
        let secret_hex = std::fs::read_to_string(&cfg.secret_file)
            .map_err(|e| ServiceError::Config(format!("{}: {e}", cfg.secret_file.display())))?;
        let secret = CoordinatorSecret::from_hex(&secret_hex)
            .map_err(|e| ServiceError::Config(e.to_string()))?;
        let store = Store::connect(&cfg.database_url, secret).await?;
        store.migrate().await?;
        let text = std::fs::read_to_string(&cfg.trust_registry)
            .map_err(|e| ServiceError::Config(format!("{}: {e}", cfg.trust_registry.display())))?;
        let registry = Arc::new(
            TrustRegistry::from_toml(&text).map_err(|e| ServiceError::Config(e.to_string()))?,
        );
        let principal = format!("coordinator:{}", cfg.name);
        let cand = Candidate {
            holder: principal.clone(),
            credential_digest: format!(
                "sha256:{}",
                crate::util::sha256_hex(
                    "mosaic/coordinator-credential/v1",
                    &[&read_seed(&cfg.ordinary_key)?]
                )
            ),
            launch_id: format!("launch-{}", uuid::Uuid::new_v4().simple()),
        };
        let lease = cfg.lease_ms.unwrap_or(10_000);
        let leader = loop {
            match store.acquire(&cand, lease).await {
                Ok((l, _)) => break l,
                Err(e) if e.category().is_some() => {
                    tracing::info!(error = %e, "waiting for leadership");
                    tokio::time::sleep(Duration::from_millis((lease / 4).max(100) as u64)).await;
                }
                Err(e) => return Err(e.into()),
            }
        };
        tracing::info!(epoch = leader.epoch(), principal, "leading");
        let svc = Arc::new(Self {
            session: Signer::new(
                &format!("{principal}/session"),
                &principal,
                &cfg.trust_domain,
                read_seed(&cfg.session_key)?,
            ),
            ordinary: Signer::new(
                &format!("{principal}/ordinary"),
                &principal,
                &cfg.trust_domain,
                read_seed(&cfg.ordinary_key)?,
            ),
            store,
            leader: RwLock::new(leader),
            registry,
            principal,
            domain: cfg.trust_domain.clone(),
            sessions: Mutex::new(HashMap::new()),
            drivers: Mutex::new(HashMap::new()),
            reservation_ttl_ms: cfg.reservation_ttl_ms.unwrap_or(120_000),
        });
        tokio::spawn(svc.clone().keep_leading(cand, lease));
        tokio::spawn(svc.clone().watchdog());
        Ok(svc)
    }

    /// Renews the lease at a third of its length; if it was lost, tries to lead again.
    async fn keep_leading(self: Arc<Self>, cand: Candidate, lease: i64) {
        loop {
            tokio::time::sleep(Duration::from_millis((lease / 3).max(50) as u64)).await;
            let mut l = self.leader.read().await.clone();
            match self.store.renew(&mut l, lease).await {
                Ok(()) => *self.leader.write().await = l,
                Err(e) => {
                    tracing::warn!(error = %e, "leadership lost; trying to reacquire");
                    if let Ok((l, _)) = self.store.acquire(&cand, lease).await {
                        tracing::info!(epoch = l.epoch(), "leading again");
                        *self.leader.write().await = l;
                    }
                }
            }
        }
    }

    /// Expires chains whose reservation deadline passed before activation (database time
    /// decides, through the fenced `expire` transition).
    async fn watchdog(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let l = self.leader().await;
            let Ok(chains) = self.store.expired_chains().await else {
                continue;
            };
            for c in chains {
                match self
                    .store
                    .expire(&l, &c, &format!("expire/{}", c.reservation_id))
                    .await
                {
                    Ok(r) => {
                        tracing::warn!(lane = %c.lane_id, assignment = %c.assignment_id, to = %r.body["to"], "reservation expired before activation");
                        self.fail(
                            &c.reservation_id,
                            "the reservation expired before activation".into(),
                        );
                        if let Ok(mut m) = self.drivers.lock() {
                            m.remove(&c.reservation_id);
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "expiry not applied"),
                }
            }
        }
    }

    pub async fn leader(&self) -> Leader {
        self.leader.read().await.clone()
    }

    /// Serves host sessions on `listener` until `shutdown`.
    pub async fn serve_hosts(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        tls: TlsIdentity,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), ServiceError> {
        let store = self.store.clone();
        let params = ServerParams {
            registry: self.registry.clone(),
            audience: self.principal.clone(),
            trust_domain: self.domain.clone(),
            audit: Arc::new(move |peer: &str, category: &str, detail: &str| {
                tracing::warn!(peer, category, detail, "rejected a host frame");
                let (store, peer, category, detail) = (
                    store.clone(),
                    peer.to_string(),
                    category.to_string(),
                    detail.to_string(),
                );
                tokio::spawn(async move {
                    store
                        .audit(
                            "wire",
                            super::error::Category::BadInput,
                            None,
                            None,
                            None,
                            &format!("{peer}: {category}: {detail}"),
                        )
                        .await;
                });
            }),
        };
        transport::serve(
            listener,
            transport::server_tls(&tls)?,
            params,
            Arc::new(HostHandler(self.clone())),
            shutdown,
        )
        .await?;
        Ok(())
    }

    /// Hosts with a live session right now.
    pub fn connected_hosts(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .sessions
            .lock()
            .map(|m| {
                m.iter()
                    .filter(|(_, tx)| !tx.is_closed())
                    .map(|(h, _)| h.clone())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn push(&self, host: &str, bytes: Vec<u8>) -> Result<(), String> {
        let tx = self
            .sessions
            .lock()
            .ok()
            .and_then(|m| m.get(host).cloned())
            .ok_or_else(|| format!("{host} is not connected"))?;
        tx.try_send(bytes)
            .map_err(|e| format!("cannot send to {host}: {e}"))
    }

    fn chain_fields(d: &Driver, l: &Leader) -> Vec<(&'static str, Value)> {
        let c = &d.reserved.chain;
        vec![
            ("message_id", s(&key("msg"))),
            ("sot_incarnation", s(l.sot())),
            ("coordinator_epoch", n(l.epoch() as u64)),
            ("assignment_id", s(&c.assignment_id)),
            ("lane_id", s(&c.lane_id)),
            ("lane_incarnation_id", s(&c.lane_incarnation_id)),
            ("assignment_attempt_id", s(&c.assignment_attempt_id)),
            ("reservation_id", s(&c.reservation_id)),
            ("reservation_epoch", n(c.reservation_epoch as u64)),
            ("reservation_deadline", s(&d.reserved.deadline)),
            ("runtime_id", s(&d.runtime)),
            ("generation", n(d.generation.unwrap_or(0) as u64)),
            // A reference to the fence, never the token itself.
            (
                "fence_proof",
                s(&format!(
                    "fence-ref:{}",
                    &crate::util::sha256_hex("mosaic/fence-ref/v1", &[c.reservation_id.as_bytes()])
                        [..32]
                )),
            ),
        ]
    }

    /// `mosaic assign`: reserve the lane and start its chain; with `wait`, return once the
    /// generation is RUNNING (or the chain failed).
    pub async fn assign(
        self: &Arc<Self>,
        lane_id: &str,
        runtime: &str,
        task: &str,
        wait: bool,
    ) -> Result<serde_json::Value, String> {
        self.assign_or_resume(lane_id, runtime, task, wait, None)
            .await
    }

    /// Like [`Service::assign`]; with `resume`, gives that assignment (which must be in
    /// recovery) a fresh chain and generation instead of creating a new assignment.
    pub async fn assign_or_resume(
        self: &Arc<Self>,
        lane_id: &str,
        runtime: &str,
        task: &str,
        wait: bool,
        resume: Option<&str>,
    ) -> Result<serde_json::Value, String> {
        if runtime != "fake@1.0.0" {
            return Err(format!(
                "unknown runtime {runtime}; this coordinator drives fake@1.0.0"
            ));
        }
        if task.trim().is_empty() {
            return Err("a task text is required".into());
        }
        let l = self.leader().await;
        let lane = self
            .store
            .lane(lane_id)
            .await
            .map_err(|e| e.to_string())?
            .ok_or(format!("no lane {lane_id}"))?;
        let host = format!("host:{}", lane_id.split(':').next().unwrap_or(""));
        // A host that is not connected could never start the generation: refuse before
        // reserving anything.
        if !self.connected_hosts().contains(&host) {
            return Err(format!("{host} is not connected to this coordinator"));
        }
        let (scope, holds, policy) = assignment_digests(lane_id);
        let req = ReserveRequest {
            lane_incarnation_id: lane.lane_incarnation_id.clone(),
            assignment_id: resume.map(String::from),
            target: lane_id.to_string(),
            runtime_id: runtime.into(),
            scope_digest: scope.clone(),
            holds_digest: holds.clone(),
            completion_policy_digest: policy.clone(),
            next_action: format!("run: {}", task.chars().take(80).collect::<String>()),
            ttl_ms: self.reservation_ttl_ms,
            idempotency_key: key("reserve"),
        };
        let reserved = self
            .store
            .reserve(&l, &req)
            .await
            .map_err(|e| e.to_string())?;
        let c = reserved.chain.clone();
        self.store
            .checkpoint(&l, &c, &key("checkpoint"))
            .await
            .map_err(|e| e.to_string())?;
        self.store
            .fence(&l, &c, &key("fence"))
            .await
            .map_err(|e| e.to_string())?;
        let (generation, staged) = self
            .store
            .stage(&l, &c, &key("stage"))
            .await
            .map_err(|e| e.to_string())?;
        let (tx, mut rx) = watch::channel(None);
        let d = Driver {
            reserved,
            host: host.clone(),
            task_text: task.into(),
            target: lane_id.into(),
            runtime: runtime.into(),
            scope,
            holds,
            policy,
            generation: Some(generation),
            identity: None,
            contracts_digest: None,
            challenge: None,
            running: tx,
        };
        let mut f = Self::chain_fields(&d, &l);
        f.push(("idempotency_key", s(&format!("stage/{}", c.reservation_id))));
        f.extend(issued(&staged.decided_at, &d.reserved.deadline));
        f.retain(|(k, _)| !matches!(*k, "contracts_digest" | "scope_digest" | "holds_digest"));
        let stage = self
            .ordinary
            .sign(MessageType::Stage, &host, f)
            .map_err(|e| e.to_string())?;
        if let Ok(mut m) = self.drivers.lock() {
            m.insert(c.reservation_id.clone(), d);
        }
        self.push(&host, stage)?;
        let base = json!({ "assignment_id": c.assignment_id, "lane_id": lane_id, "generation": generation, "lane_incarnation_id": c.lane_incarnation_id });
        if !wait {
            return Ok(
                json!({ "assignment_id": c.assignment_id, "lane_id": lane_id, "generation": generation, "state": "STAGING" }),
            );
        }
        let outcome =
            tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|v| v.is_some())).await;
        match outcome {
            Ok(Ok(v)) => match v.clone() {
                Some(Ok(identity)) => {
                    let mut out = base;
                    out["state"] = json!("RUNNING");
                    out["process_identity"] = json!({
                        "root_pid": identity["root_pid"], "start_time": identity["root_start_time"],
                        "cgroup_path": identity["cgroup_path"], "launch_nonce_digest": identity["launch_nonce_digest"] });
                    Ok(out)
                }
                Some(Err(e)) => Err(e),
                None => Err("no outcome".into()),
            },
            _ => Err("timed out waiting for RUNNING".into()),
        }
    }

    /// `mosaic stop`: drain and retire the assignment, then have the host stop it; returns
    /// once the lane is back to IDLE_CLEAN (or quarantined).
    pub async fn stop(self: &Arc<Self>, assignment_id: &str) -> Result<serde_json::Value, String> {
        let l = self.leader().await;
        let (chain, host, generation) = {
            let m = self.drivers.lock().map_err(|_| "poisoned")?;
            let d = m
                .values()
                .find(|d| d.reserved.chain.assignment_id == assignment_id)
                .ok_or(format!("no running chain for {assignment_id}"))?;
            (d.reserved.chain.clone(), d.host.clone(), d.generation)
        };
        self.store
            .drain(&l, &chain, Outcome::Completed, &key("drain"))
            .await
            .map_err(|e| e.to_string())?;
        let evidence = format!(
            "sha256:{}",
            crate::util::sha256_hex("mosaic/operator-stop/v1", &[assignment_id.as_bytes()])
        );
        let retired = self
            .store
            .retire(&l, &chain, &evidence, &key("retire"))
            .await
            .map_err(|e| e.to_string())?;
        let d = {
            let m = self.drivers.lock().map_err(|_| "poisoned")?;
            m.get(&chain.reservation_id).map(|d| {
                (
                    Self::chain_fields(d, &l),
                    d.scope.clone(),
                    d.holds.clone(),
                    d.reserved.deadline.clone(),
                )
            })
        };
        let (mut f, scope, holds, deadline) = d.ok_or("chain vanished")?;
        f.push((
            "idempotency_key",
            s(&format!("stop/{}", chain.reservation_id)),
        ));
        f.push((
            "contracts_digest",
            s(&self.contracts_of(&chain.reservation_id).unwrap_or_default()),
        ));
        f.push(("scope_digest", s(&scope)));
        f.push(("holds_digest", s(&holds)));
        f.push(("stop_reason", s("operator")));
        f.extend(issued(&retired.decided_at, &deadline));
        let stop = self
            .ordinary
            .sign(MessageType::Stop, &host, f)
            .map_err(|e| e.to_string())?;
        self.push(&host, stop)?;
        for _ in 0..600 {
            let state = self
                .store
                .lane(&chain.lane_id)
                .await
                .map_err(|e| e.to_string())?
                .map(|v| v.state)
                .unwrap_or_default();
            if state == "IDLE_CLEAN" || state == "QUARANTINED" {
                return Ok(
                    json!({ "assignment_id": assignment_id, "lane_id": chain.lane_id, "generation": generation, "state": state, "outcome": "COMPLETED" }),
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("the generation was not observed to end".into())
    }

    fn contracts_of(&self, reservation: &str) -> Option<String> {
        self.drivers
            .lock()
            .ok()?
            .get(reservation)?
            .contracts_digest
            .clone()
    }

    fn fail(&self, reservation: &str, why: String) {
        tracing::error!(reservation, why, "chain failed");
        if let Ok(m) = self.drivers.lock() {
            if let Some(d) = m.get(reservation) {
                d.running.send_replace(Some(Err(why)));
            }
        }
    }

    async fn on_staged(&self, env: &Envelope<Verified>) -> Result<(), String> {
        let l = self.leader().await;
        let res = env.str("reservation_id").to_string();
        let identity = canonical::to_json(env.get("process_identity").ok_or("no identity")?);
        let (chain, task, generation, host, scope, holds, deadline) = {
            let mut m = self.drivers.lock().map_err(|_| "poisoned")?;
            let d = m.get_mut(&res).ok_or("staged for an unknown reservation")?;
            d.identity = Some(identity.clone());
            (
                d.reserved.chain.clone(),
                d.task_text.clone(),
                d.generation.unwrap_or(0),
                d.host.clone(),
                d.scope.clone(),
                d.holds.clone(),
                d.reserved.deadline.clone(),
            )
        };
        if env.uint("generation") != Some(generation as u64) {
            return Err("staged reports another generation".into());
        }
        self.store
            .record_staged(&l, &chain, generation, &identity, &format!("staged/{res}"))
            .await
            .map_err(|e| e.to_string())?;
        let (cd, recorded) = self
            .store
            .record_contract(
                &l,
                &chain,
                &task,
                &scope,
                &holds,
                &format!("contract/{res}"),
            )
            .await
            .map_err(|e| e.to_string())?;
        let f = {
            let mut m = self.drivers.lock().map_err(|_| "poisoned")?;
            let d = m.get_mut(&res).ok_or("chain vanished")?;
            d.contracts_digest = Some(cd.clone());
            Self::chain_fields(d, &l)
        };
        let mut f = f;
        f.extend([
            ("idempotency_key", s(&format!("contract/{res}"))),
            ("contracts_digest", s(&cd)),
            ("scope_digest", s(&scope)),
            ("holds_digest", s(&holds)),
            ("task_text", s(&task)),
        ]);
        f.extend(issued(&recorded.decided_at, &deadline));
        let env = self
            .ordinary
            .sign(MessageType::Contract, &host, f)
            .map_err(|e| e.to_string())?;
        self.push(&host, env)
    }

    async fn on_injected(&self, env: &Envelope<Verified>) -> Result<(), String> {
        let l = self.leader().await;
        let res = env.str("reservation_id").to_string();
        let identity = canonical::to_json(env.get("process_identity").ok_or("no identity")?);
        let chain = self
            .drivers
            .lock()
            .map_err(|_| "poisoned")?
            .get(&res)
            .map(|d| d.reserved.chain.clone())
            .ok_or("unknown reservation")?;
        let (ch, challenge_expires, minted) = self
            .store
            .record_injected(
                &l,
                &chain,
                env.str("delivered_contracts_digest"),
                &identity,
                60_000,
                &format!("injected/{res}"),
            )
            .await
            .map_err(|e| e.to_string())?;
        let (f, host, scope, holds) = {
            let mut m = self.drivers.lock().map_err(|_| "poisoned")?;
            let d = m.get_mut(&res).ok_or("chain vanished")?;
            d.challenge = Some(ch.clone());
            (
                Self::chain_fields(d, &l),
                d.host.clone(),
                d.scope.clone(),
                d.holds.clone(),
            )
        };
        let mut f = f;
        let cd = self.contracts_of(&res).unwrap_or_default();
        f.extend([
            ("idempotency_key", s(&format!("challenge/{res}"))),
            ("contracts_digest", s(&cd)),
            ("scope_digest", s(&scope)),
            ("holds_digest", s(&holds)),
            ("challenge_id", s(&ch)),
        ]);
        f.extend(issued(&minted.decided_at, &challenge_expires));
        let env = self
            .ordinary
            .sign(MessageType::Challenge, &host, f)
            .map_err(|e| e.to_string())?;
        self.push(&host, env)
    }

    async fn on_ack(&self, env: &Envelope<Verified>) -> Result<(), String> {
        let l = self.leader().await;
        let res = env.str("reservation_id").to_string();
        let claim = AckClaim {
            challenge_id: env.str("challenge_id").into(),
            sot_incarnation: env.str("sot_incarnation").into(),
            coordinator_epoch: env.uint("coordinator_epoch").unwrap_or(0) as i64,
            reservation_id: res.clone(),
            reservation_epoch: env.uint("reservation_epoch").unwrap_or(0) as i64,
            reservation_deadline: env.str("reservation_deadline").into(),
            lane_id: env.str("lane_id").into(),
            lane_incarnation_id: env.str("lane_incarnation_id").into(),
            assignment_id: env.str("assignment_id").into(),
            assignment_attempt_id: env.str("assignment_attempt_id").into(),
            generation: env.uint("generation").unwrap_or(0) as i64,
            process_identity: canonical::to_json(env.get("process_identity").ok_or("no identity")?),
            contracts_digest: env.str("contracts_digest").into(),
            scope_digest: env.str("scope_digest").into(),
            holds_digest: env.str("holds_digest").into(),
            runtime_id: env.str("runtime_id").into(),
            ack_digest: env.digest(),
            idempotency_key: env.str("idempotency_key").into(),
        };
        self.store
            .consume_ack(&l, &claim)
            .await
            .map_err(|e| e.to_string())?;
        let (x, host) = {
            let m = self.drivers.lock().map_err(|_| "poisoned")?;
            let d = m.get(&res).ok_or("chain vanished")?;
            let token: FenceToken = d
                .reserved
                .fence_token
                .clone()
                .ok_or("fence token not held by this coordinator")?;
            (
                Activation {
                    chain: d.reserved.chain.clone(),
                    target: d.target.clone(),
                    reservation_lease_id: d.reserved.reservation_lease_id.clone(),
                    reservation_deadline: d.reserved.deadline.clone(),
                    generation: claim.generation,
                    fence_token: token,
                    challenge_id: claim.challenge_id.clone(),
                    ack_digest: claim.ack_digest.clone(),
                    contracts_digest: claim.contracts_digest.clone(),
                    scope_digest: d.scope.clone(),
                    holds_digest: d.holds.clone(),
                    process_identity: claim.process_identity.clone(),
                    completion_policy_digest: d.policy.clone(),
                    lease_scopes: vec!["repo-write".into(), "effect".into()],
                    lease_ttl_ms: 3_600_000,
                    idempotency_key: format!("activate/{res}"),
                },
                d.host.clone(),
            )
        };
        let activated = self
            .store
            .activate(&l, &x)
            .await
            .map_err(|e| e.to_string())?;
        let lease_until = activated.body["leases"][0]["expires_at"]
            .as_str()
            .unwrap_or(&activated.decided_at)
            .to_string();
        let f = {
            let m = self.drivers.lock().map_err(|_| "poisoned")?;
            m.get(&res)
                .map(|d| Self::chain_fields(d, &l))
                .ok_or("chain vanished")?
        };
        let mut f = f;
        f.extend([
            ("idempotency_key", s(&format!("activate/{res}"))),
            ("contracts_digest", s(&x.contracts_digest)),
            ("scope_digest", s(&x.scope_digest)),
            ("holds_digest", s(&x.holds_digest)),
            ("control_op", s("activate")),
        ]);
        f.extend(issued(&activated.decided_at, &lease_until));
        let env = self
            .ordinary
            .sign(MessageType::Control, &host, f)
            .map_err(|e| e.to_string())?;
        self.push(&host, env)?;
        if let Ok(m) = self.drivers.lock() {
            if let Some(d) = m.get(&res) {
                d.running
                    .send_replace(Some(Ok(claim.process_identity.clone())));
            }
        }
        Ok(())
    }

    async fn on_receipt(&self, env: &Envelope<Verified>) -> Vec<Vec<u8>> {
        let l = self.leader().await;
        let body = canonical::to_json(env.get("receipt").unwrap_or(&Value::Null));
        let key = env.str("receipt_idempotency_key").to_string();
        match self.store.ingest_termination(&l, &body).await {
            Ok((rec, _)) => {
                tracing::info!(key, ?rec, "termination receipt reconciled");
                if rec == Reconciliation::RetirementEvidence {
                    let chain =
                        self.chain_for(env.str("lane_incarnation_id"), env.uint("generation"));
                    if let Some(c) = chain {
                        if let Err(e) = self
                            .store
                            .finish(&l, &c, &key, &format!("finish/{key}"))
                            .await
                        {
                            tracing::error!(error = %e, "cannot finish the retired chain");
                        }
                    }
                }
                // An unrequested end of a chain still being driven fails it.
                if let Some(res) =
                    self.reservation_for(env.str("lane_incarnation_id"), env.uint("generation"))
                {
                    self.fail(
                        &res,
                        format!(
                            "the generation ended ({})",
                            body["termination_reason"].as_str().unwrap_or("unknown")
                        ),
                    );
                }
                // The chain is over on the host: forget its driver (and its fence token).
                self.forget(env.str("lane_incarnation_id"), env.uint("generation"));
            }
            Err(e) => {
                tracing::error!(key, error = %e, "termination receipt not ingested");
                return vec![];
            }
        }
        let ack = self.session.sign(
            MessageType::ReceiptAck,
            env.str("issuer"),
            vec![
                ("message_id", s(&key_msg())),
                ("idempotency_key", s(&format!("receipt-ack/{key}"))),
                ("sot_incarnation", Value::Null),
                ("coordinator_epoch", Value::Null),
                ("assignment_id", Value::Null),
                ("session_id", s(env.str("session_id"))),
                ("receipt_idempotency_key", s(&key)),
            ],
        );
        ack.map(|a| vec![a]).unwrap_or_default()
    }

    /// Drops the driver of the chain whose generation ended (its raw fence token with it).
    fn forget(&self, inc: &str, generation: Option<u64>) {
        if let Ok(mut m) = self.drivers.lock() {
            m.retain(|_, d| {
                !(d.reserved.chain.lane_incarnation_id == inc
                    && d.generation.map(|g| g as u64) == generation)
            });
        }
    }

    fn chain_for(&self, inc: &str, generation: Option<u64>) -> Option<Chain> {
        let m = self.drivers.lock().ok()?;
        m.values()
            .find(|d| {
                d.reserved.chain.lane_incarnation_id == inc
                    && d.generation.map(|g| g as u64) == generation
            })
            .map(|d| d.reserved.chain.clone())
    }

    fn reservation_for(&self, inc: &str, generation: Option<u64>) -> Option<String> {
        let m = self.drivers.lock().ok()?;
        m.values()
            .find(|d| {
                d.reserved.chain.lane_incarnation_id == inc
                    && d.generation.map(|g| g as u64) == generation
                    && d.running.borrow().is_none()
            })
            .map(|d| d.reserved.chain.reservation_id.clone())
    }
}

fn key_msg() -> String {
    key("msg")
}

struct HostHandler(Arc<Service>);

impl Handler for HostHandler {
    fn opened(&self, peer: &str, push: mpsc::Sender<Vec<u8>>) {
        if let Ok(mut m) = self.0.sessions.lock() {
            m.insert(peer.to_string(), push);
        }
    }

    fn handle(&self, peer: String, env: Envelope<Verified>) -> BoxFuture<'static, Vec<Vec<u8>>> {
        let svc = self.0.clone();
        Box::pin(async move {
            let res = env.str("reservation_id").to_string();
            let step = match env.message_type() {
                MessageType::Hello => {
                    let l = svc.leader().await;
                    let host_id = env.str("host_id").to_string();
                    if peer != format!("host:{host_id}") {
                        tracing::warn!(peer, host_id, "hello names another host");
                        return vec![];
                    }
                    if let Some(Value::Array(lanes)) = env.get("lanes") {
                        for lane in lanes.iter().filter_map(Value::as_str) {
                            let Some((name, inc)) = lane.split_once('@') else {
                                continue;
                            };
                            let lane_id = format!("{host_id}:{name}");
                            if let Err(e) = svc
                                .store
                                .adopt_lane_incarnation(&l, &lane_id, &host_id, inc)
                                .await
                            {
                                tracing::warn!(lane_id, error = %e, "lane not registered");
                            }
                        }
                    }
                    return vec![];
                }
                MessageType::Receipt => return svc.on_receipt(&env).await,
                MessageType::Staged => svc.on_staged(&env).await,
                MessageType::Injected => svc.on_injected(&env).await,
                MessageType::Ack => svc.on_ack(&env).await,
                _ => Ok(()),
            };
            if let Err(e) = step {
                svc.fail(&res, e);
            }
            vec![]
        })
    }
}

/// The operator API: one JSON request per line on a Unix socket only the owner can open.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum OperatorRequest {
    Lanes,
    Status,
    Assign {
        lane_id: String,
        runtime: String,
        task: String,
        #[serde(default)]
        wait: bool,
        /// Resume this assignment (in recovery) instead of creating a new one.
        #[serde(default)]
        resume: Option<String>,
    },
    Receipts {
        lane_id: Option<String>,
    },
    Stop {
        assignment_id: String,
    },
}

/// Binds the operator socket (mode 0600) so it exists before anyone is told it does.
pub fn bind_operators(path: &Path) -> Result<tokio::net::UnixListener, ServiceError> {
    if let Some(dir) = path.parent() {
        crate::util::durable::ensure_dir(dir, 0o700)
            .map_err(|e| ServiceError::Config(e.to_string()))?;
    }
    let _ = std::fs::remove_file(path);
    let listener = tokio::net::UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

pub async fn serve_operators(
    svc: Arc<Service>,
    listener: tokio::net::UnixListener,
) -> Result<(), ServiceError> {
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(operator_session(svc.clone(), stream));
    }
}

/// Remote operators: mutual TLS with a CA-issued certificate naming `operator:<name>`.
pub async fn serve_remote_operators(
    svc: Arc<Service>,
    listener: tokio::net::TcpListener,
    tls: TlsIdentity,
) -> Result<(), ServiceError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(transport::server_tls(&tls)?);
    loop {
        let (tcp, addr) = listener.accept().await?;
        let (svc, acceptor) = (svc.clone(), acceptor.clone());
        tokio::spawn(async move {
            let Ok(Ok(stream)) =
                tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
            else {
                tracing::warn!(%addr, "operator TLS handshake failed");
                return;
            };
            let principal = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| crate::pki::principal_of(c));
            match principal {
                Some(p) if p.starts_with("operator:") => {
                    tracing::info!(operator = %p, %addr, "operator connected");
                    operator_session(svc, stream).await;
                }
                other => tracing::warn!(?other, %addr, "refused: not an operator certificate"),
            }
        });
    }
}

/// One operator connection: JSON requests, one per line, answered in order.
async fn operator_session<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    svc: Arc<Service>,
    stream: S,
) {
    let (r, mut w) = tokio::io::split(stream);
    let mut lines = tokio::io::BufReader::new(r).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let resp = match serde_json::from_str::<OperatorRequest>(&line) {
            Err(e) => json!({ "ok": false, "error": format!("bad request: {e}") }),
            Ok(req) => match operate(&svc, req).await {
                Ok(v) => json!({ "ok": true, "result": v }),
                Err(e) => json!({ "ok": false, "error": e }),
            },
        };
        let mut out = resp.to_string().into_bytes();
        out.push(b'\n');
        if w.write_all(&out).await.is_err() || w.flush().await.is_err() {
            break;
        }
    }
}

async fn operate(svc: &Arc<Service>, req: OperatorRequest) -> Result<serde_json::Value, String> {
    let e = |e: AuthorityError| e.to_string();
    Ok(match req {
        OperatorRequest::Lanes => {
            serde_json::to_value(svc.store.lanes().await.map_err(e)?).map_err(|e| e.to_string())?
        }
        OperatorRequest::Status => json!({
            "assignments": svc.store.assignment_statuses().await.map_err(e)?,
            "lanes": svc.store.lanes().await.map_err(e)?,
            "coordinator_epoch": svc.leader().await.epoch(),
            "hosts_connected": svc.connected_hosts(),
        }),
        OperatorRequest::Assign {
            lane_id,
            runtime,
            task,
            wait,
            resume,
        } => {
            svc.assign_or_resume(&lane_id, &runtime, &task, wait, resume.as_deref())
                .await?
        }
        OperatorRequest::Receipts { lane_id } => json!(svc
            .store
            .termination_receipts(lane_id.as_deref())
            .await
            .map_err(e)?),
        OperatorRequest::Stop { assignment_id } => svc.stop(&assignment_id).await?,
    })
}

/// Where an operator reaches the coordinator.
#[derive(Debug, Clone)]
pub enum OperatorTarget {
    /// The coordinator's local socket.
    Socket(PathBuf),
    /// A remote coordinator's operator listener, with this operator's certificate.
    Remote {
        addr: String,
        server_name: String,
        tls: TlsIdentity,
    },
}

/// Parses `--coordinator`: `HOST:PORT` or `tls://HOST:PORT[/]`, IPv6 hosts in brackets.
/// Returns the address to dial and the host part (the default certificate name).
pub fn parse_coordinator_addr(s: &str) -> Result<(String, String), String> {
    let rest = match s.split_once("://") {
        None => s,
        Some(("tls", rest)) => rest.trim_end_matches('/'),
        Some((scheme, _)) => {
            return Err(format!(
                "--coordinator {s}: scheme {scheme}:// is not supported; use HOST:PORT or tls://HOST:PORT (the operator listener speaks mutual TLS)"
            ))
        }
    };
    let bad = || format!("--coordinator {s}: expected HOST:PORT or tls://HOST:PORT");
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    port.parse::<u16>().map_err(|_| bad())?;
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if bare.is_empty() || rest.contains('/') || (bare == host && host.contains(':')) {
        return Err(bad());
    }
    Ok((rest.to_string(), bare.to_string()))
}

/// Sends one operator request to `target` (blocking; for the CLI and tests).
pub fn operator_request(
    target: &OperatorTarget,
    req: &OperatorRequest,
) -> Result<serde_json::Value, String> {
    match target {
        OperatorTarget::Socket(p) => operator_call(p, req),
        OperatorTarget::Remote {
            addr,
            server_name,
            tls,
        } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            rt.block_on(async {
                let cfg = transport::client_tls(tls).map_err(|e| e.to_string())?;
                let tcp = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("cannot reach {addr}: {e}"))?;
                let name = rustls::pki_types::ServerName::try_from(server_name.clone())
                    .map_err(|e| e.to_string())?;
                let mut s = tokio_rustls::TlsConnector::from(cfg)
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS: {e}"))?;
                let mut line = serde_json::to_vec(req).map_err(|e| e.to_string())?;
                line.push(b'\n');
                s.write_all(&line).await.map_err(|e| e.to_string())?;
                s.flush().await.map_err(|e| e.to_string())?;
                let mut out = String::new();
                tokio::io::BufReader::new(s)
                    .read_line(&mut out)
                    .await
                    .map_err(|e| e.to_string())?;
                decode_operator_response(&out)
            })
        }
    }
}

fn decode_operator_response(out: &str) -> Result<serde_json::Value, String> {
    if out.is_empty() {
        return Err(
            "the coordinator closed the connection (is this an operator certificate from its CA?)"
                .into(),
        );
    }
    let v: serde_json::Value = serde_json::from_str(out).map_err(|e| e.to_string())?;
    if v["ok"] == true {
        Ok(v["result"].clone())
    } else {
        Err(v["error"].as_str().unwrap_or("refused").to_string())
    }
}

/// Sends one operator request over the local socket (blocking; for the CLI and tests).
pub fn operator_call(path: &Path, req: &OperatorRequest) -> Result<serde_json::Value, String> {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path)
        .map_err(|e| format!("cannot reach the coordinator at {}: {e}", path.display()))?;
    let mut line = serde_json::to_vec(req).map_err(|e| e.to_string())?;
    line.push(b'\n');
    s.write_all(&line).map_err(|e| e.to_string())?;
    let mut out = String::new();
    std::io::BufReader::new(s)
        .read_line(&mut out)
        .map_err(|e| e.to_string())?;
    decode_operator_response(&out)
}

/// Runs the coordinator daemon until SIGTERM/SIGINT.
pub async fn run_daemon(cfg: CoordinatorConfig) -> Result<(), ServiceError> {
    let svc = Service::start(&cfg).await?;
    let listener = tokio::net::TcpListener::bind(&cfg.listen).await?;
    let (stop, rx) = watch::channel(false);
    let tls = TlsIdentity {
        ca: cfg.ca.clone(),
        cert: cfg.cert.clone(),
        key: cfg.key.clone(),
    };
    let hosts = tokio::spawn(svc.clone().serve_hosts(listener, tls.clone(), rx));
    let ops = tokio::spawn(serve_operators(
        svc.clone(),
        bind_operators(&cfg.operator_socket)?,
    ));
    let remote = match &cfg.operator_listen {
        Some(addr) => Some(tokio::spawn(serve_remote_operators(
            svc.clone(),
            tokio::net::TcpListener::bind(addr).await?,
            tls.clone(),
        ))),
        None => None,
    };
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    let _ = stop.send(true);
    hosts.abort();
    ops.abort();
    if let Some(r) = remote {
        r.abort();
    }
    let l = svc.leader().await;
    let _ = svc.store.release(&l).await;
    let _ = std::fs::remove_file(&cfg.operator_socket);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_coordinator_addr as p;

    #[test]
    fn coordinator_addresses_parse_or_fail_with_the_reason() {
        let ok = |a: &str, h: &str| Ok((a.to_string(), h.to_string()));
        assert_eq!(
            p("coord.example:7443"),
            ok("coord.example:7443", "coord.example")
        );
        assert_eq!(
            p("tls://coord.example:7443/"),
            ok("coord.example:7443", "coord.example")
        );
        assert_eq!(p("[::1]:7443"), ok("[::1]:7443", "::1"));
        for bad in [
            "coord.example",
            "coord:http",
            ":7443",
            "::1:7443",
            "tls://c:1/x",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert!(p("https://c:1").unwrap_err().contains("not supported"));
    }
}
