//! The constant-time boundary (spec §17 Raw token leakage/timing). Every comparison of a
//! secret, or of a value derived from one that an attacker could probe, goes through
//! [`eq`]: a fence token (by its keyed digest, `coordinator::secret`), a fence proof
//! against its commitment (`protocol::fence`, the coordinator's check of a host message),
//! a launch nonce (by its digest, `supervisor::identity`), a harness's ACK token against
//! the contract-keyed one (`adapter::ackline`), and a credential placeholder in a request
//! through the provider gateway (`supervisor::gateway`).
//!
//! What the boundary promises: the time taken depends on the two lengths — public, fixed
//! by each value's format — and never on their contents (where they first differ). What
//! it does not: the code around it (parsing a reveal, looking a value up) is ordinary code
//! on public inputs. Nothing else in the tree calls `subtle` (tests/structure.rs checks).

use subtle::ConstantTimeEq;

/// Whether `a` and `b` are equal, in time that depends only on their lengths.
pub fn eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

#[cfg(test)]
mod tests {
    use super::eq;

    #[test]
    fn equal_only_when_every_byte_and_the_length_agree() {
        assert!(eq(b"", b""));
        assert!(eq(b"sha256:abc", b"sha256:abc"));
        assert!(!eq(b"sha256:abc", b"sha256:abd"));
        assert!(!eq(b"sha256:abc", b"sha256:ab"));
        assert!(!eq(b"xha256:abc", b"sha256:abc"));
        assert!(!eq(b"", b"a"));
    }
}
