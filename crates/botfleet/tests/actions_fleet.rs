//! A handler that uses every action, on a fleet of `botfleet worker` processes (a private
//! Redis, one SQLite registry, Telegram bots polling the fake Bot API, the workers' API behind
//! a round-robin balancer as `--api-public-url`), while users write, press buttons and send a
//! photo, and one worker is killed with SIGKILL, another stopped with SIGTERM. Every action is
//! done once, in order per chat; the edits and deletes by ref land on the message the ref
//! names after the bot moved; every press is answered once; the photo's link, made by a
//! worker since killed, still serves its bytes. In a binary of its own, so it does not add
//! load to the other fleet drills.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use base64::Engine;
use botfleet_coord::{Coordinator, RedisConfig, RedisCoordinator};
use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{
    fleet_worker, wait_for, wait_for_or, FakeTelegram, Proc, RedisServer, RoundRobinProxy,
    ScriptedHandler, TempDir,
};
use serde_json::{json, Value};

const LEASE_MS: u64 = 3_000;
const BOTS: usize = 4;
const CHATS: i64 = 2;

fn token(i: usize) -> String {
    format!("{}:acts-{i}", 8100 + i)
}

/// What the handler does for message `n{k}` (every action, by `k % 4`), for a press, and
/// for a photo.
fn script(ev: &Value) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD;
    if let Some(url) = ev["attachments"][0]["url"].as_str() {
        return json!({"text": format!("photo at {}", url.len())});
    }
    if ev["kind"] == "action" {
        return json!({"actions": [{"type": "answer", "text": format!("got {}", ev["action"]["value"].as_str().unwrap_or(""))}]});
    }
    let text = ev["text"].as_str().unwrap_or("");
    let Some(k) = text.strip_prefix('n').and_then(|k| k.parse::<u64>().ok()) else {
        return json!({});
    };
    let then = match k % 4 {
        0 => vec![
            json!({"type": "typing"}),
            json!({"type": "send", "text": format!("menu {k}"), "ref": "menu",
                "buttons": [[{"text": "Pick", "value": format!("p{k}")}]]}),
        ],
        1 => vec![json!({"type": "edit", "ref": "menu", "text": format!("edited at {k}")})],
        2 => vec![json!({"type": "send", "text": format!("file {k}"),
            "attachments": [{"data": b64.encode(format!("file-{k}")), "name": format!("f{k}.txt")}]})],
        _ => vec![json!({"type": "delete", "ref": "menu"})],
    };
    let mut actions = vec![json!({"type": "send", "text": text})];
    actions.extend(then);
    json!({ "actions": actions })
}

/// The chats' echoes (`n{k}`), in the order the fake received them: (token, chat) → ks.
fn echoes(fake: &FakeTelegram) -> HashMap<(String, String), Vec<u64>> {
    let mut out: HashMap<(String, String), Vec<u64>> = HashMap::new();
    for s in fake.state().sent() {
        if let Some(k) = s.text.strip_prefix('n').and_then(|k| k.parse().ok()) {
            out.entry((s.token, s.chat_id)).or_default().push(k);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_action_once_in_order_through_a_kill_and_a_sigterm() {
    let redis = RedisServer::start().unwrap();
    let fake = FakeTelegram::start().await.unwrap();
    let handler = ScriptedHandler::start(script).await;
    let dir = TempDir::new("botfleet-actions");
    let path = dir.0.join("bots.db");
    let db = format!("sqlite://{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    for i in 0..BOTS {
        fake.state().add_bot(&token(i));
        let mut spec = BotSpec::new(
            BotId::new(format!("acts-{i}")).unwrap(),
            Platform::Telegram,
            token(i),
        );
        spec.options.api_url = Some(fake.url());
        spec.handler = HandlerSpec::Webhook {
            url: handler.url(),
            secret: None,
        };
        store.add_bot(&spec).await.unwrap();
    }
    let coord = RedisCoordinator::connect(RedisConfig::new(redis.url()).prefix("acts"))
        .await
        .unwrap();
    let api = RoundRobinProxy::start(Vec::new()).await;
    let spawn = |name: &str| {
        Proc::spawn(
            name,
            fleet_worker(
                env!("CARGO_BIN_EXE_botfleet"),
                name,
                &db,
                &redis.url(),
                "acts",
            )
            .args(["--lease-ms", &LEASE_MS.to_string(), "--poll-timeout-s", "2"])
            // Users write to a chat faster than Telegram lets a bot answer (the fake keeps no
            // send limit): the limits are proved by the `limits` tests.
            .args(["--rate-limits", "off"])
            .args(["--api-public-url", &api.url()]),
            &dir.0,
        )
    };
    let mut procs: Vec<Option<Proc>> =
        vec![Some(spawn("a0")), Some(spawn("a1")), Some(spawn("a2"))];
    let mut backends = Vec::new();
    for p in procs.iter().flatten() {
        backends.push(p.api_url().await);
    }
    api.set_backends(backends);
    let tg = fake.state();
    // Once timed out on a clean clone's first run (not since): the message says which bots
    // were not polling and what the workers logged.
    wait_for_or(
        "every bot polling",
        Duration::from_secs(30),
        || async { (0..BOTS).all(|i| tg.is_polling(&token(i))).then_some(()) },
        || {
            let idle: Vec<usize> = (0..BOTS).filter(|i| !tg.is_polling(&token(*i))).collect();
            format!(
                "not polling: {idle:?}\n{}",
                botfleet_testkit::log_tails(&dir.0)
            )
        },
    )
    .await;

    // Users write n0, n1, … in every chat, press the menus they see, and one sends a photo.
    let mut next: HashMap<(usize, i64), u64> = HashMap::new();
    let mut presses: Vec<String> = Vec::new();
    let photo: Vec<u8> = (0..30_000u32).map(|i| (i % 253) as u8).collect();
    let mut photo_sent = false;
    let started = Instant::now();
    let mut killed = None;
    let mut termed = None;
    let mut x: u64 = 0x9e37_79b9;
    while started.elapsed() < Duration::from_secs(14) {
        for _ in 0..2 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let (bot, chat) = (
                (x % BOTS as u64) as usize,
                ((x >> 32) % CHATS as u64) as i64 + 1,
            );
            let k = next.entry((bot, chat)).or_default();
            tg.user_writes(&token(bot), chat, &format!("n{k}"));
            *k += 1;
        }
        // A press on the newest menu of a chat, when it is there.
        if x.is_multiple_of(5) {
            let (bot, chat) = (
                (x % BOTS as u64) as usize,
                ((x >> 20) % CHATS as u64) as i64 + 1,
            );
            let menu = tg
                .sent()
                .into_iter()
                .filter(|s| s.token == token(bot) && s.chat_id == chat.to_string())
                .rfind(|s| s.text.starts_with("menu "));
            if let Some(m) = menu {
                let value = format!("p{}", &m.text[5..]);
                if let Some((_, q)) = tg.user_presses(&token(bot), chat, m.message_id, &value) {
                    presses.push(q);
                }
            }
        }
        if !photo_sent && started.elapsed() > Duration::from_secs(1) {
            tg.user_sends_file(
                &token(0),
                1,
                "photo",
                photo.clone(),
                None,
                None,
                Some("pic"),
            );
            photo_sent = true;
        }
        let holder_of = |bot: usize| {
            let coord = &coord;
            async move {
                let owner = coord
                    .owner(&BotId::new(format!("acts-{bot}")).unwrap())
                    .await
                    .ok()??;
                owner.live.then(|| owner.worker.to_string())
            }
        };
        if killed.is_none() && started.elapsed() > Duration::from_secs(3) {
            // The photo's link was made by a worker that is about to die.
            if let Some(w) = holder_of(0).await {
                let i: usize = w[1..].parse().unwrap();
                procs[i].take().unwrap().signal("-KILL");
                killed = Some((w, Instant::now()));
            }
        }
        if termed.is_none() && started.elapsed() > Duration::from_secs(8) {
            let dead = killed.as_ref().map(|(w, _)| w.clone()).unwrap_or_default();
            if let Some(i) = (0..3).find(|i| procs[*i].is_some() && format!("a{i}") != dead) {
                procs[i].as_ref().unwrap().signal("-TERM");
                termed = Some(format!("a{i}"));
            }
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let (killed, at) = killed.expect("a worker was killed");
    println!("killed {killed}, stopped {termed:?}");
    // Each chat's last message deletes its menu: written to end on one.
    for ((bot, chat), k) in next.iter_mut() {
        while *k % 4 != 0 {
            tg.user_writes(&token(*bot), *chat, &format!("n{k}"));
            *k += 1;
        }
    }
    let written: u64 = next.values().sum();
    wait_for(
        "every message answered",
        Duration::from_secs(60),
        || async {
            let got = echoes(&fake);
            next.iter()
                .all(|((bot, chat), k)| {
                    got.get(&(token(*bot), chat.to_string()))
                        .is_some_and(|ks| (0..*k).all(|n| ks.contains(&n)))
                })
                .then_some(())
        },
    )
    .await;
    wait_for("every entry ended", Duration::from_secs(30), || async {
        let stats = store.inbox_stats().await.ok()?;
        stats.values().all(|s| s.pending == 0).then_some(())
    })
    .await;

    // Once each, in order per chat. A repeat is only allowed for what the killed worker did
    // in its last instant: an action the platform took just before the kill, whose record
    // the kill cut off (the send window every platform call has; Telegram cannot tell a
    // resend). Anything else done twice fails.
    let in_window = |first: Instant| {
        at.checked_duration_since(first)
            .is_some_and(|before| before < Duration::from_millis(1_500))
            || first
                .checked_duration_since(at)
                .is_some_and(|after| after < Duration::from_millis(50))
    };
    let sent = tg.sent();
    let mut dups = Vec::new();
    for ((bot, chat), k) in &next {
        let mine: Vec<_> = sent
            .iter()
            .filter(|s| s.token == token(*bot) && s.chat_id == chat.to_string())
            .collect();
        let mut firsts: Vec<u64> = Vec::new();
        for s in &mine {
            let Some(n) = s.text.strip_prefix('n').and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            if firsts.contains(&n) {
                let first = mine
                    .iter()
                    .find(|x| x.text == s.text)
                    .map_or(s.at, |x| x.at);
                dups.push((
                    format!("bot {bot} chat {chat} {}", s.text),
                    in_window(first),
                ));
            } else {
                firsts.push(n);
            }
        }
        assert_eq!(
            firsts,
            (0..*k).collect::<Vec<_>>(),
            "order of bot {bot} chat {chat}"
        );
    }
    // Every menu was edited once (by the message after it), then deleted (by the one after
    // that): each ref named the message it was given to, whichever worker did the edit. A menu
    // sent twice in the kill's window leaves its first copy as it was.
    let menus: Vec<_> = sent
        .iter()
        .filter(|s| s.text.starts_with("menu "))
        .collect();
    let mut wrong = Vec::new();
    for m in &menus {
        let k: u64 = m.text[5..].parse().unwrap();
        let twice = menus
            .iter()
            .filter(|x| x.token == m.token && x.chat_id == m.chat_id && x.text == m.text)
            .count()
            > 1;
        if twice {
            let first = menus
                .iter()
                .find(|x| x.token == m.token && x.chat_id == m.chat_id && x.text == m.text)
                .unwrap();
            if first.message_id == m.message_id {
                dups.push((format!("{} in {}", m.text, m.chat_id), in_window(m.at)));
                continue;
            }
        }
        let now = tg.bot_message(&m.token, &m.chat_id, m.message_id).unwrap();
        if !(now.deleted && now.edits == 1 && now.text == format!("edited at {}", k + 1)) {
            wrong.push((m.text.clone(), now));
        }
    }
    // Every file once.
    let files = tg.files_sent();
    let mut seen_files: Vec<(String, String, String)> = Vec::new();
    for f in &files {
        let k = f.caption.as_deref().unwrap().trim_start_matches("file ");
        assert_eq!(f.data, format!("file-{k}").into_bytes());
        let key = (f.token.clone(), f.chat_id.clone(), k.to_owned());
        if seen_files.contains(&key) {
            let first = files
                .iter()
                .find(|x| x.token == f.token && x.chat_id == f.chat_id && x.caption == f.caption)
                .unwrap();
            dups.push((format!("file {k} in {}", f.chat_id), in_window(first.at)));
        } else {
            seen_files.push(key);
        }
    }
    // Every press answered once, with its own value.
    let mut unanswered = 0;
    for q in &presses {
        match tg.press(q).and_then(|p| p.answer) {
            Some((args, _)) => assert!(args["text"].as_str().unwrap_or("").starts_with("got p")),
            None => unanswered += 1,
        }
    }
    // The photo's link serves its bytes through the balancer after its maker died.
    let ev = handler.first_with_attachments();
    let url = ev["attachments"][0]["url"].as_str().unwrap().to_owned();
    assert!(url.starts_with(&api.url()), "{url}");
    let r = reqwest::get(&url).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.bytes().await.unwrap().to_vec() == photo,
        "the photo's bytes"
    );
    println!(
        "actions drill: {written} messages, {} menus, {} files, {} presses; done twice in the kill's window: {:?}; second pollers (409) {}",
        menus.len(),
        files.len(),
        presses.len(),
        dups.iter().map(|(d, _)| d).collect::<Vec<_>>(),
        tg.conflicts()
    );
    assert!(
        wrong.is_empty(),
        "menus not edited once then deleted: {wrong:?}"
    );
    assert_eq!(unanswered, 0, "presses left unanswered");
    assert_eq!(tg.conflicts(), 0, "two pollers on one token");
    let distinct_menus = menus.len() - dups.iter().filter(|(d, _)| d.starts_with("menu ")).count();
    assert_eq!(
        distinct_menus as u64,
        written / 4,
        "a menu for every 4th message"
    );
    assert_eq!(
        seen_files.len() as u64,
        written / 4,
        "a file for every 4th message"
    );
    let outside: Vec<&String> = dups.iter().filter(|(_, w)| !w).map(|(d, _)| d).collect();
    assert!(
        outside.is_empty(),
        "done twice, not in the kill's window: {outside:?}"
    );
    drop(procs);
}
