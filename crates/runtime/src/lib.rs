#![doc = include_str!("../README.md")]

mod bot;
mod chats;
// Driven by streamed answers' edits next (issue 39, step 2); tested as a unit meanwhile.
#[cfg_attr(not(test), allow(dead_code))]
mod coalesce;
mod config;
mod files;
mod handler;
mod hooks;
pub mod http;
mod journal;
mod later;
mod lock;
pub mod metrics;
mod pace;
mod platforms;
mod replies;
mod reply_token;
mod reporter;
mod retry;
mod sends;
mod starter;
mod turn;
mod worker;

pub use botfleet_store::StoreSession;
pub use config::{hostname, WorkerConfig};
pub use files::{Files, FILES_PATH, MAX_READ_BYTES};
pub use handler::{
    request as handler_request, request_in_turn as handler_request_in_turn, sign, AnswerStream,
    BotHandler, Echo, Handler, HandlerError, HandlerRegistry, LaterReply, Reply, TurnContext,
    Webhook, SIGNATURE_HEADER,
};
pub use hooks::{Hooks, MAX_HOOK_BODY};
pub use journal::{Journal, JournalEntry, JOURNAL_CAPACITY};
pub use lock::InstanceLock;
pub use metrics::Metrics;
pub use pace::RateLimits;
pub use platforms::{
    capability_table, descriptor, is_webhook, send_scopes, supported as supported_platforms,
    validate as validate_spec, SpecError, DESCRIPTORS,
};
pub use replies::{idempotency_key_fits, Posted, Replies, ReplyError, MAX_IDEMPOTENCY_KEY};
pub use sends::{SendError, SendStatus, Sends, Submitted};
pub use worker::{Worker, WorkerError};
