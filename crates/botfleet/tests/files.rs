//! File links through the binary: `botfleet worker` with an API token serves
//! `/api/v1/files/{id}` without one (the signature is the permission), on the URL
//! `--api-public-url` names, with the bytes a user sent; a forged link is 403.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{process::Command, time::Duration};

use botfleet_testkit::{nonce, wait_for, FakeTelegram, Proc, ScriptedHandler};
use serde_json::{json, Value};

const TOKEN: &str = "7100:files-SECRET";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_photo_link_is_served_without_an_api_token_on_the_public_url() {
    let dir = std::env::temp_dir().join(format!("botfleet-files-{}", nonce()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = format!("sqlite://{}", dir.join("bots.db").display());
    let token_file = dir.join("api-token");
    std::fs::write(&token_file, "files-api-token-0123456789abcdef").unwrap();
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let handler = ScriptedHandler::start(|ev: &Value| {
        json!({"text": format!("{} files", ev["attachments"].as_array().map_or(0, Vec::len))})
    })
    .await;
    let bin = env!("CARGO_BIN_EXE_botfleet");
    let add = Command::new(bin)
        .args([
            "bots",
            "add",
            "pics",
            "--platform",
            "telegram",
            "--database-url",
            &db,
        ])
        .args([
            "--api-url",
            &fake.url(),
            "--handler",
            "webhook",
            "--webhook-url",
        ])
        .arg(handler.url())
        .env("BOTFLEET_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        add.status.success(),
        "{}",
        String::from_utf8_lossy(&add.stderr)
    );
    // The public URL names this worker's API by another host name than the bound address.
    let port = botfleet_testkit::free_port().unwrap();
    let public = format!("http://localhost:{port}");
    let mut cmd = Command::new(bin);
    cmd.args(["worker", "--database-url", &db, "--poll-timeout-s", "1"])
        .args([
            "--http-addr",
            &format!("127.0.0.1:{port}"),
            "--hooks-addr",
            "127.0.0.1:0",
        ])
        .args(["--api-public-url", &public])
        .arg("--api-token-file")
        .arg(&token_file)
        .env_remove("BOTFLEET_API_TOKEN")
        .env("RUST_LOG", "warn");
    let worker = Proc::spawn("worker", &mut cmd, &dir);
    let tg = fake.state();
    wait_for("polling", Duration::from_secs(30), || async {
        tg.is_polling(TOKEN).then_some(())
    })
    .await;
    let photo: Vec<u8> = (0..50_000u32).map(|i| (i % 251) as u8).collect();
    tg.user_sends_file(TOKEN, 5, "photo", photo.clone(), None, None, Some("hi"));
    wait_for("answered", Duration::from_secs(30), || async {
        tg.sent().iter().any(|s| s.text == "1 files").then_some(())
    })
    .await;
    let seen = handler.seen();
    assert!(!seen.is_empty(), "{}", worker.log_tail());
    let url = seen[0]["attachments"][0]["url"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(url.starts_with(&format!("{public}/api/v1/files/")), "{url}");
    let http = reqwest::Client::new();
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "no API token needed");
    assert_eq!(r.headers()["content-type"], "image/jpeg");
    assert!(r.bytes().await.unwrap().to_vec() == photo);
    let r = http.get(format!("{url}0")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["code"], "bad_signature");
    // The rest of the API still wants its token.
    let r = http
        .get(format!("{public}/api/v1/bots"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    drop(worker);
    let _ = std::fs::remove_dir_all(&dir);
}
