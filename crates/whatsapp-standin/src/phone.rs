//! The phone's side of linking a device: reading the QR code the companion shows, and the
//! signed device identity a phone produces for it (what `pair-success` carries).

use base64::{engine::general_purpose::STANDARD, Engine as _};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use wacore::libsignal::protocol::{KeyPair, PublicKey};
use waproto::{buffa::Message as _, whatsapp as wa};

/// What the phone signs the account's approval of a companion with (`[6, 0]`), and what the
/// companion signs its acceptance with (`[6, 1]`).
const ACCOUNT_SIGNATURE_PREFIX: [u8; 2] = [6, 0];
const DEVICE_SIGNATURE_PREFIX: [u8; 2] = [6, 1];

/// The fields of a pairing QR code: `ref,noise_pub,identity_pub,adv_secret[,client_type]`,
/// the keys in standard base64, optionally behind the native camera's deep-link prefix.
pub(crate) struct Qr {
    pub(crate) pairing_ref: String,
    pub(crate) noise_key: [u8; 32],
    pub(crate) identity_key: [u8; 32],
    pub(crate) adv_secret: [u8; 32],
}

impl Qr {
    pub(crate) fn parse(text: &str) -> Result<Qr, String> {
        let body = text
            .trim()
            .strip_prefix("https://wa.me/settings/linked_devices#")
            .unwrap_or(text.trim());
        let mut fields = body.split(',');
        let mut next = |name: &str| {
            fields
                .next()
                .filter(|f| !f.is_empty())
                .ok_or_else(|| format!("QR code has no {name}"))
        };
        let pairing_ref = next("ref")?.to_owned();
        let noise_key = key(next("noise key")?, "noise key")?;
        let identity_key = key(next("identity key")?, "identity key")?;
        let adv_secret = key(next("adv secret")?, "adv secret")?;
        Ok(Qr {
            pairing_ref,
            noise_key,
            identity_key,
            adv_secret,
        })
    }
}

fn key(b64: &str, name: &str) -> Result<[u8; 32], String> {
    STANDARD
        .decode(b64)
        .ok()
        .and_then(|bytes| <[u8; 32]>::try_from(bytes).ok())
        .ok_or_else(|| format!("QR code's {name} is not 32 bytes of base64"))
}

/// The `<device-identity>` of a `pair-success`: an `ADVSignedDeviceIdentityHMAC` around the
/// account-signed `ADVDeviceIdentity`, keyed with the secret the QR code carried.
pub(crate) fn device_identity(
    account: &KeyPair,
    companion_identity: &[u8; 32],
    adv_secret: &[u8; 32],
    key_index: u32,
) -> Result<Vec<u8>, String> {
    let mut rng = rand::rng();
    let details = wa::ADVDeviceIdentity {
        raw_id: Some(rand::RngExt::random(&mut rng)),
        timestamp: Some(super::unix_now()),
        key_index: Some(key_index),
        ..Default::default()
    }
    .encode_to_vec();
    let signed = [&ACCOUNT_SIGNATURE_PREFIX[..], &details, companion_identity].concat();
    let account_signature = account
        .private_key
        .calculate_signature(&signed, &mut rng)
        .map_err(|e| format!("signing the device identity: {e}"))?;
    let identity = wa::ADVSignedDeviceIdentity {
        details: Some(details),
        account_signature_key: Some(account.public_key.public_key_bytes().to_vec()),
        account_signature: Some(account_signature.to_vec()),
        device_signature: None,
    }
    .encode_to_vec();
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(adv_secret).map_err(|e| format!("hmac key: {e}"))?;
    mac.update(&identity);
    Ok(wa::ADVSignedDeviceIdentityHMAC {
        details: Some(identity),
        hmac: Some(mac.finalize().into_bytes().to_vec()),
        account_type: None,
    }
    .encode_to_vec())
}

/// Checks the identity a companion sends back in `pair-device-sign`: the account's details,
/// signed now by the companion's own identity key over `[6, 1] | details | its key | account key`.
pub(crate) fn check_device_signature(
    signed_identity: &[u8],
    companion_identity: &[u8; 32],
    account_key: &[u8],
) -> Result<(), String> {
    let identity = waproto::codec::adv_signed_device_identity_decode(signed_identity)
        .map_err(|e| format!("pair-device-sign identity: {e}"))?;
    let details = identity.details.unwrap_or_default();
    let signature = identity
        .device_signature
        .ok_or("pair-device-sign carries no device signature")?;
    let signed = [
        &DEVICE_SIGNATURE_PREFIX[..],
        &details,
        companion_identity,
        account_key,
    ]
    .concat();
    let key = PublicKey::from_djb_public_key_bytes(companion_identity)
        .map_err(|e| format!("companion identity key: {e}"))?;
    if key.verify_signature(&signed, &signature) {
        Ok(())
    } else {
        Err("the companion's device signature does not verify".to_owned())
    }
}
