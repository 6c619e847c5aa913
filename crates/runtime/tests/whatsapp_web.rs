//! WhatsApp device-link bots through the worker and the platform seam, with the real
//! `whatsapp-rust` client against the stand-in at its transport boundary (a WebSocket server
//! speaking WhatsApp Web's Noise handshake and binary nodes): linking, connect on claim,
//! hand-over without two connections, logged out, replaced, unlinked, files both ways.

#![cfg(feature = "whatsapp-web")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{sync::Arc, time::Duration};

use botfleet_coord::{Coordinator, MemoryHub};
use botfleet_core::{BotId, BotSpec, BotStatus, Platform, WorkerId};
use botfleet_runtime::{StoreSession, Worker, WorkerConfig};
use botfleet_store::Store;
use botfleet_testkit::{temp_sqlite, wait_for, TempDir};
use botfleet_whatsapp::device::{self, LinkPrompt, WebConfig};
use botfleet_whatsapp_standin::StandIn;
use tokio::{sync::oneshot, task::JoinHandle};

const VERSION: (u32, u32, u32) = (2, 3000, 1);

fn web_config() -> WebConfig {
    WebConfig {
        version: Some(VERSION),
        connect_timeout: Duration::from_secs(20),
    }
}

fn spec(id: &str, url: &str) -> BotSpec {
    let mut s = BotSpec::new(BotId::new(id).unwrap(), Platform::Whatsapp, "");
    s.options.mode = Some("web".into());
    s.options.api_url = Some(url.to_owned());
    s
}

/// Links `id` as the phone `user` would: the QR code the client shows is scanned by the
/// stand-in acting as the phone.
async fn link(store: &Arc<dyn Store>, standin: &StandIn, id: &str, user: &str) {
    let bot = BotId::new(id).unwrap();
    let session = Arc::new(
        StoreSession::above_all(store.clone(), bot.clone())
            .await
            .unwrap(),
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let url = standin.url();
    let linking = tokio::spawn(async move {
        device::link(
            &web_config(),
            &bot,
            Some(&url),
            session,
            None,
            Duration::from_secs(60),
            move |p| {
                if let LinkPrompt::Qr(q) = p {
                    let _ = tx.send(q);
                }
            },
        )
        .await
    });
    let qr = match tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("a QR code in time")
    {
        Some(q) => q,
        None => panic!("no QR code: {:?}", linking.await.unwrap()),
    };
    standin.scan(&qr, user).await.unwrap();
    let jid = linking.await.unwrap().expect("linked");
    assert!(jid.starts_with(user), "linked as {jid}");
    // The linking client closed its connection.
    wait_for(
        "the linking client gone",
        Duration::from_secs(10),
        || async { (standin.connected(user) == 0).then_some(()) },
    )
    .await;
}

struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    metrics: Arc<botfleet_runtime::Metrics>,
    sends: botfleet_runtime::Sends,
}

impl Running {
    async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .expect("stops in time")
            .unwrap();
    }
}

fn start(name: &str, coord: Arc<dyn Coordinator>, store: Arc<dyn Store>) -> Running {
    let mut c = WorkerConfig::new(WorkerId::new(name).unwrap());
    c.lease = Duration::from_millis(1500);
    c.reconcile_every = Duration::from_millis(200);
    c.whatsapp_web_version = Some(format!("{}.{}.{}", VERSION.0, VERSION.1, VERSION.2));
    let mut w = Worker::new(c, coord, store).unwrap();
    let metrics = w.metrics();
    let sends = w.sends();
    let (tx, rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        w.run(async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    Running {
        stop: Some(tx),
        task,
        metrics,
        sends,
    }
}

async fn status(store: &Arc<dyn Store>, id: &str) -> (BotStatus, String, String) {
    let r = store
        .get_bot(&BotId::new(id).unwrap())
        .await
        .unwrap()
        .unwrap();
    (
        r.status,
        r.last_error.unwrap_or_default(),
        r.reported_by.unwrap_or_default(),
    )
}

/// A stand-in, a SQLite registry in a temporary directory, and bot `id` in it linked as the
/// phone `user`.
async fn linked_bot(id: &str, user: &str) -> (StandIn, TempDir, Arc<dyn Store>) {
    let standin = StandIn::start().await.unwrap();
    let (dir, store) = temp_sqlite(&format!("wa-web-{id}")).await;
    store.add_bot(&spec(id, &standin.url())).await.unwrap();
    link(&store, &standin, id, user).await;
    (standin, dir, store)
}

/// Waits until `user`'s device has one connection and bot `id` is running (on worker `on`,
/// with no error, when given).
async fn connected_and_running(
    standin: &StandIn,
    store: &Arc<dyn Store>,
    id: &str,
    user: &str,
    on: Option<&str>,
) {
    wait_for(
        &format!("{id} connected and running"),
        Duration::from_secs(30),
        || async {
            let (st, err, by) = status(store, id).await;
            (standin.connected(user) == 1
                && st == BotStatus::Running
                && on.is_none_or(|w| err.is_empty() && by == w))
            .then_some(())
        },
    )
    .await;
}

async fn linked(store: &Arc<dyn Store>, id: &str) -> bool {
    !store
        .session_records(&BotId::new(id).unwrap(), "device")
        .await
        .unwrap()
        .is_empty()
}

/// A linked bot connects when a worker claims it; a clean shutdown hands it to the other
/// worker, which connects the same session (read whole from the store) only after the first
/// disconnected: the server never sees two connections of the device. No session write of the
/// first worker was refused: it flushed while it still held the bot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_bot_connects_on_claim_and_hands_over_without_overlap() {
    let (standin, _dir, store) = linked_bot("wa-1", "15550000001").await;
    assert!(linked(&store, "wa-1").await);
    let before = standin.logins("15550000001");

    let hub = MemoryHub::new();
    let a = start("a", Arc::new(hub.coordinator()), store.clone());
    connected_and_running(&standin, &store, "wa-1", "15550000001", Some("a")).await;
    assert_eq!(standin.logins("15550000001"), before + 1);

    let b = start("b", Arc::new(hub.coordinator()), store.clone());
    let a_metrics = a.metrics.clone();
    // Let b join the fleet before a leaves, so a hands the bot over.
    wait_for("b registered", Duration::from_secs(10), || async {
        (hub.coordinator().live_workers().await.ok()?.len() == 2).then_some(())
    })
    .await;
    // a leaves cleanly (if placement gave the bot to b already, that was the hand-over).
    a.shutdown().await;
    connected_and_running(&standin, &store, "wa-1", "15550000001", Some("b")).await;
    assert_eq!(
        standin.max_concurrent("15550000001"),
        1,
        "never two connections of one device"
    );
    assert!(standin.logins("15550000001") >= before + 2);
    let text = a_metrics.render("a");
    assert!(
        text.contains("botfleet_whatsapp_session_writes_refused_total{worker_id=\"a\",platform=\"whatsapp\"} 0")
            || !text.contains("botfleet_whatsapp_session_writes_refused_total"),
        "no refused session write on the worker that handed over: {text}"
    );
    b.shutdown().await;
    wait_for(
        "disconnected on shutdown",
        Duration::from_secs(10),
        || async { (standin.connected("15550000001") == 0).then_some(()) },
    )
    .await;
}

/// A bot handed over while its connect is still in flight (a slow network: the dial takes
/// seconds) is not dropped midway: the stopping worker's client would dial on by itself and log
/// in beside the next owner's. The connect ends first (the dial that lands is closed), then the
/// bot moves, and the server never sees two connections of the device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_during_a_slow_dial_leaves_no_second_connection() {
    let user = "15550000007";
    let (standin, _dir, store) = linked_bot("wa-slow", user).await;
    let before = standin.logins(user);
    standin.slow_dials(Duration::from_secs(2));
    let dials = standin.dials();

    let hub = MemoryHub::new();
    let a = start("a", Arc::new(hub.coordinator()), store.clone());
    wait_for("a dialing", Duration::from_secs(10), || async {
        (standin.dials() > dials).then_some(())
    })
    .await;
    // a leaves while its dial is in flight; b takes the bot.
    let b = start("b", Arc::new(hub.coordinator()), store.clone());
    wait_for("b registered", Duration::from_secs(10), || async {
        (hub.coordinator().live_workers().await.ok()?.len() == 2).then_some(())
    })
    .await;
    a.shutdown().await;
    connected_and_running(&standin, &store, "wa-slow", user, Some("b")).await;
    // Every dial the server took has logged in or gone: a client of a's abandoned midway would
    // be one of them (its dial began before a stopped).
    wait_for("no dial in flight", Duration::from_secs(30), || async {
        (standin.dials_in_flight() == 0).then_some(())
    })
    .await;
    assert_eq!(
        standin.max_concurrent(user),
        1,
        "never two connections of one device"
    );
    assert_eq!(standin.connected(user), 1);
    assert!(standin.logins(user) > before, "b logged in");
    b.shutdown().await;
}

/// The phone logs the device out: the bot fails with "link again", its session is cleared
/// (it shows as unlinked) and no worker dials it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logged_out_by_the_phone_fails_the_bot_until_linked_again() {
    let (standin, _dir, store) = linked_bot("wa-2", "15550000002").await;
    let hub = MemoryHub::new();
    let w = start("solo", Arc::new(hub.coordinator()), store.clone());
    connected_and_running(&standin, &store, "wa-2", "15550000002", None).await;
    standin.log_out("15550000002");
    let (st, err, _) = wait_for("failed", Duration::from_secs(30), || async {
        let s = status(&store, "wa-2").await;
        (s.0 == BotStatus::Failed).then_some(s)
    })
    .await;
    assert_eq!(st, BotStatus::Failed);
    assert!(err.contains("link again"), "{err}");
    assert!(err.contains("bots link wa-2"), "{err}");
    wait_for("session cleared", Duration::from_secs(10), || async {
        (!linked(&store, "wa-2").await).then_some(())
    })
    .await;
    let logins = standin.logins("15550000002");
    // Several reconcile rounds: a failed bot is not retried.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(standin.logins("15550000002"), logins, "not dialed again");
    assert_eq!(standin.connected("15550000002"), 0);
    w.shutdown().await;
}

/// Another client takes the session over: the bot stops and says so, and does not fight for
/// the session (no reconnect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_connection_stops_the_bot_instead_of_fighting() {
    let (standin, _dir, store) = linked_bot("wa-3", "15550000003").await;
    let hub = MemoryHub::new();
    let w = start("solo", Arc::new(hub.coordinator()), store.clone());
    connected_and_running(&standin, &store, "wa-3", "15550000003", None).await;
    let logins = standin.logins("15550000003");
    standin.replace("15550000003");
    let (_, err, _) = wait_for("failed", Duration::from_secs(30), || async {
        let s = status(&store, "wa-3").await;
        (s.0 == BotStatus::Failed).then_some(s)
    })
    .await;
    assert!(err.contains("stream replaced"), "{err}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(standin.logins("15550000003"), logins, "no reconnect");
    assert!(linked(&store, "wa-3").await, "the session is kept");
    w.shutdown().await;
}

/// A bot no phone has linked is reported once ("not linked: run bots link") and never
/// dialed: no registration, no login, no retry loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlinked_bot_is_reported_and_never_dialed() {
    let standin = StandIn::start().await.unwrap();
    let (_dir, store) = temp_sqlite("wa-web-unlinked").await;
    store.add_bot(&spec("wa-4", &standin.url())).await.unwrap();
    let hub = MemoryHub::new();
    let w = start("solo", Arc::new(hub.coordinator()), store.clone());
    let (_, err, _) = wait_for("reported", Duration::from_secs(30), || async {
        let s = status(&store, "wa-4").await;
        (s.0 == BotStatus::Failed).then_some(s)
    })
    .await;
    assert!(err.contains("not linked"), "{err}");
    assert!(err.contains("bots link wa-4"), "{err}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(standin.registering(), 0);
    assert_eq!(standin.total_connected(), 0);
    // Linked now, while the worker still holds the bot (parked): the link wrote under a fence
    // above that claim; a restart (the spec written again, as `bots restart` does) claims the
    // bot above the link's fence, and it connects with the new session.
    link(&store, &standin, "wa-4", "15550000004").await;
    store
        .update_bot(&spec("wa-4", &standin.url()))
        .await
        .unwrap();
    connected_and_running(&standin, &store, "wa-4", "15550000004", Some("solo")).await;
    w.shutdown().await;
}

/// A contact writes to the bot (Signal-encrypted, as a phone would): the echo handler answers
/// each text once, in order, before and after the bot moves to another worker; messages
/// written while nobody runs it are delivered to the next owner (WhatsApp's offline queue),
/// and every one is acknowledged only once recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contacts_are_answered_in_order_across_a_hand_over() {
    let (user, contact) = ("15550000005", "15557770005");
    let (standin, _dir, store) = linked_bot("wa-5", user).await;
    let hub = MemoryHub::new();
    let a = start("a", Arc::new(hub.coordinator()), store.clone());
    connected_and_running(&standin, &store, "wa-5", user, None).await;
    for i in 0..3 {
        standin
            .send_text(contact, user, &format!("m{i}"))
            .await
            .unwrap();
    }
    wait_for("three answers", Duration::from_secs(30), || async {
        (standin.replies_to(user, contact).len() >= 3).then_some(())
    })
    .await;
    // Nobody runs the bot for a moment: what the contact writes meanwhile waits at WhatsApp.
    a.shutdown().await;
    for i in 3..6 {
        standin
            .send_text(contact, user, &format!("m{i}"))
            .await
            .unwrap();
    }
    assert!(standin.unacked(user) > 0, "held while the bot is offline");
    let b = start("b", Arc::new(hub.coordinator()), store.clone());
    standin.send_text(contact, user, "m6").await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !(standin.replies_to(user, contact).len() >= 7 && standin.unacked(user) == 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "every answer: got {:?}, {} unacknowledged, status {:?}",
            standin.replies_to(user, contact),
            standin.unacked(user),
            status(&store, "wa-5").await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let want: Vec<String> = (0..7).map(|i| format!("m{i}")).collect();
    assert_eq!(
        standin.replies_to(user, contact),
        want,
        "once each, in order"
    );
    assert_eq!(standin.max_concurrent(user), 1);
    b.shutdown().await;
}

/// WhatsApp bans the number for a while: the bot waits the ban out (its status says why),
/// then the client starts again and what the contact wrote meanwhile is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_temporary_ban_is_waited_out() {
    let (user, contact) = ("15550000006", "15557770006");
    let (standin, _dir, store) = linked_bot("wa-6", user).await;
    let hub = MemoryHub::new();
    let w = start("solo", Arc::new(hub.coordinator()), store.clone());
    connected_and_running(&standin, &store, "wa-6", user, None).await;
    standin.send_text(contact, user, "before").await.unwrap();
    wait_for("answered", Duration::from_secs(30), || async {
        (standin.replies_to(user, contact).len() == 1).then_some(())
    })
    .await;
    standin.ban(user, Duration::from_secs(3));
    wait_for("the ban met", Duration::from_secs(30), || async {
        (standin.refused(user) > 0).then_some(())
    })
    .await;
    standin.send_text(contact, user, "during").await.unwrap();
    wait_for(
        "answered after the ban",
        Duration::from_secs(60),
        || async {
            (standin.replies_to(user, contact).len() == 2 && standin.unacked(user) == 0)
                .then_some(())
        },
    )
    .await;
    assert_eq!(standin.replies_to(user, contact), ["before", "during"]);
    assert_eq!(status(&store, "wa-6").await.0, BotStatus::Running);
    assert_eq!(standin.max_concurrent(user), 1);
    w.shutdown().await;
}

/// This test binary links the stand-in, so its WhatsApp client does not check the server's
/// certificate: the connector finds that out and dials nothing but this machine. A linked bot
/// pointed at another address fails with the reason, and nothing is dialed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_without_certificate_checks_dials_only_loopback() {
    assert!(botfleet_whatsapp::device::skips_server_certificate());
    let (standin, _dir, store) = linked_bot("wa-far", "15550000009").await;
    let mut rec = store
        .get_bot(&BotId::new("wa-far").unwrap())
        .await
        .unwrap()
        .unwrap();
    // TEST-NET-1: never routed; refused before any dial.
    rec.spec.options.api_url = Some("wss://192.0.2.1/ws/chat".into());
    store.update_bot(&rec.spec).await.unwrap();
    let dials = standin.dials();
    let hub = MemoryHub::new();
    let w = start("solo", Arc::new(hub.coordinator()), store.clone());
    let (st, err, _) = wait_for("failed", Duration::from_secs(30), || async {
        let s = status(&store, "wa-far").await;
        (s.0 == BotStatus::Failed).then_some(s)
    })
    .await;
    assert_eq!(st, BotStatus::Failed);
    assert!(err.contains("dials loopback addresses only"), "{err}");
    assert_eq!(standin.dials(), dials, "the stand-in was not dialed either");
    w.shutdown().await;
}

/// Bytes of every value, longer than one read of a socket.
fn sample(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect()
}

/// Files both ways through a linked device. A contact's photo (encrypted on the contact's
/// phone, its ciphertext on the CDN, the references in the message) reaches the handler as an
/// attachment with its caption as the text, never its references; its link serves the
/// decrypted bytes from the worker's API. The handler sends it back by that link, with a
/// document from `data`: the bot's client encrypts and uploads both, and the contact's phone
/// downloads and decrypts the same bytes, the text as the photo's caption.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_go_both_ways_through_a_linked_device() {
    use base64::Engine as _;
    use botfleet_core::HandlerSpec;
    use botfleet_testkit::{connector_suite::Harness, ScriptedHandler};
    use botfleet_whatsapp_standin::MediaFile;
    use serde_json::{json, Value};

    let (user, contact) = ("15550000008", "15557770008");
    let standin = StandIn::start().await.unwrap();
    let report = sample(40_000, 3);
    let report_b64 = base64::engine::general_purpose::STANDARD.encode(&report);
    let handler =
        ScriptedHandler::start(
            move |ev: &Value| match ev["attachments"][0]["url"].as_str() {
                Some(url) => {
                    json!({"actions": [{"type": "send", "text": "yours back", "attachments": [
                        {"url": url, "name": "back.jpg"},
                        {"data": report_b64, "name": "report.pdf", "mime": "application/pdf"},
                    ]}]})
                }
                None => json!({}),
            },
        )
        .await;
    let mut s = spec("wa-8", &standin.url());
    s.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    let h = Harness::new(&[s]).await;
    link(h.store(), &standin, "wa-8", user).await;
    let w = h.start_with("a", |c| {
        c.whatsapp_web_version = Some(format!("{}.{}.{}", VERSION.0, VERSION.1, VERSION.2));
    });
    connected_and_running(&standin, h.store(), "wa-8", user, None).await;

    let photo = sample(70_000, 5);
    standin
        .send_media(
            contact,
            user,
            MediaFile {
                kind: "image".into(),
                mime: Some("image/jpeg".into()),
                name: None,
                caption: Some("look".into()),
                data: photo.clone(),
            },
        )
        .await
        .unwrap();
    let replies = wait_for("both files back", Duration::from_secs(30), || async {
        let r: Vec<_> = standin
            .replies()
            .into_iter()
            .filter(|r| r.to == contact)
            .collect();
        (r.len() >= 2).then_some(r)
    })
    .await;

    let ev = handler.first_with_attachments();
    assert_eq!(ev["text"], "look", "the caption is the text");
    let att = &ev["attachments"][0];
    assert_eq!(att["kind"], "image", "{att}");
    assert_eq!(att["size"], photo.len(), "{att}");
    assert_eq!(att["mime"], "image/jpeg", "{att}");
    assert!(att.get("source").is_none(), "the references stay: {att}");
    let url = att["url"].as_str().expect("a link");
    assert!(url.starts_with(&w.api_url), "{url}");
    let body = reqwest::get(url).await.unwrap().bytes().await.unwrap();
    assert!(body[..] == photo[..], "the link serves the decrypted bytes");
    assert!(standin.media_downloads() >= 2, "read from the CDN");

    assert_eq!(replies.len(), 2, "{replies:?}");
    let back = replies[0].media.as_ref().expect("a media message");
    assert_eq!(back.kind, "image");
    assert!(back.data == photo, "the photo as the contact sent it");
    assert_eq!(replies[0].text, "yours back", "the text is its caption");
    let doc = replies[1].media.as_ref().expect("a media message");
    assert_eq!(doc.kind, "document");
    assert_eq!(doc.name.as_deref(), Some("report.pdf"));
    assert_eq!(doc.mime.as_deref(), Some("application/pdf"));
    assert!(doc.data == report, "the document's bytes");
    assert_eq!(standin.max_concurrent(user), 1);
    w.shutdown().await;
}

/// A slow handler on a linked device: the contact sees "typing…" (the `composing` chat state)
/// while it runs, then the answer, once; a `typing` action shows it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_turn_shows_the_contact_typing() {
    use botfleet_core::HandlerSpec;
    use botfleet_testkit::{connector_suite::Harness, ScriptedHandler};
    use serde_json::{json, Value};

    let (user, contact) = ("15550000009", "15557770009");
    let standin = StandIn::start().await.unwrap();
    let handler = ScriptedHandler::start(|ev: &Value| match ev["text"].as_str() {
        Some("think") => json!({"_delay_ms": 2_500, "text": "thought it over"}),
        Some("quick") => json!({"actions": [{"type": "typing"}, {"type": "send", "text": "ok"}]}),
        _ => json!({}),
    })
    .await;
    let mut s = spec("wa-9", &standin.url());
    s.handler = HandlerSpec::Webhook {
        url: handler.url(),
        secret: None,
    };
    let h = Harness::new(&[s]).await;
    link(h.store(), &standin, "wa-9", user).await;
    let w = h.start_with("a", |c| {
        c.whatsapp_web_version = Some(format!("{}.{}.{}", VERSION.0, VERSION.1, VERSION.2));
    });
    connected_and_running(&standin, h.store(), "wa-9", user, None).await;
    standin.send_text(contact, user, "think").await.unwrap();
    wait_for("the answer", Duration::from_secs(30), || async {
        (!standin.replies_to(user, contact).is_empty()).then_some(())
    })
    .await;
    assert_eq!(standin.replies_to(user, contact), ["thought it over"]);
    let shown = standin.chat_states_to(user, contact);
    assert!(shown.contains(&"composing"), "{shown:?}");
    let before = shown.len();
    standin.send_text(contact, user, "quick").await.unwrap();
    wait_for("the second answer", Duration::from_secs(30), || async {
        (standin.replies_to(user, contact).len() == 2).then_some(())
    })
    .await;
    assert!(
        standin.chat_states_to(user, contact).len() > before,
        "the typing action shows it"
    );
    w.shutdown().await;
}

/// Sends from the backend to a contact of a linked device go out on the bot's owner (the one
/// worker connected as the device), whichever worker accepted them: once each, in the order
/// accepted, a repeat of a key through the owner sending nothing, the contact's next message
/// answered after them; each send's status says `sent` with the message's WhatsApp id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_from_the_backend_go_out_on_the_devices_owner() {
    let (user, contact) = ("15550000008", "15557770008");
    let (standin, _dir, store) = linked_bot("wa-8", user).await;
    let hub = MemoryHub::new();
    let workers = [
        start("a", Arc::new(hub.coordinator()), store.clone()),
        start("b", Arc::new(hub.coordinator()), store.clone()),
    ];
    connected_and_running(&standin, &store, "wa-8", user, None).await;
    let bot = BotId::new("wa-8").unwrap();
    let spec = store.get_bot(&bot).await.unwrap().unwrap().spec;
    let coord = hub.coordinator();
    let owner = wait_for("the bot's owner", Duration::from_secs(15), || async {
        let o = coord.owner(&bot).await.ok()??;
        o.live.then(|| usize::from(o.worker.as_str() == "b"))
    })
    .await;
    let other = &workers[1 - owner].sends;
    standin.send_text(contact, user, "m0").await.unwrap();
    wait_for("m0 answered", Duration::from_secs(30), || async {
        (standin.replies_to(user, contact).len() == 1).then_some(())
    })
    .await;
    let chat = format!("{contact}@s.whatsapp.net");
    let send = |sends: &botfleet_runtime::Sends, key: &'static str, text: &'static str| {
        let (sends, spec, chat) = (sends.clone(), spec.clone(), chat.clone());
        async move {
            let body = serde_json::json!({ "text": text }).to_string();
            sends
                .submit(&spec, &chat, key, &body)
                .await
                .expect("accepted")
        }
    };
    let first = send(other, "desk-1", "desk 1").await;
    let second = send(other, "desk-2", "desk 2").await;
    assert!(first.new && second.new);
    let again = send(&workers[owner].sends, "desk-1", "desk 1").await;
    assert!(!again.new, "a repeat of a key is known on the owner too");
    assert_eq!(again.id(), first.id());
    standin.send_text(contact, user, "m1").await.unwrap();
    wait_for("every message out", Duration::from_secs(30), || async {
        (standin.replies_to(user, contact).len() >= 4).then_some(())
    })
    .await;
    for s in [&first, &second] {
        let st = wait_for("the send's status", Duration::from_secs(10), || async {
            let st = other.status(&spec, s.id()).await.ok()??;
            (st.status != "queued").then_some(st)
        })
        .await;
        assert_eq!(st.status, "sent", "{st:?}");
        assert_eq!(st.platform_ids.len(), 1, "{st:?}");
    }
    // A send the owner could double would show by now: the contact's later message is
    // answered after it.
    assert_eq!(
        standin.replies_to(user, contact),
        ["m0", "desk 1", "desk 2", "m1"],
        "once each, in order"
    );
    for w in workers {
        w.shutdown().await;
    }
}
