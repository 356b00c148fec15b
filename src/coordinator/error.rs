//! Coordinator errors. A rejection carries a countable category and a detail that never
//! contains secret material (fence tokens, coordinator secrets, credentials).

/// Why an authority transition was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Category {
    /// The caller's leadership (epoch, holder, launch, credential, timeline) is not current.
    StaleLeader,
    /// Another coordinator holds an unexpired lease.
    LeadershipHeld,
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
    /// The lane has a missing or unreconciled termination receipt or an unended generation.
    Unreconciled,
    /// Malformed input (digest format, empty owner, …).
    BadInput,
    /// Two observations disagree.
    Conflict,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StaleLeader => "stale-leader",
            Self::LeadershipHeld => "leadership-held",
            Self::WrongState => "wrong-state",
            Self::NotFound => "not-found",
            Self::Expired => "expired",
            Self::Mismatch => "mismatch",
            Self::ChallengeConsumed => "challenge-consumed",
            Self::FenceMismatch => "fence-mismatch",
            Self::IdempotencyConflict => "idempotency-conflict",
            Self::Unreconciled => "unreconciled",
            Self::BadInput => "bad-input",
            Self::Conflict => "conflict",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    #[error("database: {0}")]
    Db(String),
    #[error("the database is a standby (pg_is_in_recovery() is true); authority runs only on the primary")]
    Standby,
    #[error("database schema version {found} is newer than this coordinator knows ({known}); upgrade the coordinator")]
    SchemaTooNew { found: i32, known: i32 },
    #[error("{op} rejected ({}): {detail}", category.as_str())]
    Rejected {
        op: &'static str,
        category: Category,
        detail: String,
    },
}

impl AuthorityError {
    pub fn category(&self) -> Option<Category> {
        match self {
            Self::Rejected { category, .. } => Some(*category),
            _ => None,
        }
    }
}

impl From<tokio_postgres::Error> for AuthorityError {
    fn from(e: tokio_postgres::Error) -> Self {
        // Database errors describe statements and constraints, never parameter values.
        match e.as_db_error() {
            Some(d) => AuthorityError::Db(format!("{}: {}", d.code().code(), d.message())),
            None => AuthorityError::Db(e.to_string()),
        }
    }
}

impl From<deadpool_postgres::PoolError> for AuthorityError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        AuthorityError::Db(format!("connection pool: {e}"))
    }
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
