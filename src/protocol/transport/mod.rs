//! WebSocket over mutual TLS between supervisors and the coordinator.
//!
//! **Owns:** TLS configuration from `mosaic pki` files (one crypto provider, ring, shared
//! with rcgen and passed explicitly), the session handshake, per-frame verification on the
//! server side, and the host link that delivers receipts until acknowledged.
//!
//! **Never:** accepts a client without a certificate from the configured CA; lets the TLS
//! identity authorize a message by itself (every frame is a verified envelope, and its
//! issuer must also be the TLS peer); lets one malformed frame end a session; logs frame
//! contents.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use futures_util::{SinkExt, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use super::canonical::Value;
use super::envelope::{s, verify, Envelope, Signer, Verified, VerifyContext, MAX_ENVELOPE_BYTES};
use super::schema::MessageType;
use super::trust::TrustRegistry;

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("reading {path}: {detail}")]
    Pem { path: PathBuf, detail: String },
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("peer certificate names no Mosaic principal")]
    NoPrincipal,
    #[error("server is {got:?}, expected {want:?}")]
    WrongServer { got: String, want: String },
    #[error("websocket: {0}")]
    Ws(String),
    #[error("session refused: {0}")]
    Refused(String),
    #[error("timed out during {0}")]
    Timeout(&'static str),
}

mod client;
mod framing;
mod server;
mod tls;

pub use client::*;
pub use framing::*;
pub use server::*;
pub use tls::*;
