//! The device-link session storage (`wacore`'s traits over the fleet's store) on every store
//! backend: every kind of record round-trips, the next owner reads the session whole, a
//! stale owner's write is refused and changes nothing.

#![cfg(feature = "web")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use botfleet_core::{BotId, BotSpec, Fence, Platform};
use botfleet_store::{Store, StoreSession};
use botfleet_whatsapp::web::FencedBackend;
use wacore::store::{
    traits::{
        AppStateSyncKey, AppSyncStore, DeviceInfo, DeviceListRecord, DeviceStore,
        LidPnMappingEntry, MsgSecretEntry, MsgSecretStore, ProtocolStore, SignalStore,
        TcTokenEntry,
    },
    Device,
};

async fn backend(store: &Arc<dyn Store>, fence: u64) -> FencedBackend {
    let bot = BotId::new("wa-web").unwrap();
    store.accept_fence(&bot, Fence(fence)).await.unwrap();
    FencedBackend::load(Arc::new(StoreSession::new(
        store.clone(),
        bot,
        Fence(fence),
    )))
    .await
    .unwrap()
}

async fn a_session_moves_whole_and_stale_writers_are_refused(store: Arc<dyn Store>) {
    store
        .add_bot(&BotSpec::new(
            BotId::new("wa-web").unwrap(),
            Platform::Whatsapp,
            "EAAG",
        ))
        .await
        .ok();
    // The first owner links and uses the session.
    let a = backend(&store, 3).await;
    let mut device = Device::new();
    device.push_name = "support".into();
    device.registration_id = 4242;
    a.save(&device).await.unwrap();
    a.put_identity("4917:1", [7; 32]).await.unwrap();
    a.put_session("4917:1", &[1, 2, 3]).await.unwrap();
    for id in 1..=3 {
        a.store_prekey(id, &[id as u8; 8], false).await.unwrap();
    }
    a.mark_prekeys_uploaded(&[1, 2]).await.unwrap();
    a.remove_prekey(3).await.unwrap();
    a.store_signed_prekey(1, &[9; 64]).await.unwrap();
    a.put_sender_key("g@g.us:4917", &[5; 10]).await.unwrap();
    for (id, ts) in [(&[1u8][..], 10), (&[2u8][..], 20)] {
        a.set_sync_key(
            id,
            AppStateSyncKey {
                key_data: vec![ts as u8],
                fingerprint: vec![],
                timestamp: ts,
            },
        )
        .await
        .unwrap();
    }
    let mut hs = a.get_version("regular").await.unwrap();
    hs.version = 7;
    a.set_version("regular", hs).await.unwrap();
    a.set_sender_key_status("g@g.us", &[("4917:1", true), ("4918:1", false)])
        .await
        .unwrap();
    a.put_lid_mapping(&LidPnMappingEntry {
        lid: "100".into(),
        phone_number: "4917".into(),
        created_at: 1,
        updated_at: 2,
        learning_source: "usync".into(),
    })
    .await
    .unwrap();
    a.save_base_key("4917:1", "m1", &[4; 4]).await.unwrap();
    a.update_device_list(DeviceListRecord {
        user: "4917".into(),
        devices: vec![DeviceInfo {
            device_id: 0,
            key_index: None,
            is_hosted: false,
        }],
        timestamp: 5,
        phash: None,
        raw_id: None,
    })
    .await
    .unwrap();
    a.put_tc_token(
        "4917@s.whatsapp.net",
        &TcTokenEntry {
            token: vec![1],
            token_timestamp: 100,
            sender_timestamp: None,
        },
    )
    .await
    .unwrap();
    a.store_sent_message("4917@s.whatsapp.net", "m2", b"payload")
        .await
        .unwrap();
    a.put_msg_secrets(vec![MsgSecretEntry {
        chat: "4917".into(),
        sender: "4917".into(),
        msg_id: "m3".into(),
        secret: [3; 32],
        expires_at: 0,
        message_ts: 0,
    }])
    .await
    .unwrap();
    // Message secrets merge on a second write: a window never shrinks, a known time stays.
    let entry = |id: &str, expires_at, message_ts| MsgSecretEntry {
        chat: "4917".into(),
        sender: "4917".into(),
        msg_id: id.into(),
        secret: [4; 32],
        expires_at,
        message_ts,
    };
    a.put_msg_secrets(vec![entry("m4", 500, 90)]).await.unwrap();
    a.put_msg_secrets(vec![entry("m4", 300, 0)]).await.unwrap();
    assert_eq!(
        a.get_msg_secret_with_ts("4917", "4917", "m4")
            .await
            .unwrap(),
        Some((vec![4; 32], 90))
    );
    assert_eq!(a.delete_expired_msg_secrets(499).await.unwrap(), 0);
    assert_eq!(
        a.delete_expired_msg_secrets(500).await.unwrap(),
        1,
        "at the deadline"
    );

    // The next owner (a higher fence) reads the session whole.
    let b = backend(&store, 4).await;
    let d = b.load().await.unwrap().expect("the device moved");
    assert_eq!((d.push_name.as_str(), d.registration_id), ("support", 4242));
    assert_eq!(d.identity_key.public_key, device.identity_key.public_key);
    assert!(b.exists().await.unwrap());
    assert_eq!(b.load_identity("4917:1").await.unwrap(), Some([7; 32]));
    assert_eq!(
        b.get_session("4917:1").await.unwrap().unwrap().as_ref(),
        [1, 2, 3]
    );
    assert_eq!(b.get_max_prekey_id().await.unwrap(), 2);
    assert_eq!(b.load_prekey(2).await.unwrap().unwrap().as_ref(), [2; 8]);
    assert!(b.load_prekey(3).await.unwrap().is_none());
    assert_eq!(
        b.load_all_signed_prekeys().await.unwrap(),
        [(1, vec![9; 64])]
    );
    assert_eq!(
        b.get_sender_key("g@g.us:4917").await.unwrap(),
        Some(vec![5; 10])
    );
    assert_eq!(b.get_latest_sync_key_id().await.unwrap(), Some(vec![2]));
    assert_eq!(b.get_version("regular").await.unwrap().version, 7);
    let mut devs = b.get_sender_key_devices("g@g.us").await.unwrap();
    devs.sort();
    assert_eq!(
        devs,
        [("4917:1".to_owned(), true), ("4918:1".to_owned(), false)]
    );
    assert_eq!(
        b.get_pn_mapping("4917").await.unwrap().map(|e| e.lid),
        Some("100".to_owned())
    );
    // A number that had more than one LID maps to the one learned last, whatever the order.
    let mapping = |lid: &str, updated_at| LidPnMappingEntry {
        lid: lid.into(),
        phone_number: "4930".into(),
        created_at: 1,
        updated_at,
        learning_source: "usync".into(),
    };
    b.put_lid_mappings(&[mapping("300", 9), mapping("050", 3), mapping("900", 5)])
        .await
        .unwrap();
    assert_eq!(
        b.get_pn_mapping("4930").await.unwrap().map(|e| e.lid),
        Some("300".to_owned())
    );
    assert_eq!(b.get_all_lid_mappings().await.unwrap().len(), 4);
    assert!(b.has_same_base_key("4917:1", "m1", &[4; 4]).await.unwrap());
    assert_eq!(b.get_devices("4917").await.unwrap().unwrap().timestamp, 5);
    assert_eq!(
        b.get_all_tc_token_jids().await.unwrap(),
        ["4917@s.whatsapp.net"]
    );
    assert_eq!(
        b.take_sent_message("4917@s.whatsapp.net", "m2")
            .await
            .unwrap(),
        Some(b"payload".to_vec())
    );
    assert_eq!(
        b.get_msg_secret("4917", "4917", "m3").await.unwrap(),
        Some(vec![3; 32])
    );

    // The client's batches are one write each.
    b.put_sessions_batch(&[
        ("4918:1".into(), bytes::Bytes::from_static(&[8])),
        ("4919:1".into(), bytes::Bytes::from_static(&[9])),
    ])
    .await
    .unwrap();
    b.put_identities_batch(&[("4918:1".into(), [8; 32])])
        .await
        .unwrap();
    // The old owner, stale, is refused and changes nothing, not even part of a batch.
    assert!(a.put_session("4917:1", b"corrupt").await.is_err());
    assert!(a.save(&Device::new()).await.is_err());
    assert!(a
        .put_sessions_batch(&[
            ("4917:1".into(), bytes::Bytes::from_static(b"corrupt")),
            ("4920:1".into(), bytes::Bytes::from_static(&[1])),
        ])
        .await
        .is_err());
    assert_eq!(a.refused_writes(), 3, "every refusal counted as stale");
    assert_eq!(b.refused_writes(), 0);
    let c = backend(&store, 5).await;
    assert_eq!(
        c.get_session("4917:1").await.unwrap().unwrap().as_ref(),
        [1, 2, 3]
    );
    assert_eq!(c.load().await.unwrap().unwrap().push_name, "support");
    assert_eq!(
        c.get_session("4919:1").await.unwrap().unwrap().as_ref(),
        [9]
    );
    assert!(c.get_session("4920:1").await.unwrap().is_none());
    assert_eq!(c.load_identity("4918:1").await.unwrap(), Some([8; 32]));
    assert_eq!(
        c.get_pn_mapping("4930").await.unwrap().map(|e| e.lid),
        Some("300".to_owned()),
        "the mappings batch moved whole"
    );
    // Two takes of one sent message at once: one gets it.
    c.store_sent_message("4917@s.whatsapp.net", "m5", b"again")
        .await
        .unwrap();
    let (x, y) = tokio::join!(
        c.take_sent_message("4917@s.whatsapp.net", "m5"),
        c.take_sent_message("4917@s.whatsapp.net", "m5")
    );
    assert_eq!(
        [x.unwrap(), y.unwrap()].iter().flatten().count(),
        1,
        "taken once"
    );
    // What the new owner took is gone for the next one too.
    assert!(c
        .take_sent_message("4917@s.whatsapp.net", "m2")
        .await
        .unwrap()
        .is_none());

    // A link takes a fence above every owner so far: the owner before it is refused, and so
    // is a link that began before it; what the link writes, the next claim reads.
    let bot = BotId::new("wa-web").unwrap();
    let first = StoreSession::above_all(store.clone(), bot.clone())
        .await
        .unwrap();
    assert!(first.fence() > Fence(5));
    let second = StoreSession::above_all(store.clone(), bot.clone())
        .await
        .unwrap();
    assert!(second.fence() > first.fence());
    assert!(
        c.put_session("4917:1", b"late").await.is_err(),
        "the owner before the links"
    );
    let early = FencedBackend::load(Arc::new(first)).await.unwrap();
    assert!(early.put_session("4917:1", b"early").await.is_err());
    assert_eq!(early.refused_writes(), 1);
    let linking = FencedBackend::load(Arc::new(second.clone())).await.unwrap();
    linking.put_session("4917:1", b"linked").await.unwrap();
    assert!(store.highest_fence(&bot).await.unwrap() >= second.fence());
    let next = backend(&store, second.fence().0 + 1).await;
    assert_eq!(
        next.get_session("4917:1").await.unwrap().unwrap().as_ref(),
        b"linked"
    );
}

#[tokio::test]
async fn on_memory() {
    a_session_moves_whole_and_stale_writers_are_refused(Arc::new(
        botfleet_store::MemoryStore::new(),
    ))
    .await;
}

#[tokio::test]
async fn on_sqlite() {
    let (_dir, store) = botfleet_testkit::temp_sqlite("botfleet-wa-web").await;
    a_session_moves_whole_and_stale_writers_are_refused(store).await;
}

#[tokio::test]
async fn on_postgres() {
    if std::env::var("BOTFLEET_TEST_POSTGRES_URL").is_err() {
        eprintln!("skipped: BOTFLEET_TEST_POSTGRES_URL is not set");
        return;
    }
    let schema = botfleet_testkit::PgSchema::create().await;
    let store = botfleet_store::open(&schema.url()).await.unwrap();
    a_session_moves_whole_and_stale_writers_are_refused(store).await;
}
