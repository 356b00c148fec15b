//! The conformance suite of each registered real harness, run against its real binary (as
//! `mosaic harness install` put it under `$MOSAIC_HARNESS_ROOT`) in its interactive TUI in
//! a real tmux lane, under `mosaic up` (coordinator, supervisor, PostgreSQL), talking to
//! the deterministic test model (`mosaic-test-model`) with credentials from a 0600 file.
//!
//! Its output is the runtime's evidence file (`registry/<runtime>.evidence.json`), whose
//! digest the registry entry carries and the loader checks. Only facts that do not vary
//! between runs go in it. Normally the suite compares what it observes with the committed
//! file; `scripts/evidence` (MOSAIC_WRITE_EVIDENCE=1) rewrites it — then the run uses a
//! copy of the registry whose entry carries a provisional evidence file, since the entry
//! being evidenced cannot load without one.

mod common;
mod harness;
mod pg;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use harness::*;
use serde_json::{json, Value};

fn suite(f: &Family, registry: Option<&Path>) -> Value {
    let (name, version) = f.runtime.split_once('@').unwrap();
    let mut checks: BTreeMap<&str, Value> = BTreeMap::new();
    let reg = match registry {
        Some(d) => mosaic::adapter::Registry::load_dir(d),
        None => mosaic::adapter::Registry::embedded(),
    }
    .expect("the registry loads");
    let rref = mosaic::adapter::RuntimeRef::parse(f.runtime).unwrap();
    let entry = reg.resolve(&rref).unwrap();

    // Version probe: the installed binary passes; one swapped in for another version fails.
    let paths = |root: PathBuf| mosaic::adapter::Paths {
        bin_dir: Path::new(common::MOSAIC).parent().unwrap().to_path_buf(),
        harness_root: root,
    };
    mosaic::adapter::probe_version(entry, &rref, &paths(harness_root()))
        .unwrap_or_else(|e| panic!("{e}; scripts/test installs it (mosaic harness install)"));
    checks.insert("version_probe", json!(format!("{version} accepted")));
    let swapped =
        std::env::temp_dir().join(format!("mosaic-swapped-{}", uuid::Uuid::new_v4().simple()));
    let probe_argv = mosaic::adapter::expand(
        &entry.probes.version.command,
        &mosaic::adapter::Vars {
            harness_root: swapped.clone(),
            version: version.to_string(),
            ..Default::default()
        },
        &[],
    );
    let fake_bin = PathBuf::from(&probe_argv[0]);
    std::fs::create_dir_all(fake_bin.parent().unwrap()).unwrap();
    std::fs::write(
        &fake_bin,
        "#!/bin/sh\necho '9.9.9 (Claude Code)'\necho 9.9.9\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &fake_bin,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let refused = mosaic::adapter::probe_version(entry, &rref, &paths(swapped.clone())).is_err();
    let _ = std::fs::remove_dir_all(&swapped);
    checks.insert(
        "swapped_binary",
        json!(if refused { "refused" } else { "ACCEPTED" }),
    );

    let model = Model::start();
    let (_creds, up, token) = Up::for_family(f, &model, registry);

    // Unknown lifecycle semantics: an unvalidated version is refused before anything.
    let other = format!("{name}@0.0.1");
    let e = up.assign(&other, "x", false).unwrap_err();
    checks.insert(
        "unvalidated_version",
        json!(if e.contains("unknown-runtime") {
            "refused"
        } else {
            "ACCEPTED"
        }),
    );

    // 1. A task reaches RUNNING: the contract in the harness's context, then the activation
    //    check typed into the pane as a turn, answered by the gateway from that turn's own
    //    request (nothing reaches a model before activation), the ACK taken from the turn's
    //    end (the Stop hook).
    let a = up
        .assign(f.runtime, "TASKMARKER-ONE: keep the lane tidy", true)
        .expect("assign reaches RUNNING");
    checks.insert("reaches_running", a["state"].clone());
    let id1 = a["assignment_id"].as_str().unwrap().to_string();
    let before_activation = model.requests().len();
    let g1 = up.generation();
    checks.insert(
        "activation_answered_without_a_model",
        json!(before_activation == 0 && g1["gateway"]["staged_answers"].as_u64() >= Some(1)),
    );
    checks.insert(
        "ack_taken_from_turn_end",
        json!(
            g1["harness"]["settled"].as_u64().unwrap_or(0) >= 1
                && up.screen().contains("mosaic-ack:")
        ),
    );
    // The first turn after activation takes the contract, and the activation exchange, to
    // the model.
    let settled_before = up.settled();
    up.type_turn("TASKMARKER-ONE-FOLLOWUP: begin");
    wait_for("the first active turn settled", common::PATIENCE, || {
        (up.settled() > settled_before).then_some(())
    });
    let conv = model.conversation();
    let with_contract = conv.iter().any(|b| b.contains("TASKMARKER-ONE:"));
    // The digest the supervisor reported as delivered is the contract's own, and it is the
    // one the model was given.
    let delivered = up.sql(
        "SELECT contracts_digest FROM reservations WHERE reservation_id = $1",
        a["reservation_id"].as_str().unwrap(),
    );
    let own = up.sql(
        "SELECT contracts_digest FROM contracts WHERE task_text = $1",
        "TASKMARKER-ONE: keep the lane tidy",
    );
    let digest_in_context = delivered.is_some()
        && delivered == own
        && delivered.as_ref().is_some_and(|d| {
            conv.iter()
                .any(|b| b.contains(&format!("Mosaic contract {d}")))
        });
    checks.insert(
        "contract_in_model_context",
        json!({"task_text": with_contract, "delivered_digest": digest_in_context}),
    );
    let challenged: Vec<&String> = conv
        .iter()
        .filter(|b| b.contains("mosaic-challenge:"))
        .collect();
    checks.insert(
        "challenge_turn_carries_contract",
        json!(!challenged.is_empty() && challenged.iter().all(|b| b.contains("TASKMARKER-ONE:"))),
    );
    // Credentials reached the endpoint, from the file, and nowhere else.
    let all = model.requests();
    let bearer = format!("Bearer {token}");
    let posts: Vec<&Value> = all.iter().filter(|r| r["method"] == "POST").collect();
    let reached = !posts.is_empty()
        && posts.iter().all(|r| {
            r["headers"].as_object().is_some_and(|h| {
                h.values()
                    .any(|v| v == &json!(bearer) || v == &json!(token))
            })
        });
    checks.insert("credentials_reach_the_harness", json!(reached));
    // Every request that reached the model was an effect admitted by the coordinator.
    let claims = up
        .sql(
            "SELECT count(*)::text FROM effect_claims WHERE assignment_id = $1 AND executor = 'provider'",
            &id1,
        )
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    checks.insert(
        "every_model_request_a_claim",
        json!(claims >= posts.len() && !posts.is_empty()),
    );

    // 2. Forged settled events: from outside the generation's cgroup, and from inside it
    //    about another conversation.
    // The harness itself (the recorded pid is its PID namespace's init).
    let harness_pid =
        common::harness_process(g1["process_identity"]["harness_pid"].as_i64().unwrap() as i32);
    let socket = std::fs::read(format!("/proc/{harness_pid}/environ"))
        .unwrap()
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix("MOSAIC_LANE_SOCKET=").map(str::to_string))
        .expect("the harness has a lane socket");
    let before = up.settled();
    let mut forged = Command::new(common::MOSAIC)
        .args(["lane", "hook", f.family_name(), "stop"])
        .env("MOSAIC_LANE_SOCKET", &socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let sid = g1["conversation_id"].as_str().unwrap_or("x");
        let mut stdin = forged.stdin.take().unwrap();
        let _ = stdin.write_all(
            json!({"session_id": sid, "hook_event_name": "Stop", "last_assistant_message": "done"})
                .to_string()
                .as_bytes(),
        );
    }
    let outside_ok = forged.wait().unwrap().success();
    checks.insert(
        "forged_settled_from_outside",
        json!(if !outside_ok && up.settled() == before {
            "refused"
        } else {
            "ACCEPTED"
        }),
    );
    // From inside (a tool the model runs): a Stop naming another conversation. Either the
    // supervisor refuses it, or the harness's tool sandbox cannot reach the socket at all
    // (Codex); it never counts as a turn end.
    let refused_before = up.generation()["harness"]["refused_events"]
        .as_u64()
        .unwrap();
    let settled_before = up.settled();
    up.type_turn(&format!(
        "model:run[echo '{{\"session_id\":\"forged\",\"hook_event_name\":\"Stop\"}}' | \"$MOSAIC_BIN\" lane hook {} stop]",
        f.family_name()
    ));
    wait_for("the tool turn settled", common::PATIENCE, || {
        (up.settled() > settled_before).then_some(())
    });
    let g = up.generation();
    let refused = g["harness"]["refused_events"].as_u64().unwrap() > refused_before;
    let counted = g["harness"]["settled"].as_u64().unwrap() > settled_before + 1;
    checks.insert(
        "forged_conversation_from_inside",
        json!(match (counted, refused) {
            (true, _) => "ACCEPTED",
            (false, true) => "refused",
            (false, false) => "unreachable from the harness's tools",
        }),
    );
    // From inside, as a hostile tool would (spec §5.5): the model's shell tool writes
    // outside the generation's areas, reads another process's environment (the `mosaic up`
    // process, outside the generation) and moves itself out of its cgroup. Confinement
    // denies all three; the host is unchanged.
    let g = up.generation();
    let work = up
        .dir
        .join("supervisor/harness")
        .join(g["lane_incarnation_id"].as_str().unwrap())
        .join(format!("gen-{}", g["generation"]))
        .join("work");
    let planted = up.dir.join("supervisor/planted-by-a-tool");
    let cg = up.cgroup();
    let settled_before = up.settled();
    // In a script the test leaves in the tool's working directory, as a tool hiding its
    // intent would: no harness-side check of the command line sees the paths; only the
    // kernel boundary stands between the tool and the host.
    std::fs::write(
        work.join("hostile.sh"),
        format!(
            "echo x > {}; cat /proc/{}/environ > leak; echo $$ > {}/cgroup.procs; \
             bash -c 'echo > /dev/tcp/127.0.0.1/{}' && echo x > direct; \
             bash -c 'p=${{HTTPS_PROXY#http://}}; exec 3<>/dev/tcp/${{p%:*}}/${{p##*:}}; \
               printf \"CONNECT 192.0.2.9:443 HTTP/1.1\\r\\nHost: 192.0.2.9:443\\r\\n\\r\\n\" >&3; head -c 12 <&3' > egress; \
             echo done > hostile\n",
            planted.display(),
            up.child.id(),
            cg.parent().unwrap().display(),
            model.port,
        ),
    )
    .unwrap();
    up.type_turn("model:run[sh hostile.sh]");
    wait_for("the hostile tool ran", common::PATIENCE, || {
        (up.settled() > settled_before && work.join("hostile").exists()).then_some(())
    });
    let leaked = std::fs::metadata(work.join("leak"))
        .map(|m| m.len())
        .unwrap_or(0);
    let parent_members =
        std::fs::read_to_string(cg.parent().unwrap().join("cgroup.procs")).unwrap();
    checks.insert(
        "hostile_tool",
        json!({
            "wrote_outside_its_areas": planted.exists(),
            "read_another_process_environment": leaked > 0,
            "left_its_cgroup": !parent_members.trim().is_empty(),
            "reached_the_provider_directly": work.join("direct").exists(),
        }),
    );
    // Partial authority (§17): the harness's model calls go on (this very turn settled
    // through them) while a tunnel its scope does not name is refused by the broker.
    let egress = std::fs::read_to_string(work.join("egress")).unwrap_or_default();
    let tunnels = up
        .sql(
            "SELECT count(*)::text FROM effect_claims WHERE assignment_id = $1 AND executor = 'egress'",
            &id1,
        )
        .unwrap_or_default();
    checks.insert(
        "partial_authority",
        json!({
            "egress_outside_the_scope": if egress.starts_with("HTTP/1.1 403") {
                "refused"
            } else if egress.is_empty() {
                "no route (its tools get no proxy variable)"
            } else {
                "ACCEPTED"
            },
            "egress_claims": tunnels,
            "model_turns_carried": up.settled() > settled_before,
        }),
    );
    // The provider's key is in no process of the generation: the gateway adds it.
    let holders: Vec<i32> = common::members(&cg)
        .iter()
        .filter(|(p, _)| {
            std::fs::read(format!("/proc/{p}/environ"))
                .is_ok_and(|e| String::from_utf8_lossy(&e).contains(&token))
        })
        .map(|(p, _)| *p)
        .collect();
    checks.insert("key_in_generation_environment", json!(!holders.is_empty()));

    // 3. Settled only after a turn, never while its tool call still runs.
    let cg = up.cgroup();
    let before = up.settled();
    up.type_turn("model:run[sleep 3.5]");
    let running = wait_for("the tool running", common::PATIENCE, || {
        let m = members_running(&cg, "sleep 3.5");
        (!m.is_empty()).then_some(m)
    });
    let during = up.settled();
    wait_for("the tool finished", common::PATIENCE, || {
        (survivors(&running) == 0).then_some(())
    });
    wait_for("settled after the turn", common::PATIENCE, || {
        (up.settled() > before).then_some(())
    });
    checks.insert(
        "settled",
        json!({"while_tool_runs": during > before, "after_the_turn": true}),
    );

    // 3b. §17 row 76: no settled report while the harness still has work of its own.
    checks.insert("parity", parity(&up, &model, &cg));

    // 4. No updater, daemon or resume: at rest, the generation is the shim, its PID
    // namespace's init and the harness. Once the last turn's hook processes (a shell,
    // `mosaic lane hook`) are gone, only the shim (`mosaic-shim`), the init (`mosaic-init`)
    // and the harness remain — no updater, daemon or helper.
    let mut at_rest: Vec<String> = wait_for("the hook processes gone", common::PATIENCE, || {
        // An extension's continuation wait comes and goes with each settled boundary: not
        // part of the rest (`tests/harness_continuity.rs` covers it).
        let c: Vec<String> = common::members(&cg)
            .iter()
            .map(|(p, _)| role(*p))
            .filter(|r| r != "mosaic lane hook next")
            .collect();
        (c.iter().filter(|x| *x == "mosaic-shim").count() == 1
            && !c.iter().any(|x| x == "sh" || x == "mosaic"))
        .then_some(c)
    });
    at_rest.sort();
    at_rest.dedup();
    assert!(at_rest.iter().any(|c| c == f.comm), "{at_rest:?}");
    checks.insert("processes_at_rest", json!(at_rest));
    // Started fresh: no resume/fork flag on its command line (where the harness did not
    // overwrite it with its process title), and the conversation id the supervisor chose is
    // the one its events named (the supervisor refuses any other, so RUNNING proves it).
    let argv = std::fs::read(format!("/proc/{harness_pid}/cmdline")).unwrap();
    let resumes = argv
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .any(|a| {
            [
                "--resume",
                "-r",
                "--continue",
                "-c",
                "--fork-session",
                "--fork",
                "--session",
            ]
            .contains(&a.as_str())
        });
    let chosen = g1["conversation_id"]
        .as_str()
        .is_some_and(|c| !c.is_empty());
    checks.insert("started_fresh", json!(!resumes && chosen));

    // 5. Stop with a tool tree (setsid'd, backgrounded, nohup'd) still running.
    up.type_turn("model:run[setsid sleep 1001 & (sleep 1002 &) ; nohup sleep 1003 >/dev/null 2>&1 & sleep 1004]");
    let tree = wait_for("the tool tree", common::PATIENCE, || {
        let m = members_running(&cg, "sleep 100");
        (m.len() >= 4).then_some(m)
    });
    let state_dir = up.dir.join("supervisor/harness");
    let r = up.stop(&id1);
    checks.insert(
        "stop_with_tool_tree",
        json!({"receipt": outcome(&r), "survivors": survivors(&tree)}),
    );
    // The receipt is sent once it is durable and the private area goes after that (it is
    // kept until the receipt is written): the receipt can reach the operator first, so
    // wait for the area's removal, bounded (never gone fails the check).
    let leftover = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&state_dir)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let since = std::time::Instant::now();
    while !leftover().is_empty() && since.elapsed() < common::PATIENCE {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let left = leftover();
    if !left.is_empty() {
        eprintln!("private state left after the stop: {left:?}");
    }
    checks.insert("private_state_removed", json!(left.is_empty()));

    // 6. A fresh generation sees nothing of the first one's conversation.
    let n_before = model.conversation().len();
    let b = up
        .assign(f.runtime, "TASKMARKER-TWO: a different task", true)
        .expect("second assign");
    let id2 = b["assignment_id"].as_str().unwrap().to_string();
    // Its first active turn: what the fresh generation's model is given.
    let settled_before = up.settled();
    up.type_turn("TASKMARKER-TWO-FOLLOWUP: begin");
    wait_for(
        "the second generation's first turn",
        common::PATIENCE,
        || (up.settled() > settled_before).then_some(()),
    );
    let second: Vec<String> = model.conversation().split_off(n_before);
    checks.insert(
        "fresh_state_per_generation",
        json!(if !second.is_empty()
            && second
                .iter()
                .all(|x| !x.contains("TASKMARKER-ONE") && !x.contains("sleep 1004"))
        {
            "nothing of the previous generation"
        } else {
            "LEAKED"
        }),
    );

    // 7. SIGKILL of a tool child: the harness lives on and settles; of the harness: receipt,
    //    recovery, no survivor.
    let cg = up.cgroup();
    let before = up.settled();
    up.type_turn("model:run[echo started; sleep 1005]");
    // The `sleep` itself (not a shell whose command line mentions it).
    let child = wait_for("the tool child", common::PATIENCE, || {
        members_running(&cg, "sleep 1005")
            .into_iter()
            .find(|(p, _)| comm(*p) == "sleep")
    });
    common::kill(child.0, nix::sys::signal::Signal::SIGKILL);
    wait_for("the killed tool child gone", common::PATIENCE, || {
        common::is_dead(child.0, child.1).then_some(())
    });
    for key in f.interrupt_after_tool_kill {
        std::thread::sleep(Duration::from_millis(300));
        up.key(key);
    }
    wait_for("settled after the killed tool", common::PATIENCE, || {
        (up.settled() > before).then_some(())
    });
    let g2 = up.generation();
    checks.insert(
        "sigkill_tool_child",
        json!({"harness_alive": g2["generation"] == b["generation"],
        "settled_after": if f.interrupt_after_tool_kill.is_empty() {
            "by itself"
        } else {
            "an operator interrupt (the harness waits on the killed tool otherwise)"
        }}),
    );
    up.type_turn("model:run[setsid sleep 1006 & sleep 1007]");
    let tree = wait_for("the tool tree", common::PATIENCE, || {
        let m = members_running(&cg, "sleep 100");
        (m.len() >= 2).then_some(m)
    });
    // The harness itself, not its namespace's init.
    let hp =
        common::harness_process(g2["process_identity"]["harness_pid"].as_i64().unwrap() as i32);
    let mut tree = tree;
    tree.extend(common::members(&cg));
    common::kill(hp, nix::sys::signal::Signal::SIGKILL);
    let r = up.receipt(&b["generation"]);
    wait_for("no survivor", common::PATIENCE, || {
        (survivors(&tree) == 0).then_some(())
    });
    checks.insert(
        "sigkill_harness",
        json!({"receipt": outcome(&r), "survivors": survivors(&tree)}),
    );
    let st = up.cli(&["status"]).unwrap();
    let a2 = st["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["assignment_id"] == id2.as_str())
        .cloned()
        .unwrap();
    checks.insert(
        "after_sigkill",
        json!({"assignment": a2["state"], "execution_owner": a2["execution_owner"]}),
    );
    // The harness's own session, sealed from its files at the SIGKILL (the receipt path),
    // encrypted to `mosaic up`'s recovery identity, in the store: that identity opens it,
    // and it holds the turn typed into the harness.
    checks.insert("harness_artifact", artifact_check(&up, &id2));

    // 8. An answer that does not bind the challenge (the phrase altered), or binds it but
    //    not the contract (its key left out: what a harness that never got the contract
    //    would answer), never activates.
    for (check, task) in [
        (
            "ack_not_binding_the_challenge",
            "TASKMARKER-THREE model:wrong-ack",
        ),
        (
            "ack_without_the_contract_key",
            "TASKMARKER-FOUR model:omit-contract-key",
        ),
    ] {
        let c = up.assign(f.runtime, task, false).expect("assign");
        let id = c["assignment_id"].as_str().unwrap().to_string();
        let g = wait_for("the answer refused", Duration::from_secs(60), || {
            let g = up.generation();
            (g["generation"] == c["generation"]
                && g["harness"]["ack_refused"].as_u64().unwrap_or(0) >= 1)
                .then_some(g)
        });
        let st = up.cli(&["status"]).unwrap();
        let s = st["assignments"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["assignment_id"] == id.as_str())
            .cloned()
            .unwrap();
        checks.insert(
            check,
            json!(if s["lane_state"] != "RUNNING"
                && s["execution_owner"].is_null()
                && g["harness"]["settled"].as_u64() >= Some(1)
            {
                "refused"
            } else {
                "ACCEPTED"
            }),
        );
        up.stop(&id);
    }

    // Secrets: the token is in no log, record or status of Mosaic's.
    let mut leaked = Vec::new();
    let mut stack = vec![up.dir.clone()];
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            if let Ok(d) = std::fs::read_dir(&p) {
                stack.extend(d.filter_map(|e| e.ok().map(|e| e.path())));
            }
        } else if std::fs::read(&p).is_ok_and(|b| String::from_utf8_lossy(&b).contains(&token)) {
            leaked.push(p.display().to_string());
        }
    }
    for text in [
        std::fs::read_to_string(up.dir.with_extension("log")).unwrap_or_default(),
        up.cli(&["status"]).unwrap().to_string(),
        up.host_status().to_string(),
        up.cli(&["receipts", "--lane", &up.lane()])
            .unwrap()
            .to_string(),
    ] {
        if text.contains(&token) {
            leaked.push("log/status/receipts".into());
        }
    }
    // The harness's own files (its transcript of the test token's requests) are its business
    // and are removed with its private area; the check above covers what remains.
    checks.insert("credentials_leaked_to", json!(leaked));
    // Nothing of the lane's uid is left on the host's shared temporary directories (Codex
    // made `/tmp/codex-daemon-<uid>` when it ran unconfined): a confined generation's are
    // its own and go with it.
    let lane_uid = up.host_status()["lanes"][0]["uid"].as_u64().unwrap() as u32;
    let mut left = Vec::new();
    for dir in ["/tmp", "/var/tmp", "/dev/shm"] {
        use std::os::unix::fs::MetadataExt;
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.metadata().is_ok_and(|m| m.uid() == lane_uid) {
                left.push(e.path().display().to_string());
            }
        }
    }
    checks.insert("files_left_on_the_host", json!(left));
    drop(up);

    json!({
        "suite": "mosaic-harness-conformance/v1",
        "runtime": name,
        "validated_versions": [version],
        "checks": checks,
    })
}

/// Waits until no hook process of the generation is left (a shell running a hook script,
/// `mosaic lane hook`): every event the last turn produced has then reached the supervisor.
/// Quiet means: no hook process, and the supervisor's observations unchanged across half
/// a second with none in between (a hook forked but not yet exec'd shows the harness's
/// own name).
/// The artifact of `assignment`'s generation, recovered with the CLI: where under the
/// private area its files came from (their first two path components) and whether they
/// hold the follow-up turn typed into the harness.
fn artifact_check(up: &Up, assignment: &str) -> Value {
    let row = wait_for("the artifact stored", common::PATIENCE, || {
        let v = up
            .cli(&["checkpoint", "artifacts", "--assignment", assignment])
            .ok()?;
        v.as_array()?.iter().find(|r| r["stored"] == true).cloned()
    });
    let out = up.dir.with_extension("artifact");
    let _ = std::fs::remove_dir_all(&out);
    let identity = mosaic::up::recovery_identity(&up.dir);
    let got = up
        .cli(&[
            "checkpoint",
            "artifact",
            row["artifact_digest"].as_str().unwrap(),
            "--identity",
            identity.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ])
        .unwrap_or_else(|e| panic!("recovering the artifact: {e}"));
    let files: Vec<String> = got["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    let from: std::collections::BTreeSet<String> = files
        .iter()
        .map(|f| f.split('/').take(2).collect::<Vec<_>>().join("/"))
        .collect();
    let holds = files.iter().any(|f| {
        std::fs::read(out.join(f))
            .is_ok_and(|b| b.windows(23).any(|w| w == b"TASKMARKER-TWO-FOLLOWUP"))
    });
    let _ = std::fs::remove_dir_all(&out);
    json!({
        "from": from,
        "holds_the_typed_turn": holds,
        "classification": row["classification"],
        "recipients_match": row["recipients_match"],
    })
}

/// What a generation's process is, by its name: an extension's wait for its next
/// continuation (`mosaic lane hook <family> next`, alive as long as the harness is settled)
/// is told apart from a hook still forwarding an event.
fn role(pid: i32) -> String {
    let c = comm(pid);
    if c == "mosaic"
        && (common::cmdline_contains(pid, " hook pi next")
            || common::cmdline_contains(pid, " hook opencode next"))
    {
        return "mosaic lane hook next".into();
    }
    c
}

fn hooks_done(up: &Up, cg: &Path) {
    // An extension's wait for its next continuation (`mosaic lane hook <family> next`)
    // lasts as long as the harness is settled: it is no event still being forwarded.
    let no_hooks = || {
        !common::members(cg)
            .iter()
            .any(|(p, _)| matches!(role(*p).as_str(), "sh" | "mosaic"))
    };
    up.wait_for("the hook processes gone", || {
        if !no_hooks() {
            return None;
        }
        let seen = up.generation()["harness"].clone();
        std::thread::sleep(std::time::Duration::from_millis(500));
        (no_hooks() && up.generation()["harness"] == seen).then_some(())
    });
}

/// The latest user text of every request the model received after the first `skip`.
fn latest_texts(model: &Model, skip: usize) -> Vec<(Value, String)> {
    model
        .requests()
        .into_iter()
        .skip(skip)
        .filter(|r| r["method"] == "POST")
        .filter_map(|r| {
            let api = mosaic::testmodel::Api::of_path(r["path"].as_str()?)?;
            let (_, text) = mosaic::testmodel::latest_turn(api, &r["body"]);
            Some((r["status"].clone(), text))
        })
        .collect()
}

/// §17 row 76, cross-harness settled parity: while the harness still has work of its own —
/// a retry after the provider refused it, a compaction of a context it believes full, a
/// follow-up typed while it worked — no settled report may come; once all of it is done,
/// exactly one does.
fn parity(up: &Up, model: &Model, cg: &Path) -> Value {
    let mut out = serde_json::Map::new();

    // Retry: the provider refuses the turn's first request as overloaded.
    hooks_done(up, cg);
    let (before, skip) = (up.settled(), model.requests().len());
    up.type_turn("model:fail-once[parity-retry] model:run[sleep 2.5]");
    let running = up.wait_for("the retried turn's tool", || {
        let m = members_running(cg, "sleep 2.5");
        (!m.is_empty()).then_some(m)
    });
    let during = up.settled();
    up.wait_for("the tool finished", || {
        (survivors(&running) == 0).then_some(())
    });
    up.wait_for("settled after the retried turn", || {
        (up.settled() > before).then_some(())
    });
    hooks_done(up, cg);
    let seen = latest_texts(model, skip);
    let refused = seen
        .iter()
        .filter(|(st, t)| st != &json!(200) && t.contains("parity-retry"))
        .count();
    out.insert(
        "retry".into(),
        json!({"provider_refused": refused, "asked_again": seen.iter().any(|(st, t)| st == &json!(200) && t.contains("parity-retry")),
            "settled_while_retrying": during > before, "settled_reports": up.settled() - before}),
    );

    // Compaction: the turn's answer says the context is nearly full.
    let (before, skip) = (up.settled(), model.requests().len());
    let refused_before = up.generation()["harness"]["refused_events"]
        .as_u64()
        .unwrap_or(0);
    let compactions_before = up.generation()["harness"]["compactions"]
        .as_u64()
        .unwrap_or(0);
    up.type_turn("model:huge-usage[parity-compact] model:run[sleep 1.5]");
    // The moment the summary is asked for: the harness is compacting.
    let summarizing = |r: &Value| {
        mosaic::testmodel::Api::of_path(r["path"].as_str().unwrap_or("")).is_some_and(|api| {
            mosaic::testmodel::latest_turn(api, &r["body"])
                .1
                .to_lowercase()
                .contains("summar")
        })
    };
    up.wait_for("the harness compacting", || {
        model
            .requests()
            .iter()
            .skip(skip)
            .any(summarizing)
            .then_some(())
    });
    up.wait_for("settled after the compacting turn", || {
        (up.settled() > before).then_some(())
    });
    hooks_done(up, cg);
    // By event order, not by a poll: the turn's settled report (there must be exactly one,
    // `settled_reports` below) came while compacting if the supervisor took it before the
    // summary's answer was even sent. Both times are this host's clock.
    let time = |v: &Value| v.as_str().and_then(|t| humantime::parse_rfc3339(t).ok());
    let summary_answered_at = model
        .requests()
        .iter()
        .skip(skip)
        .find(|r| summarizing(r))
        .and_then(|r| time(&r["at"]));
    let settled_at = time(&up.generation()["harness"]["last_settled_at"]);
    let settled_while_compacting = match (settled_at, summary_answered_at) {
        (Some(s), Some(a)) => s < a,
        // Not observed: never counted as parity.
        _ => true,
    };
    let seen = latest_texts(model, skip);
    let compacted = seen
        .iter()
        .any(|(_, t)| t.to_lowercase().contains("summar"));
    // After the summary replaced the history, the model still gets the contract.
    let after: Vec<Value> = model.requests().into_iter().skip(skip).collect();
    let summary_at = after.iter().position(summarizing);
    let contract_kept = summary_at.map(|i| {
        after[i + 1..].iter().any(|r| {
            r["body"]["tools"].as_array().is_some_and(|t| !t.is_empty())
                && r["body"].to_string().contains("Mosaic contract")
        })
    });
    out.insert(
        "compaction".into(),
        json!({"compacted": compacted, "contract_after_it": contract_kept,
            "settled_while_compacting": settled_while_compacting,
            // Families whose contract rides in the history (Claude Code, Codex) ask for it
            // again after a compaction; those that put it in every request's system
            // prompt (OpenCode, Pi) need not.
            "compactions_announced_to_the_supervisor": up.generation()["harness"]["compactions"].as_u64().unwrap_or(0) - compactions_before,
            "settled_reports": up.settled() - before,
            "events_refused": up.generation()["harness"]["refused_events"].as_u64().unwrap_or(0) - refused_before}),
    );

    // Follow-up: a second line typed while the first turn's tool still runs.
    let (before, skip) = (up.settled(), model.requests().len());
    up.type_turn("model:run[sleep 3.5] parity-first");
    let first = up.wait_for("the first tool", || {
        let m = members_running(cg, "sleep 3.5");
        (!m.is_empty()).then_some(m)
    });
    up.type_turn("model:run[sleep 2.2] parity-follow-up");
    let second = up.wait_for("the follow-up's tool", || {
        let m = members_running(cg, "sleep 2.2");
        (!m.is_empty()).then_some(m)
    });
    let during = up.settled();
    let first_done_before = survivors(&first) == 0;
    up.wait_for("the follow-up finished", || {
        (survivors(&second) == 0).then_some(())
    });
    up.wait_for("settled after the follow-up", || {
        (up.settled() > before).then_some(())
    });
    hooks_done(up, cg);
    let seen = latest_texts(model, skip);
    out.insert(
        "follow_up".into(),
        json!({"follow_up_reached_the_model": seen.iter().any(|(_, t)| t.contains("parity-follow-up")),
            "first_tool_done_before_it": first_done_before,
            "settled_before_the_follow_up_ran": during > before,
            "settled_reports": up.settled() - before}),
    );
    Value::Object(out)
}

/// A copy of the committed registry in which `runtime`'s entry carries a provisional
/// evidence file (for regenerating that evidence).
fn provisional_registry(runtime: &str, version: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mosaic-reg-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(registry_dir()).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let evidence = json!({"runtime": runtime, "validated_versions": [version],
        "provisional": "stands in while scripts/evidence regenerates this evidence"})
    .to_string();
    std::fs::write(dir.join(format!("{runtime}.evidence.json")), &evidence).unwrap();
    let digest = {
        use sha2::Digest;
        format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(evidence.as_bytes()))
        )
    };
    set_digest(&dir.join(format!("{runtime}.toml")), &digest);
    dir
}

fn set_digest(toml_path: &Path, digest: &str) {
    let toml = std::fs::read_to_string(toml_path).unwrap();
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
    std::fs::write(toml_path, updated.join("\n") + "\n").unwrap();
}

fn run(f: &Family) {
    let (name, version) = f.runtime.split_once('@').unwrap();
    let write = std::env::var_os("MOSAIC_WRITE_EVIDENCE").is_some();
    let provisional = write.then(|| provisional_registry(name, version));
    // Codex 0.171.0 makes an empty /tmp/codex-daemon-<uid> even with its daemon off,
    // already for `--version` (so the install's probe makes it first): a fixed path,
    // whatever TMPDIR says. Its suite removes it while it is empty, also when the suite
    // fails.
    struct Leftover(Option<PathBuf>);
    impl Drop for Leftover {
        fn drop(&mut self) {
            if let Some(p) = &self.0 {
                let _ = std::fs::remove_dir(p);
            }
        }
    }
    let codex_dir = PathBuf::from(format!(
        "/tmp/codex-daemon-{}",
        nix::unistd::getuid().as_raw()
    ));
    let _leftover = Leftover((name == "codex").then_some(codex_dir));
    let evidence = suite(f, provisional.as_deref());
    if let Some(d) = provisional {
        let _ = std::fs::remove_dir_all(d);
    }
    let text = format!("{}\n", serde_json::to_string_pretty(&evidence).unwrap());
    let flat = evidence.to_string();
    for bad in ["ACCEPTED", "LEAKED"] {
        assert!(!flat.contains(bad), "conformance failure: {bad} in {text}");
    }
    let c = &evidence["checks"];
    for (path, want) in [
        ("/reaches_running", json!("RUNNING")),
        ("/contract_in_model_context/task_text", json!(true)),
        ("/contract_in_model_context/delivered_digest", json!(true)),
        ("/challenge_turn_carries_contract", json!(true)),
        ("/activation_answered_without_a_model", json!(true)),
        ("/every_model_request_a_claim", json!(true)),
        ("/ack_taken_from_turn_end", json!(true)),
        ("/credentials_reach_the_harness", json!(true)),
        ("/credentials_leaked_to", json!([])),
        ("/files_left_on_the_host", json!([])),
        ("/settled/while_tool_runs", json!(false)),
        ("/settled/after_the_turn", json!(true)),
        ("/started_fresh", json!(true)),
        ("/private_state_removed", json!(true)),
        ("/stop_with_tool_tree/survivors", json!(0)),
        ("/stop_with_tool_tree/receipt/verified_empty", json!(true)),
        ("/sigkill_harness/survivors", json!(0)),
        ("/sigkill_harness/receipt/verified_empty", json!(true)),
        ("/sigkill_tool_child/harness_alive", json!(true)),
        ("/after_sigkill/assignment", json!("RECOVERY")),
        ("/harness_artifact/holds_the_typed_turn", json!(true)),
        ("/harness_artifact/classification", json!("sensitive")),
        ("/harness_artifact/recipients_match", json!(true)),
        // §17 row 76: one settled report per piece of work, none while work remains.
        ("/parity/retry/provider_refused", json!(1)),
        ("/parity/retry/asked_again", json!(true)),
        ("/parity/retry/settled_while_retrying", json!(false)),
        ("/parity/retry/settled_reports", json!(1)),
        ("/parity/compaction/compacted", json!(true)),
        ("/parity/compaction/contract_after_it", json!(true)),
        ("/parity/compaction/settled_while_compacting", json!(false)),
        ("/parity/compaction/settled_reports", json!(1)),
        ("/parity/compaction/events_refused", json!(0)),
        ("/parity/follow_up/follow_up_reached_the_model", json!(true)),
        ("/parity/follow_up/first_tool_done_before_it", json!(true)),
        (
            "/parity/follow_up/settled_before_the_follow_up_ran",
            json!(false),
        ),
        ("/parity/follow_up/settled_reports", json!(1)),
        // A hostile tool reaches nothing beyond the generation; the key is never in it.
        ("/hostile_tool/wrote_outside_its_areas", json!(false)),
        (
            "/hostile_tool/read_another_process_environment",
            json!(false),
        ),
        ("/hostile_tool/left_its_cgroup", json!(false)),
        ("/hostile_tool/reached_the_provider_directly", json!(false)),
        ("/partial_authority/egress_claims", json!("0")),
        ("/partial_authority/model_turns_carried", json!(true)),
        ("/key_in_generation_environment", json!(false)),
    ] {
        assert_eq!(
            c.pointer(path),
            Some(&want),
            "conformance failure at {path} in {text}"
        );
    }
    let path = registry_dir().join(format!("{name}.evidence.json"));
    if write {
        std::fs::write(&path, &text).unwrap();
        let digest = {
            use sha2::Digest;
            format!(
                "sha256:{}",
                hex::encode(sha2::Sha256::digest(text.as_bytes()))
            )
        };
        set_digest(&registry_dir().join(format!("{name}.toml")), &digest);
        eprintln!("wrote {} ({digest})", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        committed, text,
        "{name} no longer behaves as its committed evidence says; if the change is intended, run scripts/evidence and commit"
    );
}

/// The other documented form of Claude Code's credentials: `ANTHROPIC_API_KEY` (the suite
/// runs with `ANTHROPIC_AUTH_TOKEN`). Claude Code asks before it uses a key it finds in its
/// environment; the adapter answers in advance, so the session reaches its first turn and
/// the real key (added by the gateway) reaches the provider.
#[test]
fn claude_code_activates_with_an_api_key() {
    let model = Model::start();
    let token = format!("mosaic-test-key-{}", uuid::Uuid::new_v4().simple());
    let dir = TempDir::new("mosaic-creds");
    let creds = dir.0.join("claude-code.env");
    std::fs::write(&creds, format!("ANTHROPIC_API_KEY={token}\n")).unwrap();
    std::fs::set_permissions(&creds, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let up = Up::start(
        "claude-code",
        &creds,
        None,
        None,
        &format!("http://127.0.0.1:{}", model.port),
    );
    let a = up
        .assign(CLAUDE.runtime, "TASKMARKER-KEY: keep the lane tidy", true)
        .expect("an API key in the credentials file activates");
    assert_eq!(a["state"], "RUNNING", "{a}");
    let keyed = model
        .requests()
        .iter()
        .filter(|r| r["method"] == "POST")
        .all(|r| r["headers"]["x-api-key"] == json!(token));
    assert!(keyed, "every provider request carried the real key");
    up.stop(a["assignment_id"].as_str().unwrap());
}

#[test]
fn claude_code_conformance_matches_its_committed_evidence() {
    run(&CLAUDE);
}

#[test]
fn pi_conformance_matches_its_committed_evidence() {
    run(&PI);
}

#[test]
fn opencode_conformance_matches_its_committed_evidence() {
    run(&OPENCODE);
}

#[test]
fn codex_conformance_matches_its_committed_evidence() {
    run(&CODEX);
}
