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
pub use error::{CoordError, Result};
pub use keyspace::KeySpace;
pub use lease::{LeaseHandle, LeaseKeeper, LeaseLost};
pub use link::RedisMode;
pub use membership::MemberWatch;
pub use memory::{MemoryCoordinator, MemoryHub, MemorySnapshot};
pub use redis::{RedisConfig, RedisCoordinator};
pub use types::{
    ClaimOutcome, EpochInfo, EventCursor, LifecycleEvent, LiveWorker, LockGuard, MemberEvent,
    Owner, Permit, RateGrant, RateLimit, Renewal, Turn, WorkerCommand, WorkerMeta,
};
