//! `fence_proof`: how a host checks that coordinator messages about a generation come from
//! the holder of that generation's fence — without ever seeing the fence token.
//!
//! The coordinator derives, per generation, `R = HMAC-SHA256(fence token, label ‖ lane
//! incarnation ‖ generation)` (see `coordinator::secret`). The `stage` carries the
//! commitment `C = SHA-256(label ‖ R)` as `fc1:<hex C>`; every later coordinator message
//! for that generation (contract, challenge, control) carries `R` itself as `fr1:<hex R>`,
//! and the host accepts it only if it hashes to the commitment it was staged with. Host
//! messages echo the commitment (a reference the coordinator checks against its own).
//!
//! What a valid reveal proves: its sender could compute `R`, i.e. held this reservation's
//! fence token (the coordinator secret and the reservation's salt), for exactly this lane
//! incarnation and generation. It does not prove leadership (the epoch check does), nor
//! freshness (message ids and `expires_at` do), and it reveals nothing of the token: `R`
//! is a one-way function of it, and useless for any other generation.

use sha2::{Digest, Sha256};

const COMMIT_LABEL: &[u8] = b"mosaic.fence-commit.v1";
const COMMIT_PREFIX: &str = "fc1:";
const REVEAL_PREFIX: &str = "fr1:";

/// `fc1:<hex>`: the commitment to a generation's reveal, carried by its stage.
pub fn commitment(reveal: &[u8; 32]) -> String {
    let mut h = Sha256::new();
    h.update(COMMIT_LABEL);
    h.update(reveal);
    format!("{COMMIT_PREFIX}{}", hex::encode(h.finalize()))
}

/// `fr1:<hex>`: the reveal, carried by every later coordinator message of the generation.
pub fn reveal(reveal: &[u8; 32]) -> String {
    format!("{REVEAL_PREFIX}{}", hex::encode(reveal))
}

/// True for a well-formed commitment.
pub fn is_commitment(s: &str) -> bool {
    s.strip_prefix(COMMIT_PREFIX)
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Whether `shown` (a reveal) opens `committed` (the stage's commitment). Constant time in
/// the compared digests.
pub fn opens(committed: &str, shown: &str) -> bool {
    let Some(hex_r) = shown.strip_prefix(REVEAL_PREFIX) else {
        return false;
    };
    let mut r = [0u8; 32];
    if hex::decode_to_slice(hex_r, &mut r).is_err() {
        return false;
    }
    let want = commitment(&r);
    crate::util::ct::eq(want.as_bytes(), committed.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_committed_reveal_opens_a_commitment() {
        let r = [7u8; 32];
        let c = commitment(&r);
        assert!(is_commitment(&c));
        assert!(opens(&c, &reveal(&r)));
        assert!(!opens(&c, &reveal(&[8u8; 32])));
        assert!(!opens(&c, &c), "a commitment is not its own reveal");
        assert!(!opens(&c, "fr1:zz"));
        assert!(!opens(&c, &reveal(&r)[1..]));
    }
}
