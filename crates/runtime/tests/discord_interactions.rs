//! Discord interactions and the platform's 3 s deadline: a handler slower than that still
//! answers its command (the fleet defers, then edits the original response) and its button
//! press (deferred, then a follow-up); a command nobody answers leaves nothing behind; the
//! interaction's token never reaches the handler.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform};
use botfleet_discord::fake::FakeDiscord;
use botfleet_testkit::{connector_suite::Harness, wait_for, ScriptedHandler};
use serde_json::{json, Value};

const TOKEN: &str = "DISCORD.interactions.SECRET";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handlers_meet_the_interaction_deadline() {
    let fake = FakeDiscord::start().await.unwrap();
    fake.state().add_bot(TOKEN, 1, 1);
    // Slow on purpose: past Discord's 3 s for every interaction but `quiet`.
    let handler = ScriptedHandler::start(|ev: &Value| {
        match (ev["kind"].as_str(), ev["command"]["name"].as_str()) {
            (Some("command"), Some("menu")) => {
                json!({"_delay_ms": 3_500, "actions": [
                    {"type": "answer", "text": "here is the menu"},
                    {"type": "send", "text": "Pick", "ref": "m",
                     "buttons": [[{"text": "A", "value": "a"}, {"text": "B", "value": "b"}]]},
                ]})
            }
            (Some("command"), Some("quiet")) => json!({}),
            (Some("action"), _) => {
                json!({"_delay_ms": 3_500, "actions": [{"type": "answer", "text": format!("you chose {}", ev["action"]["value"].as_str().unwrap_or("")), "ephemeral": true}]})
            }
            _ => json!({}),
        }
    })
    .await;
    let mut spec = BotSpec::new(BotId::new("int").unwrap(), Platform::Discord, TOKEN);
    spec.options.api_url = Some(fake.url());
    spec.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let w = h.start("a");
    let state = fake.state();
    wait_for("connected", Duration::from_secs(20), || async {
        (state.connected_shards(TOKEN) == 1).then_some(())
    })
    .await;
    let cmd = state.user_runs_command(TOKEN, 7, "menu", json!([]));
    let done = wait_for("the command answered", Duration::from_secs(20), || async {
        state.interaction_of(&cmd).filter(|i| !i.answers.is_empty())
    })
    .await;
    assert_eq!(done.callbacks.len(), 1, "{:?}", done.callbacks);
    let (kind, after) = done.callbacks[0];
    assert_eq!(kind, 5, "deferred: Discord shows the bot thinking");
    assert!(
        after < Duration::from_secs(3),
        "within the deadline: {after:?}"
    );
    assert_eq!(done.answers[0].how, "original", "{:?}", done.answers);
    assert_eq!(done.answers[0].text, "here is the menu");
    let menu = wait_for("the menu", Duration::from_secs(20), || async {
        state
            .sent_by(TOKEN)
            .into_iter()
            .find(|p| p.content == "Pick")
    })
    .await;
    assert_eq!(state.message(TOKEN, &menu.id).unwrap().buttons, ["a", "b"]);
    let press = state.user_presses(TOKEN, 7, &menu.id, "b").unwrap();
    let pressed = wait_for("the press answered", Duration::from_secs(20), || async {
        state
            .interaction_of(&press)
            .filter(|i| !i.answers.is_empty())
    })
    .await;
    assert_eq!(pressed.callbacks.len(), 1);
    assert_eq!(
        pressed.callbacks[0].0, 6,
        "deferred without a visible change"
    );
    assert!(pressed.callbacks[0].1 < Duration::from_secs(3));
    let a = &pressed.answers[0];
    assert_eq!(
        (a.how, a.text.as_str(), a.ephemeral),
        ("followup", "you chose b", true)
    );
    // Nobody answers: acknowledged, and its "thinking…" removed.
    let quiet = state.user_runs_command(TOKEN, 7, "quiet", json!([]));
    let q = wait_for(
        "the quiet command settled",
        Duration::from_secs(20),
        || async { state.interaction_of(&quiet).filter(|i| i.original_deleted) },
    )
    .await;
    assert_eq!(q.callbacks.len(), 1);
    assert!(q.answers.is_empty());
    for ev in handler.seen() {
        let shown = ev.to_string();
        assert!(
            !shown.contains("itok-"),
            "an interaction token reached the handler: {shown}"
        );
    }
    assert!(h
        .store()
        .inbox_pending(&spec.id, 10)
        .await
        .unwrap()
        .is_empty());
    w.shutdown().await;
}
