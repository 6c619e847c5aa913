//! The Cloud API's fixed settings.

/// The Graph API's base, with the version.
pub const DEFAULT_API_URL: &str = "https://graph.facebook.com/v21.0";

/// The longest text body WhatsApp takes, in characters; longer replies are cut (and marked).
pub const MAX_TEXT_CHARS: usize = 4096;
