//! Every state column the coordinator's tables hold, as a Rust enum, and every set of
//! states the code tests against, as one constant.
//!
//! Each enum is the whole of its column's `CHECK (… IN (…))` list: `tests/chain.rs`
//! reads the constraint back from PostgreSQL and fails if the two differ. Each one encodes
//! to and decodes from its column (`ToSql`/`FromSql` as text): a value the enum does not
//! know fails at decode, naming the value and the enum, never silently.
//!
//! **Never:** a state as a bare string anywhere else in `src/coordinator`: a statement that
//! needs a state binds the enum as a parameter or writes its list from a constant here.

use std::error::Error;
use std::fmt;

use serde::{Deserialize, Serialize};
use tokio_postgres::types::{accepts, to_sql_checked, FromSql, IsNull, ToSql, Type};

/// A state the enum does not know (a schema that moved ahead of this binary, or a typo).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a {kind}")]
pub struct UnknownState {
    pub kind: &'static str,
    pub value: String,
}

macro_rules! state_enum {
    (
        $(#[$m:meta])*
        $name:ident ($kind:literal) {
            $( $(#[$vm:meta])* $var:ident = $s:literal ),+ $(,)?
        }
    ) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vm])* $var ),+
        }

        impl $name {
            /// Every value the column may hold, in the schema's order.
            pub const ALL: &'static [$name] = &[$($name::$var),+];

            /// The column's text for this state.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$var => $s ),+
                }
            }

            /// This state as a quoted SQL literal, for statement text built at compile
            /// time (`const_format::concatcp!`): the only way a state enters SQL text.
            pub const fn sql(self) -> &'static str {
                match self {
                    $( $name::$var => concat!("'", $s, "'") ),+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownState;
            fn from_str(s: &str) -> Result<Self, UnknownState> {
                match s {
                    $( $s => Ok($name::$var), )+
                    _ => Err(UnknownState { kind: $kind, value: s.to_string() }),
                }
            }
        }

        impl From<$name> for &'static str {
            fn from(s: $name) -> &'static str {
                s.as_str()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }

        /// Compares with the column's text (for tests and read models; decisions compare
        /// enums).
        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.as_str() == *other
            }
        }

        impl ToSql for $name {
            fn to_sql(
                &self,
                ty: &Type,
                out: &mut bytes::BytesMut,
            ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
                self.as_str().to_sql(ty, out)
            }
            accepts!(TEXT, VARCHAR);
            to_sql_checked!();
        }

        impl<'a> FromSql<'a> for $name {
            fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
                let s = <&str as FromSql>::from_sql(ty, raw)?;
                Ok(s.parse::<$name>()?)
            }
            accepts!(TEXT, VARCHAR);
        }

    };
}

state_enum! {
    /// `lane_incarnations.state`: where a lane incarnation is in the chain (spec §6).
    LaneState ("lane state") {
        IdleClean = "IDLE_CLEAN",
        Reserved = "RESERVED",
        Checkpointing = "CHECKPOINTING",
        Fenced = "FENCED",
        Staging = "STAGING",
        ContractInjecting = "CONTRACT_INJECTING",
        AwaitingAck = "AWAITING_ACK",
        Ready = "READY",
        Running = "RUNNING",
        Draining = "DRAINING",
        Retiring = "RETIRING",
        Quarantined = "QUARANTINED",
    }
}

state_enum! {
    /// `assignments.lifecycle`: the work's own lifecycle.
    Lifecycle ("assignment lifecycle") {
        Active = "ACTIVE",
        Recovery = "RECOVERY",
        Completed = "COMPLETED",
        Failed = "FAILED",
        Cancelled = "CANCELLED",
        Quarantined = "QUARANTINED",
    }
}

state_enum! {
    /// `generations.state`.
    GenState ("generation state") {
        Staging = "STAGING",
        Live = "LIVE",
        Ended = "ENDED",
    }
}

state_enum! {
    /// `handoffs.state` (spec §8.1).
    HandoffState ("handoff state") {
        Offered = "OFFERED",
        Challenged = "CHALLENGED",
        Accepted = "ACCEPTED",
        Expired = "EXPIRED",
        Withdrawn = "WITHDRAWN",
    }
}

state_enum! {
    /// `continuations.state` (spec §14).
    ContinuationState ("continuation state") {
        Pending = "PENDING",
        Claimed = "CLAIMED",
        DeliveryAccepted = "DELIVERY_ACCEPTED",
        ResultRecorded = "RESULT_RECORDED",
        Expired = "EXPIRED",
        Abandoned = "ABANDONED",
    }
}

state_enum! {
    /// `assignments.work_status`: the work record's status (derived by a trigger from the
    /// lifecycle where the lifecycle decides it).
    WorkStatus ("work status") {
        Active = "active",
        Blocked = "blocked",
        Handoff = "handoff",
        Done = "done",
    }
}

state_enum! {
    /// `assignments.watchdog_step`: how far the inactivity watchdog has gone.
    WatchdogStep ("watchdog step") {
        None = "none",
        Warned = "warned",
        Escalated = "escalated",
        Replacing = "replacing",
    }
}

state_enum! {
    /// `effect_claims.state` (spec §5.5): admitted, then what the broker observed, or
    /// unknown until reconciled.
    ClaimState ("effect claim state") {
        Admitted = "ADMITTED",
        Completed = "COMPLETED",
        Failed = "FAILED",
        Aborted = "ABORTED",
        NotDispatched = "NOT_DISPATCHED",
        Unknown = "UNKNOWN",
        Reconciled = "RECONCILED",
    }
}

impl ClaimState {
    /// The state a broker's observation puts a claim in.
    pub fn observed(o: crate::protocol::effects::Outcome) -> Self {
        use crate::protocol::effects::Outcome;
        match o {
            Outcome::Completed => Self::Completed,
            Outcome::Failed => Self::Failed,
            Outcome::Aborted => Self::Aborted,
            Outcome::NotDispatched => Self::NotDispatched,
        }
    }
}

state_enum! {
    /// `lane_leases.state` (migration 0029, spec §13): an elastic lane asked of its host,
    /// leased (its host made it), being destroyed (decided by the TTL CAS), destroyed (its
    /// host's report), or quarantined for an operator (a collision or ambiguity).
    LeaseState ("lane lease state") {
        Requested = "REQUESTED",
        Active = "ACTIVE",
        Destroying = "DESTROYING",
        Destroyed = "DESTROYED",
        Quarantined = "QUARANTINED",
    }
}

state_enum! {
    /// `recovery_candidates.state` (migration 0031, spec §6.3): a candidate's challenge is
    /// out; its ACK was consumed by the one winning retarget CAS; or it can never be (a
    /// competitor won, or the work moved on).
    CandidateState ("recovery candidate state") {
        Issued = "ISSUED",
        Consumed = "CONSUMED",
        Invalidated = "INVALIDATED",
    }
}

state_enum! {
    /// `workspace_effects.state` (migration 0027): an operator's push or merge of done
    /// work's final checkpoint, requested, claimed by its host (or declined, found up to
    /// date, left to expire), then what the host observed, or unknown until reconciled.
    WorkspaceEffectState ("workspace effect state") {
        Requested = "REQUESTED",
        Admitted = "ADMITTED",
        Declined = "DECLINED",
        UpToDate = "UP_TO_DATE",
        Expired = "EXPIRED",
        Completed = "COMPLETED",
        Failed = "FAILED",
        NotDispatched = "NOT_DISPATCHED",
        Unknown = "UNKNOWN",
        Reconciled = "RECONCILED",
    }
}

/// Claims not yet settled: one that is admitted and not yet observed, or whose outcome is
/// unknown. Handoff, activation of another generation and a final outcome wait for none of
/// these to remain.
pub const OPEN_CLAIMS: &[ClaimState] = &[ClaimState::Admitted, ClaimState::Unknown];

/// Lane states before activation (spec §6): a chain in one of these has no RUNNING
/// generation yet. The one list the code and its statements test against.
pub const PREACTIVATION: &[LaneState] = &[
    LaneState::Reserved,
    LaneState::Checkpointing,
    LaneState::Fenced,
    LaneState::Staging,
    LaneState::ContractInjecting,
    LaneState::AwaitingAck,
    LaneState::Ready,
];

/// Lifecycles that still have an owner and a next action.
pub const NONTERMINAL: &[Lifecycle] = &[Lifecycle::Active, Lifecycle::Recovery];

impl LaneState {
    /// Before activation (one of [`PREACTIVATION`]).
    pub fn is_preactivation(self) -> bool {
        PREACTIVATION.contains(&self)
    }
}

/// A parenthesized SQL list of states, `('A', 'B')`, for a statement's `IN`. The values are
/// the enums' own constant texts (no input reaches it), so it is safe to splice.
pub fn sql_list<T: Copy + Into<&'static str>>(states: &[T]) -> String {
    let items: Vec<String> = states
        .iter()
        .map(|s| format!("'{}'", (*s).into()))
        .collect();
    format!("({})", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_round_trips_through_its_text() {
        for s in LaneState::ALL {
            assert_eq!(s.as_str().parse::<LaneState>(), Ok(*s));
        }
        for s in Lifecycle::ALL {
            assert_eq!(s.as_str().parse::<Lifecycle>(), Ok(*s));
        }
        for s in ContinuationState::ALL {
            assert_eq!(s.as_str().parse::<ContinuationState>(), Ok(*s));
        }
        let e = "running".parse::<LaneState>().unwrap_err();
        assert_eq!(e.to_string(), "\"running\" is not a lane state");
    }

    #[test]
    fn state_lists_are_quoted_sql() {
        assert_eq!(
            sql_list(PREACTIVATION),
            "('RESERVED', 'CHECKPOINTING', 'FENCED', 'STAGING', 'CONTRACT_INJECTING', 'AWAITING_ACK', 'READY')"
        );
        assert!(LaneState::Ready.is_preactivation() && !LaneState::Running.is_preactivation());
    }

    #[test]
    fn serde_uses_the_column_text() {
        assert_eq!(
            serde_json::to_string(&LaneState::IdleClean).unwrap(),
            "\"IDLE_CLEAN\""
        );
        assert!(serde_json::from_str::<WorkStatus>("\"ACTIVE\"").is_err());
    }
}
