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

/// A Discord bot `id` of `token` on `fake`, answered by `handler`.
fn bot(id: &str, token: &str, fake: &FakeDiscord, handler: HandlerSpec) -> BotSpec {
    let mut spec = BotSpec::new(BotId::new(id).unwrap(), Platform::Discord, token);
    spec.options.api_url = Some(fake.url());
    spec.handler = handler;
    spec
}

fn webhook(handler: &ScriptedHandler) -> HandlerSpec {
    HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    }
}

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
    let spec = bot("int", TOKEN, &fake, webhook(&handler));
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
    let menu = menu_of(state, TOKEN).await;
    assert_eq!(state.message(TOKEN, &menu).unwrap().buttons, ["a", "b"]);
    let press = state.user_presses(TOKEN, 7, &menu, "b").unwrap();
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

const ANSWERS: &str = "DISCORD.answers.SECRET";
const ECHO: &str = "DISCORD.echo.SECRET";

/// The message id of the menu ("Pick", with buttons) the bot of `token` showed, once it is
/// there: an answer to an interaction (or a message in its channel).
async fn menu_of(state: &botfleet_discord::fake::FakeDiscordState, token: &str) -> String {
    wait_for("the menu", Duration::from_secs(20), || async {
        let answered = state
            .interactions(token)
            .into_iter()
            .flat_map(|i| i.answers)
            .find(|a| a.text == "Pick")
            .map(|a| a.id);
        answered.or_else(|| {
            state
                .sent_by(token)
                .into_iter()
                .find(|p| p.content == "Pick")
                .map(|p| p.id)
        })
    })
    .await
}

/// Checks that interaction `i` was acknowledged once, with callback `kind`, within
/// Discord's 3 s, and shows `want` (`(how, text, ephemeral)` each), in order.
fn answered_as(i: &botfleet_discord::fake::Interaction, kind: u64, want: &[(&str, &str, bool)]) {
    let callbacks: Vec<u64> = i.callbacks.iter().map(|c| c.0).collect();
    assert_eq!(callbacks, [kind], "acknowledged once: {i:?}");
    assert!(
        i.callbacks[0].1 < Duration::from_secs(3),
        "within Discord's 3 s of the interaction: {i:?}"
    );
    let shown: Vec<(&str, &str, bool)> = i
        .answers
        .iter()
        .map(|a| (a.how, a.text.as_str(), a.ephemeral))
        .collect();
    assert_eq!(shown, want, "{i:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_reply_is_the_interactions_answer_where_the_user_looks() {
    let fake = FakeDiscord::start().await.unwrap();
    let state = fake.state();
    state.add_bot(ANSWERS, 1, 1);
    state.add_bot(ECHO, 1, 1);
    // The commands' channels are ones the bots may not post in: every answer must go
    // through the interaction. The menu's channel (8) is open.
    for channel in [7, 9, 10, 11, 12, 13] {
        state.mute(ANSWERS, channel);
        state.mute(ECHO, channel);
    }
    let handler = ScriptedHandler::start(|ev: &Value| {
        let value = ev["action"]["value"].as_str().unwrap_or("");
        match (ev["kind"].as_str(), ev["command"]["name"].as_str()) {
            (Some("command"), Some("quick")) => json!({"text": "quick answer"}),
            (Some("command"), Some("slow")) => json!({"_delay_ms": 3_500, "text": "slow answer"}),
            (Some("command"), Some("secret")) => json!({"text": "only you", "ephemeral": true,
                "actions": [{"type": "send", "text": "and one more"}]}),
            (Some("command"), Some("slowsecret")) => {
                json!({"_delay_ms": 3_500, "text": "only you, later", "ephemeral": true})
            }
            (Some("command"), Some("menu")) => json!({"actions": [{"type": "send", "text": "Pick",
                "buttons": [[{"text": "A", "value": "a"}, {"text": "B", "value": "b"}]]}]}),
            (Some("command"), Some("pick")) => json!({"actions": [{"type": "send",
                "text": "Pick one", "buttons": [[{"text": "X", "value": "x"}]]}]}),
            (Some("action"), _) if value == "a" || value == "x" => {
                json!({"text": format!("you chose {value}")})
            }
            (Some("action"), _) => json!({"_delay_ms": 3_500, "actions": [
                {"type": "send", "text": "you chose b", "ephemeral": true}]}),
            _ => json!({}),
        }
    })
    .await;
    let answers = bot("answers", ANSWERS, &fake, webhook(&handler));
    // Echo keeps no state: its turns start from what the gateway just delivered.
    let echo = bot("echo", ECHO, &fake, HandlerSpec::Echo);
    let h = Harness::new(&[answers.clone(), echo.clone()]).await;
    let w = h.start("a");
    wait_for("connected", Duration::from_secs(20), || async {
        (state.connected_shards(ANSWERS) == 1 && state.connected_shards(ECHO) == 1).then_some(())
    })
    .await;
    // Each in a channel of its own, so the slow ones run side by side.
    let quick = state.user_runs_command(ANSWERS, 7, "quick", json!([]));
    let slow = state.user_runs_command(ANSWERS, 9, "slow", json!([]));
    let secret = state.user_runs_command(ANSWERS, 10, "secret", json!([]));
    let slow_secret = state.user_runs_command(ANSWERS, 11, "slowsecret", json!([]));
    let echoed = state.user_runs_command(ECHO, 12, "ping", json!([]));
    let menu = state.user_runs_command(ANSWERS, 8, "menu", json!([]));
    // Buttons on the answer itself, in a channel the bot may not post in; pressed there.
    let choose = state.user_runs_command(ANSWERS, 13, "pick", json!([]));
    let picked = wait_for("the buttons shown", Duration::from_secs(20), || async {
        state
            .interaction_of(&choose)
            .filter(|i| !i.answers.is_empty())
    })
    .await;
    assert_eq!(picked.answers[0].buttons, ["x"], "{picked:?}");
    let press_x = state
        .user_presses(ANSWERS, 13, &picked.answers[0].id, "x")
        .expect("a button of the answer");
    let pick = menu_of(state, ANSWERS).await;
    let press_a = state.user_presses(ANSWERS, 8, &pick, "a").unwrap();
    let press_b = state.user_presses(ANSWERS, 8, &pick, "b").unwrap();
    let expected = [
        (&quick, 1),
        (&slow, 1),
        (&secret, 2),
        (&slow_secret, 1),
        (&echoed, 1),
        (&press_a, 1),
        (&press_b, 1),
        (&choose, 1),
        (&press_x, 1),
        (&menu, 1),
    ];
    let store = h.store();
    wait_for(
        "every interaction answered",
        Duration::from_secs(30),
        || async {
            let answered = expected.iter().all(|(id, n)| {
                state
                    .interaction_of(id)
                    .is_some_and(|i| i.answers.len() >= *n)
            });
            let a = store.inbox_pending(&answers.id, 10).await.unwrap();
            let e = store.inbox_pending(&echo.id, 10).await.unwrap();
            (answered && a.is_empty() && e.is_empty()).then_some(())
        },
    )
    .await;
    let got = |id: &str| state.interaction_of(id).unwrap();
    // Answered in the callback itself, never deferred first.
    answered_as(&got(&quick), 4, &[("response", "quick answer", false)]);
    answered_as(&got(&echoed), 4, &[("response", "/ping", false)]);
    // Deferred in time, then the "thinking…" becomes the answer.
    answered_as(&got(&slow), 5, &[("original", "slow answer", false)]);
    assert!(!got(&slow).original_deleted);
    // Ephemeral in the callback; a second text follows up.
    answered_as(
        &got(&secret),
        4,
        &[
            ("response", "only you", true),
            ("followup", "and one more", false),
        ],
    );
    // Ephemeral after a public deferral: the "thinking…" goes, the text is the user's alone.
    answered_as(
        &got(&slow_secret),
        5,
        &[("followup", "only you, later", true)],
    );
    assert!(got(&slow_secret).original_deleted);
    // A press: answered in its callback, or after a deferral as a follow-up.
    answered_as(&got(&press_a), 4, &[("response", "you chose a", false)]);
    answered_as(&got(&press_b), 6, &[("followup", "you chose b", true)]);
    answered_as(&got(&choose), 4, &[("response", "Pick one", false)]);
    answered_as(&got(&press_x), 4, &[("response", "you chose x", false)]);
    // A menu answers its command too, buttons and all: nothing went to a channel.
    answered_as(&got(&menu), 4, &[("response", "Pick", false)]);
    assert!(state.sent_by(ANSWERS).is_empty() && state.sent_by(ECHO).is_empty());
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactions_queued_behind_a_slow_turn_are_acknowledged_from_their_arrival() {
    let fake = FakeDiscord::start().await.unwrap();
    let state = fake.state();
    state.add_bot(ANSWERS, 1, 1);
    let handler = ScriptedHandler::start(|ev: &Value| {
        let value = ev["action"]["value"].as_str().unwrap_or("");
        match (ev["kind"].as_str(), ev["command"]["name"].as_str()) {
            (Some("command"), Some("menu")) => json!({"actions": [{"type": "send", "text": "Pick",
                "buttons": [[{"text": "A", "value": "a"}, {"text": "B", "value": "b"}]]}]}),
            // Past Discord's 3 s for everything queued behind it in its channel.
            (Some("command"), Some("slow")) => json!({"_delay_ms": 5_000, "text": "slow answer"}),
            (Some("command"), Some("quick")) => json!({"text": "quick answer"}),
            (Some("action"), _) => {
                json!({"text": format!("you chose {value}"), "ephemeral": value == "b"})
            }
            _ => json!({}),
        }
    })
    .await;
    let spec = bot("queued", ANSWERS, &fake, webhook(&handler));
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let w = h.start("a");
    wait_for("connected", Duration::from_secs(20), || async {
        (state.connected_shards(ANSWERS) == 1).then_some(())
    })
    .await;
    state.user_runs_command(ANSWERS, 8, "menu", json!([]));
    let pick = menu_of(state, ANSWERS).await;
    // Everything after `/slow` in its channel waits for its turn, 5 s.
    let slow = state.user_runs_command(ANSWERS, 8, "slow", json!([]));
    let press_a = state.user_presses(ANSWERS, 8, &pick, "a").unwrap();
    let press_b = state.user_presses(ANSWERS, 8, &pick, "b").unwrap();
    let quick = state.user_runs_command(ANSWERS, 8, "quick", json!([]));
    let store = h.store();
    wait_for(
        "every interaction answered",
        Duration::from_secs(30),
        || async {
            let answered = [&slow, &press_a, &press_b, &quick].iter().all(|id| {
                state
                    .interaction_of(id)
                    .is_some_and(|i| !i.answers.is_empty())
            });
            let pending = store.inbox_pending(&spec.id, 10).await.unwrap();
            (answered && pending.is_empty()).then_some(())
        },
    )
    .await;
    for (id, kind, how, text, ephemeral) in [
        (&slow, 5, "original", "slow answer", false),
        (&press_a, 6, "followup", "you chose a", false),
        (&press_b, 6, "followup", "you chose b", true),
        (&quick, 5, "original", "quick answer", false),
    ] {
        answered_as(
            &state.interaction_of(id).unwrap(),
            kind,
            &[(how, text, ephemeral)],
        );
    }
    w.shutdown().await;
}

const FILES: &str = "DISCORD.files.SECRET";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_and_refs_answer_in_place_and_their_messages_are_edited_through_the_interaction() {
    let fake = FakeDiscord::start().await.unwrap();
    let state = fake.state();
    state.add_bot(FILES, 1, 1);
    // Channels the bot may not post in: answers, and edits of them, must go through the
    // interactions.
    for channel in [20, 21, 22] {
        state.mute(FILES, channel);
    }
    let csv = json!({"data": "aWQsdG90YWwKMSwyCg==", "name": "report.csv", "mime": "text/csv"});
    let handler = ScriptedHandler::start(move |ev: &Value| {
        match (ev["kind"].as_str(), ev["command"]["name"].as_str()) {
            (Some("command"), Some("report")) => json!({"actions": [{"type": "send",
                "text": "the report", "ref": "rep", "attachments": [csv.clone()],
                "buttons": [[{"text": "Close", "value": "close"}]]}]}),
            // Deferred (past 3 s), then an ephemeral answer edited in the same turn: only
            // the interaction's webhook reaches an ephemeral message.
            (Some("command"), Some("draft")) => json!({"_delay_ms": 3_500, "actions": [
                {"type": "send", "text": "draft 1", "ref": "d", "ephemeral": true},
                {"type": "edit", "ref": "d", "text": "draft 2"}]}),
            // Files alone, no text.
            (Some("command"), Some("photo")) => json!({"actions": [{"type": "send",
                "attachments": [{"data": "bm90IHJlYWxseSBhIHBpY3R1cmU=", "name": "a.txt"}]}]}),
            // A later turn edits the report by its ref, through the command's interaction.
            (Some("action"), _) => json!({"actions": [
                {"type": "edit", "ref": "rep", "text": "the report (closed)"},
                {"type": "send", "text": "closed", "ephemeral": true}]}),
            _ => json!({}),
        }
    })
    .await;
    let spec = bot("files", FILES, &fake, webhook(&handler));
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let w = h.start("a");
    wait_for("connected", Duration::from_secs(20), || async {
        (state.connected_shards(FILES) == 1).then_some(())
    })
    .await;
    let report = state.user_runs_command(FILES, 20, "report", json!([]));
    let draft = state.user_runs_command(FILES, 21, "draft", json!([]));
    let photo = state.user_runs_command(FILES, 22, "photo", json!([]));
    let shown = botfleet_testkit::wait_for_or(
        "the report shown",
        Duration::from_secs(20),
        || async {
            state
                .interaction_of(&report)
                .filter(|i| !i.answers.is_empty())
        },
        || format!("{:?}", state.interaction_of(&report)),
    )
    .await;
    let report_id = shown.answers[0].id.clone();
    answered_as(&shown, 4, &[("response", "the report", false)]);
    assert_eq!(shown.answers[0].files, ["report.csv"], "{shown:?}");
    assert_eq!(shown.answers[0].buttons, ["close"]);
    let close = state
        .user_presses(FILES, 20, &report_id, "close")
        .expect("a button of the answer");
    let store = h.store();
    wait_for(
        "every interaction done",
        Duration::from_secs(30),
        || async {
            let answered = [&draft, &photo, &close].iter().all(|id| {
                state
                    .interaction_of(id)
                    .is_some_and(|i| !i.answers.is_empty())
            });
            let closed = state
                .message(FILES, &report_id)
                .is_some_and(|m| m.content == "the report (closed)");
            let pending = store.inbox_pending(&spec.id, 10).await.unwrap();
            (answered && closed && pending.is_empty()).then_some(())
        },
    )
    .await;
    let got = |id: &str| state.interaction_of(id).unwrap();
    // The report, edited in the press's turn through the command's webhook (the channel
    // refuses the bot), keeps its file.
    let m = state.message(FILES, &report_id).unwrap();
    assert_eq!((m.edits, m.hook_edits), (1, 1), "{m:?}");
    assert_eq!(m.files, ["report.csv"]);
    answered_as(&got(&close), 4, &[("response", "closed", true)]);
    // The ephemeral draft, edited through the webhook after the deferral.
    answered_as(&got(&draft), 5, &[("followup", "draft 1", true)]);
    let d = state.message(FILES, &got(&draft).answers[0].id).unwrap();
    assert_eq!(
        (d.content.as_str(), d.hook_edits, d.ephemeral),
        ("draft 2", 1, true)
    );
    // Files alone are an answer too.
    answered_as(&got(&photo), 4, &[("response", "", false)]);
    assert_eq!(got(&photo).answers[0].files, ["a.txt"]);
    assert!(state.sent_by(FILES).is_empty(), "nothing went to a channel");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_whose_interaction_ran_out_is_edited_in_its_channel() {
    let fake = FakeDiscord::start().await.unwrap();
    let state = fake.state();
    state.add_bot(FILES, 1, 1);
    let handler = ScriptedHandler::start(|ev: &Value| {
        match (ev["kind"].as_str(), ev["command"]["name"].as_str()) {
            (Some("command"), Some("status")) => json!({"actions": [{"type": "send",
                "text": "running", "ref": "st", "buttons": [[{"text": "Stop", "value": "stop"}]]}]}),
            (Some("command"), _) => json!({"text": "still here"}),
            (Some("action"), _) => json!({"actions": [
                {"type": "edit", "ref": "st", "text": "stopped"}, {"type": "answer"}]}),
            _ => json!({}),
        }
    })
    .await;
    let spec = bot("expired", FILES, &fake, webhook(&handler));
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let w = h.start("a");
    wait_for("connected", Duration::from_secs(20), || async {
        (state.connected_shards(FILES) == 1).then_some(())
    })
    .await;
    let status = state.user_runs_command(FILES, 30, "status", json!([]));
    let shown = wait_for("the status shown", Duration::from_secs(20), || async {
        state
            .interaction_of(&status)
            .filter(|i| !i.answers.is_empty())
    })
    .await;
    let id = shown.answers[0].id.clone();
    // Its token no longer answers: the edit goes to the channel, where the bot may post.
    state.expire_interaction(&status);
    state.user_presses(FILES, 30, &id, "stop").unwrap();
    wait_for("the status edited", Duration::from_secs(20), || async {
        state.message(FILES, &id).filter(|m| m.content == "stopped")
    })
    .await;
    let m = state.message(FILES, &id).unwrap();
    assert_eq!((m.edits, m.hook_edits), (1, 0), "{m:?}");
    // The refused interaction token is not the bot's: it goes on answering.
    let again = state.user_runs_command(FILES, 30, "ping", json!([]));
    let answered = wait_for("answered again", Duration::from_secs(20), || async {
        state
            .interaction_of(&again)
            .filter(|i| !i.answers.is_empty())
    })
    .await;
    answered_as(&answered, 4, &[("response", "still here", false)]);
    w.shutdown().await;
}

const LATER: &str = "DISCORD.later.SECRET";

/// A command whose handler answers `202`: deferred within Discord's 3 s like a slow
/// handler's, and the later answer's `answer` action, posted through the reply token, is the
/// interaction's answer (the original response edited).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_answer_meets_the_interaction_deadline() {
    let fake = FakeDiscord::start().await.unwrap();
    fake.state().add_bot(LATER, 1, 1);
    let handler = ScriptedHandler::start(|ev: &Value| match ev["kind"].as_str() {
        Some("command") => json!({"_status": 202}),
        _ => json!({}),
    })
    .await;
    let spec = bot("later", LATER, &fake, webhook(&handler));
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let w = h.start("a");
    let state = fake.state();
    wait_for("connected", Duration::from_secs(20), || async {
        (state.connected_shards(LATER) == 1).then_some(())
    })
    .await;
    let cmd = state.user_runs_command(LATER, 7, "think", json!([]));
    let token = wait_for("the handler asked", Duration::from_secs(20), || async {
        handler
            .seen()
            .iter()
            .find_map(|e| e["reply_token"].as_str().map(str::to_owned))
    })
    .await;
    let deferred = wait_for("the command deferred", Duration::from_secs(20), || async {
        state
            .interaction_of(&cmd)
            .filter(|i| !i.callbacks.is_empty())
    })
    .await;
    let (kind, after) = deferred.callbacks[0];
    assert_eq!(kind, 5, "deferred: Discord shows the bot thinking");
    assert!(
        after < Duration::from_secs(3),
        "within the deadline: {after:?}"
    );
    let part = json!({"actions": [{"type": "answer", "text": "thought it over"}], "final": true});
    let (status, answer) =
        botfleet_testkit::connector_suite::post_part(&w.api_url, &token, "k", &part).await;
    assert_eq!(status, 202, "{answer}");
    let done = wait_for("the command answered", Duration::from_secs(20), || async {
        state.interaction_of(&cmd).filter(|i| !i.answers.is_empty())
    })
    .await;
    assert_eq!(done.callbacks.len(), 1, "{:?}", done.callbacks);
    assert_eq!(
        (done.answers[0].how, done.answers[0].text.as_str()),
        ("original", "thought it over")
    );
    w.shutdown().await;
}
