#![doc = include_str!("../README.md")]

mod client;
mod config;
mod connector;
mod descriptor;
#[cfg(feature = "web")]
pub mod device;
mod error;
#[cfg(feature = "fake")]
pub mod fake;
mod inbound;
mod outbound;
#[cfg(feature = "web")]
pub mod web;
#[cfg(feature = "web")]
mod web_media;

pub use client::{GraphClient, Number};
pub use config::{DEFAULT_API_URL, MAX_TEXT_CHARS};
pub use connector::{CloudHooks, WhatsappConnector};
pub use descriptor::{is_device_link, DESCRIPTOR};
pub use error::{WhatsappError, OUTSIDE_WINDOW};
pub use inbound::{parse_delivery, sign, Delivery};
pub use outbound::limits;
