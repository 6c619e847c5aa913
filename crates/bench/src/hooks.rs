//! Webhook bots: what a chat's turn costs, and how many updates a worker answers end to end.
//!
//! - `--only turn`: on loopback Redis, the uncontended turn (ticket + turn in one call, then
//!   the release) against one plain coordinator round trip (an owner lookup), p50/p99 over
//!   10,000 iterations.
//! - `--only hooks [--workers N] [--store sqlite|postgres] [--rate R] [--seconds S]`: N
//!   `botfleet worker` processes (release build) on a private Redis and a SQLite file (or a
//!   Postgres schema of `BOTFLEET_TEST_POSTGRES_URL`); 20 Telegram webhook bots with the echo
//!   handler, 100 chats each; updates POSTed round-robin straight to the workers' hooks
//!   addresses at R per second (open loop) for S seconds. Each update is journaled, takes its
//!   turn, is echoed and sent to the fake Bot API; latency is from the POST to the fake's
//!   receipt of the reply. With `--store sqlite --workers 1 --embedded` the worker runs without
//!   Redis (the in-memory coordinator). `--handler text` puts a webhook handler (in this
//!   process) in place of echo, answering `{text}`; `--handler actions` one answering three
//!   actions (a send with two buttons under a ref, an edit of that ref, typing): latency is then
//!   to the fake's receipt of the edit.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use botfleet_coord::{Coordinator, RedisConfig, RedisCoordinator, Turn, WorkerMeta};
use botfleet_core::{BotId, BotSpec, Platform, Secret, WorkerId};
use botfleet_testkit::{nonce, FakeTelegram, PgSchema, RedisServer};

use crate::{botfleet_bin, Dir};

pub(crate) const SECRET: &str = "bench-secret";
const BOTS: usize = 20;
const CHATS: usize = 100;

pub(crate) fn arg(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

/// What [`offer`] did: when it began, how long offering took, the latencies (ms) of the
/// requests answered as hoped, and how many were not.
pub(crate) struct Offered {
    pub(crate) start: Instant,
    pub(crate) took: Duration,
    pub(crate) accepted: Vec<f64>,
    pub(crate) failed: usize,
}

/// An open-loop load: `total` requests at `rate` a second whatever the answers (at most 1,024
/// in flight), request `i` made by `request(i)` (true when answered as hoped), each timed;
/// waits until every one is answered.
pub(crate) async fn offer<F, Fut>(total: usize, rate: f64, request: F) -> anyhow::Result<Offered>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let accepted: Arc<Mutex<Vec<f64>>> = Arc::default();
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(1_024));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        let permit = gate.clone().acquire_owned().await?;
        let (accepted, failed, call) = (accepted.clone(), failed.clone(), request(i));
        tasks.spawn(async move {
            let t = Instant::now();
            if call.await {
                accepted
                    .lock()
                    .unwrap()
                    .push(t.elapsed().as_secs_f64() * 1e3);
            } else {
                failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    let took = start.elapsed();
    while tasks.join_next().await.is_some() {}
    let mut accepted = accepted.lock().unwrap().clone();
    accepted.sort_by(f64::total_cmp);
    Ok(Offered {
        start,
        took,
        accepted,
        failed: failed.load(std::sync::atomic::Ordering::Relaxed),
    })
}

/// Of the messages the fake received (`sent`), those posted at a known instant (`posted_at`,
/// by text): how long after, in ms, sorted; and when the last one came (`start` if none).
pub(crate) fn sent_after(
    sent: &[botfleet_testkit::Sent],
    posted_at: &std::collections::HashMap<String, Instant>,
    start: Instant,
) -> (Vec<f64>, Instant) {
    let mut lat: Vec<f64> = sent
        .iter()
        .filter_map(|s| Some((s.at - *posted_at.get(&s.text)?).as_secs_f64() * 1e3))
        .collect();
    lat.sort_by(f64::total_cmp);
    let last = sent.iter().map(|s| s.at).max().unwrap_or(start);
    (lat, last)
}

pub(crate) fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `--only turn [--sentinel]`: one Redis, or (`--sentinel`) a primary with one replica behind
/// Sentinels, measured with grants waiting for the replica (`--redis-min-replicas 1`, the
/// sentinel mode's default) and without (0).
pub(crate) async fn turn_overhead() -> anyhow::Result<()> {
    if std::env::args().any(|a| a == "--sentinel") {
        let setup = botfleet_testkit::SentinelSetup::start()?;
        for replicas in [0, 1] {
            let config = RedisConfig::new(setup.urls())
                .prefix(format!("b{}", nonce()))
                .sentinel(botfleet_testkit::SENTINEL_MASTER)
                .min_replicas(replicas);
            let what = format!("Redis behind Sentinel (a primary, one replica), grants waiting for {replicas} replica(s)");
            turn_rounds(config, &what).await?;
        }
        return Ok(());
    }
    let redis = RedisServer::start()?;
    let config = RedisConfig::new(redis.url()).prefix(format!("b{}", nonce()));
    turn_rounds(config, "loopback Redis").await
}

/// Times a coordinator's owner lookup, turn take and release, uncontended.
async fn turn_rounds(config: RedisConfig, what: &str) -> anyhow::Result<()> {
    let coord = RedisCoordinator::connect(config).await?;
    coord
        .register(
            &WorkerId::new("bench")?,
            &WorkerMeta {
                host: "bench".into(),
                capacity: 1,
                started_at_ms: 0,
                bots_held: 0,
                rss_bytes: 0,
            },
            Duration::from_secs(30),
        )
        .await?;
    let bot = BotId::new("b0")?;
    let n = 10_000;
    let (mut base, mut take, mut release) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n + 500 {
        let chat = format!("b0/{}", i % 64);
        let t = Instant::now();
        let _ = coord.owner(&bot).await?;
        let b = t.elapsed();
        let t = Instant::now();
        let (ticket, turn) = coord.turn_take(&chat, "k").await?;
        let tk = t.elapsed();
        let Turn::Granted { fence, .. } = turn else {
            bail!("an uncontended turn was not granted: {turn:?}");
        };
        let t = Instant::now();
        coord.turn_release(&chat, ticket, fence).await?;
        let r = t.elapsed();
        if i >= 500 {
            base.push(b.as_secs_f64() * 1e3);
            take.push(tk.as_secs_f64() * 1e3);
            release.push(r.as_secs_f64() * 1e3);
        }
    }
    for v in [&mut base, &mut take, &mut release] {
        v.sort_by(f64::total_cmp);
    }
    println!(
        "turn overhead, uncontended, {what}, {n} iterations: one coordinator round trip (owner lookup) p50 {:.3} ms p99 {:.3} ms; ticket + turn (before the handler) p50 {:.3} ms p99 {:.3} ms; release (after the send) p50 {:.3} ms p99 {:.3} ms",
        pct(&base, 0.5),
        pct(&base, 0.99),
        pct(&take, 0.5),
        pct(&take, 0.99),
        pct(&release, 0.5),
        pct(&release, 0.99),
    );
    Ok(())
}

/// A registry for a benchmark named `name`: a temp directory (removed on drop), and in it a
/// SQLite file, or (`kind` `postgres`) a Postgres schema of `BOTFLEET_TEST_POSTGRES_URL`
/// (dropped with the guard): the directory, the schema's guard, the URL and the store.
pub(crate) async fn registry(
    name: &str,
    kind: &str,
) -> anyhow::Result<(
    Dir,
    Option<PgSchema>,
    String,
    Arc<dyn botfleet_store::Store>,
)> {
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{name}-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let pg = if kind == "postgres" {
        Some(PgSchema::create().await)
    } else {
        None
    };
    let db = match &pg {
        Some(s) => s.url(),
        None => format!("sqlite://{}", dir.0.join("bots.db").display()),
    };
    let store = botfleet_store::open(&db).await?;
    Ok((dir, pg, db, store))
}

/// `--only hooks`.
pub(crate) async fn throughput() -> anyhow::Result<()> {
    let workers: usize = arg("--workers").map_or(Ok(1), |s| s.parse())?;
    let store_kind = arg("--store").unwrap_or_else(|| "sqlite".into());
    let rate: f64 = arg("--rate").map_or(Ok(2_000.0 * workers as f64), |s| s.parse())?;
    let seconds: f64 = arg("--seconds").map_or(Ok(10.0), |s| s.parse())?;
    let embedded = std::env::args().any(|a| a == "--embedded");
    let threads = arg("--worker-threads").unwrap_or_else(|| "2".into());
    let handler_kind = arg("--handler").unwrap_or_else(|| "echo".into());
    let handler = match handler_kind.as_str() {
        "echo" => None,
        "text" => Some(
            botfleet_testkit::ScriptedHandler::start(|ev| serde_json::json!({"text": ev["text"]}))
                .await,
        ),
        "actions" => Some(
            botfleet_testkit::ScriptedHandler::start(|ev| {
                let t = ev["text"].as_str().unwrap_or_default();
                serde_json::json!({"actions": [
                    {"type": "send", "text": t, "ref": "m",
                     "buttons": [[{"text": "Yes", "value": "y"}, {"text": "No", "value": "n"}]]},
                    {"type": "edit", "ref": "m", "text": format!("{t}!")},
                    {"type": "typing"},
                ]})
            })
            .await,
        ),
        other => bail!("--handler takes echo, text or actions, not {other}"),
    };
    let bin = botfleet_bin()?;
    let fake = FakeTelegram::start().await?;
    let (dir, _pg, db, store) = registry("hooks", &store_kind).await?;
    for i in 0..BOTS {
        let token = format!("{}:hooks-{i}", 20_000 + i);
        fake.state().add_bot(&token);
        let mut s = BotSpec::new(BotId::new(format!("h{i}"))?, Platform::Telegram, token);
        s.options.api_url = Some(fake.url());
        s.options.mode = Some("webhook".into());
        s.hook.secret = Some(Secret::new(SECRET));
        if let Some(h) = &handler {
            s.handler = botfleet_core::HandlerSpec::Webhook {
                url: h.url(),
                secret: None,
            };
        }
        store.add_bot(&s).await?;
    }
    let redis = if embedded {
        None
    } else {
        Some(RedisServer::start()?)
    };
    let mut procs = Vec::new();
    let mut hooks = Vec::new();
    for w in 0..workers {
        let log = dir.0.join(format!("w{w}.log"));
        let name = format!("w{w}");
        let mut args: Vec<String> = vec![
            "--worker-id".into(),
            name,
            "--database-url".into(),
            db.clone(),
            "--public-url".into(),
            "http://127.0.0.1:9".into(),
            "--worker-threads".into(),
            threads.clone(),
        ];
        if let Some(r) = &redis {
            args.extend(["--redis-url".into(), r.url()]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        procs.push(spawn_logged(&bin, &refs, &log)?);
        hooks.push(hooks_url(&log).await?);
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(512)
        .timeout(Duration::from_secs(30))
        .build()?;
    // Wait until every worker takes deliveries (registered, not 503).
    for h in &hooks {
        let t = Instant::now();
        loop {
            let r = post(&http, h, 0, 0, 0).await;
            if r.is_ok_and(|s| s == 200) {
                break;
            }
            if t.elapsed() > Duration::from_secs(30) {
                bail!("worker at {h} never took a delivery");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // The warm-up deliveries' replies, before counting.
    let t = Instant::now();
    while fake.state().sent_count() < hooks.len() && t.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let warm = fake.state().sent_count();
    let total = (rate * seconds) as usize;
    let sent_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let pids: Vec<u32> = procs.iter().map(|p| p.0.id()).collect();
    let cpu0: u64 = pids.iter().map(|p| crate::cpu_ticks(*p)).sum();
    let run = offer(total, rate, |i| {
        let (http, h, sent_at) = (
            http.clone(),
            hooks[i % hooks.len()].clone(),
            sent_at.clone(),
        );
        async move {
            let id = i + 1;
            sent_at
                .lock()
                .unwrap()
                .insert(id.to_string(), Instant::now());
            post(&http, &h, i % BOTS, (i / BOTS) % CHATS, id)
                .await
                .is_ok_and(|s| s == 200)
        }
    })
    .await?;
    let (start, offered, failures) = (run.start, run.took, run.failed);
    let want = warm + total - failures;
    let actions = handler_kind == "actions";
    // What marks an update answered: its reply, or (actions) the edit of its reply.
    let answers = || -> Vec<(String, Instant)> {
        if actions {
            (0..BOTS)
                .flat_map(|i| {
                    fake.state()
                        .calls(&format!("{}:hooks-{i}", 20_000 + i), "editMessageText")
                })
                .map(|c| {
                    let t = c.args["text"].as_str().unwrap_or_default();
                    (t.trim_end_matches('!').to_owned(), c.at)
                })
                .collect()
        } else {
            fake.state()
                .sent()
                .into_iter()
                .map(|s| (s.text, s.at))
                .collect()
        }
    };
    let t = Instant::now();
    loop {
        let n = answers().len();
        if n >= want {
            break;
        }
        if t.elapsed() > Duration::from_secs(120) {
            bail!("only {n} of {want} answered");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cpu_s = (pids.iter().map(|p| crate::cpu_ticks(*p)).sum::<u64>() - cpu0) as f64 / 100.0;
    let sent = answers();
    let mut lat: Vec<f64> = {
        let at = sent_at.lock().unwrap();
        sent.iter()
            .filter_map(|(text, when)| Some((*when - *at.get(text)?).as_secs_f64() * 1e3))
            .collect()
    };
    let last = sent.iter().map(|s| s.1).max().unwrap_or(start);
    let elapsed = (last - start).as_secs_f64();
    lat.sort_by(f64::total_cmp);
    let acks = run.accepted;
    let mut window = (0.0, 0u64);
    for i in 0..hooks.len() {
        if let Some((s, c)) = outbox_window(&http, i).await {
            window.0 += s;
            window.1 += c;
        }
    }
    println!(
        "webhook throughput, {workers} worker(s) x {threads} threads, {} store{}, {BOTS} bots x {CHATS} chats, handler {handler_kind}: offered {:.0}/s for {:.1} s, answered {} ({} refused) at {:.0}/s ({:.0}/s per worker); POST to reply p50 {:.1} ms p99 {:.1} ms; POST to 2xx (journaled) p50 {:.1} ms p99 {:.1} ms; outbox window (send accepted to record written) mean {:.2} ms; worker CPU {:.0} % of a core per 1,000 updates/s",
        store_kind,
        if embedded { " (embedded, no Redis)" } else { " + Redis" },
        total as f64 / offered.as_secs_f64(),
        offered.as_secs_f64(),
        lat.len(),
        failures,
        lat.len() as f64 / elapsed,
        lat.len() as f64 / elapsed / workers as f64,
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&acks, 0.5),
        pct(&acks, 0.99),
        if window.1 > 0 { window.0 / window.1 as f64 * 1e3 } else { f64::NAN },
        cpu_s / lat.len() as f64 * 1000.0 * 100.0,
    );
    drop(procs);
    drop(store);
    Ok(())
}

/// `(sum, count)` of a worker's outbox window histogram, from its metrics endpoint.
async fn outbox_window(http: &reqwest::Client, i: usize) -> Option<(f64, u64)> {
    let url = METRICS.lock().unwrap().get(i)?.clone();
    let text = http
        .get(format!("{url}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let num = |name: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(name))?
            .rsplit(' ')
            .next()?
            .parse()
            .ok()
    };
    Some((
        num("botfleet_outbox_window_seconds_sum")?,
        num("botfleet_outbox_window_seconds_count")? as u64,
    ))
}

/// The metrics URLs of the workers started, in order.
static METRICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Posts the Telegram update `id` (`text` from the user of private chat `chat`) to the
/// webhook address `url`: the answer's status.
pub(crate) async fn post_update(
    http: &reqwest::Client,
    url: &str,
    id: usize,
    chat: i64,
    text: &str,
) -> anyhow::Result<u16> {
    let body = serde_json::json!({
        "update_id": id,
        "message": {"message_id": id, "date": 1_700_000_000,
                    "chat": {"id": chat, "type": "private"},
                    "from": {"id": chat, "is_bot": false, "first_name": "u"},
                    "text": text}
    });
    let r = http
        .post(url)
        .header("X-Telegram-Bot-Api-Secret-Token", SECRET)
        .json(&body)
        .send()
        .await?;
    Ok(r.status().as_u16())
}

async fn post(
    http: &reqwest::Client,
    hooks: &str,
    bot: usize,
    chat: usize,
    id: usize,
) -> anyhow::Result<u16> {
    let body = serde_json::json!({
        "update_id": id,
        "message": {"message_id": id, "date": 1_700_000_000,
                    "chat": {"id": 1_000 + chat, "type": "private"},
                    "from": {"id": 1_000 + chat, "is_bot": false, "first_name": "u"},
                    "text": id.to_string()}
    });
    let r = http
        .post(format!("{hooks}/hooks/telegram/h{bot}"))
        .header("X-Telegram-Bot-Api-Secret-Token", SECRET)
        .json(&body)
        .send()
        .await?;
    Ok(r.status().as_u16())
}

pub(crate) fn spawn_logged(
    bin: &std::path::Path,
    args: &[&str],
    log: &std::path::Path,
) -> anyhow::Result<crate::Worker> {
    // `$BOTFLEET_BENCH_WRAP` runs it under a profiler, as for `spawn`.
    let wrap = std::env::var("BOTFLEET_BENCH_WRAP").unwrap_or_default();
    let mut wrap = wrap.split_whitespace();
    let mut cmd = match wrap.next() {
        Some(tool) => {
            let mut c = std::process::Command::new(tool);
            c.args(wrap).arg(bin);
            c
        }
        None => std::process::Command::new(bin),
    };
    cmd.arg("worker")
        .args(["--http-addr", "127.0.0.1:0", "--hooks-addr", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "warn")
        .env("BOTFLEET_RATE_LIMITS", crate::rate_limits())
        .env_remove("BOTFLEET_API_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log)?);
    Ok(crate::Worker(
        cmd.spawn().context("starting botfleet worker")?,
    ))
}

/// A worker's HTTP address (its API), from its log.
pub(crate) async fn http_url(log: &std::path::Path) -> anyhow::Result<String> {
    let t = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(m) = text.lines().find_map(|l| l.split(" listening on ").nth(1)) {
            return Ok(m.trim().to_owned());
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("no HTTP address in {}:\n{text}", log.display());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn hooks_url(log: &std::path::Path) -> anyhow::Result<String> {
    let t = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let hooks = text.lines().find_map(|l| l.split(" hooks on ").nth(1));
        let http = text.lines().find_map(|l| l.split(" listening on ").nth(1));
        if let (Some(h), Some(m)) = (hooks, http) {
            METRICS.lock().unwrap().push(m.trim().to_owned());
            return Ok(h.trim().to_owned());
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("no hooks address in {}:\n{text}", log.display());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
