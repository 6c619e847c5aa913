//! `--only files [--mib N]`: a file of N MiB (default 10) through one `botfleet worker`
//! process (release build, embedded) and the fake Bot API on loopback.
//!
//! - in: a user sends it as a document; its link (`GET /api/v1/files/{id}` on the worker) is
//!   read to the end: the time to the last byte, and the worker's resident memory sampled
//!   every 2 ms while it streams, above what it was before;
//! - out: the handler sends it back by that link (the worker reads it through the fleet and
//!   uploads it, multipart `sendDocument`): the time from the message to the fake's receipt
//!   of the whole upload, and the worker's memory while it works.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{free_port, nonce, rss_kib, FakeTelegram, ScriptedHandler};
use serde_json::{json, Value};

use crate::{botfleet_bin, spawn, Dir};

const TOKEN: &str = "9900:files-bench";

/// Samples the resident memory of `pid` every 2 ms until stopped: the highest seen, KiB.
struct Peak {
    stop: Arc<AtomicBool>,
    high: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Peak {
    fn start(pid: u32) -> Self {
        let (stop, high) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (s, h) = (stop.clone(), high.clone());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                h.fetch_max(rss_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        });
        Self { stop, high, task }
    }

    async fn end(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.high.load(Ordering::Relaxed)
    }
}

pub(crate) async fn pass_through(mib: usize) -> anyhow::Result<()> {
    let fake = FakeTelegram::start().await?;
    fake.state().add_bot(TOKEN);
    let forward: Arc<Mutex<Option<String>>> = Arc::default();
    let fwd = forward.clone();
    let handler = ScriptedHandler::start(move |ev: &Value| {
        match (ev["text"].as_str(), fwd.lock().unwrap().clone()) {
            (Some("forward"), Some(url)) => json!({"actions": [{"type": "send", "text": "back",
                "attachments": [{"url": url, "name": "back.bin", "kind": "file"}]}]}),
            _ => json!({}),
        }
    })
    .await;
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-bench-{}", nonce())));
    std::fs::create_dir_all(&dir.0)?;
    let path = dir.0.join("bots.db");
    let store = SqliteStore::open(&path).await?;
    let mut spec = BotSpec::new(BotId::new("files")?, Platform::Telegram, TOKEN);
    spec.options.api_url = Some(fake.url());
    spec.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    store.add_bot(&spec).await?;
    let port = free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let db = format!("sqlite://{}", path.display());
    let w = spawn(
        &botfleet_bin()?,
        &[
            "--database-url",
            &db,
            "--http-addr",
            &addr,
            "--poll-timeout-s",
            "1",
        ],
    )?;
    let pid = w.0.id();
    let tg = fake.state();
    let t = Instant::now();
    while !tg.is_polling(TOKEN) {
        if t.elapsed() > Duration::from_secs(30) {
            bail!("the bot never polled");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let data: Vec<u8> = (0..mib * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    tg.user_sends_file(
        TOKEN,
        1,
        "document",
        data.clone(),
        Some("big.bin"),
        Some("application/octet-stream"),
        None,
    );
    let t = Instant::now();
    let url = loop {
        if let Some(u) = handler
            .seen()
            .iter()
            .find_map(|e| e["attachments"][0]["url"].as_str().map(str::to_owned))
        {
            break u;
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("the document's event never came");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_kib(pid);
    let peak = Peak::start(pid);
    let t = Instant::now();
    let mut resp = reqwest::get(&url).await.context("the file link")?;
    let mut got = 0usize;
    let mut first = None;
    while let Some(chunk) = resp.chunk().await? {
        first.get_or_insert_with(|| t.elapsed());
        got += chunk.len();
    }
    let took = t.elapsed();
    let high = peak.end().await;
    if got != data.len() {
        bail!("the link served {got} of {} bytes", data.len());
    }
    println!(
        "{mib} MiB file in, through its link: first byte {:.1} ms, last {:.1} ms ({:.0} MiB/s); worker RSS {:.1} MiB before, at most +{:.1} MiB while it streamed",
        first.unwrap_or_default().as_secs_f64() * 1000.0,
        took.as_secs_f64() * 1000.0,
        mib as f64 / took.as_secs_f64(),
        before as f64 / 1024.0,
        high.saturating_sub(before) as f64 / 1024.0
    );
    *forward.lock().unwrap() = Some(url);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_kib(pid);
    let peak = Peak::start(pid);
    let t = Instant::now();
    tg.user_writes(TOKEN, 1, "forward");
    while tg.files_sent().is_empty() {
        if t.elapsed() > Duration::from_secs(60) {
            bail!("the file was never sent back");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let took = t.elapsed();
    let high = peak.end().await;
    let sent = tg.files_sent();
    if sent[0].data != data {
        bail!("the file sent back differs");
    }
    println!(
        "{mib} MiB file out, sent back by its link (read through the fleet, uploaded multipart): {:.1} ms from the message to the upload received; worker RSS {:.1} MiB before, at most +{:.1} MiB while it worked ({:.1} x the file)",
        took.as_secs_f64() * 1000.0,
        before as f64 / 1024.0,
        high.saturating_sub(before) as f64 / 1024.0,
        high.saturating_sub(before) as f64 / 1024.0 / mib as f64
    );
    drop(w);
    Ok(())
}
