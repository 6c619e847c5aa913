//! The other end of a chat: a contact's phone (a plain phone number, device 0) with its own
//! Signal keys, sessions with the linked devices it talks to, and the stores libsignal needs.
//!
//! Every store here answers at once (no I/O), so the libsignal calls complete on their first
//! poll: the hub runs them under its lock without an executor, and treats a call that would
//! wait as an error instead of blocking.

use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
};

use async_trait::async_trait;
use futures_util::FutureExt as _;
use wacore::libsignal::protocol::{
    message_decrypt, message_encrypt, process_prekey_bundle, CiphertextMessage,
    CiphertextMessageType, DeviceId, Direction, GenericSignedPreKey as _, IdentityChange,
    IdentityKey, IdentityKeyPair, IdentityKeyStore, KeyPair, PreKeyBundle, PreKeyId, PreKeyRecord,
    PreKeySignalMessage, PreKeyStore, ProtocolAddress, SessionRecord, SessionStore, SignalMessage,
    SignalProtocolError, SignedPreKeyId, SignedPreKeyRecord, SignedPreKeyStore, Timestamp,
    UsePQRatchet,
};
use wacore_binary::{builder::NodeBuilder, Node};

type SignalResult<T> = Result<T, SignalProtocolError>;

/// The id of the contact's one signed prekey.
const SIGNED_PREKEY_ID: u32 = 1;

/// How a message was wrapped: `pkmsg` opens a session (X3DH), `msg` continues one.
pub(crate) type EncType = &'static str;

/// A contact's phone.
pub(crate) struct Contact {
    identities: Identities,
    sessions: Sessions,
    prekeys: PreKeys,
    signed: SignedPreKeys,
    next_prekey: u32,
}

impl Contact {
    pub(crate) fn generate() -> Contact {
        let mut rng = rand::rng();
        let pair = IdentityKeyPair::generate(&mut rng);
        let signed_key = KeyPair::generate(&mut rng);
        let signature = pair
            .private_key()
            .calculate_signature(&signed_key.public_key.serialize(), &mut rng)
            .map(|s| s.to_vec())
            .unwrap_or_default();
        let signed = SignedPreKeyRecord::new(
            SIGNED_PREKEY_ID.into(),
            Timestamp::from_epoch_millis(super::unix_now() * 1000),
            &signed_key,
            &signature,
        );
        Contact {
            identities: Identities {
                // Registration ids are 14-bit on WhatsApp; 0 is not used.
                registration: u32::from(rand::RngExt::random_range(&mut rng, 1..0x3fff_u16)),
                pair,
                known: HashMap::new(),
            },
            sessions: Sessions::default(),
            prekeys: PreKeys::default(),
            signed: SignedPreKeys { record: signed },
            next_prekey: 1,
        }
    }

    /// The contact's `<user>` of a prekey-fetch answer: registration id, identity, a fresh
    /// one-time prekey (kept until a session consumes it) and the signed prekey.
    pub(crate) fn bundle_node(&mut self, jid: &str) -> Result<Node, String> {
        let id = self.next_prekey;
        self.next_prekey = (self.next_prekey % 0x00ff_ffff) + 1;
        let key = KeyPair::generate(&mut rand::rng());
        self.prekeys
            .map
            .insert(id, PreKeyRecord::new(PreKeyId::from(id), &key));
        let signed = &self.signed.record;
        let signed_id = signed.id().map_err(signal)?;
        let signed_public = signed.public_key().map_err(signal)?;
        let signature = signed.signature().map_err(signal)?;
        let leaf = |tag: &'static str, bytes: Vec<u8>| NodeBuilder::new(tag).bytes(bytes).build();
        let id3 = |id: u32| id.to_be_bytes()[1..].to_vec();
        Ok(NodeBuilder::new("user")
            .attr("jid", jid)
            .children([
                leaf(
                    "registration",
                    self.identities.registration.to_be_bytes().to_vec(),
                ),
                leaf("type", vec![5]),
                leaf(
                    "identity",
                    self.identities
                        .pair
                        .public_key()
                        .public_key_bytes()
                        .to_vec(),
                ),
                NodeBuilder::new("key")
                    .children([
                        leaf("id", id3(id)),
                        leaf("value", key.public_key.public_key_bytes().to_vec()),
                    ])
                    .build(),
                NodeBuilder::new("skey")
                    .children([
                        leaf("id", id3(u32::from(signed_id))),
                        leaf("value", signed_public.public_key_bytes().to_vec()),
                        leaf("signature", signature),
                    ])
                    .build(),
            ])
            .build())
    }

    /// Encrypts `plaintext` for a linked device. Without a session with the device's current
    /// identity, first runs X3DH with the bundle `bundle` yields (called only then, as it takes
    /// a one-time prekey out of the server's stock).
    pub(crate) fn encrypt(
        &mut self,
        user: &str,
        device: u16,
        identity: &[u8],
        bundle: impl FnOnce() -> Result<PreKeyBundle, String>,
        plaintext: &[u8],
    ) -> Result<(EncType, Vec<u8>), String> {
        let address = ProtocolAddress::new(user, DeviceId::from(u32::from(device)));
        let key = address.as_str().to_owned();
        let same_identity = self
            .identities
            .known
            .get(&key)
            .is_some_and(|known| known.public_key().public_key_bytes() == identity);
        if !same_identity || !self.sessions.map.contains_key(&key) {
            // A device that linked again has a new identity: its old session is useless.
            self.sessions.map.remove(&key);
            self.identities.known.remove(&key);
            let bundle = bundle()?;
            now(process_prekey_bundle(
                &address,
                &mut self.sessions,
                &mut self.identities,
                &bundle,
                &mut rand::rng(),
                UsePQRatchet::No,
            ))?
            .map_err(signal)?;
        }
        let message = now(message_encrypt(
            plaintext,
            &address,
            &mut self.sessions,
            &mut self.identities,
        ))?
        .map_err(signal)?;
        let kind = match message.message_type() {
            CiphertextMessageType::PreKey => "pkmsg",
            CiphertextMessageType::Whisper => "msg",
            other => return Err(format!("unexpected ciphertext type {other:?}")),
        };
        Ok((kind, message.serialize().to_vec()))
    }

    /// Decrypts what linked device `user:device` sent this contact.
    pub(crate) fn decrypt(
        &mut self,
        user: &str,
        device: u16,
        kind: &str,
        ciphertext: &[u8],
    ) -> Result<Vec<u8>, String> {
        let address = ProtocolAddress::new(user, DeviceId::from(u32::from(device)));
        let message = match kind {
            "pkmsg" => CiphertextMessage::PreKeySignalMessage(
                PreKeySignalMessage::try_from(ciphertext).map_err(signal)?,
            ),
            "msg" => CiphertextMessage::SignalMessage(
                SignalMessage::try_from(ciphertext).map_err(signal)?,
            ),
            other => return Err(format!("cannot decrypt enc type {other:?}")),
        };
        let result = now(message_decrypt(
            &message,
            &address,
            &mut self.sessions,
            &mut self.identities,
            &mut self.prekeys,
            &self.signed,
            &mut rand::rng(),
            UsePQRatchet::No,
        ))?
        .map_err(signal)?;
        // libsignal leaves removing a consumed one-time prekey to its caller.
        if let Some(id) = result.consumed_prekey_id {
            self.prekeys.map.remove(&u32::from(id));
        }
        Ok(result.plaintext)
    }
}

/// Polls a libsignal future once: the stores above never make it wait.
fn now<T>(future: impl Future<Output = T>) -> Result<T, String> {
    future
        .now_or_never()
        .ok_or_else(|| "a Signal operation did not complete at once".to_owned())
}

fn signal(error: SignalProtocolError) -> String {
    format!("signal: {error}")
}

/// The contact's identity and the identities of the devices it talks to (trusted on first
/// use; a changed one replaces the old, as the phone would after showing "security code
/// changed").
struct Identities {
    pair: IdentityKeyPair,
    registration: u32,
    known: HashMap<String, IdentityKey>,
}

#[async_trait]
impl IdentityKeyStore for Identities {
    async fn get_identity_key_pair(&self) -> SignalResult<IdentityKeyPair> {
        Ok(self.pair.clone())
    }

    async fn get_local_registration_id(&self) -> SignalResult<u32> {
        Ok(self.registration)
    }

    async fn save_identity(
        &mut self,
        address: &ProtocolAddress,
        identity: &IdentityKey,
    ) -> SignalResult<IdentityChange> {
        let old = self.known.insert(address.as_str().to_owned(), *identity);
        Ok(IdentityChange::from_changed(
            old.is_some_and(|old| old != *identity),
        ))
    }

    async fn is_trusted_identity(
        &self,
        _address: &ProtocolAddress,
        _identity: &IdentityKey,
        _direction: Direction,
    ) -> SignalResult<bool> {
        Ok(true)
    }

    async fn get_identity(&self, address: &ProtocolAddress) -> SignalResult<Option<IdentityKey>> {
        Ok(self.known.get(address.as_str()).copied())
    }
}

#[derive(Default)]
struct Sessions {
    map: HashMap<String, SessionRecord>,
}

#[async_trait]
impl SessionStore for Sessions {
    async fn load_session(&self, address: &ProtocolAddress) -> SignalResult<Option<SessionRecord>> {
        Ok(self.map.get(address.as_str()).cloned())
    }

    async fn has_session(&self, address: &ProtocolAddress) -> SignalResult<bool> {
        Ok(self.map.contains_key(address.as_str()))
    }

    async fn store_session(
        &mut self,
        address: &ProtocolAddress,
        record: SessionRecord,
    ) -> SignalResult<()> {
        self.map.insert(address.as_str().to_owned(), record);
        Ok(())
    }
}

#[derive(Default)]
struct PreKeys {
    map: BTreeMap<u32, PreKeyRecord>,
}

#[async_trait]
impl PreKeyStore for PreKeys {
    async fn get_pre_key(&self, prekey_id: PreKeyId) -> SignalResult<PreKeyRecord> {
        self.map
            .get(&u32::from(prekey_id))
            .cloned()
            .ok_or(SignalProtocolError::InvalidPreKeyId)
    }

    async fn save_pre_key(
        &mut self,
        prekey_id: PreKeyId,
        record: &PreKeyRecord,
    ) -> SignalResult<()> {
        self.map.insert(u32::from(prekey_id), record.clone());
        Ok(())
    }

    async fn remove_pre_key(&mut self, prekey_id: PreKeyId) -> SignalResult<()> {
        self.map.remove(&u32::from(prekey_id));
        Ok(())
    }
}

struct SignedPreKeys {
    record: SignedPreKeyRecord,
}

#[async_trait]
impl SignedPreKeyStore for SignedPreKeys {
    async fn get_signed_pre_key(&self, id: SignedPreKeyId) -> SignalResult<SignedPreKeyRecord> {
        if u32::from(id) == SIGNED_PREKEY_ID {
            Ok(self.record.clone())
        } else {
            Err(SignalProtocolError::InvalidSignedPreKeyId)
        }
    }

    async fn save_signed_pre_key(
        &mut self,
        _id: SignedPreKeyId,
        record: &SignedPreKeyRecord,
    ) -> SignalResult<()> {
        self.record = record.clone();
        Ok(())
    }
}
