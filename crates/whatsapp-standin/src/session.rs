//! One connection to the stand-in: the handshake, the admission (a login or a registration),
//! then answers to what the client sends until one side ends it.

use std::{collections::BTreeMap, collections::VecDeque, sync::Arc, time::Duration};

use base64::{engine::general_purpose::STANDARD, Engine as _};
use rand::RngExt as _;
use tokio::{net::TcpStream, sync::mpsc};
use wacore::libsignal::protocol::{
    DeviceId, IdentityKey, PreKeyBundle, PreKeyId, PublicKey, SignedPreKeyId,
};
use wacore_binary::{builder::NodeBuilder, Node};

use super::{
    phone,
    stanza::{
        app_state, attr, child_content, content, empty, error, failure, pair_device, privacy,
        result, stream_error, success, usync,
    },
    wire, Conn, Hub, Role, State,
};

/// How long a kicked client gets to read the reason and close the socket itself. Closing
/// first could make it see a dropped connection (and reconnect) instead of the reason.
const LINGER: Duration = Duration::from_secs(3);

/// QR refs per `pair-device`, as WhatsApp sends (the client shows them 60 s, then 20 s each).
const REFS: usize = 6;

/// What a connection is told to do next.
pub(crate) enum Out {
    /// Send this node.
    Send(Node),
    /// Send this node, then end the connection.
    Kick(Node),
}

/// Serves one accepted TCP connection to its end. A broken frame ends this connection only.
pub(crate) async fn serve(hub: Arc<Hub>, tcp: TcpStream) {
    if let Err(fault) = run(&hub, tcp).await {
        tracing::debug!(%fault, "stand-in connection ended");
    }
}

async fn run(hub: &Hub, tcp: TcpStream) -> Result<(), wire::Fault> {
    // A slow network: the client's dial is still in flight meanwhile.
    let delay = {
        let mut state = hub.lock();
        state.dials += 1;
        state.dialing += 1;
        state.dial_delay
    };
    let dialing = Dialing(hub);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let (mut reader, mut writer) = wire::accept(tcp).await?;
    let greeting = wire::handshake(&mut reader, &mut writer, &hub.keys).await?;
    let (push, mut pushed) = mpsc::unbounded_channel();
    let (id, first) = hub.admit(&greeting, push);
    drop(dialing);
    let member = Member { hub, id };
    let mut outs: VecDeque<Out> = first.into();
    loop {
        while let Some(out) = outs.pop_front() {
            match out {
                Out::Send(node) => writer.node(&node).await?,
                Out::Kick(node) => {
                    member.leave();
                    writer.node(&node).await?;
                    let _ = tokio::time::timeout(LINGER, reader.drain()).await;
                    writer.close().await;
                    return Ok(());
                }
            }
        }
        tokio::select! {
            node = reader.node() => match node? {
                Some(node) => outs.extend(hub.answer(id, &node)),
                None => return Ok(()),
            },
            Some(out) = pushed.recv() => outs.push_back(out),
        }
    }
}

/// A connection not admitted nor refused yet (see [`crate::StandIn::dials_in_flight`]),
/// however its handshake ends.
struct Dialing<'h>(&'h Hub);

impl Drop for Dialing<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.dialing = state.dialing.saturating_sub(1);
    }
}

/// A connection's place in the hub, given up when the connection ends (or is aborted).
struct Member<'h> {
    hub: &'h Hub,
    id: u64,
}

impl Member<'_> {
    fn leave(&self) {
        self.hub.leave(self.id);
    }
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// A device's uploaded Signal keys, kept to answer the count and digest queries truthfully.
#[derive(Default)]
pub(crate) struct Bundle {
    registration: Vec<u8>,
    identity: Vec<u8>,
    signed: Option<[Vec<u8>; 3]>,
    prekeys: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Hub {
    /// Admits a connection that finished its handshake: a login gets `<success>` or, for a
    /// device that is not linked (or whose Noise key is another client's), `<failure>`; a
    /// registration gets its QR refs.
    fn admit(
        &self,
        greeting: &wire::Greeting,
        push: mpsc::UnboundedSender<Out>,
    ) -> (u64, Vec<Out>) {
        let mut guard = self.lock();
        let state = &mut *guard;
        let take_over = state.take_over;
        let id = state.next_id();
        let payload = &greeting.payload;
        let Some(username) = payload.username else {
            let mut rng = rand::rng();
            let refs: Vec<String> = (0..REFS)
                .map(|_| format!("2@{}", STANDARD.encode(rng.random::<[u8; 24]>())))
                .collect();
            let iq = pair_device(&format!("standin-{}", state.next_id()), &refs);
            state.conns.insert(
                id,
                Conn {
                    push,
                    live: false,
                    role: Role::Registering {
                        noise_key: greeting.client_static,
                        refs,
                        scan: None,
                    },
                },
            );
            return (id, vec![Out::Send(iq)]);
        };
        let user = username.to_string();
        let device_id = u16::try_from(payload.device.unwrap_or(0)).unwrap_or(u16::MAX);
        let account = state.account(&user);
        let lid = account.lid.clone();
        let device = account.devices.entry(device_id).or_default();
        let admitted = device.linked
            && device
                .noise_key
                .is_none_or(|key| key == greeting.client_static);
        if !admitted {
            device.refused += 1;
            tracing::debug!(%user, device = device_id, "stand-in refused a login");
            return (id, vec![Out::Kick(failure())]);
        }
        if let Some(left) = device
            .banned_until
            .and_then(|t| t.checked_duration_since(std::time::Instant::now()))
        {
            device.refused += 1;
            let expire = left.as_secs().max(1).to_string();
            let ban = wacore_binary::builder::NodeBuilder::new("failure")
                .attrs([
                    ("reason", "402"),
                    ("code", "101"),
                    ("expire", expire.as_str()),
                    ("location", "standin"),
                ])
                .build();
            return (id, vec![Out::Kick(ban)]);
        }
        device.noise_key = Some(greeting.client_static);
        device.logins += 1;
        let replacing = device.live > 0 && take_over;
        if replacing {
            device.takeovers += 1;
            // As WhatsApp does: the older connections of the device are replaced.
            let older: Vec<u64> = state
                .conns
                .iter()
                .filter(|(_, c)| {
                    matches!(&c.role, Role::Device { user: u, device: d } if *u == user && *d == device_id)
                })
                .map(|(id, _)| *id)
                .collect();
            for old in older {
                if let Some(push) = state.leave(old) {
                    // A closed channel means the connection is ending anyway.
                    let _ = push.send(Out::Kick(super::stanza::replaced()));
                }
            }
        }
        let Some(device) = state.device(&user, device_id) else {
            return (id, vec![Out::Kick(failure())]);
        };
        device.live += 1;
        device.max_live = device.max_live.max(device.live);
        state.conns.insert(
            id,
            Conn {
                push,
                live: false,
                role: Role::Device {
                    user,
                    device: device_id,
                },
            },
        );
        (id, vec![Out::Send(success(&lid, device_id))])
    }

    /// Forgets a connection; idempotent.
    fn leave(&self, id: u64) {
        self.lock().leave(id);
    }

    /// What to send for a node the client sent.
    fn answer(&self, id: u64, node: &Node) -> Vec<Out> {
        match node.tag.as_ref() {
            "iq" => {}
            "message" => return self.outgoing(id, node),
            "receipt" | "ack" => {
                self.acknowledged(id, node);
                return Vec::new();
            }
            "chatstate" => {
                self.chat_state(id, node);
                return Vec::new();
            }
            // Presence, offline batch requests (the whole backlog went out
            // at once), unified-session pings: nothing to say.
            _ => return Vec::new(),
        }
        match attr(node, "type").as_deref() {
            Some("result" | "error") => self.reply(id, node),
            Some("get" | "set") => self.request(id, node),
            _ => Vec::new(),
        }
    }

    /// The client answering one of ours: only the answer to `pair-success` matters.
    fn reply(&self, id: u64, node: &Node) -> Vec<Out> {
        let mut state = self.lock();
        let (scan, noise_key) = {
            let Some(Conn {
                role: Role::Registering {
                    noise_key, scan, ..
                },
                ..
            }) = state.conns.get_mut(&id)
            else {
                return Vec::new();
            };
            if scan.as_ref().map(|s| s.iq_id.as_str()) != attr(node, "id").as_deref() {
                return Vec::new();
            }
            let Some(scan) = scan.take() else {
                return Vec::new();
            };
            (scan, *noise_key)
        };
        let verdict = if attr(node, "type").as_deref() == Some("error") {
            let error = node.get_optional_child("error");
            Err(format!(
                "the client refused the pairing: {} {}",
                error.and_then(|e| attr(e, "code")).unwrap_or_default(),
                error.and_then(|e| attr(e, "text")).unwrap_or_default(),
            ))
        } else {
            let signed = node
                .get_optional_child("pair-device-sign")
                .and_then(|n| n.get_optional_child("device-identity"))
                .map(content)
                .unwrap_or_default();
            phone::check_device_signature(signed, &scan.identity_key, &scan.account_key)
        };
        match verdict {
            Ok(()) => {
                let device = state
                    .account(&scan.user)
                    .devices
                    .entry(scan.device)
                    .or_default();
                device.linked = true;
                device.noise_key = Some(noise_key);
                let _ = scan.done.send(Ok(scan.device));
                // What WhatsApp does next: restart the stream; the client logs in as the device.
                vec![Out::Kick(stream_error(Some("515"), None))]
            }
            Err(error) => {
                let _ = scan.done.send(Err(error));
                Vec::new()
            }
        }
    }

    /// A request of the client's: answered minimally, but validly.
    fn request(&self, id: u64, node: &Node) -> Vec<Out> {
        let xmlns = attr(node, "xmlns").unwrap_or_default();
        let first = node.children().and_then(|c| c.first());
        let has = |tag: &str| node.get_optional_child(tag).is_some();
        let answer = match (xmlns.as_str(), first.map(|c| c.tag.as_ref())) {
            ("passive", Some("active")) => {
                // Out of passive mode, the server delivers the offline backlog and ends it
                // with a marker; the client waits for that (up to a minute) before it goes on.
                let backlog = self.lock().go_live(id);
                let mut outs = vec![Out::Send(result(node).build())];
                outs.extend(backlog.into_iter().map(Out::Send));
                return outs;
            }
            ("encrypt", _) if has("registration") => {
                self.with_bundle(id, |b| b.upload(node));
                // Messages that waited for the device's keys can be encrypted now.
                if let Some((user, device)) = self.device_of(id) {
                    self.lock().deliver(&user, device);
                }
                result(node).build()
            }
            ("encrypt", Some("count")) => {
                let count = self.with_bundle(id, |b| b.prekeys.len()).unwrap_or(0);
                result(node)
                    .children([NodeBuilder::new("count")
                        .attr("value", count.to_string())
                        .build()])
                    .build()
            }
            ("encrypt", Some("digest")) => {
                self.with_bundle(id, |b| b.digest()).flatten().map_or_else(
                    || error(node, 404, "item-not-found"),
                    |d| result(node).children([d]).build(),
                )
            }
            ("encrypt", Some("rotate")) => {
                if let Some(skey) = first.and_then(|r| r.get_optional_child("skey")) {
                    self.with_bundle(id, |b| b.signed = Some(signed_key(skey)));
                }
                result(node).build()
            }
            ("encrypt", Some("key")) => self.prekey_bundles(node, first),
            ("abt", Some("props")) => result(node)
                .children([NodeBuilder::new("props")
                    .attrs([("protocol", "1"), ("hash", "standin")])
                    .build()])
                .build(),
            ("privacy", Some("privacy")) if attr(node, "type").as_deref() == Some("get") => {
                result(node).children([privacy()]).build()
            }
            ("blocklist", _) => result(node).children([empty("list")]).build(),
            // Where media go: the stand-in's CDN, with a token the CDN does not check.
            ("w:m", Some("media_conn")) => {
                let host = self.lock().media.host.clone();
                result(node)
                    .children([NodeBuilder::new("media_conn")
                        .attrs([("auth", "standin-media"), ("ttl", "3600")])
                        .children([NodeBuilder::new("host")
                            .attrs([("hostname", host.as_str()), ("type", "primary")])
                            .build()])
                        .build()])
                    .build()
            }
            ("usync", Some("usync")) => {
                let answer = {
                    let state = self.lock();
                    usync(first, |user| state.accounts.contains_key(user))
                };
                result(node).children([answer]).build()
            }
            ("w:sync:app:state", Some("sync")) => result(node).children([app_state(first)]).build(),
            ("md", Some("link_code_companion_reg")) => self.pair_code(node, first),
            ("md", Some("remove-companion-device")) => {
                // The client logging itself out: the device is no longer linked.
                if let Some(who) = self.device_jid(id) {
                    self.unlink(&who);
                }
                result(node).build()
            }
            // Pings (`w:p`), dirty-bit cleaning, presence and the rest: a bare result.
            _ => result(node).build(),
        };
        vec![Out::Send(answer)]
    }

    /// Stage one of linking with a code: the client sends its wrapped key for a phone number,
    /// the server answers with a pairing ref, and the client shows the code to type in.
    fn pair_code(&self, node: &Node, reg: Option<&Node>) -> Node {
        let Some(reg) = reg.filter(|r| attr(r, "stage").as_deref() == Some("companion_hello"))
        else {
            return result(node).build();
        };
        let phone = attr(reg, "jid").unwrap_or_default();
        let phone = phone.split('@').next().unwrap_or_default().to_owned();
        self.lock().pair_codes.push(phone);
        let pairing_ref = format!("2@{}", STANDARD.encode(rand::rng().random::<[u8; 24]>()));
        result(node)
            .children([NodeBuilder::new("link_code_companion_reg")
                .children([NodeBuilder::new("link_code_pairing_ref")
                    .bytes(pairing_ref.into_bytes())
                    .build()])
                .build()])
            .build()
    }

    /// Runs `f` on the bundle of the device logged in on connection `id`.
    fn with_bundle<T>(&self, id: u64, f: impl FnOnce(&mut Bundle) -> T) -> Option<T> {
        let mut state = self.lock();
        let Some(Conn {
            role: Role::Device { user, device },
            ..
        }) = state.conns.get(&id)
        else {
            return None;
        };
        let (user, device) = (user.clone(), *device);
        let device = state.device(&user, device)?;
        Some(f(device.bundle.get_or_insert_with(Bundle::default)))
    }

    fn device_jid(&self, id: u64) -> Option<String> {
        self.device_of(id)
            .map(|(user, device)| format!("{user}:{device}"))
    }

    /// The device logged in on connection `id`.
    fn device_of(&self, id: u64) -> Option<(String, u16)> {
        match &self.lock().conns.get(&id)?.role {
            Role::Device { user, device } => Some((user.clone(), *device)),
            Role::Registering { .. } => None,
        }
    }

    /// A prekey fetch (`<key><user jid=…/>…`): a bundle for each contact asked for, with a
    /// fresh one-time prekey; accounts here (the client's own, other linked accounts) are left
    /// out, as before.
    fn prekey_bundles(&self, node: &Node, key: Option<&Node>) -> Node {
        let mut state = self.lock();
        let mut users = Vec::new();
        for jid in key
            .into_iter()
            .flat_map(|k| k.get_children_by_tag("user"))
            .filter_map(|u| attr(u, "jid"))
        {
            let who = super::Who::parse(&jid);
            if who.device.unwrap_or(0) != 0
                || !jid.ends_with("@s.whatsapp.net")
                || who.user.is_empty()
                || !who.user.bytes().all(|b| b.is_ascii_digit())
                || state.accounts.contains_key(&who.user)
            {
                continue;
            }
            let contact = state
                .contacts
                .entry(who.user.clone())
                .or_insert_with(super::contact::Contact::generate);
            match contact.bundle_node(&jid) {
                Ok(user) => users.push(user),
                Err(error) => tracing::debug!(%error, %jid, "stand-in could not build a bundle"),
            }
        }
        result(node)
            .children([NodeBuilder::new("list").children(users).build()])
            .build()
    }
}

impl State {
    /// Forgets a connection (idempotent): a device's connection is no longer live, and what
    /// it did not acknowledge waits for the next one. Answers the connection's channel.
    pub(crate) fn leave(&mut self, id: u64) -> Option<mpsc::UnboundedSender<Out>> {
        let conn = self.conns.remove(&id)?;
        if let Role::Device { user, device } = &conn.role {
            if let Some(target) = self.device(user, *device) {
                target.live = target.live.saturating_sub(1);
            }
            self.requeue(id, user, *device);
        }
        // A pending scan's sender drops with the connection: `scan` learns the client went away.
        Some(conn.push)
    }

    pub(crate) fn device(&mut self, user: &str, device: u16) -> Option<&mut super::Device> {
        self.accounts.get_mut(user)?.devices.get_mut(&device)
    }
}

impl Bundle {
    /// Whether the device uploaded what a sender needs to open a session with it.
    pub(crate) fn is_complete(&self) -> bool {
        self.identity.len() == 32 && self.registration.len() == 4 && self.signed.is_some()
    }

    /// The device's identity key, 32 bytes.
    pub(crate) fn identity(&self) -> &[u8] {
        &self.identity
    }

    /// What a sender fetches to open a session with the device: its keys and one of its
    /// one-time prekeys, which the server hands out only once (none left: without one).
    pub(crate) fn x3dh(&mut self, device: u16) -> Result<PreKeyBundle, String> {
        let key = |bytes: &[u8]| {
            PublicKey::from_djb_public_key_bytes(bytes).map_err(|e| format!("bundle key: {e}"))
        };
        let id = |bytes: &[u8]| bytes.iter().fold(0_u32, |id, b| (id << 8) | u32::from(*b));
        let [signed_id, signed_value, signature] =
            self.signed.as_ref().ok_or("no signed prekey uploaded")?;
        let registration = <[u8; 4]>::try_from(self.registration.as_slice())
            .map_err(|_| "registration id is not 4 bytes")?;
        let prekey = match self.prekeys.pop_first() {
            Some((prekey_id, value)) => Some((PreKeyId::from(id(&prekey_id)), key(&value)?)),
            None => None,
        };
        PreKeyBundle::new(
            u32::from_be_bytes(registration),
            DeviceId::from(u32::from(device)),
            prekey,
            SignedPreKeyId::from(id(signed_id)),
            key(signed_value)?,
            signature.clone(),
            IdentityKey::new(key(&self.identity)?),
        )
        .map_err(|e| format!("bundle: {e}"))
    }

    /// Takes in a prekey upload: `registration`, `type`, `identity`, `list` of `key`s, `skey`.
    fn upload(&mut self, iq: &Node) {
        self.registration = child_content(iq, "registration");
        self.identity = child_content(iq, "identity");
        if let Some(skey) = iq.get_optional_child("skey") {
            self.signed = Some(signed_key(skey));
        }
        let keys = iq
            .get_optional_child("list")
            .map(|l| l.get_children_by_tag("key"));
        for key in keys.into_iter().flatten() {
            self.prekeys
                .insert(child_content(key, "id"), child_content(key, "value"));
        }
    }

    /// The server's view of the bundle, hashed the way the client checks it.
    fn digest(&self) -> Option<Node> {
        let [id, value, signature] = self.signed.as_ref()?;
        if self.identity.is_empty() {
            return None;
        }
        let prekeys: Vec<&[u8]> = self.prekeys.values().map(Vec::as_slice).collect();
        let hash =
            wacore::prekeys::compute_key_bundle_digest(&self.identity, value, signature, &prekeys);
        let leaf = |tag: &'static str, bytes: &[u8]| NodeBuilder::new(tag).bytes(bytes).build();
        Some(
            NodeBuilder::new("digest")
                .children([
                    leaf("registration", &self.registration),
                    leaf("type", &[5]),
                    leaf("identity", &self.identity),
                    NodeBuilder::new("skey")
                        .children([
                            leaf("id", id),
                            leaf("value", value),
                            leaf("signature", signature),
                        ])
                        .build(),
                    NodeBuilder::new("list")
                        .children(self.prekeys.keys().map(|id| leaf("id", id)))
                        .build(),
                    leaf("hash", &hash),
                ])
                .build(),
        )
    }
}

fn signed_key(skey: &Node) -> [Vec<u8>; 3] {
    [
        child_content(skey, "id"),
        child_content(skey, "value"),
        child_content(skey, "signature"),
    ]
}
