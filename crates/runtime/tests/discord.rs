//! A Discord bot of several shards moving between workers: after the cold start every move
//! RESUMEs (IDENTIFYs stay at the shard count), no shard ever has two sessions, nothing
//! written is lost, nothing is answered twice.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{collections::HashMap, time::Duration};

use botfleet_core::{BotId, BotSpec, Platform};
use botfleet_discord::fake::FakeDiscord;
use botfleet_testkit::{connector_suite::Harness, wait_for};

const TOKEN: &str = "DISCORD.move.SECRET";
const SHARDS: u32 = 4;

async fn answered(fake: &FakeDiscord, texts: &[String]) {
    wait_for(
        "every message answered",
        Duration::from_secs(30),
        || async {
            let posts = fake.state().sent_by(TOKEN);
            texts
                .iter()
                .all(|t| posts.iter().any(|p| &p.content == t))
                .then_some(())
        },
    )
    .await;
}

/// Waits until `unit`'s checkpoint in the store holds a session for each of its `shards`.
async fn checkpointed(h: &Harness, unit: &BotId, shards: usize) {
    wait_for(
        "the sessions checkpointed",
        Duration::from_secs(30),
        || async {
            let c = h.store().cursor(unit).await.ok()??;
            let cp: botfleet_discord::Checkpoint = serde_json::from_str(&c.value).ok()?;
            (cp.sessions.len() == shards).then_some(())
        },
    )
    .await;
}

fn write(fake: &FakeDiscord, round: &str) -> Vec<String> {
    (0..8u64)
        .map(|c| {
            let t = format!("{round}-{c}");
            fake.state().user_writes(TOKEN, c, &t);
            t
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_bot_resumes_on_every_move() {
    let fake = FakeDiscord::start().await.unwrap();
    fake.state().add_bot(TOKEN, SHARDS, SHARDS);
    let mut spec = BotSpec::new(BotId::new("big").unwrap(), Platform::Discord, TOKEN);
    spec.options.api_url = Some(fake.url());
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let a = h.start("a");
    wait_for("all shards up", Duration::from_secs(30), || async {
        (fake.state().connected_shards(TOKEN) == SHARDS).then_some(())
    })
    .await;
    assert_eq!(fake.state().identifies(TOKEN), u64::from(SHARDS));
    let mut all = write(&fake, "cold");
    answered(&fake, &all).await;
    // The sessions are in the store (written at once when they start).
    checkpointed(&h, &spec.id, SHARDS as usize).await;
    all.extend(write(&fake, "before-drain"));
    answered(&fake, &all).await;

    // SIGTERM: b takes over and resumes.
    let b = h.start("b");
    a.shutdown().await;
    wait_for("resumed on b", Duration::from_secs(30), || async {
        (fake.state().resumes(TOKEN) >= u64::from(SHARDS)
            && fake.state().connected_shards(TOKEN) == SHARDS)
            .then_some(())
    })
    .await;
    assert_eq!(
        fake.state().replayed(TOKEN),
        0,
        "a SIGTERM writes the latest checkpoint: nothing to replay"
    );
    all.extend(write(&fake, "after-drain"));
    answered(&fake, &all).await;

    // Crash (kill -9): c takes over after the lease and resumes.
    let c = h.start("c");
    h.crash(b);
    wait_for("resumed on c", Duration::from_secs(30), || async {
        (fake.state().resumes(TOKEN) >= 2 * u64::from(SHARDS)
            && fake.state().connected_shards(TOKEN) == SHARDS)
            .then_some(())
    })
    .await;
    all.extend(write(&fake, "after-crash"));
    answered(&fake, &all).await;

    assert_eq!(
        fake.state().identifies(TOKEN),
        u64::from(SHARDS),
        "every move resumed"
    );
    assert_eq!(
        fake.state().max_sessions_per_shard(TOKEN),
        1,
        "a shard ran twice"
    );
    assert_eq!(fake.state().identify_violations(TOKEN), 0);
    assert_eq!(fake.state().dropped(TOKEN), 0);
    let mut seen: HashMap<String, usize> = HashMap::new();
    for p in fake.state().sent_by(TOKEN) {
        *seen.entry(p.content).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "answered twice: {twice:?}");
    assert!(c
        .metrics
        .render("c")
        .contains("botfleet_discord_resumes_total"));
    c.shutdown().await;
}

fn shards_running(m: &botfleet_runtime::Metrics, w: &str) -> u64 {
    m.render(w)
        .lines()
        .find(|l| l.starts_with("botfleet_shards_running{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// A bot of 8 shards in slices of 2 is 4 units: two workers share them, and when one dies
/// the other resumes its slices; IDENTIFYs stay at 8, no shard runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_of_one_bot_run_on_different_workers_and_resume_when_one_dies() {
    const T: &str = "DISCORD.slices.SECRET";
    let fake = FakeDiscord::start().await.unwrap();
    fake.state().add_bot(T, 8, 8);
    let mut spec = BotSpec::new(BotId::new("sliced").unwrap(), Platform::Discord, T);
    spec.options.api_url = Some(fake.url());
    spec.options.shards = Some(8);
    spec.options.shards_per_slice = Some(2);
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let a = h.start("a");
    let b = h.start("b");
    wait_for(
        "slices on both workers",
        Duration::from_secs(30),
        || async {
            let (x, y) = (
                shards_running(&a.metrics, "a"),
                shards_running(&b.metrics, "b"),
            );
            (fake.state().connected_shards(T) == 8 && x > 0 && y > 0 && x + y == 8).then_some(())
        },
    )
    .await;
    assert_eq!(fake.state().identifies(T), 8);
    let texts: Vec<String> = (0..8u64)
        .map(|c| {
            let t = format!("s-{c}");
            fake.state().user_writes(T, c, &t);
            t
        })
        .collect();
    wait_for("answered", Duration::from_secs(30), || async {
        let posts = fake.state().sent_by(T);
        texts
            .iter()
            .all(|t| posts.iter().any(|p| &p.content == t))
            .then_some(())
    })
    .await;
    // Every slice's sessions are in the store, then a dies.
    for k in 0..4 {
        checkpointed(&h, &spec.id.slice(k), 2).await;
    }
    h.crash(a);
    wait_for("b runs every slice", Duration::from_secs(30), || async {
        (shards_running(&b.metrics, "b") == 8 && fake.state().connected_shards(T) == 8)
            .then_some(())
    })
    .await;
    let after: Vec<String> = (0..8u64)
        .map(|c| {
            let t = format!("after-{c}");
            fake.state().user_writes(T, c, &t);
            t
        })
        .collect();
    wait_for("answered after", Duration::from_secs(30), || async {
        let posts = fake.state().sent_by(T);
        after
            .iter()
            .all(|t| posts.iter().any(|p| &p.content == t))
            .then_some(())
    })
    .await;
    assert_eq!(fake.state().identifies(T), 8, "the moved slices resumed");
    assert!(fake.state().resumes(T) >= 1);
    assert_eq!(fake.state().max_sessions_per_shard(T), 1);
    assert_eq!(fake.state().identify_violations(T), 0);
    // Every shard answered exactly once per message.
    let posts = fake.state().sent_by(T);
    for t in texts.iter().chain(&after) {
        assert_eq!(posts.iter().filter(|p| &p.content == t).count(), 1, "{t}");
    }
    b.shutdown().await;
}

/// A bot whose daily session budget is nearly spent does not identify, and says why where
/// operators look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_identify_budget_is_shown_not_burned() {
    const T: &str = "DISCORD.budget.SECRET";
    let fake = FakeDiscord::start().await.unwrap();
    fake.state().add_bot(T, 2, 2);
    fake.state().set_remaining(T, 4);
    let mut spec = BotSpec::new(BotId::new("thrifty").unwrap(), Platform::Discord, T);
    spec.options.api_url = Some(fake.url());
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let w = h.start("w");
    let why = wait_for(
        "the reason is recorded",
        Duration::from_secs(30),
        || async {
            h.store()
                .get_bot(&spec.id)
                .await
                .ok()
                .flatten()
                .and_then(|r| r.last_error)
                .filter(|e| e.contains("session budget"))
        },
    )
    .await;
    assert!(why.contains("waiting for it to reset"), "{why}");
    assert_eq!(fake.state().identifies(T), 0);
    wait_for("the budget in the metrics", Duration::from_secs(10), || async {
        w.metrics
            .render("w")
            .contains("botfleet_discord_identify_budget_remaining{worker_id=\"w\",platform=\"discord\"} 4")
            .then_some(())
    })
    .await;
    w.shutdown().await;
}

/// `--shards auto --shards-per-slice 2`: the bot is counted on Discord's recommendation (4)
/// and runs as slices of it on two workers; when Discord recommends 6, the bot restarts as a
/// whole — every old slice stopped before any shard of the new count identifies — and comes
/// back as 3 slices of 6. Messages before and after are answered once each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_sliced_bots_follow_the_recommended_count_as_a_whole() {
    const T: &str = "DISCORD.auto.SECRET";
    let fake = FakeDiscord::start().await.unwrap();
    fake.state().add_bot(T, 4, 16);
    let mut spec = BotSpec::new(BotId::new("auto").unwrap(), Platform::Discord, T);
    spec.options.api_url = Some(fake.url());
    spec.options.shards_per_slice = Some(2);
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let tune = |c: &mut botfleet_runtime::WorkerConfig| {
        c.shard_recount_every = Duration::from_millis(300);
    };
    let a = h.start_with("a", tune);
    let b = h.start_with("b", tune);
    let counted = |n: u32| {
        let (h, fake, id) = (&h, &fake, spec.id.clone());
        async move {
            wait_for(
                &format!("sliced on {n} shards, all up"),
                Duration::from_secs(60),
                || async {
                    let rec = h.store().get_bot(&id).await.ok()??;
                    let o = &rec.spec.options;
                    (o.shards_in_use == Some(n)
                        && o.shards_recommended == Some(n)
                        && fake.state().connected_shards(T) == n)
                        .then_some(rec)
                },
            )
            .await
        }
    };
    let rec = counted(4).await;
    assert_eq!(rec.into_units().len(), 2, "two slices of 2");
    let say = |texts: &[(u64, &str)]| {
        for (c, t) in texts {
            fake.state().user_writes(T, *c, t);
        }
    };
    let answered = |want: Vec<&'static str>| {
        let fake = &fake;
        async move {
            wait_for("answered", Duration::from_secs(30), || async {
                let got: Vec<String> = fake
                    .state()
                    .sent_by(T)
                    .into_iter()
                    .map(|p| p.content)
                    .collect();
                want.iter()
                    .all(|w| got.iter().any(|g| g == w))
                    .then_some(())
            })
            .await
        }
    };
    say(&[(0, "before-0"), (3, "before-3")]);
    answered(vec!["before-0", "before-3"]).await;

    // Discord recommends 6 now: slice 0's owner notices, the bot is counted again as a whole.
    fake.state().set_shards(T, 6);
    let rec = counted(6).await;
    assert_eq!(rec.into_units().len(), 3, "three slices of 2");
    say(&[(4, "after-4"), (5, "after-5"), (11, "after-11")]);
    answered(vec!["after-4", "after-5", "after-11"]).await;

    assert_eq!(
        fake.state().max_sessions_per_shard(T),
        1,
        "a shard had two sessions at once: old and new slices overlapped"
    );
    assert_eq!(fake.state().identify_violations(T), 0);
    let mut seen: HashMap<String, usize> = HashMap::new();
    for p in fake.state().sent_by(T) {
        *seen.entry(p.content).or_default() += 1;
    }
    assert!(seen.values().all(|n| *n == 1), "answered twice: {seen:?}");
    a.shutdown().await;
    b.shutdown().await;
}

/// The count is recorded only once no slice of the count in use is held anywhere: a slice
/// still held by a worker slow to let it go holds the new count (and every new slice) back
/// until it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_sliced_bot_is_not_counted_again_while_an_old_slice_is_held() {
    use botfleet_coord::{ClaimOutcome, Coordinator, WorkerMeta};
    use botfleet_core::{Fence, WorkerId};
    const T: &str = "DISCORD.drain.SECRET";
    let fake = FakeDiscord::start().await.unwrap();
    fake.state().add_bot(T, 4, 16);
    // As after a new recommendation: 4 in use, to be counted again.
    let mut spec = BotSpec::new(BotId::new("drain").unwrap(), Platform::Discord, T);
    spec.options.api_url = Some(fake.url());
    spec.options.shards_per_slice = Some(2);
    spec.options.shards_in_use = Some(4);
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    // Another process still holds slice 1 (it takes no units of its own: capacity 0).
    let slow = h.coordinator();
    slow.register(
        &WorkerId::new("slow").unwrap(),
        &WorkerMeta {
            host: "elsewhere".into(),
            capacity: 0,
            started_at_ms: 0,
            bots_held: 1,
            rss_bytes: 0,
        },
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let slice = BotId::new("drain#1").unwrap();
    let ClaimOutcome::Granted(fence) = slow.claim(&slice, Fence(0)).await.unwrap() else {
        panic!("the slice could not be claimed");
    };
    let a = h.start("a");
    // The counting unit runs on a (its claim is live) and waits.
    wait_for(
        "the counting unit claimed",
        Duration::from_secs(15),
        || async {
            let c = h.coordinator();
            c.owner(&spec.id)
                .await
                .ok()
                .flatten()
                .filter(|o| o.live && o.worker.as_str() == "a")
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rec = h.store().get_bot(&spec.id).await.unwrap().unwrap();
    assert_eq!(
        rec.spec.options.shards_recommended, None,
        "counted while an old slice is held"
    );
    assert_eq!(
        fake.state().connected_shards(T),
        0,
        "no shard runs meanwhile"
    );
    // Let go: the count is recorded and the slices run on it.
    assert!(slow.release(&slice, fence).await.unwrap());
    wait_for("counted and running", Duration::from_secs(30), || async {
        let rec = h.store().get_bot(&spec.id).await.ok()??;
        (rec.spec.options.shards_recommended == Some(4) && fake.state().connected_shards(T) == 4)
            .then_some(())
    })
    .await;
    assert_eq!(fake.state().max_sessions_per_shard(T), 1);
    a.shutdown().await;
}

/// A send from the backend to a channel of a bot in slices joins the turns of the slice whose
/// shard receives that channel (Discord routes by guild), wherever it is accepted: it waits
/// behind the reply in progress there and goes out after it, once, its status found through
/// either worker; a repeat of its key is known through the other worker; a chat Discord
/// cannot have is refused as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_to_a_bot_in_slices_joins_its_channels_slice() {
    const T: &str = "DISCORD.sends.SECRET";
    let fake = FakeDiscord::start().await.unwrap();
    fake.state().add_bot(T, 8, 8);
    let mut spec = BotSpec::new(BotId::new("sliced-sends").unwrap(), Platform::Discord, T);
    spec.options.api_url = Some(fake.url());
    spec.options.shards = Some(8);
    spec.options.shards_per_slice = Some(2);
    let server = botfleet_testkit::connector_suite::answer_slowly(&mut spec).await;
    let h = Harness::new(std::slice::from_ref(&spec)).await;
    let (a, b) = (h.start("a"), h.start("b"));
    wait_for("every shard connected", Duration::from_secs(30), || async {
        (fake.state().connected_shards(T) == 8).then_some(())
    })
    .await;
    // Channel 5 comes on shard 5, which slice 2 runs.
    let slice = spec.id.slice(2);
    fake.state().user_writes(T, 5, "slow-5");
    let store = h.store().clone();
    wait_for(
        "the message journaled on its slice",
        Duration::from_secs(10),
        || async {
            let p = store.inbox_pending(&slice, 10).await.ok()?;
            (!p.is_empty()).then_some(())
        },
    )
    .await;
    let body = serde_json::json!({ "text": "desk 5" }).to_string();
    let sent = a.sends.submit(&spec, "5", "desk-5", &body).await.unwrap();
    assert!(sent.new);
    assert_eq!(sent.unit, slice, "journaled on the channel's slice");
    let in_five = || -> Vec<String> {
        fake.state()
            .sent_by(T)
            .into_iter()
            .filter(|p| p.channel == "5")
            .map(|p| p.content)
            .collect()
    };
    wait_for("both out", Duration::from_secs(20), || async {
        (in_five().len() >= 2).then_some(())
    })
    .await;
    assert_eq!(
        in_five(),
        ["slow-5", "desk 5"],
        "after the reply in progress"
    );
    let status = wait_for("the send's status", Duration::from_secs(10), || async {
        let st = b.sends.status(&spec, sent.id()).await.ok()??;
        (st.status != "queued").then_some(st)
    })
    .await;
    assert_eq!(status.status, "sent", "{status:?}");
    let again = b.sends.submit(&spec, "5", "desk-5", &body).await.unwrap();
    assert!(!again.new && again.unit == slice, "{again:?}");
    let refused = a.sends.submit(&spec, "no-channel", "desk-x", &body).await;
    assert!(
        matches!(refused, Err(botfleet_runtime::SendError::UnknownChat(_))),
        "{refused:?}"
    );
    assert_eq!(in_five().len(), 2, "nothing sent twice");
    a.shutdown().await;
    b.shutdown().await;
    server.abort();
}
