//! Coordinator errors. A refusal carries a countable category and a detail that never holds
//! secret material (fence tokens, coordinator secrets, credentials, task text).

/// Why something was refused: a closed set an operator can count and script on. The same
/// categories reach the operator CLI's JSON errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Category {
    /// The caller's leadership (epoch, holder, launch, credential, timeline) is not current.
    StaleLeader,
    /// Another coordinator holds an unexpired lease.
    LeadershipHeld,
    /// This coordinator is standing by; another one leads.
    NotLeader,
    /// The record is not in the state this transition starts from.
    WrongState,
    /// An id that names nothing.
    NotFound,
    /// A deadline passed (equality counts as passed).
    Expired,
    /// A bound value differs from the canonical one.
    Mismatch,
    /// The challenge was already consumed.
    ChallengeConsumed,
    /// The fence token does not match.
    FenceMismatch,
    /// Same idempotency key, different request.
    IdempotencyConflict,
    /// The lane has a missing or unreconciled termination receipt, an unended generation,
    /// or a generation that still owes its work's checkpoint.
    Unreconciled,
    /// Malformed input (digest format, empty owner, …).
    BadInput,
    /// A runtime the lane's host did not advertise.
    UnknownRuntime,
    /// An effect the assignment's scope does not license (or its holds withhold).
    OutOfScope,
    /// A task larger than the documented limit.
    TooLarge,
    /// Two observations disagree.
    Conflict,
    /// The lane's host has no live session.
    HostUnreachable,
    /// Placement found no lane the policy allows (the message says why each was passed over).
    NoEligibleLane,
    /// A message about a lane, reservation or generation of another host.
    NotOwner,
    /// A recovery candidate's failed-target snapshot no longer matches the work (spec
    /// §6.3.1): fresh evidence, selection and a new candidate are needed.
    SnapshotChanged,
    /// The chain ended before it reached RUNNING (the message says why).
    ChainEnded,
    /// Nothing came back in time (an operator wait, a host that did not answer).
    Timeout,
    /// The database could not be reached or failed.
    Unavailable,
    /// A bug: an invariant the code relies on did not hold.
    Internal,
}

/// Every category, for parsing and documentation.
pub const ALL_CATEGORIES: [Category; 24] = [
    Category::StaleLeader,
    Category::LeadershipHeld,
    Category::NotLeader,
    Category::WrongState,
    Category::NotFound,
    Category::Expired,
    Category::Mismatch,
    Category::ChallengeConsumed,
    Category::FenceMismatch,
    Category::IdempotencyConflict,
    Category::Unreconciled,
    Category::BadInput,
    Category::UnknownRuntime,
    Category::OutOfScope,
    Category::TooLarge,
    Category::Conflict,
    Category::HostUnreachable,
    Category::NoEligibleLane,
    Category::NotOwner,
    Category::SnapshotChanged,
    Category::ChainEnded,
    Category::Timeout,
    Category::Unavailable,
    Category::Internal,
];

impl Category {
    pub fn parse(s: &str) -> Option<Self> {
        ALL_CATEGORIES.into_iter().find(|c| c.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::StaleLeader => "stale-leader",
            Self::LeadershipHeld => "leadership-held",
            Self::NotLeader => "not-leader",
            Self::WrongState => "wrong-state",
            Self::NotFound => "not-found",
            Self::Expired => "expired",
            Self::Mismatch => "mismatch",
            Self::ChallengeConsumed => "challenge-consumed",
            Self::FenceMismatch => "fence-mismatch",
            Self::IdempotencyConflict => "idempotency-conflict",
            Self::Unreconciled => "unreconciled",
            Self::BadInput => "bad-input",
            Self::UnknownRuntime => "unknown-runtime",
            Self::OutOfScope => "out-of-scope",
            Self::TooLarge => "too-large",
            Self::Conflict => "conflict",
            Self::HostUnreachable => "host-unreachable",
            Self::NoEligibleLane => "no-eligible-lane",
            Self::NotOwner => "not-owner",
            Self::SnapshotChanged => "snapshot-changed",
            Self::ChainEnded => "chain-ended",
            Self::Timeout => "timeout",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    /// A database error the statement reported (constraint, syntax, …): its SQLSTATE and
    /// the server's own message, never a parameter value.
    #[error("database: {code}: {message}")]
    Statement { code: String, message: String },
    /// The database URL cannot be used as given (syntax, an unsafe or unknown TLS mode).
    #[error("database url: {0}")]
    BadDatabaseUrl(String),
    /// The CA file a `verify-full` URL names cannot be read or holds no certificate.
    #[error("sslrootcert {path}: {detail}")]
    RootCert { path: String, detail: String },
    /// The connection failed before the outcome was known.
    #[error("database connection: {0}")]
    Connection(String),
    /// A conflict PostgreSQL asks the client to retry (deadlock, serialization).
    #[error("database asked for a retry: {0}")]
    Retryable(String),
    #[error("the database is a standby (pg_is_in_recovery() is true); authority runs only on the primary")]
    Standby,
    #[error("database schema version {found} is newer than this coordinator knows ({known}); upgrade the coordinator")]
    SchemaTooNew { found: i32, known: i32 },
    /// A promise this code makes to itself was broken (a compare-and-swap that matched more
    /// than one row, a receipt without the field its transition writes): a bug, never input.
    #[error("internal: {op}: {detail}")]
    Invariant { op: &'static str, detail: String },
    /// The system's random source failed (fence salts, ids).
    #[error("random source: {0}")]
    Entropy(String),
    /// A row did not decode: a column missing, of another type, NULL, or holding a state
    /// this binary does not know (a schema that moved ahead of it).
    #[error("decoding column {column}: {detail}")]
    Decode { column: String, detail: String },
    #[error("{op} rejected ({}): {detail}", category.as_str())]
    Rejected {
        op: &'static str,
        category: Category,
        detail: String,
    },
}

impl AuthorityError {
    /// The refusal category, when this is a refusal.
    pub fn category(&self) -> Option<Category> {
        match self {
            Self::Rejected { category, .. } => Some(*category),
            _ => None,
        }
    }

    /// The category an operator sees for any error.
    pub fn operator_category(&self) -> Category {
        match self {
            Self::Rejected { category, .. } => *category,
            Self::Statement { .. } | Self::Connection(_) | Self::Retryable(_) | Self::Standby => {
                Category::Unavailable
            }
            Self::BadDatabaseUrl(_) | Self::RootCert { .. } => Category::BadInput,
            Self::SchemaTooNew { .. }
            | Self::Invariant { .. }
            | Self::Entropy(_)
            | Self::Decode { .. } => Category::Internal,
        }
    }
}

/// PostgreSQL error codes the schema raises itself (migration 0002).
const STALE_AT_COMMIT: &str = "MS001";

impl From<tokio_postgres::Error> for AuthorityError {
    fn from(e: tokio_postgres::Error) -> Self {
        // Database errors describe statements and constraints, never parameter values.
        match e.as_db_error() {
            Some(d) if d.code().code() == STALE_AT_COMMIT => AuthorityError::Rejected {
                op: "commit",
                category: Category::StaleLeader,
                detail: d.message().to_string(),
            },
            Some(d) if matches!(d.code().code(), "40001" | "40P01") => {
                AuthorityError::Retryable(format!("{}: {}", d.code().code(), d.message()))
            }
            // Another request with the same idempotency key committed first: a retry finds
            // its receipt.
            Some(d) if d.code().code() == "23505" && d.constraint() == Some("idempotency_pkey") => {
                AuthorityError::Retryable(format!("{}: {}", d.code().code(), d.message()))
            }
            // The server ended the session (administrator, shutdown, crash): the outcome of
            // an open transaction is unknown to the client.
            Some(d) if d.code().code().starts_with("57P") || d.code().code().starts_with("08") => {
                AuthorityError::Connection(format!("{}: {}", d.code().code(), d.message()))
            }
            Some(d) => AuthorityError::Statement {
                code: d.code().code().to_string(),
                message: d.message().to_string(),
            },
            // The whole cause chain ("error performing TLS handshake: invalid peer
            // certificate: UnknownIssuer"), so the log says what to fix.
            None => AuthorityError::Connection(with_causes(&e)),
        }
    }
}

impl From<deadpool_postgres::PoolError> for AuthorityError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(b) => b.into(),
            other => AuthorityError::Connection(format!("connection pool: {other}")),
        }
    }
}

/// An error and every cause under it, `outer: inner: …`.
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        text.push_str(&format!(": {s}"));
        src = s.source();
    }
    text
}

pub(crate) fn reject(
    op: &'static str,
    category: Category,
    detail: impl Into<String>,
) -> AuthorityError {
    AuthorityError::Rejected {
        op,
        category,
        detail: detail.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_parse_back_and_are_distinct() {
        let mut seen = std::collections::BTreeSet::new();
        for c in ALL_CATEGORIES {
            assert!(seen.insert(c.as_str()), "{} twice", c.as_str());
            assert_eq!(Category::parse(c.as_str()), Some(c));
            assert_eq!(serde_json::to_value(c).unwrap(), c.as_str());
        }
    }
}
