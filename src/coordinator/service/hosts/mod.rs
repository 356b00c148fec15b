//! Host sessions: who is connected, what each host message may touch, and the
//! reconciliation a hello starts.
//!
//! Every host-originated message is accepted only for lanes, reservations and generations
//! of the session's own host, and only when its fields agree with the chain they name; a
//! message that does not is refused and audited (identifiers only) and changes nothing.
//!
//! On every hello — first connect, reconnect, or a changed lane set on a live session — the
//! host reports each lane's incarnation, status and live generations; the coordinator
//! adopts the incarnations, follows a host-side quarantine, ends what may not keep running
//! (a generation it never staged, one whose chain ended, one whose host lost the chain
//! before activation), tells the host again what a RUNNING generation may not know yet, and
//! resends whatever each live chain waits for. No lane stays wedged on a lost message.
//!
//! **Never:** lets a session act for another host's lanes, or a receipt body speak for a
//! lane or generation other than the envelope's own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use crate::coordinator::activation::AckClaim;
use crate::coordinator::ending::{EndCause, Reconciliation};
use crate::coordinator::error::{AuthorityError, Category};
use crate::coordinator::leader::Leader;
use crate::coordinator::model::ChainRow;
use crate::coordinator::states::{GenState, LaneState};
use crate::protocol::messages::{
    FromHostChain, FromHostSession, HostState, Receipt, ReceiptAck, ToHost, Verdict,
};
use crate::protocol::report::{self, HostReport};
use crate::protocol::transport::{self, Admission, Handled, Handler, Outgoing, SessionHandle};
use crate::protocol::{Envelope, Verified};

use super::driver::LaneOrder;
use super::operator::OpError;
use super::Service;

mod checkpoints;
mod effects;
mod hand_on;
mod handler;
mod messages;
mod receipts;
mod sessions;

pub(crate) use handler::*;
pub use sessions::*;
