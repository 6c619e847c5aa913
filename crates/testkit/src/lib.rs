#![doc = include_str!("../README.md")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod cluster;
pub mod connector_suite;
pub mod coord_suite;
mod hooks;
mod link_proxy;
pub mod mutate;
mod partition;
mod pg;
mod process;
mod redis_server;
mod rng;
mod sentinel;
pub mod store_suite;
mod wait;
pub mod webhook_suite;

pub use botfleet_discord::fake::{
    FakeDiscord, FakeDiscordState, SendFault as DiscordSendFault, Sent as DiscordSent,
};
pub use botfleet_slack::fake::{
    FakeSlack, FakeSlackState, SendFault as SlackSendFault, Sent as SlackSent,
};
pub use botfleet_telegram::fake::{
    app as fake_telegram_app, DeliveryStats, Draft, Edited, FakeState, FakeTelegram, Fault,
    PollSpan, Sent,
};
pub use botfleet_whatsapp::fake::{
    FakeGraph, FakeGraphState, SendFault as WhatsappSendFault, Sent as WhatsappSent,
};
pub use cluster::{ClusterNode, RedisCluster};
pub use connector_suite::{PlatformFixture, Shown};
pub use coord_suite::CoordFixture;
pub use hooks::{serve_bytes, RecordingHandler, RoundRobinProxy, ScriptedHandler, StateHandler};
pub use link_proxy::{LinkMode, LinkProxy};
pub use partition::Partition;
pub use pg::PgSchema;
pub use process::{fleet_worker, log_tails, rss_kib, Proc};
pub use redis_server::{free_port, RedisServer};
pub use rng::SeededRng;
pub use sentinel::{SentinelSetup, SENTINEL_MASTER};
pub use store_suite::StoreFixture;
pub use wait::{wait_for, wait_for_or};

/// A fresh random nonce, 16 hex characters (unique names for temp files, schemas, prefixes).
pub fn nonce() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("entropy");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// How many journal entries the coordinator keeps (for the suite).
pub const JOURNAL_KEEP_FOR_TESTS: usize = botfleet_coord::JOURNAL_KEEP;

/// A directory under the system's temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    /// A fresh, empty directory named `{prefix}-{nonce}`.
    pub fn new(prefix: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", nonce()));
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        Self(dir)
    }
}

impl Drop for TempDir {
    /// Removes the directory, unless `BOTFLEET_KEEP_TEST_DIRS` is set (to read a failed
    /// drill's worker logs after it).
    fn drop(&mut self) {
        if std::env::var_os("BOTFLEET_KEEP_TEST_DIRS").is_some() {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A SQLite store in a fresh temp dir (removed when the `TempDir` drops).
pub async fn temp_sqlite(prefix: &str) -> (TempDir, std::sync::Arc<dyn botfleet_store::Store>) {
    let dir = TempDir::new(prefix);
    let s = botfleet_store::SqliteStore::open(dir.0.join("bots.db"))
        .await
        .expect("open a SQLite store");
    (dir, std::sync::Arc::new(s))
}
