//! A bot's long poll on its own connection: kept alive across polls, over TLS, and through
//! what a server or a network may do to it (close a kept connection, chunk a reply, send
//! garbage, never answer).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    future::Future,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use botfleet_core::Secret;
use botfleet_telegram::{fake::TEST_CA_PEM, BotApi, TelegramClient, TelegramConfig, TelegramError};
use botfleet_testkit::FakeTelegram;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const TOKEN: &str = "1234:secret-token-part";

fn client(poll: Duration, slack: Duration, ca: Option<&str>) -> TelegramClient {
    TelegramClient::new(TelegramConfig {
        poll_timeout: poll,
        request_slack: slack,
        extra_root_certs_pem: ca.map(str::to_owned),
        ..TelegramConfig::default()
    })
    .unwrap()
}

fn api(url: &str) -> BotApi {
    BotApi::new(Some(url), &Secret::new(TOKEN)).unwrap()
}

/// Serves raw bytes: `script(n, stream)` runs for the n-th accepted connection.
async fn raw_server<F, Fut>(script: F) -> (String, Arc<AtomicUsize>)
where
    F: Fn(usize, TcpStream) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let n = seen.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(script(n, s));
        }
    });
    (url, count)
}

/// Reads one request (head and `Content-Length` body); `None` once the client closed.
async fn read_request(s: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = s.read(&mut chunk).await.ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Some(String::from_utf8_lossy(&buf).to_string());
        }
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

const EMPTY_OK: &str = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 23\r\n\r\n{\"ok\":true,\"result\":[]}";

#[tokio::test]
async fn one_connection_carries_every_poll() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let c = client(Duration::from_secs(10), Duration::from_secs(5), None);
    let a = api(&fake.url());
    let mut poll = c.long_poll();
    let mut offset = 0;
    for k in 0..20 {
        let id = fake.state().user_writes(TOKEN, 5, &format!("m{k}"));
        let got = poll.get_updates(&a, offset).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].update_id, Some(id));
        offset = id + 1;
    }
    // A poll that times out empty keeps the connection too.
    let quick = client(Duration::ZERO, Duration::from_secs(5), None);
    let mut idle = quick.long_poll();
    for _ in 0..3 {
        assert!(idle.get_updates(&a, offset).await.unwrap().is_empty());
    }
    assert_eq!(fake.state().connections_accepted(), 2, "one per long poll");
}

#[tokio::test]
async fn tls_with_a_private_ca() {
    let fake = FakeTelegram::start_tls().await.unwrap();
    assert!(fake.url().starts_with("https://"));
    fake.state().add_bot(TOKEN);
    let c = client(
        Duration::from_secs(10),
        Duration::from_secs(5),
        Some(TEST_CA_PEM),
    );
    let a = api(&fake.url());
    assert_eq!(c.get_me(&a).await.unwrap().id, 1234);
    let mut poll = c.long_poll();
    let mut offset = 0;
    for k in 0..5 {
        let id = fake.state().user_writes(TOKEN, 9, &format!("m{k}"));
        let got = poll.get_updates(&a, offset).await.unwrap();
        assert_eq!(got[0].update_id, Some(id));
        offset = id + 1;
    }
    c.send_message(&a, "9", "over TLS", None).await.unwrap();
    assert_eq!(fake.state().sent().last().unwrap().text, "over TLS");
    // getMe went through the shared pool; the polls through one connection of their own.
    assert!(fake.state().connections_accepted() <= 3);
    // Without the private CA the certificate is not trusted: a transient network error,
    // without the token.
    let untrusting = client(Duration::from_secs(1), Duration::from_secs(5), None);
    let e = untrusting.long_poll().get_updates(&a, 0).await.unwrap_err();
    assert!(matches!(e, TelegramError::Transport(_)), "{e:?}");
    assert!(e.is_transient());
    let shown = format!("{e} {e:?}");
    assert!(shown.contains("TLS"), "{shown}");
    assert!(!shown.contains("secret-token-part"), "{shown}");
}

#[test]
fn bad_extra_roots_are_refused() {
    let e = TelegramClient::new(TelegramConfig {
        extra_root_certs_pem: Some("not a certificate".into()),
        ..TelegramConfig::default()
    })
    .unwrap_err();
    assert!(matches!(e, TelegramError::Malformed(_)), "{e:?}");
}

#[tokio::test]
async fn a_kept_connection_the_server_closed_is_replaced_once() {
    // The first connection answers one poll, then the server lets it go.
    let (url, conns) = raw_server(|_, mut s| async move {
        if read_request(&mut s).await.is_some() {
            s.write_all(EMPTY_OK.as_bytes()).await.unwrap();
        }
        let _ = s.shutdown().await;
    })
    .await;
    let c = client(Duration::ZERO, Duration::from_secs(5), None);
    let a = api(&url);
    let mut poll = c.long_poll();
    for _ in 0..3 {
        assert!(poll.get_updates(&a, 0).await.unwrap().is_empty());
    }
    assert_eq!(conns.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn chunked_and_close_delimited_replies_are_read() {
    let (url, _) = raw_server(|n, mut s| async move {
        if read_request(&mut s).await.is_some() {
            if n == 0 {
                let body = r#"{"ok":true,"result":[{"update_id":7,"message":{"message_id":1,"chat":{"id":3},"text":"hi"}}]}"#;
                let (a, b) = body.split_at(20);
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{a}\r\n{:x};ext\r\n{b}\r\n0\r\n\r\n",
                    a.len(),
                    b.len()
                );
                // In pieces, as a slow network would deliver it.
                for piece in reply.as_bytes().chunks(7) {
                    s.write_all(piece).await.unwrap();
                    s.flush().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            } else {
                s.write_all(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"ok\":true,\"result\":[{\"update_id\":8}]}")
                    .await
                    .unwrap();
            }
            let _ = s.shutdown().await;
        }
    })
    .await;
    let c = client(Duration::ZERO, Duration::from_secs(5), None);
    let a = api(&url);
    let mut poll = c.long_poll();
    let got = poll.get_updates(&a, 0).await.unwrap();
    assert_eq!(got[0].update_id, Some(7));
    // "Connection: close": the next poll opens a new connection, whose reply ends with it.
    let got = poll.get_updates(&a, 8).await.unwrap();
    assert_eq!(got[0].update_id, Some(8));
}

#[tokio::test]
async fn garbage_and_cut_replies_are_errors_not_panics() {
    let (url, _) = raw_server(|n, mut s| async move {
        if read_request(&mut s).await.is_none() {
            return;
        }
        let reply: Vec<u8> = match n {
            0 => b"hello there\r\n\r\n".to_vec(),
            1 => {
                let mut v = b"HTTP/1.1 200 OK\r\n".to_vec();
                v.extend(
                    std::iter::repeat_n(b"X-Filler: aaaaaaaaaaaaaaaa\r\n".iter().copied(), 1000)
                        .flatten(),
                );
                v
            }
            2 => b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{\"ok\":true".to_vec(),
            3 => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nnope!".to_vec(),
            _ => b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 10\r\n\r\n<html>oops".to_vec(),
        };
        let _ = s.write_all(&reply).await;
        let _ = s.shutdown().await;
    })
    .await;
    let c = client(Duration::ZERO, Duration::from_secs(5), None);
    let a = api(&url);
    let mut poll = c.long_poll();
    let e = poll.get_updates(&a, 0).await.unwrap_err();
    assert!(matches!(e, TelegramError::Malformed(_)), "not HTTP: {e:?}");
    let e = poll.get_updates(&a, 0).await.unwrap_err();
    assert!(
        matches!(e, TelegramError::Malformed(ref m) if m.contains("head")),
        "huge head: {e:?}"
    );
    let e = poll.get_updates(&a, 0).await.unwrap_err();
    assert!(matches!(e, TelegramError::Transport(_)), "cut short: {e:?}");
    let e = poll.get_updates(&a, 0).await.unwrap_err();
    assert!(matches!(e, TelegramError::Malformed(_)), "not JSON: {e:?}");
    let e = poll.get_updates(&a, 0).await.unwrap_err();
    assert!(
        matches!(e, TelegramError::Server { status: 502, .. }),
        "{e:?}"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_and_the_next_poll_starts_over() {
    let (url, conns) = raw_server(|n, mut s| async move {
        while read_request(&mut s).await.is_some() {
            if n == 0 {
                // Takes the request and says nothing, holding the connection.
                tokio::time::sleep(Duration::from_secs(30)).await;
                return;
            }
            s.write_all(EMPTY_OK.as_bytes()).await.unwrap();
        }
    })
    .await;
    let c = client(Duration::ZERO, Duration::from_millis(300), None);
    let a = api(&url);
    let mut poll = c.long_poll();
    let e = poll.get_updates(&a, 0).await.unwrap_err();
    assert!(
        matches!(e, TelegramError::Transport(ref m) if m.contains("timed out")),
        "{e:?}"
    );
    assert!(poll.get_updates(&a, 0).await.unwrap().is_empty());
    assert_eq!(conns.load(Ordering::SeqCst), 2);
}

/// Every bot answering at once reuses a few warm connections instead of opening one per bot.
#[tokio::test]
async fn a_burst_of_sends_reuses_a_bounded_set_of_connections() {
    let fake = FakeTelegram::start().await.unwrap();
    fake.state().add_bot(TOKEN);
    let c = TelegramClient::new(TelegramConfig {
        max_concurrent_calls: 4,
        pool_idle_per_host: 4,
        ..TelegramConfig::default()
    })
    .unwrap();
    let a = api(&fake.url());
    let sends: Vec<_> = (0..300)
        .map(|i| {
            let (c, a) = (c.clone(), a.clone());
            tokio::spawn(async move { c.send_message(&a, "1", &format!("n{i}"), None).await })
        })
        .collect();
    for s in sends {
        s.await.unwrap().unwrap();
    }
    assert_eq!(fake.state().sent_count(), 300);
    let conns = fake.state().connections_accepted();
    assert!(conns <= 4, "{conns} connections for 300 sends");
}
