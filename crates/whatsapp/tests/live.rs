//! Opt-in: a device-link bot against the real WhatsApp, through the connector, when
//! `BOTFLEET_LIVE_WHATSAPP` names a registry (database URL) that holds a bot linked with
//! `botfleet bots link`. Without it the test says so and passes: nothing here can reach
//! WhatsApp in CI.
//!
//! ```sh
//! botfleet bots add live --platform whatsapp --mode web --database-url sqlite:///tmp/live.db
//! botfleet bots link live --database-url sqlite:///tmp/live.db      # scan with the phone
//! BOTFLEET_LIVE_WHATSAPP=sqlite:///tmp/live.db \
//! BOTFLEET_LIVE_WHATSAPP_TO=15551234567 BOTFLEET_LIVE_WHATSAPP_WAIT_S=120 \
//!   cargo test -p botfleet-whatsapp --features web --test live -- --nocapture
//! ```
//!
//! It connects the session (WhatsApp accepts it), sends a text to `BOTFLEET_LIVE_WHATSAPP_TO`
//! (default: the linked number itself, "Message yourself"), and with
//! `BOTFLEET_LIVE_WHATSAPP_WAIT_S` waits that long for a text written to the bot from another
//! phone and answers it with the same text.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{sync::Arc, time::Duration};

use botfleet_core::{BotId, ChatKey, Outbound};
use botfleet_platform::{Connector, SessionKv};
use botfleet_store::{Keyring, StoreSession};
use botfleet_whatsapp::{device, WhatsappConnector};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linked_number_connects_sends_and_answers() {
    let Ok(db) = std::env::var("BOTFLEET_LIVE_WHATSAPP") else {
        eprintln!("BOTFLEET_LIVE_WHATSAPP is not set: the live WhatsApp test did not run");
        return;
    };
    assert!(
        !device::skips_server_certificate(),
        "this build does not check WhatsApp's server certificate (it links the stand-in): run \
         `cargo test -p botfleet-whatsapp --features web --test live`"
    );
    let keys = match std::env::var("BOTFLEET_SECRET_KEY") {
        Ok(k) => Keyring::from_text(&k, "BOTFLEET_SECRET_KEY").unwrap(),
        Err(_) => Keyring::none(),
    };
    let store = botfleet_store::open_with(&db, keys).await.unwrap();
    let id =
        BotId::new(std::env::var("BOTFLEET_LIVE_WHATSAPP_BOT").unwrap_or_else(|_| "live".into()))
            .unwrap();
    let spec = store
        .get_bot(&id)
        .await
        .unwrap()
        .expect("the bot is registered")
        .spec;
    let fence = store.highest_fence(&id).await.unwrap();
    let kv: Arc<dyn SessionKv> = Arc::new(StoreSession::new(store.clone(), id.clone(), fence));
    let connector = WhatsappConnector::new().unwrap();
    let mut conn = connector
        .connect_with_session(&spec, None, Arc::new(|| true), kv.clone())
        .await
        .expect("WhatsApp accepted the linked session");
    eprintln!("connected {id}");

    let to = match std::env::var("BOTFLEET_LIVE_WHATSAPP_TO") {
        Ok(n) => format!("{n}@s.whatsapp.net"),
        Err(_) => {
            let device = kv.load("device").await.unwrap();
            let v: serde_json::Value = serde_json::from_slice(&device[0].1).unwrap();
            // The account itself, without the device: "Message yourself".
            let user = v["pn"]["user"].as_str().expect("a linked number");
            format!("{user}@s.whatsapp.net")
        }
    };
    let text = format!("botfleet live test {}", botfleet_core::unix_ms());
    conn.sender
        .send(&Outbound {
            chat: ChatKey::new(id.clone(), to.clone()),
            text: text.clone(),
            reply_to: None,
            idempotency_key: text.clone(),
        })
        .await
        .expect("WhatsApp took the message");
    eprintln!("sent {text:?} to {to}");

    let wait: u64 = std::env::var("BOTFLEET_LIVE_WHATSAPP_WAIT_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if wait > 0 {
        eprintln!("write to the linked number from another phone within {wait} s");
        let batch = tokio::time::timeout(Duration::from_secs(wait), conn.receiver.next())
            .await
            .expect("a message in time")
            .expect("a batch");
        let m = &batch.messages[0].message;
        eprintln!("received {:?} in {}", m.text, m.chat.chat);
        conn.receiver.ack(batch.ack).await.unwrap();
        conn.sender
            .send(&Outbound::reply_to(m, m.text.clone()))
            .await
            .expect("the reply went out");
    }
    conn.receiver.close().await;
}
