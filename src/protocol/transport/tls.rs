//! TLS configuration from `mosaic pki` files: one crypto provider (ring), client and
//! server configurations that require a certificate from the configured CA.

use super::*;

/// A TLS identity: the CA to trust, and this side's certificate and key.
#[derive(Debug, Clone)]
pub struct TlsIdentity {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub(super) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub(super) fn load(
    id: &TlsIdentity,
) -> Result<
    (
        rustls::RootCertStore,
        Vec<CertificateDer<'static>>,
        PrivateKeyDer<'static>,
    ),
    TransportError,
> {
    let pem = |path: &PathBuf, e: &dyn std::fmt::Display| TransportError::Pem {
        path: path.clone(),
        detail: e.to_string(),
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&id.ca).map_err(|e| pem(&id.ca, &e))? {
        roots
            .add(c.map_err(|e| pem(&id.ca, &e))?)
            .map_err(|e| pem(&id.ca, &e))?;
    }
    let certs = CertificateDer::pem_file_iter(&id.cert)
        .map_err(|e| pem(&id.cert, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem(&id.cert, &e))?;
    let key = PrivateKeyDer::from_pem_file(&id.key).map_err(|e| pem(&id.key, &e))?;
    Ok((roots, certs, key))
}

/// Server TLS: a client certificate from the CA is required.
pub fn server_tls(id: &TlsIdentity) -> Result<Arc<rustls::ServerConfig>, TransportError> {
    let (roots, certs, key) = load(id)?;
    let tls = |e: &dyn std::fmt::Display| TransportError::Tls(e.to_string());
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| tls(&e))?;
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| tls(&e))?;
    Ok(Arc::new(cfg))
}

/// Client TLS: trusts only the CA, presents this side's certificate.
pub fn client_tls(id: &TlsIdentity) -> Result<Arc<rustls::ClientConfig>, TransportError> {
    let (roots, certs, key) = load(id)?;
    let tls = |e: &dyn std::fmt::Display| TransportError::Tls(e.to_string());
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls(&e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| tls(&e))?;
    Ok(Arc::new(cfg))
}
