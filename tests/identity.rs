//! Identity verification on real processes in real cgroups: every check of
//! `identity::verify_claim` has a row here that fails if the check is removed.

mod common;

use std::os::unix::process::CommandExt;
use std::process::{Child, Command};

use mosaic::cgroup::{Cg, CgroupTree};
use mosaic::supervisor::identity::{
    self, Claim, Expected, IdentityError, LaunchNonce, ProcessIdentity,
};

struct Fixture {
    tree: CgroupTree,
    cg: Cg,
    rel: String,
    child: Child,
    pid: i32,
    start: u64,
    nonce: LaunchNonce,
    boot: String,
}

impl Fixture {
    fn new() -> Self {
        common::require_host();
        let mount = mosaic::cgroup::discover_mount().unwrap();
        let root = mount
            .path
            .join(format!("mosaic-test-id-{}", uuid::Uuid::new_v4().simple()));
        let tree = CgroupTree::open(&mount, Some(&root), "/", false).unwrap();
        let cg = tree.at("gen-1");
        cg.create_fresh().unwrap();
        let procs = cg.open_procs_for_join().unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&procs);
        let mut cmd = Command::new("sleep");
        cmd.arg("300");
        // SAFETY: only write(2) on an fd opened before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::write(fd, b"0".as_ptr().cast(), 1) == 1 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let child = cmd.spawn().unwrap();
        let pid = child.id() as i32;
        let start = common::start_time(pid).unwrap();
        let rel = tree.rel(cg.path());
        Self {
            tree,
            cg,
            rel,
            child,
            pid,
            start,
            nonce: LaunchNonce::generate().unwrap(),
            boot: identity::boot_id().unwrap(),
        }
    }

    fn expected<'a>(
        &'a self,
        digest: &'a identity::NonceDigest,
        recorded: Option<&'a ProcessIdentity>,
    ) -> Expected<'a> {
        Expected {
            boot_id: &self.boot,
            cgroup: &self.rel,
            nonce_digest: digest,
            recorded,
        }
    }

    fn record(&self) -> ProcessIdentity {
        let seen = identity::observe(self.pid).unwrap();
        ProcessIdentity {
            boot_id: self.boot.clone(),
            root_pid: self.pid,
            root_start_time: self.start,
            exe_path: seen.exe_path,
            exe_dev: seen.exe_dev,
            exe_ino: seen.exe_ino,
            cgroup_path: self.rel.clone(),
            cgroup_id: self.cg.id().unwrap(),
            launch_nonce_digest: self.nonce.digest(),
            lane_id: "h:l".into(),
            lane_incarnation_id: "li-x".into(),
            generation: 1,
            harness_pid: None,
            harness_start_time: None,
            confinement: Default::default(),
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.tree.destroy_all(std::time::Duration::from_secs(5));
    }
}

#[test]
fn a_true_claim_verifies() {
    let f = Fixture::new();
    let d = f.nonce.digest();
    let claim = Claim {
        peer_pid: f.pid,
        claimed_pid: f.pid,
        claimed_start_time: f.start,
        nonce: &f.nonce,
    };
    let rec = f.record();
    identity::verify_claim(&claim, &f.expected(&d, None)).unwrap();
    identity::verify_claim(&claim, &f.expected(&d, Some(&rec))).unwrap();
}

#[test]
fn every_forged_field_is_rejected() {
    let f = Fixture::new();
    let d = f.nonce.digest();
    let other = LaunchNonce::generate().unwrap();
    let rec = f.record();
    let me = std::process::id() as i32;
    let mut wrong_root = rec.clone();
    wrong_root.root_pid = me;
    let mut wrong_exe = rec.clone();
    wrong_exe.exe_ino += 1;
    let mut old_start = rec.clone();
    old_start.root_start_time -= 1;
    let bogus_boot = "00000000-0000-0000-0000-000000000000".to_string();
    type Row<'a> = (&'a str, Claim<'a>, Expected<'a>, fn(&IdentityError) -> bool);
    let rows: Vec<Row> = vec![
        (
            "other start time (PID reuse)",
            Claim {
                peer_pid: f.pid,
                claimed_pid: f.pid,
                claimed_start_time: f.start + 1,
                nonce: &f.nonce,
            },
            f.expected(&d, None),
            |e| matches!(e, IdentityError::StartTime { .. }),
        ),
        (
            "other nonce",
            Claim {
                peer_pid: f.pid,
                claimed_pid: f.pid,
                claimed_start_time: f.start,
                nonce: &other,
            },
            f.expected(&d, None),
            |e| matches!(e, IdentityError::Nonce),
        ),
        (
            "peer is someone else",
            Claim {
                peer_pid: me,
                claimed_pid: f.pid,
                claimed_start_time: f.start,
                nonce: &f.nonce,
            },
            f.expected(&d, None),
            |e| matches!(e, IdentityError::PeerMismatch { .. }),
        ),
        (
            "process outside the cgroup",
            Claim {
                peer_pid: me,
                claimed_pid: me,
                claimed_start_time: common::start_time(me).unwrap(),
                nonce: &f.nonce,
            },
            f.expected(&d, None),
            |e| matches!(e, IdentityError::NotInCgroup { .. }),
        ),
        (
            "not the recorded root",
            Claim {
                peer_pid: f.pid,
                claimed_pid: f.pid,
                claimed_start_time: f.start,
                nonce: &f.nonce,
            },
            f.expected(&d, Some(&wrong_root)),
            |e| matches!(e, IdentityError::WrongRoot { .. }),
        ),
        (
            "recorded start time differs",
            Claim {
                peer_pid: f.pid,
                claimed_pid: f.pid,
                claimed_start_time: f.start,
                nonce: &f.nonce,
            },
            f.expected(&d, Some(&old_start)),
            |e| matches!(e, IdentityError::StartTime { .. }),
        ),
        (
            "executable changed",
            Claim {
                peer_pid: f.pid,
                claimed_pid: f.pid,
                claimed_start_time: f.start,
                nonce: &f.nonce,
            },
            f.expected(&d, Some(&wrong_exe)),
            |e| matches!(e, IdentityError::Exe { .. }),
        ),
        (
            "another boot",
            Claim {
                peer_pid: f.pid,
                claimed_pid: f.pid,
                claimed_start_time: f.start,
                nonce: &f.nonce,
            },
            Expected {
                boot_id: &bogus_boot,
                cgroup: &f.rel,
                nonce_digest: &d,
                recorded: None,
            },
            |e| matches!(e, IdentityError::Boot),
        ),
    ];
    for (name, claim, exp, want) in rows {
        match identity::verify_claim(&claim, &exp) {
            Err(e) if want(&e) => {}
            other => panic!("{name}: expected rejection, got {other:?}"),
        }
    }
}

#[test]
fn a_dead_process_never_satisfies_its_old_identity() {
    let mut f = Fixture::new();
    let d = f.nonce.digest();
    let rec = f.record();
    f.child.kill().unwrap();
    f.child.wait().unwrap();
    let claim = Claim {
        peer_pid: f.pid,
        claimed_pid: f.pid,
        claimed_start_time: f.start,
        nonce: &f.nonce,
    };
    let r = identity::verify_claim(&claim, &f.expected(&d, Some(&rec)));
    assert!(matches!(r, Err(IdentityError::Gone { .. })), "{r:?}");
}
