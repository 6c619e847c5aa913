//! The support bot on one embedded worker, against a local fake of the Telegram Bot API.
//!
//! Run with: `cargo run -p example-support-bot`. A worker built this way takes its compiled-in
//! handlers by name; a bot registered with `--handler support` uses this one.

use std::{collections::HashMap, sync::Arc, time::Duration};

use botfleet_coord::MemoryHub;
use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform, WorkerId};
use botfleet_runtime::{BotHandler, Worker, WorkerConfig};
use botfleet_store::Store;
use botfleet_telegram::fake::FakeTelegram;
use example_support_bot::{SupportBot, NAME};

const TOKEN: &str = "123456:support-example";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let telegram = FakeTelegram::start().await?;
    telegram.state().add_bot(TOKEN);
    let store: Arc<dyn Store> = botfleet_store::open("sqlite::memory:").await?;
    let mut spec = BotSpec::new(BotId::new("support-bot")?, Platform::Telegram, TOKEN);
    spec.options.api_url = Some(telegram.url());
    spec.handler = HandlerSpec::Named(NAME.into());
    store.add_bot(&spec).await?;

    let mut config = WorkerConfig::new(WorkerId::new("example")?);
    config.telegram.poll_timeout = Duration::from_secs(1);
    let handlers: HashMap<String, Arc<dyn BotHandler>> =
        HashMap::from([(NAME.to_owned(), Arc::new(SupportBot) as Arc<dyn BotHandler>)]);
    config.handlers = Arc::new(handlers);
    let worker = Worker::new(config, Arc::new(MemoryHub::new().coordinator()), store)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));

    while !telegram.state().is_polling(TOKEN) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    telegram.state().user_writes(TOKEN, 42, "/start");
    let menu = loop {
        if let Some(m) = telegram.state().sent().first().cloned() {
            break m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "the bot sent {:?} with buttons {:?}",
        menu.text, menu.reply_markup
    );
    telegram
        .state()
        .user_presses(TOKEN, 42, menu.message_id, "billing");
    loop {
        let now = telegram.state().bot_message(TOKEN, "42", menu.message_id);
        if let Some(m) = now.filter(|m| m.edits > 0) {
            println!("after the press it reads {:?}", m.text);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop.send(());
    running.await??;
    Ok(())
}
