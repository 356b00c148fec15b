//! Operator notifications (issue 23 part 6), end to end under `mosaic up` (coordinator,
//! supervisor, PostgreSQL, fake harnesses): the database records each event with the change
//! that caused it, and the coordinator's notifier hands it to a command (the event on its
//! stdin) and a webhook — once per sink, again after a sink refused it, never the webhook's
//! secret path in a log.

mod common;
mod pg;
mod up;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use up::*;

/// A webhook receiver on loopback: every POST body it is sent, in order.
struct Hook {
    port: u16,
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Hook {
    fn start() -> Self {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let b = bodies.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut len = 0usize;
                loop {
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    let l = line.to_ascii_lowercase();
                    if let Some(v) = l.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0; len];
                if r.read_exact(&mut body).is_ok() {
                    if let Ok(v) = serde_json::from_slice(&body) {
                        b.lock().unwrap().push(v);
                    }
                }
                let _ = s.write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n");
            }
        });
        Self { port, bodies }
    }

    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }
}

/// The command sink: refuses every event the first time it sees it (exit 1), takes it the
/// second (appends it to `events.jsonl`).
fn command(dir: &Path) -> std::path::PathBuf {
    let script = dir.join("notify.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nevent=$(cat)\nkey=$(printf '%s' \"$event\" | sha256sum | cut -c1-16)\n\
             if [ ! -e {d}/seen-$key ]; then : > {d}/seen-$key; echo refused once >&2; exit 1; fi\n\
             printf '%s\\n' \"$event\" >> {d}/events.jsonl\n",
            d = dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

fn events(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_operator_event_reaches_every_sink_once_and_a_refusal_is_retried() {
    let dir = tempdir();
    let hook = Hook::start();
    let secret = format!("hook-secret-{}", uuid::Uuid::new_v4().simple());
    let url = format!("http://127.0.0.1:{}/hooks/{secret}", hook.port);
    let up = Up::fleet_with(
        3,
        1,
        &[
            "--notify-command".into(),
            command(&dir.0).display().to_string(),
            "--notify-webhook".into(),
            url,
        ],
    );
    // 1. A harness reports a rate limit: the work is blocked with that code.
    let a = up.assign(&up.lane_id(1), "blocked=rate-limited");
    let blocked = a["assignment_id"].as_str().unwrap().to_string();
    // 2. A handoff offered, which its target never acknowledges: it expires.
    let b = up.assign(&up.lane_id(2), "hang");
    let moving = b["assignment_id"].as_str().unwrap().to_string();
    up.cli(&[
        "handoff",
        "--assignment",
        &moving,
        "--to",
        &up.lane_id(3),
        "--task",
        "hang",
        "--within-ms",
        "1500",
    ])
    .unwrap_or_else(|e| panic!("handoff: {e}"));
    let kinds = [
        ("blocked", blocked.as_str()),
        ("handoff-offered", moving.as_str()),
        ("handoff-expired", moving.as_str()),
    ];
    common::wait_until("every event at both sinks", || {
        let (c, w) = (events(&dir.0), hook.bodies());
        kinds
            .iter()
            .all(|(k, a)| c.iter().any(want(k, a)) && w.iter().any(want(k, a)))
            .then_some(())
    });
    let c = events(&dir.0);
    let e = c.iter().find(|e| want("blocked", &blocked)(e)).unwrap();
    assert_eq!(e["code"], "rate-limited");
    assert!(e["evidence_digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert_eq!(e["lane_id"], up.lane_id(1).as_str());
    // Each event once per sink: the command refused each the first time, and took it on
    // the retry.
    let (c, w) = (events(&dir.0), hook.bodies());
    for (k, a) in kinds {
        assert_eq!(
            c.iter().filter(|e| want(k, a)(e)).count(),
            1,
            "{k} at the command"
        );
        assert_eq!(
            w.iter().filter(|e| want(k, a)(e)).count(),
            1,
            "{k} at the webhook"
        );
    }
    assert!(
        up.count("SELECT count(*) FROM notifications WHERE attempts >= 2 AND done_at IS NOT NULL")
            .await
            >= 3,
        "the refused deliveries were not retried"
    );
    assert_eq!(
        up.count("SELECT count(*) FROM notifications WHERE done_at IS NULL")
            .await,
        0
    );
    // `mosaic notifications` shows them, each taken by both sinks.
    let shown = up.cli(&["notifications"]).unwrap();
    let shown = shown.as_array().unwrap();
    assert!(shown.len() >= 3, "{shown:?}");
    for n in shown {
        assert_eq!(n["done"], true, "{n}");
        assert_eq!(
            n["delivered_to"],
            serde_json::json!(["command", "webhook"]),
            "{n}"
        );
    }
    // The webhook's path is its secret: in no log.
    let log = std::fs::read_to_string(log_of(&up.dir)).unwrap_or_default();
    assert!(log.contains("notifier delivering operator events"), "{log}");
    assert!(
        !log.contains(&secret),
        "the webhook's secret path reached the log"
    );
}

/// Budget exhaustion: the acceptance that spends the last of an assignment's loop budget
/// records one `exhausted` event (code `continuation-budget-exhausted`); the work goes on,
/// the next continuation is refused, and nothing more is told.
#[tokio::test(flavor = "multi_thread")]
async fn a_used_up_loop_budget_is_told_once() {
    let dir = tempdir();
    let up = Up::fleet_with(
        1,
        1,
        &[
            "--notify-command".into(),
            command(&dir.0).display().to_string(),
        ],
    );
    let a = up.assign(&up.lane_id(1), "take-continuations");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    let budget = up
        .count(&format!(
            "SELECT continuation_budget::bigint FROM assignments WHERE assignment_id = '{id}'"
        ))
        .await;
    assert!(budget > 0);
    let exhausted = |events: &[Value]| {
        events
            .iter()
            .filter(|e| want("exhausted", &id)(e))
            .cloned()
            .collect::<Vec<_>>()
    };
    for i in 0..budget {
        let r = up
            .cli(&[
                "continue",
                "--assignment",
                &id,
                "--next-action",
                &format!("step {i}"),
            ])
            .unwrap_or_else(|e| panic!("continue {i}: {e}"));
        let cn = r["continuation_id"].as_str().unwrap().to_string();
        up.continuation_reaches(&cn, "RESULT_RECORDED", "the continuation's result")
            .await;
        if i + 1 < budget {
            assert_eq!(
                up.count(&format!(
                    "SELECT count(*) FROM notifications WHERE kind = 'exhausted' AND body->>'assignment_id' = '{id}'"
                ))
                .await,
                0,
                "told before the budget was used up (after {} of {budget})",
                i + 1
            );
        }
    }
    let refused = up.cli(&["continue", "--assignment", &id, "--next-action", "one more"]);
    assert!(
        refused.is_err(),
        "a continuation past the budget: {refused:?}"
    );
    common::wait_until("the exhaustion told", || {
        (!exhausted(&events(&dir.0)).is_empty()).then_some(())
    });
    let told = exhausted(&events(&dir.0));
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(told[0]["code"], "continuation-budget-exhausted");
    assert_eq!(told[0]["lane_id"], up.lane_id(1).as_str());
    assert_eq!(
        up.count("SELECT count(*) FROM notifications WHERE kind = 'exhausted'")
            .await,
        1
    );
    // The work itself goes on.
    assert_eq!(up.assignment(&id)["state"], "ACTIVE");
}

/// Whether `e` is the event of `kind` about `assignment`.
fn want<'a>(kind: &'a str, assignment: &'a str) -> impl Fn(&Value) -> bool + 'a {
    move |e: &Value| e["kind"] == kind && e["assignment_id"] == assignment
}

/// A directory removed on drop.
struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
fn tempdir() -> Dir {
    let d = std::env::temp_dir().join(format!("mosaic-notify-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}
