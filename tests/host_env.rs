//! Bad environments fail closed with a clear error: no cgroup v2, a root outside the
//! mount, an unwritable cgroup, a bad config; and `doctor` reports this host.

mod common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use mosaic::cgroup::{CgroupError, CgroupTree, V2Mount};

#[test]
fn no_cgroup_v2_fails_closed() {
    let dir = std::env::temp_dir().join(format!("mosaic-nov2-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = V2Mount {
        path: dir.clone(),
        hybrid: false,
        favordynmods: false,
    };
    let e = CgroupTree::open(&fake, Some(&dir.join("root")), "/", false).unwrap_err();
    assert!(matches!(e, CgroupError::NoV2 { .. }), "{e}");
    assert!(!dir.join("root").exists(), "a refused open created state");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn roots_outside_the_mount_or_undelegated_are_refused() {
    common::require_host();
    let m = mosaic::cgroup::discover_mount().unwrap();
    let e =
        CgroupTree::open(&m, Some(&PathBuf::from("/tmp/not-a-cgroup")), "/", false).unwrap_err();
    assert!(matches!(e, CgroupError::OutsideMount { .. }), "{e}");
    let e = CgroupTree::open(&m, Some(&m.path), "/", false).unwrap_err();
    assert!(
        matches!(e, CgroupError::OutsideMount { .. }),
        "the mount root itself is not delegable: {e}"
    );
    let e = CgroupTree::open(&m, None, "/", false).unwrap_err();
    assert!(matches!(e, CgroupError::RootCgroupNotDelegated), "{e}");
}

/// A cgroup root (not created) and a temp dir for one test, both removed on drop, also
/// when an assertion fails.
struct Scratch {
    root: PathBuf,
    dir: PathBuf,
}

impl Scratch {
    fn new(what: &str) -> Self {
        let m = mosaic::cgroup::discover_mount().unwrap();
        let id = uuid::Uuid::new_v4().simple();
        Self {
            root: m.path.join(format!("mosaic-test-{what}-{id}")),
            dir: std::env::temp_dir().join(format!("mosaic-{what}-{id}")),
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.root);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn an_unwritable_cgroup_fails_closed_with_the_fix() {
    common::require_host();
    let scratch = Scratch::new("ro");
    let (root, dir) = (scratch.root.clone(), scratch.dir.clone());
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    // A world-writable state dir so only the cgroup is the problem.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "host_id = \"ro\"\nstate_dir = {:?}\nruntime_dir = {:?}\ncgroup_root = {root:?}\n",
            dir.join("s"),
            dir.join("r")
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    // The build tree may sit in a directory `nobody` cannot traverse (CI clones into a
    // 0700 temp dir): run a copy of the binary from the world-readable test dir.
    let exe = dir.join("mosaic");
    std::fs::copy(common::MOSAIC, &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Installed as a supervisor is: the shim beside it.
    let shim = dir.join("mosaic-shim");
    std::fs::copy(common::SHIM, &shim).unwrap();
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    // `nobody` cannot write a root-owned cgroup.
    let out = Command::new(&exe)
        .args(["supervisor", "--config"])
        .arg(&cfg)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("not writable") && err.contains("Delegate=yes"),
        "{err}"
    );
    assert!(
        std::fs::read_dir(&root)
            .unwrap()
            .flatten()
            .all(|e| !e.path().is_dir()),
        "a refused start created cgroups"
    );
}

#[test]
fn a_supervisor_without_its_shim_refuses_to_start_and_creates_nothing() {
    common::require_host();
    let scratch = Scratch::new("noshim");
    let (root, dir) = (scratch.root.clone(), scratch.dir.clone());
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let cfg = dir.join("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "host_id = \"noshim\"\nstate_dir = {:?}\nruntime_dir = {:?}\ncgroup_root = {root:?}\nbin_dir = {:?}\n",
            dir.join("s"),
            dir.join("r"),
            dir.join("bin"),
        ),
    )
    .unwrap();
    // `mosaic` installed, its shim not; then the shim present but not executable.
    std::fs::copy(common::MOSAIC, dir.join("bin/mosaic")).unwrap();
    for shim in [None, Some(0o644)] {
        if let Some(mode) = shim {
            use std::os::unix::fs::PermissionsExt;
            let p = dir.join("bin/mosaic-shim");
            std::fs::copy(common::SHIM, &p).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        let mut child = Command::new(dir.join("bin/mosaic"))
            .args(["supervisor", "--config"])
            .arg(&cfg)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A supervisor that starts anyway would serve forever: bounded, then killed.
        let started = std::time::Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > common::PATIENCE {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the supervisor started without its shim");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("mosaic-shim is missing or not executable"),
            "{err}"
        );
        assert!(!root.exists(), "a refused start created its cgroup root");
        assert!(
            !dir.join("s").exists(),
            "a refused start created its state dir"
        );
    }
}

#[test]
fn bad_config_is_refused_with_the_key() {
    let dir = std::env::temp_dir().join(format!("mosaic-cfg-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    for (body, needle) in [
        (
            "state_dir = \"/x\"\nruntime_dir = \"/y\"\nlanes = [\"Bad Lane\"]\n",
            "invalid lane name",
        ),
        (
            "state_dir = \"/x\"\nruntime_dir = \"/y\"\nsurprise = 1\n",
            "surprise",
        ),
        ("state_dir = \"rel\"\nruntime_dir = \"/y\"\n", "absolute"),
        (
            "host_id = \"a:b\"\nstate_dir = \"/x\"\nruntime_dir = \"/y\"\n",
            "invalid host id",
        ),
    ] {
        let cfg = dir.join("c.toml");
        std::fs::write(&cfg, body).unwrap();
        let out = Command::new(common::MOSAIC)
            .args(["supervisor", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(needle),
            "{body}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn doctor_reports_this_host() {
    common::require_host();
    let out = Command::new(common::MOSAIC)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.status.success(), "{v}");
    assert_eq!(v["can_run_supervisor"], true);
    let names: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for n in [
        "cgroup-v2",
        "cgroup-delegation",
        "cgroup-kill",
        "pidfd",
        "tmux",
        "postgresql",
        "clock",
    ] {
        assert!(names.contains(&n), "doctor has no {n} check: {names:?}");
    }
    // The clock check names the transport tolerance sessions need (synchronized or not).
    let clock = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "clock")
        .unwrap();
    assert!(
        clock["detail"].as_str().unwrap().contains("300 s"),
        "{clock}"
    );
    // A root the supervisor could not use makes doctor fail, with a non-zero exit.
    let out = Command::new(common::MOSAIC)
        .args(["doctor", "--json", "--cgroup-root", "/tmp"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["can_run_supervisor"], false);
}
