//! A bot's Socket Mode connection: open (`apps.connections.open`, the WebSocket, `hello`),
//! read envelopes, acknowledge them, refresh on `disconnect` (the new socket first, then the old
//! one closed, so no event waits for a socket), reconnect when a socket dies.

use std::{
    sync::{
        atomic::{AtomicI64, Ordering},
        Arc,
    },
    time::Duration,
};

use async_trait::async_trait;
use botfleet_core::BotId;
use botfleet_platform::{Ack, Batch, ErrorKind, PlatformError, Received, Receiver};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::net::TcpStream;
use tokio_tungstenite::{
    connect_async_with_config,
    tungstenite::{protocol::WebSocketConfig, Message},
    MaybeTlsStream, WebSocketStream,
};
use tracing::{debug, info, warn};

use crate::{
    inbound::{parse_command, parse_event, parse_frame, parse_interactive, Event, Frame, Me},
    SlackApi, SlackClient, SlackError,
};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// An open socket, counted in the connector's gauge while it lives.
struct Socket {
    ws: Ws,
    open: Arc<AtomicI64>,
}

impl Drop for Socket {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Socket {
    /// Sends a close frame, waiting briefly: Slack may not answer it.
    async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.ws.close(None)).await;
    }
}

/// The inbound side of a Slack bot.
pub(crate) struct SocketReceiver {
    pub(crate) client: SlackClient,
    pub(crate) api: SlackApi,
    pub(crate) bot: BotId,
    pub(crate) me: Me,
    pub(crate) open: Arc<AtomicI64>,
    socket: Option<Socket>,
    /// Bumped with every new socket: an ack names the socket its envelope came on.
    generation: u64,
}

impl SocketReceiver {
    pub(crate) fn new(
        client: SlackClient,
        api: SlackApi,
        bot: BotId,
        me: Me,
        open: Arc<AtomicI64>,
    ) -> Self {
        Self {
            client,
            api,
            bot,
            me,
            open,
            socket: None,
            generation: 0,
        }
    }

    fn ws_config(&self) -> WebSocketConfig {
        let c = self.client.config();
        WebSocketConfig::default()
            .read_buffer_size(c.read_buffer)
            // Writes are acks and closes: written at once, no buffer kept.
            .write_buffer_size(0)
            .max_write_buffer_size(1 << 20)
            .max_message_size(Some(c.max_message))
            .max_frame_size(Some(c.max_message))
    }

    /// Opens a new socket and waits for its `hello`.
    async fn connect(&self) -> Result<Socket, SlackError> {
        let url = self.client.connections_open(&self.api).await?;
        let limit = self.client.config().connect_timeout;
        let (ws, _) = tokio::time::timeout(
            limit,
            connect_async_with_config(url.as_str(), Some(self.ws_config()), true),
        )
        .await
        .map_err(|_| SlackError::network(format!("WebSocket connect: no answer within {limit:?}")))?
        // Not kept as the source: the handshake's error names the socket URL, whose ticket
        // opens the app's socket.
        .map_err(|e| {
            SlackError::network(format!("WebSocket connect: {}", strip(&e.to_string())))
        })?;
        self.open.fetch_add(1, Ordering::Relaxed);
        let mut socket = Socket {
            ws,
            open: self.open.clone(),
        };
        let hello = tokio::time::timeout(limit, async {
            while let Some(m) = socket.ws.next().await {
                match m {
                    Ok(Message::Text(t)) => match parse_frame(&t) {
                        Ok(Frame::Hello) => return Ok(()),
                        Ok(Frame::Disconnect(r)) if r == "link_disabled" => {
                            return Err(SlackError::LinkDisabled)
                        }
                        Ok(Frame::Disconnect(r)) => {
                            return Err(SlackError::network(format!(
                                "disconnected before hello ({r})"
                            )))
                        }
                        // Anything before hello comes again later.
                        _ => {}
                    },
                    Ok(_) => {}
                    Err(e) => {
                        return Err(SlackError::network_from(format!("before hello: {e}"), e))
                    }
                }
            }
            Err(SlackError::network("closed before hello"))
        })
        .await
        .map_err(|_| SlackError::network(format!("no hello within {limit:?}")))?;
        hello.map(|()| socket)
    }

    /// Opens the first socket (so a refused app token shows at connect time).
    pub(crate) async fn open_now(&mut self) -> Result<(), SlackError> {
        let s = Box::pin(self.connect()).await?;
        self.install(s).await;
        Ok(())
    }

    async fn install(&mut self, socket: Socket) -> Option<Socket> {
        self.generation += 1;
        self.socket.replace(socket)
    }

    /// `disconnect` (refresh): the new socket first, then the old one closed.
    async fn refresh(&mut self, reason: &str) -> Result<(), SlackError> {
        info!(bot = %self.bot, reason, "Slack asks for a new connection; opening it before closing this one");
        let new = Box::pin(self.connect()).await?;
        if let Some(old) = self.install(new).await {
            old.close().await;
        }
        Ok(())
    }
}

/// URLs of Socket Mode hold a ticket: keep error texts to their first words.
fn strip(s: &str) -> String {
    s.split(['?', '&']).next().unwrap_or("").to_owned()
}

#[async_trait]
impl Receiver for SocketReceiver {
    async fn next(&mut self) -> Result<Batch, PlatformError> {
        loop {
            if self.socket.is_none() {
                // Boxed: opening a socket (HTTP call, TLS and WebSocket handshakes) takes
                // kilobytes of state that an idle bot's waiting future must not carry.
                let s = Box::pin(self.connect()).await?;
                self.install(s).await;
            }
            let idle = self.client.config().idle_timeout;
            let Some(socket) = self.socket.as_mut() else {
                continue;
            };
            let msg = match tokio::time::timeout(idle, socket.ws.next()).await {
                Err(_) => {
                    warn!(bot = %self.bot, "nothing heard on the socket for {idle:?}; reconnecting");
                    self.socket = None;
                    continue;
                }
                Ok(None) => {
                    self.socket = None;
                    return Err(SlackError::network("socket closed").into());
                }
                Ok(Some(Err(e))) => {
                    self.socket = None;
                    return Err(SlackError::network_from(format!("socket: {e}"), e).into());
                }
                Ok(Some(Ok(m))) => m,
            };
            let text = match msg {
                Message::Text(t) => t,
                Message::Close(_) => {
                    self.socket = None;
                    return Err(SlackError::network("socket closed by Slack").into());
                }
                // Pings are answered by the WebSocket layer.
                _ => continue,
            };
            let frame = match parse_frame(&text) {
                Ok(f) => f,
                Err(why) => {
                    debug!(bot = %self.bot, why = %why, "unreadable frame skipped");
                    return Ok(Batch {
                        malformed: 1,
                        ..Batch::default()
                    });
                }
            };
            match frame {
                Frame::Hello | Frame::Other => {}
                Frame::Disconnect(reason) if reason == "link_disabled" => {
                    self.socket = None;
                    return Err(SlackError::LinkDisabled.into());
                }
                Frame::Disconnect(reason) => {
                    if let Err(e) = Box::pin(self.refresh(&reason)).await {
                        warn!(bot = %self.bot, error = %e, "could not open a new connection; keeping the old one while it lasts");
                    }
                }
                Frame::Envelope {
                    envelope_id,
                    kind,
                    retry_attempt,
                    payload,
                } => {
                    let mut batch = Batch {
                        ack: Ack(vec![format!("{}:{envelope_id}", self.generation)]),
                        redelivered: usize::from(retry_attempt > 0),
                        ..Batch::default()
                    };
                    let event = match kind.as_str() {
                        "events_api" => Some(parse_event(&self.bot, &self.me, &payload)),
                        "slash_commands" => Some(parse_command(&self.bot, &payload)),
                        "interactive" => Some(parse_interactive(&self.bot, &payload)),
                        _ => None,
                    };
                    if let Some(event) = event {
                        match event {
                            Event::Message(key, message) => {
                                batch.messages.push(Received { key, message });
                            }
                            Event::Ignored => {}
                            Event::Malformed(why) => {
                                debug!(bot = %self.bot, why = %why, "unreadable event skipped");
                                batch.malformed = 1;
                            }
                        }
                    }
                    return Ok(batch);
                }
            }
        }
    }

    async fn ack(&mut self, ack: Ack) -> Result<Option<String>, PlatformError> {
        for a in ack.0 {
            let Some((generation, id)) = a.split_once(':') else {
                continue;
            };
            // An envelope of a socket that is gone cannot be acknowledged: Slack delivers it
            // again, and the inbox knows it then.
            if generation != self.generation.to_string() {
                continue;
            }
            let Some(socket) = self.socket.as_mut() else {
                continue;
            };
            let frame = json!({ "envelope_id": id }).to_string();
            if let Err(e) = socket.ws.send(Message::text(frame)).await {
                self.socket = None;
                return Err(PlatformError::new(
                    ErrorKind::Transient,
                    "network",
                    format!("acknowledging: {e}"),
                ));
            }
        }
        Ok(None)
    }

    async fn close(&mut self) {
        if let Some(s) = self.socket.take() {
            s.close().await;
        }
    }
}
