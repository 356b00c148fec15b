//! The conformance suite of each registered runtime. Its output is that runtime's evidence
//! file, committed beside the registry entry (`registry/<runtime>.evidence.json`), whose
//! SHA-256 the entry carries as `adversarial_evidence_digest` and the registry checks at
//! load. Every fact in it is observed here, on real processes, tmux and cgroups — and only
//! facts that do not vary between runs (no pids, no times), so the same behaviour always
//! yields the same file.
//!
//! Normally the suite compares what it observes with the committed file and fails on any
//! difference (the evidence no longer describes the runtime). `scripts/evidence` runs it
//! with `MOSAIC_WRITE_EVIDENCE=1`, which rewrites the evidence file and the entry's digest.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use mosaic::supervisor::control::Request;
use serde_json::{json, Value};

fn registry_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("registry")
}

/// Stops `lane`'s generation and returns its receipt.
fn stop(h: &Host, lane: &str) -> Value {
    h.call(&Request::Stop { lane: lane.into() })
}

fn outcome(r: &Value) -> Value {
    json!({
        "termination_reason": r["termination_reason"],
        "observation_source": r["observation_source"],
        "forced": r["stop"]["forced"],
        "verified_empty": r["cleanup"]["verified_empty"],
        "cgroup_removed": r["cleanup"]["cgroup_removed"],
        "unfinished": r["unfinished_status"],
    })
}

/// Every member of a generation's tree, then whether any survived its end.
fn survivors(before: &[(i32, u64)]) -> usize {
    before.iter().filter(|(p, st)| !is_dead(*p, *st)).count()
}

fn tree(h: &Host, lane: &str, directives: &str, n: usize) -> (Value, Vec<(i32, u64)>) {
    let g = h.start(lane, directives);
    let cg = cgroup_abs(h, g["process_identity"]["cgroup_path"].as_str().unwrap());
    let before = wait_until("the whole tree in its cgroup", || {
        let m = members(&cg);
        (m.len() >= n + 2).then_some(m)
    });
    (g, before)
}

fn fake_suite() -> Value {
    let mut checks: BTreeMap<&str, Value> = BTreeMap::new();
    let bin_dir = Path::new(MOSAIC).parent().unwrap().to_path_buf();
    let reg =
        mosaic::adapter::Registry::load_dir(&registry_dir()).expect("the committed registry loads");
    let rref = mosaic::adapter::RuntimeRef::parse("fake@1.0.0").unwrap();
    let entry = reg.resolve(&rref).unwrap();

    // The version probe, on the real binary and on one swapped in place.
    let paths = |bin_dir: &Path| mosaic::adapter::Paths {
        bin_dir: bin_dir.to_path_buf(),
        harness_root: PathBuf::from("/nonexistent"),
    };
    mosaic::adapter::probe_version(entry, &rref, &paths(&bin_dir))
        .expect("the real binary passes its probe");
    checks.insert("version_probe", json!("fake 1.0.0 accepted"));
    let swapped =
        std::env::temp_dir().join(format!("mosaic-swapped-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&swapped).unwrap();
    let fake = swapped.join("mosaic-fake-harness");
    std::fs::write(&fake, "#!/bin/sh\necho 'fake 9.9.9'\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let refused = mosaic::adapter::probe_version(entry, &rref, &paths(&swapped)).is_err();
    let _ = std::fs::remove_dir_all(&swapped);
    checks.insert(
        "swapped_binary",
        json!(if refused { "refused" } else { "ACCEPTED" }),
    );

    let h = Host::new();
    h.create_lane("c1");
    let refusal = |runtime: &str, d: &str| {
        h.refused(&Request::Start {
            lane: "c1".into(),
            runtime: runtime.into(),
            directives: vec![d.into()],
        })
        .0
    };
    checks.insert("unvalidated_version", json!(refusal("fake@1.0.1", "hang")));
    checks.insert("unknown_runtime", json!(refusal("other@1.0.0", "hang")));
    checks.insert(
        "unknown_directive",
        json!(refusal("fake@1.0.0", "frobnicate")),
    );

    // Fresh process per generation: nothing of an identity is reused.
    let g1 = h.start("c1", "hang");
    let g2 = h.start("c1", "hang");
    let fresh = [
        "cgroup_path",
        "cgroup_id",
        "root_pid",
        "launch_nonce_digest",
        "harness_pid",
    ]
    .iter()
    .all(|f| g1["process_identity"][f] != g2["process_identity"][f]);
    checks.insert(
        "fresh_generation_identity",
        json!(if fresh { "all distinct" } else { "REUSED" }),
    );
    checks.insert("replaced_generation", outcome(&h.wait_receipt("c1", 1)));
    stop(&h, "c1");

    // Graceful stop of a tree (plain, setsid'd, double-forked, own process group).
    let (_, before) = tree(&h, "c1", "spawn=8", 8);
    let r = stop(&h, "c1");
    checks.insert(
        "graceful_stop",
        json!({ "receipt": outcome(&r), "survivors": survivors(&before) }),
    );
    // A harness and tree that ignore SIGTERM: forced after the grace period.
    let (_, before) = tree(&h, "c1", "ignore-term spawn=4", 4);
    let r = stop(&h, "c1");
    checks.insert(
        "ignore_term_stop",
        json!({ "receipt": outcome(&r), "survivors": survivors(&before) }),
    );
    // SIGKILL of the harness: seen by the shim; the tree is killed with it.
    let (g, before) = tree(&h, "c1", "spawn=4", 4);
    kill(
        g["process_identity"]["harness_pid"].as_i64().unwrap() as i32,
        nix::sys::signal::Signal::SIGKILL,
    );
    let r = h.wait_receipt("c1", g["generation"].as_u64().unwrap());
    wait_until("tree gone", || (survivors(&before) == 0).then_some(()));
    checks.insert(
        "sigkill",
        json!({ "receipt": outcome(&r), "survivors": survivors(&before) }),
    );
    // Crash and exits.
    for (name, d) in [
        ("crash", "crash-after=0.1"),
        ("exit_nonzero", "exit=3"),
        ("exit_zero", "exit=0"),
    ] {
        let g = h.start("c1", d);
        let r = h.wait_receipt("c1", g["generation"].as_u64().unwrap());
        checks.insert(
            name,
            json!({ "receipt": outcome(&r), "exit_code": r["exit_code"], "signal": r["signal"] }),
        );
    }
    // A supervisor restart re-adopts the live generation by its identity, never by pid.
    let mut h = h;
    let g = h.start("c1", "hang");
    h.crash_supervisor();
    h.start_supervisor();
    let after = h.lane_status("c1")["generation"].clone();
    let same = after["process_identity"] == g["process_identity"];
    checks.insert(
        "restart_readoption",
        json!(if same {
            "re-adopted, same identity"
        } else {
            "LOST"
        }),
    );
    stop(&h, "c1");

    json!({
        "suite": "mosaic-conformance/v1",
        "runtime": "fake",
        "validated_versions": ["1.0.0"],
        "checks": checks,
    })
}

#[test]
fn fake_conformance_matches_its_committed_evidence() {
    require_host();
    let evidence = fake_suite();
    let text = format!("{}\n", serde_json::to_string_pretty(&evidence).unwrap());
    let path = registry_dir().join("fake.evidence.json");
    let digest = format!("sha256:{}", {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(text.as_bytes()))
    });
    if std::env::var_os("MOSAIC_WRITE_EVIDENCE").is_some() {
        std::fs::write(&path, &text).unwrap();
        let toml_path = registry_dir().join("fake.toml");
        let toml = std::fs::read_to_string(&toml_path).unwrap();
        let updated: Vec<String> = toml
            .lines()
            .map(|l| {
                if l.starts_with("adversarial_evidence_digest = ") {
                    format!("adversarial_evidence_digest = \"{digest}\"")
                } else {
                    l.to_string()
                }
            })
            .collect();
        std::fs::write(&toml_path, updated.join("\n") + "\n").unwrap();
        eprintln!("wrote {} ({digest})", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        committed, text,
        "the fake runtime no longer behaves as its committed evidence says; if the change is intended, run scripts/evidence and commit"
    );
    // No check may show a failure, whatever the file says.
    let flat = evidence.to_string();
    for bad in ["ACCEPTED", "REUSED", "LOST"] {
        assert!(!flat.contains(bad), "conformance failure: {bad} in {flat}");
    }
    assert!(
        evidence["checks"]
            .as_object()
            .unwrap()
            .values()
            .all(|v| v.get("survivors").is_none_or(|s| s == 0)),
        "{flat}"
    );
}
