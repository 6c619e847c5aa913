//! The CLI as an operator uses it: the registry commands, the embedded worker with its HTTP
//! endpoints and instance lock, and clear errors for bad input.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use botfleet_testkit::{nonce, wait_for, FakeTelegram};

struct Dir(PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> Dir {
    let d = std::env::temp_dir().join(format!("botfleet-cli-{}", nonce()));
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

fn db(dir: &Dir) -> String {
    format!("sqlite://{}", dir.0.join("bots.db").display())
}

fn botfleet(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
        .args(args)
        .env_remove("BOTFLEET_TOKEN")
        .output()
        .unwrap()
}

/// `botfleet bots add ID --platform P --token T [extra…] --database-url DB`.
fn bots_add(db: &str, id: &str, platform: &str, token: &str, extra: &[&str]) -> Output {
    let mut args = vec!["bots", "add", id, "--platform", platform, "--token", token];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--database-url", db]);
    botfleet(&args)
}

/// `botfleet bots list --json` against `db`: (stdout, stderr).
fn list_json(db: &str) -> (String, String) {
    text(&botfleet(&["bots", "list", "--json", "--database-url", db]))
}

/// The bots `bots list --json` shows (one a line).
fn listed(db: &str) -> Vec<serde_json::Value> {
    list_json(db)
        .0
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn the_registry_commands_work_and_never_show_tokens() {
    let dir = tempdir();
    let db = db(&dir);
    let o = bots_add(&db, "support-eu", "telegram", "111:SECRET-A", &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    let o = bots_add(&db, "support-eu", "telegram", "111:SECRET-A", &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("exists already"), "{:?}", text(&o));
    let o = bots_add(&db, "x", "myspace", "1:a", &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("unknown platform \"myspace\""),
        "{:?}",
        text(&o)
    );
    let o = bots_add(&db, "bad id", "telegram", "1:a", &[]);
    assert!(text(&o).1.contains("invalid bot id"), "{:?}", text(&o));
    let o = bots_add(
        &db,
        "hook",
        "telegram",
        "222:SECRET-B",
        &["--handler", "webhook"],
    );
    assert!(text(&o).1.contains("needs webhook_url"), "{:?}", text(&o));
    // A handler compiled into the workers is named; a name that cannot be one is refused.
    let o = bots_add(
        &db,
        "zz-lib",
        "telegram",
        "223:SECRET-L",
        &["--handler", "support"],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let o = bots_add(
        &db,
        "lib2",
        "telegram",
        "224:SECRET-M",
        &["--handler", "Not A Name"],
    );
    assert!(!o.status.success());
    assert!(text(&o).1.contains("compiled-in handler"), "{:?}", text(&o));
    assert!(
        botfleet(&["bots", "disable", "support-eu", "--database-url", &db])
            .status
            .success()
    );
    let o = botfleet(&["bots", "list", "--json", "--database-url", &db]);
    let (out, _) = text(&o);
    assert!(!out.contains("SECRET"), "{out}");
    let row: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(row["id"], "support-eu");
    assert_eq!(row["enabled"], false);
    assert_eq!(row["status"], "pending");
    let o = botfleet(&["bots", "list", "--database-url", &db]);
    assert!(text(&o).0.starts_with("ID "), "{:?}", text(&o));
    assert!(
        botfleet(&["bots", "remove", "support-eu", "--database-url", &db])
            .status
            .success()
    );
    let o = botfleet(&["bots", "remove", "support-eu", "--database-url", &db]);
    assert!(text(&o).1.contains("no bot support-eu"), "{:?}", text(&o));
}

#[test]
fn import_reports_each_bad_line_and_keeps_the_good_ones() {
    let dir = tempdir();
    let db = db(&dir);
    let file = dir.0.join("bots.jsonl");
    std::fs::write(
        &file,
        [
            r#"{"id":"a","platform":"telegram","token":"1:SECRET-1"}"#,
            r#"{"id":"b","platform":"telegram","token":12345678}"#,
            r#"not json"#,
            "",
            r#"{"id":"c","platform":"icq","token":"3:SECRET-3"}"#,
            r#"{"id":"d","platform":"telegram","token":"4:SECRET-4","handler":"webhook","webhook_url":"http://127.0.0.1:9/h"}"#,
            r#"{"id":"a","platform":"telegram","token":"1:SECRET-1"}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let o = botfleet(&[
        "bots",
        "import",
        file.to_str().unwrap(),
        "--database-url",
        &db,
    ]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("imported 2 bots, 4 lines refused"), "{out}");
    for n in [2, 3, 5, 7] {
        assert!(
            err.contains(&format!("line {n}: ")),
            "line {n} not reported: {err}"
        );
    }
    assert!(err.contains("unknown platform"), "{err}");
    assert!(
        !err.contains("12345678") && !err.contains("SECRET"),
        "{err}"
    );
}

#[test]
fn bad_flags_are_clear_errors() {
    let o = botfleet(&["worker", "--lease-ms", "5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("--lease-ms"), "{:?}", text(&o));
    let o = botfleet(&["worker", "--connect-rate", "fast"]);
    assert_eq!(o.status.code(), Some(2));
    let o = botfleet(&["worker", "--http-addr", "nowhere"]);
    assert_eq!(o.status.code(), Some(2));
    let dir = tempdir();
    let o = botfleet(&[
        "worker",
        "--database-url",
        &db(&dir),
        "--redis-url",
        "http://127.0.0.1:1",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("invalid Redis URL"), "{:?}", text(&o));
    // The Redis mode's flags must fit together; a mode that is not built is a usage error.
    let database = db(&dir);
    let worker = |extra: &[&str]| {
        let mut args = vec![
            "worker",
            "--database-url",
            &database,
            "--http-addr",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        botfleet(&args)
    };
    for (extra, says) in [
        (
            &[
                "--redis-url",
                "redis://127.0.0.1:1",
                "--redis-mode",
                "sentinel",
            ][..],
            "needs --redis-sentinel-master",
        ),
        (
            &[
                "--redis-url",
                "redis://127.0.0.1:1",
                "--redis-sentinel-master",
                "m",
            ][..],
            "is for --redis-mode sentinel",
        ),
        (&["--redis-mode", "sentinel"][..], "need --redis-url"),
        (
            &["--redis-url", "redis://127.0.0.1:1,redis://127.0.0.1:2"][..],
            "needs the sentinel mode",
        ),
    ] {
        let o = worker(extra);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {:?}", text(&o));
        assert!(text(&o).1.contains(says), "{extra:?}: {:?}", text(&o));
    }
    let o = worker(&["--redis-mode", "clustered"]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(text(&o).1.contains("--redis-mode"), "{:?}", text(&o));
    let o = botfleet(&[
        "worker",
        "--database-url",
        "mysql://x/y",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("invalid database URL"),
        "{:?}",
        text(&o)
    );
    let o = botfleet(&[
        "bots",
        "list",
        "--database-url",
        "sqlite:///nonexistent-dir-bf/x.db",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("does not exist"), "{:?}", text(&o));
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

/// What follows `marker` in the first line of `child`'s stderr that has it (20 s at most).
fn first_line(child: &mut Child, marker: &'static str) -> Option<String> {
    let stderr = child.stderr.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.split(marker).nth(1) {
                let _ = tx.send(rest.trim().to_owned());
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(20)).ok()
}

/// Starts an embedded worker and reads its HTTP address from its log.
fn start_worker(db: &str) -> Worker {
    start_worker_with(db, &[])
}

/// [`start_worker`] with more flags.
fn start_worker_with(db: &str, extra: &[&str]) -> Worker {
    let mut child = spawn_worker(db, extra);
    let url = first_line(&mut child, "listening on ").expect("worker printed its address");
    Worker { child, url }
}

/// An embedded worker on `db` with `extra` flags, its stderr piped (warnings and up).
fn spawn_worker(db: &str, extra: &[&str]) -> Child {
    spawn_worker_env(db, extra, &[])
}

/// [`spawn_worker`] with `env` set too.
fn spawn_worker_env(db: &str, extra: &[&str], env: &[(&str, &str)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
        .envs(env.iter().copied())
        .args([
            "worker",
            "--database-url",
            db,
            "--http-addr",
            "127.0.0.1:0",
            "--poll-timeout-s",
            "1",
        ])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_worker_serves_bots_health_and_metrics() {
    let fake = FakeTelegram::start().await.unwrap();
    let dir = tempdir();
    let db = db(&dir);
    fake.state().add_bot("777:GOOD");
    for (id, token) in [("good", "777:GOOD"), ("late", "778:NOT-YET")] {
        let o = bots_add(&db, id, "telegram", token, &["--api-url", &fake.url()]);
        assert!(o.status.success(), "{:?}", text(&o));
    }
    let w = start_worker(&db);
    let http = reqwest::Client::new();
    let get = |path: &'static str| {
        let (http, url) = (http.clone(), w.url.clone());
        async move {
            let r = http.get(format!("{url}{path}")).send().await.ok()?;
            Some((r.status().as_u16(), r.text().await.ok()?))
        }
    };
    assert_eq!(get("/healthz").await.unwrap().0, 200);
    wait_for("ready", Duration::from_secs(10), || async {
        (get("/readyz").await?.0 == 200).then_some(())
    })
    .await;
    // A second worker on the same database refuses to start.
    let o = botfleet(&[
        "worker",
        "--database-url",
        &db,
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("another botfleet worker is running"),
        "{:?}",
        text(&o)
    );
    // The good bot answers; the unknown token is reported failed, with the reason.
    wait_for("good polling", Duration::from_secs(10), || async {
        fake.state().is_polling("777:GOOD").then_some(())
    })
    .await;
    fake.state().user_writes("777:GOOD", 9, "ping");
    wait_for("answer", Duration::from_secs(10), || async {
        fake.state()
            .sent()
            .iter()
            .any(|s| s.text == "ping")
            .then_some(())
    })
    .await;
    let list = wait_for("late failed", Duration::from_secs(10), || async {
        let (out, _) = list_json(&db);
        out.contains("\"failed\"").then_some(out)
    })
    .await;
    assert!(list.contains("401"), "{list}");
    assert!(
        list.contains("\"owner\":\"w-"),
        "running bots show their worker: {list}"
    );
    let (_, metrics) = get("/metrics").await.unwrap();
    assert!(metrics.contains("platform=\"telegram\"} 1"), "{metrics}");
    assert!(metrics.contains("reason=\"unauthorized\"} 1"), "{metrics}");
    assert!(
        metrics.contains("botfleet_messages_sent_total"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("GOOD") && !metrics.contains("NOT-YET"),
        "{metrics}"
    );
    // The operator fixes the token and restarts the bot: the worker picks it up.
    fake.state().add_bot("778:NOT-YET");
    assert!(
        botfleet(&["bots", "restart", "late", "--database-url", &db])
            .status
            .success()
    );
    wait_for(
        "late polling after restart",
        Duration::from_secs(15),
        || async { fake.state().is_polling("778:NOT-YET").then_some(()) },
    )
    .await;
    // SIGTERM: drains and exits 0.
    let mut w = w;
    assert!(Command::new("kill")
        .args(["-TERM", &w.child.id().to_string()])
        .status()
        .unwrap()
        .success());
    let status = tokio::task::spawn_blocking(move || {
        let s = w.child.wait().unwrap();
        drop(w);
        s
    })
    .await
    .unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(fake.state().conflicts(), 0);
}

#[test]
fn the_demo_runs_and_reports_nothing_lost() {
    // Every flag of its own: the mix of platforms, a pause before users write, and the page
    // kept up after the report until Ctrl-C.
    let mut child = Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
        .args([
            "demo",
            "--bots",
            "30",
            "--slack-percent",
            "20",
            "--discord-percent",
            "10",
            "--webhook-percent",
            "20",
            "--duration-s",
            "10",
            "--lease-ms",
            "1000",
            "--rate",
            "50",
            "--wait-s",
            "1",
            "--stay",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut out = String::new();
    let page = loop {
        let Some(Ok(line)) = lines.next() else {
            let _ = child.kill();
            panic!("the demo ended before its page stayed up:\n{out}");
        };
        out.push_str(&line);
        out.push('\n');
        if let Some(rest) = line.strip_prefix("the page stays up at http://") {
            break rest.split('/').next().unwrap().to_owned();
        }
    };
    // Still serving after the report.
    let answer = http_10(&page, "GET / HTTP/1.0\r\nHost: demo\r\n\r\n");
    assert!(
        answer.lines().next().is_some_and(|l| l.contains(" 200 ")),
        "{answer:.200}"
    );
    // Its API takes sends from the backend, and they go out.
    let body = r#"{"chat": "1001", "text": "from the desk"}"#;
    let answer = http_10(
        &page,
        &format!(
            "POST /api/v1/bots/demo-29/messages HTTP/1.0\r\nHost: demo\r\nContent-Type: application/json\r\nIdempotency-Key: demo-1\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert!(
        answer.lines().next().is_some_and(|l| l.contains(" 202 ")),
        "{answer}"
    );
    let id = answer
        .split("\"id\":\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status = http_10(
            &page,
            &format!("GET /api/v1/bots/demo-29/messages/{id} HTTP/1.0\r\nHost: demo\r\n\r\n"),
        );
        if status.contains("\"status\":\"sent\"") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // And the parts of answers that come later: a token not of this fleet is unknown.
    let body = r#"{"final": true}"#;
    let answer = http_10(
        &page,
        &format!(
            "POST /api/v1/replies/r1.forged HTTP/1.0\r\nHost: demo\r\nContent-Type: application/json\r\nIdempotency-Key: k\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert!(
        answer.lines().next().is_some_and(|l| l.contains(" 404 "))
            && answer.contains("unknown_token"),
        "{answer}"
    );
    // Ctrl-C ends it, with the run's verdict as its exit status.
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{out}\n{err}");
    assert!(
        out.contains("30 bots (21 Telegram of which 6 by webhook")
            && out.contains("6 Slack, 3 Discord"),
        "the mix as asked: {out}"
    );
    assert!(out.contains("users start writing in 1 s"), "{out}");
    // Every platform in one pool, each reported: nothing lost, every chat in order.
    for p in ["telegram", "slack", "discord"] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(p) && l.contains("written"))
            .unwrap_or_else(|| panic!("no {p} line in:\n{out}"));
        assert!(
            line.contains("lost 0") && line.contains("chats out of order 0"),
            "{line}"
        );
    }
    for line in [
        "Telegram second pollers (409)       0",
        "Slack sockets held by two workers  0",
        "Discord shards run twice            0",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    assert!(
        out.contains("killed") && out.contains("worker-3 joins"),
        "{out}"
    );
    assert!(out.contains("kill -> the victim's bots back"), "{out}");
    assert!(out.contains("Slack envelope ack p99"), "{out}");
    // Webhook bots were answered through the balancer (their replies are in telegram's line).
    let taken: u64 = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Telegram webhook deliveries"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no webhook line in:\n{out}"));
    assert!(taken > 0, "{out}");
}

#[test]
fn update_and_upsert_change_bots_in_place() {
    let dir = tempdir();
    let db = db(&dir);
    assert!(bots_add(&db, "a", "telegram", "1:SECRET-OLD", &[])
        .status
        .success());
    // Nothing to change is an error; so is a bot that does not exist.
    let o = botfleet(&["bots", "update", "a", "--database-url", &db]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("nothing to change"), "{:?}", text(&o));
    let o = botfleet(&[
        "bots",
        "update",
        "zz",
        "--token",
        "1:SECRET-X",
        "--database-url",
        &db,
    ]);
    assert!(text(&o).1.contains("no bot zz"), "{:?}", text(&o));
    // The token from standard input, the handler from a flag.
    let mut child = Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
        .args([
            "bots",
            "update",
            "a",
            "--token",
            "-",
            "--handler",
            "webhook",
        ])
        .args([
            "--webhook-url",
            "http://127.0.0.1:9/h",
            "--database-url",
            &db,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"1:SECRET-NEW\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(text(&o).0.contains("updated a"), "{:?}", text(&o));
    let (list, _) = list_json(&db);
    assert!(list.contains("\"handler\":\"webhook\""), "{list}");
    assert!(!list.contains("SECRET"), "{list}");
    // A bad webhook URL is refused, naming the field, and nothing changes.
    let o = botfleet(&[
        "bots",
        "update",
        "a",
        "--webhook-url",
        "ftp://x",
        "--database-url",
        &db,
    ]);
    assert!(text(&o).1.contains("webhook_url"), "{:?}", text(&o));
    let (after, _) = list_json(&db);
    assert_eq!(after, list);
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    // Upsert: the existing bot is updated, a new one added; without it, refused.
    let file = dir.0.join("bots.jsonl");
    std::fs::write(
        &file,
        [
            r#"{"id":"a","platform":"telegram","token":"1:SECRET-NEWER"}"#,
            r#"{"id":"b","platform":"telegram","token":"2:SECRET-B"}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let o = botfleet(&["bots", "import", f, "--database-url", &db]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("line 1: bot a exists already"),
        "{:?}",
        text(&o)
    );
    let o = botfleet(&["bots", "import", "--upsert", f, "--database-url", &db]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(
        text(&o)
            .0
            .contains("imported 2 bots (0 added, 1 updated, 1 unchanged)"),
        "{:?}",
        text(&o)
    );
    let (list, _) = list_json(&db);
    assert!(
        list.contains("\"handler\":\"echo\""),
        "the line describes the whole bot: {list}"
    );
}

#[test]
fn a_config_file_configures_the_worker_and_logs_can_be_json() {
    let dir = tempdir();
    let db = db(&dir);
    let conf = dir.0.join("botfleet.toml");
    std::fs::write(
        &conf,
        format!(
            "# the worker\ndatabase_url = \"{db}\"\nhttp_addr = \"127.0.0.1:0\"\nlease-ms = 4000\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
        .args(["worker", "--log-format", "json", "--config"])
        .arg(&conf)
        .env("RUST_LOG", "info")
        .env_remove("BOTFLEET_HTTP_ADDR")
        .env_remove("BOTFLEET_DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut json_lines = 0;
    let mut listening = false;
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if line.contains("listening on http://127.0.0.1:") {
            listening = true;
        } else if line.starts_with("botfleet worker ") && line.contains(" hooks on http://") {
            // The other machine-readable line: where the hooks address is.
        } else if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
            assert!(v["level"].is_string(), "{line}");
            assert!(!line.contains('\u{1b}'), "colour in a file: {line}");
            json_lines += 1;
        } else {
            panic!("a log line that is not JSON: {line}");
        }
        if listening && json_lines > 0 {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(listening && json_lines > 0);
    // The file's database was used: the worker created it.
    assert!(dir.0.join("bots.db").exists());
    // A bad key or value stops the start, naming the key.
    for (body, want) in [
        ("lease_msec = 4000\n", "unknown key \"lease_msec\""),
        ("capacity = 0\n", "key capacity"),
    ] {
        std::fs::write(&conf, body).unwrap();
        let o = Command::new(env!("CARGO_BIN_EXE_botfleet"))
            .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
            .args(["worker", "--config"])
            .arg(&conf)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        assert!(text(&o).1.contains(want), "{:?}", text(&o));
    }
}

const KEY_1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const KEY_2: &str = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_encrypted_at_rest_and_rotated_while_the_worker_runs() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot("5:SECRET-S");
    let dir = tempdir();
    let db = db(&dir);
    let keys = dir.0.join("keys");
    std::fs::write(&keys, format!("{KEY_1}\n")).unwrap();
    let k = keys.to_str().unwrap();
    let o = bots_add(
        &db,
        "sealed",
        "telegram",
        "5:SECRET-S",
        &["--api-url", &fake.url(), "--secret-key-file", k],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let no_secret_on_disk = || {
        for entry in std::fs::read_dir(&dir.0).unwrap() {
            let path = entry.unwrap().path();
            if path.to_string_lossy().contains("bots.db") {
                let bytes = std::fs::read(&path).unwrap();
                assert!(!bytes.windows(6).any(|w| w == b"SECRET"), "{path:?}");
            }
        }
    };
    no_secret_on_disk();
    // Without the key: a clear error, for the CLI and for a worker at start.
    let o = botfleet(&["bots", "list", "--database-url", &db]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("--secret-key-file"), "{:?}", text(&o));
    let o = botfleet(&[
        "worker",
        "--database-url",
        &db,
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("is encrypted"), "{:?}", text(&o));
    // With it, the worker runs the bot.
    let w = start_worker_with(&db, &["--secret-key-file", k]);
    let answered = |text: &'static str| {
        let fake = &fake;
        async move {
            fake.state().user_writes("5:SECRET-S", 1, text);
            wait_for(text, Duration::from_secs(15), || async {
                fake.state()
                    .sent()
                    .iter()
                    .any(|s| s.text == text)
                    .then_some(())
            })
            .await;
        }
    };
    answered("before the rotation").await;
    let events = || async {
        let v: serde_json::Value = reqwest::get(format!("{}/api/v1/events", w.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["events"].as_array().unwrap().clone()
    };
    let seen = events().await.len();
    // Rotate: the new key first in the file the worker reads, then re-encrypt.
    std::fs::write(&keys, format!("{KEY_2}\n{KEY_1}\n")).unwrap();
    let o = botfleet(&[
        "secrets",
        "rotate",
        "--database-url",
        &db,
        "--secret-key-file",
        k,
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(text(&o).0.contains("of 1 bots under key"), "{:?}", text(&o));
    no_secret_on_disk();
    answered("after the rotation").await;
    let stopped: Vec<_> = events().await[seen..]
        .iter()
        .filter(|e| e["kind"] == "bot_stopped")
        .cloned()
        .collect();
    assert!(stopped.is_empty(), "a rotation restarted bots: {stopped:?}");
    // The old key alone no longer opens it; the worker, meeting the new key, re-reads its file.
    std::fs::write(&keys, format!("{KEY_1}\n")).unwrap();
    let o = botfleet(&[
        "bots",
        "list",
        "--database-url",
        &db,
        "--secret-key-file",
        k,
    ]);
    assert!(text(&o).1.contains("do not include"), "{:?}", text(&o));
    std::fs::write(&keys, format!("{KEY_2}\n")).unwrap();
    let o = botfleet(&[
        "bots",
        "restart",
        "sealed",
        "--database-url",
        &db,
        "--secret-key-file",
        k,
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    wait_for(
        "restarted with the new key",
        Duration::from_secs(15),
        || async {
            events().await[seen..]
                .iter()
                .any(|e| e["kind"] == "bot_started")
                .then_some(())
        },
    )
    .await;
    answered("after the restart").await;
    drop(w);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_operations_show_progress() {
    let fake = FakeTelegram::start().await.unwrap();
    let dir = tempdir();
    let db = db(&dir);
    for i in 0..3 {
        let token = format!("{}:PROGRESS", 600 + i);
        fake.state().add_bot(&token);
        let o = bots_add(
            &db,
            &format!("p{i}"),
            "telegram",
            &token,
            &["--api-url", &fake.url()],
        );
        assert!(o.status.success());
    }
    // A worker's cold start ends with a line saying its whole share runs.
    let mut child = Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
        .args([
            "worker",
            "--database-url",
            &db,
            "--http-addr",
            "127.0.0.1:0",
        ])
        .args(["--poll-timeout-s", "1", "--log-format", "text"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut child, "cold start done");
    let _ = child.kill();
    let _ = child.wait();
    let line = line.expect("a cold-start line");
    assert!(line.contains("bots=3"), "{line}");
    // `fleet status --watch` shows the status again and again.
    let mut watch = Command::new(env!("CARGO_BIN_EXE_botfleet"))
        .env("BOTFLEET_HOOKS_ADDR", "127.0.0.1:0")
        .args([
            "fleet",
            "status",
            "--json",
            "--watch",
            "1",
            "--database-url",
            &db,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = watch.stdout.take().unwrap();
    let mut docs = 0;
    for line in BufReader::new(out).lines().map_while(Result::ok) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["bots"], 3);
        docs += 1;
        if docs == 2 {
            break;
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert_eq!(docs, 2);
}

#[test]
fn discord_bots_take_a_shard_count() {
    let dir = tempdir();
    let db = db(&dir);
    let o = bots_add(
        &db,
        "d",
        "discord",
        "DISCORD.cli.SECRET",
        &["--shards", "8"],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let (list, _) = list_json(&db);
    assert!(
        list.contains("\"shards\":8") && list.contains("\"platform\":\"discord\""),
        "{list}"
    );
    let o = botfleet(&[
        "bots",
        "update",
        "d",
        "--shards",
        "auto",
        "--database-url",
        &db,
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let (list, _) = list_json(&db);
    assert!(list.contains("\"shards\":null"), "{list}");
    let o = bots_add(
        &db,
        "e",
        "discord",
        "DISCORD.cli.SECRET",
        &["--shards", "0"],
    );
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    let o = bots_add(&db, "t", "telegram", "1:SECRET", &["--shards", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o).1.contains("only Discord bots have shards"),
        "{:?}",
        text(&o)
    );
    // Slices of the recommended count: registered, counted by the fleet when it starts (no
    // slices until then).
    let o = bots_add(
        &db,
        "auto",
        "discord",
        "DISCORD.cli.SECRET",
        &["--shards", "auto", "--shards-per-slice", "4"],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let (list, _) = list_json(&db);
    let row: serde_json::Value = list
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["id"] == "auto")
        .unwrap();
    assert_eq!(row["shards"], serde_json::Value::Null);
    assert_eq!(row["shards_per_slice"], 4);
    assert!(
        row.get("shards_in_use").is_none() && row.get("slices").is_none(),
        "{row}"
    );
    let o = botfleet(&["bots", "list", "--database-url", &db]);
    assert!(text(&o).0.contains("auto ?/? K=4"), "{:?}", text(&o));
    // More shards per slice than a fixed count has is refused; the listing shows each slice's
    // shards.
    let o = bots_add(
        &db,
        "s",
        "discord",
        "DISCORD.cli.SECRET",
        &["--shards", "2", "--shards-per-slice", "4"],
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("shards_per_slice"), "{:?}", text(&o));
    let o = bots_add(
        &db,
        "s",
        "discord",
        "DISCORD.cli.SECRET",
        &["--shards", "10", "--shards-per-slice", "4"],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let (list, _) = list_json(&db);
    let row: serde_json::Value = list
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["id"] == "s")
        .unwrap();
    let slices: Vec<(String, u64, u64)> = row["slices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["unit"].as_str().unwrap().to_owned(),
                s["first_shard"].as_u64().unwrap(),
                s["shards"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        slices,
        [
            ("s#0".to_owned(), 0, 4),
            ("s#1".to_owned(), 4, 4),
            ("s#2".to_owned(), 8, 2)
        ]
    );
    let o = bots_add(&db, "x#1", "discord", "DISCORD.cli.SECRET", &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("reserved for slices"), "{:?}", text(&o));
    let o = botfleet(&["version"]);
    assert!(
        text(&o).0.contains("platforms: telegram, slack, discord"),
        "{:?}",
        text(&o)
    );
}

/// Webhook bots through the CLI: each platform takes its own secret's name, the secrets stay
/// out of `bots list`, a secret without its webhook mode and a mode the build lacks are
/// refused with the field named.
#[test]
fn webhook_bots_are_added_with_their_platforms_settings() {
    let dir = tempdir();
    let db = db(&dir);
    let ok = |args: &[&str]| {
        let o = botfleet(args);
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    ok(&[
        "bots",
        "add",
        "tg",
        "--platform",
        "telegram",
        "--token",
        "1:tok",
        "--mode",
        "webhook",
        "--secret-token",
        "SEKRET_tg",
        "--max-connections",
        "10",
        "--database-url",
        &db,
    ]);
    ok(&[
        "bots",
        "add",
        "sl",
        "--platform",
        "slack",
        "--token",
        "xoxb-1",
        "--mode",
        "events",
        "--signing-secret",
        "SEKRETsl",
        "--database-url",
        &db,
    ]);
    ok(&[
        "bots",
        "add",
        "wa",
        "--platform",
        "whatsapp",
        "--token",
        "EAAG1",
        "--phone-number-id",
        "123",
        "--app-secret",
        "SEKRETwa",
        "--verify-token",
        "SEKRETvt",
        "--database-url",
        &db,
    ]);
    let o = botfleet(&["bots", "list", "--json", "--database-url", &db]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(!out.contains("SEKRET"), "{out}");
    for (id, mode) in [("tg", "webhook"), ("sl", "events"), ("wa", "cloud")] {
        let line = out
            .lines()
            .find(|l| l.contains(&format!("\"id\":\"{id}\"")))
            .unwrap();
        assert!(line.contains(&format!("\"mode\":\"{mode}\"")), "{line}");
        assert!(line.contains("\"has_hook_secret\":true"), "{line}");
    }
    for (args, field) in [
        (
            vec![
                "bots",
                "add",
                "x1",
                "--platform",
                "telegram",
                "--token",
                "1:t",
                "--secret-token",
                "abc",
            ],
            "needs mode webhook",
        ),
        (
            vec![
                "bots",
                "add",
                "x2",
                "--platform",
                "telegram",
                "--token",
                "1:t",
                "--mode",
                "webhook",
            ],
            "secret_token",
        ),
        (
            vec![
                "bots",
                "add",
                "x3",
                "--platform",
                "slack",
                "--token",
                "xoxb-1",
                "--mode",
                "events",
                "--secret-token",
                "abc",
            ],
            "secret_token is not a slack setting",
        ),
        (vec!["bots", "add", "x4", "--platform", "telegram"], "token"),
        (
            vec![
                "bots",
                "add",
                "x5",
                "--platform",
                "whatsapp",
                "--token",
                "EAAG",
                "--app-secret",
                "a",
                "--verify-token",
                "v",
            ],
            "phone_number_id",
        ),
        (
            vec![
                "bots",
                "add",
                "x6",
                "--platform",
                "telegram",
                "--token",
                "1:t",
                "--mode",
                "carrier",
            ],
            "mode",
        ),
    ] {
        let mut a = args.clone();
        a.extend(["--database-url", &db]);
        let o = botfleet(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{a:?}");
        assert!(err.contains(field), "{a:?}: {err}");
        assert!(!err.contains("abc\""), "{err}");
    }
    // Back to polling forgets the webhook settings.
    ok(&[
        "bots",
        "update",
        "tg",
        "--mode",
        "poll",
        "--database-url",
        &db,
    ]);
    let o = botfleet(&["bots", "list", "--json", "--database-url", &db]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let line = out.lines().find(|l| l.contains("\"id\":\"tg\"")).unwrap();
    assert!(
        line.contains("\"mode\":\"poll\"") && line.contains("\"has_hook_secret\":false"),
        "{line}"
    );
}

/// `--commands FILE` on `bots add` and `bots update`: the commands reach the registry and,
/// through a running worker, the platforms (Telegram's `setMyCommands`, Discord's application
/// commands); `[]` removes them. A file that is not a commands array (named, with the line and
/// column), a missing file, and a command the platforms refuse are clear errors that change
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_from_a_file_reach_the_registry_and_the_platforms() {
    let tg = FakeTelegram::start().await.unwrap();
    let dc = botfleet_testkit::FakeDiscord::start().await.unwrap();
    tg.state().add_bot("901:CMDS");
    dc.state().add_bot("DISCORD.cmds", 1, 1);
    let dir = tempdir();
    let db = db(&dir);
    let file = |name: &str, body: &str| {
        let p = dir.0.join(name);
        std::fs::write(&p, body).unwrap();
        p.display().to_string()
    };
    let two = file(
        "two.json",
        r#"[{"name": "start", "description": "Begin"},
            {"name": "help", "description": "What I do",
             "options": [{"name": "topic", "description": "About what", "type": "string"}]}]"#,
    );
    let none = file("none.json", "[]");
    let broken = file(
        "broken.json",
        "[{\"name\": \"start\",\n  \"description\": }]",
    );
    let refused = file(
        "refused.json",
        r#"[{"name": "Start!", "description": "x"}]"#,
    );

    // Bad files first: each is refused with its reason, and nothing is registered.
    let o = bots_add(&db, "tg", "telegram", "901:CMDS", &["--commands", &broken]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&broken) && err.contains("line 2, column"),
        "{err}"
    );
    let missing = dir.0.join("missing.json").display().to_string();
    let o = bots_add(&db, "tg", "telegram", "901:CMDS", &["--commands", &missing]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("cannot read"), "{err}");
    let o = bots_add(&db, "tg", "telegram", "901:CMDS", &["--commands", &refused]);
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("invalid commands: command 0"),
        "a name the platforms refuse: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(!list_json(&db).0.contains("\"tg\""), "nothing registered");

    for (id, platform, token, api) in [
        ("tg", "telegram", "901:CMDS", tg.url()),
        ("dc", "discord", "DISCORD.cmds", dc.url()),
    ] {
        let o = bots_add(
            &db,
            id,
            platform,
            token,
            &["--api-url", &api, "--commands", &two],
        );
        assert!(o.status.success(), "{id}: {:?}", text(&o));
    }
    let bots = listed(&db);
    assert_eq!(bots.len(), 2, "{bots:?}");
    for bot in &bots {
        let names: Vec<&str> = bot["commands"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["start", "help"], "{bot}");
    }

    // A worker registers them with both platforms.
    let _w = start_worker_with(&db, &["--registry-refresh-ms", "200"]);
    let discord_names = |dc: &botfleet_testkit::FakeDiscord| {
        dc.state().commands("DISCORD.cmds").map(|c| {
            c.as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x["name"].as_str().map(str::to_owned))
                .collect::<Vec<_>>()
        })
    };
    wait_for(
        "the commands registered on both platforms",
        Duration::from_secs(20),
        || async {
            (tg.state().my_commands("901:CMDS").0 == Some(vec!["start".into(), "help".into()])
                && discord_names(&dc) == Some(vec!["start".into(), "help".into()]))
            .then_some(())
        },
    )
    .await;

    // `bots update --commands` with `[]` removes them (the worker restarts the bot on it).
    for id in ["tg", "dc"] {
        let o = botfleet(&[
            "bots",
            "update",
            id,
            "--commands",
            &none,
            "--database-url",
            &db,
        ]);
        assert!(o.status.success(), "{id}: {:?}", text(&o));
    }
    assert!(!list_json(&db).0.contains("\"commands\""), "removed");
    wait_for(
        "the commands removed on both platforms",
        Duration::from_secs(20),
        || async {
            (tg.state()
                .my_commands("901:CMDS")
                .0
                .unwrap_or_default()
                .is_empty()
                && discord_names(&dc).is_some_and(|n| n.is_empty()))
            .then_some(())
        },
    )
    .await;
    // And a broken file on `update` changes nothing.
    let o = botfleet(&[
        "bots",
        "update",
        "tg",
        "--commands",
        &broken,
        "--database-url",
        &db,
    ]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
}

/// The flags of `bots add` and `bots update` that no other test runs, through the binary:
/// each lands in the registry as given (secrets only as "set", never their values).
#[test]
fn bots_add_and_update_take_their_remaining_flags() {
    let dir = tempdir();
    let db = db(&dir);
    let bot = |id: &str| listed(&db).into_iter().find(|b| b["id"] == id).unwrap();
    let o = bots_add(
        &db,
        "sl",
        "slack",
        "xoxb-flags",
        &[
            "--app-token",
            "xapp-FIRST-SECRET",
            "--handler",
            "webhook",
            "--webhook-url",
            "http://127.0.0.1:9/hook",
            "--webhook-secret",
            "HOOK-SECRET-1",
            "--disabled",
            "--handler-timeout-s",
            "30",
            "--async-reply-ttl-s",
            "120",
        ],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    let b = bot("sl");
    assert_eq!(b["has_app_token"], true, "{b}");
    assert_eq!(b["enabled"], false, "{b}");
    assert_eq!(b["handler_timeout_s"], 30, "{b}");
    assert_eq!(b["async_reply_ttl_s"], 120, "{b}");
    let shown = list_json(&db).0;
    assert!(
        !shown.contains("FIRST-SECRET") && !shown.contains("HOOK-SECRET"),
        "{shown}"
    );
    let o = botfleet(&[
        "bots",
        "update",
        "sl",
        "--app-token",
        "xapp-SECOND-SECRET",
        "--webhook-secret",
        "HOOK-SECRET-2",
        "--handler-timeout-s",
        "60",
        "--async-reply-ttl-s",
        "86400",
        "--database-url",
        &db,
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(bot("sl")["handler_timeout_s"], 60);
    assert_eq!(bot("sl")["async_reply_ttl_s"], 86_400);
    // Typing, on a platform that has it.
    let o = bots_add(&db, "tg", "telegram", "1:flags", &["--typing", "false"]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(bot("tg")["typing"], false);
    let o = botfleet(&[
        "bots",
        "update",
        "tg",
        "--typing",
        "true",
        "--database-url",
        &db,
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(bot("tg")["typing"], true);
    // Streamed answers: natively where the platform can, unless the bot asks for edits.
    assert_eq!(bot("sl")["stream"], "native");
    let o = botfleet(&[
        "bots",
        "update",
        "sl",
        "--stream",
        "edits",
        "--database-url",
        &db,
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(bot("sl")["stream"], "edits");
    // The bot's own send limits: its platform's scopes only; "" goes back to the workers'.
    let o = bots_add(
        &db,
        "own",
        "telegram",
        "2:flags",
        &["--rate-limits", "bot=100/1,group=off"],
    );
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(bot("own")["rate_limits"], "bot=100/1,group=off");
    let o = botfleet(&[
        "bots",
        "update",
        "own",
        "--rate-limits",
        "channel=1/1",
        "--database-url",
        &db,
    ]);
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert!(
        text(&o)
            .1
            .contains("telegram has no send limit `channel` (it has: chat, group, bot)"),
        "{:?}",
        text(&o)
    );
    assert_eq!(bot("own")["rate_limits"], "bot=100/1,group=off");
    let o = botfleet(&[
        "bots",
        "update",
        "own",
        "--rate-limits",
        "",
        "--database-url",
        &db,
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert!(bot("own").get("rate_limits").is_none(), "{}", bot("own"));
    // Out of range and malformed values are usage errors that change nothing.
    for bad in [
        ["--handler-timeout-s", "0"],
        ["--handler-timeout-s", "901"],
        ["--async-reply-ttl-s", "9"],
        ["--async-reply-ttl-s", "86401"],
        ["--typing", "maybe"],
        ["--stream", "chunks"],
    ] {
        let o = botfleet(&[
            "bots",
            "update",
            "sl",
            bad[0],
            bad[1],
            "--database-url",
            &db,
        ]);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {:?}", text(&o));
    }
    assert_eq!(bot("sl")["handler_timeout_s"], 60);
    assert_eq!(bot("sl")["stream"], "edits");
}

/// The worker's tuning flags no other test runs, through the binary: a worker given all of
/// them starts and serves; a value that is not a number, for any of them, is a usage error
/// naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_takes_its_tuning_flags() {
    let dir = tempdir();
    let db = db(&dir);
    let tuning: [(&str, &str); 15] = [
        ("--capacity", "500"),
        ("--telegram-connect-rate", "50"),
        ("--slack-connect-rate", "5"),
        ("--discord-connect-rate", "5"),
        ("--handler-timeout-s", "60"),
        ("--async-reply-ttl-s", "30"),
        ("--handler-retry-s", "30"),
        ("--turn-slots", "64"),
        ("--file-link-ttl-s", "600"),
        ("--turn-wait-ms", "5000"),
        ("--transport-down-ms", "0"),
        ("--discord-shard-recount-s", "600"),
        ("--metrics-top-bots", "5"),
        ("--worker-threads", "2"),
        ("--rate-limits", "whatsapp.number=250/1,telegram=off"),
    ];
    let args: Vec<&str> = tuning.iter().flat_map(|(f, v)| [*f, *v]).collect();
    let w = start_worker_with(&db, &args);
    let health = reqwest::get(format!("{}/healthz", w.url)).await.unwrap();
    assert_eq!(health.status(), 200);
    for (flag, _) in tuning {
        let o = botfleet(&["worker", flag, "x", "--database-url", &db]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(flag), "{flag}: {err}");
    }
    // A held turn lives 10 s to 24 h.
    for bad in ["9", "86401"] {
        let o = botfleet(&["worker", "--async-reply-ttl-s", bad, "--database-url", &db]);
        let (_, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--async-reply-ttl-s"), "{bad}: {err}");
    }
    // A send limit the platform does not have is named with the ones it has.
    let o = botfleet(&[
        "worker",
        "--rate-limits",
        "telegram.nope=1/1",
        "--database-url",
        &db,
    ]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--rate-limits") && err.contains("it has: chat, group, bot"),
        "{err}"
    );
}

/// One HTTP/1.0 exchange with `addr`: the whole answer.
fn http_10(addr: &str, request: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut conn, request.as_bytes()).unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut conn, &mut answer).unwrap();
    answer
}

/// A registry (on a fresh SQLite file) with one Telegram bot, `good`, of `token` on a fake
/// Telegram that knows it.
async fn one_telegram_bot(token: &str) -> (FakeTelegram, Dir, String) {
    let fake = FakeTelegram::start().await.unwrap();
    let dir = tempdir();
    let db = db(&dir);
    fake.state().add_bot(token);
    let o = bots_add(&db, "good", "telegram", token, &["--api-url", &fake.url()]);
    assert!(o.status.success(), "{:?}", text(&o));
    (fake, dir, db)
}

/// Waits (30 s at most) until `token`'s bot polled the fake.
async fn polled(fake: &FakeTelegram, token: &str, what: &str) {
    wait_for(what, Duration::from_secs(30), || {
        let polled = fake.state().polls(token) > 0;
        async move { polled.then_some(()) }
    })
    .await;
}

/// `--redis-min-replicas`: a worker whose Redis has fewer replicas than it asks for acts on no
/// grant — its bot is not polled — and its log says why (once, not once per try); the same
/// Redis with `--redis-min-replicas 0` (one Redis's default) runs the bot. Values out of range
/// and the flag without a Redis are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_acts_on_no_grant_its_replicas_lack() {
    let redis = botfleet_testkit::RedisServer::start().unwrap();
    let (fake, _dir, db) = one_telegram_bot("777:GOOD").await;
    let url = redis.url();
    let spawn = |replicas: &str| {
        spawn_worker(
            &db,
            &["--redis-url", &url, "--redis-min-replicas", replicas],
        )
    };
    let mut child = spawn("1");
    let said = first_line(&mut child, "too few replicas");
    let w = Worker {
        child,
        url: String::new(),
    };
    let said = said.expect("the worker says its grants lack replicas");
    assert!(said.contains("--redis-min-replicas"), "{said}");
    assert!(!said.contains("GOOD"), "a token in the log: {said}");
    // The claim was written but not acted on: the bot was never polled.
    assert_eq!(fake.state().polls("777:GOOD"), 0);
    drop(w);
    let _w = Worker {
        child: spawn("0"),
        url: String::new(),
    };
    polled(
        &fake,
        "777:GOOD",
        "the bot polled with no replica asked for",
    )
    .await;

    a_redis_flag_is_checked(&db, "--redis-min-replicas", &["x", "17", "1.5"], "1");
}

/// `--coord-groups` (`BOTFLEET_COORD_GROUPS`): a worker splitting its Redis keys into 8
/// coordination groups runs its bot; one started beside it with 4 (from the environment) does
/// not start, and says why, naming both numbers; values out of range and the flag without a
/// Redis are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_of_another_number_of_groups_does_not_start() {
    let redis = botfleet_testkit::RedisServer::start().unwrap();
    let (fake, _dir, db) = one_telegram_bot("778:GOOD").await;
    let url = redis.url();
    let _w = Worker {
        child: spawn_worker(&db, &["--redis-url", &url, "--coord-groups", "8"]),
        url: String::new(),
    };
    polled(
        &fake,
        "778:GOOD",
        "the bot polled by the worker with 8 groups",
    )
    .await;

    let mut other = spawn_worker_env(
        &db,
        &["--redis-url", &url],
        &[("BOTFLEET_COORD_GROUPS", "4")],
    );
    let status = wait_for(
        "the worker with 4 groups exits",
        Duration::from_secs(30),
        || {
            let exited = other.try_wait().unwrap();
            async move { exited }
        },
    )
    .await;
    let mut said = String::new();
    std::io::Read::read_to_string(&mut other.stderr.take().unwrap(), &mut said).unwrap();
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(
        said.contains("into 4 group(s) (--coord-groups) but the fleet's live workers use 8"),
        "{said}"
    );
    // It never joined: still one worker in the fleet.
    let o = botfleet(&[
        "fleet",
        "status",
        "--json",
        "--redis-url",
        &url,
        "--database-url",
        &db,
    ]);
    assert!(o.status.success(), "{:?}", text(&o));
    let doc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(doc["workers"].as_array().map(Vec::len), Some(1), "{doc}");

    a_redis_flag_is_checked(&db, "--coord-groups", &["0", "1025", "x"], "8");
}

/// A worker refuses each of `bad` values of the Redis `flag` (usage, exit 2, naming it), and
/// a `good` one without `--redis-url` (exit 1: the flag needs it).
fn a_redis_flag_is_checked(db: &str, flag: &str, bad: &[&str], good: &str) {
    for bad in bad {
        let o = botfleet(&["worker", flag, bad, "--database-url", db]);
        assert_eq!(o.status.code(), Some(2), "{bad}: {:?}", text(&o));
        assert!(text(&o).1.contains(flag), "{bad}: {:?}", text(&o));
    }
    let o = botfleet(&[
        "worker",
        flag,
        good,
        "--database-url",
        db,
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert!(
        text(&o).1.contains(&format!("{flag} needs --redis-url")),
        "{:?}",
        text(&o)
    );
}

/// Coordination groups through the binary: a worker on Redis with 8 groups; one group's keys
/// deleted (its data lost) puts that group, and only that one, in a grace window (a lease:
/// 30 s, long enough to be read on a busy machine), which
/// `fleet status` (no `--coord-groups`: it reads the fleet's number from the roster), as JSON
/// and as text, and the worker's `botfleet_grace_window_seconds{group}` show.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_that_lost_its_data_is_shown_in_its_grace_window() {
    let redis = botfleet_testkit::RedisServer::start().unwrap();
    let (fake, _dir, db) = one_telegram_bot("779:GOOD").await;
    let url = redis.url();
    let w = start_worker_with(
        &db,
        &[
            "--redis-url",
            &url,
            "--coord-groups",
            "8",
            "--lease-ms",
            "30000",
        ],
    );
    polled(&fake, "779:GOOD", "the bot polled").await;
    let deleted = redis.delete_keys("{botfleet:g3}:*").unwrap();
    assert!(deleted > 0, "the group had keys");
    let status = |json: bool| {
        let mut args = vec![
            "fleet",
            "status",
            "--redis-url",
            &url,
            "--database-url",
            &db,
        ];
        if json {
            args.push("--json");
        }
        let o = botfleet(&args);
        assert!(o.status.success(), "{:?}", text(&o));
        o
    };
    // The worker finds its liveness in g3 gone at its next renewal and joins g3 again.
    let doc = wait_for("g3 in its grace window", Duration::from_secs(45), || {
        let doc: serde_json::Value = serde_json::from_slice(&status(true).stdout).unwrap();
        let waiting = doc["groups_in_grace"]
            .as_array()
            .is_some_and(|g| !g.is_empty());
        async move { waiting.then_some(doc) }
    })
    .await;
    assert_eq!(doc["groups"], 8, "{doc}");
    let waiting = doc["groups_in_grace"].as_array().unwrap();
    assert_eq!(waiting.len(), 1, "{doc}");
    assert_eq!(waiting[0]["group"], "g3", "{doc}");
    let left = waiting[0]["grace_window_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 30_000, "{doc}");
    assert_eq!(doc["grace_window_ms"].as_u64(), Some(left), "{doc}");
    let said = text(&status(false)).0;
    assert!(
        said.contains("in 1 of 8 coordination groups: g3 ("),
        "{said}"
    );

    let http = reqwest::Client::new();
    let metrics = wait_for(
        "the group's grace in the metrics",
        Duration::from_secs(10),
        || {
            let (http, url) = (http.clone(), w.url.clone());
            async move {
                let text = http
                    .get(format!("{url}/metrics"))
                    .send()
                    .await
                    .ok()?
                    .text()
                    .await
                    .ok()?;
                text.contains("group=\"g3\"").then_some(text)
            }
        },
    )
    .await;
    let grace: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("botfleet_grace_window_seconds{"))
        .collect();
    assert_eq!(grace.len(), 2, "the fleet's and g3's: {grace:?}");
    assert!(
        grace.iter().any(|l| l.contains(",group=\"g3\"} ")),
        "{grace:?}"
    );
}
