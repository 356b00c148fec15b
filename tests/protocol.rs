//! The envelope rejection matrix (spec §17: envelope field substitution, canonical
//! authentication preimage matrix, key role/domain confusion, old queued message, raw
//! token leakage). Every row names the check it exercises and fails if that check is gone.

mod fixture;

use fixture::*;
use mosaic::protocol::canonical::{self, Value};
use mosaic::protocol::envelope::{self, s, EnvelopeError};
use mosaic::protocol::queue::GenerationGate;
use mosaic::protocol::schema::{MessageType, ALL_TYPES};
use mosaic::protocol::verify;

fn obj(bytes: &[u8]) -> Vec<(String, Value)> {
    match canonical::parse(bytes).unwrap() {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

fn enc(m: Vec<(String, Value)>) -> Vec<u8> {
    canonical::encode(&Value::Object(m))
}

fn set(m: &mut Vec<(String, Value)>, k: &str, v: Value) {
    match m.iter_mut().find(|(x, _)| x == k) {
        Some(e) => e.1 = v,
        None => m.push((k.to_string(), v)),
    }
}

fn check(bytes: &[u8], audience: &str) -> Result<MessageType, EnvelopeError> {
    let reg = registry();
    verify(bytes, &ctx(&reg, audience)).map(|e| e.message_type())
}

fn category(bytes: &[u8], audience: &str) -> &'static str {
    match check(bytes, audience) {
        Ok(t) => panic!(
            "accepted a {t:?} that must be rejected: {}",
            String::from_utf8_lossy(bytes)
        ),
        Err(e) => e.category(),
    }
}

#[test]
fn every_variant_signs_and_verifies() {
    for t in ALL_TYPES {
        let (_, aud) = legit(t);
        assert_eq!(check(&valid(t), aud), Ok(t), "{t:?}");
    }
}

#[test]
fn field_substitution_breaks_the_proof() {
    // Every field of every variant, changed after signing (re-encoded canonically), fails.
    for t in ALL_TYPES {
        let (_, aud) = legit(t);
        let base = obj(&valid(t));
        for (k, v) in &base {
            if k == "authentication_proof" {
                continue;
            }
            let mut m = base.clone();
            let changed = match v {
                Value::Str(x) if x.starts_with("sha256:") => {
                    s(&format!("sha256:{}", "f".repeat(64)))
                }
                Value::Str(x) if x.ends_with('Z') => s("2026-06-01T00:09:00.000000Z"),
                Value::Str(x) => s(&format!("{x}x")),
                Value::Int(i) => Value::Int(i + 1),
                Value::Null
                    if t.schema().kind_of(k)
                        == Some(mosaic::protocol::schema::Kind::NullableUint) =>
                {
                    Value::Int(1)
                }
                Value::Null => s("x"),

                Value::Object(o) => {
                    let mut o = o.clone();
                    o.push(("zzz".into(), Value::Int(1)));
                    Value::Object(o)
                }
                Value::Array(a) => {
                    let mut a = a.clone();
                    a.push(s("x"));
                    Value::Array(a)
                }
                Value::Bool(b) => Value::Bool(!b),
            };
            set(&mut m, k, changed);
            let cat = category(&enc(m), aud);
            // Fields checked before the proof give their own reason; all others must fail
            // exactly at the proof.
            let expected = match k.as_str() {
                "message_type" => None,
                "issuer" => Some("wrong-issuer"),
                "audience" => Some("wrong-audience"),
                "key_id" => Some("unknown-key"),
                "trust_domain" => Some("wrong-domain"),
                "protocol_version"
                | "authentication_profile_version"
                | "envelope_schema_version"
                | "authentication_suite_id" => Some("unsupported-profile"),
                "process_identity" => Some("bad-field"),
                _ => Some("bad-proof"),
            };
            if let Some(e) = expected {
                assert_eq!(cat, e, "{t:?}.{k}");
            }
        }
    }
}

#[test]
fn canonical_preimage_matrix() {
    let t = MessageType::Ack;
    let (_, aud) = legit(t);
    let good = valid(t);
    let text = String::from_utf8(good.clone()).unwrap();
    let base = obj(&good);
    let proof = base
        .iter()
        .find(|(k, _)| k == "authentication_proof")
        .unwrap()
        .1
        .clone();
    let other_proof = obj(&valid(MessageType::Injected))
        .into_iter()
        .find(|(k, _)| k == "authentication_proof")
        .unwrap()
        .1;
    let without = |m: &[(String, Value)]| {
        m.iter()
            .filter(|(k, _)| k != "authentication_proof")
            .cloned()
            .collect::<Vec<_>>()
    };

    type Row = (&'static str, Vec<u8>, &'static str);
    let mut rows: Vec<Row> = Vec::new();
    let mut m = base.clone();
    set(&mut m, "authentication_proof", other_proof);
    rows.push(("proof from another envelope", enc(m), "bad-proof"));
    // The same preimage signed by a different (valid, same-role) key, under the right key id.
    let forged = {
        let mut m = without(&base);
        let schema = t.schema();
        let pre = envelope::preimage(schema, "ed25519-v1", DOMAIN, &Value::Object(m.clone()));
        use ed25519_dalek::Signer as _;
        let sig = ed25519_dalek::SigningKey::from_bytes(&seed("host-session")).sign(&pre);
        m.push((
            "authentication_proof".into(),
            s(&hex::encode(sig.to_bytes())),
        ));
        enc(m)
    };
    rows.push(("signed by another key", forged, "bad-proof"));
    let mut m = base.clone();
    set(&mut m, "key_id", s("host-session"));
    rows.push((
        "key id swapped to a key of another purpose",
        enc(m),
        "key-not-authorized",
    ));
    let mut m = base.clone();
    set(&mut m, "authentication_suite_id", s("ed448-v1"));
    rows.push(("algorithm substitution", enc(m), "unsupported-profile"));
    let mut m = base.clone();
    set(&mut m, "authentication_profile_version", s("mosaic-jcs-v0"));
    rows.push(("profile substitution", enc(m), "unsupported-profile"));
    let mut m = base.clone();
    set(&mut m, "envelope_schema_version", s("mosaic.ack.v2"));
    rows.push(("schema substitution", enc(m), "unsupported-profile"));
    let mut m = base.clone();
    set(&mut m, "authentication_proof", s(""));
    rows.push(("empty proof", enc(m), "bad-field"));
    let mut m = base.clone();
    set(&mut m, "authentication_proof", Value::Null);
    rows.push(("null proof", enc(m), "bad-field"));
    rows.push(("absent proof", enc(without(&base)), "missing-field"));
    let mut m = base.clone();
    set(
        &mut m,
        "authentication_proof",
        s(&proof.as_str().unwrap().to_uppercase()),
    );
    rows.push((
        "proof in another output encoding",
        enc(m),
        "bad-proof-encoding",
    ));
    // The proof computed over a preimage that (recursively) contains a proof field.
    let recursive = {
        let mut m = without(&base);
        m.push(("authentication_proof".into(), s("")));
        let pre = envelope::preimage(t.schema(), "ed25519-v1", DOMAIN, &Value::Object(m.clone()));
        use ed25519_dalek::Signer as _;
        let sig = ed25519_dalek::SigningKey::from_bytes(&seed("host-ordinary")).sign(&pre);
        set(
            &mut m,
            "authentication_proof",
            s(&hex::encode(sig.to_bytes())),
        );
        enc(m)
    };
    rows.push(("recursive proof", recursive, "bad-proof"));
    // Non-canonical renderings of the very same object.
    rows.push((
        "whitespace",
        text.replacen(",", ", ", 1).into_bytes(),
        "non-canonical",
    ));
    rows.push((
        "alternate key order",
        {
            let mut r = base.clone();
            r.reverse();
            let mut out = b"{".to_vec();
            for (i, (k, v)) in r.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend(canonical::encode(&s(k)));
                out.push(b':');
                out.extend(canonical::encode(v));
            }
            out.push(b'}');
            out
        },
        "non-canonical",
    ));
    rows.push((
        "unicode escape",
        text.replacen("\"h1:w1\"", "\"h1:\\u0077\\u0031\"", 1)
            .into_bytes(),
        "non-canonical",
    ));
    rows.push((
        "escaped solidus",
        text.replacen("/mosaic/lanes", "\\/mosaic/lanes", 1)
            .into_bytes(),
        "non-canonical",
    ));
    rows.push((
        "numeric form 7.0",
        text.replacen("\"coordinator_epoch\":7", "\"coordinator_epoch\":7.0", 1)
            .into_bytes(),
        "malformed",
    ));
    rows.push((
        "numeric form 7e0",
        text.replacen("\"coordinator_epoch\":7", "\"coordinator_epoch\":7e0", 1)
            .into_bytes(),
        "malformed",
    ));
    rows.push((
        "leading zero",
        text.replacen("\"coordinator_epoch\":7", "\"coordinator_epoch\":07", 1)
            .into_bytes(),
        "malformed",
    ));
    rows.push((
        "integer beyond 2^53",
        text.replacen(
            "\"coordinator_epoch\":7",
            "\"coordinator_epoch\":9007199254740993",
            1,
        )
        .into_bytes(),
        "malformed",
    ));
    rows.push((
        "duplicate field",
        text.replacen("{", "{\"assignment_id\":\"a-1\",", 1)
            .into_bytes(),
        "duplicate-field",
    ));
    let mut m = base.clone();
    m.push(("note".into(), s("hi")));
    rows.push(("unknown field", enc(m), "unknown-field"));
    let mut m = base.clone();
    m.push(("issued_at".into(), s("2026-06-01T00:00:00.000000Z")));
    rows.push((
        "candidate ACK asserting authoritative time",
        enc(m),
        "prohibited-field",
    ));
    let mut m = base.clone();
    m.retain(|(k, _)| k != "challenge_id");
    rows.push(("missing challenge id", enc(m), "missing-field"));
    let mut m = base.clone();
    set(&mut m, "message_type", s("ack2"));
    rows.push(("unknown type", enc(m), "unknown-type"));
    let mut big = base.clone();
    set(&mut big, "fence_proof", s(&"x".repeat(300 * 1024)));
    rows.push(("oversized", enc(big), "too-large"));
    rows.push(("not an object", b"[1]".to_vec(), "malformed"));
    rows.push(("truncated", good[..good.len() - 1].to_vec(), "malformed"));

    for (name, bytes, want) in rows {
        assert_eq!(category(&bytes, aud), want, "row {name:?}");
    }
    assert_eq!(
        check(&good, aud),
        Ok(t),
        "the unmodified envelope must still verify"
    );
}

#[test]
fn missing_any_required_field_is_rejected() {
    for t in ALL_TYPES {
        let (_, aud) = legit(t);
        let base = obj(&valid(t));
        for (name, _) in t.schema().required_fields() {
            let mut m = base.clone();
            m.retain(|(k, _)| k != name);
            assert_eq!(
                category(&enc(m), aud),
                "missing-field",
                "{t:?} without {name}"
            );
        }
    }
}

#[test]
fn recovery_prohibitions_are_rejected_not_ignored() {
    let fields_for_recovery = [
        "assignment_attempt_id",
        "reservation_id",
        "reservation_epoch",
        "reservation_deadline",
        "lane_id",
        "lane_incarnation_id",
        "runtime_id",
        "generation",
        "fence_proof",
        "challenge_id",
        "ready_state",
        "lease_id",
        "effect_id",
        "execution_owner",
        "activation_idempotency_identity",
        "expires_at",
        "authoritative_deadline",
        "challenge_deadline",
        "deadline",
    ];
    for t in [MessageType::RecoveryChallenge, MessageType::RecoveryAck] {
        let (_, aud) = legit(t);
        let base = obj(&valid(t));
        for f in fields_for_recovery {
            let mut m = base.clone();
            m.push((f.to_string(), s("x")));
            assert_eq!(category(&enc(m), aud), "prohibited-field", "{t:?} + {f}");
        }
    }
    let (_, aud) = legit(MessageType::RecoveryAck);
    for f in ["issued_at", "acknowledged_at", "received_at", "consumed_at"] {
        let mut m = obj(&valid(MessageType::RecoveryAck));
        m.push((f.to_string(), s("2026-06-01T00:00:00.000000Z")));
        assert_eq!(
            category(&enc(m), aud),
            "prohibited-field",
            "recovery_ack + {f}"
        );
    }
}

#[test]
fn key_role_purpose_audience_domain_confusion_matrix() {
    // Every key signs every type for every audience in two domains. Exactly the
    // combinations the registry allows verify; every other one is rejected.
    let reg = registry();
    let audiences = [COORD, HOST, CANDIDATE, "coordinator:other"];
    let mut accepted = 0;
    let mut rejected = 0;
    for k in KEYS {
        for domain in [DOMAIN, "mosaic.other"] {
            let signer =
                mosaic::protocol::Signer::new(k.key_id, k.principal, domain, seed(k.key_id));
            for t in ALL_TYPES {
                for aud in audiences {
                    let bytes = signer.sign(t, aud, fields(t)).unwrap();
                    let ok = domain == DOMAIN
                        && k.audiences.contains(&aud)
                        && allowed(k.role, k.purpose).contains(&t);
                    let got = verify(&bytes, &ctx(&reg, aud));
                    assert_eq!(
                        got.is_ok(),
                        ok,
                        "{} signing {t:?} for {aud} in {domain}: {got:?}",
                        k.key_id
                    );
                    if ok {
                        accepted += 1
                    } else {
                        rejected += 1
                    }
                }
            }
        }
    }
    assert!(accepted >= ALL_TYPES.len(), "{accepted}");
    assert!(rejected > accepted * 10, "{rejected}");
    // Ordinary and recovery keys never cross.
    let ordinary = signer("host-ordinary")
        .sign(
            MessageType::RecoveryAck,
            COORD,
            fields(MessageType::RecoveryAck),
        )
        .unwrap();
    assert_eq!(category(&ordinary, COORD), "key-not-authorized");
    let recovery = signer("candidate-recovery")
        .sign(MessageType::Ack, COORD, fields(MessageType::Ack))
        .unwrap();
    assert_eq!(category(&recovery, COORD), "key-not-authorized");
}

#[test]
fn revoked_expired_and_unknown_keys_are_refused() {
    let t = MessageType::Ack;
    let bytes = valid(t);
    let mut reg = registry();
    reg.revoke("host-ordinary");
    assert_eq!(
        verify(&bytes, &ctx(&reg, COORD)).unwrap_err().category(),
        "revoked-key"
    );
    let reg = registry();
    let late = mosaic::protocol::VerifyContext {
        now: epoch() + std::time::Duration::from_secs(101 * 365 * 86400),
        ..ctx(&reg, COORD)
    };
    assert_eq!(
        verify(&bytes, &late).unwrap_err().category(),
        "key-not-valid-now"
    );
    let early = mosaic::protocol::VerifyContext {
        now: epoch() - std::time::Duration::from_secs(1),
        ..ctx(&reg, COORD)
    };
    assert_eq!(
        verify(&bytes, &early).unwrap_err().category(),
        "key-not-valid-now"
    );
    let empty = mosaic::protocol::TrustRegistry::new();
    assert_eq!(
        verify(&bytes, &ctx(&empty, COORD)).unwrap_err().category(),
        "unknown-key"
    );
    // A key that claims types outside its purpose or side is refused at load.
    let mut bad = entry(&KEYS[3]);
    bad.allowed_types.insert(MessageType::Contract);
    assert!(mosaic::protocol::TrustRegistry::new().insert(bad).is_err());
    let mut bad = entry(&KEYS[3]);
    bad.allowed_types.insert(MessageType::RecoveryAck);
    assert!(mosaic::protocol::TrustRegistry::new().insert(bad).is_err());
}

#[test]
fn old_queued_messages_are_rejected_and_audited_without_payload() {
    let reg = registry();
    let mk = |generation: u64, inc: &str, text: &str| {
        let mut f = fields(MessageType::Contract);
        for (k, v) in f.iter_mut() {
            match *k {
                "generation" => *v = envelope::n(generation),
                "lane_incarnation_id" => *v = s(inc),
                "task_text" => *v = s(text),
                _ => {}
            }
        }
        let bytes = signer("coord-ordinary")
            .sign(MessageType::Contract, HOST, f)
            .unwrap();
        verify(&bytes, &ctx(&reg, HOST)).unwrap()
    };
    let mut gate = GenerationGate::new();
    gate.advance("h1:w1", "li-1", 1).unwrap();
    let queued = mk(1, "li-1", "SECRET-OLD-TASK");
    assert!(gate.admit(&queued).is_ok());
    // The lane moves on: everything queued for generation 1 is now stale.
    gate.advance("h1:w1", "li-1", 2).unwrap();
    let audit = gate.admit(&queued).unwrap_err();
    assert_eq!(audit.reason.category(), "stale-generation");
    let line = serde_json::to_string(&audit).unwrap();
    assert!(
        !line.contains("SECRET-OLD-TASK"),
        "payload leaked into the audit record: {line}"
    );
    assert!(line.contains("m-1") && line.contains("stale-generation"));
    // Current generation, other incarnation, future generation, fenced: only the first passes.
    assert!(gate.admit(&mk(2, "li-1", "new")).is_ok());
    assert_eq!(
        gate.admit(&mk(2, "li-0", "x")).unwrap_err().category,
        "stale-incarnation"
    );
    assert_eq!(
        gate.admit(&mk(3, "li-1", "x")).unwrap_err().category,
        "future-generation"
    );
    gate.fence("h1:w1");
    assert_eq!(
        gate.admit(&mk(2, "li-1", "x")).unwrap_err().category,
        "fenced-generation"
    );
    // Generations never move backwards within an incarnation; a new incarnation restarts.
    assert!(gate.advance("h1:w1", "li-1", 2).is_err());
    assert!(gate.advance("h1:w1", "li-2", 1).is_ok());
    assert_eq!(
        gate.admit(&mk(2, "li-1", "x")).unwrap_err().category,
        "stale-incarnation"
    );
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_bytes_never_panic_or_verify(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let reg = registry();
            prop_assert!(verify(&bytes, &ctx(&reg, COORD)).is_err());
        }

        #[test]
        fn no_mutation_of_a_valid_envelope_verifies(t_idx in 0usize..ALL_TYPES.len(), pos in any::<usize>(), byte in any::<u8>(), op in 0u8..3) {
            let t = ALL_TYPES[t_idx];
            let (_, aud) = legit(t);
            let good = valid(t);
            let mut b = good.clone();
            let i = pos % b.len();
            match op {
                0 => b[i] = byte,
                1 => b.insert(i, byte),
                _ => { b.remove(i); }
            }
            prop_assume!(b != good);
            let reg = registry();
            prop_assert!(verify(&b, &ctx(&reg, aud)).is_err());
        }
    }
}

/// The typed recovery variants round-trip through their envelopes unchanged (the deadline
/// byte for byte), and the digest the coordinator recomputes from a candidate row is the
/// digest of the exact envelope the candidate received — for that message id only.
#[test]
fn recovery_messages_round_trip_and_an_ack_binds_one_exact_challenge_envelope() {
    use mosaic::protocol::messages::{
        FromHostSession, RecoveryAck, RecoveryChallenge, RecoveryFacts, ToHost,
    };
    let reg = registry();
    let facts = RecoveryFacts {
        sot_incarnation: "sot-1".into(),
        coordinator_epoch: 3,
        assignment_id: "as-1".into(),
        recovery_candidate_id: format!("rk-{}", "1".repeat(32)),
        recovery_handoff_challenge_id: format!("rh-{}", "2".repeat(64)),
        candidate_principal: CANDIDATE.into(),
        expected_retarget_operation: "initial".into(),
        failed_target_snapshot_digest: format!("sha256:{}", "3".repeat(64)),
        objective_failure_evidence_digest: format!("sha256:{}", "4".repeat(64)),
        policy_selection_digest: format!("sha256:{}", "5".repeat(64)),
        scope_digest: format!("sha256:{}", "6".repeat(64)),
        holds_digest: format!("sha256:{}", "7".repeat(64)),
        contracts_digest: format!("sha256:{}", "8".repeat(64)),
        recovery_deadline: "2026-06-01T00:00:30.123456Z".into(),
    };
    let ch = RecoveryChallenge {
        idempotency_key: "retarget/rk-1".into(),
        facts: facts.clone(),
        issued_at: "2026-06-01T00:00:00.123456Z".into(),
    };
    let coord = signer("coord-recovery");
    let mut f = ch.fields();
    f.push(("message_id", s("sess-1.4")));
    let bytes = coord
        .sign(MessageType::RecoveryChallenge, CANDIDATE, f)
        .unwrap();
    let env = verify(&bytes, &ctx(&reg, CANDIDATE)).unwrap();
    let Some(ToHost::RecoveryChallenge(back)) = ToHost::decode(&env).unwrap() else {
        panic!("not a recovery challenge")
    };
    assert_eq!(back, ch);
    assert_eq!(
        ch.envelope_digest(&coord, CANDIDATE, "sess-1.4").unwrap(),
        env.digest()
    );
    assert_ne!(
        ch.envelope_digest(&coord, CANDIDATE, "sess-1.5").unwrap(),
        env.digest(),
        "another message id is another envelope"
    );
    let ack = RecoveryAck::answering(&env, &back);
    assert_eq!(ack.acknowledged_recovery_message_id, "sess-1.4");
    let cand = signer("candidate-recovery");
    let mut f = ack.fields();
    f.push(("message_id", s("sess-1.9")));
    let bytes = cand.sign(MessageType::RecoveryAck, COORD, f).unwrap();
    let env2 = verify(&bytes, &ctx(&reg, COORD)).unwrap();
    let Some(FromHostSession::RecoveryAck(a)) = FromHostSession::decode(&env2).unwrap() else {
        panic!("not a recovery ack")
    };
    assert_eq!(*a, ack);
    assert_eq!(a.facts.recovery_deadline, facts.recovery_deadline);
    // The coordinator's ordinary key cannot issue the challenge; the candidate's recovery
    // key cannot issue it either (role), nor can it address another audience.
    let mut f = ch.fields();
    f.push(("message_id", s("sess-1.4")));
    let by_ordinary = signer("coord-ordinary")
        .sign(MessageType::RecoveryChallenge, CANDIDATE, f.clone())
        .unwrap();
    assert_eq!(category(&by_ordinary, CANDIDATE), "key-not-authorized");
    let by_candidate = cand
        .sign(MessageType::RecoveryChallenge, CANDIDATE, f)
        .unwrap();
    assert_eq!(category(&by_candidate, CANDIDATE), "key-not-authorized");
}

/// §17 Recovery key/deadline independence: key validity is its own predicate. A recovery
/// ACK whose `recovery_deadline` is far ahead is refused when its key is revoked or outside
/// its validity window; a valid key does not extend a deadline (the deadline is the
/// coordinator's CAS, `tests/retarget.rs`), and the envelope carries no time of its own.
#[test]
fn a_recovery_key_is_checked_apart_from_the_recovery_deadline() {
    let t = MessageType::RecoveryAck;
    let bytes = valid(t);
    let (_, aud) = legit(t);
    let mut reg = registry();
    assert!(verify(&bytes, &ctx(&reg, aud)).is_ok());
    reg.revoke("candidate-recovery");
    assert_eq!(
        verify(&bytes, &ctx(&reg, aud)).unwrap_err().category(),
        "revoked-key"
    );
    let reg = registry();
    let late = mosaic::protocol::VerifyContext {
        now: epoch() + std::time::Duration::from_secs(101 * 365 * 86400),
        ..ctx(&reg, aud)
    };
    assert_eq!(
        verify(&bytes, &late).unwrap_err().category(),
        "key-not-valid-now"
    );
    // Candidate time is never carried: every time field is absent from the ACK (and
    // `recovery_prohibitions_are_rejected_not_ignored` refuses one added).
    let m = obj(&bytes);
    for f in [
        "issued_at",
        "expires_at",
        "acknowledged_at",
        "received_at",
        "consumed_at",
    ] {
        assert!(m.iter().all(|(k, _)| k != f), "{f}");
    }
}
