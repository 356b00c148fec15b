//! A confined generation (spec §5.5, §3 invariants 5–7): attacked from inside a real
//! generation by the fake harness's hostile directives (each attempt made for real, its
//! outcome written to the attacker's home), every attempt to reach beyond the generation
//! fails, and the host is unchanged afterwards. The same attempts from a lane the operator
//! opted out (`unconfined_lanes`) get through: the confinement is what stops them.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use mosaic::supervisor::control::Request;
use serde_json::Value;

fn lane_incarnation(h: &Host, lane: &str) -> String {
    h.lane_status(lane)["lane_incarnation_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Generation `generation` of `lane`'s private area.
fn area(h: &Host, lane: &str, generation: u64) -> PathBuf {
    h.state_dir()
        .join("harness")
        .join(lane_incarnation(h, lane))
        .join(format!("gen-{generation}"))
}

/// The attacker's outcomes, once it has made every attempt: attempt → allowed.
fn outcomes(h: &Host, lane: &str, generation: u64) -> Vec<(String, bool, String)> {
    let file = area(h, lane, generation).join("home/attacks");
    let text = wait_until("the attacker's outcomes", || {
        std::fs::read_to_string(&file)
            .ok()
            .filter(|t| t.contains("attacks done"))
    });
    parse_outcomes(&text)
}

/// `attack WHAT allowed` / `attack WHAT denied: …` lines: (what, allowed, what was said).
fn parse_outcomes(text: &str) -> Vec<(String, bool, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("attack "))
        .map(|l| {
            let (what, rest) = l.split_once(' ').unwrap();
            (what.to_string(), rest == "allowed", rest.to_string())
        })
        .collect()
}

fn pid(v: &Value) -> i32 {
    v.as_i64().unwrap() as i32
}

/// The victim: a live generation on lane `victim`, with a credential in its environment.
struct Victim {
    /// Its pane's terminal (the shim's stdin).
    tty: PathBuf,
    harness: i32,
    harness_start: u64,
    cgroup: PathBuf,
    members: Vec<(i32, u64)>,
    area: PathBuf,
}

fn victim(h: &Host) -> Victim {
    h.create_lane("victim");
    let g = h.start("victim", "spawn=2");
    let id = &g["process_identity"];
    let cgroup = cgroup_abs(h, id["cgroup_path"].as_str().unwrap());
    let members = wait_until("the victim's tree", || {
        let m = members(&cgroup);
        (m.len() >= 4).then_some(m)
    });
    Victim {
        tty: std::fs::read_link(format!("/proc/{}/fd/0", pid(&id["root_pid"]))).unwrap(),
        harness: pid(&id["harness_pid"]),
        harness_start: id["harness_start_time"].as_u64().unwrap(),
        cgroup,
        members,
        area: area(h, "victim", 1),
    }
}

/// Every attempt a hostile tool makes against the victim, the supervisor and the host.
fn hostile(h: &Host, v: &Victim, own_cgroup_parent: &Path) -> Vec<String> {
    let sup = h.supervisor_pid().unwrap();
    vec![
        format!("attack=write:{}", v.area.join("home/planted").display()),
        format!("attack=read:{}", v.area.display()),
        format!("attack=join:{}", v.cgroup.display()),
        format!("attack=join:{}", own_cgroup_parent.display()),
        // Another pane's terminal: its input (the typed activation check), its screen.
        format!("attack=open:{}", v.tty.display()),
        format!("attack=signal:{sup}"),
        format!("attack=signal:{}", v.harness),
        format!("attack=ptrace:{}", v.harness),
        format!("attack=ptrace:{sup}"),
        // Same uid, so the kernel's own check would let these through: limits, priority.
        format!("attack=prlimit:{sup}"),
        format!("attack=renice:{sup}"),
        format!("attack=environ:{sup}"),
        format!("attack=environ:{}", v.harness),
        format!("attack=mem:{}", v.harness),
        format!(
            "attack=read:{}",
            h.state_dir().join("supervisor.lock").display()
        ),
        format!("attack=write:{}", h.state_dir().join("planted").display()),
        format!("attack=read:{}", h.dir.join("run/lanes").display()),
        // The supervisor's control socket: the generation cannot drive its supervisor.
        format!("attack=connect:{}", h.socket().display()),
        // No lane's tmux server, its own included: nothing to capture, nothing to set for
        // the next generation.
        format!("attack=connect:{}", h.lane_tmux_socket("victim").display()),
        format!(
            "attack=connect:{}",
            h.lane_tmux_socket("attacker").display()
        ),
        "attack=write:/etc/mosaic-planted".to_string(),
        // Root's own files: the harness keeps uid 0, but not its reach.
        "attack=read:/etc/shadow".to_string(),
        "attack=write:/usr/mosaic-planted".to_string(),
        "attack=mount".to_string(),
        "attack=unshare".to_string(),
        "attack=raw-socket".to_string(),
        // No descriptor above stdio crosses exec.
        "attack=fd:3".to_string(),
        "attack=fd:4".to_string(),
        "attack=fd:5".to_string(),
    ]
}

#[test]
fn a_confined_generation_reaches_nothing_beyond_its_own_areas() {
    let h = Host::new();
    let v = victim(&h);
    h.create_lane("attacker");
    let own = area(&h, "attacker", 1);
    let incarnation = lane_incarnation(&h, "attacker");
    let own_cgroup_parent = h.cgroup_root.join(format!("lanes/attacker/{incarnation}"));
    let mut directives = hostile(&h, &v, &own_cgroup_parent);
    // A host file's mode (landlock does not govern chmod; the harness is uid 0, the owner).
    struct Probe(PathBuf);
    impl Drop for Probe {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let probe = Probe(PathBuf::from(format!(
        "/usr/local/mosaic-chmod-probe-{}",
        std::process::id()
    )));
    std::fs::write(&probe.0, "x").unwrap();
    directives.push(format!("attack=chmod:{}", probe.0.display()));
    // What it may do: write its own home and read the system.
    directives.push(format!("attack=write:{}", own.join("home/mine").display()));
    directives.push(format!("attack=write:{}", own.join("work/mine").display()));
    directives.push("attack=read:/usr/bin".to_string());
    // What tools take for granted: their terminal by name, a listing of /etc.
    directives.push("attack=write:/dev/stderr".to_string());
    directives.push("attack=read:/etc".to_string());
    // Its /tmp is its own: writable, and nothing of it reaches the host's.
    let tmp_name = format!("mosaic-confined-{}", std::process::id());
    directives.push(format!("attack=write:/tmp/{tmp_name}"));
    directives.push("hang".to_string());
    let g = h.start("attacker", &directives.join(" "));
    assert_eq!(
        g["process_identity"]["confinement"], "verified",
        "the identity records the confinement the supervisor saw: {g}"
    );
    let got = outcomes(&h, "attacker", 1);
    assert_eq!(got.len(), directives.len() - 1, "{got:?}");
    for (what, allowed, said) in &got {
        let own_area = what.contains(own.to_str().unwrap())
            || what == "read:/usr/bin"
            || what == "write:/dev/stderr"
            || what == "read:/etc"
            || *what == format!("write:/tmp/{tmp_name}");
        assert_eq!(
            *allowed, own_area,
            "{what}: {said} (only its own areas and the system's files are reachable)"
        );
    }
    // The kernel's own view of the attacker: no capability, no_new_privs, seccomp on.
    let harness = pid(&g["process_identity"]["harness_pid"]);
    let seen = mosaic::confine::observe(harness).unwrap();
    assert!(seen.is_confined(), "{seen:?}");
    // And the host is unchanged: the victim's tree whole, in its cgroup, nothing planted,
    // the supervisor serving, no receipt for the victim.
    assert!(!is_dead(v.harness, v.harness_start));
    for (p, st) in &v.members {
        assert!(!is_dead(*p, *st), "victim member {p} died");
    }
    let mut now = members(&v.cgroup);
    let mut before = v.members.clone();
    now.sort();
    before.sort();
    assert_eq!(now, before, "the victim's cgroup changed");
    assert!(!v.area.join("home/planted").exists());
    assert!(!h.state_dir().join("planted").exists());
    assert!(!Path::new("/etc/mosaic-planted").exists());
    assert!(!Path::new("/usr/mosaic-planted").exists());
    assert!(
        !Path::new("/tmp").join(&tmp_name).exists(),
        "the generation's /tmp is private"
    );
    assert!(h.receipts(Some("victim"), true).is_empty());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&probe.0).unwrap().permissions().mode() & 0o7777,
        0o644,
        "a host file's mode changed"
    );
    assert_eq!(h.lane_status("attacker")["confinement"], "enforced");
    // The attacker is still in its own cgroup (it could not leave).
    let attacker_cg = cgroup_abs(&h, g["process_identity"]["cgroup_path"].as_str().unwrap());
    assert!(members(&attacker_cg).iter().any(|(p, _)| *p == harness));
    // Both stop cleanly.
    for lane in ["attacker", "victim"] {
        let r = h.call(&Request::Stop { lane: lane.into() });
        assert_eq!(r["cleanup"]["verified_empty"], true, "{r}");
    }
}

#[test]
fn an_opted_out_lane_runs_unconfined_and_says_so() {
    let h = Host::with(Options {
        unconfined_lanes: vec!["open"],
        ..Options::default()
    });
    let v = victim(&h);
    h.create_lane("open");
    assert_eq!(h.lane_status("open")["confinement"], "none");
    assert_eq!(h.lane_status("victim")["confinement"], "enforced");
    let sup = h.supervisor_pid().unwrap();
    let planted = v.area.join("home/planted");
    let parent = h
        .cgroup_root
        .join(format!("lanes/open/{}", lane_incarnation(&h, "open")));
    let g = h.start(
        "open",
        &format!(
            "attack=write:{} attack=environ:{sup} attack=read:{} attack=join:{} attack=connect:{} hang",
            planted.display(),
            h.state_dir().join("supervisor.lock").display(),
            parent.display(),
            h.socket().display()
        ),
    );
    assert_eq!(g["process_identity"]["confinement"], "none", "{g}");
    let got = outcomes(&h, "open", 1);
    assert!(got.iter().all(|(_, allowed, _)| *allowed), "{got:?}");
    assert!(
        planted.exists(),
        "an unconfined harness writes another lane's area"
    );
    assert!(
        h.log().contains("UNCONFINED"),
        "an unconfined start is logged loudly"
    );
}

#[test]
fn a_host_that_cannot_confine_refuses_confined_starts_and_reserves_nothing() {
    assert!(
        mosaic::coordinator::failpoint::enabled(),
        "this test makes the host unable to confine with a failpoint: cargo test --features failpoints (scripts/test does)"
    );
    let h = Host::with(Options {
        unconfined_lanes: vec!["open"],
        env: vec![("FAILPOINTS", "confine:probe=return".into())],
        ..Options::default()
    });
    h.create_lane("w1");
    let (k, msg) = h.refused(&Request::Start {
        lane: "w1".into(),
        runtime: "fake@1.0.0".into(),
        directives: vec!["hang".into()],
    });
    assert_eq!(k, "confinement-unavailable", "{msg}");
    assert!(msg.contains("mosaic doctor"), "{msg}");
    // Nothing was reserved: no generation number burned, no receipt, no cgroup.
    let st = h.lane_status("w1");
    assert!(st["current_generation"].is_null(), "{st}");
    assert!(h.receipts(Some("w1"), true).is_empty());
    // The opted-out lane still starts.
    h.create_lane("open");
    assert_eq!(h.start("open", "hang")["generation"], 1);
}

/// Runs the fake harness with `directives` under `policy` straight from this test (no
/// supervisor in between), its home in `home`; its attack outcomes.
fn run_confined(
    policy: mosaic::confine::Policy,
    home: &Path,
    directives: &[String],
) -> Vec<(String, bool, String)> {
    use std::os::unix::process::CommandExt;
    let prepared = mosaic::confine::Prepared::build(&policy, Some(home)).unwrap();
    let fake = Path::new(common::MOSAIC).with_file_name("mosaic-fake-harness");
    let mut c = std::process::Command::new(fake);
    c.args(directives).env("HOME", home).current_dir(home);
    // SAFETY: `enter` makes raw system calls only (no allocation, no lock).
    unsafe {
        c.pre_exec(move || prepared.enter());
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = std::fs::read_to_string(home.join("attacks")).unwrap();
    parse_outcomes(&text)
}

/// The layers one by one, each with the others out of the way: the test builds a policy
/// that hides nothing (no mount namespace masking), so what stops each attempt is the layer
/// named, and deleting that layer makes its assertion fail.
#[test]
fn each_layer_stops_what_it_covers_on_its_own() {
    let h = Host::new();
    let home = h.dir.join("layer-home");
    std::fs::create_dir_all(&home).unwrap();
    let policy = mosaic::confine::Policy {
        read: mosaic::confine::SYSTEM_READ
            .iter()
            .map(PathBuf::from)
            .chain([Path::new(common::MOSAIC).parent().unwrap().to_path_buf()])
            .collect(),
        write: vec![home.clone()],
        devices: mosaic::confine::DEVICES.iter().map(PathBuf::from).collect(),
        masked: vec![h.state_dir(), h.dir.join("run")],
        hidden: vec![],
        private: vec![],
        sockets: vec![],
    };
    let got = run_confined(
        policy,
        &home,
        &[
            // landlock (and the read-only tree): the state dir is masked, and visible:
            // nothing hides it here.
            format!("attack=write:{}", h.state_dir().join("planted").display()),
            format!(
                "attack=read:{}",
                h.state_dir().join("supervisor.lock").display()
            ),
            // The daemon's peer check: the control socket is reachable by path here; also
            // through a zombie child that connected and exited.
            format!("attack=connect:{}", h.socket().display()),
            format!("attack=zombie-connect:{}", h.socket().display()),
            // landlock's scopes and ptrace rule: the supervisor is outside the domain.
            format!("attack=signal:{}", h.supervisor_pid().unwrap()),
            format!("attack=environ:{}", h.supervisor_pid().unwrap()),
            // landlock: a file only root may read, below a readable hierarchy.
            "attack=read:/etc/shadow".into(),
            // seccomp (and no capabilities).
            format!("attack=prlimit:{}", h.supervisor_pid().unwrap()),
            format!("attack=renice:{}", h.supervisor_pid().unwrap()),
            "attack=unshare".into(),
            "attack=raw-socket".into(),
            format!("attack=write:{}", home.join("mine").display()),
            "exit=0".into(),
        ],
    );
    let allowed: Vec<&str> = got
        .iter()
        .filter(|(_, a, _)| *a)
        .map(|(w, _, _)| w.as_str())
        .collect();
    assert_eq!(
        allowed,
        [format!("write:{}", home.join("mine").display())],
        "{got:?}"
    );
    let said = |what: &str| &got.iter().find(|(w, _, _)| w.starts_with(what)).unwrap().2;
    // A write outside its areas: the read-only tree and landlock both stop it.
    let w = said("write:");
    assert!(
        w.contains("Read-only file system") || w.contains("Permission denied"),
        "{got:?}"
    );
    // Reads are landlock's alone here (nothing hides the state dir).
    assert!(said("read:").contains("Permission denied"), "{got:?}");
    // Refused at accept: closed without a word (or reset, the line it sent unread).
    let c = said("connect:");
    assert!(
        c.contains("closed without answering") || c.contains("reset by peer"),
        "{got:?}"
    );
    assert!(!h.state_dir().join("planted").exists());
    assert!(
        h.audit().contains("control-peer-refused"),
        "the refused peer is audited"
    );
}
