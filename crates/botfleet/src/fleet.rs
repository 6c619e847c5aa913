//! `botfleet fleet status`.

use std::{collections::HashMap, process::ExitCode};

use anyhow::Context;
use botfleet_coord::placement::{Ring, RingConfig, DEFAULT_BALANCE};
use botfleet_coord::Coordinator;
use botfleet_core::{BotId, BotStatus};
use botfleet_store::{BotFilter, Store};
use clap::Subcommand;

use crate::common::{Backends, Remote};

#[derive(Debug, Subcommand)]
pub(crate) enum FleetCommand {
    /// Workers (id, host, capacity, bots held, heartbeat age) and bots nobody runs, with why.
    Status {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        remote: Remote,
        /// One JSON document instead of tables.
        #[arg(long)]
        json: bool,
        /// Show it again every this many seconds (1-3600) until Ctrl-C; on a terminal the
        /// screen is redrawn.
        #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2",
              value_parser = clap::value_parser!(u64).range(1..=3_600))]
        watch: Option<u64>,
    },
}

pub(crate) async fn run(cmd: FleetCommand) -> anyhow::Result<ExitCode> {
    crate::common::init_logs("warn");
    let FleetCommand::Status {
        backends,
        remote,
        json,
        watch,
    } = cmd;
    let Some(every) = watch else {
        let doc = status(&backends, &remote).await?;
        print(&doc, json);
        return Ok(ExitCode::SUCCESS);
    };
    use std::io::IsTerminal;
    let terminal = std::io::stdout().is_terminal();
    loop {
        let doc = status(&backends, &remote).await;
        if terminal {
            print!("\x1b[H\x1b[2J");
        }
        match doc {
            Ok(doc) => print(&doc, json),
            Err(e) => println!("error: {e:#}"),
        }
        tokio::select! {
            () = tokio::time::sleep(std::time::Duration::from_secs(every)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
    }
}

/// The status document, through the API or from the store and Redis.
async fn status(backends: &Backends, remote: &Remote) -> anyhow::Result<serde_json::Value> {
    Ok(match remote.client()? {
        Some(api) => api.call(reqwest::Method::GET, "/fleet", None).await?,
        None => {
            let store = backends.store().await?;
            match backends.redis().await? {
                Some(c) => status_doc(&*store, Some(&*c), "fleet").await?,
                None => status_doc(&*store, None, "embedded").await?,
            }
        }
    })
}

/// Prints the status document as JSON or tables.
fn print(doc: &serde_json::Value, json: bool) {
    if json {
        println!("{doc}");
        return;
    }
    if doc["workers"].is_null() {
        println!(
            "embedded mode (no --redis-url): {} bots, {} reported running",
            doc["bots"], doc["running"]
        );
        for b in doc["failed"].as_array().into_iter().flatten() {
            println!(
                "  {} failed: {}",
                b["id"].as_str().unwrap_or_default(),
                b["reason"].as_str().unwrap_or("?")
            );
        }
        print_senders(doc);
        return;
    }
    println!(
        "{:<24} {:<20} {:>9} {:>9} {:>7} {:>14}",
        "WORKER", "HOST", "CAPACITY", "UNITS", "SHARDS", "HEARTBEAT AGE"
    );
    for w in doc["workers"].as_array().into_iter().flatten() {
        println!(
            "{:<24} {:<20} {:>9} {:>9} {:>7} {:>12}ms",
            w["id"].as_str().unwrap_or_default(),
            w["host"].as_str().unwrap_or_default(),
            w["capacity"],
            w["bots_held"],
            w["shards"],
            w["heartbeat_age_ms"]
        );
    }
    let grace_ms = doc["grace_window_ms"].as_u64().unwrap_or(0);
    if grace_ms > 0 {
        println!(
            "\nRedis lost its data: bots that had owners are granted again in {:.1} s (the grace window lets their old owners stop first)",
            grace_ms as f64 / 1000.0
        );
        let groups = doc["groups"].as_u64().unwrap_or(1);
        let waiting: Vec<String> = doc["groups_in_grace"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| {
                format!(
                    "{} ({:.1} s)",
                    g["group"].as_str().unwrap_or_default(),
                    g["grace_window_ms"].as_u64().unwrap_or(0) as f64 / 1000.0
                )
            })
            .collect();
        if groups > 1 {
            println!(
                "in {} of {groups} coordination groups: {}",
                waiting.len(),
                waiting.join(", ")
            );
        }
    }
    let unowned = doc["unowned"].as_array().cloned().unwrap_or_default();
    println!(
        "\n{} enabled bots, {} with no live owner",
        doc["bots"],
        unowned.len()
    );
    for u in &unowned {
        println!(
            "  {}: {}",
            u["id"].as_str().unwrap_or_default(),
            u["why"].as_str().unwrap_or_default()
        );
    }
    print_senders(doc);
}

/// The bots with the most sends from the backend, when there are any.
fn print_senders(doc: &serde_json::Value) {
    let sends = doc["sends"].as_array().cloned().unwrap_or_default();
    if sends.is_empty() {
        return;
    }
    println!(
        "
sends from the backend in the last 24 h, most first:"
    );
    for s in &sends {
        println!(
            "  {}: {} sent, {} queued, {} failed",
            s["id"].as_str().unwrap_or_default(),
            s["sent"],
            s["queued"],
            s["failed"]
        );
    }
}

/// The fleet as one JSON document: workers (heartbeat age, capacity, bots held), enabled
/// bots, the grace window after a Redis data loss, and every enabled bot with no live owner
/// with the reason. Without a coordinator (the CLI against an embedded worker's database)
/// only what the store knows.
pub(crate) async fn status_doc(
    store: &dyn Store,
    coord: Option<&dyn Coordinator>,
    mode: &str,
) -> anyhow::Result<serde_json::Value> {
    let bots = store.list_bots(&BotFilter::default()).await?;
    // Bots by platform and reported state (disabled ones apart).
    let mut by_platform: std::collections::BTreeMap<&str, std::collections::BTreeMap<&str, u64>> =
        std::collections::BTreeMap::new();
    for b in &bots {
        let state = if b.spec.enabled {
            b.status.as_str()
        } else {
            "disabled"
        };
        *by_platform
            .entry(b.spec.platform.as_str())
            .or_default()
            .entry(state)
            .or_default() += 1;
    }
    let by_platform = serde_json::to_value(&by_platform)?;
    let sends = top_senders(store).await?;
    let Some(coord) = coord else {
        // Embedded: the coordinator lives inside the worker process; the store says enough.
        let running = bots
            .iter()
            .filter(|b| b.status == BotStatus::Running)
            .count();
        let failed: Vec<_> = bots
            .iter()
            .filter(|b| b.status == BotStatus::Failed)
            .map(|b| serde_json::json!({"id": b.spec.id.as_str(), "reason": b.last_error}))
            .collect();
        return Ok(serde_json::json!({
            "mode": mode,
            "bots": bots.len(),
            "running": running,
            "failed": failed,
            "by_platform": by_platform,
            "sends": sends,
        }));
    };
    let live = coord.live_workers().await.context("listing workers")?;
    let caps: HashMap<_, _> = live
        .iter()
        .map(|w| (w.id.clone(), w.meta.capacity))
        .collect();
    let ring = Ring::new(live.iter().map(|w| &w.id), RingConfig::default());
    // What the fleet places: units (a bot, or each slice of a Discord bot split into slices).
    let units: Vec<botfleet_core::BotRecord> = bots
        .iter()
        .filter(|b| b.spec.enabled)
        .cloned()
        .flat_map(botfleet_core::BotRecord::into_units)
        .collect();
    let weights: HashMap<BotId, u32> = units
        .iter()
        .map(|u| (u.spec.id.clone(), u.spec.weight()))
        .collect();
    let enabled: Vec<BotId> = units.iter().map(|u| u.spec.id.clone()).collect();
    let plan = ring.assign_weighted(
        &enabled,
        DEFAULT_BALANCE,
        |w| caps.get(w).copied(),
        |u| weights.get(u).copied().unwrap_or(1),
    );
    let epochs = coord
        .group_epochs()
        .await
        .context("reading the fleet epoch")?;
    let ms = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    // Each group's window; a bot waits out its own group's.
    let grace_of: HashMap<botfleet_coord::Group, u64> = epochs
        .iter()
        .filter(|(_, e)| !e.grace_left.is_zero())
        .map(|(g, e)| (*g, ms(e.grace_left)))
        .collect();
    let epoch = botfleet_coord::EpochInfo::combine(epochs.iter().map(|(_, e)| e.clone()));
    let grace_ms = epoch.as_ref().map_or(0, |e| ms(e.grace_left));
    let mut unowned = Vec::new();
    let mut running = 0usize;
    // A bot its live worker reports running is owned; only the others are asked about (one
    // coordinator call each), so a page refreshing every second costs little at 10,000 bots.
    let live_ids: std::collections::HashSet<&str> = live.iter().map(|w| w.id.as_str()).collect();
    // Shards each worker holds, for the platforms whose bots have shards (Discord).
    let mut shards: HashMap<String, u64> = HashMap::new();
    for b in &units {
        let discord = botfleet_runtime::descriptor(b.spec.platform).is_some_and(|d| {
            d.modes
                .iter()
                .any(|m| m.setting(botfleet_core::Setting::Shards).taken())
        });
        if let Some(w) = crate::registry::reported_owner(b, |w| live_ids.contains(w)) {
            running += 1;
            if discord {
                *shards.entry(w.to_owned()).or_default() += u64::from(b.spec.weight());
            }
            continue;
        }
        let owner = coord.owner(&b.spec.id).await?;
        if let Some(o) = owner.as_ref().filter(|o| o.live) {
            running += 1;
            if discord {
                *shards.entry(o.worker.to_string()).or_default() += u64::from(b.spec.weight());
            }
            continue;
        }
        let group_grace_ms = grace_of
            .get(&coord.group_of_bot(&b.spec.id))
            .copied()
            .unwrap_or(0);
        let why = if b.status == BotStatus::Failed {
            format!("failed: {}", b.last_error.as_deref().unwrap_or("?"))
        } else if live.is_empty() {
            "no live worker".to_owned()
        } else if plan.unplaced.contains(&b.spec.id) {
            "every live worker is at capacity".to_owned()
        } else if group_grace_ms > 0
            && store
                .highest_fence(&b.spec.id)
                .await
                .is_ok_and(|f| f > botfleet_core::Fence::ZERO)
        {
            format!(
                "Redis lost its data: waiting out the grace window ({:.1} s left) so its old owner has stopped",
                group_grace_ms as f64 / 1000.0
            )
        } else if owner.is_some() {
            "its worker stopped renewing; waiting for the lease to end".to_owned()
        } else {
            "not claimed yet (starting, or being handed over)".to_owned()
        };
        unowned.push(serde_json::json!({"id": b.spec.id.as_str(), "why": why}));
    }
    let mut waiting: Vec<_> = grace_of.iter().collect();
    waiting.sort();
    let groups_in_grace: Vec<_> = waiting
        .into_iter()
        .map(|(g, ms)| serde_json::json!({"group": g.to_string(), "grace_window_ms": ms}))
        .collect();
    Ok(serde_json::json!({
        "mode": mode,
        "workers": live.iter().map(|w| serde_json::json!({
            "id": w.id.as_str(), "host": w.meta.host, "capacity": w.meta.capacity,
            "bots_held": w.meta.bots_held, "heartbeat_age_ms": w.heartbeat_age_ms,
            "rss_bytes": w.meta.rss_bytes,
            "shards": shards.get(w.id.as_str()).copied().unwrap_or(0),
            "lease_ms": u64::try_from(w.lease.as_millis()).unwrap_or(u64::MAX),
        })).collect::<Vec<_>>(),
        "bots": bots.iter().filter(|b| b.spec.enabled).count(),
        "units": enabled.len(),
        "owned": running,
        "by_platform": by_platform,
        "grace_window_ms": grace_ms,
        "groups": coord.groups(),
        "groups_in_grace": groups_in_grace,
        "epoch": epoch.as_ref().map(|e| serde_json::json!({
            "id": e.id, "age_ms": u64::try_from(e.age.as_millis()).unwrap_or(u64::MAX),
            "after_loss": e.after_loss,
        })),
        "unowned": unowned,
        "sends": sends,
    }))
}

/// How many bots [`top_senders`] shows.
const TOP_SENDERS: usize = 20;

/// The bots with the most sends from the backend of the last 24 hours, most first (at most
/// [`TOP_SENDERS`]): `{id, queued, sent, failed}` each. A bot in slices is its own (its
/// sends go through slice 0).
async fn top_senders(store: &dyn Store) -> anyhow::Result<Vec<serde_json::Value>> {
    let stats = store.inbox_stats().await?;
    let mut by_bot: std::collections::BTreeMap<String, botfleet_store::SendCounts> =
        std::collections::BTreeMap::new();
    for (unit, s) in stats {
        if s.sends.total() > 0 {
            *by_bot.entry(unit.base().to_owned()).or_default() += s.sends;
        }
    }
    let mut top: Vec<(String, botfleet_store::SendCounts)> = by_bot.into_iter().collect();
    // Most first; the ids (sorted already) break ties.
    top.sort_by_key(|(_, s)| std::cmp::Reverse(s.total()));
    top.truncate(TOP_SENDERS);
    Ok(top
        .into_iter()
        .map(|(id, s)| {
            serde_json::json!({"id": id, "queued": s.queued, "sent": s.sent, "failed": s.failed})
        })
        .collect())
}
