//! A support bot written as a Rust handler ([`BotHandler`]): `/start` answers with two
//! buttons, a press edits that message (and answers the press so the client stops waiting),
//! a photo or a file is read through the fleet and answered with its size, anything else is
//! acknowledged; a counter of the chat's visits lives in the chat's `state`.
//! Every action goes through the fleet's turn pipeline, fenced and once, on whatever worker
//! holds the chat.

use async_trait::async_trait;
use botfleet_core::{Button, EventKind, Inbound};
use botfleet_runtime::{BotHandler, HandlerError, TurnContext};

/// The name bots give with `--handler support`.
pub const NAME: &str = "support";

/// The handler.
#[derive(Debug, Default)]
pub struct SupportBot;

#[async_trait]
impl BotHandler for SupportBot {
    async fn handle(&self, event: &Inbound, cx: &mut TurnContext) -> Result<(), HandlerError> {
        let visits = cx.state().and_then(|s| s["visits"].as_u64()).unwrap_or(0) + 1;
        cx.set_state(&serde_json::json!({ "visits": visits }));
        match event.kind {
            EventKind::Command if event.command.as_ref().is_some_and(|c| c.name == "start") => {
                let buttons = vec![vec![
                    Button {
                        text: "Billing".into(),
                        value: Some("billing".into()),
                        url: None,
                    },
                    Button {
                        text: "Technical".into(),
                        value: Some("technical".into()),
                        url: None,
                    },
                ]];
                if cx.caps().typing {
                    cx.typing();
                }
                cx.send("How can we help?", buttons, Some("menu"));
            }
            EventKind::Action => {
                let picked = event
                    .action
                    .as_ref()
                    .map_or("?", |a| a.value.as_str())
                    .to_owned();
                if cx.caps().answer {
                    cx.answer(format!("Noted: {picked}"));
                }
                if cx.caps().edit {
                    cx.edit(
                        "menu",
                        format!("You chose {picked}. An agent will write here (visit {visits})."),
                        Vec::new(),
                    );
                } else {
                    cx.reply(format!("You chose {picked} (visit {visits})."));
                }
            }
            _ if !event.attachments.is_empty() => {
                let mut sizes = Vec::new();
                for a in &event.attachments {
                    // The bytes come through the fleet: the handler holds no platform token.
                    let bytes = cx.file(a).await?;
                    sizes.push(format!("{} bytes of {}", bytes.len(), a.kind.as_str()));
                }
                cx.reply(format!("Thanks for {} (visit {visits}).", sizes.join(", ")));
            }
            _ if !event.text.is_empty() => {
                cx.reply(format!(
                    "Got it (visit {visits}). Send /start for the menu."
                ));
            }
            _ => {}
        }
        Ok(())
    }
}
