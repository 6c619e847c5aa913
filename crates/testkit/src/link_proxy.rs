//! A TCP proxy that stands for one worker's network link to a server (Redis): it forwards
//! bytes both ways until told to *blackhole* them (connections stay open, nothing passes,
//! as when a switch or a firewall drops the packets of a live link) or to *delay* them (every
//! chunk arrives later, in order, as on a congested or distant link). Unlike a server that is
//! down, a blackholed link answers nothing and refuses nothing: every call on it hangs.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::{mpsc, watch},
    task::JoinHandle,
    time::Instant,
};

/// What the link does to the bytes that cross it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkMode {
    /// Forwards at once.
    Pass,
    /// Forwards nothing (and refuses no connection): everything waits until another mode.
    Blackhole,
    /// Forwards every chunk this long after it was read, in order.
    Delay(Duration),
}

/// A proxy on `127.0.0.1:0` in front of `target`; ends its connections when dropped.
#[derive(Debug)]
pub struct LinkProxy {
    addr: SocketAddr,
    mode: watch::Sender<LinkMode>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl LinkProxy {
    /// Starts forwarding to `target`.
    ///
    /// # Errors
    /// When no local port can be bound.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, mode_rx) = watch::channel(LinkMode::Pass);
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let held = tasks.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(target).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let mut tasks = held.lock().unwrap_or_else(|e| e.into_inner());
                tasks.retain(|t| !t.is_finished());
                tasks.extend(pipe(cr, sw, mode_rx.clone()));
                tasks.extend(pipe(sr, cw, mode_rx.clone()));
            }
        });
        Ok(Self {
            addr,
            mode,
            tasks,
            accept,
        })
    }

    /// The proxy's address: clients connect here instead of to the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:<port>` of the proxy.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Sets what the link does from now on (chunks already waiting follow the new mode).
    pub fn set(&self, mode: LinkMode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.accept.abort();
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

/// One direction of a connection: a reader stamps each chunk with the time it arrived, a
/// writer passes it on when the mode lets it.
fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<LinkMode>,
) -> [JoinHandle<()>; 2] {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send((Instant::now(), buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let writer = tokio::spawn(async move {
        while let Some((at, chunk)) = rx.recv().await {
            loop {
                let now = *mode.borrow_and_update();
                let due = match now {
                    LinkMode::Pass => None,
                    LinkMode::Delay(d) => Some(at + d),
                    LinkMode::Blackhole => {
                        if mode.changed().await.is_err() {
                            return;
                        }
                        continue;
                    }
                };
                if let Some(due) = due {
                    tokio::select! {
                        () = tokio::time::sleep_until(due) => {}
                        r = mode.changed() => {
                            if r.is_err() { return; }
                            continue;
                        }
                    }
                }
                break;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    [reader, writer]
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(c: &mut TcpStream, msg: &[u8]) -> Vec<u8> {
        c.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        c.read_exact(&mut got).await.unwrap();
        got
    }

    #[tokio::test]
    async fn passes_blackholes_and_delays_in_order() {
        let proxy = LinkProxy::start(echo_server().await).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(round_trip(&mut c, b"one").await, b"one");
        // Blackholed: nothing comes back, the connection stays open.
        proxy.set(LinkMode::Blackhole);
        c.write_all(b"two").await.unwrap();
        let mut got = [0u8; 3];
        let hung = tokio::time::timeout(Duration::from_millis(300), c.read_exact(&mut got)).await;
        assert!(hung.is_err(), "a blackholed link answers nothing");
        // Healed: what waited arrives, in order.
        proxy.set(LinkMode::Pass);
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"two");
        // Delayed both ways: a round trip takes at least twice the delay.
        proxy.set(LinkMode::Delay(Duration::from_millis(150)));
        let t = Instant::now();
        assert_eq!(round_trip(&mut c, b"three").await, b"three");
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{:?}",
            t.elapsed()
        );
    }
}
