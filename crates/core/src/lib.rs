#![doc = include_str!("../README.md")]

mod action;
mod attachment;
mod clock;
mod command_spec;
mod descriptor;
mod error;
mod ids;
mod message;
mod platform;
mod secret;
mod spec;

pub use action::{fit_text, Act, Action, ActionEvent, Button, Caps, Target};
pub use attachment::{Attachment, AttachmentKind, OutFile, Upload};
pub use clock::{Clock, ManualClock, SystemClock};
pub use command_spec::{
    check_commands, commands_digest, CommandOption, CommandSpec, OptionKind, MAX_COMMANDS,
};
pub use descriptor::{Descriptor, Endpoint, ModeSpec, Need, Setting};
pub use error::{InvalidId, InvalidSpec, UnknownPlatform};
pub use ids::{BotId, ChatKey, Fence, Incarnation, WorkerId, MAX_ID_LEN};
pub use message::{Command, EventKind, Inbound, Outbound};
pub use platform::Platform;
pub use secret::Secret;
pub use spec::{
    BotOptions, BotRecord, BotSpec, BotStatus, HandlerSpec, HookSecrets, StreamMode,
    ASYNC_REPLY_TTL_S, MAX_HANDLER_TIMEOUT_S,
};

/// Milliseconds since the Unix epoch, from the wall clock; for timestamps shown to people,
/// never for leases.
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
