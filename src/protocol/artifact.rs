//! Harness artifacts (spec §11): what a harness keeps of its own session — its transcript
//! or state file, as its adapter exports it — captured beside a generation's end, classified
//! sensitive, encrypted at rest to the principals allowed to recover it (age, X25519
//! recipients) and content addressed by the encrypted bytes. Nothing here ever holds a
//! plaintext byte or a secret key: a recipient is a public key, the digest is over
//! ciphertext.

use serde::{Deserialize, Serialize};

/// The only classification an artifact has: a harness's transcript can hold anything the
/// agent read (source, secrets it was shown), so it is never stored in the clear.
pub const CLASSIFICATION: &str = "sensitive";

/// The one purpose an artifact is kept for: an operator's recovery of what the harness
/// said and did (never a generation's restore: a fresh generation never sees an old
/// conversation, spec §3.2).
pub const PURPOSE: &str = "operator-recovery";

/// Most plaintext bytes one artifact packs (every exported file, whole): beyond, nothing
/// is captured and the receipt says why.
pub const MAX_PLAIN_BYTES: u64 = 64 << 20;
/// Most bytes an encrypted artifact can be (its plaintext limit, the tar headers of its
/// most files, and age's per-chunk overhead, with room to spare): a receipt naming a
/// larger one names no artifact.
pub const MAX_SEALED_BYTES: u64 = 2 * MAX_PLAIN_BYTES + (MAX_FILES as u64) * 1024;
/// Most files one artifact packs.
pub const MAX_FILES: usize = 10_000;

/// The retention policy artifacts are recorded under: kept until an operator removes them.
pub const RETENTION_POLICY: &str = "mosaic/retention/sensitive/keep-until-removed/v1";

/// Its digest, recorded with every artifact.
pub fn retention_policy_digest() -> String {
    format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/retention-policy", &[RETENTION_POLICY.as_bytes()])
    )
}

/// Why a recipient was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecipientError {
    #[error("a recovery recipient is `PRINCIPAL=age1…` (a principal name of letters, digits, `.`, `_`, `-`, `@` and `:`, at most 100; an age X25519 public key): the one for {0:?} is not")]
    Malformed(String),
    #[error("recovery recipient principal {0:?} is named twice")]
    Duplicate(String),
    #[error("at most {MAX_RECIPIENTS} recovery recipients")]
    TooMany,
}

/// Most recipients one artifact is encrypted to.
pub const MAX_RECIPIENTS: usize = 16;

/// A principal allowed to recover artifacts, with the age public key they are encrypted
/// to. Built only through [`Recipient::parse`]: its key always parses.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Recipient {
    principal: String,
    key: String,
}

impl Recipient {
    /// `PRINCIPAL=age1…`.
    pub fn parse(s: &str) -> Result<Self, RecipientError> {
        // Only what precedes `=` is echoed: a secret key pasted by mistake never reaches
        // an error or a log.
        let bad = || {
            RecipientError::Malformed(
                s.split_once('=')
                    .map(|(p, _)| p)
                    .unwrap_or("")
                    .chars()
                    .take(100)
                    .collect(),
            )
        };
        let (principal, key) = s.split_once('=').ok_or_else(bad)?;
        let principal_ok = (1..=100).contains(&principal.len())
            && principal
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-@:".contains(&b));
        if !principal_ok || key.parse::<age::x25519::Recipient>().is_err() {
            return Err(bad());
        }
        Ok(Self {
            principal: principal.to_string(),
            key: key.to_string(),
        })
    }

    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// The age key (parsed at construction: infallible again).
    pub fn age(&self) -> Option<age::x25519::Recipient> {
        self.key.parse().ok()
    }
}

impl std::fmt::Display for Recipient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.principal, self.key)
    }
}

/// A checked, sorted list of recipients (no principal twice).
pub fn parse_recipients<S: AsRef<str>>(list: &[S]) -> Result<Vec<Recipient>, RecipientError> {
    if list.len() > MAX_RECIPIENTS {
        return Err(RecipientError::TooMany);
    }
    let mut out = list
        .iter()
        .map(|s| Recipient::parse(s.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort();
    for w in out.windows(2) {
        if w[0].principal == w[1].principal {
            return Err(RecipientError::Duplicate(w[0].principal.clone()));
        }
    }
    Ok(out)
}

/// The digest of a recipient list (sorted: the same principals and keys, the same
/// digest), recorded with each artifact encrypted to it.
pub fn recipients_digest(list: &[Recipient]) -> String {
    let lines: Vec<String> = list.iter().map(|r| r.to_string()).collect();
    let parts: Vec<&[u8]> = lines.iter().map(|l| l.as_bytes()).collect();
    format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/artifact-recipients/v1", &parts)
    )
}

/// A captured artifact, as a receipt carries it: the digest and size of its encrypted
/// bytes, how many files it packs, and whom it was encrypted to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactRef {
    pub digest: String,
    pub size: u64,
    pub files: u32,
    pub recipients_digest: String,
}

impl ArtifactRef {
    pub fn well_formed(&self) -> bool {
        use crate::protocol::envelope::is_digest;
        is_digest(&self.digest)
            && is_digest(&self.recipients_digest)
            && self.size > 0
            && self.size <= MAX_SEALED_BYTES
            && self.files > 0
            && self.files as usize <= MAX_FILES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> String {
        age::x25519::Identity::generate().to_public().to_string()
    }

    #[test]
    fn recipients_are_checked_sorted_and_digested_by_content() {
        let (a, b) = (key(), key());
        let one = parse_recipients(&[format!("ops={a}"), format!("alice@x={b}")]).unwrap();
        let two = parse_recipients(&[format!("alice@x={b}"), format!("ops={a}")]).unwrap();
        assert_eq!(one, two);
        assert_eq!(recipients_digest(&one), recipients_digest(&two));
        assert_eq!(one[0].principal(), "alice@x");
        let other = parse_recipients(&[format!("ops={b}")]).unwrap();
        assert_ne!(recipients_digest(&one), recipients_digest(&other));
        for bad in [
            format!("ops {a}"),
            format!("={a}"),
            format!("o ps={a}"),
            "ops=age1notakey".to_string(),
            format!("ops={}", &a[..a.len() - 1]),
        ] {
            assert!(
                matches!(
                    parse_recipients(std::slice::from_ref(&bad)),
                    Err(RecipientError::Malformed(_))
                ),
                "{bad}"
            );
        }
        // A secret key pasted where a recipient goes is never echoed.
        let secret = age::x25519::Identity::generate();
        let secret = age::secrecy::ExposeSecret::expose_secret(&secret.to_string()).to_string();
        for bad in [format!("ops={secret}"), secret.clone()] {
            let e = parse_recipients(&[bad]).unwrap_err().to_string();
            assert!(!e.contains("AGE-SECRET-KEY"), "{e}");
        }
        assert_eq!(
            parse_recipients(&[format!("ops={a}"), format!("ops={b}")]),
            Err(RecipientError::Duplicate("ops".into()))
        );
        let many: Vec<String> = (0..=MAX_RECIPIENTS).map(|i| format!("p{i}={a}")).collect();
        assert_eq!(parse_recipients(&many), Err(RecipientError::TooMany));
    }
}
