//! What Mosaic reads and writes of the model APIs the harnesses speak (the Anthropic
//! Messages API, the OpenAI Responses API and OpenAI Chat Completions): which API a request
//! speaks, its latest turn, and an answer encoded as that API would stream it.
//!
//! Two users: the provider gateway's staging responder, which answers a generation's model
//! requests itself before its activation (nothing reaches a provider before then: spec
//! §3.7), and the deterministic test model.
//!
//! **Never:** decides what a model would say beyond the activation answer
//! ([`activation_answer`]); everything else is the caller's.

use serde_json::{json, Value};

/// What the model decided to do for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Text(String),
    Shell(String),
    /// A call of the named tool with these arguments (a tool other than the shell).
    Call(String, Value),
}

/// The API a request speaks, from its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    AnthropicMessages,
    OpenAiResponses,
    OpenAiChat,
}

impl Api {
    pub fn of_path(path: &str) -> Option<Self> {
        if path.ends_with("/messages") {
            Some(Self::AnthropicMessages)
        } else if path.ends_with("/responses") {
            Some(Self::OpenAiResponses)
        } else if path.ends_with("/chat/completions") {
            Some(Self::OpenAiChat)
        } else {
            None
        }
    }
}
/// Every string inside `v`, depth first.
pub fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// The latest turn of the conversation: whether it is a tool result, and its text.
pub fn latest_turn(api: Api, body: &Value) -> (bool, String) {
    let mut text = Vec::new();
    match api {
        Api::AnthropicMessages => {
            // Claude Code may end the list with a `system` message of context: the turn is
            // the latest `user` message.
            let last = body["messages"]
                .as_array()
                .and_then(|m| m.iter().rev().find(|x| x["role"] == "user"));
            let Some(last) = last else {
                return (false, String::new());
            };
            let blocks = last["content"].as_array();
            let tool_result = last["role"] == "user"
                && blocks.is_some_and(|b| b.iter().any(|x| x["type"] == "tool_result"));
            strings(&last["content"], &mut text);
            (tool_result, text.join("\n"))
        }
        Api::OpenAiChat => {
            let last = body["messages"].as_array().and_then(|m| {
                m.iter()
                    .rev()
                    .find(|x| x["role"] == "user" || x["role"] == "tool")
            });
            let Some(last) = last else {
                return (false, String::new());
            };
            strings(&last["content"], &mut text);
            (last["role"] == "tool", text.join("\n"))
        }
        Api::OpenAiResponses => {
            let items = body["input"].as_array();
            let Some(last) = items.and_then(|i| i.last()) else {
                if let Some(s) = body["input"].as_str() {
                    return (false, s.to_string());
                }
                return (false, String::new());
            };
            let tool = last["type"] == "function_call_output"
                || last["type"] == "custom_tool_call_output"
                || last["type"] == "local_shell_call_output";
            // The latest user message, which may be followed by reasoning or context items.
            let user = items
                .into_iter()
                .flatten()
                .rev()
                .find(|i| i["role"] == "user")
                .unwrap_or(last);
            strings(&user["content"], &mut text);
            (tool, text.join("\n"))
        }
    }
}

/// The answer to a staged generation's check, from its own request: the activation check
/// (or a handoff target's handoff check, each answered in its own form) in the latest turn
/// and the contract key in the context the harness sent. `None` when the latest turn
/// carries no check. Without the key (the contract never reached the harness's context)
/// the answer leaves it out, and the supervisor acknowledges nothing.
pub fn activation_answer(api: Api, body: &Value) -> Option<String> {
    use crate::adapter::Check;
    let (tool_result, latest) = latest_turn(api, body);
    if tool_result {
        return None;
    }
    let (check, hex) = [Check::Handoff, Check::Activation]
        .into_iter()
        .find_map(|c| c.find(&latest).map(|h| (c, h)))?;
    Some(match contract_key(body) {
        Some(k) => check.answer(&hex, &k),
        None => check.answer_without_key(&hex),
    })
}

/// The contract key in a request's context, if the contract is there.
pub fn contract_key(body: &Value) -> Option<String> {
    let mut all = Vec::new();
    strings(body, &mut all);
    all.iter().find_map(|s| {
        s.match_indices("contract key ").find_map(|(i, m)| {
            let k: String = s[i + m.len()..]
                .chars()
                .take_while(|c| c.is_ascii_hexdigit())
                .collect();
            (k.len() >= 8).then_some(k)
        })
    })
}

/// The tool an answer calls and its arguments (`Text` calls none: an empty name).
fn tool_call(api: Api, body: &Value, answer: &Answer) -> (String, Value) {
    match answer {
        Answer::Shell(cmd) => shell_call(api, body, cmd),
        Answer::Call(name, input) => (name.clone(), input.clone()),
        Answer::Text(_) => (String::new(), Value::Null),
    }
}

/// The name and arguments of the shell tool as each harness declares it, found in the
/// request's tool list (so the call is one the harness really offers).
pub fn shell_call(api: Api, body: &Value, cmd: &str) -> (String, Value) {
    let tools: Vec<String> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            t["name"]
                .as_str()
                .or_else(|| t["function"]["name"].as_str())
                .map(str::to_string)
        })
        .collect();
    let pick = |names: &[&str]| {
        names
            .iter()
            .find(|n| tools.iter().any(|t| t == *n))
            .map(|n| n.to_string())
    };
    match api {
        Api::AnthropicMessages => (
            pick(&["Bash"]).unwrap_or_else(|| "Bash".into()),
            json!({"command": cmd, "description": "run a command"}),
        ),
        Api::OpenAiChat => (
            pick(&["bash", "Bash"]).unwrap_or_else(|| "bash".into()),
            json!({"command": cmd, "description": "run a command"}),
        ),
        Api::OpenAiResponses => match pick(&["exec_command", "shell", "shell_command"]) {
            Some(n) if n == "exec_command" => (n, json!({"cmd": cmd})),
            Some(n) if n == "shell" => (n, json!({"command": ["bash", "-lc", cmd]})),
            Some(n) => (n, json!({"command": cmd})),
            None => ("shell".into(), json!({"command": ["bash", "-lc", cmd]})),
        },
    }
}

fn sse(events: &[(Option<&str>, Value)], done: bool) -> String {
    let mut out = String::new();
    for (name, data) in events {
        if let Some(n) = name {
            out.push_str(&format!("event: {n}\n"));
        }
        out.push_str(&format!("data: {data}\n\n"));
    }
    if done {
        out.push_str("data: [DONE]\n\n");
    }
    out
}
/// The response body (and content type) that gives `answer` to one request of `api`, in
/// the form the request asked for (streamed or not), reporting `input_tokens` of input.
pub fn encode(
    api: Api,
    body: &Value,
    answer: &Answer,
    n: u64,
    input_tokens: u64,
) -> (String, &'static str) {
    let stream = body["stream"]
        .as_bool()
        .unwrap_or(api == Api::OpenAiResponses);
    let model = body["model"]
        .as_str()
        .unwrap_or("mosaic-test-model")
        .to_string();
    match api {
        Api::AnthropicMessages => {
            let id = format!("msg_{n}");
            let usage = json!({"input_tokens": input_tokens, "output_tokens": 5,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0});
            let (block, stop, full) = match answer {
                Answer::Text(t) => (
                    vec![
                        (
                            Some("content_block_start"),
                            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
                        ),
                        (
                            Some("content_block_delta"),
                            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":t}}),
                        ),
                    ],
                    "end_turn",
                    json!([{"type":"text","text":t}]),
                ),
                Answer::Shell(_) | Answer::Call(..) => {
                    let (name, input) = tool_call(api, body, answer);
                    let tid = format!("toolu_{n}");
                    (
                        vec![
                            (
                                Some("content_block_start"),
                                json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":tid,"name":name,"input":{}}}),
                            ),
                            (
                                Some("content_block_delta"),
                                json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":input.to_string()}}),
                            ),
                        ],
                        "tool_use",
                        json!([{"type":"tool_use","id":tid,"name":name,"input":input}]),
                    )
                }
            };
            if !stream {
                let msg = json!({"id": id, "type":"message","role":"assistant","model":model,
                    "content": full, "stop_reason": stop, "stop_sequence": null, "usage": usage});
                return (msg.to_string(), "application/json");
            }
            let mut ev = vec![(
                Some("message_start"),
                json!({"type":"message_start","message":{"id":id,"type":"message","role":"assistant",
                    "model":model,"content":[],"stop_reason":null,"stop_sequence":null,"usage":usage}}),
            )];
            ev.extend(block);
            ev.push((
                Some("content_block_stop"),
                json!({"type":"content_block_stop","index":0}),
            ));
            ev.push((
                Some("message_delta"),
                json!({"type":"message_delta","delta":{"stop_reason":stop,"stop_sequence":null},"usage":usage}),
            ));
            ev.push((Some("message_stop"), json!({"type":"message_stop"})));
            (sse(&ev, false), "text/event-stream")
        }
        Api::OpenAiChat => {
            let id = format!("chatcmpl-{n}");
            let chunk = |delta: Value, finish: Value| {
                json!({"id": id, "object":"chat.completion.chunk","created":0,"model":model,
                    "choices":[{"index":0,"delta":delta,"finish_reason":finish}]})
            };
            let (delta, finish, message) = match answer {
                Answer::Text(t) => (
                    json!({"role":"assistant","content":t}),
                    "stop",
                    json!({"role":"assistant","content":t}),
                ),
                Answer::Shell(_) | Answer::Call(..) => {
                    let (name, args) = tool_call(api, body, answer);
                    let call = json!([{"index":0,"id":format!("call_{n}"),"type":"function",
                        "function":{"name":name,"arguments":args.to_string()}}]);
                    (
                        json!({"role":"assistant","content":null,"tool_calls":call}),
                        "tool_calls",
                        json!({"role":"assistant","content":null,"tool_calls":call}),
                    )
                }
            };
            let usage = json!({"prompt_tokens":input_tokens,"completion_tokens":5,
                "total_tokens":input_tokens + 5});
            if !stream {
                let r = json!({"id": id, "object":"chat.completion","created":0,"model":model,
                    "choices":[{"index":0,"message":message,"finish_reason":finish}],"usage":usage});
                return (r.to_string(), "application/json");
            }
            let mut last = chunk(json!({}), json!(finish));
            last["usage"] = usage;
            (
                sse(&[(None, chunk(delta, Value::Null)), (None, last)], true),
                "text/event-stream",
            )
        }
        Api::OpenAiResponses => {
            let rid = format!("resp_{n}");
            let item = match answer {
                Answer::Text(t) => {
                    json!({"type":"message","id":format!("msg_{n}"),"role":"assistant",
                    "status":"completed","content":[{"type":"output_text","text":t,"annotations":[]}]})
                }
                Answer::Shell(_) | Answer::Call(..) => {
                    let (name, args) = tool_call(api, body, answer);
                    json!({"type":"function_call","id":format!("fc_{n}"),"call_id":format!("call_{n}"),
                        "name":name,"arguments":args.to_string(),"status":"completed"})
                }
            };
            let response = |status: &str, output: Value| {
                json!({"id":rid,"object":"response","created_at":0,"status":status,"model":model,
                    "output":output,"usage":{"input_tokens":input_tokens,"input_tokens_details":{"cached_tokens":0},
                    "output_tokens":5,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":input_tokens + 5}})
            };
            let mut ev = vec![
                (
                    Some("response.created"),
                    json!({"type":"response.created","response":response("in_progress", json!([]))}),
                ),
                (
                    Some("response.output_item.added"),
                    json!({"type":"response.output_item.added","output_index":0,"item":item}),
                ),
            ];
            if let Answer::Text(t) = answer {
                ev.push((
                    Some("response.output_text.delta"),
                    json!({"type":"response.output_text.delta","item_id":format!("msg_{n}"),"output_index":0,"content_index":0,"delta":t}),
                ));
            }
            ev.push((
                Some("response.output_item.done"),
                json!({"type":"response.output_item.done","output_index":0,"item":item}),
            ));
            ev.push((Some("response.completed"), json!({"type":"response.completed","response":response("completed", json!([item]))})));
            (sse(&ev, false), "text/event-stream")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_activation_answer_binds_the_challenge_and_the_contract_key_in_context() {
        let req = |system: &str, turn: &str| json!({"system": system, "messages": [{"role": "user", "content": turn}]});
        let a = |b: &Value| activation_answer(Api::AnthropicMessages, b);
        assert_eq!(
            a(&req(
                "Mosaic contract sha256:x, contract key 00ff00ff. Task.",
                "mosaic-challenge:0a1b"
            ))
            .as_deref(),
            Some("mosaic-ack:0a1b-00ff00ff")
        );
        // The contract is not in the context: no key, so nothing the supervisor takes.
        assert_eq!(
            a(&req("no contract here", "mosaic-challenge:0a1b")).as_deref(),
            Some("mosaic-ack:0a1b")
        );
        assert_eq!(a(&req("contract key 00ff00ff", "hello")), None);
        // A handoff check is answered in its own form, never the activation check's.
        assert_eq!(
            a(&req("contract key 00ff00ff", "mosaic-handoff:0a1b")).as_deref(),
            Some("mosaic-handoff-ack:0a1b-00ff00ff")
        );
        assert_eq!(
            a(&req("none", "mosaic-handoff:0a1b")).as_deref(),
            Some("mosaic-handoff-ack:0a1b")
        );
        // Chat and Responses requests carry the same two parts elsewhere.
        let chat = json!({"messages": [{"role": "system", "content": "contract key abcdef0123"},
            {"role": "user", "content": "please mosaic-challenge:77 now"}]});
        assert_eq!(
            activation_answer(Api::OpenAiChat, &chat).as_deref(),
            Some("mosaic-ack:77-abcdef0123")
        );
        let resp = json!({"instructions": "contract key abcdef0123",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "mosaic-challenge:77"}]}]});
        assert_eq!(
            activation_answer(Api::OpenAiResponses, &resp).as_deref(),
            Some("mosaic-ack:77-abcdef0123")
        );
    }

    #[test]
    fn answers_are_encoded_as_each_api_streams_them() {
        let text = Answer::Text("mosaic-ack:77-abcdef0123".into());
        let body = json!({"stream": true, "model": "m"});
        let (a, ct) = encode(Api::AnthropicMessages, &body, &text, 1, 0);
        assert_eq!(ct, "text/event-stream");
        assert!(
            a.contains("event: message_stop") && a.contains("mosaic-ack:77-abcdef0123"),
            "{a}"
        );
        let (c, _) = encode(Api::OpenAiChat, &json!({"stream": false}), &text, 1, 0);
        let v: Value = serde_json::from_str(&c).unwrap();
        assert_eq!(
            v["choices"][0]["message"]["content"],
            "mosaic-ack:77-abcdef0123"
        );
        let (r, _) = encode(Api::OpenAiResponses, &json!({}), &text, 1, 0);
        assert!(r.contains("response.completed"), "{r}");
    }
}
