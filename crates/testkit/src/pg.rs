//! A throwaway Postgres schema per test, in the database `BOTFLEET_TEST_POSTGRES_URL` names.

/// A schema created for one test and dropped (on a helper thread) when this value drops.
#[derive(Debug)]
pub struct PgSchema {
    base: String,
    name: String,
}

impl PgSchema {
    /// Creates `botfleet_test_<nonce>` in the database of `BOTFLEET_TEST_POSTGRES_URL`.
    ///
    /// # Panics
    /// When the variable is unset or the server refuses: a test that asked for Postgres must
    /// not pass without it.
    pub async fn create() -> Self {
        let base = std::env::var("BOTFLEET_TEST_POSTGRES_URL").expect("BOTFLEET_TEST_POSTGRES_URL");
        let name = format!("botfleet_test_{}", crate::nonce());
        let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
            .await
            .expect("connect to BOTFLEET_TEST_POSTGRES_URL");
        let task = tokio::spawn(conn);
        client
            .batch_execute(&format!("CREATE SCHEMA {name}"))
            .await
            .expect("create schema");
        drop(client);
        let _ = task.await;
        Self { base, name }
    }

    /// The base URL with `search_path` set to this schema.
    pub fn url(&self) -> String {
        let sep = if self.base.contains('?') { '&' } else { '?' };
        format!("{}{sep}options=-csearch_path%3D{}", self.base, self.name)
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let base = self.base.clone();
        let name = self.name.clone();
        // Drop runs inside a runtime; do the async cleanup on a thread with its own.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                if let Ok((client, conn)) =
                    tokio_postgres::connect(&base, tokio_postgres::NoTls).await
                {
                    let task = tokio::spawn(conn);
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                        .await;
                    drop(client);
                    let _ = task.await;
                }
            });
        })
        .join();
    }
}
