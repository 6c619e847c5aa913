#![doc = include_str!("../README.md")]

mod client;
mod cloud;
mod descriptor;
#[cfg(feature = "web")]
pub mod device;
#[cfg(feature = "fake")]
pub mod fake;
#[cfg(feature = "web")]
pub mod web;

pub use client::{GraphClient, Number, WhatsappError, DEFAULT_API_URL, MAX_TEXT_CHARS};
pub use cloud::{parse_delivery, sign, CloudHooks, WhatsappConnector};
pub use descriptor::{is_device_link, DESCRIPTOR};
