//! The broker's listener: the one way out of a confined generation.
//!
//! A confined harness has a network namespace with loopback alone (`crate::confine::net`).
//! In it, at `127.0.0.1:GATEWAY_PORT`, is a listener the shim bound and the supervisor
//! serves. It carries exactly two kinds of request, each a protected effect admitted by the
//! coordinator before it is dispatched (spec §5.5; `super::broker`):
//!
//! - **Provider requests** (origin-form, `POST /v1/messages` and the like: `provider.rs`):
//!   sent on to the runtime's declared upstream (`providers.<runtime>`; https verified
//!   against the system's roots) with the credentials added, the answer streamed back with
//!   its token usage read. Before the generation's activation nothing is sent anywhere: the
//!   gateway answers the activation exchange itself (`staging.rs`).
//! - **Egress tunnels** (`CONNECT host:port`, what `HTTPS_PROXY` makes a tool send:
//!   `egress.rs`): a TCP connection to a host the assignment's scope names
//!   (`egress:HOST[:PORT]`), never to the host's own loopback or link-local addresses.
//!
//! The generation never holds its credentials. Its environment has, for each variable of
//! the runtime's credentials file, a placeholder (`mosaic-credential-<NAME>`); the gateway
//! replaces a placeholder found in a provider request's key header with the real value,
//! which the supervisor alone read from the file. A placeholder is worth nothing elsewhere.
//!
//! Every admitted effect's outcome is observed and reported (`settle.rs`): completed,
//! failed, aborted (cut part-way, when its generation ends with it in flight) or not
//! dispatched.
//!
//! **Never:** sends a request anywhere but the declared upstream; dispatches an effect the
//! coordinator did not admit just now, or after its generation was fenced; puts a
//! credential in a log, an error, a view or a metric; replaces a placeholder in a body or
//! a URL; keeps a request's headers or body after it is answered.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;

use crate::shim::proto::SecretValue;

use super::broker::BrokerSlot;
use super::metrics::HostMetrics;

pub use crate::adapter::credentials::placeholder;

mod answer;
mod egress;
mod provider;
mod request;
mod settle;
mod staging;
#[cfg(test)]
mod tests;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("provider upstream {url:?}: {detail}")]
    Upstream { url: String, detail: String },
}

/// A provider's base URL, checked: http or https, a host, no user info, query or fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// Prefixed to every request's path ("" or "/v1", never a trailing slash).
    pub base_path: String,
}

impl Upstream {
    pub fn parse(url: &str) -> Result<Self, GatewayError> {
        // Named by scheme and host only: a URL carrying user info or a query may carry a
        // secret, and errors reach logs.
        let shown = url
            .split_once("://")
            .map(|(scheme, rest)| {
                let host = rest.split(['/', '?', '#']).next().unwrap_or("");
                let host = host.rsplit('@').next().unwrap_or(host);
                format!("{scheme}://{host}")
            })
            .unwrap_or_else(|| "(not a URL)".into());
        let bad = |detail: &str| GatewayError::Upstream {
            url: shown.clone(),
            detail: detail.to_string(),
        };
        let t = crate::util::http1::Target::parse(url).map_err(bad)?;
        if t.uri.query().is_some() || url.contains('#') {
            return Err(bad("must not carry a query or fragment"));
        }
        Ok(Self {
            https: t.https,
            base_path: t.uri.path().trim_end_matches('/').to_string(),
            host: t.host,
            port: t.port,
        })
    }

    /// The base URL, normalized.
    pub fn url(&self) -> String {
        format!(
            "{}://{}{}",
            if self.https { "https" } else { "http" },
            self.authority(),
            self.base_path
        )
    }

    fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match (self.https, self.port) {
            (true, 443) | (false, 80) => host,
            _ => format!("{host}:{}", self.port),
        }
    }
}

/// What one generation's gateway did, as its views show it.
#[derive(Debug, Default)]
pub struct Stats {
    requests: AtomicU64,
    failed: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    staged_answers: AtomicU64,
    tunnels: AtomicU64,
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StatsView {
    /// The provider's base URL; `null` for a runtime that declares none.
    pub upstream: Option<String>,
    /// Provider requests answered by the upstream (any status).
    pub requests: u64,
    /// Requests refused or not carried (not admitted, upstream unreachable, credentials
    /// unreadable, malformed).
    pub failed: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Model requests answered by the gateway itself before the generation's activation.
    pub staged_answers: u64,
    /// Egress tunnels opened.
    pub tunnels: u64,
}

/// One generation's route: where its provider requests go, what replaces their
/// placeholders, and who admits its effects.
pub struct Route {
    pub lane_id: String,
    pub generation: u64,
    pub runtime: String,
    /// The runtime's provider; `None`: it declares none (egress only).
    pub upstream: Option<Upstream>,
    /// (placeholder, real value); `Err`: the credentials could not be read (a re-adopted
    /// generation whose file went bad), and every provider request is refused with the
    /// reason.
    pub secrets: Result<Vec<(String, SecretValue)>, String>,
    pub broker: BrokerSlot,
}

/// A served gateway; dropping it stops serving (the listener's copy in the shim stays),
/// ends its tunnels and reports every effect still in flight as aborted.
pub struct Gateway {
    task: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
        self.shared.close();
    }
}

impl Gateway {
    pub fn view(&self) -> StatsView {
        self.handle().view()
    }

    /// A handle on the same counters (the live view keeps one).
    pub fn handle(&self) -> GatewayHandle {
        GatewayHandle {
            stats: self.shared.stats.clone(),
            upstream: self.shared.route.upstream.as_ref().map(Upstream::url),
        }
    }
}

/// The counters of a served gateway, for views.
#[derive(Clone, Debug)]
pub struct GatewayHandle {
    stats: Arc<Stats>,
    upstream: Option<String>,
}

impl GatewayHandle {
    pub fn view(&self) -> StatsView {
        let s = &self.stats;
        StatsView {
            upstream: self.upstream.clone(),
            requests: s.requests.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            input_tokens: s.input_tokens.load(Ordering::Relaxed),
            output_tokens: s.output_tokens.load(Ordering::Relaxed),
            staged_answers: s.staged_answers.load(Ordering::Relaxed),
            tunnels: s.tunnels.load(Ordering::Relaxed),
        }
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

struct Shared {
    route: Route,
    stats: Arc<Stats>,
    metrics: Arc<HostMetrics>,
    /// Admitted effects not yet observed to their end.
    inflight: Arc<settle::Inflight>,
    /// Set when the gateway is dropped: tunnels end.
    closed: tokio::sync::watch::Sender<bool>,
    /// Tunnels open at once.
    tunnels: Arc<tokio::sync::Semaphore>,
}

impl Shared {
    /// Counts and answers a refused request. Logged at debug: a generation must not be able
    /// to flood the supervisor's log.
    fn refuse(&self, status: StatusCode, why: &str) -> Response<Body> {
        self.stats.failed.fetch_add(1, Ordering::Relaxed);
        self.metrics
            .gateway_requests
            .get_or_create(&HostMetrics::runtime_outcome(&self.route.runtime, "failed"))
            .inc();
        tracing::debug!(lane_id = %self.route.lane_id, generation = self.route.generation, reason = why,
            "gateway refused a request");
        refusal(status, why)
    }

    /// The gateway is going away: tunnels end, and what is still in flight was cut.
    fn close(&self) {
        let _ = self.closed.send(true);
        settle::abort_all(&self.inflight);
    }
}

/// Serves `listener` (the shim's, copied) for one generation until dropped.
pub fn serve(
    listener: TcpListener,
    route: Route,
    metrics: Arc<HostMetrics>,
) -> std::io::Result<Gateway> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let shared = Arc::new(Shared {
        route,
        stats: Arc::new(Stats::default()),
        metrics,
        inflight: Default::default(),
        closed: tokio::sync::watch::channel(false).0,
        tunnels: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
    });
    // A hostile generation must not exhaust the supervisor: at most `MAX_CONNECTIONS` of
    // its connections are served at once (the rest wait in the listener's backlog), and a
    // connection that sends no complete request head in time is closed.
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let (lane_id, generation) = (shared.route.lane_id.clone(), shared.route.generation);
    let served = shared.clone();
    let task = tokio::spawn(async move {
        let shared = served;
        let mut conns = tokio::task::JoinSet::new();
        let mut saturated = false;
        loop {
            let permit = match permits.clone().try_acquire_owned() {
                Ok(p) => p,
                Err(_) => {
                    if !saturated {
                        saturated = true;
                        tracing::warn!(lane_id = %lane_id, generation,
                            "the generation holds {MAX_CONNECTIONS} gateway connections; further ones wait");
                    }
                    let Ok(p) = permits.clone().acquire_owned().await else {
                        return;
                    };
                    p
                }
            };
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        // EMFILE and the like: back off rather than spin.
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            };
            let _ = stream.set_nodelay(true);
            let shared = shared.clone();
            // Owned by this task: when the gateway is dropped, its connections end too.
            conns.spawn(async move {
                let _permit = permit;
                let svc = hyper::service::service_fn(move |req| {
                    let shared = shared.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(&shared, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEAD_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    Ok(Gateway { task, shared })
}

/// Connections of one generation served at once (and, apart, tunnels open at once).
pub const MAX_CONNECTIONS: usize = 32;
/// How long a connection has to send a request's head.
const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the upstream has to accept a connection (TLS handshake included).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);
/// How long the upstream has to begin its answer (a model may think for minutes).
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
/// The largest request body carried (it is read whole before its claim: the claim binds
/// its digest).
pub const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024;

fn refusal(status: StatusCode, message: &str) -> Response<Body> {
    let body = serde_json::json!({"error": {"type": "mosaic_gateway", "message": message}});
    let mut r = Response::new(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

async fn handle(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    if req.method() == hyper::Method::CONNECT {
        return egress::tunnel(shared, req).await;
    }
    let mut req = req;
    if req.uri().scheme().is_some() {
        // A client that sent a request for the gateway itself through its proxy variables
        // (it ignored NO_PROXY) asked for this listener: read it as the request it is.
        let to_self = req.uri().scheme_str() == Some("http")
            && req.uri().authority().map(|a| a.as_str())
                == Some(&format!("127.0.0.1:{}", crate::confine::net::GATEWAY_PORT)[..]);
        if !to_self {
            return shared.refuse(
                StatusCode::FORBIDDEN,
                "plain http is not proxied: only CONNECT tunnels (https) to hosts the scope names",
            );
        }
        let origin = req
            .uri()
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        match origin.parse() {
            Ok(u) => *req.uri_mut() = u,
            Err(_) => return shared.refuse(StatusCode::BAD_REQUEST, "malformed request path"),
        }
    }
    provider::forward(shared, req).await
}

/// The status and category a request the broker did not let through is answered with.
fn denied(shared: &Shared, d: &super::broker::Denied) -> Response<Body> {
    use super::broker::Denied;
    let status = match d {
        Denied::NoAnswer => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::FORBIDDEN,
    };
    shared.refuse(status, &format!("{d} [{}]", d.category()))
}

/// One connection to the upstream, for one request (no pooling: a generation's requests
/// are few and long).
async fn connect(
    u: &Upstream,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, String> {
    crate::util::http1::connect(u.https, &u.host, u.port, CONNECT_TIMEOUT)
        .await
        .map_err(|e| format!("upstream {e}"))
}

/// Reads a request's body whole, refusing one larger than `MAX_REQUEST_BYTES`.
async fn read_body(body: Incoming) -> Result<Bytes, &'static str> {
    http_body_util::Limited::new(body, MAX_REQUEST_BYTES)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|_| "the request body is larger than the gateway carries, or was cut off")
}
