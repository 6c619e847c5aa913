#![doc = include_str!("../README.md")]

mod client;
mod config;
mod connector;
mod descriptor;
mod error;
#[cfg(feature = "fake")]
pub mod fake;
mod inbound;
mod outbound;
mod poll;

pub use client::{BotApi, BotUser, LongPoll, TelegramClient};
pub use config::{TelegramConfig, DEFAULT_API_URL};
pub use connector::{TelegramConnector, TelegramHooks};
pub use descriptor::DESCRIPTOR;
pub use error::TelegramError;
pub use inbound::{parse_update, split_updates, RawUpdate, Update};
pub use outbound::limits;
pub use outbound::{act, keyboard, send, CAPS, MAX_TEXT_CHARS};
