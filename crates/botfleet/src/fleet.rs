//! `botfleet fleet status`.

use std::{collections::HashMap, process::ExitCode};

use anyhow::Context;
use botfleet_coord::placement::{Ring, RingConfig, DEFAULT_BALANCE};
use botfleet_core::{BotId, BotStatus};
use botfleet_store::BotFilter;
use clap::Subcommand;

use crate::common::Backends;

#[derive(Debug, Subcommand)]
pub(crate) enum FleetCommand {
    /// Workers (id, host, capacity, bots held, heartbeat age) and bots nobody runs, with why.
    Status {
        #[command(flatten)]
        backends: Backends,
        /// One JSON document instead of tables.
        #[arg(long)]
        json: bool,
    },
}

pub(crate) async fn run(cmd: FleetCommand) -> anyhow::Result<ExitCode> {
    crate::common::init_logs("warn");
    let FleetCommand::Status { backends, json } = cmd;
    let store = backends.store().await?;
    let bots = store.list_bots(&BotFilter::default()).await?;
    let Some(coord) = backends.redis().await? else {
        // Embedded: the coordinator lives inside the worker process; the store says enough.
        let running = bots
            .iter()
            .filter(|b| b.status == BotStatus::Running)
            .count();
        let failed: Vec<_> = bots
            .iter()
            .filter(|b| b.status == BotStatus::Failed)
            .collect();
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "mode": "embedded",
                    "bots": bots.len(),
                    "running": running,
                    "failed": failed.iter().map(|b| serde_json::json!({"id": b.spec.id.as_str(), "reason": b.last_error})).collect::<Vec<_>>(),
                })
            );
        } else {
            println!(
                "embedded mode (no --redis-url): {} bots, {running} reported running",
                bots.len()
            );
            for b in failed {
                println!(
                    "  {} failed: {}",
                    b.spec.id,
                    b.last_error.as_deref().unwrap_or("?")
                );
            }
        }
        return Ok(ExitCode::SUCCESS);
    };
    let live = coord.live_workers().await.context("listing workers")?;
    let caps: HashMap<_, _> = live
        .iter()
        .map(|w| (w.id.clone(), w.meta.capacity))
        .collect();
    let ring = Ring::new(live.iter().map(|w| &w.id), RingConfig::default());
    let enabled: Vec<BotId> = bots
        .iter()
        .filter(|b| b.spec.enabled)
        .map(|b| b.spec.id.clone())
        .collect();
    let plan = ring.assign(&enabled, DEFAULT_BALANCE, |w| caps.get(w).copied());
    let epoch = coord.epoch().await.context("reading the fleet epoch")?;
    let grace_ms = epoch.as_ref().map_or(0, |e| {
        u64::try_from(e.grace_left.as_millis()).unwrap_or(u64::MAX)
    });
    let mut unowned = Vec::new();
    for b in bots.iter().filter(|b| b.spec.enabled) {
        let owner = coord.owner(&b.spec.id).await?;
        if owner.as_ref().is_some_and(|o| o.live) {
            continue;
        }
        let why = if b.status == BotStatus::Failed {
            format!("failed: {}", b.last_error.as_deref().unwrap_or("?"))
        } else if live.is_empty() {
            "no live worker".to_owned()
        } else if plan.unplaced.contains(&b.spec.id) {
            "every live worker is at capacity".to_owned()
        } else if grace_ms > 0
            && store
                .highest_fence(&b.spec.id)
                .await
                .is_ok_and(|f| f > botfleet_core::Fence::ZERO)
        {
            format!(
                "Redis lost its data: waiting out the grace window ({:.1} s left) so its old owner has stopped",
                grace_ms as f64 / 1000.0
            )
        } else if owner.is_some() {
            "its worker stopped renewing; waiting for the lease to end".to_owned()
        } else {
            "not claimed yet (starting, or being handed over)".to_owned()
        };
        unowned.push((b.spec.id.to_string(), why));
    }
    if json {
        println!(
            "{}",
            serde_json::json!({
                "mode": "fleet",
                "workers": live.iter().map(|w| serde_json::json!({
                    "id": w.id.as_str(), "host": w.meta.host, "capacity": w.meta.capacity,
                    "bots_held": w.meta.bots_held, "heartbeat_age_ms": w.heartbeat_age_ms,
                })).collect::<Vec<_>>(),
            "bots": enabled.len(),
                "grace_window_ms": grace_ms,
                "epoch": epoch.as_ref().map(|e| serde_json::json!({
                    "id": e.id, "age_ms": u64::try_from(e.age.as_millis()).unwrap_or(u64::MAX),
                    "after_loss": e.after_loss,
                })),
                "unowned": unowned.iter().map(|(id, why)| serde_json::json!({"id": id, "why": why})).collect::<Vec<_>>(),
            })
        );
    } else {
        println!(
            "{:<24} {:<20} {:>9} {:>9} {:>14}",
            "WORKER", "HOST", "CAPACITY", "BOTS", "HEARTBEAT AGE"
        );
        for w in &live {
            println!(
                "{:<24} {:<20} {:>9} {:>9} {:>12}ms",
                w.id.as_str(),
                w.meta.host,
                w.meta.capacity,
                w.meta.bots_held,
                w.heartbeat_age_ms
            );
        }
        if grace_ms > 0 {
            println!(
                "\nRedis lost its data: bots that had owners are granted again in {:.1} s (the grace window lets their old owners stop first)",
                grace_ms as f64 / 1000.0
            );
        }
        println!(
            "\n{} enabled bots, {} with no live owner",
            enabled.len(),
            unowned.len()
        );
        for (id, why) in &unowned {
            println!("  {id}: {why}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
