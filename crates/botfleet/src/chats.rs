//! `botfleet chats`: a chat handed to a person and given back, through a worker's control API
//! (`POST /api/v1/bots/{id}/chats/{chat}/pause|resume`,
//! `GET /api/v1/bots/{id}/chats?paused=true`, `GET /api/v1/bots/{id}/chats/{chat}/events`).
//! While a chat is paused its bot's handler is not called for it on any worker; what its users
//! write is recorded; `botfleet send` answers; `botfleet chats tail` shows the conversation.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{json, Value};

use crate::{bots::path_segment, common::Remote, send::DEFAULT_API};

/// The longest timed pause `--for-s` takes: a year.
const MAX_FOR_S: u64 = 365 * 24 * 3_600;

/// Hand a chat to a person and give it back.
#[derive(Debug, Subcommand)]
pub(crate) enum ChatsCommand {
    /// Pause a chat: its bot's handler is not called for it, on any worker, until it is
    /// resumed (or `--for-s` passes); what its users write is recorded, and `botfleet send`
    /// answers them.
    Pause(PauseArgs),
    /// Give a paused chat back to its bot.
    Resume(ResumeArgs),
    /// The bot's paused chats, one a line: chat, until (or `-`), since, reason.
    List(ListArgs),
    /// A chat's conversation, one item a line (cursor, time, type, state, what): what its
    /// users sent, the sends from the backend and what the bot did; then what comes, as it
    /// comes, until interrupted (unless `--no-follow`).
    Tail(TailArgs),
}

/// `botfleet chats tail`.
#[derive(Debug, Args)]
pub(crate) struct TailArgs {
    /// The bot's id.
    bot: String,
    /// The chat, as the platform names it.
    chat: String,
    /// Only what came after this cursor (the first column of an earlier line; default: all
    /// that is kept).
    #[arg(long, value_name = "CURSOR", default_value_t = 0)]
    after: u64,
    /// Print what there is and exit, instead of following the chat.
    #[arg(long)]
    no_follow: bool,
    /// One JSON object a line (as the API gives each item) instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

/// How often `chats tail` asks for what came.
const TAIL_LOOK: std::time::Duration = std::time::Duration::from_millis(500);

/// How `chats tail` shows an item: what was written, sent or done, on one line.
fn what(item: &Value) -> String {
    let d = &item["data"];
    let text = |v: &Value| -> String {
        v.as_str()
            .unwrap_or_default()
            .replace(['\n', '\r'], " ")
            .chars()
            .take(200)
            .collect()
    };
    match item["type"].as_str().unwrap_or_default() {
        "said" => {
            let kind = d["type"].as_str().unwrap_or("?");
            match d.get("text").filter(|t| t.is_string()) {
                Some(t) => format!("[{kind}] {}", text(t)),
                None => format!("[{kind}]"),
            }
        }
        "send" => match d.get("text").filter(|t| t.is_string()) {
            Some(t) => text(t),
            None => format!(
                "[{} action(s)]",
                d["actions"].as_array().map_or(0, Vec::len)
            ),
        },
        _ => {
            if let Some(v) = d["action"]["value"].as_str() {
                format!("[press] {}", text(&Value::from(v)))
            } else {
                text(&d["text"])
            }
        }
    }
}

/// Prints the items of a read of a chat's log; answers the cursor to read on from.
///
/// # Errors
/// Standard output is gone (a pipe closed: `chats tail | head`).
fn print_items(v: &Value, json: bool, after: u64) -> std::io::Result<u64> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for item in v["events"].as_array().into_iter().flatten() {
        if json {
            writeln!(out, "{item}")?;
        } else {
            writeln!(
                out,
                "{:<8} {:<20} {:<8} {:<13} {}",
                item["cursor"].to_string(),
                shown(&item["at_ms"]),
                item["type"].as_str().unwrap_or_default(),
                item["state"].as_str().unwrap_or("-"),
                what(item)
            )?;
        }
    }
    out.flush()?;
    Ok(v["cursor"].as_u64().unwrap_or(after))
}

/// `botfleet chats pause`.
#[derive(Debug, Args)]
pub(crate) struct PauseArgs {
    /// The bot's id.
    bot: String,
    /// The chat, as the platform names it.
    chat: String,
    /// End the pause by itself after this many seconds (1 to a year; default: when resumed).
    #[arg(long, value_name = "S", value_parser = clap::value_parser!(u64).range(1..=MAX_FOR_S))]
    for_s: Option<u64>,
    /// Why, for people (one line, at most 500 bytes).
    #[arg(long, value_name = "TEXT")]
    reason: Option<String>,
    #[command(flatten)]
    remote: Remote,
}

/// `botfleet chats resume`.
#[derive(Debug, Args)]
pub(crate) struct ResumeArgs {
    /// The bot's id.
    bot: String,
    /// The chat, as the platform names it.
    chat: String,
    /// Hand what its users wrote during the pause to the handler, in order (default: the
    /// person answered it).
    #[arg(long)]
    replay: bool,
    #[command(flatten)]
    remote: Remote,
}

/// `botfleet chats list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// The bot's id.
    bot: String,
    /// One JSON object a line instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    remote: Remote,
}

/// The API client of `remote` (a worker's default address when none is given).
fn client(remote: &Remote) -> anyhow::Result<crate::common::ApiClient> {
    let mut remote = remote.clone();
    remote.url.get_or_insert_with(|| DEFAULT_API.to_owned());
    remote.client()?.context("no control API URL")
}

/// A time in unix ms as people read it (`2026-12-06T19:33:44Z`), `-` for none.
fn shown(ms: &Value) -> String {
    ms.as_i64().map_or_else(|| "-".to_owned(), utc)
}

/// Unix ms as a UTC date and time to the second.
fn utc(ms: i64) -> String {
    let (y, m, d, h, mi, s, _) = botfleet_core::utc_of_unix_ms(ms);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// Runs `botfleet chats`.
pub(crate) async fn run(c: ChatsCommand) -> anyhow::Result<ExitCode> {
    match c {
        ChatsCommand::Pause(a) => {
            let api = client(&a.remote)?;
            let mut body = json!({});
            if let Some(s) = a.for_s {
                body["until_ms"] = Value::from(botfleet_core::unix_ms() + (s * 1_000) as i64);
            }
            if let Some(r) = &a.reason {
                body["reason"] = Value::from(r.as_str());
            }
            let path = format!(
                "/bots/{}/chats/{}/pause",
                path_segment(&a.bot),
                path_segment(&a.chat)
            );
            let v = api
                .call(Method::POST, &path, Some(body.to_string()))
                .await?;
            println!(
                "paused {} {} until {}",
                a.bot,
                a.chat,
                if v["until_ms"].is_null() {
                    "resumed".to_owned()
                } else {
                    shown(&v["until_ms"])
                }
            );
        }
        ChatsCommand::Resume(a) => {
            let api = client(&a.remote)?;
            let path = format!(
                "/bots/{}/chats/{}/resume",
                path_segment(&a.bot),
                path_segment(&a.chat)
            );
            let body = json!({ "replay": a.replay }).to_string();
            let v = api.call(Method::POST, &path, Some(body)).await?;
            if v["was_paused"] == Value::Bool(false) {
                println!("{} {} was not paused", a.bot, a.chat);
            } else {
                println!(
                    "resumed {} {}: {} message(s) replayed",
                    a.bot, a.chat, v["replayed"]
                );
            }
        }
        ChatsCommand::List(a) => {
            let api = client(&a.remote)?;
            let path = format!("/bots/{}/chats?paused=true", path_segment(&a.bot));
            let v = api.call(Method::GET, &path, None).await?;
            let chats = v["chats"].as_array().cloned().unwrap_or_default();
            if a.json {
                for c in chats {
                    println!("{c}");
                }
            } else {
                println!("{:<24} {:<20} {:<20} REASON", "CHAT", "UNTIL", "SINCE");
                for c in chats {
                    println!(
                        "{:<24} {:<20} {:<20} {}",
                        c["chat"].as_str().unwrap_or_default(),
                        shown(&c["until_ms"]),
                        shown(&c["paused_at_ms"]),
                        c["reason"].as_str().unwrap_or(""),
                    );
                }
            }
        }
        ChatsCommand::Tail(a) => {
            let api = client(&a.remote)?;
            let path = format!(
                "/bots/{}/chats/{}/events",
                path_segment(&a.bot),
                path_segment(&a.chat)
            );
            let mut after = a.after;
            let (mut read_once, mut failing) = (false, false);
            loop {
                let read = api
                    .call(
                        Method::GET,
                        &format!("{path}?after={after}&limit=1000"),
                        None,
                    )
                    .await;
                match read {
                    Ok(v) => {
                        (read_once, failing) = (true, false);
                        let Ok(next) = print_items(&v, a.json, after) else {
                            // Whoever read it stopped reading.
                            break;
                        };
                        let full =
                            next != after && v["events"].as_array().map_or(0, Vec::len) >= 1000;
                        after = next;
                        if full {
                            continue;
                        }
                        if a.no_follow {
                            break;
                        }
                    }
                    // Once read, a worker that goes away is asked again (from where it was).
                    Err(e) if a.no_follow || !read_once => return Err(e),
                    Err(e) => {
                        if !failing {
                            eprintln!("{e:#}; trying again");
                        }
                        failing = true;
                    }
                }
                tokio::time::sleep(TAIL_LOOK).await;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::utc;

    #[test]
    fn times_show_as_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_585_879_999), "2026-12-06T19:37:59Z");
    }
}
