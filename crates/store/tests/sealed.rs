//! Credentials at rest, on every store that keeps them at rest (SQLite, Postgres): sealed
//! when a key is given, unreadable without it, re-sealed in place under a new key without
//! touching what workers compare.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use botfleet_core::{BotId, BotSpec, HandlerSpec, Platform, Secret};
use botfleet_store::{Keyring, Store, StoreError};
use botfleet_testkit::nonce;

const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const K2: &str = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";

type Raw = Vec<(String, String, Option<String>, Option<String>)>;

trait Backend {
    async fn open(&self, keys: Arc<Keyring>) -> Arc<dyn Store>;
    /// id, token, app_token, webhook_secret as stored.
    async fn raw(&self) -> Raw;
}

fn ring(text: &str) -> Arc<Keyring> {
    Keyring::from_text(text, "test").unwrap()
}

fn specs() -> Vec<BotSpec> {
    let mut a = BotSpec::new(BotId::new("a").unwrap(), Platform::Telegram, "1:SECRET-A");
    a.handler = HandlerSpec::Webhook {
        url: "http://127.0.0.1:9/h".into(),
        secret: Some(Secret::new("hook-SECRET")),
    };
    let mut s = BotSpec::new(BotId::new("s").unwrap(), Platform::Slack, "xoxb-SECRET-S");
    s.app_token = Some(Secret::new("xapp-SECRET-S"));
    vec![a, s]
}

async fn sealed_at_rest(b: &impl Backend) {
    let k1 = b.open(ring(K1)).await;
    for spec in specs() {
        k1.add_bot(&spec).await.unwrap();
    }
    // A linked-device session's keys are sealed like credentials.
    let a = BotId::new("a").unwrap();
    k1.accept_fence(&a, botfleet_core::Fence(1)).await.unwrap();
    let session = botfleet_store::SessionWrite::Put {
        kind: "identity".into(),
        key: "self".into(),
        value: b"SECRET-KEYPAIR".to_vec(),
    };
    k1.session_write(&a, &[session], botfleet_core::Fence(1))
        .await
        .unwrap();
    let raw = b.raw().await;
    assert_eq!(raw.len(), 2);
    for (id, token, app, hook) in &raw {
        for v in std::iter::once(token).chain(app).chain(hook) {
            assert!(v.starts_with("enc1:") && !v.contains("SECRET"), "{id}: {v}");
        }
    }
    // Read back whole, through the key.
    let before = k1.list_bots(&Default::default()).await.unwrap();
    assert_eq!(
        before.iter().map(|r| r.spec.clone()).collect::<Vec<_>>(),
        specs()
    );
    // Without the key: a clear error, never a sealed value passed off as a token.
    let plain = b.open(Keyring::none()).await;
    let e = plain.get_bot(&BotId::new("a").unwrap()).await.unwrap_err();
    assert!(matches!(e, StoreError::Secrets(_)), "{e}");
    assert!(e.to_string().contains("--secret-key-file"), "{e}");
    // A legacy plain row, written without a key, is read by keyed stores too.
    let p = BotSpec::new(BotId::new("p").unwrap(), Platform::Telegram, "3:SECRET-P");
    plain.add_bot(&p).await.unwrap();
    assert_eq!(k1.get_bot(&p.id).await.unwrap().unwrap().spec, p);
    // Rotation: the new key first, the old one still opening.
    let both = b.open(ring(&format!("{K2}\n{K1}"))).await;
    assert_eq!(both.reseal_secrets().await.unwrap(), 3);
    assert_eq!(
        both.reseal_secrets().await.unwrap(),
        0,
        "nothing left to move"
    );
    let after = both.list_bots(&Default::default()).await.unwrap();
    for old in &before {
        let new = after.iter().find(|r| r.spec.id == old.spec.id).unwrap();
        assert_eq!(old.spec, new.spec);
        assert_eq!(
            old.updated_at_ms, new.updated_at_ms,
            "a re-seal is not a change workers restart for"
        );
    }
    let raw2 = b.raw().await;
    assert!(raw2.iter().all(|(_, t, _, _)| t.starts_with("enc1:")));
    assert_ne!(raw[0].1, raw2[0].1);
    // Only the new key now: everything opens. Only the old one: nothing does.
    let k2 = b.open(ring(K2)).await;
    assert_eq!(k2.list_bots(&Default::default()).await.unwrap().len(), 3);
    assert_eq!(
        k2.session_records(&a, "identity").await.unwrap(),
        [("self".to_owned(), b"SECRET-KEYPAIR".to_vec())],
        "the session was re-sealed too"
    );
    assert!(k1.session_records(&a, "identity").await.is_err());
    assert!(plain.session_records(&a, "identity").await.is_err());
    let e = k1.get_bot(&p.id).await.unwrap_err();
    assert!(e.to_string().contains("do not include"), "{e}");
}

struct Sqlite {
    dir: std::path::PathBuf,
    path: std::path::PathBuf,
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Backend for Sqlite {
    async fn open(&self, keys: Arc<Keyring>) -> Arc<dyn Store> {
        Arc::new(
            botfleet_store::SqliteStore::open(&self.path)
                .await
                .unwrap()
                .with_keyring(keys),
        )
    }

    async fn raw(&self) -> Raw {
        let c = rusqlite::Connection::open(&self.path).unwrap();
        let mut st = c
            .prepare("SELECT id, token, app_token, webhook_secret FROM bots ORDER BY id")
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }
}

#[tokio::test]
async fn sqlite_seals_credentials_at_rest() {
    let dir = std::env::temp_dir().join(format!("botfleet-sealed-{}", nonce()));
    std::fs::create_dir_all(&dir).unwrap();
    let b = Sqlite {
        path: dir.join("bots.db"),
        dir,
    };
    sealed_at_rest(&b).await;
    // The file itself holds no credential.
    for entry in std::fs::read_dir(&b.dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(!bytes.windows(6).any(|w| w == b"SECRET"));
    }
}

struct Postgres {
    schema: botfleet_testkit::PgSchema,
}

impl Backend for Postgres {
    async fn open(&self, keys: Arc<Keyring>) -> Arc<dyn Store> {
        Arc::new(
            botfleet_store::PostgresStore::open(&self.schema.url())
                .await
                .unwrap()
                .with_keyring(keys),
        )
    }

    async fn raw(&self) -> Raw {
        let (client, conn) = tokio_postgres::connect(&self.schema.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        let task = tokio::spawn(conn);
        let rows = client
            .query(
                "SELECT id, token, app_token, webhook_secret FROM bots ORDER BY id",
                &[],
            )
            .await
            .unwrap();
        drop(client);
        let _ = task.await;
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    }
}

#[tokio::test]
async fn postgres_seals_credentials_at_rest() {
    if std::env::var("BOTFLEET_TEST_POSTGRES_URL").is_err() {
        eprintln!("skipped: BOTFLEET_TEST_POSTGRES_URL is not set");
        return;
    }
    let b = Postgres {
        schema: botfleet_testkit::PgSchema::create().await,
    };
    sealed_at_rest(&b).await;
}
