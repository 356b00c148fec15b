//! A provider's rate limit, as the gateway sees it in the provider's own answer (issue 23
//! part 5): status 429 and the headers that say when the limit resets. The supervisor,
//! not the harness, observes it — every model request of a confined generation passes
//! through its gateway — so no harness's word and no family-specific signal is needed, and
//! a harness's shell tool cannot forge one (its traffic never takes the provider path).
//!
//! When the limit resets is the latest of the hints present: `retry-after-ms`,
//! `retry-after` (seconds), Anthropic's `anthropic-ratelimit-*-reset` (RFC 3339) and
//! `anthropic-ratelimit-unified-reset` (Unix seconds), OpenAI's `x-ratelimit-reset-*`
//! (durations such as `6m0s`). Without any, [`DEFAULT_WAIT`]. The evidence is the status,
//! those headers and when it was seen, canonically encoded; only its digest leaves the host.
//!
//! **Never:** takes a hint from the request or the body; keeps a header not listed here
//! (a provider may echo an organisation or a key); waits longer than [`MAX_WAIT`].

use std::time::{Duration, SystemTime};

/// How long a limit that names no reset is assumed to last.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);
/// The longest wait a hint may name (the coordinator refuses longer blocks).
pub const MAX_WAIT: Duration = Duration::from_secs(7 * 86_400);
/// A limit this long or longer blocks the work at once; a shorter one only when the
/// harness's turn ends under it (the harness's own retries may ride it out).
pub const BLOCK_AT_ONCE: Duration = Duration::from_secs(30);

/// One rate-limited answer of the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limited {
    /// How long from the answer until the limit resets.
    pub wait: Duration,
    /// The status and the rate-limit headers, canonical JSON (the blocker's evidence).
    pub evidence: Vec<u8>,
}

/// The headers a reset hint is read from (and the only ones the evidence keeps).
fn relevant(name: &str) -> bool {
    name == "retry-after"
        || name == "retry-after-ms"
        || (name.starts_with("anthropic-ratelimit-") && name.ends_with("-reset"))
        || name.starts_with("x-ratelimit-reset-")
}

/// What an answer with `status` and `headers` (names lower-case) says of a rate limit, at
/// `now`: `None` unless the status is 429.
pub fn of_answer<'a>(
    status: u16,
    headers: impl IntoIterator<Item = (&'a str, &'a str)>,
    now: SystemTime,
) -> Option<Limited> {
    if status != 429 {
        return None;
    }
    let mut kept = std::collections::BTreeMap::new();
    let mut wait: Option<Duration> = None;
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        if !relevant(&name) {
            continue;
        }
        let value = value.trim();
        if let Some(w) = hint(&name, value, now) {
            wait = Some(wait.map_or(w, |x| x.max(w)));
        }
        kept.insert(name, value.chars().take(200).collect::<String>());
    }
    let wait = wait.unwrap_or(DEFAULT_WAIT).min(MAX_WAIT);
    // When it was seen (host time, advisory): two limits with the same headers are two
    // pieces of evidence, each its own block.
    let seen = humantime::format_rfc3339_micros(now).to_string();
    let evidence = serde_json::to_vec(
        &serde_json::json!({ "status": status, "headers": kept, "observed_at": seen }),
    )
    .unwrap_or_default();
    Some(Limited { wait, evidence })
}

/// One header's reset hint as a wait from `now`.
fn hint(name: &str, value: &str, now: SystemTime) -> Option<Duration> {
    let until = |t: SystemTime| Some(t.duration_since(now).unwrap_or(Duration::ZERO));
    match name {
        "retry-after-ms" => value.parse::<u64>().ok().map(Duration::from_millis),
        "retry-after" => value.parse::<u64>().ok().map(Duration::from_secs),
        "anthropic-ratelimit-unified-reset" => {
            until(SystemTime::UNIX_EPOCH + Duration::from_secs(value.parse().ok()?))
        }
        n if n.starts_with("anthropic-ratelimit-") => {
            until(humantime::parse_rfc3339_weak(value).ok()?)
        }
        n if n.starts_with("x-ratelimit-reset-") => humantime::parse_duration(value).ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
