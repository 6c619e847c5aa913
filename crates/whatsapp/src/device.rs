//! WhatsApp device-link bots (`--mode web`) on the platform seam, on `whatsapp-rust`.
//!
//! A linked number is one companion-device session. Its state (identity, Signal keys,
//! app-state keys) lives in the shared store through [`FencedBackend`], every write under the
//! claim's fence. The client dials only while the worker may act for the bot (the transport
//! factory asks first), so a worker that lost the bot never connects the session its
//! successor holds. Messages reach the runtime before WhatsApp is told they arrived: the
//! client's durability hook waits until the runtime has recorded them.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use async_trait::async_trait;
use botfleet_core::{Act, BotId, BotSpec, ChatKey, Inbound, Outbound, Platform};
use botfleet_platform::{
    Ack, Batch, Connection, ErrorKind, MayAct, PlatformError, Received, Receiver, Sender, SessionKv,
};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};
use whatsapp_rust::{
    bot::{Bot, BotHandle},
    http::{HttpClient, HttpRequest, HttpResponse},
    transport::{Transport, TransportEvent, TransportFactory},
    types::durability_hook::InboundDurabilityHook,
    Client, Jid, TokioRuntime,
};
use whatsapp_rust_tokio_transport::TokioWebSocketTransportFactory;

use crate::web::FencedBackend;

/// WhatsApp Web's socket.
pub const DEFAULT_WEB_URL: &str = "wss://web.whatsapp.com/ws/chat";

/// One-time prekeys uploaded at a time.
pub const PREKEY_BATCH: usize = 50;

/// How device-link bots connect (one for every bot of the process).
#[derive(Clone, Debug)]
pub struct WebConfig {
    /// The WhatsApp Web version to announce; `None` asks web.whatsapp.com for the current
    /// one (once a day per session). Tests against the stand-in pin it.
    pub version: Option<(u32, u32, u32)>,
    /// How long a connection may take to be accepted before the attempt counts as failed.
    pub connect_timeout: Duration,
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            version: None,
            connect_timeout: Duration::from_secs(30),
        }
    }
}

impl WebConfig {
    /// The defaults, with `BOTFLEET_WHATSAPP_WEB_VERSION` (`2.3000.1017`) pinning the version.
    ///
    /// # Errors
    /// A malformed version.
    pub fn from_env() -> Result<Self, String> {
        let mut cfg = Self::default();
        if let Ok(v) = std::env::var("BOTFLEET_WHATSAPP_WEB_VERSION") {
            cfg.version = Some(parse_version(&v)?);
        }
        Ok(cfg)
    }
}

/// `a.b.c` as three numbers.
///
/// # Errors
/// Anything else.
pub fn parse_version(v: &str) -> Result<(u32, u32, u32), String> {
    let parts: Vec<u32> = v
        .trim()
        .split('.')
        .map(|p| p.parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("a WhatsApp Web version looks like 2.3000.1017, not {v:?}"))?;
    match parts[..] {
        [a, b, c] => Ok((a, b, c)),
        _ => Err(format!(
            "a WhatsApp Web version looks like 2.3000.1017, not {v:?}"
        )),
    }
}

/// Figures of a process's device-link sessions, for the metrics endpoint.
#[derive(Debug, Default)]
pub struct WebStats {
    /// Sessions connected now.
    pub open: std::sync::atomic::AtomicI64,
    /// Session writes refused because a newer owner held the bot.
    pub refused_writes: Arc<AtomicU64>,
    /// Times a session was logged out by the phone.
    pub logged_out: AtomicU64,
    /// Times another connection took a session over.
    pub replaced: AtomicU64,
}

/// Whether this build skips the check of WhatsApp's server certificate: a build that links
/// the test stand-in (`botfleet-whatsapp-standin` turns on `wacore`'s
/// `danger-skip-cert-chain-verify`). Found out, not assumed: the client's own check is asked
/// to pass a chain whose signatures are zeros, which only such a build accepts. Said loudly
/// at start-up; such a build dials loopback addresses only.
pub fn skips_server_certificate() -> bool {
    static SKIPS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SKIPS.get_or_init(|| {
        use waproto::{
            buffa::{Message as _, MessageField},
            whatsapp as wa,
        };
        let key = [9u8; 32];
        let details = |serial: u32, issuer: u32| {
            wa::cert_chain::noise_certificate::Details {
                serial: Some(serial),
                issuer_serial: Some(issuer),
                key: Some(key.to_vec()),
                not_before: None,
                not_after: None,
            }
            .encode_to_vec()
        };
        let unsigned = |d: Vec<u8>| wa::cert_chain::NoiseCertificate {
            details: Some(d),
            signature: Some(vec![0; 64]),
        };
        let chain = wa::CertChain {
            intermediate: MessageField::some(unsigned(details(1, 0))),
            leaf: MessageField::some(unsigned(details(2, 1))),
        }
        .encode_to_vec();
        wacore::noise::HandshakeUtils::verify_server_cert(&chain, &key).is_ok()
    })
}

/// Whether `url` (`ws://host:port/…`) names this machine.
pub(crate) fn is_loopback(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A build that does not check the server's certificate dials nothing but this machine.
fn refuse_unverified(url: &str) -> Result<(), PlatformError> {
    if skips_server_certificate() && !is_loopback(url) {
        return Err(PlatformError::new(
            ErrorKind::Rejected,
            "unverified_build",
            "this build does not check WhatsApp's server certificate (it links the test stand-in): it dials loopback addresses only; run a build of `cargo build --release -p botfleet`",
        ));
    }
    Ok(())
}

fn url(spec: &BotSpec) -> String {
    spec.options
        .api_url
        .clone()
        .unwrap_or_else(|| DEFAULT_WEB_URL.to_owned())
}

/// Dials only while the worker may act for the bot.
struct GuardedDial {
    inner: TokioWebSocketTransportFactory,
    may_act: MayAct,
    /// The connection dialed last, so that a stop can close it even when the client's own
    /// graceful disconnect is slow.
    current: Socket,
}

/// The client's current connection, shared with its [`Running`]; once a stop began, a dial
/// that lands is closed at once instead of kept (the client's own disconnect does not reach a
/// dial in flight: it would log in after the stop, beside the next owner's connection).
#[derive(Default)]
struct Dialed {
    current: Option<Arc<dyn Transport>>,
    closing: bool,
}

type Socket = Arc<std::sync::Mutex<Dialed>>;

fn dialed(socket: &Socket) -> std::sync::MutexGuard<'_, Dialed> {
    socket.lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks the client as stopping and takes its connection, to close.
fn closing(socket: &Socket) -> Option<Arc<dyn Transport>> {
    let mut d = dialed(socket);
    d.closing = true;
    d.current.take()
}

#[async_trait]
impl TransportFactory for GuardedDial {
    async fn create_transport(
        &self,
    ) -> whatsapp_rust::anyhow::Result<(
        Arc<dyn Transport>,
        whatsapp_rust::async_channel::Receiver<TransportEvent>,
    )> {
        let refused = || {
            whatsapp_rust::anyhow::anyhow!("this worker may no longer act for the bot: not dialing")
        };
        if !(self.may_act)() || dialed(&self.current).closing {
            return Err(refused());
        }
        let (transport, events) = self.inner.create_transport().await?;
        // Asked again once the dial landed: a stop or a lost lease meanwhile closes it here.
        let kept = {
            let mut d = dialed(&self.current);
            let keep = !d.closing && (self.may_act)();
            if keep {
                d.current = Some(transport.clone());
            }
            keep
        };
        if !kept {
            transport.disconnect().await;
            return Err(refused());
        }
        Ok((transport, events))
    }
}

/// The client's HTTP needs (the current WhatsApp Web version; media uploads and downloads)
/// over a reqwest pool.
#[derive(Debug)]
pub(crate) struct Http(pub(crate) reqwest::Client);

impl Http {
    /// A pool for media and version checks.
    pub(crate) fn new() -> Result<Http, reqwest::Error> {
        reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map(Http)
    }
}

/// Where a request goes: as asked, except that a build linking the test stand-in speaks
/// plain HTTP to loopback (its CDN has no certificate; the client builds `https://` URLs).
fn http_target(url: &str) -> std::borrow::Cow<'_, str> {
    match url.strip_prefix("https://") {
        Some(rest) if skips_server_certificate() && is_loopback(url) => {
            format!("http://{rest}").into()
        }
        _ => url.into(),
    }
}

#[async_trait]
impl HttpClient for Http {
    async fn execute(&self, request: HttpRequest) -> whatsapp_rust::anyhow::Result<HttpResponse> {
        let method = reqwest::Method::from_bytes(request.method.as_bytes())?;
        let mut req = self.0.request(method, &*http_target(&request.url));
        for (k, v) in &request.headers {
            req = req.header(k, v);
        }
        if let Some(body) = request.body {
            req = req.body(body.to_vec());
        }
        let resp = req.send().await?;
        let status_code = resp.status().as_u16();
        let body = resp.bytes().await?.to_vec();
        Ok(HttpResponse { status_code, body })
    }
}

/// What the client's events mean to the bot.
#[derive(Debug)]
enum Ev {
    Connected,
    Disconnected(String),
    LoggedOut(String),
    Replaced,
    QrCode(String),
    PairCode(String),
    Paired(String),
    PairFailed(String),
    /// The client gave up and will not reconnect by itself (a temporary ban, an outdated
    /// client, another connect failure).
    GaveUp(PlatformError),
}

struct Events(mpsc::UnboundedSender<Ev>);

impl whatsapp_rust::types::events::EventHandler for Events {
    fn handle_event(&self, event: Arc<whatsapp_rust::types::events::Event>) {
        use whatsapp_rust::types::events::Event;
        let ev = match &*event {
            Event::Connected(_) => Ev::Connected,
            Event::Disconnected(d) => Ev::Disconnected(format!("{:?}", d.reason)),
            Event::LoggedOut(l) => Ev::LoggedOut(format!("{:?}", l.reason)),
            Event::StreamReplaced(_) => Ev::Replaced,
            Event::PairingQrCode(q) => Ev::QrCode(q.code.clone()),
            Event::PairingCode(c) => Ev::PairCode(c.code.clone()),
            Event::PairSuccess(p) => Ev::Paired(p.id.to_string()),
            Event::PairError(e) => Ev::PairFailed(format!("{e:?}")),
            Event::PairingCodeError(e) => Ev::PairFailed(format!("{e:?}")),
            Event::PairingQrCodesExhausted(_) => {
                Ev::PairFailed("every QR code expired unscanned".into())
            }
            Event::TemporaryBan(b) => {
                let wait = b.expire.to_std().unwrap_or(Duration::from_secs(3600));
                Ev::GaveUp(PlatformError::new(
                    ErrorKind::RateLimited(wait),
                    "temporary_ban",
                    format!(
                        "WhatsApp banned this number for {} s ({:?})",
                        wait.as_secs(),
                        b.code
                    ),
                ))
            }
            Event::ClientOutdated(_) => Ev::GaveUp(PlatformError::new(
                ErrorKind::Credentials,
                "client_outdated",
                "WhatsApp says this client version is outdated: unset or raise \
                 --whatsapp-web-version, or upgrade botfleet",
            )),
            Event::ConnectFailure(f) => Ev::GaveUp(PlatformError::new(
                ErrorKind::Transient,
                "connect_failure",
                format!("WhatsApp refused the connection ({:?})", f.reason),
            )),
            _ => return,
        };
        let _ = self.0.send(ev);
    }
}

/// Messages handed to the runtime, acknowledged to WhatsApp once it recorded them.
struct Delivery {
    messages: Vec<Received>,
    recorded: oneshot::Sender<()>,
}

/// The client's durability hook: WhatsApp is told a message arrived only after the runtime
/// recorded it (a worker killed before that gets it redelivered to its successor).
struct Hand {
    bot: BotId,
    tx: mpsc::Sender<Delivery>,
}

#[async_trait]
impl InboundDurabilityHook for Hand {
    async fn on_messages(
        &self,
        _client: Arc<Client>,
        batch: &[whatsapp_rust::types::events::InboundMessage],
    ) -> whatsapp_rust::anyhow::Result<()> {
        use whatsapp_rust::wacore::proto_helpers::MessageExt;
        let messages: Vec<Received> = batch
            .iter()
            .filter(|m| !m.info.source.is_from_me)
            .filter_map(|m| {
                let base = m.message.get_base_message();
                let file = crate::web_media::attachment(base);
                let text = match (base.text_content(), &file) {
                    (Some(text), _) => text,
                    (None, Some(_)) => base.get_caption().unwrap_or_default(),
                    (None, None) => return None,
                };
                let src = &m.info.source;
                let chat = src.chat.to_string();
                let mut message = Inbound::message(
                    Platform::Whatsapp,
                    ChatKey::new(self.bot.clone(), chat.clone()),
                    m.info.id.to_string(),
                    Some(src.sender.to_string()),
                    text,
                    Some(m.info.timestamp.timestamp_millis()),
                );
                message.attachments.extend(file);
                Some(Received {
                    key: format!("{chat}|{}|{}", src.sender, m.info.id),
                    message,
                })
            })
            .collect();
        if messages.is_empty() {
            return Ok(());
        }
        let (recorded, done) = oneshot::channel();
        self.tx
            .send(Delivery { messages, recorded })
            .await
            .map_err(|_| whatsapp_rust::anyhow::anyhow!("the bot stopped receiving"))?;
        // Not acknowledged unless recorded: WhatsApp delivers it again.
        tokio::time::timeout(Duration::from_secs(60), done)
            .await
            .map_err(|_| whatsapp_rust::anyhow::anyhow!("not recorded in time"))?
            .map_err(|_| whatsapp_rust::anyhow::anyhow!("the bot stopped before recording"))
    }
}

/// A started client and its channels.
struct Running {
    handle: Option<BotHandle>,
    client: Arc<Client>,
    socket: Socket,
    events: mpsc::UnboundedReceiver<Ev>,
    deliveries: mpsc::Receiver<Delivery>,
}

async fn start(
    cfg: &WebConfig,
    url: String,
    bot: &BotId,
    backend: Arc<FencedBackend>,
    may_act: MayAct,
    linking: bool,
    phone: Option<String>,
) -> Result<Running, PlatformError> {
    refuse_unverified(&url)?;
    let (etx, events) = mpsc::unbounded_channel();
    let socket: Socket = Arc::default();
    let (dtx, deliveries) = mpsc::channel(64);
    let http = Http::new()
        .map_err(|e| PlatformError::new(ErrorKind::Transient, "http_client", e.to_string()))?;
    let mut builder = Bot::builder()
        .with_backend_arc(backend)
        .with_transport_factory(GuardedDial {
            inner: TokioWebSocketTransportFactory::new().with_url(url),
            may_act,
            current: socket.clone(),
        })
        .with_http_client(http)
        .with_runtime(TokioRuntime)
        .with_event_handler(Events(etx))
        .with_inbound_durability_hook(Hand {
            bot: bot.clone(),
            tx: dtx,
        })
        .skip_history_sync()
        // whatsmeow's batch: WhatsApp asks for more when the server runs low, and a session
        // keeps every unused one (812, WhatsApp Web's batch, cost ~250 KiB per session).
        .with_wanted_pre_key_count(PREKEY_BATCH);
    if let Some(v) = cfg.version {
        builder = builder.with_version(v);
    }
    if linking {
        // The name the phone shows for the linked device until the phone syncs its own.
        builder = builder.with_push_name(bot.to_string());
    }
    if let Some(phone) = phone {
        builder = builder.with_pair_code(whatsapp_rust::wacore::pair_code::PairCodeOptions {
            phone_number: phone,
            ..Default::default()
        });
    }
    let built = builder.build().await.map_err(|e| {
        PlatformError::new(
            ErrorKind::Transient,
            "client_build",
            format!("cannot start the WhatsApp client: {e}"),
        )
    })?;
    let client = built.client();
    let handle = built.spawn();
    Ok(Running {
        handle: Some(handle),
        client,
        socket,
        events,
        deliveries,
    })
}

impl Running {
    /// Disconnects cleanly (the client flushes its state, through the fence still held) and
    /// waits for it to end; closes the connection itself when that takes too long, and in any
    /// case whatever connection is still open once the client ended (a dial in flight).
    async fn stop(&mut self) {
        if let Some(handle) = self.handle.take() {
            // A dial landing while the client disconnects is closed, not logged in.
            dialed(&self.socket).closing = true;
            // Well inside the time a worker gives a stopping bot (5 s) before it hands the bot
            // over: the connection must be closed by then.
            if tokio::time::timeout(GRACEFUL_STOP, handle.shutdown())
                .await
                .is_err()
            {
                warn!(
                    "the WhatsApp client did not disconnect within {} s; closing its connection",
                    GRACEFUL_STOP.as_secs()
                );
            }
            self.close_socket().await;
        }
    }

    /// Closes the connection itself, whatever the client is doing; no dial is kept after it.
    async fn close_socket(&self) {
        close(closing(&self.socket)).await;
    }
}

/// Closes a connection, giving it a second at most.
async fn close(transport: Option<Arc<dyn Transport>>) {
    if let Some(t) = transport {
        let _ = tokio::time::timeout(Duration::from_secs(1), t.disconnect()).await;
    }
}

/// How often a connect in progress asks whether this worker may still act for the bot.
const MAY_ACT_TICK: Duration = Duration::from_millis(100);

/// How long a clean disconnect (flushing the client's state) may take on a stop.
const GRACEFUL_STOP: Duration = Duration::from_secs(3);

impl Drop for Running {
    /// A client dropped without [`Running::stop`] (a connect abandoned midway) still
    /// disconnects, and keeps no dial that lands afterwards. The runtime lets a connect end
    /// instead of dropping it, so this is the last resort.
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            let socket = closing(&self.socket);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    close(socket).await;
                    let _ = tokio::time::timeout(GRACEFUL_STOP, handle.shutdown()).await;
                });
            }
        }
    }
}

/// Why a session ended before it was connected.
enum Early {
    LoggedOut(String),
    Replaced,
    GaveUp(PlatformError),
}

fn stopped() -> PlatformError {
    PlatformError::new(
        ErrorKind::Transient,
        "client_stopped",
        "the WhatsApp client stopped",
    )
}

fn not_owner() -> PlatformError {
    PlatformError::new(
        ErrorKind::Transient,
        "not_owner",
        "this worker no longer holds the bot",
    )
}

fn logged_out(bot: &BotId, why: &str) -> PlatformError {
    PlatformError::new(
        ErrorKind::Credentials,
        "logged_out",
        format!("logged out by the phone ({why}): link again with `botfleet bots link {bot}`"),
    )
}

fn replaced() -> PlatformError {
    PlatformError::new(
        ErrorKind::Credentials,
        "stream_replaced",
        "another client connected with this linked session (stream replaced); stopped so as \
         not to fight for it: stop the other client, then `botfleet bots restart` the bot",
    )
}

/// Reads a session whole; `what` names it in the error.
async fn read_session(
    session: Arc<dyn SessionKv>,
    what: &str,
) -> Result<FencedBackend, PlatformError> {
    FencedBackend::load(session).await.map_err(|e| {
        PlatformError::new(
            ErrorKind::Transient,
            "session_read",
            format!("cannot read {what}: {e}"),
        )
    })
}

/// Opens a linked bot's session: the bot's connection once WhatsApp accepted it.
pub(crate) async fn connect(
    cfg: &WebConfig,
    stats: &Arc<WebStats>,
    spec: &BotSpec,
    may_act: MayAct,
    session: Arc<dyn SessionKv>,
) -> Result<Connection, PlatformError> {
    let backend = read_session(session.clone(), "the linked session")
        .await?
        .counting(stats.refused_writes.clone());
    if !backend.is_linked() {
        return Err(PlatformError::new(
            ErrorKind::Credentials,
            "not_linked",
            format!(
                "not linked: run `botfleet bots link {}` and confirm on the phone",
                spec.id
            ),
        ));
    }
    let backend = Arc::new(backend);
    let mut run = start(
        cfg,
        url(spec),
        &spec.id,
        backend.clone(),
        may_act.clone(),
        false,
        None,
    )
    .await?;
    let mut early = VecDeque::new();
    // Asked while waiting too: a stop (or a lost lease) ends the connect within a tick, the
    // runtime waits for it, and the next owner meets no connection of ours.
    let mut tick = tokio::time::interval(MAY_ACT_TICK);
    let outcome = tokio::time::timeout(cfg.connect_timeout, async {
        loop {
            tokio::select! {
                _ = tick.tick() => if !may_act() {
                    return Err(Early::GaveUp(not_owner()));
                },
                ev = run.events.recv() => match ev {
                    Some(Ev::Connected) => return Ok(()),
                    Some(Ev::LoggedOut(why)) => return Err(Early::LoggedOut(why)),
                    Some(Ev::Replaced) => return Err(Early::Replaced),
                    Some(Ev::GaveUp(e)) => return Err(Early::GaveUp(e)),
                    Some(_) => debug!(bot = %spec.id, "a client event before connected"),
                    None => return Err(Early::GaveUp(stopped())),
                },
                // Messages come before `Connected` when WhatsApp held some (the offline
                // queue), and the client finishes that queue only once they are recorded:
                // the session is accepted, the runtime takes over from here.
                d = run.deliveries.recv() => if let Some(d) = d {
                    early.push_back(d);
                    return Ok(());
                },
            }
        }
    })
    .await;
    // Not connected, or no longer ours: the client stops here, whatever the reason.
    let lost = !may_act();
    if lost || !matches!(outcome, Ok(Ok(()))) {
        run.stop().await;
    }
    // A worker that lost the bot meanwhile (frozen, fenced, stopping) says nothing about the
    // session and lets it go: its successor owns it.
    if lost {
        return Err(not_owner());
    }
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(Early::LoggedOut(why))) => {
            stats.logged_out.fetch_add(1, Ordering::Relaxed);
            let _ = session.clear().await;
            return Err(logged_out(&spec.id, &why));
        }
        Ok(Err(Early::Replaced)) => {
            stats.replaced.fetch_add(1, Ordering::Relaxed);
            return Err(replaced());
        }
        Ok(Err(Early::GaveUp(e))) => return Err(e),
        Err(_) => {
            return Err(PlatformError::new(
                ErrorKind::Transient,
                "connect_timeout",
                format!(
                    "WhatsApp did not accept the session within {} s",
                    cfg.connect_timeout.as_secs()
                ),
            ));
        }
    }
    info!(bot = %spec.id, "WhatsApp session connected");
    let client = Arc::new(std::sync::RwLock::new(run.client.clone()));
    stats.open.fetch_add(1, Ordering::Relaxed);
    Ok(Connection {
        receiver: Box::new(WebReceiver {
            bot: spec.id.clone(),
            stats: stats.clone(),
            may_act,
            open: true,
            run,
            relaunch: Relaunch {
                cfg: cfg.clone(),
                url: url(spec),
                backend,
                client: client.clone(),
            },
            session,
            early,
            waiting: HashMap::new(),
            next_ack: 0,
        }),
        sender: Arc::new(WebSender { client }),
    })
}

/// What starting the client again takes, after it gave up on its own (a temporary ban over,
/// a connect failure).
struct Relaunch {
    cfg: WebConfig,
    url: String,
    backend: Arc<FencedBackend>,
    /// The client the sender uses: replaced on a relaunch.
    client: Arc<std::sync::RwLock<Arc<Client>>>,
}

struct WebReceiver {
    bot: BotId,
    stats: Arc<WebStats>,
    may_act: MayAct,
    open: bool,
    run: Running,
    relaunch: Relaunch,
    session: Arc<dyn SessionKv>,
    early: VecDeque<Delivery>,
    waiting: HashMap<String, oneshot::Sender<()>>,
    next_ack: u64,
}

impl WebReceiver {
    async fn stop(&mut self) {
        self.run.stop().await;
        if std::mem::take(&mut self.open) {
            self.stats.open.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// A worker that lost the bot (frozen past its lease, or stopping) reports nothing about
    /// the session: its successor owns it now.
    fn lost(&self) -> Option<PlatformError> {
        (!(self.may_act)()).then(not_owner)
    }

    fn batch(&mut self, d: Delivery) -> Batch {
        self.next_ack += 1;
        let id = self.next_ack.to_string();
        self.waiting.insert(id.clone(), d.recorded);
        Batch {
            messages: d.messages,
            ack: Ack(vec![id]),
            ..Batch::default()
        }
    }
}

#[async_trait]
impl Receiver for WebReceiver {
    async fn next(&mut self) -> Result<Batch, PlatformError> {
        if let Some(d) = self.early.pop_front() {
            return Ok(self.batch(d));
        }
        if self.run.handle.is_none() {
            // The client gave up earlier (the runtime waited as the error said): start it
            // again, if this worker still holds the bot.
            if let Some(e) = self.lost() {
                return Err(e);
            }
            let r = &self.relaunch;
            let run = start(
                &r.cfg,
                r.url.clone(),
                &self.bot,
                r.backend.clone(),
                self.may_act.clone(),
                false,
                None,
            )
            .await?;
            *r.client.write().unwrap_or_else(|e| e.into_inner()) = run.client.clone();
            self.run = run;
            self.open = true;
            self.stats.open.fetch_add(1, Ordering::Relaxed);
            info!(bot = %self.bot, "WhatsApp client started again");
        }
        loop {
            tokio::select! {
                ev = self.run.events.recv() => match ev {
                    Some(Ev::LoggedOut(why)) => {
                        self.stop().await;
                        if let Some(e) = self.lost() {
                            return Err(e);
                        }
                        self.stats.logged_out.fetch_add(1, Ordering::Relaxed);
                        // The session is of no use any more: a new link starts afresh.
                        if let Err(e) = self.session.clear().await {
                            warn!(bot = %self.bot, error = %e, "cannot clear the logged-out session");
                        }
                        return Err(logged_out(&self.bot, &why));
                    }
                    Some(Ev::Replaced) => {
                        self.stop().await;
                        if let Some(e) = self.lost() {
                            return Err(e);
                        }
                        self.stats.replaced.fetch_add(1, Ordering::Relaxed);
                        return Err(replaced());
                    }
                    Some(Ev::GaveUp(e)) => {
                        self.stop().await;
                        return Err(self.lost().unwrap_or(e));
                    }
                    Some(Ev::Disconnected(why)) => {
                        // The client reconnects by itself with backoff (each dial asks first).
                        debug!(bot = %self.bot, reason = %why, "WhatsApp connection dropped; reconnecting");
                    }
                    Some(_) => {}
                    None => return Err(stopped()),
                },
                d = self.run.deliveries.recv() => match d {
                    Some(d) => return Ok(self.batch(d)),
                    None => return Err(stopped()),
                },
            }
        }
    }

    async fn ack(&mut self, ack: Ack) -> Result<Option<String>, PlatformError> {
        for id in ack.0 {
            if let Some(tx) = self.waiting.remove(&id) {
                let _ = tx.send(());
            }
        }
        Ok(None)
    }

    async fn close(&mut self) {
        // Unrecorded deliveries stay unacknowledged: WhatsApp gives them to the next owner.
        // Dropping their answers now ends the client's waits at once, so it disconnects fast.
        self.waiting.clear();
        self.early.clear();
        self.run.deliveries.close();
        while self.run.deliveries.try_recv().is_ok() {}
        self.stop().await;
    }
}

struct WebSender {
    client: Arc<std::sync::RwLock<Arc<Client>>>,
}

#[async_trait]
impl Sender for WebSender {
    async fn send(&self, out: &Outbound) -> Result<(), PlatformError> {
        if out.text.is_empty() {
            return Ok(());
        }
        let to = jid_of(&out.chat)?;
        self.deliver(to, wa_text(&out.text), message_id(&out.idempotency_key))
            .await
    }

    fn typing_every(&self, _: &Inbound) -> Option<Duration> {
        // A contact's phone shows "typing…" until the next message or `paused`, and drops a
        // state it has not heard again for a while.
        Some(Duration::from_secs(10))
    }

    async fn act(
        &self,
        chat: &ChatKey,
        act: &Act<'_>,
        key: &str,
    ) -> Result<Option<String>, PlatformError> {
        if let Act::Typing = act {
            let to = jid_of(chat)?;
            self.client()
                .chatstate()
                .send_composing(&to)
                .await
                .map_err(|e| {
                    PlatformError::new(
                        ErrorKind::Transient,
                        "chatstate",
                        format!("cannot show typing: {e}"),
                    )
                })?;
            return Ok(None);
        }
        let Act::Send {
            text,
            buttons: [],
            files,
            ..
        } = act
        else {
            return Err(botfleet_platform::unsupported(act));
        };
        let to = jid_of(chat)?;
        // The text goes as the first file's caption where its kind shows one; else first,
        // as a message of its own. Each message has an id of its own, the same on a resend.
        let captioned = files
            .first()
            .is_some_and(|f| crate::web_media::has_caption(f.kind));
        let mut first = None;
        if !text.is_empty() && !captioned {
            let id = message_id(key);
            self.deliver(to.clone(), wa_text(text), id.clone()).await?;
            first = Some(id);
        }
        for (i, f) in files.iter().enumerate() {
            let caption = (i == 0 && captioned).then_some(*text);
            let message = crate::web_media::upload(&self.client(), f, caption).await?;
            let id = message_id(&format!("{key}#file{i}"));
            self.deliver(to.clone(), message, id.clone()).await?;
            first.get_or_insert(id);
        }
        Ok(first)
    }
}

impl WebSender {
    /// The bot's current client.
    fn client(&self) -> Arc<Client> {
        self.client
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sends `message` to `to` as message `id`.
    async fn deliver(
        &self,
        to: Jid,
        message: whatsapp_rust::waproto::whatsapp::Message,
        id: String,
    ) -> Result<(), PlatformError> {
        // The same reply always carries the same message id: a resend (a retry, a successor
        // replaying what was answered but not yet marked) is the same message to WhatsApp.
        let options = whatsapp_rust::SendOptions::default().with_message_id(id);
        self.client()
            .send_message_with_options(to, message, options)
            .await
            .map(|_| ())
            .map_err(|e| {
                PlatformError::new(
                    ErrorKind::Transient,
                    "send_failed",
                    format!("WhatsApp did not take the message: {e}"),
                )
            })
    }
}

/// The chat's JID.
fn jid_of(chat: &ChatKey) -> Result<Jid, PlatformError> {
    chat.chat.parse().map_err(|_| {
        PlatformError::new(
            ErrorKind::Rejected,
            "bad_chat",
            format!("{:?} is not a WhatsApp chat", chat.chat),
        )
    })
}

/// A WhatsApp-shaped message id (`3EB0` and 16 hex bytes) derived from an idempotency key.
fn message_id(key: &str) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(key.as_bytes());
    let hex: String = d[..16].iter().map(|b| format!("{b:02X}")).collect();
    format!("3EB0{hex}")
}

fn wa_text(text: &str) -> whatsapp_rust::waproto::whatsapp::Message {
    use whatsapp_rust::wacore::proto_helpers::MessageBuilderExt;
    whatsapp_rust::waproto::whatsapp::Message::text(text)
}

/// What `link` shows the operator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkPrompt {
    /// A QR code to scan in WhatsApp > Linked devices (its text; it rotates).
    Qr(String),
    /// The code to enter on the phone (linking with a phone number).
    Code(String),
}

/// Why linking failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Nobody confirmed on the phone in time.
    #[error("no phone confirmed the link within {0} s; run the command again to get a new code")]
    Timeout(u64),
    /// WhatsApp never offered a code: it could not be reached.
    #[error(
        "WhatsApp did not answer within {1} s (no code came from {0}): check this machine's \
         connection to it"
    )]
    Unreachable(String, u64),
    /// WhatsApp or the phone refused.
    #[error("linking failed: {0}")]
    Refused(String),
    /// Another writer took the session while this link ran (a second `bots link` of the bot):
    /// what this link wrote was refused.
    #[error(
        "another link of this bot began meanwhile and owns its session now: this link is void \
         (if the phone lists the device it added, remove it in Linked devices)"
    )]
    Superseded,
    /// The session could not be read or written.
    #[error("{0}")]
    Platform(#[from] PlatformError),
}

/// Links a bot: registers as a new companion device, shows each QR code (or the pairing
/// code for `phone`) through `prompt`, waits until the phone confirms and WhatsApp accepts the
/// new device, and leaves the session stored. Answers the linked account's JID.
///
/// # Errors
/// [`LinkError`].
pub async fn link(
    cfg: &WebConfig,
    bot: &BotId,
    api_url: Option<&str>,
    session: Arc<dyn SessionKv>,
    phone: Option<String>,
    timeout: Duration,
    prompt: impl Fn(LinkPrompt) + Send + Sync,
) -> Result<String, LinkError> {
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let backend = read_session(session.clone(), "the session")
        .await?
        .counting(refused.clone());
    let url = api_url.map_or_else(|| DEFAULT_WEB_URL.to_owned(), str::to_owned);
    let mut run = start(
        cfg,
        url.clone(),
        bot,
        Arc::new(backend),
        Arc::new(|| true),
        true,
        phone,
    )
    .await?;
    let mut paired: Option<String> = None;
    let mut prompted = false;
    let mut tick = tokio::time::interval(MAY_ACT_TICK);
    let outcome = tokio::time::timeout(timeout, async {
        loop {
            tokio::select! {
                // A refused write: another link owns the session now, waiting is in vain.
                _ = tick.tick() => if refused.load(Ordering::Relaxed) > 0 {
                    return Err(LinkError::Superseded);
                },
                ev = run.events.recv() => match ev {
                    Some(Ev::QrCode(code)) => {
                        prompted = true;
                        prompt(LinkPrompt::Qr(code));
                    }
                    Some(Ev::PairCode(code)) => {
                        prompted = true;
                        prompt(LinkPrompt::Code(code));
                    }
                    Some(Ev::Paired(jid)) => paired = Some(jid),
                    Some(Ev::Connected) if paired.is_some() => return Ok(()),
                    Some(Ev::PairFailed(why)) => return Err(LinkError::Refused(why)),
                    Some(Ev::LoggedOut(why)) => return Err(LinkError::Refused(format!("logged out: {why}"))),
                    Some(_) => {}
                    None => return Err(LinkError::Refused("the client stopped".into())),
                },
                // Messages that arrive during linking are left for the bot's worker.
                d = run.deliveries.recv() => drop(d),
            }
        }
    })
    .await;
    run.stop().await;
    // A write refused as stale: a newer writer owns the session, whatever it holds now.
    if refused.load(Ordering::Relaxed) > 0 {
        return Err(LinkError::Superseded);
    }
    // The client writes the new device on its way out: linked only if the store has it.
    if matches!(outcome, Ok(Ok(()))) {
        let stored = read_session(session, "the session back").await?;
        if !stored.is_linked() {
            return Err(LinkError::Refused(
                "the phone confirmed, but the session could not be stored (was the bot started \
                 meanwhile?); run the command again"
                    .into(),
            ));
        }
    }
    match outcome {
        Ok(Ok(())) => Ok(paired.unwrap_or_default()),
        Ok(Err(e)) => Err(e),
        Err(_) if !prompted => Err(LinkError::Unreachable(url, timeout.as_secs())),
        Err(_) => Err(LinkError::Timeout(timeout.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_keeps_its_message_id_across_resends() {
        let a = message_id("wa:1555@s.whatsapp.net:3EB0AA:reply");
        assert_eq!(a, message_id("wa:1555@s.whatsapp.net:3EB0AA:reply"));
        assert_ne!(a, message_id("wa:1555@s.whatsapp.net:3EB0AB:reply"));
        assert!(a.starts_with("3EB0") && a.len() == 36);
        assert!(a[4..].bytes().all(|b| b.is_ascii_hexdigit()));
    }

    /// Whether the check is off depends on what else this build links (`cargo test
    /// --workspace` unifies the stand-in's feature into every crate; `cargo test -p
    /// botfleet-whatsapp --features web` does not): either way a loopback stand-in is dialed,
    /// and WhatsApp only while the check is on. The release tree is checked in
    /// `crates/botfleet/tests/release_tree.rs`.
    #[test]
    fn an_unchecked_build_dials_loopback_only() {
        assert!(refuse_unverified("ws://127.0.0.1:9/ws/chat").is_ok());
        let far = refuse_unverified(DEFAULT_WEB_URL);
        assert_eq!(far.is_err(), skips_server_certificate());
        if let Err(e) = far {
            assert_eq!(e.kind(), ErrorKind::Rejected);
        }
    }

    #[test]
    fn loopback_addresses_are_told_apart() {
        for url in [
            "ws://127.0.0.1:9/ws/chat",
            "ws://localhost:9",
            "ws://[::1]:9/x",
            "ws://127.3.2.1",
        ] {
            assert!(is_loopback(url), "{url}");
        }
        for url in [
            "wss://web.whatsapp.com/ws/chat",
            "ws://192.0.2.1:9",
            "ws://127.0.0.1.evil.example/x",
            "ws://[2001:db8::1]:9",
        ] {
            assert!(!is_loopback(url), "{url}");
        }
    }

    #[test]
    fn versions_are_three_numbers() {
        assert_eq!(parse_version("2.3000.1017"), Ok((2, 3000, 1017)));
        assert!(parse_version("2.3000").is_err());
        assert!(parse_version("2.x.1").is_err());
        assert!(parse_version("").is_err());
    }
}
