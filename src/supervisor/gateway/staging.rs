//! Before its activation a generation reaches no provider (spec §3.7: a staging generation
//! has no effect to make). Its harness still takes the activation check as a model turn and
//! answers it from that turn's result (`adapter::ackline`), so the gateway answers the
//! harness's model requests itself: the activation check with the ACK its own request
//! proves it can give — the challenge from the latest turn, the contract key from the
//! context the harness sent, so a harness whose context lacks the contract gets no key —
//! and anything else with a short "not active yet". Nothing is sent upstream, no credential
//! is used, and no claim is made.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Response, StatusCode};

use super::{read_body, Body, Shared};
use crate::adapter::modelwire::{activation_answer, encode, Answer, Api};

/// What a model request that is not the activation check gets before activation.
pub const NOT_ACTIVE: &str =
    "Mosaic: this generation is not active yet. Nothing reaches a model before its activation.";

pub(super) async fn answer(
    shared: &Arc<Shared>,
    parts: &hyper::http::request::Parts,
    body: Incoming,
) -> Response<Body> {
    let api = match (
        parts.method == hyper::Method::POST,
        Api::of_path(parts.uri.path()),
    ) {
        (true, Some(api)) => api,
        _ => return shared.refuse(StatusCode::SERVICE_UNAVAILABLE, NOT_ACTIVE),
    };
    let bytes = match read_body(body).await {
        Ok(b) => b,
        Err(why) => return shared.refuse(StatusCode::PAYLOAD_TOO_LARGE, why),
    };
    let Ok(request) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return shared.refuse(StatusCode::BAD_REQUEST, "a model request is JSON");
    };
    let n = shared.stats.staged_answers.fetch_add(1, Ordering::Relaxed) + 1;
    let text = activation_answer(api, &request).unwrap_or_else(|| NOT_ACTIVE.to_string());
    #[cfg(feature = "failpoints")]
    let text = fault(api, &request, text);
    let (out, content_type) = encode(api, &request, &Answer::Text(text), n, 0);
    let mut r = Response::new(
        Full::new(Bytes::from(out))
            .map_err(|never| match never {})
            .boxed(),
    );
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

/// Test builds only (`failpoints`, like every fault the suites inject): a task may ask for
/// the answer a harness that lost its way would give — the challenge's phrase reversed
/// (`model:wrong-ack`), the contract key left out (`model:omit-contract-key`), or a handoff
/// check answered in the activation check's form (`model:handoff-as-activation`) — so the
/// real-harness suites show that such an answer, taken from the harness's own turn end,
/// never activates it nor takes a handoff.
#[cfg(feature = "failpoints")]
fn fault(api: Api, request: &serde_json::Value, text: String) -> String {
    use crate::adapter::{ackline, modelwire, Check};
    let mut all = Vec::new();
    modelwire::strings(request, &mut all);
    let has = |m: &str| all.iter().any(|s| s.contains(m));
    let (_, latest) = modelwire::latest_turn(api, request);
    let key = modelwire::contract_key(request).unwrap_or_default();
    if let Some(phrase) = Check::Handoff.find(&latest) {
        if has("model:handoff-as-activation") {
            return Check::Activation.answer(&phrase, &key);
        }
        return text;
    }
    let Some(phrase) = ackline::find_challenge(&latest) else {
        return text;
    };
    if has("model:wrong-ack") {
        return ackline::ack(&phrase.chars().rev().collect::<String>(), &key);
    }
    if has("model:omit-contract-key") {
        return ackline::ack_without_key(&phrase);
    }
    text
}
