//! Sends from the backend (`--only sends [--workers N] [--store sqlite|postgres] [--rate R]
//! [--seconds S] [--embedded]`): N `botfleet worker` processes (release build) on a private
//! Redis and a SQLite file (or a Postgres schema of `BOTFLEET_TEST_POSTGRES_URL`); 20 Telegram
//! bots polling the fake Bot API. `POST /api/v1/bots/{id}/messages` at R per second (open
//! loop) for S seconds, round-robin over the workers' APIs and 100 chats per bot, each with
//! a fresh `Idempotency-Key`: so most land on a worker that does not run the bot, which
//! journals the send and nudges the owner. Reported: request to 202 (recorded) and request to
//! the fake's receipt of the message, p50/p99, and the rate the sends went out at. With
//! `--store sqlite --workers 1 --embedded` the worker runs without Redis.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::bail;
use botfleet_core::{BotId, BotSpec, Platform};
use botfleet_testkit::{FakeTelegram, RedisServer};

use crate::{
    botfleet_bin,
    hooks::{arg, pct},
};

const BOTS: usize = 20;
const CHATS: usize = 100;

/// `--only sends`.
pub(crate) async fn api_sends() -> anyhow::Result<()> {
    let workers: usize = arg("--workers").map_or(Ok(1), |s| s.parse())?;
    let store_kind = arg("--store").unwrap_or_else(|| "sqlite".into());
    let rate: f64 = arg("--rate").map_or(Ok(1_000.0 * workers as f64), |s| s.parse())?;
    let seconds: f64 = arg("--seconds").map_or(Ok(10.0), |s| s.parse())?;
    let embedded = std::env::args().any(|a| a == "--embedded");
    let threads = arg("--worker-threads").unwrap_or_else(|| "2".into());
    let bin = botfleet_bin()?;
    let fake = FakeTelegram::start().await?;
    let (dir, _pg, db, store) = crate::hooks::registry("sends", &store_kind).await?;
    let token = |i: usize| format!("{}:sends-{i}", 21_000 + i);
    for i in 0..BOTS {
        fake.state().add_bot(&token(i));
        let mut s = BotSpec::new(BotId::new(format!("s{i}"))?, Platform::Telegram, token(i));
        s.options.api_url = Some(fake.url());
        store.add_bot(&s).await?;
    }
    let redis = if embedded {
        None
    } else {
        Some(RedisServer::start()?)
    };
    let mut procs = Vec::new();
    let mut apis = Vec::new();
    for w in 0..workers {
        let log = dir.0.join(format!("w{w}.log"));
        let mut args: Vec<String> = vec![
            "--worker-id".into(),
            format!("w{w}"),
            "--database-url".into(),
            db.clone(),
            "--worker-threads".into(),
            threads.clone(),
            "--poll-timeout-s".into(),
            "2".into(),
        ];
        if let Some(r) = &redis {
            args.extend(["--redis-url".into(), r.url()]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        procs.push(crate::hooks::spawn_logged(&bin, &refs, &log)?);
        apis.push(crate::hooks::http_url(&log).await?);
    }
    let t = Instant::now();
    while (0..BOTS).any(|i| !fake.state().is_polling(&token(i))) {
        if t.elapsed() > Duration::from_secs(60) {
            bail!("the bots never all polled");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(512)
        .timeout(Duration::from_secs(30))
        .build()?;
    let total = (rate * seconds) as usize;
    let posted_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let pids: Vec<u32> = procs.iter().map(|p| p.0.id()).collect();
    let cpu0: u64 = pids.iter().map(|p| crate::cpu_ticks(*p)).sum();
    let run = crate::hooks::offer(total, rate, |i| {
        let (http, api, posted_at) = (
            http.clone(),
            apis[i % apis.len()].clone(),
            posted_at.clone(),
        );
        async move {
            let text = format!("m{i}");
            let body = serde_json::json!({"chat": (1_000 + (i / BOTS) % CHATS).to_string(),
                "text": text});
            posted_at.lock().unwrap().insert(text, Instant::now());
            let r = http
                .post(format!("{api}/api/v1/bots/s{}/messages", i % BOTS))
                .header("idempotency-key", format!("bench-{i}"))
                .json(&body)
                .send()
                .await;
            r.is_ok_and(|r| r.status().as_u16() == 202)
        }
    })
    .await?;
    let (start, offered, refused) = (run.start, run.took, run.failed);
    let want = total - refused;
    let t = Instant::now();
    loop {
        let n = fake.state().sent_count();
        if n >= want {
            break;
        }
        if t.elapsed() > Duration::from_secs(120) {
            bail!("only {n} of {want} sent");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cpu_s = (pids.iter().map(|p| crate::cpu_ticks(*p)).sum::<u64>() - cpu0) as f64 / 100.0;
    let sent = fake.state().sent();
    let (lat, last) = crate::hooks::sent_after(&sent, &posted_at.lock().unwrap(), start);
    let elapsed = (last - start).as_secs_f64();
    let acc = run.accepted;
    println!(
        "API sends, {workers} worker(s) x {threads} threads, {store_kind} store{}, {BOTS} polling bots x {CHATS} chats: offered {:.0}/s for {:.1} s, accepted {} ({refused} refused), sent {} at {:.0}/s ({:.0}/s per worker); request to 202 p50 {:.1} ms p99 {:.1} ms; request to sent p50 {:.1} ms p99 {:.1} ms; worker CPU {:.0} % of a core per 1,000 sends/s",
        if embedded { " (embedded, no Redis)" } else { " + Redis" },
        total as f64 / offered.as_secs_f64(),
        offered.as_secs_f64(),
        acc.len(),
        lat.len(),
        lat.len() as f64 / elapsed,
        lat.len() as f64 / elapsed / workers as f64,
        pct(&acc, 0.5),
        pct(&acc, 0.99),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        cpu_s / lat.len().max(1) as f64 * 1000.0 * 100.0,
    );
    drop(procs);
    drop(store);
    Ok(())
}
