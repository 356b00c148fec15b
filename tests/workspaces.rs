//! Workspaces: an assignment that names a repository works in a clone of it on the branch
//! `mosaic/<assignment_id>`, kept on its host for the assignment's next generations, so
//! what an agent wrote survives its generation's SIGKILL and is there for its resume
//! (real git, tmux, cgroups, PostgreSQL, confined generations).

mod common;
mod pg;
mod world;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{cgroup_at, wait_until};
use mosaic::coordinator::service::OperatorRequest;
use serde_json::Value;
use world::{Spec, World};

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(["-c", "safe.directory=*", "-C"])
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("git runs (the suite needs git)");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository with two commits on `main` and a branch `feature`.
struct Repo(PathBuf);

impl Repo {
    fn new() -> Self {
        let dir =
            std::env::temp_dir().join(format!("mosaic-repo-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        git(&dir, &["init", "-q", "-b", "main"]);
        git(&dir, &["config", "user.name", "t"]);
        git(&dir, &["config", "user.email", "t@example.invalid"]);
        std::fs::write(dir.join("a.txt"), "one\n").unwrap();
        std::fs::write(dir.join(".gitignore"), "*.log\n").unwrap();
        git(&dir, &["add", "."]);
        git(&dir, &["commit", "-q", "-m", "first"]);
        git(&dir, &["branch", "feature"]);
        std::fs::write(dir.join("b.txt"), "two\n").unwrap();
        git(&dir, &["add", "."]);
        git(&dir, &["commit", "-q", "-m", "second"]);
        Repo(dir)
    }
}

impl Drop for Repo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A repository and a world of `lanes` lanes; its `lane-1` and that lane's host.
fn world(lanes: usize, tag: &'static str) -> (Repo, World, String, String) {
    let repo = Repo::new();
    let w = World::started(Spec {
        lanes,
        tag,
        ..Spec::default()
    });
    let lane = w.lane_of(0, "lane-1");
    let host = lane.split_once(':').unwrap().0.to_string();
    (repo, w, lane, host)
}

fn add_repo(w: &World, name: &str, path: &Path, host: &str) -> Value {
    w.op(&OperatorRequest::RepoAdd {
        name: name.into(),
        path: Some(path.display().to_string()),
        url: None,
        host_id: Some(host.into()),
        copy: vec![],
        setup: vec![],
        setup_timeout_s: None,
    })
    .unwrap_or_else(|e| panic!("repo add: {e:?}"))
}

fn assign_in(
    w: &World,
    lane: &str,
    task: &str,
    repo: Option<&str>,
    base: Option<&str>,
    resume: Option<&str>,
) -> Result<Value, mosaic::coordinator::service::OpError> {
    let mut r = world::assign_request(lane, task, resume, true);
    if let OperatorRequest::Assign {
        repo: rp,
        base: b,
        replace_task,
        ..
    } = &mut r
    {
        *rp = repo.map(String::from);
        *b = base.map(String::from);
        // A resume here runs the next step of the test's script: another task on purpose.
        *replace_task = resume.is_some();
    }
    w.op(&r)
}

/// `attack WHAT allowed|denied: …` lines of `file`, once `n` are there.
fn attempts(file: &Path, n: usize) -> Vec<(String, bool)> {
    wait_until("the harness's attempts", || {
        let text = std::fs::read_to_string(file).ok()?;
        let got: Vec<(String, bool)> = text
            .lines()
            .filter_map(|l| l.strip_prefix("attack "))
            .filter_map(|l| l.split_once(' '))
            .map(|(what, rest)| (what.to_string(), rest == "allowed"))
            .collect();
        (got.len() >= n).then_some(got)
    })
}

fn lifecycle(w: &World, asg: &str) -> Option<String> {
    w.status()["assignments"]
        .as_array()?
        .iter()
        .find(|a| a["assignment_id"] == asg)
        .and_then(|a| a["state"].as_str().map(String::from))
}

/// The whole path: a declared repository, an assignment working in its clone on its own
/// branch, the work SIGKILLed with uncommitted and untracked changes, and the resumed
/// generation finding exactly those files in the same workspace.
#[test]
fn work_in_a_repository_survives_its_generation() {
    let (repo, w, lane, host) = world(2, "workspaces");
    let added = add_repo(&w, "demo", &repo.0, &host);
    assert_eq!(added["added"], true, "{added}");
    // The same declaration again is a no-op; another source under the name is refused.
    assert_eq!(add_repo(&w, "demo", &repo.0, &host)["added"], false);
    let other = w.op(&OperatorRequest::RepoAdd {
        name: "demo".into(),
        path: Some("/elsewhere".into()),
        url: None,
        host_id: Some(host.clone()),
        copy: vec![],
        setup: vec![],
        setup_timeout_s: None,
    });
    assert!(format!("{other:?}").contains("conflict"), "{other:?}");

    let inc = w.incarnation_of(0, "lane-1");
    let work1 = w.area(0, &inc, 1).join("work");
    let task = format!(
        "attack=write:{0}/a.txt attack=write:{0}/new.txt attack=write:{0}/scratch.log hang",
        work1.display()
    );
    let a = assign_in(&w, &lane, &task, Some("demo"), Some("feature"), None).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let done = attempts(&w.area(0, &inc, 1).join("home/attacks"), 3);
    assert!(done.iter().all(|(_, ok)| *ok), "{done:?}");

    // On the host: the assignment's clone, on its own branch from `feature`, the lane's.
    let ws = w.state_dir(0).join("workspaces").join(&asg);
    assert_eq!(
        git(&ws, &["rev-parse", "--abbrev-ref", "HEAD"]),
        format!("mosaic/{asg}")
    );
    assert_eq!(
        git(&ws, &["rev-parse", "HEAD"]),
        git(&repo.0, &["rev-parse", "feature"])
    );
    assert!(!ws.join("b.txt").exists(), "the base is feature, not main");
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata(ws.join("new.txt")).unwrap().uid();
    assert_ne!(uid, 0, "the workspace is the lane's, not root's");
    assert_eq!(std::fs::metadata(&ws).unwrap().uid(), uid);
    let status = git(&ws, &["status", "--porcelain"]);
    let lines: Vec<&str> = status.lines().map(str::trim).collect();
    assert!(
        lines.contains(&"M a.txt") && lines.contains(&"?? new.txt"),
        "{status}"
    );
    assert!(
        !status.contains("scratch.log"),
        "ignored files stay ignored: {status}"
    );
    // The source repository is untouched: the work lives in the clone.
    assert!(git(&repo.0, &["status", "--porcelain"]).is_empty());
    assert!(!git(&repo.0, &["branch", "--list", "mosaic/*"]).contains("mosaic/"));

    // Another lane's generation reaches none of it, by its host path.
    let inc2 = w.incarnation_of(0, "lane-2");
    let spy = format!(
        "attack=read:{0} attack=read:{0}/new.txt attack=write:{0}/planted.txt hang",
        ws.display()
    );
    let s = assign_in(&w, &w.lane_of(0, "lane-2"), &spy, None, None, None).unwrap();
    let denied = attempts(&w.area(0, &inc2, 1).join("home/attacks"), 3);
    assert!(
        denied.iter().all(|(_, ok)| !*ok),
        "another lane reached the workspace: {denied:?}"
    );
    assert!(!ws.join("planted.txt").exists());
    let out = stop(&w, s["assignment_id"].as_str().unwrap());
    assert_eq!(out["state"], "CANCELLED", "{out}");

    // SIGKILL: the work goes to recovery; the workspace stays.
    kill_into_recovery(&w, &a, &asg);
    // Its end was checkpointed, from the receipt path: a synthetic commit of every file
    // not ignored, in the host's own checkpoint repository, recorded with the receipt.
    let rows = checkpoints(&w, &asg, 1);
    let ck = &rows[0];
    assert_eq!(ck["generation"], 1, "{ck}");
    let store = w.state_dir(0).join("checkpoints/demo.git");
    let commit = ck["commit_id"].as_str().unwrap();
    assert_eq!(
        git_dir(
            &store,
            &[
                "rev-parse",
                &format!("refs/mosaic/checkpoints/{asg}/{inc}/1")
            ]
        ),
        commit
    );
    assert_eq!(
        git_dir(&store, &["rev-parse", &format!("{commit}^{{tree}}")]),
        ck["tree_id"]
    );
    assert_eq!(
        git_dir(&store, &["show", &format!("{commit}:a.txt")]),
        "one\nattack"
    );
    let names = git_dir(&store, &["ls-tree", "-r", "--name-only", commit]);
    let names: Vec<&str> = names.lines().collect();
    assert_eq!(
        names,
        [".gitignore", "a.txt", "new.txt"],
        "ignored files and .git stay out"
    );
    let receipt_digest: String = tokio_block(async {
        w.sql()
            .await
            .query_one(
                "SELECT body->>'checkpoint_digest' FROM termination_receipts \
                 WHERE lane_incarnation_id = $1 AND generation = 1",
                &[&inc],
            )
            .await
            .unwrap()
            .get(0)
    });
    assert_eq!(
        ck["checkpoint_digest"].as_str(),
        Some(receipt_digest.as_str())
    );
    // The agent's repository was not touched by the capture: no index, no ref of it.
    assert_eq!(
        git(&ws, &["status", "--porcelain"]),
        status,
        "the checkpoint changed the agent's repository"
    );
    let work2 = w.area(0, &inc, 2).join("work");
    let task2 = format!(
        "attack=read:{0}/new.txt attack=read:{0}/scratch.log attack=write:{0}/after.txt hang",
        work2.display()
    );
    let b = assign_in(&w, &lane, &task2, None, None, Some(&asg)).unwrap();
    assert_eq!(b["generation"], 2, "{b}");
    // Not handed off to a lane of its own host: two generations would share its workspace.
    let refused = w.op(&OperatorRequest::Handoff {
        assignment_id: asg.clone(),
        lane_id: w.lane_of(0, "lane-2"),
        task: Some("hang".into()),
        within_ms: None,
        request_id: None,
    });
    assert!(
        format!("{refused:?}").contains("only to a lane of another host"),
        "{refused:?}"
    );
    let seen = attempts(&w.area(0, &inc, 2).join("home/attacks"), 3);
    assert!(
        seen.iter().all(|(_, ok)| *ok),
        "the resumed generation: {seen:?}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "one\nattack\n"
    );
    assert!(ws.join("after.txt").exists() && ws.join("new.txt").exists());
    let out = stop(&w, asg.clone());
    assert_eq!(out["state"], "CANCELLED", "{out}");
    let rows = checkpoints(&w, &asg, 2);
    let last = rows[1]["commit_id"].as_str().unwrap();
    assert!(git_dir(&store, &["ls-tree", "-r", "--name-only", last]).contains("after.txt"));
}

/// Makes `ws` impossible to checkpoint: its `.gitignore` a FIFO (git would wait on it
/// forever; the capture refuses it).
fn plant_fifo_gitignore(ws: &Path) {
    std::fs::remove_file(ws.join(".gitignore")).unwrap();
    nix::unistd::mkfifo(
        &ws.join(".gitignore"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
}

/// A waited stop of `asg`.
fn stop(w: &World, asg: impl Into<String>) -> Value {
    w.op(&OperatorRequest::Stop {
        assignment_id: asg.into(),
        outcome: None,
        evidence_digest: None,
        wait: true,
        request_id: None,
    })
    .unwrap()
}

fn git_dir(store: &Path, args: &[&str]) -> String {
    let mut all = vec!["--git-dir", store.to_str().unwrap()];
    all.extend_from_slice(args);
    git(Path::new("/"), &all)
}

fn tokio_block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// The recorded checkpoints of `asg`, once there are `n`.
fn checkpoints(w: &World, asg: &str, n: usize) -> Vec<Value> {
    wait_until("the checkpoints recorded", || {
        let v = w
            .op(&OperatorRequest::Checkpoints {
                assignment_id: Some(asg.into()),
                checkpoint_digest: None,
            })
            .ok()?;
        let rows = v.as_array()?.clone();
        (rows.len() >= n).then_some(rows)
    })
}

/// An assign naming no declared repository, a repository on another host, or a base git
/// could read as an option or a range is refused before anything is reserved.
#[tokio::test(flavor = "multi_thread")]
async fn a_bad_workspace_request_reserves_nothing() {
    let (repo, w, lane, host) = world(1, "workspaces-bad");
    tokio::task::block_in_place(|| {
        add_repo(&w, "demo", &repo.0, &host);
        add_repo(&w, "far", &repo.0, "some-other-host");
    });
    let before = w.count("SELECT count(*) FROM reservations").await;
    for (repo, base, why) in [
        (Some("nope"), None, "not-found"),
        (Some("far"), None, "bad-input"),
        (Some("demo"), Some("a..b"), "bad-input"),
        (Some("demo"), Some("--upload-pack=x"), "bad-input"),
        (Some("../x"), None, "bad-input"),
        (None, Some("main"), "bad-input"),
    ] {
        let e = tokio::task::block_in_place(|| assign_in(&w, &lane, "hang", repo, base, None))
            .expect_err("refused");
        assert_eq!(e.category.as_str(), why, "{repo:?} {base:?}: {e:?}");
    }
    assert_eq!(w.count("SELECT count(*) FROM reservations").await, before);
    assert_eq!(w.count("SELECT count(*) FROM assignments").await, 0);
}

/// A generation of work in a repository whose checkpoint cannot be taken (here its
/// workspace holds a FIFO named `.gitignore`, which git would wait on forever) quarantines
/// its lane, saying why; nothing is recorded as a checkpoint. The operator's release goes on without one (recorded on the
/// generation), and only then does the lane's next chain get past its fence.
#[test]
fn a_missing_checkpoint_quarantines_until_the_operator_releases() {
    let (repo, w, lane, host) = world(1, "workspaces-nock");
    add_repo(&w, "demo", &repo.0, &host);
    let a = assign_in(&w, &lane, "hang", Some("demo"), None, None).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let ws = w.state_dir(0).join("workspaces").join(&asg);
    plant_fifo_gitignore(&ws);
    let out = stop(&w, asg.clone());
    assert_eq!(out["state"], "CANCELLED", "{out}");
    let reason = wait_until("the lane quarantined", || {
        let lanes = w.op(&OperatorRequest::Lanes).ok()?;
        let l = lanes
            .as_array()?
            .iter()
            .find(|l| l["lane_id"] == lane.as_str())?
            .clone();
        (l["state"] == "QUARANTINED")
            .then(|| l["quarantine_reason"].as_str().unwrap_or("").to_string())
    });
    assert!(reason.contains("without a checkpoint"), "{reason}");
    let detail: String = tokio_block(async {
        w.sql()
            .await
            .query_one(
                "SELECT body->>'detail' FROM termination_receipts WHERE assignment_id = $1",
                &[&asg],
            )
            .await
            .unwrap()
            .get(0)
    });
    assert!(
        detail.contains(".gitignore is not a regular file"),
        "{detail}"
    );
    let none = w
        .op(&OperatorRequest::Checkpoints {
            assignment_id: Some(asg.clone()),
            checkpoint_digest: None,
        })
        .unwrap();
    assert_eq!(none.as_array().map(Vec::len), Some(0), "{none}");
    // The debt is on the generation's row, and nothing but a checkpoint or the waiver
    // clears it: the database refuses anyone else.
    let owed = "SELECT count(*) FROM generations WHERE checkpoint_owed";
    assert_eq!(tokio_block(async { w.count(owed).await }), 1);
    let refused = |sql: &str| {
        let e = tokio_block(async { w.sql().await.execute(sql, &[]).await.expect_err(sql) });
        assert_eq!(e.code().map(|c| c.code()), Some("MS003"), "{sql}: {e:?}");
    };
    refused("UPDATE generations SET checkpoint_owed = false");
    // Nor can another end receipt replace the one that decided it.
    refused("UPDATE generations SET end_receipt = 'tr-other'");
    // The migration's backfill, over the rows this lane left, with the flag cleared behind
    // the triggers' back (in a transaction rolled back): it finds the debt; a harness
    // artifact's deletion record changes nothing; a deleted end checkpoint's means paid.
    let backfill = |purpose: Option<&str>| -> i64 {
        tokio_block(async {
            let c = w.sql().await;
            c.batch_execute(
                "BEGIN; SET LOCAL session_replication_role = replica; \
                 UPDATE generations SET checkpoint_owed = false",
            )
            .await
            .unwrap();
            if let Some(purpose) = purpose {
                c.execute(
                    "INSERT INTO checkpoint_deletions (deletion_id, checkpoint_digest, assignment_id, \
                       lane_incarnation_id, generation, purpose, retention_policy_digest, reason, scope, \
                       objects_deleted, receipt_digest) \
                     SELECT 'cd-' || md5(random()::text), 'sha256:' || repeat('a', 64), $1, \
                       lane_incarnation_id, generation, $2, 'sha256:' || repeat('b', 64), 'operator', \
                       'coordinator-store', '{}', 'sha256:' || repeat('c', 64) FROM generations",
                    &[&asg, &purpose],
                )
                .await
                .unwrap();
            }
            let n: i64 = c
                .query_one("SELECT mosaic_backfill_checkpoint_debts()", &[])
                .await
                .unwrap()
                .get(0);
            c.batch_execute("ROLLBACK").await.unwrap();
            n
        })
    };
    assert_eq!(backfill(None), 1, "the debt the lane's rows show");
    assert_eq!(
        backfill(Some("operator-recovery")),
        1,
        "an artifact's deletion"
    );
    assert_eq!(
        backfill(Some("same-assignment-recovery")),
        0,
        "its checkpoint's deletion"
    );
    assert_eq!(tokio_block(async { w.count(owed).await }), 1);
    w.op(&OperatorRequest::LaneRelease {
        lane_id: lane.clone(),
        request_id: None,
    })
    .unwrap();
    let waived: i64 = tokio_block(async {
        w.sql()
            .await
            .query_one(
                "SELECT count(*) FROM generations WHERE checkpoint_waived_at IS NOT NULL",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    });
    assert_eq!(waived, 1);
    assert_eq!(tokio_block(async { w.count(owed).await }), 0);
    let b = assign_in(&w, &lane, "hang", None, None, None).unwrap();
    assert_eq!(b["state"], "RUNNING", "{b}");
    let out = stop(&w, b["assignment_id"].as_str().unwrap());
    assert_eq!(out["state"], "CANCELLED", "{out}");
}

/// A repository declared on host 0 of a world of two hosts with one lane each (the
/// coordinator's config extended by `coordinator_extra`); both lanes.
fn two_hosts(tag: &'static str, coordinator_extra: String) -> (Repo, World, String, String) {
    let repo = Repo::new();
    let w = World::started(Spec {
        hosts: 2,
        supervisors: 2,
        lanes: 1,
        tag,
        coordinator_extra,
        ..Spec::default()
    });
    let (lane0, lane1) = (w.lane_of(0, "lane-1"), w.lane_of(1, "lane-1"));
    add_repo(&w, "demo", &repo.0, lane0.split_once(':').unwrap().0);
    (repo, w, lane0, lane1)
}

/// SIGKILLs the generation `a` started, and waits for its work in recovery.
fn kill_into_recovery(w: &World, a: &Value, asg: &str) {
    let cg = cgroup_at(a["process_identity"]["cgroup_path"].as_str().unwrap());
    std::fs::write(cg.join("cgroup.kill"), "1").unwrap();
    wait_until("the work in recovery", || {
        (lifecycle(w, asg)? == "RECOVERY").then_some(())
    });
}

/// Every file of `ws` but its `.git`, with its bytes and mode (links as their targets).
fn files_of(ws: &Path) -> std::collections::BTreeMap<String, (Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![ws.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if p == ws.join(".git") {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(ws).unwrap().display().to_string();
            if m.is_dir() {
                stack.push(p);
            } else if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, (t.display().to_string().into_bytes(), 0o120000));
            } else {
                out.insert(
                    rel,
                    (std::fs::read(&p).unwrap(), m.permissions().mode() & 0o777),
                );
            }
        }
    }
    out
}

/// A directory removed when the test ends.
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        if std::fs::remove_dir_all(&self.0).is_err() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// A read of stored object `object` of checkpoint `digest` from its start, as the
/// operator's restore makes it: `(served, error)`.
fn restore_read(
    w: &World,
    digest: &str,
    object: &str,
) -> (bool, mosaic::coordinator::service::OpError) {
    match w.op(&OperatorRequest::CheckpointRead {
        checkpoint_digest: digest.into(),
        object_digest: object.into(),
        offset: 0,
    }) {
        Ok(_) => (
            true,
            mosaic::coordinator::service::OpError::new(
                mosaic::coordinator::Category::Internal,
                "served",
            ),
        ),
        Err(e) => (false, e),
    }
}

/// The termination receipts' details of `asg`, newest first.
fn receipt_details(w: &World, asg: &str) -> Vec<String> {
    tokio_block(async {
        w.sql()
            .await
            .query(
                "SELECT coalesce(body->>'detail', '') FROM termination_receipts WHERE assignment_id = $1 ORDER BY ingested_at DESC",
                &[&asg],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    })
}

/// Work in repository `demo` on `lane` (of host 0) whose harness changed its workspace —
/// `a.txt` modified, `new.txt`, `staged.txt` (then staged) and the ignored `scratch.log`
/// written, `b.txt` deleted — still running: its assign's answer, id and workspace.
fn changed_work(w: &World, lane: &str) -> (Value, String, PathBuf) {
    let inc = w.incarnation_of(0, "lane-1");
    let work = w.area(0, &inc, 1).join("work");
    let task = format!(
        "attack=write:{0}/a.txt attack=write:{0}/new.txt attack=write:{0}/staged.txt attack=write:{0}/scratch.log hang",
        work.display()
    );
    let a = assign_in(w, lane, &task, Some("demo"), None, None).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    attempts(&w.area(0, &inc, 1).join("home/attacks"), 4);
    let ws = w.state_dir(0).join("workspaces").join(&asg);
    git(&ws, &["add", "staged.txt"]);
    std::fs::remove_file(ws.join("b.txt")).unwrap();
    (a, asg, ws)
}

/// Work in a repository SIGKILLed on one host resumes on another from the checkpoint the
/// coordinator's store holds: the same files, byte for byte (tracked, staged and untracked
/// changes alike), on the same branch at the same base. A byte flipped in the store is
/// refused (the restore fails, the work waits in recovery), and the repaired object
/// serves; the restore is recorded.
#[test]
fn work_moves_to_another_host_through_the_checkpoint_store() {
    let (repo, w, lane0, lane1) = two_hosts("workspaces-move", String::new());
    let (a, asg, ws0) = changed_work(&w, &lane0);
    let mut before = files_of(&ws0);
    // Ignored files are not the work's: never checkpointed, never carried.
    assert!(before.remove("scratch.log").is_some(), "{before:?}");
    kill_into_recovery(&w, &a, &asg);
    // Uploaded: the checkpoint's bundle and its base's, in the store.
    let ck = wait_until("the checkpoint stored", || {
        let rows = checkpoints(&w, &asg, 1);
        (rows[0]["stored"] == true).then(|| rows[0].clone())
    });
    assert!(ck["transfer_error"].is_null(), "{ck}");
    assert_eq!(
        ck["base_commit_id"].as_str(),
        Some(git(&repo.0, &["rev-parse", "main"]).as_str()),
        "{ck}"
    );
    let bundle = ck["bundle_object"].as_str().unwrap().to_string();
    // An operator opens it read-only: the files it changed against its base, the patch.
    let show = |w: &World| {
        w.op(&OperatorRequest::CheckpointShow {
            checkpoint_digest: ck["checkpoint_digest"].as_str().unwrap().into(),
            diff: true,
        })
    };
    let shown = show(&w).unwrap_or_else(|e| panic!("checkpoint show: {e:?}"));
    let mut files: Vec<(String, String)> = shown["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["status"].as_str().unwrap().into(),
                f["path"].as_str().unwrap().into(),
            )
        })
        .collect();
    files.sort();
    let want: Vec<(String, String)> = [
        ("A", "new.txt"),
        ("A", "staged.txt"),
        ("D", "b.txt"),
        ("M", "a.txt"),
    ]
    .iter()
    .map(|(s, p)| (s.to_string(), p.to_string()))
    .collect();
    assert_eq!(files, want, "{shown}");
    let patch = shown["diff"].as_str().unwrap();
    assert!(
        patch.contains("+attack") && patch.contains("-two"),
        "{patch}"
    );
    assert_eq!(shown["diff_truncated"], false);

    // An operator's own copy (the real CLI, a separate process): a repository on the work's
    // branch at its base whose files are the checkpoint's, byte for byte; never into a
    // directory that holds anything.
    let digest = ck["checkpoint_digest"].as_str().unwrap().to_string();
    let restore = |w: &World, into: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_mosaic"))
            .args(["checkpoint", "restore", &digest, "--json", "--into"])
            .arg(into)
            .arg("--coordinator-socket")
            .arg(w.socket(0))
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.success(), v)
    };
    let copy = repo.0.with_extension("restored");
    let _clean = Removed(copy.clone());
    let (ok, v) = restore(&w, &copy);
    assert!(ok, "{v}");
    assert_eq!(v["commit_id"], ck["commit_id"], "{v}");
    assert_eq!(files_of(&copy), before, "the restored copy differs");
    assert_eq!(
        git(&copy, &["rev-parse", "--abbrev-ref", "HEAD"]),
        format!("mosaic/{asg}")
    );
    assert_eq!(
        git(&copy, &["rev-parse", "HEAD"]),
        git(&repo.0, &["rev-parse", "main"])
    );
    let (ok, v) = restore(&w, &copy);
    assert!(!ok && v["error"]["category"] == "bad-input", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("restore into a new directory"),
        "{v}"
    );
    assert_eq!(
        files_of(&copy),
        before,
        "a refused restore changed the copy"
    );
    // Only the objects that very checkpoint names (never a stored object by its address
    // alone), from a part's start.
    let zero = format!("sha256:{}", "0".repeat(64));
    for (ck_digest, object) in [(&zero, &bundle), (&digest, &zero)] {
        let e = w
            .op(&OperatorRequest::CheckpointRead {
                checkpoint_digest: ck_digest.clone(),
                object_digest: object.clone(),
                offset: 0,
            })
            .unwrap_err();
        assert_eq!(e.category, mosaic::coordinator::Category::NotFound, "{e:?}");
    }
    let e = w
        .op(&OperatorRequest::CheckpointRead {
            checkpoint_digest: digest.clone(),
            object_digest: bundle.clone(),
            offset: 1,
        })
        .unwrap_err();
    assert_eq!(e.category, mosaic::coordinator::Category::BadInput, "{e:?}");

    // What the operator read is on record, with who read it: the show, then each object
    // the restore read (one part each here); the refused reads left nothing.
    let reads = w
        .op(&OperatorRequest::CheckpointReads {
            assignment_id: Some(asg.clone()),
        })
        .unwrap();
    let reads = reads.as_array().unwrap();
    let me = {
        use std::os::unix::fs::MetadataExt;
        format!(
            "local:uid={}",
            std::fs::metadata("/proc/self").unwrap().uid()
        )
    };
    let mut objects: Vec<&str> = [ck["base_object"].as_str(), Some(bundle.as_str())]
        .into_iter()
        .flatten()
        .collect();
    objects.sort();
    let mut read: Vec<&str> = reads
        .iter()
        .filter(|r| r["what"] == "checkpoint-read")
        .map(|r| r["object_digest"].as_str().unwrap())
        .collect();
    read.sort();
    assert_eq!(read, objects, "{reads:?}");
    assert_eq!(reads.len(), objects.len() + 1, "{reads:?}");
    assert_eq!(reads[0]["what"], "checkpoint-show", "{reads:?}");
    assert!(
        reads
            .iter()
            .all(|r| r["reader"] == me.as_str() && r["checkpoint_digest"] == digest.as_str()),
        "{reads:?}"
    );

    // A byte flipped at rest: refused, never served; the work stays where it was.
    let flip = |w: &World| {
        tokio_block(async {
            w.sql()
                .await
                .execute(
                    "UPDATE checkpoint_object_parts SET data = set_byte(data, 20, get_byte(data, 20) # 1) \
                     WHERE object_digest = $1 AND part = 0",
                    &[&bundle],
                )
                .await
                .unwrap()
        })
    };
    assert_eq!(flip(&w), 1);
    let e = show(&w).unwrap_err();
    assert!(e.message.contains("corrupt"), "{e:?}");
    let second = repo.0.with_extension("corrupt");
    let _clean2 = Removed(second.clone());
    let (ok, v) = restore(&w, &second);
    assert!(!ok && v["error"]["category"] == "conflict", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("corrupt"),
        "{v}"
    );
    assert!(
        !second.exists(),
        "a refused restore left {}",
        second.display()
    );
    let (ok, v) = restore_read(&w, &digest, &bundle);
    assert!(!ok && v.message.contains("corrupt"), "{v:?}");
    let refused = assign_in(&w, &lane1, "hang", None, None, Some(&asg));
    assert!(refused.is_err(), "{refused:?}");
    wait_until("the refused restore's receipt", || {
        receipt_details(&w, &asg)
            .iter()
            .any(|d| d.contains("corrupt"))
            .then_some(())
    });
    wait_until("the work in recovery again", || {
        (lifecycle(&w, &asg)? == "RECOVERY").then_some(())
    });
    assert!(!w.state_dir(1).join("workspaces").join(&asg).exists());

    // Repaired: the resume on the other host starts in exactly the same files.
    assert_eq!(flip(&w), 1);
    assert!(
        restore_read(&w, &digest, &bundle).0,
        "the repaired object is served"
    );
    let b = assign_in(&w, &lane1, "hang", None, None, Some(&asg)).unwrap();
    assert_eq!(b["state"], "RUNNING", "{b}");
    let ws1 = w.state_dir(1).join("workspaces").join(&asg);
    assert_eq!(files_of(&ws1), before, "the restored workspace differs");
    assert!(
        !ws1.join("scratch.log").exists(),
        "ignored files are not carried"
    );
    assert_eq!(
        git(&ws1, &["rev-parse", "--abbrev-ref", "HEAD"]),
        format!("mosaic/{asg}")
    );
    assert_eq!(
        git(&ws1, &["rev-parse", "HEAD"]),
        git(&repo.0, &["rev-parse", "main"])
    );
    let status = git(&ws1, &["status", "--porcelain"]);
    for line in ["M a.txt", "D b.txt", "?? new.txt", "?? staged.txt"] {
        assert!(status.lines().any(|l| l.trim() == line), "{line}: {status}");
    }
    let restores: i64 = tokio_block(async {
        w.sql()
            .await
            .query_one(
                "SELECT count(*) FROM checkpoint_restores WHERE assignment_id = $1 AND host_id = $2",
                &[&asg, &lane1.split_once(':').unwrap().0],
            )
            .await
            .unwrap()
            .get(0)
    });
    assert_eq!(restores, 2, "the base and the bundle, each served once");
    let store1 = w.state_dir(1).join("checkpoints").join("demo.git");
    let imported = format!("refs/mosaic/restored/{asg}/");
    assert_ne!(git_dir(&store1, &["for-each-ref", &imported]), "");
    let out = stop(&w, asg.clone());
    assert_eq!(out["state"], "CANCELLED", "{out}");
    // Done: both hosts release their copies; the other host's imported refs of the work
    // go with its copy.
    wait_until("both hosts released their copies", || {
        let v = w
            .op(&OperatorRequest::WorkspaceReleases {
                assignment_id: Some(asg.clone()),
            })
            .ok()?;
        let rows = v.as_array()?;
        (rows.iter().filter(|r| r["state"] == "released").count() == 2).then_some(())
    });
    assert!(!ws1.exists());
    assert_eq!(git_dir(&store1, &["for-each-ref", &imported]), "");
    assert_eq!(
        git_dir(
            &store1,
            &["for-each-ref", &format!("refs/mosaic/checkpoints/{asg}/")]
        ),
        ""
    );
}

/// A checkpoint larger than the store takes stays on its host, says why, and a resume on
/// another host is refused with that reason, before anything is reserved.
#[test]
fn a_checkpoint_over_the_store_limit_stays_on_its_host_and_says_so() {
    let (_repo, w, lane0, lane1) = two_hosts(
        "workspaces-limit",
        "checkpoint_store_max_bytes = 100\n".into(),
    );
    let a = assign_in(&w, &lane0, "hang", Some("demo"), None, None).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    kill_into_recovery(&w, &a, &asg);
    let ck = wait_until("the upload refused", || {
        let rows = checkpoints(&w, &asg, 1);
        rows[0]["transfer_error"].as_str().map(String::from)
    });
    assert!(ck.contains("larger than the store takes"), "{ck}");
    let rows = checkpoints(&w, &asg, 1);
    assert_eq!(rows[0]["stored"], false, "{}", rows[0]);
    let reservations = || tokio_block(async { w.count("SELECT count(*) FROM reservations").await });
    let n = reservations();
    let refused = assign_in(&w, &lane1, "hang", None, None, Some(&asg)).expect_err("refused");
    assert!(
        refused.message.contains("larger than the store takes"),
        "{refused:?}"
    );
    assert_eq!(reservations(), n);
    // On its own host it resumes from its own checkpoint repository.
    let b = assign_in(&w, &lane0, "hang", None, None, Some(&asg)).unwrap();
    assert_eq!(b["state"], "RUNNING", "{b}");
    let out = stop(&w, asg.clone());
    assert_eq!(out["state"], "CANCELLED", "{out}");
    // Done, but its files are in no checkpoint the store holds: the host keeps its copy
    // (workspace and refs), the coordinator having refused to release it.
    let said = kept_said(&w, 0, &asg);
    assert!(said.contains("not-stored"), "{said}");
    assert!(w.state_dir(0).join("workspaces").join(&asg).is_dir());
    let store = w.state_dir(0).join("checkpoints").join("demo.git");
    let prefix = format!("refs/mosaic/checkpoints/{asg}/");
    assert_ne!(git_dir(&store, &["for-each-ref", &prefix]), "");
    let rows = w
        .op(&OperatorRequest::WorkspaceReleases {
            assignment_id: Some(asg),
        })
        .unwrap();
    assert_eq!(rows, serde_json::json!([]));
}

/// A waited stop of `asg` asking for COMPLETED.
fn complete(w: &World, asg: &str) -> Value {
    w.op(&OperatorRequest::Stop {
        assignment_id: asg.into(),
        outcome: Some("COMPLETED".into()),
        evidence_digest: Some(format!("sha256:{}", "e".repeat(64))),
        wait: true,
        request_id: None,
    })
    .unwrap()
}

/// The lifecycle, final checkpoint and final evidence of `asg`, from the database.
fn final_of(w: &World, asg: &str) -> (String, Option<String>, Option<String>) {
    tokio_block(async {
        let r = w
            .sql()
            .await
            .query_one(
                "SELECT lifecycle, final_checkpoint_digest, final_evidence_digest FROM assignments WHERE assignment_id = $1",
                &[&asg],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    })
}

/// §17 premature completion: work in a repository is COMPLETED only on the checkpoint its
/// final generation's receipt carries (named, and bound into its final evidence); a final
/// generation that left none makes the requested completion QUARANTINED instead, and work
/// in recovery whose last generation has none is refused COMPLETED before anything changes.
#[test]
fn work_in_a_repository_completes_only_on_its_final_checkpoint() {
    let (repo, w, lane, host) = world(1, "workspaces-complete");
    add_repo(&w, "demo", &repo.0, &host);
    let a = assign_in(&w, &lane, "hang", Some("demo"), None, None).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let out = complete(&w, &asg);
    assert_eq!(out["state"], "COMPLETED", "{out}");
    let ck = checkpoints(&w, &asg, 1);
    let (lifecycle, final_ck, evidence) = final_of(&w, &asg);
    assert_eq!(lifecycle, "COMPLETED");
    assert_eq!(final_ck.as_deref(), ck[0]["checkpoint_digest"].as_str());
    assert!(evidence.is_some());

    // No checkpoint of the final generation (its .gitignore a FIFO): never COMPLETED.
    let b = assign_in(&w, &lane, "hang", Some("demo"), None, None).unwrap();
    let asg2 = b["assignment_id"].as_str().unwrap().to_string();
    let ws = w.state_dir(0).join("workspaces").join(&asg2);
    plant_fifo_gitignore(&ws);
    let out = complete(&w, &asg2);
    assert_eq!(out["state"], "QUARANTINED", "{out}");
    let (lifecycle, final_ck, _) = final_of(&w, &asg2);
    assert_eq!((lifecycle.as_str(), final_ck), ("QUARANTINED", None));

    // Work in recovery whose last generation left no checkpoint: refused, unchanged.
    w.op(&OperatorRequest::LaneRelease {
        lane_id: lane.clone(),
        request_id: None,
    })
    .unwrap();
    let c = assign_in(&w, &lane, "hang", Some("demo"), None, None).unwrap();
    let asg3 = c["assignment_id"].as_str().unwrap().to_string();
    let ws = w.state_dir(0).join("workspaces").join(&asg3);
    plant_fifo_gitignore(&ws);
    kill_into_recovery(&w, &c, &asg3);
    let refused = w
        .op(&OperatorRequest::Stop {
            assignment_id: asg3.clone(),
            outcome: Some("COMPLETED".into()),
            evidence_digest: Some(format!("sha256:{}", "e".repeat(64))),
            wait: true,
            request_id: None,
        })
        .expect_err("refused");
    assert!(
        refused
            .message
            .contains("needs the checkpoint of its last generation"),
        "{refused:?}"
    );
    assert_eq!(final_of(&w, &asg3).0, "RECOVERY");
    // Resumed with no checkpoint to restore (the operator goes on without it): a fresh
    // clone, and the files no checkpoint recorded set aside, never handed on as one.
    w.op(&OperatorRequest::LaneRelease {
        lane_id: lane.clone(),
        request_id: None,
    })
    .unwrap();
    let d = assign_in(&w, &lane, "hang", None, None, Some(&asg3)).unwrap();
    assert_eq!(d["state"], "RUNNING", "{d}");
    let dir = w.state_dir(0).join("workspaces");
    let ws3 = dir.join(&asg3);
    assert!(
        std::fs::symlink_metadata(ws3.join(".gitignore"))
            .unwrap()
            .file_type()
            .is_file(),
        "the resumed generation got the unrecorded files (the FIFO)"
    );
    let aside = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!(".superseded-{asg3}-"))
        })
        .count();
    assert_eq!(aside, 1, "the unrecorded files are set aside");

    // The host's copy of the completed work is released once its files are in the store:
    // workspace and checkpoint refs gone, with a receipt naming the stored checkpoint.
    let rel = released(&w, &asg);
    assert_eq!(rel["matched"], "stored", "{rel}");
    assert_eq!(
        rel["checkpoint_digest"], ck[0]["checkpoint_digest"],
        "{rel}"
    );
    assert_eq!(rel["tree_id"], ck[0]["tree_id"], "{rel}");
    assert!(rel["refs_removed"].as_i64().unwrap() >= 1, "{rel}");
    assert!(rel["receipt_digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert!(!w.state_dir(0).join("workspaces").join(&asg).exists());
    let store = w.state_dir(0).join("checkpoints").join("demo.git");
    let prefix = format!("refs/mosaic/checkpoints/{asg}/");
    assert_eq!(git_dir(&store, &["for-each-ref", &prefix]), "");
    // Work whose files are in no checkpoint (asg2, its last generation left none) keeps
    // its copy; so does work that may run again (asg3).
    kept_said(&w, 0, &asg2);
    for kept in [&asg2, &asg3] {
        assert!(
            w.state_dir(0).join("workspaces").join(kept).is_dir(),
            "{kept}"
        );
        let rows = w
            .op(&OperatorRequest::WorkspaceReleases {
                assignment_id: Some(kept.clone()),
            })
            .unwrap();
        assert_eq!(rows, serde_json::json!([]), "{kept}");
    }
}

/// The release of host copies of `asg`, once one is done.
fn released(w: &World, asg: &str) -> Value {
    wait_until("the host released its copy of the work", || {
        let v = w
            .op(&OperatorRequest::WorkspaceReleases {
                assignment_id: Some(asg.into()),
            })
            .ok()?;
        let r = v.as_array()?.first()?.clone();
        (r["state"] == "released").then_some(r)
    })
}

/// Waits until host `h`'s supervisor has said it keeps its copy of `asg`.
fn kept_said(w: &World, h: usize, asg: &str) -> String {
    wait_until("the host said it keeps its copy", || {
        std::fs::read_to_string(w.supervisor_log(h))
            .ok()?
            .lines()
            .find(|l| l.contains(asg) && l.contains("copy of the work is kept"))
            .map(String::from)
    })
}

/// One value of a query over the world's database.
fn sql_one<T: for<'a> tokio_postgres::types::FromSql<'a>>(
    w: &World,
    q: &str,
    p: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> T {
    tokio_block(async { w.sql().await.query_one(q, p).await.unwrap().get(0) })
}

/// Work in a repository handed off to a lane of another host (spec §8.1): at the offer the
/// source's workspace is held read-only and checkpointed, the target's is restored from
/// exactly that checkpoint before its harness starts — the same files, byte for byte — and
/// the target's ACK binds the checkpoint's digest. The source's generation, fenced, ends
/// on that same checkpoint (it could write nothing after it). An earlier offer that expired
/// gave the source its workspace back: the next offer checkpoints it again.
#[test]
fn a_handoff_carries_the_work_to_another_host_byte_for_byte() {
    let (repo, w, lane0, lane1) = two_hosts("workspaces-handoff", String::new());
    let inc = w.incarnation_of(0, "lane-1");
    let (_, asg, ws0) = changed_work(&w, &lane0);
    // A first offer nobody acknowledges: its checkpoint is taken, the offer expires, and
    // the source's workspace is its own again — what it writes next is the work.
    w.op(&OperatorRequest::Handoff {
        assignment_id: asg.clone(),
        lane_id: lane1.clone(),
        task: Some("hang".into()),
        within_ms: Some(4_000),
        request_id: None,
    })
    .unwrap_or_else(|e| panic!("handoff: {e:?}"));
    let first: String = wait_until("the first offer's checkpoint, then its expiry", || {
        let r: Option<String> = sql_one(
            &w,
            "SELECT max(checkpoint_digest) FROM handoffs WHERE assignment_id = $1 AND state = 'EXPIRED'",
            &[&asg],
        );
        r
    });
    wait_until("the target lane idle again", || {
        let s: String = sql_one(
            &w,
            "SELECT state FROM lane_incarnations WHERE lane_id = $1 AND retired_at IS NULL",
            &[&lane1],
        );
        (s == "IDLE_CLEAN").then_some(())
    });
    std::fs::write(ws0.join("later.txt"), "written after the first offer\n").unwrap();
    let mut before = files_of(&ws0);
    assert!(before.remove("scratch.log").is_some(), "{before:?}");

    let h = w
        .op(&OperatorRequest::Handoff {
            assignment_id: asg.clone(),
            lane_id: lane1.clone(),
            task: Some("accept-handoff hang".into()),
            within_ms: Some(120_000),
            request_id: None,
        })
        .unwrap_or_else(|e| panic!("handoff: {e:?}"));
    assert!(h["workspace"].as_str().unwrap().contains("demo"), "{h}");
    let inc1 = w.incarnation_of(1, "lane-1");
    wait_until("the target running the work", || {
        let on: Option<String> = sql_one(
            &w,
            "SELECT (SELECT a.lane_incarnation_id FROM assignments a JOIN lane_incarnations li USING (lane_incarnation_id) \
             WHERE a.assignment_id = $1 AND a.execution_owner IS NOT NULL AND li.state = 'RUNNING')",
            &[&asg],
        );
        (on.as_deref() == Some(inc1.as_str())).then_some(())
    });
    let ws1 = w.state_dir(1).join("workspaces").join(&asg);
    assert_eq!(files_of(&ws1), before, "the handed-off workspace differs");
    assert_eq!(
        git(&ws1, &["rev-parse", "HEAD"]),
        git(&repo.0, &["rev-parse", "main"])
    );
    assert_eq!(
        git(&ws1, &["rev-parse", "--abbrev-ref", "HEAD"]),
        format!("mosaic/{asg}")
    );
    // One checkpoint bound everywhere: the handoff's row, its checkpoint row (of the
    // source generation, taken at the offer) and the accepted ACK.
    let (bound, recorded, acked): (Option<String>, String, Option<String>) = tokio_block(async {
        let r = w
            .sql()
            .await
            .query_one(
                "SELECT h.checkpoint_digest, ck.checkpoint_digest, h.ack_body->>'checkpoint_digest' \
                 FROM handoffs h JOIN checkpoints ck ON ck.handoff_id = h.handoff_id \
                 WHERE h.assignment_id = $1 AND h.state = 'ACCEPTED' AND ck.purpose = 'handoff' \
                   AND ck.lane_incarnation_id = $2 AND ck.generation = 1",
                &[&asg, &inc],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    });
    assert_eq!(bound.as_deref(), Some(recorded.as_str()));
    assert_ne!(
        recorded, first,
        "the second offer reused the first one's checkpoint"
    );
    assert_eq!(acked.as_deref(), Some(recorded.as_str()));
    // The target's host restored it from the store, for the handoff.
    let served: i64 = sql_one(
        &w,
        "SELECT count(*) FROM checkpoint_restores r JOIN handoffs h ON h.target_reservation_id = r.reservation_id \
         JOIN checkpoints ck ON ck.handoff_id = h.handoff_id AND ck.bundle_object = r.object_digest \
         WHERE h.assignment_id = $1 AND h.state = 'ACCEPTED' AND r.purpose = 'handoff'",
        &[&asg],
    );
    assert_eq!(
        served, 1,
        "the accepted checkpoint's bundle, served once to its target"
    );
    // The fenced source ends on the handoff's checkpoint.
    let ended = wait_until("the source's end checkpoint", || {
        sql_one::<Option<String>>(
            &w,
            "SELECT max(checkpoint_digest) FROM checkpoints WHERE assignment_id = $1 \
             AND purpose = 'same-assignment-recovery' AND lane_incarnation_id = $2",
            &[&asg, &inc],
        )
    });
    assert_eq!(ended, recorded);
    // Both are listed, each with its origin, and both name the stored objects (the
    // generation's end record, too, can be restored elsewhere).
    let listed = wait_until("both records stored", || {
        let rows = checkpoints(&w, &asg, 2);
        rows.iter()
            .filter(|c| c["checkpoint_digest"] == recorded.as_str())
            .all(|c| c["stored"] == true)
            .then_some(rows)
    });
    assert!(
        listed.iter().any(|c| c["purpose"] == "handoff"
            && c["handoff_id"].is_string()
            && c["termination_receipt"].is_null()
            && c["checkpoint_digest"] == recorded.as_str()),
        "{listed:?}"
    );
    let out = stop(&w, asg.clone());
    assert_eq!(out["state"], "CANCELLED", "{out}");
}

/// A handoff of work in a repository to another lane of its own host is refused before
/// anything is reserved: two generations would share its one workspace directory.
#[test]
fn a_handoff_of_work_in_a_repository_stays_off_its_own_host() {
    let (repo, w, lane, host) = world(2, "workspaces-handoff-host");
    add_repo(&w, "demo", &repo.0, &host);
    let a = assign_in(&w, &lane, "hang", Some("demo"), None, None).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let other = w.lane_of(0, "lane-2");
    let e = w
        .op(&OperatorRequest::Handoff {
            assignment_id: asg.clone(),
            lane_id: other.clone(),
            task: None,
            within_ms: None,
            request_id: None,
        })
        .unwrap_err();
    assert!(e.message.contains("another host"), "{e:?}");
    let (offers, state): (i64, String) = tokio_block(async {
        let c = w.sql().await;
        let n = c
            .query_one(
                "SELECT count(*) FROM handoffs WHERE assignment_id = $1",
                &[&asg],
            )
            .await
            .unwrap()
            .get(0);
        let s = c
            .query_one(
                "SELECT li.state FROM lane_incarnations li WHERE li.lane_id = $1 AND li.retired_at IS NULL",
                &[&other],
            )
            .await
            .unwrap()
            .get(0);
        (n, s)
    });
    assert_eq!((offers, state.as_str()), (0, "IDLE_CLEAN"));
    let out = stop(&w, asg);
    assert_eq!(out["state"], "CANCELLED", "{out}");
}

/// A source whose workspace cannot be held read-only (an unconfined lane's, written by its
/// harness as the supervisor) gets no handoff checkpoint: its host says why, the reason is
/// on the handoff, nothing is staged on the target, and the offer expires with the work
/// running on at its source.
#[test]
fn a_handoff_from_an_unconfined_lane_takes_no_checkpoint_and_moves_nothing() {
    let repo = Repo::new();
    let w = World::started(Spec {
        hosts: 2,
        supervisors: 2,
        lanes: 1,
        tag: "workspaces-handoff-unconfined",
        supervisor_top: "unconfined_lanes = [\"lane-1\"]\n".into(),
        ..Spec::default()
    });
    let (lane0, lane1) = (w.lane_of(0, "lane-1"), w.lane_of(1, "lane-1"));
    add_repo(&w, "demo", &repo.0, lane0.split_once(':').unwrap().0);
    let a = assign_in(&w, &lane0, "checkpoint hang", Some("demo"), None, None).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    // Its harness cannot have a checkpoint while it runs either: its workspace may be
    // written from outside its cgroup.
    let inc0 = w.incarnation_of(0, "lane-1");
    let asked = first_answer(&w.area(0, &inc0, 1).join("home/checkpoints"));
    assert_eq!(asked["ok"], false, "{asked}");
    assert!(
        asked["error"].as_str().unwrap().contains("unconfined"),
        "{asked}"
    );
    w.op(&OperatorRequest::Handoff {
        assignment_id: asg.clone(),
        lane_id: lane1.clone(),
        task: Some("accept-handoff hang".into()),
        within_ms: Some(4_000),
        request_id: None,
    })
    .unwrap_or_else(|e| panic!("handoff: {e:?}"));
    let why = wait_until("the handoff's checkpoint error", || {
        sql_one::<Option<String>>(
            &w,
            "SELECT max(checkpoint_error) FROM handoffs WHERE assignment_id = $1",
            &[&asg],
        )
    });
    assert!(why.contains("unconfined"), "{why}");
    wait_until("the offer expired", || {
        let s: Option<String> = sql_one(
            &w,
            "SELECT max(state) FROM handoffs WHERE assignment_id = $1",
            &[&asg],
        );
        (s.as_deref() == Some("EXPIRED")).then_some(())
    });
    let (digest, rows): (Option<String>, i64) = tokio_block(async {
        let c = w.sql().await;
        let d = c
            .query_one(
                "SELECT max(checkpoint_digest) FROM handoffs WHERE assignment_id = $1",
                &[&asg],
            )
            .await
            .unwrap()
            .get(0);
        let n = c
            .query_one(
                "SELECT count(*) FROM checkpoints WHERE assignment_id = $1",
                &[&asg],
            )
            .await
            .unwrap()
            .get(0);
        (d, n)
    });
    assert_eq!((digest, rows), (None, 0), "a checkpoint was recorded");
    assert!(
        !w.state_dir(1).join("workspaces").join(&asg).exists(),
        "the target was staged without the checkpoint"
    );
    assert_eq!(lifecycle(&w, &asg).as_deref(), Some("ACTIVE"));
    let out = stop(&w, asg);
    assert_eq!(out["state"], "CANCELLED", "{out}");
}

fn add_repo_with_setup(
    w: &World,
    name: &str,
    path: &Path,
    host: &str,
    copy: &[&str],
    setup: &[String],
    timeout: Option<u32>,
) -> Result<Value, mosaic::coordinator::service::OpError> {
    w.op(&OperatorRequest::RepoAdd {
        name: name.into(),
        path: Some(path.display().to_string()),
        url: None,
        host_id: Some(host.into()),
        copy: copy.iter().map(|c| c.to_string()).collect(),
        setup: setup.to_vec(),
        setup_timeout_s: timeout,
    })
}

/// Every pid whose command line holds `needle`.
fn pids_running(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| common::cmdline_contains(*p, needle))
        .collect()
}

/// A repository's setup: a gitignored `.env` copied from its directory, then commands run
/// in the fresh workspace before the harness starts — as the lane's uid, confined (its own
/// network namespace, the supervisor's state out of sight, nothing written outside the
/// workspace), none of its processes left once the harness runs. What the workspace was
/// made from is recorded: the checkpoint's inputs digest is recomputed here from the
/// evidence (the declaration, the base commit, the copied bytes).
#[test]
fn a_fresh_workspace_gets_its_setup_before_the_harness_starts() {
    let (repo, w, lane, host) = world(1, "ws-setup");
    std::fs::write(repo.0.join(".gitignore"), "*.log\n.env\n").unwrap();
    git(&repo.0, &["commit", "-q", "-am", "ignore .env"]);
    let secret = format!("TOKEN={}\n", uuid::Uuid::new_v4().simple());
    std::fs::write(repo.0.join(".env"), &secret).unwrap();
    let state = w.state_dir(0);
    let marker = format!(
        "sleep {}",
        600_000 + uuid::Uuid::new_v4().as_u128() % 100_000
    );
    let setup = vec![
        "test -f .env && id -u > setup-uid.txt && readlink /proc/self/ns/net > setup-netns.txt"
            .to_string(),
        format!(
            "({marker} &) ; touch {0}/escaped 2>/dev/null; ls -A {0} > setup-state.txt; echo done > setup-done.txt",
            state.display()
        ),
    ];
    // Refused before anything is stored: a path out of the repository, a file from a URL.
    for (copy, why) in [("../x", "file to copy"), (".git/config", "file to copy")] {
        let e = add_repo_with_setup(&w, "bad", &repo.0, &host, &[copy], &[], None)
            .expect_err("refused");
        assert_eq!(e.category.as_str(), "bad-input", "{e:?}");
        assert!(e.message.contains(why), "{e:?}");
    }
    let url = w.op(&OperatorRequest::RepoAdd {
        name: "bad".into(),
        path: None,
        url: Some("https://example.invalid/r.git".into()),
        host_id: None,
        copy: vec![".env".into()],
        setup: vec![],
        setup_timeout_s: None,
    });
    assert!(format!("{url:?}").contains("bad-input"), "{url:?}");
    assert_eq!(
        w.op(&OperatorRequest::Repos).unwrap(),
        serde_json::json!([])
    );

    let added =
        add_repo_with_setup(&w, "demo", &repo.0, &host, &[".env"], &setup, Some(60)).unwrap();
    assert_eq!(added["added"], true, "{added}");
    // The setup is part of the declaration: another under the same name is a conflict.
    let other = add_repo_with_setup(&w, "demo", &repo.0, &host, &[".env"], &setup[..1], Some(60));
    assert!(format!("{other:?}").contains("conflict"), "{other:?}");

    let inc = w.incarnation_of(0, "lane-1");
    let work = w.area(0, &inc, 1).join("work");
    let task = format!(
        "attack=read:{0}/.env attack=read:{0}/setup-done.txt hang",
        work.display()
    );
    let a = assign_in(&w, &lane, &task, Some("demo"), Some("main"), None).unwrap();
    assert_eq!(a["state"], "RUNNING", "{a}");
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let seen = attempts(&w.area(0, &inc, 1).join("home/attacks"), 2);
    assert!(
        seen.iter().all(|(_, ok)| *ok),
        "the harness sees the setup's work: {seen:?}"
    );

    let ws = state.join("workspaces").join(&asg);
    assert_eq!(std::fs::read_to_string(ws.join(".env")).unwrap(), secret);
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata(&ws).unwrap().uid();
    assert_ne!(uid, 0);
    let ran_as = std::fs::read_to_string(ws.join("setup-uid.txt")).unwrap();
    assert_eq!(
        ran_as.trim(),
        uid.to_string(),
        "the setup runs as the lane's uid"
    );
    let netns = std::fs::read_to_string(ws.join("setup-netns.txt")).unwrap();
    let own = std::fs::read_link("/proc/self/ns/net").unwrap();
    assert_ne!(
        netns.trim(),
        own.to_string_lossy(),
        "the setup has no network"
    );
    assert!(
        !state.join("escaped").exists(),
        "the setup wrote outside its workspace"
    );
    let listing = std::fs::read_to_string(ws.join("setup-state.txt")).unwrap();
    // Only the path down to its own workspace exists for it (as for a generation's area):
    // the checkpoint repositories beside it, made before it ran, are not there.
    assert!(
        state.join("checkpoints").is_dir() && !listing.contains("checkpoints"),
        "the setup saw the supervisor's state: {listing}"
    );
    assert!(
        pids_running(&marker).is_empty(),
        "a process of the setup outlived it"
    );
    // Its output is kept beside the workspace, not in the supervisor's log.
    let log = std::fs::read_to_string(state.join("workspaces").join(format!(".setup-{asg}.log")))
        .unwrap();
    assert!(
        log.contains("setup command 2 of 2") && !log.contains("TOKEN="),
        "{log}"
    );

    let out = stop(&w, asg.clone());
    assert_eq!(out["state"], "CANCELLED", "{out}");
    let ck = checkpoints(&w, &asg, 1).remove(0);
    let store = state.join("checkpoints/demo.git");
    let names = git_dir(
        &store,
        &[
            "ls-tree",
            "-r",
            "--name-only",
            ck["commit_id"].as_str().unwrap(),
        ],
    );
    assert!(names.contains("setup-done.txt"), "{names}");
    assert!(
        !names.contains(".env\n") && !names.ends_with(".env"),
        "an ignored copy stays out: {names}"
    );
    use sha2::Digest;
    let inputs = mosaic::protocol::repo::WorkspaceInputs {
        repository: mosaic::protocol::repo::RepoName::parse("demo").unwrap(),
        source: mosaic::protocol::repo::RepoSource::path(repo.0.to_str().unwrap()).unwrap(),
        base_commit_id: Some(git(&repo.0, &["rev-parse", "main"])),
        restored_from: None,
        setup_digest: mosaic::protocol::repo::RepoSetup::parse(&[".env".into()], &setup, Some(60))
            .unwrap()
            .digest(),
        copied: vec![mosaic::protocol::repo::CopiedFile {
            path: mosaic::protocol::repo::CopyPath::parse(".env").unwrap(),
            digest: Some(format!(
                "sha256:{}",
                hex::encode(sha2::Sha256::digest(secret.as_bytes()))
            )),
        }],
        commands_run: 2,
    };
    assert_eq!(
        ck["inputs_digest"].as_str(),
        Some(inputs.digest().as_str()),
        "{ck}"
    );
}

/// A setup that fails (a command's non-zero exit, a command past its time limit, a copied
/// file that is a link) starts no harness and leaves no workspace; the failure says which
/// command and where its output is, and the next start runs the setup again from a fresh
/// clone.
#[test]
fn a_failed_setup_starts_no_harness_and_leaves_no_workspace() {
    let (repo, w, lane, host) = world(1, "ws-setup-fail");
    std::os::unix::fs::symlink("/etc/passwd", repo.0.join("linked.env")).unwrap();
    // Committed as a link to /etc, a real directory in the source's working tree: the copy
    // reads the source's file and meets the clone's link (a root write through it would
    // land in /etc).
    let etc_file = format!("mosaic-setup-{}.env", uuid::Uuid::new_v4().simple());
    std::os::unix::fs::symlink("/etc", repo.0.join("cfg")).unwrap();
    git(&repo.0, &["add", "cfg"]);
    git(&repo.0, &["commit", "-q", "-m", "cfg"]);
    std::fs::remove_file(repo.0.join("cfg")).unwrap();
    std::fs::create_dir(repo.0.join("cfg")).unwrap();
    std::fs::write(repo.0.join("cfg").join(&etc_file), "X=1\n").unwrap();
    let through = format!("cfg/{etc_file}");
    let state = w.state_dir(0);
    let sleeper = format!(
        "sleep {}",
        700_000 + uuid::Uuid::new_v4().as_u128() % 100_000
    );
    // (repository, files to copy, commands, time limit, what the failure says)
    type Case<'a> = (&'a str, Vec<&'a str>, Vec<String>, Option<u32>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "exits",
            vec![],
            vec!["true".into(), "echo failing; exit 7".into()],
            None,
            "setup command 2 of 2 failed",
        ),
        (
            "slow",
            vec![],
            vec![format!("({sleeper} &); {sleeper}")],
            Some(1),
            "did not finish within 1 s",
        ),
        (
            "linked",
            vec!["linked.env"],
            vec![],
            None,
            "links are not followed",
        ),
        (
            "through",
            vec![through.as_str()],
            vec![],
            None,
            "links are not followed",
        ),
        (
            "tracked",
            vec!["a.txt"],
            vec![],
            None,
            "its clone does not carry",
        ),
    ];
    for (name, copy, setup, timeout, why) in cases {
        add_repo_with_setup(&w, name, &repo.0, &host, &copy, &setup, timeout).unwrap();
        let got = assign_in(&w, &lane, "hang", Some(name), None, None);
        let text = format!("{got:?}");
        assert!(
            text.contains(why) && text.contains("its host said"),
            "{name}: {text}"
        );
        assert!(got.is_err(), "{name}: no harness may start: {text}");
        let dir = state.join("workspaces");
        let left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str().map(String::from))
            .filter(|n| !n.starts_with('.') || n.starts_with(".new-"))
            .collect();
        assert!(left.is_empty(), "{name}: a workspace was left: {left:?}");
        assert!(
            pids_running(&sleeper).is_empty(),
            "{name}: the setup's process lives on"
        );
        assert!(
            !Path::new("/etc").join(&etc_file).exists(),
            "{name}: written through a link"
        );
        // The work waits in recovery; stopped, so the next case has the lane.
        for a in w.status()["assignments"].as_array().unwrap() {
            if a["state"] == "RECOVERY" {
                let out = stop(&w, a["assignment_id"].as_str().unwrap());
                assert_eq!(out["state"], "CANCELLED", "{out}");
            }
        }
    }
}

fn sql_rows(
    w: &World,
    q: &str,
    p: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Vec<tokio_postgres::Row> {
    tokio_block(async { w.sql().await.query(q, p).await.unwrap() })
}

fn open_reservation(w: &World, asg: &str) -> String {
    sql_rows(
        w,
        "SELECT reservation_id FROM reservations WHERE assignment_id = $1 AND released_at IS NULL",
        &[&asg],
    )[0]
    .get(0)
}

fn assign_from(
    w: &World,
    lane: &str,
    task: &str,
    from: &str,
    resume: Option<&str>,
    within: Option<u32>,
) -> Result<Value, mosaic::coordinator::service::OpError> {
    let mut r = world::assign_request(lane, task, resume, true);
    if let OperatorRequest::Assign {
        repo,
        from_checkpoint,
        grant_within_s,
        ..
    } = &mut r
    {
        *repo = Some("demo".into());
        *from_checkpoint = Some(from.into());
        *grant_within_s = within;
    }
    w.op(&r)
}

/// §11 and §17 (Checkpoint disclosure, Checkpoint grant bindings): another assignment's
/// workspace starts from a checkpoint only under the grant its own reservation made —
/// consumed once by its first stage, with one scoped access receipt — and gets exactly
/// that tree. Without one, nothing of the checkpoint reaches it: not at its start, not
/// through the store by digest, not by path. The consuming statement refuses every
/// substituted bound field, a replay, an expired grant and a revoked one.
#[test]
fn another_assignment_starts_from_a_checkpoint_only_under_its_grant() {
    let (repo, w, lane, host) = world(2, "ws-grant");
    add_repo(&w, "demo", &repo.0, &host);
    let (_, asg_a, ws_a) = changed_work(&w, &lane);
    let mut want = files_of(&ws_a);
    assert!(want.remove("scratch.log").is_some());
    assert_eq!(stop(&w, asg_a.clone())["state"], "CANCELLED");
    let ck = wait_until("the checkpoint stored", || {
        let rows = checkpoints(&w, &asg_a, 1);
        (rows[0]["stored"] == true).then(|| rows[0].clone())
    });
    let digest = ck["checkpoint_digest"].as_str().unwrap().to_string();
    let bundle = ck["bundle_object"].as_str().unwrap().to_string();
    let lane2 = w.lane_of(0, "lane-2");

    // Refused before anything is reserved: no such checkpoint, a resume, a lifetime out of
    // range.
    let count = |q: &str| -> i64 { sql_rows(&w, q, &[])[0].get(0) };
    let before = count("SELECT count(*) FROM reservations");
    let none = format!("sha256:{}", "0".repeat(64));
    for (from, resume, within, why) in [
        (none.as_str(), None, None, "not-found"),
        (digest.as_str(), Some(asg_a.as_str()), None, "bad-input"),
        (digest.as_str(), None, Some(0), "bad-input"),
        ("sha256:nothex", None, None, "bad-input"),
    ] {
        let e = assign_from(&w, &lane2, "hang", from, resume, within).expect_err("refused");
        assert_eq!(
            e.category.as_str(),
            why,
            "{from} {resume:?} {within:?}: {e:?}"
        );
    }
    assert_eq!(count("SELECT count(*) FROM reservations"), before);
    assert_eq!(count("SELECT count(*) FROM checkpoint_grants"), 0);

    // Without a grant another assignment in the same repository starts from the base.
    let u = assign_in(&w, &lane2, "hang", Some("demo"), None, None).unwrap();
    let asg_u = u["assignment_id"].as_str().unwrap().to_string();
    let ws_u = w.state_dir(0).join("workspaces").join(&asg_u);
    assert!(!ws_u.join("new.txt").exists() && ws_u.join("b.txt").exists());

    // Through the store, by digest: U's open reservation gets nothing of A's checkpoint.
    let store = tokio_block(async {
        mosaic::coordinator::store::Store::connect(
            &w.db.url,
            mosaic::coordinator::secret::CoordinatorSecret::generate().unwrap(),
        )
        .await
        .unwrap()
    });
    let fetch = |asg: &str, res: &str| {
        tokio_block(store.checkpoint_fetch(
            &host,
            &mosaic::protocol::messages::CheckpointFetch {
                assignment_id: asg.into(),
                reservation_id: res.into(),
                object_digest: bundle.clone(),
                offset: 0,
            },
        ))
        .unwrap()
    };
    let res_u = open_reservation(&w, &asg_u);
    assert_eq!(
        fetch(&asg_u, &res_u),
        mosaic::protocol::messages::DataAnswer::Refused("not-granted".into())
    );
    assert_eq!(stop(&w, asg_u.clone())["state"], "CANCELLED");

    // T: a remediation assignment from A's checkpoint, on the same lane.
    let t = assign_from(&w, &lane2, "hang", &digest, None, Some(120)).unwrap();
    assert_eq!(t["state"], "RUNNING", "{t}");
    let asg_t = t["assignment_id"].as_str().unwrap().to_string();
    let ws_t = w.state_dir(0).join("workspaces").join(&asg_t);
    assert_eq!(files_of(&ws_t), want, "the granted tree, byte for byte");
    assert_eq!(
        git(&ws_t, &["rev-parse", "--abbrev-ref", "HEAD"]),
        format!("mosaic/{asg_t}")
    );
    let res_t = open_reservation(&w, &asg_t);
    let grants = w
        .op(&OperatorRequest::CheckpointGrants {
            assignment_id: Some(asg_t.clone()),
        })
        .unwrap();
    let g = grants.as_array().unwrap();
    assert_eq!(g.len(), 1, "{grants}");
    let g = g[0].clone();
    let s = |k: &str| g[k].as_str().unwrap_or_default().to_string();
    assert_eq!(
        (
            s("source_assignment_id"),
            s("checkpoint_digest"),
            s("target_assignment_id")
        ),
        (asg_a.clone(), digest.clone(), asg_t.clone())
    );
    assert_eq!(s("consumed_by_reservation"), res_t, "{g}");
    assert_eq!(s("recovery_principal"), format!("host:{host}"));
    assert_eq!(
        s("permitted_fields_digest"),
        mosaic::coordinator::grants::permitted_fields_digest()
    );
    let binding = mosaic::coordinator::grants::GrantBinding {
        grant_id: s("grant_id"),
        sot_incarnation: s("sot_incarnation"),
        coordinator_epoch: g["coordinator_epoch"].as_i64().unwrap(),
        source_assignment_id: s("source_assignment_id"),
        source_attempt_id: s("source_attempt_id"),
        source_lane_incarnation_id: s("source_lane_incarnation_id"),
        source_generation: g["source_generation"].as_i64().unwrap(),
        checkpoint_digest: s("checkpoint_digest"),
        target_assignment_id: s("target_assignment_id"),
        target_attempt_id: s("target_attempt_id"),
        recovery_principal: s("recovery_principal"),
        recovery_role: s("recovery_role"),
        purpose: s("purpose"),
        classification: s("classification"),
        permitted_fields_digest: s("permitted_fields_digest"),
        transformation_digest: None,
        retention_policy_digest: s("retention_policy_digest"),
    };
    // One access receipt, its digest that of every bound field, the chain and itself.
    let receipts = sql_rows(
        &w,
        "SELECT receipt_id, reservation_id, receipt_digest FROM checkpoint_access_receipts WHERE grant_id = $1",
        &[&binding.grant_id],
    );
    assert_eq!(receipts.len(), 1);
    let (rid, rres, rdig): (String, String, String) =
        (receipts[0].get(0), receipts[0].get(1), receipts[0].get(2));
    assert_eq!(rres, res_t);
    assert_eq!(rdig, binding.receipt_digest(&res_t, &rid));
    assert_eq!(s("access_receipt"), rid);
    // The store serves T's chain the granted objects, and nobody else under T's grant.
    assert!(matches!(
        fetch(&asg_t, &res_t),
        mosaic::protocol::messages::DataAnswer::Data { .. }
    ));
    assert_eq!(
        fetch(&asg_a, &res_t),
        mosaic::protocol::messages::DataAnswer::Refused("not-granted".into())
    );
    // Spent: not revoked after its use.
    let revoke = |id: &str| {
        w.op(&OperatorRequest::CheckpointGrantRevoke {
            grant_id: id.into(),
            request_id: None,
        })
    };
    assert!(format!("{:?}", revoke(&binding.grant_id)).contains("conflict"));
    assert!(format!("{:?}", revoke("cg-0123")).contains("conflict"));

    // The consuming statement itself, on the grant made unspent again inside a
    // transaction that is rolled back: every bound field substituted, a replay, an
    // expired grant, a revoked one.
    tokio_block(async {
        let mut c = w.sql().await;
        let tx = c.transaction().await.unwrap();
        let reset = "UPDATE checkpoint_grants SET consumed_at = NULL, consumed_by_reservation = NULL, revoked_at = NULL, \
                     deadline = clock_timestamp() + interval '1 hour' WHERE grant_id = $1";
        tx.execute(
            "DELETE FROM checkpoint_access_receipts WHERE grant_id = $1",
            &[&binding.grant_id],
        )
        .await
        .unwrap();
        tx.execute(reset, &[&binding.grant_id]).await.unwrap();
        let consume_by = |b: mosaic::coordinator::grants::GrantBinding, res: String| {
            let tx = &tx;
            async move {
                let rid = format!("ca-{}", uuid::Uuid::new_v4().simple());
                let rd = b.receipt_digest(&res, &rid);
                let mut p: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = vec![&res];
                p.extend(b.params());
                p.push(&rid);
                p.push(&rd);
                tx.query(mosaic::coordinator::grants::CONSUME, &p)
                    .await
                    .unwrap()
                    .len()
            }
        };
        let consume = |b| consume_by(b, res_t.clone());
        type B = mosaic::coordinator::grants::GrantBinding;
        type Sub = Box<dyn Fn(&mut B)>;
        let other = "sha256:".to_string() + &"9".repeat(64);
        let subs: Vec<(&str, Sub)> = vec![
            ("grant_id", Box::new(|b: &mut B| b.grant_id = "cg-x".into())),
            (
                "sot_incarnation",
                Box::new(|b: &mut B| b.sot_incarnation += "x"),
            ),
            (
                "coordinator_epoch",
                Box::new(|b: &mut B| b.coordinator_epoch += 1),
            ),
            (
                "source_assignment_id",
                Box::new(|b: &mut B| b.source_assignment_id += "x"),
            ),
            (
                "source_attempt_id",
                Box::new(|b: &mut B| b.source_attempt_id += "x"),
            ),
            (
                "source_lane_incarnation_id",
                Box::new(|b: &mut B| b.source_lane_incarnation_id += "x"),
            ),
            (
                "source_generation",
                Box::new(|b: &mut B| b.source_generation += 1),
            ),
            (
                "checkpoint_digest",
                Box::new({
                    let o = other.clone();
                    move |b: &mut B| b.checkpoint_digest = o.clone()
                }),
            ),
            (
                "target_assignment_id",
                Box::new(|b: &mut B| b.target_assignment_id += "x"),
            ),
            (
                "target_attempt_id",
                Box::new(|b: &mut B| b.target_attempt_id += "x"),
            ),
            (
                "recovery_principal",
                Box::new(|b: &mut B| b.recovery_principal = "host:elsewhere".into()),
            ),
            (
                "recovery_role",
                Box::new(|b: &mut B| b.recovery_role = "reviewer".into()),
            ),
            (
                "purpose",
                Box::new(|b: &mut B| b.purpose = "same-assignment-recovery".into()),
            ),
            (
                "classification",
                Box::new(|b: &mut B| b.classification = "artifact".into()),
            ),
            (
                "permitted_fields_digest",
                Box::new({
                    let o = other.clone();
                    move |b: &mut B| b.permitted_fields_digest = o.clone()
                }),
            ),
            (
                "transformation_digest",
                Box::new({
                    let o = other.clone();
                    move |b: &mut B| b.transformation_digest = Some(o.clone())
                }),
            ),
            (
                "retention_policy_digest",
                Box::new({
                    let o = other.clone();
                    move |b: &mut B| b.retention_policy_digest = o.clone()
                }),
            ),
        ];
        for (field, sub) in &subs {
            let mut b = binding.clone();
            sub(&mut b);
            assert_eq!(
                consume(b).await,
                0,
                "a substituted {field} consumed the grant"
            );
        }
        // Presented by another chain: a released reservation, one of another assignment.
        assert_eq!(
            consume_by(binding.clone(), res_u.clone()).await,
            0,
            "another chain's reservation"
        );
        assert_eq!(
            consume_by(binding.clone(), "rs-none".into()).await,
            0,
            "no reservation"
        );
        assert_eq!(consume(binding.clone()).await, 1, "the exact binding");
        assert_eq!(consume(binding.clone()).await, 0, "a replay");
        let n: i64 = tx
            .query_one(
                "SELECT count(*) FROM checkpoint_access_receipts WHERE grant_id = $1",
                &[&binding.grant_id],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "one scoped receipt");
        tx.execute(
            "DELETE FROM checkpoint_access_receipts WHERE grant_id = $1",
            &[&binding.grant_id],
        )
        .await
        .unwrap();
        tx.execute(reset, &[&binding.grant_id]).await.unwrap();
        tx.execute(
            "UPDATE checkpoint_grants SET deadline = created_at + interval '1 microsecond' WHERE grant_id = $1",
            &[&binding.grant_id],
        )
        .await
        .unwrap();
        assert_eq!(consume(binding.clone()).await, 0, "an expired grant");
        tx.execute(reset, &[&binding.grant_id]).await.unwrap();
        tx.execute(
            "UPDATE checkpoint_grants SET revoked_at = clock_timestamp() WHERE grant_id = $1",
            &[&binding.grant_id],
        )
        .await
        .unwrap();
        assert_eq!(consume(binding.clone()).await, 0, "a revoked grant");
        tx.rollback().await.unwrap();
    });

    // By path: T's confined generation reaches neither A's workspace nor the checkpoint
    // repositories (both below the supervisor's state).
    let inc2 = w.incarnation_of(0, "lane-2");
    // A stop that waits answers once its lane is usable again: the next assign on that
    // lane is taken at once.
    let out = stop(&w, asg_t.clone());
    assert_eq!(
        (out["state"].as_str(), out["lane_state"].as_str()),
        (Some("CANCELLED"), Some("IDLE_CLEAN")),
        "{out}"
    );
    let spy = format!(
        "attack=read:{0}/new.txt attack=read:{1}/checkpoints/demo.git/HEAD hang",
        ws_a.display(),
        w.state_dir(0).display()
    );
    let v = assign_in(&w, &lane2, &spy, None, None, None).unwrap();
    let gen_v = v["generation"].as_u64().unwrap();
    let denied = attempts(&w.area(0, &inc2, gen_v).join("home/attacks"), 2);
    assert!(denied.iter().all(|(_, ok)| !*ok), "{denied:?}");
    assert_eq!(
        stop(&w, v["assignment_id"].as_str().unwrap())["state"],
        "CANCELLED"
    );
}

/// A grant revoked before its target's first stage: the stage finds it spent, the chain
/// ends, no workspace is made (never a fresh clone in its place), and the work is blocked
/// (`no-granted-checkpoint`) — the watchdog leaves it alone — until the operator stops it.
#[test]
fn a_revoked_grant_ends_its_chain_and_blocks_the_work() {
    assert!(
        mosaic::coordinator::failpoint::enabled(),
        "this test holds the coordinator at a failpoint: build with --features failpoints (scripts/test does)"
    );
    let (repo, mut w, lane, host) = world(1, "ws-grant-revoked");
    add_repo(&w, "demo", &repo.0, &host);
    let (_, asg_a, _) = changed_work(&w, &lane);
    assert_eq!(stop(&w, asg_a.clone())["state"], "CANCELLED");
    let ck = checkpoints(&w, &asg_a, 1).remove(0);
    let digest = ck["checkpoint_digest"].as_str().unwrap().to_string();
    // The next assign is held right after its reservation (and grant) commit.
    let go = w.dir.join("go");
    w.crash_coordinator(0);
    w.start_coordinator(
        0,
        Some(&format!(
            "hold-after-commit:reserve=return({})",
            go.display()
        )),
    );
    w.wait_leading(0);
    let me = format!("host:{host}");
    wait_until("the host connected", || {
        let st = w.op(&OperatorRequest::Status).ok()?;
        st["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| h == me.as_str())
            .then_some(())
    });
    let sock = w.socket(0);
    let mut req = world::assign_request(&lane, "hang", None, true);
    if let OperatorRequest::Assign {
        repo,
        from_checkpoint,
        ..
    } = &mut req
    {
        *repo = Some("demo".into());
        *from_checkpoint = Some(digest.clone());
    }
    let first =
        std::thread::spawn(move || mosaic::coordinator::service::operator_call(&sock, &req));
    let log = w.coordinator_log(0);
    wait_until("the assign held after its reservation", || {
        std::fs::read_to_string(&log)
            .ok()?
            .contains("failpoint=hold-after-commit:reserve ")
            .then_some(())
    });
    let rows = sql_rows(
        &w,
        "SELECT grant_id, target_assignment_id FROM checkpoint_grants",
        &[],
    );
    assert_eq!(rows.len(), 1);
    let (grant, asg_t): (String, String) = (rows[0].get(0), rows[0].get(1));
    let revoked = w
        .op(&OperatorRequest::CheckpointGrantRevoke {
            grant_id: grant.clone(),
            request_id: None,
        })
        .unwrap();
    assert!(revoked["revoked_at"].is_string(), "{revoked}");
    std::fs::write(&go, "").unwrap();
    let e = first.join().unwrap().expect_err("the chain ends");
    assert_eq!(e.category.as_str(), "chain-ended", "{e:?}");
    assert!(
        !w.state_dir(0).join("workspaces").join(&asg_t).exists(),
        "a workspace was made"
    );
    let blocked = wait_until("the work blocked", || {
        let r = sql_rows(
            &w,
            "SELECT work_status, blocker_code, next_action FROM assignments WHERE assignment_id = $1",
            &[&asg_t],
        );
        let (status, code, next): (String, Option<String>, String) =
            (r[0].get(0), r[0].get(1), r[0].get(2));
        (status == "blocked").then_some((code, next))
    });
    assert_eq!(blocked.0.as_deref(), Some("no-granted-checkpoint"));
    assert!(blocked.1.contains("new grant"), "{}", blocked.1);
    let none: i64 = sql_rows(&w, "SELECT count(*) FROM checkpoint_access_receipts", &[])[0].get(0);
    assert_eq!(none, 0, "a revoked grant gave access");
    assert_eq!(stop(&w, asg_t)["state"], "CANCELLED");
}

/// §11 retention: each checkpoint records the digest of the policy in force (here: kept one
/// second after its work is done); `checkpoint gc` deletes in one run every record its
/// policy lets go — only of done work, never one a live grant names (its target may still
/// be restoring) — each with a receipt whose digest is recomputed here from the stored
/// row, and never an object another checkpoint still names; `checkpoint delete` deletes
/// done work's checkpoint at once and refuses work that is not done. Nothing deleted can
/// be shown or granted again.
#[test]
fn checkpoints_of_done_work_go_by_their_policy_with_a_receipt() {
    let repo = Repo::new();
    let w = World::started(Spec {
        lanes: 2,
        tag: "ws-retention",
        coordinator_extra: "checkpoint_retention_s = 1\n".into(),
        ..Spec::default()
    });
    let (lane, lane2) = (w.lane_of(0, "lane-1"), w.lane_of(0, "lane-2"));
    let host = lane.split_once(':').unwrap().0.to_string();
    add_repo(&w, "demo", &repo.0, &host);
    let stored_rows = |asg: &str, n: usize| {
        wait_until("the checkpoints stored", || {
            let rows = checkpoints(&w, asg, n);
            rows.iter().all(|r| r["stored"] == true).then_some(rows)
        })
    };
    // A: two generations (SIGKILLed, resumed to write more, stopped): two checkpoints.
    let (a, asg_a, _) = changed_work(&w, &lane);
    kill_into_recovery(&w, &a, &asg_a);
    let inc = w.incarnation_of(0, "lane-1");
    let work2 = w.area(0, &inc, 2).join("work");
    let task2 = format!("attack=write:{}/later.txt hang", work2.display());
    assign_in(&w, &lane, &task2, None, None, Some(&asg_a)).unwrap();
    attempts(&w.area(0, &inc, 2).join("home/attacks"), 1);
    assert_eq!(stop(&w, asg_a.clone())["state"], "CANCELLED");
    let cks_a = stored_rows(&asg_a, 2);
    let policy = mosaic::coordinator::retention::RetentionPolicy::configured(Some(1))
        .unwrap()
        .digest();
    assert!(
        cks_a
            .iter()
            .all(|c| c["retention_policy_digest"] == policy.as_str()),
        "{cks_a:?}"
    );
    let (first_a, second_a) = (
        cks_a[0]["checkpoint_digest"].as_str().unwrap().to_string(),
        cks_a[1]["checkpoint_digest"].as_str().unwrap().to_string(),
    );
    assert_ne!(first_a, second_a);
    // B: in recovery with its checkpoint (not done).
    let b = assign_in(&w, &lane2, "hang", Some("demo"), None, None).unwrap();
    let asg_b = b["assignment_id"].as_str().unwrap().to_string();
    kill_into_recovery(&w, &b, &asg_b);
    // Resumed to write more and SIGKILLed again: two checkpoints, the work in recovery.
    let inc2 = w.incarnation_of(0, "lane-2");
    let work_b = w.area(0, &inc2, 2).join("work");
    let task_b = format!("attack=write:{}/more.txt hang", work_b.display());
    let b2 = assign_in(&w, &lane2, &task_b, None, None, Some(&asg_b)).unwrap();
    attempts(&w.area(0, &inc2, 2).join("home/attacks"), 1);
    kill_into_recovery(&w, &b2, &asg_b);
    let cks_b = stored_rows(&asg_b, 2);
    let ck_b = cks_b[0].clone();
    let digest_b = ck_b["checkpoint_digest"].as_str().unwrap().to_string();
    assert_eq!(
        cks_a[0]["base_object"], ck_b["base_object"],
        "one base, stored once"
    );
    // T: a remediation from A's first checkpoint, its grant live (10 minutes).
    let t = assign_from(&w, &lane, "hang", &first_a, None, None).unwrap();
    let asg_t = t["assignment_id"].as_str().unwrap().to_string();

    // Refused, changing nothing: work not done, no such checkpoint, not a digest, a live
    // grant's.
    let delete = |d: &str| {
        w.op(&OperatorRequest::CheckpointDelete {
            checkpoint_digest: d.into(),
            request_id: None,
        })
    };
    for (d, why) in [
        (digest_b.clone(), "wrong-state"),
        (format!("sha256:{}", "0".repeat(64)), "not-found"),
        ("sha256:x".to_string(), "bad-input"),
        (first_a.clone(), "wrong-state"),
    ] {
        let e = delete(&d).expect_err("refused");
        assert_eq!(e.category.as_str(), why, "{d}: {e:?}");
    }
    // Once A has been done a second: A's second checkpoint alone.
    let gc = |dry_run: bool| {
        w.op(&OperatorRequest::CheckpointGc {
            dry_run,
            request_id: None,
        })
        .unwrap()
    };
    let listed = wait_until("A's checkpoint past its retention", || {
        let v = gc(true);
        let l = v["deletable"].as_array()?.clone();
        (!l.is_empty()).then_some(l)
    });
    let digests: Vec<&str> = listed
        .iter()
        .map(|d| d["checkpoint_digest"].as_str().unwrap())
        .collect();
    assert_eq!(digests, [second_a.as_str()], "{listed:?}");
    let done = gc(false);
    let deleted = done["deleted"].as_array().unwrap();
    assert_eq!(deleted.len(), 1, "{done}");
    assert_eq!(done["kept"], serde_json::json!([]), "{done}");
    // The stored receipt, its digest recomputed from its own fields.
    let rows = sql_rows(
        &w,
        "SELECT deletion_id, checkpoint_digest, assignment_id, lane_incarnation_id, generation, purpose, handoff_id, \
                retention_policy_digest, reason, scope, objects_deleted, receipt_digest FROM checkpoint_deletions",
        &[],
    );
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    let doomed = mosaic::coordinator::retention::Doomed {
        checkpoint_digest: r.get(1),
        assignment_id: r.get(2),
        lane_incarnation_id: r.get(3),
        generation: r.get(4),
        purpose: r.get(5),
        handoff_id: r.get(6),
        request_seq: None,
        retention_policy_digest: r.get(7),
    };
    let (id, reason, scope, gone, digest): (String, String, String, Vec<String>, String) =
        (r.get(0), r.get(8), r.get(9), r.get(10), r.get(11));
    assert_eq!(
        (
            doomed.checkpoint_digest.as_str(),
            doomed.assignment_id.as_str(),
            doomed.generation
        ),
        (second_a.as_str(), asg_a.as_str(), 2)
    );
    assert_eq!(
        (reason.as_str(), scope.as_str()),
        ("retention", "coordinator-store")
    );
    assert_eq!(digest, doomed.receipt_digest(&id, &reason, &gone));
    assert_eq!(deleted[0]["receipt_digest"], digest.as_str());
    // Its bundle went; the base the other checkpoints name stayed.
    assert_eq!(
        gone,
        [cks_a[1]["bundle_object"].as_str().unwrap().to_string()]
    );
    let stored = |o: &str| -> i64 {
        sql_rows(
            &w,
            "SELECT count(*) FROM checkpoint_objects WHERE object_digest = $1",
            &[&o],
        )[0]
        .get(0)
    };
    assert_eq!(stored(cks_a[1]["bundle_object"].as_str().unwrap()), 0);
    for o in [
        &cks_a[0]["bundle_object"],
        &ck_b["base_object"],
        &ck_b["bundle_object"],
    ] {
        assert_eq!(stored(o.as_str().unwrap()), 1, "{o}");
    }
    let left = checkpoints(&w, &asg_a, 1);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["checkpoint_digest"], first_a.as_str());
    let shown = w.op(&OperatorRequest::CheckpointShow {
        checkpoint_digest: second_a.clone(),
        diff: false,
    });
    assert_eq!(shown.expect_err("gone").category.as_str(), "not-found");
    let e = assign_from(&w, &lane, "hang", &second_a, None, None).expect_err("gone");
    assert_eq!(e.category.as_str(), "not-found", "{e:?}");
    // T, done: its checkpoint deleted at once by the operator, whatever the policy.
    assert_eq!(stop(&w, asg_t.clone())["state"], "CANCELLED");
    let ck_t = stored_rows(&asg_t, 1).remove(0);
    let out = delete(ck_t["checkpoint_digest"].as_str().unwrap()).unwrap();
    assert_eq!(out["deleted"][0]["reason"], "operator", "{out}");
    // B, done now: both its checkpoints go in one run once its time passed.
    assert_eq!(stop(&w, asg_b.clone())["state"], "CANCELLED");
    let listed = wait_until("B's checkpoints past their retention", || {
        let v = gc(true);
        let l = v["deletable"].as_array()?.clone();
        (l.len() == 2).then_some(l)
    });
    assert!(
        listed.iter().all(|d| d["assignment_id"] == asg_b.as_str()),
        "{listed:?}"
    );
    let done = gc(false);
    assert_eq!(done["deleted"].as_array().map(Vec::len), Some(2), "{done}");
    assert_eq!(done["kept"], serde_json::json!([]), "{done}");
    for c in &cks_b {
        assert_eq!(stored(c["bundle_object"].as_str().unwrap()), 0, "{c}");
    }
    let receipts = w
        .op(&OperatorRequest::CheckpointDeletions {
            assignment_id: None,
        })
        .unwrap();
    assert_eq!(receipts.as_array().map(Vec::len), Some(4), "{receipts}");
    // A checkpoint deleted is a debt once paid: both lanes, every generation's checkpoint
    // of theirs gone, take new work (their fences pass).
    for l in [&lane, &lane2] {
        let n = assign_in(&w, l, "hang", Some("demo"), None, None)
            .unwrap_or_else(|e| panic!("{l} after its checkpoints were deleted: {e:?}"));
        assert_eq!(n["state"], "RUNNING", "{n}");
        let asg = n["assignment_id"].as_str().unwrap().to_string();
        assert_eq!(stop(&w, asg)["state"], "CANCELLED");
    }
}

/// The first JSON line of `file` (a fake harness's answers), once it is there.
fn first_answer(file: &Path) -> Value {
    nth_answer(file, 0)
}

/// The harness's `n`th answer (from 0) in `file`, once it is there.
fn nth_answer(file: &Path, n: usize) -> Value {
    wait_until("the harness's answer", || {
        std::fs::read_to_string(file)
            .ok()?
            .lines()
            .nth(n)
            .and_then(|l| serde_json::from_str(l).ok())
    })
}

/// `mosaic lane checkpoint` (§11: a checkpoint before the generation ends): a RUNNING
/// generation asks, its host freezes it, checkpoints the workspace, records it with the
/// coordinator (no receipt, no handoff: request 1) and uploads it; the harness hears it is
/// stored. Then the host goes down with the generation and its disk loses the work, so no
/// end checkpoint can come; the work resumes on the other host in exactly the files of
/// that instant (a change made after it is not there). Work without a workspace is
/// refused with the reason, and records nothing.
#[test]
fn a_checkpoint_the_harness_asks_for_survives_the_loss_of_its_host() {
    // Effect leases short enough that a lost host's work is in recovery within seconds.
    let (_repo, mut w, lane0, lane1) =
        two_hosts("workspaces-asked", "lease_ttl_ms = 6000\n".into());

    // No workspace: refused, nothing recorded.
    let plain = assign_in(&w, &lane1, "checkpoint hang", None, None, None).unwrap();
    let plain_asg = plain["assignment_id"].as_str().unwrap().to_string();
    let inc1 = w.incarnation_of(1, "lane-1");
    let refused = first_answer(&w.area(1, &inc1, 1).join("home/checkpoints"));
    assert_eq!(refused["ok"], false, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("no workspace"),
        "{refused}"
    );
    assert!(checkpoints(&w, &plain_asg, 0).is_empty());
    let out = stop(&w, plain_asg);
    assert_eq!(out["lane_state"], "IDLE_CLEAN", "{out}");

    let inc0 = w.incarnation_of(0, "lane-1");
    let area = w.area(0, &inc0, 1);
    let task = format!(
        "attack=write:{0}/a.txt attack=write:{0}/new.txt checkpoint checkpoint hang",
        area.join("work").display()
    );
    let a = assign_in(&w, &lane0, &task, Some("demo"), None, None).unwrap();
    assert_eq!(a["state"], "RUNNING", "{a}");
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let answer = first_answer(&area.join("home/checkpoints"));
    assert_eq!(answer["ok"], true, "{answer}");
    let got = &answer["checkpoint"];
    assert_eq!(got["request_seq"], 1, "{answer}");
    assert_eq!(got["stored"], true, "{answer}");
    let rows = checkpoints(&w, &asg, 1);
    let ck = &rows[0];
    assert_eq!(ck["checkpoint_digest"], got["checkpoint_digest"], "{ck}");
    assert_eq!(ck["request_seq"], 1, "{ck}");
    assert_eq!(ck["purpose"], "same-assignment-recovery", "{ck}");
    assert!(
        ck["termination_receipt"].is_null() && ck["handoff_id"].is_null(),
        "{ck}"
    );
    assert_eq!(ck["stored"], true, "{ck}");
    // A second request at once: refused (one a minute), nothing recorded.
    let again = nth_answer(&area.join("home/checkpoints"), 1);
    assert_eq!(again["ok"], false, "{again}");
    assert!(
        again["error"].as_str().unwrap().contains("at most one per"),
        "{again}"
    );
    assert_eq!(checkpoints(&w, &asg, 1).len(), 1);
    // Frozen while it was read, running again after.
    let cg = cgroup_at(a["process_identity"]["cgroup_path"].as_str().unwrap());
    let events = std::fs::read_to_string(cg.join("cgroup.events")).unwrap();
    assert!(events.lines().any(|l| l == "frozen 0"), "{events}");
    let ws0 = w.state_dir(0).join("workspaces").join(&asg);
    let at_checkpoint = files_of(&ws0);
    assert!(at_checkpoint.contains_key("new.txt"), "{at_checkpoint:?}");
    // After the checkpoint: a change it does not hold.
    std::fs::write(ws0.join("late.txt"), "after\n").unwrap();

    // The host goes down with its generation, and its disk loses the work (the workspace
    // and the host's own checkpoint repository): when it comes back, the generation's end
    // is observed, but there is nothing left to take its end checkpoint from.
    w.crash_supervisor(0);
    std::fs::write(cg.join("cgroup.kill"), "1").unwrap();
    std::fs::remove_dir_all(&ws0).unwrap();
    std::fs::remove_dir_all(w.state_dir(0).join("checkpoints")).unwrap();
    w.start_supervisor(0);
    wait_until("the work in recovery", || {
        (lifecycle(&w, &asg)? == "RECOVERY").then_some(())
    });
    wait_until("the generation's end observed", || {
        (!receipt_details(&w, &asg).is_empty()).then_some(())
    });
    assert_eq!(
        checkpoints(&w, &asg, 1).len(),
        1,
        "an end checkpoint was recorded from nothing"
    );
    let b = assign_in(&w, &lane1, "hang", None, None, Some(&asg)).unwrap();
    assert_eq!(b["state"], "RUNNING", "{b}");
    let ws1 = w.state_dir(1).join("workspaces").join(&asg);
    assert_eq!(
        files_of(&ws1),
        at_checkpoint,
        "the restored workspace differs"
    );
    assert!(!ws1.join("late.txt").exists());
    assert_eq!(
        git(&ws1, &["rev-parse", "--abbrev-ref", "HEAD"]),
        format!("mosaic/{asg}")
    );
    assert_eq!(stop(&w, asg)["state"], "CANCELLED");
}

/// A generation that asked for a checkpoint, wrote on, and then died with its host up
/// leaves two records: the one it asked for and its end. A resume elsewhere takes the end
/// (the later work); a remediation assignment granted the earlier one gets exactly that
/// earlier tree, never the end's.
#[test]
fn a_resume_takes_the_end_and_a_grant_takes_the_checkpoint_it_names() {
    let (_repo, w, lane0, lane1) = two_hosts("workspaces-asked-end", String::new());
    let inc0 = w.incarnation_of(0, "lane-1");
    let area = w.area(0, &inc0, 1);
    let task = format!(
        "attack=write:{0}/a.txt checkpoint hang",
        area.join("work").display()
    );
    let a = assign_in(&w, &lane0, &task, Some("demo"), None, None).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let answer = first_answer(&area.join("home/checkpoints"));
    assert_eq!(answer["checkpoint"]["stored"], true, "{answer}");
    let asked = answer["checkpoint"]["checkpoint_digest"]
        .as_str()
        .unwrap()
        .to_string();
    let ws0 = w.state_dir(0).join("workspaces").join(&asg);
    let at_request = files_of(&ws0);
    std::fs::write(ws0.join("late.txt"), "after\n").unwrap();
    let at_end = files_of(&ws0);
    kill_into_recovery(&w, &a, &asg);
    let rows = wait_until("both records stored", || {
        let rows = checkpoints(&w, &asg, 2);
        rows.iter().all(|r| r["stored"] == true).then_some(rows)
    });
    assert!(
        rows.iter()
            .any(|r| r["request_seq"] == 1 && r["checkpoint_digest"] == asked.as_str())
            && rows.iter().any(|r| r["termination_receipt"].is_string()),
        "{rows:?}"
    );

    // Granted the one it asked for: that tree.
    // (A new assignment in a repository declared by path runs on that path's host.)
    let t = assign_from(&w, &lane0, "hang", &asked, None, Some(120)).unwrap();
    assert_eq!(t["state"], "RUNNING", "{t}");
    let asg_t = t["assignment_id"].as_str().unwrap().to_string();
    let ws_t = w.state_dir(0).join("workspaces").join(&asg_t);
    assert_eq!(
        files_of(&ws_t),
        at_request,
        "the granted tree, byte for byte"
    );
    let out = stop(&w, asg_t);
    assert_eq!(out["lane_state"], "IDLE_CLEAN", "{out}");

    // Resumed: its end.
    let b = assign_in(&w, &lane1, "hang", None, None, Some(&asg)).unwrap();
    assert_eq!(b["state"], "RUNNING", "{b}");
    let ws1 = w.state_dir(1).join("workspaces").join(&asg);
    assert_eq!(files_of(&ws1), at_end, "the resumed tree is not the end's");
    assert_eq!(stop(&w, asg)["state"], "CANCELLED");
}

/// A supervisor killed while a generation's cgroup is frozen for the checkpoint its harness
/// asked for: when it comes back, its re-adoption thaws the generation, which runs on;
/// nothing was recorded for that request, and the work still ends on its own checkpoint.
#[test]
fn a_generation_frozen_for_its_checkpoint_is_thawed_when_its_supervisor_returns() {
    let (repo, mut w, lane, host) = world(1, "workspaces-frozen");
    add_repo(&w, "demo", &repo.0, &host);
    // Held after the freeze, before the workspace is read, until this file exists (never).
    let hold = repo.0.with_extension("never");
    restart_holding(&mut w, &host, "checkpoint:frozen", &hold);
    let a = assign_in(&w, &lane, "checkpoint hang", Some("demo"), None, None).unwrap();
    assert_eq!(a["state"], "RUNNING", "{a}");
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let cg = cgroup_at(a["process_identity"]["cgroup_path"].as_str().unwrap());
    let frozen = |state: &str| {
        let want = format!("frozen {state}");
        wait_until("the generation's freezer state", || {
            std::fs::read_to_string(cg.join("cgroup.events"))
                .ok()?
                .lines()
                .any(|l| l == want)
                .then_some(())
        })
    };
    frozen("1");
    w.crash_supervisor(0);
    w.start_supervisor(0);
    frozen("0");
    wait_connected(&w, &host);
    let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap();
    assert!(!procs.trim().is_empty(), "the generation runs on");
    let life: String = sql_one(
        &w,
        "SELECT lifecycle FROM assignments WHERE assignment_id = $1",
        &[&asg],
    );
    assert_eq!(life, "ACTIVE");
    assert!(
        checkpoints(&w, &asg, 0).is_empty(),
        "nothing recorded for the request"
    );
    let out = stop(&w, asg.clone());
    assert_eq!(out["state"], "CANCELLED", "{out}");
    let rows = checkpoints(&w, &asg, 1);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0]["request_seq"].is_null(), "{}", rows[0]);
}

/// Restarts host 0's supervisor with failpoint `point` holding until `file` exists (this
/// start only), and waits for it to be connected again.
fn restart_holding(w: &mut World, host: &str, point: &str, file: &Path) {
    w.crash_supervisor(0);
    // The killed process's session is seen gone first (its socket closed with it):
    // otherwise the old session, not yet noticed dead, passes for the new one, and the
    // next request finds the host unreachable.
    wait_until("the old session gone", || {
        (!connected(w, host)?).then_some(())
    });
    let spec = format!("{point}=return({})", file.display());
    w.sup[0].start(Some(spec.as_str()));
    wait_connected(w, host);
}

/// Whether the coordinator holds a session of `host` now (`None`: no answer).
fn connected(w: &World, host: &str) -> Option<bool> {
    let st = w.op(&OperatorRequest::Status).ok()?;
    Some(
        st["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| h == host || h == format!("host:{host}").as_str()),
    )
}

/// Waits until the coordinator holds `host`'s session.
fn wait_connected(w: &World, host: &str) {
    wait_until("the host connected again", || {
        connected(w, host)?.then_some(())
    });
}

/// Done work whose files on its host changed after its last checkpoint: the coordinator
/// refuses to release the copy (its tree is in no stored checkpoint of the work), and the
/// host keeps it — the one copy of those files.
#[test]
fn a_host_copy_that_is_in_no_stored_checkpoint_is_kept() {
    let (repo, mut w, lane, host) = world(1, "workspaces-changed");
    add_repo(&w, "demo", &repo.0, &host);
    let go = repo.0.with_extension("go");
    restart_holding(&mut w, &host, "release:ask", &go);
    let a = assign_in(&w, &lane, "hang", Some("demo"), None, None).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let out = complete(&w, &asg);
    assert_eq!(out["state"], "COMPLETED", "{out}");
    // The host is about to ask; its copy changes first.
    wait_until("the release held", || {
        std::fs::read_to_string(w.supervisor_log(0))
            .ok()?
            .contains("release:ask")
            .then_some(())
    });
    let ws = w.state_dir(0).join("workspaces").join(&asg);
    std::fs::write(ws.join("late.txt"), "written after the last checkpoint\n").unwrap();
    std::fs::write(&go, "").unwrap();
    let said = kept_said(&w, 0, &asg);
    assert!(said.contains("not-stored"), "{said}");
    assert!(ws.join("late.txt").is_file());
    let rows = w
        .op(&OperatorRequest::WorkspaceReleases {
            assignment_id: Some(asg),
        })
        .unwrap();
    assert_eq!(rows, serde_json::json!([]));
    let _ = std::fs::remove_file(&go);
}

/// A bare clone of `repo` standing in for its remote; removed on drop.
struct Remote(PathBuf);

impl Remote {
    fn of(repo: &Repo) -> Self {
        let p = std::env::temp_dir().join(format!(
            "mosaic-remote-{}.git",
            uuid::Uuid::new_v4().simple()
        ));
        let ok = Command::new("git")
            .args(["clone", "--bare", "-q"])
            .arg(&repo.0)
            .arg(&p)
            .status()
            .expect("git clone");
        assert!(ok.success());
        Self(p)
    }

    fn at(&self, reference: &str) -> Option<String> {
        let out = Command::new("git")
            .arg("--git-dir")
            .arg(&self.0)
            .args(["rev-parse", "--verify", "-q", reference])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn git(&self, args: &[&str]) -> String {
        git_dir(&self.0, args)
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `mosaic workspace push|merge` for `asg`: the effect as the coordinator answered it.
fn hand_on(
    w: &World,
    asg: &str,
    kind: &str,
    into: Option<&str>,
) -> Result<Value, mosaic::coordinator::service::OpError> {
    w.op(&OperatorRequest::WorkspaceEffect {
        assignment_id: asg.into(),
        kind: kind.into(),
        into: into.map(String::from),
        host_id: None,
        wait: true,
        request_id: None,
    })
}

/// Like [`hand_on`], once the work's final checkpoint is whole in the store.
fn hand_on_stored(w: &World, asg: &str, kind: &str, into: Option<&str>) -> Value {
    wait_until("the final checkpoint in the store", || {
        match hand_on(w, asg, kind, into) {
            Err(e) if e.message.contains("not whole in the coordinator's store") => None,
            other => Some(other.unwrap_or_else(|e| panic!("{kind}: {e:?}"))),
        }
    })
}

/// The final checkpoint's commit and tree of COMPLETED work `asg`.
fn final_commit(w: &World, asg: &str) -> (String, String) {
    let (_, digest, _) = final_of(w, asg);
    let digest = digest.expect("a final checkpoint");
    let rows = w
        .op(&OperatorRequest::Checkpoints {
            assignment_id: Some(asg.into()),
            checkpoint_digest: Some(digest),
        })
        .unwrap();
    let r = &rows[0];
    (
        r["commit_id"].as_str().unwrap().into(),
        r["tree_id"].as_str().unwrap().into(),
    )
}

/// Work assigned in `demo` on `lane` from `base`, its workspace given `files`, completed.
fn completed_with(w: &World, lane: &str, base: Option<&str>, files: &[(&str, &str)]) -> String {
    let a = assign_in(w, lane, "hang", Some("demo"), base, None).unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    let ws = w.state_dir(0).join("workspaces").join(&asg);
    for (name, text) in files {
        std::fs::write(ws.join(name), text).unwrap();
    }
    assert_eq!(complete(w, &asg)["state"], "COMPLETED");
    asg
}

/// Issue 20 §6 "finishing the work": done work's final checkpoint is handed on only through
/// the host's push executor, after the coordinator admitted the exact update. A push puts
/// exactly the checkpoint (its tree is the work's files, uncommitted ones too) on the work's
/// own branch of the remote; again it finds it there and claims nothing; a merge
/// fast-forwards a branch that has not moved, makes a merge commit of one that has, and
/// declines a conflict without touching the remote. Work that is not COMPLETED, or that has
/// no workspace, is refused before anything is recorded; a host without the repository
/// among its push executor's declines it.
#[test]
fn done_work_is_handed_on_only_through_an_admitted_update() {
    let repo = Repo::new();
    let remote = Remote::of(&repo);
    let w = World::started(Spec {
        lanes: 1,
        tag: "workspaces-hand-on",
        supervisor_extra: format!("[repositories.demo]\nurl = {:?}\n", remote.0),
        ..Spec::default()
    });
    let lane = w.lane_of(0, "lane-1");
    let host = lane.split_once(':').unwrap().0.to_string();
    add_repo(&w, "demo", &repo.0, &host);
    let effects = |asg: &str| -> i64 {
        sql_one(
            &w,
            "SELECT count(*) FROM workspace_effects WHERE assignment_id = $1",
            &[&asg],
        )
    };

    // Not done yet: refused, nothing recorded, the remote untouched.
    let (_, asg, ws) = changed_work(&w, &lane);
    let refused = hand_on(&w, &asg, "push", None).expect_err("running work is not handed on");
    assert!(
        refused.message.contains("only COMPLETED work"),
        "{refused:?}"
    );
    assert_eq!(effects(&asg), 0);
    std::fs::write(ws.join("untracked.txt"), "never committed\n").unwrap();
    assert_eq!(complete(&w, &asg)["state"], "COMPLETED");
    let (commit, tree) = final_commit(&w, &asg);

    // A push: exactly the final checkpoint on mosaic/<assignment>.
    let branch = format!("refs/heads/mosaic/{asg}");
    let out = hand_on_stored(&w, &asg, "push", None);
    assert_eq!(out["state"], "COMPLETED", "{out}");
    assert_eq!(out["new_id"], commit.as_str(), "{out}");
    assert_eq!(out["old_id"], "0".repeat(40), "{out}");
    assert_eq!(out["reference"], branch.as_str());
    assert_eq!(remote.at(&branch).as_deref(), Some(commit.as_str()));
    assert_eq!(
        remote.git(&["rev-parse", &format!("{commit}^{{tree}}")]),
        tree
    );
    assert_eq!(
        remote.git(&["show", &format!("{commit}:untracked.txt")]),
        "never committed"
    );
    assert_eq!(
        remote.git(&["show", &format!("{commit}:a.txt")]),
        "one\nattack"
    );
    assert!(
        out["result_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"),
        "{out}"
    );
    // Again (through the CLI): already there, nothing claimed.
    let out = Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args(["workspace", "push", "--json", "--assignment", &asg])
        .arg("--coordinator-socket")
        .arg(w.socket(0))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["state"], "UP_TO_DATE", "{again}");
    assert!(again["old_id"].is_null(), "{again}");
    // Someone else's history on the work's branch: never forced over.
    let main_tip = remote.at("refs/heads/main").unwrap();
    let tree_of_main = remote.git(&["rev-parse", &format!("{main_tip}^{{tree}}")]);
    let theirs = git_dir(
        &remote.0,
        &[
            "-c",
            "user.name=x",
            "-c",
            "user.email=x@x",
            "commit-tree",
            &tree_of_main,
            "-p",
            &main_tip,
            "-m",
            "theirs",
        ],
    );
    remote.git(&["update-ref", &branch, &theirs]);
    let out = hand_on(&w, &asg, "push", None).unwrap();
    assert_eq!(out["state"], "DECLINED", "{out}");
    assert!(
        out["detail"].as_str().unwrap().contains("no force push"),
        "{out}"
    );
    assert_eq!(remote.at(&branch).as_deref(), Some(theirs.as_str()));
    remote.git(&["update-ref", &branch, &commit]);

    // A merge into main, which has not moved since the work's base: a fast-forward.
    let main_before = remote.at("refs/heads/main").unwrap();
    let out = hand_on(&w, &asg, "merge", Some("main")).unwrap();
    assert_eq!(out["state"], "COMPLETED", "{out}");
    assert_eq!(out["old_id"], main_before.as_str());
    assert_eq!(
        remote.at("refs/heads/main").as_deref(),
        Some(commit.as_str())
    );

    // Work based on `feature` changing a.txt otherwise: its merge conflicts, is declined,
    // claims nothing, and main stays.
    let clash = completed_with(&w, &lane, Some("feature"), &[("a.txt", "one\nclash\n")]);
    let out = hand_on_stored(&w, &clash, "merge", Some("main"));
    assert_eq!(out["state"], "DECLINED", "{out}");
    assert!(
        out["detail"]
            .as_str()
            .unwrap()
            .contains("conflicts in: a.txt"),
        "{out}"
    );
    assert!(out["old_id"].is_null(), "{out}");
    assert_eq!(
        remote.at("refs/heads/main").as_deref(),
        Some(commit.as_str())
    );

    // Work based on `feature` adding a file: a merge commit of main and the checkpoint.
    let side = completed_with(&w, &lane, Some("feature"), &[("c.txt", "side\n")]);
    let (side_commit, _) = final_commit(&w, &side);
    let out = hand_on_stored(&w, &side, "merge", Some("main"));
    assert_eq!(out["state"], "COMPLETED", "{out}");
    let merged = remote.at("refs/heads/main").unwrap();
    assert_eq!(out["new_id"], merged.as_str(), "{out}");
    assert_eq!(remote.git(&["rev-parse", &format!("{merged}^1")]), commit);
    assert_eq!(
        remote.git(&["rev-parse", &format!("{merged}^2")]),
        side_commit
    );
    assert_eq!(remote.git(&["show", &format!("{merged}:c.txt")]), "side");
    assert_eq!(
        remote.git(&["show", &format!("{merged}:untracked.txt")]),
        "never committed"
    );

    // The host's reads of the checkpoints it handed on are recorded as such.
    let reads: i64 = sql_one(
        &w,
        "SELECT count(*) FROM checkpoint_restores WHERE purpose = 'workspace-effect' AND assignment_id = $1",
        &[&side],
    );
    assert!(reads >= 1, "the store read is recorded");

    // A host whose push executor does not have the repository: declined, nothing claimed.
    let w2_repo = Repo::new();
    let missing = std::env::temp_dir().join(format!(
        "mosaic-missing-remote-{}.git",
        uuid::Uuid::new_v4().simple()
    ));
    let w2 = World::started(Spec {
        lanes: 1,
        tag: "workspaces-hand-on-none",
        supervisor_extra: format!("[repositories.gone]\nurl = {missing:?}\n"),
        ..Spec::default()
    });
    let lane2 = w2.lane_of(0, "lane-1");
    let host2 = lane2.split_once(':').unwrap().0.to_string();
    add_repo(&w2, "demo", &w2_repo.0, &host2);
    let lone = completed_with(&w2, &lane2, None, &[("x.txt", "x\n")]);
    let out = hand_on_stored(&w2, &lone, "push", None);
    assert_eq!(out["state"], "DECLINED", "{out}");
    assert!(
        out["detail"]
            .as_str()
            .unwrap()
            .contains("no repository \"demo\" is configured"),
        "{out}"
    );
    // A remote that cannot be read: declined, and what git said about it (its location)
    // is nowhere in the record.
    add_repo(&w2, "gone", &w2_repo.0, &host2);
    let a = assign_in(&w2, &lane2, "hang", Some("gone"), None, None).unwrap();
    let gone = a["assignment_id"].as_str().unwrap().to_string();
    assert_eq!(complete(&w2, &gone)["state"], "COMPLETED");
    let out = hand_on_stored(&w2, &gone, "push", None);
    assert_eq!(out["state"], "DECLINED", "{out}");
    let detail = out["detail"].as_str().unwrap();
    assert!(detail.contains("the remote could not be read"), "{out}");
    let name = missing.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        !out.to_string().contains(&name),
        "the remote's location leaked: {out}"
    );
    // Without --into, work based on HEAD names no branch to merge into.
    let e = hand_on(&w2, &lone, "merge", None).expect_err("no branch named");
    assert!(e.message.contains("--into"), "{e:?}");
    // Work without a workspace has no branch at all.
    let plain = assign_in(&w2, &lane2, "hang", None, None, None).unwrap();
    let plain = plain["assignment_id"].as_str().unwrap().to_string();
    assert_eq!(complete(&w2, &plain)["state"], "COMPLETED");
    let e = hand_on(&w2, &plain, "push", None).expect_err("no workspace");
    assert!(e.message.contains("has no workspace"), "{e:?}");
}

/// The recorded effect `id` of `asg` (`mosaic workspace effects`), once `ready` holds.
fn effect_row(w: &World, asg: &str, id: &str, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    wait_until(what, || {
        let v = w
            .op(&OperatorRequest::WorkspaceEffects {
                assignment_id: Some(asg.to_string()),
            })
            .ok()?;
        let row = v.as_array()?.iter().find(|r| r["effect_id"] == id)?.clone();
        ready(&row).then_some(row)
    })
}

/// Completed work in `demo` whose host pushes to a remote of its own, with the supervisor
/// restarted holding its push executor at failpoint `point` until `file` exists; the push
/// requested (not waited for) once the final checkpoint is stored. The repository, the
/// remote, the world, the work, its final commit and the effect.
fn push_held(
    tag: &'static str,
    point: &str,
    file: &Path,
) -> (Repo, Remote, World, String, String, String, String) {
    let repo = Repo::new();
    let remote = Remote::of(&repo);
    let mut w = World::started(Spec {
        lanes: 1,
        tag,
        supervisor_extra: format!("[repositories.demo]\nurl = {:?}\n", remote.0),
        ..Spec::default()
    });
    let lane = w.lane_of(0, "lane-1");
    let host = lane.split_once(':').unwrap().0.to_string();
    add_repo(&w, "demo", &repo.0, &host);
    let asg = completed_with(&w, &lane, None, &[("done.txt", "done\n")]);
    let (commit, _) = final_commit(&w, &asg);
    restart_holding(&mut w, &host, point, file);
    let v = wait_until("the final checkpoint in the store", || {
        match w.op(&OperatorRequest::WorkspaceEffect {
            assignment_id: asg.clone(),
            kind: "push".into(),
            into: None,
            host_id: None,
            wait: false,
            request_id: None,
        }) {
            Err(e) if e.message.contains("not whole in the coordinator's store") => None,
            other => Some(other.unwrap()),
        }
    });
    let id = v["effect_id"].as_str().unwrap().to_string();
    (repo, remote, w, host, asg, commit, id)
}

/// What a host observed of its push is kept until the coordinator recorded it: pushed,
/// then the coordinator SIGKILLed before the report, the observation waits on the host's
/// disk and is recorded once a coordinator leads again (COMPLETED, or — when the host's
/// new session came after the admission's window — UNKNOWN reconciled by that late
/// observation); never re-pushed, never lost, never guessed.
#[test]
fn a_push_observed_while_the_coordinator_is_down_is_recorded_when_it_returns() {
    let go =
        Removed(std::env::temp_dir().join(format!("mosaic-go-{}", uuid::Uuid::new_v4().simple())));
    let (_repo, remote, mut w, _host, asg, commit, id) =
        push_held("workspaces-hand-on-fault", "workspace-effect:settle", &go.0);
    let branch = format!("refs/heads/mosaic/{asg}");
    wait_until("pushed", || {
        (remote.at(&branch).as_deref() == Some(commit.as_str())).then_some(())
    });
    let kept = w
        .state_dir(0)
        .join("push")
        .join("settle")
        .join(format!("{id}.json"));
    wait_until("the observation kept", || kept.exists().then_some(()));
    let text = std::fs::read_to_string(&kept).unwrap();
    assert!(text.contains("\"completed\""), "{text}");
    assert!(
        !text.contains(&*remote.0.to_string_lossy()),
        "no URL: {text}"
    );
    w.crash_coordinator(0);
    std::fs::write(&go.0, "").unwrap();
    w.start_coordinator(0, None);
    w.wait_leading(0);
    let row = effect_row(&w, &asg, &id, "the observation recorded", |r| {
        r["state"] == "COMPLETED" || r["state"] == "RECONCILED"
    });
    if row["state"] == "RECONCILED" {
        assert_eq!(row["reconciliation"], "observed-late: completed", "{row}");
    }
    assert_eq!(row["new_id"], commit.as_str(), "{row}");
    assert!(
        row["result_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"),
        "{row}"
    );
    wait_until("the kept observation gone", || {
        (!kept.exists()).then_some(())
    });
    assert_eq!(remote.at(&branch).as_deref(), Some(commit.as_str()));
}

/// A supervisor SIGKILLed between a push's admission and its push (the exact update on its
/// disk, nothing sent): the next one settles it by what the remote shows — not at the new
/// id, so UNKNOWN (a git the dead one began could still land), never "not pushed" and never
/// pushed again by itself; the operator resolves it with evidence, and the next push of the
/// work goes through.
#[test]
fn a_push_whose_supervisor_died_mid_way_is_unknown_until_resolved() {
    let never = Removed(
        std::env::temp_dir().join(format!("mosaic-never-{}", uuid::Uuid::new_v4().simple())),
    );
    let (_repo, remote, mut w, host, asg, commit, id) = push_held(
        "workspaces-hand-on-died",
        "workspace-effect:pre-push",
        &never.0,
    );
    let push = |w: &World| {
        w.op(&OperatorRequest::WorkspaceEffect {
            assignment_id: asg.clone(),
            kind: "push".into(),
            into: None,
            host_id: None,
            wait: false,
            request_id: None,
        })
    };
    let intent = w
        .state_dir(0)
        .join("push")
        .join("settle")
        .join(format!("{id}.intent.json"));
    wait_until("the intent kept", || intent.exists().then_some(()));
    w.crash_supervisor(0);
    wait_until("the old session gone", || {
        (!connected(&w, &host)?).then_some(())
    });
    w.start_supervisor(0);
    wait_connected(&w, &host);
    let row = effect_row(&w, &asg, &id, "settled by what the remote shows", |r| {
        r["state"] == "UNKNOWN"
    });
    assert!(
        row["detail"]
            .as_str()
            .unwrap()
            .contains("died while pushing")
            || row["detail"].as_str().unwrap().contains("no report"),
        "{row}"
    );
    let branch = format!("refs/heads/mosaic/{asg}");
    assert_eq!(remote.at(&branch), None, "nothing was pushed");
    wait_until("the kept intent gone", || (!intent.exists()).then_some(()));
    // Open until resolved: no other push of the work.
    let e = push(&w).expect_err("one open");
    assert!(e.message.contains("still open (UNKNOWN)"), "{e:?}");
    let r = w
        .op(&OperatorRequest::WorkspaceResolve {
            effect_id: id.clone(),
            applied: false,
            evidence_digest: format!("sha256:{}", "4".repeat(64)),
            request_id: None,
        })
        .unwrap();
    assert_eq!(r["state"], "RECONCILED", "{r}");
    let out = hand_on(&w, &asg, "push", None).unwrap();
    assert_eq!(out["state"], "COMPLETED", "{out}");
    assert_eq!(remote.at(&branch).as_deref(), Some(commit.as_str()));
}
