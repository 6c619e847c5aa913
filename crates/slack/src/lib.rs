#![doc = include_str!("../README.md")]

mod client;
mod config;
mod connector;
mod descriptor;
mod error;
mod events;
#[cfg(feature = "fake")]
pub mod fake;
mod inbound;
mod outbound;
mod socket;

pub use client::{AuthInfo, SlackApi, SlackClient};
pub use config::{SlackConfig, DEFAULT_API_URL};
pub use connector::SlackConnector;
pub use descriptor::DESCRIPTOR;
pub use error::SlackError;
pub use events::{sign, SlackEvents, MAX_SKEW_S};
pub use inbound::{parse_command, parse_event, parse_frame, parse_interactive, Event, Frame, Me};
pub use outbound::limits;
pub use outbound::{act, blocks, channel_and_thread, send, CAPS, MAX_TEXT_CHARS};
