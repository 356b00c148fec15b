//! Golden vectors in `tests/vectors/`: canonical envelopes with their exact preimages and
//! proofs, valid and invalid, so another implementation can be checked against them.
//!
//! The files are generated from the fixture keys (Ed25519 signatures are deterministic)
//! and committed. This test regenerates them in memory and requires the committed files
//! to match byte for byte — a change to the encoding or the preimage profile shows up as
//! a diff — then checks every case through the verifier and, independently of it, checks
//! each valid case's preimage and raw signature. `MOSAIC_WRITE_VECTORS=1` rewrites them.

mod fixture;

use fixture::*;
use mosaic::protocol::canonical::{self, Value};
use mosaic::protocol::envelope::{self, s};
use mosaic::protocol::schema::{MessageType, ALL_TYPES};
use mosaic::protocol::{verify, TrustRegistry};

fn trust_toml() -> String {
    let mut out =
        String::from("# Trust registry for the golden vectors (fixture keys; test use only).\n");
    for k in KEYS {
        let e = entry(k);
        let types: Vec<String> = e
            .allowed_types
            .iter()
            .map(|t| format!("{:?}", t.as_str()))
            .collect();
        let auds: Vec<String> = e.audiences.iter().map(|a| format!("{a:?}")).collect();
        out.push_str(&format!(
            "\n[[key]]\nkey_id = {:?}\nprincipal = {:?}\nrole = {:?}\npurpose = {:?}\nallowed_types = [{}]\naudiences = [{}]\ntrust_domain = {:?}\nnot_before = \"2026-01-01T00:00:00Z\"\nnot_after = \"2027-01-01T00:00:00Z\"\nsuite = \"ed25519-v1\"\npublic_key = {:?}\n",
            e.key_id,
            e.principal,
            format!("{:?}", e.role).to_lowercase(),
            format!("{:?}", e.purpose).to_lowercase(),
            types.join(", "),
            auds.join(", "),
            e.trust_domain,
            hex::encode(e.public_key.to_bytes()),
        ));
    }
    out
}

struct Case {
    name: String,
    audience: &'static str,
    envelope: Vec<u8>,
    expect: &'static str,
}

fn mutate(t: MessageType, f: impl FnOnce(&mut Vec<(String, Value)>)) -> Vec<u8> {
    let Value::Object(mut m) = canonical::parse(&valid(t)).unwrap() else {
        unreachable!()
    };
    f(&mut m);
    canonical::encode(&Value::Object(m))
}

fn cases() -> Vec<Case> {
    let mut v: Vec<Case> = ALL_TYPES
        .into_iter()
        .map(|t| Case {
            name: format!("valid {}", t.as_str()),
            audience: legit(t).1,
            envelope: valid(t),
            expect: "valid",
        })
        .collect();
    let ack = MessageType::Ack;
    let text = String::from_utf8(valid(ack)).unwrap();
    let set = |k: &'static str, val: Value| {
        move |m: &mut Vec<(String, Value)>| {
            m.iter_mut()
                .filter(|(x, _)| x == k)
                .for_each(|e| e.1 = val.clone())
        }
    };
    v.extend([
        Case {
            name: "generation substituted after signing".into(),
            audience: COORD,
            envelope: mutate(ack, set("generation", envelope::n(4))),
            expect: "bad-proof",
        },
        Case {
            name: "contracts digest substituted".into(),
            audience: COORD,
            envelope: mutate(
                ack,
                set("contracts_digest", s(&format!("sha256:{}", "0".repeat(64)))),
            ),
            expect: "bad-proof",
        },
        Case {
            name: "whitespace after a comma".into(),
            audience: COORD,
            envelope: text.replacen(',', ", ", 1).into_bytes(),
            expect: "non-canonical",
        },
        Case {
            name: "unicode escape for an ASCII letter".into(),
            audience: COORD,
            envelope: text
                .replacen("\"h1:w1\"", "\"h1:\\u0077\\u0031\"", 1)
                .into_bytes(),
            expect: "non-canonical",
        },
        Case {
            name: "duplicate field".into(),
            audience: COORD,
            envelope: text
                .replacen('{', "{\"assignment_id\":\"a-1\",", 1)
                .into_bytes(),
            expect: "duplicate-field",
        },
        Case {
            name: "candidate ACK asserting issued_at".into(),
            audience: COORD,
            envelope: mutate(ack, |m| {
                m.push(("issued_at".into(), s("2026-06-01T00:00:00.000000Z")))
            }),
            expect: "prohibited-field",
        },
        Case {
            name: "recovery ACK carrying a generation".into(),
            audience: COORD,
            envelope: mutate(MessageType::RecoveryAck, |m| {
                m.push(("generation".into(), envelope::n(1)))
            }),
            expect: "prohibited-field",
        },
        Case {
            name: "empty proof".into(),
            audience: COORD,
            envelope: mutate(ack, set("authentication_proof", s(""))),
            expect: "bad-field",
        },
        Case {
            name: "proof absent".into(),
            audience: COORD,
            envelope: mutate(ack, |m| m.retain(|(k, _)| k != "authentication_proof")),
            expect: "missing-field",
        },
        Case {
            name: "host key signing a coordinator contract".into(),
            audience: HOST,
            envelope: signer("host-ordinary")
                .sign(MessageType::Contract, HOST, fields(MessageType::Contract))
                .unwrap(),
            expect: "key-not-authorized",
        },
        Case {
            name: "wrong audience".into(),
            audience: COORD,
            envelope: signer("host-ordinary")
                .sign(ack, HOST, fields(ack))
                .unwrap(),
            expect: "wrong-audience",
        },
    ]);
    v
}

fn render(cases: &[Case]) -> String {
    let reg = registry();
    let mut items = Vec::new();
    for c in cases {
        let mut obj = vec![
            ("name".to_string(), s(&c.name)),
            ("audience".to_string(), s(c.audience)),
            ("trust_domain".to_string(), s(DOMAIN)),
            ("verify_at".to_string(), s("2026-06-01T00:00:00Z")),
            (
                "envelope".to_string(),
                s(&String::from_utf8(c.envelope.clone()).unwrap()),
            ),
            ("expect".to_string(), s(c.expect)),
        ];
        if c.expect == "valid" {
            let env = verify(&c.envelope, &ctx(&reg, c.audience)).unwrap();
            let Value::Object(m) = canonical::parse(env.bytes()).unwrap() else {
                unreachable!()
            };
            let proof = m
                .iter()
                .find(|(k, _)| k == "authentication_proof")
                .unwrap()
                .1
                .clone();
            let without = Value::Object(
                m.into_iter()
                    .filter(|(k, _)| k != "authentication_proof")
                    .collect(),
            );
            let pre =
                envelope::preimage(env.message_type().schema(), "ed25519-v1", DOMAIN, &without);
            obj.push(("preimage_hex".to_string(), s(&hex::encode(pre))));
            obj.push(("proof".to_string(), proof));
        }
        items.push(Value::Object(obj));
    }
    // One case per line keeps diffs readable.
    let lines: Vec<String> = items
        .iter()
        .map(|i| String::from_utf8(canonical::encode(i)).unwrap())
        .collect();
    format!("[\n{}\n]\n", lines.join(",\n"))
}

#[test]
fn golden_vectors_match_and_verify() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let (trust, envs) = (trust_toml(), render(&cases()));
    if std::env::var_os("MOSAIC_WRITE_VECTORS").is_some() {
        std::fs::write(dir.join("trust.toml"), &trust).unwrap();
        std::fs::write(dir.join("envelopes.json"), &envs).unwrap();
    }
    let on_disk_trust = std::fs::read_to_string(dir.join("trust.toml")).unwrap();
    let on_disk_envs = std::fs::read_to_string(dir.join("envelopes.json")).unwrap();
    assert_eq!(
        on_disk_trust, trust,
        "tests/vectors/trust.toml is stale (MOSAIC_WRITE_VECTORS=1 regenerates)"
    );
    assert_eq!(
        on_disk_envs, envs,
        "tests/vectors/envelopes.json is stale (MOSAIC_WRITE_VECTORS=1 regenerates)"
    );

    // Check the files as another implementation would: from the files alone.
    let reg = TrustRegistry::from_toml(&on_disk_trust).unwrap();
    let serde_json::Value::Array(list) = serde_json::from_str(&on_disk_envs).unwrap() else {
        panic!()
    };
    assert!(list.len() > ALL_TYPES.len());
    for c in list {
        let name = c["name"].as_str().unwrap();
        let cx = mosaic::protocol::VerifyContext {
            registry: &reg,
            audience: c["audience"].as_str().unwrap(),
            trust_domain: c["trust_domain"].as_str().unwrap(),
            now: humantime::parse_rfc3339(c["verify_at"].as_str().unwrap()).unwrap(),
        };
        let bytes = c["envelope"].as_str().unwrap().as_bytes();
        let got = verify(bytes, &cx);
        match c["expect"].as_str().unwrap() {
            "valid" => {
                let env = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                // Independent of `verify`: the recorded preimage really is signed by the
                // issuer's key, and ends with the canonical envelope minus its proof.
                let pre = hex::decode(c["preimage_hex"].as_str().unwrap()).unwrap();
                let sig = hex::decode(c["proof"].as_str().unwrap()).unwrap();
                let key = reg.resolve(env.key_id()).unwrap();
                key.public_key
                    .verify_strict(&pre, &ed25519_dalek::Signature::from_slice(&sig).unwrap())
                    .unwrap();
                assert!(pre.starts_with(b"MOSAIC/session-envelope/v1\0"), "{name}");
            }
            want => assert_eq!(
                got.map(|e| e.message_type()).unwrap_err().category(),
                want,
                "{name}"
            ),
        }
    }
}
