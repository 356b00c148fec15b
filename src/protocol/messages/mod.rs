//! Typed messages: a verified envelope converted, in one place, into one struct per message
//! type, so handlers take fields by name and type instead of reading `env.str("…")`; and
//! every message a daemon sends built from its struct, so the field set a sender writes and
//! the one its receiver reads are the same code.
//!
//! - [`FromHostChain`]: the chain messages a host sends the coordinator (staged, injected,
//!   ACK, progress, blocked, handoff ACK, continuation accept and result).
//! - [`ToHost`]: everything the coordinator sends a host (stage, contract, challenge,
//!   handoff challenge, continuation, activation, reconcile, receipt verdict).
//! - [`Receipt`]: a host's termination receipt.
//!
//! **Never:** converts an envelope that was not verified (`Envelope<Verified>` only), or
//! fills a missing required field with a default: the schema guarantees each one, and a
//! conversion that finds one missing is a typed error naming the field.

use super::canonical::{self, Value};
use super::envelope::{Envelope, Verified};

mod checkpoint;
mod from_host;
mod recovery;
mod to_host;
mod workspace;
mod workspace_effect;

pub use checkpoint::*;

pub use from_host::*;
pub use recovery::*;
pub use to_host::*;
pub use workspace::*;
pub use workspace_effect::*;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{message_type}: required field {field} is missing or not {expected}")]
    Field {
        message_type: &'static str,
        field: &'static str,
        expected: &'static str,
    },
    #[error("{message_type}: {field} is {value:?}, which this build does not know")]
    Unknown {
        message_type: &'static str,
        field: &'static str,
        value: String,
    },
}

/// The category after `prefix` in a verdict's text (`retry:unavailable`): 1 to 64
/// characters, else `None`.
pub(super) fn category_after(v: &str, prefix: &str) -> Option<String> {
    v.strip_prefix(prefix)
        .filter(|c| !c.is_empty() && c.len() <= 64)
        .map(str::to_string)
}

/// The first identifier field of `env` that is not shaped like one Mosaic mints
/// (`report::id_ok`), if any. Identifiers are looked up, logged and echoed: a host message
/// carrying a malformed one is refused whole, without repeating it.
pub fn malformed_identifier(env: &Envelope<Verified>) -> Option<&'static str> {
    [
        "reservation_id",
        "assignment_id",
        "assignment_attempt_id",
        "lane_id",
        "lane_incarnation_id",
        "receipt_idempotency_key",
        "challenge_id",
        "host_id",
    ]
    .into_iter()
    .find(|f| matches!(env.get(f), Some(Value::Str(v)) if !super::report::id_ok(v)))
}

/// The chain a host's chain message speaks for: what the coordinator checks against the
/// reservation's rows before anything else (`hosts::owned`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainRef {
    pub reservation_id: String,
    pub lane_id: String,
    pub lane_incarnation_id: String,
    pub assignment_id: String,
    pub assignment_attempt_id: String,
    pub generation: u64,
    pub sot_incarnation: String,
    pub coordinator_epoch: u64,
    /// The stage's fence commitment, shown back.
    pub fence_proof: String,
}

/// Field access for one envelope, each miss a typed error naming the field.
pub(super) struct Fields<'e> {
    env: &'e Envelope<Verified>,
    t: &'static str,
}

impl<'e> Fields<'e> {
    pub(super) fn of(env: &'e Envelope<Verified>) -> Self {
        Fields {
            env,
            t: env.message_type().as_str(),
        }
    }

    pub(super) fn miss(&self, field: &'static str, expected: &'static str) -> WireError {
        WireError::Field {
            message_type: self.t,
            field,
            expected,
        }
    }

    pub(super) fn str(&self, field: &'static str) -> Result<String, WireError> {
        match self.env.get(field) {
            Some(Value::Str(s)) => Ok(s.clone()),
            _ => Err(self.miss(field, "a string")),
        }
    }

    pub(super) fn opt_str(&self, field: &'static str) -> Option<String> {
        match self.env.get(field) {
            Some(Value::Str(s)) => Some(s.clone()),
            _ => None,
        }
    }

    pub(super) fn unknown(&self, field: &'static str, value: &str) -> WireError {
        WireError::Unknown {
            message_type: self.t,
            field,
            value: value.chars().take(80).collect(),
        }
    }

    /// A stage's repository: its four fields all present and valid, or none of them.
    pub(super) fn repository(
        &self,
    ) -> Result<Option<crate::protocol::repo::RepoBinding>, WireError> {
        use crate::protocol::repo::{BaseRef, RepoBinding, RepoName, RepoSetup, RepoSource};
        let fields = [
            "repository",
            "repository_kind",
            "repository_source",
            "base_ref",
        ];
        let got: Vec<Option<String>> = fields.iter().map(|f| self.opt_str(f)).collect();
        if got.iter().all(Option::is_none) {
            return Ok(None);
        }
        let get = |i: usize| {
            got[i]
                .clone()
                .ok_or_else(|| self.miss(fields[i], "a string"))
        };
        let (name, kind, source, base) = (get(0)?, get(1)?, get(2)?, get(3)?);
        let name = RepoName::parse(&name).map_err(|_| self.unknown("repository", &name))?;
        let source = match kind.as_str() {
            "path" => RepoSource::path(&source),
            "url" => RepoSource::url(&source),
            _ => return Err(self.unknown("repository_kind", &kind)),
        }
        .map_err(|_| self.unknown("repository_source", &source))?;
        let base = BaseRef::parse(&base).map_err(|_| self.unknown("base_ref", &base))?;
        let (copy, commands) = (self.str_list("setup_copy"), self.str_list("setup_commands"));
        let setup = match self.opt_uint("setup_timeout_s") {
            None if copy.is_empty() && commands.is_empty() => RepoSetup::default(),
            None => return Err(self.miss("setup_timeout_s", "an integer")),
            Some(t) => {
                let t = u32::try_from(t)
                    .map_err(|_| self.unknown("setup_timeout_s", &t.to_string()))?;
                let setup = RepoSetup::parse(&copy, &commands, Some(t))
                    .map_err(|e| self.unknown("setup_commands", &e.to_string()))?;
                if setup.is_empty() || setup.fits(&source).is_err() {
                    return Err(self.unknown(
                        "setup_copy",
                        "a setup that asks nothing, or copies from a URL",
                    ));
                }
                setup
            }
        };
        Ok(Some(RepoBinding {
            name,
            source,
            base,
            setup,
        }))
    }

    /// A list of strings (an optional field): empty when absent.
    pub(super) fn str_list(&self, field: &'static str) -> Vec<String> {
        match self.env.get(field) {
            Some(Value::Array(v)) => v
                .iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect(),
            _ => vec![],
        }
    }

    pub(super) fn opt_uint(&self, field: &'static str) -> Option<u64> {
        match self.env.get(field) {
            Some(Value::Int(i)) if *i >= 0 => Some(*i as u64),
            _ => None,
        }
    }

    pub(super) fn uint(&self, field: &'static str) -> Result<u64, WireError> {
        match self.env.get(field) {
            Some(Value::Int(i)) if *i >= 0 => Ok(*i as u64),
            _ => Err(self.miss(field, "a non-negative integer")),
        }
    }

    pub(super) fn json(&self, field: &'static str) -> Result<serde_json::Value, WireError> {
        match self.env.get(field) {
            Some(v @ Value::Object(_)) => Ok(canonical::to_json(v)),
            _ => Err(self.miss(field, "an object")),
        }
    }

    pub(super) fn chain(&self) -> Result<ChainRef, WireError> {
        Ok(ChainRef {
            reservation_id: self.str("reservation_id")?,
            lane_id: self.str("lane_id")?,
            lane_incarnation_id: self.str("lane_incarnation_id")?,
            assignment_id: self.str("assignment_id")?,
            assignment_attempt_id: self.str("assignment_attempt_id")?,
            generation: self.uint("generation")?,
            sot_incarnation: self.str("sot_incarnation")?,
            coordinator_epoch: self.uint("coordinator_epoch")?,
            fence_proof: self.str("fence_proof")?,
        })
    }
}
