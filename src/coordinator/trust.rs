//! Revocations of registry keys and principals (migration 0016): authority, decided by a
//! fenced transition, applied by every coordinator on top of the registry file it loads.
//!
//! **Never:** un-revokes; revokes the coordinator's own principal (that would leave the
//! fleet without an authority that can sign — replace its keys with `mosaic init` instead).

use serde_json::json;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::rows::RowExt;
use super::store::Store;
use super::txn::{body, request_digest, Step};

/// A revoked key id or principal, and the key material it had then.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Revocation {
    pub subject: String,
    /// The public keys (hex) revoked; empty for an operator (revoked by name).
    pub public_keys: Vec<String>,
    pub revoked_epoch: i64,
    pub revoked_at: String,
}

/// `kind:name` or `kind:name/purpose`, as the registry names principals and keys (an
/// operator has no keys: `operator:name` only).
pub fn subject_ok(s: &str) -> bool {
    if s.starts_with("operator:") && s.contains('/') {
        return false;
    }
    let (principal, purpose) = match s.split_once('/') {
        Some((p, k)) => (p, Some(k)),
        None => (s, None),
    };
    let Some((kind, name)) = principal.split_once(':') else {
        return false;
    };
    ["coordinator", "host", "operator"].contains(&kind)
        && !name.is_empty()
        && name.len() <= 64
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && purpose.is_none_or(|p| p == "session" || p == "ordinary" || p == "recovery")
}

impl Store {
    /// Records where this coordinator process takes operator requests (not authority).
    pub async fn record_endpoint(
        &self,
        launch_id: &str,
        principal: &str,
        operator_address: Option<&str>,
    ) -> Result<(), AuthorityError> {
        let c = self.pool.get().await?;
        c.execute(
            "INSERT INTO coordinator_endpoints (launch_id, principal, operator_address) VALUES ($1, $2, $3) \
             ON CONFLICT (launch_id) DO UPDATE SET operator_address = EXCLUDED.operator_address",
            &[&launch_id, &principal, &operator_address],
        )
        .await?;
        Ok(())
    }

    /// The operator address of the coordinator that holds an unexpired leadership now.
    pub async fn leader_endpoint(&self) -> Result<Option<String>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query_opt(
            "SELECT e.operator_address FROM leadership l JOIN coordinator_endpoints e ON e.launch_id = l.launch_id \
             WHERE NOT l.released AND l.lease_expires_at > clock_timestamp() AND e.operator_address IS NOT NULL",
            &[],
        )
        .await?
        .map(|r| r.col("operator_address"))
        .transpose()
    }

    /// Every revocation, oldest first.
    pub async fn revocations(&self) -> Result<Vec<Revocation>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query(
            "SELECT subject, public_keys, revoked_epoch, mosaic_ts(revoked_at) AS revoked_at FROM trust_revocations ORDER BY revoked_at, subject",
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(Revocation {
                subject: r.col("subject")?,
                public_keys: r.col("public_keys")?,
                revoked_epoch: r.col("revoked_epoch")?,
                revoked_at: r.col("revoked_at")?,
            })
        })
        .collect()
    }

    /// Revokes `subject` for good, with `public_keys`, the keys it names in the registry in
    /// use (none for an operator; a host or key that names none is refused: a typo would
    /// otherwise be recorded for ever and revoke nothing). Revoking it again answers the
    /// first revocation.
    pub async fn revoke(
        &self,
        l: &Leader,
        subject: &str,
        own_principal: &str,
        public_keys: Vec<String>,
    ) -> Result<Revocation, AuthorityError> {
        const OP: &str = "trust-revoke";
        if !subject_ok(subject) {
            return Err(reject(
                OP,
                Category::BadInput,
                format!("{subject:?} is not a principal (host:ID, operator:NAME) or a key id (host:ID/session|ordinary)"),
            ));
        }
        if subject.split('/').next() == Some(own_principal) {
            return Err(reject(
                OP,
                Category::BadInput,
                format!("{subject} is this coordinator's own: a coordinator cannot revoke itself (rotate its keys with `mosaic init coordinator --force` in its directory, which keeps its secret and the hosts it addresses, then give every host and standby the new trust.toml)"),
            ));
        }
        if let Some(r) = self
            .revocations()
            .await?
            .into_iter()
            .find(|r| r.subject == subject)
        {
            return Ok(r);
        }
        let operator = subject.starts_with("operator:");
        if !operator && public_keys.is_empty() {
            return Err(reject(
                OP,
                Category::NotFound,
                format!("no key in the trust registry in use is {subject} or belongs to it"),
            ));
        }
        let public_keys = if operator { vec![] } else { public_keys };
        let step = Step::new(
            OP,
            l,
            format!("trust-revoke/{subject}"),
            request_digest(OP, &[subject]),
        );
        let s = subject.to_string();
        self.transition(
            &step,
            body!([s, public_keys] |f| {
                let epoch = f.leader().epoch();
                let d = f.cas(
                    "INSERT INTO trust_revocations (subject, public_keys, revoked_epoch) VALUES ($1, $2, $3) ON CONFLICT (subject) DO NOTHING RETURNING subject",
                    &[&s, &public_keys, &epoch],
                ).await?;
                let Ok(d) = d else {
                    return Err(reject(OP, Category::Conflict, format!("{s} was revoked concurrently")));
                };
                d.decide(json!({ "subject": s, "public_keys": public_keys }))
            }),
        )
        .await?;
        self.revocations()
            .await?
            .into_iter()
            .find(|r| r.subject == subject)
            .ok_or_else(|| reject(OP, Category::NotFound, subject.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn subjects_are_principals_or_key_ids() {
        for ok in [
            "host:a",
            "host:build-01.x/session",
            "operator:ann",
            "host:h/ordinary",
        ] {
            assert!(super::subject_ok(ok), "{ok}");
        }
        for bad in [
            "",
            "host:",
            "lane:x",
            "operator:ann/session",
            "host:a/other",
            "host:-a",
            "host:a b",
            "hosta",
        ] {
            assert!(!super::subject_ok(bad), "{bad}");
        }
    }
}
