//! `botfleet bots …`: the registry. With `--redis-url`, every change is also published as a
//! lifecycle event so running workers react within a second; without it, an embedded worker
//! on the same database picks changes up at its next registry refresh (2 s by default).

use std::{
    io::{BufRead, IsTerminal},
    process::ExitCode,
};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};

use reqwest::Method;

use crate::{
    common::{Backends, Remote, RemoteWorker},
    registry::{BotLine, BotPatch, Change, LineOutcome, Registry},
};

/// A handler as `--handler` takes it: `echo`, `webhook`, or the name of a handler compiled
/// into the workers (a worker built as a library); checked as the registry checks it.
fn handler_name(v: &str) -> Result<String, String> {
    if v == "echo" || v == "webhook" || botfleet_core::HandlerSpec::is_handler_name(v) {
        Ok(v.to_owned())
    } else {
        Err("expected echo, webhook, or a compiled-in handler's name (a-z, 0-9, _ or -, starting with a letter, at most 32)".into())
    }
}

/// What `bots update` changes; a flag left out keeps the current value.
#[derive(Debug, Args)]
pub(crate) struct UpdateArgs {
    /// A new platform token; `-` reads it from standard input (keeps it out of the process
    /// list).
    #[arg(long)]
    token: Option<String>,
    /// A new Slack app-level token (`xapp-…`); `-` reads it from standard input.
    #[arg(long)]
    app_token: Option<String>,
    /// A new platform API base URL; an empty value goes back to the platform's default.
    #[arg(long)]
    api_url: Option<String>,
    /// A new handler: `echo`, `webhook`, or the name of one compiled into the workers.
    #[arg(long, value_parser = handler_name)]
    handler: Option<String>,
    /// Where the webhook handler POSTs.
    #[arg(long)]
    webhook_url: Option<String>,
    /// A new webhook signing key; an empty value sends unsigned requests.
    #[arg(long)]
    webhook_secret: Option<String>,
    /// Discord: a new shard count, or `auto`.
    #[arg(long, value_parser = shard_count, value_name = "auto|N")]
    shards: Option<ShardCount>,
    /// Discord: new shards per slice; 0 makes the bot one unit again.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=4096), value_name = "K")]
    shards_per_slice: Option<u32>,
    #[command(flatten)]
    hook: HookArgs,
}

impl UpdateArgs {
    fn into_patch(self) -> anyhow::Result<BotPatch> {
        let read = |v: Option<String>, what: &str| -> anyhow::Result<Option<String>> {
            match v.as_deref() {
                Some("-") => {
                    let mut line = String::new();
                    std::io::stdin()
                        .read_line(&mut line)
                        .with_context(|| format!("reading the {what} from standard input"))?;
                    let t = line.trim_end_matches(['\r', '\n']).to_owned();
                    if t.is_empty() {
                        bail!("no {what} on standard input");
                    }
                    Ok(Some(t))
                }
                _ => Ok(v),
            }
        };
        let clear = |v: Option<String>| v.map(|s| Some(s).filter(|s| !s.is_empty()));
        let mut patch = BotPatch {
            token: read(self.token, "token")?,
            app_token: read(self.app_token, "app token")?.map(Some),
            api_url: clear(self.api_url),
            handler: self.handler,
            webhook_url: self.webhook_url.map(Some),
            webhook_secret: clear(self.webhook_secret),
            enabled: None,
            shards: self.shards.map(|s| s.0),
            shards_per_slice: self.shards_per_slice.map(|k| Some(k).filter(|k| *k > 0)),
            ..BotPatch::default()
        };
        self.hook.fill_patch(&mut patch);
        if patch.is_empty() {
            bail!("nothing to change: give at least one of --token, --app-token, --api-url, --handler, --webhook-url, --webhook-secret, --shards, --shards-per-slice, --mode, --secret-token, --signing-secret, --app-secret, --verify-token, --phone-number-id, --max-connections, --commands, --handler-timeout-s, --typing, --async-reply-ttl-s, --stream, --rate-limits");
        }
        Ok(patch)
    }
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
    /// WhatsApp device-link bots (`--mode web`) have none: `bots link` links them.
    #[arg(long, env = "BOTFLEET_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Slack's app-level token (`xapp-…`, scope connections:write) that opens Socket Mode
    /// connections. Prefer the environment variable.
    #[arg(long, env = "BOTFLEET_APP_TOKEN", hide_env_values = true)]
    app_token: Option<String>,
    /// The platform API's base URL: a self-hosted Bot API server for Telegram; Slack's Web
    /// API base (default `https://slack.com/api/`); Discord's REST base with the version
    /// (default `https://discord.com/api/v10`); WhatsApp's Graph API base (default
    /// `https://graph.facebook.com/v21.0`), or for a device-link bot (`--mode web`) the
    /// WhatsApp Web socket, ws:// or wss:// (default `wss://web.whatsapp.com/ws/chat`).
    #[arg(long)]
    api_url: Option<String>,
    /// How the bot answers: `echo`, `webhook` (POSTs each event to --webhook-url), or the
    /// name of a handler compiled into the workers (a worker built as a library).
    #[arg(long, value_parser = handler_name, default_value = "echo")]
    handler: String,
    /// Where the webhook handler POSTs.
    #[arg(long)]
    webhook_url: Option<String>,
    /// HMAC-SHA256 key signing webhook requests.
    #[arg(long, env = "BOTFLEET_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// Register it disabled.
    #[arg(long)]
    disabled: bool,
    /// Discord: the number of shards (1-4096), or `auto` for the count Discord recommends
    /// (`GET /gateway/bot`, read again when the bot restarts).
    #[arg(long, value_parser = shard_count, value_name = "auto|N")]
    shards: Option<ShardCount>,
    /// Discord: split the shards into slices of this many (1-4096), each placed on a worker
    /// of its own choosing. With --shards auto the slices are cut from the count Discord
    /// recommends, read when the bot starts; when Discord recommends another, the bot restarts
    /// as a whole on it. Without it the bot is one unit.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096), value_name = "K")]
    shards_per_slice: Option<u32>,
    #[command(flatten)]
    hook: HookArgs,
}

/// How a bot receives and what verifies its webhook deliveries (flags of `add` and `update`).
#[derive(Debug, Args, Default)]
pub(crate) struct HookArgs {
    /// How the bot receives: telegram `poll` (default) or `webhook`; slack `socket` (default)
    /// or `events`; whatsapp `cloud` (default) or `web`.
    #[arg(long)]
    mode: Option<String>,
    /// Telegram webhook mode: the secret every delivery carries in
    /// `X-Telegram-Bot-Api-Secret-Token` (A-Z a-z 0-9 _ -, up to 256).
    #[arg(long, env = "BOTFLEET_SECRET_TOKEN", hide_env_values = true)]
    secret_token: Option<String>,
    /// Slack Events API: the app's signing secret (`X-Slack-Signature`).
    #[arg(long, env = "BOTFLEET_SIGNING_SECRET", hide_env_values = true)]
    signing_secret: Option<String>,
    /// WhatsApp Cloud API: the app secret (`X-Hub-Signature-256`).
    #[arg(long, env = "BOTFLEET_APP_SECRET", hide_env_values = true)]
    app_secret: Option<String>,
    /// WhatsApp Cloud API: the verify token of the subscription handshake.
    #[arg(long, env = "BOTFLEET_VERIFY_TOKEN", hide_env_values = true)]
    verify_token: Option<String>,
    /// WhatsApp Cloud API: the id of the phone number replies are sent from.
    #[arg(long)]
    phone_number_id: Option<String>,
    /// Telegram webhook mode: deliveries in flight at once (`setWebhook`'s max_connections,
    /// 1-100; default 40).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    max_connections: Option<u32>,
    /// Telegram, Discord: a JSON file of the bot's commands, `[{"name", "description",
    /// "options": [{"name", "description", "type", "required"}]}]`, which the fleet registers
    /// with the platform (`setMyCommands`, Discord's application commands); `[]` removes them.
    #[arg(long, value_name = "FILE", value_parser = commands_file)]
    commands: Option<CommandsFile>,
    /// How long one call of the bot's handler may take, in seconds (1-900) [default: the
    /// workers' --handler-timeout-s].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(botfleet_core::MAX_HANDLER_TIMEOUT_S)))]
    handler_timeout_s: Option<u32>,
    /// Whether the chat is shown typing while the bot's handler runs long (`true` or
    /// `false`) [default: true, where the platform has typing].
    #[arg(long, value_name = "BOOL")]
    typing: Option<bool>,
    /// How long a turn whose handler answered 202 waits for its answer, in seconds
    /// (10-86400) [default: the workers' --async-reply-ttl-s].
    #[arg(long, value_parser = clap::value_parser!(u32).range(i64::from(*botfleet_core::ASYNC_REPLY_TTL_S.start())..=i64::from(*botfleet_core::ASYNC_REPLY_TTL_S.end())))]
    async_reply_ttl_s: Option<u32>,
    /// How a streamed answer (a message sent with a ref, then edited as it grows) reaches the
    /// platform: `native` (the platform's own streams where the chat has them: Slack threads,
    /// Telegram private chats; edits elsewhere) or `edits` [default: native].
    #[arg(long, value_name = "MODE", value_parser = stream_mode)]
    stream: Option<botfleet_core::StreamMode>,
    /// The bot's own send limits over the workers' --rate-limits: `off`, `SCOPE=off` or
    /// `SCOPE=CALLS/SECONDS[:BURST]`, comma-separated, of its platform's scopes (e.g.
    /// `bot=100/1,group=off` for a Telegram bot on a Bot API server of its own); on `update`,
    /// "" goes back to the workers'.
    #[arg(long, value_name = "LIMITS")]
    rate_limits: Option<String>,
}

/// `--stream native|edits`.
fn stream_mode(s: &str) -> Result<botfleet_core::StreamMode, String> {
    s.parse()
}

/// The commands read from `--commands FILE`: one value to clap (an `Option<Vec<_>>` field
/// would be taken for a flag given many times, one command each).
#[derive(Clone, Debug)]
pub(crate) struct CommandsFile(Vec<botfleet_core::CommandSpec>);

/// `--commands FILE`: the file's JSON array of commands (checked for the platforms' rules
/// when the bot is).
fn commands_file(path: &str) -> Result<CommandsFile, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    serde_json::from_str(&text).map(CommandsFile).map_err(|e| {
        format!(
            "{path} is not a JSON array of commands ({{\"name\", \"description\", \"options\"}}): line {}, column {}",
            e.line(),
            e.column()
        )
    })
}

impl HookArgs {
    /// The flags as a new bot's fields.
    fn fill_line(self, line: &mut BotLine) {
        line.mode = self.mode;
        line.secret_token = self.secret_token;
        line.signing_secret = self.signing_secret;
        line.app_secret = self.app_secret;
        line.verify_token = self.verify_token;
        line.phone_number_id = self.phone_number_id;
        line.max_connections = self.max_connections;
        line.commands = self.commands.map(|c| c.0);
        line.handler_timeout_s = self.handler_timeout_s;
        line.typing = self.typing;
        line.async_reply_ttl_s = self.async_reply_ttl_s;
        line.stream = self.stream;
        line.rate_limits = self.rate_limits;
    }

    /// The flags as a change's fields (an empty text clears).
    fn fill_patch(self, patch: &mut BotPatch) {
        patch.mode = self.mode;
        patch.secret_token = self.secret_token;
        patch.signing_secret = self.signing_secret;
        patch.app_secret = self.app_secret;
        patch.verify_token = self.verify_token;
        patch.phone_number_id = self.phone_number_id;
        patch.max_connections = self.max_connections;
        patch.commands = self.commands.map(|c| Some(c.0));
        patch.handler_timeout_s = self.handler_timeout_s.map(Some);
        patch.typing = self.typing.map(Some);
        patch.async_reply_ttl_s = self.async_reply_ttl_s.map(Some);
        patch.stream = self.stream.map(Some);
        patch.rate_limits = self.rate_limits.map(Some);
    }
}

/// A bot's shards as `bots list` shows them: `-` for bots without, `N`, `auto`, or for a bot
/// on the recommended count sliced in K `auto 6/6 K=2` (in use / recommended; `?` while it is
/// counted again).
fn shards_cell(r: &serde_json::Value) -> String {
    let n = |k: &str| r[k].as_u64().map_or("?".to_owned(), |v| v.to_string());
    match (r["shards"].as_u64(), r["shards_per_slice"].as_u64()) {
        (Some(s), None) => s.to_string(),
        (Some(s), Some(k)) => format!("{s} K={k}"),
        (None, Some(k)) => format!(
            "auto {}/{} K={k}",
            n("shards_in_use"),
            n("shards_recommended")
        ),
        (None, None) if r["platform"] == "discord" => "auto".to_owned(),
        (None, None) => "-".to_owned(),
    }
}

/// `--shards`: `auto` or a count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ShardCount(Option<u32>);

fn shard_count(s: &str) -> Result<ShardCount, String> {
    if s == "auto" {
        return Ok(ShardCount(None));
    }
    match s.parse::<u32>() {
        Ok(n) if (1..=4096).contains(&n) => Ok(ShardCount(Some(n))),
        _ => Err("must be auto or a number from 1 to 4096".into()),
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum BotsCommand {
    /// Register a bot.
    Add {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        remote: RemoteWorker,
        #[command(flatten)]
        bot: AddArgs,
    },
    /// Change a registered bot (rotate a token, switch its handler); its owner restarts it
    /// with the new settings within a second (embedded: at the next registry refresh).
    Update {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        remote: RemoteWorker,
        /// The bot's id.
        id: String,
        #[command(flatten)]
        change: UpdateArgs,
    },
    /// Register many bots from a JSON-lines file (fields of `add`: id, platform, token,
    /// app_token, api_url, handler, webhook_url, webhook_secret, enabled, shards, shards_per_slice,
    /// mode, secret_token, signing_secret, app_secret, verify_token, phone_number_id,
    /// max_connections, commands, handler_timeout_s, typing, async_reply_ttl_s, stream,
    /// rate_limits); `-` reads standard input.
    Import {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        remote: Remote,
        /// The file.
        file: String,
        /// Update bots that exist already (a line without `enabled` keeps their setting)
        /// instead of refusing them.
        #[arg(long)]
        upsert: bool,
    },
    /// List bots (never their tokens).
    List {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        remote: Remote,
        /// One JSON object per bot instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Unregister a bot.
    Remove {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        remote: Remote,
        /// The bot's id.
        id: String,
    },
    /// Enable a bot.
    Enable {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        remote: Remote,
        /// The bot's id.
        id: String,
    },
    /// Disable a bot (it stays registered, nobody runs it).
    Disable {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        remote: Remote,
        /// The bot's id.
        id: String,
    },
    /// Link a WhatsApp device-link bot (`--mode web`) to a phone: shows a QR code to scan in
    /// WhatsApp > Linked devices (or, with `--phone`, a code to enter on that phone), waits
    /// until the phone confirms, stores the session and restarts the bot.
    Link {
        #[command(flatten)]
        backends: Backends,
        /// The bot's id.
        id: String,
        /// Link with a pairing code for this phone number (country code first, digits
        /// only, e.g. 15551234567) instead of a QR code.
        #[arg(long)]
        phone: Option<String>,
        /// How long to wait for the phone, in seconds.
        #[arg(long, default_value_t = 180)]
        timeout: u64,
        /// Replace a linked session (disable the bot first, so no worker runs it meanwhile).
        #[arg(long)]
        force: bool,
    },
    /// Restart a bot (e.g. after fixing its token); clears a `failed` status.
    Restart {
        #[command(flatten)]
        backends: Backends,
        #[command(flatten)]
        remote: Remote,
        /// The bot's id.
        id: String,
    },
}

pub(crate) async fn run(cmd: BotsCommand) -> anyhow::Result<ExitCode> {
    crate::common::init_logs("warn");
    match cmd {
        BotsCommand::Add {
            backends,
            remote,
            bot,
        } => {
            let mut line = BotLine {
                id: bot.id,
                platform: bot.platform,
                token: bot.token.unwrap_or_default(),
                app_token: bot.app_token,
                api_url: bot.api_url,
                handler: Some(bot.handler.clone()),
                webhook_url: bot.webhook_url,
                webhook_secret: bot.webhook_secret,
                enabled: Some(!bot.disabled),
                shards: bot.shards.and_then(|s| s.0),
                shards_per_slice: bot.shards_per_slice,
                ..BotLine::default()
            };
            bot.hook.fill_line(&mut line);
            let id = line.id.clone();
            match remote.client()? {
                Some(api) => {
                    api.call(Method::POST, "/bots", Some(line.to_json().to_string()))
                        .await?;
                }
                None => {
                    let spec = line.into_spec()?;
                    registry(&backends).await?.add(&spec).await?;
                }
            }
            println!("added {id}");
        }
        BotsCommand::Update {
            backends,
            remote,
            id,
            change,
        } => {
            let patch = change.into_patch()?;
            let change = match remote.client()? {
                Some(api) => {
                    let v = api
                        .call(
                            Method::PATCH,
                            &format!("/bots/{}", path_segment(&id)),
                            Some(patch.to_json().to_string()),
                        )
                        .await?;
                    if v["change"] == "unchanged" {
                        Change::Unchanged
                    } else {
                        Change::Updated
                    }
                }
                None => registry(&backends).await?.update(&id, patch).await?,
            };
            match change {
                Change::Unchanged => println!("{id} unchanged"),
                _ => println!("updated {id}"),
            }
        }
        BotsCommand::Import {
            backends,
            remote,
            file,
            upsert,
        } => return import(backends, remote, &file, upsert).await,
        BotsCommand::List {
            backends,
            remote,
            json,
        } => {
            let rows: Vec<serde_json::Value> = match remote.client()? {
                Some(api) => api.call(Method::GET, "/bots", None).await?["bots"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
                None => registry(&backends)
                    .await?
                    .list()
                    .await?
                    .into_iter()
                    .map(serde_json::to_value)
                    .collect::<Result<_, _>>()?,
            };
            if json {
                for r in rows {
                    println!("{r}");
                }
            } else {
                println!(
                    "{:<24} {:<9} {:<7} {:<8} {:<20} {:>7} {:>5} {:>6} {:>13} {:<14} LAST ERROR",
                    "ID",
                    "PLATFORM",
                    "ENABLED",
                    "STATUS",
                    "OWNER",
                    "PENDING",
                    "HELD",
                    "PAUSED",
                    "UNDELIVERABLE",
                    "SHARDS"
                );
                for r in rows {
                    // A device-link bot no phone has linked yet is shown as such: no worker
                    // runs it until `bots link`.
                    let status = if r["linked"] == serde_json::Value::Bool(false) {
                        "unlinked"
                    } else {
                        r["status"].as_str().unwrap_or_default()
                    };
                    println!(
                        "{:<24} {:<9} {:<7} {:<8} {:<20} {:>7} {:>5} {:>6} {:>13} {:<14} {}",
                        r["id"].as_str().unwrap_or_default(),
                        r["platform"].as_str().unwrap_or_default(),
                        r["enabled"].to_string(),
                        status,
                        r["owner"].as_str().unwrap_or("-"),
                        r["pending"],
                        r["held"],
                        r["paused_chats"],
                        r["undeliverable"],
                        shards_cell(&r),
                        r["last_error"].as_str().unwrap_or(""),
                    );
                }
            }
        }
        BotsCommand::Remove {
            backends,
            remote,
            id,
        } => {
            match remote.client()? {
                Some(api) => {
                    api.call(
                        Method::DELETE,
                        &format!("/bots/{}", path_segment(&id)),
                        None,
                    )
                    .await?;
                }
                None => registry(&backends).await?.remove(&id).await?,
            }
            println!("removed {id}");
        }
        BotsCommand::Enable {
            backends,
            remote,
            id,
        } => {
            act(&backends, &remote, &id, "enable").await?;
            println!("enabled {id}");
        }
        BotsCommand::Disable {
            backends,
            remote,
            id,
        } => {
            act(&backends, &remote, &id, "disable").await?;
            println!("disabled {id}");
        }
        BotsCommand::Link {
            backends,
            id,
            phone,
            timeout,
            force,
        } => return link(&backends, &id, phone, timeout, force).await,
        BotsCommand::Restart {
            backends,
            remote,
            id,
        } => {
            act(&backends, &remote, &id, "restart").await?;
            println!("restarting {id}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// An id as one URL path segment (ids are letters, digits and `- _ . @`; anything else is
/// escaped so the API refuses it as an id, not as a route).
pub(crate) fn path_segment(id: &str) -> String {
    id.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.@".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `enable`, `disable` or `restart`, through the API or on the registry.
async fn act(backends: &Backends, remote: &Remote, id: &str, what: &str) -> anyhow::Result<()> {
    if let Some(api) = remote.client()? {
        api.call(
            Method::POST,
            &format!("/bots/{}/{what}", path_segment(id)),
            None,
        )
        .await?;
        return Ok(());
    }
    let reg = registry(backends).await?;
    match what {
        "enable" => reg.set_enabled(id, true).await.map(|_| ())?,
        "disable" => reg.set_enabled(id, false).await.map(|_| ())?,
        _ => reg.restart(id).await?,
    }
    Ok(())
}

async fn registry(backends: &Backends) -> anyhow::Result<Registry> {
    Ok(Registry {
        store: backends.store().await?,
        fleet: backends.redis().await?,
    })
}

async fn import(
    backends: Backends,
    remote: Remote,
    file: &str,
    upsert: bool,
) -> anyhow::Result<ExitCode> {
    let mut reader: Box<dyn BufRead> = if file == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(file).with_context(|| format!("cannot open {file}"))?,
        ))
    };
    // (added, updated, unchanged) and the refused lines with why.
    let mut counts = [0usize; 3];
    let mut refused: Vec<(u64, String)> = Vec::new();
    if let Some(api) = remote.client()? {
        let mut body = String::new();
        reader
            .read_to_string(&mut body)
            .with_context(|| format!("reading {file}"))?;
        let path = if upsert {
            "/bots/import?upsert=true"
        } else {
            "/bots/import"
        };
        let v = api.call(Method::POST, path, Some(body)).await?;
        for (i, k) in ["added", "updated", "unchanged"].iter().enumerate() {
            counts[i] = usize::try_from(v[*k].as_u64().unwrap_or(0)).unwrap_or(usize::MAX);
        }
        for r in v["refused"].as_array().into_iter().flatten() {
            refused.push((
                r["line"].as_u64().unwrap_or(0),
                r["error"].as_str().unwrap_or_default().to_owned(),
            ));
        }
    } else {
        let reg = registry(&backends).await?;
        let lines = reader
            .lines()
            .enumerate()
            .map(|(n, l)| (n + 1, l.map_err(|e| e.to_string())));
        // On a terminal, a progress line (thousands of lines take a while on a remote
        // database); never in a pipe or a file.
        let terminal = std::io::stderr().is_terminal();
        let mut shown = std::time::Instant::now();
        let progress = |n: usize| {
            if terminal && shown.elapsed() >= std::time::Duration::from_millis(250) {
                shown = std::time::Instant::now();
                eprint!("\r{n} lines read…");
            }
        };
        let results = reg.import(lines, upsert, progress).await;
        if terminal {
            eprint!("\r\x1b[K");
        }
        for r in results {
            match r.outcome {
                LineOutcome::Done { change } => counts[change as usize] += 1,
                LineOutcome::Refused { error, .. } => refused.push((r.line as u64, error)),
            }
        }
    }
    for (line, error) in &refused {
        eprintln!("line {line}: {error}");
    }
    let bad = refused.len();
    let [added, updated, unchanged] = counts;
    if upsert {
        println!(
            "imported {} bots ({added} added, {updated} updated, {unchanged} unchanged), {bad} lines refused",
            added + updated + unchanged
        );
    } else {
        println!("imported {added} bots, {bad} lines refused");
    }
    Ok(if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `bots link`: see [`BotsCommand::Link`].
#[cfg(feature = "whatsapp-web")]
async fn link(
    backends: &Backends,
    id: &str,
    phone: Option<String>,
    timeout: u64,
    force: bool,
) -> anyhow::Result<ExitCode> {
    use botfleet_platform::SessionKv;
    use botfleet_whatsapp::device::{self, LinkPrompt, WebConfig};

    let reg = registry(backends).await?;
    let rec = reg.get(id).await?;
    if !botfleet_whatsapp::is_device_link(&rec.spec) {
        anyhow::bail!(
            "{id} is not a WhatsApp device-link bot: only `--platform whatsapp --mode web` bots are linked"
        );
    }
    if let Some(p) = &phone {
        if p.is_empty() || p.len() > 15 || !p.bytes().all(|b| b.is_ascii_digit()) {
            anyhow::bail!(
                "--phone takes the number with its country code, digits only (e.g. 15551234567)"
            );
        }
    }
    if timeout == 0 {
        anyhow::bail!("--timeout must be at least 1 second");
    }
    let linked = crate::registry::linked(reg.store.as_ref(), &rec.spec)
        .await?
        .unwrap_or(false);
    if linked && !force {
        anyhow::bail!(
            "{id} is linked already; to link it to another phone: `botfleet bots disable {id}`, then `botfleet bots link {id} --force`"
        );
    }
    if force && rec.spec.enabled {
        anyhow::bail!(
            "{id} is enabled: `botfleet bots disable {id}` first, so no worker uses the session while it is replaced"
        );
    }
    // Under a fence of its own above every one granted so far: a worker that runs the bot
    // later holds a higher one and reads what is written here, and a second link of the bot
    // started meanwhile voids this one instead of mixing two devices in one session.
    let session = std::sync::Arc::new(
        botfleet_runtime::StoreSession::above_all(reg.store.clone(), rec.spec.id.clone())
            .await
            .map_err(|e| anyhow::anyhow!("cannot take the session to link it: {e}"))?,
    );
    // A new device starts from nothing: the session replaced (`--force`), or what an earlier
    // link left unfinished (its keys are no other link's to reuse).
    session
        .clear()
        .await
        .map_err(|e| anyhow::anyhow!("cannot clear the old session: {e}"))?;
    let cfg = WebConfig::from_env().map_err(anyhow::Error::msg)?;
    let with_phone = phone.is_some();
    if with_phone {
        println!("asking WhatsApp for a pairing code…");
    } else {
        println!("waiting for a QR code from WhatsApp…");
    }
    let linked_as = device::link(
        &cfg,
        &rec.spec.id,
        rec.spec.options.api_url.as_deref(),
        session,
        phone,
        std::time::Duration::from_secs(timeout),
        |p| match p {
            LinkPrompt::Qr(code) => {
                println!(
                    "Scan with WhatsApp on the phone (Settings > Linked devices > Link a device):"
                );
                println!("{}", render_qr(&code));
                println!("QR data: {code}");
            }
            LinkPrompt::Code(code) => println!(
                "On the phone: WhatsApp > Linked devices > Link a device > Link with phone number instead, and enter {code}"
            ),
        },
    )
    .await;
    match linked_as {
        Ok(jid) => {
            println!("linked {id} as {jid}");
            if rec.spec.enabled {
                reg.restart(id).await?;
                println!("its worker connects it now");
            } else {
                println!("it is disabled: `botfleet bots enable {id}` to run it");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// A QR code as text for a terminal: two modules per character cell.
#[cfg(feature = "whatsapp-web")]
fn render_qr(data: &str) -> String {
    match qrcode::QrCode::new(data.as_bytes()) {
        Ok(code) => code
            .render::<qrcode::render::unicode::Dense1x2>()
            .quiet_zone(true)
            .build(),
        Err(e) => format!("(cannot draw the QR code: {e}; render the QR data below instead)"),
    }
}

#[cfg(not(feature = "whatsapp-web"))]
async fn link(
    _backends: &Backends,
    _id: &str,
    _phone: Option<String>,
    _timeout: u64,
    _force: bool,
) -> anyhow::Result<ExitCode> {
    anyhow::bail!("WhatsApp device-link is not in this build (cargo feature whatsapp-web)")
}
