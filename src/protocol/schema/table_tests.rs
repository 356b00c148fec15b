use super::*;

#[test]
fn every_type_has_exactly_one_consistent_schema() {
    for t in ALL_TYPES {
        let s: Vec<&Schema> = SCHEMAS.iter().filter(|s| s.message_type == t).collect();
        assert_eq!(s.len(), 1, "{t:?}");
        let s = s[0];
        assert_eq!(t.schema().message_type, t);
        assert_eq!(MessageType::parse(t.as_str()), Some(t));
        assert_eq!(s.version, format!("mosaic.{}.v1", t.as_str()));
        // No field is both allowed and prohibited; no field is listed twice.
        let mut names: Vec<&str> = s
            .required_fields()
            .map(|(n, _)| *n)
            .chain(s.optional.iter().map(|(n, _)| *n))
            .collect();
        for n in &names {
            assert!(
                !s.is_prohibited(n),
                "{t:?}: {n} both allowed and prohibited"
            );
        }
        let before = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(before, names.len(), "{t:?} lists a field twice");
    }
    let digests: std::collections::BTreeSet<[u8; 32]> =
        SCHEMAS.iter().map(|s| s.digest()).collect();
    assert_eq!(digests.len(), SCHEMAS.len());
}

#[test]
fn recovery_and_ordinary_are_disjoint_in_purpose() {
    for s in &SCHEMAS {
        let recovery = matches!(
            s.message_type,
            MessageType::RecoveryChallenge | MessageType::RecoveryAck
        );
        assert_eq!(
            recovery,
            s.purpose == Purpose::Recovery,
            "{:?}",
            s.message_type
        );
    }
}
