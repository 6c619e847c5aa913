//! A stand-in WhatsApp Web server for tests: it speaks the real wire
//! protocol — WebSocket, Noise as responder, binary nodes — so the real `whatsapp-rust` client
//! can link a device to it, log in, stay idle, and be kicked out the ways WhatsApp kicks.
//!
//! It binds `127.0.0.1:0`; point the client's transport at [`StandIn::url`]:
//!
//! ```ignore
//! let server = StandIn::start().await?;
//! let transport = TokioWebSocketTransportFactory::new().with_url(server.url()).without_origin();
//! ```
//!
//! The client must be built with `wacore`'s `danger-skip-cert-chain-verify` (this crate turns
//! it on): the stand-in's Noise certificate cannot carry WhatsApp's signature.
//!
//! What it does per connection: a login (`username` + `device` in the client payload) of a
//! linked device gets `<success>`; of any other device `<failure reason="401">`, which the
//! client reports as `LoggedOut`. A registration (no device yet) gets `<pair-device>` refs, so
//! the client shows QR codes; [`StandIn::scan`] plays the phone scanning one. Every `iq` a
//! logged-in client sends gets a minimal valid answer (prekeys are kept, so the count and
//! digest queries answer truthfully); its `<message>`s are acked and read (see below), its
//! receipts and message acks settle deliveries; everything else is ignored.
//!
//! Contacts write to linked devices with [`StandIn::send_text`]: the stand-in plays the
//! contact's phone (its own Signal keys; X3DH from the device's uploaded prekeys), delivers
//! to a live connection or keeps the message until the device logs in (the offline queue), and
//! counts it delivered only once the client acknowledges it — a connection that ends before
//! that gets it again on the next login. What linked devices send to contacts (after asking
//! `usync` for the contact's devices and fetching its prekey bundle) is decrypted on the
//! contact's side and shows in [`StandIn::replies`].
//!
//! Media go through a CDN of the stand-in's own (plain HTTP on a second loopback port, which
//! the `media_conn` answer names; the client's HTTP client must speak `http://` to the
//! `https://` URLs it builds): [`StandIn::send_media`] has a contact send a photo or a
//! document encrypted as phones encrypt media, and a file a linked device uploads and sends
//! shows in [`StandIn::replies`] downloaded and decrypted.
//!
//! Unlike WhatsApp, by default a second login of a device does not kick the first: both stay
//! connected, so [`StandIn::max_concurrent`] shows a double login. [`StandIn::replace`] is the
//! kick; after [`StandIn::take_over`] a login kicks the older connection as WhatsApp does
//! (counted in [`StandIn::takeovers`]). [`StandIn::slow_dials`] holds new connections, so a
//! client's dial stays in flight.

mod contact;
mod mailbox;
mod media;
mod phone;
mod session;
mod stanza;
mod wire;

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tokio::{
    net::TcpListener,
    sync::{mpsc, oneshot},
    task::{JoinHandle, JoinSet},
};
use wacore::libsignal::protocol::KeyPair;

use session::Out;

pub use media::MediaFile;

/// How long [`StandIn::scan`] waits for the client to sign the pairing.
const SCAN_TIMEOUT: Duration = Duration::from_secs(30);

/// A running stand-in server. Dropping it stops it: the accept loop and every connection end.
pub struct StandIn {
    addr: SocketAddr,
    hub: Arc<Hub>,
    accept: JoinHandle<()>,
    cdn: JoinHandle<()>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        // The accept task owns the connections' JoinSet; aborting it aborts them all.
        self.accept.abort();
        self.cdn.abort();
    }
}

impl std::fmt::Debug for StandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandIn").field("addr", &self.addr).finish()
    }
}

impl StandIn {
    /// Binds `127.0.0.1:0` for the socket and another port for the media CDN, and starts
    /// serving.
    ///
    /// # Errors
    /// When a listener cannot be bound.
    pub async fn start() -> std::io::Result<StandIn> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let media = TcpListener::bind(("127.0.0.1", 0)).await?;
        let hub = Arc::new(Hub {
            keys: wire::ServerKeys::generate(),
            state: Mutex::default(),
        });
        hub.lock().media.host = media.local_addr()?.to_string();
        let accept = tokio::spawn(accept_loop(listener, hub.clone()));
        let cdn = tokio::spawn(media::serve(media, hub.clone()));
        Ok(StandIn {
            addr,
            hub,
            accept,
            cdn,
        })
    }

    /// Answers every new connection's WebSocket upgrade only after `delay` (a slow network):
    /// a client's dial stays in flight that long. Zero (the default) answers at once.
    pub fn slow_dials(&self, delay: Duration) {
        self.hub.lock().dial_delay = delay;
    }

    /// From now on, behaves as WhatsApp does when a device logs in while it has a live
    /// connection: the older connection is kicked with `<conflict type="replaced"/>` (its
    /// client emits `StreamReplaced`), and the login counted in [`StandIn::takeovers`]. By
    /// default both stay connected, so that [`StandIn::max_concurrent`] shows a double login.
    pub fn take_over(&self) {
        self.hub.lock().take_over = true;
    }

    /// Logins of `who` (see [`StandIn::connected`]) that replaced a live connection of the
    /// device (see [`StandIn::take_over`]).
    pub fn takeovers(&self, who: &str) -> usize {
        self.hub.devices(who, |d| d.takeovers).sum()
    }

    /// TCP connections accepted so far, whether or not they got as far as a login.
    pub fn dials(&self) -> usize {
        self.hub.lock().dials
    }

    /// Connections accepted whose login has not been answered yet (held by
    /// [`StandIn::slow_dials`], or in their handshake); a connection that goes away before its
    /// login leaves this count too.
    pub fn dials_in_flight(&self) -> usize {
        self.hub.lock().dialing
    }

    /// The WebSocket URL to give the client's transport: `ws://127.0.0.1:PORT/ws/chat`.
    pub fn url(&self) -> String {
        format!("ws://{}/ws/chat", self.addr)
    }

    /// Makes device `device` of phone number `user` a linked device, as if it had been paired
    /// earlier: its logins are accepted. (A device that logged in once is bound to that
    /// client's Noise key, as on WhatsApp; a device added here is bound on its first login.)
    pub fn add_device(&self, user: &str, device: u16) {
        let mut state = self.hub.lock();
        let device = state.account(user).devices.entry(device).or_default();
        device.linked = true;
    }

    /// Live connections (handshake done, login accepted) of `who`: a device JID
    /// (`"15551234567:1"`, with or without `@s.whatsapp.net`), or a phone number for all of
    /// its devices.
    pub fn connected(&self, who: &str) -> usize {
        self.hub.devices(who, |d| d.live).sum()
    }

    /// Live connections of every device.
    pub fn total_connected(&self) -> usize {
        let state = self.hub.lock();
        state
            .conns
            .values()
            .filter(|c| matches!(c.role, Role::Device { .. }))
            .count()
    }

    /// The most connections one device of `who` (see [`StandIn::connected`]) ever had at the
    /// same time.
    pub fn max_concurrent(&self, who: &str) -> usize {
        self.hub.devices(who, |d| d.max_live).max().unwrap_or(0)
    }

    /// Logins of `who` (see [`StandIn::connected`]) accepted so far.
    pub fn logins(&self, who: &str) -> usize {
        self.hub.devices(who, |d| d.logins).sum()
    }

    /// Logins of `who` (see [`StandIn::connected`]) refused so far: the device is not linked
    /// (never paired, or logged out), or the client's Noise key is not the device's.
    pub fn refused(&self, who: &str) -> usize {
        self.hub.devices(who, |d| d.refused).sum()
    }

    /// Whether `user:device` is a linked device (its logins are accepted).
    pub fn is_linked(&self, user: &str, device: u16) -> bool {
        let state = self.hub.lock();
        state
            .accounts
            .get(user)
            .and_then(|a| a.devices.get(&device))
            .is_some_and(|d| d.linked)
    }

    /// Kicks the live connections of `who` (see [`StandIn::connected`]) the way WhatsApp does
    /// when another client takes the session over: `<stream:error><conflict type="replaced"/>`.
    /// The client emits `StreamReplaced`. The device stays linked.
    pub fn replace(&self, who: &str) {
        self.hub.kick(who, stanza::replaced());
    }

    /// The phone removes the linked device(s) `who` (see [`StandIn::connected`]): their live
    /// connections get `<stream:error code="401"><conflict type="device_removed"/>` (the
    /// client emits `LoggedOut`), and their later logins are refused.
    pub fn log_out(&self, who: &str) {
        self.hub.unlink(who);
        self.hub.kick(who, stanza::removed());
    }

    /// WhatsApp bans `who` for `time`: live connections are told to restart
    /// (`<stream:error code="515"/>`) and their logins meanwhile are refused with
    /// `<failure reason="402" code="101" expire=…/>` (the client emits `TemporaryBan` and
    /// stops); after `time` they are accepted again.
    pub fn ban(&self, who: &str, time: Duration) {
        let until = std::time::Instant::now() + time;
        self.hub.each_device(who, |d| d.banned_until = Some(until));
        self.hub.kick(who, stanza::stream_error(Some("515"), None));
    }

    /// Plays the phone scanning a QR code: `qr` is the text of the client's `PairingQrCode`
    /// event. Sends the registering client that shows it a `pair-success` for phone number
    /// `user` and a new device id, waits for the client to sign it (`pair-device-sign`), links
    /// the device and tells the client to restart the stream (515), after which it logs in as
    /// the new device. Returns the device id.
    ///
    /// # Errors
    /// When the QR code is malformed, no connected client shows it, or the client refuses or
    /// does not sign the pairing within 30 seconds.
    pub async fn scan(&self, qr: &str, user: &str) -> Result<u16, String> {
        let qr = phone::Qr::parse(qr)?;
        let (done, answer) = oneshot::channel();
        {
            let mut state = self.hub.lock();
            let (conn, node) = state.start_pairing(&qr, user, done)?;
            conn.push
                .send(Out::Send(node))
                .map_err(|_| "the registering client went away".to_owned())?;
        }
        match tokio::time::timeout(SCAN_TIMEOUT, answer).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err("the registering client went away".to_owned()),
            Err(_) => Err("the client did not sign the pairing in time".to_owned()),
        }
    }

    /// Registering clients connected now: each was sent `pair-device` refs, shows QR codes and
    /// waits for a scan.
    pub fn registering(&self) -> usize {
        let state = self.hub.lock();
        state
            .conns
            .values()
            .filter(|c| matches!(c.role, Role::Registering { .. }))
            .count()
    }

    /// The phone numbers clients asked a pairing code for (`link_code_companion_reg`), in order.
    /// Each was answered with a pairing ref, so the client emitted its `PairingCode` event; the
    /// phone entering the code is not simulated.
    pub fn pair_code_requests(&self) -> Vec<String> {
        self.hub.lock().pair_codes.clone()
    }

    /// A contact (phone number `from`, e.g. `"15557770001"`, device 0 — its phone) writes
    /// `text` to every linked device of the account `to_user`. Each device's copy is encrypted
    /// the way the contact's phone would: X3DH from the device's uploaded prekey bundle opens
    /// the session (`pkmsg`; a real sender keeps that wrapping until the device has written
    /// back), later messages continue it (`msg`); the plaintext is the padded `Message`
    /// protobuf with `conversation` set. A connected device gets it at once; a device that is
    /// not connected (or has not uploaded its keys yet) gets it when it next logs in, before
    /// `<ib><offline/>` ends the backlog. A copy is delivered only when the client acknowledges
    /// it (a delivery `<receipt>`, or an `<ack class="message">`); a connection that ends first
    /// hands it back, and the next login gets the same ciphertext again. Returns the message id
    /// (the same for every device).
    ///
    /// # Errors
    /// When `from` is not a phone number (or is an account here), or `to_user` has no linked
    /// device.
    pub async fn send_text(&self, from: &str, to_user: &str, text: &str) -> Result<String, String> {
        self.hub.lock().post_text(from, to_user, text)
    }

    /// A contact sends `file` to every linked device of `to_user`, as [`StandIn::send_text`]
    /// sends a text: its phone encrypts the bytes under a new media key (AES-256-CBC with an
    /// HMAC, keys expanded with the media type's HKDF info, as WhatsApp's clients do), puts
    /// the ciphertext on the stand-in's CDN and sends a media message with the references
    /// (`url`, `direct_path`, `media_key`, both hashes, the length; the caption, the name).
    /// Returns the message id.
    ///
    /// # Errors
    /// As [`StandIn::send_text`]; when the file cannot be encrypted.
    pub async fn send_media(
        &self,
        from: &str,
        to_user: &str,
        file: MediaFile,
    ) -> Result<String, String> {
        let mut state = self.hub.lock();
        let message = state.media.message(&file)?;
        state.post(from, to_user, message)
    }

    /// Downloads the CDN served (a linked device fetching a contact's file).
    pub fn media_downloads(&self) -> usize {
        self.hub.lock().media.downloads.values().sum()
    }

    /// Messages to `to_user` not acknowledged yet, queued or in flight: one per message and
    /// linked device it went to.
    pub fn unacked(&self, to_user: &str) -> usize {
        self.hub.lock().unacked(to_user)
    }

    /// The texts linked devices sent to contacts, as the contacts' phones decrypted them, in
    /// the order they arrived.
    pub fn replies(&self) -> Vec<Reply> {
        self.hub.lock().replies.clone()
    }

    /// The texts the linked account `user` sent to the phone number `contact`, in the order
    /// the contact read them.
    pub fn replies_to(&self, user: &str, contact: &str) -> Vec<String> {
        self.hub
            .lock()
            .replies
            .iter()
            .filter(|r| r.from_user == user && r.to == contact)
            .map(|r| r.text.clone())
            .collect()
    }

    /// The chat states (`composing`, `recording`, `paused`) the linked account `user` showed
    /// the phone number `contact`, in order.
    pub fn chat_states_to(&self, user: &str, contact: &str) -> Vec<&'static str> {
        self.hub
            .lock()
            .chat_states
            .iter()
            .filter(|c| c.from_user == user && c.to == contact)
            .map(|c| c.state)
            .collect()
    }

    /// How the message with id `message_id` (from [`StandIn::send_text`]) was encrypted for
    /// the first device it was encrypted for: `"pkmsg"` (opens a session) or `"msg"`; `None`
    /// until it has been encrypted.
    pub fn enc_type(&self, message_id: &str) -> Option<&'static str> {
        self.hub.lock().kinds.get(message_id).copied()
    }
}

/// A chat state a linked device sent to a contact.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ChatState {
    /// The phone number of the account whose device sent it.
    from_user: String,
    /// The contact's phone number.
    to: String,
    /// `composing`, `recording` or `paused`.
    state: &'static str,
}

/// A text a linked device sent to a contact, as the contact's phone read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The phone number of the account whose device sent it.
    pub from_user: String,
    /// The contact's phone number.
    pub to: String,
    /// The text (a media message's caption; empty without one).
    pub text: String,
    /// The file of a media message, as the contact downloaded and decrypted it.
    pub media: Option<MediaFile>,
}

/// Accepts connections until the stand-in is dropped. Owns every connection task: they live in
/// its JoinSet, so aborting this task ends them too.
async fn accept_loop(listener: TcpListener, hub: Arc<Hub>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    conns.spawn(session::serve(hub.clone(), tcp));
                }
                Err(error) => {
                    tracing::debug!(%error, "stand-in accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// What the server knows, shared by the handle, the accept loop and the connections.
struct Hub {
    keys: wire::ServerKeys,
    // std Mutex: never held across .await.
    state: Mutex<State>,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `field` of every device `who` names.
    fn devices(&self, who: &str, field: impl Fn(&Device) -> usize) -> std::vec::IntoIter<usize> {
        let who = Who::parse(who);
        let state = self.lock();
        let values: Vec<usize> = state
            .accounts
            .get(&who.user)
            .into_iter()
            .flat_map(|a| a.devices.iter())
            .filter(|(id, _)| who.device.is_none_or(|d| d == **id))
            .map(|(_, d)| field(d))
            .collect();
        values.into_iter()
    }

    fn kick(&self, who: &str, node: wacore_binary::Node) {
        let who = Who::parse(who);
        let state = self.lock();
        for conn in state.conns.values() {
            if let Role::Device { user, device } = &conn.role {
                if *user == who.user && who.device.is_none_or(|d| d == *device) {
                    // A closed channel means the connection is ending anyway.
                    let _ = conn.push.send(Out::Kick(node.clone()));
                }
            }
        }
    }

    fn each_device(&self, who: &str, f: impl Fn(&mut Device)) {
        let who = Who::parse(who);
        let mut state = self.lock();
        if let Some(account) = state.accounts.get_mut(&who.user) {
            for (_, device) in account
                .devices
                .iter_mut()
                .filter(|(id, _)| who.device.is_none_or(|d| d == **id))
            {
                f(device);
            }
        }
    }

    fn unlink(&self, who: &str) {
        self.each_device(who, Device::unlink);
    }
}

/// A phone number, or one of its devices.
struct Who {
    user: String,
    device: Option<u16>,
}

impl Who {
    /// `user`, `user:device`, either with `@s.whatsapp.net`.
    fn parse(text: &str) -> Who {
        let bare = text.split('@').next().unwrap_or_default();
        match bare.split_once(':') {
            Some((user, device)) => Who {
                user: user.to_owned(),
                device: Some(device.parse().unwrap_or(u16::MAX)),
            },
            None => Who {
                user: bare.to_owned(),
                device: None,
            },
        }
    }
}

#[derive(Default)]
struct State {
    accounts: BTreeMap<String, Account>,
    conns: HashMap<u64, Conn>,
    next_id: u64,
    pair_codes: Vec<String>,
    /// The contacts' phones, by phone number.
    contacts: BTreeMap<String, contact::Contact>,
    replies: Vec<Reply>,
    /// Chat states linked devices sent (typing), in order.
    chat_states: Vec<ChatState>,
    /// How each message from a contact was first encrypted, by message id.
    kinds: HashMap<String, contact::EncType>,
    /// How long a new connection waits before its WebSocket upgrade is answered.
    dial_delay: Duration,
    /// TCP connections accepted so far.
    dials: usize,
    /// Of those, the ones not admitted (nor refused, nor gone) yet.
    dialing: usize,
    /// Whether a login replaces the device's older connections (see [`StandIn::take_over`]).
    take_over: bool,
    /// The media CDN's uploads and downloads.
    media: media::MediaStore,
}

impl State {
    fn account(&mut self, user: &str) -> &mut Account {
        let count = self.accounts.len() as u64;
        self.accounts
            .entry(user.to_owned())
            .or_insert_with(|| Account {
                identity: KeyPair::generate(&mut rand::rng()),
                // LIDs are opaque numbers; these are recognisably the stand-in's.
                lid: (200_000_000_000_000 + count).to_string(),
                devices: BTreeMap::new(),
            })
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Finds the registering connection showing `qr`, reserves a device id for `user` and
    /// builds the `pair-success` iq for it.
    fn start_pairing(
        &mut self,
        qr: &phone::Qr,
        user: &str,
        done: oneshot::Sender<Result<u16, String>>,
    ) -> Result<(&Conn, wacore_binary::Node), String> {
        if user.is_empty() || !user.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{user:?} is not a phone number"));
        }
        let (conn_id, shows_key) = self
            .conns
            .iter()
            .find_map(|(id, c)| match &c.role {
                Role::Registering {
                    refs, noise_key, ..
                } if refs.contains(&qr.pairing_ref) => Some((*id, *noise_key == qr.noise_key)),
                _ => None,
            })
            .ok_or_else(|| format!("no registering client shows ref {}", qr.pairing_ref))?;
        if !shows_key {
            return Err("the QR code's noise key is not the client's".to_owned());
        }
        let iq_id = format!("standin-{}", self.next_id());
        let account = self.account(user);
        let device = (1..=u16::MAX)
            .find(|id| !account.devices.contains_key(id))
            .ok_or("no device id left")?;
        // Reserved now so a second scan picks another id; linked once the client signs.
        account.devices.insert(device, Device::default());
        let identity = phone::device_identity(
            &account.identity,
            &qr.identity_key,
            &qr.adv_secret,
            u32::from(device),
        )?;
        let node = stanza::pair_success(&iq_id, user, device, &account.lid, identity);
        let account_key = account.identity.public_key.public_key_bytes().to_vec();
        let Some(conn) = self.conns.get_mut(&conn_id) else {
            return Err("the registering client went away".to_owned());
        };
        let Role::Registering { scan, .. } = &mut conn.role else {
            return Err("the client is no longer registering".to_owned());
        };
        *scan = Some(Scan {
            iq_id,
            user: user.to_owned(),
            device,
            identity_key: qr.identity_key,
            account_key,
            done,
        });
        Ok((conn, node))
    }
}

/// A phone number's account: the phone's identity key and the linked devices.
struct Account {
    identity: KeyPair,
    lid: String,
    devices: BTreeMap<u16, Device>,
}

#[derive(Default)]
struct Device {
    linked: bool,
    /// The Noise key of the client that owns the device; logins with another key are refused.
    noise_key: Option<[u8; 32]>,
    live: usize,
    max_live: usize,
    /// Logins that replaced a live connection of the device.
    takeovers: usize,
    logins: usize,
    refused: usize,
    /// Logins are refused with a temporary ban until then.
    banned_until: Option<std::time::Instant>,
    bundle: Option<session::Bundle>,
    /// Messages from contacts not acknowledged yet, in order.
    inbox: VecDeque<mailbox::Envelope>,
}

impl Device {
    fn unlink(&mut self) {
        self.linked = false;
        self.noise_key = None;
        self.bundle = None;
        // WhatsApp drops what was queued for a removed device.
        self.inbox.clear();
    }
}

/// A connection past its handshake.
struct Conn {
    push: mpsc::UnboundedSender<Out>,
    /// Past its offline backlog: new messages go out on it at once.
    live: bool,
    role: Role,
}

enum Role {
    /// A client without a device, shown these refs as QR codes.
    Registering {
        noise_key: [u8; 32],
        refs: Vec<String>,
        scan: Option<Scan>,
    },
    /// A logged-in device.
    Device { user: String, device: u16 },
}

/// A `pair-success` sent, waiting for the client's `pair-device-sign`.
struct Scan {
    iq_id: String,
    user: String,
    device: u16,
    identity_key: [u8; 32],
    account_key: Vec<u8>,
    done: oneshot::Sender<Result<u16, String>>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
