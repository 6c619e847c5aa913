//! `botfleet send`: a message to a chat that no inbound message started (a person answering
//! from a desk, a finished job), through a worker's control API (`POST
//! /api/v1/bots/{id}/messages`). It goes out once, in the chat's turn, whichever worker takes
//! it.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};

use crate::common::Remote;

/// Where the control API is when neither `--api-url` nor `BOTFLEET_API_URL` says (a worker's
/// default `--http-addr`).
pub(crate) const DEFAULT_API: &str = "http://127.0.0.1:8080";

/// How long `--wait` waits for the send to be sent or to fail.
const WAIT: Duration = Duration::from_secs(60);

/// Send a message to a chat of a bot, through a worker's control API.
#[derive(Debug, Args)]
pub(crate) struct SendArgs {
    /// The bot's id.
    bot: String,
    /// The chat, as the platform names it (a Telegram chat id, a Slack channel `C…`, a
    /// Discord channel id, a WhatsApp number).
    chat: String,
    /// The text to send (may be left out with --actions).
    text: Option<String>,
    /// A JSON file of actions of the handler contract (`send` with buttons and files, `edit`
    /// and `delete` by `ref`, `typing`, `template` on WhatsApp Cloud), done after the text;
    /// `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    actions: Option<PathBuf>,
    /// The send's key: give the same one to every retry of one send, and it goes out once
    /// (default: a fresh one).
    #[arg(long, value_name = "KEY")]
    idempotency_key: Option<String>,
    /// Wait (up to 60 s) until it is sent or has failed; print its platform ids or why.
    #[arg(long)]
    wait: bool,
    #[command(flatten)]
    remote: Remote,
}

/// Runs `botfleet send`: prints the send's id (and with `--wait` how it went); exit 1 when
/// it failed or was refused.
pub(crate) async fn run(a: SendArgs) -> anyhow::Result<ExitCode> {
    let mut remote = a.remote.clone();
    remote.url.get_or_insert_with(|| DEFAULT_API.to_owned());
    let api = remote.client()?.context("no control API URL")?;
    let mut body = json!({ "chat": a.chat });
    if let Some(t) = &a.text {
        body["text"] = Value::from(t.as_str());
    }
    if let Some(f) = &a.actions {
        let text = if f.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin())
                .context("reading the actions from standard input")?
        } else {
            std::fs::read_to_string(f)
                .with_context(|| format!("reading the actions file {} (--actions)", f.display()))?
        };
        let actions: Value = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "the actions file {} (--actions) is not JSON: {e} (line {}, column {})",
                f.display(),
                e.line(),
                e.column()
            )
        })?;
        if !actions.is_array() {
            anyhow::bail!(
                "the actions file {} (--actions) must hold a JSON array of actions",
                f.display()
            );
        }
        body["actions"] = actions;
    }
    if a.text.is_none() && a.actions.is_none() {
        anyhow::bail!("nothing to send: give a TEXT or --actions FILE");
    }
    let key = a.idempotency_key.clone().unwrap_or_else(fresh_key);
    let path = format!("/bots/{}/messages", a.bot);
    let sent = api
        .call_with(
            reqwest::Method::POST,
            &path,
            Some(body.to_string()),
            &[("idempotency-key", key.as_str())],
        )
        .await?;
    let id = sent["id"].as_str().unwrap_or_default().to_owned();
    println!("{id}");
    if !a.wait {
        return Ok(ExitCode::SUCCESS);
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let v = api
            .call(reqwest::Method::GET, &format!("{path}/{id}"), None)
            .await?;
        match v["status"].as_str() {
            Some("sent") => {
                let ids: Vec<&str> = v["platform_ids"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .collect();
                println!("sent: {}", ids.join(" "));
                return Ok(ExitCode::SUCCESS);
            }
            Some("failed") => {
                println!(
                    "failed: {}",
                    v["reason"].as_str().unwrap_or("no reason given")
                );
                return Ok(ExitCode::FAILURE);
            }
            _ if tokio::time::Instant::now() >= deadline => {
                println!(
                    "queued: not sent within {} s (it still goes out in its chat's turn)",
                    WAIT.as_secs()
                );
                return Ok(ExitCode::FAILURE);
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A key no other send has: the time in ns and this process.
fn fresh_key() -> String {
    let ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("cli-{ns}-{}", std::process::id())
}
