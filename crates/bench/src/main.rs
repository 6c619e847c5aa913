//! Measures a `botfleet worker` process against the fake Bot API over plain HTTP.
//!
//! Run with: `cargo build --release -p botfleet -p botfleet-bench && target/release/botfleet-bench`
//! (`--quick` for 1,000 bots only;
//! `--only idle|slack|slack-idle|slack-refresh|discord|discord-idle|discord-cold|discord-failover|reclaim|moves|failover|coord|loss|turn|hooks|sends|held|streams|files|whatsapp-idle`
//! for one part). It prints,
//! for 1,000 and 10,000 bots: time from start to all bots polling at a given connect rate,
//! then RSS and CPU of the idle worker (10 s poll timeout); the time from `kill -9` of one of
//! two workers to all bots polling again; at 2,000, 10,000 and 20,000 bots, how fast a join, a
//! SIGTERM and a kill -9 move them (see `moves.rs`); how the fleet comes back when Redis
//! loses its data; and for Slack bots (see `slack.rs`) the cost of an idle socket and the
//! refresh drill at scale; for webhook bots (see `hooks.rs`) what a chat's turn costs and the
//! updates a worker answers per second end to end; for files (see `files.rs`) a 10 MiB file
//! in through its link and out again, time and the worker's memory while it streams.
//! The workers keep no platform's send limits unless `--rate-limits SPEC` (their flag's
//! value) is given: the fakes keep none either.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod discord;
mod files;
mod held;
mod hooks;
mod moves;
mod sends;
mod shards;
mod slack;
mod streams;
mod whatsapp;

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use botfleet_core::{BotId, BotSpec, Platform};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{nonce, rss_kib, FakeTelegram, RedisServer};

pub(crate) struct Dir(pub(crate) PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) struct Worker(pub(crate) Child);
impl Drop for Worker {
    fn drop(&mut self) {
        // The worker's own process group (see `spawn`): a wrapper's child (heaptrack runs the
        // worker as its child) ends with it instead of running on, unseen, after the bench.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(crate) fn botfleet_bin() -> anyhow::Result<PathBuf> {
    let me = std::env::current_exe()?;
    let bin = me.with_file_name("botfleet");
    if !bin.exists() {
        bail!(
            "{} not found: build it first (cargo build --release -p botfleet)",
            bin.display()
        );
    }
    Ok(bin)
}

pub(crate) fn token(i: usize) -> String {
    format!("{}:bench-{i}", 10_000_000 + i)
}

/// A registry of `bots` bots on `fake` in `dir`; answers its database URL.
pub(crate) async fn registry(
    dir: &Path,
    fake: &FakeTelegram,
    bots: usize,
) -> anyhow::Result<String> {
    for i in 0..bots {
        fake.state().add_bot(&token(i));
    }
    registry_at(dir, bots, |_| fake.url()).await
}

/// A registry of `bots` bots, bot `i` on the Bot API at `url_of(i)`.
pub(crate) async fn registry_at(
    dir: &Path,
    bots: usize,
    url_of: impl Fn(usize) -> String,
) -> anyhow::Result<String> {
    let path = dir.join("bots.db");
    let store = SqliteStore::open(&path).await?;
    for i in 0..bots {
        let mut spec = BotSpec::new(BotId::new(format!("b{i}"))?, Platform::Telegram, token(i));
        spec.options.api_url = Some(url_of(i));
        store.add_bot(&spec).await?;
    }
    Ok(format!("sqlite://{}", path.display()))
}

/// The workers' `--rate-limits`: the bench's own `--rate-limits`, else `off` — the fakes
/// keep no platform's limits, and the benchmarks measure the fleet's own costs (a Telegram
/// bot's 30 messages a second would cap the webhook benchmark's 20 bots at 600 a second).
pub(crate) fn rate_limits() -> String {
    crate::hooks::arg("--rate-limits").unwrap_or_else(|| "off".to_owned())
}

/// Starts `botfleet worker ARGS` (on a free HTTP port unless `args` names one). Its log goes
/// nowhere, or to `$BOTFLEET_BENCH_LOGS/worker-<pid>.log` when that is set, at level
/// `$BOTFLEET_BENCH_LOG_LEVEL` (default info).
/// `$BOTFLEET_BENCH_WRAP` (e.g. `heaptrack -o /tmp/worker`) runs the worker under a profiler
/// (the worker's process group ends with the bench); `$BOTFLEET_BENCH_PROBE` is run at every
/// idle measurement (see [`measure`]).
pub(crate) fn spawn(bin: &Path, args: &[&str]) -> anyhow::Result<Worker> {
    let wrap = std::env::var("BOTFLEET_BENCH_WRAP").unwrap_or_default();
    let mut wrap = wrap.split_whitespace();
    let mut cmd = match wrap.next() {
        Some(tool) => {
            let mut c = Command::new(tool);
            c.args(wrap).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.arg("worker");
    if !args.contains(&"--http-addr") {
        cmd.args(["--http-addr", "127.0.0.1:0"]);
    }
    if !args.contains(&"--hooks-addr") {
        cmd.args(["--hooks-addr", "127.0.0.1:0"]);
    }
    cmd.args(args)
        .env("BOTFLEET_RATE_LIMITS", rate_limits())
        .stdout(Stdio::null());
    let logs = std::env::var_os("BOTFLEET_BENCH_LOGS");
    let log_file = match &logs {
        Some(dir) => Some(
            std::fs::File::create(Path::new(dir).join(format!(
                "worker-{}-{}.log",
                std::process::id(),
                nonce()
            )))
            .context("creating the worker log")?,
        ),
        None => None,
    };
    match log_file {
        Some(f) => cmd
            .env(
                "RUST_LOG",
                std::env::var("BOTFLEET_BENCH_LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            )
            .stderr(f),
        None => cmd.env("RUST_LOG", "error").stderr(Stdio::null()),
    };
    // A process group of its own, ended as a whole on drop.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let child = cmd.spawn().context("starting botfleet worker")?;
    Ok(Worker(child))
}

/// User + system CPU time of a process, in clock ticks (1/100 s on Linux).
pub(crate) fn cpu_ticks(pid: u32) -> u64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0);
    let stime: u64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    utime + stime
}

/// Waits 5 s for things to settle, then prints the RSS, open files and CPU of worker `pid`
/// over 20 s, per bot and above the empty worker's `base_kib`.
pub(crate) async fn measure(pid: u32, bots: usize, base_kib: u64, what: String) {
    tokio::time::sleep(Duration::from_secs(5)).await;
    let window = Duration::from_secs(20);
    let (c0, t0) = (cpu_ticks(pid), Instant::now());
    tokio::time::sleep(window).await;
    let (c1, dt) = (cpu_ticks(pid), t0.elapsed());
    let cpu = (c1 - c0) as f64 / 100.0 / dt.as_secs_f64() * 100.0;
    // A look inside the worker at the moment it is measured (a debugger dumping the
    // allocator's statistics, say): `BOTFLEET_BENCH_PROBE="script"` runs `script PID LABEL`.
    if let Ok(probe) = std::env::var("BOTFLEET_BENCH_PROBE") {
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!("{probe} {pid} \"$0\""))
            .arg(&what)
            .status();
    }
    let rss = rss_kib(pid);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count);
    println!(
        "{bots:>6} bots idle, {what}: {fds} open files, RSS {:.1} MiB ({:.1} KiB per bot; {:.1} KiB per bot above the empty worker), CPU {cpu:.2} % of one core ({:.3} % per 1,000 bots)",
        rss as f64 / 1024.0,
        rss as f64 / bots as f64,
        rss.saturating_sub(base_kib) as f64 / bots as f64,
        cpu / bots as f64 * 1000.0
    );
}

/// Waits until `count()` reaches `want`; answers how long that took.
pub(crate) async fn wait_count(
    what: &str,
    want: usize,
    limit: Duration,
    count: impl Fn() -> usize,
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    loop {
        let n = count();
        if n >= want {
            return Ok(t.elapsed());
        }
        if t.elapsed() > limit {
            bail!("only {n} of {want} {what} after {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_polling(fake: &FakeTelegram, n: usize, limit: Duration) -> anyhow::Result<Duration> {
    wait_count("bots polling", n, limit, || fake.state().polling_tokens()).await
}

/// RSS of a worker with an empty registry: the process itself, without bots.
async fn baseline_rss() -> anyhow::Result<u64> {
    let fake = FakeTelegram::start().await?;
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let db = registry(&dir.0, &fake, 0).await?;
    let w = spawn(
        &botfleet_bin()?,
        &["--database-url", &db, "--lease-ms", "15000"],
    )?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(rss_kib(w.0.id()))
}

/// Flags of the idle measurement: `--poll-s S` (long-poll timeout, default 45), `--rounds R`
/// (messages per bot before measuring again, aged connections; default 35), `--wave N` (Slack:
/// bots written to at once in each round, default all of them).
fn arg<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::args()
        .skip_while(|a| a != name)
        .nth(1)
        .and_then(|v| v.parse().ok())
}

/// RSS and CPU of one worker with `bots` idle Telegram bots: right after they all poll, and
/// again after `rounds` messages per bot (every connection then has carried that many
/// requests: hyper's per-connection structures grow with use).
async fn idle(
    bots: usize,
    rate: f64,
    poll_s: u64,
    rounds: usize,
    base_kib: u64,
) -> anyhow::Result<()> {
    let fake = FakeTelegram::start().await?;
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let db = registry(&dir.0, &fake, bots).await?;
    let bin = botfleet_bin()?;
    let started = Instant::now();
    let poll = poll_s.to_string();
    let w = spawn(
        &bin,
        &[
            "--database-url",
            &db,
            "--connect-rate",
            &rate.to_string(),
            "--lease-ms",
            "15000",
            "--poll-timeout-s",
            &poll,
        ],
    )?;
    let pid = w.0.id();
    let up = wait_polling(
        &fake,
        bots,
        Duration::from_secs(bots as u64 / rate as u64 + 120),
    )
    .await?;
    let ideal = bots as f64 / rate;
    println!(
        "{bots:>6} bots: start to all polling {:.2} s at {rate} starts/s (bots / rate = {ideal:.2} s; process start included: {:.2} s)",
        up.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let measure = |what: String| measure(pid, bots, base_kib, format!("{poll_s} s polls, {what}"));
    measure("fresh".into()).await;
    if rounds > 0 {
        for r in 0..rounds {
            let want = (r + 1) * bots;
            for i in 0..bots {
                fake.state().user_writes(&token(i), 1, "ping");
            }
            let t = Instant::now();
            while fake.state().sent_count() < want {
                if t.elapsed() > Duration::from_secs(120) {
                    bail!(
                        "round {r}: {} of {want} answered",
                        fake.state().sent_count()
                    );
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        measure(format!("after {rounds} messages per bot")).await;
    }
    Ok(())
}

async fn reclaim(bots: usize, lease_ms: u64) -> anyhow::Result<()> {
    let redis = RedisServer::start()?;
    let fake = FakeTelegram::start().await?;
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let db = registry(&dir.0, &fake, bots).await?;
    let bin = botfleet_bin()?;
    let lease = lease_ms.to_string();
    let common = [
        "--database-url",
        db.as_str(),
        "--redis-url",
        &redis.url(),
        "--lease-ms",
        &lease,
        "--connect-rate",
        "5000",
    ];
    let mut a = spawn(
        &bin,
        &[&common[..], &["--worker-id", "a", "--poll-timeout-s", "2"]].concat(),
    )?;
    let _b = spawn(
        &bin,
        &[&common[..], &["--worker-id", "b", "--poll-timeout-s", "2"]].concat(),
    )?;
    wait_polling(&fake, bots, Duration::from_secs(60)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let window = Duration::from_secs(10);
    let before = redis.client_round_trips();
    tokio::time::sleep(window).await;
    let per_s = (redis.client_round_trips() - before) / window.as_secs_f64();
    println!(
        "{bots:>6} bots, 2 idle workers (lease {:.1} s): {per_s:.1} Redis round trips/s in all, {:.1} per worker",
        lease_ms as f64 / 1000.0,
        per_s / 2.0
    );
    let t = Instant::now();
    a.0.kill()?;
    let _ = a.0.wait();
    while fake.state().polling_tokens() == bots && t.elapsed() < Duration::from_secs(2) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let back = wait_polling(&fake, bots, Duration::from_secs(60)).await?;
    let _ = back;
    println!(
        "{bots:>6} bots, 2 workers: kill -9 of one to all bots polling again {:.2} s (lease {:.1} s; goal lease + 1 s)",
        t.elapsed().as_secs_f64(),
        lease_ms as f64 / 1000.0
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A child serving part of the fake Bot API for the move benchmark (see shards.rs).
    let args: Vec<String> = std::env::args().collect();
    // The stand-in WhatsApp Web server of the device-link benchmark (see whatsapp.rs).
    if args.iter().any(|a| a == whatsapp::CHILD_FLAG) {
        return whatsapp::standin_child().await;
    }
    if let Some(pos) = args.iter().position(|a| a == "--fake-shard") {
        let first = args
            .get(pos + 1)
            .and_then(|v| v.parse().ok())
            .context("--fake-shard FIRST COUNT")?;
        let count = args
            .get(pos + 2)
            .and_then(|v| v.parse().ok())
            .context("--fake-shard FIRST COUNT")?;
        return shards::serve(first, count).await;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    println!("botfleet bench: worker in its own process, fake Bot API over plain HTTP on loopback");
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    if only.as_deref().is_none_or(|o| o == "idle") {
        let base = baseline_rss().await?;
        println!(
            "     0 bots: RSS {:.1} MiB (the worker process alone)",
            base as f64 / 1024.0
        );
        let poll_s = arg("--poll-s").unwrap_or(45);
        let rounds = arg("--rounds").unwrap_or(35);
        let sizes: Vec<usize> = match arg("--size") {
            Some(n) => vec![n],
            None if quick => vec![1_000],
            None => vec![2_000, 10_000],
        };
        for n in sizes {
            idle(n, 1_000.0, poll_s, rounds, base).await?;
        }
    }
    if only
        .as_deref()
        .is_none_or(|o| o == "slack" || o == "slack-idle")
    {
        let base = baseline_rss().await?;
        let rounds = arg("--rounds").unwrap_or(35);
        let n = arg("--size").unwrap_or(if quick { 1_000 } else { 2_000 });
        let wave = arg("--wave").unwrap_or(n).max(1);
        slack::idle(n, rounds, wave, base).await?;
    }
    if only
        .as_deref()
        .is_none_or(|o| o == "slack" || o == "slack-refresh")
    {
        let n = arg("--size").unwrap_or(if quick { 1_000 } else { 2_000 });
        let spread = Duration::from_secs(arg("--spread-s").unwrap_or(60));
        slack::refresh_drill(n, spread).await?;
    }
    if only
        .as_deref()
        .is_none_or(|o| o == "discord" || o == "discord-idle")
    {
        let base = baseline_rss().await?;
        let rounds = arg("--rounds").unwrap_or(35);
        let n = arg("--size").unwrap_or(1_000);
        discord::idle(n, rounds, base).await?;
    }
    if only
        .as_deref()
        .is_none_or(|o| o == "discord" || o == "discord-cold")
    {
        let n = arg("--size").unwrap_or(100);
        discord::cold(u32::try_from(n).unwrap_or(100), 16).await?;
    }
    if only
        .as_deref()
        .is_none_or(|o| o == "discord" || o == "discord-failover")
    {
        let n = arg("--size").unwrap_or(500);
        discord::failover(n).await?;
    }
    if only.as_deref().is_none_or(|o| o == "reclaim") {
        reclaim(if quick { 1_000 } else { 5_000 }, 5_000).await?;
    }
    if only.as_deref().is_none_or(|o| o == "moves") {
        // `--size N` for one size only.
        let one: Option<usize> = std::env::args()
            .skip_while(|a| a != "--size")
            .nth(1)
            .and_then(|s| s.parse().ok());
        let sizes: Vec<usize> = match one {
            Some(n) => vec![n],
            None if quick => vec![2_000],
            None => vec![2_000, 10_000, 20_000],
        };
        for n in sizes {
            moves::moves(n).await?;
        }
    }
    if only.as_deref().is_none_or(|o| o == "failover") {
        let per = arg("--size").unwrap_or(if quick { 2_000 } else { 10_000 });
        moves::failover(per).await?;
    }
    if only.as_deref().is_none_or(|o| o == "coord") {
        // `--size N` for one size, `--groups G` for one number of groups.
        let sizes: Vec<usize> = match arg("--size") {
            Some(n) => vec![n],
            None if quick => vec![1_000],
            None => vec![1_000, 10_000],
        };
        let groups: Vec<u16> = match arg::<u16>("--groups") {
            Some(g) => vec![g],
            None => vec![1, 16, 64],
        };
        let window = Duration::from_secs(arg("--window-s").unwrap_or(30));
        moves::coord_load(&sizes, &groups, window).await?;
    }
    if only.as_deref().is_none_or(|o| o == "loss") {
        moves::data_loss(if quick { 200 } else { 2_000 }).await?;
    }
    if only.as_deref().is_none_or(|o| o == "turn") {
        hooks::turn_overhead().await?;
    }
    if only.as_deref().is_none_or(|o| o == "hooks") {
        hooks::throughput().await?;
    }
    if only.as_deref().is_none_or(|o| o == "sends") {
        sends::api_sends().await?;
    }
    if only.as_deref().is_none_or(|o| o == "held") {
        held::held_turns().await?;
    }
    if only.as_deref().is_none_or(|o| o == "streams") {
        streams::streams().await?;
    }
    if only.as_deref().is_none_or(|o| o == "files") {
        files::pass_through(arg("--mib").unwrap_or(10)).await?;
    }
    // Asked for by name only: it holds each phase 30 s.
    if only.as_deref() == Some("whatsapp-idle") {
        whatsapp::idle(
            arg("--size").unwrap_or(200),
            arg("--contacts").unwrap_or(10),
        )
        .await?;
    }
    Ok(())
}
