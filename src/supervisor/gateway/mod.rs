//! The provider gateway: the one way a confined generation reaches its model provider.
//!
//! A confined harness has a network namespace with loopback alone (`crate::confine::net`).
//! In it, at `127.0.0.1:GATEWAY_PORT`, is a listener the shim bound and the supervisor
//! serves: every request to it is sent on to the runtime's declared upstream (the
//! `providers.<runtime>.upstream` base URL; https verified against the system's roots) and
//! its answer streamed back.
//!
//! The generation never holds its credentials. Its environment has, for each variable of
//! the runtime's credentials file, a placeholder (`mosaic-credential-<NAME>`); the gateway
//! replaces a placeholder found in a request's header values with the real value, which
//! the supervisor alone read from the file. A placeholder is worth nothing elsewhere: only
//! this generation's gateway replaces it, and only toward its declared upstream.
//!
//! Each answer's token usage (the `usage` fields of the Anthropic and OpenAI APIs, streamed
//! or not) is counted per generation (`host status`, `lanes`) and per runtime (metrics).
//!
//! **Never:** sends a request anywhere but the declared upstream; puts a credential in a
//! log, an error, a view or a metric; replaces a placeholder in a body or a URL; keeps a
//! request's headers or body after it is answered.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;

use crate::shim::proto::SecretValue;

use super::metrics::HostMetrics;

pub use crate::adapter::credentials::placeholder;

mod answer;
mod request;

use answer::{find, Redacted, Usage, REDACTED};
use request::{check_path, substitute, HOP_BY_HOP};

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
        let uri: hyper::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(bad("must be an http:// or https:// URL")),
        };
        let auth = uri.authority().ok_or_else(|| bad("names no host"))?;
        if auth.as_str().contains('@') {
            return Err(bad(
                "must not carry user info (credentials go in the credentials file)",
            ));
        }
        if uri.query().is_some() || url.contains('#') {
            return Err(bad("must not carry a query or fragment"));
        }
        let host = auth.host().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("names no host"));
        }
        Ok(Self {
            https,
            host: host.to_string(),
            port: auth.port_u16().unwrap_or(if https { 443 } else { 80 }),
            base_path: uri.path().trim_end_matches('/').to_string(),
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
}

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct StatsView {
    pub upstream: String,
    /// Requests answered by the upstream (any status).
    pub requests: u64,
    /// Requests the gateway could not carry (upstream unreachable, credentials unreadable).
    pub failed: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// One generation's route: where it goes and what replaces its placeholders.
pub struct Route {
    pub lane_id: String,
    pub generation: u64,
    pub runtime: String,
    pub upstream: Upstream,
    /// (placeholder, real value); `Err`: the credentials could not be read (a re-adopted
    /// generation whose file went bad), and every request is refused with the reason.
    pub secrets: Result<Vec<(String, SecretValue)>, String>,
}

/// A served gateway; dropping it stops serving (the listener's copy in the shim stays).
pub struct Gateway {
    task: tokio::task::JoinHandle<()>,
    pub stats: Arc<Stats>,
    upstream: String,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Gateway {
    pub fn view(&self) -> StatsView {
        self.handle().view()
    }

    /// A handle on the same counters (the live view keeps one).
    pub fn handle(&self) -> GatewayHandle {
        GatewayHandle {
            stats: self.stats.clone(),
            upstream: self.upstream.clone(),
        }
    }
}

/// The counters of a served gateway, for views.
#[derive(Clone, Debug)]
pub struct GatewayHandle {
    stats: Arc<Stats>,
    upstream: String,
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
        }
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

struct Shared {
    route: Route,
    stats: Arc<Stats>,
    metrics: Arc<HostMetrics>,
}

/// Serves `listener` (the shim's, copied) for one generation until dropped.
pub fn serve(
    listener: TcpListener,
    route: Route,
    metrics: Arc<HostMetrics>,
) -> std::io::Result<Gateway> {
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let stats = Arc::new(Stats::default());
    let upstream = route.upstream.url();
    let shared = Arc::new(Shared {
        route,
        stats: stats.clone(),
        metrics,
    });
    // A hostile generation must not exhaust the supervisor: at most `MAX_CONNECTIONS` of
    // its connections are served at once (the rest wait in the listener's backlog), and a
    // connection that sends no complete request head in time is closed.
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let (lane_id, generation) = (shared.route.lane_id.clone(), shared.route.generation);
    let task = tokio::spawn(async move {
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
                    .await;
            });
        }
    });
    Ok(Gateway {
        task,
        stats,
        upstream,
    })
}

/// Connections of one generation served at once.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a connection has to send a request's head.
const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long the upstream has to accept a connection (TLS handshake included).
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);
/// How long the upstream has to begin its answer (a model may think for minutes).
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

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

async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let route = &shared.route;
    let runtime = &route.runtime;
    let fail = |status: StatusCode, why: &str| {
        shared.stats.failed.fetch_add(1, Ordering::Relaxed);
        shared
            .metrics
            .gateway_requests
            .get_or_create(&HostMetrics::runtime_outcome(runtime, "failed"))
            .inc();
        // Counted (metrics, the view), logged at debug: a generation must not be able to
        // flood the supervisor's log.
        tracing::debug!(lane_id = %route.lane_id, generation = route.generation, reason = why,
            "provider gateway refused a request");
        refusal(status, why)
    };
    let secrets = match &route.secrets {
        Ok(s) => s,
        Err(why) => return fail(StatusCode::SERVICE_UNAVAILABLE, why),
    };
    let (mut parts, body) = req.into_parts();
    if parts.method != hyper::Method::GET && parts.method != hyper::Method::POST {
        return fail(
            StatusCode::METHOD_NOT_ALLOWED,
            "the gateway carries GET and POST only",
        );
    }
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    if let Err(why) = check_path(path) {
        return fail(StatusCode::BAD_REQUEST, why);
    }
    let uri = match format!("{}{path}", route.upstream.base_path).parse::<hyper::Uri>() {
        Ok(u) => u,
        Err(_) => return fail(StatusCode::BAD_REQUEST, "malformed request path"),
    };
    parts.uri = uri;
    let mut headers = hyper::HeaderMap::with_capacity(parts.headers.len() + 2);
    for (name, value) in parts.headers.iter() {
        if HOP_BY_HOP.contains(&name.as_str()) {
            continue;
        }
        match substitute(name.as_str(), value, secrets) {
            Ok(v) => {
                headers.append(name.clone(), v);
            }
            Err(why) => return fail(StatusCode::BAD_REQUEST, why),
        }
    }
    match hyper::header::HeaderValue::from_str(&route.upstream.authority()) {
        Ok(h) => {
            headers.insert(hyper::header::HOST, h);
        }
        Err(_) => {
            return fail(
                StatusCode::BAD_GATEWAY,
                "upstream host is not a header value",
            )
        }
    }
    headers.insert(
        hyper::header::ACCEPT_ENCODING,
        hyper::header::HeaderValue::from_static("identity"),
    );
    parts.headers = headers;
    let upstream_req = Request::from_parts(parts, body);
    let mut sender = match connect(&route.upstream).await {
        Ok(s) => s,
        Err(why) => return fail(StatusCode::BAD_GATEWAY, &why),
    };
    let resp = match tokio::time::timeout(ANSWER_TIMEOUT, sender.send_request(upstream_req)).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return fail(StatusCode::BAD_GATEWAY, &format!("upstream request: {e}")),
        Err(_) => {
            return fail(
                StatusCode::GATEWAY_TIMEOUT,
                "the upstream did not answer in time",
            )
        }
    };
    shared.stats.requests.fetch_add(1, Ordering::Relaxed);
    shared
        .metrics
        .gateway_requests
        .get_or_create(&HostMetrics::runtime_outcome(runtime, "carried"))
        .inc();
    let (parts, body) = resp.into_parts();
    let mut scan = Usage {
        tail: Vec::new(),
        input: 0,
        output: 0,
        stats: shared.stats.clone(),
        metrics: shared.metrics.clone(),
        runtime: runtime.clone(),
    };
    let body = body
        .map_frame(move |frame| {
            if let Some(d) = frame.data_ref() {
                scan.feed(d);
            }
            frame
        })
        .boxed();
    // A provider that quotes a key back (in an error, a header) must not hand it to the
    // generation: every credential is cut out of the answer, headers and body.
    let keys: Arc<Vec<Vec<u8>>> = Arc::new(
        secrets
            .iter()
            .map(|(_, v)| v.0.as_bytes().to_vec())
            .filter(|k| !k.is_empty())
            .collect(),
    );
    let mut r = Response::from_parts(
        parts,
        Redacted {
            inner: body,
            keys: keys.clone(),
            carry: Vec::new(),
            pending: None,
            done: false,
        }
        .boxed(),
    );
    for h in HOP_BY_HOP {
        r.headers_mut().remove(*h);
    }
    if !keys.is_empty() {
        // Its length may change where a key is cut out: sent chunked instead.
        r.headers_mut().remove(hyper::header::CONTENT_LENGTH);
    }
    for v in r.headers_mut().values_mut() {
        if keys.iter().any(|k| find(v.as_bytes(), k).is_some()) {
            *v = hyper::header::HeaderValue::from_static(REDACTED);
        }
    }
    r
}

/// One connection to the upstream, for one request (no pooling: a generation's requests
/// are few and long).
async fn connect(
    u: &Upstream,
) -> Result<hyper::client::conn::http1::SendRequest<Incoming>, String> {
    let tcp = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect((u.host.as_str(), u.port)),
    )
    .await
    .map_err(|_| format!("upstream {}:{} did not answer in time", u.host, u.port))?
    .map_err(|e| format!("upstream {}:{} unreachable: {e}", u.host, u.port))?;
    let _ = tcp.set_nodelay(true);
    if !u.https {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("upstream handshake: {e}"))?;
        tokio::spawn(conn);
        return Ok(sender);
    }
    let cfg = tls_config()?;
    let name = rustls_pki_types::ServerName::try_from(u.host.clone())
        .map_err(|_| format!("{:?} is not a TLS server name", u.host))?;
    let tls = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_rustls::TlsConnector::from(cfg).connect(name, tcp),
    )
    .await
    .map_err(|_| "the upstream's TLS handshake did not finish in time".to_string())?
    .map_err(|e| format!("upstream TLS: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("upstream handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// The client TLS configuration for https upstreams: the system's roots, loaded once.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CFG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CFG.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = rustls::RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(format!(
                "no system root certificate could be loaded ({} errors)",
                found.errors.len()
            ));
        }
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map(|b| Arc::new(b.with_root_certificates(roots).with_no_client_auth()))
        .map_err(|e| e.to_string())
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_are_checked() {
        let u = Upstream::parse("https://api.example.com/v1/").unwrap();
        assert_eq!(
            (u.https, u.host.as_str(), u.port, u.base_path.as_str()),
            (true, "api.example.com", 443, "/v1")
        );
        let u = Upstream::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!((u.port, u.base_path.as_str()), (8080, ""));
        assert_eq!(u.authority(), "127.0.0.1:8080");
        for bad in [
            "ftp://x",
            "api.example.com",
            "https://user:pw@x.example",
            "https://x.example/?key=1",
            "https://x.example/#f",
            "",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad} accepted");
        }
    }

    /// An upstream that quotes the request's Authorization header back, in a header and
    /// in its body split across two writes (the key cut in the middle); records what it got.
    fn echo_upstream() -> (u16, std::sync::mpsc::Receiver<String>) {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                let auth = head
                    .lines()
                    .find_map(|l| l.strip_prefix("authorization: "))
                    .unwrap_or("")
                    .trim()
                    .to_string();
                let _ = tx.send(head.clone());
                let body = format!("{{\"error\":\"bad key {auth}\"}}");
                let (a, b) = body.split_at(body.len() / 2 + 3);
                let _ = write!(
                    s,
                    "HTTP/1.1 401 Unauthorized\r\nx-echo: {auth}\r\ncontent-length: {}\r\n\r\n{a}",
                    body.len()
                );
                let _ = s.flush();
                std::thread::sleep(std::time::Duration::from_millis(30));
                let _ = s.write_all(b.as_bytes());
            }
        });
        (port, rx)
    }

    fn ask(port: u16, head: &str) -> String {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "{head}Host: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn credentials_go_only_where_a_key_goes_and_never_come_back() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (up, got) = echo_upstream();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let secret = "sk-real-secret-value-0123456789";
        let _gw = rt.block_on(async {
            serve(
                l,
                Route {
                    lane_id: "h:l".into(),
                    generation: 1,
                    runtime: "r".into(),
                    upstream: Upstream::parse(&format!("http://127.0.0.1:{up}")).unwrap(),
                    secrets: Ok(vec![
                        (placeholder("KEY"), SecretValue(secret.into())),
                        (
                            placeholder("KEY_2"),
                            SecretValue("other-secret-value".into()),
                        ),
                    ]),
                },
                Arc::new(HostMetrics::new()),
            )
            .unwrap()
        });
        // The key reaches the upstream in its header; quoted back, it is cut out of the
        // answer's header and body (split across two chunks).
        let answer = ask(
            port,
            "POST /v1/x HTTP/1.1\r\nAuthorization: Bearer mosaic-credential-KEY\r\n",
        );
        let sent = got.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        assert!(
            sent.contains(&format!("authorization: Bearer {secret}")),
            "{sent}"
        );
        assert!(!answer.contains(secret), "{answer}");
        assert!(answer.contains("x-echo: [redacted by mosaic]"), "{answer}");
        // (The body arrives chunked: its length changed.)
        assert!(answer.contains("bad key Bearer "), "{answer}");
        assert!(answer.contains("[redacted by mosaic]\"}"), "{answer}");
        // A name that begins another's is that other one, exactly.
        ask(
            port,
            "POST /v1/x HTTP/1.1\r\nAuthorization: Bearer mosaic-credential-KEY_2\r\n",
        );
        let sent = got.recv_timeout(std::time::Duration::from_secs(5)).unwrap();
        assert!(
            sent.contains("authorization: Bearer other-secret-value\r\n"),
            "{sent}"
        );
        // Refused before anything is sent: a placeholder in a header a provider might
        // quote back, a path that leaves the base, a method that is not GET or POST.
        for (head, status) in [
            (
                "POST /v1/x HTTP/1.1\r\nanthropic-beta: mosaic-credential-KEY\r\n",
                "400",
            ),
            (
                "POST /v1/x HTTP/1.1\r\nx-api-key: pre-mosaic-credential-KEY\r\n",
                "400",
            ),
            ("POST /v1/../admin HTTP/1.1\r\n", "400"),
            ("POST /v1/%2e%2e/admin HTTP/1.1\r\n", "400"),
            ("POST //evil.example/x HTTP/1.1\r\n", "400"),
            ("DELETE /v1/x HTTP/1.1\r\n", "405"),
        ] {
            let answer = ask(port, head);
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status}")),
                "{head}: {answer}"
            );
            assert!(!answer.contains(secret));
        }
        assert!(
            got.recv_timeout(std::time::Duration::from_millis(200))
                .is_err(),
            "a refused request reached the upstream"
        );
    }

    #[test]
    fn usage_is_read_across_chunks_at_its_largest() {
        let m = Arc::new(HostMetrics::new());
        let stats = Arc::new(Stats::default());
        let mut u = Usage {
            tail: Vec::new(),
            input: 0,
            output: 0,
            stats: stats.clone(),
            metrics: m,
            runtime: "x".into(),
        };
        // Anthropic streaming: input in message_start, a running output total later; a
        // cache field that must not count as input; a field split across two chunks.
        u.feed(br#"data: {"message":{"usage":{"input_tokens":120,"cache_read_input_tokens":9999,"output_tokens":1}}}"#);
        u.feed(br#"data: {"usage":{"output_tok"#);
        u.feed(br#"ens": 37}}"#);
        u.feed(br#"data: {"usage":{"output_tokens":40}}"#);
        drop(u);
        assert_eq!(stats.input_tokens.load(Ordering::Relaxed), 120);
        assert_eq!(stats.output_tokens.load(Ordering::Relaxed), 40);
    }
}
