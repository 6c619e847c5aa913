//! A Discord bot of several shards moving between workers: after the cold start every move
//! RESUMEs (IDENTIFYs stay at the shard count), no shard ever has two sessions, nothing
//! written is lost, nothing is answered twice.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{collections::HashMap, time::Duration};

use botfleet_core::{BotId, BotSpec, Platform};
use botfleet_discord::fake::FakeDiscord;
use botfleet_testkit::{connector_suite::Harness, wait_for};

const TOKEN: &str = "DISCORD.move.SECRET";
const SHARDS: u32 = 4;

async fn answered(fake: &FakeDiscord, texts: &[String]) {
    wait_for(
        "every message answered",
        Duration::from_secs(30),
        || async {
            let posts = fake.state().posts(TOKEN);
            texts
                .iter()
                .all(|t| posts.iter().any(|p| &p.content == t))
                .then_some(())
        },
    )
    .await;
}

fn write(fake: &FakeDiscord, round: &str) -> Vec<String> {
    (0..8u64)
        .map(|c| {
            let t = format!("{round}-{c}");
            fake.state().user_writes(TOKEN, c, &t);
            t
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_bot_resumes_on_every_move() {
    let fake = FakeDiscord::start().await.unwrap();
    fake.state().add_bot(TOKEN, SHARDS, SHARDS);
    let mut spec = BotSpec::new(BotId::new("big").unwrap(), Platform::Discord, TOKEN);
    spec.options.api_url = Some(fake.api_url());
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let a = h.start("a");
    wait_for("all shards up", Duration::from_secs(30), || async {
        (fake.state().connected_shards(TOKEN) == SHARDS).then_some(())
    })
    .await;
    assert_eq!(fake.state().identifies(TOKEN), u64::from(SHARDS));
    let mut all = write(&fake, "cold");
    answered(&fake, &all).await;
    // Let the checkpoint be written (every 3 s, and at once for new sessions).
    tokio::time::sleep(Duration::from_millis(3500)).await;
    all.extend(write(&fake, "before-drain"));
    answered(&fake, &all).await;

    // SIGTERM: b takes over and resumes.
    let b = h.start("b");
    a.shutdown().await;
    wait_for("resumed on b", Duration::from_secs(30), || async {
        (fake.state().resumes(TOKEN) >= u64::from(SHARDS)
            && fake.state().connected_shards(TOKEN) == SHARDS)
            .then_some(())
    })
    .await;
    all.extend(write(&fake, "after-drain"));
    answered(&fake, &all).await;

    // Crash (kill -9): c takes over after the lease and resumes.
    let c = h.start("c");
    h.crash(b);
    wait_for("resumed on c", Duration::from_secs(30), || async {
        (fake.state().resumes(TOKEN) >= 2 * u64::from(SHARDS)
            && fake.state().connected_shards(TOKEN) == SHARDS)
            .then_some(())
    })
    .await;
    all.extend(write(&fake, "after-crash"));
    answered(&fake, &all).await;

    assert_eq!(
        fake.state().identifies(TOKEN),
        u64::from(SHARDS),
        "every move resumed"
    );
    assert_eq!(
        fake.state().max_sessions_per_shard(TOKEN),
        1,
        "a shard ran twice"
    );
    assert_eq!(fake.state().identify_violations(TOKEN), 0);
    assert_eq!(fake.state().dropped(TOKEN), 0);
    let mut seen: HashMap<String, usize> = HashMap::new();
    for p in fake.state().posts(TOKEN) {
        *seen.entry(p.content).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "answered twice: {twice:?}");
    assert!(c
        .metrics
        .render("c")
        .contains("botfleet_discord_resumes_total"));
    c.shutdown().await;
}
