//! What Slack is to the fleet: its modes, credentials, settings and rules.

use botfleet_core::{BotSpec, Descriptor, Endpoint, InvalidSpec, ModeSpec, Need, Platform};

/// Slack: Socket Mode (`socket`, the default, with the app-level token `xapp-…`) or the
/// Events API POSTing to the fleet (`events`, verified by `signing_secret`).
pub const DESCRIPTOR: Descriptor = Descriptor {
    platform: Platform::Slack,
    title: "Slack",
    modes: &[
        ModeSpec {
            name: "socket",
            webhook: false,
            token: Need::Required,
            app_token: Need::Required,
            verify_token: Need::Unused,
            endpoint: Endpoint::Http,
            settings: &[],
            missing: None,
            caps: crate::CAPS,
        },
        ModeSpec {
            name: "events",
            webhook: true,
            token: Need::Required,
            app_token: Need::Optional,
            verify_token: Need::Unused,
            endpoint: Endpoint::Http,
            settings: &[],
            missing: None,
            caps: crate::CAPS,
        },
    ],
    secret_field: Some("signing_secret"),
    // Socket Mode allows several connections per app.
    exclusive_session: false,
    // Connections are limited per app.
    connect_rate: 1_000.0,
    api_url: crate::DEFAULT_API_URL,
    check,
};

fn check(spec: &BotSpec, mode: &ModeSpec) -> Result<(), InvalidSpec> {
    if !spec.token.expose().starts_with("xoxb-") {
        return Err(InvalidSpec::Token("must be a Slack bot token (xoxb-…)"));
    }
    match &spec.app_token {
        None if mode.app_token == Need::Required => Err(InvalidSpec::AppToken(
            "is required for Slack Socket Mode (xapp-…)",
        )),
        Some(a) if !a.expose().starts_with("xapp-") => Err(InvalidSpec::AppToken(
            "must be a Slack app-level token (xapp-…)",
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use botfleet_core::{BotId, Secret};

    #[test]
    fn socket_mode_needs_both_tokens_and_events_a_signing_secret() {
        let mut s = BotSpec::new(BotId::new("s").unwrap(), Platform::Slack, "xoxp-1");
        let e = DESCRIPTOR.validate(&s).unwrap_err().to_string();
        assert!(e.contains("app_token"), "{e}");
        s.app_token = Some(Secret::new("xapp-1"));
        let e = DESCRIPTOR.validate(&s).unwrap_err().to_string();
        assert_eq!(e, "invalid token: must be a Slack bot token (xoxb-…)");
        s.token = Secret::new("xoxb-1");
        DESCRIPTOR.validate(&s).unwrap();
        s.app_token = Some(Secret::new("xoxb-2"));
        assert!(DESCRIPTOR.validate(&s).is_err());
        s.app_token = None;
        s.options.mode = Some("events".into());
        let e = DESCRIPTOR.validate(&s).unwrap_err().to_string();
        assert!(e.contains("signing_secret"), "{e}");
        s.hook.secret = Some(Secret::new("sig"));
        DESCRIPTOR.validate(&s).unwrap();
        assert!(DESCRIPTOR.is_webhook(&s));
    }
}
