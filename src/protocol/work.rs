//! The vocabulary of the work record both sides share: which evidence kinds exist, what a
//! blocker code and a next action may look like, and how evidence is digested.
//!
//! **Never:** decides anything; these are pure checks, applied by the supervisor before it
//! signs a report and by the coordinator before it decides one.

/// The evidence kinds a policy may accept: a commit id (40 or 64 hex digits), a file set
/// (the bytes of a listing of changed files with their contents' digests), a test result
/// (the bytes of a test report).
pub const EVIDENCE_KINDS: [&str; 3] = ["commit", "file-set", "test-result"];

/// Blocker codes only the supervisor reports for a real harness, from what it observed
/// itself (a provider's 429, a prompt its hook showed, a replaced conversation): a
/// harness's own `mosaic lane blocked` may not claim them.
pub const SUPERVISOR_BLOCKER_CODES: [&str; 3] =
    ["rate-limited", "waiting-for-input", "conversation-replaced"];

/// The most evidence one report may carry (it is digested, not stored).
pub const MAX_EVIDENCE_BYTES: usize = 1024 * 1024;

/// A canonical blocker code: lower-case words joined by dashes, at most 63 bytes.
pub fn code_ok(code: &str) -> bool {
    !code.is_empty()
        && code.len() <= 63
        && !code.starts_with('-')
        && code
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// An executable next action: one non-blank line of at most 1000 bytes.
pub fn next_action_ok(s: &str) -> bool {
    !s.trim().is_empty() && s.len() <= 1000 && !s.contains(['\n', '\r'])
}

/// Whether `bytes` is a commit id: 40 (SHA-1) or 64 (SHA-256) lower-case hex digits.
pub fn commit_id_ok(bytes: &[u8]) -> bool {
    matches!(bytes.len(), 40 | 64)
        && bytes
            .iter()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// The digest a handoff or continuation binds for its next action.
pub fn next_action_digest(next_action: &str) -> String {
    format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/next-action/v1", &[next_action.as_bytes()])
    )
}

/// The digest of one piece of evidence, bound to its kind (`blocker` for a blocker's).
pub fn evidence_digest(kind: &str, bytes: &[u8]) -> String {
    format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/evidence/v1", &[kind.as_bytes(), bytes])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_actions_and_commits() {
        assert!(code_ok("needs-credentials"));
        assert!(!code_ok("Needs Credentials"));
        assert!(!code_ok(""));
        assert!(!code_ok("-x"));
        assert!(next_action_ok("run `make test` after the fixture lands"));
        assert!(!next_action_ok("   "));
        assert!(!next_action_ok("two\nlines"));
        assert!(commit_id_ok(&[b'a'; 40]));
        assert!(!commit_id_ok(&[b'A'; 40]));
        assert!(!commit_id_ok(&[b'a'; 41]));
        assert_ne!(
            evidence_digest("commit", b"x"),
            evidence_digest("file-set", b"x")
        );
    }
}
