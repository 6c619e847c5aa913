//! A reply of several actions across a crash: what was done before the worker died is not done
//! again, what was not is done by the next owner, in order.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform};
use botfleet_testkit::{connector_suite::Harness, wait_for, FakeTelegram, ScriptedHandler};
use serde_json::json;

const TOKEN: &str = "3100:actions-SECRET";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_mid_reply_does_each_action_once_in_order() {
    let fake = FakeTelegram::start().await.unwrap();
    let tg = fake.state();
    tg.add_bot(TOKEN);
    let handler = ScriptedHandler::start(|ev| match ev["text"].as_str() {
        Some("go") => json!({"actions": [
            {"type": "send", "text": "one", "ref": "first"},
            {"type": "send", "text": "two"},
            {"type": "edit", "ref": "first", "text": "one, edited"},
            {"type": "send", "text": "three"},
        ]}),
        _ => json!({}),
    })
    .await;
    let (bot, h, a) = polling_bot("acts", TOKEN, &fake, &handler).await;
    // "one" goes through; "two" keeps failing (a platform outage) until the worker dies in
    // its backoff, after the turn recorded that "one" is done. (A worker dying after the
    // platform took a request and before its progress is written sends that one again: the
    // window every send has, measured by botfleet_outbox_window_seconds.)
    tg.set_send_delay(Duration::from_millis(800));
    let key = tg.user_writes(TOKEN, 7, "go").to_string();
    wait_for(
        "the first send in flight",
        Duration::from_secs(20),
        || async { (tg.most_sends_in_flight() >= 1).then_some(()) },
    )
    .await;
    for _ in 0..1000 {
        tg.inject_send(TOKEN, botfleet_testkit::Fault::ServerError);
    }
    let store = h.store().clone();
    wait_for(
        "the progress after one",
        Duration::from_secs(20),
        || async {
            store
                .turn_progress(&bot.id, &key)
                .await
                .unwrap()
                .filter(|p| p.contains("\"done\":1"))
        },
    )
    .await;
    h.crash(a);
    // The crashed worker's turn is a task of this process, not a killed one: it may retry
    // "two" until its lease is unsafe (2/3 of the harness's 1.5 s lease by its clock). The
    // platform recovers only once that bound has passed, so only the next owner sends.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    tg.clear_faults(TOKEN);
    tg.set_send_delay(Duration::ZERO);
    let b = h.start("b");
    wait_for("the whole reply", Duration::from_secs(30), || async {
        tg.sent().iter().any(|s| s.text == "three").then_some(())
    })
    .await;
    let texts: Vec<String> = tg.sent().into_iter().map(|s| s.text).collect();
    assert_eq!(
        texts,
        ["one", "two", "three"],
        "what was done before the crash is not done again"
    );
    let first = tg.sent()[0].message_id;
    let m = tg.bot_message(TOKEN, "7", first).unwrap();
    assert_eq!(
        (m.text.as_str(), m.edits),
        ("one, edited", 1),
        "the ref given before the crash names the message after it"
    );
    assert_eq!(
        handler.seen().len(),
        2,
        "the replay asked the handler again"
    );
    b.shutdown().await;
}

/// A reply that edits one message many times (an answer built up in one go) reaches the
/// platform as one edit, on the last text (a last edit of buttons alone keeps that text);
/// an edit to what a message shows is not sent at all; counted in
/// `botfleet_stream_edits_total` by outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edits_of_one_message_in_a_reply_go_as_the_last() {
    const TOKEN: &str = "3101:coalesce-SECRET";
    let fake = FakeTelegram::start().await.unwrap();
    let tg = fake.state();
    tg.add_bot(TOKEN);
    let handler = ScriptedHandler::start(|ev| match ev["text"].as_str() {
        Some("go") => {
            let mut actions = vec![
                json!({"type": "send", "text": "thinking", "ref": "s"}),
                json!({"type": "send", "text": "hello", "ref": "h"}),
            ];
            for i in 0..50 {
                actions.push(json!({"type": "edit", "ref": "s", "text": format!("part {i}")}));
            }
            actions.push(json!({"type": "edit", "ref": "h", "text": "hello"}));
            actions.push(
                json!({"type": "edit", "ref": "s", "buttons": [[{"text": "ok", "value": "ok"}]]}),
            );
            // A ref given to another message: the edits before it are the first one's.
            actions.extend([
                json!({"type": "send", "text": "first", "ref": "r"}),
                json!({"type": "edit", "ref": "r", "text": "first, edited"}),
                json!({"type": "send", "text": "second", "ref": "r"}),
                json!({"type": "edit", "ref": "r", "text": "second, edited"}),
            ]);
            actions.push(json!({"type": "send", "text": "done"}));
            json!({ "actions": actions })
        }
        _ => json!({}),
    })
    .await;
    let (_bot, _h, a) = polling_bot("coalesce", TOKEN, &fake, &handler).await;
    tg.user_writes(TOKEN, 7, "go");
    wait_for("the whole reply", Duration::from_secs(30), || async {
        tg.sent().iter().any(|s| s.text == "done").then_some(())
    })
    .await;
    let sent = tg.sent();
    let texts: Vec<&str> = sent.iter().map(|s| s.text.as_str()).collect();
    assert_eq!(texts, ["thinking", "hello", "first", "second", "done"]);
    for (k, text) in [(2, "first, edited"), (3, "second, edited")] {
        let m = tg.bot_message(TOKEN, "7", sent[k].message_id).unwrap();
        assert_eq!((m.text.as_str(), m.edits), (text, 1), "a ref given anew");
    }
    let s = tg.bot_message(TOKEN, "7", sent[0].message_id).unwrap();
    assert_eq!(
        (s.text.as_str(), s.edits),
        ("part 49", 1),
        "51 edits of one message go as one, on the last text"
    );
    assert!(s.reply_markup.is_some(), "with the last edit's buttons");
    let hello = tg.bot_message(TOKEN, "7", sent[1].message_id).unwrap();
    assert_eq!(
        hello.edits, 0,
        "an edit to what the message shows is not sent"
    );
    let metrics = a.metrics.render("a");
    for (outcome, n) in [("sent", 3), ("coalesced", 50), ("skipped", 1)] {
        let line = format!(
            "botfleet_stream_edits_total{{worker_id=\"a\",platform=\"telegram\",outcome=\"{outcome}\"}} {n}"
        );
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
    a.shutdown().await;
}

/// A Telegram bot `id` of `token` on `fake`, answered by `handler`, polling on worker "a" of
/// a harness of its own.
async fn polling_bot(
    id: &str,
    token: &str,
    fake: &FakeTelegram,
    handler: &ScriptedHandler,
) -> (
    BotSpec,
    Harness,
    botfleet_testkit::connector_suite::RunningWorker,
) {
    let mut bot = BotSpec::new(BotId::new(id).unwrap(), Platform::Telegram, token);
    bot.options.api_url = Some(fake.url());
    bot.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let a = h.start("a");
    let tg = fake.state();
    wait_for("polling", Duration::from_secs(20), || async {
        tg.is_polling(token).then_some(())
    })
    .await;
    (bot, h, a)
}

/// WhatsApp Cloud's customer service window: inside it a desk's free text goes out; more
/// than 24 hours after the user's last message the platform refuses it (131047): the send
/// fails at once with the reason, tried once; a `template` action goes out instead, from the
/// backend and from a handler. A mode without templates refuses the action with a reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_cloud_sends_templates_outside_the_24_hour_window() {
    const NUMBER: &str = "100888";
    const ACCESS: &str = "EAAG-window-SECRET";
    const USER: &str = "4917011";
    let graph = botfleet_testkit::FakeGraph::start().await.unwrap();
    let g = graph.state();
    g.add_number(NUMBER, ACCESS, "app-secret");
    g.keep_window(NUMBER);
    let mut bot = BotSpec::new(BotId::new("wa-window").unwrap(), Platform::Whatsapp, ACCESS);
    bot.options.api_url = Some(graph.url());
    bot.options.phone_number_id = Some(NUMBER.into());
    bot.hook.secret = Some(botfleet_core::Secret::new("app-secret"));
    bot.hook.verify_token = Some(botfleet_core::Secret::new("verify-me"));
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let w = h.start("a");
    let submit = |key: &'static str, body: serde_json::Value| {
        let (sends, bot) = (w.sends.clone(), bot.clone());
        async move {
            wait_for("the send taken", Duration::from_secs(20), || async {
                sends.submit(&bot, USER, key, &body.to_string()).await.ok()
            })
            .await
        }
    };
    let ended = |key: &'static str| {
        let (store, id) = (h.store().clone(), bot.id.clone());
        async move {
            wait_for("the send ended", Duration::from_secs(20), || async {
                let e = store
                    .inbox_entry(&id, &botfleet_store::send_key(key))
                    .await
                    .ok()??;
                (e.state != botfleet_store::InboxState::Pending).then_some(e)
            })
            .await
        }
    };
    // Inside the window.
    g.user_wrote_ago(NUMBER, USER, Duration::from_secs(3_600));
    submit("in", json!({"text": "inside"})).await;
    assert_eq!(ended("in").await.state, botfleet_store::InboxState::Done);
    assert_eq!(g.sent().last().unwrap().text, "inside");
    // More than a day after the user's last message.
    g.user_wrote_ago(NUMBER, USER, Duration::from_secs(25 * 3_600));
    submit("late", json!({"text": "too late"})).await;
    let late = ended("late").await;
    assert_eq!(late.state, botfleet_store::InboxState::Undeliverable);
    let why = late.error.unwrap_or_default();
    assert!(why.contains(botfleet_whatsapp::OUTSIDE_WINDOW), "{why}");
    assert_eq!(g.window_refusals(), 1, "refused once, not retried");
    let components = json!([{"type": "body", "parameters": [{"type": "text", "text": "42"}]}]);
    submit(
        "tpl",
        json!({"actions": [{"type": "template", "name": "order_update", "language": "en_US",
                            "components": components}]}),
    )
    .await;
    assert_eq!(ended("tpl").await.state, botfleet_store::InboxState::Done);
    let sent = g.sent().last().unwrap().clone();
    assert_eq!(
        (sent.to.as_str(), sent.template, sent.components),
        (
            USER,
            Some(("order_update".to_owned(), "en_US".to_owned())),
            Some(components)
        )
    );
    assert_eq!(g.window_refusals(), 1);
    // A template without its name is refused by the fleet, not sent.
    submit(
        "bad",
        json!({"actions": [{"type": "template", "name": "", "language": "en_US"}]}),
    )
    .await;
    let bad = ended("bad").await;
    assert_eq!(bad.state, botfleet_store::InboxState::Undeliverable);
    assert!(bad.error.unwrap_or_default().contains("`name`"));
    w.shutdown().await;

    // A Telegram bot has no templates: the action is refused with its reason.
    let fake = FakeTelegram::start().await.unwrap();
    let tg = fake.state();
    tg.add_bot("3101:templates-SECRET");
    let handler = ScriptedHandler::start(|_| {
        json!({"actions": [{"type": "template", "name": "hi", "language": "en"},
                           {"type": "send", "text": "after"}]})
    })
    .await;
    let (tbot, th, ta) = polling_bot("no-tpl", "3101:templates-SECRET", &fake, &handler).await;
    let key = tg.user_writes("3101:templates-SECRET", 8, "go").to_string();
    let e = wait_for("the turn ended", Duration::from_secs(20), || async {
        let e = th.store().inbox_entry(&tbot.id, &key).await.ok()??;
        (e.state != botfleet_store::InboxState::Pending).then_some(e)
    })
    .await;
    assert!(
        e.error.unwrap_or_default().contains("caps.templates"),
        "the refusal says why"
    );
    assert_eq!(
        tg.sent().iter().map(|s| s.text.clone()).collect::<Vec<_>>(),
        ["after"]
    );
    ta.shutdown().await;
}
