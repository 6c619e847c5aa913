#![doc = include_str!("../README.md")]

mod connector;
mod error;

pub use connector::{Ack, Batch, Connection, Connector, Identity, Received, Receiver, Sender};
pub use error::{ErrorKind, PlatformError};
