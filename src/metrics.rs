//! The `/metrics` endpoint both daemons serve (Prometheus text format, `prometheus-client`
//! registries, a minimal hyper HTTP/1 server). Off unless a listen address is configured;
//! `mosaic up` binds localhost.
//!
//! **Never:** labels a metric with anything but lane ids, message types, reasons and
//! categories — no tokens, prompts, task text, keys or digests of secrets.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use http_body_util::Full;
use hyper::body::Bytes;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// Runs before each scrape (to refresh values read from elsewhere, e.g. the database).
pub type Refresh = Arc<dyn Fn() -> BoxFuture<'static, ()> + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics listener {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// Binds the metrics listener.
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener, MetricsError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// Serves `GET /metrics` from `registry` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    refresh: Option<Refresh>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = crate::util::shutdown_signalled(&mut shutdown) => return,
        };
        let (registry, refresh) = (registry.clone(), refresh.clone());
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (registry, refresh) = (registry.clone(), refresh.clone());
                    async move {
                        Ok::<_, std::convert::Infallible>(respond(req, &registry, refresh).await)
                    }
                });
            let io = hyper_util::rt::TokioIo::new(stream);
            let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, svc);
            // A scraper that never finishes its request is not worth more than this.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(30), conn).await;
        });
    }
}

async fn respond(
    req: hyper::Request<hyper::body::Incoming>,
    registry: &Registry,
    refresh: Option<Refresh>,
) -> hyper::Response<Full<Bytes>> {
    let reply = |status: u16, ctype: &str, body: String| {
        let mut r = hyper::Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
        if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        r
    };
    if req.method() != hyper::Method::GET || req.uri().path() != "/metrics" {
        return reply(404, "text/plain", "only GET /metrics here\n".into());
    }
    if let Some(f) = refresh {
        f().await;
    }
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, registry) {
        Ok(()) => reply(
            200,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            body,
        ),
        Err(e) => reply(500, "text/plain", format!("encoding failed: {e}\n")),
    }
}
