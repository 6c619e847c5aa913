#![doc = include_str!("../README.md")]

mod connector;
mod error;
mod files;
mod hooks;
mod limits;
mod session;

pub use connector::{
    unsupported, Ack, Batch, Connection, Connector, Identity, MayAct, Received, Receiver, Sender,
    Stat, StreamStep,
};
pub use error::{ErrorKind, PlatformError};
pub use files::{no_files, too_large, upload_body, upload_part, FileBody};
pub use hooks::{
    form_pairs, secrets_match, HookAnswer, HookRefusal, HookRequest, NoDeliveries, Webhooks,
};
pub use limits::{Bucket, Call, Limit};
pub use session::{KvWrite, SessionError, SessionKv};
