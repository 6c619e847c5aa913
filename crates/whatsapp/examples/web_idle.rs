//! Memory of idle linked WhatsApp sessions: N device-link bots connected through the
//! connector (the real `whatsapp-rust` client, sessions in a SQLite store under a fence) to
//! the stand-in, which runs in a child process so that its memory is not counted.
//!
//! `cargo run --release -p botfleet-whatsapp --features standin --example web_idle -- 200`
//!
//! Prints the RSS of this process with no session, then with N idle sessions (after they
//! settle), and the difference per session.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use botfleet_core::{BotId, BotSpec, Fence, Platform};
use botfleet_platform::{Connector, SessionKv};
use botfleet_store::{SqliteStore, Store, StoreSession};
use botfleet_whatsapp::{device::WebConfig, web::FencedBackend, WhatsappConnector};
use wacore::store::traits::DeviceStore;

fn rss_kib() -> u64 {
    botfleet_testkit::rss_kib(std::process::id())
}

/// The child: a stand-in that adds the devices named on standard input.
async fn standin() {
    let s = botfleet_whatsapp::standin::StandIn::start().await.unwrap();
    println!("{}", s.url());
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["send", from, to] => {
                s.send_text(from, to, "hello").await.unwrap();
            }
            ["unacked", to] => {
                let _ = writeln!(out, "{}", s.unacked(to));
            }
            [user] => s.add_device(user, 1),
            _ => {}
        }
        let _ = writeln!(out, "ok");
        let _ = out.flush();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().nth(1).as_deref() == Some("--standin") {
        return standin().await;
    }
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("--standin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut to_child = child.stdin.take().unwrap();
    let url = lines.next().unwrap().unwrap();

    let dir = std::env::temp_dir().join(format!("botfleet-web-idle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.join("b.db")).await.unwrap());
    let connector = WhatsappConnector::new().unwrap().with_web(WebConfig {
        version: Some((2, 3000, 1)),
        connect_timeout: Duration::from_secs(60),
    });

    // Sessions as a phone would have linked them: a device with its number, known to the
    // server.
    let mut specs = Vec::new();
    for i in 0..n {
        let id = BotId::new(format!("wa-{i}")).unwrap();
        let mut spec = BotSpec::new(id.clone(), Platform::Whatsapp, "");
        spec.options.mode = Some("web".into());
        spec.options.api_url = Some(url.clone());
        store.add_bot(&spec).await.unwrap();
        store.accept_fence(&id, Fence(1)).await.unwrap();
        let user = format!("1555{:07}", i);
        let kv = Arc::new(StoreSession::new(store.clone(), id.clone(), Fence(1)));
        let backend = FencedBackend::load(kv).await.unwrap();
        let mut device = wacore::store::Device::new();
        device.pn = Some(format!("{user}:1@s.whatsapp.net").parse().unwrap());
        device.push_name = "bench".into();
        backend.save(&device).await.unwrap();
        writeln!(to_child, "{user}").unwrap();
        assert_eq!(lines.next().unwrap().unwrap(), "ok");
        specs.push(spec);
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    let base = rss_kib();
    let t = Instant::now();
    let mut open = Vec::with_capacity(n);
    for chunk in specs.chunks(20) {
        let mut batch = Vec::new();
        for spec in chunk {
            let kv: Arc<dyn SessionKv> =
                Arc::new(StoreSession::new(store.clone(), spec.id.clone(), Fence(1)));
            let c = connector.clone();
            let spec = spec.clone();
            batch.push(tokio::spawn(async move {
                c.connect_with_session(&spec, None, Arc::new(|| true), kv)
                    .await
            }));
        }
        for b in batch {
            open.push(b.await.unwrap().expect("connected"));
        }
    }
    let took = t.elapsed();
    // Idle: keepalives only.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let idle = rss_kib();
    println!(
        "{n} idle linked sessions (connected in {:.1} s): RSS {:.1} MiB with none, {:.1} MiB with them: {:.0} KiB per session",
        took.as_secs_f64(),
        base as f64 / 1024.0,
        idle as f64 / 1024.0,
        idle.saturating_sub(base) as f64 / n as f64
    );
    if std::env::var("WEB_IDLE_KINDS").is_ok() {
        for k in botfleet_whatsapp::web::KINDS {
            let rows = store.session_records(&specs[0].id, k).await.unwrap();
            let bytes: usize = rows.iter().map(|(k, v)| k.len() + v.len()).sum();
            println!("  {k}: {} records, {bytes} bytes", rows.len());
        }
    }

    // Then `contacts` people write to every bot once: each session now holds that many
    // Signal sessions (recorded and acknowledged as the runtime does).
    let contacts: usize = std::env::args()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let mut tasks = Vec::new();
    for mut c in open {
        tasks.push(tokio::spawn(async move {
            let mut got = 0;
            while got < contacts {
                let b = c.receiver.next().await.expect("a batch");
                got += b.messages.len();
                c.receiver.ack(b.ack).await.unwrap();
            }
            c
        }));
    }
    for j in 0..contacts {
        for i in 0..n {
            writeln!(to_child, "send 1666{j:07} 1555{i:07}").unwrap();
            assert_eq!(lines.next().unwrap().unwrap(), "ok");
        }
    }
    let mut open = Vec::new();
    for t in tasks {
        open.push(t.await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = rss_kib();
    println!(
        "after {contacts} contacts wrote to each: RSS {:.1} MiB: {:.0} KiB per session",
        after as f64 / 1024.0,
        after.saturating_sub(base) as f64 / n as f64
    );
    for mut c in open {
        c.receiver.close().await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
