//! The command line: every subcommand and its options (clap). `main.rs` dispatches them.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

pub(crate) use crate::at::CoordinatorAt;
pub(crate) use crate::lease_args::PlaceArgs;
pub(crate) use crate::work_args::{CheckpointOp, RepoOp};

#[derive(Parser)]
#[command(
    name = "mosaic",
    version,
    about = "Fresh-process authority for fleets of AI coding agents"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

#[derive(Subcommand)]
pub(crate) enum Cmd {
    /// Run everything on this machine (today: the supervisor with N fake-harness lanes).
    Up(UpArgs),
    /// Install the pinned real harnesses from npm (into the harness root), or check them.
    Harness {
        #[command(subcommand)]
        op: HarnessOp,
    },
    /// Run the coordinator daemon (the authority, on PostgreSQL).
    Coordinator {
        #[arg(long)]
        config: PathBuf,
    },
    /// Lanes the coordinator knows, with their incarnation and state.
    Lanes {
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Assign a task to a lane: reserve, stage a fresh generation, contract, ACK, activate.
    /// Everything is validated before anything is reserved. Without --lane, the lane is
    /// placed by the published roster (`mosaic roster publish`): one that declares the
    /// runtime, every --label and the --role, on a connected host below its capacity.
    Assign {
        #[arg(long = "lane")]
        lane_id: Option<String>,
        #[command(flatten)]
        place: Box<PlaceArgs>,
        #[arg(long)]
        runtime: String,
        /// The task text; `-` reads it from standard input. With --resume it may be left
        /// out (the assignment's own task is resumed).
        #[arg(
            long,
            conflicts_with = "task_file",
            required_unless_present_any = ["task_file", "resume"]
        )]
        task: Option<String>,
        /// Read the task text from this file (for tasks too long for a command line).
        #[arg(long)]
        task_file: Option<PathBuf>,
        /// A capability the assignment may use (repeatable; one effect lease each).
        /// Default: the lane itself.
        #[arg(long = "scope")]
        scope: Vec<String>,
        /// A capability it must not use, even where the scope names it (repeatable).
        #[arg(long = "hold")]
        holds: Vec<String>,
        /// The completion policy (default operator-evidence/v1: COMPLETED only with
        /// `mosaic stop --complete --evidence FILE`).
        #[arg(long)]
        completion_policy: Option<String>,
        /// `running`: return once the generation is RUNNING (or the chain ended).
        #[arg(long)]
        wait: Option<String>,
        /// Resume this assignment (left in recovery, e.g. after its harness died) on a
        /// fresh generation instead of creating a new assignment.
        #[arg(long)]
        resume: Option<String>,
        /// With --resume: give the assignment this new task (a different task is refused
        /// without it, so a typo never silently runs other work).
        #[arg(long, requires = "resume")]
        replace_task: bool,
        /// The inactivity policy (`name@version`, published with `mosaic policy publish`)
        /// that decides when idle work is warned, escalated, replaced and reassigned.
        /// Default: default@1.
        #[arg(long)]
        inactivity_policy: Option<String>,
        /// A declared repository (`mosaic repo add`) the assignment works in: its
        /// workspace is a clone on the branch mosaic/<assignment_id>, kept for the
        /// assignment's next generations. Without it: a private scratch directory.
        #[arg(long)]
        repo: Option<String>,
        /// The ref that branch starts at (default: the repository's HEAD).
        #[arg(long, requires = "repo")]
        base: Option<String>,
        /// Start the new assignment's workspace from this checkpoint of another
        /// assignment's work in the same repository (`sha256:…`, see `mosaic checkpoint
        /// list`): its reservation makes a single-use grant its first stage consumes.
        #[arg(long, requires = "repo", conflicts_with_all = ["resume", "base"])]
        from_checkpoint: Option<String>,
        /// How long that grant lives, seconds (default 600).
        #[arg(long, requires = "from_checkpoint")]
        grant_within: Option<u32>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// The roster: what each host's lanes are for (a declaration placement reads, never
    /// authority).
    Roster {
        #[command(subcommand)]
        op: RosterOp,
    },
    /// Repositories assignments work in (a roster declaration, not authority).
    Repo {
        #[command(subcommand)]
        op: RepoOp,
    },
    /// Checkpoints of workspaces (taken when a generation of work in a repository ends).
    Checkpoint {
        #[command(subcommand)]
        op: CheckpointOp,
    },
    /// Hand done work's branch on: push it, or merge it (through a host's push executor,
    /// once the coordinator admitted the exact update).
    Workspace {
        #[command(subcommand)]
        op: crate::work_args::WorkspaceOp,
    },
    /// Block active work: a canonical code, an evidence file and the action that would
    /// unblock it (the work keeps its owner; the watchdog leaves it alone).
    Block {
        #[arg(long = "assignment")]
        assignment_id: String,
        #[arg(long)]
        code: String,
        /// The evidence (required: a blocked claim without evidence is refused).
        #[arg(long)]
        evidence: PathBuf,
        #[arg(long)]
        next_action: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Make blocked work active again: a fresh inactivity period and attempt budget; work
    /// in recovery gets its next attempt from the watchdog at once.
    Unblock {
        #[arg(long = "assignment")]
        assignment_id: String,
        #[arg(long)]
        next_action: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Move work whose start failed before activation to another lane, through a recovery
    /// candidate the retarget policy selects (its host must acknowledge the recovery
    /// challenge before anything is reserved there).
    Retarget(crate::lease_args::RetargetArgs),
    /// Hand RUNNING work to an idle lane: the target's fresh generation must acknowledge
    /// the handoff (`mosaic lane handoff-ack`) before responsibility moves, and then still
    /// needs its own activation ACK before it runs.
    Handoff {
        #[arg(long = "assignment")]
        assignment_id: String,
        #[arg(long = "to")]
        lane_id: String,
        /// The target's task (default: the current attempt's).
        #[arg(long)]
        task: Option<String>,
        /// Milliseconds the target has to acknowledge and activate (default: the
        /// coordinator's reservation ttl); past it the work stays with its source.
        #[arg(long)]
        within_ms: Option<i64>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Continue RUNNING work with a next action: delivered to its live generation at the
    /// next settled boundary (`mosaic lane next`) and accepted exactly once.
    Continue {
        #[arg(long = "assignment")]
        assignment_id: String,
        #[arg(long)]
        next_action: String,
        /// Milliseconds it may wait for delivery (default 600000).
        #[arg(long)]
        within_ms: Option<i64>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Inactivity policies: publish a version (frozen once published), show one.
    Policy {
        #[command(subcommand)]
        op: PolicyOp,
    },
    /// Assignments (owners, state, generation) and lanes.
    Status {
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Termination receipts the coordinator ingested, with their reconciliation.
    Receipts {
        #[arg(long = "lane")]
        lane_id: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Operator notifications (newest 200): each event, the sinks that took it, the last
    /// error of one still being retried.
    Notifications {
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// End an assignment: its leases are revoked at once, its generation stopped, and the
    /// outcome (CANCELLED unless --complete or --fail) becomes final when the host's
    /// termination receipt proves the generation ended. With the host unreachable it
    /// answers `pending` and finishes when the host reconnects; repeating it is idempotent.
    /// Waiting, it answers once the lane is out of RETIRING too (`lane_state`).
    Stop {
        #[arg(long = "assignment")]
        assignment_id: String,
        /// End it COMPLETED; needs --evidence.
        #[arg(long, conflicts_with = "fail", requires = "evidence")]
        complete: bool,
        /// End it FAILED.
        #[arg(long)]
        fail: bool,
        /// A file whose SHA-256 becomes the completion evidence (its content is not sent).
        #[arg(long)]
        evidence: Option<PathBuf>,
        /// Return at once instead of waiting for the host's receipt.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Cancel an assignment in any unfinished state (a stop with outcome CANCELLED).
    Cancel {
        #[arg(long = "assignment")]
        assignment_id: String,
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// A live view of every lane (state, runtime, generation, assignment, owner, last
    /// receipt), with keys to attach (Enter), assign, stop, resume and release.
    Tui {
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// The coordinator's audit log of refusals (identifiers and categories only).
    Audit {
        /// Only rows after this audit id.
        #[arg(long, default_value_t = 0)]
        since: i64,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Run the per-host supervisor daemon.
    Supervisor {
        #[arg(long)]
        config: PathBuf,
    },
    /// Talk to a running supervisor over its local control socket.
    Host {
        /// Control socket path.
        #[arg(long, global = true, conflicts_with_all = ["config", "state_dir"])]
        socket: Option<PathBuf>,
        /// The supervisor's config file (its runtime_dir holds the socket).
        #[arg(long, global = true, conflicts_with = "state_dir")]
        config: Option<PathBuf>,
        /// The state dir of `mosaic up` (default: $MOSAIC_STATE_DIR or the user state dir).
        #[arg(long, global = true)]
        state_dir: Option<PathBuf>,
        /// Print compact JSON instead of indented JSON.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        op: HostOp,
    },
    /// Check whether this host can run the supervisor; with --coordinator-config, whether
    /// that coordinator can start (its files, keys, registry, certificate names, database).
    Doctor {
        #[arg(long)]
        json: bool,
        #[arg(long)]
        coordinator_config: Option<PathBuf>,
        /// The cgroup root the supervisor would be configured with.
        #[arg(long)]
        cgroup_root: Option<PathBuf>,
    },
    /// Install missing system packages (tmux, PostgreSQL server) when root with apt.
    Setup,
    /// Make a coordinator's directory (CA, certificate, keys, secret, trust registry,
    /// config), or a standby's (README: Production).
    Init {
        #[command(subcommand)]
        op: crate::fleet::InitOp,
    },
    /// Enrol a host or an operator with the coordinator whose directory holds the CA.
    Enroll {
        #[command(subcommand)]
        op: crate::fleet::EnrollOp,
    },
    /// Ed25519 signing keys: print a seed file's public half, or make one.
    Keys {
        #[command(subcommand)]
        op: crate::fleet::KeysOp,
    },
    /// The trust registry in use; revoke a key or a principal.
    Trust {
        #[command(subcommand)]
        op: crate::fleet::TrustOp,
    },
    /// The coordinator's PostgreSQL role and database.
    Db {
        #[command(subcommand)]
        op: crate::fleet::DbOp,
    },
    /// A private CA and mutual-TLS certificates for coordinators, hosts and operators.
    Pki {
        #[command(subcommand)]
        op: PkiOp,
    },
    /// Inside a generation: fetch the contract, acknowledge the challenge. For operators:
    /// release a quarantined lane, or have its host recreate it.
    Lane {
        #[command(subcommand)]
        op: LaneOp,
    },
    /// What became of an operator request (its key: `--request-id`, or the `request_id` of
    /// its answer).
    Request {
        #[command(subcommand)]
        op: RequestOp,
    },
    /// Effect claims (spec §5.5): each protected effect a generation made through its host's
    /// broker — provider requests, egress tunnels, pushes — with its state, digests and
    /// token usage. Newest first.
    Effects {
        #[arg(long = "assignment")]
        assignment_id: Option<String>,
        #[arg(long)]
        limit: Option<i64>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// One effect claim.
    Effect {
        #[command(subcommand)]
        op: EffectOp,
    },
}

#[derive(Subcommand)]
pub(crate) enum EffectOp {
    /// Settle a claim whose outcome is unknown (its broker died with it): say whether it
    /// was applied at its sink, with the evidence that shows it (what the sink shows now:
    /// the remote's ref, the service's record). Until then its assignment neither resumes
    /// nor gets an outcome but QUARANTINED.
    Resolve {
        #[command(flatten)]
        r: crate::work_args::Resolution,
        #[command(flatten)]
        at: CoordinatorAt,
    },
}

#[derive(Subcommand)]
pub(crate) enum RequestOp {
    /// The request's operation, what it named, and its state: answered (with the answer and
    /// its subject now), refused (nothing changed), or unknown (repeat it with its key).
    Show {
        #[arg(value_name = "REQUEST_ID")]
        id: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
}

#[derive(Subcommand)]
pub(crate) enum PolicyOp {
    /// Publish the inactivity policy in FILE (TOML: policy_id, warn_after_ms,
    /// escalate_after_ms, replace_after_ms, replacements_before_reassign, max_attempts,
    /// exhaustion, evidence_kinds).
    Publish {
        file: PathBuf,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Show a published policy and its digest.
    Show {
        policy_id: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
}

#[derive(Subcommand)]
pub(crate) enum RosterOp {
    /// Publish the roster in FILE (TOML: `[[hosts]]` with host_id and capacity, each with
    /// `[[hosts.lanes]]`: lane, runtimes, labels, roles) as its next version.
    Publish {
        file: PathBuf,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Show the current roster; with --reservation, how that reservation was placed (the
    /// policy, its inputs and their digests).
    Show {
        #[arg(long)]
        reservation: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
}

#[derive(Subcommand)]
pub(crate) enum HarnessOp {
    /// Install pinned harnesses from npm (default: every installable registered runtime).
    Install {
        /// runtime@version, e.g. claude-code@2.1.332.
        runtimes: Vec<String>,
        /// Default: $MOSAIC_HARNESS_ROOT, else /var/lib/mosaic/harnesses.
        #[arg(long)]
        root: Option<PathBuf>,
        /// Registry entries to install from instead of the built-in ones.
        #[arg(long)]
        registry_dir: Option<PathBuf>,
    },
}

pub(crate) fn parse_runtime_path(s: &str) -> Result<(String, PathBuf), String> {
    let (rt, path) = s.split_once('=').ok_or_else(|| {
        "expected RUNTIME=PATH, e.g. claude-code=/etc/mosaic/claude-code.env".to_string()
    })?;
    if rt.is_empty() || path.is_empty() {
        return Err("expected RUNTIME=PATH".into());
    }
    Ok((rt.to_string(), PathBuf::from(path)))
}

pub(crate) fn parse_runtime_url(s: &str) -> Result<(String, String), String> {
    let (rt, url) = s.split_once('=').ok_or_else(|| {
        "expected RUNTIME=URL, e.g. claude-code=https://api.anthropic.com".to_string()
    })?;
    mosaic::supervisor::gateway::Upstream::parse(url).map_err(|e| e.to_string())?;
    if rt.is_empty() {
        return Err("expected RUNTIME=URL".into());
    }
    Ok((rt.to_string(), url.to_string()))
}

#[derive(Subcommand)]
pub(crate) enum LaneOp {
    /// Print this generation's contract (waits until it is injected).
    Contract,
    /// Wait for this generation's activation check (harnesses that fetch it here).
    Challenge,
    /// Acknowledge this generation's challenge; returns once the generation is active.
    /// Without --response: fetches the challenge and answers it.
    Ack {
        /// The answer to submit as is (it must carry mosaic-ack:<phrase>).
        #[arg(long)]
        response: Option<String>,
    },
    /// Forward one hook event of a real harness (its JSON on stdin) to the supervisor and
    /// print what the harness should get back. Installed hooks call this; not for humans.
    Hook {
        /// The harness family (e.g. claude-code).
        family: String,
        /// The event (session-start, stop, session-end, …).
        event: String,
    },
    /// Acknowledge this generation's handoff challenge (a handoff target only); returns
    /// once responsibility moved to it.
    HandoffAck,
    /// Report progress with objective evidence (the supervisor digests it; the same
    /// evidence never counts twice). Only an active generation may report.
    Progress {
        /// commit | file-set | test-result
        #[arg(long)]
        kind: String,
        /// The evidence file (file-set, test-result).
        #[arg(long, conflicts_with = "commit", required_unless_present = "commit")]
        evidence: Option<PathBuf>,
        /// The commit id (kind commit).
        #[arg(long)]
        commit: Option<String>,
        /// What this generation does next (one line).
        #[arg(long)]
        next_action: Option<String>,
    },
    /// Wait, settled, for the coordinator's next continuation (each is given once).
    Next,
    /// Report the result of a continuation, with its evidence.
    ContinuationResult {
        #[arg(long = "id")]
        continuation_id: String,
        #[arg(long)]
        evidence: PathBuf,
    },
    /// Report that this generation is blocked: a canonical code, the evidence, and the
    /// executable action that would unblock it.
    Blocked {
        #[arg(long)]
        code: String,
        #[arg(long)]
        evidence: PathBuf,
        #[arg(long)]
        next_action: String,
    },
    /// Checkpoint this generation's workspace now (its processes frozen while it is read):
    /// answered once taken, with whether the coordinator's store holds it yet.
    Checkpoint,
    /// Push the current commit of a repository in this generation's area to a repository
    /// the host declares (`[repositories.NAME]`), with the host's credentials: the
    /// coordinator admits the exact ref update first. Default ref: the assignment's own
    /// branch, `refs/heads/mosaic/<assignment>`. Never a force push or a delete.
    Push {
        #[arg(long)]
        repo: String,
        #[arg(long = "ref")]
        reference: Option<String>,
        /// The repository to push from (default: the working directory).
        #[arg(long)]
        from: Option<PathBuf>,
        /// The claim's idempotency key (default: one derived from the update): the same key
        /// again names the same update, and another update under it is refused.
        #[arg(long)]
        key: Option<String>,
    },
    /// Return a QUARANTINED lane to IDLE_CLEAN; refused unless every generation's cleanup
    /// was verified and nothing of the lane is still open.
    Release {
        #[arg(long = "lane")]
        lane_id: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Have the lane's host destroy and recreate the lane (a fresh incarnation): the way
    /// out of a host-side quarantine or a cleanup that was never verified.
    Recreate {
        #[arg(long = "lane")]
        lane_id: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    #[command(flatten)]
    Elastic(crate::lease_args::ElasticOp),
}

#[derive(Subcommand)]
pub(crate) enum PkiOp {
    /// Make a recovery identity (an age X25519 key pair) at --out (mode 0600, never
    /// overwritten) and print its public recipient, for the coordinator's
    /// `recovery_recipients`: harness artifacts are encrypted to it.
    RecoveryKey {
        #[arg(long)]
        out: PathBuf,
    },
    /// Create the CA (ca.pem, ca-key.pem) in DIR.
    Init {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        force: bool,
    },
    /// Issue a coordinator (server) certificate; NAME, localhost, 127.0.0.1 and every
    /// --dns and --ip go in its SANs.
    IssueCoordinator {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        name: String,
        /// A DNS name hosts dial it by (repeatable).
        #[arg(long = "dns")]
        dns: Vec<String>,
        /// An IP address they dial (repeatable).
        #[arg(long = "ip")]
        ips: Vec<std::net::IpAddr>,
        #[arg(long, default_value_t = 365)]
        days: i64,
        #[arg(long)]
        force: bool,
    },
    /// Issue a host (client) certificate; the host id goes in the SAN.
    IssueHost {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        host_id: String,
        #[arg(long, default_value_t = 365)]
        days: i64,
        #[arg(long)]
        force: bool,
    },
    /// Issue an operator (client) certificate.
    IssueOperator {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 365)]
        days: i64,
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum HostOp {
    /// Lanes, live generations and their identities.
    Status,
    /// Create a lane (or recreate a destroyed one with a fresh incarnation).
    LaneCreate {
        #[arg(long)]
        lane: String,
    },
    /// Stop the lane's generation and remove the lane (its coordinator retires it at once).
    LaneDestroy {
        #[arg(long)]
        lane: String,
    },
    /// Start a fresh generation (any previous one is stopped and verified gone first).
    Start {
        #[arg(long)]
        lane: String,
        #[arg(long)]
        runtime: String,
        /// Task directives for the harness.
        directives: Vec<String>,
    },
    /// Stop the lane's generation and print its termination receipt.
    Stop {
        #[arg(long)]
        lane: String,
    },
    /// Termination receipts not yet acknowledged (with --all, acknowledged ones too).
    Receipts {
        #[arg(long)]
        lane: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// Acknowledge a receipt by idempotency key (the consumer took it over).
    Ack { key: String },
    /// Take this host out of the fleet: destroy every lane (the coordinator retires each),
    /// then the supervisor exits and removes its cgroup root and sockets. Its state dir
    /// stays, with a marker that keeps the supervisor from starting on it again. Then
    /// disable its unit and revoke its keys (`mosaic trust revoke host:ID`).
    Decommission {
        /// Leave even if the coordinator cannot be told (it retires the lanes when it
        /// hears from this host, which may be never).
        #[arg(long)]
        force: bool,
    },
}

#[cfg(test)]
mod tests {
    /// Every subcommand's arguments are well formed (clap checks names, conflicts and
    /// requirements only when a command is built — which would otherwise be the first run
    /// of that subcommand).
    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }

    /// `--config` is accepted after a host subcommand too, and every host command names its
    /// lane with `--lane`.
    #[test]
    fn host_commands_take_config_anywhere_and_name_lanes_alike() {
        use clap::Parser;
        for args in [
            &["mosaic", "host", "status", "--config", "f.toml"][..],
            &["mosaic", "host", "--config", "f.toml", "status"],
            &[
                "mosaic",
                "host",
                "lane-destroy",
                "--lane",
                "l",
                "--config",
                "f.toml",
            ],
            &["mosaic", "host", "lane-create", "--lane", "l"],
            &["mosaic", "host", "stop", "--lane", "l"],
            &["mosaic", "host", "decommission", "--config", "f.toml"],
        ] {
            assert!(super::Cli::try_parse_from(args).is_ok(), "{args:?}");
        }
        assert!(super::Cli::try_parse_from(["mosaic", "host", "lane-destroy", "l"]).is_err());
        // --replace-task only with --resume; --task may be left out with --resume.
        assert!(super::Cli::try_parse_from([
            "mosaic",
            "assign",
            "--lane",
            "h:l",
            "--runtime",
            "fake@1.0.0",
            "--replace-task",
            "--task",
            "x"
        ])
        .is_err());
        assert!(super::Cli::try_parse_from([
            "mosaic",
            "assign",
            "--lane",
            "h:l",
            "--runtime",
            "fake@1.0.0",
            "--resume",
            "a-1"
        ])
        .is_ok());
    }
}

/// `mosaic up`'s options.
#[derive(clap::Args)]
pub(crate) struct UpArgs {
    #[arg(long)]
    pub(crate) state_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 2)]
    pub(crate) lanes: u32,
    /// Run this many supervisors, each a host of its own (certificate, keys, cgroup
    /// subtree, state), as separate processes against one coordinator. Host ids are
    /// `<hostname>-1` … `<hostname>-N`.
    #[arg(long, default_value_t = 1)]
    pub(crate) hosts: u32,
    /// Assign a task, show it reach RUNNING, SIGKILL its harness, show the receipt and
    /// the recovery; then stay up.
    #[arg(long)]
    pub(crate) demo: bool,
    /// Use this PostgreSQL instead of a private cluster in the state dir.
    #[arg(long)]
    pub(crate) database_url: Option<String>,
    /// Where real harnesses are installed (`mosaic harness install`); default
    /// $MOSAIC_HARNESS_ROOT, else /var/lib/mosaic/harnesses.
    #[arg(long)]
    pub(crate) harness_root: Option<PathBuf>,
    /// A runtime's credentials file, `RUNTIME=FILE` (mode 0600; repeatable), e.g.
    /// `claude-code=/etc/mosaic/claude-code.env`.
    #[arg(long = "credentials", value_parser = parse_runtime_path)]
    pub(crate) credentials: Vec<(String, PathBuf)>,
    /// Load runtime registry entries from this directory instead of the built-in ones.
    #[arg(long)]
    pub(crate) registry_dir: Option<PathBuf>,
    /// A runtime's config overlay, `RUNTIME=DIR` (repeatable): config files (provider,
    /// model selection) copied into each of its generations, e.g. `pi=/etc/mosaic/pi`.
    #[arg(long = "harness-config", value_parser = parse_runtime_path)]
    pub(crate) harness_config: Vec<(String, PathBuf)>,
    /// A runtime's model provider, `RUNTIME=URL` (repeatable), e.g.
    /// `claude-code=https://api.anthropic.com`: confined generations reach it only
    /// through the supervisor's gateway, which adds the credentials.
    #[arg(long = "provider", value_parser = parse_runtime_url)]
    pub(crate) provider: Vec<(String, String)>,
    /// A program (absolute path) run for every operator event (work blocked, waiting for
    /// input, attempts exhausted, a lane quarantined, a handoff offered or expired) with
    /// the event as JSON on its stdin.
    #[arg(long)]
    pub(crate) notify_command: Option<PathBuf>,
    /// A URL every operator event is POSTed to as JSON (http or https).
    #[arg(long)]
    pub(crate) notify_webhook: Option<String>,
    /// A lane (its name, e.g. `lane-2`) whose generations run outside Mosaic's
    /// confinement (`unconfined_lanes` in the supervisor config); repeatable. For harnesses
    /// that need what the confinement denies; their own sandbox, if any, stays on.
    #[arg(long = "unconfined-lane")]
    pub(crate) unconfined_lanes: Vec<String>,
}

impl UpArgs {
    pub(crate) fn into_options(self) -> mosaic::up::UpOptions {
        mosaic::up::UpOptions {
            state_dir: self.state_dir,
            lanes: self.lanes,
            hosts: self.hosts,
            demo: self.demo,
            database_url: self.database_url,
            harness_root: self.harness_root,
            credentials: self.credentials,
            registry_dir: self.registry_dir,
            harness_config: self.harness_config,
            providers: self.provider,
            notify_command: self.notify_command,
            notify_webhook: self.notify_webhook,
            unconfined_lanes: self.unconfined_lanes,
        }
    }
}
