//! Checkpoint transfer on the host session: a host uploads the objects of a checkpoint it
//! recorded (`checkpoint_upload`, each part answered by `checkpoint_stored`), and a host
//! restoring one its stage names fetches them (`checkpoint_fetch`, each part answered by
//! `checkpoint_data`). Objects are content addressed (`sha256:` of their bytes): the
//! coordinator verifies each whole object before it says `stored` and again before it
//! serves one; the fetching host verifies it again before git reads it.

use super::{Fields, WireError};
use crate::protocol::canonical::Value;
use crate::protocol::envelope::{n, s};
use crate::protocol::repo::{RestorePoint, StoredObject};

/// Most raw bytes one part carries (its base64 is at most an envelope string's 64 KiB).
pub const PART_BYTES: usize = 48 * 1024;

/// What an uploaded object is to its checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectRole {
    /// A bundle of the base commit the checkpoint is relative to (every object of it).
    Base,
    /// The checkpoint's own bundle (its commit, with the base as its prerequisite).
    Bundle,
    /// A generation's harness artifact (encrypted): `checkpoint_digest` and
    /// `object_digest` are both its digest (it is its own content address).
    Artifact,
}

impl ObjectRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Base => "base",
            Self::Bundle => "bundle",
            Self::Artifact => "artifact",
        }
    }
}

/// `checkpoint_upload`: one part of one object of a checkpoint the host recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointUpload {
    pub assignment_id: String,
    pub lane_incarnation_id: String,
    pub generation: u64,
    pub checkpoint_digest: String,
    pub role: ObjectRole,
    /// With role `base`: the commit the bundle holds.
    pub base_commit_id: Option<String>,
    pub object_digest: String,
    pub object_size: u64,
    pub offset: u64,
    pub data: Vec<u8>,
}

/// The coordinator's answer to one uploaded part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredVerdict {
    /// Send the part that starts at `received`.
    More,
    /// The object is whole, verified and recorded for the checkpoint.
    Stored,
    /// Not now (no leader, a database fault): upload it again later.
    Retry(String),
    /// Never (too large, not this host's checkpoint, the bytes do not match their digest).
    Refused(String),
}

impl StoredVerdict {
    fn encode(&self) -> String {
        match self {
            Self::More => "more".into(),
            Self::Stored => "stored".into(),
            Self::Retry(c) => format!("retry:{c}"),
            Self::Refused(c) => format!("refused:{c}"),
        }
    }

    fn parse(v: &str) -> Option<Self> {
        match v {
            "more" => Some(Self::More),
            "stored" => Some(Self::Stored),
            // The receipt verdict's `retry:`/`refused:` forms, read the same way.
            _ => match super::Verdict::parse(v)? {
                super::Verdict::Retry(c) => Some(Self::Retry(c)),
                super::Verdict::Refused(c) => Some(Self::Refused(c)),
                super::Verdict::Ingested => None,
            },
        }
    }
}

/// `checkpoint_stored`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointStored {
    pub object_digest: String,
    pub verdict: StoredVerdict,
    /// How many bytes of the object the store holds (the next part starts there).
    pub received: u64,
}

/// `checkpoint_fetch`: one part of an object the stage of `reservation_id` restores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointFetch {
    pub assignment_id: String,
    pub reservation_id: String,
    pub object_digest: String,
    pub offset: u64,
}

/// The coordinator's answer to a fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataAnswer {
    Data { object_size: u64, data: Vec<u8> },
    Refused(String),
}

/// `checkpoint_data`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointData {
    pub object_digest: String,
    pub offset: u64,
    pub answer: DataAnswer,
}

fn b64(data: &[u8]) -> Value {
    use base64::Engine;
    s(&base64::engine::general_purpose::STANDARD.encode(data))
}

impl Fields<'_> {
    fn bytes(&self, field: &'static str) -> Result<Vec<u8>, WireError> {
        use base64::Engine;
        let text = self.str(field)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .ok()
            .filter(|d| d.len() <= PART_BYTES)
            .ok_or_else(|| self.miss(field, "base64 of at most 48 KiB"))
    }
}

fn null_authority(f: &mut Vec<(&'static str, Value)>, assignment_id: Option<&str>) {
    f.extend([
        ("sot_incarnation", Value::Null),
        ("coordinator_epoch", Value::Null),
        ("assignment_id", assignment_id.map(s).unwrap_or(Value::Null)),
    ]);
}

impl CheckpointUpload {
    pub fn fields(&self) -> Vec<(&'static str, Value)> {
        let mut f = vec![(
            "idempotency_key",
            s(&format!(
                "checkpoint-upload/{}/{}",
                self.object_digest, self.offset
            )),
        )];
        null_authority(&mut f, Some(&self.assignment_id));
        f.extend([
            ("lane_incarnation_id", s(&self.lane_incarnation_id)),
            ("generation", n(self.generation)),
            ("checkpoint_digest", s(&self.checkpoint_digest)),
            ("role", s(self.role.as_str())),
            ("object_digest", s(&self.object_digest)),
            ("object_size", n(self.object_size)),
            ("offset", n(self.offset)),
            ("data", b64(&self.data)),
        ]);
        if let Some(b) = &self.base_commit_id {
            f.push(("base_commit_id", s(b)));
        }
        f
    }

    pub(super) fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        let role = match f.str("role")?.as_str() {
            "base" => ObjectRole::Base,
            "bundle" => ObjectRole::Bundle,
            "artifact" => ObjectRole::Artifact,
            other => return Err(f.unknown("role", other)),
        };
        Ok(Self {
            assignment_id: f.str("assignment_id")?,
            lane_incarnation_id: f.str("lane_incarnation_id")?,
            generation: f.uint("generation")?,
            checkpoint_digest: f.str("checkpoint_digest")?,
            role,
            base_commit_id: f.opt_str("base_commit_id"),
            object_digest: f.str("object_digest")?,
            object_size: f.uint("object_size")?,
            offset: f.uint("offset")?,
            data: f.bytes("data")?,
        })
    }
}

impl CheckpointFetch {
    pub fn fields(&self) -> Vec<(&'static str, Value)> {
        let mut f = vec![(
            "idempotency_key",
            s(&format!(
                "checkpoint-fetch/{}/{}/{}",
                self.reservation_id, self.object_digest, self.offset
            )),
        )];
        null_authority(&mut f, Some(&self.assignment_id));
        f.extend([
            ("reservation_id", s(&self.reservation_id)),
            ("object_digest", s(&self.object_digest)),
            ("offset", n(self.offset)),
        ]);
        f
    }

    pub(super) fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        Ok(Self {
            assignment_id: f.str("assignment_id")?,
            reservation_id: f.str("reservation_id")?,
            object_digest: f.str("object_digest")?,
            offset: f.uint("offset")?,
        })
    }
}

impl CheckpointStored {
    pub(super) fn fields(&self, f: &mut Vec<(&'static str, Value)>) {
        f.push((
            "idempotency_key",
            s(&format!(
                "checkpoint-stored/{}/{}/{}",
                self.object_digest,
                self.received,
                uuid::Uuid::new_v4().simple()
            )),
        ));
        null_authority(f, None);
        f.extend([
            ("object_digest", s(&self.object_digest)),
            ("verdict", s(&self.verdict.encode())),
            ("received", n(self.received)),
        ]);
    }

    pub(super) fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        let v = f.str("verdict")?;
        Ok(Self {
            object_digest: f.str("object_digest")?,
            verdict: StoredVerdict::parse(&v).ok_or_else(|| f.unknown("verdict", &v))?,
            received: f.uint("received")?,
        })
    }
}

impl CheckpointData {
    pub(super) fn fields(&self, f: &mut Vec<(&'static str, Value)>) {
        f.push((
            "idempotency_key",
            s(&format!(
                "checkpoint-data/{}/{}/{}",
                self.object_digest,
                self.offset,
                uuid::Uuid::new_v4().simple()
            )),
        ));
        null_authority(f, None);
        f.extend([
            ("object_digest", s(&self.object_digest)),
            ("offset", n(self.offset)),
        ]);
        match &self.answer {
            DataAnswer::Data { object_size, data } => f.extend([
                ("verdict", s("data")),
                ("object_size", n(*object_size)),
                ("data", b64(data)),
            ]),
            DataAnswer::Refused(c) => f.push(("verdict", s(&format!("refused:{c}")))),
        }
    }

    pub(super) fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        let v = f.str("verdict")?;
        let answer = match v.as_str() {
            "data" => DataAnswer::Data {
                object_size: f.uint("object_size")?,
                data: f.bytes("data")?,
            },
            other => match other.strip_prefix("refused:").filter(|c| !c.is_empty()) {
                Some(c) => DataAnswer::Refused(c.to_string()),
                None => return Err(f.unknown("verdict", other)),
            },
        };
        Ok(Self {
            object_digest: f.str("object_digest")?,
            offset: f.uint("offset")?,
            answer,
        })
    }
}

/// A stage's restore point, as its `restore_*` fields.
pub(super) fn restore_fields(f: &mut Vec<(&'static str, Value)>, r: &RestorePoint) {
    f.extend([
        ("restore_checkpoint_digest", s(&r.checkpoint_digest)),
        ("restore_commit_id", s(&r.commit_id)),
        ("restore_tree_id", s(&r.tree_id)),
        ("restore_host_id", s(&r.host_id)),
    ]);
    if let Some(b) = &r.base_commit_id {
        f.push(("restore_base_commit_id", s(b)));
    }
    if let Some(o) = &r.base_object {
        f.extend([
            ("restore_base_object", s(&o.digest)),
            ("restore_base_size", n(o.size)),
        ]);
    }
    if let Some(o) = &r.bundle_object {
        f.extend([
            ("restore_bundle_object", s(&o.digest)),
            ("restore_bundle_size", n(o.size)),
        ]);
    }
}

impl Fields<'_> {
    /// A stage's restore point: its four required fields all present or none of them;
    /// each stored object with its size; a base object only with its commit.
    pub(super) fn restore(&self) -> Result<Option<RestorePoint>, WireError> {
        let Some(checkpoint_digest) = self.opt_str("restore_checkpoint_digest") else {
            return Ok(None);
        };
        let object = |d: &'static str, size: &'static str| -> Result<_, WireError> {
            Ok(match self.opt_str(d) {
                Some(digest) => Some(StoredObject {
                    digest,
                    size: self.uint(size)?,
                }),
                None => None,
            })
        };
        let r = RestorePoint {
            checkpoint_digest,
            commit_id: self.str("restore_commit_id")?,
            tree_id: self.str("restore_tree_id")?,
            host_id: self.str("restore_host_id")?,
            base_commit_id: self.opt_str("restore_base_commit_id"),
            base_object: object("restore_base_object", "restore_base_size")?,
            bundle_object: object("restore_bundle_object", "restore_bundle_size")?,
        };
        if r.base_object.is_some() && r.base_commit_id.is_none() {
            return Err(self.miss("restore_base_commit_id", "a commit id"));
        }
        Ok(Some(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_round_trip_and_unknown_text_is_refused() {
        for v in [
            StoredVerdict::More,
            StoredVerdict::Stored,
            StoredVerdict::Retry("unavailable".into()),
            StoredVerdict::Refused("too-large".into()),
        ] {
            assert_eq!(StoredVerdict::parse(&v.encode()), Some(v));
        }
        for bad in ["", "ok", "retry:", "refused", "maybe:x", "ingested"] {
            assert_eq!(StoredVerdict::parse(bad), None, "{bad:?}");
        }
    }
}
