//! The Discord connector against the fake gateway: identify, dispatches, the checkpoint,
//! RESUME after a hand-over, op 7, op 9, zombie connections, close codes, the identify pace,
//! sends.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{sync::Arc, time::Duration};

use botfleet_core::{BotId, BotSpec, Outbound, Platform};
use botfleet_discord::{
    fake::{FakeDiscord, SendFault},
    Checkpoint, DiscordConfig, DiscordConnector, LocalGate,
};
use botfleet_platform::{Batch, Connection, Connector, ErrorKind};

fn spec(fake: &FakeDiscord, token: &str) -> BotSpec {
    let mut s = BotSpec::new(BotId::new("dbot").unwrap(), Platform::Discord, token);
    s.options.api_url = Some(fake.url());
    s
}

fn connector() -> DiscordConnector {
    let config = DiscordConfig {
        checkpoint_every: Duration::from_millis(0),
        ..DiscordConfig::default()
    };
    DiscordConnector::new(config, Arc::new(LocalGate::default())).unwrap()
}

/// Batches until `n` messages came (at most 20 s); every checkpoint answered on the way.
async fn read(conn: &mut Connection, n: usize) -> (Vec<String>, Option<String>) {
    let mut texts = Vec::new();
    let mut cp = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while texts.len() < n {
        let b: Batch = tokio::time::timeout_at(deadline, conn.receiver.next())
            .await
            .expect("messages within 20 s")
            .unwrap();
        texts.extend(b.messages.iter().map(|m| m.message.text.clone()));
        if let Some(c) = conn.receiver.ack(b.ack).await.unwrap() {
            cp = Some(c);
        }
    }
    (texts, cp)
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn shards_identify_receive_and_resume_elsewhere_without_identifying_again() {
    let fake = FakeDiscord::start().await.unwrap();
    let token = "T.ONE.secret";
    fake.state().add_bot(token, 2, 2);
    let c = connector();
    let s = spec(&fake, token);
    assert_eq!(c.verify(&s).await.unwrap().name.as_deref(), Some("fakebot"));
    let mut conn = c.connect(&s, None).await.unwrap();
    until("both shards connected", || {
        fake.state().connected_shards(token) == 2
    })
    .await;
    assert_eq!(fake.state().identifies(token), 2);
    // Channel 10 is on shard 0, 11 on shard 1.
    fake.state().user_writes(token, 10, "a");
    fake.state().user_writes(token, 11, "b");
    let (texts, cp) = read(&mut conn, 2).await;
    assert_eq!(texts.len(), 2);
    let cp: Checkpoint = serde_json::from_str(&cp.expect("a checkpoint")).unwrap();
    assert_eq!((cp.shards, cp.sessions.len()), (2, 2));
    // Hand-over: close (resumable), write while nobody is connected, resume from the
    // checkpoint: the missed messages come, no new IDENTIFY.
    let cp_text = serde_json::to_string(&cp).unwrap();
    conn.receiver.close().await;
    until("closed", || fake.state().connected_shards(token) == 0).await;
    fake.state().user_writes(token, 10, "while away");
    let mut again = c.connect(&s, Some(&cp_text)).await.unwrap();
    let (texts, _) = read(&mut again, 1).await;
    assert!(texts.contains(&"while away".to_owned()), "{texts:?}");
    assert_eq!(fake.state().identifies(token), 2, "a move resumes");
    assert_eq!(fake.state().resumes(token), 2);
    assert_eq!(c.resumes(), 2);
    assert_eq!(fake.state().max_sessions_per_shard(token), 1);
    assert_eq!(fake.state().identify_violations(token), 0);
    again.receiver.close().await;
}

#[tokio::test]
async fn reconnect_invalid_session_and_zombies_are_survived() {
    let fake = FakeDiscord::start().await.unwrap();
    fake.state().set_heartbeat(Duration::from_millis(150));
    let token = "T.TWO.secret";
    fake.state().add_bot(token, 1, 1);
    let c = connector();
    let mut conn = c.connect(&spec(&fake, token), None).await.unwrap();
    until("connected", || fake.state().connected_shards(token) == 1).await;
    // op 7: resume.
    fake.state().reconnect(token, 0);
    until("resumed after op 7", || fake.state().resumes(token) == 1).await;
    fake.state().user_writes(token, 0, "after op 7");
    assert_eq!(read(&mut conn, 1).await.0, ["after op 7"]);
    // A zombie (heartbeats not acknowledged): reconnect and resume.
    fake.state().zombie(token, 0, true);
    until("resumed after the zombie", || {
        fake.state().resumes(token) >= 2
    })
    .await;
    fake.state().zombie(token, 0, false);
    // op 9, not resumable: identify again (after Discord's 1-5 s).
    fake.state().invalidate(token, 0, false);
    until("identified again", || fake.state().identifies(token) == 2).await;
    until("connected", || fake.state().connected_shards(token) == 1).await;
    fake.state().user_writes(token, 0, "after op 9");
    assert_eq!(read(&mut conn, 1).await.0, ["after op 9"]);
    assert_eq!(fake.state().max_sessions_per_shard(token), 1);
    conn.receiver.close().await;
}

#[tokio::test]
async fn refusing_close_codes_fail_the_bot_and_resumable_ones_do_not() {
    let fake = FakeDiscord::start().await.unwrap();
    let token = "T.THREE.secret";
    fake.state().add_bot(token, 1, 1);
    let c = connector();
    let mut conn = c.connect(&spec(&fake, token), None).await.unwrap();
    until("connected", || fake.state().connected_shards(token) == 1).await;
    fake.state().close(token, 0, 4000);
    until("resumed after 4000", || fake.state().resumes(token) == 1).await;
    fake.state().close(token, 0, 4014);
    let e = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            // Sessions (READY, RESUMED) come as empty batches.
            if let Err(e) = conn.receiver.next().await {
                return e;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(e.kind(), ErrorKind::Credentials);
    assert!(
        e.to_string().contains("4014") && e.to_string().contains("intents"),
        "{e}"
    );
    assert!(!e.to_string().contains(token));
    // A revoked token: REST 401 and gateway 4004, both credentials.
    fake.state().revoke(token);
    let e = c.connect(&spec(&fake, token), None).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Credentials);
    assert!(!format!("{e:?}").contains(token));
}

#[tokio::test]
async fn identifies_of_one_bucket_keep_five_seconds_apart() {
    let fake = FakeDiscord::start().await.unwrap();
    let token = "T.FOUR.secret";
    // Two shards, one bucket: the second IDENTIFY must wait 5 s.
    fake.state().add_bot(token, 2, 1);
    let c = connector();
    let t = std::time::Instant::now();
    let mut conn = c.connect(&spec(&fake, token), None).await.unwrap();
    until("both shards connected", || {
        fake.state().connected_shards(token) == 2
    })
    .await;
    assert!(t.elapsed() >= Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(fake.state().identify_violations(token), 0);
    conn.receiver.close().await;
}

#[tokio::test]
async fn a_nearly_spent_identify_budget_stops_identifying() {
    let fake = FakeDiscord::start().await.unwrap();
    let token = "T.FIVE.secret";
    fake.state().add_bot(token, 1, 1);
    fake.state().set_remaining(token, 3);
    let e = connector()
        .connect(&spec(&fake, token), None)
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::RateLimited(_)), "{e}");
    assert_eq!(e.reason(), "identify_budget");
    assert_eq!(fake.state().identifies(token), 0);
}

#[tokio::test]
async fn sends_reply_in_the_channel_once_and_honour_rate_limits() {
    let fake = FakeDiscord::start().await.unwrap();
    let token = "T.SIX.secret";
    fake.state().add_bot(token, 1, 1);
    let c = connector();
    let s = spec(&fake, token);
    let mut conn = c.connect(&s, None).await.unwrap();
    until("connected", || fake.state().connected_shards(token) == 1).await;
    fake.state().user_writes(token, 77, "ping");
    let b = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let b = conn.receiver.next().await.unwrap();
            if !b.messages.is_empty() {
                return b;
            }
        }
    })
    .await
    .unwrap();
    let msg = &b.messages[0].message;
    let out = Outbound::reply_to(msg, "pong");
    conn.sender.send(&out).await.unwrap();
    // The same reply again (a retry after a lost answer) is dropped by its nonce.
    conn.sender.send(&out).await.unwrap();
    let posts = fake.state().sent_by(token);
    assert_eq!(posts.len(), 1);
    assert_eq!(
        (posts[0].channel.as_str(), posts[0].content.as_str()),
        ("77", "pong")
    );
    assert_eq!(posts[0].reply_to.as_deref(), Some(msg.message_id.as_str()));
    assert_eq!(fake.state().duplicate_sends(token), 1);
    // A route's 429 names its major parameter's scope, the channel (never the bot's global
    // bucket: an edit's 429 holds no other call); the bot's global limit says so (the fleet
    // pauses the bot's global bucket).
    for (fault, kind, scope) in [
        (
            SendFault::TooManyRequests(1.5),
            ErrorKind::RateLimited(Duration::from_millis(1500)),
            Some("channel"),
        ),
        (
            SendFault::GlobalTooManyRequests(2.0),
            ErrorKind::RateLimited(Duration::from_secs(2)),
            Some("global"),
        ),
        (SendFault::ServerError, ErrorKind::Transient, None),
    ] {
        fake.state().inject_send(token, fault);
        let e = conn
            .sender
            .send(&Outbound::reply_to(msg, "again"))
            .await
            .unwrap_err();
        assert_eq!((e.kind(), e.scope()), (kind, scope));
    }
    conn.receiver.close().await;
}

/// The fake's count of live sessions per shard sees two hosts running one shard (what the
/// fleet tests assert never happens).
#[tokio::test]
async fn two_hosts_identifying_one_shard_are_seen() {
    let fake = FakeDiscord::start().await.unwrap();
    let token = "T.SEVEN.secret";
    fake.state().add_bot(token, 1, 1);
    let s = spec(&fake, token);
    let mut one = connector().connect(&s, None).await.unwrap();
    until("first connected", || {
        fake.state().connected_shards(token) == 1
    })
    .await;
    let mut two = connector().connect(&s, None).await.unwrap();
    until("second session", || {
        fake.state().max_sessions_per_shard(token) == 2
    })
    .await;
    one.receiver.close().await;
    two.receiver.close().await;
}

/// A shard whose worker may no longer act (lease gone, bot stopping) does not reconnect:
/// it never takes the session back from a successor.
#[tokio::test]
async fn a_shard_that_may_not_act_does_not_come_back() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let fake = FakeDiscord::start().await.unwrap();
    let token = "T.EIGHT.secret";
    fake.state().add_bot(token, 1, 1);
    let ok = Arc::new(AtomicBool::new(true));
    let guard = ok.clone();
    let mut conn = connector()
        .connect_guarded(
            &spec(&fake, token),
            None,
            Arc::new(move || guard.load(Ordering::SeqCst)),
        )
        .await
        .unwrap();
    until("connected", || fake.state().connected_shards(token) == 1).await;
    ok.store(false, Ordering::SeqCst);
    fake.state().close(token, 0, 4000);
    until("disconnected", || fake.state().connected_shards(token) == 0).await;
    // Well past the reconnect backoff (1-2 s): still gone, no RESUME sent.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(fake.state().connected_shards(token), 0);
    assert_eq!(fake.state().resumes(token), 0);
    conn.receiver.close().await;
}

/// What a bot sends counts against Discord's limits as documented: a message against its
/// channel's bucket and the bot's global one, an edit or typing against the global one, an
/// interaction's answer against none (the runtime takes the tokens fleet-wide).
#[tokio::test]
async fn sends_declare_the_global_and_channel_buckets() {
    use botfleet_core::Act;
    use botfleet_platform::Call;
    let fake = FakeDiscord::start().await.unwrap();
    let token = "T.NINE.secret";
    fake.state().add_bot(token, 1, 1);
    let c =
        DiscordConnector::new(DiscordConfig::default(), Arc::new(LocalGate::default())).unwrap();
    let mut conn = c.connect(&spec(&fake, token), None).await.unwrap();
    let chat = botfleet_core::ChatKey::new(BotId::new("dbot").unwrap(), "5");
    let send = Act::Send {
        text: "a",
        buttons: &[],
        thread_of: None,
        files: &[],
    };
    let scopes = |act: &Act<'_>| -> Vec<(&'static str, String)> {
        conn.sender
            .buckets(&chat, Call::Act(act))
            .into_iter()
            .map(|b| (b.scope, b.of))
            .collect()
    };
    assert_eq!(
        scopes(&send),
        [("channel", "5".to_owned()), ("global", String::new())]
    );
    assert_eq!(scopes(&Act::Typing), [("global", String::new())]);
    let msg =
        botfleet_core::Inbound::message(Platform::Discord, chat.clone(), "1", None, "x", None);
    assert!(scopes(&Act::Defer { event: &msg }).is_empty());
    let b = conn.sender.buckets(&chat, Call::Act(&send));
    assert_eq!(b[0].limit, botfleet_discord::limits::CHANNEL);
    assert_eq!(b[1].limit.burst, 50);
    conn.receiver.close().await;
}
