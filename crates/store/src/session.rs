//! A bot's linked-device session (WhatsApp Web: device identity, Signal sessions and keys,
//! app-state keys): records that move with the bot from worker to worker. Every write carries
//! the claim's fence, so a worker that lost the bot cannot corrupt the session its successor
//! uses; values are sealed like credentials (see `Keyring`).

/// One change to a bot's session records. `Debug` shows the record, never the value.
#[derive(Clone, PartialEq, Eq)]
pub enum SessionWrite {
    /// Sets the record `key` of `kind` (e.g. `session`, `prekey`, `identity`, `device`).
    Put {
        /// The record's kind.
        kind: String,
        /// Its key within the kind.
        key: String,
        /// Its value.
        value: Vec<u8>,
    },
    /// Removes the record `key` of `kind` (absent is fine).
    Delete {
        /// The record's kind.
        kind: String,
        /// Its key within the kind.
        key: String,
    },
}

impl std::fmt::Debug for SessionWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionWrite::Put { kind, key, value } => {
                write!(f, "Put({kind}/{key}, {} bytes)", value.len())
            }
            SessionWrite::Delete { kind, key } => write!(f, "Delete({kind}/{key})"),
        }
    }
}

/// A record's (kind, key).
pub(crate) type RecordId = (String, String);
/// A record to set: kind, key, value.
pub(crate) type RecordPut = (String, String, Vec<u8>);

/// `writes` reduced to their outcome, last write of a record winning: (records to set, in
/// order of first mention, records to remove).
pub(crate) fn net(writes: &[SessionWrite]) -> (Vec<RecordPut>, Vec<RecordId>) {
    let mut last: Vec<(RecordId, Option<Vec<u8>>)> = Vec::new();
    for w in writes {
        let (k, v) = match w {
            SessionWrite::Put { kind, key, value } => {
                ((kind.clone(), key.clone()), Some(value.clone()))
            }
            SessionWrite::Delete { kind, key } => ((kind.clone(), key.clone()), None),
        };
        match last.iter_mut().find(|(x, _)| *x == k) {
            Some(slot) => slot.1 = v,
            None => last.push((k, v)),
        }
    }
    let mut puts = Vec::new();
    let mut dels = Vec::new();
    for ((kind, key), v) in last {
        match v {
            Some(v) => puts.push((kind, key, v)),
            None => dels.push((kind, key)),
        }
    }
    (puts, dels)
}

/// Hex of `bytes` (session values are sealed as text).
pub(crate) use crate::seal::hex as to_hex;
/// The bytes of `hex`, `None` if it is not hex.
pub(crate) use crate::seal::unhex as from_hex;

/// The sealing field of a kind (binds a sealed value to its kind).
pub(crate) fn field(kind: &str) -> String {
    format!("session:{kind}")
}

/// `value` (of `bot`'s record of `kind`) sealed under the first key, `None` when it is so
/// already.
pub(crate) fn resealed(
    keys: &crate::Keyring,
    bot: &str,
    kind: &str,
    value: &str,
) -> crate::Result<Option<String>> {
    if keys.is_current(value) {
        return Ok(None);
    }
    let f = field(kind);
    Ok(Some(keys.seal(bot, &f, &keys.open(bot, &f, value)?)?))
}

/// Opens sealed `(key, value)` rows of `kind`.
pub(crate) fn open_session_rows(
    keys: &crate::Keyring,
    bot: &botfleet_core::BotId,
    kind: &str,
    rows: Vec<(String, String)>,
) -> crate::Result<Vec<(String, Vec<u8>)>> {
    rows.into_iter()
        .map(|(key, v)| {
            let hex = keys.open(bot.as_str(), &field(kind), &v)?;
            let bytes = from_hex(&hex).ok_or_else(|| {
                crate::StoreError::Corrupt(format!(
                    "bot {bot}: session record {kind}/{key} is not hex"
                ))
            })?;
            Ok((key, bytes))
        })
        .collect()
}

/// The `bot_id` under which fleet-wide secrets are kept in `session_records` (not a valid
/// bot id, so never a bot's; resealed with the sessions by `secrets rotate`).
pub(crate) const FLEET: &str = "@fleet";
/// Their kind.
pub(crate) const FLEET_SECRET: &str = "secret";

/// `fresh` as a fleet secret's stored value (sealed under the first key).
pub(crate) fn seal_fleet_secret(keys: &crate::Keyring, fresh: &[u8]) -> crate::Result<String> {
    keys.seal(FLEET, &field(FLEET_SECRET), &to_hex(fresh))
}

/// A fleet secret's bytes from its stored value.
pub(crate) fn open_fleet_secret(
    keys: &crate::Keyring,
    name: &str,
    stored: &str,
) -> crate::Result<Vec<u8>> {
    let hex = keys.open(FLEET, &field(FLEET_SECRET), stored)?;
    from_hex(&hex)
        .ok_or_else(|| crate::StoreError::Corrupt(format!("the fleet secret {name:?} is not hex")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let b: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&b)).unwrap(), b);
        assert!(from_hex("abc").is_none());
        assert!(from_hex("zz").is_none());
    }
}
