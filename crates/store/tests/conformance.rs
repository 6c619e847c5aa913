//! Every store backend runs the one conformance suite from `botfleet-testkit`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{path::PathBuf, sync::Arc};

use botfleet_store::{MemoryStore, PostgresStore, SqliteStore, Store};
use botfleet_testkit::{nonce, StoreFixture};

/// Fresh in-memory stores.
struct Memory;

impl StoreFixture for Memory {
    async fn store(&self) -> Arc<dyn Store> {
        Arc::new(MemoryStore::new())
    }
}

/// Fresh SQLite files in a temp directory removed on drop.
struct Sqlite {
    dir: PathBuf,
}

impl Sqlite {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("botfleet-sqlite-{}", nonce()));
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }
}

impl Drop for Sqlite {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl StoreFixture for Sqlite {
    async fn store(&self) -> Arc<dyn Store> {
        let path = self.dir.join(format!("{}.db", nonce()));
        Arc::new(SqliteStore::open(path).await.unwrap())
    }
}

mod sqlite {
    use super::*;
    botfleet_testkit::store_conformance!(Some(Sqlite::new()));
}

mod memory {
    use super::*;
    botfleet_testkit::store_conformance!(Some(Memory));
}

mod postgres {
    use super::*;
    use botfleet_testkit::PgSchema;

    /// Each store gets its own schema in the database named by `BOTFLEET_TEST_POSTGRES_URL`;
    /// the suite is skipped (with a note) when the variable is unset.
    struct Postgres {
        schemas: std::sync::Mutex<Vec<PgSchema>>,
    }

    fn fixture() -> Option<Postgres> {
        if std::env::var("BOTFLEET_TEST_POSTGRES_URL").is_err() {
            eprintln!("skipped: BOTFLEET_TEST_POSTGRES_URL is not set");
            return None;
        }
        Some(Postgres {
            schemas: std::sync::Mutex::new(Vec::new()),
        })
    }

    impl StoreFixture for Postgres {
        async fn store(&self) -> Arc<dyn Store> {
            let schema = PgSchema::create().await;
            let store = PostgresStore::open(&schema.url()).await.unwrap();
            self.schemas.lock().unwrap().push(schema);
            Arc::new(store)
        }
    }

    botfleet_testkit::store_conformance!(fixture());
}
