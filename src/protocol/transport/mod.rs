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
    /// The clocks of the two sides differ by more than the transport tolerance.
    #[error("{0}")]
    ClockSkew(ClockSkew),
    #[error("timed out during {0}")]
    Timeout(&'static str),
}

/// How far a host's clock is from the coordinator's database time (the reference), as
/// measured at session start. Positive: the host is ahead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSkew {
    pub host_ahead_ms: i64,
    pub tolerance_ms: u64,
}

impl ClockSkew {
    /// The default transport tolerance: five minutes, as Kerberos allows; an ordinary
    /// unsynchronized host stays well inside it, a clock off by an hour does not.
    pub const DEFAULT_TOLERANCE_MS: u64 = 300_000;

    pub fn beyond_tolerance(&self) -> bool {
        self.host_ahead_ms.unsigned_abs() > self.tolerance_ms
    }

    /// What the refusing side's close frame says (short: a close reason is 123 bytes).
    pub fn close_reason(&self) -> String {
        format!("clock-skew: host {:+} ms", self.host_ahead_ms)
    }
}

impl std::fmt::Display for ClockSkew {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.host_ahead_ms.unsigned_abs() as f64 / 1000.0;
        let side = if self.host_ahead_ms >= 0 {
            "ahead of"
        } else {
            "behind"
        };
        write!(
            f,
            "clock skew: the host's clock is {secs:.1} s {side} the coordinator's database time (tolerance {} s); fix the host's time (NTP) — no session is opened until it is within the tolerance",
            self.tolerance_ms / 1000
        )
    }
}

/// Milliseconds since the Unix epoch, negative before it (a clock set far back).
fn unix_ms(t: SystemTime) -> i128 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i128,
        Err(e) => -(e.duration().as_millis() as i128),
    }
}

mod client;
mod framing;
mod server;
mod session_loop;
mod tls;

pub use client::*;
pub use framing::*;
pub use server::*;
use session_loop::*;
pub use tls::*;
