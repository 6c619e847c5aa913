//! Streamed answers (`--only streams [--streams N] [--every-ms M] [--secs S]`): one embedded
//! `botfleet worker` process (release build, SQLite), one Telegram bot polling the fake, which
//! answers 429 to an edit within 1 s of its message's last change (as Telegram does). N chats
//! (default 1,000) each hold a turn open, then N streams run at once through the worker's API:
//! each a send, then an edit of it every M ms (default 250) for S s (default 5), the last one
//! final (at most 64 posts in flight). Reported: parts posted per second, edits the fake took
//! per second and per stream, edits refused for the pace (0 expected), the worker's CPU and
//! RSS while streaming, and how long after the last part the last final text was shown.
//!
//! With `--native`, the bot streams natively (its chats are private: Telegram's message
//! drafts): each part extends the text, and each stream ends as one message. Reported then:
//! the drafts the fake took and the messages that ended them.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use anyhow::bail;

use crate::held::LaterBot;

/// `--only streams`.
pub(crate) async fn streams() -> anyhow::Result<()> {
    let n: usize = crate::hooks::arg("--streams").map_or(Ok(1_000), |s| s.parse())?;
    let every_ms: u64 = crate::hooks::arg("--every-ms").map_or(Ok(250), |s| s.parse())?;
    let secs: u64 = crate::hooks::arg("--secs").map_or(Ok(5), |s| s.parse())?;
    let edits_each = (secs * 1_000 / every_ms.max(1)).max(1);
    let native = std::env::args().any(|a| a == "--native");
    let mode = if native {
        botfleet_core::StreamMode::Native
    } else {
        botfleet_core::StreamMode::Edits
    };
    let bot = LaterBot::start("streams", "31001:streams", mode, false).await?;
    bot.fake.state().pace_edits(Some(Duration::from_secs(1)));
    bot.hold(0..n, |i| format!("ask {i}")).await?;
    let tokens: HashMap<String, String> = bot.tokens.lock().unwrap().iter().cloned().collect();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(60))
        .build()?;
    let gate = Arc::new(tokio::sync::Semaphore::new(64));
    let refused = Arc::new(AtomicUsize::new(0));
    let rss0 = botfleet_testkit::rss_kib(bot.pid);
    let cpu0 = crate::cpu_ticks(bot.pid);
    // The worker's RSS, sampled while it streams.
    let peak = Arc::new(AtomicUsize::new(0));
    let sampler = {
        let (peak, pid) = (peak.clone(), bot.pid);
        tokio::spawn(async move {
            loop {
                let kib = usize::try_from(botfleet_testkit::rss_kib(pid)).unwrap_or(0);
                peak.fetch_max(kib, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let start = tokio::time::Instant::now();
    let mut streams = Vec::with_capacity(n);
    for i in 0..n {
        let Some(token) = tokens.get(&format!("ask {i}")).cloned() else {
            bail!("no reply token for stream {i}");
        };
        let (http, api, gate, refused) =
            (http.clone(), bot.api.clone(), gate.clone(), refused.clone());
        // Spread over one interval, so the streams do not all post at one instant.
        let offset = Duration::from_millis(every_ms * i as u64 / n as u64);
        streams.push(tokio::spawn(async move {
            for k in 0..=edits_each {
                tokio::time::sleep_until(start + offset + Duration::from_millis(every_ms * k))
                    .await;
                let action = if native {
                    // A text that grows: each part adds to the last.
                    let words: String = (1..=k).map(|w| format!(" part {w}")).collect();
                    let text = if k == edits_each {
                        format!("{i}:{words} final")
                    } else {
                        format!("{i}:{words}")
                    };
                    if k == 0 {
                        serde_json::json!({"type": "send", "text": text, "ref": "answer"})
                    } else {
                        serde_json::json!({"type": "edit", "ref": "answer", "text": text})
                    }
                } else if k == 0 {
                    serde_json::json!({"type": "send", "text": "…", "ref": "answer"})
                } else if k == edits_each {
                    serde_json::json!({"type": "edit", "ref": "answer", "text": format!("final {i}")})
                } else {
                    serde_json::json!({"type": "edit", "ref": "answer", "text": format!("{i}: part {k}")})
                };
                let body = serde_json::json!({"actions": [action], "final": k == edits_each});
                let _permit = gate.acquire().await;
                let ok = http
                    .post(format!("{api}/api/v1/replies/{token}"))
                    .header("idempotency-key", format!("p{k}"))
                    .json(&body)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().as_u16() == 202);
                if !ok {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for s in streams {
        s.await?;
    }
    let posting = start.elapsed();
    let state = bot.fake.state();
    // Every stream over: its final text shown (an edit), or (native) its draft sent as a
    // message.
    let finals = || {
        if native {
            state
                .sent()
                .iter()
                .filter(|s| s.text.ends_with(" final"))
                .count()
        } else {
            state
                .edits(bot.token)
                .iter()
                .filter(|e| e.text.starts_with("final "))
                .count()
        }
    };
    crate::wait_count("every stream over", n, Duration::from_secs(300), finals).await?;
    let done = start.elapsed();
    let cpu_s = (crate::cpu_ticks(bot.pid) - cpu0) as f64 / 100.0;
    sampler.abort();
    // The changes the platform took of each stream's message: drafts, or edits.
    let (changes, what): (Vec<String>, &str) = if native {
        let drafts = state.drafts(bot.token).into_iter().map(|d| d.chat_id);
        (drafts.collect(), "drafts")
    } else {
        let edits = state.edits(bot.token).into_iter().map(|e| e.chat_id);
        (edits.collect(), "edits")
    };
    let mut per_stream: HashMap<&str, usize> = HashMap::new();
    for chat in &changes {
        *per_stream.entry(chat.as_str()).or_default() += 1;
    }
    let most = per_stream.values().copied().max().unwrap_or(0);
    let (started, ended, edits) = if native {
        (per_stream.len(), finals(), state.edits(bot.token).len())
    } else {
        let sent = state.sent().iter().filter(|s| s.text == "…").count();
        (sent, per_stream.len(), 0)
    };
    if started != n || ended != n || edits != 0 {
        bail!("{started} streams started, {ended} ended, {edits} edits of drafts, of {n}");
    }
    let (title, how) = if native {
        ("native streams (Telegram drafts)", "a part")
    } else {
        ("streams", "an edit")
    };
    let posts = n as u64 * (edits_each + 1);
    println!(
        "{title}, one embedded worker (SQLite), one Telegram bot, {n} at once, {how} every {every_ms} ms for {secs} s each ({posts} parts; {} refused): posted in {:.2} s ({:.0} parts/s); the fake took {} {what} ({:.1} per stream, at most {most}; {:.0}/s), {} edits refused for the pace; every stream over {:.2} s after the start ({:.2} s after the last part); worker CPU {:.2} s ({:.0}% of one core), RSS {:.1} MiB before, at most {:.1} MiB while streaming",
        refused.load(Ordering::Relaxed),
        posting.as_secs_f64(),
        posts as f64 / posting.as_secs_f64(),
        changes.len(),
        changes.len() as f64 / n as f64,
        changes.len() as f64 / done.as_secs_f64(),
        state.edits_paced(),
        done.as_secs_f64(),
        (done - posting).as_secs_f64(),
        cpu_s,
        cpu_s * 100.0 / done.as_secs_f64(),
        rss0 as f64 / 1024.0,
        peak.load(Ordering::Relaxed) as f64 / 1024.0,
    );
    Ok(())
}
