//! Typed messages: a verified envelope converts, in one place, into its message's struct
//! (`protocol::messages`), field for field — and a type that is not a host chain message
//! converts to nothing.

mod fixture;

use fixture::*;
use mosaic::protocol::canonical::Value;
use mosaic::protocol::envelope::{n, s};
use mosaic::protocol::messages::{FromHostChain, WireError};
use mosaic::protocol::schema::MessageType;
use mosaic::protocol::verify;

fn chain_fields() -> Vec<(&'static str, Value)> {
    vec![
        ("message_id", s("m-1")),
        ("idempotency_key", s("k-1")),
        ("sot_incarnation", s("sot-1")),
        ("coordinator_epoch", n(7)),
        ("assignment_id", s("as-1")),
        ("lane_id", s("h1:lane-1")),
        ("lane_incarnation_id", s("li-1")),
        ("assignment_attempt_id", s("at-1")),
        ("reservation_id", s("rs-1")),
        ("generation", n(3)),
        ("fence_proof", s(&format!("sha256:{}", "f".repeat(64)))),
    ]
}

fn verified(
    key: &str,
    t: MessageType,
    fields: Vec<(&str, Value)>,
) -> mosaic::protocol::Envelope<mosaic::protocol::Verified> {
    let bytes = signer(key).sign(t, COORD, fields).unwrap();
    let reg = registry();
    verify(&bytes, &ctx(&reg, COORD)).unwrap()
}

#[test]
fn a_staged_envelope_becomes_its_struct_field_for_field() {
    let mut f = chain_fields();
    f.push(("process_identity", process_identity()));
    let env = verified("host-ordinary", MessageType::Staged, f);
    let Some(FromHostChain::Staged(m)) = FromHostChain::decode(&env).unwrap() else {
        panic!("not a staged message");
    };
    let c = &m.chain;
    assert_eq!(
        (
            c.reservation_id.as_str(),
            c.lane_id.as_str(),
            c.lane_incarnation_id.as_str(),
            c.assignment_id.as_str(),
            c.assignment_attempt_id.as_str(),
            c.generation,
            c.sot_incarnation.as_str(),
            c.coordinator_epoch
        ),
        ("rs-1", "h1:lane-1", "li-1", "as-1", "at-1", 3, "sot-1", 7)
    );
    assert_eq!(
        m.process_identity,
        mosaic::protocol::canonical::to_json(&process_identity())
    );
}

#[test]
fn only_host_chain_messages_convert() {
    let env = verified(
        "host-session",
        MessageType::Heartbeat,
        vec![
            ("message_id", s("m-2")),
            ("idempotency_key", s("k-2")),
            ("sot_incarnation", Value::Null),
            ("coordinator_epoch", Value::Null),
            ("assignment_id", Value::Null),
            ("session_id", s("sess-1")),
        ],
    );
    assert_eq!(FromHostChain::decode(&env), Ok(None));
    // The error names the message type and the field (a schema cannot leave one out, so
    // this is shown on the error value itself).
    let e = WireError::Field {
        message_type: "staged",
        field: "process_identity",
        expected: "an object",
    };
    assert_eq!(
        e.to_string(),
        "staged: required field process_identity is missing or not an object"
    );
}

// ---- coordinator → host ----------------------------------------------------------------

use mosaic::protocol::messages::{
    Activate, ChainAuthority, Challenge, Continuation, ContinuationPhase, Contract, Digests,
    HandoffBound, HandoffChallenge, Issued, ReceiptAck, Reconcile, Stage, ToHost, Verdict,
};
use mosaic::protocol::report::LaneOrderWire;

fn authority() -> ChainAuthority {
    ChainAuthority {
        sot_incarnation: "sot-1".into(),
        coordinator_epoch: 7,
        assignment_id: "as-1".into(),
        lane_id: "h1:lane-1".into(),
        lane_incarnation_id: "li-1".into(),
        assignment_attempt_id: "at-1".into(),
        reservation_id: "rs-1".into(),
        reservation_epoch: 1,
        reservation_deadline: "2099-01-01T00:00:00.000000Z".into(),
        runtime_id: "fake@1.0.0".into(),
        generation: 3,
        fence_proof: format!("sha256:{}", "f".repeat(64)),
    }
}

fn digests() -> Digests {
    let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    Digests {
        contracts_digest: d('c'),
        scope_digest: d('5'),
        holds_digest: d('6'),
    }
}

fn issued(key: &str) -> Issued {
    Issued {
        idempotency_key: key.into(),
        issued_at: "2026-01-01T00:00:00.000000Z".into(),
        expires_at: "2099-01-01T00:00:00.000000Z".into(),
    }
}

/// One of every message the coordinator sends a host.
/// A recovery recipient (a public key: nothing secret) for the stage's golden vector.
const RECOVERY_KEY: &str = "age18h6q9fzgysmtr5vrzcveyhvgmrp538m796xp9ehxwagvtgpncppsyqa9ka";

fn every_to_host() -> Vec<ToHost> {
    let mut lanes = std::collections::BTreeMap::new();
    lanes.insert(
        "h1:lane-1".to_string(),
        LaneOrderWire {
            lane_incarnation_id: "li-1".into(),
            end: vec![2, 3],
            hold: vec![4],
            release: vec![1],
            recreate: true,
            create: false,
            destroy: false,
        },
    );
    vec![
        ToHost::Stage(Stage {
            authority: authority(),
            issued: issued("stage/rs-1"),
            repository: Some(mosaic::protocol::repo::RepoBinding {
                name: mosaic::protocol::repo::RepoName::parse("demo").unwrap(),
                source: mosaic::protocol::repo::RepoSource::path("/srv/demo").unwrap(),
                base: mosaic::protocol::repo::BaseRef::parse("main").unwrap(),
                setup: mosaic::protocol::repo::RepoSetup::parse(
                    &[".env".into(), "config/local.toml".into()],
                    &["make setup".into()],
                    Some(60),
                )
                .unwrap(),
            }),
            restore: Some(mosaic::protocol::repo::RestorePoint {
                checkpoint_digest: format!("sha256:{}", "d".repeat(64)),
                commit_id: "a".repeat(40),
                tree_id: "b".repeat(40),
                host_id: "h1".into(),
                base_commit_id: Some("c".repeat(40)),
                base_object: Some(mosaic::protocol::repo::StoredObject {
                    digest: format!("sha256:{}", "e".repeat(64)),
                    size: 70_000,
                }),
                bundle_object: Some(mosaic::protocol::repo::StoredObject {
                    digest: format!("sha256:{}", "f".repeat(64)),
                    size: 900,
                }),
            }),
            artifact_recipients: mosaic::protocol::artifact::parse_recipients(&[format!(
                "ops={RECOVERY_KEY}"
            )])
            .unwrap(),
        }),
        ToHost::Contract(Contract {
            authority: authority(),
            digests: digests(),
            task_text: "print=hello".into(),
            issued: issued("contract/rs-1"),
        }),
        ToHost::Challenge(Challenge {
            authority: authority(),
            digests: digests(),
            challenge_id: "ch-1".into(),
            issued: issued("challenge/rs-1"),
        }),
        ToHost::HandoffChallenge(HandoffChallenge {
            authority: authority(),
            digests: digests(),
            bound: HandoffBound {
                handoff_challenge_id: "hc-1".into(),
                source_assignment_attempt_id: "at-0".into(),
                responsibility_owner: "operator:o".into(),
                execution_owner: "host:h1".into(),
                pending_target: "lane-2".into(),
                next_action_digest: format!("sha256:{}", "a".repeat(64)),
                challenge_deadline: "2099-01-01T00:00:00.000000Z".into(),
                checkpoint_digest: None,
            },
            next_action: "carry on".into(),
            issued: issued("handoff-challenge/rs-1"),
        }),
        ToHost::Continuation(Continuation {
            authority: authority(),
            digests: digests(),
            continuation_id: "cn-1".into(),
            claim_ref: "cl-1".into(),
            next_action: "next".into(),
            next_action_digest: format!("sha256:{}", "b".repeat(64)),
            loop_budget: 4,
            phase: ContinuationPhase::Accepted,
            result_to: "coordinator".into(),
            issued: issued("continuation/cn-1/cl-1/accepted"),
        }),
        ToHost::Activate(Activate {
            authority: authority(),
            digests: digests(),
            issued: issued("activate/rs-1"),
        }),
        ToHost::Reconcile(Reconcile {
            idempotency_key: "reconcile/1".into(),
            sot_incarnation: Some("sot-1".into()),
            coordinator_epoch: Some(7),
            session_id: "sess-1".into(),
            lanes,
        }),
        ToHost::ReceiptAck(ReceiptAck {
            idempotency_key: "receipt-ack/tr-1".into(),
            coordinator_epoch: None,
            session_id: "sess-1".into(),
            receipt_idempotency_key: "tr-1".into(),
            verdict: Verdict::Refused("not-owner".into()),
        }),
        ToHost::HandoffCheckpoint(mosaic::protocol::messages::HandoffCheckpoint {
            authority: authority(),
            digests: digests(),
            handoff_id: "ho-1".into(),
            issued: issued("handoff-checkpoint/ho-1"),
        }),
        ToHost::CheckpointStored(mosaic::protocol::messages::CheckpointStored {
            object_digest: format!("sha256:{}", "e".repeat(64)),
            verdict: mosaic::protocol::messages::StoredVerdict::More,
            received: 49152,
        }),
        ToHost::CheckpointData(mosaic::protocol::messages::CheckpointData {
            object_digest: format!("sha256:{}", "e".repeat(64)),
            offset: 49152,
            answer: mosaic::protocol::messages::DataAnswer::Data {
                object_size: 70_000,
                data: vec![7; 70_000 - 49152],
            },
        }),
        ToHost::CheckpointData(mosaic::protocol::messages::CheckpointData {
            object_digest: format!("sha256:{}", "f".repeat(64)),
            offset: 0,
            answer: mosaic::protocol::messages::DataAnswer::Refused("corrupt".into()),
        }),
        ToHost::WorkspaceReleaseAnswer(mosaic::protocol::messages::WorkspaceReleaseAnswer {
            assignment_id: "asg-1".into(),
            done: false,
            verdict: mosaic::protocol::messages::ReleaseVerdict::Release,
        }),
        ToHost::WorkspaceReleaseAnswer(mosaic::protocol::messages::WorkspaceReleaseAnswer {
            assignment_id: "asg-1".into(),
            done: true,
            verdict: mosaic::protocol::messages::ReleaseVerdict::Keep("not-released".into()),
        }),
    ]
}

/// Signs `fields` of `m`'s type as the coordinator's key for its purpose would, and verifies
/// the envelope as a host does.
fn signed_as(
    m: &ToHost,
    mut f: Vec<(&'static str, Value)>,
) -> mosaic::protocol::Envelope<mosaic::protocol::Verified> {
    let key = match m {
        ToHost::Reconcile(_)
        | ToHost::ReceiptAck(_)
        | ToHost::CheckpointStored(_)
        | ToHost::CheckpointData(_)
        | ToHost::WorkspaceReleaseAnswer(_) => "coord-session",
        _ => "coord-ordinary",
    };
    f.push(("message_id", s("m-1")));
    let bytes = signer(key).sign(m.message_type(), HOST, f).unwrap();
    let reg = registry();
    verify(&bytes, &ctx(&reg, HOST)).unwrap()
}

fn round_trip(m: &ToHost) -> mosaic::protocol::Envelope<mosaic::protocol::Verified> {
    signed_as(m, m.fields())
}

/// `m` with one field replaced (or, with `None`, left out).
fn with_field(
    m: &ToHost,
    field: &'static str,
    v: Option<Value>,
) -> mosaic::protocol::Envelope<mosaic::protocol::Verified> {
    let mut f: Vec<(&'static str, Value)> = m
        .fields()
        .into_iter()
        .filter(|(k, _)| *k != field)
        .collect();
    f.extend(v.map(|v| (field, v)));
    signed_as(m, f)
}

/// What the coordinator builds is what a host reads, for every message type: the one field
/// set (`ToHost::fields`) passes the schema, and `ToHost::decode` gives back the same value.
#[test]
fn every_coordinator_message_survives_signing_and_conversion_unchanged() {
    for m in every_to_host() {
        let env = round_trip(&m);
        assert_eq!(env.message_type(), m.message_type());
        assert_eq!(
            ToHost::decode(&env).unwrap(),
            Some(m.clone()),
            "{}",
            m.message_type().as_str()
        );
    }
}

/// A value this build does not know is refused whole — never read as the nearest thing it
/// knows: a verdict that is not `ingested`/`retry:`/`refused:` acknowledges no receipt, a
/// control operation other than `activate` activates nothing, a continuation phase other
/// than `offer`/`accepted` delivers nothing.
#[test]
fn an_unknown_verdict_control_op_or_phase_is_refused() {
    let all = every_to_host();
    let pick = |t: MessageType| all.iter().find(|m| m.message_type() == t).unwrap().clone();
    for (t, field, bad) in [
        (MessageType::ReceiptAck, "verdict", "ingested-ish"),
        (MessageType::ReceiptAck, "verdict", "refused:"),
        (MessageType::ReceiptAck, "verdict", "acked:ok"),
        (MessageType::Control, "control_op", "stop"),
        (MessageType::Continuation, "phase", "offered"),
        (MessageType::CheckpointStored, "verdict", "stored-ish"),
        (MessageType::CheckpointStored, "verdict", "retry:"),
        (MessageType::CheckpointData, "verdict", "refused:"),
        (MessageType::CheckpointData, "verdict", "maybe"),
        // `recorded` answers a done, never an ask; a keep names its reason.
        (MessageType::WorkspaceReleaseAnswer, "verdict", "recorded"),
        (MessageType::WorkspaceReleaseAnswer, "verdict", "keep:"),
        (MessageType::WorkspaceReleaseAnswer, "verdict", "released"),
        (MessageType::WorkspaceReleaseAnswer, "step", "finish"),
    ] {
        let env = with_field(&pick(t), field, Some(s(bad)));
        match ToHost::decode(&env) {
            Err(WireError::Unknown { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{} with {field}={bad:?} converted: {other:?}", t.as_str()),
        }
    }
}

/// The schema lets a receipt ACK omit its verdict; the host does not read a missing verdict
/// as `ingested` (it would delete a receipt the coordinator never said it stored).
#[test]
fn a_receipt_ack_without_a_verdict_acknowledges_nothing() {
    let m = every_to_host()
        .into_iter()
        .find(|m| matches!(m, ToHost::ReceiptAck(_)))
        .unwrap();
    let env = with_field(&m, "verdict", None);
    assert!(
        matches!(
            ToHost::decode(&env),
            Err(WireError::Field {
                field: "verdict",
                ..
            })
        ),
        "{:?}",
        ToHost::decode(&env)
    );
}

/// Every verdict the coordinator writes reads back as itself.
#[test]
fn verdicts_round_trip_through_their_text() {
    for v in [
        Verdict::Ingested,
        Verdict::Retry("unavailable".into()),
        Verdict::Refused("mismatch".into()),
    ] {
        assert_eq!(Verdict::parse(&v.encode()), Some(v));
    }
}

// ---- host → coordinator ----------------------------------------------------------------

use mosaic::protocol::messages::{
    Ack, Blocked, ChainRef, ContinuationAccept, ContinuationResult, ContractBound, HandoffAck,
    Injected, Progress, Staged,
};

fn chain_ref() -> ChainRef {
    ChainRef {
        reservation_id: "rs-1".into(),
        lane_id: "h1:lane-1".into(),
        lane_incarnation_id: "li-1".into(),
        assignment_id: "as-1".into(),
        assignment_attempt_id: "at-1".into(),
        generation: 3,
        sot_incarnation: "sot-1".into(),
        coordinator_epoch: 7,
        fence_proof: format!("sha256:{}", "f".repeat(64)),
    }
}

fn bound() -> ContractBound {
    ContractBound {
        reservation_epoch: 2,
        reservation_deadline: "2099-01-01T00:00:00.000000Z".into(),
        runtime_id: "fake@1.0.0".into(),
        digests: digests(),
    }
}

/// One of every chain message a host sends.
fn every_from_host() -> Vec<FromHostChain> {
    let id = mosaic::protocol::canonical::to_json(&process_identity());
    let hb = HandoffBound {
        handoff_challenge_id: "hc-1".into(),
        source_assignment_attempt_id: "at-0".into(),
        responsibility_owner: "operator:o".into(),
        execution_owner: "host:h1".into(),
        pending_target: "lane-2".into(),
        next_action_digest: format!("sha256:{}", "a".repeat(64)),
        challenge_deadline: "2099-01-01T00:00:00.000000Z".into(),
        checkpoint_digest: Some(format!("sha256:{}", "c".repeat(64))),
    };
    vec![
        FromHostChain::Staged(Staged {
            chain: chain_ref(),
            process_identity: id.clone(),
            restored_checkpoint_digest: Some(format!("sha256:{}", "c".repeat(64))),
        }),
        FromHostChain::Injected(Injected {
            chain: chain_ref(),
            bound: bound(),
            delivered_contracts_digest: digests().contracts_digest,
            process_identity: id.clone(),
        }),
        FromHostChain::Ack(Ack {
            chain: chain_ref(),
            bound: bound(),
            challenge_id: "ch-1".into(),
            process_identity: id.clone(),
            ack_digest: String::new(),
        }),
        FromHostChain::Progress(Progress {
            chain: chain_ref(),
            bound: bound(),
            evidence_kind: "test-result".into(),
            evidence_digest: format!("sha256:{}", "e".repeat(64)),
            next_action: Some("carry on".into()),
            message_id: String::new(),
        }),
        FromHostChain::Blocked(Blocked {
            chain: chain_ref(),
            bound: bound(),
            blocker_code: "needs-review".into(),
            blocker_evidence_digest: format!("sha256:{}", "e".repeat(64)),
            next_action: "review it".into(),
            resume_after_ms: None,
        }),
        FromHostChain::Blocked(Blocked {
            chain: chain_ref(),
            bound: bound(),
            blocker_code: "rate-limited".into(),
            blocker_evidence_digest: format!("sha256:{}", "f".repeat(64)),
            next_action: "wait for the reset".into(),
            resume_after_ms: Some(30_000),
        }),
        FromHostChain::HandoffAck(HandoffAck {
            chain: chain_ref(),
            bound: bound(),
            handoff: hb,
            process_identity: id.clone(),
            ack_digest: String::new(),
        }),
        FromHostChain::ContinuationAccept(ContinuationAccept {
            chain: chain_ref(),
            bound: bound(),
            continuation_id: "cn-1".into(),
            claim_ref: "cl-1".into(),
            next_action_digest: format!("sha256:{}", "b".repeat(64)),
            process_identity: id,
        }),
        FromHostChain::ContinuationResult(ContinuationResult {
            chain: chain_ref(),
            bound: bound(),
            continuation_id: "cn-1".into(),
            result_evidence_digest: format!("sha256:{}", "d".repeat(64)),
        }),
        FromHostChain::CheckpointTaken(mosaic::protocol::messages::CheckpointTaken {
            chain: chain_ref(),
            bound: bound(),
            origin: mosaic::protocol::messages::TakenFor::Handoff("ho-1".into()),
            taken: Ok(mosaic::protocol::repo::CheckpointRef {
                repository: mosaic::protocol::repo::RepoName::parse("demo").unwrap(),
                commit_id: "a".repeat(40),
                tree_id: "b".repeat(40),
                inputs_digest: Some(format!("sha256:{}", "e".repeat(64))),
            }),
        }),
        FromHostChain::CheckpointTaken(mosaic::protocol::messages::CheckpointTaken {
            chain: chain_ref(),
            bound: bound(),
            origin: mosaic::protocol::messages::TakenFor::Handoff("ho-2".into()),
            taken: Err("its lane is unconfined".into()),
        }),
        FromHostChain::CheckpointTaken(mosaic::protocol::messages::CheckpointTaken {
            chain: chain_ref(),
            bound: bound(),
            origin: mosaic::protocol::messages::TakenFor::Request(3),
            taken: Ok(mosaic::protocol::repo::CheckpointRef {
                repository: mosaic::protocol::repo::RepoName::parse("demo").unwrap(),
                commit_id: "c".repeat(40),
                tree_id: "d".repeat(40),
                inputs_digest: None,
            }),
        }),
    ]
}

/// What a host builds is what the coordinator reads, for every chain message: the one field
/// set passes the schema, and decoding gives back the same value (its envelope-derived
/// parts — the ACK digests, the message id — filled from the envelope).
#[test]
fn every_host_chain_message_survives_signing_and_conversion_unchanged() {
    for m in every_from_host() {
        let mut f = m.fields().unwrap();
        f.push(("message_id", s("m-1")));
        let bytes = signer("host-ordinary")
            .sign(m.message_type(), COORD, f)
            .unwrap();
        let reg = registry();
        let env = verify(&bytes, &ctx(&reg, COORD)).unwrap();
        let mut want = m.clone();
        match &mut want {
            FromHostChain::Ack(a) => a.ack_digest = env.digest(),
            FromHostChain::HandoffAck(a) => a.ack_digest = env.digest(),
            FromHostChain::Progress(p) => p.message_id = "m-1".into(),
            _ => {}
        }
        assert_eq!(
            FromHostChain::decode(&env).unwrap(),
            Some(want),
            "{}",
            m.message_type().as_str()
        );
    }
}

/// A retry of a host message is the same step on the coordinator: its key is derived from
/// what it reports, never random, and two different reports never share one.
#[test]
fn host_message_keys_name_what_they_report() {
    let all = every_from_host();
    let keys: std::collections::BTreeSet<String> =
        all.iter().map(|m| m.idempotency_key()).collect();
    assert_eq!(keys.len(), all.len(), "{keys:?}");
    // New evidence is a new report: a new key.
    let FromHostChain::Progress(mut p) = all[3].clone() else {
        panic!("not a progress")
    };
    let first = FromHostChain::Progress(p.clone()).idempotency_key();
    p.evidence_digest = format!("sha256:{}", "9".repeat(64));
    assert_ne!(FromHostChain::Progress(p).idempotency_key(), first);
}

/// A live generation's checkpoint names exactly one origin: a handoff, or its harness's
/// request by a number from 1. Both, neither, or a number 0 is refused whole — never read
/// as either.
#[test]
fn a_checkpoint_names_one_origin_exactly() {
    let m = every_from_host()
        .into_iter()
        .find(|m| {
            matches!(m, FromHostChain::CheckpointTaken(c)
                if matches!(c.origin, mosaic::protocol::messages::TakenFor::Request(_)))
        })
        .unwrap();
    let base: Vec<(&'static str, Value)> = m.fields().unwrap();
    let decode = |f: Vec<(&'static str, Value)>| {
        let mut f = f;
        f.push(("message_id", s("m-1")));
        let bytes = signer("host-ordinary")
            .sign(m.message_type(), COORD, f)
            .unwrap();
        let reg = registry();
        let env = verify(&bytes, &ctx(&reg, COORD)).unwrap();
        FromHostChain::decode(&env)
    };
    assert!(matches!(decode(base.clone()), Ok(Some(_))));
    let mut both = base.clone();
    both.push(("handoff_id", s("ho-1")));
    let neither: Vec<_> = base
        .iter()
        .filter(|(k, _)| *k != "request_seq")
        .cloned()
        .collect();
    let mut zero = neither.clone();
    zero.push(("request_seq", mosaic::protocol::envelope::n(0)));
    for (what, f) in [("both", both), ("neither", neither), ("zero", zero)] {
        refused_whole(what, decode(f));
    }
}

/// `got` is a refusal of the whole message: a field missing or malformed, or a value this
/// build does not know.
fn refused_whole<T: std::fmt::Debug>(what: &str, got: Result<T, WireError>) {
    assert!(
        matches!(
            got,
            Err(WireError::Field { .. } | WireError::Unknown { .. })
        ),
        "{what}: {got:?}"
    );
}

/// A host's release of its copy of done work says exactly what it holds: an ask names the
/// tree and the checkpoint together or neither, and no count; a done names its count and no
/// tree; any other step is refused whole.
#[test]
fn a_workspace_release_says_exactly_what_it_holds() {
    use mosaic::protocol::messages::{FromHostSession, HeldTree, ReleaseStep, WorkspaceRelease};
    let ask = WorkspaceRelease {
        assignment_id: "asg-1".into(),
        step: ReleaseStep::Ask {
            workspace: Some(HeldTree {
                tree_id: "e".repeat(40),
                checkpoint_digest: format!("sha256:{}", "c".repeat(64)),
            }),
        },
    };
    let done = WorkspaceRelease {
        assignment_id: "asg-1".into(),
        step: ReleaseStep::Done { refs_removed: 2 },
    };
    let decode = |f: Vec<(&'static str, Value)>| {
        let mut f = f;
        f.push(("message_id", s("m-1")));
        let bytes = signer("host-session")
            .sign(MessageType::WorkspaceRelease, COORD, f)
            .unwrap();
        let reg = registry();
        let env = verify(&bytes, &ctx(&reg, COORD)).unwrap();
        FromHostSession::decode(&env)
    };
    for m in [&ask, &done] {
        assert_eq!(
            decode(m.fields()).unwrap(),
            Some(FromHostSession::WorkspaceRelease(m.clone()))
        );
    }
    let without = |m: &WorkspaceRelease, k: &str| -> Vec<(&'static str, Value)> {
        m.fields().into_iter().filter(|(f, _)| *f != k).collect()
    };
    let with = |mut f: Vec<(&'static str, Value)>, k: &'static str, v: Value| {
        f.retain(|(x, _)| *x != k);
        f.push((k, v));
        f
    };
    let cases = [
        (
            "a tree without its checkpoint",
            without(&ask, "checkpoint_digest"),
        ),
        ("a checkpoint without its tree", without(&ask, "tree_id")),
        (
            "an ask with a count",
            with(
                ask.fields(),
                "refs_removed",
                mosaic::protocol::envelope::n(1),
            ),
        ),
        (
            "a tree that is no object id",
            with(ask.fields(), "tree_id", s("HEAD")),
        ),
        (
            "a done with a tree",
            with(done.fields(), "tree_id", s(&"e".repeat(40))),
        ),
        ("a done without its count", without(&done, "refs_removed")),
        ("another step", with(done.fields(), "step", s("forget"))),
    ];
    for (what, f) in cases {
        refused_whole(what, decode(f));
    }
}
