//! Answers that come later on a fleet of `botfleet worker` processes (one Redis, one SQLite
//! registry, a round-robin proxy in front of the hooks addresses): the worker holding a turn
//! is killed with SIGKILL right after its handler answered `202`; the parts posted through
//! another worker's API finish the turn, once and in order, and the chat's next message is
//! answered after the last part, with the state the parts left — for a polling Telegram bot
//! (the bot's claim moves to the survivor, which holds the turn on) and for a Telegram
//! webhook bot behind the balancer (the chat's turn is taken over). Then a SIGTERM of the
//! worker holding a turn: it hands its bots over, and the turn is held on by the next. Last,
//! a kill of the worker holding a turn of a Discord bot (its gateway session moves to the
//! survivor, which holds the turn on).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform, Secret};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{
    connector_suite::{all_over, asked_in, later_handler, post_three_parts, NEXT_AFTER_PARTS},
    fleet_worker, wait_for, FakeDiscord, FakeTelegram, Proc, RedisServer, RoundRobinProxy,
    ScriptedHandler, TempDir,
};

const POLL: &str = "7100:later-poll";
const HOOK: &str = "7101:later-hook";
const DISC: &str = "DISCORD.later.SECRET";
const SECRET: &str = "later-secret_1";

struct Fleet {
    tg: FakeTelegram,
    dc: FakeDiscord,
    handler: ScriptedHandler,
    proxy: RoundRobinProxy,
    dir: TempDir,
    db: String,
    /// The registry the workers share (their inbox too), read by the test.
    store: SqliteStore,
    redis: RedisServer,
    /// Each live worker, with its hooks and API addresses.
    workers: Vec<(Proc, String, String)>,
}

impl Fleet {
    async fn start() -> Self {
        let redis = RedisServer::start().unwrap();
        let tg = FakeTelegram::start().await.unwrap();
        let handler = later_handler().await;
        let proxy = RoundRobinProxy::start_with_timeout(Vec::new(), Duration::from_secs(1)).await;
        let dir = TempDir::new("botfleet-later-fleet");
        let db_path = dir.0.join("bots.db");
        let db = format!("sqlite://{}", db_path.display());
        let store = SqliteStore::open(&db_path).await.unwrap();
        let hook = HandlerSpec::Webhook {
            url: handler.url(),
            secret: None,
        };
        for (id, token, webhook) in [("poll", POLL, false), ("hook", HOOK, true)] {
            tg.state().add_bot(token);
            let mut s = BotSpec::new(BotId::new(id).unwrap(), Platform::Telegram, token);
            s.options.api_url = Some(tg.url());
            s.handler = hook.clone();
            if webhook {
                s.options.mode = Some("webhook".into());
                s.hook.secret = Some(Secret::new(SECRET));
            }
            store.add_bot(&s).await.unwrap();
        }
        let dc = FakeDiscord::start().await.unwrap();
        dc.state().add_bot(DISC, 1, 1);
        let mut s = BotSpec::new(BotId::new("disc").unwrap(), Platform::Discord, DISC);
        s.options.api_url = Some(dc.url());
        s.handler = hook.clone();
        store.add_bot(&s).await.unwrap();
        let mut fleet = Self {
            tg,
            dc,
            handler,
            proxy,
            dir,
            db,
            store,
            redis,
            workers: Vec::new(),
        };
        fleet.add("a").await;
        fleet.add("b").await;
        let public = format!("{}/hooks/telegram/hook", fleet.proxy.url());
        wait_for("the bots running", Duration::from_secs(30), || async {
            let s = fleet.tg.state();
            (s.is_polling(POLL)
                && s.webhook(HOOK).as_deref() == Some(public.as_str())
                && fleet.dc.state().connected_shards(DISC) == 1)
                .then_some(())
        })
        .await;
        fleet
    }

    async fn add(&mut self, name: &str) {
        let w = Proc::spawn(
            name,
            fleet_worker(
                env!("CARGO_BIN_EXE_botfleet"),
                name,
                &self.db,
                &self.redis.url(),
                "later",
            )
            .args(["--lease-ms", "3000", "--public-url", &self.proxy.url()]),
            &self.dir.0,
        );
        let log = w.log.clone();
        let hooks = wait_for("the hooks address", Duration::from_secs(20), || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let url = text
                .lines()
                .find_map(|l| l.split(" hooks on ").nth(1).map(|u| u.trim().to_owned()));
            async move { url }
        })
        .await;
        let api = w.api_url().await;
        self.workers.push((w, hooks, api));
        self.balance();
    }

    fn balance(&self) {
        self.proxy
            .set_backends(self.workers.iter().map(|w| w.1.clone()).collect());
    }

    /// The worker holding a turn open, by its metrics.
    async fn holder(&self) -> usize {
        wait_for(
            "a worker holding the turn",
            Duration::from_secs(20),
            || async {
                for (i, (_, _, api)) in self.workers.iter().enumerate() {
                    let text = reqwest::get(format!("{api}/metrics"))
                        .await
                        .ok()?
                        .text()
                        .await
                        .ok()?;
                    if text
                        .lines()
                        .any(|l| l.starts_with("botfleet_turns_held{") && l.ends_with(" 1"))
                    {
                        return Some(i);
                    }
                }
                None
            },
        )
        .await
    }

    /// What `token`'s bot sent to `chat`, in order.
    fn sent(&self, token: &str, chat: i64) -> Vec<String> {
        let chat = chat.to_string();
        if token == DISC {
            return self
                .dc
                .state()
                .shown_in_channels(DISC)
                .into_iter()
                .filter(|(c, _)| *c == chat)
                .map(|(_, t)| t)
                .collect();
        }
        self.tg
            .state()
            .sent()
            .into_iter()
            .filter(|s| s.token == token && s.chat_id == chat)
            .map(|s| s.text)
            .collect()
    }

    /// A user of `token`'s bot writes `text` in `chat`.
    fn user_writes(&self, token: &str, chat: i64, text: &str) {
        if token == DISC {
            self.dc.state().user_writes(DISC, chat.unsigned_abs(), text);
        } else {
            self.tg.state().user_writes(token, chat, text);
        }
    }

    /// In `chat` of `token`'s bot: "ask" held, the holder taken down by `signal`, "next"
    /// written, three parts posted through a survivor: all answered once, in order.
    async fn drill(&mut self, token: &str, chat: i64, signal: &str) {
        self.user_writes(token, chat, "ask");
        let reply_token = asked_in(&self.handler, &chat.to_string()).await;
        let holder = self.holder().await;
        let (w, _, _) = self.workers.remove(holder);
        w.signal(signal);
        self.balance();
        self.user_writes(token, chat, "next");
        post_three_parts(&self.workers[0].2, &reply_token).await;
        let next = NEXT_AFTER_PARTS;
        wait_for("the next message answered", Duration::from_secs(40), || {
            let done = self.sent(token, chat).iter().any(|t| t == next);
            async move { done.then_some(()) }
        })
        .await;
        // Every turn over: nothing more is sent, what was sent can be counted.
        let bot = match token {
            POLL => "poll",
            HOOK => "hook",
            _ => "disc",
        };
        let bot = BotId::new(bot).unwrap();
        all_over(&self.store, &bot).await;
        assert_eq!(
            self.sent(token, chat),
            ["one", "two", "three", next],
            "{signal} of the holder, chat {chat}"
        );
        let id = chat.to_string();
        let asked = self
            .handler
            .seen()
            .iter()
            .filter(|e| e["text"] == "ask" && e["chat"]["chat"] == id.as_str())
            .count();
        assert_eq!(asked, 1, "the handler was asked again after the {signal}");
        drop(w);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_turn_outlives_a_kill_and_a_sigterm_of_its_worker() {
    let mut fleet = Fleet::start().await;
    fleet.drill(POLL, 11, "-KILL").await;
    fleet.add("c").await;
    fleet.drill(HOOK, 12, "-KILL").await;
    fleet.add("d").await;
    fleet.drill(POLL, 13, "-TERM").await;
    fleet.add("e").await;
    fleet.drill(DISC, 14, "-KILL").await;
}
