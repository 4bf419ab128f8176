//! The gateway serves a standard OpenAI client, async-openai, unchanged:
//! answers and streams arrive whole, the key's tokens are refunded to
//! what the stream's `usage` reports, and the refusals (an estimate that
//! never fits, too many streams at once, a spent budget) reach the client
//! as OpenAI-style errors naming the budget. On `MemoryStore` and on the
//! Redis server `cargo xtask test` starts (`PORTCULLIS_REDIS_URL`), both
//! on a clock that stands still, so every count is exact.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ai_gateway::{app, Limits};
use async_openai::config::OpenAIConfig;
use async_openai::error::{OpenAIError, WrappedError};
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, ChatCompletionStreamOptions, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use async_openai::Client;
use axum::http::Request;
use futures::StreamExt;
use portcullis::redis::{ClockMode, RedisStore};
use portcullis::tower::{BearerToken, KeyExtractor};
use portcullis::{ManualClock, MemoryStore, ReservationStore, Store};

const KEY: &str = "sk-test-key";
/// A prompt the fake model takes a second to echo (5 ms a word).
const LONG: &str = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three twenty-four twenty-five twenty-six twenty-seven twenty-eight twenty-nine thirty thirty-one thirty-two thirty-three thirty-four thirty-five thirty-six thirty-seven thirty-eight thirty-nine forty forty-one forty-two forty-three forty-four forty-five forty-six forty-seven forty-eight forty-nine fifty";

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

async fn serve<St: ReservationStore>(store: St, limits: &Limits) -> SocketAddr {
    let app = app(store, limits).expect("valid limits");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn client(addr: SocketAddr) -> Client<OpenAIConfig> {
    Client::with_config(
        OpenAIConfig::new()
            .with_api_base(format!("http://{addr}/v1"))
            .with_api_key(KEY),
    )
}

fn chat(prompt: &str, max_tokens: u32, stream: bool) -> CreateChatCompletionRequest {
    let mut args = CreateChatCompletionRequestArgs::default();
    args.model("fake-model")
        .max_tokens(max_tokens)
        .messages(vec![ChatCompletionRequestUserMessageArgs::default()
            .content(prompt)
            .build()
            .unwrap()
            .into()]);
    if stream {
        args.stream(true)
            .stream_options(ChatCompletionStreamOptions {
                include_usage: Some(true),
                include_obfuscation: None,
            });
    }
    args.build().unwrap()
}

/// Tokens left to the key's tokens-per-minute.
async fn left<St: Store>(store: &St, limits: &Limits) -> u64 {
    let budget = ai_gateway::budget(limits).unwrap();
    let (parts, ()) = Request::post("/")
        .header("authorization", format!("Bearer {KEY}"))
        .body(())
        .unwrap()
        .into_parts();
    let subject = BearerToken::new().extract(&parts).unwrap();
    store
        .peek(&subject, &budget.token_policies()[..1])
        .await
        .unwrap()
        .decisions()[0]
        .remaining()
}

fn api_error(result: Result<impl std::fmt::Debug, OpenAIError>) -> (u16, Option<String>) {
    match result {
        Err(OpenAIError::ApiError(e)) => (e.status_code.as_u16(), e.api_error.code),
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn answers_and_streams<St: ReservationStore + Store + Clone>(store: St) {
    let limits = Limits::default();
    let addr = serve(store.clone(), &limits).await;
    let client = client(addr);
    let answer = client
        .chat()
        .create(chat("hello there gateway", 50, false))
        .await
        .unwrap();
    assert_eq!(
        answer.choices[0].message.content.as_deref(),
        Some("You said: hello there gateway")
    );
    let first = answer.usage.unwrap().total_tokens;
    assert_eq!(left(&store, &limits).await, 20_000 - u64::from(first));

    let mut stream = client
        .chat()
        .create_stream(chat("stream this back", 500, true))
        .await
        .unwrap();
    let (mut text, mut usage) = (String::new(), None);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        for choice in &chunk.choices {
            text.push_str(choice.delta.content.as_deref().unwrap_or(""));
        }
        if chunk.usage.is_some() {
            usage = chunk.usage;
        }
    }
    assert_eq!(text, "You said: stream this back");
    let second = usage
        .expect("the last event carries the usage")
        .total_tokens;
    // 500 and the prompt were reserved; all but the usage came back.
    let spent = u64::from(first) + u64::from(second);
    assert_eq!(left(&store, &limits).await, 20_000 - spent);
}

/// A raw request (the stock client retries a `429` after its
/// `Retry-After`, as it should: the refusals are read here as they are
/// sent, and parsed as the client parses them).
async fn raw(addr: SocketAddr, request: &CreateChatCompletionRequest) -> (u16, Option<String>) {
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("authorization", format!("Bearer {KEY}"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(request).unwrap())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap();
    if status == 200 {
        return (status, None);
    }
    let error: WrappedError = serde_json::from_slice(&body).expect("an OpenAI-style error");
    (status, error.error.code)
}

async fn refusals<St: ReservationStore + Store + Clone>(store: St) {
    let limits = Limits {
        tokens_per_minute: 1_000,
        requests_per_minute: 60,
        streams: 1,
        max_overage: 100,
    };
    let addr = serve(store.clone(), &limits).await;
    let client = client(addr);
    // More than the budget ever holds: 400, nothing reserved.
    let (status, code) = api_error(client.chat().create(chat("hi", 5_000, false)).await);
    assert_eq!((status, code.as_deref()), (400, Some("token_estimate")));
    assert_eq!(left(&store, &limits).await, 1_000);
    // One stream open: the next request is refused by the streams limit.
    let mut open = client
        .chat()
        .create_stream(chat(LONG, 300, true))
        .await
        .unwrap();
    open.next().await.unwrap().unwrap();
    let (status, code) = raw(addr, &chat("hi", 10, false)).await;
    assert_eq!((status, code.as_deref()), (429, Some("api-key-in-flight")));
    // The client goes away mid-stream: charged its estimate, the stream
    // freed (the stock client retries the refused request a second later).
    drop(open);
    let answer = client.chat().create(chat("hi", 10, false)).await.unwrap();
    let used = u64::from(answer.usage.unwrap().total_tokens);
    let estimate = 300 + prompt_of(&chat(LONG, 300, true));
    assert_eq!(left(&store, &limits).await, 1_000 - estimate - used);
    // An estimate the budget holds, but not now: refused by
    // tokens-per-minute, with its name; nothing charged.
    let (status, code) = raw(addr, &chat("hi", 700, false)).await;
    assert_eq!((status, code.as_deref()), (429, Some("tokens-per-minute")));
    assert_eq!(left(&store, &limits).await, 1_000 - estimate - used);
}

/// The prompt part of an estimate: a quarter of the JSON body's bytes.
fn prompt_of(request: &CreateChatCompletionRequest) -> u64 {
    (serde_json::to_vec(request).unwrap().len() as u64).div_ceil(4)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_client_is_served_in_memory() {
    let clock = ManualClock::new(now_micros());
    answers_and_streams(MemoryStore::with_clock(clock.clone())).await;
    refusals(MemoryStore::with_clock(clock)).await;
}

async fn redis(clock: &ManualClock, prefix: &str) -> RedisStore {
    let url = std::env::var("PORTCULLIS_REDIS_URL").expect(
        "PORTCULLIS_REDIS_URL is not set: run `cargo xtask test`, or `cargo xtask redis` and export what it prints",
    );
    RedisStore::builder()
        .url(url)
        .prefix(format!("{prefix}-{}", now_micros()))
        .clock(ClockMode::Client(Arc::new(clock.clone())))
        .client_clock_tolerance(Duration::MAX)
        .build()
        .await
        .expect("the Redis store builds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_client_is_served_on_redis() {
    // A day ahead: keys written on it outlive the test in Redis' own
    // clock.
    let clock = ManualClock::new(now_micros() + 86_400_000_000);
    answers_and_streams(redis(&clock, "ai-gateway-a").await).await;
    refusals(redis(&clock, "ai-gateway-b").await).await;
}
