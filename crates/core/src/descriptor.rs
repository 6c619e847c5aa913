//! What a platform is, in one value: its receive modes, the credentials and settings each
//! mode takes, its rules for them, and its defaults. Each platform crate exports one
//! [`Descriptor`] (`botfleet_telegram::DESCRIPTOR`, …); the runtime keeps the list of the
//! descriptors a build runs, and the registry, the CLI and the workers read it instead of
//! knowing platforms by name.

use crate::{error::InvalidSpec, BotSpec, Platform, Secret};

/// Whether a mode takes a credential or a setting.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Need {
    /// The mode has no use for it; giving one is an error.
    Unused,
    /// It may be given.
    Optional,
    /// The mode cannot run without it.
    Required,
}

impl Need {
    /// Whether it may be given at all.
    pub fn taken(self) -> bool {
        self != Need::Unused
    }
}

/// What a bot's `api_url` points at.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Endpoint {
    /// An `http://` or `https://` API base.
    Http,
    /// A `ws://` or `wss://` socket (WhatsApp Web).
    WebSocket,
}

/// A per-bot setting that only some platforms and modes take.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Setting {
    /// `shards`: a fixed shard count (Discord).
    Shards,
    /// `shards_per_slice`: the bot split into slices placed apart (Discord).
    ShardsPerSlice,
    /// `max_connections`: connections the platform may open to the hooks address (Telegram).
    MaxConnections,
    /// `phone_number_id`: the number replies are sent from (WhatsApp Cloud API).
    PhoneNumberId,
}

impl Setting {
    /// Every setting, in a fixed order.
    pub const ALL: [Setting; 4] = [
        Setting::Shards,
        Setting::ShardsPerSlice,
        Setting::MaxConnections,
        Setting::PhoneNumberId,
    ];

    /// Its name in flags (with dashes), import lines and API bodies.
    pub fn name(self) -> &'static str {
        match self {
            Setting::Shards => "shards",
            Setting::ShardsPerSlice => "shards_per_slice",
            Setting::MaxConnections => "max_connections",
            Setting::PhoneNumberId => "phone_number_id",
        }
    }

    /// Whether `spec` sets it.
    pub fn is_set(self, spec: &BotSpec) -> bool {
        let o = &spec.options;
        match self {
            Setting::Shards => o.shards.is_some(),
            Setting::ShardsPerSlice => o.shards_per_slice.is_some(),
            Setting::MaxConnections => o.max_connections.is_some(),
            Setting::PhoneNumberId => o.phone_number_id.is_some(),
        }
    }

    /// Unsets it in `spec`.
    pub fn clear(self, spec: &mut BotSpec) {
        let o = &mut spec.options;
        match self {
            Setting::Shards => o.shards = None,
            Setting::ShardsPerSlice => o.shards_per_slice = None,
            Setting::MaxConnections => o.max_connections = None,
            Setting::PhoneNumberId => o.phone_number_id = None,
        }
    }
}

/// One way a platform's bots receive.
#[derive(Debug)]
pub struct ModeSpec {
    /// Its name in `--mode`, import lines and the API (`poll`, `webhook`, …).
    pub name: &'static str,
    /// Whether the platform POSTs the bot's updates to the fleet's hooks address, where every
    /// worker takes them (no connection is held); the webhook secret is then required.
    pub webhook: bool,
    /// The platform credential (`token`).
    pub token: Need,
    /// A second credential (`app_token`, Slack's `xapp-…`).
    pub app_token: Need,
    /// The subscription handshake's verify token (`verify_token`, WhatsApp Cloud API).
    pub verify_token: Need,
    /// What `api_url` points at.
    pub endpoint: Endpoint,
    /// The settings besides the common ones, and whether each is required.
    pub settings: &'static [(Setting, Need)],
    /// `None` when this build runs the mode; otherwise why not (which cargo feature adds it).
    pub missing: Option<&'static str>,
    /// What a handler's actions can do in this mode.
    pub caps: crate::Caps,
}

impl ModeSpec {
    /// Whether the mode takes `s`, and how.
    pub fn setting(&self, s: Setting) -> Need {
        self.settings
            .iter()
            .find(|(x, _)| *x == s)
            .map_or(Need::Unused, |(_, n)| *n)
    }
}

/// What a platform is. Each platform crate exports one as `DESCRIPTOR`.
#[derive(Debug)]
pub struct Descriptor {
    /// The platform's name.
    pub platform: Platform,
    /// Its name as people write it (`Telegram`, `WhatsApp`).
    pub title: &'static str,
    /// Its receive modes; the first is the default.
    pub modes: &'static [ModeSpec],
    /// The name of the webhook verification secret in flags, import lines and the API
    /// (`secret_token`, `signing_secret`, `app_secret`); `None` when no mode is a webhook.
    pub secret_field: Option<&'static str>,
    /// Whether the platform tolerates only one live connection per token (Telegram answers a
    /// second poller with 409; a second WhatsApp Web session kicks the first).
    pub exclusive_session: bool,
    /// Fleet-wide bot starts per second by default. The platforms' own limits are per bot,
    /// not per fleet; this keeps a cold start of a whole fleet from stampeding the store.
    pub connect_rate: f64,
    /// The public endpoint used when a bot sets no `api_url`.
    pub api_url: &'static str,
    /// The platform's own rules for credentials and settings (token shapes, character sets),
    /// run after the checks every platform shares. Errors name the field, never its value.
    pub check: fn(&BotSpec, &ModeSpec) -> Result<(), InvalidSpec>,
}

impl Descriptor {
    /// The default mode.
    pub fn default_mode(&self) -> &'static ModeSpec {
        &self.modes[0]
    }

    /// The mode `spec` asks for (its platform's default when unset), if the platform has it.
    pub fn mode_of(&self, spec: &BotSpec) -> Option<&'static ModeSpec> {
        match &spec.options.mode {
            None => Some(self.default_mode()),
            Some(m) => self.modes.iter().find(|x| x.name == m),
        }
    }

    /// Whether `spec`'s mode is a webhook mode (see [`ModeSpec::webhook`]).
    pub fn is_webhook(&self, spec: &BotSpec) -> bool {
        self.mode_of(spec).is_some_and(|m| m.webhook)
    }

    /// The name of `spec`'s mode as shown (`?` for one the platform lacks).
    pub fn mode_name(&self, spec: &BotSpec) -> &'static str {
        self.mode_of(spec).map_or("?", |m| m.name)
    }

    /// Checks `spec` against this platform: the mode, which credentials and settings it takes,
    /// the rules every platform shares ([`BotSpec::validate_shared`]) and the platform's own.
    ///
    /// # Errors
    /// [`InvalidSpec`] names the field at fault and why, never its value.
    pub fn validate(&self, spec: &BotSpec) -> Result<(), InvalidSpec> {
        if spec.platform != self.platform {
            return Err(InvalidSpec::Mode(format!(
                "a {} bot checked as {}",
                spec.platform, self.platform
            )));
        }
        let Some(mode) = self.mode_of(spec) else {
            let names: Vec<&str> = self.modes.iter().map(|m| m.name).collect();
            return Err(InvalidSpec::Mode(format!(
                "{} bots take mode {}",
                self.platform,
                names.join(" or ")
            )));
        };
        if let Some(why) = mode.missing {
            return Err(InvalidSpec::Mode(format!(
                "{} mode {} is not in this build ({why})",
                self.platform, mode.name
            )));
        }
        spec.validate_shared()?;
        let secret = spec.hook.secret.as_ref();
        let secret_field = self.secret_field.unwrap_or("secret");
        match mode.token {
            Need::Required if spec.token.expose().is_empty() => {
                return Err(InvalidSpec::Token("is empty"))
            }
            _ => {}
        }
        match (mode.app_token, &spec.app_token) {
            (Need::Required, None) => {
                return Err(InvalidSpec::AppToken("is required in this mode"))
            }
            (Need::Unused, Some(_)) => {
                return Err(self.not_a_setting("app_token", mode));
            }
            _ => {}
        }
        if let Some(s) = secret {
            check_secret(secret_field, s)?;
            if !mode.webhook {
                return Err(self.not_a_setting(secret_field, mode));
            }
        } else if mode.webhook {
            return Err(InvalidSpec::Hook {
                field: secret_field,
                reason: "is required: every delivery is verified with it",
            });
        }
        match (mode.verify_token, &spec.hook.verify_token) {
            (Need::Required, None) => {
                return Err(InvalidSpec::Hook {
                    field: "verify_token",
                    reason: "is required in this mode",
                })
            }
            (Need::Unused, Some(_)) => return Err(self.not_a_setting("verify_token", mode)),
            (_, Some(v)) => check_secret("verify_token", v)?,
            _ => {}
        }
        if !spec.options.commands.is_empty() && !mode.caps.commands {
            return Err(self.not_a_setting("commands", mode));
        }
        if let Some(url) = &spec.options.api_url {
            match mode.endpoint {
                Endpoint::Http => crate::spec::check_http_url("api_url", url)?,
                Endpoint::WebSocket => crate::spec::check_ws_url("api_url", url)?,
            }
        }
        for s in Setting::ALL {
            match (mode.setting(s), s.is_set(spec)) {
                (Need::Unused, true) => return Err(self.not_a_setting(s.name(), mode)),
                (Need::Required, false) => {
                    return Err(InvalidSpec::Hook {
                        field: s.name(),
                        reason: "is required in this mode",
                    })
                }
                _ => {}
            }
        }
        (self.check)(spec, mode)
    }

    fn not_a_setting(&self, field: &'static str, mode: &ModeSpec) -> InvalidSpec {
        InvalidSpec::NotASetting {
            field,
            platform: self.platform,
            mode: mode.name,
        }
    }

    /// Every field name any mode of this platform takes besides the common ones.
    pub fn fields(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut add = |f: &'static str| {
            if !out.contains(&f) {
                out.push(f);
            }
        };
        for m in self.modes {
            if m.app_token.taken() {
                add("app_token");
            }
            if m.verify_token.taken() {
                add("verify_token");
            }
            if m.webhook {
                if let Some(s) = self.secret_field {
                    add(s);
                }
            }
            for (s, n) in m.settings {
                if n.taken() {
                    add(s.name());
                }
            }
        }
        out
    }
}

/// A webhook secret or verify token: 1-256 bytes without white space.
fn check_secret(field: &'static str, s: &Secret) -> Result<(), InvalidSpec> {
    let s = s.expose();
    if s.is_empty() || s.len() > 256 || s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(InvalidSpec::Hook {
            field,
            reason: "must be 1-256 bytes without white space",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BotId;

    const MODES: &[ModeSpec] = &[
        ModeSpec {
            name: "pull",
            webhook: false,
            token: Need::Required,
            app_token: Need::Unused,
            verify_token: Need::Unused,
            endpoint: Endpoint::Http,
            settings: &[],
            missing: None,
            caps: crate::Caps::TEXT_ONLY,
        },
        ModeSpec {
            name: "push",
            webhook: true,
            token: Need::Required,
            app_token: Need::Optional,
            verify_token: Need::Required,
            endpoint: Endpoint::Http,
            settings: &[(Setting::MaxConnections, Need::Optional)],
            missing: None,
            caps: crate::Caps::TEXT_ONLY,
        },
        ModeSpec {
            name: "later",
            webhook: false,
            token: Need::Optional,
            app_token: Need::Unused,
            verify_token: Need::Unused,
            endpoint: Endpoint::WebSocket,
            settings: &[],
            missing: Some("cargo feature later"),
            caps: crate::Caps::TEXT_ONLY,
        },
    ];

    fn no_digits(spec: &BotSpec, _: &ModeSpec) -> Result<(), InvalidSpec> {
        if spec.token.expose().chars().any(|c| c.is_ascii_digit()) {
            return Err(InvalidSpec::Token("may not hold digits here"));
        }
        Ok(())
    }

    const D: Descriptor = Descriptor {
        platform: Platform::Telegram,
        title: "Test",
        modes: MODES,
        secret_field: Some("push_secret"),
        exclusive_session: true,
        connect_rate: 5.0,
        api_url: "https://example.invalid",
        check: no_digits,
    };

    fn spec() -> BotSpec {
        BotSpec::new(BotId::new("b").unwrap(), Platform::Telegram, "tok")
    }

    #[test]
    fn modes_credentials_and_settings_follow_the_table() {
        let mut s = spec();
        assert_eq!(D.mode_name(&s), "pull", "the first mode is the default");
        D.validate(&s).unwrap();
        s.token = Secret::new("t0k");
        assert_eq!(
            D.validate(&s).unwrap_err().to_string(),
            "invalid token: may not hold digits here",
            "the platform's own rule runs"
        );
        s.token = Secret::new("tok");
        s.options.max_connections = Some(5);
        assert_eq!(
            D.validate(&s).unwrap_err().to_string(),
            "invalid max_connections: not a setting of telegram bots in mode pull"
        );
        s.options.mode = Some("push".into());
        let e = D.validate(&s).unwrap_err().to_string();
        assert_eq!(
            e,
            "invalid push_secret: is required: every delivery is verified with it"
        );
        s.hook.secret = Some(Secret::new("very-secret"));
        let e = D.validate(&s).unwrap_err().to_string();
        assert!(e.contains("verify_token") && e.contains("required"), "{e}");
        s.hook.verify_token = Some(Secret::new("has space"));
        let e = D.validate(&s).unwrap_err().to_string();
        assert!(
            e.contains("verify_token") && !e.contains("has space"),
            "{e}"
        );
        s.hook.verify_token = Some(Secret::new("v"));
        D.validate(&s).unwrap();
        assert!(D.is_webhook(&s));
        s.options.mode = Some("pull".into());
        let e = D.validate(&s).unwrap_err().to_string();
        assert!(
            e.contains("push_secret") && !e.contains("very-secret"),
            "{e}"
        );
        s.options.mode = Some("carrier".into());
        assert_eq!(
            D.validate(&s).unwrap_err().to_string(),
            "invalid mode: telegram bots take mode pull or push or later"
        );
        s.options.mode = Some("later".into());
        let e = D.validate(&s).unwrap_err().to_string();
        assert!(e.contains("not in this build (cargo feature later)"), "{e}");
        assert_eq!(
            D.fields(),
            [
                "app_token",
                "verify_token",
                "push_secret",
                "max_connections"
            ]
        );
    }
}
