//! Domain types of botfleet, shared by every layer: identifiers, bot specs, platform-neutral
//! messages, secrets and clocks. This crate does no I/O and knows no async runtime.
//!
//! ```
//! use botfleet_core::{BotId, BotSpec, Platform};
//!
//! let spec = BotSpec::new(BotId::new("support-eu")?, "telegram".parse::<Platform>()?, "123:abc");
//! spec.validate()?;
//! assert_eq!(format!("{:?}", spec.token), "<redacted>");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod clock;
mod error;
mod ids;
mod message;
mod platform;
mod secret;
mod spec;

pub use clock::{Clock, ManualClock, SystemClock};
pub use error::{InvalidId, InvalidSpec, UnknownPlatform};
pub use ids::{BotId, ChatKey, Fence, Incarnation, WorkerId, MAX_ID_LEN};
pub use message::{Inbound, Outbound};
pub use platform::Platform;
pub use secret::Secret;
pub use spec::{BotOptions, BotRecord, BotSpec, BotStatus, HandlerSpec};

/// Milliseconds since the Unix epoch, from the wall clock; for timestamps shown to people,
/// never for leases.
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
