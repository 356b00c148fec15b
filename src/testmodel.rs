//! A deterministic model endpoint for running the real harnesses without credentials or a
//! network: enough of the Anthropic Messages API (streaming), the OpenAI Responses API (SSE)
//! and OpenAI Chat Completions for Claude Code, Codex, OpenCode and Pi to run whole turns.
//!
//! It never "thinks". It answers from markers it finds in the request, so a test decides
//! what the model does by what it puts in the conversation:
//!
//! | marker (anywhere in the latest user turn) | answer |
//! |---|---|
//! | `mosaic-challenge:<hex>` | `mosaic-ack:<hex>-<key>`, `<key>` being the `contract key` found in the request (the harness saw the challenge and has the contract); without one, `mosaic-ack:<hex>` |
//! | … and `model:wrong-ack` anywhere in the request | `mosaic-ack:` with the hex reversed |
//! | … and `model:omit-contract-key` anywhere in the request | `mosaic-ack:<hex>`, no key |
//! | `model:run[<command>]` | one shell tool call running `<command>` |
//! | `model:call[<Tool>\|<JSON>]` | one call of the tool named `<Tool>` with those arguments (e.g. one that needs a human's permission) |
//! | `model:say[<text>]` | `<text>` (a turn's answer a test can predict, e.g. a continuation's result) |
//! | `model:rate-limit[<tag>:<seconds>]` anywhere in the request | every request carrying it is refused with the provider's real rate-limit answer (429, its reset headers and error body) until `<seconds>` after the first one; later ones are answered |
//! | `model:fail-once[<tag>]` | the first request carrying the tag (with tools offered) is refused as overloaded (Anthropic 529, OpenAI 503), later ones are answered: the harness must retry |
//! | `model:huge-usage[<tag>]` anywhere in the request | the first two answers to requests carrying the tag report 990 000 input tokens (a tool call and the turn's end, so each harness sees it where it looks), so the harness compacts its context; later ones report ordinary usage, so no harness compacts forever |
//! | (the latest turn is a tool result) | `tool finished` |
//! | anything else | `ok` |
//!
//! Every request is appended, whole, to a JSON-lines log, so a test asserts on what
//! actually reached the model (the contract in the system prompt, a token in a header, a
//! previous generation's conversation absent).
//!
//! **Never:** used outside tests, benchmarks and demos; it is no model and has no secrets.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};

use crate::adapter::modelwire::{encode, strings};
pub use crate::adapter::modelwire::{latest_turn, Answer, Api};

fn marker<'a>(text: &'a str, open: &str, close: char) -> Option<&'a str> {
    let start = text.rfind(open)? + open.len();
    let rest = &text[start..];
    let end = rest.find(close)?;
    Some(&rest[..end])
}

/// The last `model:call[<Tool>|<JSON>]` marker in `text`: the JSON is read as one value
/// (its own brackets included), then the marker's `]` must follow.
fn call_marker(text: &str) -> Option<(String, Value)> {
    let start = text.rfind("model:call[")? + "model:call[".len();
    let (name, rest) = text[start..].split_once('|')?;
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
    let input = values.next()?.ok()?;
    rest[values.byte_offset()..]
        .starts_with(']')
        .then(|| (name.to_string(), input))
}

/// Whether the request offers tools: the harness's main conversation (side requests, such
/// as a title, offer none).
fn offers_tools(body: &Value) -> bool {
    body["tools"].as_array().is_some_and(|t| !t.is_empty())
}

/// The text blocks (not tool results) of the latest user message of an Anthropic request.
fn queued_text(body: &Value) -> Option<String> {
    let last = body["messages"]
        .as_array()?
        .iter()
        .rev()
        .find(|x| x["role"] == "user")?;
    let text: Vec<&str> = last["content"]
        .as_array()?
        .iter()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str())
        .collect();
    (!text.is_empty()).then(|| text.join("\n"))
}

/// Decides the answer to one request.
pub fn decide(api: Api, body: &Value) -> Answer {
    let (tool_result, latest) = latest_turn(api, body);
    let offers_tools = offers_tools(body);
    if tool_result {
        // Claude Code hands a line typed while a tool ran to the model beside that tool's
        // result, as text blocks of the same user message: a follow-up asking for a tool
        // gets it.
        let follow_up = (api == Api::AnthropicMessages)
            .then(|| queued_text(body))
            .flatten()
            .and_then(|t| marker(&t, "model:run[", ']').map(str::to_string));
        return match follow_up {
            Some(cmd) if offers_tools => Answer::Shell(cmd),
            _ => Answer::Text("tool finished".into()),
        };
    }
    if let Some(hex) = crate::adapter::ackline::find_challenge(&latest) {
        let mut all = Vec::new();
        strings(body, &mut all);
        let wrong = all.iter().any(|s| s.contains("model:wrong-ack"));
        let hex: String = if wrong {
            hex.chars().rev().collect()
        } else {
            hex
        };
        // The contract key, if the contract is in this request's context.
        let key = crate::adapter::modelwire::contract_key(body)
            .filter(|_| !all.iter().any(|s| s.contains("model:omit-contract-key")));
        return Answer::Text(match key {
            Some(k) => crate::adapter::ackline::ack(&hex, &k),
            None => crate::adapter::ackline::ack_without_key(&hex),
        });
    }
    if let Some(text) = marker(&latest, "model:say[", ']') {
        return Answer::Text(text.to_string());
    }
    // Only a request that offers tools gets a tool call (a harness's side requests, such as
    // title generation, offer none).
    // `model:call[<Tool>|<JSON arguments>]`: a call of another tool (one that may need a
    // human's permission).
    if let (Some((name, input)), true) = (call_marker(&latest), offers_tools) {
        return Answer::Call(name, input);
    }
    if let (Some(cmd), true) = (marker(&latest, "model:run[", ']'), offers_tools) {
        return Answer::Shell(cmd.to_string());
    }
    Answer::Text("ok".into())
}

/// The tag of a `model:huge-usage[<tag>]` marker anywhere in the request (a tool result's
/// continuation carries the turn that asked in its history).
pub fn huge_usage_tag(body: &Value) -> Option<String> {
    // Only the main conversation (requests offering tools): a side request, such as a
    // title, must not use up the tag's answers.
    if !offers_tools(body) {
        return None;
    }
    let mut all = Vec::new();
    strings(body, &mut all);
    all.iter()
        .find_map(|s| marker(s, "model:huge-usage[", ']').map(str::to_string))
}

/// Input tokens reported by an ordinary answer, and by one that says the context is nearly
/// full.
pub const ORDINARY_INPUT_TOKENS: u64 = 10;
pub const HUGE_INPUT_TOKENS: u64 = 990_000;

/// The tag of a `model:fail-once[<tag>]` marker in the latest user turn of a request that
/// offers tools (a harness's side requests, such as title generation, offer none and are
/// answered).
pub fn fail_once_tag(api: Api, body: &Value) -> Option<String> {
    let (tool_result, latest) = latest_turn(api, body);
    (!tool_result && offers_tools(body))
        .then(|| marker(&latest, "model:fail-once[", ']').map(str::to_string))
        .flatten()
}

/// The refusal a provider sends when it is overloaded: retryable in every harness.
pub fn overloaded(api: Api) -> (u16, String) {
    match api {
        Api::AnthropicMessages => (
            529,
            json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}})
                .to_string(),
        ),
        Api::OpenAiChat | Api::OpenAiResponses => (
            503,
            json!({"error":{"message":"The server is overloaded; retry later","type":"server_error","param":null,"code":null}})
                .to_string(),
        ),
    }
}

/// The tag and length of a `model:rate-limit[<tag>:<seconds>]` marker anywhere in the
/// request (its history too: every request of the conversation is limited until the window
/// the first one opened has passed).
pub fn rate_limit_marker(body: &Value) -> Option<(String, u64)> {
    let mut all = Vec::new();
    strings(body, &mut all);
    all.iter().find_map(|s| {
        let m = marker(s, "model:rate-limit[", ']')?;
        let (tag, secs) = m.split_once(':')?;
        Some((tag.to_string(), secs.parse().ok()?))
    })
}

/// What a provider sends when a request is over its rate limit, `left` seconds before the
/// limit resets: status 429, the provider's own reset headers and error body.
pub fn rate_limited(api: Api, left: u64) -> (u16, String, Vec<(String, String)>) {
    let reset = humantime::format_rfc3339_seconds(
        std::time::SystemTime::now() + std::time::Duration::from_secs(left),
    )
    .to_string();
    match api {
        Api::AnthropicMessages => (
            429,
            json!({"type":"error","error":{"type":"rate_limit_error",
                "message":"This request would exceed the rate limit for your organization of 50 requests per minute. Please try again later."}})
                .to_string(),
            vec![
                ("retry-after".into(), left.to_string()),
                ("anthropic-ratelimit-requests-limit".into(), "50".into()),
                ("anthropic-ratelimit-requests-remaining".into(), "0".into()),
                ("anthropic-ratelimit-requests-reset".into(), reset),
            ],
        ),
        Api::OpenAiChat | Api::OpenAiResponses => (
            429,
            json!({"error":{"message":"Rate limit reached for requests per min (RPM): Limit 50, Used 50, Requested 1. Please try again later.",
                "type":"requests","param":null,"code":"rate_limit_exceeded"}})
                .to_string(),
            vec![
                ("retry-after".into(), left.to_string()),
                ("x-ratelimit-limit-requests".into(), "50".into()),
                ("x-ratelimit-remaining-requests".into(), "0".into()),
                ("x-ratelimit-reset-requests".into(), format!("{left}s")),
            ],
        ),
    }
}

/// The response body (and content type) for one request: what `decide` answers, encoded.
pub fn respond(api: Api, body: &Value, n: u64, input_tokens: u64) -> (String, &'static str) {
    encode(api, body, &decide(api, body), n, input_tokens)
}

/// The running endpoint's shared state.
struct State {
    log: std::sync::Mutex<std::fs::File>,
    n: AtomicU64,
    /// `model:fail-once` tags already refused once.
    failed: std::sync::Mutex<std::collections::HashSet<String>>,
    /// How many answers reported huge usage, per `model:huge-usage` tag.
    huge: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// When each `model:rate-limit` tag's window ends (opened by its first request).
    limits: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

/// Serves until the process ends. Prints `listening <port>` on stdout once bound.
pub async fn serve(listen: &str, log: PathBuf) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)?;
    let state = Arc::new(State {
        log: std::sync::Mutex::new(file),
        n: AtomicU64::new(0),
        failed: Default::default(),
        huge: Default::default(),
        limits: Default::default(),
    });
    println!("listening {}", listener.local_addr()?.port());
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, std::convert::Infallible>(handle(req, &state).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, svc)
                .await;
        });
    }
}

async fn handle(
    req: hyper::Request<hyper::body::Incoming>,
    state: &State,
) -> hyper::Response<Full<Bytes>> {
    let n = state.n.fetch_add(1, Ordering::Relaxed) + 1;
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let headers: serde_json::Map<String, Value> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or("<binary>"))))
        .collect();
    let bytes = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let mut extra: Vec<(String, String)> = Vec::new();
    let (status, text, ctype) = match (method.as_str(), Api::of_path(&path)) {
        ("POST", Some(api)) if limit_left(state, &body).is_some() => {
            let left = limit_left(state, &body).unwrap_or(1);
            let (status, text, headers) = rate_limited(api, left);
            extra = headers;
            (status, text, "application/json")
        }
        ("POST", Some(api)) => {
            let refuse = fail_once_tag(api, &body).is_some_and(|tag| {
                state
                    .failed
                    .lock()
                    .map(|mut seen| seen.insert(tag))
                    .unwrap_or(false)
            });
            if refuse {
                let (status, text) = overloaded(api);
                (status, text, "application/json")
            } else {
                let huge = huge_usage_tag(&body).is_some_and(|tag| {
                    state.huge.lock().is_ok_and(|mut m| {
                        let seen = m.entry(tag).or_insert(0);
                        *seen += 1;
                        *seen <= 2
                    })
                });
                let tokens = if huge {
                    HUGE_INPUT_TOKENS
                } else {
                    ORDINARY_INPUT_TOKENS
                };
                let (t, c) = respond(api, &body, n, tokens);
                (200, t, c)
            }
        }
        ("GET", _) if path.ends_with("/models") => (
            200,
            json!({"object":"list","data":[{"id":"mosaic-test-model","object":"model","created":0,"owned_by":"mosaic"}]}).to_string(),
            "application/json",
        ),
        ("POST", None) if path.ends_with("/count_tokens") => {
            (200, json!({"input_tokens": 10}).to_string(), "application/json")
        }
        _ => (404, json!({"error":"not served here"}).to_string(), "application/json"),
    };
    // `at`: when the answer was ready to send (this host's clock, the supervisor's too), so
    // a test can order the model's requests against what the supervisor observed.
    let entry = json!({"n": n, "method": method, "path": path, "headers": headers,
        "body": body, "status": status, "response": text, "at": crate::util::now_rfc3339()});
    if let Ok(mut f) = state.log.lock() {
        use std::io::Write;
        let _ = writeln!(f, "{entry}");
    }
    let mut r = hyper::Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or_default();
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    for (k, v) in extra {
        if let (Ok(k), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(k.as_bytes()),
            hyper::header::HeaderValue::from_str(&v),
        ) {
            r.headers_mut().insert(k, v);
        }
    }
    r
}

/// Whole seconds left in the rate-limit window a request's marker opened (the first
/// request carrying it opens it), if it is still open.
fn limit_left(state: &State, body: &Value) -> Option<u64> {
    let (tag, secs) = rate_limit_marker(body)?;
    let now = std::time::Instant::now();
    let until = *state
        .limits
        .lock()
        .ok()?
        .entry(tag)
        .or_insert(now + std::time::Duration::from_secs(secs));
    (until > now).then(|| (until - now).as_secs().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_from_markers() {
        let a = |text: &str| {
            decide(
                Api::AnthropicMessages,
                &json!({"messages":[{"role":"user","content":[{"type":"text","text":text}]}]}),
            )
        };
        assert_eq!(a("hello"), Answer::Text("ok".into()));
        assert_eq!(
            a("say mosaic-challenge:0a1b now"),
            Answer::Text("mosaic-ack:0a1b".into())
        );
        assert_eq!(a("model:run[sleep 3; echo hi]"), Answer::Text("ok".into()));
        // A call's arguments keep their own brackets.
        let call = |text: &str| {
            decide(
                Api::AnthropicMessages,
                &json!({"tools": [{"name": "question"}], "messages": [{"role": "user",
                    "content": [{"type": "text", "text": text}]}]}),
            )
        };
        assert_eq!(
            call(r#"ask model:call[question|{"q":[{"o":["a","b"]}]}] now"#),
            Answer::Call("question".into(), json!({"q":[{"o":["a","b"]}]}))
        );
        assert_eq!(
            call(r#"model:call[question|{"q":[1]} ]"#),
            Answer::Text("ok".into())
        );
        assert_eq!(
            a("Next action: model:say[result-7f]"),
            Answer::Text("result-7f".into())
        );
        assert_eq!(
            decide(
                Api::AnthropicMessages,
                &json!({"tools": [{"name": "Bash"}], "messages": [{"role": "user",
                    "content": [{"type": "text", "text": "model:run[sleep 3; echo hi]"}]}]}),
            ),
            Answer::Shell("sleep 3; echo hi".into())
        );
        assert_eq!(
            decide(
                Api::AnthropicMessages,
                &json!({"system": "Mosaic contract sha256:x, contract key 00ff00ff. Task.",
                    "messages": [{"role": "user", "content": "mosaic-challenge:0a1b"}]}),
            ),
            Answer::Text("mosaic-ack:0a1b-00ff00ff".into())
        );
        let wrong = decide(
            Api::OpenAiChat,
            &json!({"messages":[{"role":"system","content":"model:wrong-ack"},
                {"role":"user","content":"mosaic-challenge:0a1b"}]}),
        );
        assert_eq!(wrong, Answer::Text("mosaic-ack:b1a0".into()));
        let tool = decide(
            Api::OpenAiChat,
            &json!({"tools":[{"function":{"name":"bash"}}],
                "messages":[{"role":"user","content":"model:run[x]"},{"role":"tool","content":"x"}]}),
        );
        assert_eq!(tool, Answer::Text("tool finished".into()));
    }

    #[test]
    fn retries_and_huge_usage_only_for_the_turn_that_asks() {
        let turn = json!({"tools":[{"function":{"name":"bash"}}],
            "messages":[{"role":"user","content":"model:fail-once[r1] model:huge-usage[c1]"}]});
        assert_eq!(fail_once_tag(Api::OpenAiChat, &turn).as_deref(), Some("r1"));
        assert_eq!(huge_usage_tag(&turn).as_deref(), Some("c1"));
        // A side request without tools, and the turn's tool-result continuation, are not
        // refused; the continuation still carries the huge-usage tag in its history.
        let side = json!({"messages":[{"role":"user","content":"model:fail-once[r1] model:huge-usage[c1]"}]});
        assert_eq!(fail_once_tag(Api::OpenAiChat, &side), None);
        let after = json!({"tools":[{"function":{"name":"bash"}}],
            "messages":[{"role":"user","content":"model:fail-once[r1] model:huge-usage[c1]"},
                {"role":"tool","content":"x"}]});
        assert_eq!(fail_once_tag(Api::OpenAiChat, &after), None);
        assert_eq!(huge_usage_tag(&after).as_deref(), Some("c1"));
        assert_eq!(huge_usage_tag(&side), None);
        assert_eq!(overloaded(Api::AnthropicMessages).0, 529);
        assert_eq!(overloaded(Api::OpenAiResponses).0, 503);
        let (text, _) = respond(Api::OpenAiChat, &turn, 1, HUGE_INPUT_TOKENS);
        assert!(text.contains("\"prompt_tokens\":990000"), "{text}");
    }
}
