//! The coordinator secret and fence tokens.
//!
//! A fence token is a 256-bit secret bound to one reservation: HMAC-SHA256 under the
//! coordinator secret of the reservation id and a 256-bit random salt minted with it. The
//! database keeps the salt and HMAC-SHA256(secret, token), never the token; whichever
//! coordinator leads re-derives the token when the chain needs it (activation), so a chain
//! survives the death of the process that reserved it without the raw token ever being
//! written down. What presenting it proves: the presenter holds the coordinator secret and
//! names exactly this reservation (salt and id) — a guessed, replayed or other chain's value
//! fails the constant-time digest comparison.
//!
//! **Never:** prints, serializes or stores a raw token or the secret (`Debug` redacts,
//! neither type implements `Serialize`, both zeroize on drop).

use std::sync::Arc;

use hmac::{Hmac, Mac};
use sha2::Sha256;
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

    /// The fence token of `reservation_id` minted with `salt` (see the module docs).
    pub fn fence_token(&self, reservation_id: &str, salt: &str) -> FenceToken {
        let mut m = self.mac();
        m.update(b"mosaic/fence-token/v2");
        m.update(&(reservation_id.len() as u64).to_be_bytes());
        m.update(reservation_id.as_bytes());
        m.update(salt.as_bytes());
        let mut b = [0u8; 32];
        b.copy_from_slice(&m.finalize().into_bytes());
        FenceToken(b)
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC accepts any key length; `new_from_slice` cannot fail for HMAC.
        match <Hmac<Sha256> as Mac>::new_from_slice(&self.0 .0) {
            Ok(m) => m,
            Err(_) => unreachable_hmac(),
        }
    }

    /// Keyed digest of a fence token: what the database stores.
    pub fn fence_digest(&self, token: &FenceToken) -> String {
        let mut m = self.mac();
        m.update(b"mosaic/fence-token/v1");
        m.update(&token.0);
        format!("hmac-sha256:{}", hex::encode(m.finalize().into_bytes()))
    }

    /// Whether `token` is the one whose digest is `stored`, in constant time.
    pub fn fence_matches(&self, token: &FenceToken, stored: &str) -> bool {
        let got = self.fence_digest(token);
        crate::util::ct::eq(got.as_bytes(), stored.as_bytes())
    }
}

impl CoordinatorSecret {
    /// The ownership token of an elastic lane's lease (spec §13), minted with `salt`. It
    /// never leaves the coordinator: derived when a destruction is decided, dropped after.
    pub fn ownership_token(&self, lease_id: &str, salt: &str) -> FenceToken {
        let mut m = self.mac();
        m.update(b"mosaic/lane-ownership-token/v1");
        m.update(&(lease_id.len() as u64).to_be_bytes());
        m.update(lease_id.as_bytes());
        m.update(salt.as_bytes());
        let mut b = [0u8; 32];
        b.copy_from_slice(&m.finalize().into_bytes());
        FenceToken(b)
    }

    /// Keyed digest of an ownership token: what the database stores and compares.
    pub fn ownership_proof(&self, token: &FenceToken) -> String {
        let mut m = self.mac();
        m.update(b"mosaic/lane-ownership-proof/v1");
        m.update(&token.0);
        format!("hmac-sha256:{}", hex::encode(m.finalize().into_bytes()))
    }

    /// Whether `token` is the one whose proof is `stored`, in constant time.
    pub fn ownership_matches(&self, token: &FenceToken, stored: &str) -> bool {
        let got = self.ownership_proof(token);
        crate::util::ct::eq(got.as_bytes(), stored.as_bytes())
    }
}

#[cold]
fn unreachable_hmac() -> ! {
    // HMAC's key-length check only rejects lengths for MACs with fixed key sizes.
    panic!("HMAC-SHA256 rejected a 32-byte key")
}

/// A fresh 256-bit salt for a reservation's fence token (hex).
pub fn fence_salt() -> Result<String, SecretError> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| SecretError::Random(e.to_string()))?;
    Ok(hex::encode(b))
}

/// A raw fence token: derived when a transition needs it, dropped (and zeroized) right after.
#[derive(Clone, Zeroize, ZeroizeOnDrop, PartialEq, Eq)]
pub struct FenceToken([u8; 32]);

impl std::fmt::Debug for FenceToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FenceToken(<redacted>)")
    }
}

impl FenceToken {
    /// The per-generation value behind `fence_proof` (see `protocol::fence`): a one-way
    /// function of this token, bound to one lane incarnation and generation.
    pub fn generation_reveal(&self, lane_incarnation_id: &str, generation: u64) -> [u8; 32] {
        let mut m = match <Hmac<Sha256> as Mac>::new_from_slice(&self.0) {
            Ok(m) => m,
            Err(_) => unreachable_hmac(),
        };
        m.update(b"mosaic/fence-reveal/v1");
        m.update(&(lane_incarnation_id.len() as u64).to_be_bytes());
        m.update(lane_incarnation_id.as_bytes());
        m.update(&generation.to_be_bytes());
        let mut b = [0u8; 32];
        b.copy_from_slice(&m.finalize().into_bytes());
        b
    }

    /// A random token that is no reservation's (tests present it to prove refusal).
    pub fn random() -> Result<Self, SecretError> {
        let mut b = [0u8; 32];
        getrandom::fill(&mut b).map_err(|e| SecretError::Random(e.to_string()))?;
        Ok(Self(b))
    }
    /// The hex form, for leak scans in tests. Never log it.
    pub fn expose_hex(&self) -> String {
        hex::encode(self.0)
    }
    pub fn from_hex(s: &str) -> Result<Self, SecretError> {
        let mut b = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut b).map_err(|_| SecretError::Malformed)?;
        Ok(Self(b))
    }
}
