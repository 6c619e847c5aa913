//! Answers that come later from a handler in Rust: `TurnContext::answer_later` holds the
//! chat's turn, and the `LaterReply` handle, moved into a task that outlives `handle`, posts
//! the answer in parts.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{collections::HashMap, sync::Arc, time::Duration};

use async_trait::async_trait;
use botfleet_core::{BotId, BotSpec, HandlerSpec, Inbound, Platform};
use botfleet_runtime::{BotHandler, HandlerError, TurnContext};
use botfleet_testkit::{
    connector_suite::{Harness, RunningWorker},
    wait_for, FakeTelegram, ScriptedHandler,
};

const TOKEN: &str = "5200:later-SECRET";

/// "ask": answered later, in two parts, by a task (what the task's posts were answered goes
/// to `posts`); anything else: the text and the state.
struct Agent {
    posts: Arc<std::sync::Mutex<Vec<String>>>,
}

#[async_trait]
impl BotHandler for Agent {
    async fn handle(&self, event: &Inbound, cx: &mut TurnContext) -> Result<(), HandlerError> {
        if event.text != "ask" {
            let state = cx.state().map(|s| s.to_string()).unwrap_or_default();
            cx.reply(format!("{} {state}", event.text));
            return Ok(());
        }
        let later = cx.later().expect("a worker's turn has a later handle");
        assert!(later.token().starts_with("r1."));
        assert!(
            !format!("{later:?}").contains("r1."),
            "the token stays out of Debug"
        );
        cx.answer_later();
        let posts = self.posts.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let one = serde_json::json!({"actions": [{"type": "send", "text": "part one"}],
                "final": false});
            let two = serde_json::json!({"actions": [{"type": "send", "text": "part two"}],
                "state": {"k": 1}, "final": true});
            for (key, part) in [("p1", &one), ("p2", &two), ("p2", &two), ("p3", &one)] {
                let answer = match later.post(key, part).await {
                    Ok(p) => format!("{key}: {} repeated {}", p.seq, p.repeated),
                    Err(e) => format!("{key}: {e}"),
                };
                posts.lock().unwrap().push(answer);
            }
        });
        Ok(())
    }
}

/// A Telegram bot `id` of `token` on a new fake, answered by `handler`, in a new registry;
/// worker "a" (with `tune` applied to its configuration) runs it, polling.
async fn running(
    id: &str,
    token: &str,
    handler: HandlerSpec,
    tune: impl FnOnce(&mut botfleet_runtime::WorkerConfig),
) -> (FakeTelegram, Harness, RunningWorker) {
    running_as(id, token, handler, |_| {}, tune).await
}

/// [`running`], with `spec` applied to the bot's spec.
async fn running_as(
    id: &str,
    token: &str,
    handler: HandlerSpec,
    spec: impl FnOnce(&mut BotSpec),
    tune: impl FnOnce(&mut botfleet_runtime::WorkerConfig),
) -> (FakeTelegram, Harness, RunningWorker) {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(token);
    let mut bot = BotSpec::new(BotId::new(id).unwrap(), Platform::Telegram, token);
    bot.options.api_url = Some(fake.url());
    bot.handler = handler;
    spec(&mut bot);
    let h = Harness::new(std::slice::from_ref(&bot)).await;
    let w = h.start_with("a", tune);
    let tg = fake.state();
    wait_for("polling", Duration::from_secs(20), || async {
        tg.is_polling(token).then_some(())
    })
    .await;
    (fake, h, w)
}

/// In `chat` of `token`'s bot, "ask" then "next": waits until "next" is answered.
async fn ask_then_next(tg: &botfleet_testkit::FakeState, token: &str, chat: i64) {
    tg.user_writes(token, chat, "ask");
    tg.user_writes(token, chat, "next");
    wait_for(
        "the next message answered",
        Duration::from_secs(20),
        || async {
            tg.sent()
                .iter()
                .any(|s| s.text.starts_with("next"))
                .then_some(())
        },
    )
    .await;
}

/// The last part, "done", posted through the API at `api_url`: "done" then the waiting "next"
/// are sent, and the handler was asked "ask" once (not again by a worker that took the turn).
async fn done_then_next(
    tg: &botfleet_testkit::FakeState,
    handler: &ScriptedHandler,
    api_url: &str,
    token: &str,
) {
    let last = serde_json::json!({"actions": [{"type": "send", "text": "done"}], "final": true});
    let (status, answer) =
        botfleet_testkit::connector_suite::post_part(api_url, token, "k", &last).await;
    assert_eq!(status, 202, "{answer}");
    wait_for(
        "the next message answered",
        Duration::from_secs(20),
        || async { tg.sent().iter().any(|m| m.text == "next").then_some(()) },
    )
    .await;
    let texts: Vec<String> = tg.sent().into_iter().map(|s| s.text).collect();
    assert_eq!(texts, ["done", "next"], "{texts:?}");
    let asked = handler.seen().iter().filter(|e| e["text"] == "ask").count();
    assert_eq!(asked, 1, "the handler was asked again after the hand-over");
}

fn webhook(handler: &ScriptedHandler) -> HandlerSpec {
    HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_handler_answers_later_in_parts() {
    let posts: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let agent = Arc::new(Agent {
        posts: posts.clone(),
    });
    let (fake, _h, w) = running("agent", TOKEN, HandlerSpec::Named("agent".into()), |c| {
        let handlers: HashMap<String, Arc<dyn BotHandler>> =
            HashMap::from([("agent".to_owned(), agent as Arc<dyn BotHandler>)]);
        c.handlers = Arc::new(handlers);
    })
    .await;
    let tg = fake.state();
    ask_then_next(tg, TOKEN, 9).await;
    let texts: Vec<String> = tg.sent().into_iter().map(|s| s.text).collect();
    assert_eq!(
        texts,
        ["part one", "part two", r#"next {"k":1}"#],
        "{texts:?}"
    );
    let posts = wait_for("every post answered", Duration::from_secs(10), || async {
        let p = posts.lock().unwrap().clone();
        (p.len() == 4).then_some(p)
    })
    .await;
    assert_eq!(
        posts,
        [
            "p1: 1 repeated false",
            "p2: 2 repeated false",
            "p2: 2 repeated true",
            "p3: the turn already ended or expired",
        ],
        "{posts:?}"
    );
    w.shutdown().await;
}

/// Held turns are not messages in flight: a bot whose every allowed in-flight message is
/// held open still receives, and its other chats are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_turns_keep_no_bot_from_receiving() {
    const T: &str = "5201:held-SECRET";
    let handler = botfleet_testkit::connector_suite::later_handler().await;
    let (fake, _h, w) = running("busy", T, webhook(&handler), |c| c.max_in_flight = 2).await;
    let tg = fake.state();
    for chat in 1..=3 {
        tg.user_writes(T, chat, "ask");
    }
    wait_for("three turns held", Duration::from_secs(20), || async {
        (w.metrics.turns_held_now() == 3).then_some(())
    })
    .await;
    tg.user_writes(T, 4, "hello");
    wait_for("another chat answered", Duration::from_secs(20), || async {
        tg.sent().iter().any(|m| m.text == "hello").then_some(())
    })
    .await;
    w.shutdown().await;
}

/// Holds every turn open and keeps its handle.
struct Holder {
    handles: Handles,
}

#[async_trait]
impl BotHandler for Holder {
    async fn handle(&self, _event: &Inbound, cx: &mut TurnContext) -> Result<(), HandlerError> {
        let later = cx.later().expect("a worker's turn has a later handle");
        self.handles.lock().unwrap().push(later);
        cx.answer_later();
        Ok(())
    }
}

/// Handles of the turns [`Holder`] held.
type Handles = Arc<std::sync::Mutex<Vec<botfleet_runtime::LaterReply>>>;

/// [`running`] a bot `id` answered by a [`Holder`] (its handles), with no typing: its calls
/// to the fake would open connections (tasks) as they please.
async fn running_holder(id: &str, token: &str) -> (FakeTelegram, Harness, RunningWorker, Handles) {
    let handles: Handles = Arc::default();
    let holder = Arc::new(Holder {
        handles: handles.clone(),
    });
    let no_typing = |b: &mut BotSpec| b.options.typing = Some(false);
    let (fake, h, w) = running_as(
        id,
        token,
        HandlerSpec::Named("holder".into()),
        no_typing,
        |c| {
            let handlers: HashMap<String, Arc<dyn BotHandler>> =
                HashMap::from([("holder".to_owned(), holder as Arc<dyn BotHandler>)]);
            c.handlers = Arc::new(handlers);
        },
    )
    .await;
    (fake, h, w, handles)
}

/// A polling bot's held turns are kept as data, not as a task each: 100 chats held open add
/// next to no task to the runtime (each kept a task of its own before), and each is still
/// finished by its last part, posted through its handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_turns_keep_no_task_each() {
    const T: &str = "5206:tasks-SECRET";
    const CHATS: i64 = 100;
    let (fake, _h, w, handles) = running_holder("holder", T).await;
    let tg = fake.state();
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let before = tasks();
    for chat in 1..=CHATS {
        tg.user_writes(T, chat, "ask");
    }
    wait_for("every turn held", Duration::from_secs(60), || async {
        (w.metrics.turns_held_now() == CHATS as u64).then_some(())
    })
    .await;
    let held = tasks();
    assert!(
        held < before + 20,
        "{CHATS} held turns took {} tasks ({before} before)",
        held.saturating_sub(before)
    );
    let handles = std::mem::take(&mut *handles.lock().unwrap());
    assert_eq!(handles.len(), CHATS as usize);
    let last = serde_json::json!({"actions": [{"type": "send", "text": "done"}], "final": true});
    for h in &handles {
        h.post("last", &last).await.unwrap();
    }
    wait_for(
        "every held turn finished",
        Duration::from_secs(60),
        || async {
            let done = tg.sent().iter().filter(|m| m.text == "done").count();
            (done == CHATS as usize && w.metrics.turns_held_now() == 0).then_some(())
        },
    )
    .await;
    w.shutdown().await;
}

/// A polling bot whose receiving has to wait (a 429 on `getUpdates`: 30 s) still finishes
/// its held turns meanwhile: its chat queues make progress while the bot's task waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_turns_go_on_while_receiving_waits() {
    const T: &str = "5207:waits-SECRET";
    let (fake, _h, w, handles) = running_holder("waits", T).await;
    let tg = fake.state();
    // The poll in flight delivers "ask"; the next one is refused for 30 s.
    tg.inject(T, botfleet_testkit::Fault::TooManyRequests(30));
    tg.user_writes(T, 1, "ask");
    wait_for(
        "the turn held and the next poll refused",
        Duration::from_secs(20),
        || async {
            let refused =
                w.metrics.render("w").lines().any(|l| {
                    l.starts_with("botfleet_platform_errors_total{") && !l.ends_with(" 0")
                });
            (refused && w.metrics.turns_held_now() == 1).then_some(())
        },
    )
    .await;
    let handle = handles.lock().unwrap().pop().unwrap();
    let last = serde_json::json!({"actions": [{"type": "send", "text": "done"}], "final": true});
    handle.post("last", &last).await.unwrap();
    wait_for(
        "the part sent while receiving waits",
        Duration::from_secs(15),
        || async { tg.sent().iter().any(|m| m.text == "done").then_some(()) },
    )
    .await;
    assert_eq!(w.metrics.turns_held_now(), 0);
    w.shutdown().await;
}

/// A worker stopped (SIGTERM: its bots handed over) while a handler is working on a message
/// that it then answers `202`: the hold is still written, so the next owner holds the turn on
/// and does not ask the handler again; a part posted through it finishes the turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_202_during_a_hand_over_is_not_asked_again() {
    const T: &str = "5202:handover-SECRET";
    let handler = ScriptedHandler::start(|ev: &serde_json::Value| match ev["text"].as_str() {
        Some("ask") => serde_json::json!({"_status": 202, "_delay_ms": 1_500}),
        Some(t) => serde_json::json!({ "text": t }),
        None => serde_json::json!({}),
    })
    .await;
    let (fake, h, a) = running("moving", T, webhook(&handler), |_| {}).await;
    let tg = fake.state();
    tg.user_writes(T, 5, "ask");
    let token = botfleet_testkit::connector_suite::asked_token(&handler, "ask").await;
    // The handler is still working (1.5 s) when the worker stops and hands the bot over.
    let b = h.start("b");
    a.shutdown().await;
    tg.user_writes(T, 5, "next");
    wait_for(
        "the turn held on the next owner",
        Duration::from_secs(20),
        || async { (b.metrics.turns_held_now() == 1).then_some(()) },
    )
    .await;
    done_then_next(tg, &handler, &b.api_url, &token).await;
    b.shutdown().await;
}

/// "ask": streamed into one message by a task, 30 words 50 ms apart, then finished with a
/// state; anything else: the text and the state.
struct Streamer;

/// What [`Streamer`]'s stream ends on.
fn streamed_text() -> String {
    (0..30).map(|w| format!("w{w} ")).collect()
}

#[async_trait]
impl BotHandler for Streamer {
    async fn handle(&self, event: &Inbound, cx: &mut TurnContext) -> Result<(), HandlerError> {
        if event.text != "ask" {
            let state = cx.state().map(|s| s.to_string()).unwrap_or_default();
            cx.reply(format!("{} {state}", event.text));
            return Ok(());
        }
        let mut stream = cx.later().expect("a worker's turn").stream("answer");
        cx.answer_later();
        tokio::spawn(async move {
            for w in 0..30 {
                stream
                    .append(&format!("w{w} "))
                    .await
                    .expect("a part taken");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(stream.text(), streamed_text());
            stream
                .finish(Some(&serde_json::json!({"streamed": true})))
                .await
                .expect("the last part taken");
        });
        Ok(())
    }
}

/// The bot `id` of `token` answered by [`Streamer`], on a running worker.
async fn running_streamer(id: &str, token: &str) -> (FakeTelegram, Harness, RunningWorker) {
    running(id, token, HandlerSpec::Named("streamer".into()), |c| {
        let handlers: HashMap<String, Arc<dyn BotHandler>> = HashMap::from([(
            "streamer".to_owned(),
            Arc::new(Streamer) as Arc<dyn BotHandler>,
        )]);
        c.handlers = Arc::new(handlers);
    })
    .await
}

/// A Rust handler streams its answer word by word into one message of a group (where
/// Telegram has no drafts), on a fake that paces a message's edits as Telegram does: one
/// message, a few edits (none refused for the pace), ending on the whole text; the chat's
/// next message is answered after, with the state the stream's end left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_handler_streams_its_answer_into_one_message() {
    const T: &str = "5203:stream-SECRET";
    let (fake, _h, w) = running_streamer("streamer", T).await;
    let tg = fake.state();
    tg.pace_edits(Some(Duration::from_secs(1)));
    ask_then_next(tg, T, -3).await;
    let texts: Vec<String> = tg.sent().into_iter().map(|s| s.text).collect();
    assert_eq!(texts, ["w0 ", r#"next {"streamed":true}"#], "{texts:?}");
    let edits: Vec<String> = tg.edits(T).into_iter().map(|e| e.text).collect();
    assert!(!edits.is_empty() && edits.len() <= 4, "{edits:?}");
    assert_eq!(edits.last(), Some(&streamed_text()));
    assert_eq!(tg.edits_paced(), 0, "an edit went faster than the pace");
    assert!(tg.drafts(T).is_empty(), "no drafts in a group");
    w.shutdown().await;
}

/// The same stream in a private chat goes as Telegram's message drafts (the bot's `stream` is
/// `native`, the default): one draft, shown growing a few times (each a longer text of the
/// answer), then one message with the whole text at the turn's end — no edit — and the chat's
/// next message after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rust_handler_streams_its_answer_as_a_draft_in_a_private_chat() {
    const T: &str = "5205:drafts-SECRET";
    let (fake, _h, w) = running_streamer("drafter", T).await;
    let tg = fake.state();
    ask_then_next(tg, T, 3).await;
    let texts: Vec<String> = tg.sent().into_iter().map(|s| s.text).collect();
    assert_eq!(
        texts,
        [streamed_text(), r#"next {"streamed":true}"#.to_owned()],
        "{texts:?}"
    );
    assert!(tg.edits(T).is_empty(), "{:?}", tg.edits(T));
    let drafts = tg.drafts(T);
    assert!(!drafts.is_empty() && drafts.len() <= 5, "{drafts:?}");
    assert!(drafts
        .iter()
        .all(|d| d.draft_id == drafts[0].draft_id && d.chat_id == "3"));
    assert!(
        drafts
            .windows(2)
            .all(|p| p[1].text.starts_with(&p[0].text) && p[1].text.len() > p[0].text.len()),
        "each draft shows more of the answer: {drafts:?}"
    );
    assert!(streamed_text().starts_with(&drafts.last().unwrap().text));
    w.shutdown().await;
}

/// A worker joins whose place on the ring is where the bot should run: its owner hands the
/// bot over while a turn of it is held. The newcomer holds the turn on (not asking the handler
/// again), a part posted through the old owner's API finishes it, and the chat's next message
/// is answered after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_turn_moves_with_its_bot_to_a_worker_that_joins() {
    use botfleet_coord::placement::{Ring, RingConfig};
    use botfleet_core::WorkerId;
    const T: &str = "5204:join-SECRET";
    let handler = botfleet_testkit::connector_suite::later_handler().await;
    let (fake, h, a) = running("joined", T, webhook(&handler), |_| {}).await;
    // A name whose worker the ring gives the bot once it joins beside "a".
    let bot = BotId::new("joined").unwrap();
    let first = WorkerId::new("a").unwrap();
    let name = (0..100)
        .map(|i| format!("b{i}"))
        .find(|n| {
            let next = WorkerId::new(n.as_str()).unwrap();
            Ring::new([&first, &next], RingConfig::default()).owner_of(&bot) == Some(&next)
        })
        .expect("a name the ring gives the bot");
    let tg = fake.state();
    tg.user_writes(T, 6, "ask");
    let token = botfleet_testkit::connector_suite::asked_token(&handler, "ask").await;
    wait_for("the turn held", Duration::from_secs(20), || async {
        (a.metrics.turns_held_now() == 1).then_some(())
    })
    .await;
    let b = h.start(&name);
    wait_for(
        "the bot and its held turn on the newcomer",
        Duration::from_secs(30),
        || async {
            (b.metrics.turns_held_now() == 1 && a.metrics.turns_held_now() == 0).then_some(())
        },
    )
    .await;
    tg.user_writes(T, 6, "next");
    done_then_next(tg, &handler, &a.api_url, &token).await;
    a.shutdown().await;
    b.shutdown().await;
}
