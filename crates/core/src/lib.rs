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

pub use action::{fit_text, Act, Action, ActionEvent, Button, Caps, Target, OUTSIDE_WINDOW};
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

/// The UTC calendar date and time of unix `ms`, in the proleptic Gregorian calendar:
/// `(year, month, day, hour, minute, second, millisecond)`.
pub fn utc_of_unix_ms(ms: i64) -> (i64, i64, i64, i64, i64, i64, i64) {
    let (days, rest) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Days since 1970-01-01 to a civil date (H. Hinnant's `civil_from_days`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1_000 % 60,
        rest % 1_000,
    )
}
