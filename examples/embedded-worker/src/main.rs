//! botfleet as a library: one worker on the in-memory coordinator and a SQLite registry,
//! running an echo bot against a local fake of the Telegram Bot API.
//!
//! Run with: `cargo run -p example-embedded-worker`
//!
//! To point it at a real Bot API instead, register the bot with your token and without
//! `api_url` (or with your self-hosted server's URL), and drop the fake.

use std::{sync::Arc, time::Duration};

use botfleet_coord::MemoryHub;
use botfleet_core::{BotId, BotSpec, Platform, WorkerId};
use botfleet_runtime::{Worker, WorkerConfig};
use botfleet_store::Store;
use botfleet_telegram::fake::FakeTelegram;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A stand-in for api.telegram.org that speaks the same JSON.
    let telegram = FakeTelegram::start().await?;
    telegram.state().add_bot("123456:example-token");

    // The registry: any store URL works (sqlite://file.db, postgres://…).
    let store: Arc<dyn Store> = botfleet_store::open("sqlite::memory:").await?;
    let mut spec = BotSpec::new(
        BotId::new("echo-bot")?,
        Platform::Telegram,
        "123456:example-token",
    );
    spec.options.api_url = Some(telegram.url());
    store.add_bot(&spec).await?;

    // One worker on the in-memory coordinator: the embedded mode.
    let mut config = WorkerConfig::new(WorkerId::new("example")?);
    config.telegram.poll_timeout = Duration::from_secs(1);
    let worker = Worker::new(
        config,
        Arc::new(MemoryHub::new().coordinator()),
        store.clone(),
    )?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));

    // A user writes; the bot answers.
    while !telegram.state().is_polling("123456:example-token") {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    telegram
        .state()
        .user_writes("123456:example-token", 42, "hello, fleet");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while telegram.state().sent_count() == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for sent in telegram.state().sent() {
        println!("the bot answered chat {}: {:?}", sent.chat_id, sent.text);
    }

    // Clean shutdown: hand over (nobody to hand to here), unregister.
    let _ = stop.send(());
    running.await??;
    let rec = store.get_bot(&BotId::new("echo-bot")?).await?;
    println!("status recorded: {:?}", rec.map(|r| r.status));
    Ok(())
}
