//! The support bot driven through the Telegram fake by a real worker: `/start` shows two
//! buttons, a press is answered and edits that message, a photo is answered with its size,
//! the visit counter lives in the chat's state, and a bot naming a handler the worker lacks
//! waits (its messages are not lost).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{collections::HashMap, sync::Arc, time::Duration};

use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform};
use botfleet_runtime::BotHandler;
use botfleet_testkit::{connector_suite::Harness, wait_for, FakeTelegram};
use example_support_bot::{SupportBot, NAME};

const TOKEN: &str = "5100:support-SECRET";

/// The Telegram fake, a bot on it naming the support handler, and a registry with it.
async fn setup() -> (FakeTelegram, BotSpec, Harness) {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let mut bot = BotSpec::new(BotId::new("support").unwrap(), Platform::Telegram, TOKEN);
    bot.options.api_url = Some(fake.url());
    bot.handler = HandlerSpec::Named(NAME.into());
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    (fake, bot, h)
}

/// A worker built with the support handler compiled in.
fn with_support(c: &mut botfleet_runtime::WorkerConfig) {
    let handlers: HashMap<String, Arc<dyn BotHandler>> =
        HashMap::from([(NAME.to_owned(), Arc::new(SupportBot) as Arc<dyn BotHandler>)]);
    c.handlers = Arc::new(handlers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_press_and_state_through_the_telegram_fake() {
    let (fake, _bot, h) = setup().await;
    let tg = fake.state();
    let w = h.start_with("a", with_support);
    wait_for("polling", Duration::from_secs(20), || async {
        tg.is_polling(TOKEN).then_some(())
    })
    .await;
    tg.user_writes(TOKEN, 9, "/start");
    let menu = wait_for("the menu", Duration::from_secs(20), || async {
        tg.sent().into_iter().find(|s| s.text == "How can we help?")
    })
    .await;
    let keyboard = menu.reply_markup.clone().unwrap();
    assert_eq!(
        keyboard["inline_keyboard"][0][1]["callback_data"],
        "technical"
    );
    assert_eq!(tg.calls(TOKEN, "sendChatAction").len(), 1, "typing shown");
    let (_, query) = tg
        .user_presses(TOKEN, 9, menu.message_id, "billing")
        .unwrap();
    let edited = wait_for(
        "the press edits the menu",
        Duration::from_secs(20),
        || async {
            tg.bot_message(TOKEN, "9", menu.message_id)
                .filter(|m| m.edits == 1)
        },
    )
    .await;
    assert_eq!(
        edited.text,
        "You chose billing. An agent will write here (visit 2)."
    );
    assert!(edited.reply_markup.is_none(), "the buttons are gone");
    let answer = tg.press(&query).unwrap().answer.unwrap();
    assert_eq!(answer.0["text"], "Noted: billing");
    tg.user_writes(TOKEN, 9, "my invoice is wrong");
    wait_for("the third visit", Duration::from_secs(20), || async {
        tg.sent()
            .iter()
            .any(|s| s.text == "Got it (visit 3). Send /start for the menu.")
            .then_some(())
    })
    .await;
    // A photo: the handler reads it through the fleet and answers with its size.
    let (_, file_id) = tg.user_sends_file(TOKEN, 9, "photo", vec![7; 4321], None, None, None);
    wait_for("the photo's size", Duration::from_secs(20), || async {
        tg.sent()
            .iter()
            .any(|s| s.text == "Thanks for 4321 bytes of image (visit 4).")
            .then_some(())
    })
    .await;
    assert_eq!(tg.downloads(&file_id), 1, "read once, from the platform");
    w.shutdown().await;
}

/// A worker without the handler a bot names keeps its messages pending (retried), and a
/// worker that has it answers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_without_the_handler_leaves_the_messages_to_one_with_it() {
    let (fake, bot, h) = setup().await;
    let tg = fake.state();
    let bare = h.start("bare");
    wait_for("polling", Duration::from_secs(20), || async {
        tg.is_polling(TOKEN).then_some(())
    })
    .await;
    tg.user_writes(TOKEN, 9, "hello");
    wait_for("the message journaled", Duration::from_secs(20), || async {
        let pending = h.store().inbox_pending(&bot.id, 10).await.ok()?;
        (pending.len() == 1).then_some(())
    })
    .await;
    assert_eq!(tg.sent_count(), 0, "nothing answered without the handler");
    bare.shutdown().await;
    let w = h.start_with("full", with_support);
    wait_for(
        "answered by the worker with the handler",
        Duration::from_secs(30),
        || async {
            tg.sent()
                .iter()
                .any(|s| s.text.starts_with("Got it (visit 1)"))
                .then_some(())
        },
    )
    .await;
    w.shutdown().await;
}
