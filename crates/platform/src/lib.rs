#![doc = include_str!("../README.md")]

mod connector;
mod error;

pub use connector::{
    Ack, Batch, Connection, Connector, Identity, MayAct, Received, Receiver, Sender, Stat,
};
pub use error::{ErrorKind, PlatformError};
