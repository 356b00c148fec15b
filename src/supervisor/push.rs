//! The push executor (spec §5.5: "repository push"): a generation holds no repository
//! credentials and reaches no remote; its `mosaic lane push` hands the supervisor a git
//! bundle of its branch, and the supervisor pushes it with the host's credentials — only
//! after the coordinator admitted a claim binding the exact ref update (repository, ref,
//! old and new object ids).
//!
//! The bundle is *data*: the supervisor reads it from the generation's area (opened beneath
//! it, never through a link), fetches it into a mirror of its own (`<state_dir>/push/`,
//! its own config only: git never runs in the generation's repository or with its config),
//! checks the update is a fast-forward of what the remote has, and pushes with
//! `--force-with-lease` on the old id it claimed, so the remote changes only from exactly
//! that id to exactly the new one. Never a force, never a delete, only `refs/heads/`; the
//! assignment's own branch (`refs/heads/mosaic/<assignment>`) under `push:REPO`, any other
//! only where the scope names it (`push:REPO:REF`).
//!
//! **Never:** gives the generation a credential or the remote's URL, runs git in a
//! directory the generation controls, pushes without a fresh admission, or reports an
//! outcome it could not observe (an outcome it cannot tell stays unreported: the claim's
//! reconciliation owner settles it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::broker::{Admitted, BrokerSlot, Claim, Denied, EffectObservation, Phase};
use crate::protocol::effects::{self, Outcome, Target};

/// A repository this host may push to, as its config declares it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Repository {
    /// Where it is pushed: any URL git understands (https, ssh, a path).
    pub url: String,
    /// A 0600 file of `KEY=VALUE` lines given to `git push` alone (e.g. `GIT_SSH_COMMAND`,
    /// or `GIT_CONFIG_COUNT`/`GIT_CONFIG_KEY_0`/`GIT_CONFIG_VALUE_0` for an auth header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<PathBuf>,
}

/// The largest bundle taken.
pub const MAX_BUNDLE_BYTES: u64 = 512 * 1024 * 1024;
/// How long one git command may take.
const GIT_TIMEOUT: Duration = Duration::from_secs(300);
/// The id of a ref that does not exist.
pub(crate) const ZERO: &str = "0000000000000000000000000000000000000000";

/// What a push's executor needs of its generation.
#[derive(Debug)]
pub struct PushCtx {
    pub lane_id: String,
    pub generation: u64,
    /// The generation's area: a bundle is read only from beneath it.
    pub area: PathBuf,
    pub repos: BTreeMap<String, Repository>,
    /// `<state_dir>/push`: the supervisor's mirrors.
    pub mirrors: PathBuf,
    pub broker: BrokerSlot,
}

/// A push as the harness asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushRequest {
    pub repo: String,
    /// Default: the assignment's own branch.
    #[serde(default)]
    pub reference: Option<String>,
    /// The bundle's path, beneath the generation's area.
    pub bundle: PathBuf,
    /// The commit the bundle's one ref names (what the harness's repository had).
    pub new: String,
    /// The claim's idempotency key; default: one derived from the update itself.
    #[serde(default)]
    pub key: Option<String>,
}

/// What came of a push, for the harness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushAnswer {
    pub effect_id: String,
    pub repo: String,
    pub reference: String,
    pub old: String,
    pub new: String,
    /// `pushed`; `up-to-date` (the remote already had it: nothing claimed or pushed);
    /// `rejected` (the remote refused it: nothing changed); `settled-before` (the same
    /// update was claimed before: not pushed again; `claim_state` says what became of it);
    /// `unknown` (it could not be told whether the remote took it).
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_state: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Denied(#[from] Denied),
    #[error("git: {0}")]
    Git(String),
    /// The remote already has the commit at the ref (not an error for the harness).
    #[error("the remote's ref is already at that commit")]
    UpToDate,
}

impl PushError {
    pub fn category(&self) -> &str {
        match self {
            Self::Refused(_) => "push-refused",
            Self::Denied(d) => d.category(),
            Self::Git(_) => "git",
            Self::UpToDate => "up-to-date",
        }
    }
}

fn refused(m: impl Into<String>) -> PushError {
    PushError::Refused(m.into())
}

/// Runs one push for generation `ctx` of assignment `assignment_id`. An error never names
/// the remote's URL (git's messages do: it is cut out).
pub async fn push(
    ctx: &PushCtx,
    assignment_id: &str,
    r: PushRequest,
) -> Result<PushAnswer, PushError> {
    let url = ctx.repos.get(&r.repo).map(|x| x.url.clone());
    push_inner(ctx, assignment_id, r)
        .await
        .map_err(|e| match (e, url) {
            (PushError::Git(m), Some(u)) => PushError::Git(m.replace(&u, "<remote>")),
            (PushError::Refused(m), Some(u)) => PushError::Refused(m.replace(&u, "<remote>")),
            (e, _) => e,
        })
}

async fn push_inner(
    ctx: &PushCtx,
    assignment_id: &str,
    r: PushRequest,
) -> Result<PushAnswer, PushError> {
    // Everything checked before anything is claimed.
    let repo = ctx.repos.get(&r.repo).ok_or_else(|| {
        refused(format!(
            "no repository {:?} is configured on this host (push is an executor only for configured repositories)",
            r.repo
        ))
    })?;
    let reference = r
        .reference
        .clone()
        .unwrap_or_else(|| effects::assignment_branch(assignment_id));
    let target = Target::parse(Executor::Push, &format!("push:{}:{reference}", r.repo))
        .map_err(|e| refused(e.to_string()))?;
    if !is_oid(&r.new) {
        return Err(refused("the new commit is not a full object id"));
    }
    if let Some(k) = &r.key {
        if !effects::key_ok(k) {
            return Err(refused(
                "a key is letters, digits and . _ : - / (at most 200)",
            ));
        }
    }
    let broker = match ctx.broker.ready(super::coordinated::ADMIT_TIMEOUT).await {
        Some(b) if b.phase(&ctx.lane_id, ctx.generation) == Phase::Active => b,
        Some(b) if b.phase(&ctx.lane_id, ctx.generation) == Phase::Staging => {
            return Err(Denied::NotActive.into())
        }
        _ => return Err(Denied::NoAuthority.into()),
    };
    let mirror = ensure_mirror(&ctx.mirrors, &r.repo).await?;
    let bundle = copy_bundle(&ctx.area, &r.bundle, &ctx.mirrors)?;
    let result = async {
        let env = repo_env(&r.repo, repo)?;
        let old = remote_ref(&mirror, &repo.url, &reference, &env).await?;
        if old == r.new {
            return Err(PushError::UpToDate);
        }
        // The bundle's objects into the mirror, under a name of its own.
        let incoming = format!("refs/mosaic/incoming/{}", uuid::Uuid::new_v4().simple());
        git(&mirror, &["fetch", "--no-tags", "--quiet", &path_str(&bundle)?, &format!("+{}:{incoming}", bundle_ref(&bundle)?)], &[])
            .await?;
        let got = git(&mirror, &["rev-parse", "--verify", &format!("{incoming}^{{commit}}")], &[]).await?;
        let _ = git(&mirror, &["update-ref", "-d", &incoming], &[]).await;
        if got.trim() != r.new {
            return Err(refused("the bundle's ref is not the commit named"));
        }
        if old != ZERO {
            // The old commit, to check the update only moves forward.
            git(&mirror, &["fetch", "--no-tags", "--quiet", &repo.url, &old], &env).await?;
            if git(&mirror, &["merge-base", "--is-ancestor", &old, &r.new], &[]).await.is_err() {
                return Err(refused(format!(
                    "{reference} is at {old} on the remote, which {} does not descend from: no force push",
                    r.new
                )));
            }
        }
        Ok((old, env))
    }
    .await;
    let _ = std::fs::remove_file(&bundle);
    let (old, env) = match result {
        // Already there: nothing is pushed, so nothing is claimed.
        Err(PushError::UpToDate) => {
            return Ok(PushAnswer {
                effect_id: String::new(),
                repo: r.repo.clone(),
                reference: reference.clone(),
                old: r.new.clone(),
                new: r.new.clone(),
                state: "up-to-date".into(),
                claim_state: None,
            })
        }
        other => other?,
    };
    // The default key names the update by what it puts where (repository, ref, commit), so
    // a retry of it is the same claim: one whose outcome was never seen is not pushed
    // again (no blind retry); one that was rejected answers so.
    let key = r.key.clone().unwrap_or_else(|| {
        let h = crate::util::sha256_hex(
            "mosaic/push-key/v1",
            &[r.repo.as_bytes(), reference.as_bytes(), r.new.as_bytes()],
        );
        format!("push-{}", &h[..32])
    });
    let claim = Claim {
        operation_digest: effects::operation_digest(
            &target,
            &[
                r.repo.as_bytes(),
                reference.as_bytes(),
                old.as_bytes(),
                r.new.as_bytes(),
            ],
        ),
        target,
        idempotency_key: key,
    };
    let answer = |effect_id: &str, state: &str, claim_state: Option<String>| PushAnswer {
        effect_id: effect_id.to_string(),
        repo: r.repo.clone(),
        reference: reference.clone(),
        old: old.clone(),
        new: r.new.clone(),
        state: state.to_string(),
        claim_state,
    };
    let effect_id = match broker.admit(&ctx.lane_id, ctx.generation, claim).await? {
        Admitted::Fresh { effect_id } => effect_id,
        Admitted::Settled {
            effect_id,
            claim_state,
            ..
        } => return Ok(answer(&effect_id, "settled-before", Some(claim_state))),
    };
    super::broker::hold("effect:pre-dispatch").await;
    if !broker.may_dispatch(&ctx.lane_id, ctx.generation) {
        broker.observed(
            &ctx.lane_id,
            ctx.generation,
            EffectObservation::new(&effect_id, Outcome::NotDispatched, &[b"fenced"], None),
        );
        return Err(Denied::Fenced.into());
    }
    let pushed = git(
        &mirror,
        &[
            "push",
            "--porcelain",
            "--quiet",
            &format!(
                "--force-with-lease={reference}:{}",
                if old == ZERO { "" } else { &old }
            ),
            &repo.url,
            &format!("{}:{reference}", r.new),
        ],
        &env,
    )
    .await;
    // What the remote has now says what happened, whatever git answered.
    let now = remote_ref(&mirror, &repo.url, &reference, &env).await;
    let (outcome, state) = match (&pushed, now.as_deref()) {
        (_, Ok(n)) if n == r.new => (Some(Outcome::Completed), "pushed"),
        (Err(_), Ok(n)) if n == old => (Some(Outcome::Failed), "rejected"),
        (Err(_), Ok(_)) => (Some(Outcome::Failed), "rejected"),
        (Ok(_), Ok(_)) => (None, "unknown"),
        (_, Err(_)) => (None, "unknown"),
    };
    match outcome {
        Some(o) => broker.observed(
            &ctx.lane_id,
            ctx.generation,
            EffectObservation::new(&effect_id, o, &[old.as_bytes(), r.new.as_bytes()], None),
        ),
        None => tracing::error!(lane_id = %ctx.lane_id, generation = ctx.generation, effect_id,
            "a push's outcome cannot be told (the remote does not answer): its claim stays open for its reconciliation owner"),
    }
    Ok(answer(&effect_id, state, None))
}

use crate::protocol::effects::Executor;

/// The environment `git` gets for `repo` (its env file's lines, if it names one).
pub(crate) fn repo_env(name: &str, repo: &Repository) -> Result<Vec<(String, String)>, PushError> {
    Ok(match &repo.env {
        None => Vec::new(),
        Some(p) => crate::adapter::credentials::load(&format!("repository {name}"), p)
            .map_err(|e| refused(format!("the repository's env file: {e}")))?
            .into_iter()
            .map(|(k, v)| (k, v.0.clone()))
            .collect(),
    })
}

pub(crate) fn is_oid(s: &str) -> bool {
    matches!(s.len(), 40 | 64)
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

pub(crate) fn path_str(p: &Path) -> Result<String, PushError> {
    p.to_str()
        .map(String::from)
        .ok_or_else(|| refused("a path that is not UTF-8"))
}

/// The supervisor's bare mirror for `repo`, made on first use.
pub(crate) async fn ensure_mirror(mirrors: &Path, repo: &str) -> Result<PathBuf, PushError> {
    let m = mirrors.join(format!("{repo}.git"));
    if !m.join("HEAD").exists() {
        crate::util::durable::ensure_dir(mirrors, 0o700)
            .map_err(|e| PushError::Git(format!("{}: {e}", mirrors.display())))?;
        git(mirrors, &["init", "--bare", "--quiet", &path_str(&m)?], &[]).await?;
    }
    Ok(m)
}

/// Copies the bundle from beneath `area` (no link followed anywhere on the way, at most
/// `MAX_BUNDLE_BYTES`) into the mirrors' directory; the copy's path.
fn copy_bundle(area: &Path, bundle: &Path, mirrors: &Path) -> Result<PathBuf, PushError> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let rel = bundle
        .strip_prefix(area)
        .map_err(|_| refused("the bundle must be in the generation's own area"))?;
    let dir = rustix::fs::open(
        area,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| PushError::Git(format!("the generation's area: {e}")))?;
    let fd = rustix::fs::openat2(
        &dir,
        rel,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| {
        refused(format!(
            "the bundle cannot be opened beneath the generation's area ({e})"
        ))
    })?;
    let mut f = std::fs::File::from(fd);
    let meta = f.metadata().map_err(|e| PushError::Git(e.to_string()))?;
    if !meta.is_file() || meta.len() > MAX_BUNDLE_BYTES {
        return Err(refused(format!(
            "the bundle must be a regular file of at most {MAX_BUNDLE_BYTES} bytes"
        )));
    }
    crate::util::durable::ensure_dir(mirrors, 0o700)
        .map_err(|e| PushError::Git(format!("{}: {e}", mirrors.display())))?;
    let copy = mirrors.join(format!("incoming-{}.bundle", uuid::Uuid::new_v4().simple()));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&copy)
        .map_err(|e| PushError::Git(format!("{}: {e}", copy.display())))?;
    let copied = std::io::copy(&mut std::io::Read::take(&mut f, MAX_BUNDLE_BYTES), &mut out);
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&copy);
        return Err(PushError::Git(format!("copying the bundle: {e}")));
    }
    Ok(copy)
}

/// The one ref a bundle carries (its header: `<oid> <refname>` lines after the signature).
fn bundle_ref(bundle: &Path) -> Result<String, PushError> {
    use std::io::BufRead;
    let f = std::fs::File::open(bundle).map_err(|e| PushError::Git(e.to_string()))?;
    let mut lines = std::io::BufReader::new(f).lines();
    match lines.next() {
        Some(Ok(sig))
            if sig.starts_with("# v2 git bundle") || sig.starts_with("# v3 git bundle") => {}
        _ => return Err(refused("the file is not a git bundle")),
    }
    let mut refs = Vec::new();
    for line in lines.take(1000) {
        let Ok(line) = line else { break };
        if line.is_empty() {
            break;
        }
        if line.starts_with('-') || line.starts_with('@') {
            continue; // prerequisites, capabilities
        }
        if let Some((oid, name)) = line.split_once(' ') {
            if is_oid(oid) && (name.starts_with("refs/") || name == "HEAD") {
                refs.push(name.to_string());
            }
        }
    }
    match refs.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(refused("the bundle carries no ref")),
        _ => Err(refused("the bundle must carry exactly one ref")),
    }
}

/// The id `reference` has on the remote (`ZERO` when it does not exist).
pub(crate) async fn remote_ref(
    mirror: &Path,
    url: &str,
    reference: &str,
    env: &[(String, String)],
) -> Result<String, PushError> {
    let out = git(mirror, &["ls-remote", "--", url, reference], env).await?;
    Ok(out
        .lines()
        .find_map(|l| {
            let (oid, name) = l.split_once('\t')?;
            (name == reference).then(|| oid.to_string())
        })
        .unwrap_or_else(|| ZERO.to_string()))
}

/// Runs git in `dir` (the supervisor's own: never the generation's) with only the
/// supervisor's config (no system or user file) and `env`; its stdout, or its stderr's
/// first line as the error. Bounded by `GIT_TIMEOUT`.
pub(crate) async fn git(
    dir: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> Result<String, PushError> {
    let out = git_raw(dir, args, env).await?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(PushError::Git(format!(
        "`git {}` failed: {}",
        args[0],
        err.lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(300)
            .collect::<String>()
    )))
}

/// `git` as [`git`] runs it, whatever its exit status (a command whose failure says
/// something, like `merge-tree`'s conflicts).
pub(crate) async fn git_raw(
    dir: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> Result<std::process::Output, PushError> {
    let mut c = tokio::process::Command::new("git");
    c.current_dir(dir)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(GIT_TIMEOUT, c.output())
        .await
        .map_err(|_| PushError::Git(format!("`git {}` did not finish in time", args[0])))?
        .map_err(|e| PushError::Git(format!("running git: {e} (is git installed?)")))
}

/// The per-generation context, shared with its lane socket.
pub type Shared = Arc<PushCtx>;
