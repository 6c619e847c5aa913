//! `botfleet bots …`: the registry. With `--redis-url`, every change is also published as a
//! lifecycle event so running workers react within a second; without it, an embedded worker
//! on the same database picks changes up at its next registry refresh (2 s by default).

use std::{io::BufRead, process::ExitCode, sync::Arc};

use anyhow::{bail, Context};
use botfleet_coord::{Coordinator, LifecycleEvent};
use botfleet_core::{
    BotId, BotOptions, BotRecord, BotSpec, BotStatus, HandlerSpec, Platform, Secret,
};
use botfleet_store::{BotFilter, Store, StoreError};
use clap::{Args, Subcommand, ValueEnum};

use crate::common::Backends;

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
enum HandlerKind {
    /// Reply with the same text.
    Echo,
    /// POST the message to --webhook-url and send back the reply's `text`.
    Webhook,
}

#[derive(Debug, Args)]
pub(crate) struct AddArgs {
    /// The bot's id (letters, digits, - _ . @; at most 128).
    id: String,
    /// telegram, slack, discord or whatsapp.
    #[arg(long)]
    platform: String,
    /// The platform token (Telegram bot token, Slack bot token `xoxb-…`). Prefer the
    /// environment variable: command lines are visible to other users of the machine.
    #[arg(long, env = "BOTFLEET_TOKEN", hide_env_values = true)]
    token: String,
    /// Slack's app-level token (`xapp-…`, scope connections:write) that opens Socket Mode
    /// connections. Prefer the environment variable.
    #[arg(long, env = "BOTFLEET_APP_TOKEN", hide_env_values = true)]
    app_token: Option<String>,
    /// The platform API's base URL: a self-hosted Bot API server for Telegram; Slack's Web
    /// API base (default `https://slack.com/api/`).
    #[arg(long)]
    api_url: Option<String>,
    /// How the bot answers.
    #[arg(long, value_enum, default_value = "echo")]
    handler: HandlerKind,
    /// Where the webhook handler POSTs.
    #[arg(long)]
    webhook_url: Option<String>,
    /// HMAC-SHA256 key signing webhook requests.
    #[arg(long, env = "BOTFLEET_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// Register it disabled.
    #[arg(long)]
    disabled: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BotsCommand {
    /// Register a bot.
    Add {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        bot: AddArgs,
    },
    /// Register many bots from a JSON-lines file (fields of `add`: id, platform, token,
    /// app_token, api_url, handler, webhook_url, webhook_secret, enabled); `-` reads standard
    /// input.
    Import {
        #[command(flatten)]
        backends: Backends,
        /// The file.
        file: String,
    },
    /// List bots (never their tokens).
    List {
        #[command(flatten)]
        backends: Backends,
        /// One JSON object per bot instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Unregister a bot.
    Remove {
        #[command(flatten)]
        backends: Backends,
        /// The bot's id.
        id: String,
    },
    /// Enable a bot.
    Enable {
        #[command(flatten)]
        backends: Backends,
        /// The bot's id.
        id: String,
    },
    /// Disable a bot (it stays registered, nobody runs it).
    Disable {
        #[command(flatten)]
        backends: Backends,
        /// The bot's id.
        id: String,
    },
    /// Restart a bot (e.g. after fixing its token); clears a `failed` status.
    Restart {
        #[command(flatten)]
        backends: Backends,
        /// The bot's id.
        id: String,
    },
}

/// One bot as `bots add` flags or a `bots import` line describe it.
#[derive(Debug, Default)]
struct ImportLine {
    id: String,
    platform: String,
    token: String,
    app_token: Option<String>,
    api_url: Option<String>,
    handler: Option<String>,
    webhook_url: Option<String>,
    webhook_secret: Option<String>,
    enabled: Option<bool>,
}

/// The fields of an import line.
const IMPORT_FIELDS: &[&str] = &[
    "id",
    "platform",
    "token",
    "app_token",
    "api_url",
    "handler",
    "webhook_url",
    "webhook_secret",
    "enabled",
];

impl ImportLine {
    /// Reads one JSON line. Errors name the field at fault, never a value (a token may be in
    /// any of them).
    fn from_json(line: &str) -> Result<Self, String> {
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| {
            format!(
                "not JSON (column {}): {}",
                e.column(),
                match e.classify() {
                    serde_json::error::Category::Eof => "it ends early",
                    serde_json::error::Category::Syntax => "a syntax error",
                    _ => "unreadable",
                }
            )
        })?;
        let serde_json::Value::Object(obj) = v else {
            return Err("not a JSON object".into());
        };
        let mut out = ImportLine::default();
        for (k, v) in &obj {
            if !IMPORT_FIELDS.contains(&k.as_str()) {
                let shown: String = k.chars().take(40).collect();
                return Err(format!(
                    "unknown field {shown:?} (known: {})",
                    IMPORT_FIELDS.join(", ")
                ));
            }
            let text = |name: &str| -> Result<Option<String>, String> {
                match v {
                    serde_json::Value::Null => Ok(None),
                    serde_json::Value::String(s) => Ok(Some(s.clone())),
                    _ => Err(format!("field {name} must be a string")),
                }
            };
            match k.as_str() {
                "id" => out.id = text("id")?.unwrap_or_default(),
                "platform" => out.platform = text("platform")?.unwrap_or_default(),
                "token" => out.token = text("token")?.unwrap_or_default(),
                "app_token" => out.app_token = text("app_token")?,
                "api_url" => out.api_url = text("api_url")?,
                "handler" => out.handler = text("handler")?,
                "webhook_url" => out.webhook_url = text("webhook_url")?,
                "webhook_secret" => out.webhook_secret = text("webhook_secret")?,
                "enabled" => {
                    out.enabled = match v {
                        serde_json::Value::Null => None,
                        serde_json::Value::Bool(b) => Some(*b),
                        _ => return Err("field enabled must be true or false".into()),
                    }
                }
                _ => {}
            }
        }
        for (field, value) in [
            ("id", &out.id),
            ("platform", &out.platform),
            ("token", &out.token),
        ] {
            if value.is_empty() {
                return Err(format!("missing field {field}"));
            }
        }
        Ok(out)
    }

    /// The spec this line (or `bots add`'s flags) describes, validated.
    fn into_spec(self) -> anyhow::Result<BotSpec> {
        let id = BotId::new(self.id)?;
        let platform: Platform = self.platform.parse()?;
        let supported = botfleet_runtime::supported_platforms();
        if !supported.contains(&platform) {
            let names: Vec<&str> = supported.iter().map(|p| p.as_str()).collect();
            bail!(
                "platform {platform} does not run in this build yet (it runs: {})",
                names.join(", ")
            );
        }
        let handler = HandlerSpec::from_parts(
            self.handler.as_deref().unwrap_or("echo"),
            self.webhook_url,
            self.webhook_secret.map(Secret::new),
        )?;
        let spec = BotSpec {
            id,
            platform,
            token: Secret::new(self.token),
            app_token: self.app_token.map(Secret::new),
            options: BotOptions {
                api_url: self.api_url,
            },
            handler,
            enabled: self.enabled.unwrap_or(true),
        };
        spec.validate()?;
        Ok(spec)
    }
}

async fn publish(
    fleet: &Option<Arc<dyn Coordinator>>,
    event: LifecycleEvent,
) -> anyhow::Result<()> {
    if let Some(c) = fleet {
        c.publish(&event)
            .await
            .context("the registry changed, but telling the fleet failed; workers see it at their next refresh")?;
    }
    Ok(())
}

async fn get(store: &dyn Store, id: &str) -> anyhow::Result<BotRecord> {
    let id = BotId::new(id)?;
    store
        .get_bot(&id)
        .await?
        .with_context(|| format!("no bot {id}"))
}

pub(crate) async fn run(cmd: BotsCommand) -> anyhow::Result<ExitCode> {
    crate::common::init_logs("warn");
    match cmd {
        BotsCommand::Add { backends, bot } => {
            let spec = ImportLine {
                id: bot.id,
                platform: bot.platform,
                token: bot.token,
                app_token: bot.app_token,
                api_url: bot.api_url,
                handler: Some(
                    match bot.handler {
                        HandlerKind::Echo => "echo",
                        HandlerKind::Webhook => "webhook",
                    }
                    .to_owned(),
                ),
                webhook_url: bot.webhook_url,
                webhook_secret: bot.webhook_secret,
                enabled: Some(!bot.disabled),
            }
            .into_spec()?;
            let store = backends.store().await?;
            let fleet = backends.redis().await?;
            store.add_bot(&spec).await?;
            publish(&fleet, LifecycleEvent::Activate(spec.id.clone())).await?;
            println!("added {}", spec.id);
        }
        BotsCommand::Import { backends, file } => return import(backends, &file).await,
        BotsCommand::List { backends, json } => {
            let store = backends.store().await?;
            let fleet = backends.redis().await?;
            let bots = store.list_bots(&BotFilter::default()).await?;
            let inbox = store.inbox_stats().await?;
            let mut rows = Vec::new();
            for b in &bots {
                let owner = match &fleet {
                    Some(c) => c
                        .owner(&b.spec.id)
                        .await?
                        .filter(|o| o.live)
                        .map(|o| o.worker.to_string()),
                    None => b
                        .reported_by
                        .clone()
                        .filter(|_| b.status == BotStatus::Running),
                };
                rows.push(serde_json::json!({
                    "id": b.spec.id.as_str(),
                    "platform": b.spec.platform.as_str(),
                    "enabled": b.spec.enabled,
                    "status": b.status.as_str(),
                    "owner": owner,
                    "pending": inbox.get(&b.spec.id).map_or(0, |s| s.pending),
                    "undeliverable": inbox.get(&b.spec.id).map_or(0, |s| s.undeliverable),
                    "last_error": b.last_error,
                }));
            }
            if json {
                for r in rows {
                    println!("{r}");
                }
            } else {
                println!(
                    "{:<24} {:<9} {:<7} {:<8} {:<20} {:>7} {:>13} LAST ERROR",
                    "ID", "PLATFORM", "ENABLED", "STATUS", "OWNER", "PENDING", "UNDELIVERABLE"
                );
                for r in rows {
                    println!(
                        "{:<24} {:<9} {:<7} {:<8} {:<20} {:>7} {:>13} {}",
                        r["id"].as_str().unwrap_or_default(),
                        r["platform"].as_str().unwrap_or_default(),
                        r["enabled"],
                        r["status"].as_str().unwrap_or_default(),
                        r["owner"].as_str().unwrap_or("-"),
                        r["pending"],
                        r["undeliverable"],
                        r["last_error"].as_str().unwrap_or(""),
                    );
                }
            }
        }
        BotsCommand::Remove { backends, id } => {
            let store = backends.store().await?;
            let fleet = backends.redis().await?;
            let id = BotId::new(id)?;
            if !store.remove_bot(&id).await? {
                bail!("no bot {id}");
            }
            publish(&fleet, LifecycleEvent::Deactivate(id.clone())).await?;
            println!("removed {id}");
        }
        BotsCommand::Enable { backends, id } => set_enabled(backends, &id, true).await?,
        BotsCommand::Disable { backends, id } => set_enabled(backends, &id, false).await?,
        BotsCommand::Restart { backends, id } => {
            let store = backends.store().await?;
            let fleet = backends.redis().await?;
            let rec = get(&*store, &id).await?;
            // Re-writing the spec bumps its change time: embedded workers restart it too.
            store.update_bot(&rec.spec).await?;
            store
                .set_status(&rec.spec.id, BotStatus::Pending, None, None)
                .await?;
            publish(&fleet, LifecycleEvent::Restart(rec.spec.id.clone())).await?;
            println!("restarting {}", rec.spec.id);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn set_enabled(backends: Backends, id: &str, enabled: bool) -> anyhow::Result<()> {
    let store = backends.store().await?;
    let fleet = backends.redis().await?;
    let mut rec = get(&*store, id).await?;
    rec.spec.enabled = enabled;
    store.update_bot(&rec.spec).await?;
    let ev = if enabled {
        LifecycleEvent::Activate(rec.spec.id.clone())
    } else {
        LifecycleEvent::Deactivate(rec.spec.id.clone())
    };
    publish(&fleet, ev).await?;
    println!(
        "{} {}",
        if enabled { "enabled" } else { "disabled" },
        rec.spec.id
    );
    Ok(())
}

async fn import(backends: Backends, file: &str) -> anyhow::Result<ExitCode> {
    let reader: Box<dyn BufRead> = if file == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(file).with_context(|| format!("cannot open {file}"))?,
        ))
    };
    let store = backends.store().await?;
    let fleet = backends.redis().await?;
    let (mut ok, mut bad) = (0usize, 0usize);
    for (n, line) in reader.lines().enumerate() {
        let n = n + 1;
        let line = match line {
            Ok(l) => l,
            Err(e) => {
                eprintln!("line {n}: unreadable: {e}");
                bad += 1;
                continue;
            }
        };
        if line.trim().is_empty() {
            continue;
        }
        let result = async {
            let l = ImportLine::from_json(&line).map_err(|e| anyhow::anyhow!("{e}"))?;
            let spec = l.into_spec()?;
            match store.add_bot(&spec).await {
                Ok(()) => {}
                Err(StoreError::AlreadyExists(id)) => anyhow::bail!("bot {id} exists already"),
                Err(e) => return Err(e.into()),
            }
            publish(&fleet, LifecycleEvent::Activate(spec.id.clone())).await?;
            Ok::<_, anyhow::Error>(())
        }
        .await;
        match result {
            Ok(()) => ok += 1,
            Err(e) => {
                eprintln!("line {n}: {e:#}");
                bad += 1;
            }
        }
    }
    println!("imported {ok} bots, {bad} lines refused");
    Ok(if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
