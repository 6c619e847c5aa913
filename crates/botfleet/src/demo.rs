//! `botfleet demo`: the fleet at work, in one process, with nothing to set up.

use std::{
    collections::HashMap,
    process::ExitCode,
    sync::Arc,
    time::{Duration, Instant},
};

use botfleet_coord::{Coordinator, MemoryCoordinator, MemoryHub};
use botfleet_core::{BotId, BotSpec, Platform, WorkerId};
use botfleet_runtime::{Metrics, Worker, WorkerConfig};
use botfleet_store::{MemoryStore, Store};
use botfleet_telegram::fake::FakeTelegram;
use clap::Args;
use tokio::{sync::oneshot, task::JoinHandle};

/// Flags of `botfleet demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// How many bots (1-5000).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(1..=5_000))]
    bots: u32,
    /// How long users write, in seconds (10-600).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(10..=600))]
    duration_s: u64,
    /// Messages users write per second, over all bots (1-5000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=5_000))]
    rate: u32,
    /// The workers' lease in ms (1000-60000): how long a dead worker's bots wait.
    #[arg(long, default_value_t = 3_000, value_parser = clap::value_parser!(u64).range(1_000..=60_000))]
    lease_ms: u64,
}

struct DemoWorker {
    id: WorkerId,
    handle: MemoryCoordinator,
    metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    alive: bool,
}

fn token(i: u32) -> String {
    format!("{}:demo-{i}", 100_000 + i)
}

fn start_worker(
    name: &str,
    hub: &MemoryHub,
    store: Arc<dyn Store>,
    lease: Duration,
) -> anyhow::Result<DemoWorker> {
    let id = WorkerId::new(name)?;
    let mut cfg = WorkerConfig::new(id.clone());
    cfg.lease = lease;
    cfg.connect_rate = 500.0;
    cfg.reconcile_every = Duration::from_millis(250);
    cfg.telegram.poll_timeout = Duration::from_secs(5);
    let handle = hub.coordinator();
    let worker = Worker::new(cfg, Arc::new(handle.clone()) as Arc<dyn Coordinator>, store)?;
    let metrics = worker.metrics();
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
        alive: true,
    })
}

fn view(t: Duration, ws: &[DemoWorker], fake: &FakeTelegram, written: u64) -> String {
    let mut line = format!("t={:>3}s ", t.as_secs());
    for w in ws.iter().filter(|w| w.alive) {
        line.push_str(&format!(
            " {}:{:>4}",
            w.id,
            w.metrics.running_now(Platform::Telegram)
        ));
    }
    line.push_str(&format!(
        "  | polling {:>4}  written {:>6}  answered {:>6}",
        fake.state().polling_tokens(),
        written,
        fake.state().sent_count()
    ));
    line
}

pub(crate) async fn run(a: DemoArgs) -> anyhow::Result<ExitCode> {
    crate::common::init_logs("error");
    let fake = FakeTelegram::start().await?;
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    for i in 0..a.bots {
        fake.state().add_bot(&token(i));
        let mut spec = BotSpec::new(
            BotId::new(format!("demo-{i}"))?,
            Platform::Telegram,
            token(i),
        );
        spec.options.api_url = Some(fake.url());
        store.add_bot(&spec).await?;
    }
    let hub = MemoryHub::new();
    let lease = Duration::from_millis(a.lease_ms);
    let mut ws = Vec::new();
    for i in 0..3 {
        ws.push(start_worker(
            &format!("worker-{i}"),
            &hub,
            store.clone(),
            lease,
        )?);
    }
    println!(
        "botfleet demo: {} bots, 3 workers, users writing {} msg/s for {} s, lease {} ms",
        a.bots, a.rate, a.duration_s, a.lease_ms
    );
    let start = Instant::now();
    while fake.state().polling_tokens() < a.bots as usize
        && start.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("all {} bots polling after {:?}", a.bots, start.elapsed());

    // Users write c<chat>-<n>: each chat's messages must come back once each, in order.
    let mut expected: HashMap<(String, String), Vec<String>> = HashMap::new();
    let mut next_n: HashMap<(u32, u32), u32> = HashMap::new();
    let (mut written, mut seed) = (0u64, 0x9e37_79b9u64);
    let t0 = Instant::now();
    let total = Duration::from_secs(a.duration_s);
    let (kill_at, join_at) = (total / 3, total * 2 / 3);
    let (mut killed, mut joined) = (None::<Instant>, false);
    let mut reclaim: Option<Duration> = None;
    let mut last_view = Instant::now();
    let tick = Duration::from_millis(50);
    let per_tick = (f64::from(a.rate) * tick.as_secs_f64()).max(1.0) as u32;
    while t0.elapsed() < total {
        for _ in 0..per_tick {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let bot = (seed % u64::from(a.bots)) as u32;
            let chat = ((seed >> 32) % 3) as u32;
            let n = next_n.entry((bot, chat)).or_default();
            let text = format!("c{chat}-{n}");
            *n += 1;
            fake.state()
                .user_writes(&token(bot), i64::from(chat) + 1, &text);
            expected
                .entry((token(bot), (chat + 1).to_string()))
                .or_default()
                .push(text);
            written += 1;
        }
        if killed.is_none() && t0.elapsed() >= kill_at {
            // kill -9, in one process: the worker's coordinator handle dies and its loop stops.
            let w = &mut ws[1];
            hub.crash(&w.handle);
            w.task.abort();
            w.alive = false;
            let name = w.id.clone();
            killed = Some(Instant::now());
            println!(
                "{}  -> {name} killed",
                view(t0.elapsed(), &ws, &fake, written)
            );
        }
        if let (Some(k), None) = (killed, reclaim) {
            let survivors: i64 = ws
                .iter()
                .filter(|w| w.alive)
                .map(|w| w.metrics.running_now(Platform::Telegram))
                .sum();
            // Every bot polled since the kill: the survivors serve them all.
            if survivors == i64::from(a.bots) && fake.state().polled_since(k) == a.bots as usize {
                reclaim = Some(k.elapsed());
                println!(
                    "{}  -> all bots running on the survivors {:?} after the kill",
                    view(t0.elapsed(), &ws, &fake, written),
                    k.elapsed()
                );
            }
        }
        if !joined && t0.elapsed() >= join_at {
            ws.push(start_worker("worker-3", &hub, store.clone(), lease)?);
            joined = true;
            println!(
                "{}  -> worker-3 joins",
                view(t0.elapsed(), &ws, &fake, written)
            );
        }
        if last_view.elapsed() >= Duration::from_secs(1) {
            println!("{}", view(t0.elapsed(), &ws, &fake, written));
            last_view = Instant::now();
        }
        tokio::time::sleep(tick).await;
    }
    // Let the last answers arrive: until every message written has an answer (counting
    // answers would let a duplicate stand in for a missing one), at most 15 s.
    let settle = Instant::now();
    let all_answered = || {
        let mut got: HashMap<(String, String), Vec<String>> = HashMap::new();
        for s in fake.state().sent() {
            got.entry((s.token, s.chat_id)).or_default().push(s.text);
        }
        expected.iter().all(|(k, want)| {
            got.get(k)
                .is_some_and(|g| want.iter().all(|t| g.contains(t)))
        })
    };
    while !all_answered() && settle.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("{}", view(t0.elapsed(), &ws, &fake, written));
    let mut got: HashMap<(String, String), Vec<String>> = HashMap::new();
    for s in fake.state().sent() {
        got.entry((s.token, s.chat_id)).or_default().push(s.text);
    }
    let (mut lost, mut duplicated, mut out_of_order) = (0usize, 0usize, 0usize);
    for (chat, want) in &expected {
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
        // Order: first answers, in order of their first appearance, must follow the writes.
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
    println!("\nreport");
    println!("  messages written      {written}");
    println!("  answers received      {}", fake.state().sent_count());
    println!("  lost                  {lost}");
    println!("  duplicated            {duplicated}");
    println!("  chats out of order    {out_of_order}");
    println!("  second pollers (409)  {}", fake.state().conflicts());
    match reclaim {
        Some(d) => println!("  kill -> all bots back {d:?} (lease {} ms)", a.lease_ms),
        None => println!("  kill -> bots back     not within the run"),
    }
    for w in &mut ws {
        if let Some(s) = w.stop.take() {
            let _ = s.send(());
        }
    }
    for w in ws {
        let _ = tokio::time::timeout(Duration::from_secs(10), w.task).await;
    }
    Ok(
        if lost == 0 && out_of_order == 0 && fake.state().conflicts() == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
}
