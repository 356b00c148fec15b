//! A confined generation (spec §5.5, §3 invariants 5–7): attacked from inside a real
//! generation by the fake harness's hostile directives (each attempt made for real, its
//! outcome written to the attacker's home), every attempt to reach beyond the generation
//! fails, and the host is unchanged afterwards. The same attempts from a lane the operator
//! opted out (`unconfined_lanes`) get through: the confinement is what stops them.

mod common;
mod pg;
mod world;

use std::path::{Path, PathBuf};

use common::*;
use mosaic::supervisor::control::Request;
use serde_json::Value;
use world::{Spec, World};

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
        // No other process exists for it: not the supervisor's, not another lane's
        // command line (world-readable on the host's /proc).
        format!("attack=read:/proc/{sup}/cmdline"),
        format!("attack=read:/proc/{}/cmdline", v.harness),
        "attack=read:/proc/1/cmdline".to_string(),
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
        // Root's own files: out of reach (its lane's uid, and landlock's cut-outs).
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
    // Its own processes are there for it.
    directives.push("attack=read:/proc/self/status".to_string());
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
            || what == "read:/proc/self/status"
            || what == "write:/dev/stderr"
            || what == "read:/etc"
            || *what == format!("write:/tmp/{tmp_name}");
        assert_eq!(
            *allowed, own_area,
            "{what}: {said} (only its own areas and the system's files are reachable)"
        );
    }
    // The kernel's own view of the attacker: no capability, no_new_privs, seccomp on, its
    // lane's own uid (not root, not the victim's).
    let harness = pid(&g["process_identity"]["harness_pid"]);
    let seen = mosaic::confine::observe(harness).unwrap();
    assert!(seen.is_confined(), "{seen:?}");
    let uid = h.lane_status("attacker")["uid"].as_u64().unwrap() as u32;
    assert_eq!(seen.only_id, Some((uid, uid)), "{seen:?}");
    let victim_uid = mosaic::confine::observe(v.harness).unwrap().only_id;
    assert!(uid >= 1000 && victim_uid.is_some_and(|(u, _)| u != uid && u >= 1000));
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
    // It attacks only once its start is through: an unconfined harness that left its
    // cgroup before the supervisor saw it there would fail its own launch (as it should).
    let go = h.dir.join("open-go");
    let g = h.start(
        "open",
        &format!(
            "attack=wait:{} attack=write:{} attack=environ:{sup} attack=read:{} attack=join:{} attack=connect:{} hang",
            go.display(),
            planted.display(),
            h.state_dir().join("supervisor.lock").display(),
            parent.display(),
            h.socket().display()
        ),
    );
    assert_eq!(g["process_identity"]["confinement"], "none", "{g}");
    std::fs::write(&go, "").unwrap();
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
        gateway: None,
        uid: None,
        staged: None,
        workspace_source: None,
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

/// A file removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A world (coordinator, PostgreSQL, one supervisor) whose `fake` runtime has the test
/// model as its provider and a key in its credentials file: a generation's provider
/// requests are effects, admitted only under an assignment (`tests/effects.rs`).
fn provider_world(model: &Model, token: &str, unconfined: &[&str]) -> (World, Scratch) {
    let creds = Scratch(std::env::temp_dir().join(format!(
        "mosaic-creds-{}.env",
        uuid::Uuid::new_v4().simple()
    )));
    std::fs::write(&creds.0, format!("FAKE_PROVIDER_KEY={token}\n")).unwrap();
    std::fs::set_permissions(
        &creds.0,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let unconfined: Vec<String> = unconfined.iter().map(|l| format!("{l:?}")).collect();
    let w = World::started(Spec {
        lanes: 1,
        tag: "gateway",
        supervisor_extra: format!(
            "[providers]\nfake = \"http://127.0.0.1:{}\"\n[credentials]\nfake = {:?}\n",
            model.port, creds.0
        ),
        supervisor_top: format!("unconfined_lanes = [{}]\n", unconfined.join(", ")),
        ..Spec::default()
    });
    (w, creds)
}

/// Runs `task` on lane-1 of `w` to RUNNING: (the assign's answer, the generation's area).
fn run(w: &World, task: &str) -> (Value, PathBuf) {
    let a = w.assign_to(&w.lane_of(0, "lane-1"), task, true).unwrap();
    let area = w.area(
        0,
        a["lane_incarnation_id"].as_str().unwrap(),
        a["generation"].as_u64().unwrap(),
    );
    (a, area)
}

/// The attempts recorded in `home/attacks` of `area`, once all were made.
fn outcomes_in(area: &Path) -> Vec<(String, bool, String)> {
    let file = area.join("home/attacks");
    let text = wait_until("the attacker's outcomes", || {
        std::fs::read_to_string(&file)
            .ok()
            .filter(|t| t.contains("attacks done"))
    });
    parse_outcomes(&text)
}

fn stop(w: &World, a: &Value) {
    w.op(&mosaic::coordinator::service::OperatorRequest::Stop {
        assignment_id: a["assignment_id"].as_str().unwrap().into(),
        outcome: None,
        evidence_digest: None,
        wait: true,
        request_id: None,
    })
    .unwrap();
}

/// Every environment in `cgroup` (each member's `/proc/<pid>/environ`), as text.
fn environments(cgroup: &Path) -> Vec<(i32, String)> {
    members(cgroup)
        .iter()
        .filter_map(|(p, _)| {
            std::fs::read(format!("/proc/{p}/environ"))
                .ok()
                .map(|e| (*p, String::from_utf8_lossy(&e).into_owned()))
        })
        .collect()
}

#[test]
fn a_confined_generation_reaches_its_provider_only_through_the_gateway_and_never_holds_its_key() {
    let model = Model::start();
    let token = format!("mosaic-secret-{}", uuid::Uuid::new_v4().simple());
    let (w, _creds) = provider_world(&model, &token, &[]);
    let (a, area) = run(
        &w,
        &format!(
            // The provider through the gateway, with the key its environment holds; the
            // same provider straight at its address; an address outside the host.
            "attack=provider:FAKE_PROVIDER_KEY attack=tcp:127.0.0.1:{} attack=tcp:192.0.2.1:80 hang",
            model.port
        ),
    );
    let got = outcomes_in(&area);
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got[0].1, "the gateway carried the request: {got:?}");
    assert!(
        !got[1].1 && !got[2].1,
        "no address is reachable but the gateway: {got:?}"
    );
    // The real key reached the provider, added by the gateway; the placeholder did not.
    let posts: Vec<Value> = model
        .requests()
        .into_iter()
        .filter(|r| r["method"] == "POST")
        .collect();
    assert_eq!(posts.len(), 1, "{posts:?}");
    let auth = posts[0]["headers"]["authorization"].as_str().unwrap_or("");
    assert_eq!(auth, format!("Bearer {token}"), "the provider got {auth:?}");
    // The key is in no environment of the generation; the harness has its placeholder.
    let cg = cgroup_at(a["process_identity"]["cgroup_path"].as_str().unwrap());
    let envs = environments(&cg);
    assert!(envs.len() >= 2, "{envs:?}");
    for (p, e) in &envs {
        assert!(!e.contains(&token), "pid {p} holds the provider key");
    }
    let harness = envs
        .iter()
        .find(|(_, e)| e.contains("FAKE_PROVIDER_KEY="))
        .expect("the harness's environment names its key");
    assert!(
        harness
            .1
            .contains("FAKE_PROVIDER_KEY=mosaic-credential-FAKE_PROVIDER_KEY"),
        "{}",
        harness.1
    );
    // The gateway counted the answer's usage, as the answer itself reports it.
    let answer: Value =
        serde_json::from_str(&std::fs::read_to_string(area.join("home/provider-answer")).unwrap())
            .unwrap();
    let seen = wait_until("the gateway's count", || {
        let g = w.host_status(0)["lanes"][0]["generation"]["gateway"].clone();
        (g["input_tokens"] == answer["usage"]["prompt_tokens"]).then_some(g)
    });
    assert_eq!(seen["requests"], 1, "{seen}");
    assert_eq!(
        seen["output_tokens"], answer["usage"]["completion_tokens"],
        "{seen}"
    );
    assert!(answer["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    // And no log shows the key.
    for log in [w.supervisor_log(0), w.coordinator_log(0)] {
        assert!(
            !std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains(&token),
            "the key reached {}",
            log.display()
        );
    }
    stop(&w, &a);
}

/// A supervisor without a coordinator admits no effect: a generation started locally is
/// under no assignment, and its gateway refuses its provider requests (they reach nothing).
#[test]
fn a_generation_under_no_assignment_makes_no_effect() {
    let model = Model::start();
    let creds = Scratch(std::env::temp_dir().join(format!(
        "mosaic-creds-{}.env",
        uuid::Uuid::new_v4().simple()
    )));
    std::fs::write(&creds.0, "FAKE_PROVIDER_KEY=k\n").unwrap();
    std::fs::set_permissions(
        &creds.0,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let h = Host::with(Options {
        extra_config: format!(
            "[providers]\nfake = \"http://127.0.0.1:{}\"\n[credentials]\nfake = {:?}\n",
            model.port, creds.0
        ),
        ..Options::default()
    });
    h.create_lane("p");
    h.start(
        "p",
        "attack=provider:FAKE_PROVIDER_KEY attack=egress:192.0.2.1:443 hang",
    );
    let got = outcomes(&h, "p", 1);
    assert!(!got[0].1 && got[0].2.contains("403"), "{got:?}");
    assert!(
        std::fs::read_to_string(area(&h, "p", 1).join("home/provider-answer"))
            .unwrap()
            .contains("no-authority"),
        "the refusal says why"
    );
    assert!(!got[1].1 && got[1].2.contains("no-authority"), "{got:?}");
    assert!(
        model.requests().is_empty(),
        "a request reached the provider"
    );
    let r = h.call(&Request::Stop { lane: "p".into() });
    assert_eq!(r["cleanup"]["verified_empty"], true, "{r}");
}

#[test]
fn a_readopted_generation_gets_its_gateway_back() {
    let model = Model::start();
    let token = format!("mosaic-secret-{}", uuid::Uuid::new_v4().simple());
    let (mut w, _creds) = provider_world(&model, &token, &[]);
    // The harness asks only once told to, after the restart: it waits for a file in its
    // own home (the lane's first generation's area).
    let go = w.area(0, &w.incarnation_of(0, "lane-1"), 1).join("home/go");
    let (a, area) = run(
        &w,
        &format!(
            "attack=wait:{} attack=provider:FAKE_PROVIDER_KEY hang",
            go.display()
        ),
    );
    assert_eq!(a["generation"], 1);
    // Crashed once the host recorded the activation (before, a restart stops the
    // generation: a chain is not resumed mid-way).
    wait_until("the activation recorded", || {
        (w.host_status(0)["lanes"][0]["generation"]["activated"] == true).then_some(())
    });
    w.crash_supervisor(0);
    w.start_supervisor(0);
    // The listener its shim kept, served again by the new supervisor, carries it with the
    // key read again from the file, once its claim is admitted.
    std::fs::write(area.join("home/go"), "").unwrap();
    let got = outcomes_in(&area);
    assert!(got.iter().all(|(_, a, _)| *a), "{got:?}");
    let auth = model
        .requests()
        .iter()
        .filter(|r| r["method"] == "POST")
        .map(|r| {
            r["headers"]["authorization"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect::<Vec<_>>();
    assert_eq!(auth, vec![format!("Bearer {token}")]);
    stop(&w, &a);
}

#[test]
fn an_unconfined_lane_goes_straight_to_its_provider_with_its_key() {
    let model = Model::start();
    let token = format!("mosaic-secret-{}", uuid::Uuid::new_v4().simple());
    let (w, _creds) = provider_world(&model, &token, &["lane-1"]);
    let (a, area) = run(
        &w,
        &format!(
            "attack=provider:FAKE_PROVIDER_KEY attack=tcp:127.0.0.1:{} hang",
            model.port
        ),
    );
    let got = outcomes_in(&area);
    assert!(got.iter().all(|(_, a, _)| *a), "{got:?}");
    let harness =
        pid(&w.host_status(0)["lanes"][0]["generation"]["process_identity"]["harness_pid"]);
    let env = std::fs::read(format!("/proc/{harness}/environ")).unwrap();
    assert!(
        String::from_utf8_lossy(&env).contains(&format!("FAKE_PROVIDER_KEY={token}")),
        "an unconfined harness holds its key itself"
    );
    assert!(w.host_status(0)["lanes"][0]["generation"]["gateway"].is_null());
    stop(&w, &a);
}

/// The lane's uid on its own: a file only root may read, below a hierarchy landlock lets
/// the harness read, is read by a harness that kept uid 0 and refused to one running as
/// its lane's uid.
#[test]
fn a_lane_uid_keeps_root_only_files_out_of_reach() {
    let h = Host::new();
    let home = h.dir.join("uid-home");
    std::fs::create_dir_all(&home).unwrap();
    let probe = Scratch(PathBuf::from(format!(
        "/usr/local/mosaic-root-only-{}",
        uuid::Uuid::new_v4().simple()
    )));
    std::fs::write(&probe.0, "secret").unwrap();
    std::fs::set_permissions(
        &probe.0,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let policy = |uid: Option<u32>| mosaic::confine::Policy {
        read: mosaic::confine::SYSTEM_READ
            .iter()
            .map(PathBuf::from)
            .chain(["/usr/local".into()])
            .chain([Path::new(common::MOSAIC).parent().unwrap().to_path_buf()])
            .collect(),
        write: vec![home.clone()],
        devices: mosaic::confine::DEVICES.iter().map(PathBuf::from).collect(),
        masked: vec![],
        hidden: vec![],
        // Its own /tmp, as every generation has: what it runs (this build, maybe below a
        // 0700 directory in /tmp, as on a CI clone) is mounted back where it can reach it.
        private: vec![PathBuf::from("/tmp")],
        sockets: vec![],
        gateway: None,
        uid,
        staged: None,
        workspace_source: None,
    };
    let read = format!("attack=read:{}", probe.0.display());
    let as_root = run_confined(policy(None), &home, &[read.clone(), "exit=0".into()]);
    assert!(as_root[0].1, "uid 0 reads it: {as_root:?}");
    let uid = 1_900_999_999;
    mosaic::util::durable::chown_tree(&home, uid, uid).unwrap();
    let as_lane = run_confined(policy(Some(uid)), &home, &[read, "exit=0".into()]);
    assert!(!as_lane[0].1, "the lane's uid does not: {as_lane:?}");
}

/// Every lane incarnation gets a uid of its own, never handed out again: not to a
/// recreated lane, not after a restart.
#[test]
fn lane_uids_are_never_handed_out_twice() {
    let mut h = Host::new();
    let uid = |h: &Host, lane: &str| h.lane_status(lane)["uid"].as_u64().unwrap();
    h.create_lane("a");
    h.create_lane("b");
    let (a1, b1) = (uid(&h, "a"), uid(&h, "b"));
    assert_ne!(a1, b1);
    h.call(&Request::LaneDestroy { lane: "a".into() });
    h.create_lane("a");
    let a2 = uid(&h, "a");
    assert!(
        a2 > a1.max(b1),
        "a recreated lane got {a2} after {a1}, {b1}"
    );
    h.crash_supervisor();
    h.start_supervisor();
    h.create_lane("c");
    assert!(uid(&h, "c") > a2);
    // Another supervisor on the same machine (its own state directory) never hands out
    // one of them: the host's ledger is shared.
    let other = Host::new();
    other.create_lane("a");
    let o = uid(&other, "a");
    assert!(
        ![a1, b1, a2, uid(&h, "c")].contains(&o),
        "{o} handed out twice"
    );
    // The generation runs as it, and its areas are its own.
    let g = h.start("c", "hang");
    let harness = pid(&g["process_identity"]["harness_pid"]);
    let c = uid(&h, "c") as u32;
    assert_eq!(
        mosaic::confine::observe(harness).unwrap().only_id,
        Some((c, c))
    );
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(area(&h, "c", 1)).unwrap().uid(), c);
}

/// A confined real harness has no way to its model but the gateway: without a declared
/// provider its start is refused before anything is reserved. An unconfined lane reaches
/// its provider itself, so the check does not apply there.
#[test]
fn a_confined_real_harness_without_a_provider_is_refused() {
    let root = std::env::var("MOSAIC_HARNESS_ROOT")
        .expect("MOSAIC_HARNESS_ROOT names the installed harnesses (scripts/test sets it)");
    let h = Host::with(Options {
        unconfined_lanes: vec!["open"],
        extra_config: format!("harness_root = {root:?}\n"),
        ..Options::default()
    });
    h.create_lane("w");
    h.create_lane("open");
    let start = |lane: &str| Request::Start {
        lane: lane.into(),
        runtime: "claude-code@2.1.332".into(),
        directives: vec![],
    };
    let (k, msg) = h.refused(&start("w"));
    assert_eq!(k, "no-provider", "{msg}");
    assert!(msg.contains("providers.claude-code"), "{msg}");
    assert!(h.lane_status("w")["current_generation"].is_null());
    let (k, _) = h.refused(&start("open"));
    assert_ne!(k, "no-provider");
}

/// A generation that floods its gateway with connections gets a bounded share of the
/// supervisor: the supervisor's descriptors grow by at most the gateway's connection limit,
/// it keeps answering, and the gateway carries the generation's next request.
#[test]
fn a_flood_of_gateway_connections_is_bounded() {
    let model = Model::start();
    let token = format!("mosaic-secret-{}", uuid::Uuid::new_v4().simple());
    let (w, _creds) = provider_world(&model, &token, &[]);
    let sup = w.sup[0].pid().unwrap();
    let fds = || {
        std::fs::read_dir(format!("/proc/{sup}/fd"))
            .unwrap()
            .count()
    };
    let before = fds();
    let (a, area) = run(
        &w,
        "attack=flood:150 attack=provider:FAKE_PROVIDER_KEY hang",
    );
    let home = area.join("home");
    wait_until("the flood held", || {
        home.join("flooding").exists().then_some(())
    });
    // Give the supervisor time to accept all it would.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let during = fds();
    assert!(
        during < before + mosaic::supervisor::gateway::MAX_CONNECTIONS + 24,
        "the supervisor holds {during} descriptors, {before} before the flood"
    );
    w.host_status(0);
    std::fs::write(home.join("release"), "").unwrap();
    let got = outcomes_in(&area);
    assert!(got.iter().all(|(_, a, _)| *a), "{got:?}");
    stop(&w, &a);
}

/// Every generation has a network namespace never used before: no two generations of a
/// lane, and no generation and the supervisor, share one. Its gateway works in each.
#[test]
fn every_generation_gets_a_network_namespace_of_its_own() {
    let model = Model::start();
    let token = format!("mosaic-secret-{}", uuid::Uuid::new_v4().simple());
    let (w, _creds) = provider_world(&model, &token, &[]);
    // Each namespace is held open here, so the kernel cannot free it and reuse its number
    // for a later one: equal numbers would be one namespace.
    let mut held = Vec::new();
    let mut ns = |pid: i32| {
        use std::os::unix::fs::MetadataExt;
        let f = std::fs::File::open(format!("/proc/{pid}/ns/net")).unwrap();
        let ino = f.metadata().unwrap().ino();
        held.push(f);
        ino
    };
    let sup = ns(w.sup[0].pid().unwrap() as i32);
    let mut seen = vec![sup];
    for n in 1..=3u64 {
        let (a, area) = run(&w, "attack=provider:FAKE_PROVIDER_KEY hang");
        assert_eq!(a["generation"], n);
        let g = &w.host_status(0)["lanes"][0]["generation"];
        assert_eq!(g["process_identity"]["confinement"], "verified", "{g}");
        let mine = ns(pid(&g["process_identity"]["harness_pid"]));
        assert!(!seen.contains(&mine), "generation {n} shares {mine:?}");
        seen.push(mine);
        let got = outcomes_in(&area);
        assert!(got[0].1, "{got:?}");
        stop(&w, &a);
    }
}

/// The supervisor checks the started harness's ids against its lane's, from its own record:
/// a harness running as any other uid (here the shim is sent a wrong one) fails its launch,
/// ended with its receipt.
#[test]
fn a_harness_under_another_uid_than_its_lanes_fails_its_launch() {
    assert!(
        mosaic::coordinator::failpoint::enabled(),
        "this test sends the shim a wrong uid with a failpoint: cargo test --features failpoints (scripts/test does)"
    );
    let h = Host::with(Options {
        env: vec![("FAILPOINTS", "confine:wrong-uid=return".into())],
        ..Options::default()
    });
    h.create_lane("w");
    let (k, msg) = h.refused(&Request::Start {
        lane: "w".into(),
        runtime: "fake@1.0.0".into(),
        directives: vec!["hang".into()],
    });
    assert_eq!(k, "launch-failed", "{msg}");
    assert!(msg.contains("runs without its confinement"), "{msg}");
    let receipts = h.receipts(Some("w"), true);
    assert_eq!(receipts.len(), 1, "{receipts:?}");
}

/// `/proc/<pid>/status`'s `NSpid`: the pid in each namespace, outermost first.
fn ns_pids(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

#[test]
fn a_confined_generation_is_a_pid_namespace_that_ends_with_its_harness() {
    let h = Host::new();
    h.create_lane("w");
    let go = area(&h, "w", 1).join("home/go");
    // Waits for `go`, then starts three long-lived descendants (one double-forked: an
    // orphan of the namespace) and exits 7 without waiting for them.
    let g = h.start("w", &format!("attack=wait:{} spawn=3 exit=7", go.display()));
    let id = &g["process_identity"];
    let (init, root) = (pid(&id["harness_pid"]), pid(&id["root_pid"]));
    // The supervisor's harness pid is the namespace's init, the shim's child; the harness
    // is the init's only child, the namespace's second process.
    let comm = std::fs::read_to_string(format!("/proc/{init}/comm")).unwrap();
    assert_eq!(comm.trim(), mosaic::confine::pidns::INIT_NAME);
    assert_eq!(ns_pids(init)[1..], [1]);
    let ns = |p: i32| std::fs::read_link(format!("/proc/{p}/ns/pid")).unwrap();
    assert_ne!(ns(init), ns(root), "the init is in a namespace of its own");
    let cg = cgroup_abs(&h, id["cgroup_path"].as_str().unwrap());
    let harness = wait_until("the harness", || {
        members(&cg)
            .into_iter()
            .map(|(p, _)| p)
            .find(|p| *p != init && *p != root)
    });
    assert_eq!(ns_pids(harness)[1..], [2]);
    assert_eq!(ns(harness), ns(init));
    // Its end ends the namespace: the kernel kills every process left in it before the
    // init's own exit is seen, so the supervisor's kill finds only the shim; the receipt
    // has the harness's own exit, which the init handed over.
    std::fs::write(&go, "").unwrap();
    let r = h.wait_receipt("w", 1);
    assert_eq!(r["exit_code"], 7, "{r}");
    assert_eq!(r["termination_reason"], "crash", "{r}");
    assert_eq!(r["cleanup"]["members_killed"], 1, "{r}");
    assert_eq!(r["cleanup"]["verified_empty"], true, "{r}");
    assert!(!cg.exists());
}
