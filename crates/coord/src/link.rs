//! Which Redis the coordinator talks to: the one server its URL names (standalone), or the
//! primary that Redis Sentinel names, followed across failovers (sentinel).
//!
//! A [`Link`] hands out the current [`Node`]: a client (for subscriptions), the shared
//! multiplexed connection and the connections for blocking reads. In sentinel mode the primary
//! is looked up again
//! - when a call meets a connection error, a timeout or a `READONLY` reply (the server it talks
//!   to is gone, frozen, or was demoted to a replica),
//! - when a Sentinel announces `+switch-master`,
//! - and every [`CHECK_EVERY`] anyway (a demoted server still answers reads).
//!
//! A new address replaces the node; subscribers see [`Link::changes`] and subscribe again on
//! the new primary. Calls in flight on the old node fail and are retried by their callers, as
//! after a Redis restart.

use std::{
    sync::{Arc, RwLock, Weak},
    time::Duration,
};

use redis::{aio::ConnectionManager, ConnectionAddr, Value};
use tokio::sync::{watch, Mutex, OnceCell};
use tracing::{debug, info, warn};

use crate::{redis::RedisConfig, CoordError, Result};

/// How the coordinator finds its Redis.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum RedisMode {
    /// One Redis, at the URL.
    #[default]
    Standalone,
    /// The URLs (comma-separated) are Redis Sentinels; the keys live on the primary they name
    /// for `master`, and a failover is followed within seconds.
    Sentinel {
        /// The name the Sentinels monitor the primary under (`sentinel monitor NAME ...`).
        master: String,
    },
}

/// How often, at most, the sentinel mode asks for the primary again without being told to.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(5);

/// Two lookups after errors are at least this far apart: a burst of failing calls asks once.
const ERROR_LOOKUP_GAP: Duration = Duration::from_millis(250);

/// One Redis server and the connections to it.
pub(crate) struct Node {
    /// For subscriptions (each opens its own connection).
    pub(crate) client: redis::Client,
    /// The shared, multiplexed connection every plain call uses.
    pub(crate) conn: ConnectionManager,
    /// `host:port`, for logs (never a password).
    pub(crate) addr: String,
    blocking_events: OnceCell<Mutex<ConnectionManager>>,
    blocking_commands: OnceCell<Mutex<ConnectionManager>>,
}

/// Which of a node's connections for blocking reads.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Blocking {
    /// `XREAD BLOCK` on the event stream.
    Events,
    /// `BLPOP` on the worker's commands.
    Commands,
}

impl Node {
    async fn connect(client: redis::Client, config: &RedisConfig) -> Result<Arc<Self>> {
        let conn = connect_manager(&client, config, Some(config.response_timeout)).await?;
        Ok(Arc::new(Self {
            addr: addr_of(&client),
            client,
            conn,
            blocking_events: OnceCell::new(),
            blocking_commands: OnceCell::new(),
        }))
    }

    /// The connection for blocking reads of `kind`, made on first use: a blocked read never
    /// holds up the shared connection or the other kind.
    pub(crate) async fn blocking(
        &self,
        kind: Blocking,
        config: &RedisConfig,
    ) -> Result<&Mutex<ConnectionManager>> {
        let cell = match kind {
            Blocking::Events => &self.blocking_events,
            Blocking::Commands => &self.blocking_commands,
        };
        cell.get_or_try_init(|| async {
            connect_manager(&self.client, config, None)
                .await
                .map(Mutex::new)
        })
        .await
    }
}

/// `host:port` of a client's server.
fn addr_of(client: &redis::Client) -> String {
    match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(h, p) => format!("{h}:{p}"),
        other => other.to_string(),
    }
}

/// The connection to the fleet's Redis, replaced when Sentinel names another primary.
pub(crate) struct Link {
    config: Arc<RedisConfig>,
    sentinels: Option<Sentinels>,
    node: RwLock<Arc<Node>>,
    /// Bumped on every new node.
    generation: watch::Sender<u64>,
    /// One lookup at a time.
    looking: Mutex<()>,
    /// When the last lookup after an error started.
    last_error_lookup: std::sync::Mutex<Option<std::time::Instant>>,
}

impl Link {
    /// Connects as `config.mode` says.
    pub(crate) async fn connect(config: Arc<RedisConfig>) -> Result<Arc<Self>> {
        let (sentinels, client) = match &config.mode {
            RedisMode::Standalone => {
                if config.url.contains(',') {
                    return Err(CoordError::InvalidUrl {
                        reason: "a list of URLs needs the sentinel mode (--redis-mode sentinel)"
                            .into(),
                    });
                }
                (None, open_client(config.url.trim())?)
            }
            RedisMode::Sentinel { master } => {
                let s = Sentinels::parse(&config.url, master)?;
                // With no primary in use, a lookup names one or fails.
                let client = s
                    .primary(&config, None)
                    .await?
                    .ok_or(CoordError::Unreachable {
                        what: "find the primary through Sentinel".into(),
                        source: None,
                    })?;
                (Some(s), client)
            }
        };
        let node = Node::connect(client, &config).await?;
        if sentinels.is_some() {
            info!(primary = %node.addr, "Redis primary found through Sentinel");
        }
        let link = Arc::new(Self {
            config,
            sentinels,
            node: RwLock::new(node),
            generation: watch::channel(0).0,
            looking: Mutex::new(()),
            last_error_lookup: std::sync::Mutex::new(None),
        });
        if let Some(s) = &link.sentinels {
            tokio::spawn(watch_sentinels(Arc::downgrade(&link), s.clone()));
        }
        Ok(link)
    }

    /// The node calls go to now.
    pub(crate) fn node(&self) -> Arc<Node> {
        self.node.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Changes when the node does: subscriptions end and subscribe again.
    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// A call on `node` failed with `e` (`None`: it timed out). In sentinel mode, when the
    /// failure says the server may no longer be the primary, look the primary up again, in
    /// the background.
    pub(crate) fn failed(self: &Arc<Self>, node: &Arc<Node>, e: Option<&redis::RedisError>) {
        if self.sentinels.is_none() {
            return;
        }
        let moved = e.is_none_or(|e| {
            e.is_io_error()
                || e.is_timeout()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
        });
        if !moved {
            return;
        }
        {
            let mut last = self
                .last_error_lookup
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|at| at.elapsed() < ERROR_LOOKUP_GAP) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        let (link, node) = (self.clone(), node.clone());
        tokio::spawn(async move {
            if let Err(e) = link.look_up(Some(&node)).await {
                debug!(error = %e, "cannot find the Redis primary through Sentinel yet");
            }
        });
    }

    /// Asks the Sentinels for the primary and moves to it if it is not the one in use.
    /// `after`: skip when the node in use is no longer this one (another lookup moved on).
    async fn look_up(&self, after: Option<&Arc<Node>>) -> Result<()> {
        let Some(s) = &self.sentinels else {
            return Ok(());
        };
        let _one = self.looking.lock().await;
        let current = self.node();
        if after.is_some_and(|a| !Arc::ptr_eq(a, &current)) {
            return Ok(());
        }
        let Some(client) = s.primary(&self.config, Some(&current.addr)).await? else {
            return Ok(());
        };
        let node = Node::connect(client, &self.config).await?;
        warn!(from = %current.addr, to = %node.addr, "Redis primary moved (Sentinel failover); following it");
        *self.node.write().unwrap_or_else(|e| e.into_inner()) = node;
        self.generation.send_modify(|g| *g += 1);
        Ok(())
    }
}

/// Looks the primary up every [`CHECK_EVERY`] and at each `+switch-master` a Sentinel
/// announces, until the link is gone.
async fn watch_sentinels(link: Weak<Link>, sentinels: Sentinels) {
    use futures_util::StreamExt;
    let mut sub: Option<redis::aio::PubSub> = None;
    loop {
        if sub.is_none() {
            sub = sentinels.subscribe_switches().await;
        }
        let told = match sub.as_mut() {
            Some(ps) => {
                let mut stream = ps.on_message();
                match tokio::time::timeout(CHECK_EVERY, stream.next()).await {
                    Ok(Some(m)) => {
                        let payload: String = m.get_payload().unwrap_or_default();
                        // "<master name> <old ip> <old port> <new ip> <new port>"
                        payload.split(' ').next() == Some(sentinels.master.as_str())
                    }
                    Ok(None) => {
                        drop(stream);
                        sub = None;
                        false
                    }
                    Err(_) => false,
                }
            }
            None => {
                tokio::time::sleep(CHECK_EVERY).await;
                false
            }
        };
        let Some(link) = link.upgrade() else {
            return;
        };
        if told {
            info!("a Sentinel announced a new primary");
        }
        if let Err(e) = link.look_up(None).await {
            debug!(error = %e, "cannot find the Redis primary through Sentinel");
        }
    }
}

/// One Sentinel. Sentinels often have no password while the primary has one, so a Sentinel
/// is asked without credentials first, and with its URL's when it answers `NOAUTH`.
#[derive(Clone)]
struct SentinelNode {
    plain: redis::Client,
    authed: Option<redis::Client>,
}

impl SentinelNode {
    /// `ask` on a connection without credentials, then (on `NOAUTH`) with the URL's.
    async fn with<T, F, Fut>(&self, ask: F) -> redis::RedisResult<T>
    where
        F: Fn(redis::Client) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        match (ask(self.plain.clone()).await, &self.authed) {
            (Err(e), Some(authed)) if e.code() == Some("NOAUTH") => ask(authed.clone()).await,
            (r, _) => r,
        }
    }
}

/// The Sentinels of one monitored primary.
#[derive(Clone)]
struct Sentinels {
    nodes: Vec<SentinelNode>,
    master: String,
    /// Credentials and database for the primary: those of the first URL.
    template: redis::ConnectionInfo,
}

impl Sentinels {
    fn parse(urls: &str, master: &str) -> Result<Self> {
        if master.trim().is_empty() {
            return Err(CoordError::InvalidUrl {
                reason: "the sentinel mode needs the primary's name (--redis-sentinel-master)"
                    .into(),
            });
        }
        let mut nodes = Vec::new();
        let mut template = None;
        for url in urls.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            let client = open_client(url)?;
            let info = client.get_connection_info().clone();
            if template.is_none() {
                template = Some(info.clone());
            }
            // A Sentinel has no databases: database 0, and credentials only if it asks.
            let open = |i: redis::ConnectionInfo| {
                redis::Client::open(i).map_err(|e| CoordError::InvalidUrl {
                    reason: format!("does not parse ({:?})", e.kind()),
                })
            };
            let has_credentials = info.redis_settings().password().is_some()
                || info.redis_settings().username().is_some();
            let authed = if has_credentials {
                let settings = info.redis_settings().clone().set_db(0);
                Some(open(info.clone().set_redis_settings(settings))?)
            } else {
                None
            };
            let plain = open(info.set_redis_settings(redis::RedisConnectionInfo::default()))?;
            nodes.push(SentinelNode { plain, authed });
        }
        let Some(template) = template else {
            return Err(CoordError::InvalidUrl {
                reason: "no Sentinel URL given".into(),
            });
        };
        Ok(Self {
            nodes,
            master: master.trim().to_owned(),
            template,
        })
    }

    /// The primary: the first address a Sentinel names whose server says it is a primary;
    /// `None` when that is `current` (`host:port`), which is not asked again.
    async fn primary(
        &self,
        config: &RedisConfig,
        current: Option<&str>,
    ) -> Result<Option<redis::Client>> {
        let limit = config.connect_timeout;
        let mut last = String::from("no Sentinel answered");
        for s in &self.nodes {
            let addr = addr_of(&s.plain);
            let asked = s.with(|client| async move {
                let mut c = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.master)
                    .query_async::<Option<(String, String)>>(&mut c)
                    .await
            });
            let (host, port) = match tokio::time::timeout(limit, asked).await {
                Ok(Ok(Some(hp))) => hp,
                Ok(Ok(None)) => {
                    last = format!("Sentinel {addr} does not know {:?}", self.master);
                    continue;
                }
                Ok(Err(e)) => {
                    last = format!("Sentinel {addr}: {e}");
                    continue;
                }
                Err(_) => {
                    last = format!("Sentinel {addr} did not answer within {limit:?}");
                    continue;
                }
            };
            let Ok(port) = port.parse::<u16>() else {
                last = format!("Sentinel {addr} named a primary with port {port:?}");
                continue;
            };
            if current == Some(format!("{host}:{port}").as_str()) {
                return Ok(None);
            }
            let info = self
                .template
                .clone()
                .set_addr(ConnectionAddr::Tcp(host.clone(), port));
            let client = redis::Client::open(info).map_err(|e| CoordError::InvalidUrl {
                reason: format!("does not parse ({:?})", e.kind()),
            })?;
            let role = async {
                let mut c = client.get_multiplexed_async_connection().await?;
                redis::cmd("ROLE").query_async::<Value>(&mut c).await
            };
            match tokio::time::timeout(limit, role).await {
                Ok(Ok(v)) if is_primary(&v) => return Ok(Some(client)),
                Ok(Ok(_)) => {
                    last =
                        format!("{host}:{port}, named by Sentinel {addr}, is not a primary (yet)")
                }
                Ok(Err(e)) => last = format!("{host}:{port}, named by Sentinel {addr}: {e}"),
                Err(_) => {
                    last = format!(
                        "{host}:{port}, named by Sentinel {addr}, did not answer within {limit:?}"
                    )
                }
            }
        }
        Err(CoordError::Unreachable {
            what: format!(
                "find the primary {:?} through Sentinel: {last}",
                self.master
            ),
            source: None,
        })
    }

    /// A subscription to `+switch-master` on the first Sentinel that takes it.
    async fn subscribe_switches(&self) -> Option<redis::aio::PubSub> {
        for s in &self.nodes {
            let sub = s.with(|client| async move {
                let mut ps = client.get_async_pubsub().await?;
                ps.subscribe("+switch-master").await?;
                Ok::<_, redis::RedisError>(ps)
            });
            if let Ok(Ok(ps)) = tokio::time::timeout(Duration::from_secs(2), sub).await {
                return Some(ps);
            }
        }
        None
    }
}

/// Whether a `ROLE` reply says "master".
fn is_primary(v: &Value) -> bool {
    let Value::Array(items) = v else {
        return false;
    };
    match items.first() {
        Some(Value::BulkString(b)) => b == b"master",
        Some(Value::SimpleString(s)) => s == "master",
        _ => false,
    }
}

/// Checks the URL's shape and returns a client, with errors that never echo a password.
pub(crate) fn open_client(url: &str) -> Result<redis::Client> {
    let scheme = url.split_once("://").map(|(s, _)| s);
    match scheme {
        Some("redis" | "redis+unix" | "unix") => {}
        Some("rediss") => {
            return Err(CoordError::InvalidUrl {
                reason: "TLS (rediss://) is not built into this binary".into(),
            })
        }
        Some(other) => {
            return Err(CoordError::InvalidUrl {
                reason: format!("unsupported scheme {other:?} (expected redis://)"),
            })
        }
        None => {
            return Err(CoordError::InvalidUrl {
                reason: "expected redis://host:port[/db]".into(),
            })
        }
    }
    redis::Client::open(url).map_err(|e| CoordError::InvalidUrl {
        reason: format!("does not parse ({:?})", e.kind()),
    })
}

/// A connection manager that reconnects by itself, with the config's timeouts.
pub(crate) async fn connect_manager(
    client: &redis::Client,
    config: &RedisConfig,
    response_timeout: Option<Duration>,
) -> Result<ConnectionManager> {
    let cfg = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(response_timeout)
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    match tokio::time::timeout(
        config.connect_timeout * 2,
        ConnectionManager::new_with_config(client.clone(), cfg),
    )
    .await
    {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(CoordError::Unreachable {
            what: "connect".into(),
            source: Some(e),
        }),
        Err(_) => Err(CoordError::Unreachable {
            what: format!(
                "connect (no answer within {:?})",
                config.connect_timeout * 2
            ),
            source: None,
        }),
    }
}
