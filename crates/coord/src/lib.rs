#![doc = include_str!("../README.md")]

mod coordinator;
mod error;
mod keyspace;
mod lease;
mod link;
mod membership;
mod memory;
pub mod placement;
mod redis;
mod types;

pub use coordinator::Coordinator;

/// Journal entries the fleet keeps (the newest).
pub const JOURNAL_KEEP: usize = 5_000;
/// How long after a data loss's grace window turns still report
/// [`Turn::after_loss`] (at least; ten grace windows if longer): long enough for every entry
/// whose ticket was lost to be found again (the webhook sweeper replays entries older than two
/// leases, every lease).
pub const AFTER_LOSS_SETTLE: std::time::Duration = std::time::Duration::from_secs(30);
pub use error::{CoordError, Result};
pub use keyspace::{Group, KeySpace, MAX_GROUPS};
pub use lease::{LeaseHandle, LeaseKeeper, LeaseLost};
pub use link::RedisMode;
pub use membership::MemberWatch;
pub use memory::{MemoryCoordinator, MemoryHub, MemorySnapshot};
pub use redis::{RedisConfig, RedisCoordinator};
pub use types::{
    BucketTake, ClaimOutcome, EpochInfo, EventCursor, LifecycleEvent, LiveWorker, LockGuard,
    MemberEvent, Owner, Permit, RateGrant, RateLimit, Renewal, Turn, WorkerCommand, WorkerMeta,
};
