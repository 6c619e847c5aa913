//! Credentials at rest: tokens, app tokens and webhook signing keys are sealed with
//! XChaCha20-Poly1305 (RustCrypto's `chacha20poly1305`) before a SQL store writes them, each
//! value with its own random 192-bit nonce and bound to its bot and field (associated data), so
//! a sealed value copied to another bot or field does not open.
//!
//! Stored form: `enc1:<key id>:<hex nonce><hex ciphertext>`, where the key id (8 hex digits)
//! names the key without revealing it (see `key_id`). A keyring holds one or more keys:
//! the first seals, every one opens — so a key is rotated by putting the new key first, running
//! `botfleet secrets rotate`, then dropping the old one. A keyring read from a file re-reads it
//! when it meets a value sealed under a key it does not hold (a worker keeps running while the
//! file gains the new key and the values move to it). Without a key, values are stored as they
//! are and a sealed value is an error that says a key is needed.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
};

use chacha20poly1305::{
    aead::{Aead, KeyInit, Payload},
    XChaCha20Poly1305, XNonce,
};

use crate::StoreError;

/// The prefix of a sealed value.
const PREFIX: &str = "enc1:";

struct Key {
    id: String,
    cipher: XChaCha20Poly1305,
}

/// The keys a store seals and opens credentials with. `Debug` shows key ids only.
pub struct Keyring {
    keys: RwLock<Arc<Vec<Key>>>,
    file: Option<PathBuf>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("key_ids", &self.key_ids())
            .field("file", &self.file)
            .finish()
    }
}

/// Why a keyring could not be built; never shows key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file could not be read.
    #[error("cannot read the secret key file {path}: {reason}")]
    Unreadable {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A line is not 64 hex characters.
    #[error("{source_name}: key {n} is not 64 hex characters (32 random bytes, as `openssl rand -hex 32` prints)")]
    Malformed {
        /// Where the keys came from.
        source_name: String,
        /// 1-based key number.
        n: usize,
    },
    /// No key at all.
    #[error("{0}: holds no key")]
    Empty(String),
}

/// The id of a key: the first 4 bytes of the authentication tag of sealing nothing under the
/// all-zero nonce with a fixed label — deterministic, and it reveals nothing of the key — as 8
/// hex digits.
fn key_id(cipher: &XChaCha20Poly1305) -> String {
    let tag = cipher
        .encrypt(
            &XNonce::default(),
            Payload {
                msg: &[],
                aad: b"botfleet key id",
            },
        )
        .unwrap_or_default();
    hex(&tag[..tag.len().min(4)])
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn parse_keys(text: &str, source_name: &str) -> Result<Vec<Key>, KeyError> {
    let mut keys = Vec::new();
    for (n, k) in text
        .split(['\n', ','])
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .enumerate()
    {
        let bytes = unhex(k)
            .filter(|b| b.len() == 32)
            .ok_or_else(|| KeyError::Malformed {
                source_name: source_name.to_owned(),
                n: n + 1,
            })?;
        let cipher =
            XChaCha20Poly1305::new_from_slice(&bytes).map_err(|_| KeyError::Malformed {
                source_name: source_name.to_owned(),
                n: n + 1,
            })?;
        keys.push(Key {
            id: key_id(&cipher),
            cipher,
        });
    }
    if keys.is_empty() {
        return Err(KeyError::Empty(source_name.to_owned()));
    }
    Ok(keys)
}

impl Keyring {
    /// No key: credentials are stored as they are.
    pub fn none() -> Arc<Self> {
        Arc::new(Self {
            keys: RwLock::new(Arc::new(Vec::new())),
            file: None,
        })
    }

    /// Keys as hex text: one per line (or comma-separated), the first seals; `#` comments.
    ///
    /// # Errors
    /// A key that is not 64 hex characters, or no key.
    pub fn from_text(text: &str, source_name: &str) -> Result<Arc<Self>, KeyError> {
        Ok(Arc::new(Self {
            keys: RwLock::new(Arc::new(parse_keys(text, source_name)?)),
            file: None,
        }))
    }

    /// Keys from a file as [`Keyring::from_text`] reads them; re-read when a value sealed
    /// under an unknown key turns up.
    ///
    /// # Errors
    /// An unreadable file, a malformed key, or no key.
    pub fn from_file(path: &Path) -> Result<Arc<Self>, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|e| KeyError::Unreadable {
            path: path.display().to_string(),
            reason: e.kind().to_string(),
        })?;
        Ok(Arc::new(Self {
            keys: RwLock::new(Arc::new(parse_keys(&text, &path.display().to_string())?)),
            file: Some(path.to_owned()),
        }))
    }

    fn current(&self) -> Arc<Vec<Key>> {
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The ids of the keys, the sealing one first.
    pub fn key_ids(&self) -> Vec<String> {
        self.current().iter().map(|k| k.id.clone()).collect()
    }

    /// Whether there is no key (values stored as they are).
    pub fn is_empty(&self) -> bool {
        self.current().is_empty()
    }

    /// Whether `stored` is sealed (under any key).
    pub fn is_sealed(stored: &str) -> bool {
        stored.starts_with(PREFIX)
    }

    /// Whether `stored` is as [`Keyring::seal`] would write it now: sealed under the first
    /// key (or, without keys, plain).
    pub(crate) fn is_current(&self, stored: &str) -> bool {
        match self.current().first() {
            None => !Self::is_sealed(stored),
            Some(k) => stored
                .strip_prefix(PREFIX)
                .and_then(|r| r.split_once(':'))
                .is_some_and(|(id, _)| id == k.id),
        }
    }

    /// `plain` sealed for `bot`'s `field` under the first key (as is without a key).
    pub(crate) fn seal(&self, bot: &str, field: &str, plain: &str) -> crate::Result<String> {
        let keys = self.current();
        let Some(k) = keys.first() else {
            return Ok(plain.to_owned());
        };
        let mut nonce = [0u8; 24];
        getrandom::fill(&mut nonce)
            .map_err(|e| StoreError::Secrets(format!("no randomness for a nonce: {e}")))?;
        let aad = format!("botfleet:{bot}:{field}");
        let ct = k
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain.as_bytes(),
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| StoreError::Secrets("sealing failed".into()))?;
        Ok(format!("{PREFIX}{}:{}{}", k.id, hex(&nonce), hex(&ct)))
    }

    /// The plain value of `stored` (as is when not sealed).
    ///
    /// # Errors
    /// [`StoreError::Secrets`] when no key opens it: no key given, a key not held, or the
    /// value altered or moved from another bot or field.
    pub(crate) fn open(&self, bot: &str, field: &str, stored: &str) -> crate::Result<String> {
        let Some(rest) = stored.strip_prefix(PREFIX) else {
            return Ok(stored.to_owned());
        };
        let bad = |why: String| StoreError::Secrets(format!("bot {bot}: the {field} {why}"));
        let (id, body) = rest
            .split_once(':')
            .ok_or_else(|| bad("is not a sealed value botfleet wrote".into()))?;
        let mut keys = self.current();
        if keys.is_empty() {
            return Err(bad(format!(
                "is encrypted (key {id}): give the secret key (--secret-key-file, BOTFLEET_SECRET_KEY)"
            )));
        }
        if !keys.iter().any(|k| k.id == id) {
            keys = self.reload().unwrap_or(keys);
        }
        let k = keys.iter().find(|k| k.id == id).ok_or_else(|| {
            bad(format!(
                "is encrypted under key {id}, which the secret keys given ({}) do not include",
                keys.iter()
                    .map(|k| k.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let raw = unhex(body)
            .filter(|b| b.len() > 24)
            .ok_or_else(|| bad("is not a sealed value botfleet wrote".into()))?;
        let (nonce, ct) = raw.split_at(24);
        let aad = format!("botfleet:{bot}:{field}");
        let plain = k
            .cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| {
                bad(format!(
                    "does not open under key {id} (altered, or copied from another bot or field)"
                ))
            })?;
        String::from_utf8(plain).map_err(|_| bad("is not text".into()))
    }

    /// Re-reads the key file (if the keys came from one); the new keys when it changed.
    fn reload(&self) -> Option<Arc<Vec<Key>>> {
        let path = self.file.as_ref()?;
        let text = std::fs::read_to_string(path).ok()?;
        let keys = Arc::new(parse_keys(&text, &path.display().to_string()).ok()?);
        tracing::info!(keys = ?keys.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(), "re-read the secret key file");
        *self
            .keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = keys.clone();
        Some(keys)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const K1: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const K2: &str = "1f1e1d1c1b1a191817161514131211100f0e0d0c0b0a09080706050403020100";

    #[test]
    fn seals_open_only_for_their_bot_field_and_key() {
        let ring = Keyring::from_text(K1, "test").unwrap();
        let a = ring.seal("b1", "token", "123:SECRET").unwrap();
        let b = ring.seal("b1", "token", "123:SECRET").unwrap();
        assert!(a.starts_with("enc1:") && !a.contains("SECRET"));
        assert_ne!(a, b, "every value gets its own nonce");
        assert_eq!(ring.open("b1", "token", &a).unwrap(), "123:SECRET");
        assert!(
            ring.open("b2", "token", &a).is_err(),
            "moved to another bot"
        );
        assert!(
            ring.open("b1", "app_token", &a).is_err(),
            "moved to another field"
        );
        let mut altered = a.clone();
        altered.pop();
        altered.push(if a.ends_with('0') { '1' } else { '0' });
        assert!(ring.open("b1", "token", &altered).is_err());
        let other = Keyring::from_text(K2, "test").unwrap();
        let e = other.open("b1", "token", &a).unwrap_err().to_string();
        assert!(e.contains("do not include"), "{e}");
        let e = Keyring::none()
            .open("b1", "token", &a)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--secret-key-file"), "{e}");
        // Plain values pass through; without a key nothing is sealed.
        assert_eq!(ring.open("b1", "token", "plain").unwrap(), "plain");
        assert_eq!(Keyring::none().seal("b1", "token", "p").unwrap(), "p");
    }

    #[test]
    fn the_first_key_seals_and_every_key_opens() {
        let old = Keyring::from_text(K1, "test").unwrap();
        let sealed_old = old.seal("b", "token", "t").unwrap();
        let both = Keyring::from_text(&format!("{K2}\n# the old one\n{K1}\n"), "test").unwrap();
        assert_eq!(both.key_ids().len(), 2);
        assert!(!both.is_current(&sealed_old));
        assert_eq!(both.open("b", "token", &sealed_old).unwrap(), "t");
        let sealed_new = both.seal("b", "token", "t").unwrap();
        assert!(both.is_current(&sealed_new));
        assert!(Keyring::none().is_current("plain"));
    }

    #[test]
    fn bad_keys_are_refused_without_showing_them() {
        for text in ["", "abc", &K1[..60], &format!("{K1}zz")] {
            let e = Keyring::from_text(text, "BOTFLEET_SECRET_KEY")
                .unwrap_err()
                .to_string();
            assert!(e.contains("BOTFLEET_SECRET_KEY"), "{e}");
            assert!(!e.contains("0001020304"), "{e}");
        }
    }

    #[test]
    fn a_file_is_re_read_for_a_key_it_did_not_hold() {
        let path = std::env::temp_dir().join(format!("botfleet-keys-{}", std::process::id()));
        std::fs::write(&path, K1).unwrap();
        let ring = Keyring::from_file(&path).unwrap();
        let newer = Keyring::from_text(K2, "test").unwrap();
        let sealed = newer.seal("b", "token", "t").unwrap();
        std::fs::write(&path, format!("{K2}\n{K1}\n")).unwrap();
        assert_eq!(ring.open("b", "token", &sealed).unwrap(), "t");
        assert_eq!(ring.key_ids().len(), 2);
        let _ = std::fs::remove_file(&path);
    }
}
