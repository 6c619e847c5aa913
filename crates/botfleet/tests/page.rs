//! The live fleet page in a real headless Chromium, driven over the DevTools protocol: it
//! loads, shows the workers and a bot's sends from the backend, and — without a reload —
//! shows a worker killed with SIGKILL as gone, with the departure in its event list.
//!
//! Needs `chromium` (or `chromium-browser`, `google-chrome`) on PATH; `.ci/run` installs it.
//! Without one the test says so and passes, unless `BOTFLEET_REQUIRE_CHROMIUM` is set.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::Duration,
};

use botfleet_testkit::{FakeTelegram, RedisServer};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn chromium() -> Option<String> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .map(str::to_owned)
}

/// Runs `cmd`, returning it and the first stderr line containing `marker` (after it).
fn start_reading(mut cmd: Command, marker: &'static str) -> (Proc, String) {
    let mut child = cmd
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split(marker).nth(1) {
                let _ = tx.send(rest.trim().to_owned());
            }
        }
    });
    let found = rx
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("no {marker:?} line"));
    (Proc(child), found)
}

fn worker(id: &str, db: &str, redis: &str) -> (Proc, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_botfleet"));
    c.env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0");
    c.args([
        "worker",
        "--worker-id",
        id,
        "--database-url",
        db,
        "--redis-url",
        redis,
    ])
    .args([
        "--prefix",
        "page",
        "--http-addr",
        "127.0.0.1:0",
        "--lease-ms",
        "3000",
    ])
    .args(["--poll-timeout-s", "5"])
    .env("RUST_LOG", "warn")
    .env_remove("BOTFLEET_API_TOKEN");
    start_reading(c, "listening on ")
}

/// One DevTools page session.
struct Page {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next: u64,
}

impl Page {
    /// Evaluates `expr` (a string) until `ok` holds or 30 s pass; the last value.
    async fn until(&mut self, expr: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let v = self
                .eval(expr)
                .await
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if ok(&v) || std::time::Instant::now() > deadline {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn eval(&mut self, expr: &str) -> Value {
        self.next += 1;
        let id = self.next;
        let msg = json!({"id": id, "method": "Runtime.evaluate",
                         "params": {"expression": expr, "returnByValue": true}});
        self.ws.send(Message::text(msg.to_string())).await.unwrap();
        while let Some(m) = self.ws.next().await {
            let Ok(Message::Text(t)) = m else { continue };
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["id"].as_u64() == Some(id) {
                return v["result"]["result"]["value"].clone();
            }
        }
        panic!("DevTools closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_workers_and_a_killed_one_going() {
    let Some(browser) = chromium() else {
        assert!(
            std::env::var_os("BOTFLEET_REQUIRE_CHROMIUM").is_none(),
            "BOTFLEET_REQUIRE_CHROMIUM is set but no Chromium is installed"
        );
        eprintln!("skipped: no chromium on PATH");
        return;
    };
    let fake = FakeTelegram::start().await.unwrap();
    let redis = RedisServer::start().unwrap();
    // Removed at the end (after the browser and the workers, declared later, are gone).
    let tmp = botfleet_testkit::TempDir::new("botfleet-page");
    let dir = tmp.0.clone();
    let db = format!("sqlite://{}", dir.join("bots.db").display());
    for i in 0..20 {
        let token = format!("{}:PAGE", 500 + i);
        fake.state().add_bot(&token);
        let o = Command::new(env!("CARGO_BIN_EXE_botfleet"))
            .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
            .args(["bots", "add", &format!("bot-{i}"), "--platform", "telegram"])
            .args([
                "--token",
                &token,
                "--api-url",
                &fake.url(),
                "--database-url",
                &db,
            ])
            .output()
            .unwrap();
        assert!(o.status.success());
    }
    let (_a, url) = worker("page-a", &db, &redis.url());
    let (b, _) = worker("page-b", &db, &redis.url());
    let profile = dir.join("chromium");
    let mut c = Command::new(&browser);
    c.args([
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--remote-debugging-port=0",
    ])
    .arg(format!("--user-data-dir={}", profile.display()))
    .arg("about:blank")
    // Chromium's own scratch files go with the test's directory too.
    .env("TMPDIR", &dir);
    let (_chromium, ws_url) = start_reading(c, "DevTools listening on ");
    // A new tab on the page, then its DevTools socket.
    let devtools = ws_url
        .trim_start_matches("ws://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let target: Value = reqwest::Client::new()
        .put(format!("http://{devtools}/json/new?{url}/"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let (ws, _) =
        tokio_tungstenite::connect_async(target["webSocketDebuggerUrl"].as_str().unwrap())
            .await
            .unwrap();
    let mut page = Page { ws, next: 0 };
    let workers = r#"Array.from(document.querySelectorAll('#workers tr.worker')).map(r => r.cells[0].textContent).join(',')"#;
    let seen = page
        .until(workers, |s| s.contains("page-a") && s.contains("page-b"))
        .await;
    assert!(
        seen.contains("page-a") && seen.contains("page-b"),
        "the page shows {seen:?}"
    );
    let running = "document.getElementById('owned').textContent";
    assert_eq!(
        page.until(running, |s| s == "20").await,
        "20",
        "running bots on the page"
    );
    // A send from the backend, through the CLI: the page counts it for its bot.
    let o = Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .args(["send", "bot-3", "900", "from the desk", "--api-url", &url])
        .args(["--idempotency-key", "page-1", "--wait"])
        .env_remove("BOTFLEET_API_TOKEN")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sends = r#"Array.from(document.querySelectorAll('#sends tbody tr')).map(r => Array.from(r.cells).map(c => c.textContent).join(' ')).join(',')"#;
    assert_eq!(
        page.until(sends, |s| s == "bot-3 1 0 0").await,
        "bot-3 1 0 0",
        "the send counted for its bot (sent, queued, failed)"
    );
    // Mark this page: a reload would lose the mark.
    page.eval("window.__notReloaded = true").await;
    let mut b = b;
    b.0.kill().unwrap();
    let _ = b.0.wait();
    let gone = r#"(document.querySelector('#workers tr.gone')?.textContent || '') + '|' + document.getElementById('events').textContent + '|' + (window.__notReloaded === true)"#;
    let shown = page
        .until(gone, |s| {
            s.starts_with("page-b") && s.contains("worker_left")
        })
        .await;
    assert!(
        shown.starts_with("page-b"),
        "the killed worker is shown gone: {shown:?}"
    );
    assert!(
        shown.contains("worker_left") && shown.contains("page-b"),
        "{shown:?}"
    );
    assert!(shown.ends_with("|true"), "the page was reloaded: {shown:?}");
    // Its bots come back on the survivor, and the page counts them again.
    assert_eq!(page.until(running, |s| s == "20").await, "20");
    // The fleet's journal: on a's page, what b did before it died as well as a's reclaim.
    let events = "document.getElementById('events').textContent";
    let shown = page
        .until(events, |s| {
            s.contains("page-b  bot_started") && s.contains("page-a  bot_started")
        })
        .await;
    assert!(
        shown.contains("page-b  bot_started"),
        "b's entries on a's page: {shown}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
