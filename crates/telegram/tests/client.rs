//! The client against the testkit's fake Bot API, which speaks the real JSON.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use botfleet_core::{BotId, Secret};
use botfleet_telegram::{
    parse_update, BotApi, TelegramClient, TelegramConfig, TelegramError, Update,
};
use botfleet_testkit::{free_port, wait_for, FakeTelegram, Fault};

const TOKEN: &str = "1234:secret-token-part";

fn api(url: &str, token: &str) -> BotApi {
    BotApi::new(Some(url), &Secret::new(token)).unwrap()
}

fn client(poll: Duration) -> TelegramClient {
    TelegramClient::new(TelegramConfig {
        poll_timeout: poll,
        request_slack: Duration::from_secs(5),
        ..TelegramConfig::default()
    })
    .unwrap()
}

#[tokio::test]
async fn get_me_checks_the_token_without_leaking_it() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let c = client(Duration::from_secs(1));
    let me = c.get_me(&api(&fake.url(), TOKEN)).await.unwrap();
    assert_eq!(me.id, 1234);
    let e = c
        .get_me(&api(&fake.url(), "999:wrong-secret"))
        .await
        .unwrap_err();
    assert!(matches!(e, TelegramError::Unauthorized(_)), "{e:?}");
    assert!(!e.is_transient());
    let shown = format!("{e} {e:?} {:?}", api(&fake.url(), "999:wrong-secret"));
    assert!(!shown.contains("wrong-secret"), "{shown}");
}

#[tokio::test]
async fn long_polls_wake_on_a_message_and_offsets_confirm() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let c = client(Duration::from_secs(10));
    let token = api(&fake.url(), TOKEN);
    let state = fake.state().clone();
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        state.user_writes(TOKEN, 77, "hello")
    });
    let started = tokio::time::Instant::now();
    let got = c.get_updates(&token, 0).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woke on the message"
    );
    let id = writer.await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].update_id, Some(id));
    match parse_update(&BotId::new("b").unwrap(), &got[0]) {
        Update::Message(m) => assert_eq!((m.chat.chat.as_str(), m.text.as_str()), ("77", "hello")),
        other => panic!("{other:?}"),
    }
    // Not confirmed yet: asked again from the same offset, it comes again.
    assert_eq!(c.get_updates(&token, 0).await.unwrap().len(), 1);
    // Confirmed by the next offset: gone (the short poll returns empty after its timeout).
    let quick = client(Duration::ZERO);
    assert!(quick.get_updates(&token, id + 1).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_second_poller_ends_the_first_with_409_and_a_dropped_poll_frees_the_token() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let c = client(Duration::from_secs(20));
    let token = api(&fake.url(), TOKEN);
    let first = {
        let (c, token) = (c.clone(), token.clone());
        tokio::spawn(async move { c.get_updates(&token, 0).await })
    };
    wait_for("first poll in flight", Duration::from_secs(5), || async {
        fake.state().is_polling(TOKEN).then_some(())
    })
    .await;
    // As the real server: the newer poll wins, the older one is ended with 409.
    let second = {
        let (c, token) = (c.clone(), token.clone());
        tokio::spawn(async move { c.get_updates(&token, 0).await })
    };
    let e = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the older poll ends at once")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(e, TelegramError::Conflict(ref d) if d.contains("terminated by other")),
        "{e:?}"
    );
    assert_eq!(fake.state().conflicts(), 1);
    assert!(fake.state().is_polling(TOKEN), "the newer poll goes on");
    // Abandoning the in-flight poll (what a worker does when it stops a bot) frees the token
    // at once, not after the 20 s poll timeout.
    second.abort();
    wait_for("token freed", Duration::from_secs(5), || async {
        (!fake.state().is_polling(TOKEN)).then_some(())
    })
    .await;
    assert!(client(Duration::ZERO).get_updates(&token, 0).await.is_ok());
    assert_eq!(fake.state().conflicts(), 1);
}

/// As the real server: at most one "terminated by other getUpdates request" per 3 s per bot;
/// a poll ended sooner after the last one waits for its 409.
#[tokio::test]
async fn older_polls_are_ended_at_most_once_per_three_seconds() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let c = client(Duration::from_secs(20));
    let token = api(&fake.url(), TOKEN);
    let mut ended = Vec::new();
    let mut polls = Vec::new();
    for k in 0..3u64 {
        let (c, token) = (c.clone(), token.clone());
        polls.push(tokio::spawn(async move {
            let r = c.get_updates(&token, 0).await;
            (r, tokio::time::Instant::now())
        }));
        wait_for("poll accepted", Duration::from_secs(5), || async {
            (fake.state().polls(TOKEN) > k).then_some(())
        })
        .await;
    }
    // The first two were ended by the next; the third is the poll.
    for p in polls.drain(..2) {
        let (r, at) = p.await.unwrap();
        assert!(matches!(r, Err(TelegramError::Conflict(_))), "{r:?}");
        ended.push(at);
    }
    let gap = ended[1] - ended[0];
    assert!(gap >= Duration::from_millis(2_900), "409s {gap:?} apart");
    assert!(fake.state().is_polling(TOKEN));
    polls.pop().unwrap().abort();
}

#[tokio::test]
async fn faults_are_classified() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let c = client(Duration::ZERO);
    let token = api(&fake.url(), TOKEN);
    fake.state().inject(TOKEN, Fault::TooManyRequests(7));
    fake.state().inject(TOKEN, Fault::ServerError);
    fake.state().inject(TOKEN, Fault::Garbage);
    let e = c.get_updates(&token, 0).await.unwrap_err();
    assert!(
        matches!(e, TelegramError::RateLimited(d) if d == Duration::from_secs(7)),
        "{e:?}"
    );
    let e = c.get_updates(&token, 0).await.unwrap_err();
    assert!(
        matches!(e, TelegramError::Server { status: 500, .. }),
        "{e:?}"
    );
    let e = c.get_updates(&token, 0).await.unwrap_err();
    assert!(matches!(e, TelegramError::Malformed(_)), "{e:?}");
    assert!(c.get_updates(&token, 0).await.is_ok());
    fake.state().revoke(TOKEN);
    let e = c.get_updates(&token, 0).await.unwrap_err();
    assert!(matches!(e, TelegramError::Unauthorized(_)), "{e:?}");
}

#[tokio::test]
async fn messages_are_sent_and_recorded() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let c = client(Duration::ZERO);
    c.send_message(&api(&fake.url(), TOKEN), "77", "hi there", None)
        .await
        .unwrap();
    let sent = fake.state().sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].chat_id.as_str(), sent[0].text.as_str()),
        ("77", "hi there")
    );
    let e = c
        .send_message(&api(&fake.url(), TOKEN), "77", "", None)
        .await
        .unwrap_err();
    assert!(
        matches!(e, TelegramError::Refused { status: 400, .. }),
        "{e:?}"
    );
}

#[tokio::test]
async fn network_errors_never_show_the_token() {
    let port = free_port().unwrap();
    let c = client(Duration::ZERO);
    let e = c
        .get_me(&api(&format!("http://127.0.0.1:{port}"), TOKEN))
        .await
        .unwrap_err();
    assert!(
        matches!(e, TelegramError::Network(_)) && e.is_transient(),
        "{e:?}"
    );
    let mut chain = format!("{e} {e:?}");
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        chain.push_str(&format!(" {s} {s:?}"));
        src = s.source();
    }
    assert!(!chain.contains("secret-token-part"), "{chain}");
}

#[tokio::test]
async fn a_webhook_blocks_polling_until_deleted() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    fake.state()
        .set_webhook(TOKEN, "https://example.invalid/hook");
    let c = client(Duration::ZERO);
    let token = api(&fake.url(), TOKEN);
    let e = c.get_updates(&token, 0).await.unwrap_err();
    assert!(
        matches!(e, TelegramError::Conflict(ref d) if d.contains("webhook")),
        "{e:?}"
    );
    c.delete_webhook(&token).await.unwrap();
    assert!(c.get_updates(&token, 0).await.is_ok());
}

#[tokio::test]
async fn a_deferred_press_is_answered_empty_and_its_late_answer_is_a_message() {
    use botfleet_core::{Act, ChatKey, EventKind, Inbound, Platform};
    let fake = FakeTelegram::start().await.unwrap();
    let tg = fake.state();
    tg.add_bot(TOKEN);
    let c = client(Duration::from_secs(1));
    let api = api(&fake.url(), TOKEN);
    let sent = botfleet_telegram::act(
        &c,
        &api,
        "77",
        &Act::Send {
            text: "menu",
            buttons: &[vec![botfleet_core::Button {
                text: "A".into(),
                value: Some("a".into()),
                url: None,
            }]],
            thread_of: None,
            files: &[],
        },
    )
    .await
    .unwrap()
    .unwrap();
    let (_, query) = tg
        .user_presses(TOKEN, 77, sent.parse().unwrap(), "a")
        .unwrap();
    let mut ev = Inbound::message(
        Platform::Telegram,
        ChatKey::new(BotId::new("b").unwrap(), "77"),
        "9",
        None,
        "",
        None,
    );
    ev.kind = EventKind::Action;
    ev.answer_handle = Some(query.clone().into());
    botfleet_telegram::act(&c, &api, "77", &Act::Defer { event: &ev })
        .await
        .unwrap();
    let answer = tg.press(&query).unwrap().answer.unwrap().0;
    assert!(answer.get("text").is_none(), "answered empty: {answer}");
    // Again (a replay after a crash): Telegram refuses the query, which is fine.
    botfleet_telegram::act(&c, &api, "77", &Act::Defer { event: &ev })
        .await
        .unwrap();
    let late = Act::Answer {
        event: &ev,
        text: Some("thanks, noted"),
        alert: false,
        ephemeral: false,
        deferred: true,
        answered: false,
        buttons: &[],
        files: &[],
    };
    let id = botfleet_telegram::act(&c, &api, "77", &late).await.unwrap();
    assert!(id.is_some(), "the late answer is a message");
    assert!(tg.sent().iter().any(|s| s.text == "thanks, noted"));
}

/// `sendMessageDraft` as the fake checks it: drafts in a private chat are shown in order;
/// in a group, or with a zero `draft_id`, they are refused (not retried).
#[tokio::test]
async fn drafts_stream_into_private_chats_only() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let c = client(Duration::from_secs(1));
    let bot = api(&fake.url(), TOKEN);
    for text in ["", "Hel", "Hello, wor", "Hello, world"] {
        c.send_message_draft(&bot, "42", 7, text).await.unwrap();
    }
    let drafts: Vec<(String, i64, String)> = fake
        .state()
        .drafts(TOKEN)
        .into_iter()
        .map(|d| (d.chat_id, d.draft_id, d.text))
        .collect();
    assert_eq!(drafts.len(), 4);
    assert_eq!(drafts[3], ("42".to_owned(), 7, "Hello, world".to_owned()));
    for (chat, id) in [("-100123", 7), ("42", 0)] {
        let e = c.send_message_draft(&bot, chat, id, "x").await.unwrap_err();
        assert!(matches!(e, TelegramError::Refused { .. }), "{e:?}");
        assert!(!e.is_transient(), "{e:?}");
    }
    assert_eq!(
        fake.state().drafts(TOKEN).len(),
        4,
        "nothing refused was shown"
    );
}
