//! Fuzzes the envelope parser and verifier: arbitrary bytes must never panic, and must
//! never verify (the registry holds one key whose secret the fuzzer does not have).
#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use mosaic::protocol::schema::{MessageType, Purpose, Role};
use mosaic::protocol::trust::{KeyEntry, Suite};
use mosaic::protocol::{verify, Signer, TrustRegistry, VerifyContext};

fuzz_target!(|data: &[u8]| {
    let signer = Signer::new("host-ordinary", "host:h1", "mosaic.fuzz", [7u8; 32]);
    let mut reg = TrustRegistry::new();
    let _ = reg.insert(KeyEntry {
        key_id: "host-ordinary".into(),
        principal: "host:h1".into(),
        role: Role::Host,
        purpose: Purpose::Ordinary,
        allowed_types: [MessageType::Ack, MessageType::Injected, MessageType::Staged].into_iter().collect(),
        audiences: ["coordinator:main".to_string()].into_iter().collect(),
        trust_domain: "mosaic.fuzz".into(),
        not_before: SystemTime::UNIX_EPOCH,
        not_after: SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 40),
        revoked: false,
        suite: Suite::Ed25519,
        public_key: signer.public_key(),
    });
    let ctx = VerifyContext { registry: &reg, audience: "coordinator:main", trust_domain: "mosaic.fuzz", now: SystemTime::now() };
    let _ = mosaic::protocol::canonical::parse(data);
    assert!(verify(data, &ctx).is_err(), "fuzzer forged an envelope");
});
