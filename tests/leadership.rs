//! Leadership (spec §5.1): one epoch at a time, rooted in the primary's clock — at the store,
//! with coordinators killed, paused past their lease and taken over by a standby, and with
//! `mosaic up` killed and restarted.

mod common;
mod pg;
mod store;
mod up;
mod world;

use store::*;
use up::*;
use world::split::*;

#[tokio::test]
async fn split_brain_the_stale_coordinator_can_do_nothing() {
    let f = fx().await;
    let s = &f.store;
    let inc = f.lane.lane_incarnation_id.clone();
    // A releases; B takes a short lease, starts a chain, then stalls past expiry. (A second
    // lane runs work under B: its leases are B's to renew until B's lease runs out.)
    s.release(&f.leader).await.unwrap();
    let (b, _) = s.acquire(&candidate("b"), 400).await.unwrap();
    let lane3 = adopt(s, &b, "h1:w3").await;
    let ran = running(s, &b, &lane3.lane_incarnation_id).await;
    s.renew_leases(&b, ran.chain(), 60_000).await.unwrap();
    let r = to_awaiting_ack(s, &b, &inc, None, 60_000).await;
    let b_ack = ack(&b, &r);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // C takes over (the lease expired by database time).
    let (c, _) = s.acquire(&candidate("c"), 60_000).await.unwrap();
    assert!(c.epoch() > b.epoch());
    let lane2 = adopt(s, &c, "h1:w2").await;
    let before = authority_counts(&f.db.url).await;
    let mut b2 = b.clone();
    assert_eq!(
        category(
            s.reserve(&b, &request(&lane2.lane_incarnation_id, None, 60_000))
                .await
        ),
        Category::StaleLeader
    );
    assert_eq!(
        category(s.consume_ack(&b, &b_ack).await),
        Category::StaleLeader
    );
    assert_eq!(
        category(
            s.ingest_termination(&b, HOST, &receipt_for(&r, "sigkill", true))
                .await
        ),
        Category::StaleLeader
    );
    assert_eq!(
        category(
            s.quarantine(&b, &lane2.lane_incarnation_id, "stale", false)
                .await
        ),
        Category::StaleLeader
    );
    assert_eq!(
        category(s.renew(&mut b2, 60_000).await),
        Category::StaleLeader
    );
    assert_eq!(
        category(s.renew_leases(&b, ran.chain(), 60_000).await),
        Category::StaleLeader,
        "a stale epoch renewed a lease"
    );
    assert_eq!(
        authority_counts(&f.db.url).await,
        before,
        "the stale leader changed something"
    );
    assert_eq!(
        audited(s, "reserve", "stale-leader").await
            + audited(s, "consume-ack", "stale-leader").await
            + audited(s, "ingest-termination", "stale-leader").await
            + audited(s, "quarantine", "stale-leader").await
            + audited(s, "leadership-renew", "stale-leader").await
            + audited(s, "renew-leases", "stale-leader").await,
        6
    );
    // The takeover ended B's preactivation chain: recovery, and its generation is to be
    // stopped (the lane drains until the host proves it ended).
    assert_eq!(state(s, "h1:w1").await, "DRAINING");
    let a = assignment(s, &r.chain().assignment_id).await;
    assert_eq!(
        (a.lifecycle.as_str(), a.execution_owner.as_deref()),
        ("RECOVERY", None)
    );
    let row = s
        .chain_by_reservation(&r.chain().reservation_id)
        .await
        .unwrap()
        .unwrap();
    assert!(row.stop_requested && !row.reservation_open);
    // The old ACK cannot activate under the new epoch either.
    let mut c_ack = b_ack.clone();
    c_ack.coordinator_epoch = c.epoch();
    assert_eq!(
        category(s.consume_ack(&c, &c_ack).await),
        Category::StaleLeader,
        "the challenge was issued under epoch B"
    );
    // The host's receipt ends the generation; the lane is clean again.
    s.ingest_termination(&c, HOST, &receipt_for(&r, "quit", true))
        .await
        .unwrap();
    s.finish(&c, &inc).await.unwrap();
    assert_eq!(state(s, "h1:w1").await, "IDLE_CLEAN");
}

#[tokio::test]
async fn concurrent_epoch_acquisitions_yield_one_epoch() {
    let f = fx().await;
    let s = &f.store;
    s.release(&f.leader).await.unwrap();
    let before = count(&f.db.url, "SELECT max(epoch) FROM epochs").await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.acquire(&candidate(&format!("n{i}")), 60_000).await
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok((l, _)) => winners.push(l.epoch()),
            Err(e) => assert_eq!(e.category(), Some(Category::LeadershipHeld)),
        }
    }
    assert_eq!(winners, vec![before + 1]);
    assert_eq!(
        count(&f.db.url, "SELECT max(epoch) FROM epochs").await,
        before + 1
    );
    // Epochs are never reused: rewriting history is refused by the schema.
    let c = sql(&f.db.url).await;
    assert!(c
        .execute("UPDATE epochs SET epoch = 1000", &[])
        .await
        .is_err());
}

#[tokio::test]
async fn a_lapsed_leader_reacquires_with_a_new_epoch_and_its_old_epoch_is_dead() {
    let f = fx().await;
    let s = &f.store;
    let cand = candidate("lapsing");
    s.release(&f.leader).await.unwrap();
    let (first, _) = s.acquire(&cand, 300).await.unwrap();
    // The same launch retrying after an ambiguous commit finds its own acquisition.
    let (same, _) = s.acquire(&cand, 300).await.unwrap();
    assert_eq!(same.epoch(), first.epoch());
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let mut stale = first.clone();
    assert_eq!(
        category(s.renew(&mut stale, 300).await),
        Category::StaleLeader
    );
    // The lapse heals: the same launch takes a new epoch (its key names the epoch).
    let (again, r) = s.acquire(&cand, 60_000).await.unwrap();
    assert_eq!(again.epoch(), first.epoch() + 1);
    assert_eq!(r.body["previous_epoch"], first.epoch());
    let lane = adopt(s, &again, "h1:w3").await;
    assert_eq!(
        category(
            s.reserve(&first, &request(&lane.lane_incarnation_id, None, 60_000))
                .await
        ),
        Category::StaleLeader
    );
    s.reserve(&again, &request(&lane.lane_incarnation_id, None, 60_000))
        .await
        .unwrap();
}

/// §17 Coordinator epoch takeover, credential rotation: a coordinator whose credential was
/// rotated is a new candidate. Its running launch cannot keep its epoch under the new
/// credential (the ambiguous-commit path refuses a changed credential), a new launch with
/// the new credential cannot take over an unexpired lease, and once the lease has run out
/// it takes the next epoch, bound to the new credential; the old epoch can then neither
/// renew nor mutate, and the old credential's launch cannot come back while the new one
/// holds.
#[tokio::test]
async fn a_rotated_credential_takes_a_new_epoch_and_the_old_one_is_dead() {
    let f = fx().await;
    let s = &f.store;
    s.release(&f.leader).await.unwrap();
    let old = candidate("rotating");
    let (first, _) = s.acquire(&old, 300).await.unwrap();
    // The same launch, its credential rotated: not its epoch any more.
    let same_launch_rotated = Candidate {
        credential_digest: d('e'),
        ..old.clone()
    };
    assert_eq!(
        category(s.acquire(&same_launch_rotated, 60_000).await.map(|_| ())),
        Category::Mismatch
    );
    // A new launch with the rotated credential waits for the lease like anyone.
    let rotated = Candidate {
        credential_digest: d('e'),
        launch_id: format!("launch-{}", uuid::Uuid::new_v4().simple()),
        ..old.clone()
    };
    assert_eq!(
        category(s.acquire(&rotated, 60_000).await.map(|_| ())),
        Category::LeadershipHeld
    );
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (second, r) = s.acquire(&rotated, 60_000).await.unwrap();
    assert_eq!(second.epoch(), first.epoch() + 1);
    assert_eq!(r.body["previous_epoch"], first.epoch());
    let c = sql(&f.db.url).await;
    let bound: String = c
        .query_one("SELECT credential_digest FROM leadership", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(bound, d('e'));
    // The old epoch is dead: no renewal, no mutation.
    let mut stale = first.clone();
    assert_eq!(
        category(s.renew(&mut stale, 60_000).await),
        Category::StaleLeader
    );
    let lane = adopt(s, &second, "h1:w4").await;
    assert_eq!(
        category(
            s.reserve(&first, &request(&lane.lane_incarnation_id, None, 60_000))
                .await
        ),
        Category::StaleLeader
    );
    // The old credential's launch retrying its acquisition gets nothing while the new
    // one holds; the new epoch is the one that mutates.
    assert_eq!(
        category(s.acquire(&old, 60_000).await.map(|_| ())),
        Category::LeadershipHeld
    );
    s.reserve(&second, &request(&lane.lane_incarnation_id, None, 60_000))
        .await
        .unwrap();
    assert_eq!(
        count(&f.db.url, "SELECT max(epoch) FROM epochs").await,
        second.epoch()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_paused_past_its_lease_reacquires_and_its_inflight_transition_is_refused() {
    let mut w = Split::new(2);
    // The pause lands inside consume-ack: the transaction is open, its commit still ahead.
    w.crash_coordinator(0);
    let held = held_before_commit(&w, "consume-ack");
    w.start_coordinator(0, Some(&held));
    let first = w.wait_leading(0);
    w.wait_host_connected();
    let waiter = w.assign_async(1, "hang");
    // In flight: the lane waits for its ACK and a coordinator transaction has sat open far
    // longer than any transition takes (the failpoint holds it before its commit).
    pause_past_lease(
        &w,
        "consume-ack",
        &format!(
            "SELECT count(*) FROM pg_stat_activity a, lane_incarnations li \
             WHERE a.application_name = 'mosaic-coordinator' AND a.state = 'idle in transaction' \
               AND clock_timestamp() - a.state_change > interval '400 ms' \
               AND li.lane_id = '{}' AND li.retired_at IS NULL AND li.state = 'AWAITING_ACK'",
            w.lane(1)
        ),
    );
    // The commit came after the lease lapsed: refused. No other coordinator runs, so the
    // same process takes a higher epoch and ends the chain it had in flight.
    let _ = waiter.join();
    let second = w.wait_leading(0);
    assert!(
        second > first,
        "re-acquired with a higher epoch ({first} → {second})"
    );
    assert_eq!(
        w.count("SELECT count(*) FROM transition_receipts WHERE transition = 'consume-ack'")
            .await,
        0,
        "the transition in flight across the lapse committed"
    );
    let st = w.op(&OperatorRequest::Status).unwrap();
    assert!(st["leadership"]["losses"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(w.wait_settled(1, "after the lapse"), "IDLE_CLEAN");
    assert_eq!(w.assignment_row(&w.lane(1)).await.unwrap().1, "RECOVERY");
    // Work continues under the new epoch.
    w.usable(1).await;
    w.usable(2).await;
}

/// Leadership acquisition runs in the transition frame like every other authority change,
/// so it has the same crash points: killed before its commit it minted nothing (the next
/// acquisition takes the very next epoch), killed after it the epoch and its receipt are
/// there and the next one takes the epoch after — and lanes work under either.
#[tokio::test(flavor = "multi_thread")]
async fn a_coordinator_killed_around_its_acquisition_commit_mints_an_epoch_only_with_its_receipt() {
    let mut w = Split::new(1);
    let first = w.wait_leading(0);
    w.crash_coordinator(0);
    // Before the commit: nothing of the acquisition survives.
    w.start_coordinator(0, Some("before-commit:leadership-acquire=return"));
    w.wait_coordinator_died(0, "before-commit:leadership-acquire");
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM epochs WHERE epoch > {first}"
        ))
        .await,
        0,
        "an acquisition killed before its commit minted an epoch"
    );
    w.start_coordinator(0, None);
    let second = w.wait_leading(0);
    assert_eq!(
        second,
        first + 1,
        "the next acquisition takes the very next epoch"
    );
    w.crash_coordinator(0);
    // After the commit: the epoch exists, with its receipt, though its holder is dead.
    w.start_coordinator(0, Some("after-commit:leadership-acquire=return"));
    w.wait_coordinator_died(0, "after-commit:leadership-acquire");
    let receipts = format!(
        "SELECT count(*) FROM transition_receipts r JOIN idempotency i USING (receipt_id) \
         WHERE r.transition = 'leadership-acquire' AND r.coordinator_epoch = {}",
        second + 1
    );
    assert_eq!(
        w.count(&receipts).await,
        1,
        "the committed acquisition has its receipt"
    );
    w.start_coordinator(0, None);
    let third = w.wait_leading(0);
    assert_eq!(
        third,
        second + 2,
        "the dead acquisition's epoch is never reused"
    );
    w.wait_host_connected();
    w.usable(1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_standby_takes_over_a_dead_leader_and_drives_every_chain_on() {
    let mut w = Split::new(2);
    // The leader will die mid-chain on the second assignment, after the host's identity
    // was recorded; the first one runs.
    w.crash_coordinator(0);
    w.start_coordinator(0, Some("after-commit:staged=1*print(first)->return"));
    w.wait_leading(0);
    w.wait_host_connected();
    let running = w.assign(1, "hang").unwrap();
    // A second coordinator on the same database stands by.
    w.start_coordinator(1, None);
    let st = operator_call(&w.socket(1), &OperatorRequest::Status).unwrap();
    assert_eq!(st["leadership"]["state"], "standby");
    let waiter = w.assign_async(2, "hang");
    w.wait_coordinator_died(0, "after-commit:staged");
    let _ = waiter.join();
    // The standby leads within the lease plus one renewal interval of the old lease's end
    // (database times, both from its acquisition receipt).
    let epoch = w.wait_leading(1);
    let gap_ms: f64 = w
        .sql()
        .await
        .query_one(
            "SELECT EXTRACT(EPOCH FROM (decided_at - (body->>'previous_lease_expires_at')::timestamptz))::float8 * 1000 \
             FROM transition_receipts WHERE transition = 'leadership-acquire' AND coordinator_epoch = $1",
            &[&epoch],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        gap_ms <= (LEASE_MS + LEASE_MS / 3) as f64,
        "took over {gap_ms} ms after the lease ended"
    );
    // It drives every chain on with no operator action: the host reconnects to it, the
    // interrupted chain ends with its generation stopped, the RUNNING one keeps running.
    assert_eq!(w.wait_settled(2, "driven on by the standby"), "IDLE_CLEAN");
    assert_eq!(w.assignment_row(&w.lane(2)).await.unwrap().1, "RECOVERY");
    assert_eq!(w.wait_settled(1, "kept running"), "RUNNING");
    assert_eq!(
        w.stop_final(running["assignment_id"].as_str().unwrap())["state"],
        "CANCELLED"
    );
    w.usable(1).await;
    w.usable(2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_that_loses_its_lease_to_the_standby_hands_its_hosts_over() {
    let mut w = Split::new(2);
    w.wait_leading(0);
    w.wait_host_connected();
    let running = w.assign(1, "hang").unwrap();
    w.start_coordinator(1, None);
    // Paused for a few leases — far less than the session liveness limit (15 s), so the
    // host sees nothing wrong with its session to the paused leader.
    let pid = nix::unistd::Pid::from_raw(w.coord_pid(0));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let epoch = w.wait_leading(1);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    // The old leader learns it lost (its renewal is refused) and lets its hosts go; the
    // host reconnects, the old leader refuses it as a standby, and it lands on the leader.
    let me = format!("host:{}", w.hosts[0]);
    common::wait_until("the host on the new leader", || {
        let st = operator_call(&w.socket(1), &OperatorRequest::Status).ok()?;
        st["hosts_connected"]
            .as_array()?
            .iter()
            .any(|h| h == me.as_str())
            .then_some(())
    });
    let old = operator_call(&w.socket(0), &OperatorRequest::Status).unwrap();
    assert_eq!(old["leadership"]["state"], "standby", "{old}");
    assert!(
        old["hosts_connected"].as_array().unwrap().is_empty(),
        "the old leader kept a host session: {old}"
    );
    assert!(w.wait_leading(1) >= epoch);
    assert_eq!(
        w.stop_final(running["assignment_id"].as_str().unwrap())["state"],
        "CANCELLED"
    );
    w.usable(2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mosaic_up_killed_or_stopped_and_restarted_leaves_every_lane_usable() {
    let mut up = Up::start(2);
    let (l1, l2) = (up.lane_id(1), up.lane_id(2));
    let running = up.assign(&l1, "hang spawn=2");
    // Lane 2 waits for an ACK that never comes.
    let dir = up.dir.clone();
    let l2c = l2.clone();
    let pending = std::thread::spawn(move || {
        Command::new(common::MOSAIC)
            .args([
                "assign",
                "--lane",
                &l2c,
                "--runtime",
                "fake@1.0.0",
                "--task",
                "no-ack hang",
                "--wait",
                "running",
                "--json",
                "--state-dir",
            ])
            .arg(&dir)
            .output()
    });
    wait_for("lane 2 waiting for its ACK", || {
        (up.lane_state(&l2) == "AWAITING_ACK").then_some(())
    });
    // SIGKILL: nothing is torn down. The restarted `up` re-adopts the RUNNING generation and
    // ends the chain that lost its hand-off (new epoch), stopping its generation.
    up.restart_after(nix::sys::signal::Signal::SIGKILL);
    let _ = pending.join();
    wait_for("lane 1 still RUNNING", || {
        (up.lane_state(&l1) == "RUNNING").then_some(())
    });
    wait_for("lane 2 clean", || {
        (up.lane_state(&l2) == "IDLE_CLEAN").then_some(())
    });
    let st = up.cli(&["status"]).unwrap();
    let a2 = st["assignments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["lane_id"] == l2.as_str())
        .unwrap()
        .clone();
    assert_eq!(a2["state"], "RECOVERY");
    // Stop, resume and new work all succeed.
    let s = up
        .cli(&[
            "stop",
            "--assignment",
            running["assignment_id"].as_str().unwrap(),
        ])
        .unwrap();
    assert_eq!(s["state"], "CANCELLED");
    let r = up
        .cli(&[
            "assign",
            "--lane",
            &l2,
            "--runtime",
            "fake@1.0.0",
            "--task",
            "hang",
            "--wait",
            "running",
            "--replace-task",
            "--resume",
            a2["assignment_id"].as_str().unwrap(),
        ])
        .unwrap();
    assert_eq!(r["state"], "RUNNING");
    wait_for("lane 1 clean", || {
        (up.lane_state(&l1) == "IDLE_CLEAN").then_some(())
    });
    let b = up.assign(&l1, "hang");
    assert_eq!(b["state"], "RUNNING");
    // SIGTERM tears every lane down; the restart makes fresh incarnations, and the work
    // they had is in recovery — never a quarantined lane.
    fn incarnation(up: &Up, l: &str) -> Option<String> {
        up.cli(&["lanes"])
            .ok()?
            .as_array()?
            .iter()
            .find(|x| x["lane_id"] == l)?["lane_incarnation_id"]
            .as_str()
            .map(String::from)
    }
    let before: Vec<Option<String>> = [&l1, &l2].iter().map(|l| incarnation(&up, l)).collect();
    up.restart_after(nix::sys::signal::Signal::SIGTERM);
    // Fresh incarnations, registered from the new supervisor's hello (until then the
    // coordinator still shows the old, idle ones).
    for (l, old) in [&l1, &l2].iter().zip(&before) {
        wait_for("fresh lane", || {
            (up.lane_state(l) == "IDLE_CLEAN" && incarnation(&up, l) != *old).then_some(())
        });
    }
    // The stopped coordinator's leadership loop gave its lease up as it stopped (it was
    // asked to stop and awaited, not aborted): the new one took over a released lease.
    assert_eq!(
        up.count(
            "SELECT count(*) FROM transition_receipts WHERE transition = 'leadership-acquire' \
               AND (body->>'previous_released')::boolean \
               AND coordinator_epoch = (SELECT max(coordinator_epoch) FROM transition_receipts WHERE transition = 'leadership-acquire')"
        )
        .await,
        1,
        "the stopped coordinator did not release its lease"
    );
    let st = up.cli(&["status"]).unwrap();
    for a in st["assignments"].as_array().unwrap() {
        assert!(
            matches!(a["state"].as_str(), Some("RECOVERY" | "CANCELLED")),
            "{a}"
        );
    }
    assert_eq!(up.assign(&l1, "hang")["state"], "RUNNING");
    assert_eq!(up.assign(&l2, "hang")["state"], "RUNNING");
}

/// A leader whose database stops answering (closed to connections, every connection cut)
/// cannot renew, and cannot learn that its lease lapsed: it stops believing it leads once a
/// lease has passed since its last renewal was sent — by its own monotonic clock, never
/// longer than the database's deadline — and closes its host sessions, rather than going on
/// answering `leading` (and refusing each transition as stale) until the database is back.
/// Healed, it leads again under a new epoch and the host returns.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_cut_off_from_its_database_stops_believing_it_leads_when_its_lease_runs_out() {
    let w = Split::new(1);
    w.wait_host_connected();
    let epoch = w.status()["coordinator_epoch"].as_i64().unwrap();
    w.close_database(true);
    // Stepped down, and its host sessions closed (each ends as its task sees the close).
    let st = common::wait_until("the leader steps down and lets its host go", || {
        let st = w.status();
        (st["leadership"]["state"] != "leading"
            && st["hosts_connected"].as_array().is_some_and(Vec::is_empty))
        .then_some(st)
    });
    assert!(st["coordinator_epoch"].is_null(), "{st}");
    assert!(st["database_unreachable"].is_string(), "{st}");
    w.close_database(false);
    w.wait_host_connected();
    let now = w.status()["coordinator_epoch"].as_i64().unwrap();
    assert!(now > epoch, "epoch {now} after {epoch}");
    w.usable(1).await;
}

/// A leader whose renewals go unanswered on a connection that stays open (the backend
/// serving them is stopped: what a black-holed network or a hung server looks like) stops
/// believing it leads when its lease runs out, and leads again only under a new epoch. Its
/// renewal used to wait on that connection for as long as TCP kept it, answering `leading`
/// under the old epoch, and holding its hosts, all the while.
#[tokio::test(flavor = "multi_thread")]
async fn a_leader_whose_renewal_goes_unanswered_steps_down_when_its_lease_runs_out() {
    let w = Split::new(1);
    w.wait_host_connected();
    let epoch = w.status()["coordinator_epoch"].as_i64().unwrap();
    /// Lets the stopped backends go on however the test ends.
    struct Stopped(Vec<i32>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            for p in &self.0 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(*p),
                    nix::sys::signal::Signal::SIGCONT,
                );
            }
        }
    }
    // Between renewals (idle): stopped mid-UPDATE, it would hold the leadership row's lock
    // and keep the next acquisition waiting too.
    let renewals = format!(
        "SELECT pid FROM pg_stat_activity WHERE datname = '{}' AND state = 'idle' \
         AND query LIKE 'UPDATE leadership SET lease_expires_at%'",
        w.db.name
    );
    let c = w.sql().await;
    let idle = || async {
        let rows = c.query(&renewals, &[]).await.unwrap();
        rows.iter().map(|r| r.get(0)).collect::<Vec<i32>>()
    };
    let mut stopped = None;
    for _ in 0..200 {
        let pids = idle().await;
        let guard = Stopped(pids.clone());
        for p in &pids {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*p),
                nix::sys::signal::Signal::SIGSTOP,
            )
            .unwrap();
        }
        // Stopped, a backend cannot change its state: still idle, or let go and tried again.
        let still = idle().await;
        if !pids.is_empty() && pids.iter().all(|p| still.contains(p)) {
            stopped = Some(guard);
            break;
        }
        drop(guard);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopped = stopped.expect("no idle connection renewing the lease");
    // Stepped down (the old epoch is gone) and acquired again on other connections.
    let now = common::wait_until("a new epoch while the renewals' backend is stopped", || {
        w.status()["coordinator_epoch"]
            .as_i64()
            .filter(|e| *e > epoch)
    });
    assert!(now > epoch);
    drop(stopped);
    w.wait_host_connected();
    w.usable(1).await;
}

/// §17 Leadership expiry at mutation: the leader paused (SIGSTOP past its lease) with each
/// mutation class's transaction open, its commit still ahead — every chain step and the
/// stop's two, the work's lease renewal, a continuation's claim, acceptance and result, and a
/// handoff's offer and acceptance — makes no mutation under its old epoch: the commit is
/// refused, it leads again only under a new epoch, every invariant holds and every lane
/// takes new work. (consume-ack's row, with its recovery checked, is the test above.)
async fn expiry_at(op: &'static str) {
    let handoff = op.starts_with("handoff-");
    let lanes = if handoff { 2 } else { 1 };
    let mut w = Split::new(lanes);
    w.crash_coordinator(0);
    let held = held_before_commit(&w, op);
    w.start_coordinator(0, Some(&held));
    let first = w.wait_leading(0);
    w.wait_host_connected();
    // What sets the mutation going: an operator request in the background (it may be cut
    // short by the lapse), or, for a lease renewal, the running work itself.
    let running = |w: &Split, task: &str| {
        let a = w.assign(1, task).unwrap_or_else(|e| panic!("assign: {e}"));
        a["assignment_id"].as_str().unwrap().to_string()
    };
    let background = |w: &Split, req: OperatorRequest| {
        let sock = w.socket(0);
        Some(std::thread::spawn(move || operator_call(&sock, &req)))
    };
    let waiter = match op {
        _ if STOP.contains(&op) => {
            let id = running(&w, "hang");
            background(
                &w,
                OperatorRequest::Stop {
                    assignment_id: id,
                    outcome: None,
                    evidence_digest: None,
                    wait: true,
                    request_id: None,
                },
            )
        }
        "renew-leases" => {
            running(&w, "hang");
            None
        }
        "continuation-claim" | "continuation-accept" | "continuation-result" => {
            let id = running(&w, "take-continuations");
            background(
                &w,
                OperatorRequest::Continue {
                    assignment_id: id,
                    next_action: "run the integration tests".into(),
                    within_ms: None,
                    request_id: None,
                },
            )
        }
        "handoff-offer" | "handoff-accept" => {
            let id = running(&w, "hang");
            background(
                &w,
                OperatorRequest::Handoff {
                    assignment_id: id,
                    lane_id: w.lane(2),
                    task: Some("accept-handoff hang".into()),
                    within_ms: None,
                    request_id: None,
                },
            )
        }
        _ => Some(w.assign_async(1, "hang")),
    };
    pause_past_lease(
        &w,
        op,
        "SELECT count(*) FROM pg_stat_activity a WHERE a.application_name = 'mosaic-coordinator' \
         AND a.state = 'idle in transaction' AND clock_timestamp() - a.state_change > interval '400 ms'",
    );
    if let Some(waiter) = waiter {
        let _ = waiter.join();
    }
    let second = w.wait_leading(0);
    assert!(
        second > first,
        "{op}: re-acquired with a higher epoch ({first} → {second})"
    );
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM transition_receipts WHERE transition = '{op}' AND coordinator_epoch = {first}"
        ))
        .await,
        0,
        "{op}: the transition in flight across the lapse committed under the old epoch"
    );
    w.invariants().await;
    for n in 1..=lanes {
        w.usable(n).await;
    }
}

/// Once `in_flight` (a count query) finds the paused transaction of `op`, the leader is
/// SIGSTOPped for three leases, then continued.
/// The failpoint that holds `op`'s first transaction open, its commit ahead, until
/// `pause_past_lease` lets it go (a file, never a timer: the pause lands inside it however
/// slow the machine is).
fn held_before_commit(w: &Split, op: &str) -> String {
    format!(
        "hold-before-commit:{op}=1*return({})",
        w.dir.join("go-commit").display()
    )
}

fn pause_past_lease(w: &Split, op: &str, in_flight: &str) {
    let rt = tokio::runtime::Handle::current();
    common::wait_until(&format!("{op} in flight"), || {
        let n = std::thread::scope(|s| s.spawn(|| rt.block_on(w.count(in_flight))).join().unwrap());
        (n > 0).then_some(())
    });
    let pid = nix::unistd::Pid::from_raw(w.coord_pid(0));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(3 * LEASE_MS as u64));
    std::fs::write(w.dir.join("go-commit"), b"").unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
}

macro_rules! expiry {
    ($name:ident, $op:literal) => {
        #[tokio::test(flavor = "multi_thread")]
        async fn $name() {
            expiry_at($op).await
        }
    };
}

expiry!(leadership_expiry_before_reserve_commits, "reserve");
expiry!(leadership_expiry_before_checkpoint_commits, "checkpoint");
expiry!(leadership_expiry_before_fence_commits, "fence");
expiry!(leadership_expiry_before_stage_commits, "stage");
expiry!(leadership_expiry_before_staged_commits, "staged");
expiry!(leadership_expiry_before_injected_commits, "injected");
expiry!(leadership_expiry_before_activate_commits, "activate");
expiry!(leadership_expiry_before_request_end_commits, "request-end");
expiry!(
    leadership_expiry_before_ingest_termination_commits,
    "ingest-termination"
);
expiry!(
    leadership_expiry_before_renew_leases_commits,
    "renew-leases"
);
expiry!(
    leadership_expiry_before_continuation_claim_commits,
    "continuation-claim"
);
expiry!(
    leadership_expiry_before_continuation_accept_commits,
    "continuation-accept"
);
expiry!(
    leadership_expiry_before_continuation_result_commits,
    "continuation-result"
);
expiry!(
    leadership_expiry_before_handoff_offer_commits,
    "handoff-offer"
);
expiry!(
    leadership_expiry_before_handoff_accept_commits,
    "handoff-accept"
);
