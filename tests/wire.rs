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
