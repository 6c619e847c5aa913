//! `botfleet demo`: the fleet at work, in one process, with nothing to set up: Telegram,
//! Slack and Discord bots in one pool of three workers, and Telegram webhook bots answered by
//! every worker behind a round-robin balancer; users writing on all of them; one worker is
//! killed midway and another joins; then a report per platform.

use std::{
    collections::HashMap,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context;
use botfleet_coord::{Coordinator, MemoryCoordinator, MemoryHub};
use botfleet_core::{BotId, BotSpec, Platform, Secret, WorkerId};
use botfleet_discord::fake::FakeDiscord;
use botfleet_runtime::{Journal, Metrics, Worker, WorkerConfig};
use botfleet_slack::fake::FakeSlack;
use botfleet_store::{MemoryStore, Store};
use botfleet_telegram::fake::FakeTelegram;
use clap::Args;
use tokio::{sync::oneshot, task::JoinHandle};

/// Flags of `botfleet demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// How many bots in all (1-5000).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=5_000))]
    bots: u32,
    /// Percent of them on Slack (0-100).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=100))]
    slack_percent: u32,
    /// Percent of them on Discord, two shards each (0-100); the rest on Telegram.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=100))]
    discord_percent: u32,
    /// Percent of them Telegram bots in webhook mode (0-100): Telegram POSTs their updates to
    /// every worker through a round-robin balancer, and each chat still gets one turn at a time.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=100))]
    webhook_percent: u32,
    /// How long users write, in seconds (10-600).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(10..=600))]
    duration_s: u64,
    /// Messages users write per second, over all bots (1-5000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=5_000))]
    rate: u32,
    /// The workers' lease in ms (1000-60000): how long a dead worker's bots wait.
    #[arg(long, default_value_t = 3_000, value_parser = clap::value_parser!(u64).range(1_000..=60_000))]
    lease_ms: u64,
    /// Where the live fleet page and the control API listen (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    http_addr: std::net::SocketAddr,
    /// Seconds to wait, page up, before users start writing (0-600): time to open the page.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=600))]
    wait_s: u64,
    /// Keep serving the page after the report, until Ctrl-C.
    #[arg(long)]
    stay: bool,
}

struct DemoWorker {
    id: WorkerId,
    handle: MemoryCoordinator,
    metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// Its hooks address (webhook bots), and the task serving it.
    hooks_url: String,
    hooks_task: JoinHandle<()>,
    alive: bool,
    /// Sends from the backend through it.
    sends: botfleet_runtime::Sends,
    /// The parts of answers that come later, taken in through it.
    replies: botfleet_runtime::Replies,
}

/// One demo bot: which platform, its tokens.
struct DemoBot {
    id: BotId,
    platform: Platform,
    /// Telegram token, or Slack bot token.
    token: String,
    /// A Telegram bot in webhook mode.
    webhook: bool,
}

/// The secret token of the demo's Telegram webhook bots.
const DEMO_SECRET: &str = "demo-secret";

async fn start_worker(
    name: &str,
    hub: &MemoryHub,
    store: Arc<dyn Store>,
    lease: Duration,
    journal: &Arc<Journal>,
    public_url: &str,
) -> anyhow::Result<DemoWorker> {
    let id = WorkerId::new(name)?;
    let mut cfg = WorkerConfig::new(id.clone());
    cfg.lease = lease;
    cfg.reconcile_every = Duration::from_millis(250);
    cfg.telegram.poll_timeout = Duration::from_secs(5);
    cfg.telegram.public_url = Some(public_url.to_owned());
    let handle = hub.coordinator();
    let mut worker = Worker::new(cfg, Arc::new(handle.clone()) as Arc<dyn Coordinator>, store)?
        .with_journal(journal.clone());
    let metrics = worker.metrics();
    let sends = worker.sends();
    let replies = worker.replies();
    let (hooks_addr, hooks_task) = botfleet_runtime::http::serve_router(
        "127.0.0.1:0".parse().context("loopback")?,
        worker.hooks().router(),
    )
    .await
    .context("binding a hooks address")?;
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        if let Err(e) = worker
            .run(async {
                let _ = rx.await;
            })
            .await
        {
            eprintln!("worker stopped with an error: {e}");
        }
    });
    Ok(DemoWorker {
        id,
        handle,
        metrics,
        stop: Some(tx),
        task,
        hooks_url: format!("http://{hooks_addr}"),
        hooks_task,
        alive: true,
        sends,
        replies,
    })
}

/// The load balancer in front of the workers' hooks addresses: each request to the next
/// worker in turn, skipping one that does not answer (killed).
#[derive(Clone, Default)]
struct Balancer {
    backends: Arc<std::sync::Mutex<Vec<String>>>,
    next: Arc<std::sync::atomic::AtomicUsize>,
    http: reqwest::Client,
}

impl Balancer {
    fn set(&self, urls: Vec<String>) {
        *self.backends.lock().unwrap_or_else(|e| e.into_inner()) = urls;
    }

    async fn forward(
        &self,
        path: &str,
        headers: &axum::http::HeaderMap,
        body: axum::body::Bytes,
    ) -> axum::response::Response {
        use axum::response::IntoResponse;
        let backends = self
            .backends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for _ in 0..backends.len() {
            let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % backends.len();
            let mut req = self
                .http
                .post(format!("{}{path}", backends[i]))
                .body(body.clone());
            for (k, v) in headers {
                if k != "host" && k != "content-length" {
                    req = req.header(k, v);
                }
            }
            if let Ok(r) = req.send().await {
                let status = r.status();
                return (status, r.bytes().await.unwrap_or_default()).into_response();
            }
        }
        (axum::http::StatusCode::BAD_GATEWAY, "no worker answered").into_response()
    }
}

/// Serves `balancer` on a loopback port; answers its URL.
async fn serve_balancer(balancer: Balancer) -> anyhow::Result<(String, JoinHandle<()>)> {
    let app = axum::Router::new().fallback(
        move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let b = balancer.clone();
            async move { b.forward(uri.path(), &headers, body).await }
        },
    );
    let (addr, task) =
        botfleet_runtime::http::serve_router("127.0.0.1:0".parse().context("loopback")?, app)
            .await
            .context("binding the demo's balancer")?;
    Ok((format!("http://{addr}"), task))
}

fn view(t: Duration, ws: &[DemoWorker], fakes: &Fakes, written: u64) -> String {
    let mut line = format!("t={:>3}s ", t.as_secs());
    for w in ws.iter().filter(|w| w.alive) {
        line.push_str(&format!(
            " {}:{:>4}",
            w.id,
            w.metrics.running_now(Platform::Telegram) + w.metrics.running_now(Platform::Slack)
        ));
    }
    line.push_str(&format!(
        "  | polling {:>4}  sockets {:>4}  shards {:>4}  written {:>6}  answered {:>6}",
        fakes.telegram.state().polling_tokens(),
        fakes.slack.state().connected_apps(),
        fakes.discord.state().connected_total(),
        written,
        fakes.telegram.state().sent_count()
            + fakes.slack.state().sent().len()
            + fakes.discord.state().sent().len()
    ));
    line
}

struct Fakes {
    telegram: FakeTelegram,
    slack: FakeSlack,
    discord: FakeDiscord,
}

/// What users wrote and bots answered, per (bot token, chat): the texts in order.
type Chats = HashMap<(String, String), Vec<String>>;

impl Fakes {
    fn answered(&self) -> HashMap<Platform, Chats> {
        let mut tg: Chats = HashMap::new();
        for s in self.telegram.state().sent() {
            tg.entry((s.token, s.chat_id)).or_default().push(s.text);
        }
        let mut sl: Chats = HashMap::new();
        for p in self.slack.state().sent() {
            sl.entry((p.token, p.channel)).or_default().push(p.text);
        }
        let mut dc: Chats = HashMap::new();
        for p in self.discord.state().sent() {
            dc.entry((p.token, p.channel)).or_default().push(p.content);
        }
        [
            (Platform::Telegram, tg),
            (Platform::Slack, sl),
            (Platform::Discord, dc),
        ]
        .into_iter()
        .collect()
    }

    fn user_writes(&self, bot: &DemoBot, chat: u32, text: &str) -> (String, String) {
        match bot.platform {
            Platform::Slack => {
                let channel = format!("C{chat}");
                self.slack
                    .state()
                    .user_writes(&bot.token, &channel, None, text);
                (bot.token.clone(), channel)
            }
            Platform::Discord => {
                self.discord
                    .state()
                    .user_writes(&bot.token, u64::from(chat), text);
                (bot.token.clone(), chat.to_string())
            }
            _ => {
                self.telegram
                    .state()
                    .user_writes(&bot.token, i64::from(chat), text);
                (bot.token.clone(), chat.to_string())
            }
        }
    }

    /// How many of `bots` were served (polled, or a socket opened) since `since`.
    fn served_since(&self, bots: &[&DemoBot], since: Instant) -> usize {
        let of = |p: Platform| -> Vec<String> {
            bots.iter()
                .filter(|b| b.platform == p && !b.webhook)
                .map(|b| b.token.clone())
                .collect()
        };
        // A webhook bot is served by every worker once its webhook is set.
        let hooked = bots
            .iter()
            .filter(|b| b.webhook && self.telegram.state().webhook(&b.token).is_some())
            .count();
        hooked
            + self
                .telegram
                .state()
                .polled_since_among(&of(Platform::Telegram), since)
            + self
                .slack
                .state()
                .connected_since_among(&of(Platform::Slack), since)
            + self
                .discord
                .state()
                .served_since_among(&of(Platform::Discord), since)
    }
}

pub(crate) async fn run(a: DemoArgs) -> anyhow::Result<ExitCode> {
    crate::common::init_logs("error");
    let fakes = Fakes {
        telegram: FakeTelegram::start().await?,
        slack: FakeSlack::start().await?,
        discord: FakeDiscord::start().await?,
    };
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let slack_bots = a.bots * a.slack_percent / 100;
    let discord_bots = (a.bots * a.discord_percent / 100).min(a.bots - slack_bots);
    let webhook_bots = (a.bots * a.webhook_percent / 100).min(a.bots - slack_bots - discord_bots);
    let mut bots = Vec::new();
    for i in 0..a.bots {
        let id = BotId::new(format!("demo-{i}"))?;
        let bot = if i < slack_bots {
            let (token, app) = (format!("xoxb-demo-{i}"), format!("xapp-demo-{i}"));
            fakes.slack.state().add_app(&token, &app);
            let mut spec = BotSpec::new(id.clone(), Platform::Slack, token.clone());
            spec.app_token = Some(Secret::new(app));
            spec.options.api_url = Some(fakes.slack.url());
            store.add_bot(&spec).await?;
            DemoBot {
                id,
                platform: Platform::Slack,
                token,
                webhook: false,
            }
        } else if i < slack_bots + discord_bots {
            let token = format!("DISCORD.demo.{i}");
            fakes.discord.state().add_bot(&token, 2, 2);
            let mut spec = BotSpec::new(id.clone(), Platform::Discord, token.clone());
            spec.options.api_url = Some(fakes.discord.url());
            store.add_bot(&spec).await?;
            DemoBot {
                id,
                platform: Platform::Discord,
                token,
                webhook: false,
            }
        } else {
            let webhook = i < slack_bots + discord_bots + webhook_bots;
            let token = format!("{}:demo-{i}", 100_000 + i);
            fakes.telegram.state().add_bot(&token);
            let mut spec = BotSpec::new(id.clone(), Platform::Telegram, token.clone());
            spec.options.api_url = Some(fakes.telegram.url());
            if webhook {
                spec.options.mode = Some("webhook".into());
                spec.hook.secret = Some(Secret::new(DEMO_SECRET));
            }
            store.add_bot(&spec).await?;
            DemoBot {
                id,
                platform: Platform::Telegram,
                token,
                webhook,
            }
        };
        bots.push(bot);
    }
    let hub = MemoryHub::new();
    let lease = Duration::from_millis(a.lease_ms);
    let journal = Journal::new(botfleet_runtime::JOURNAL_CAPACITY);
    let balancer = Balancer::default();
    let (public_url, balancer_task) = serve_balancer(balancer.clone()).await?;
    let mut ws = Vec::new();
    for i in 0..3 {
        ws.push(
            start_worker(
                &format!("worker-{i}"),
                &hub,
                store.clone(),
                lease,
                &journal,
                &public_url,
            )
            .await?,
        );
    }
    // The live page and the API, over the demo's own registry and coordination; sends from
    // the backend go through worker-0 (the run kills worker-1).
    let probe: Arc<dyn Coordinator> = Arc::new(hub.coordinator());
    let router = crate::api::routes(crate::api::ApiState {
        registry: crate::registry::Registry {
            store: store.clone(),
            fleet: Some(probe.clone()),
        },
        coord: probe,
        mode: "demo",
        journal: journal.clone(),
        token_digest: None,
        fleet_cache: Default::default(),
        sends: Some(ws[0].sends.clone()),
        metrics: None,
    })
    // Later answers' parts too, through worker-0 as any worker takes them.
    .merge(ws[0].replies.router());
    let (addr, http_task) = botfleet_runtime::http::serve_router(a.http_addr, router)
        .await
        .with_context(|| format!("binding {} (--http-addr)", a.http_addr))?;
    println!("watch it live: http://{addr}/");
    balancer.set(ws.iter().map(|w| w.hooks_url.clone()).collect());
    println!(
        "botfleet demo: {} bots ({} Telegram of which {webhook_bots} by webhook through a balancer to every worker, {slack_bots} Slack, {discord_bots} Discord of 2 shards), 3 workers, users writing {} msg/s for {} s, lease {} ms",
        a.bots,
        a.bots - slack_bots - discord_bots,
        a.rate,
        a.duration_s,
        a.lease_ms
    );
    let start = Instant::now();
    let all: Vec<&DemoBot> = bots.iter().collect();
    while fakes.served_since(&all, start) < bots.len() && start.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("all {} bots connected after {:?}", a.bots, start.elapsed());
    if a.wait_s > 0 {
        println!("users start writing in {} s", a.wait_s);
        tokio::time::sleep(Duration::from_secs(a.wait_s)).await;
    }

    // Users write c<chat>-<n>: each chat's messages must come back once each, in order.
    let mut expected: HashMap<Platform, Chats> = HashMap::new();
    let mut next_n: HashMap<(u32, u32), u32> = HashMap::new();
    let (mut written, mut seed) = (0u64, 0x9e37_79b9u64);
    let t0 = Instant::now();
    let total = Duration::from_secs(a.duration_s);
    let (kill_at, join_at) = (total / 3, total * 2 / 3);
    let mut killed: Option<(Instant, Vec<usize>)> = None;
    let mut joined = false;
    let mut reclaim: Option<Duration> = None;
    let mut last_view = Instant::now();
    let tick = Duration::from_millis(50);
    let per_tick = (f64::from(a.rate) * tick.as_secs_f64()).max(1.0) as u32;
    let probe = hub.coordinator();
    while t0.elapsed() < total {
        for _ in 0..per_tick {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let b = (seed % u64::from(a.bots)) as usize;
            let chat = ((seed >> 32) % 3) as u32;
            let n = next_n.entry((b as u32, chat)).or_default();
            let text = format!("c{chat}-{n}");
            *n += 1;
            let key = fakes.user_writes(&bots[b], chat + 1, &text);
            expected
                .entry(bots[b].platform)
                .or_default()
                .entry(key)
                .or_default()
                .push(text);
            written += 1;
        }
        if killed.is_none() && t0.elapsed() >= kill_at {
            // kill -9, in one process: the worker's coordinator handle dies and its loop stops.
            let victim = ws[1].id.clone();
            let mut moved = Vec::new();
            for (i, b) in bots.iter().enumerate().filter(|(_, b)| !b.webhook) {
                if let Ok(Some(o)) = probe.owner(&b.id).await {
                    if o.worker == victim && o.live {
                        moved.push(i);
                    }
                }
            }
            let w = &mut ws[1];
            hub.crash(&w.handle);
            w.task.abort();
            w.hooks_task.abort();
            w.alive = false;
            killed = Some((Instant::now(), moved));
            println!(
                "{}  -> {victim} killed",
                view(t0.elapsed(), &ws, &fakes, written)
            );
        }
        if let (Some((k, moved)), None) = (&killed, reclaim) {
            // The victim's bots are back once each was served again by a survivor.
            let moved: Vec<&DemoBot> = moved.iter().map(|i| &bots[*i]).collect();
            if fakes.served_since(&moved, *k) == moved.len() {
                reclaim = Some(k.elapsed());
                println!(
                    "{}  -> the {} bots it ran are back on the survivors {:?} after the kill",
                    view(t0.elapsed(), &ws, &fakes, written),
                    moved.len(),
                    k.elapsed()
                );
            }
        }
        if !joined && t0.elapsed() >= join_at {
            ws.push(
                start_worker(
                    "worker-3",
                    &hub,
                    store.clone(),
                    lease,
                    &journal,
                    &public_url,
                )
                .await?,
            );
            balancer.set(
                ws.iter()
                    .filter(|w| w.alive)
                    .map(|w| w.hooks_url.clone())
                    .collect(),
            );
            joined = true;
            println!(
                "{}  -> worker-3 joins",
                view(t0.elapsed(), &ws, &fakes, written)
            );
        }
        if last_view.elapsed() >= Duration::from_secs(1) {
            println!("{}", view(t0.elapsed(), &ws, &fakes, written));
            last_view = Instant::now();
        }
        tokio::time::sleep(tick).await;
    }
    // Let the last answers arrive: until every message written has an answer (counting
    // answers would let a duplicate stand in for a missing one), at most 15 s.
    let settle = Instant::now();
    let all_answered = || {
        let got = fakes.answered();
        expected.iter().all(|(p, chats)| {
            chats.iter().all(|(k, want)| {
                got[p]
                    .get(k)
                    .is_some_and(|g| want.iter().all(|t| g.contains(t)))
            })
        })
    };
    while !all_answered() && settle.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("{}", view(t0.elapsed(), &ws, &fakes, written));
    let mut got = fakes.answered();
    println!("\nreport");
    println!("  messages written      {written}");
    let mut failed = false;
    for p in [Platform::Telegram, Platform::Slack, Platform::Discord] {
        let want = expected.remove(&p).unwrap_or_default();
        let have_all = got.remove(&p).unwrap_or_default();
        let (lost, duplicated, out_of_order) = tally(&want, have_all);
        let written_p: usize = want.values().map(Vec::len).sum();
        println!(
            "  {:<9} written {written_p:>6}  lost {lost}  duplicated {duplicated}  chats out of order {out_of_order}",
            p.as_str()
        );
        failed |= lost > 0 || out_of_order > 0;
    }
    let conflicts = fakes.telegram.state().conflicts();
    let overlaps = fakes.slack.state().overlaps();
    let discord_tokens: Vec<&DemoBot> = bots
        .iter()
        .filter(|b| b.platform == Platform::Discord)
        .collect();
    let two_sessions = discord_tokens
        .iter()
        .filter(|b| fakes.discord.state().max_sessions_per_shard(&b.token) > 1)
        .count();
    let identifies: u64 = discord_tokens
        .iter()
        .map(|b| fakes.discord.state().identifies(&b.token))
        .sum();
    let resumes: u64 = discord_tokens
        .iter()
        .map(|b| fakes.discord.state().resumes(&b.token))
        .sum();
    println!("  Telegram second pollers (409)       {conflicts}");
    let d = fakes.telegram.state().deliveries();
    println!(
        "  Telegram webhook deliveries         {} taken, {} retried (a worker down or draining)",
        d.delivered, d.failed
    );
    println!("  Slack sockets held by two workers  {overlaps}");
    println!(
        "  Discord shards run twice            {two_sessions}; {identifies} IDENTIFYs for {} shards, {resumes} RESUMEs (a moved bot resumes)",
        discord_tokens.len() * 2
    );
    let mut acks = fakes.slack.state().ack_latencies();
    if !acks.is_empty() {
        acks.sort();
        println!(
            "  Slack envelope ack p99              {:?} (Slack allows 3 s)",
            acks[(acks.len() * 99 / 100).min(acks.len() - 1)]
        );
    }
    match reclaim {
        Some(d) => println!(
            "  kill -> the victim's bots back     {d:?} (lease {} ms)",
            a.lease_ms
        ),
        None => println!("  kill -> bots back                  not within the run"),
    }
    if a.stay {
        println!("\nthe page stays up at http://{addr}/ — Ctrl-C to end");
        let _ = tokio::signal::ctrl_c().await;
    }
    for w in &mut ws {
        if let Some(s) = w.stop.take() {
            let _ = s.send(());
        }
    }
    for w in ws {
        let _ = tokio::time::timeout(Duration::from_secs(10), w.task).await;
        w.hooks_task.abort();
    }
    balancer_task.abort();
    http_task.abort();
    Ok(
        if failed || conflicts > 0 || overlaps > 0 || two_sessions > 0 {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        },
    )
}

/// Lost, duplicated, and chats whose first answers are out of the written order.
fn tally(want: &Chats, mut got: Chats) -> (usize, usize, usize) {
    let (mut lost, mut duplicated, mut out_of_order) = (0usize, 0usize, 0usize);
    for (chat, want) in want {
        let have = got.remove(chat).unwrap_or_default();
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for t in &have {
            *seen.entry(t.as_str()).or_default() += 1;
        }
        lost += want
            .iter()
            .filter(|t| !seen.contains_key(t.as_str()))
            .count();
        duplicated += seen.values().map(|c| c - 1).sum::<usize>();
        let mut firsts = Vec::new();
        for t in &have {
            if !firsts.contains(t) {
                firsts.push(t.clone());
            }
        }
        let sub: Vec<&String> = want.iter().filter(|t| firsts.contains(t)).collect();
        if sub.iter().zip(firsts.iter()).any(|(a, b)| *a != b) {
            out_of_order += 1;
        }
    }
    (lost, duplicated, out_of_order)
}
