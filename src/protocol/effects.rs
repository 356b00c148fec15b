//! Protected effects (spec §5.5): the registry of executors a generation's effects may go
//! through, what each one touches, which scope entry licenses it, and how its claims are
//! named and digested. Both sides read it: the host's broker to build a claim, the
//! coordinator to admit one. An executor not listed here does not exist: a claim naming
//! another is refused before anything is looked up.
//!
//! | executor | what it does | target | licensed by | sink class | an unknown outcome |
//! |---|---|---|---|---|---|
//! | `provider` | one request to the runtime's model provider, through the gateway | `provider` | `provider` | reconcilable | reconciled when its generation ends: the answer could only reach that generation, which is gone |
//! | `egress` | one TCP connection to a named host, through the egress proxy | `egress:HOST:PORT` | `egress:HOST:PORT`, or `egress:HOST` for ports 80 and 443 | non-retryable-on-ambiguity | stays unknown, owned by the operator, until resolved |
//! | `push` | one ref update of a configured repository, made with the host's credentials | `push:REPO:REF` | `push:REPO` for the assignment's own branch `refs/heads/mosaic/<assignment>`, `push:REPO:REF` for that ref | reconcilable | stays unknown, owned by the operator, until resolved (the remote tells) |
//!
//! **Never:** carries an effect's content: a claim binds the digest of its operation, never
//! a request body, a URL's query or a credential.

use std::fmt;

/// An effect path the broker offers. The list is closed: there is no way to name another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Executor {
    Provider,
    Egress,
    Push,
}

/// How an effect's sink behaves when its outcome is not known (spec §5.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkClass {
    /// The sink commits or does not, atomically, and can be asked which.
    Transactional,
    /// Doing it again with the same key is the same as doing it once.
    SinkIdempotent,
    /// What happened can be found out afterwards.
    Reconcilable,
    /// Neither: an unknown outcome needs a person.
    NonRetryableOnAmbiguity,
}

/// What becomes of a claim whose outcome nobody observed (its broker died with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnUnknown {
    /// Reconciled when the generation's end is ingested, for this reason.
    ReconcileAtEnd(&'static str),
    /// Left unknown, with the operator as its reconciliation owner, until resolved.
    Operator,
}

/// The one reconciliation owner this build names for an unknown outcome.
pub const RECONCILIATION_OWNER: &str = "operator";

impl Executor {
    pub const ALL: [Executor; 3] = [Executor::Provider, Executor::Egress, Executor::Push];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Provider => "provider",
            Self::Egress => "egress",
            Self::Push => "push",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == s)
    }

    pub const fn sink_class(self) -> SinkClass {
        match self {
            Self::Provider | Self::Push => SinkClass::Reconcilable,
            Self::Egress => SinkClass::NonRetryableOnAmbiguity,
        }
    }

    pub const fn on_unknown(self) -> OnUnknown {
        match self {
            Self::Provider => OnUnknown::ReconcileAtEnd(
                "generation-ended: a provider answer goes only to the generation that asked, which has ended",
            ),
            Self::Egress | Self::Push => OnUnknown::Operator,
        }
    }
}

impl fmt::Display for Executor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl SinkClass {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Transactional => "transactional",
            Self::SinkIdempotent => "sink-idempotent",
            Self::Reconcilable => "reconcilable",
            Self::NonRetryableOnAmbiguity => "non-retryable-on-ambiguity",
        }
    }
}

/// What a broker observed of an admitted effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Carried to its end (an answer read whole, a connection closed by either side, a ref
    /// updated).
    Completed,
    /// The sink refused it or could not be reached: it had no effect.
    Failed,
    /// Cut part-way by the broker (its generation ended, its authority was revoked): the
    /// sink may have seen part of it.
    Aborted,
    /// Admitted, then never sent (the broker gave up waiting, or its generation ended
    /// first).
    NotDispatched,
}

impl Outcome {
    pub const ALL: [Outcome; 4] = [
        Outcome::Completed,
        Outcome::Failed,
        Outcome::Aborted,
        Outcome::NotDispatched,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Aborted => "aborted",
            Self::NotDispatched => "not-dispatched",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == s)
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EffectError {
    #[error("unknown executor {0:?} (registered: provider, egress, push)")]
    UnknownExecutor(String),
    #[error("malformed {executor} target: {detail}")]
    Target {
        executor: &'static str,
        detail: &'static str,
    },
}

/// What one effect acts on: enough to decide which scope entry licenses it, nothing of
/// its content.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    Provider,
    Egress { host: String, port: u16 },
    Push { repo: String, reference: String },
}

/// The largest host name accepted (DNS's limit).
const MAX_HOST: usize = 253;

/// A host name or IPv4 address as an egress target: lower-case letters, digits, dots and
/// dashes, no empty label, not starting or ending with a dot or dash.
pub fn host_ok(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= MAX_HOST
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// A repository name as configured on a host: letters, digits, `.`, `_`, `-`.
pub fn repo_ok(r: &str) -> bool {
    !r.is_empty()
        && r.len() <= 64
        && !r.starts_with('.')
        && r.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// A branch ref the broker may update: `refs/heads/` and a name git would accept, kept to
/// a conservative alphabet (no `..`, no `@{`, no trailing `.lock` or `/`).
pub fn ref_ok(r: &str) -> bool {
    let Some(name) = r.strip_prefix("refs/heads/") else {
        return false;
    };
    !name.is_empty()
        && r.len() <= 200
        && !name.contains("..")
        && !name.ends_with(".lock")
        && name.split('/').all(|c| {
            !c.is_empty()
                && !c.starts_with('.')
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'+'))
        })
}

/// The branch every assignment may push without naming it in its scope (with `push:REPO`).
pub fn assignment_branch(assignment_id: &str) -> String {
    format!("refs/heads/mosaic/{assignment_id}")
}

impl Target {
    pub fn executor(&self) -> Executor {
        match self {
            Self::Provider => Executor::Provider,
            Self::Egress { .. } => Executor::Egress,
            Self::Push { .. } => Executor::Push,
        }
    }

    /// The target's text, as a claim carries it and a scope entry names it.
    pub fn text(&self) -> String {
        match self {
            Self::Provider => "provider".into(),
            Self::Egress { host, port } => format!("egress:{host}:{port}"),
            Self::Push { repo, reference } => format!("push:{repo}:{reference}"),
        }
    }

    /// Reads a claim's target for `executor`; anything not in its exact form is refused.
    pub fn parse(executor: Executor, text: &str) -> Result<Self, EffectError> {
        let bad = |detail| EffectError::Target {
            executor: executor.as_str(),
            detail,
        };
        match executor {
            Executor::Provider if text == "provider" => Ok(Self::Provider),
            Executor::Provider => Err(bad("a provider call's target is `provider`")),
            Executor::Egress => {
                let rest = text
                    .strip_prefix("egress:")
                    .ok_or_else(|| bad("expected egress:HOST:PORT"))?;
                let (host, port) = rest
                    .rsplit_once(':')
                    .ok_or_else(|| bad("expected egress:HOST:PORT"))?;
                let port: u16 = port
                    .parse()
                    .ok()
                    .filter(|p| *p != 0 && !port.starts_with('0'))
                    .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?;
                if !host_ok(host) {
                    return Err(bad("the host is not a lower-case name or IPv4 address"));
                }
                Ok(Self::Egress {
                    host: host.into(),
                    port,
                })
            }
            Executor::Push => {
                let rest = text
                    .strip_prefix("push:")
                    .ok_or_else(|| bad("expected push:REPO:REF"))?;
                let (repo, reference) = rest
                    .split_once(':')
                    .ok_or_else(|| bad("expected push:REPO:REF"))?;
                if !repo_ok(repo) {
                    return Err(bad("the repository name is not letters, digits, . _ -"));
                }
                if !ref_ok(reference) {
                    return Err(bad("the ref is not a plain refs/heads/ branch"));
                }
                Ok(Self::Push {
                    repo: repo.into(),
                    reference: reference.into(),
                })
            }
        }
    }

    /// The scope entries, any one of which licenses this effect for `assignment_id`. The
    /// coordinator admits a claim only under an unreleased, unexpired lease for one of them.
    pub fn licensed_by(&self, assignment_id: &str) -> Vec<String> {
        match self {
            Self::Provider => vec!["provider".into()],
            Self::Egress { host, port } => {
                let mut v = vec![format!("egress:{host}:{port}")];
                if matches!(port, 80 | 443) {
                    v.push(format!("egress:{host}"));
                }
                v
            }
            Self::Push { repo, reference } => {
                let mut v = vec![format!("push:{repo}:{reference}")];
                if *reference == assignment_branch(assignment_id) {
                    v.push(format!("push:{repo}"));
                }
                v
            }
        }
    }
}

/// A claim's effect id: derived from the assignment and the claim's idempotency key alone,
/// so the same key always names the same claim (and a retry cannot mint a second one).
pub fn effect_id(assignment_id: &str, idempotency_key: &str) -> String {
    let h = crate::util::sha256_hex(
        "mosaic/effect-id/v1",
        &[assignment_id.as_bytes(), idempotency_key.as_bytes()],
    );
    format!("ef-{}", &h[..32])
}

/// The digest of one operation: its target and the bytes that say exactly what it does
/// (a request's method, path and body digest; a ref update's old and new ids), each
/// length-prefixed under the executor's domain.
pub fn operation_digest(target: &Target, parts: &[&[u8]]) -> String {
    let text = target.text();
    let mut all: Vec<&[u8]> = vec![text.as_bytes()];
    all.extend_from_slice(parts);
    format!(
        "sha256:{}",
        crate::util::sha256_hex(
            &format!("mosaic/effect-operation/{}/v1", target.executor()),
            &all
        )
    )
}

/// The digest of what a broker observed of an effect's result.
pub fn result_digest(effect_id: &str, outcome: Outcome, parts: &[&[u8]]) -> String {
    let mut all: Vec<&[u8]> = vec![effect_id.as_bytes(), outcome.as_str().as_bytes()];
    all.extend_from_slice(parts);
    format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/effect-result/v1", &all)
    )
}

/// A claim's idempotency key: what the broker (or the harness, for a push) names it by.
pub fn key_ok(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 200
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-' | b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_round_trip_and_refuse_anything_else() {
        for (e, t) in [
            (Executor::Provider, "provider"),
            (Executor::Egress, "egress:pypi.org:443"),
            (Executor::Egress, "egress:10.0.0.7:5432"),
            (Executor::Push, "push:app:refs/heads/mosaic/as-1"),
        ] {
            let p = Target::parse(e, t).unwrap();
            assert_eq!(p.text(), t);
            assert_eq!(p.executor(), e);
        }
        for (e, t) in [
            (Executor::Provider, "provider:x"),
            (Executor::Egress, "egress:pypi.org"),
            (Executor::Egress, "egress:PyPI.org:443"),
            (Executor::Egress, "egress:pypi.org:0"),
            (Executor::Egress, "egress:pypi.org:080"),
            (Executor::Egress, "egress:pypi.org:70000"),
            (Executor::Egress, "egress:-x.org:443"),
            (Executor::Egress, "egress:a..b:443"),
            (Executor::Egress, "provider"),
            (Executor::Push, "push:app:refs/tags/v1"),
            (Executor::Push, "push:app:refs/heads/../x"),
            (Executor::Push, "push:app:refs/heads/x.lock"),
            (Executor::Push, "push:../app:refs/heads/x"),
            (Executor::Push, "push:app:refs/heads/a@{1}"),
            (Executor::Push, "push:app"),
        ] {
            assert!(Target::parse(e, t).is_err(), "{t} accepted as {e}");
        }
        assert_eq!(Executor::parse("deploy"), None);
    }

    #[test]
    fn each_target_is_licensed_only_by_its_own_entries() {
        let web = Target::parse(Executor::Egress, "egress:pypi.org:443").unwrap();
        assert_eq!(
            web.licensed_by("as-1"),
            vec!["egress:pypi.org:443", "egress:pypi.org"]
        );
        let db = Target::parse(Executor::Egress, "egress:pypi.org:5432").unwrap();
        assert_eq!(db.licensed_by("as-1"), vec!["egress:pypi.org:5432"]);
        let own = Target::parse(Executor::Push, "push:app:refs/heads/mosaic/as-1").unwrap();
        assert_eq!(
            own.licensed_by("as-1"),
            vec!["push:app:refs/heads/mosaic/as-1", "push:app"]
        );
        // Another assignment's branch is not "its own branch" for this one.
        assert_eq!(
            own.licensed_by("as-2"),
            vec!["push:app:refs/heads/mosaic/as-1"]
        );
    }

    #[test]
    fn ids_and_digests_are_bound_to_what_they_name() {
        assert_eq!(effect_id("as-1", "k"), effect_id("as-1", "k"));
        assert_ne!(effect_id("as-1", "k"), effect_id("as-2", "k"));
        assert_ne!(effect_id("as-1", "k"), effect_id("as-1", "k2"));
        assert!(effect_id("as-1", "k").starts_with("ef-"));
        let t = Target::Provider;
        assert_ne!(
            operation_digest(&t, &[b"POST", b"/v1/x"]),
            operation_digest(&t, &[b"POST/v1", b"/x"]),
            "parts are length-prefixed"
        );
        let e = Target::parse(Executor::Egress, "egress:a.b:443").unwrap();
        assert_ne!(operation_digest(&t, &[]), operation_digest(&e, &[]));
        assert!(key_ok("gw-0123/ab:c.d_e"));
        assert!(!key_ok("a b") && !key_ok("") && !key_ok(&"k".repeat(201)));
    }
}
