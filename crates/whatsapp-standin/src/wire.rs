//! The stand-in's wire, server side: WebSocket binary messages carrying WhatsApp's intro
//! (`ED` edge-routing pre-intro optional, then `WA` + magic + dictionary version) and 3-byte
//! length-prefixed frames; the Noise handshake as responder (XX, IK, and XXfallback when an IK
//! hello was made for another server key); then AES-GCM frames each holding one binary node.

use std::fmt;

use futures_util::{
    stream::{SplitSink, SplitStream},
    SinkExt, StreamExt,
};
use tokio::net::TcpStream;
use tokio_tungstenite::{tungstenite::Message, WebSocketStream};
use wacore::{
    handshake::{NoiseCipher, NoiseHandshake},
    libsignal::protocol::KeyPair,
};
use wacore_binary::{
    consts::{NOISE_PATTERN_IK, NOISE_PATTERN_XX, NOISE_PATTERN_XXFALLBACK, WA_CONN_HEADER},
    Node,
};
use waproto::{
    buffa::{Message as _, MessageField},
    whatsapp as wa,
};

type Ws = WebSocketStream<TcpStream>;

const NOISE: &str = "noise";

/// Why a connection ended early; it ends that connection only.
#[derive(Debug)]
pub(crate) struct Fault(String);

impl Fault {
    pub(crate) fn new(what: impl fmt::Display) -> Self {
        Fault(what.to_string())
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `?` on the crates' error types: each of them closes the connection it happened on.
trait Context<T> {
    fn ctx(self, what: &'static str) -> Result<T, Fault>;
}

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn ctx(self, what: &'static str) -> Result<T, Fault> {
        self.map_err(|e| Fault(format!("{what}: {e}")))
    }
}

/// The server's Noise identity: a static key and the certificate chain naming it.
pub(crate) struct ServerKeys {
    static_key: KeyPair,
    cert_chain: Vec<u8>,
}

impl ServerKeys {
    /// A fresh static key and a chain for it: an intermediate with a key of its own (its
    /// signature is zeros — only WhatsApp can sign one, which is why the client must be built
    /// with `danger-skip-cert-chain-verify`), and a leaf for the static key, really signed by
    /// the intermediate. Both valid from a day ago for a year, so the client caches the chain
    /// and tries Noise IK on its next login.
    pub(crate) fn generate() -> Self {
        let mut rng = rand::rng();
        let static_key = KeyPair::generate(&mut rng);
        let intermediate = KeyPair::generate(&mut rng);
        let now = super::unix_now();
        let details = |serial: u32, issuer: u32, key: &[u8]| {
            wa::cert_chain::noise_certificate::Details {
                serial: Some(serial),
                issuer_serial: Some(issuer),
                key: Some(key.to_vec()),
                not_before: Some(now.saturating_sub(86_400)),
                not_after: Some(now + 365 * 86_400),
            }
            .encode_to_vec()
        };
        let intermediate_details = details(1, 0, intermediate.public_key.public_key_bytes());
        let leaf_details = details(2, 1, static_key.public_key.public_key_bytes());
        let leaf_signature = intermediate
            .private_key
            .calculate_signature(&leaf_details, &mut rng)
            .map(|s| s.to_vec())
            .unwrap_or_else(|_| vec![0; 64]);
        let chain = wa::CertChain {
            leaf: MessageField::some(wa::cert_chain::NoiseCertificate {
                details: Some(leaf_details),
                signature: Some(leaf_signature),
            }),
            intermediate: MessageField::some(wa::cert_chain::NoiseCertificate {
                details: Some(intermediate_details),
                signature: Some(vec![0; 64]),
            }),
        };
        ServerKeys {
            static_key,
            cert_chain: chain.encode_to_vec(),
        }
    }

    fn public(&self) -> &[u8] {
        self.static_key.public_key.public_key_bytes()
    }

    fn private(&self) -> &[u8] {
        self.static_key.private_key.serialize()
    }
}

/// The receiving half: buffers WebSocket messages and cuts them into frames.
pub(crate) struct Reader {
    stream: SplitStream<Ws>,
    buf: Vec<u8>,
    intro_seen: bool,
    cipher: Option<NoiseCipher>,
    counter: u32,
}

/// The sending half: one WebSocket binary message per frame.
pub(crate) struct Writer {
    sink: SplitSink<Ws, Message>,
    cipher: Option<NoiseCipher>,
    counter: u32,
}

/// What the handshake learned about the client.
pub(crate) struct Greeting {
    /// The client's static Noise key (its `noise_key`; the QR code shows it too).
    pub(crate) client_static: [u8; 32],
    /// Who it says it is: a login (`username` + `device`) or a registration.
    pub(crate) payload: wa::ClientPayload,
}

/// Completes the WebSocket upgrade.
pub(crate) async fn accept(tcp: TcpStream) -> Result<(Reader, Writer), Fault> {
    let ws = tokio_tungstenite::accept_async(tcp)
        .await
        .ctx("websocket upgrade")?;
    let (sink, stream) = ws.split();
    Ok((
        Reader {
            stream,
            buf: Vec::new(),
            intro_seen: false,
            cipher: None,
            counter: 0,
        },
        Writer {
            sink,
            cipher: None,
            counter: 0,
        },
    ))
}

/// Runs the Noise handshake as responder and switches both halves to encrypted frames.
pub(crate) async fn handshake(
    reader: &mut Reader,
    writer: &mut Writer,
    keys: &ServerKeys,
) -> Result<Greeting, Fault> {
    let first = reader
        .next_frame()
        .await?
        .ok_or_else(|| Fault::new("closed before hello"))?;
    let hello = waproto::codec::handshake_message_decode(&first)
        .ctx("client hello")?
        .client_hello
        .into_option()
        .ok_or_else(|| Fault::new("no client hello"))?;
    let client_ephemeral = key32(hello.ephemeral.as_deref(), "client ephemeral")?;

    // An IK hello carries the client's static key and login payload already. It opens only
    // with the key it was made for; one made for another server key (a chain cached from an
    // earlier stand-in) gets the XXfallback answer, as WhatsApp does after a key rotation.
    if let (Some(sealed_static), Some(sealed_payload)) = (&hello.r#static, &hello.payload) {
        let Ok(ik) = IkResponder::open(keys, client_ephemeral, sealed_static, sealed_payload)
        else {
            return xx(
                reader,
                writer,
                keys,
                NOISE_PATTERN_XXFALLBACK,
                client_ephemeral,
            )
            .await;
        };
        let client_static = ik.client_static;
        let payload = decode_payload(&ik.payload)?;
        let (server_hello, read, write) = ik.answer(keys, client_ephemeral)?;
        writer.raw_frame(&server_hello).await?;
        reader.cipher = Some(read);
        writer.cipher = Some(write);
        return Ok(Greeting {
            client_static,
            payload,
        });
    }
    xx(reader, writer, keys, NOISE_PATTERN_XX, client_ephemeral).await
}

/// XX (or XXfallback, which differs only in its protocol name) from the server hello on:
/// `<- e, ee, s, es` then `-> s, se` with the login payload.
async fn xx(
    reader: &mut Reader,
    writer: &mut Writer,
    keys: &ServerKeys,
    pattern: &str,
    client_ephemeral: [u8; 32],
) -> Result<Greeting, Fault> {
    let mut noise = NoiseHandshake::new(pattern, &WA_CONN_HEADER).ctx(NOISE)?;
    noise.authenticate(&client_ephemeral);
    let ephemeral = KeyPair::generate(&mut rand::rng());
    noise.authenticate(ephemeral.public_key.public_key_bytes());
    noise
        .mix_shared_secret(ephemeral.private_key.serialize(), &client_ephemeral)
        .ctx(NOISE)?;
    let sealed_static = noise.encrypt(keys.public()).ctx(NOISE)?;
    noise
        .mix_shared_secret(keys.private(), &client_ephemeral)
        .ctx(NOISE)?;
    let sealed_chain = noise.encrypt(&keys.cert_chain).ctx(NOISE)?;
    writer
        .raw_frame(&server_hello(
            ephemeral.public_key.public_key_bytes(),
            Some(sealed_static),
            sealed_chain,
        ))
        .await?;

    let finish = reader
        .next_frame()
        .await?
        .ok_or_else(|| Fault::new("closed before finish"))?;
    let finish = waproto::codec::handshake_message_decode(&finish)
        .ctx("client finish")?
        .client_finish
        .into_option()
        .ok_or_else(|| Fault::new("no client finish"))?;
    let client_static = noise
        .decrypt(finish.r#static.as_deref().unwrap_or_default())
        .ctx(NOISE)?;
    let client_static = key32(Some(&client_static), "client static")?;
    noise
        .mix_shared_secret(ephemeral.private_key.serialize(), &client_static)
        .ctx(NOISE)?;
    let payload = noise
        .decrypt(finish.payload.as_deref().unwrap_or_default())
        .ctx(NOISE)?;
    let (read, write) = noise.finish().ctx(NOISE)?;
    reader.cipher = Some(read);
    writer.cipher = Some(write);
    Ok(Greeting {
        client_static,
        payload: decode_payload(&payload)?,
    })
}

/// IK, responder side: the first message is `-> e, es, s, ss` plus the login payload.
struct IkResponder {
    noise: NoiseHandshake,
    client_static: [u8; 32],
    payload: Vec<u8>,
}

impl IkResponder {
    /// Opens the client's hello; fails if it was made for another server key.
    fn open(
        keys: &ServerKeys,
        client_ephemeral: [u8; 32],
        sealed_static: &[u8],
        sealed_payload: &[u8],
    ) -> Result<Self, Fault> {
        let mut noise = NoiseHandshake::new(NOISE_PATTERN_IK, &WA_CONN_HEADER).ctx(NOISE)?;
        noise.authenticate(keys.public());
        noise.authenticate(&client_ephemeral);
        noise
            .mix_shared_secret(keys.private(), &client_ephemeral)
            .ctx(NOISE)?;
        let client_static = noise.decrypt(sealed_static).ctx(NOISE)?;
        let client_static = key32(Some(&client_static), "client static")?;
        noise
            .mix_shared_secret(keys.private(), &client_static)
            .ctx(NOISE)?;
        let payload = noise.decrypt(sealed_payload).ctx(NOISE)?;
        Ok(IkResponder {
            noise,
            client_static,
            payload,
        })
    }

    /// `<- e, ee, se` with the certificate chain and no static key (which is what tells the
    /// client its IK was accepted); returns the hello and the (read, write) ciphers.
    fn answer(
        self,
        keys: &ServerKeys,
        client_ephemeral: [u8; 32],
    ) -> Result<(Vec<u8>, NoiseCipher, NoiseCipher), Fault> {
        let mut noise = self.noise;
        let ephemeral = KeyPair::generate(&mut rand::rng());
        noise.authenticate(ephemeral.public_key.public_key_bytes());
        noise
            .mix_shared_secret(ephemeral.private_key.serialize(), &client_ephemeral)
            .ctx(NOISE)?;
        noise
            .mix_shared_secret(ephemeral.private_key.serialize(), &self.client_static)
            .ctx(NOISE)?;
        let sealed_chain = noise.encrypt(&keys.cert_chain).ctx(NOISE)?;
        let hello = server_hello(ephemeral.public_key.public_key_bytes(), None, sealed_chain);
        // The split's first key is the initiator's sending key: the server reads with it.
        let (read, write) = noise.finish().ctx(NOISE)?;
        Ok((hello, read, write))
    }
}

fn server_hello(
    ephemeral: &[u8],
    sealed_static: Option<Vec<u8>>,
    sealed_chain: Vec<u8>,
) -> Vec<u8> {
    waproto::codec::handshake_message_to_vec(&wa::HandshakeMessage {
        server_hello: MessageField::some(wa::handshake_message::ServerHello {
            ephemeral: Some(ephemeral.to_vec()),
            r#static: sealed_static,
            payload: Some(sealed_chain),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn decode_payload(bytes: &[u8]) -> Result<wa::ClientPayload, Fault> {
    wa::ClientPayload::decode_from_slice(bytes).ctx("client payload")
}

fn key32(bytes: Option<&[u8]>, what: &'static str) -> Result<[u8; 32], Fault> {
    bytes
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| Fault(format!("{what} is not a 32-byte key")))
}

/// Where the intro ends in `buf`: `None` while it is incomplete.
fn intro_len(buf: &[u8]) -> Result<Option<usize>, Fault> {
    let mut start = 0;
    if buf.starts_with(b"ED") || buf == b"E" {
        // `ED\0\1`, a 3-byte length, the routing info; then the WA header.
        if buf.len() < 7 {
            return Ok(None);
        }
        start = 7 + u24(&buf[4..7]);
    }
    match buf.get(start..start + WA_CONN_HEADER.len()) {
        None => Ok(None),
        Some(header) if header == WA_CONN_HEADER => Ok(Some(start + WA_CONN_HEADER.len())),
        Some(header) => Err(Fault(format!("unexpected intro {header:02x?}"))),
    }
}

fn u24(b: &[u8]) -> usize {
    (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2])
}

impl Reader {
    /// The next frame's payload; `None` once the client has closed. Cancel-safe: bytes read
    /// are kept in `buf` until a whole frame is there.
    async fn next_frame(&mut self) -> Result<Option<Vec<u8>>, Fault> {
        loop {
            if !self.intro_seen {
                if let Some(len) = intro_len(&self.buf)? {
                    self.buf.drain(..len);
                    self.intro_seen = true;
                }
            }
            if self.intro_seen && self.buf.len() >= 3 {
                let len = u24(&self.buf[..3]);
                if self.buf.len() >= 3 + len {
                    let frame = self.buf[3..3 + len].to_vec();
                    self.buf.drain(..3 + len);
                    return Ok(Some(frame));
                }
            }
            match self.stream.next().await {
                Some(Ok(Message::Binary(data))) => self.buf.extend_from_slice(&data),
                Some(Ok(Message::Close(_))) | None => return Ok(None),
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(Fault(format!("websocket read: {e}"))),
            }
        }
    }

    /// The next node the client sent; `None` once it has closed. Cancel-safe.
    pub(crate) async fn node(&mut self) -> Result<Option<Node>, Fault> {
        let Some(mut frame) = self.next_frame().await? else {
            return Ok(None);
        };
        let cipher = self
            .cipher
            .as_ref()
            .ok_or_else(|| Fault::new("frame before handshake"))?;
        cipher
            .decrypt_in_place_with_counter(self.counter, &mut frame)
            .ctx("decrypt")?;
        self.counter = self.counter.wrapping_add(1);
        let plain = wacore_binary::util::unpack(&frame).ctx("unpack")?;
        let node = wacore_binary::marshal::unmarshal_ref(&plain)
            .ctx("unmarshal")?
            .to_owned();
        Ok(Some(node))
    }

    /// Reads until the client closes (or errs), throwing what it sends away.
    pub(crate) async fn drain(&mut self) {
        while let Ok(Some(_)) = self.next_frame().await {}
    }
}

impl Writer {
    async fn raw_frame(&mut self, payload: &[u8]) -> Result<(), Fault> {
        let framed = wacore::framing::encode_frame(payload, None).ctx("frame")?;
        self.sink
            .send(Message::Binary(framed.into()))
            .await
            .ctx("websocket write")
    }

    /// Sends one node, encrypted.
    pub(crate) async fn node(&mut self, node: &Node) -> Result<(), Fault> {
        let plain = wacore_binary::marshal(node).ctx("marshal")?;
        let cipher = self
            .cipher
            .as_ref()
            .ok_or_else(|| Fault::new("node before handshake"))?;
        let sealed = cipher
            .encrypt_with_counter(self.counter, &plain)
            .ctx("encrypt")?;
        self.counter = self.counter.wrapping_add(1);
        self.raw_frame(&sealed).await
    }

    /// Sends a close frame; errors do not matter any more.
    pub(crate) async fn close(&mut self) {
        let _ = self.sink.send(Message::Close(None)).await;
        let _ = self.sink.close().await;
    }
}
