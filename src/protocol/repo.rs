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
    #[error("file to copy {0:?}: a relative path inside the repository (1–1024 bytes, no control characters, no '.' or '..' component, not in .git)")]
    CopyPath(String),
    #[error("setup command {0:?}: 1–4096 bytes on one line, no control characters")]
    Command(String),
    #[error("setup: at most {max_copy} files to copy and {max_commands} commands, a timeout of 1–{max_timeout} s; files to copy only from a repository path (a URL has no source directory to copy them from)")]
    Setup {
        max_copy: usize,
        max_commands: usize,
        max_timeout: u32,
    },
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

/// A file a fresh workspace gets from the repository's source directory (an ignored
/// `.env`-style file a clone does not carry): its path relative to the repository, the
/// same in the source and in the workspace.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CopyPath(String);

impl CopyPath {
    pub fn parse(s: &str) -> Result<Self, RepoError> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok = !s.is_empty()
            && s.len() <= 1024
            && !s.chars().any(char::is_control)
            && parts
                .iter()
                .all(|p| !p.is_empty() && *p != "." && *p != "..")
            && parts[0] != ".git";
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(RepoError::CopyPath(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for CopyPath {
    type Error = RepoError;
    fn try_from(s: String) -> Result<Self, RepoError> {
        Self::parse(&s)
    }
}

impl From<CopyPath> for String {
    fn from(n: CopyPath) -> String {
        n.0
    }
}

/// A command a fresh workspace's setup runs (`/bin/sh -c`, in the workspace), one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SetupCommand(String);

impl SetupCommand {
    pub fn parse(s: &str) -> Result<Self, RepoError> {
        if !s.trim().is_empty() && s.len() <= 4096 && !s.chars().any(char::is_control) {
            Ok(Self(s.to_string()))
        } else {
            Err(RepoError::Command(s.to_string()))
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SetupCommand {
    type Error = RepoError;
    fn try_from(s: String) -> Result<Self, RepoError> {
        Self::parse(&s)
    }
}

impl From<SetupCommand> for String {
    fn from(n: SetupCommand) -> String {
        n.0
    }
}

/// What a repository's fresh workspace gets before any harness runs in it: files copied
/// from its source directory, then commands run in it (confined like the lane's
/// generations, in the generation's cgroup), each within `timeout_s`. Part of the
/// repository's declaration (a name keeps it), and of every checkpoint's recorded inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, try_from = "SetupWire")]
pub struct RepoSetup {
    copy: Vec<CopyPath>,
    commands: Vec<SetupCommand>,
    timeout_s: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetupWire {
    copy: Vec<CopyPath>,
    commands: Vec<SetupCommand>,
    timeout_s: u32,
}

impl TryFrom<SetupWire> for RepoSetup {
    type Error = RepoError;
    fn try_from(w: SetupWire) -> Result<Self, RepoError> {
        Self::new(w.copy, w.commands, Some(w.timeout_s))
    }
}

impl Default for RepoSetup {
    fn default() -> Self {
        Self {
            copy: vec![],
            commands: vec![],
            timeout_s: Self::DEFAULT_TIMEOUT_S,
        }
    }
}

impl RepoSetup {
    pub const MAX_COPY: usize = 32;
    pub const MAX_COMMANDS: usize = 16;
    pub const MAX_TIMEOUT_S: u32 = 3600;
    pub const DEFAULT_TIMEOUT_S: u32 = 300;

    /// Checked as a whole: within the limits, no file named twice (kept in order of
    /// path; commands keep theirs).
    pub fn new(
        mut copy: Vec<CopyPath>,
        commands: Vec<SetupCommand>,
        timeout_s: Option<u32>,
    ) -> Result<Self, RepoError> {
        let timeout_s = timeout_s.unwrap_or(Self::DEFAULT_TIMEOUT_S);
        copy.sort();
        let dup = copy.windows(2).any(|w| w[0] == w[1]);
        if dup
            || copy.len() > Self::MAX_COPY
            || commands.len() > Self::MAX_COMMANDS
            || !(1..=Self::MAX_TIMEOUT_S).contains(&timeout_s)
        {
            return Err(Self::limits());
        }
        Ok(Self {
            copy,
            commands,
            timeout_s,
        })
    }

    /// Parsed from what an operator typed.
    pub fn parse(
        copy: &[String],
        commands: &[String],
        timeout_s: Option<u32>,
    ) -> Result<Self, RepoError> {
        Self::new(
            copy.iter()
                .map(|c| CopyPath::parse(c))
                .collect::<Result<_, _>>()?,
            commands
                .iter()
                .map(|c| SetupCommand::parse(c))
                .collect::<Result<_, _>>()?,
            timeout_s,
        )
    }

    fn limits() -> RepoError {
        RepoError::Setup {
            max_copy: Self::MAX_COPY,
            max_commands: Self::MAX_COMMANDS,
            max_timeout: Self::MAX_TIMEOUT_S,
        }
    }

    /// Whether it asks for nothing.
    pub fn is_empty(&self) -> bool {
        self.copy.is_empty() && self.commands.is_empty()
    }
    pub fn copy(&self) -> &[CopyPath] {
        &self.copy
    }
    pub fn commands(&self) -> &[SetupCommand] {
        &self.commands
    }
    pub fn timeout_s(&self) -> u32 {
        self.timeout_s
    }

    /// Whether it fits `source`: files are copied only from a directory.
    pub fn fits(&self, source: &RepoSource) -> Result<(), RepoError> {
        if self.copy.is_empty() || matches!(source, RepoSource::Path(_)) {
            Ok(())
        } else {
            Err(Self::limits())
        }
    }

    /// Its digest: every file name, every command, in order, and the timeout.
    pub fn digest(&self) -> String {
        let mut parts: Vec<&[u8]> = vec![b"copy"];
        parts.extend(self.copy.iter().map(|c| c.as_str().as_bytes()));
        parts.push(b"commands");
        parts.extend(self.commands.iter().map(|c| c.as_str().as_bytes()));
        let t = self.timeout_s.to_be_bytes();
        parts.push(&t);
        format!(
            "sha256:{}",
            crate::util::sha256_hex("mosaic/repo-setup/v1", &parts)
        )
    }
}

/// What a host needs to give an assignment its workspace: the repository, where it comes
/// from, the ref its branch `mosaic/<assignment_id>` starts at, and the setup of a fresh
/// workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepoBinding {
    pub name: RepoName,
    pub source: RepoSource,
    pub base: BaseRef,
    #[serde(default, skip_serializing_if = "RepoSetup::is_empty")]
    pub setup: RepoSetup,
}

/// One copied file of a workspace's recorded inputs: its path and the digest of its
/// bytes, or that the restored checkpoint already had it (the work's version kept).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopiedFile {
    pub path: CopyPath,
    /// `sha256:` of the bytes copied; `None`: kept as the checkpoint restored it.
    pub digest: Option<String>,
}

/// What a workspace was made from, besides its files: the repository and its source, the
/// commit its branch started at, the checkpoint it was restored from, the setup's digest
/// and the files it copied. Its digest is recorded with every checkpoint of the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceInputs {
    pub repository: RepoName,
    pub source: RepoSource,
    pub base_commit_id: Option<String>,
    pub restored_from: Option<String>,
    pub setup_digest: String,
    pub copied: Vec<CopiedFile>,
    /// How many setup commands ran, each to a zero exit.
    pub commands_run: usize,
}

impl WorkspaceInputs {
    pub fn digest(&self) -> String {
        let none = b"-".as_slice();
        let mut parts: Vec<&[u8]> = vec![
            self.repository.as_str().as_bytes(),
            self.source.kind().as_bytes(),
            self.source.as_str().as_bytes(),
            self.base_commit_id.as_deref().map_or(none, str::as_bytes),
            self.restored_from.as_deref().map_or(none, str::as_bytes),
            self.setup_digest.as_bytes(),
        ];
        for c in &self.copied {
            parts.push(c.path.as_str().as_bytes());
            parts.push(c.digest.as_deref().map_or(none, str::as_bytes));
        }
        let n = (self.commands_run as u64).to_be_bytes();
        parts.push(&n);
        format!(
            "sha256:{}",
            crate::util::sha256_hex("mosaic/workspace-inputs/v1", &parts)
        )
    }
}

/// A checkpoint of a workspace as its host took it: the synthetic commit on the hidden
/// ref of its checkpoint repository, and that commit's tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointRef {
    pub repository: RepoName,
    pub commit_id: String,
    pub tree_id: String,
    /// The digest of the workspace's recorded inputs (`WorkspaceInputs`), when its host
    /// recorded them (a workspace made before they were is `None`). Not part of the
    /// checkpoint's content address: two workspaces made alike hold the same tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inputs_digest: Option<String>,
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

    /// Both ids are object ids (and the inputs' digest, if any, a digest).
    pub fn well_formed(&self) -> bool {
        object_id_ok(&self.commit_id)
            && object_id_ok(&self.tree_id)
            && self
                .inputs_digest
                .as_deref()
                .is_none_or(crate::protocol::envelope::is_digest)
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
            inputs_digest: None,
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

/// Most checkpoints one generation may ask for (`mosaic lane checkpoint`).
pub const MAX_REQUESTED_CHECKPOINTS: u32 = 32;

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

    #[test]
    fn a_setup_names_only_files_inside_the_repository() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "./a",
            "a//b",
            "a/",
            ".git/config",
            ".git",
            "a\nb",
            "a\u{1b}b",
        ] {
            assert!(CopyPath::parse(bad).is_err(), "{bad:?}");
        }
        for good in [".env", "config/.env.local", "a/.git-keep", "x.git/y"] {
            assert!(CopyPath::parse(good).is_ok(), "{good:?}");
        }
        assert!(SetupCommand::parse("").is_err() && SetupCommand::parse("  ").is_err());
        assert!(SetupCommand::parse("a\nb").is_err());
        assert!(SetupCommand::parse("make setup && echo ok").is_ok());
        let s = |c: &[&str], t| {
            RepoSetup::parse(
                &c.iter().map(|x| x.to_string()).collect::<Vec<_>>(),
                &["true".into()],
                t,
            )
        };
        assert!(s(&[".env", ".env"], None).is_err(), "a file twice");
        assert!(s(&[".env"], Some(0)).is_err() && s(&[".env"], Some(3601)).is_err());
        let many: Vec<String> = (0..33).map(|i| format!("f{i}")).collect();
        assert!(RepoSetup::parse(&many, &[], None).is_err());
        // The digest binds every part: order of files is canonical, of commands is not.
        let a = s(&["b", "a"], None).unwrap();
        assert_eq!(a.digest(), s(&["a", "b"], None).unwrap().digest());
        assert_ne!(a.digest(), s(&["a"], None).unwrap().digest());
        assert_ne!(a.digest(), s(&["a", "b"], Some(10)).unwrap().digest());
        let two = |x: &str, y: &str| {
            RepoSetup::parse(&[], &[x.into(), y.into()], None)
                .unwrap()
                .digest()
        };
        assert_ne!(two("x", "y"), two("y", "x"));
        assert_ne!(two("xy", "z"), two("x", "yz"));
        // Files only from a directory; the wire refuses what `new` refuses.
        assert!(a
            .fits(&RepoSource::url("https://example.com/r.git").unwrap())
            .is_err());
        assert!(a.fits(&RepoSource::path("/srv/r").unwrap()).is_ok());
        let wire = r#"{"copy":[".env",".env"],"commands":[],"timeout_s":5}"#;
        assert!(serde_json::from_str::<RepoSetup>(wire).is_err());
        let back: RepoSetup = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
        assert_eq!(back, a);
    }
}
