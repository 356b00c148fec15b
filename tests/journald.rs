//! Structured log fields: every lifecycle event carries LANE_ID, GENERATION, RECEIPT_KEY,
//! REASON (and ASSIGNMENT_ID where there is one) — checked on the stderr path, and on a
//! real journald: this machine's `systemd-journald`, run privately in a mount namespace of
//! its own (the test needs root and `unshare`; it fails with the reason otherwise).

mod common;

use std::process::Command;

use serde_json::Value;

/// The supervisor's configuration for one lane under `dir`.
fn config(dir: &std::path::Path, cgroup_root: &std::path::Path) -> std::path::PathBuf {
    let c = dir.join("supervisor.toml");
    std::fs::write(
        &c,
        format!(
            "host_id = \"jd\"\nstate_dir = {:?}\nruntime_dir = {:?}\ncgroup_root = {cgroup_root:?}\nbin_dir = {:?}\nlanes = [\"lane-1\"]\n",
            dir.join("state"),
            dir.join("run"),
            std::path::Path::new(common::MOSAIC).parent().unwrap()
        ),
    )
    .unwrap();
    c
}

struct Dir {
    dir: std::path::PathBuf,
    cgroup_root: std::path::PathBuf,
}

impl Drop for Dir {
    fn drop(&mut self) {
        common::teardown(
            &self.dir,
            &self.dir.join("run/lanes"),
            &self.cgroup_root,
            &[],
        );
    }
}

fn dir() -> Dir {
    common::require_host();
    let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let dir = std::env::temp_dir().join(format!("mosaic-jd-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let cgroup_root = mosaic::cgroup::discover_mount()
        .unwrap()
        .path
        .join(format!("mosaic-test-{id}"));
    Dir { dir, cgroup_root }
}

/// A shell script that starts the supervisor, runs one generation to its end, and stops.
fn script(cfg: &std::path::Path) -> String {
    let m = common::MOSAIC;
    format!(
        "{m} supervisor --config {cfg} & S=$!\n\
         for i in $(seq 200); do {m} host --config {cfg} status >/dev/null 2>&1 && break; sleep 0.05; done\n\
         {m} host --config {cfg} start --lane lane-1 --runtime fake@1.0.0 exit=3 >/dev/null\n\
         for i in $(seq 200); do {m} host --config {cfg} receipts | grep -q tr- && break; sleep 0.05; done\n\
         kill -TERM $S; wait $S\n",
        cfg = cfg.display()
    )
}

#[test]
fn lifecycle_events_carry_their_fields_on_stderr() {
    let d = dir();
    let cfg = config(&d.dir, &d.cgroup_root);
    let out = Command::new("sh")
        .arg("-c")
        .arg(script(&cfg))
        .env("MOSAIC_LOG", "info")
        .env_remove("INVOCATION_ID")
        .env_remove("JOURNAL_STREAM")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.contains("termination receipt durable"))
        .unwrap_or_else(|| panic!("no receipt event:\n{err}"));
    for field in [
        "lane_id=jd:lane-1",
        "generation=1",
        "receipt_key=tr-",
        "reason=",
    ] {
        assert!(line.contains(field), "{field} missing from: {line}");
    }
}

#[test]
fn lifecycle_events_carry_their_fields_in_a_real_journal() {
    let d = dir();
    assert!(
        std::path::Path::new("/lib/systemd/systemd-journald").exists()
            || std::path::Path::new("/usr/lib/systemd/systemd-journald").exists(),
        "this test needs systemd-journald (apt-get install systemd)"
    );
    let jd = if std::path::Path::new("/lib/systemd/systemd-journald").exists() {
        "/lib/systemd/systemd-journald"
    } else {
        "/usr/lib/systemd/systemd-journald"
    };
    let cfg = config(&d.dir, &d.cgroup_root);
    let json = d.dir.join("journal.json");
    // A private journald: its sockets and journal on tmpfs in this namespace only.
    let inner = format!(
        "set -e\nmount -t tmpfs tmpfs /run/systemd/journal\nmount -t tmpfs tmpfs /run/log/journal\n\
         {jd} & J=$!\nfor i in $(seq 100); do [ -S /run/systemd/journal/socket ] && break; sleep 0.05; done\n\
         export INVOCATION_ID=mosaic-test\n{}\nsleep 0.5\n\
         journalctl -D /run/log/journal -o json --no-pager SYSLOG_IDENTIFIER=mosaic > {}\nkill $J\n",
        script(&cfg),
        json.display()
    );
    // The mount points must exist; the ones this test makes are removed afterwards (the
    // mounts themselves never leave the private namespace).
    let made: Vec<&str> = [
        "/run/systemd",
        "/run/systemd/journal",
        "/run/log",
        "/run/log/journal",
    ]
    .into_iter()
    .filter(|p| !std::path::Path::new(p).exists())
    .collect();
    std::fs::create_dir_all("/run/systemd/journal").unwrap();
    std::fs::create_dir_all("/run/log/journal").unwrap();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &inner])
        .env("MOSAIC_LOG", "info")
        .output();
    for p in made.iter().rev() {
        let _ = std::fs::remove_dir(p);
    }
    let out = out.expect("this test needs unshare (util-linux)");
    assert!(
        out.status.success(),
        "the private journal run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let entries: Vec<Value> = std::fs::read_to_string(&json)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let receipt = entries
        .iter()
        .find(|e| e["MESSAGE"] == "termination receipt durable")
        .unwrap_or_else(|| panic!("no receipt event among {} journal entries", entries.len()));
    assert_eq!(receipt["LANE_ID"], "jd:lane-1", "{receipt}");
    assert_eq!(receipt["GENERATION"], "1", "{receipt}");
    assert!(
        receipt["RECEIPT_KEY"]
            .as_str()
            .unwrap_or("")
            .starts_with("tr-"),
        "{receipt}"
    );
    assert!(receipt["REASON"].as_str().is_some(), "{receipt}");
    assert_eq!(receipt["SYSLOG_IDENTIFIER"], "mosaic");
    assert!(entries
        .iter()
        .any(|e| e["MESSAGE"] == "generation live" && e["LANE_ID"] == "jd:lane-1"));
}
