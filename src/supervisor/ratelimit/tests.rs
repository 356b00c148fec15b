use super::*;

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn only_a_429_is_a_rate_limit() {
    assert_eq!(of_answer(200, [("retry-after", "30")], at(0)), None);
    assert_eq!(of_answer(529, [("retry-after", "30")], at(0)), None);
    assert!(of_answer(429, [], at(0)).is_some());
}

#[test]
fn the_latest_reset_any_hint_names_is_the_wait() {
    let now = at(1_700_000_000);
    // Anthropic: seconds, RFC 3339 per limit, and the unified (subscription) reset.
    let l = of_answer(
        429,
        [
            ("retry-after", "12"),
            ("anthropic-ratelimit-tokens-reset", "2023-11-14T22:14:20Z"), // now + 7 s
            ("anthropic-ratelimit-unified-reset", "1700000100"),          // now + 100 s
            ("x-request-id", "req_1"),
        ],
        now,
    )
    .unwrap();
    assert_eq!(l.wait, Duration::from_secs(100));
    // OpenAI: durations.
    let l = of_answer(
        429,
        [
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ],
        now,
    )
    .unwrap();
    assert_eq!(l.wait, Duration::from_secs(360));
    // Milliseconds beat nothing; a reset already past waits nothing; no hint waits the default.
    assert_eq!(
        of_answer(429, [("retry-after-ms", "1500")], now)
            .unwrap()
            .wait,
        Duration::from_millis(1500)
    );
    assert_eq!(
        of_answer(
            429,
            [("anthropic-ratelimit-requests-reset", "2000-01-01T00:00:00Z")],
            now
        )
        .unwrap()
        .wait,
        Duration::ZERO
    );
    assert_eq!(
        of_answer(429, [("retry-after", "soon")], now).unwrap().wait,
        DEFAULT_WAIT
    );
    assert_eq!(
        of_answer(429, [("retry-after", "99999999")], now)
            .unwrap()
            .wait,
        MAX_WAIT
    );
}

#[test]
fn the_evidence_keeps_the_status_and_the_reset_headers_only() {
    let l = of_answer(
        429,
        [
            ("Retry-After", "5"),
            ("openai-organization", "org-secret"),
            ("set-cookie", "k=v"),
        ],
        at(0),
    )
    .unwrap();
    let e: serde_json::Value = serde_json::from_slice(&l.evidence).unwrap();
    assert_eq!(
        e,
        serde_json::json!({"status": 429, "headers": {"retry-after": "5"},
            "observed_at": "1970-01-01T00:00:00.000000Z"})
    );
}
