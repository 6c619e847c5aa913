//! The control API as a client's backend uses it: an embedded worker process with an API
//! token, every route, bad input refused with a code and nothing changed, tokens never
//! returned, a rotated token taking over on the running worker.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use botfleet_testkit::{nonce, wait_for, FakeTelegram};
use serde_json::{json, Value};

const API_TOKEN: &str = "test-api-token-0123456789abcdef";

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Worker {
    child: Child,
    url: String,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_worker(db: &str, token_file: Option<&std::path::Path>) -> Worker {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_botfleet"));
    cmd.env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0");
    cmd.args([
        "worker",
        "--database-url",
        db,
        "--http-addr",
        "127.0.0.1:0",
        "--poll-timeout-s",
        "1",
    ])
    .env_remove("BOTFLEET_API_TOKEN")
    .env("RUST_LOG", "warn")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    if let Some(f) = token_file {
        cmd.arg("--api-token-file").arg(f);
    }
    let mut child = cmd.spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.split("listening on ").nth(1) {
                let _ = tx.send(Ok(url.trim().to_owned()));
            } else {
                let _ = tx.send(Err(line));
            }
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(Ok(url)) => return Worker { child, url },
            Ok(Err(line)) => seen.push(line),
            Err(_) => panic!("the worker printed no address: {seen:?}"),
        }
    }
}

struct Api {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
}

impl Api {
    async fn call(&self, method: &str, path: &str, body: Option<String>) -> (u16, Value) {
        let mut r = self.http.request(
            method.parse().unwrap(),
            format!("{}/api/v1{path}", self.url),
        );
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        if let Some(b) = body {
            r = r.header("content-type", "application/json").body(b);
        }
        let resp = r.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        assert!(
            !text.contains("SECRET") && !text.contains("hook-key"),
            "a credential came back from {method} {path}: {text}"
        );
        let v = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
        };
        (status, v)
    }
}

fn code(v: &Value) -> &str {
    v["code"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_works_refuses_bad_input_and_never_returns_a_token() {
    let fake = FakeTelegram::start().await.unwrap();
    for t in [
        "1:SECRET-A",
        "2:SECRET-OLD",
        "2:SECRET-NEW",
        "3:SECRET-C",
        "4:SECRET-D",
    ] {
        fake.state().add_bot(t);
    }
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-api-{}", nonce())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let db = format!("sqlite://{}", dir.0.join("bots.db").display());
    let token_file = dir.0.join("api-token");
    std::fs::write(&token_file, format!("{API_TOKEN}\n")).unwrap();
    let w = start_worker(&db, Some(&token_file));
    let http = reqwest::Client::new();
    let api = Api {
        http: http.clone(),
        url: w.url.clone(),
        token: Some(API_TOKEN.to_owned()),
    };
    let anonymous = Api {
        http: http.clone(),
        url: w.url.clone(),
        token: None,
    };
    let wrong = Api {
        http: http.clone(),
        url: w.url.clone(),
        token: Some("wrong-token-0123456789".to_owned()),
    };
    // Health stays open; the API does not.
    let r = http.get(format!("{}/healthz", w.url)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let bot_a =
        json!({"id": "a", "platform": "telegram", "token": "1:SECRET-A", "api_url": fake.url()});
    for who in [&anonymous, &wrong] {
        let (s, v) = who.call("POST", "/bots", Some(bot_a.to_string())).await;
        assert_eq!((s, code(&v)), (401, "unauthorized"), "{v}");
        let (s, _) = who.call("GET", "/bots", None).await;
        assert_eq!(s, 401);
    }
    // Every route refuses a request without the token.
    for (method, path) in [
        ("GET", "/bots"),
        ("POST", "/bots"),
        ("GET", "/bots/a"),
        ("PATCH", "/bots/a"),
        ("DELETE", "/bots/a"),
        ("POST", "/bots/a/enable"),
        ("POST", "/bots/a/disable"),
        ("POST", "/bots/a/restart"),
        ("POST", "/bots/import"),
        ("GET", "/fleet"),
        ("GET", "/events"),
        ("GET", "/events/stream"),
        ("GET", "/openapi.json"),
    ] {
        let (s, v) = anonymous.call(method, path, Some("{}".into())).await;
        assert_eq!((s, code(&v)), (401, "unauthorized"), "{method} {path}");
    }
    let (s, v) = api.call("GET", "/bots", None).await;
    assert_eq!(
        (s, v["bots"].as_array().unwrap().len()),
        (200, 0),
        "refused requests changed nothing"
    );

    // Add, list, show.
    let (s, v) = api.call("POST", "/bots", Some(bot_a.to_string())).await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["change"], "added");
    assert_eq!(v["bot"]["id"], "a");
    assert!(v["bot"].get("token").is_none());
    wait_for("a polling", Duration::from_secs(15), || async {
        fake.state().is_polling("1:SECRET-A").then_some(())
    })
    .await;
    let (s, v) = api.call("GET", "/bots/a", None).await;
    assert_eq!(s, 200);
    assert_eq!(v["platform"], "telegram");

    // Bad input: a code, a message naming the field, nothing stored.
    let cases = [
        ("POST", "/bots", "{".to_owned(), 400, "invalid"),
        (
            "POST",
            "/bots",
            json!({"id": "x", "platform": "telegram", "token": 12345}).to_string(),
            400,
            "invalid",
        ),
        (
            "POST",
            "/bots",
            json!({"id": "x", "platform": "icq", "token": "9:SECRET-X"}).to_string(),
            400,
            "invalid",
        ),
        (
            "POST",
            "/bots",
            json!({"id": "x", "platform": "telegram", "token": "9:SECRET-X", "tokn": 1})
                .to_string(),
            400,
            "invalid",
        ),
        ("POST", "/bots", bot_a.to_string(), 409, "exists"),
        (
            "PATCH",
            "/bots/a",
            json!({"platform": "slack"}).to_string(),
            400,
            "invalid",
        ),
        (
            "PATCH",
            "/bots/a",
            json!({"handler": "webhook"}).to_string(),
            400,
            "invalid",
        ),
        (
            "PATCH",
            "/bots/nope",
            json!({"token": "5:SECRET-Z"}).to_string(),
            404,
            "not_found",
        ),
        ("GET", "/bots/nope", String::new(), 404, "not_found"),
        (
            "POST",
            "/bots/nope/restart",
            String::new(),
            404,
            "not_found",
        ),
        ("DELETE", "/bots/nope", String::new(), 404, "not_found"),
        ("GET", "/nothing-here", String::new(), 404, "no_route"),
        ("PUT", "/bots", String::new(), 405, "method_not_allowed"),
    ];
    for (method, path, body, status, want) in cases {
        let body = (!body.is_empty()).then_some(body);
        let (s, v) = api.call(method, path, body).await;
        assert_eq!((s, code(&v)), (status, want), "{method} {path}: {v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    }
    let big = format!(
        "{{\"id\":\"x\",\"platform\":\"telegram\",\"token\":\"{}\"}}",
        "9".repeat(100_000)
    );
    let (s, v) = api.call("POST", "/bots", Some(big)).await;
    assert_eq!((s, code(&v)), (413, "too_large"), "{v}");
    let (_, v) = api.call("GET", "/bots", None).await;
    assert_eq!(
        v["bots"].as_array().unwrap().len(),
        1,
        "nothing was stored: {v}"
    );
    assert_eq!(v["bots"][0]["handler"], "echo");

    // Rotate a running bot's token: the worker restarts it with the new one; the old one
    // stops before the new one runs.
    let b =
        json!({"id": "b", "platform": "telegram", "token": "2:SECRET-OLD", "api_url": fake.url()});
    assert_eq!(api.call("POST", "/bots", Some(b.to_string())).await.0, 201);
    wait_for("b polling", Duration::from_secs(15), || async {
        fake.state().is_polling("2:SECRET-OLD").then_some(())
    })
    .await;
    let patched = std::time::Instant::now();
    let (s, v) = api
        .call(
            "PATCH",
            "/bots/b",
            Some(json!({"token": "2:SECRET-NEW"}).to_string()),
        )
        .await;
    assert_eq!((s, &v["change"]), (200, &json!("updated")), "{v}");
    wait_for(
        "b polls with the new token",
        Duration::from_secs(15),
        || async { (fake.state().polls("2:SECRET-NEW") > 0).then_some(()) },
    )
    .await;
    eprintln!(
        "token rotated: the new token polled {:?} after the PATCH was sent",
        patched.elapsed()
    );
    let old_requests = fake.state().requests_of("2:SECRET-OLD");
    fake.state()
        .user_writes("2:SECRET-NEW", 5, "after the rotation");
    wait_for(
        "answered with the new token",
        Duration::from_secs(15),
        || async {
            fake.state()
                .sent()
                .iter()
                .any(|s| s.text == "after the rotation" && s.token == "2:SECRET-NEW")
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        fake.state().requests_of("2:SECRET-OLD"),
        old_requests,
        "the old token kept polling after the new one started"
    );
    let (_, v) = api
        .call(
            "PATCH",
            "/bots/b",
            Some(json!({"token": "2:SECRET-NEW"}).to_string()),
        )
        .await;
    assert_eq!(v["change"], "unchanged");
    // The bot's own send limits, shown with it; its platform's scopes only.
    let limits = json!({"rate_limits": "chat=2/1,group=off"}).to_string();
    let (s, v) = api.call("PATCH", "/bots/b", Some(limits)).await;
    assert_eq!(s, 200, "{v}");
    let (_, v) = api.call("GET", "/bots/b", None).await;
    assert_eq!(v["rate_limits"], "chat=2/1,group=off", "{v}");
    let bad = json!({"rate_limits": "channel=1/1"}).to_string();
    let (s, v) = api.call("PATCH", "/bots/b", Some(bad)).await;
    assert_eq!((s, code(&v)), (400, "invalid"), "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap_or_default()
            .contains("rate_limits"),
        "{v}"
    );

    // Disable, enable, restart.
    let (s, v) = api.call("POST", "/bots/b/disable", None).await;
    assert_eq!((s, &v["bot"]["enabled"]), (200, &json!(false)), "{v}");
    wait_for("b stopped", Duration::from_secs(15), || async {
        (!fake.state().is_polling("2:SECRET-NEW")).then_some(())
    })
    .await;
    let (s, v) = api.call("POST", "/bots/b/enable", None).await;
    assert_eq!((s, &v["bot"]["enabled"]), (200, &json!(true)), "{v}");
    wait_for("b polling again", Duration::from_secs(15), || async {
        fake.state().is_polling("2:SECRET-NEW").then_some(())
    })
    .await;
    assert_eq!(api.call("POST", "/bots/b/restart", None).await.0, 200);

    // Import: added, refused with the line, then upserted.
    let lines = [
        json!({"id": "c", "platform": "telegram", "token": "3:SECRET-C", "api_url": fake.url()}).to_string(),
        "not json".to_owned(),
        json!({"id": "d", "platform": "telegram", "token": "4:SECRET-D", "api_url": fake.url(), "handler": "webhook", "webhook_url": "http://127.0.0.1:9/h", "webhook_secret": "hook-key"}).to_string(),
    ]
    .join("\n");
    let (s, v) = api.call("POST", "/bots/import", Some(lines.clone())).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["added"].as_u64(), v["refused"][0]["line"].as_u64()),
        (Some(2), Some(2)),
        "{v}"
    );
    assert_eq!(v["refused"][0]["code"], "invalid");
    let (_, v) = api.call("POST", "/bots/import", Some(lines.clone())).await;
    assert_eq!(
        v["refused"].as_array().unwrap().len(),
        3,
        "without upsert existing ids are refused: {v}"
    );
    let (_, v) = api
        .call("POST", "/bots/import?upsert=true", Some(lines))
        .await;
    assert_eq!(
        (v["unchanged"].as_u64(), v["updated"].as_u64()),
        (Some(2), Some(0)),
        "{v}"
    );
    let (_, v) = api.call("GET", "/bots?platform=telegram", None).await;
    assert_eq!(v["bots"].as_array().unwrap().len(), 4, "{v}");
    let (_, v) = api.call("GET", "/bots?platform=slack", None).await;
    assert_eq!(v["bots"].as_array().unwrap().len(), 0, "{v}");

    // The fleet, the journal, the document.
    let (s, v) = api.call("GET", "/fleet", None).await;
    assert_eq!(s, 200);
    assert_eq!(v["mode"], "embedded");
    assert_eq!(v["workers"].as_array().unwrap().len(), 1, "{v}");
    let (s, v) = api.call("GET", "/events", None).await;
    assert_eq!(s, 200);
    let kinds: Vec<&str> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    for k in ["bot_started", "bot_stopped", "registry_changed"] {
        assert!(kinds.contains(&k), "{k} not in {kinds:?}");
    }
    let last = v["events"].as_array().unwrap().last().unwrap()["seq"]
        .as_u64()
        .unwrap();
    let (_, v) = api
        .call("GET", &format!("/events?after={last}"), None)
        .await;
    assert!(v["events"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["seq"].as_u64() > Some(last)));
    let (s, v) = api.call("GET", "/openapi.json", None).await;
    assert_eq!(s, 200);
    assert!(v["paths"]["/api/v1/bots/{id}"]["patch"].is_object(), "{v}");

    // Delete.
    let (s, _) = api.call("DELETE", "/bots/a", None).await;
    assert_eq!(s, 204);
    assert_eq!(api.call("GET", "/bots/a", None).await.0, 404);
    wait_for("a stopped", Duration::from_secs(15), || async {
        (!fake.state().is_polling("1:SECRET-A")).then_some(())
    })
    .await;
    assert_eq!(fake.state().conflicts(), 0);
}

#[test]
fn a_bad_api_token_is_a_clear_error_at_start() {
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-api-{}", nonce())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let db = format!("sqlite://{}", dir.0.join("bots.db").display());
    let short = dir.0.join("short");
    std::fs::write(&short, "abc\n").unwrap();
    for (file, want) in [
        (dir.0.join("missing"), "--api-token-file"),
        (short, "at least 16 characters"),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_botfleet"))
            .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
            .args([
                "worker",
                "--database-url",
                &db,
                "--http-addr",
                "127.0.0.1:0",
            ])
            .arg("--api-token-file")
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains(want), "{err}");
        assert!(!err.contains("abc"), "the token was printed: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_manages_bots_through_a_workers_api() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot("7:SECRET-CLI");
    let (dir, token_file, w) = token_worker();
    // The CLI runs elsewhere: no database of its own (none is created), only the API.
    let cwd = dir.0.join("cli");
    std::fs::create_dir_all(&cwd).unwrap();
    let cli = |args: &[&str], with_token: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_botfleet"));
        c.env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0");
        c.args(args)
            .current_dir(&cwd)
            .env_remove("BOTFLEET_API_TOKEN")
            .env_remove("BOTFLEET_DATABASE_URL")
            .env("BOTFLEET_API_URL", &w.url);
        if with_token {
            c.arg("--api-token-file").arg(&token_file);
        }
        let o = c.output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(
            !out.contains("SECRET") && !err.contains("SECRET"),
            "{out}{err}"
        );
        (o.status.code(), out, err)
    };
    let (code, _, err) = cli(&["bots", "list"], false);
    assert_eq!(code, Some(1));
    assert!(err.contains("unauthorized"), "{err}");
    // `--api-url` of `bots add` is the platform's; the worker comes from BOTFLEET_API_URL.
    let (code, out, err) = cli(
        &[
            "bots",
            "add",
            "cli-bot",
            "--platform",
            "telegram",
            "--token",
            "7:SECRET-CLI",
            "--api-url",
            &fake.url(),
        ],
        true,
    );
    assert_eq!(code, Some(0), "{out}{err}");
    // `--worker-url` names the worker itself, over BOTFLEET_API_URL (here a dead port).
    fake.state().add_bot("9:SECRET-FLAG");
    let via_flag = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_botfleet"))
            .args(args)
            .args(["--worker-url", &w.url])
            .arg("--api-token-file")
            .arg(&token_file)
            .current_dir(&cwd)
            .env_remove("BOTFLEET_API_TOKEN")
            .env_remove("BOTFLEET_DATABASE_URL")
            .env("BOTFLEET_API_URL", "http://127.0.0.1:9")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        (o.status.code(), out, err)
    };
    let (code, out, err) = via_flag(&[
        "bots",
        "add",
        "cli-flag",
        "--platform",
        "telegram",
        "--token",
        "9:SECRET-FLAG",
        "--api-url",
        &fake.url(),
    ]);
    assert_eq!(code, Some(0), "{out}{err}");
    let (code, out, err) = via_flag(&["bots", "update", "cli-flag", "--typing", "false"]);
    assert_eq!((code, out.trim()), (Some(0), "updated cli-flag"), "{err}");
    let (_, out, _) = cli(&["bots", "list", "--json"], true);
    assert!(
        out.lines().any(|l| l.contains("\"cli-flag\"")),
        "added through the flag's worker: {out}"
    );
    let (code, _, err) = cli(&["bots", "remove", "cli-flag"], true);
    assert_eq!(code, Some(0), "{err}");
    wait_for("cli-bot polling", Duration::from_secs(15), || async {
        fake.state().is_polling("7:SECRET-CLI").then_some(())
    })
    .await;
    let (_, out, _) = cli(&["bots", "list", "--json"], true);
    let row: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(
        (row["id"].as_str(), row["status"].as_str()),
        (Some("cli-bot"), Some("running")),
        "{out}"
    );
    let (code, out, _) = cli(
        &[
            "bots",
            "update",
            "cli-bot",
            "--handler",
            "webhook",
            "--webhook-url",
            "http://127.0.0.1:9/h",
        ],
        true,
    );
    assert_eq!((code, out.trim()), (Some(0), "updated cli-bot"));
    let (code, _, err) = cli(
        &["bots", "update", "cli-bot", "--webhook-url", "ftp://x"],
        true,
    );
    assert_eq!(code, Some(1));
    assert!(
        err.contains("webhook_url") && err.contains("(invalid)"),
        "{err}"
    );
    let (code, _, _) = cli(&["bots", "disable", "cli-bot"], true);
    assert_eq!(code, Some(0));
    wait_for("cli-bot stopped", Duration::from_secs(15), || async {
        (!fake.state().is_polling("7:SECRET-CLI")).then_some(())
    })
    .await;
    let file = dir.0.join("more.jsonl");
    std::fs::write(
        &file,
        format!(
            "{}\n{{bad\n",
            json!({"id": "cli-2", "platform": "telegram", "token": "8:SECRET-2"})
        ),
    )
    .unwrap();
    let (code, out, err) = cli(
        &["bots", "import", "--upsert", file.to_str().unwrap()],
        true,
    );
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        out.contains("imported 1 bots (1 added, 0 updated, 0 unchanged), 1 lines refused"),
        "{out}"
    );
    assert!(err.contains("line 2: "), "{err}");
    let (code, out, _) = cli(&["fleet", "status", "--json"], true);
    assert_eq!(code, Some(0));
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["workers"].as_array().map(Vec::len), Some(1), "{doc}");
    let (code, _, _) = cli(&["bots", "remove", "cli-2"], true);
    assert_eq!(code, Some(0));
    let (code, _, err) = cli(&["bots", "remove", "cli-2"], true);
    assert_eq!(code, Some(1));
    assert!(err.contains("no bot cli-2 (not_found)"), "{err}");
    assert!(
        !cwd.join("botfleet.db").exists(),
        "the CLI opened a database of its own"
    );
}

/// An embedded worker with an API token, in a directory of its own: the directory, the
/// token's file, the worker.
fn token_worker() -> (Dir, PathBuf, Worker) {
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-api-{}", nonce())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let db = format!("sqlite://{}", dir.0.join("bots.db").display());
    let token_file = dir.0.join("api-token");
    std::fs::write(&token_file, API_TOKEN).unwrap();
    let w = start_worker(&db, Some(&token_file));
    (dir, token_file, w)
}

/// An embedded worker with an API token, and the Telegram bot `id` of `token` on a fake,
/// added through the API and polling: the fake, the worker's directory, the token's file, the
/// worker and its API.
async fn polling_bot(token: &str, id: &str) -> (FakeTelegram, Dir, PathBuf, Worker, Api) {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(token);
    let (dir, token_file, w) = token_worker();
    let api = Api {
        http: reqwest::Client::new(),
        url: w.url.clone(),
        token: Some(API_TOKEN.to_owned()),
    };
    let bot = json!({"id": id, "platform": "telegram", "token": token, "api_url": fake.url()});
    let (s, v) = api.call("POST", "/bots", Some(bot.to_string())).await;
    assert_eq!(s, 201, "{v}");
    wait_for("polling", Duration::from_secs(15), || async {
        fake.state().is_polling(token).then_some(())
    })
    .await;
    (fake, dir, token_file, w, api)
}

/// Send `id` of `bot` once its status is `status` (within 20 s): what `GET` answers.
async fn until_status(api: &Api, bot: &str, id: &str, status: &str) -> Value {
    wait_for(status, Duration::from_secs(20), || async {
        let (_, v) = api
            .call("GET", &format!("/bots/{bot}/messages/{id}"), None)
            .await;
        (v["status"] == status).then_some(v)
    })
    .await
}

/// `POST /bots/{id}/messages` with `body`, under `Idempotency-Key: key` when given.
async fn post_send(api: &Api, bot: &str, key: Option<&str>, body: String) -> (u16, Value) {
    let mut r = api
        .http
        .post(format!("{}/api/v1/bots/{bot}/messages", api.url))
        .bearer_auth(api.token.as_deref().unwrap_or_default())
        .header("content-type", "application/json")
        .body(body);
    if let Some(k) = key {
        r = r.header("idempotency-key", k);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_from_the_backend_go_out_once_and_say_how_they_went() {
    let (fake, _dir, _token_file, _w, api) = polling_bot("5:SECRET-SEND", "desk").await;
    let hello = json!({"chat": "77", "text": "from the desk"}).to_string();

    // Bad input: refused with a code, nothing sent.
    let (s, v) = post_send(&api, "desk", None, hello.clone()).await;
    assert_eq!((s, code(&v)), (400, "invalid"), "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("Idempotency-Key"),
        "{v}"
    );
    let long = "k".repeat(201);
    for bad_key in ["", long.as_str(), "tab\there"] {
        let (s, v) = post_send(&api, "desk", Some(bad_key), hello.clone()).await;
        assert_eq!((s, code(&v)), (400, "invalid"), "{bad_key:?}: {v}");
        assert!(v["message"].as_str().unwrap().contains("Idempotency-Key"));
    }
    for body in [
        json!({"text": "no chat"}),
        json!({"chat": "77"}),
        json!({"chat": "77", "text": ""}),
        json!({"chat": "77", "text": "hi", "state": {"x": 1}}),
        json!({"chat": "77", "actions": [{"type": "teleport"}]}),
    ] {
        let (s, v) = post_send(&api, "desk", Some("bad-body"), body.to_string()).await;
        assert_eq!((s, code(&v)), (400, "invalid"), "{body}: {v}");
    }
    let (s, v) = post_send(&api, "desk", Some("k"), "not json".into()).await;
    assert_eq!((s, code(&v)), (400, "invalid"), "{v}");
    let (s, v) = post_send(&api, "nobody", Some("k"), hello.clone()).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    let odd = json!({"chat": "not a chat", "text": "x"}).to_string();
    let (s, v) = post_send(&api, "desk", Some("k"), odd).await;
    assert_eq!((s, code(&v)), (422, "invalid_chat"), "{v}");
    let huge = json!({"chat": "77", "text": "x".repeat(70_000)}).to_string();
    let (s, v) = post_send(&api, "desk", Some("k"), huge).await;
    assert_eq!((s, code(&v)), (413, "too_large"), "{v}");
    assert!(
        fake.state().sent().is_empty(),
        "a refused send sent something"
    );

    // A send, its repeat, and the key reused for another.
    let (s, first) = post_send(&api, "desk", Some("ticket-9 reply 1"), hello.clone()).await;
    assert_eq!(s, 202, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    assert!(["queued", "sent"].contains(&first["status"].as_str().unwrap()));
    let (s, again) = post_send(&api, "desk", Some("ticket-9 reply 1"), hello.clone()).await;
    assert_eq!(
        (s, again["id"].as_str()),
        (202, Some(id.as_str())),
        "{again}"
    );
    let other = json!({"chat": "77", "text": "something else"}).to_string();
    let (s, v) = post_send(&api, "desk", Some("ticket-9 reply 1"), other).await;
    assert_eq!((s, code(&v)), (422, "key_reused"), "{v}");
    let sent = until_status(&api, "desk", &id, "sent").await;
    let ids = sent["platform_ids"].as_array().unwrap();
    assert_eq!(ids.len(), 1, "{sent}");
    let out: Vec<_> = fake
        .state()
        .sent()
        .into_iter()
        .filter(|m| m.text == "from the desk")
        .collect();
    assert_eq!(out.len(), 1, "sent once");
    assert_eq!(
        (out[0].chat_id.as_str(), out[0].message_id.to_string()),
        ("77", ids[0].as_str().unwrap().to_owned())
    );

    // Actions: a menu, edited by its ref; then an edit of a ref nobody gave: failed, and why.
    let menu = json!({"chat": "77", "actions": [
        {"type": "send", "text": "menu", "ref": "m", "buttons": [[{"text": "A", "value": "a"}]]},
        {"type": "edit", "ref": "m", "text": "menu (edited)"}]});
    let (s, v) = post_send(&api, "desk", Some("menu-1"), menu.to_string()).await;
    assert_eq!(s, 202, "{v}");
    let menu_id = v["id"].as_str().unwrap().to_owned();
    let bad = json!({"chat": "77", "actions": [{"type": "edit", "ref": "nope", "text": "x"}]});
    let (s, v) = post_send(&api, "desk", Some("edit-nope"), bad.to_string()).await;
    assert_eq!(s, 202, "{v}");
    let bad_id = v["id"].as_str().unwrap().to_owned();
    let failed = until_status(&api, "desk", &bad_id, "failed").await;
    assert!(
        failed["reason"].as_str().unwrap().contains("unknown ref"),
        "{failed}"
    );
    let (_, v) = api
        .call("GET", &format!("/bots/desk/messages/{menu_id}"), None)
        .await;
    assert_eq!(v["status"], "sent", "{v}");
    assert_eq!(v["platform_ids"].as_array().unwrap().len(), 1, "{v}");
    assert!(
        fake.state()
            .calls("5:SECRET-SEND", "editMessageText")
            .iter()
            .any(|c| c.args["text"] == "menu (edited)"),
        "the edit by ref"
    );
    let (s, v) = api.call("GET", "/bots/desk/messages/0123", None).await;
    assert_eq!((s, code(&v)), (404, "not_found"), "{v}");
    // Counted per bot: in its view, and among the fleet's senders.
    let counts = json!({"queued": 0, "sent": 2, "failed": 1});
    let (_, v) = api.call("GET", "/bots/desk", None).await;
    assert_eq!(v["sends"], counts, "{v}");
    let (_, v) = api.call("GET", "/fleet", None).await;
    let mut row = counts.clone();
    row["id"] = json!("desk");
    assert_eq!(v["sends"], json!([row]), "{v}");

    // A disabled bot takes no sends.
    let (s, _) = api.call("POST", "/bots/desk/disable", None).await;
    assert_eq!(s, 200);
    let (s, v) = post_send(&api, "desk", Some("after-disable"), hello).await;
    assert_eq!((s, code(&v)), (409, "bot_disabled"), "{v}");

    let metrics = api
        .http
        .get(format!("{}/metrics", api.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (status, n) in [("accepted", 3), ("repeated", 1)] {
        let line = "botfleet_api_sends_total{worker_id=";
        assert!(
            metrics.lines().any(|l| l.starts_with(line)
                && l.contains(&format!("status=\"{status}\""))
                && l.ends_with(&format!(" {n}"))),
            "{status} {n}: {metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sends_through_a_workers_api() {
    let (fake, dir, token_file, w, _api) = polling_bot("6:SECRET-CLISEND", "clisend").await;
    let send = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_botfleet"))
            .arg("send")
            .args(args)
            .args(["--api-url", &w.url])
            .arg("--api-token-file")
            .arg(&token_file)
            .env_remove("BOTFLEET_API_TOKEN")
            .env_remove("BOTFLEET_API_URL")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!out.contains("SECRET") && !err.contains("SECRET"));
        (o.status.code(), out, err)
    };
    let args = [
        "clisend",
        "77",
        "from the cli",
        "--idempotency-key",
        "cli-1",
        "--wait",
    ];
    let (code, out, err) = send(&args);
    assert_eq!(code, Some(0), "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0].len(), 64, "the send's id: {out}");
    assert!(lines[1].starts_with("sent: "), "{out}");
    // The same key again: the same id, nothing sent again.
    let (code, again, _) = send(&args[..5]);
    assert_eq!(code, Some(0));
    assert_eq!(again.lines().next(), Some(lines[0]));
    let texts = |t: &str| fake.state().sent().iter().filter(|m| m.text == t).count();
    assert_eq!(texts("from the cli"), 1);
    // Actions from a file, no text.
    let actions = dir.0.join("actions.json");
    std::fs::write(
        &actions,
        json!([{"type": "send", "text": "pick", "buttons": [[{"text": "A", "value": "a"}]]}])
            .to_string(),
    )
    .unwrap();
    let file = actions.to_str().unwrap();
    let (code, out, err) = send(&["clisend", "77", "--actions", file, "--wait"]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("sent: "), "{out}");
    assert_eq!(texts("pick"), 1);
    // A send whose action is refused: exit 1, and why.
    std::fs::write(
        &actions,
        r#"[{"type": "edit", "ref": "nope", "text": "x"}]"#,
    )
    .unwrap();
    let (code, out, _) = send(&["clisend", "77", "--actions", file, "--wait"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("failed: ") && out.contains("unknown ref"),
        "{out}"
    );
    // Bad input: a clear error, nothing sent.
    std::fs::write(&actions, "[{\"type\": ").unwrap();
    let (code, _, err) = send(&["clisend", "77", "--actions", file]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("actions.json") && err.contains("line 1"),
        "{err}"
    );
    let (code, _, err) = send(&["clisend", "77"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("nothing to send"), "{err}");
    let (code, _, err) = send(&["clisend", "not a chat", "x"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("invalid_chat"), "{err}");
    let (code, _, err) = send(&["nobody", "77", "x"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("not_found"), "{err}");
    // `fleet status` counts them for the bot.
    let o = Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .args(["fleet", "status", "--api-url", &w.url])
        .arg("--api-token-file")
        .arg(&token_file)
        .env_remove("BOTFLEET_API_TOKEN")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("clisend: 2 sent, 0 queued, 1 failed"), "{out}");
}

/// Answers that come later through the worker binary: a webhook handler answers `202`; the
/// bot shows the held turn (`held` in `GET /api/v1/bots/{id}`, `botfleet_turns_held` in the
/// metrics); its parts are posted to `POST /api/v1/replies/{reply_token}` with no API token
/// (the reply token is the permission), where a forged token is unknown and a bad body is
/// refused; the last part ends the turn and the chat's next message is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_answers_are_posted_to_the_workers_api_without_an_api_token() {
    let handler = botfleet_testkit::connector_suite::later_handler().await;
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot("6:SECRET-LATER");
    let (_dir, _token_file, w) = token_worker();
    let api = Api {
        http: reqwest::Client::new(),
        url: w.url.clone(),
        token: Some(API_TOKEN.to_owned()),
    };
    let bot = json!({"id": "agent", "platform": "telegram", "token": "6:SECRET-LATER",
        "api_url": fake.url(), "handler": "webhook", "webhook_url": handler.url()});
    let (s, v) = api.call("POST", "/bots", Some(bot.to_string())).await;
    assert_eq!(s, 201, "{v}");
    wait_for("polling", Duration::from_secs(15), || async {
        fake.state().is_polling("6:SECRET-LATER").then_some(())
    })
    .await;
    fake.state().user_writes("6:SECRET-LATER", 31, "ask");
    let token = botfleet_testkit::connector_suite::asked_token(&handler, "ask").await;
    wait_for("the turn shown held", Duration::from_secs(20), || async {
        let (_, v) = api.call("GET", "/bots/agent", None).await;
        (v["held"] == 1).then_some(())
    })
    .await;
    let metrics = reqwest::get(format!("{}/metrics", w.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("botfleet_turns_held{") && l.ends_with(" 1")),
        "{metrics}"
    );
    fake.state().user_writes("6:SECRET-LATER", 31, "next");
    let http = reqwest::Client::new();
    let post = |token: String, key: &'static str, body: Value| {
        let http = http.clone();
        let url = format!("{}/api/v1/replies/{token}", w.url);
        async move {
            let r = http
                .post(url)
                .header("idempotency-key", key)
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            let s = r.status().as_u16();
            (s, r.json::<Value>().await.unwrap_or_default())
        }
    };
    let (s, v) = post("r1.forged.token".into(), "k", json!({"final": true})).await;
    assert_eq!((s, code(&v)), (404, "unknown_token"), "{v}");
    let (s, v) = post(token.clone(), "k", json!({"text": "no"})).await;
    assert_eq!((s, code(&v)), (400, "invalid"), "{v}");
    let one = json!({"actions": [{"type": "send", "text": "one"}], "final": false});
    let (s, v) = post(token.clone(), "p1", one).await;
    assert_eq!((s, v["seq"].as_u64()), (202, Some(1)), "{v}");
    let two = json!({"actions": [{"type": "send", "text": "two"}], "state": {"n": 2},
        "final": true});
    let (s, v) = post(token.clone(), "p2", two).await;
    assert_eq!(s, 202, "{v}");
    let next = r#"next after {"n":2}"#;
    wait_for(
        "the next message answered",
        Duration::from_secs(20),
        || async {
            fake.state()
                .sent()
                .iter()
                .any(|m| m.text == next)
                .then_some(())
        },
    )
    .await;
    let texts: Vec<String> = fake.state().sent().into_iter().map(|m| m.text).collect();
    assert_eq!(texts, ["one", "two", next], "{texts:?}");
    let (s, v) = post(token, "p3", json!({"final": true})).await;
    assert_eq!((s, code(&v)), (410, "turn_ended"), "{v}");
    let (_, v) = api.call("GET", "/bots/agent", None).await;
    assert_eq!(v["held"], 0, "{v}");
}
