//! The fake Bot API in child processes ("shards"), each serving a range of bot tokens.
//!
//! A process may hold at most as many sockets as its file limit (20,000 on the project's
//! machine, a hard limit): 20,000 long polls cannot end in one process. So the benchmark runs
//! the fake in `--fake-shard FIRST COUNT` children and asks them over HTTP what it needs:
//! which of a set of tokens were polled since a moment (wall clock, one machine), when each
//! was first polled, and how many second pollers they saw. This also keeps the fake off the
//! measuring process's cores.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context};
use axum::{extract::State, routing::post, Json, Router};
use botfleet_testkit::{fake_telegram_app, FakeState};
use serde_json::{json, Value};

use crate::{token, Worker};

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Serves a shard until killed: the fake Bot API for tokens `first..first + count`, plus
/// `POST /_bench/polls` `{"since_unix_ms": T, "tokens": [i, ...]}` → `{"polled": k,
/// "last_first_unix_ms": m, "conflicts": c}`. Prints `listening PORT` when ready.
pub(crate) async fn serve(first: usize, count: usize) -> anyhow::Result<()> {
    let state = FakeState::default();
    for i in first..first + count {
        state.add_bot(&token(i));
    }
    // One instant read on both clocks: converts wall-clock times to this process's Instants.
    let base = (Instant::now(), SystemTime::now());
    let app = fake_telegram_app(state.clone()).merge(
        Router::new()
            .route("/_bench/polls", post(polls))
            .with_state((state, base)),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?.port());
    axum::serve(listener, app).await?;
    Ok(())
}

async fn polls(
    State((state, (base_i, base_s))): State<(FakeState, (Instant, SystemTime))>,
    Json(q): Json<Value>,
) -> Json<Value> {
    let since_ms = q["since_unix_ms"].as_i64().unwrap_or(0);
    let to_instant = |ms: i64| {
        let base_ms = unix_ms(base_s);
        if ms >= base_ms {
            base_i + Duration::from_millis((ms - base_ms).unsigned_abs())
        } else {
            base_i
                .checked_sub(Duration::from_millis((base_ms - ms).unsigned_abs()))
                .unwrap_or(base_i)
        }
    };
    let wanted: std::collections::HashSet<String> = q["tokens"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_u64)
                .map(|i| token(i as usize))
                .collect()
        })
        .unwrap_or_default();
    let firsts = state.first_poll_per_token_since(to_instant(since_ms));
    let mut polled = 0;
    let mut last = None::<Instant>;
    for (tok, t) in firsts {
        if wanted.contains(&tok) {
            polled += 1;
            last = Some(last.map_or(t, |l| l.max(t)));
        }
    }
    let last_ms = last.map(|t| unix_ms(base_s + t.duration_since(base_i)));
    Json(json!({
        "polled": polled,
        "last_first_unix_ms": last_ms,
        "conflicts": state.conflicts(),
    }))
}

/// The running shards.
pub(crate) struct Shards {
    shards: Vec<(usize, usize, u16, Worker)>,
}

impl Shards {
    /// Starts shards of at most `per_shard` tokens each, covering `0..n`.
    pub(crate) fn start(n: usize, per_shard: usize) -> anyhow::Result<Self> {
        let me = std::env::current_exe()?;
        let mut shards = Vec::new();
        let mut first = 0;
        while first < n {
            let count = per_shard.min(n - first);
            let mut child = Command::new(&me)
                .args(["--fake-shard", &first.to_string(), &count.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .context("starting a fake shard")?;
            let out = child.stdout.take().context("shard stdout")?;
            let mut line = String::new();
            BufReader::new(out).read_line(&mut line)?;
            let port: u16 = line
                .trim()
                .strip_prefix("listening ")
                .and_then(|p| p.parse().ok())
                .with_context(|| format!("shard said {line:?}"))?;
            shards.push((first, count, port, Worker(child)));
            first += count;
        }
        Ok(Self { shards })
    }

    /// The Bot API URL that serves bot `i`.
    /// The shard processes' ids.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.shards.iter().map(|s| s.3 .0.id()).collect()
    }

    pub(crate) fn url_of(&self, i: usize) -> String {
        let port = self
            .shards
            .iter()
            .find(|(f, c, _, _)| (*f..f + c).contains(&i))
            .map_or(0, |s| s.2);
        format!("http://127.0.0.1:{port}")
    }

    /// How many of `bots` (indexes) were polled at or after `since`, and when the last of
    /// their first such polls was; with the second pollers every shard saw.
    pub(crate) fn polls(&self, bots: &[usize], since: SystemTime) -> anyhow::Result<Polls> {
        let mut out = Polls::default();
        for (first, count, port, _) in &self.shards {
            let mine: Vec<usize> = bots
                .iter()
                .copied()
                .filter(|i| (*first..first + count).contains(i))
                .collect();
            let body = json!({"since_unix_ms": unix_ms(since), "tokens": mine}).to_string();
            let v = post_json(*port, "/_bench/polls", &body)?;
            out.polled += v["polled"].as_u64().unwrap_or(0) as usize;
            out.conflicts += v["conflicts"].as_u64().unwrap_or(0);
            if let Some(ms) = v["last_first_unix_ms"].as_i64() {
                let t = UNIX_EPOCH + Duration::from_millis(ms.max(0).unsigned_abs());
                out.last_first = Some(out.last_first.map_or(t, |l: SystemTime| l.max(t)));
            }
        }
        Ok(out)
    }
}

/// What the shards say about a set of bots.
#[derive(Debug, Default)]
pub(crate) struct Polls {
    /// Bots polled since the moment asked about.
    pub(crate) polled: usize,
    /// The latest of their first polls since then.
    pub(crate) last_first: Option<SystemTime>,
    /// Second pollers seen, all bots.
    pub(crate) conflicts: u64,
}

fn post_json(port: u16, path: &str, body: &str) -> anyhow::Result<Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let Some((head, body)) = resp.split_once("\r\n\r\n") else {
        bail!("shard answered no body");
    };
    if !head.starts_with("HTTP/1.1 200") {
        bail!("shard answered {}", head.lines().next().unwrap_or(""));
    }
    Ok(serde_json::from_str(body)?)
}
