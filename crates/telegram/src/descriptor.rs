//! What Telegram is to the fleet: its modes, credentials, settings and rules.

use botfleet_core::{
    BotSpec, Descriptor, Endpoint, InvalidSpec, ModeSpec, Need, Platform, Secret, Setting,
};

/// Telegram: long polling (`poll`, the default) or updates POSTed to the fleet (`webhook`,
/// verified by `secret_token`, with `max_connections` for `setWebhook`).
pub const DESCRIPTOR: Descriptor = Descriptor {
    platform: Platform::Telegram,
    title: "Telegram",
    modes: &[
        ModeSpec {
            name: "poll",
            webhook: false,
            token: Need::Required,
            app_token: Need::Unused,
            verify_token: Need::Unused,
            endpoint: Endpoint::Http,
            settings: &[],
            missing: None,
            caps: crate::CAPS,
        },
        ModeSpec {
            name: "webhook",
            webhook: true,
            token: Need::Required,
            app_token: Need::Unused,
            verify_token: Need::Unused,
            endpoint: Endpoint::Http,
            settings: &[(Setting::MaxConnections, Need::Optional)],
            missing: None,
            caps: crate::CAPS,
        },
    ],
    secret_field: Some("secret_token"),
    exclusive_session: true,
    // Telegram's limits are per token: the fleet's limiter must not be what makes a
    // failover slow.
    connect_rate: 10_000.0,
    api_url: crate::DEFAULT_API_URL,
    check,
};

fn check(spec: &BotSpec, _: &ModeSpec) -> Result<(), InvalidSpec> {
    if spec.token.expose().contains('/') {
        // The token becomes a path segment: `/bot{token}/getMe`.
        return Err(InvalidSpec::Token("contains '/'"));
    }
    if let Some(n) = spec.options.max_connections {
        if !(1..=100).contains(&n) {
            return Err(InvalidSpec::Hook {
                field: "max_connections",
                reason: "must be between 1 and 100",
            });
        }
    }
    let ok = |s: &Secret| {
        s.expose()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    if spec.hook.secret.as_ref().is_some_and(|s| !ok(s)) {
        return Err(InvalidSpec::Hook {
            field: "secret_token",
            reason: "may hold only A-Z, a-z, 0-9, _ and - (Telegram's rule)",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use botfleet_core::BotId;

    fn spec(token: &str) -> BotSpec {
        BotSpec::new(BotId::new("b1").unwrap(), Platform::Telegram, token)
    }

    #[test]
    fn tokens_and_webhook_settings_follow_telegrams_rules() {
        DESCRIPTOR.validate(&spec("123:abc")).unwrap();
        let e = DESCRIPTOR.validate(&spec("")).unwrap_err();
        assert_eq!(e.to_string(), "invalid token: is empty");
        let e = DESCRIPTOR.validate(&spec("12 3:secret-part")).unwrap_err();
        assert!(!e.to_string().contains("secret-part"));
        assert!(DESCRIPTOR.validate(&spec("12/3")).is_err());
        let mut s = spec("1:a");
        s.options.mode = Some("webhook".into());
        let e = DESCRIPTOR.validate(&s).unwrap_err().to_string();
        assert!(e.contains("secret_token") && e.contains("required"), "{e}");
        s.hook.secret = Some(Secret::new("has.dot"));
        let e = DESCRIPTOR.validate(&s).unwrap_err().to_string();
        assert!(
            e.contains("Telegram's rule") && !e.contains("has.dot"),
            "{e}"
        );
        s.hook.secret = Some(Secret::new("ok_token-1"));
        s.options.max_connections = Some(101);
        assert!(DESCRIPTOR.validate(&s).is_err());
        s.options.max_connections = Some(100);
        DESCRIPTOR.validate(&s).unwrap();
        assert!(DESCRIPTOR.is_webhook(&s));
        s.options.api_url = Some("ftp://x".into());
        assert_eq!(
            DESCRIPTOR.validate(&s).unwrap_err().to_string(),
            "invalid api_url: must start with http:// or https://"
        );
        s.options.api_url = None;
        s.options.shards = Some(2);
        assert!(
            DESCRIPTOR.validate(&s).is_err(),
            "only Discord bots have shards"
        );
    }
}
