//! One bot's long poll over its own HTTP/1.1 connection, holding next to nothing while it
//! waits.
//!
//! A general HTTP client keeps buffers per connection whether or not bytes flow: hyper holds
//! an 8 KiB read buffer, an 8 KiB write buffer and a request channel of 8–17 KiB for every
//! open connection, and a worker keeps thousands of long polls open that sit idle for most of
//! their 45 s. This client keeps only the socket between polls and while a poll waits: it
//! waits for the socket to become readable, and only then takes a buffer, reads the reply,
//! and lets the buffer go. Requests are `POST {path}/bot{token}/getUpdates` with a JSON body,
//! one at a time, kept alive; the reply may be `Content-Length`, chunked, or delimited by the
//! connection's close. TLS (`https://`) is rustls with the public web roots (plus any the
//! configuration adds).

use std::{io, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf},
    net::TcpStream,
};
use tokio_rustls::{client::TlsStream, rustls, TlsConnector};

use crate::TelegramError;

/// The longest reply head accepted (status line and headers).
const MAX_HEAD: usize = 16 * 1024;
/// The longest reply body accepted: 100 updates of the largest messages fit many times over.
const MAX_BODY: usize = 64 * 1024 * 1024;
/// Headers read from a reply, at most.
const MAX_HEADERS: usize = 48;
/// How long a connection (TCP and TLS) may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a bot's polls go, parsed once from its `getUpdates` URL. Holds the token (in
/// `path`), so `Debug` prints none of it.
#[derive(Clone)]
pub(crate) struct Target {
    tls: bool,
    /// Host name or address, as in the URL (without brackets for IPv6).
    host: String,
    port: u16,
    /// `Host` header value.
    authority: String,
    /// Path and query of `getUpdates`, token included.
    path: String,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Target(<redacted>)")
    }
}

impl Target {
    /// The target of `url` (`http` or `https`).
    pub(crate) fn new(url: &reqwest::Url) -> Result<Self, TelegramError> {
        let tls = match url.scheme() {
            "https" => true,
            "http" => false,
            other => {
                return Err(TelegramError::Malformed(format!(
                    "API URL scheme {other:?} is not http or https"
                )))
            }
        };
        let shown = url
            .host_str()
            .ok_or_else(|| TelegramError::Malformed("API URL has no host".into()))?;
        // An IPv6 address comes bracketed; the socket and TLS want it bare.
        let host = shown
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| TelegramError::Malformed("API URL has no port".into()))?;
        let authority = match url.port() {
            Some(p) => format!("{shown}:{p}"),
            None => shown.to_owned(),
        };
        let mut path = url.path().to_owned();
        if let Some(q) = url.query() {
            path.push('?');
            path.push_str(q);
        }
        Ok(Self {
            tls,
            host,
            port,
            authority,
            path,
        })
    }
}

/// The TLS settings every bot of a client shares.
#[derive(Clone)]
pub(crate) struct Tls(TlsConnector);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// The public web roots, and the certificates of `extra_pem` (PEM) besides.
    pub(crate) fn new(extra_pem: Option<&str>) -> Result<Self, TelegramError> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        if let Some(pem) = extra_pem {
            let mut n = 0;
            for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
                let cert = cert.map_err(|e| {
                    TelegramError::Malformed(format!("extra root certificates: {e}"))
                })?;
                roots.add(cert).map_err(|e| {
                    TelegramError::Malformed(format!("extra root certificate refused: {e}"))
                })?;
                n += 1;
            }
            if n == 0 {
                return Err(TelegramError::Malformed(
                    "extra root certificates: no PEM certificate found".into(),
                ));
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TelegramError::Malformed(format!("TLS setup: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self(TlsConnector::from(Arc::new(config))))
    }
}

/// An open connection.
enum Io {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Io {
    /// Waits until the socket has bytes (or an error, or its end), holding no buffer.
    async fn readable(&self) -> io::Result<()> {
        match self {
            Io::Plain(s) => s.readable().await,
            Io::Tls(s) => s.get_ref().0.readable().await,
        }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            Io::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A reply: status and body.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

/// Why an exchange failed.
enum Failed {
    /// A kept-alive connection turned out closed before any byte of the reply: the server let
    /// it go between polls. Safe to try once more on a new connection.
    Stale(io::Error),
    /// Anything else: the connection is dropped and the error reported.
    Other(TelegramError),
}

fn net(what: &str, e: &io::Error) -> TelegramError {
    TelegramError::Transport(format!("{what}: {e}"))
}

/// One bot's poll connection. Dropping it (or the future of a poll in flight) closes the
/// socket, which is how the server learns that the poll was given up.
pub(crate) struct PollConn {
    io: Option<Io>,
}

impl std::fmt::Debug for PollConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollConn")
            .field("open", &self.io.is_some())
            .finish()
    }
}

impl PollConn {
    pub(crate) fn new() -> Self {
        Self { io: None }
    }

    /// POSTs `body` (JSON) to `target` and reads the reply, on the kept-alive connection when
    /// there is one (once more on a new one if the server had closed it meanwhile).
    pub(crate) async fn post(
        &mut self,
        target: &Target,
        tls: &Tls,
        body: &[u8],
    ) -> Result<Reply, TelegramError> {
        if self.io.is_some() {
            match self.exchange(target, body).await {
                Ok(r) => return Ok(r),
                Err(Failed::Stale(_)) => {}
                Err(Failed::Other(e)) => return Err(e),
            }
        }
        // Boxed: the TCP and TLS handshakes take kilobytes of state that a waiting poll's
        // future must not carry.
        self.io = Some(Box::pin(connect(target, tls)).await?);
        match self.exchange(target, body).await {
            Ok(r) => Ok(r),
            Err(Failed::Stale(e)) => Err(net("connection closed before the reply", &e)),
            Err(Failed::Other(e)) => Err(e),
        }
    }

    async fn exchange(&mut self, target: &Target, body: &[u8]) -> Result<Reply, Failed> {
        let Some(io) = self.io.as_mut() else {
            return Err(Failed::Other(TelegramError::Transport(
                "no connection".into(),
            )));
        };
        let outcome = exchange(io, target, body).await;
        match &outcome {
            Ok((_, true)) | Err(_) => self.io = None,
            Ok((_, false)) => {}
        }
        outcome.map(|(r, _)| r)
    }
}

async fn connect(target: &Target, tls: &Tls) -> Result<Io, TelegramError> {
    let open = async {
        let tcp = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(|e| net("connect", &e))?;
        let _ = tcp.set_nodelay(true);
        if !target.tls {
            return Ok(Io::Plain(tcp));
        }
        let name = rustls::pki_types::ServerName::try_from(target.host.clone())
            .map_err(|e| TelegramError::Malformed(format!("API host is not a TLS name: {e}")))?;
        let s = tls
            .0
            .connect(name, tcp)
            .await
            .map_err(|e| net("TLS handshake", &e))?;
        Ok(Io::Tls(Box::new(s)))
    };
    tokio::time::timeout(CONNECT_TIMEOUT, open)
        .await
        .map_err(|_| TelegramError::Transport("connect timed out".into()))?
}

/// Writes one request and reads its reply; answers whether the connection must be closed.
async fn exchange(io: &mut Io, target: &Target, body: &[u8]) -> Result<(Reply, bool), Failed> {
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: botfleet\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        target.path,
        target.authority,
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    // A write to a connection the server closed may still succeed (the kernel takes it); the
    // read then finds the close. Either way, nothing of the reply came: stale.
    if let Err(e) = io.write_all(&request).await {
        return Err(Failed::Stale(e));
    }
    if let Err(e) = io.flush().await {
        return Err(Failed::Stale(e));
    }
    drop(request);
    // The long wait: no buffer is held until the reply starts to arrive.
    if let Err(e) = io.readable().await {
        return Err(Failed::Stale(e));
    }
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let head = loop {
        let n = read_more(io, &mut buf, MAX_HEAD).await;
        let n = match n {
            Ok(n) => n,
            Err(e) if buf.is_empty() => return Err(Failed::Stale(e)),
            Err(e) => return Err(Failed::Other(net("read", &e))),
        };
        if n == 0 {
            let e = io::Error::new(io::ErrorKind::UnexpectedEof, "closed by the server");
            return Err(if buf.is_empty() {
                Failed::Stale(e)
            } else {
                Failed::Other(net("reply cut short", &e))
            });
        }
        match parse_head(&buf).map_err(Failed::Other)? {
            Some(head) => break head,
            None if buf.len() >= MAX_HEAD => {
                return Err(Failed::Other(TelegramError::Malformed(
                    "reply head too long".into(),
                )))
            }
            None => {}
        }
    };
    let mut body = buf.split_off(head.len);
    drop(buf);
    let body = match head.framing {
        Framing::Length(n) => {
            if n > MAX_BODY {
                return Err(Failed::Other(TelegramError::Malformed(format!(
                    "reply body of {n} bytes is too long"
                ))));
            }
            if body.len() > n {
                // Bytes past the reply: the server does not pipeline, so this is garbage.
                return Err(Failed::Other(TelegramError::Malformed(
                    "bytes after the reply body".into(),
                )));
            }
            body.reserve_exact(n - body.len());
            while body.len() < n {
                match read_more(io, &mut body, n).await {
                    Ok(0) => {
                        return Err(Failed::Other(TelegramError::Transport(
                            "reply body cut short".into(),
                        )))
                    }
                    Ok(_) => {}
                    Err(e) => return Err(Failed::Other(net("read", &e))),
                }
            }
            body
        }
        Framing::Chunked => loop {
            match dechunk(&body).map_err(Failed::Other)? {
                Some(done) => break done,
                None if body.len() > MAX_BODY => {
                    return Err(Failed::Other(TelegramError::Malformed(
                        "chunked reply body is too long".into(),
                    )))
                }
                None => match read_more(io, &mut body, MAX_BODY + 1024).await {
                    Ok(0) => {
                        return Err(Failed::Other(TelegramError::Transport(
                            "chunked reply cut short".into(),
                        )))
                    }
                    Ok(_) => {}
                    Err(e) => return Err(Failed::Other(net("read", &e))),
                },
            }
        },
        Framing::UntilClose => loop {
            match read_more(io, &mut body, MAX_BODY + 1).await {
                Ok(0) => break body,
                Ok(_) if body.len() > MAX_BODY => {
                    return Err(Failed::Other(TelegramError::Malformed(
                        "reply body is too long".into(),
                    )))
                }
                Ok(_) => {}
                Err(e) => return Err(Failed::Other(net("read", &e))),
            }
        },
    };
    let close = head.close || matches!(head.framing, Framing::UntilClose);
    Ok((
        Reply {
            status: head.status,
            body,
        },
        close,
    ))
}

/// Reads what is available into the spare room of `buf`, growing it up to `limit` bytes.
async fn read_more(io: &mut Io, buf: &mut Vec<u8>, limit: usize) -> io::Result<usize> {
    if buf.len() == buf.capacity() {
        let room = buf.capacity().clamp(4096, 1 << 20);
        buf.reserve(room.min(limit.saturating_sub(buf.len()).max(1)));
    }
    io.read_buf(buf).await
}

/// How a reply's body ends.
#[derive(Debug, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    /// Bytes of the head, blank line included.
    len: usize,
    framing: Framing,
    close: bool,
}

/// The reply head in `buf`, once complete.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, TelegramError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut headers);
    let len = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(TelegramError::Malformed(format!("reply head: {e}"))),
    };
    let status = r.code.unwrap_or(0);
    if !(200..600).contains(&status) {
        return Err(TelegramError::Malformed(format!(
            "unexpected HTTP status {status}"
        )));
    }
    let (mut length, mut chunked, mut close) = (None, false, r.version == Some(0));
    for h in r.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .parse()
                .map_err(|_| TelegramError::Malformed(format!("bad Content-Length {value:?}")))?;
            if length.is_some_and(|l| l != n) {
                return Err(TelegramError::Malformed(
                    "conflicting Content-Length headers".into(),
                ));
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
        } else if h.name.eq_ignore_ascii_case("connection") {
            for token in value.split(',') {
                if token.trim().eq_ignore_ascii_case("close") {
                    close = true;
                } else if token.trim().eq_ignore_ascii_case("keep-alive") {
                    close = false;
                }
            }
        }
    }
    let framing = if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else if status == 204 || status == 304 {
        Framing::Length(0)
    } else {
        Framing::UntilClose
    };
    Ok(Some(Head {
        status,
        len,
        framing,
        close,
    }))
}

/// The body of a chunked `data`, once every chunk and the trailer have arrived.
fn dechunk(data: &[u8]) -> Result<Option<Vec<u8>>, TelegramError> {
    let bad = |what: &str| TelegramError::Malformed(format!("chunked reply: {what}"));
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let Some(eol) = find_crlf(&data[at..]) else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&data[at..at + eol]).map_err(|_| bad("size line"))?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| bad("size"))?;
        if size > MAX_BODY {
            return Err(bad("chunk too long"));
        }
        at += eol + 2;
        if size == 0 {
            // Trailer fields, then a blank line.
            loop {
                let Some(eol) = find_crlf(&data[at..]) else {
                    return Ok(None);
                };
                at += eol + 2;
                if eol == 0 {
                    return if at == data.len() {
                        Ok(Some(out))
                    } else {
                        Err(bad("bytes after the last chunk"))
                    };
                }
            }
        }
        if data.len() < at + size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&data[at..at + size]);
        if &data[at + size..at + size + 2] != b"\r\n" {
            return Err(bad("chunk not followed by CRLF"));
        }
        at += size + 2;
    }
}

fn find_crlf(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\r\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn heads_say_how_the_body_ends() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n{}")
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.status, h.framing, h.close),
            (200, Framing::Length(12), false)
        );
        assert_eq!(h.len, 39);
        let h = parse_head(b"HTTP/1.1 409 Conflict\r\ntransfer-encoding: gzip, chunked\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            (h.status, h.framing, h.close),
            (409, Framing::Chunked, true)
        );
        let h = parse_head(b"HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!((h.framing, h.close), (Framing::UntilClose, true));
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Le")
            .unwrap()
            .is_none());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
                .is_err()
        );
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 101 Switching\r\n\r\n").is_err());
    }

    #[test]
    fn chunks_are_joined_once_complete() {
        let whole = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n";
        for cut in 0..whole.len() {
            assert_eq!(dechunk(&whole[..cut]).unwrap(), None, "cut at {cut}");
        }
        assert_eq!(dechunk(whole).unwrap().unwrap(), b"hello world");
        assert!(dechunk(b"zz\r\n").is_err());
        assert!(dechunk(b"2\r\nabXY0\r\n\r\n").is_err());
        assert!(dechunk(b"0\r\n\r\nextra").is_err());
    }

    #[test]
    fn targets_never_print_the_token() {
        let url = reqwest::Url::parse("https://api.example:8443/bot1:SECRET/getUpdates").unwrap();
        let t = Target::new(&url).unwrap();
        assert_eq!((t.tls, t.port), (true, 8443));
        assert_eq!(t.authority, "api.example:8443");
        assert_eq!(t.path, "/bot1:SECRET/getUpdates");
        assert!(!format!("{t:?}").contains("SECRET"));
        let v6 = Target::new(&reqwest::Url::parse("http://[::1]/x").unwrap()).unwrap();
        assert_eq!(
            (v6.host.as_str(), v6.authority.as_str(), v6.port),
            ("::1", "[::1]", 80)
        );
        assert!(Target::new(&reqwest::Url::parse("ftp://h/x").unwrap()).is_err());
    }
}
