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
fn the_retry_hint_then_the_exhausted_buckets_reset_is_the_wait() {
    let now = at(1_700_000_000);
    // OpenAI: the token bucket resets in a day but is not the limit; requests are.
    let l = of_answer(
        429,
        [
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "20s"),
            ("x-ratelimit-remaining-tokens", "90000"),
            ("x-ratelimit-reset-tokens", "24h"),
        ],
        now,
    )
    .unwrap();
    assert_eq!(l.wait, Duration::from_secs(20));
    // A subscription cap: the unified reset, when its status says rejected.
    let l = of_answer(
        429,
        [
            ("anthropic-ratelimit-unified-status", "rejected"),
            ("anthropic-ratelimit-unified-reset", "1700003600"),
            ("anthropic-ratelimit-requests-remaining", "40"),
            ("anthropic-ratelimit-requests-reset", "2023-11-14T22:14:20Z"),
        ],
        now,
    )
    .unwrap();
    assert_eq!(l.wait, Duration::from_secs(3600));
    // The provider's retry hint wins over every bucket; milliseconds too.
    let l = of_answer(
        429,
        [
            ("retry-after", "12"),
            ("x-ratelimit-remaining-requests", "0"),
            ("x-ratelimit-reset-requests", "6m0s"),
        ],
        now,
    )
    .unwrap();
    assert_eq!(l.wait, Duration::from_secs(12));
    assert_eq!(
        of_answer(429, [("retry-after-ms", "1500")], now)
            .unwrap()
            .wait,
        Duration::from_millis(1500)
    );
}

#[test]
fn without_a_retry_hint_or_an_exhausted_bucket_the_latest_reset_is_the_wait() {
    let now = at(1_700_000_000);
    let l = of_answer(
        429,
        [
            ("anthropic-ratelimit-tokens-reset", "2023-11-14T22:14:20Z"), // now + 7 s
            ("anthropic-ratelimit-unified-reset", "1700000100"),          // now + 100 s
            ("x-request-id", "req_1"),
        ],
        now,
    )
    .unwrap();
    assert_eq!(l.wait, Duration::from_secs(100));
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
    // A reset already past waits nothing; no hint waits the default; none waits past the cap.
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
fn the_evidence_keeps_the_status_and_the_rate_limit_headers_only() {
    let l = of_answer(
        429,
        [
            ("Retry-After", "5"),
            ("x-ratelimit-remaining-requests", "0"),
            ("openai-organization", "org-secret"),
            ("set-cookie", "k=v"),
        ],
        at(0),
    )
    .unwrap();
    let e: serde_json::Value = serde_json::from_slice(&l.evidence).unwrap();
    assert_eq!(
        e,
        serde_json::json!({"status": 429,
            "headers": {"retry-after": "5", "x-ratelimit-remaining-requests": "0"},
            "observed_at": "1970-01-01T00:00:00.000000Z"})
    );
}
