//! Fleet coordination for botfleet.
//!
//! Workers agree through a [`Coordinator`] on who is live ([`LeaseKeeper`],
//! [`MemberWatch`]), who runs which bot (fenced claims), what changed (lifecycle events), what
//! one worker must do (commands), how fast the fleet may connect (a shared rate limiter), and
//! who leads singleton jobs (fenced locks). Two backends implement it: [`MemoryHub`] for one
//! process (the embedded default and the test double) and [`RedisCoordinator`] for a fleet.
//! [`placement`] says which worker *should* run a bot; a claim decides who *does*.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use botfleet_coord::{ClaimOutcome, Coordinator, MemoryHub, WorkerMeta};
//! use botfleet_core::{BotId, Fence, WorkerId};
//!
//! let hub = MemoryHub::new();
//! let (a, b) = (hub.coordinator(), hub.coordinator());
//! let meta = WorkerMeta { host: "h".into(), capacity: 100, started_at_ms: 0, bots_held: 0 };
//! a.register(&WorkerId::new("a")?, &meta, Duration::from_secs(10)).await?;
//! b.register(&WorkerId::new("b")?, &meta, Duration::from_secs(10)).await?;
//! let bot = BotId::new("support-bot")?;
//! assert!(matches!(a.claim(&bot, Fence::ZERO).await?, ClaimOutcome::Granted(_)));
//! assert!(matches!(b.claim(&bot, Fence::ZERO).await?, ClaimOutcome::Held(_)));
//! # Ok(()) }
//! ```

mod coordinator;
mod error;
mod keyspace;
mod lease;
mod membership;
mod memory;
pub mod placement;
mod redis;
mod types;

pub use coordinator::Coordinator;
pub use error::{CoordError, Result};
pub use keyspace::KeySpace;
pub use lease::{LeaseHandle, LeaseKeeper, LeaseLost};
pub use membership::MemberWatch;
pub use memory::{MemoryCoordinator, MemoryHub};
pub use redis::{RedisConfig, RedisCoordinator};
pub use types::{
    ClaimOutcome, EventCursor, LifecycleEvent, LiveWorker, LockGuard, MemberEvent, Owner, Permit,
    RateLimit, Renewal, WorkerCommand, WorkerMeta,
};
