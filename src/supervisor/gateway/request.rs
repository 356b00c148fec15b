//! What the gateway sends upstream: which headers go, where a credential may go, which
//! paths are carried.

use crate::shim::proto::SecretValue;

/// Headers that describe one hop, not the request: never forwarded.
pub(super) const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    // Answers are read for their usage: asked for uncompressed.
    "accept-encoding",
];

/// Headers a credential may go in, and only as the whole value (`authorization` also as
/// `Bearer <placeholder>`): where providers read their keys. A placeholder anywhere else —
/// another header, part of a value — is refused: a header the provider might quote back
/// (an error naming a bad value, an echoed origin) must never carry a key.
const CREDENTIAL_HEADERS: &[&str] = &["authorization", "x-api-key", "api-key", "x-goog-api-key"];

/// `value` of header `name` as sent upstream: a placeholder in an allowed form replaced by
/// its credential (marked sensitive), anything else unchanged; a placeholder elsewhere is
/// refused.
pub(super) fn substitute(
    name: &str,
    value: &hyper::header::HeaderValue,
    secrets: &[(String, SecretValue)],
) -> Result<hyper::header::HeaderValue, &'static str> {
    const MARK: &[u8] = b"mosaic-credential-";
    if !value.as_bytes().windows(MARK.len()).any(|w| w == MARK) {
        return Ok(value.clone());
    }
    let text = value
        .to_str()
        .map_err(|_| "a malformed header names a credential")?;
    let (prefix, token) = match text.strip_prefix("Bearer ") {
        Some(t) if name == "authorization" => ("Bearer ", t),
        _ => ("", text),
    };
    if !CREDENTIAL_HEADERS.contains(&name) {
        return Err("a credential may go only in a provider's key header");
    }
    let real = secrets
        .iter()
        .find(|(p, _)| crate::util::ct::eq(p.as_bytes(), token.as_bytes()))
        .map(|(_, v)| v)
        .ok_or("the header names no credential of this runtime (or not as its whole value)")?;
    let full = zeroize::Zeroizing::new(format!("{prefix}{}", real.0));
    let mut hv = hyper::header::HeaderValue::from_str(&full)
        .map_err(|_| "a credential does not fit in a header value")?;
    hv.set_sensitive(true);
    Ok(hv)
}

/// Refuses a request path that could leave the upstream's base path or be read two ways:
/// dot segments, empty segments, encoded dots or slashes, a missing leading slash.
pub(super) fn check_path(path: &str) -> Result<(), &'static str> {
    let p = path.split(['?', '#']).next().unwrap_or("");
    if !p.starts_with('/') {
        return Err("only origin-form requests (a path) are carried");
    }
    let lower = p.to_ascii_lowercase();
    if p[1..].split('/').any(|seg| seg == "." || seg == "..")
        || p.contains("//")
        || lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || p.contains('\\')
    {
        return Err("the request path has dot, empty or encoded segments");
    }
    Ok(())
}
