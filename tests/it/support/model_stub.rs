//! A stub of an OpenAI-compatible model server for the real opencode CLI: it answers
//! `POST /v1/chat/completions` with server-sent events, as such servers stream, and
//! records every request, so a test can assert what the model was shown (the prompt,
//! the model id, that no token is in it).
//!
//! Scripted answers, by what the request is:
//! - no tools offered: opencode's title request (it asks for a session title first,
//!   without tools) → a short title;
//! - tools offered and the last message is the user's: the agent's first turn → one
//!   `bash` tool call running the stub's shell command (`tool_calls` deltas, then
//!   `finish_reason: tool_calls`);
//! - tools offered and the last message is a tool result → a final text answer (or,
//!   once [`ModelStub::set_looping`] is on, the same tool call again: an agent that
//!   never stops).
//!
//! With [`ModelStub::start_with_prompt_files`] the stub also hands the agent's prompt
//! to the command it runs, as a model would read it from its context: it writes the
//! user text of each first agent turn to `<dir>/prompt-<seq>.md` and puts that path in
//! place of `{prompt}` in the command; and its final answer is the last tool result,
//! verbatim (an agent that returns its subagent's output unchanged, seed 004's "Return
//! the dispatcher's output verbatim").
//!
//! Every answer ends with a `usage` chunk of known token counts ([`StubUsage::of`],
//! different for each request) which the stub records with the request, so a test can
//! compare what opencode reports (priced with [`PRICE`] in the test's `opencode.json`)
//! with the stub's own sums ([`ModelStub::served`]).

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpResponse, HttpServer, web};
use serde_json::{Value, json};

/// Locks a mutex, ignoring poisoning (a panicking test must not hide the requests).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The final answer of an agent's last turn.
pub const FINAL_TEXT: &str = "Done: the work item is handled.";

/// The title the stub gives sessions.
pub const TITLE: &str = "Shepherd work item";

/// The model's price in the test's `opencode.json`, USD per million tokens (opencode's
/// `cost` keys: `input`, `output`, `cache_read`, `cache_write`). Whole micro-dollars
/// per token × count, so every step's cost is an exact number of micro-dollars.
pub const PRICE: [(&str, u64); 4] = [
    ("input", 3),
    ("output", 15),
    ("cache_read", 1),
    ("cache_write", 4),
];

/// The usage the stub reports for one response (OpenAI's `usage` object).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StubUsage {
    /// `prompt_tokens` (cached ones included, as OpenAI counts).
    pub prompt: u64,
    /// `completion_tokens` (reasoning included).
    pub completion: u64,
    /// `prompt_tokens_details.cached_tokens`.
    pub cached: u64,
    /// `completion_tokens_details.reasoning_tokens`.
    pub reasoning: u64,
}

impl StubUsage {
    /// The usage of the `seq`-th request (1-based): different for each, so a sum
    /// that missed or doubled one would show.
    pub fn of(seq: usize) -> Self {
        let seq = seq as u64;
        Self {
            prompt: 1000 + 37 * seq,
            completion: 40 + 3 * seq,
            cached: 100 + seq,
            reasoning: 5 + seq,
        }
    }

    /// The JSON `usage` object.
    fn json(&self) -> Value {
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning},
        })
    }

    /// What this response costs at [`PRICE`], in micro-dollars, counted as opencode
    /// counts (`session/index.ts` `getUsage`: input without the cached tokens, output
    /// without reasoning, reasoning at the output price).
    pub fn cost_micros(&self) -> u64 {
        let price = |k: &str| PRICE.iter().find(|(n, _)| *n == k).map_or(0, |(_, p)| *p);
        (self.prompt - self.cached) * price("input")
            + self.completion * price("output")
            + self.cached * price("cache_read")
    }
}

/// One request the stub received.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    /// The JSON body (`model`, `messages`, `tools`, `stream`, …).
    pub body: Value,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The usage the stub answered it with.
    pub usage: StubUsage,
}

impl ModelRequest {
    /// The model id asked for.
    pub fn model(&self) -> &str {
        self.body["model"].as_str().unwrap_or("")
    }

    /// Whether this is an agent turn (tools offered), not the title request.
    pub fn is_agent_turn(&self) -> bool {
        self.body["tools"].as_array().is_some_and(|t| !t.is_empty())
    }

    /// The text of the user messages, in order (content as a string, or the text
    /// parts of a content array).
    pub fn user_texts(&self) -> Vec<String> {
        let empty = Vec::new();
        self.body["messages"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| match &m["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""),
                _ => String::new(),
            })
            .collect()
    }

    /// The text of the last message (a tool result's content).
    fn last_text(&self) -> String {
        let last = self.body["messages"].as_array().and_then(|m| m.last());
        match last.map(|m| &m["content"]) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        }
    }

    /// The role of the last message.
    fn last_role(&self) -> &str {
        self.body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["role"].as_str())
            .unwrap_or("")
    }
}

/// State shared with the server.
struct StubState {
    /// Every request, in arrival order.
    requests: Mutex<Vec<ModelRequest>>,
    /// The shell command of the `bash` tool call.
    command: Mutex<String>,
    /// Answer every agent turn with the tool call (an agent that never ends).
    looping: AtomicBool,
    /// Where the prompts of first agent turns are written (`{prompt}` in the command
    /// names the file), and whether the final answer echoes the last tool result.
    prompt_dir: Option<std::path::PathBuf>,
}

/// A running stub model server. Dropping it stops the server.
pub struct ModelStub {
    /// Shared state.
    state: Arc<StubState>,
    /// Port it listens on.
    port: u16,
    /// The server.
    handle: ServerHandle,
}

impl ModelStub {
    /// Starts a stub on a free port whose agent turn runs `command` in `bash`.
    pub async fn start(command: &str) -> Self {
        Self::launch(command, None).await
    }

    /// Starts a stub whose agent turn runs `command` with `{prompt}` replaced by the
    /// path of a file in `dir` holding the turn's prompt (the user text), and whose
    /// final answer is the last tool result verbatim.
    pub async fn start_with_prompt_files(command: &str, dir: &std::path::Path) -> Self {
        Self::launch(command, Some(dir.to_owned())).await
    }

    async fn launch(command: &str, prompt_dir: Option<std::path::PathBuf>) -> Self {
        let state = Arc::new(StubState {
            requests: Mutex::new(Vec::new()),
            command: Mutex::new(command.to_owned()),
            looping: AtomicBool::new(false),
            prompt_dir,
        });
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = listener.local_addr().expect("local addr").port();
        let data = web::Data::new(state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::JsonConfig::default().limit(64 * 1024 * 1024))
                .route("/v1/chat/completions", web::post().to(completions))
                .route("/v1/models", web::get().to(models))
        })
        .workers(2)
        .disable_signals()
        .shutdown_timeout(1)
        .listen(listener)
        .expect("listen on the bound socket")
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            state,
            port,
            handle,
        }
    }

    /// The OpenAI-compatible base URL (`…/v1`), for the provider's `baseURL`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// Changes the shell command of the next agent turns.
    pub fn set_command(&self, command: &str) {
        *lock(&self.state.command) = command.to_owned();
    }

    /// Makes every agent turn a tool call, even after a tool's result: the agent then
    /// loops until something stops it.
    pub fn set_looping(&self, on: bool) {
        self.state.looping.store(on, Ordering::SeqCst);
    }

    /// The sums of the usage the stub answered agent turns with (`prompt`,
    /// `completion`, `cached`, `reasoning`), their cost at [`PRICE`] in micro-dollars,
    /// and how many there were. The session-title request is not included: opencode does
    /// not count it.
    pub fn served(&self) -> (StubUsage, u64, usize) {
        let turns = self.agent_turns();
        let mut sum = StubUsage::default();
        let mut cost = 0;
        for t in &turns {
            sum.prompt += t.usage.prompt;
            sum.completion += t.usage.completion;
            sum.cached += t.usage.cached;
            sum.reasoning += t.usage.reasoning;
            cost += t.usage.cost_micros();
        }
        (sum, cost, turns.len())
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<ModelRequest> {
        lock(&self.state.requests).clone()
    }

    /// The agent turns so far (requests that offered tools).
    pub fn agent_turns(&self) -> Vec<ModelRequest> {
        self.requests()
            .into_iter()
            .filter(ModelRequest::is_agent_turn)
            .collect()
    }
}

impl Drop for ModelStub {
    fn drop(&mut self) {
        drop(self.handle.stop(false));
    }
}

async fn models() -> HttpResponse {
    HttpResponse::Ok().json(json!({"object": "list", "data": []}))
}

async fn completions(
    req: actix_web::HttpRequest,
    body: web::Json<Value>,
    state: web::Data<Arc<StubState>>,
) -> HttpResponse {
    let mut request = ModelRequest {
        body: body.into_inner(),
        authorization: req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        usage: StubUsage::default(),
    };
    let seq = {
        let mut all = lock(&state.requests);
        request.usage = StubUsage::of(all.len() + 1);
        all.push(request.clone());
        all.len()
    };
    let model = request.model().to_owned();
    let chunk = |delta: Value, finish: Value| {
        json!({
            "id": format!("chatcmpl-{seq}"),
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
    };
    let chunks = if !request.is_agent_turn() {
        vec![
            chunk(json!({"role": "assistant", "content": TITLE}), Value::Null),
            chunk(json!({}), json!("stop")),
        ]
    } else if request.last_role() == "tool" && !state.looping.load(Ordering::SeqCst) {
        let text = match &state.prompt_dir {
            Some(_) => request.last_text(),
            None => FINAL_TEXT.to_owned(),
        };
        vec![
            chunk(json!({"role": "assistant", "content": text}), Value::Null),
            chunk(json!({}), json!("stop")),
        ]
    } else {
        let mut command = lock(&state.command).clone();
        if let Some(dir) = &state.prompt_dir {
            let path = dir.join(format!("prompt-{seq}.md"));
            let prompt = request.user_texts().join("\n");
            std::fs::write(&path, prompt).expect("write the turn's prompt");
            command = command.replace("{prompt}", &path.display().to_string());
        }
        let arguments = json!({"command": command, "description": "Do the work item"});
        vec![
            chunk(
                json!({"role": "assistant", "tool_calls": [{
                    "index": 0, "id": format!("call_{seq}"), "type": "function",
                    "function": {"name": "bash", "arguments": ""},
                }]}),
                Value::Null,
            ),
            chunk(
                json!({"tool_calls": [{"index": 0, "function": {"arguments": arguments.to_string()}}]}),
                Value::Null,
            ),
            chunk(json!({}), json!("tool_calls")),
        ]
    };
    let mut text = String::new();
    for c in chunks {
        text.push_str(&format!("data: {c}\n\n"));
    }
    let usage = json!({
        "id": format!("chatcmpl-{seq}"), "object": "chat.completion.chunk", "created": 0,
        "model": model, "choices": [],
        "usage": request.usage.json(),
    });
    text.push_str(&format!("data: {usage}\n\ndata: [DONE]\n\n"));
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .body(text)
}
