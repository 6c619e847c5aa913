//! What Discord is to the fleet: its mode, credentials, settings and rules.

use botfleet_core::{
    BotSpec, Descriptor, Endpoint, InvalidSpec, ModeSpec, Need, Platform, Setting,
};

/// Discord: gateway sessions (`gateway`), with a shard count (`shards`, Discord's
/// recommendation when unset) and slices of shards placed apart (`shards_per_slice`).
pub const DESCRIPTOR: Descriptor = Descriptor {
    platform: Platform::Discord,
    title: "Discord",
    modes: &[ModeSpec {
        name: "gateway",
        webhook: false,
        token: Need::Required,
        app_token: Need::Unused,
        verify_token: Need::Unused,
        endpoint: Endpoint::Http,
        settings: &[
            (Setting::Shards, Need::Optional),
            (Setting::ShardsPerSlice, Need::Optional),
        ],
        missing: None,
        caps: crate::outbound::CAPS,
    }],
    secret_field: None,
    // Each shard's session is its own; two sessions of one shard fight.
    exclusive_session: true,
    connect_rate: 1_000.0,
    api_url: crate::DEFAULT_API_URL,
    check,
};

/// Discord's own rules are enforced by Discord (token shape varies); the shared checks cover
/// shard counts and slices.
fn check(_: &BotSpec, _: &ModeSpec) -> Result<(), InvalidSpec> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use botfleet_core::BotId;

    #[test]
    fn shards_and_slices_are_discord_settings() {
        let mut d = BotSpec::new(BotId::new("big").unwrap(), Platform::Discord, "t");
        DESCRIPTOR.validate(&d).unwrap();
        d.options.shards = Some(14);
        d.options.shards_per_slice = Some(4);
        DESCRIPTOR.validate(&d).unwrap();
        assert_eq!(d.units().len(), 4);
        d.options.shards = Some(5000);
        assert!(DESCRIPTOR.validate(&d).is_err());
        d.options.shards = Some(4);
        d.options.mode = Some("socket".into());
        let e = DESCRIPTOR.validate(&d).unwrap_err().to_string();
        assert_eq!(e, "invalid mode: discord bots take mode gateway");
    }
}
