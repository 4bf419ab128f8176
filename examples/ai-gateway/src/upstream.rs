//! The fake model: an OpenAI-compatible chat completion that answers by
//! echoing the last user message word by word ("You said: …"), at most
//! `max_tokens` words, as one JSON body or as server-sent events, each
//! reporting its `usage` (prompt: a quarter of the messages' characters,
//! rounded up; completion: one token per word). A real gateway forwards
//! the request to its provider here instead (and sets
//! `stream_options.include_usage`, so the last event carries the usage).

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{json, Value};

/// Between two streamed words.
const WORD_DELAY: Duration = Duration::from_millis(5);

pub(crate) async fn chat(body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return error(StatusCode::BAD_REQUEST, "the body is not JSON");
    };
    let model = request["model"].as_str().unwrap_or("fake-model").to_owned();
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let characters: usize = messages
        .iter()
        .filter_map(|m| m["content"].as_str())
        .map(str::len)
        .sum();
    let prompt_tokens = u64::try_from(characters.div_ceil(4)).unwrap_or(u64::MAX);
    let last = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .unwrap_or("");
    let max_tokens = request["max_tokens"]
        .as_u64()
        .or_else(|| request["max_completion_tokens"].as_u64())
        .unwrap_or(1_024);
    let limit = usize::try_from(max_tokens).unwrap_or(usize::MAX);
    let words: Vec<String> = std::iter::once("You said:")
        .chain(last.split_whitespace())
        .take(limit)
        .map(str::to_owned)
        .collect();
    let completion_tokens = u64::try_from(words.len()).unwrap_or(u64::MAX);
    let usage = json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens.saturating_add(completion_tokens),
    });
    if request["stream"].as_bool() == Some(true) {
        stream(model, words, usage)
    } else {
        let answer = json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": words.join(" ") },
                "finish_reason": "stop",
            }],
            "usage": usage,
        });
        (
            [(header::CONTENT_TYPE, "application/json")],
            answer.to_string(),
        )
            .into_response()
    }
}

/// One SSE event per word, then the finish, the usage and `[DONE]`.
fn stream(model: String, words: Vec<String>, usage: Value) -> Response {
    let chunk = move |delta: Value, finish: Value| {
        json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
        })
    };
    let mut events: Vec<String> =
        vec![chunk(json!({ "role": "assistant", "content": "" }), Value::Null).to_string()];
    let count = words.len();
    for (i, word) in words.into_iter().enumerate() {
        let text = if i + 1 < count {
            format!("{word} ")
        } else {
            word
        };
        events.push(chunk(json!({ "content": text }), Value::Null).to_string());
    }
    events.push(chunk(json!({}), json!("stop")).to_string());
    let mut last = chunk(json!({}), Value::Null);
    last["choices"] = json!([]);
    last["usage"] = usage;
    events.push(last.to_string());
    events.push("[DONE]".to_owned());
    let body = futures::stream::iter(events).then(|event| async move {
        tokio::time::sleep(WORD_DELAY).await;
        Ok::<_, Infallible>(Bytes::from(format!("data: {event}\n\n")))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "stream"))
}

fn error(status: StatusCode, message: &str) -> Response {
    let body = json!({ "error": { "message": message, "type": "invalid_request_error" } });
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}
