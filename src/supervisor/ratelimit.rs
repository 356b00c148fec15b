//! A provider's rate limit, as the gateway sees it in the provider's own answer (issue 23
//! part 5): status 429 and the headers that say when the limit resets. The supervisor,
//! not the harness, observes it — every model request of a confined generation passes
//! through its gateway — so no harness's word and no family-specific signal is needed. It is
//! the provider's own answer: a harness's shell tool, which can reach the same provider
//! path, can provoke one (and a block of its own work), never forge one.
//!
//! When the limit resets: the provider's retry hint (`retry-after-ms`, `retry-after` in
//! seconds) when it gives one; else the reset of each bucket it says is exhausted
//! (Anthropic's `anthropic-ratelimit-<bucket>-reset`, RFC 3339, with `-remaining: 0`, and
//! `-unified-reset`, Unix seconds, with `-unified-status: rejected`; OpenAI's
//! `x-ratelimit-reset-<bucket>`, a duration such as `6m0s`, with
//! `x-ratelimit-remaining-<bucket>: 0`) — a 429 carries every bucket's reset, most not the
//! limit; else the latest reset named; else [`DEFAULT_WAIT`]. The evidence is the status,
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

/// The headers a reset hint is read from (and the only ones the evidence keeps): the
/// retry hints, and each bucket's reset and remaining count.
fn relevant(name: &str) -> bool {
    name == "retry-after"
        || name == "retry-after-ms"
        || (name.starts_with("anthropic-ratelimit-")
            && (name.ends_with("-reset")
                || name.ends_with("-remaining")
                || name.ends_with("-status")))
        || name.starts_with("x-ratelimit-reset-")
        || name.starts_with("x-ratelimit-remaining-")
}

/// The bucket a reset header is for, and the header that says the bucket is exhausted.
fn exhausted_by(reset: &str) -> Option<(String, &'static str)> {
    if let Some(b) = reset
        .strip_prefix("anthropic-ratelimit-")
        .and_then(|r| r.strip_suffix("-reset"))
    {
        return Some(if b == "unified" {
            ("anthropic-ratelimit-unified-status".into(), "rejected")
        } else {
            (format!("anthropic-ratelimit-{b}-remaining"), "0")
        });
    }
    reset
        .strip_prefix("x-ratelimit-reset-")
        .map(|b| (format!("x-ratelimit-remaining-{b}"), "0"))
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
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        if relevant(&name) {
            kept.insert(name, value.trim().chars().take(200).collect::<String>());
        }
    }
    // The provider's own retry hint when it gives one; else the reset of the buckets it
    // says are exhausted (a 429 carries every bucket's reset, most of them not the limit);
    // else the latest reset named; else the default.
    let latest = |names: &mut dyn Iterator<Item = &String>| {
        names.filter_map(|n| hint(n, &kept[n], now)).max()
    };
    let retry = latest(&mut kept.keys().filter(|n| n.starts_with("retry-after")));
    let exhausted = latest(&mut kept.keys().filter(|n| {
        exhausted_by(n).is_some_and(|(flag, v)| kept.get(&flag).map(String::as_str) == Some(v))
    }));
    let any = latest(&mut kept.keys());
    let wait = retry
        .or(exhausted)
        .or(any)
        .unwrap_or(DEFAULT_WAIT)
        .min(MAX_WAIT);
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
