//! The operator API: one JSON request per line over the coordinator's local socket (mode
//! 0600: only its owner can open it), or over the mutual-TLS operator listener (the client
//! certificate must name an `operator:` principal). Operator requests are not envelopes:
//! their authority is the socket's owner or the operator certificate.
//!
//! Every request is validated before anything is reserved: a bad request gets a typed
//! error (`{"ok": false, "error": {"category": …, "message": …}}`) and changes nothing.
//!
//! **Never:** answers with task text, fence material or keys; reports an outcome the
//! database has not finalized.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

use crate::coordinator::chain::ReserveRequest;
use crate::coordinator::error::{AuthorityError, Category};
use crate::coordinator::model::{ChainProgress, ChainRow, Outcome};
use crate::coordinator::requests::Opened;
use crate::protocol::task;
use crate::protocol::transport::{self, TlsIdentity};

use super::{Service, ServiceError};
use crate::coordinator::states::{ContinuationState, LaneState, Lifecycle, WorkStatus};

mod hand_on;
mod handoff;
mod operate;
mod place;
mod repos;
mod request;
mod settle;
mod wire;

pub use request::*;
pub use wire::*;
