//! Turns held open for answers that come later (`--only held [--chats N] [--webhook]`): one
//! embedded `botfleet worker` process (release build, SQLite, no Redis), one Telegram bot
//! polling the fake Bot API (with `--webhook`: a webhook bot, its updates posted to the
//! worker's hooks address), and a handler that answers `202` to every message. N chats (default 1,000)
//! each write once: N turns held open; then N more. Reported: the worker's RSS per held turn
//! (above the same worker after 2N answered messages, so what the allocator kept from a burst
//! is not counted as holding), and per further held turn (the next N: the worker's fixed costs
//! of holding paid already), then the parts posted through the worker's API — one final part
//! per turn, 32 at a time — per second, and request to the part's message at the fake,
//! p50/p99.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::bail;
use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform};
use botfleet_testkit::FakeTelegram;

use crate::{botfleet_bin, hooks::pct};

/// One embedded worker process (SQLite) running one Telegram bot that polls the fake, and a
/// handler answering "warm …" at once and anything else later (`202`), keeping its token.
pub(crate) struct LaterBot {
    pub(crate) fake: FakeTelegram,
    /// (the text asked, its reply token), in the order asked.
    pub(crate) tokens: Arc<Mutex<Vec<(String, String)>>>,
    pub(crate) token: &'static str,
    /// The worker's hooks address, for a webhook bot (its updates are posted there).
    hooks: Option<String>,
    http: reqwest::Client,
    /// The next update id posted to a webhook bot.
    next_update: std::sync::atomic::AtomicUsize,
    /// The worker (ended on drop).
    _proc: crate::Worker,
    pub(crate) api: String,
    pub(crate) pid: u32,
    _handler: botfleet_testkit::ScriptedHandler,
    _registry: (crate::Dir, Arc<dyn botfleet_store::Store>),
}

impl LaterBot {
    /// Starts it (registry `name`, streaming as `stream`; a webhook bot with `webhook`), once
    /// the bot polls (or its deliveries are taken).
    pub(crate) async fn start(
        name: &str,
        token: &'static str,
        stream: botfleet_core::StreamMode,
        webhook: bool,
    ) -> anyhow::Result<Self> {
        let bin = botfleet_bin()?;
        let fake = FakeTelegram::start().await?;
        let tokens: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
        let kept = tokens.clone();
        let handler = botfleet_testkit::ScriptedHandler::start(move |ev: &serde_json::Value| {
            let text = ev["text"].as_str().unwrap_or_default();
            if text.starts_with("warm") {
                return serde_json::json!({ "text": text });
            }
            let token = ev["reply_token"].as_str().unwrap_or_default().to_owned();
            kept.lock().unwrap().push((text.to_owned(), token));
            serde_json::json!({"_status": 202})
        })
        .await;
        let (dir, _pg, db, store) = crate::hooks::registry(name, "sqlite").await?;
        fake.state().add_bot(token);
        let mut spec = BotSpec::new(BotId::new(name)?, Platform::Telegram, token);
        spec.options.api_url = Some(fake.url());
        spec.options.async_reply_ttl_s = Some(3_600);
        // Its chats are private: `native` streams as drafts there.
        spec.options.stream = Some(stream);
        spec.handler = HandlerSpec::Webhook {
            url: handler.url(),
            secret: None,
        };
        if webhook {
            spec.options.mode = Some("webhook".into());
            spec.hook.secret = Some(botfleet_core::Secret::new(crate::hooks::SECRET));
        }
        store.add_bot(&spec).await?;
        let log = dir.0.join("w.log");
        let args = [
            "--worker-id",
            "w0",
            "--database-url",
            &db,
            "--worker-threads",
            "2",
            "--poll-timeout-s",
            "2",
            // (Updates are posted to the hooks address: the fake's webhook is not used.)
            "--public-url",
            "http://127.0.0.1:9",
        ];
        let proc = crate::hooks::spawn_logged(&bin, &args, &log)?;
        let api = crate::hooks::http_url(&log).await?;
        let pid = proc.0.id();
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .timeout(Duration::from_secs(30))
            .build()?;
        let hooks = match webhook {
            true => Some(crate::hooks::hooks_url(&log).await?),
            false => None,
        };
        let t = Instant::now();
        loop {
            let ready = match &hooks {
                // Taken once the worker holds the bot's registration (not 503).
                Some(h) => {
                    let path = format!("{h}/hooks/telegram/{name}");
                    crate::hooks::post_update(&http, &path, 0, 1, "warm 0").await? == 200
                }
                None => fake.state().is_polling(token),
            };
            if ready {
                break;
            }
            if t.elapsed() > Duration::from_secs(60) {
                bail!("the bot never took messages");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Self {
            fake,
            tokens,
            token,
            hooks: hooks.map(|h| format!("{h}/hooks/telegram/{name}")),
            http,
            next_update: 1.into(),
            _proc: proc,
            api,
            pid,
            _handler: handler,
            _registry: (dir, store),
        })
    }

    /// Writes `text(i)` in the chats `chats` and waits until the worker holds as many turns
    /// as it was asked in all (by its metrics).
    pub(crate) async fn hold(
        &self,
        chats: std::ops::Range<usize>,
        text: impl Fn(usize) -> String,
    ) -> anyhow::Result<()> {
        let asked = self.tokens.lock().unwrap().len();
        let n = asked + chats.len();
        for i in chats.clone() {
            self.write(i, &text(i)).await?;
        }
        crate::wait_count("turns held", n, Duration::from_secs(120), || {
            self.tokens.lock().unwrap().len()
        })
        .await?;
        // Held (each hold written once its handler answered), as the worker counts them.
        let t = Instant::now();
        loop {
            let text = reqwest::get(format!("{}/metrics", self.api))
                .await?
                .text()
                .await?;
            let held = text
                .lines()
                .find(|l| l.starts_with("botfleet_turns_held{"))
                .and_then(|l| l.rsplit(' ').next()?.parse::<usize>().ok())
                .unwrap_or(0);
            if held >= n {
                return Ok(());
            }
            if t.elapsed() > Duration::from_secs(60) {
                bail!("only {held} of {n} turns held");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl LaterBot {
    /// The `i`-th user writes `text`: through the fake Bot API to a polling bot, or posted to
    /// the worker's hooks address for a webhook bot.
    pub(crate) async fn write(&self, i: usize, text: &str) -> anyhow::Result<()> {
        match &self.hooks {
            None => {
                self.fake.state().user_writes(self.token, chat(i), text);
            }
            Some(h) => {
                // Update ids from 1 on (0 was the readiness probe's).
                let id = self
                    .next_update
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let status = crate::hooks::post_update(&self.http, h, id, chat(i), text).await?;
                if status != 200 {
                    bail!("an update was answered {status}");
                }
            }
        }
        Ok(())
    }
}

/// The chat of the `i`-th user.
fn chat(i: usize) -> i64 {
    500_000 + i as i64
}

/// `--only held`.
pub(crate) async fn held_turns() -> anyhow::Result<()> {
    let chats: usize = crate::hooks::arg("--chats").map_or(Ok(1_000), |s| s.parse())?;
    let webhook = std::env::args().any(|a| a == "--webhook");
    let bot = LaterBot::start(
        "held",
        "31000:held",
        botfleet_core::StreamMode::Native,
        webhook,
    )
    .await?;
    let (fake, tokens, pid, api) = (&bot.fake, &bot.tokens, bot.pid, &bot.api);
    // The readiness probe of a webhook bot was answered too.
    let probe = usize::from(webhook);
    // Twice as many chats answered at once first: the allocator's high-water of turns at
    // work, and each chat's own records, are not counted as holding.
    for i in 0..2 * chats {
        bot.write(i, &format!("warm {i}")).await?;
    }
    crate::wait_count(
        "warm-up answered",
        2 * chats + probe,
        Duration::from_secs(120),
        || fake.state().sent_count(),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = botfleet_testkit::rss_kib(pid);
    bot.hold(0..chats, |i| format!("ask {i}")).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held_rss = botfleet_testkit::rss_kib(pid);
    let per_turn = held_rss.saturating_sub(before) as f64 * 1024.0 / chats as f64;
    // As many more held: what each further held turn costs, the worker's fixed costs of
    // holding (its store's caches filling, the poller) paid already.
    bot.hold(chats..2 * chats, |i| format!("ask {i}")).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let more_rss = botfleet_testkit::rss_kib(pid);
    let per_more = more_rss.saturating_sub(held_rss) as f64 * 1024.0 / chats as f64;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(30))
        .build()?;
    let posts: Vec<(String, String)> = tokens.lock().unwrap().clone();
    let posted_at: Arc<Mutex<std::collections::HashMap<String, Instant>>> = Arc::default();
    let sent_before = fake.state().sent_count();
    let start = Instant::now();
    let mut lat_202 = Vec::with_capacity(posts.len());
    for batch in posts.chunks(32) {
        let mut calls = Vec::new();
        for (text, tok) in batch {
            let (http, api, posted_at) = (http.clone(), api.clone(), posted_at.clone());
            let (text, tok) = (text.clone(), tok.clone());
            calls.push(tokio::spawn(async move {
                let answer = format!("answer to {text}");
                let body = serde_json::json!({
                    "actions": [{"type": "send", "text": answer}], "final": true
                });
                let t = Instant::now();
                posted_at.lock().unwrap().insert(answer, t);
                let r = http
                    .post(format!("{api}/api/v1/replies/{tok}"))
                    .header("idempotency-key", "final")
                    .json(&body)
                    .send()
                    .await;
                (r.is_ok_and(|r| r.status().as_u16() == 202), t.elapsed())
            }));
        }
        for c in calls {
            let (ok, took) = c.await?;
            if !ok {
                bail!("a part was refused");
            }
            lat_202.push(took.as_secs_f64() * 1e3);
        }
    }
    let posting = start.elapsed();
    crate::wait_count(
        "answers sent",
        sent_before + posts.len(),
        Duration::from_secs(120),
        || fake.state().sent_count(),
    )
    .await?;
    let sent = fake.state().sent();
    let (lat, last) = crate::hooks::sent_after(&sent, &posted_at.lock().unwrap(), start);
    lat_202.sort_by(f64::total_cmp);
    println!(
        "held turns, one embedded worker (SQLite), one Telegram {} bot, {chats} chats: RSS {:.1} MiB after {} answered, {:.1} MiB with {chats} held: {per_turn:.0} bytes per held turn; {:.1} MiB with {} held: {per_more:.0} bytes per further held turn; {} final parts posted 32 at a time in {:.2} s ({:.0}/s), request to 202 p50 {:.1} ms p99 {:.1} ms, request to sent p50 {:.1} ms p99 {:.1} ms, all sent {:.2} s after the first post",
        if webhook { "webhook" } else { "polling" },
        before as f64 / 1024.0,
        2 * chats,
        held_rss as f64 / 1024.0,
        more_rss as f64 / 1024.0,
        2 * chats,
        posts.len(),
        posting.as_secs_f64(),
        posts.len() as f64 / posting.as_secs_f64(),
        pct(&lat_202, 0.5),
        pct(&lat_202, 0.99),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        (last - start).as_secs_f64(),
    );
    drop(bot);
    Ok(())
}
