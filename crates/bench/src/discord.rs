//! Discord shards in one worker process, on the fake gateway (plain `ws://` on loopback): what
//! an idle shard costs, and a cold start against the identify schedule.

use std::{path::Path, time::Duration};

use botfleet_core::{BotId, BotSpec, Platform};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{nonce, FakeDiscord};

use crate::{botfleet_bin, measure, spawn, wait_count, Dir};

fn token(i: usize) -> String {
    format!("DISCORD.bench.{i}")
}

/// A registry of `bots` Discord bots of `shards` shards each (identify buckets:
/// `concurrency`); answers its database URL.
async fn registry(
    dir: &Path,
    fake: &FakeDiscord,
    bots: usize,
    shards: u32,
    concurrency: u32,
) -> anyhow::Result<String> {
    let path = dir.join("bots.db");
    let store = SqliteStore::open(&path).await?;
    for i in 0..bots {
        fake.state().add_bot(&token(i), shards, concurrency);
        let mut spec = BotSpec::new(BotId::new(format!("d{i}"))?, Platform::Discord, token(i));
        spec.options.api_url = Some(fake.url());
        store.add_bot(&spec).await?;
    }
    Ok(format!("sqlite://{}", path.display()))
}

fn connected(fake: &FakeDiscord, bots: usize) -> usize {
    (0..bots)
        .map(|i| fake.state().connected_shards(&token(i)) as usize)
        .sum()
}

/// RSS and CPU of one worker holding `shards` idle shards (bots of 4 shards, 4 identify
/// buckets, so the identify schedule is not what takes time), fresh and after `rounds`
/// messages per shard.
pub(crate) async fn idle(shards: usize, rounds: usize, base_kib: u64) -> anyhow::Result<()> {
    let fake = FakeDiscord::start().await?;
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let bots = shards.div_ceil(4);
    let db = registry(&dir.0, &fake, bots, 4, 4).await?;
    let w = spawn(
        &botfleet_bin()?,
        &["--database-url", &db, "--lease-ms", "15000"],
    )?;
    let pid = w.0.id();
    let n = bots * 4;
    let up = wait_count("shards connected", n, Duration::from_secs(300), || {
        connected(&fake, bots)
    })
    .await?;
    println!(
        "{n:>6} Discord shards ({bots} bots of 4): start to all connected {:.2} s",
        up.as_secs_f64()
    );
    measure(pid, n, base_kib, "Discord shards, fresh".into()).await;
    if rounds > 0 {
        for r in 0..rounds {
            for i in 0..bots {
                for ch in 0..4u64 {
                    fake.state().user_writes(&token(i), ch, &format!("r{r}"));
                }
            }
            let want = (r + 1) * n;
            wait_count("messages answered", want, Duration::from_secs(120), || {
                (0..bots)
                    .map(|i| fake.state().sent_by(&token(i)).len())
                    .sum()
            })
            .await?;
        }
        measure(
            pid,
            n,
            base_kib,
            format!("Discord shards, after {rounds} messages per shard"),
        )
        .await;
    }
    Ok(())
}

/// A cold start of one bot of `shards` shards at `concurrency` identify buckets: the time
/// until every shard is connected, against the schedule's minimum (a bucket identifies once
/// per 5 s: `(ceil(shards / concurrency) - 1) * 5 s`).
pub(crate) async fn cold(shards: u32, concurrency: u32) -> anyhow::Result<()> {
    let fake = FakeDiscord::start().await?;
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let db = registry(&dir.0, &fake, 1, shards, concurrency).await?;
    let _w = spawn(
        &botfleet_bin()?,
        &["--database-url", &db, "--lease-ms", "15000"],
    )?;
    let t = wait_count(
        "shards connected",
        shards as usize,
        Duration::from_secs(600),
        || connected(&fake, 1),
    )
    .await?;
    let rounds = shards.div_ceil(concurrency.max(1));
    let minimum = f64::from(rounds.saturating_sub(1)) * 5.0;
    println!(
        "{shards:>6} shards at max_concurrency {concurrency}: all connected {:.2} s after start (the identify schedule's minimum: {minimum:.0} s); {} IDENTIFYs, {} too early",
        t.as_secs_f64(),
        fake.state().identifies(&token(0)),
        fake.state().identify_violations(&token(0)),
    );
    Ok(())
}

/// Two worker processes on Redis share `bots` Discord bots of 4 shards (default lease 15 s);
/// one is killed with SIGKILL: the time until every shard of its bots RESUMEd on the other
/// (goal: lease + 1 s + one round trip), and IDENTIFYs over the run (the shard count: a move
/// never identifies again).
pub(crate) async fn failover(bots: usize) -> anyhow::Result<()> {
    use botfleet_coord::{Coordinator, RedisConfig, RedisCoordinator};
    let fake = FakeDiscord::start().await?;
    let redis = botfleet_testkit::RedisServer::start()?;
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let db = registry(&dir.0, &fake, bots, 4, 4).await?;
    let bin = botfleet_bin()?;
    let url = redis.url();
    let worker = |id: &str| {
        spawn(
            &bin,
            &[
                "--database-url",
                &db,
                "--redis-url",
                &url,
                "--worker-id",
                id,
            ],
        )
    };
    let a = worker("a")?;
    let _b = worker("b")?;
    let n = bots * 4;
    wait_count("shards connected", n, Duration::from_secs(300), || {
        connected(&fake, bots)
    })
    .await?;
    // Let both settle (placement, renewals) before the kill.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let coord = RedisCoordinator::connect(RedisConfig::new(url.clone())).await?;
    let mut victims = Vec::new();
    for i in 0..bots {
        if let Ok(Some(o)) = coord.owner(&BotId::new(format!("d{i}"))?).await {
            if o.live && o.worker.as_str() == "a" {
                victims.push(i);
            }
        }
    }
    let before: Vec<u64> = victims
        .iter()
        .map(|i| fake.state().resumes(&token(*i)))
        .collect();
    let mut a = a;
    let t = std::time::Instant::now();
    a.0.kill()?;
    let _ = a.0.wait();
    let done = || {
        victims
            .iter()
            .zip(&before)
            .filter(|(i, b)| {
                fake.state().resumes(&token(**i)) >= **b + 4
                    && fake.state().connected_shards(&token(**i)) == 4
            })
            .count()
    };
    wait_count(
        "victim bots resumed",
        victims.len(),
        Duration::from_secs(120),
        done,
    )
    .await?;
    let identifies: u64 = (0..bots).map(|i| fake.state().identifies(&token(i))).sum();
    let most: u32 = (0..bots)
        .map(|i| fake.state().max_sessions_per_shard(&token(i)))
        .max()
        .unwrap_or(0);
    println!(
        "{n:>6} Discord shards on 2 workers: kill -9 of the one holding {} bots ({} shards): every shard resumed on the other {:.2} s after the kill (lease 15 s); {identifies} IDENTIFYs in all for {n} shards; at most {most} session per shard",
        victims.len(),
        victims.len() * 4,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
