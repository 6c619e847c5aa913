//! Webhook test helpers: a round-robin proxy standing for the load balancer in front of every
//! worker's hooks address, and a handler that keeps conversation state.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use axum::{
    body::Bytes,
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::{any, post},
    Json, Router,
};
use serde_json::{json, Value};

/// A load balancer for tests: each request goes to the next backend in turn; a backend that
/// does not answer is skipped (as a health-checked balancer would), and 502 comes back only
/// when none answers.
pub struct RoundRobinProxy {
    addr: SocketAddr,
    state: ProxyState,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Default)]
struct ProxyState {
    backends: Arc<Mutex<Vec<String>>>,
    next: Arc<AtomicUsize>,
    /// Requests answered per backend URL.
    served: Arc<Mutex<HashMap<String, u64>>>,
    http: reqwest::Client,
}

impl RoundRobinProxy {
    /// Serves on `127.0.0.1:0`, spreading over `backends` (`http://host:port`).
    pub async fn start(backends: Vec<String>) -> Self {
        Self::start_with_timeout(backends, Duration::from_secs(30)).await
    }

    /// [`RoundRobinProxy::start`], giving up on a backend that has not answered within
    /// `timeout` (a frozen one) and trying the next, as a balancer with a response timeout does.
    pub async fn start_with_timeout(backends: Vec<String>, timeout: Duration) -> Self {
        let state = ProxyState {
            backends: Arc::new(Mutex::new(backends)),
            http: reqwest::Client::builder().timeout(timeout).build().unwrap(),
            ..ProxyState::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new()
            .fallback(any(forward))
            .with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, state, task }
    }

    /// `http://127.0.0.1:<port>`: the fleet's public URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the backends (a worker restarted on another port).
    pub fn set_backends(&self, backends: Vec<String>) {
        *self.state.backends.lock().unwrap() = backends;
    }

    /// Requests each backend answered.
    pub fn served(&self) -> HashMap<String, u64> {
        self.state.served.lock().unwrap().clone()
    }
}

impl Drop for RoundRobinProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(
    State(s): State<ProxyState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let backends = s.backends.lock().unwrap().clone();
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    for _ in 0..backends.len() {
        let i = s.next.fetch_add(1, Ordering::Relaxed) % backends.len();
        let target = format!("{}{path}", backends[i]);
        let mut req = s.http.request(method.clone(), &target).body(body.clone());
        for (k, v) in &headers {
            if k != "host" && k != "content-length" {
                req = req.header(k, v);
            }
        }
        match req.send().await {
            Ok(r) => {
                *s.served
                    .lock()
                    .unwrap()
                    .entry(backends[i].clone())
                    .or_default() += 1;
                let status = r.status();
                let ct = r
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("text/plain")
                    .to_owned();
                let body = r.bytes().await.unwrap_or_default();
                return (status, [("content-type", ct)], body).into_response();
            }
            // Not answering (killed, stopped): the next one.
            Err(_) => continue,
        }
    }
    (StatusCode::BAD_GATEWAY, "no backend answered\n").into_response()
}

/// A webhook handler that keeps a count per chat in the conversation state: it answers
/// `{"text": "<n>:<text>", "state": {"n": <n>}}` where `n` is the state's `n` plus one, and
/// records how many calls of one chat ran at once.
pub struct StateHandler {
    addr: SocketAddr,
    state: HandlerState,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Default)]
struct HandlerState {
    delay: Duration,
    /// Per chat: calls in flight now, and the most at once.
    in_flight: Arc<Mutex<HashMap<String, (u64, u64)>>>,
    /// Per chat: the texts being handled now.
    running: Arc<Mutex<HashMap<String, Vec<String>>>>,
    /// Every call that began while another of its chat ran: what and when.
    overlaps: Arc<Mutex<Vec<String>>>,
    calls: Arc<AtomicUsize>,
    /// A state this large (bytes of padding) is answered when the text is "big".
    big: usize,
}

impl StateHandler {
    /// Serves on `127.0.0.1:0`; each call takes `delay` (so turns overlap if they can).
    pub async fn start(delay: Duration) -> Self {
        let state = HandlerState {
            delay,
            big: 100 * 1024,
            ..HandlerState::default()
        };
        let (addr, task) = serve_loopback(
            Router::new()
                .route("/", post(handle))
                .with_state(state.clone()),
        )
        .await;
        Self { addr, state, task }
    }

    /// Where to POST.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The most calls of one chat that ran at once (1 when turns hold).
    pub fn max_concurrency_per_chat(&self) -> u64 {
        self.state
            .in_flight
            .lock()
            .unwrap()
            .values()
            .map(|(_, m)| *m)
            .max()
            .unwrap_or(0)
    }

    /// Every call that began while another call of its chat was running (empty when turns
    /// hold): the chat, the text, the texts in flight, and the wall clock (ms) it began at.
    pub fn overlaps(&self) -> Vec<String> {
        self.state.overlaps.lock().unwrap().clone()
    }

    /// Calls so far.
    pub fn calls(&self) -> usize {
        self.state.calls.load(Ordering::SeqCst)
    }
}

impl Drop for StateHandler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(State(s): State<HandlerState>, Json(msg): Json<Value>) -> Response {
    s.calls.fetch_add(1, Ordering::SeqCst);
    let chat = format!("{}/{}", msg["chat"]["bot"], msg["chat"]["chat"]);
    let text = msg["text"].as_str().unwrap_or("").to_owned();
    {
        let mut m = s.in_flight.lock().unwrap();
        let e = m.entry(chat.clone()).or_default();
        e.0 += 1;
        e.1 = e.1.max(e.0);
        let mut running = s.running.lock().unwrap();
        let now = running.entry(chat.clone()).or_default();
        if !now.is_empty() {
            let at = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            s.overlaps.lock().unwrap().push(format!(
                "{chat}: {text:?} began at {at} ms while {now:?} ran"
            ));
        }
        now.push(text.clone());
    }
    // The call ends here, or where its caller went away (a worker killed mid-call: the
    // server drops this future, and that caller can never use the answer).
    let _call = CallEnds {
        s: s.clone(),
        chat,
        text: text.clone(),
    };
    if !s.delay.is_zero() {
        tokio::time::sleep(s.delay).await;
    }
    let n = msg["state"]["n"].as_u64().unwrap_or(0) + 1;
    let mut state = json!({ "n": n });
    if text == "big" {
        state["pad"] = Value::String("x".repeat(s.big));
    }
    Json(json!({ "text": format!("{n}:{text}"), "state": state })).into_response()
}

/// Takes a [`StateHandler`] call off its chat's calls in flight when dropped.
struct CallEnds {
    s: HandlerState,
    chat: String,
    text: String,
}

impl Drop for CallEnds {
    fn drop(&mut self) {
        if let Some(e) = self.s.in_flight.lock().unwrap().get_mut(&self.chat) {
            e.0 -= 1;
        }
        if let Some(now) = self.s.running.lock().unwrap().get_mut(&self.chat) {
            if let Some(i) = now.iter().position(|t| *t == self.text) {
                now.remove(i);
            }
        }
    }
}

/// A webhook handler that records every request it gets and answers what the event was:
/// `command:<name> <args>` for a command, `edited:<text>` for an edit, `message:<text>`
/// otherwise.
pub struct RecordingHandler(ScriptedHandler);

impl RecordingHandler {
    /// Serves on `127.0.0.1:0`.
    pub async fn start() -> Self {
        Self(ScriptedHandler::start(echo_kind).await)
    }

    /// Where to POST.
    pub fn url(&self) -> String {
        self.0.url()
    }

    /// The requests so far, in the order they came.
    pub fn seen(&self) -> Vec<Value> {
        self.0.seen()
    }
}

/// `{kind}:{text}` (a command's name and args as its text).
fn echo_kind(ev: &Value) -> Value {
    let kind = ev["kind"].as_str().unwrap_or("none");
    let text = match kind {
        "command" => format!(
            "{} {}",
            ev["command"]["name"].as_str().unwrap_or(""),
            ev["command"]["args"].as_str().unwrap_or("")
        ),
        _ => ev["text"].as_str().unwrap_or("").to_owned(),
    };
    json!({ "text": format!("{kind}:{}", text.trim_end()) })
}

/// How a [`ScriptedHandler`] answers an event (the request's JSON → the answer's JSON).
pub(crate) type Script = Arc<dyn Fn(&Value) -> Value + Send + Sync>;

/// A `webhook` handler that answers each event as its script says, recording the requests.
/// An answer with `"_delay_ms": N` is sent N ms late (without that key): a slow handler; one
/// with `"_status": S` is sent with status S (`202`: the answer comes later).
pub struct ScriptedHandler {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ScriptedHandler {
    /// Serves on `127.0.0.1:0`, answering with `script`.
    pub async fn start(script: impl Fn(&Value) -> Value + Send + Sync + 'static) -> Self {
        let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
        let script: Script = Arc::new(script);
        let (addr, task) = serve_loopback(
            Router::new()
                .route("/", post(scripted))
                .with_state((seen.clone(), script)),
        )
        .await;
        Self { addr, seen, task }
    }

    /// Where to POST.
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// The requests so far, in the order they came.
    pub fn seen(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }

    /// The first event that carried attachments.
    ///
    /// # Panics
    /// If none did yet (the message shows what came).
    pub fn first_with_attachments(&self) -> Value {
        let seen = self.seen();
        seen.iter()
            .find(|e| e["attachments"].is_array())
            .cloned()
            .unwrap_or_else(|| panic!("no event with attachments in {seen:?}"))
    }
}

impl Drop for ScriptedHandler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn scripted(
    State((seen, script)): State<(Arc<Mutex<Vec<Value>>>, Script)>,
    Json(ev): Json<Value>,
) -> Response {
    let mut answer = script(&ev);
    seen.lock().unwrap().push(ev);
    // A script makes the handler slow by answering `_delay_ms` (taken out of the answer).
    let delay = answer
        .as_object_mut()
        .and_then(|o| o.remove("_delay_ms"))
        .and_then(|d| d.as_u64());
    if let Some(ms) = delay {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let status = answer
        .as_object_mut()
        .and_then(|o| o.remove("_status"))
        .and_then(|s| s.as_u64())
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| axum::http::StatusCode::from_u16(s).ok());
    match status {
        Some(s) => (s, Json(answer)).into_response(),
        None => Json(answer).into_response(),
    }
}

/// Serves `bytes` as `mime` at every path of a free loopback port (a handler's file
/// server): answers its base URL and the task (abort it when done).
pub async fn serve_bytes(
    bytes: Vec<u8>,
    mime: &'static str,
) -> (String, tokio::task::JoinHandle<()>) {
    let bytes = axum::body::Bytes::from(bytes);
    let app = Router::new().route(
        "/{*name}",
        axum::routing::get(move || {
            let b = bytes.clone();
            async move { ([("content-type", mime)], b) }
        }),
    );
    let (addr, task) = serve_loopback(app).await;
    (format!("http://{addr}"), task)
}

/// Serves `app` on a free loopback port until the task is aborted.
async fn serve_loopback(app: Router) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn call(h: &StateHandler, text: &str, timeout: Duration) -> Option<Value> {
        let body = json!({"chat": {"bot": "b", "chat": "c"}, "text": text, "state": null});
        let r = reqwest::Client::new()
            .post(h.url())
            .json(&body)
            .timeout(timeout)
            .send()
            .await
            .ok()?;
        r.json().await.ok()
    }

    #[tokio::test]
    async fn a_call_whose_caller_went_away_no_longer_runs() {
        let h = StateHandler::start(Duration::from_millis(400)).await;
        // The caller gives up (as a killed worker does) while the call sleeps.
        assert!(call(&h, "m0", Duration::from_millis(50)).await.is_none());
        crate::wait_for("the abandoned call ended", Duration::from_secs(10), || {
            let ended = h
                .state
                .running
                .lock()
                .unwrap()
                .get("\"b\"/\"c\"")
                .is_none_or(Vec::is_empty);
            async move { ended.then_some(()) }
        })
        .await;
        // The next call of the chat runs alone.
        let answer = call(&h, "m1", Duration::from_secs(10)).await.unwrap();
        assert_eq!(answer["text"], "1:m1");
        assert!(h.overlaps().is_empty(), "{:?}", h.overlaps());
        assert_eq!(h.max_concurrency_per_chat(), 1);
    }

    #[tokio::test]
    async fn calls_of_one_chat_at_once_are_seen() {
        let h = StateHandler::start(Duration::from_secs(2)).await;
        let (a, b) = tokio::join!(
            call(&h, "m0", Duration::from_secs(10)),
            call(&h, "m1", Duration::from_secs(10))
        );
        assert!(a.is_some() && b.is_some());
        assert_eq!(h.overlaps().len(), 1, "{:?}", h.overlaps());
        assert_eq!(h.max_concurrency_per_chat(), 2);
    }
}
