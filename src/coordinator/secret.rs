//! The coordinator secret and fence tokens.
//!
//! A fence token is 256 random bits, handed once to the party that must present it. The
//! database stores only HMAC-SHA256(coordinator secret, token); presented tokens are
//! compared by that digest in constant time.
//!
//! **Never:** prints, serializes or stores a raw token or the secret (`Debug` redacts,
//! neither type implements `Serialize`, both zeroize on drop).

use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, ZeroizeOnDrop};

#[derive(Clone, Zeroize, ZeroizeOnDrop)]
struct SecretBytes([u8; 32]);

#[derive(Clone)]
pub struct CoordinatorSecret(Arc<SecretBytes>);

impl std::fmt::Debug for CoordinatorSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CoordinatorSecret(<redacted>)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("coordinator secret must be 64 hex digits")]
    Malformed,
    #[error("random source failed: {0}")]
    Random(String),
}

impl CoordinatorSecret {
    pub fn from_hex(s: &str) -> Result<Self, SecretError> {
        let mut b = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut b).map_err(|_| SecretError::Malformed)?;
        Ok(Self(Arc::new(SecretBytes(b))))
    }

    pub fn generate() -> Result<Self, SecretError> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| SecretError::Random(e.to_string()))?;
        Ok(Self(Arc::new(SecretBytes(b))))
    }

    /// The hex form, for writing the secret file once at setup.
    pub fn expose_hex(&self) -> String {
        hex::encode(self.0 .0)
    }

    /// Keyed digest of a fence token: what the database stores.
    pub fn fence_digest(&self, token: &FenceToken) -> String {
        // HMAC accepts any key length; `new_from_slice` cannot fail for HMAC.
        let mut m = match <Hmac<Sha256> as Mac>::new_from_slice(&self.0 .0) {
            Ok(m) => m,
            Err(_) => unreachable_hmac(),
        };
        m.update(b"mosaic/fence-token/v1");
        m.update(&token.0);
        format!("hmac-sha256:{}", hex::encode(m.finalize().into_bytes()))
    }

    /// Whether `token` is the one whose digest is `stored`, in constant time.
    pub fn fence_matches(&self, token: &FenceToken, stored: &str) -> bool {
        let got = self.fence_digest(token);
        got.len() == stored.len() && bool::from(got.as_bytes().ct_eq(stored.as_bytes()))
    }
}

#[cold]
fn unreachable_hmac() -> ! {
    // HMAC's key-length check only rejects lengths for MACs with fixed key sizes.
    panic!("HMAC-SHA256 rejected a 32-byte key")
}

/// A raw fence token. Only ever held by the minting transaction and the presenting party.
#[derive(Clone, Zeroize, ZeroizeOnDrop, PartialEq, Eq)]
pub struct FenceToken([u8; 32]);

impl std::fmt::Debug for FenceToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FenceToken(<redacted>)")
    }
}

impl FenceToken {
    pub fn generate() -> Result<Self, SecretError> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| SecretError::Random(e.to_string()))?;
        Ok(Self(b))
    }
    /// The hex form, for the one hand-off to the presenting party. Never log it.
    pub fn expose_hex(&self) -> String {
        hex::encode(self.0)
    }
    pub fn from_hex(s: &str) -> Result<Self, SecretError> {
        let mut b = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut b).map_err(|_| SecretError::Malformed)?;
        Ok(Self(b))
    }
}
