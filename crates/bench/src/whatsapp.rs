//! Memory of idle linked WhatsApp sessions: N device-link bots connected through the
//! connector (the real `whatsapp-rust` client, sessions in a SQLite store under a fence) to
//! the stand-in (`botfleet-whatsapp-standin`), which runs in a child process so that its
//! memory is not counted.
//!
//! `botfleet-bench --only whatsapp-idle [--size N] [--contacts C]` (default 200 sessions, 10
//! contacts)
//!
//! Prints the RSS of this process with no session, then with N idle sessions (after they
//! settle), and after C contacts wrote to each, per session. This binary links the stand-in,
//! which turns off the client's certificate check: the connector then dials loopback only.

use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use botfleet_core::{BotId, BotSpec, Fence, Platform};
use botfleet_platform::{Connector, SessionKv};
use botfleet_store::{SqliteStore, Store, StoreSession};
use botfleet_whatsapp::{device::WebConfig, web::FencedBackend, WhatsappConnector};
use wacore::store::traits::DeviceStore;

/// The flag that makes this binary the stand-in child.
pub(crate) const CHILD_FLAG: &str = "--whatsapp-standin";

fn rss_kib() -> u64 {
    botfleet_testkit::rss_kib(std::process::id())
}

/// The child: a stand-in that adds the devices named on standard input, sends a contact's
/// text on `send FROM TO`, and answers each line with `ok`.
pub(crate) async fn standin_child() -> anyhow::Result<()> {
    let s = botfleet_whatsapp_standin::StandIn::start().await?;
    println!("{}", s.url());
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words[..] {
            ["send", from, to] => {
                s.send_text(from, to, "hello")
                    .await
                    .map_err(|e| anyhow::anyhow!("stand-in send: {e}"))?;
            }
            [user] => s.add_device(user, 1),
            _ => {}
        }
        writeln!(out, "ok")?;
        out.flush()?;
    }
    Ok(())
}

/// The stand-in child and the lines it answers.
struct Child {
    proc: std::process::Child,
    to: std::process::ChildStdin,
    from: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Child {
    fn start() -> anyhow::Result<(Self, String)> {
        let mut proc = Command::new(std::env::current_exe()?)
            .arg(CHILD_FLAG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting the stand-in child")?;
        let mut from = BufReader::new(proc.stdout.take().context("child stdout")?).lines();
        let to = proc.stdin.take().context("child stdin")?;
        let url = from.next().context("the stand-in's URL")??;
        Ok((Self { proc, to, from }, url))
    }

    fn say(&mut self, line: &str) -> anyhow::Result<()> {
        writeln!(self.to, "{line}")?;
        match self.from.next() {
            Some(Ok(l)) if l == "ok" => Ok(()),
            other => bail!("the stand-in answered {other:?} to {line:?}"),
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

/// `--only whatsapp-idle`: `n` linked sessions, idle, then after `contacts` contacts wrote.
pub(crate) async fn idle(n: usize, contacts: usize) -> anyhow::Result<()> {
    let (mut child, url) = Child::start()?;
    let dir = std::env::temp_dir().join(format!("botfleet-web-idle-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = run(n, contacts, &mut child, &url, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run(
    n: usize,
    contacts: usize,
    child: &mut Child,
    url: &str,
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(dir.join("b.db")).await?);
    let connector = WhatsappConnector::new()?.with_web(WebConfig {
        version: Some((2, 3000, 1)),
        connect_timeout: Duration::from_secs(60),
    });

    // Sessions as a phone would have linked them: a device with its number, known to the
    // server.
    let mut specs = Vec::new();
    for i in 0..n {
        let id = BotId::new(format!("wa-{i}"))?;
        let mut spec = BotSpec::new(id.clone(), Platform::Whatsapp, "");
        spec.options.mode = Some("web".into());
        spec.options.api_url = Some(url.to_owned());
        store.add_bot(&spec).await?;
        store.accept_fence(&id, Fence(1)).await?;
        let user = format!("1555{i:07}");
        let kv = Arc::new(StoreSession::new(store.clone(), id.clone(), Fence(1)));
        let backend = FencedBackend::load(kv).await?;
        let mut device = wacore::store::Device::new();
        device.pn = Some(
            format!("{user}:1@s.whatsapp.net")
                .parse()
                .map_err(|e| anyhow::anyhow!("jid: {e:?}"))?,
        );
        device.push_name = "bench".into();
        backend
            .save(&device)
            .await
            .map_err(|e| anyhow::anyhow!("saving the device: {e}"))?;
        child.say(&user)?;
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
            open.push(b.await?.map_err(|e| anyhow::anyhow!("connecting: {e}"))?);
        }
    }
    let took = t.elapsed();
    // Idle: keepalives only.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let idle = rss_kib();
    println!(
        "{n} idle linked WhatsApp sessions (connected in {:.1} s): RSS {:.1} MiB with none, {:.1} MiB with them: {:.0} KiB per session",
        took.as_secs_f64(),
        base as f64 / 1024.0,
        idle as f64 / 1024.0,
        idle.saturating_sub(base) as f64 / n.max(1) as f64
    );
    if std::env::var("WEB_IDLE_KINDS").is_ok() {
        for k in botfleet_whatsapp::web::KINDS {
            let rows = store.session_records(&specs[0].id, k).await?;
            let bytes: usize = rows.iter().map(|(k, v)| k.len() + v.len()).sum();
            println!("  {k}: {} records, {bytes} bytes", rows.len());
        }
    }

    // Then `contacts` people write to every bot once: each session now holds that many
    // Signal sessions (recorded and acknowledged as the runtime does).
    let mut tasks = Vec::new();
    for mut c in open {
        tasks.push(tokio::spawn(async move {
            let mut got = 0;
            while got < contacts {
                let Ok(b) = c.receiver.next().await else {
                    break;
                };
                got += b.messages.len();
                if c.receiver.ack(b.ack).await.is_err() {
                    break;
                }
            }
            (c, got)
        }));
    }
    for j in 0..contacts {
        for i in 0..n {
            child.say(&format!("send 1666{j:07} 1555{i:07}"))?;
        }
    }
    let mut open = Vec::new();
    for t in tasks {
        let (c, got) = t.await?;
        if got < contacts {
            bail!("a session got {got} of {contacts} texts");
        }
        open.push(c);
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = rss_kib();
    println!(
        "after {contacts} contacts wrote to each: RSS {:.1} MiB: {:.0} KiB per session",
        after as f64 / 1024.0,
        after.saturating_sub(base) as f64 / n.max(1) as f64
    );
    for mut c in open {
        c.receiver.close().await;
    }
    Ok(())
}
