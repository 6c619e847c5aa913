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
    let mut bot = BotSpec::new(BotId::new("acts").unwrap(), Platform::Telegram, TOKEN);
    bot.options.api_url = Some(fake.url());
    bot.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let a = h.start("a");
    wait_for("polling", Duration::from_secs(20), || async {
        tg.is_polling(TOKEN).then_some(())
    })
    .await;
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
