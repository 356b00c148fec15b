//! One HTTP/1.1 connection for one request, over TCP or TLS (the system's roots): the
//! provider gateway's upstream requests and the coordinator's webhook notifications.
//!
//! **Never:** names more of a URL than its host and port in an error (a URL's path or
//! query may carry a secret: a webhook's token).

use std::sync::{Arc, OnceLock};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// An http or https URL, checked: a host, no user info. Errors name no part of the URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub https: bool,
    pub host: String,
    pub port: u16,
    pub uri: hyper::Uri,
}

impl Target {
    pub fn parse(url: &str) -> Result<Self, &'static str> {
        let uri: hyper::Uri = url.parse().map_err(|_| "not a URL")?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err("must be an http:// or https:// URL"),
        };
        let auth = uri.authority().ok_or("names no host")?;
        if auth.as_str().contains('@') {
            return Err("must not carry user info (credentials go in the credentials file)");
        }
        let host = auth.host().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err("names no host");
        }
        Ok(Self {
            https,
            host: host.to_string(),
            port: auth.port_u16().unwrap_or(if https { 443 } else { 80 }),
            uri,
        })
    }
}

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
