//! One HTTP/1.1 connection for one request, over TCP or TLS (the system's roots): the
//! provider gateway's upstream requests and the coordinator's webhook notifications.
//!
//! **Never:** names more of a URL than its host and port in an error (a URL's path or
//! query may carry a secret: a webhook's token).

use std::sync::{Arc, OnceLock};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// A connection to `host:port` (TLS when `https`), ready for requests; its driver task runs
/// until the connection closes. Each step is bounded by `timeout`.
pub async fn connect(
    https: bool,
    host: &str,
    port: u16,
    timeout: std::time::Duration,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>, String> {
    let tcp = tokio::time::timeout(timeout, tokio::net::TcpStream::connect((host, port)))
        .await
        .map_err(|_| format!("{host}:{port} did not answer in time"))?
        .map_err(|e| format!("{host}:{port} unreachable: {e}"))?;
    let _ = tcp.set_nodelay(true);
    if !https {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(conn);
        return Ok(sender);
    }
    let cfg = tls_config()?;
    let name = rustls_pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| format!("{host:?} is not a TLS server name"))?;
    let tls = tokio::time::timeout(
        timeout,
        tokio_rustls::TlsConnector::from(cfg).connect(name, tcp),
    )
    .await
    .map_err(|_| format!("the TLS handshake with {host} did not finish in time"))?
    .map_err(|e| format!("TLS with {host}: {e}"))?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(conn);
    Ok(sender)
}

/// The client TLS configuration: the system's roots, loaded once.
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
