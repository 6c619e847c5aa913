//! Slack Socket Mode bots in one worker process, on the fake Slack (plain `ws://` on
//! loopback): what an idle socket costs, and the refresh drill at scale (every socket replaced
//! within a minute while users write: events may wait, none may be lost).

use std::{
    collections::HashMap,
    path::Path,
    time::{Duration, Instant},
};

use botfleet_core::{BotId, BotSpec, Platform, Secret};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{nonce, FakeSlack};

use crate::{botfleet_bin, measure, spawn, wait_count, Dir};

fn tokens(i: usize) -> (String, String) {
    (format!("xoxb-bench-{i}"), format!("xapp-bench-{i}"))
}

/// A registry of `bots` Slack bots on `fake`; answers its database URL.
async fn registry(dir: &Path, fake: &FakeSlack, bots: usize) -> anyhow::Result<String> {
    let path = dir.join("bots.db");
    let store = SqliteStore::open(&path).await?;
    for i in 0..bots {
        let (bot, app) = tokens(i);
        fake.state().add_app(&bot, &app);
        let mut spec = BotSpec::new(BotId::new(format!("s{i}"))?, Platform::Slack, bot);
        spec.app_token = Some(Secret::new(app));
        spec.options.api_url = Some(fake.url());
        store.add_bot(&spec).await?;
    }
    Ok(format!("sqlite://{}", path.display()))
}

async fn wait_connected(fake: &FakeSlack, n: usize, limit: Duration) -> anyhow::Result<Duration> {
    wait_count("Slack bots connected", n, limit, || {
        fake.state().connected_apps()
    })
    .await
}

/// Waits until `want` posts arrived.
async fn wait_posts(fake: &FakeSlack, want: usize, limit: Duration) -> anyhow::Result<()> {
    wait_count("messages answered", want, limit, || {
        fake.state().sent_count()
    })
    .await
    .map(|_| ())
}

/// RSS and CPU of one worker with `bots` idle Slack bots: right after all connect, and again
/// after `rounds` messages per bot. Each round writes to `wave` bots at once and waits for
/// their answers before the next wave (`wave` = `bots`: every bot at once, the figure the
/// README's goal is on): what a worker keeps per bot after traffic, apart from the heap that
/// a burst of `wave` simultaneous turns leaves allocated.
pub(crate) async fn idle(
    bots: usize,
    rounds: usize,
    wave: usize,
    base_kib: u64,
) -> anyhow::Result<()> {
    let fake = FakeSlack::start().await?;
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let db = registry(&dir.0, &fake, bots).await?;
    let w = spawn(
        &botfleet_bin()?,
        &["--database-url", &db, "--lease-ms", "15000"],
    )?;
    let pid = w.0.id();
    let up = wait_connected(&fake, bots, Duration::from_secs(bots as u64 / 100 + 120)).await?;
    println!(
        "{bots:>6} Slack bots: start to all sockets open {:.2} s at the default 1,000 starts/s",
        up.as_secs_f64()
    );
    measure(pid, bots, base_kib, "Slack sockets, fresh".into()).await;
    if rounds > 0 {
        for r in 0..rounds {
            for i in 0..bots {
                fake.state()
                    .user_writes(&tokens(i).0, "C1", None, &format!("r{r}"));
                if (i + 1) % wave == 0 || i + 1 == bots {
                    wait_posts(&fake, r * bots + i + 1, Duration::from_secs(120)).await?;
                }
            }
        }
        let waves = if wave >= bots {
            String::new()
        } else {
            format!(" (written to {wave} bots at a time)")
        };
        measure(
            pid,
            bots,
            base_kib,
            format!("Slack sockets, after {rounds} messages per bot{waves}"),
        )
        .await;
    }
    Ok(())
}

/// Every socket of `bots` Slack bots refreshed (`disconnect: refresh_requested`) within
/// `spread`, while users write to every bot. Reports delays of answers before and during the
/// drill, loss, duplicates, order, and the most sockets one app held.
pub(crate) async fn refresh_drill(bots: usize, spread: Duration) -> anyhow::Result<()> {
    let fake = FakeSlack::start().await?;
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let db = registry(&dir.0, &fake, bots).await?;
    let _w = spawn(
        &botfleet_bin()?,
        &["--database-url", &db, "--lease-ms", "15000"],
    )?;
    wait_connected(&fake, bots, Duration::from_secs(bots as u64 / 100 + 120)).await?;
    // Users write: one message per bot per round, a round every 2 s; the drill runs in the
    // middle rounds.
    let round_every = Duration::from_secs(2);
    let rounds = (spread.as_secs() / 2) as usize + 10;
    let drill_from = 5;
    let mut written: HashMap<(String, String), Instant> = HashMap::new();
    let state = fake.state().clone();
    let (tx, rx) = tokio::sync::oneshot::channel::<(usize, Instant, Instant)>();
    let refresher = {
        let state = state.clone();
        tokio::spawn(async move {
            tokio::time::sleep(round_every * drill_from as u32).await;
            let start = Instant::now();
            let mut asked = 0;
            for i in 0..bots {
                let due = spread.mul_f64(i as f64 / bots as f64);
                tokio::time::sleep_until((start + due).into()).await;
                asked += state.refresh(&tokens(i).0);
            }
            let _ = tx.send((asked, start, Instant::now()));
        })
    };
    for r in 0..rounds {
        let t = Instant::now();
        for i in 0..bots {
            let (bot, _) = tokens(i);
            let text = format!("m{r}");
            state.user_writes(&bot, "C1", None, &text);
            written.insert((bot, text), Instant::now());
        }
        tokio::time::sleep_until((t + round_every).into()).await;
    }
    let (asked, drill_start, drill_end) = rx.await?;
    refresher.await?;
    wait_posts(&fake, rounds * bots, Duration::from_secs(120)).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let posts = state.sent();
    let mut last: HashMap<&str, usize> = HashMap::new();
    let (mut dup, mut disorder) = (0, 0);
    let (mut before, mut during) = (Vec::new(), Vec::new());
    for p in &posts {
        let r: usize = p.text.trim_start_matches('m').parse().unwrap_or(0);
        match last.get(p.token.as_str()) {
            Some(&prev) if prev == r => dup += 1,
            Some(&prev) if prev > r => disorder += 1,
            _ => {}
        }
        last.insert(&p.token, r);
        if let Some(at) = written.get(&(p.token.clone(), p.text.clone())) {
            let delay = p.at.saturating_duration_since(*at);
            if *at >= drill_start && *at <= drill_end {
                during.push(delay);
            } else if *at < drill_start {
                before.push(delay);
            }
        }
    }
    let pct = |v: &mut Vec<Duration>, q: f64| {
        v.sort();
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
            .as_secs_f64()
            * 1000.0
    };
    let most = (0..bots)
        .map(|i| state.max_sockets(&tokens(i).0))
        .max()
        .unwrap_or(0);
    println!(
        "{bots:>6} Slack bots, refresh drill: {asked} sockets asked to refresh over {:.1} s while users wrote {} messages; {} answered, lost {}, duplicated {dup}, out of order {disorder}; answer delay before the drill p50 {:.0} ms p99 {:.0} ms, during it p50 {:.0} ms p99 {:.0} ms max {:.0} ms; most sockets one app held at once {most}; apps on two sockets outside a refresh {}",
        (drill_end - drill_start).as_secs_f64(),
        rounds * bots,
        posts.len(),
        (rounds * bots).saturating_sub(posts.len() - dup),
        pct(&mut before, 0.5),
        pct(&mut before, 0.99),
        pct(&mut during, 0.5),
        pct(&mut during, 0.99),
        during.iter().max().copied().unwrap_or_default().as_secs_f64() * 1000.0,
        state.overlaps()
    );
    Ok(())
}
