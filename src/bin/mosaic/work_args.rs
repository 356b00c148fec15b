//! The command line of work's homes: `mosaic repo …` and `mosaic checkpoint …`.

use clap::Subcommand;

use crate::at::CoordinatorAt;

#[derive(Subcommand)]
pub(crate) enum CheckpointOp {
    /// The recorded checkpoints: digests, commit and tree ids, what they bind.
    List {
        #[arg(long = "assignment")]
        assignment_id: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// One stored checkpoint, read-only: what it binds and the files it changed against its
    /// base (from the coordinator's store, every object verified against its digest).
    Show {
        /// Its digest (`sha256:…`, as `checkpoint list` shows it).
        checkpoint_digest: String,
        /// The patch too (at most 1 MiB; `diff_truncated` says when it was cut).
        #[arg(long)]
        diff: bool,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// A stored checkpoint as a repository of your own: `--into DIR` (absent or empty)
    /// becomes a repository on the branch `mosaic/<assignment>` at the checkpoint's base,
    /// its files exactly the checkpoint's (`git status` shows the work as changes). Every
    /// object is checked against its digest before it is used.
    Restore {
        checkpoint_digest: String,
        #[arg(long)]
        into: std::path::PathBuf,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// The grants that let one assignment start from another's checkpoint (every bound
    /// field, whether consumed, revoked or expired, and the access receipt).
    Grants {
        #[arg(long = "assignment")]
        assignment_id: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Delete the checkpoints their retention policy lets go (of done work, kept past
    /// `checkpoint_retention_s`, named by no unspent grant or open push or merge) and the
    /// harness artifacts theirs does (`artifact_retention_s`), each with a deletion receipt;
    /// `--dry-run` lists them. Only the coordinator's store and records: each host
    /// releases its own copy of done work once its files are in the store (`releases`).
    Gc {
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Delete a checkpoint of done work now, whatever its policy, with a deletion receipt;
    /// given a harness artifact's digest, that artifact (of done work, once its upload is
    /// settled).
    Delete {
        checkpoint_digest: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// The deletion receipts.
    Deletions {
        #[arg(long = "assignment")]
        assignment_id: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// What operators read of stored checkpoints: each `show` and each part of an object a
    /// `restore` read — who (a remote operator's principal, or the local socket's user),
    /// which checkpoint and object, when. Recorded before anything is served.
    Reads {
        #[arg(long = "assignment")]
        assignment_id: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Hosts' copies of done work they released: once the work has ended and its files are
    /// in the store, each host deletes its workspace and checkpoint refs of it; each entry
    /// is that deletion's receipt (`allowed` until the host says it is done).
    Releases {
        #[arg(long = "assignment")]
        assignment_id: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Harness artifacts (each generation's session transcript, encrypted to the
    /// coordinator's `recovery_recipients`): digests, whom they are encrypted to, whether
    /// the store holds them.
    Artifacts {
        #[arg(long = "assignment")]
        assignment_id: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Recover a harness artifact: read from the store (each read recorded), checked
    /// against its digest, decrypted with your recovery identity (`--identity FILE`, made
    /// by `mosaic pki recovery-key`; `mosaic up` keeps one in its keys directory) and
    /// unpacked into `--out DIR` (which must not exist).
    Artifact {
        artifact_digest: String,
        #[arg(long)]
        identity: std::path::PathBuf,
        #[arg(long)]
        out: std::path::PathBuf,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Revoke a grant its target has not consumed yet.
    RevokeGrant {
        grant_id: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
}

#[derive(Subcommand)]
pub(crate) enum RepoOp {
    /// Declare a repository: a directory on one host (--path, --host) or a remote every
    /// host can fetch (--url). The same declaration again is a no-op; a name keeps its
    /// source.
    Add {
        name: String,
        #[arg(
            long,
            conflicts_with = "url",
            required_unless_present = "url",
            requires = "host"
        )]
        path: Option<String>,
        #[arg(long)]
        url: Option<String>,
        /// The host the path is on.
        #[arg(long)]
        host: Option<String>,
        /// A file a fresh workspace gets from the repository's directory (a path relative
        /// to it, e.g. a gitignored `.env`); repeatable. Only with --path.
        #[arg(long = "copy", requires = "path")]
        copy: Vec<String>,
        /// A command run in a fresh workspace before its harness starts (`sh -c`, as the
        /// lane's uid, confined like its generations: no network); repeatable, in order.
        #[arg(long = "setup")]
        setup: Vec<String>,
        /// Each setup command's time limit in seconds (default 300).
        #[arg(long)]
        setup_timeout: Option<u32>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// The declared repositories.
    List {
        #[command(flatten)]
        at: CoordinatorAt,
    },
}

/// `mosaic workspace …`: handing done work's branch on.
#[derive(Subcommand)]
pub(crate) enum WorkspaceOp {
    /// Push COMPLETED work's final checkpoint to its own branch (`mosaic/<assignment>`) of
    /// the repository's remote, made by a host whose supervisor config declares the
    /// repository (`[repositories.NAME]`, with its credentials) once the coordinator admitted
    /// the exact update. Never a force push. Waits for what the host observed.
    Push {
        #[arg(long = "assignment")]
        assignment_id: String,
        /// The host that pushes (default: the host the work last ran on).
        #[arg(long)]
        host: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Merge COMPLETED work's final checkpoint into a branch of the repository's remote
    /// (`--into`, default the branch the work was based on): a fast-forward when the branch
    /// has not moved, else a merge commit; a conflict changes nothing and says where.
    Merge {
        #[arg(long = "assignment")]
        assignment_id: String,
        #[arg(long)]
        into: Option<String>,
        #[arg(long)]
        host: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// The pushes and merges of done work: the update admitted, what the host observed.
    Effects {
        #[arg(long = "assignment")]
        assignment_id: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Settle a push or merge whose outcome nobody observed (UNKNOWN, or admitted and never
    /// reported): whether the remote took it, with the evidence that shows it (what the
    /// remote's ref is now). Until then no other push or merge of that work is made.
    Resolve {
        #[command(flatten)]
        r: Resolution,
        #[command(flatten)]
        at: CoordinatorAt,
    },
}

/// How an operator settles an effect whose outcome nobody observed.
#[derive(clap::Args)]
pub(crate) struct Resolution {
    #[arg(long = "effect", value_name = "EFFECT_ID")]
    pub effect_id: String,
    /// It took effect at its sink.
    #[arg(
        long,
        conflicts_with = "not_applied",
        required_unless_present = "not_applied"
    )]
    pub applied: bool,
    /// It did not.
    #[arg(long)]
    pub not_applied: bool,
    /// What shows it (what the sink shows now): its digest is recorded.
    #[arg(long)]
    pub evidence: std::path::PathBuf,
}

/// Runs one `mosaic workspace …`.
pub(crate) fn workspace(op: WorkspaceOp) -> anyhow::Result<std::process::ExitCode> {
    use mosaic::coordinator::service::OperatorRequest;
    match op {
        WorkspaceOp::Push {
            assignment_id,
            host,
            at,
        } => at.call(OperatorRequest::WorkspaceEffect {
            assignment_id,
            kind: "push".into(),
            into: None,
            host_id: host,
            wait: true,
            request_id: None,
        }),
        WorkspaceOp::Merge {
            assignment_id,
            into,
            host,
            at,
        } => at.call(OperatorRequest::WorkspaceEffect {
            assignment_id,
            kind: "merge".into(),
            into,
            host_id: host,
            wait: true,
            request_id: None,
        }),
        WorkspaceOp::Effects { assignment_id, at } => {
            at.call(OperatorRequest::WorkspaceEffects { assignment_id })
        }
        WorkspaceOp::Resolve {
            r:
                Resolution {
                    effect_id,
                    applied,
                    evidence,
                    ..
                },
            at,
        } => {
            let evidence_digest =
                match evidence_digest("workspace-effect-reconciliation", &evidence) {
                    Ok(d) => d,
                    Err(m) => return at.refuse(m),
                };
            at.call(OperatorRequest::WorkspaceResolve {
                effect_id,
                applied,
                evidence_digest,
                request_id: None,
            })
        }
    }
}

/// The digest of evidence file `path` for `purpose`; why not, if it cannot be read or is
/// empty.
pub(crate) fn evidence_digest(purpose: &str, path: &std::path::Path) -> Result<String, String> {
    match std::fs::read(path) {
        Ok(b) if !b.is_empty() => Ok(mosaic::protocol::work::evidence_digest(purpose, &b)),
        Ok(_) => Err(format!("evidence {} is empty", path.display())),
        Err(e) => Err(format!("reading evidence {}: {e}", path.display())),
    }
}
