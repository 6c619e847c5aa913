//! The real `whatsapp-rust` client against the stand-in WhatsApp Web server: linking by QR
//! code, logging in again, being replaced, being logged out, asking for a pairing code, and
//! texts both ways with a contact (live, from the offline queue, redelivered when unacked).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use botfleet_whatsapp_standin::{Reply, StandIn};
use tokio::sync::mpsc;
use wacore::{proto_helpers::MessageExt as _, store::InMemoryBackend};
use whatsapp_rust::{
    anyhow, async_trait,
    bot::{Bot, BotHandle},
    http::{HttpClient, HttpRequest, HttpResponse},
    pair_code::PairCodeOptions,
    store::traits::Backend,
    types::events::{Event, EventHandler, InboundMessage},
    InboundDurabilityHook, Jid, TokioRuntime,
};
use whatsapp_rust_tokio_transport::TokioWebSocketTransportFactory;

const PHONE: &str = "15551234567";
/// A contact writing to the bot.
const CONTACT: &str = "15557770001";
/// Long enough for the client's first login after pairing: it waits 10 s for the app-state
/// key the phone would share before it syncs and emits `Connected`.
const DEADLINE: Duration = Duration::from_secs(60);

/// The builder wants an HTTP client; with the version pinned, nothing calls it.
struct NoHttp;

#[async_trait]
impl HttpClient for NoHttp {
    async fn execute(&self, request: HttpRequest) -> anyhow::Result<HttpResponse> {
        Err(anyhow::anyhow!(
            "no HTTP in tests (asked for {})",
            request.url
        ))
    }
}

/// A running client and the events it emits.
struct Client {
    handle: Option<BotHandle>,
    events: mpsc::UnboundedReceiver<Arc<Event>>,
}

/// Passes the client's events on in the order it emits them (an `on_event` callback runs
/// each on its own task, which can reorder them).
struct Forward(mpsc::UnboundedSender<Arc<Event>>);

impl EventHandler for Forward {
    fn handle_event(&self, event: Arc<Event>) {
        let _ = self.0.send(event);
    }
}

/// An inbound durability hook, as botfleet registers one: it counts the messages it is given
/// and reports them recorded only while `ok` is set (otherwise the client must not ack them).
#[derive(Clone, Default)]
struct Gate {
    ok: Arc<AtomicBool>,
    given: Arc<AtomicUsize>,
}

impl Gate {
    fn new(ok: bool) -> Gate {
        let gate = Gate::default();
        gate.ok.store(ok, Ordering::SeqCst);
        gate
    }
}

#[async_trait]
impl InboundDurabilityHook for Gate {
    async fn on_messages(
        &self,
        _client: Arc<whatsapp_rust::Client>,
        batch: &[InboundMessage],
    ) -> anyhow::Result<()> {
        self.given.fetch_add(batch.len(), Ordering::SeqCst);
        if self.ok.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(anyhow::anyhow!("not recorded"))
        }
    }
}

impl Client {
    async fn start(server: &StandIn, backend: Arc<dyn Backend>, pair_code: Option<&str>) -> Client {
        Client::start_with(server, backend, pair_code, None).await
    }

    async fn start_with(
        server: &StandIn,
        backend: Arc<dyn Backend>,
        pair_code: Option<&str>,
        hook: Option<Gate>,
    ) -> Client {
        let (tx, events) = mpsc::unbounded_channel();
        let mut builder = Bot::builder()
            .with_backend_arc(backend)
            .with_transport_factory(
                TokioWebSocketTransportFactory::new()
                    .with_url(server.url())
                    .without_origin(),
            )
            .with_http_client(NoHttp)
            .with_runtime(TokioRuntime)
            .with_version((2, 3000, 1_000_000_000))
            .with_push_name("botfleet")
            .skip_history_sync()
            .with_event_handler(Forward(tx));
        if let Some(hook) = hook {
            builder = builder.with_inbound_durability_hook(hook);
        }
        if let Some(phone) = pair_code {
            builder = builder.with_pair_code(PairCodeOptions {
                phone_number: phone.to_owned(),
                ..PairCodeOptions::default()
            });
        }
        let bot = builder.build().await.expect("bot builds");
        Client {
            handle: Some(bot.spawn()),
            events,
        }
    }

    /// The first event `pick` accepts, skipping the others.
    async fn next<T>(&mut self, what: &str, pick: impl Fn(&Event) -> Option<T>) -> T {
        let wait = async {
            loop {
                match self.events.recv().await {
                    Some(event) => {
                        if let Some(found) = pick(&event) {
                            return found;
                        }
                    }
                    None => panic!("the client stopped before {what}"),
                }
            }
        };
        tokio::time::timeout(DEADLINE, wait)
            .await
            .unwrap_or_else(|_| panic!("no {what} within {DEADLINE:?}"))
    }

    /// The next `n` texts the client received (`Event::Messages`), in order.
    async fn texts(&mut self, n: usize) -> Vec<Text> {
        let mut texts = Vec::new();
        while texts.len() < n {
            let batch = self
                .next("a text", |e| match e {
                    Event::Messages(batch) => Some(
                        batch
                            .messages
                            .iter()
                            .filter_map(|m| {
                                let text = m.message.text_content()?.to_owned();
                                Some(Text {
                                    sender: m.info.source.sender.to_string(),
                                    text,
                                    offline: m.info.is_offline,
                                })
                            })
                            .collect::<Vec<_>>(),
                    ),
                    _ => None,
                })
                .await;
            texts.extend(batch);
        }
        texts
    }

    /// The running client, to send with.
    fn client(&self) -> Arc<whatsapp_rust::Client> {
        self.handle.as_ref().expect("running").client()
    }

    /// Waits until the client's run loop has ended by itself.
    async fn stopped(&mut self) {
        let handle = self.handle.take().expect("running");
        tokio::time::timeout(DEADLINE, handle)
            .await
            .expect("the client stops by itself");
    }

    async fn shutdown(mut self) {
        if let Some(handle) = self.handle.take() {
            handle.shutdown().await;
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(handle) = &self.handle {
            handle.abort();
        }
    }
}

/// Polls `condition` until it holds.
async fn until(what: &str, condition: impl Fn() -> bool) {
    let wait = async {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(DEADLINE, wait)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen within {DEADLINE:?}"));
}

fn qr_code(event: &Event) -> Option<String> {
    match event {
        Event::PairingQrCode(qr) => Some(qr.code.clone()),
        _ => None,
    }
}

fn connected(event: &Event) -> Option<()> {
    matches!(event, Event::Connected(_)).then_some(())
}

/// Links a fresh client by QR code; returns its backend and device JID once the client has
/// logged in as the new device. The client keeps running.
async fn link(server: &StandIn) -> (Arc<dyn Backend>, String, Client) {
    link_with(server, None).await
}

async fn link_with(server: &StandIn, hook: Option<Gate>) -> (Arc<dyn Backend>, String, Client) {
    let backend: Arc<dyn Backend> = Arc::new(InMemoryBackend::new());
    let mut client = Client::start_with(server, backend.clone(), None, hook).await;
    let qr = client.next("a QR code", qr_code).await;
    assert_eq!(server.registering(), 1);
    let device = server
        .scan(&qr, PHONE)
        .await
        .expect("the client accepts the pairing");
    let jid = format!("{PHONE}:{device}");
    client
        .next("PairSuccess", |e| match e {
            Event::PairSuccess(success) => Some(success.id.clone()),
            _ => None,
        })
        .await;
    assert!(server.is_linked(PHONE, device));
    until("the login as the new device", || {
        server.connected(&jid) == 1
    })
    .await;
    (backend, jid, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_client_links_by_qr_and_connects() {
    let server = StandIn::start().await.expect("stand-in starts");
    let (_backend, jid, mut client) = link(&server).await;
    client.next("Connected", connected).await;

    assert_eq!(server.connected(&jid), 1);
    assert_eq!(server.total_connected(), 1);
    assert_eq!(server.registering(), 0);
    assert_eq!(server.logins(&jid), 1);
    assert_eq!(server.max_concurrent(&jid), 1);
    client.shutdown().await;
    until("the disconnect", || server.total_connected() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_device_logs_in_again() {
    let server = StandIn::start().await.expect("stand-in starts");
    let (backend, jid, first) = link(&server).await;
    first.shutdown().await;
    until("the disconnect", || server.connected(&jid) == 0).await;

    let mut again = Client::start(&server, backend, None).await;
    again.next("Connected", connected).await;
    assert_eq!(server.connected(&jid), 1);
    assert_eq!(server.logins(&jid), 2);
    assert_eq!(server.refused(&jid), 0);
    assert_eq!(server.max_concurrent(&jid), 1);
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_added_to_a_new_stand_in_logs_in() {
    // The client caches the first server's Noise key and opens its next login with Noise IK
    // for it; the new stand-in has another key and answers with XXfallback.
    let first = StandIn::start().await.expect("stand-in starts");
    let (backend, jid, client) = link(&first).await;
    client.shutdown().await;
    drop(first);

    let second = StandIn::start().await.expect("stand-in starts");
    second.add_device(PHONE, 1);
    let mut client = Client::start(&second, backend, None).await;
    client.next("Connected", connected).await;
    assert_eq!(second.connected(&jid), 1);
    assert_eq!(second.max_concurrent(&jid), 1);
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_session_ends_without_reconnecting() {
    let server = StandIn::start().await.expect("stand-in starts");
    let (_backend, jid, mut client) = link(&server).await;
    client.next("Connected", connected).await;

    server.replace(&jid);
    client
        .next("StreamReplaced", |e| {
            matches!(e, Event::StreamReplaced(_)).then_some(())
        })
        .await;
    // The run loop ends by itself: no reconnect, so no second login.
    client.stopped().await;
    assert_eq!(server.connected(&jid), 0);
    assert_eq!(server.logins(&jid), 1);
    assert!(server.is_linked(PHONE, 1), "a replaced device stays linked");
    assert_eq!(server.max_concurrent(&jid), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logged_out_device_is_refused_afterwards() {
    let server = StandIn::start().await.expect("stand-in starts");
    let (backend, jid, mut client) = link(&server).await;
    client.next("Connected", connected).await;

    server.log_out(&jid);
    let on_connect = client
        .next("LoggedOut", |e| match e {
            Event::LoggedOut(out) => Some(out.on_connect),
            _ => None,
        })
        .await;
    assert!(!on_connect, "logged out while connected");
    client.stopped().await;
    assert_eq!(server.connected(&jid), 0);
    assert!(!server.is_linked(PHONE, 1));

    // The same device logging in later is refused the way WhatsApp refuses a removed device.
    let mut later = Client::start(&server, backend, None).await;
    let on_connect = later
        .next("LoggedOut", |e| match e {
            Event::LoggedOut(out) => Some(out.on_connect),
            _ => None,
        })
        .await;
    assert!(on_connect, "refused at login");
    later.stopped().await;
    assert_eq!(server.refused(&jid), 1);
    assert_eq!(server.logins(&jid), 1);
    assert_eq!(server.max_concurrent(&jid), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_asking_for_a_pairing_code_gets_one() {
    let server = StandIn::start().await.expect("stand-in starts");
    let backend: Arc<dyn Backend> = Arc::new(InMemoryBackend::new());
    let mut client = Client::start(&server, backend, Some(PHONE)).await;
    let code = client
        .next("a pairing code", |e| match e {
            Event::PairingCode(code) => Some(code.code.clone()),
            _ => None,
        })
        .await;
    assert_eq!(code.len(), 8);
    assert_eq!(server.pair_code_requests(), vec![PHONE.to_owned()]);
    client.shutdown().await;
}

/// A text the client received: who sent it, and whether it came from the offline queue.
#[derive(Debug, PartialEq, Eq)]
struct Text {
    sender: String,
    text: String,
    offline: bool,
}

/// The contact's `text`, received live.
fn live(text: &str) -> Text {
    Text {
        sender: format!("{CONTACT}@s.whatsapp.net"),
        text: text.to_owned(),
        offline: false,
    }
}

/// The contact's `text`, received from the offline queue at login.
fn queued(text: &str) -> Text {
    Text {
        offline: true,
        ..live(text)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contact_and_the_bot_write_to_each_other() {
    let server = StandIn::start().await.expect("stand-in starts");
    let (_backend, _jid, mut client) = link(&server).await;
    client.next("Connected", connected).await;

    // The contact's first message opens the Signal session: X3DH from the uploaded bundle.
    let first = server
        .send_text(CONTACT, PHONE, "hello bot")
        .await
        .expect("the contact writes");
    assert_eq!(client.texts(1).await, vec![live("hello bot")]);
    assert_eq!(server.enc_type(&first), Some("pkmsg"));
    until("the delivery receipt", || server.unacked(PHONE) == 0).await;

    // The bot answers: usync for the contact's devices, then the session the contact opened.
    let to: Jid = format!("{CONTACT}@s.whatsapp.net").parse().expect("a jid");
    tokio::time::timeout(DEADLINE, client.client().send_text(to, "hi contact"))
        .await
        .expect("the send does not stall")
        .expect("the client sends");
    until("the reply", || !server.replies().is_empty()).await;
    assert_eq!(
        server.replies(),
        vec![Reply {
            from_user: PHONE.to_owned(),
            to: CONTACT.to_owned(),
            text: "hi contact".to_owned(),
            media: None,
        }]
    );

    // Three in a row, on the established session.
    let mut ids = Vec::new();
    for text in ["one", "two", "three"] {
        ids.push(server.send_text(CONTACT, PHONE, text).await.expect("sent"));
    }
    assert_eq!(
        client.texts(3).await,
        vec![live("one"), live("two"), live("three")]
    );
    for id in &ids {
        assert_eq!(server.enc_type(id), Some("msg"), "message {id}");
    }
    until("every receipt", || server.unacked(PHONE) == 0).await;

    // The bot writes first to someone who never wrote: it fetches that contact's prekey
    // bundle and opens the session; the contact's answer continues it.
    let stranger = "15557770002";
    let to: Jid = format!("{stranger}@s.whatsapp.net").parse().expect("a jid");
    tokio::time::timeout(DEADLINE, client.client().send_text(to, "anyone there?"))
        .await
        .expect("the send does not stall")
        .expect("the client sends");
    until("the first word", || server.replies().len() == 2).await;
    assert_eq!(
        server.replies()[1],
        Reply {
            from_user: PHONE.to_owned(),
            to: stranger.to_owned(),
            text: "anyone there?".to_owned(),
            media: None,
        }
    );
    let answer = server
        .send_text(stranger, PHONE, "yes")
        .await
        .expect("sent");
    let got = client.texts(1).await;
    assert_eq!(got[0].sender, format!("{stranger}@s.whatsapp.net"));
    assert_eq!(got[0].text, "yes");
    assert_eq!(server.enc_type(&answer), Some("msg"));
    until("every receipt", || server.unacked(PHONE) == 0).await;
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sent_while_offline_arrives_at_the_next_login() {
    let server = StandIn::start().await.expect("stand-in starts");
    let hook = Gate::new(true);
    let (backend, jid, mut client) = link_with(&server, Some(hook.clone())).await;
    client.next("Connected", connected).await;
    client.shutdown().await;
    until("the disconnect", || server.connected(&jid) == 0).await;

    // Two before the device is back; without a reply the sender keeps the X3DH wrapping.
    let first = server
        .send_text(CONTACT, PHONE, "while you were out")
        .await
        .expect("queued");
    let second = server
        .send_text(CONTACT, PHONE, "and again")
        .await
        .expect("queued");
    assert_eq!(server.unacked(PHONE), 2);

    let mut again = Client::start_with(&server, backend, None, Some(hook.clone())).await;
    assert_eq!(
        again.texts(2).await,
        vec![queued("while you were out"), queued("and again")]
    );
    until("the receipts", || server.unacked(PHONE) == 0).await;
    assert_eq!(hook.given.load(Ordering::SeqCst), 2);
    assert_eq!(server.enc_type(&first), Some("pkmsg"));
    assert_eq!(server.enc_type(&second), Some("pkmsg"));
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_message_is_delivered_again_at_the_next_login() {
    let server = StandIn::start().await.expect("stand-in starts");
    // The hook never records: the client decrypts the message but must not acknowledge it.
    let refusing = Gate::new(false);
    let (backend, jid, mut client) = link_with(&server, Some(refusing.clone())).await;
    client.next("Connected", connected).await;

    server
        .send_text(CONTACT, PHONE, "keep me")
        .await
        .expect("sent");
    until("the hook sees it", || {
        refusing.given.load(Ordering::SeqCst) >= 1
    })
    .await;
    assert_eq!(server.unacked(PHONE), 1, "in flight, not acknowledged");
    client.shutdown().await;
    until("the disconnect", || server.connected(&jid) == 0).await;
    assert_eq!(server.unacked(PHONE), 1, "back in the queue");

    // The worker's successor (same store) records it: now it is acknowledged.
    let recording = Gate::new(true);
    let mut again = Client::start_with(&server, backend, None, Some(recording.clone())).await;
    // Redelivered from the queue: the same stanza (id, ciphertext), now marked offline.
    assert_eq!(again.texts(1).await, vec![queued("keep me")]);
    until("the receipt", || server.unacked(PHONE) == 0).await;
    assert_eq!(recording.given.load(Ordering::SeqCst), 1);
    again.shutdown().await;
}
