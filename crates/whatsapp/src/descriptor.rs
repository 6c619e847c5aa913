//! What WhatsApp is to the fleet: its modes, credentials, settings and rules.

use botfleet_core::{
    BotSpec, Descriptor, Endpoint, InvalidSpec, ModeSpec, Need, Platform, Setting,
};

/// WhatsApp: the Cloud API POSTing to the fleet (`cloud`, the default: an access token,
/// `app_secret` verifying deliveries, `verify_token` for the subscription handshake and the
/// sending number's `phone_number_id`), or a linked device (`web`: no token, the session a
/// phone linked stands for it; `api_url` is then WhatsApp Web's socket).
pub const DESCRIPTOR: Descriptor = Descriptor {
    platform: Platform::Whatsapp,
    title: "WhatsApp",
    modes: &[
        ModeSpec {
            name: "cloud",
            webhook: true,
            token: Need::Required,
            app_token: Need::Unused,
            verify_token: Need::Required,
            endpoint: Endpoint::Http,
            settings: &[(Setting::PhoneNumberId, Need::Required)],
            missing: None,
            caps: crate::outbound::CAPS,
        },
        ModeSpec {
            name: "web",
            webhook: false,
            token: Need::Optional,
            app_token: Need::Unused,
            verify_token: Need::Unused,
            endpoint: Endpoint::WebSocket,
            settings: &[],
            missing: if cfg!(feature = "web") {
                None
            } else {
                Some("cargo feature whatsapp-web of botfleet, web of botfleet-whatsapp")
            },
            caps: CAPS,
        },
    ],
    secret_field: Some("app_secret"),
    // A second WhatsApp Web session kicks the first.
    exclusive_session: true,
    connect_rate: 1_000.0,
    api_url: crate::DEFAULT_API_URL,
    check,
};

/// Whether `spec` is a device-link bot (a WhatsApp bot in mode `web`): one a phone links with
/// `bots link`, whose session stands for its token.
pub fn is_device_link(spec: &BotSpec) -> bool {
    spec.platform == Platform::Whatsapp && DESCRIPTOR.mode_name(spec) == "web"
}

fn check(spec: &BotSpec, _: &ModeSpec) -> Result<(), InvalidSpec> {
    match &spec.options.phone_number_id {
        Some(p) if p.is_empty() || p.len() > 64 || !p.chars().all(|c| c.is_ascii_digit()) => {
            Err(InvalidSpec::Hook {
                field: "phone_number_id",
                reason: "is required: the digits of the sending number's id",
            })
        }
        _ => Ok(()),
    }
}

/// What device-link bots do: text, files both ways (up to 10 a send, 16 MiB each, the text
/// as the first file's caption), and typing (the `composing` chat state). Buttons are the
/// Cloud API's.
const CAPS: botfleet_core::Caps = botfleet_core::Caps {
    typing: true,
    files: true,
    max_files: 10,
    max_file_bytes: 16 * 1024 * 1024,
    max_text: crate::MAX_TEXT_CHARS as u32,
    ..botfleet_core::Caps::TEXT_ONLY
};

#[cfg(test)]
mod tests {
    use super::*;
    use botfleet_core::{BotId, Secret};

    #[test]
    fn cloud_bots_need_their_number_and_secrets() {
        let mut s = BotSpec::new(BotId::new("wa").unwrap(), Platform::Whatsapp, "EAAG");
        let e = DESCRIPTOR.validate(&s).unwrap_err().to_string();
        assert!(e.contains("app_secret"), "{e}");
        s.hook.secret = Some(Secret::new("app-secret"));
        s.hook.verify_token = Some(Secret::new("v"));
        let e = DESCRIPTOR.validate(&s).unwrap_err().to_string();
        assert!(e.contains("phone_number_id"), "{e}");
        s.options.phone_number_id = Some("12ab".into());
        assert!(DESCRIPTOR.validate(&s).is_err());
        s.options.phone_number_id = Some("1234".into());
        DESCRIPTOR.validate(&s).unwrap();
        assert!(DESCRIPTOR.is_webhook(&s));
    }

    #[test]
    fn device_link_bots_need_no_token_and_take_a_socket_url() {
        let mut s = BotSpec::new(BotId::new("wa").unwrap(), Platform::Whatsapp, "");
        s.options.mode = Some("web".into());
        if cfg!(not(feature = "web")) {
            let e = DESCRIPTOR.validate(&s).unwrap_err().to_string();
            assert!(e.contains("not in this build"), "{e}");
            return;
        }
        DESCRIPTOR.validate(&s).unwrap();
        s.options.api_url = Some("ws://127.0.0.1:9/ws/chat".into());
        DESCRIPTOR.validate(&s).unwrap();
        s.options.api_url = Some("https://web.whatsapp.com".into());
        assert_eq!(
            DESCRIPTOR.validate(&s).unwrap_err().to_string(),
            "invalid api_url: must start with ws:// or wss://"
        );
        s.options.api_url = None;
        s.options.phone_number_id = Some("1".into());
        assert!(DESCRIPTOR.validate(&s).is_err(), "a Cloud API setting");
        // Every other bot still needs its token.
        s.options.mode = Some("cloud".into());
        assert!(DESCRIPTOR.validate(&s).is_err());
    }
}
