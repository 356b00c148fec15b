//! Harness artifacts (spec §11): what a harness kept of its session is captured at its
//! generation's end — SIGKILL included, from the receipt path — encrypted to the
//! coordinator's recovery recipients, named in the receipt, recorded as a PostgreSQL fact
//! and moved to the coordinator's store; only an identity it was encrypted to opens it, a
//! changed byte is refused, every read is recorded (real tmux, cgroups, PostgreSQL, daemons
//! and CLI).

mod common;
mod pg;
mod world;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{cgroup_at, wait_until};
use mosaic::coordinator::service::OperatorRequest;
use serde_json::Value;
use sha2::Digest;
use world::{Spec, World};

fn lifecycle(w: &World, asg: &str) -> Option<String> {
    w.status()["assignments"]
        .as_array()?
        .iter()
        .find(|a| a["assignment_id"] == asg)
        .and_then(|a| a["state"].as_str().map(String::from))
}

/// The artifacts recorded for `asg`, once `n` are and every one is stored.
fn stored_artifacts(w: &World, asg: &str, n: usize) -> Vec<Value> {
    wait_until("the artifacts stored", || {
        let v = w
            .op(&OperatorRequest::Artifacts {
                assignment_id: Some(asg.into()),
            })
            .ok()?;
        let rows = v.as_array()?.clone();
        (rows.len() == n && rows.iter().all(|r| r["stored"] == true)).then_some(rows)
    })
}

fn sql_rows(
    w: &World,
    q: &str,
    p: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Vec<tokio_postgres::Row> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async { w.sql().await.query(q, p).await.unwrap() })
}

/// `mosaic checkpoint artifact` (the real CLI): `(succeeded, its JSON answer)`.
fn recover(w: &World, digest: &str, identity: &Path, out: &Path) -> (bool, Value) {
    let o = Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args(["checkpoint", "artifact", digest, "--json", "--identity"])
        .arg(identity)
        .arg("--out")
        .arg(out)
        .arg("--coordinator-socket")
        .arg(w.socket(0))
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    (o.status.success(), v)
}

/// Assigns lane-1 a harness that prints its transcript, SIGKILLs it once the transcript is
/// written (it prints once active), and waits for the work in recovery.
fn print_then_kill(w: &World) -> String {
    let lane = w.lane_of(0, "lane-1");
    let a = w
        .assign_to(&lane, "print=first-line print=the-secret-word hang", true)
        .unwrap();
    let asg = a["assignment_id"].as_str().unwrap().to_string();
    // Killed once its transcript is written (it prints once active).
    let inc = w.incarnation_of(0, "lane-1");
    let transcript = w.area(0, &inc, 1).join("home/transcript");
    wait_until("the transcript written", || {
        std::fs::read_to_string(&transcript)
            .ok()
            .filter(|t| t.lines().count() == TRANSCRIPT_LINES)
    });
    let cg = cgroup_at(a["process_identity"]["cgroup_path"].as_str().unwrap());
    std::fs::write(cg.join("cgroup.kill"), "1").unwrap();
    wait_until("the work in recovery", || {
        (lifecycle(w, &asg)? == "RECOVERY").then_some(())
    });
    asg
}

/// Lines each test's harness prints (its transcript).
const TRANSCRIPT_LINES: usize = 2;

struct Removed(PathBuf);
impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
}

fn artifact_files(w: &World) -> Vec<String> {
    std::fs::read_dir(w.state_dir(0).join("artifacts"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A generation's transcript, SIGKILLed with it: sealed from the receipt path, named in
/// the receipt, recorded (sensitive, its policy and purpose, encrypted to the configured
/// principal), moved to the store and gone from the host; the stored bytes hash to the
/// recorded digest and hold no plaintext; the world's recovery identity opens exactly
/// what the harness wrote, another identity opens nothing, a flipped byte is refused, an
/// existing destination is refused before anything is read, and every read is recorded.
#[test]
fn a_harness_transcript_survives_sigkill_encrypted_and_only_its_recipient_opens_it() {
    let w = World::started(Spec {
        lanes: 1,
        tag: "artifacts",
        ..Spec::default()
    });
    let asg = print_then_kill(&w);

    let rows = stored_artifacts(&w, &asg, 1);
    let r = &rows[0];
    let digest = r["artifact_digest"].as_str().unwrap().to_string();
    assert_eq!(r["classification"], "sensitive", "{r}");
    assert_eq!(r["purpose"], "operator-recovery", "{r}");
    assert_eq!(r["generation"], 1, "{r}");
    assert_eq!(r["files"], 1, "{r}");
    assert_eq!(r["recipients_match"], true, "{r}");
    assert_eq!(
        r["principals"],
        serde_json::json!(["operator:local"]),
        "{r}"
    );
    assert_eq!(
        r["retention_policy_digest"],
        mosaic::protocol::artifact::retention_policy_digest()
    );
    // The receipt names it (the host's signed observation), and it is that generation's.
    let named: Vec<String> = sql_rows(
        &w,
        "SELECT body->'harness_artifact'->>'digest' FROM termination_receipts WHERE assignment_id = $1",
        &[&asg],
    )
    .iter()
    .map(|row| row.get(0))
    .collect();
    assert_eq!(named, vec![digest.clone()]);
    // The store's bytes are the digest's, and encrypted.
    let parts = sql_rows(
        &w,
        "SELECT data FROM checkpoint_object_parts WHERE object_digest = $1 ORDER BY part",
        &[&digest],
    );
    let bytes: Vec<u8> = parts.iter().flat_map(|p| p.get::<_, Vec<u8>>(0)).collect();
    assert_eq!(
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes))),
        digest
    );
    assert!(bytes.starts_with(b"age-encryption.org/v1"));
    assert!(
        !bytes.windows(15).any(|x| x == b"the-secret-word"),
        "the transcript is stored in the clear"
    );
    // The host's copy went once the store held it.
    wait_until("the host's copy removed", || {
        artifact_files(&w).is_empty().then_some(())
    });

    // The recipient's identity opens exactly what the harness wrote.
    let out = w.dir.join("recovered");
    let _clean = Removed(out.clone());
    let (ok, v) = recover(&w, &digest, &w.recovery_identity(), &out);
    assert!(ok, "{v}");
    assert_eq!(v["files"], serde_json::json!(["home/transcript"]), "{v}");
    assert_eq!(
        std::fs::read_to_string(out.join("home/transcript")).unwrap(),
        "first-line\nthe-secret-word\n"
    );
    // Into a destination that exists: refused before anything is read.
    let reads = |w: &World| -> i64 {
        sql_rows(
            w,
            "SELECT count(*) FROM checkpoint_reads WHERE what = 'artifact-read' AND checkpoint_digest = $1 AND assignment_id = $2",
            &[&digest, &asg],
        )[0]
        .get(0)
    };
    let read_once = reads(&w);
    assert!(read_once >= 1);
    let (ok, v) = recover(&w, &digest, &w.recovery_identity(), &out);
    assert!(
        !ok && v["error"]["message"].as_str().unwrap().contains("exists"),
        "{v}"
    );
    assert_eq!(reads(&w), read_once);
    // Another principal's identity: nothing opens, nothing is left behind.
    let other = w.dir.join("other-identity.txt");
    let made = Command::new(env!("CARGO_BIN_EXE_mosaic"))
        .args(["pki", "recovery-key", "--out"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(made.status.success());
    let other_out = w.dir.join("other-recovered");
    let (ok, v) = recover(&w, &digest, &other, &other_out);
    assert!(
        !ok && v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cannot decrypt"),
        "{v}"
    );
    assert!(!other_out.exists());
    // A byte of the store flipped: refused as corrupt (and audited); nothing unpacked.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        w.sql()
            .await
            .execute(
                "UPDATE checkpoint_object_parts SET data = overlay(data placing '\\x00'::bytea from 40 for 1) \
                 WHERE object_digest = $1 AND part = 0",
                &[&digest],
            )
            .await
            .unwrap();
    });
    let corrupt_out = w.dir.join("corrupt-recovered");
    let (ok, v) = recover(&w, &digest, &w.recovery_identity(), &corrupt_out);
    assert!(
        !ok && v["error"]["message"].as_str().unwrap().contains("corrupt"),
        "{v}"
    );
    assert!(!corrupt_out.exists());
    assert!(w.audited("does not hash to its address") >= 1);
    // No host is ever served an artifact: it is no checkpoint object to restore.
    let served: i64 = sql_rows(
        &w,
        "SELECT count(*) FROM checkpoint_restores WHERE object_digest = $1",
        &[&digest],
    )[0]
    .get(0);
    assert_eq!(served, 0);

    // Deleted only as done work's, with a receipt; then nothing of it can be read.
    let delete = |w: &World| {
        w.op(&OperatorRequest::CheckpointDelete {
            checkpoint_digest: digest.clone(),
            request_id: None,
        })
    };
    let e = delete(&w).unwrap_err();
    assert_eq!(
        e.category,
        mosaic::coordinator::Category::WrongState,
        "{e:?}"
    );
    let stopped = w
        .op(&OperatorRequest::Stop {
            assignment_id: asg.clone(),
            outcome: None,
            evidence_digest: None,
            wait: true,
            request_id: None,
        })
        .unwrap();
    assert_eq!(stopped["state"], "CANCELLED", "{stopped}");
    // Its policy keeps it until removed: a gc leaves it.
    let gc = w
        .op(&OperatorRequest::CheckpointGc {
            dry_run: false,
            request_id: None,
        })
        .unwrap();
    assert_eq!(gc["deleted"], serde_json::json!([]), "{gc}");
    let gone = delete(&w).unwrap();
    let receipt = &gone["deleted"][0];
    assert_eq!(
        receipt["objects_deleted"],
        serde_json::json!([digest]),
        "{gone}"
    );
    let rows = sql_rows(
        &w,
        "SELECT purpose, reason, receipt_digest FROM checkpoint_deletions WHERE checkpoint_digest = $1",
        &[&digest],
    );
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, String>(0), "operator-recovery");
    assert_eq!(
        rows[0].get::<_, String>(2),
        receipt["receipt_digest"].as_str().unwrap()
    );
    let left: i64 = sql_rows(
        &w,
        "SELECT (SELECT count(*) FROM harness_artifacts WHERE artifact_digest = $1) \
              + (SELECT count(*) FROM checkpoint_objects WHERE object_digest = $1)",
        &[&digest],
    )[0]
    .get(0);
    assert_eq!(left, 0);
    let e = w
        .op(&OperatorRequest::ArtifactRead {
            artifact_digest: digest.clone(),
            offset: 0,
        })
        .unwrap_err();
    assert_eq!(e.category, mosaic::coordinator::Category::NotFound, "{e:?}");
}

/// Without recovery recipients nothing is captured: a transcript is never kept in the
/// clear, on the host or in the store.
#[test]
fn without_recovery_recipients_no_transcript_is_kept() {
    let w = World::started(Spec {
        lanes: 1,
        tag: "artifacts-none",
        recovery: false,
        ..Spec::default()
    });
    let asg = print_then_kill(&w);
    let receipts: Vec<Value> = sql_rows(
        &w,
        "SELECT body FROM termination_receipts WHERE assignment_id = $1",
        &[&asg],
    )
    .iter()
    .map(|r| r.get(0))
    .collect();
    assert_eq!(receipts.len(), 1);
    assert!(
        receipts[0].get("harness_artifact").is_none(),
        "{}",
        receipts[0]
    );
    let rows = w
        .op(&OperatorRequest::Artifacts {
            assignment_id: Some(asg.clone()),
        })
        .unwrap();
    assert_eq!(rows, serde_json::json!([]));
    assert!(artifact_files(&w).is_empty(), "{:?}", artifact_files(&w));
}

/// Each generation keeps its own artifact: two generations of one lane (the second a
/// resume) whose artifacts the store refuses (larger than its limit) each stay on the
/// host, marked refused, each its own bytes under its own name — the first is not
/// overwritten by the second — each recorded with the store's reason, and each opens to
/// exactly what its own generation printed.
#[test]
fn each_generation_keeps_its_own_artifact_when_the_store_refuses_them() {
    let w = World::started(Spec {
        lanes: 1,
        tag: "artifacts-refused",
        coordinator_extra: "checkpoint_store_max_bytes = 64\n".into(),
        ..Spec::default()
    });
    let asg = print_then_kill(&w);
    let lane = w.lane_of(0, "lane-1");
    let mut r = world::assign_request(
        &lane,
        "print=second-gen print=its-own-words hang",
        Some(&asg),
        true,
    );
    if let OperatorRequest::Assign { replace_task, .. } = &mut r {
        *replace_task = true;
    }
    let b = w.op(&r).unwrap();
    let inc = w.incarnation_of(0, "lane-1");
    let gen2 = b["generation"].as_u64().unwrap();
    assert_eq!(gen2, 2, "{b}");
    let transcript = w.area(0, &inc, gen2).join("home/transcript");
    wait_until("the second transcript written", || {
        std::fs::read_to_string(&transcript)
            .ok()
            .filter(|t| t.lines().count() == TRANSCRIPT_LINES)
    });
    let cg = cgroup_at(b["process_identity"]["cgroup_path"].as_str().unwrap());
    std::fs::write(cg.join("cgroup.kill"), "1").unwrap();
    let rows = wait_until("both artifacts refused by the store", || {
        let v = w
            .op(&OperatorRequest::Artifacts {
                assignment_id: Some(asg.clone()),
            })
            .ok()?;
        let rows = v.as_array()?.clone();
        (rows.len() == 2 && rows.iter().all(|r| r["transfer_error"].is_string())).then_some(rows)
    });
    let dir = w.state_dir(0).join("artifacts");
    wait_until("both marked refused on the host", || {
        (artifact_files(&w)
            .iter()
            .filter(|f| f.ends_with(".refused"))
            .count()
            == 2)
            .then_some(())
    });
    let identity = mosaic::artifact_recovery::read_identity(&w.recovery_identity()).unwrap();
    for (r, words) in rows.iter().zip([
        "first-line\nthe-secret-word\n",
        "second-gen\nits-own-words\n",
    ]) {
        assert!(
            r["transfer_error"]
                .as_str()
                .unwrap()
                .contains("larger than the store takes"),
            "{r}"
        );
        assert_eq!(r["stored"], false);
        let g = r["generation"].as_u64().unwrap();
        let sealed = std::fs::read(dir.join(format!("{inc}.gen-{g}.age"))).unwrap();
        assert_eq!(
            format!("sha256:{}", hex::encode(sha2::Sha256::digest(&sealed))),
            r["artifact_digest"].as_str().unwrap()
        );
        let out = w.dir.join(format!("opened-{g}"));
        let _clean = Removed(out.clone());
        mosaic::artifact_recovery::open_artifact(&sealed, &identity, &out).unwrap();
        assert_eq!(
            std::fs::read_to_string(out.join("home/transcript")).unwrap(),
            words
        );
    }
    assert_ne!(rows[0]["artifact_digest"], rows[1]["artifact_digest"]);
}

/// Artifacts go by a retention policy of their own (`artifact_retention_s`, the `sensitive`
/// classification's, its digest recorded on each): `checkpoint gc` leaves one of work that
/// is not done, and deletes it once its work has been done that long (database time), with
/// a deletion receipt of reason `retention`; record and store object go together.
#[test]
fn artifacts_of_done_work_go_by_their_own_policy_with_a_receipt() {
    use mosaic::coordinator::retention::{Classification, RetentionPolicy};
    let w = World::started(Spec {
        lanes: 1,
        tag: "artifacts-retention",
        coordinator_extra: "artifact_retention_s = 1\n".into(),
        ..Spec::default()
    });
    let asg = print_then_kill(&w);
    let rows = stored_artifacts(&w, &asg, 1);
    let digest = rows[0]["artifact_digest"].as_str().unwrap().to_string();
    let policy = RetentionPolicy::configured_for(Classification::Sensitive, Some(1)).unwrap();
    assert_eq!(
        rows[0]["retention_policy_digest"],
        policy.digest().as_str(),
        "{}",
        rows[0]
    );
    let gc = || {
        w.op(&OperatorRequest::CheckpointGc {
            dry_run: false,
            request_id: None,
        })
        .unwrap()
    };
    // Work in recovery is not done: kept, whatever its policy.
    let out = gc();
    assert_eq!(out["deleted"], serde_json::json!([]), "{out}");
    assert_eq!(stored_artifacts(&w, &asg, 1).len(), 1);
    let stopped = w
        .op(&OperatorRequest::Stop {
            assignment_id: asg.clone(),
            outcome: None,
            evidence_digest: None,
            wait: true,
            request_id: None,
        })
        .unwrap();
    assert_eq!(stopped["state"], "CANCELLED", "{stopped}");
    let deleted = wait_until("the policy's time passed", || {
        let out = gc();
        let d = out["deleted"].as_array()?.clone();
        (!d.is_empty()).then_some(d)
    });
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    assert_eq!(deleted[0]["reason"], "retention", "{deleted:?}");
    assert_eq!(deleted[0]["objects_deleted"], serde_json::json!([digest]));
    let rows = sql_rows(
        &w,
        "SELECT reason, purpose, retention_policy_digest FROM checkpoint_deletions WHERE checkpoint_digest = $1",
        &[&digest],
    );
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, String>(0), "retention");
    assert_eq!(rows[0].get::<_, String>(1), "operator-recovery");
    assert_eq!(rows[0].get::<_, String>(2), policy.digest());
    let left: i64 = sql_rows(
        &w,
        "SELECT (SELECT count(*) FROM harness_artifacts WHERE artifact_digest = $1) \
              + (SELECT count(*) FROM checkpoint_objects WHERE object_digest = $1)",
        &[&digest],
    )[0]
    .get(0);
    assert_eq!(left, 0);
}
