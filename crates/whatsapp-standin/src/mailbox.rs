//! Text messages both ways. Contacts write to linked devices: each message waits in the
//! device's inbox, encrypted once (as the contact's phone would), goes out on a live
//! connection, and leaves the inbox only when the client acknowledges it; a connection that
//! ends first puts its unacknowledged messages back, so the next login gets them again (the
//! offline queue). Devices write to contacts: the contact's side decrypts and records it.

use std::collections::BTreeSet;

use rand::RngExt as _;
use wacore::{messages::MessageUtils, proto_helpers::MessageExt as _};
use wacore_binary::Node;
use waproto::whatsapp as wa;

use super::{
    contact::{Contact, EncType},
    session::Out,
    stanza::{attr, content, message_ack, offline_end, offline_preview, text_message},
    ChatState, Hub, Reply, Role, State, Who,
};

/// A message from a contact to one linked device.
pub(crate) struct Envelope {
    id: String,
    from: String,
    t: u64,
    /// The padded `Message` protobuf, kept until it is encrypted.
    plaintext: Vec<u8>,
    /// How it goes on the wire, fixed at the first encryption: a redelivery repeats it.
    wire: Option<(EncType, Vec<u8>)>,
    /// The connection it went out on and that has not acknowledged it yet.
    on: Option<u64>,
}

impl State {
    /// A contact writes `text` to every linked device of `to_user`; returns the message id.
    pub(crate) fn post_text(
        &mut self,
        from: &str,
        to_user: &str,
        text: &str,
    ) -> Result<String, String> {
        self.post(
            from,
            to_user,
            wa::Message {
                conversation: Some(text.to_owned()),
                ..Default::default()
            },
        )
    }

    /// A contact sends `message` to every linked device of `to_user`; returns the message id.
    pub(crate) fn post(
        &mut self,
        from: &str,
        to_user: &str,
        message: wa::Message,
    ) -> Result<String, String> {
        if from.is_empty() || !from.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{from:?} is not a phone number"));
        }
        if self.accounts.contains_key(from) {
            return Err(format!("{from} is an account here, not a contact"));
        }
        let devices: Vec<u16> = self
            .accounts
            .get(to_user)
            .map(|a| {
                a.devices
                    .iter()
                    .filter(|(_, d)| d.linked)
                    .map(|(id, _)| *id)
                    .collect()
            })
            .unwrap_or_default();
        if devices.is_empty() {
            return Err(format!("{to_user} has no linked device"));
        }
        self.contacts
            .entry(from.to_owned())
            .or_insert_with(Contact::generate);
        let id = format!(
            "3EB0{}",
            rand::rng()
                .random::<[u8; 8]>()
                .iter()
                .map(|b| format!("{b:02X}"))
                .collect::<String>()
        );
        let plaintext = MessageUtils::encode_and_pad(&message);
        let t = super::unix_now();
        for &device in &devices {
            if let Some(device) = self.device(to_user, device) {
                device.inbox.push_back(Envelope {
                    id: id.clone(),
                    from: from.to_owned(),
                    t,
                    plaintext: plaintext.clone(),
                    wire: None,
                    on: None,
                });
            }
        }
        for device in devices {
            self.deliver(to_user, device);
        }
        Ok(id)
    }

    /// Encrypts what can be encrypted now and sends it if the device has a live connection.
    pub(crate) fn deliver(&mut self, user: &str, device: u16) {
        self.seal(user, device);
        let Some(conn) = self.live_conn(user, device) else {
            return;
        };
        let nodes = self.hand_out(user, device, conn, false);
        if let Some(conn) = self.conns.get(&conn) {
            for node in nodes {
                // A closed channel: the connection is ending, and its leaving requeues these.
                let _ = conn.push.send(Out::Send(node));
            }
        }
    }

    /// Encrypts, in order, the device's messages still in plaintext; stops at the first that
    /// cannot be yet (the device has not uploaded its prekeys).
    fn seal(&mut self, user: &str, device: u16) {
        let State {
            accounts,
            contacts,
            kinds,
            ..
        } = self;
        let Some(target) = accounts
            .get_mut(user)
            .and_then(|a| a.devices.get_mut(&device))
        else {
            return;
        };
        let super::Device { inbox, bundle, .. } = target;
        for envelope in inbox.iter_mut().filter(|e| e.wire.is_none()) {
            let Some(bundle) = bundle.as_mut().filter(|b| b.is_complete()) else {
                break;
            };
            let Some(contact) = contacts.get_mut(&envelope.from) else {
                break;
            };
            let identity = bundle.identity().to_vec();
            match contact.encrypt(
                user,
                device,
                &identity,
                || bundle.x3dh(device),
                &envelope.plaintext,
            ) {
                Ok(wire) => {
                    kinds.entry(envelope.id.clone()).or_insert(wire.0);
                    envelope.wire = Some(wire);
                }
                Err(error) => {
                    tracing::debug!(%error, user, device, "stand-in could not encrypt a message");
                    break;
                }
            }
        }
    }

    /// The newest live connection (past its offline flush) of `user:device`.
    fn live_conn(&self, user: &str, device: u16) -> Option<u64> {
        self.conns
            .iter()
            .filter(|(_, c)| {
                c.live
                    && matches!(&c.role, Role::Device { user: u, device: d } if u == user && *d == device)
            })
            .map(|(id, _)| *id)
            .max()
    }

    /// The stanzas of the device's encrypted messages not in flight, in queue order, now in
    /// flight on `conn`; stops at the first still unencrypted.
    fn hand_out(&mut self, user: &str, device: u16, conn: u64, offline: bool) -> Vec<Node> {
        let Some(target) = self.device(user, device) else {
            return Vec::new();
        };
        let mut nodes = Vec::new();
        for envelope in target.inbox.iter_mut() {
            if envelope.on.is_some() {
                continue;
            }
            let Some((kind, bytes)) = &envelope.wire else {
                break;
            };
            envelope.on = Some(conn);
            nodes.push(text_message(
                &envelope.from,
                &envelope.id,
                envelope.t,
                kind,
                bytes,
                offline,
            ));
        }
        nodes
    }

    /// The client left passive mode on `conn`: what the server sends then is the offline
    /// backlog — a preview, the queued messages marked `offline`, the end marker — and from
    /// now on new messages go out at once.
    pub(crate) fn go_live(&mut self, conn: u64) -> Vec<Node> {
        let Some(c) = self.conns.get_mut(&conn) else {
            return vec![offline_end(0)];
        };
        let Role::Device { user, device } = &c.role else {
            return vec![offline_end(0)];
        };
        let (user, device) = (user.clone(), *device);
        c.live = true;
        self.seal(&user, device);
        let messages = self.hand_out(&user, device, conn, true);
        let mut nodes = Vec::with_capacity(messages.len() + 2);
        if !messages.is_empty() {
            nodes.push(offline_preview(messages.len()));
        }
        let count = messages.len();
        nodes.extend(messages);
        nodes.push(offline_end(count));
        nodes
    }

    /// Connection `conn` of `user:device` ended: what it did not acknowledge is queued again.
    pub(crate) fn requeue(&mut self, conn: u64, user: &str, device: u16) {
        if let Some(target) = self.device(user, device) {
            for envelope in target.inbox.iter_mut() {
                if envelope.on == Some(conn) {
                    envelope.on = None;
                }
            }
        }
        self.deliver(user, device);
    }

    /// The device on `conn` acknowledged these messages: they are delivered.
    fn settle(&mut self, conn: u64, ids: &BTreeSet<String>) {
        let Some(super::Conn {
            role: Role::Device { user, device },
            ..
        }) = self.conns.get(&conn)
        else {
            return;
        };
        let (user, device) = (user.clone(), *device);
        if let Some(target) = self.device(&user, device) {
            target.inbox.retain(|e| !ids.contains(&e.id));
        }
    }

    /// Messages to `user` (all devices) not acknowledged yet.
    pub(crate) fn unacked(&self, user: &str) -> usize {
        self.accounts
            .get(user)
            .map_or(0, |a| a.devices.values().map(|d| d.inbox.len()).sum())
    }
}

impl Hub {
    /// A `<message>` the client sends: for each contact it is encrypted to, the contact's
    /// phone decrypts it and records the text. The server acks it either way.
    pub(crate) fn outgoing(&self, conn: u64, node: &Node) -> Vec<Out> {
        let id = attr(node, "id").unwrap_or_default();
        let to = attr(node, "to").unwrap_or_default();
        let ack = Out::Send(message_ack(&id, &to));
        let mut state = self.lock();
        let Some(super::Conn {
            role: Role::Device { user, device },
            ..
        }) = state.conns.get(&conn)
        else {
            return vec![ack];
        };
        let (user, device) = (user.clone(), *device);
        // `<enc>` straight in the message is for `to`; `<participants>` names each device.
        let direct = node.get_children_by_tag("enc").map(|e| (to.clone(), e));
        let fanned = node
            .get_optional_child("participants")
            .into_iter()
            .flat_map(|p| p.get_children_by_tag("to"))
            .flat_map(|to| {
                let jid = attr(to, "jid").unwrap_or_default();
                to.get_children_by_tag("enc").map(move |e| (jid.clone(), e))
            });
        let mut heard = BTreeSet::new();
        for (jid, enc) in direct.chain(fanned) {
            let who = Who::parse(&jid);
            if who.device.unwrap_or(0) != 0
                || !jid.ends_with("@s.whatsapp.net")
                || state.accounts.contains_key(&who.user)
                || heard.contains(&who.user)
            {
                // Own devices, other accounts' devices: not a contact's phone.
                continue;
            }
            let Some(contact) = state.contacts.get_mut(&who.user) else {
                tracing::debug!(contact = %who.user, "stand-in got a message for an unknown contact");
                continue;
            };
            let kind = attr(enc, "type").unwrap_or_default();
            let version = attr(enc, "v").and_then(|v| v.parse().ok()).unwrap_or(2_u8);
            let text = contact
                .decrypt(&user, device, &kind, content(enc))
                .and_then(|plain| {
                    let bytes = MessageUtils::unpad_message_ref(&plain, version)
                        .map_err(|e| format!("unpad: {e}"))?;
                    waproto::codec::message_decode(bytes).map_err(|e| format!("decode: {e}"))
                });
            match text {
                Ok(message) => {
                    heard.insert(who.user.clone());
                    let media = match state.media.read(message.get_base_message()) {
                        Some(Ok(file)) => Some(file),
                        Some(Err(error)) => {
                            tracing::debug!(%error, contact = %who.user, "stand-in could not read a file");
                            continue;
                        }
                        None => None,
                    };
                    let text = match &media {
                        Some(file) => file.caption.clone().unwrap_or_default(),
                        None => match message.text_content() {
                            Some(text) => text.to_owned(),
                            None => continue,
                        },
                    };
                    state.replies.push(Reply {
                        from_user: user.clone(),
                        to: who.user.clone(),
                        text,
                        media,
                    });
                }
                Err(error) => {
                    tracing::debug!(%error, contact = %who.user, "stand-in could not read a message");
                }
            }
        }
        vec![ack]
    }

    /// `<chatstate to=…><composing/></chatstate>` from a linked device: what its contact
    /// would see ("typing…", or "recording audio…" with `media="audio"`, or nothing after
    /// `paused`), recorded in order.
    pub(crate) fn chat_state(&self, conn: u64, node: &Node) {
        let to = attr(node, "to").unwrap_or_default();
        let Some(child) = node.children().and_then(|c| c.first()) else {
            return;
        };
        let what = match (child.tag.as_ref(), attr(child, "media").as_deref()) {
            ("composing", Some("audio")) => "recording",
            ("composing", _) => "composing",
            ("paused", _) => "paused",
            _ => return,
        };
        let mut state = self.lock();
        let Some(super::Conn {
            role: Role::Device { user, .. },
            ..
        }) = state.conns.get(&conn)
        else {
            return;
        };
        let from_user = user.clone();
        state.chat_states.push(ChatState {
            from_user,
            to: Who::parse(&to).user,
            state: what,
        });
    }

    /// A `<receipt>` (one id, or a `<list>` of `<item>`s for an aggregate) or a message
    /// `<ack>` from the client: those messages are delivered. A retry receipt (the client
    /// could not decrypt) is not an acknowledgement.
    pub(crate) fn acknowledged(&self, conn: u64, node: &Node) {
        let kind = attr(node, "type").unwrap_or_default();
        if node.tag == "receipt" && kind.contains("retry") {
            tracing::debug!(id = ?attr(node, "id"), "stand-in got a retry receipt");
            return;
        }
        if node.tag == "ack" && attr(node, "class").as_deref() != Some("message") {
            return;
        }
        let mut ids: BTreeSet<String> = attr(node, "id").into_iter().collect();
        ids.extend(
            node.get_optional_child("list")
                .into_iter()
                .flat_map(|l| l.get_children_by_tag("item"))
                .filter_map(|item| attr(item, "id")),
        );
        self.lock().settle(conn, &ids);
    }
}
