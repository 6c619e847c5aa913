#![doc = include_str!("../README.md")]
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

pub mod connector_suite;
pub mod coord_suite;
mod partition;
mod pg;
mod redis_server;
mod rng;
pub mod store_suite;
mod wait;

pub use botfleet_discord::fake::{FakeDiscord, FakeDiscordState};
pub use botfleet_slack::fake::{FakeSlack, FakeSlackState, Post, PostFault};
pub use botfleet_telegram::fake::{app as fake_telegram_app, FakeState, FakeTelegram, Fault, Sent};
pub use connector_suite::PlatformFixture;
pub use coord_suite::CoordFixture;
pub use partition::Partition;
pub use pg::PgSchema;
pub use redis_server::{free_port, RedisServer};
pub use rng::SeededRng;
pub use store_suite::StoreFixture;
pub use wait::wait_for;

/// A fresh random nonce, 16 hex characters (unique names for temp files, schemas, prefixes).
pub fn nonce() -> String {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).expect("entropy");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// How many journal entries the coordinator keeps (for the suite).
pub const JOURNAL_KEEP_FOR_TESTS: usize = botfleet_coord::JOURNAL_KEEP;
