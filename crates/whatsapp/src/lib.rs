#![doc = include_str!("../README.md")]

mod client;
mod cloud;
#[cfg(feature = "fake")]
pub mod fake;

pub use client::{GraphClient, Number, WhatsappError, DEFAULT_API_URL, MAX_TEXT_CHARS};
pub use cloud::{parse_delivery, sign, CloudHooks, WhatsappConnector};
