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

    let tg = telegram.state();
    until("the bot polling", || tg.is_polling(TOKEN).then_some(())).await?;
    tg.user_writes(TOKEN, 42, "/start");
    let menu = until("the menu", || tg.sent().first().cloned()).await?;
    println!(
        "the bot sent {:?} with buttons {:?}",
        menu.text, menu.reply_markup
    );
    tg.user_presses(TOKEN, 42, menu.message_id, "billing");
    let edited = until("the edit", || {
        tg.bot_message(TOKEN, "42", menu.message_id)
            .filter(|m| m.edits > 0)
    })
    .await?;
    println!("after the press it reads {:?}", edited.text);
    let _ = stop.send(());
    running.await??;
    Ok(())
}

/// What `probe` finds, once it finds something, within 10 s.
async fn until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = probe() {
            return Ok(v);
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!("no {what} within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
