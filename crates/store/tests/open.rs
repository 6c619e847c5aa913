//! Opening stores from URLs: clear errors for anything that cannot work.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use botfleet_store::{open, StoreError};

#[tokio::test]
async fn unknown_schemes_are_refused() {
    for url in ["mysql://x/y", "botfleet.db", "", "sqlite://"] {
        match open(url).await {
            Err(StoreError::InvalidUrl { reason }) => assert!(!reason.is_empty()),
            other => panic!("{url:?}: expected InvalidUrl, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_missing_directory_is_a_clear_error() {
    let e = open("sqlite:///nonexistent-dir-botfleet/x/bots.db")
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Open {
                backend: "sqlite",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("does not exist"), "{e}");
}

#[tokio::test]
async fn a_file_that_is_not_a_database_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("botfleet-open-{}", botfleet_testkit::nonce()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("garbage.db");
    std::fs::write(&path, vec![0x42u8; 8192]).unwrap();
    let e = open(&format!("sqlite://{}", path.display()))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Open { .. }), "{e:?}");
    assert!(
        e.to_string().contains("cannot open the sqlite database"),
        "{e}"
    );
    // A directory where the file should be.
    let e = open(&format!("sqlite://{}", dir.display()))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Open { .. }), "{e:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn an_unreachable_postgres_is_a_clear_error() {
    // Port 1 on loopback: nothing listens there.
    let e = open("postgres://botfleet:pw-secret@127.0.0.1:1/db?connect_timeout=2")
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Open {
                backend: "postgres",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(!e.to_string().contains("pw-secret"), "{e}");
    let e = open("postgres://[::bad").await.unwrap_err();
    assert!(
        matches!(e, StoreError::InvalidUrl { .. } | StoreError::Open { .. }),
        "{e:?}"
    );
}

#[tokio::test]
async fn two_processes_worth_of_handles_share_one_sqlite_file() {
    let dir = std::env::temp_dir().join(format!("botfleet-shared-{}", botfleet_testkit::nonce()));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("bots.db").display());
    let (a, b) = tokio::join!(open(&url), open(&url));
    let (a, b) = (a.unwrap(), b.unwrap());
    let id = botfleet_core::BotId::new("shared").unwrap();
    a.add_bot(&botfleet_core::BotSpec::new(
        id.clone(),
        botfleet_core::Platform::Telegram,
        "1:a",
    ))
    .await
    .unwrap();
    assert!(b.get_bot(&id).await.unwrap().is_some());
    // Migrations are not re-run on reopen.
    drop((a, b));
    let c = open(&url).await.unwrap();
    assert!(c.get_bot(&id).await.unwrap().is_some());
    std::fs::remove_dir_all(&dir).unwrap();
}
