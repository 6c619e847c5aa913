//! The platforms' send limits kept by the fleet: a bot's calls take a token from each bucket
//! its platform counts them against (Telegram: the chat's, the group's, the bot's), through
//! the coordinator every worker shares, and wait — without a turn slot — when one is empty.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use botfleet_coord::Coordinator;
use botfleet_core::{BotId, BotSpec, HandlerSpec, Inbound, Platform};
use botfleet_runtime::{BotHandler, HandlerError, TurnContext};
use botfleet_testkit::{
    connector_suite::{Harness, RunningWorker},
    wait_for, FakeTelegram,
};

const TOKEN: &str = "5300:limits-SECRET";

/// Answers a message "N" with N messages "reply i of N", anything else with its text.
struct Many;

#[async_trait]
impl BotHandler for Many {
    async fn handle(&self, event: &Inbound, cx: &mut TurnContext) -> Result<(), HandlerError> {
        let Ok(n) = event.text.parse::<usize>() else {
            cx.reply(event.text.clone());
            return Ok(());
        };
        for i in 1..=n {
            cx.send(format!("reply {i} of {n}"), Vec::new(), None);
        }
        Ok(())
    }
}

/// Answers after 3 s (a handler that takes long enough to show typing).
struct Slow;

#[async_trait]
impl BotHandler for Slow {
    async fn handle(&self, event: &Inbound, cx: &mut TurnContext) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_secs(3)).await;
        cx.reply(event.text.clone());
        Ok(())
    }
}

/// Answers a message "N" as [`Many`] does; anything else later, in three parts 1.5 s apart:
/// a message "a" (its ref "m"), its edit to "ab", and — the last part — its edit to "abc".
struct LaterEdits;

#[async_trait]
impl BotHandler for LaterEdits {
    async fn handle(&self, event: &Inbound, cx: &mut TurnContext) -> Result<(), HandlerError> {
        if event.text.parse::<usize>().is_ok() {
            return Many.handle(event, cx).await;
        }
        let later = cx.later().expect("a worker's turn");
        cx.answer_later();
        tokio::spawn(async move {
            let parts = [
                (
                    "p1",
                    serde_json::json!({"actions": [{"type": "send", "text": "a", "ref": "m"}], "final": false}),
                ),
                (
                    "p2",
                    serde_json::json!({"actions": [{"type": "edit", "ref": "m", "text": "ab"}], "final": false}),
                ),
                (
                    "p3",
                    serde_json::json!({"actions": [{"type": "edit", "ref": "m", "text": "abc"}], "final": true}),
                ),
            ];
            for (i, (key, part)) in parts.iter().enumerate() {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                later.post(key, part).await.expect("a part taken");
            }
        });
        Ok(())
    }
}

/// The Telegram bot "lim" on `fake`, answered by [`Many`].
fn lim(fake: &FakeTelegram) -> BotSpec {
    let mut bot = BotSpec::new(BotId::new("lim").unwrap(), Platform::Telegram, TOKEN);
    bot.options.api_url = Some(fake.url());
    bot.handler = HandlerSpec::Named("many".into());
    bot
}

/// Starts worker `name` of `h` with [`Many`], its configuration changed by `tune`.
fn start(
    h: &Harness,
    name: &str,
    tune: impl FnOnce(&mut botfleet_runtime::WorkerConfig),
) -> RunningWorker {
    h.start_with(name, |c| {
        let handlers: HashMap<String, Arc<dyn BotHandler>> = HashMap::from([
            ("many".to_owned(), Arc::new(Many) as Arc<dyn BotHandler>),
            ("slow".to_owned(), Arc::new(Slow) as Arc<dyn BotHandler>),
            (
                "later_edits".to_owned(),
                Arc::new(LaterEdits) as Arc<dyn BotHandler>,
            ),
        ]);
        c.handlers = Arc::new(handlers);
        tune(c);
    })
}

/// The bot "lim" run by worker "a" (its configuration changed by `tune`), polling a new fake.
async fn running(
    tune: impl FnOnce(&mut botfleet_runtime::WorkerConfig),
) -> (FakeTelegram, Harness, RunningWorker) {
    running_as(None, tune).await
}

/// [`running`], the bot with its own `rate_limits`.
async fn running_as(
    rate_limits: Option<&str>,
    tune: impl FnOnce(&mut botfleet_runtime::WorkerConfig),
) -> (FakeTelegram, Harness, RunningWorker) {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let mut bot = lim(&fake);
    bot.options.rate_limits = rate_limits.map(str::to_owned);
    let h = Harness::new(&[bot]).await;
    let w = start(&h, "a", tune);
    let tg = fake.state();
    wait_for("polling", Duration::from_secs(20), || async {
        tg.is_polling(TOKEN).then_some(())
    })
    .await;
    (fake, h, w)
}

/// When each of `chat`'s `n` replies reached the fake, once all of them did.
async fn replies_at(tg: &botfleet_testkit::FakeState, chat: i64, n: usize) -> Vec<Instant> {
    wait_for("the replies sent", Duration::from_secs(30), || async {
        let at: Vec<Instant> = tg
            .sent()
            .into_iter()
            .filter(|s| s.chat_id == chat.to_string())
            .map(|s| s.at)
            .collect();
        (at.len() >= n).then_some(at)
    })
    .await
}

/// Waits until worker "a" (`w`) counted a first 429 of `platform`'s `scope`, then answers what
/// another coordinator's take from the bucket `key` (of `limit`) finds.
async fn after_429(
    w: &RunningWorker,
    other: &impl Coordinator,
    platform: &str,
    scope: &str,
    key: &str,
    limit: botfleet_coord::RateLimit,
) -> botfleet_coord::BucketTake {
    let counted = format!(
        "botfleet_rate_limited_total{{worker_id=\"a\",platform=\"{platform}\",scope=\"{scope}\"}} 1"
    );
    wait_for("the 429 counted", Duration::from_secs(20), || async {
        w.metrics.render("a").contains(&counted).then_some(())
    })
    .await;
    other.take_buckets(&[(key, limit)]).await.unwrap()
}

/// Asks for 3 replies in `chat` and checks worker "a" (`w`) sent them taking no bucket:
/// nothing waited, nothing was timed.
async fn answered_taking_no_bucket(tg: &botfleet_testkit::FakeState, w: &RunningWorker, chat: i64) {
    tg.user_writes(TOKEN, chat, "3");
    replies_at(tg, chat, 3).await;
    let m = w.metrics.render("a");
    assert!(
        !m.contains("botfleet_rate_bucket_waits_total{")
            && !m.contains("botfleet_send_wait_seconds_count{"),
        "no bucket taken:\n{m}"
    );
}

/// `users` messages of users and `desk` sends from the backend (through `sends`, in turn) to
/// `group` of `bot` (`token` at the fake `tg`): all arrive, each once, each kind in order,
/// with at most one 429 in all.
async fn users_and_desk_in_one_group(
    tg: &botfleet_testkit::FakeState,
    token: &str,
    bot: &BotSpec,
    group: i64,
    (users, desk): (usize, usize),
    sends: &[botfleet_runtime::Sends],
) {
    for k in 0..users.max(desk) {
        if k < users {
            tg.user_writes(token, group, &format!("user {k}"));
        }
        if k < desk {
            let body = serde_json::json!({ "text": format!("desk {k}") }).to_string();
            sends[k % sends.len()]
                .submit(bot, &group.to_string(), &format!("desk-{k}"), &body)
                .await
                .expect("accepted");
        }
    }
    let texts: Vec<String> = wait_for("every message out", Duration::from_secs(120), || async {
        let t: Vec<String> = tg
            .sent()
            .into_iter()
            .filter(|s| s.chat_id == group.to_string())
            .map(|s| s.text)
            .collect();
        (t.len() >= users + desk).then_some(t)
    })
    .await;
    let of = |kind: &str| -> Vec<String> {
        texts
            .iter()
            .filter(|t| t.starts_with(kind))
            .cloned()
            .collect()
    };
    let want =
        |kind: &str, n: usize| -> Vec<String> { (0..n).map(|k| format!("{kind} {k}")).collect() };
    assert_eq!(of("user"), want("user", users), "{texts:?}");
    assert_eq!(of("desk"), want("desk", desk), "{texts:?}");
    assert_eq!(texts.len(), users + desk, "each once: {texts:?}");
    assert!(tg.messages_paced() <= 1, "429s: {}", tg.messages_paced());
}

/// The gaps between consecutive instants.
fn gaps(at: &[Instant]) -> Vec<Duration> {
    at.windows(2).map(|w| w[1] - w[0]).collect()
}

/// Telegram's documented limits, kept: one message a second in a private chat, one every
/// 3 s in a group (20 a minute); the waits are counted by scope and timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bots_messages_keep_telegrams_chat_and_group_limits() {
    let (fake, _h, w) = running(|_| {}).await;
    let tg = fake.state();
    tg.user_writes(TOKEN, 7, "3");
    tg.user_writes(TOKEN, -100_500, "2");
    let private = replies_at(tg, 7, 3).await;
    let group = replies_at(tg, -100_500, 2).await;
    // Lower bounds only (a busy machine makes them longer): the token comes back at the
    // bucket's rate, and the call goes after it (a little under it for the HTTP call's own
    // time).
    for g in gaps(&private) {
        assert!(g >= Duration::from_millis(900), "private chat: {g:?}");
    }
    for g in gaps(&group) {
        assert!(g >= Duration::from_millis(2_900), "group: {g:?}");
    }
    let m = w.metrics.render("a");
    for scope in ["chat", "group"] {
        let line = format!(
            "botfleet_rate_bucket_waits_total{{worker_id=\"a\",platform=\"telegram\",scope=\"{scope}\"}}"
        );
        assert!(m.contains(&line), "{scope} waits counted:\n{m}");
    }
    assert!(
        m.contains("botfleet_send_wait_seconds_count{worker_id=\"a\",platform=\"telegram\"} 5"),
        "every message's wait timed:\n{m}"
    );
    w.shutdown().await;
}

/// A bucket emptied or paused through another coordinator (another worker of the fleet) holds
/// this worker's sends in that chat, and only there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_paused_elsewhere_in_the_fleet_holds_this_workers_sends() {
    let (fake, h, w) = running(|_| {}).await;
    let tg = fake.state();
    let other = h.coordinator();
    let pause = Duration::from_secs(4);
    let paused_at = Instant::now();
    other
        .pause_bucket("send:telegram:lim:chat:42", pause)
        .await
        .unwrap();
    tg.user_writes(TOKEN, 42, "1");
    tg.user_writes(TOKEN, 43, "1");
    let held = replies_at(tg, 42, 1).await[0];
    let free = replies_at(tg, 43, 1).await[0];
    assert!(
        held - paused_at >= pause - Duration::from_millis(100),
        "sent {:?} into a pause of {pause:?}",
        held - paused_at
    );
    assert!(
        free < held,
        "the other chat did not wait for the paused one"
    );
    w.shutdown().await;
}

/// `off` keeps no limit: nothing waits, nothing is timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_turned_off_take_no_bucket() {
    let (fake, _h, w) = running(|c| c.rate_limits = "off".parse().unwrap()).await;
    let tg = fake.state();
    answered_taking_no_bucket(tg, &w, 9).await;
    w.shutdown().await;
}

/// A bot's own `rate_limits` go over the worker's: a bot with `chat=1/2` on a worker that keeps
/// no limit (`off`) sends to a chat once every 2 s and counts its waits; a bot with `off` on a
/// worker keeping the documented limits takes no bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bots_own_rate_limits_go_over_the_workers() {
    let (fake, _h, w) = running_as(Some("chat=1/2"), |c| {
        c.rate_limits = "off".parse().unwrap();
    })
    .await;
    let tg = fake.state();
    tg.user_writes(TOKEN, 11, "3");
    for g in gaps(&replies_at(tg, 11, 3).await) {
        assert!(
            g >= Duration::from_millis(1_900),
            "private chat at 1/2 s: {g:?}"
        );
    }
    let m = w.metrics.render("a");
    assert!(
        m.contains(
            "botfleet_rate_bucket_waits_total{worker_id=\"a\",platform=\"telegram\",scope=\"chat\"}"
        ),
        "the chat's waits counted:\n{m}"
    );
    w.shutdown().await;

    let (fake, _h, w) = running_as(Some("off"), |_| {}).await;
    let tg = fake.state();
    answered_taking_no_bucket(tg, &w, 12).await;
    w.shutdown().await;
}

/// A 429 pauses the bucket it was for — Telegram's: the chat's — for the whole fleet, for
/// the platform's `retry_after`: another coordinator sees the pause, the chat's send goes
/// after it, and another chat does not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_pauses_its_chats_bucket_for_the_fleet() {
    let (fake, h, w) = running(|_| {}).await;
    let tg = fake.state();
    let retry_after = Duration::from_secs(5);
    tg.inject_send(
        TOKEN,
        botfleet_testkit::Fault::TooManyRequests(retry_after.as_secs()),
    );
    let written = Instant::now();
    tg.user_writes(TOKEN, 42, "1");
    let other = h.coordinator();
    let chat = botfleet_coord::RateLimit::new(1.0, 1);
    let key = "send:telegram:lim:chat:42";
    let seen = after_429(&w, &other, "telegram", "chat", key, chat).await;
    assert!(
        seen.wait > Duration::from_millis(500),
        "the pause is the fleet's: {seen:?}"
    );
    tg.user_writes(TOKEN, 43, "1");
    let free = replies_at(tg, 43, 1).await[0];
    let held = replies_at(tg, 42, 1).await[0];
    assert!(
        free < held,
        "the other chat did not wait for the paused one"
    );
    // The 429 came after the message was written.
    assert!(
        held - written >= retry_after - Duration::from_millis(100),
        "sent {:?} after the message, though the 429 asked for {retry_after:?}",
        held - written
    );
    w.shutdown().await;
}

/// Replies and sends from the backend to one group, taken by three workers, against a fake
/// that answers 429 to a second message within 100 ms to a chat (Telegram's limit, scaled
/// down; the workers keep 4 a second): every message arrives, each kind in its order, with
/// at most one 429 in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_and_backend_sends_to_one_group_keep_its_limit_with_three_workers() {
    let fake = FakeTelegram::start().await.unwrap();
    let tg = fake.state();
    tg.add_bot(TOKEN);
    tg.pace_chats(Some(Duration::from_millis(100)));
    let bot = lim(&fake);
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let limits = || -> botfleet_runtime::RateLimits {
        "telegram.chat=4/1:1,telegram.group=off".parse().unwrap()
    };
    let workers: Vec<RunningWorker> = ["a", "b", "c"]
        .iter()
        .map(|n| start(&h, n, |c| c.rate_limits = limits()))
        .collect();
    wait_for("polling", Duration::from_secs(20), || async {
        tg.is_polling(TOKEN).then_some(())
    })
    .await;
    let sends: Vec<_> = workers.iter().map(|w| w.sends.clone()).collect();
    users_and_desk_in_one_group(tg, TOKEN, &bot, -4_200, (10, 12), &sends).await;
    for w in workers {
        w.shutdown().await;
    }
}

/// 200 sends from the backend to 200 users of one WhatsApp Cloud number, all at once, against
/// the Graph fake keeping the number's 80 messages a second: paced to it (the burst, then
/// 80 a second), each sent once, at most a rare 429 from the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whatsapp_sends_at_once_are_paced_to_the_numbers_throughput() {
    const NUMBER: &str = "100777";
    const ACCESS: &str = "EAAG-limits-SECRET";
    let graph = botfleet_testkit::FakeGraph::start().await.unwrap();
    let g = graph.state();
    g.add_number(NUMBER, ACCESS, "app-secret");
    g.limit_throughput(NUMBER, 80);
    let mut bot = BotSpec::new(BotId::new("wal").unwrap(), Platform::Whatsapp, ACCESS);
    bot.options.api_url = Some(graph.url());
    bot.options.phone_number_id = Some(NUMBER.into());
    bot.hook.secret = Some(botfleet_core::Secret::new("app-secret"));
    bot.hook.verify_token = Some(botfleet_core::Secret::new("verify-me"));
    bot.handler = HandlerSpec::Named("many".into());
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let w = start(&h, "a", |_| {});
    // Sends are taken once the worker has registered: the first one is waited for (it takes
    // one message of the number's burst).
    let warm = serde_json::json!({ "text": "warm" }).to_string();
    wait_for(
        "the worker taking sends",
        Duration::from_secs(20),
        || async { w.sends.submit(&bot, "4917warm", "warm", &warm).await.ok() },
    )
    .await;
    wait_for("the first send out", Duration::from_secs(20), || async {
        (g.sent_times().len() == 1).then_some(())
    })
    .await;
    let n = 200;
    let mut submits = tokio::task::JoinSet::new();
    for k in 0..n {
        let (sends, bot) = (w.sends.clone(), bot.clone());
        submits.spawn(async move {
            let body = serde_json::json!({ "text": format!("notice {k}") }).to_string();
            sends
                .submit(&bot, &format!("4917{k:05}"), &format!("n-{k}"), &body)
                .await
                .expect("accepted");
        });
    }
    while let Some(r) = submits.join_next().await {
        r.unwrap();
    }
    let at = wait_for("every notice sent", Duration::from_secs(60), || async {
        let at = g.sent_times();
        (at.len() > n).then(|| at[1..].to_vec())
    })
    .await;
    // The worker keeps 80 a second by when it sends; the fake counts by when a request
    // arrives, with a tenth more for the way (100 ms). On 2 cores busy with the whole suite a
    // request can wait longer than that between the two, so a rare 429 (retried, not lost) is
    // the wire's, not the pacing's: unpaced, about 110 of the 200 are refused.
    let throttled = g.throttled();
    assert!(
        throttled <= 3,
        "{throttled} 429s for the number's throughput"
    );
    let mut texts: Vec<String> = g.sent().into_iter().map(|s| s.text).collect();
    texts.sort();
    let before = texts.len();
    texts.dedup();
    assert_eq!(texts.len(), before, "a notice sent twice");
    // 79 at once, the other 121 at 80 a second: at least 1.5 s (a little under it for the
    // calls' own time).
    let span = at[n - 1] - at[0];
    assert!(
        span >= Duration::from_millis(1_300),
        "{n} sends in {span:?}"
    );
    let m = w.metrics.render("a");
    assert!(
        m.contains(
            "botfleet_rate_bucket_waits_total{worker_id=\"a\",platform=\"whatsapp\",scope=\"number\"}"
        ),
        "{m}"
    );
    w.shutdown().await;
}

/// The Discord bot `id` (`token`, answered by the handler named `handler`) run by worker "a"
/// (its configuration changed by `tune`), its one shard up on a new fake.
async fn discord_running(
    token: &str,
    id: &str,
    handler: &str,
    tune: impl FnOnce(&mut botfleet_runtime::WorkerConfig),
) -> (botfleet_discord::fake::FakeDiscord, Harness, RunningWorker) {
    let fake = botfleet_discord::fake::FakeDiscord::start().await.unwrap();
    fake.state().add_bot(token, 1, 1);
    let mut bot = BotSpec::new(BotId::new(id).unwrap(), Platform::Discord, token);
    bot.options.api_url = Some(fake.url());
    bot.handler = HandlerSpec::Named(handler.into());
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let w = start(&h, "a", tune);
    wait_for("the shard up", Duration::from_secs(30), || async {
        (fake.state().connected_shards(token) == 1).then_some(())
    })
    .await;
    (fake, h, w)
}

/// The edits of `token`'s messages Discord took, once [`LaterEdits`]'s last ("abc") is
/// among them.
async fn edits_until_the_last(
    fake: &botfleet_discord::fake::FakeDiscord,
    token: &str,
) -> Vec<String> {
    wait_for("the last part's edit", Duration::from_secs(30), || async {
        let e: Vec<String> = fake
            .state()
            .edits(token)
            .into_iter()
            .map(|e| e.content)
            .collect();
        e.iter().any(|t| t == "abc").then_some(e)
    })
    .await
}

/// When the Discord fake took `channel`'s first message from `token`'s bot.
async fn discord_post_at(
    fake: &botfleet_discord::fake::FakeDiscord,
    token: &str,
    channel: u64,
) -> Instant {
    wait_for("the channel's answer", Duration::from_secs(30), || async {
        fake.state()
            .sent_by(token)
            .into_iter()
            .find(|p| p.channel == channel.to_string())
            .map(|p| p.at)
    })
    .await
}

/// A Discord route's 429 pauses that route's bucket — the channel's — on every worker, and
/// no other (another channel and the bot's global bucket go on); a global 429 pauses the
/// bot's global bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discord_429_pauses_its_route_or_the_bots_global_bucket() {
    use botfleet_discord::fake::SendFault;
    const DTOKEN: &str = "DISCORD.limits.SECRET";
    let (fake, h, w) = discord_running(DTOKEN, "dl", "many", |_| {}).await;
    let other = h.coordinator();
    let probe = botfleet_coord::RateLimit::new(1.0, 1);
    let pause = Duration::from_secs(4);
    let global = botfleet_coord::RateLimit::new(50.0, 50);
    // A route's 429: the channel waits, another channel and the global bucket do not.
    fake.state()
        .inject_send(DTOKEN, SendFault::TooManyRequests(pause.as_secs_f64()));
    let written = Instant::now();
    fake.state().user_writes(DTOKEN, 5, "route");
    let key = "send:discord:dl:channel:5";
    let seen = after_429(&w, &other, "discord", "channel", key, probe).await;
    assert!(
        seen.wait > Duration::from_millis(500),
        "the route paused: {seen:?}"
    );
    let g = other
        .take_buckets(&[("send:discord:dl:global", global)])
        .await
        .unwrap();
    assert!(g.taken(), "the global bucket is not paused: {g:?}");
    fake.state().user_writes(DTOKEN, 6, "elsewhere");
    let free = discord_post_at(&fake, DTOKEN, 6).await;
    let held = discord_post_at(&fake, DTOKEN, 5).await;
    assert!(
        free < held,
        "the other channel did not wait for the paused route"
    );
    assert!(
        held - written >= pause - Duration::from_millis(100),
        "{:?}",
        held - written
    );
    // A global 429: the bot's global bucket, for every worker.
    fake.state().inject_send(
        DTOKEN,
        SendFault::GlobalTooManyRequests(pause.as_secs_f64()),
    );
    fake.state().user_writes(DTOKEN, 7, "global");
    let key = "send:discord:dl:global";
    let g = after_429(&w, &other, "discord", "global", key, global).await;
    assert!(
        g.wait > Duration::from_millis(500),
        "the global bucket paused: {g:?}"
    );
    discord_post_at(&fake, DTOKEN, 7).await;
    w.shutdown().await;
}

/// Typing gives way first: a slow handler's typing takes a token from Discord's global bucket
/// and, while that bucket is held (paused through another coordinator, as a global 429 would),
/// is left out — counted, never waited for — while the reply waits for the bucket and goes.
/// With the bucket free, the same slow turn shows typing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typing_gives_way_when_discords_global_bucket_is_short() {
    const DTOKEN: &str = "DISCORD.typing.SECRET";
    let (fake, h, w) = discord_running(DTOKEN, "dt", "slow", |_| {}).await;
    let other = h.coordinator();
    let skipped = "botfleet_typing_skipped_total{worker_id=\"a\",platform=\"discord\"}";
    other
        .pause_bucket("send:discord:dt:global", Duration::from_secs(6))
        .await
        .unwrap();
    fake.state().user_writes(DTOKEN, 7, "held");
    wait_for("typing left out", Duration::from_secs(20), || async {
        w.metrics.render("a").contains(skipped).then_some(())
    })
    .await;
    assert!(
        fake.state().typing(DTOKEN).is_empty(),
        "typing shown into a held bucket"
    );
    discord_post_at(&fake, DTOKEN, 7).await;
    fake.state().user_writes(DTOKEN, 8, "free");
    wait_for("typing shown", Duration::from_secs(20), || async {
        fake.state()
            .typing(DTOKEN)
            .contains(&"8".to_owned())
            .then_some(())
    })
    .await;
    w.shutdown().await;
}

/// Discord's route limits, learnt from its answers and kept by the fleet: with the documented
/// channel limit off, five messages of one turn into a channel whose message route allows 2 a
/// 3 s window (the fake announces it as Discord does, in `X-RateLimit-*` headers) wait for
/// the route's reset instead of meeting a 429; the bucket Discord said is empty is paused
/// where another coordinator sees it; another channel goes on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discords_announced_route_limits_are_learnt_and_kept_by_the_fleet() {
    const DTOKEN: &str = "DISCORD.routes.SECRET";
    let (fake, h, w) = discord_running(DTOKEN, "dr", "many", |c| {
        c.rate_limits = "discord.channel=off".parse().unwrap();
    })
    .await;
    let window = Duration::from_secs(3);
    fake.state().limit_messages(Some((2, window)));
    let other = h.coordinator();
    fake.state().user_writes(DTOKEN, 5, "5");
    let waited =
        "botfleet_rate_bucket_waits_total{worker_id=\"a\",platform=\"discord\",scope=\"route\"}";
    wait_for(
        "a send waiting for the route",
        Duration::from_secs(30),
        || async { w.metrics.render("a").contains(waited).then_some(()) },
    )
    .await;
    // The route's bucket of channel 5, paused for the fleet until the window ends.
    let key = format!(
        "send:discord:dr:route:{}:5",
        botfleet_discord::fake::MESSAGES_BUCKET
    );
    let probe = botfleet_coord::RateLimit::new(1.0, 1);
    let seen = other.take_buckets(&[(&key, probe)]).await.unwrap();
    assert!(
        !seen.taken() && seen.wait > Duration::from_millis(300),
        "the route paused for the fleet: {seen:?}"
    );
    fake.state().user_writes(DTOKEN, 6, "elsewhere");
    let elsewhere = discord_post_at(&fake, DTOKEN, 6).await;
    let posts = wait_for("five messages", Duration::from_secs(30), || async {
        let p: Vec<_> = fake
            .state()
            .sent_by(DTOKEN)
            .into_iter()
            .filter(|p| p.channel == "5")
            .collect();
        (p.len() >= 5).then_some(p)
    })
    .await;
    let texts: Vec<&str> = posts.iter().map(|p| p.content.as_str()).collect();
    let wanted: Vec<String> = (1..=5).map(|i| format!("reply {i} of 5")).collect();
    assert_eq!(texts, wanted, "in order, once each");
    assert_eq!(
        fake.state().messages_limited(DTOKEN),
        0,
        "no 429 for the route"
    );
    assert!(
        posts[2].at - posts[0].at >= window - Duration::from_millis(10),
        "the third waited for the window: {:?}",
        posts[2].at - posts[0].at
    );
    assert!(
        elsewhere < posts[2].at,
        "channel 6 waited for channel 5's route"
    );
    w.shutdown().await;
}

/// Discord bans an IP for 10,000 refused calls (401, 403, 429) in 10 minutes; the fleet keeps
/// short of it. With the budget at 3 refused calls a minute (`discord.invalid=3/60`), replies
/// into a channel the bot may not post in (403) spend it; the fourth shuts the gate of every
/// Discord call for every worker (seen through another coordinator) for a tenth of the budget
/// (6 s): a reply in another channel waits for it, then goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_calls_past_the_fleets_budget_stop_discords_calls_short_of_the_ban() {
    const DTOKEN: &str = "DISCORD.invalid.SECRET";
    let (fake, h, w) = discord_running(DTOKEN, "di", "many", |c| {
        c.rate_limits = "discord.invalid=3/60".parse().unwrap();
    })
    .await;
    fake.state().mute(DTOKEN, 9);
    let other = h.coordinator();
    for i in 0..4 {
        fake.state().user_writes(DTOKEN, 9, &format!("refused {i}"));
    }
    let shut = "botfleet_invalid_guard_shut_total{worker_id=\"a\",platform=\"discord\"} 1";
    wait_for("the gate shut", Duration::from_secs(30), || async {
        w.metrics.render("a").contains(shut).then_some(())
    })
    .await;
    let at = Instant::now();
    let probe = botfleet_coord::RateLimit::new(1.0, 1);
    let seen = other
        .take_buckets(&[("send:discord::invalid:gate", probe)])
        .await
        .unwrap();
    assert!(
        !seen.taken() && seen.wait > Duration::from_secs(1),
        "the gate shut for the fleet: {seen:?}"
    );
    let m = w.metrics.render("a");
    assert!(
        m.contains("botfleet_invalid_requests_total{worker_id=\"a\",platform=\"discord\"} 4"),
        "{m}"
    );
    fake.state().user_writes(DTOKEN, 6, "elsewhere");
    let posted = discord_post_at(&fake, DTOKEN, 6).await;
    assert!(
        posted - at >= Duration::from_secs(3),
        "another channel's reply went through the shut gate after {:?}",
        posted - at
    );
    assert!(fake
        .state()
        .sent_by(DTOKEN)
        .iter()
        .all(|p| p.channel != "9"));
    w.shutdown().await;
}

/// A webhook bot's turns run on whichever worker the balancer hands a delivery to: 50 replies
/// and 50 sends from the backend (through the three workers' APIs) to one Telegram group,
/// against a fake keeping Telegram's limits scaled (a chat's second message within 100 ms,
/// more than 10 to a group within 2 s: 429), all arrive, in order, each once, with at most
/// one 429 in all — the workers keeping 9 a second to a chat and 4 a second to a group,
/// together (the chat's pace alone would break the group's limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_bots_group_messages_through_three_workers_keep_telegrams_limits() {
    use botfleet_testkit::webhook_suite;
    const GTOKEN: &str = "5400:group-token";
    let fake = FakeTelegram::start().await.unwrap();
    let tg = fake.state();
    tg.add_bot(GTOKEN);
    tg.pace_chats(Some(Duration::from_millis(100)));
    tg.limit_groups(Some((10, Duration::from_secs(2))));
    let (_dir, store) = botfleet_testkit::temp_sqlite("botfleet-limits").await;
    let mut bot = BotSpec::new(BotId::new("groupy").unwrap(), Platform::Telegram, GTOKEN);
    bot.options.api_url = Some(fake.url());
    bot.options.mode = Some("webhook".into());
    bot.hook.secret = Some(botfleet_core::Secret::new("group-secret_1"));
    bot.handler = HandlerSpec::Echo;
    store.add_bot(&bot).await.unwrap();
    let proxy = botfleet_testkit::RoundRobinProxy::start(Vec::new()).await;
    let hub = botfleet_coord::MemoryHub::new();
    let mut workers = Vec::new();
    for name in ["a", "b", "c"] {
        let mut c = webhook_suite::config(name, &proxy.url());
        c.rate_limits = "telegram.chat=9/1:1,telegram.group=4/1:1".parse().unwrap();
        let coord: Arc<dyn Coordinator> = Arc::new(hub.coordinator());
        workers.push(webhook_suite::start(c, coord, store.clone()).await);
    }
    proxy.set_backends(workers.iter().map(|w| w.hooks_url.clone()).collect());
    let hook = format!("{}/hooks/telegram/groupy", proxy.url());
    wait_for("the webhook set", Duration::from_secs(20), || async {
        (tg.webhook(GTOKEN).as_deref() == Some(hook.as_str())).then_some(())
    })
    .await;
    let sends: Vec<_> = workers.iter().map(|w| w.sends.clone()).collect();
    users_and_desk_in_one_group(tg, GTOKEN, &bot, -4_300, (50, 50), &sends).await;
    for w in workers {
        w.shutdown().await;
    }
}

/// Edits that a newer one supersedes give way first: a held turn's answer in three parts on
/// Discord — a message, its edit 1.5 s later, the last part's edit 1.5 s after that — with
/// the bot's global bucket at one call every 6 s. The first edit finds the bucket short and
/// does not hold the turn: the last part's edit goes instead of it (counted as coalesced),
/// once the bucket has a token. One edit reaches Discord, not two 6 s apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_gives_way_to_a_newer_part_while_its_bucket_is_short() {
    const DTOKEN: &str = "DISCORD.giveway.SECRET";
    let (fake, _h, w) = discord_running(DTOKEN, "dg", "later_edits", |c| {
        c.rate_limits = "discord.global=1/6:1".parse().unwrap();
    })
    .await;
    fake.state().user_writes(DTOKEN, 5, "go");
    let texts = edits_until_the_last(&fake, DTOKEN).await;
    assert_eq!(texts, ["abc"], "the superseded edit went too");
    let sent: Vec<String> = fake
        .state()
        .sent_by(DTOKEN)
        .into_iter()
        .map(|p| p.content)
        .collect();
    assert_eq!(sent, ["a"]);
    let m = w.metrics.render("a");
    assert!(
        m.contains(
            "botfleet_stream_edits_total{worker_id=\"a\",platform=\"discord\",outcome=\"coalesced\"} 1"
        ),
        "{m}"
    );
    w.shutdown().await;
}

/// A final message goes before a streaming edit: an edit that a newer part may supersede
/// leaves each bucket's reserve (a fifth of it) to the calls that do not yield. The bot's
/// global bucket at 5 (refilling once a minute): three messages in one channel and a held
/// turn's message in another leave one token — the reserve — so the turn's edit 1.5 s later
/// gives way, and the last part's edit takes that token and goes. Taking it for the edit
/// would have held the final text for a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_edit_leaves_the_buckets_reserve_to_the_final_one() {
    const DTOKEN: &str = "DISCORD.reserve.SECRET";
    let (fake, _h, w) = discord_running(DTOKEN, "dv", "later_edits", |c| {
        c.rate_limits = "discord.global=1/60:5".parse().unwrap();
    })
    .await;
    fake.state().user_writes(DTOKEN, 6, "3");
    wait_for("three messages", Duration::from_secs(30), || async {
        let n = fake.state().sent_by(DTOKEN).len();
        (n >= 3).then_some(())
    })
    .await;
    fake.state().user_writes(DTOKEN, 5, "go");
    let texts = edits_until_the_last(&fake, DTOKEN).await;
    assert_eq!(texts, ["abc"], "the streaming edit took the reserve");
    w.shutdown().await;
}
