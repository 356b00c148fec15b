//! A repository an assignment works in, as both sides check it: its name, where it comes
//! from, and the ref its branch starts at. Each is a type that cannot hold a value git
//! could read as an option, a range or a control sequence (the database's `CHECK`s say the
//! same, `migrations/0015_repositories.sql`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepoError {
    #[error("repository name {0:?}: 1–64 of A-Z a-z 0-9 . _ -, starting with a letter or digit, without '..'")]
    Name(String),
    #[error("base ref {0:?}: 1–200 of A-Z a-z 0-9 . _ / -, starting with a letter or digit, without '..'")]
    BaseRef(String),
    #[error(
        "repository path {0:?}: an absolute path without control characters, at most 4096 bytes"
    )]
    Path(String),
    #[error("repository URL {0:?}: https://, ssh:// or git@host:path, without control characters, at most 4096 bytes")]
    Url(String),
}

fn charset(s: &str, max: usize, extra: &[u8]) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || extra.contains(&b))
}

/// A repository's name in the roster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RepoName(String);

impl RepoName {
    pub fn parse(s: &str) -> Result<Self, RepoError> {
        // Never `..`: a name may become a path component (a mirror, a checkpoint store).
        if charset(s, 64, b"._-") && !s.contains("..") {
            Ok(Self(s.to_string()))
        } else {
            Err(RepoError::Name(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for RepoName {
    type Error = RepoError;
    fn try_from(s: String) -> Result<Self, RepoError> {
        Self::parse(&s)
    }
}

impl From<RepoName> for String {
    fn from(n: RepoName) -> String {
        n.0
    }
}

/// The ref an assignment's branch starts at (a branch, tag or commit id of the repository).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct BaseRef(String);

impl BaseRef {
    /// The repository's default branch, as its clone checks it out.
    pub const DEFAULT: &'static str = "HEAD";

    pub fn parse(s: &str) -> Result<Self, RepoError> {
        if charset(s, 200, b"._/-") && !s.contains("..") {
            Ok(Self(s.to_string()))
        } else {
            Err(RepoError::BaseRef(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for BaseRef {
    type Error = RepoError;
    fn try_from(s: String) -> Result<Self, RepoError> {
        Self::parse(&s)
    }
}

impl From<BaseRef> for String {
    fn from(n: BaseRef) -> String {
        n.0
    }
}

/// Where a repository is cloned from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "source", rename_all = "lowercase")]
pub enum RepoSource {
    /// A directory on one host.
    Path(String),
    /// A remote any host can fetch.
    Url(String),
}

impl RepoSource {
    pub fn path(s: &str) -> Result<Self, RepoError> {
        if s.starts_with('/') && s.len() <= 4096 && !s.chars().any(char::is_control) {
            Ok(Self::Path(s.to_string()))
        } else {
            Err(RepoError::Path(s.to_string()))
        }
    }
    pub fn url(s: &str) -> Result<Self, RepoError> {
        let scheme = s.starts_with("https://")
            || s.starts_with("ssh://")
            || (s.starts_with("git@") && s.contains(':'));
        if scheme && s.len() <= 4096 && !s.chars().any(|c| c.is_control() || c == ' ') {
            Ok(Self::Url(s.to_string()))
        } else {
            Err(RepoError::Url(s.to_string()))
        }
    }
    /// From the two database columns.
    pub fn of(kind: &str, source: &str) -> Result<Self, RepoError> {
        match kind {
            "path" => Self::path(source),
            _ => Self::url(source),
        }
    }
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Path(_) => "path",
            Self::Url(_) => "url",
        }
    }
    pub fn as_str(&self) -> &str {
        match self {
            Self::Path(s) | Self::Url(s) => s,
        }
    }
}

/// What a host needs to give an assignment its workspace: the repository, where it comes
/// from, and the ref its branch `mosaic/<assignment_id>` starts at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepoBinding {
    pub name: RepoName,
    pub source: RepoSource,
    pub base: BaseRef,
}

/// A checkpoint of a workspace as its host took it: the synthetic commit on the hidden
/// ref of its checkpoint repository, and that commit's tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRef {
    pub repository: RepoName,
    pub commit_id: String,
    pub tree_id: String,
}

/// A git object id as git prints it (SHA-1: 40 lower-case hex digits).
pub fn object_id_ok(s: &str) -> bool {
    s.len() == 40
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl CheckpointRef {
    /// Its content address: derived from the commit and tree ids alone (either side can
    /// compute it), `sha256:` and 64 hex digits.
    pub fn digest(&self) -> String {
        format!(
            "sha256:{}",
            crate::util::sha256_hex(
                "mosaic/checkpoint/v1",
                &[self.commit_id.as_bytes(), self.tree_id.as_bytes()]
            )
        )
    }

    /// Both ids are object ids.
    pub fn well_formed(&self) -> bool {
        object_id_ok(&self.commit_id) && object_id_ok(&self.tree_id)
    }
}

/// An object of the coordinator's checkpoint store: its content address and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredObject {
    pub digest: String,
    pub size: u64,
}

/// The checkpoint a stage's workspace is restored from: the assignment's latest, with
/// where its bytes are (on the host that took it; in the coordinator's store once
/// uploaded). The coordinator derives `checkpoint_digest` from the two ids before it
/// sends it; the host checks that again, and that the restored tree is exactly `tree_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestorePoint {
    pub checkpoint_digest: String,
    pub commit_id: String,
    pub tree_id: String,
    /// The host that took it.
    pub host_id: String,
    /// The commit the checkpoint is relative to (its parent), if it has one.
    pub base_commit_id: Option<String>,
    /// A bundle of the base commit, once stored.
    pub base_object: Option<StoredObject>,
    /// The checkpoint's bundle (relative to its base), once stored.
    pub bundle_object: Option<StoredObject>,
}

impl RestorePoint {
    /// Its ids are object ids and its digest is theirs.
    pub fn well_formed(&self, repository: &RepoName) -> bool {
        let c = CheckpointRef {
            repository: repository.clone(),
            commit_id: self.commit_id.clone(),
            tree_id: self.tree_id.clone(),
        };
        c.well_formed()
            && c.digest() == self.checkpoint_digest
            && self.base_commit_id.as_deref().is_none_or(object_id_ok)
    }
}

/// The hidden ref a checkpoint is kept under in the host's checkpoint repository.
pub fn checkpoint_ref(assignment_id: &str, incarnation: &str, generation: u64) -> String {
    format!("refs/mosaic/checkpoints/{assignment_id}/{incarnation}/{generation}")
}

/// The one retention policy checkpoints have today: kept until an operator removes them.
pub const RETENTION_POLICY: &str = "mosaic/retention/keep-until-removed/v1";

/// Its digest, recorded with every checkpoint.
pub fn retention_policy_digest() -> String {
    format!(
        "sha256:{}",
        crate::util::sha256_hex("mosaic/retention-policy", &[RETENTION_POLICY.as_bytes()])
    )
}

/// The hidden ref a workspace's base commit is kept under in the host's checkpoint
/// repository (a checkpoint's parent: what its bundle is relative to).
pub fn base_ref(commit_id: &str) -> String {
    format!("refs/mosaic/bases/{commit_id}")
}

/// The branch an assignment's workspace works on.
pub fn branch_of(assignment_id: &str) -> String {
    format!("mosaic/{assignment_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_git_could_read_as_an_option_or_a_range_is_accepted() {
        for bad in [
            "",
            "-x",
            "--upload-pack=x",
            "a..b",
            "a b",
            "a\nb",
            ".hidden",
            "a~1^",
        ] {
            assert!(BaseRef::parse(bad).is_err(), "{bad:?}");
            assert!(RepoName::parse(bad).is_err(), "{bad:?}");
        }
        assert!(BaseRef::parse("main").is_ok() && BaseRef::parse("release/1.2").is_ok());
        assert!(BaseRef::parse(BaseRef::DEFAULT).is_ok());
        assert!(RepoName::parse("demo-1.x").is_ok());
        assert!(RepoSource::path("relative/dir").is_err());
        assert!(RepoSource::path("/srv/repo\n").is_err());
        assert!(RepoSource::url("-oProxyCommand=x").is_err());
        assert!(RepoSource::url("file:///etc").is_err());
        assert!(RepoSource::url("https://example.com/r.git").is_ok());
    }
}
