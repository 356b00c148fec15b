//! A provider request: checked whole (method, path, where its credentials go), answered by
//! the staging responder before activation, otherwise admitted as a claim bound to the
//! digest of exactly this request and only then sent upstream.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::answer::{find, Redacted, Usage, REDACTED};
use super::request::{check_path, substitute, HOP_BY_HOP};
use super::settle::{Settle, SettledBody};
use super::{denied, read_body, Body, HostMetrics, Shared, ANSWER_TIMEOUT};
use crate::protocol::effects::{self, Outcome, Target};
use crate::supervisor::broker::{Admitted, Claim, Denied, Phase};

pub(super) async fn forward(shared: &Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let route = &shared.route;
    let runtime = &route.runtime;
    let Some(upstream) = &route.upstream else {
        return shared.refuse(
            StatusCode::NOT_FOUND,
            "this generation's runtime declares no provider",
        );
    };
    let secrets = match &route.secrets {
        Ok(s) => s,
        Err(why) => return shared.refuse(StatusCode::SERVICE_UNAVAILABLE, why),
    };
    let (mut parts, body) = req.into_parts();
    // Everything about the request is checked before anything is asked or sent.
    if parts.method != hyper::Method::GET && parts.method != hyper::Method::POST {
        return shared.refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "the gateway carries GET and POST only",
        );
    }
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    if let Err(why) = check_path(&path) {
        return shared.refuse(StatusCode::BAD_REQUEST, why);
    }
    let uri = match format!("{}{path}", upstream.base_path).parse::<hyper::Uri>() {
        Ok(u) => u,
        Err(_) => return shared.refuse(StatusCode::BAD_REQUEST, "malformed request path"),
    };
    let mut headers = hyper::HeaderMap::with_capacity(parts.headers.len() + 2);
    for (name, value) in parts.headers.iter() {
        if HOP_BY_HOP.contains(&name.as_str()) {
            continue;
        }
        match substitute(name.as_str(), value, secrets) {
            Ok(v) => {
                headers.append(name.clone(), v);
            }
            Err(why) => return shared.refuse(StatusCode::BAD_REQUEST, why),
        }
    }
    match hyper::header::HeaderValue::from_str(&upstream.authority()) {
        Ok(h) => {
            headers.insert(hyper::header::HOST, h);
        }
        Err(_) => {
            return shared.refuse(
                StatusCode::BAD_GATEWAY,
                "upstream host is not a header value",
            )
        }
    }
    headers.insert(
        hyper::header::ACCEPT_ENCODING,
        hyper::header::HeaderValue::from_static("identity"),
    );
    // A supervisor restarting waits (bounded) for its coordinator link's broker.
    let ready = route
        .broker
        .ready(crate::supervisor::coordinated::ADMIT_TIMEOUT)
        .await;
    let broker = match (
        ready.as_ref().map_or(Phase::NoAuthority, |b| {
            b.phase(&route.lane_id, route.generation)
        }),
        ready,
    ) {
        (Phase::Active, Some(b)) => b,
        // Before activation nothing leaves: the gateway answers the activation exchange.
        (Phase::Staging, _) => return super::staging::answer(shared, &parts, body).await,
        _ => return denied(shared, &Denied::NoAuthority),
    };
    let bytes = match read_body(body).await {
        Ok(b) => b,
        Err(why) => return shared.refuse(StatusCode::PAYLOAD_TOO_LARGE, why),
    };
    // The claim binds exactly this request: method, path, and its body's digest.
    let body_digest = crate::util::sha256_hex("mosaic/provider-request-body/v1", &[&bytes]);
    let claim = Claim {
        target: Target::Provider,
        idempotency_key: format!("gw-{}", uuid::Uuid::new_v4().simple()),
        operation_digest: effects::operation_digest(
            &Target::Provider,
            &[
                parts.method.as_str().as_bytes(),
                path.as_bytes(),
                body_digest.as_bytes(),
            ],
        ),
    };
    let effect_id = match broker.admit(&route.lane_id, route.generation, claim).await {
        Ok(Admitted::Fresh { effect_id }) => effect_id,
        // A fresh key every time: a settled answer means the key was somehow seen before,
        // and nothing is sent twice.
        Ok(Admitted::Settled { .. }) => {
            return shared.refuse(
                StatusCode::CONFLICT,
                "this request's claim was admitted before; it is not sent again",
            )
        }
        Err(d) => return denied(shared, &d),
    };
    let settle = Settle::begin(
        &shared.inflight,
        &effect_id,
        &route.lane_id,
        route.generation,
        broker.clone(),
        true,
    );
    crate::supervisor::broker::hold("effect:pre-dispatch").await;
    // The executor's own fence check, right before dispatch: a generation fenced since its
    // admission sends nothing.
    if !broker.may_dispatch(&route.lane_id, route.generation) {
        settle.finish(Outcome::NotDispatched);
        return denied(shared, &Denied::Fenced);
    }
    parts.uri = uri;
    parts.headers = headers;
    let upstream_req = Request::from_parts(parts, Full::new(bytes));
    settle.dispatching();
    let mut sender = match super::connect(upstream).await {
        Ok(s) => s,
        Err(why) => {
            // Nothing reached the provider.
            settle.finish(Outcome::Failed);
            return shared.refuse(StatusCode::BAD_GATEWAY, &why);
        }
    };
    let resp = match tokio::time::timeout(ANSWER_TIMEOUT, sender.send_request(upstream_req)).await {
        Ok(Ok(r)) => r,
        // The request may have reached the provider, in part or whole.
        Ok(Err(e)) => {
            settle.finish(Outcome::Aborted);
            return shared.refuse(StatusCode::BAD_GATEWAY, &format!("upstream request: {e}"));
        }
        Err(_) => {
            settle.finish(Outcome::Aborted);
            return shared.refuse(
                StatusCode::GATEWAY_TIMEOUT,
                "the upstream did not answer in time",
            );
        }
    };
    settle
        .status
        .store(resp.status().as_u16(), Ordering::SeqCst);
    // A rate limit the provider says it applies, or an answer that ends one: the
    // supervisor's own observation of the work being parked (issue 23 part 5).
    let limited = crate::supervisor::ratelimit::of_answer(
        resp.status().as_u16(),
        resp.headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?))),
        std::time::SystemTime::now(),
    );
    if limited.is_some() || resp.status().is_success() {
        broker.provider_answered(&route.lane_id, route.generation, limited);
    }
    // The sink accepted it and is answering.
    crate::supervisor::broker::hold("effect:post-sink").await;
    shared.stats.requests.fetch_add(1, Ordering::Relaxed);
    shared
        .metrics
        .gateway_requests
        .get_or_create(&HostMetrics::runtime_outcome(runtime, "carried"))
        .inc();
    let (parts, body) = resp.into_parts();
    let mut scan = Usage {
        tail: Vec::new(),
        input: 0,
        output: 0,
        stats: shared.stats.clone(),
        metrics: shared.metrics.clone(),
        runtime: runtime.clone(),
        settle: Some(settle.clone()),
    };
    let body = body
        .map_frame(move |frame| {
            if let Some(d) = frame.data_ref() {
                scan.feed(d);
            }
            frame
        })
        .boxed();
    // A provider that quotes a key back (in an error, a header) must not hand it to the
    // generation: every credential is cut out of the answer, headers and body.
    let keys: Arc<Vec<Vec<u8>>> = Arc::new(
        secrets
            .iter()
            .map(|(_, v)| v.0.as_bytes().to_vec())
            .filter(|k| !k.is_empty())
            .collect(),
    );
    let redacted = Redacted {
        inner: body,
        keys: keys.clone(),
        carry: Vec::new(),
        pending: None,
        done: false,
    }
    .boxed();
    let mut r = Response::from_parts(
        parts,
        SettledBody {
            inner: redacted,
            settle,
            ended: false,
        }
        .boxed(),
    );
    for h in HOP_BY_HOP {
        r.headers_mut().remove(*h);
    }
    if !keys.is_empty() {
        // Its length may change where a key is cut out: sent chunked instead.
        r.headers_mut().remove(hyper::header::CONTENT_LENGTH);
    }
    for v in r.headers_mut().values_mut() {
        if keys.iter().any(|k| find(v.as_bytes(), k).is_some()) {
            *v = hyper::header::HeaderValue::from_static(REDACTED);
        }
    }
    r
}
