//! A Telegram polling bot's conversation state moves with its chat: two `botfleet worker`
//! processes on a private Redis and one SQLite registry, the bot's webhook handler counting in
//! `state`, and the worker running the bot killed with SIGKILL. In a binary of its own, so it
//! does not add load to the fleet drills of `fleet_processes`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use botfleet_coord::{Coordinator, RedisConfig, RedisCoordinator};
use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{
    fleet_worker, wait_for, FakeTelegram, Proc, RedisServer, StateHandler, TempDir,
};

const LEASE_MS: u64 = 3_000;
const TOKEN: &str = "7001:state-kill";

/// The testkit's `StateHandler` answers `<n>:<text>`, `n` counted in the chat's state: the
/// count goes on, one step a message, in order and with no reply twice, through a kill -9 of
/// the worker that ran the bot. (Before every bot's turn read and wrote the state, a polling
/// bot's handler never got it and every reply was `1:…`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polling_bots_conversation_state_survives_kill_9_of_its_worker() {
    let redis = RedisServer::start().unwrap();
    let fake = FakeTelegram::start().await.unwrap();
    let handler = StateHandler::start(Duration::ZERO).await;
    let dir = TempDir::new("botfleet-state");
    let path = dir.0.join("bots.db");
    let db = format!("sqlite://{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    fake.state().add_bot(TOKEN);
    let bot = BotId::new("counter").unwrap();
    let mut spec = BotSpec::new(bot.clone(), Platform::Telegram, TOKEN);
    spec.options.api_url = Some(fake.url());
    spec.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    store.add_bot(&spec).await.unwrap();
    let coord = RedisCoordinator::connect(RedisConfig::new(redis.url()).prefix("itest"))
        .await
        .unwrap();
    let mut procs: Vec<Proc> = (0..2)
        .map(|i| {
            let name = format!("s{i}");
            Proc::spawn(
                &name,
                fleet_worker(
                    env!("CARGO_BIN_EXE_botfleet"),
                    &name,
                    &db,
                    &redis.url(),
                    "itest",
                )
                .args([
                    "--lease-ms",
                    &LEASE_MS.to_string(),
                    "--poll-timeout-s",
                    "2",
                ]),
                &dir.0,
            )
        })
        .collect();
    let replies = || -> Vec<String> {
        fake.state()
            .sent()
            .into_iter()
            .filter(|m| m.chat_id == "7")
            .map(|m| m.text)
            .collect()
    };
    let want = |upto: usize| -> Vec<String> { (1..=upto).map(|n| format!("{n}:m{n}")).collect() };
    for n in 1..=3 {
        fake.state().user_writes(TOKEN, 7, &format!("m{n}"));
        wait_for("a reply", Duration::from_secs(30), || async {
            (replies().len() >= n).then_some(())
        })
        .await;
    }
    assert_eq!(replies(), want(3));
    // The third turn recorded (its reply and state are the entry's end): a kill before that
    // write is the documented send window, where a replay sends the reply again.
    wait_for("m3's entry ended", Duration::from_secs(20), || async {
        let stats = store.inbox_stats().await.ok()?;
        stats.get(&bot).is_none_or(|s| s.pending == 0).then_some(())
    })
    .await;
    let holder = wait_for("the bot's holder", Duration::from_secs(10), || async {
        let owner = coord.owner(&bot).await.ok()??;
        (0..2).find(|i| owner.live && owner.worker.as_str() == format!("s{i}"))
    })
    .await;
    procs[holder].child.kill().unwrap();
    let killed_at = Instant::now();
    // Written while nobody runs the bot: the survivor takes it after the lease.
    for n in 4..=6 {
        fake.state().user_writes(TOKEN, 7, &format!("m{n}"));
    }
    wait_for(
        "the survivor answers on from the state",
        Duration::from_secs(40),
        || async { (replies().len() >= 6).then_some(()) },
    )
    .await;
    println!(
        "state after kill -9: answered on from n=3 {:?} after the kill (lease {LEASE_MS} ms)",
        killed_at.elapsed()
    );
    // Every entry ended: no turn is left that could send again, so the replies are final.
    wait_for(
        "every message's entry ended",
        Duration::from_secs(20),
        || async {
            let stats = store.inbox_stats().await.ok()?;
            stats.get(&bot).is_none_or(|s| s.pending == 0).then_some(())
        },
    )
    .await;
    assert_eq!(replies(), want(6), "the count goes on, once a message");
    let owner = coord.owner(&bot).await.unwrap().unwrap();
    assert_eq!(owner.worker.as_str(), format!("s{}", 1 - holder));
    drop(procs);
}
