//! Slack's own behaviours, through the worker: the refresh drill (every socket replaced while
//! users write: events delayed, none lost), `link_disabled`, redeliveries, threads.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{sync::Arc, time::Duration};

use botfleet_coord::MemoryHub;
use botfleet_core::{BotId, BotSpec, BotStatus, Platform, Secret, WorkerId};
use botfleet_runtime::{Worker, WorkerConfig};
use botfleet_store::{SqliteStore, Store};
use botfleet_testkit::{nonce, wait_for, FakeSlack};
use tokio::sync::oneshot;

struct Dir(std::path::PathBuf);
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tokens(j: usize) -> (String, String) {
    (format!("xoxb-sl-{j}"), format!("xapp-sl-{j}"))
}

async fn fleet(
    n: usize,
) -> (
    FakeSlack,
    Dir,
    Arc<dyn Store>,
    Arc<botfleet_runtime::Metrics>,
    oneshot::Sender<()>,
) {
    let fake = FakeSlack::start().await.unwrap();
    let dir = Dir(std::env::temp_dir().join(format!("botfleet-slack-{}", nonce())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.0.join("b.db")).await.unwrap());
    for j in 0..n {
        let (bot, app) = tokens(j);
        fake.state().add_app(&bot, &app);
        let mut spec = BotSpec::new(BotId::new(format!("sl-{j}")).unwrap(), Platform::Slack, bot);
        spec.app_token = Some(Secret::new(app));
        spec.options.api_url = Some(fake.url());
        store.add_bot(&spec).await.unwrap();
    }
    let mut c = WorkerConfig::new(WorkerId::new("solo").unwrap());
    c.lease = Duration::from_millis(1500);
    c.reconcile_every = Duration::from_millis(200);
    let w = Worker::new(c, Arc::new(MemoryHub::new().coordinator()), store.clone()).unwrap();
    let metrics = w.metrics();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let _ = w
            .run(async {
                let _ = rx.await;
            })
            .await;
    });
    wait_for("every bot connected", Duration::from_secs(20), || async {
        (fake.state().connected_apps() == n).then_some(())
    })
    .await;
    (fake, dir, store, metrics, tx)
}

/// Slack asks every socket to be replaced while users write: each bot opens its new socket
/// before closing the old (never more than two), no event is lost or answered twice, and
/// every channel's order holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_refresh_drill_loses_nothing() {
    let n = 20;
    let (fake, _dir, _store, _m, stop) = fleet(n).await;
    let mut expected = Vec::new();
    for round in 0..10 {
        for j in 0..n {
            let text = format!("m{round}");
            fake.state().user_writes(&tokens(j).0, "C1", None, &text);
            expected.push((tokens(j).0, text));
        }
        if round == 3 {
            for j in 0..n {
                assert_eq!(fake.state().refresh(&tokens(j).0), 1);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for("every event answered", Duration::from_secs(30), || async {
        (fake.state().sent().len() >= expected.len()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let posts = fake.state().sent();
    assert_eq!(posts.len(), expected.len(), "nothing twice");
    for j in 0..n {
        let got: Vec<&str> = posts
            .iter()
            .filter(|p| p.token == tokens(j).0)
            .map(|p| p.text.as_str())
            .collect();
        let want: Vec<String> = (0..10).map(|r| format!("m{r}")).collect();
        assert_eq!(got, want, "bot {j}: once each, in order");
        assert!(fake.state().max_sockets(&tokens(j).0) <= 2);
        assert_eq!(
            fake.state().sockets(&tokens(j).0),
            1,
            "the old socket was closed"
        );
    }
    assert_eq!(fake.state().overlaps(), 0);
    let _ = stop.send(());
}

/// An event not acknowledged in time comes again: it is acknowledged, counted, and answered
/// once. Replies to a thread stay in the thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redeliveries_are_answered_once_and_threads_are_kept() {
    let (fake, _dir, _store, metrics, stop) = fleet(1).await;
    // No time at all: every acknowledgement is late and Slack delivers again.
    fake.state().set_ack_deadline(Duration::ZERO);
    fake.state()
        .user_writes(&tokens(0).0, "C7", Some("1700000000.000001"), "in a thread");
    wait_for("redelivered", Duration::from_secs(10), || async {
        (fake.state().redeliveries() > 0).then_some(())
    })
    .await;
    fake.state().set_ack_deadline(Duration::from_secs(3));
    wait_for("answered", Duration::from_secs(10), || async {
        (!fake.state().sent().is_empty()).then_some(())
    })
    .await;
    wait_for("all acknowledged", Duration::from_secs(10), || async {
        (fake.state().undelivered() == 0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let posts = fake.state().sent();
    assert_eq!(posts.len(), 1, "answered once: {posts:?}");
    assert_eq!(posts[0].channel, "C7");
    assert_eq!(posts[0].thread_ts.as_deref(), Some("1700000000.000001"));
    let text = metrics.render("solo");
    let counted = |name: &str| {
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains("slack"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert!(
        counted("botfleet_messages_redelivered_total") >= 1.0,
        "the redelivery is counted: {text}"
    );
    let _ = stop.send(());
}

/// Socket Mode turned off for an app: the bot fails with the reason and is not retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_disabled_fails_the_bot() {
    let (fake, _dir, store, _m, stop) = fleet(1).await;
    fake.state().link_disabled(&tokens(0).0);
    let rec = wait_for("failed", Duration::from_secs(10), || async {
        store
            .get_bot(&BotId::new("sl-0").unwrap())
            .await
            .unwrap()
            .filter(|r| r.status == BotStatus::Failed)
    })
    .await;
    assert!(rec.last_error.unwrap().contains("link_disabled"));
    let calls = fake.state().requests_of(&tokens(0).1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fake.state().requests_of(&tokens(0).1), calls, "not retried");
    assert_eq!(fake.state().sockets(&tokens(0).0), 0);
    let _ = stop.send(());
}

/// Slack's streaming methods, as the client calls them and the fake checks them: a stream
/// starts only as a reply in a thread, outside a DM only to a named recipient; appends add to
/// the message, the stop adds the last text and ends it; nothing is appended after the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_streams_start_append_and_stop() {
    use botfleet_slack::{SlackApi, SlackClient, SlackConfig, SlackError};
    let fake = FakeSlack::start().await.unwrap();
    let (bot, app) = tokens(90);
    fake.state().add_app(&bot, &app);
    let api = SlackApi::new(
        Some(&fake.url()),
        &Secret::new(bot.as_str()),
        &Secret::new(app.as_str()),
    );
    let client = SlackClient::new(SlackConfig::default()).unwrap();
    let refused = |r: Result<String, SlackError>| match r {
        Err(SlackError::Refused { code, .. }) => code,
        other => panic!("{other:?}"),
    };
    // In a channel, no recipient: refused; in a DM, none needed.
    let no_one = client
        .start_stream(&api, "C1", "1700000000.000001", None, Some("Hel"))
        .await;
    assert_eq!(refused(no_one), "invalid_arguments");
    let dm = client
        .start_stream(&api, "D1", "1700000000.000001", None, None)
        .await;
    assert!(dm.is_ok(), "{dm:?}");
    let ts = client
        .start_stream(
            &api,
            "C1",
            "1700000000.000001",
            Some(("T1", "U1")),
            Some("Hel"),
        )
        .await
        .unwrap();
    client.append_stream(&api, "C1", &ts, "lo, ").await.unwrap();
    client.append_stream(&api, "C1", &ts, "wor").await.unwrap();
    let shown = fake.state().posted(&bot, "C1", &ts).unwrap();
    assert_eq!((shown.text.as_str(), shown.streaming), ("Hello, wor", true));
    client
        .stop_stream(&api, "C1", &ts, Some("ld"))
        .await
        .unwrap();
    let shown = fake.state().posted(&bot, "C1", &ts).unwrap();
    assert_eq!(
        (shown.text.as_str(), shown.streaming),
        ("Hello, world", false)
    );
    let after = client
        .append_stream(&api, "C1", &ts, "!")
        .await
        .map(|()| String::new());
    assert_eq!(refused(after), "message_not_in_streaming_state");
    assert_eq!(fake.state().streams(&bot).len(), 2);
}
