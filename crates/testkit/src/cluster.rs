//! A private Redis Cluster on loopback ports: primaries and their replicas, each a
//! `redis-server --cluster-enabled yes` of its own ([`RedisServer`]), joined with
//! `redis-cli --cluster create`. Every process is killed (by its pid) and its directory
//! removed on drop.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::RedisServer;

/// A Redis Cluster of its own: by default three primaries with one replica each, every slot
/// served. A node that fails is noticed by the others within a second (`cluster-node-timeout`
/// 1000 ms), and the slots of the nodes still up keep being served while some are down
/// (`cluster-require-full-coverage no`), as operators run it when one node's trouble must not
/// stop the others.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`: a node's id, port, whether it is a primary, and (a replica)
/// its primary's id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node's id (40 hex characters).
    pub id: String,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Whether it is a primary now (else a replica).
    pub primary: bool,
    /// A replica's primary (its id).
    pub replica_of: Option<String>,
    /// Flagged failed (`fail`) by the cluster.
    pub failed: bool,
    /// The slot ranges it serves (a primary's), each `start..=end`.
    pub slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Three primaries and three replicas (one each); waits until every node says the cluster
    /// is `ok` and each replica follows its primary.
    ///
    /// # Errors
    /// When `redis-server` or `redis-cli` is missing, or the cluster does not form in 30 s.
    pub fn start() -> std::io::Result<Self> {
        Self::start_with(3, 1)
    }

    /// `primaries` primaries (3 at least: `redis-cli --cluster create` asks for that many),
    /// each with `replicas` replicas.
    ///
    /// # Errors
    /// As [`RedisCluster::start`].
    pub fn start_with(primaries: usize, replicas: usize) -> std::io::Result<Self> {
        let count = primaries * (1 + replicas);
        let nodes = (0..count)
            .map(|_| {
                // The cluster bus on a free port of its own (by default the port + 10,000,
                // which may be taken).
                let bus = crate::free_port()?.to_string();
                RedisServer::start_with(&[
                    "--cluster-port",
                    &bus,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-require-full-coverage",
                    "no",
                ])
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let cluster = Self { nodes };
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot run redis-cli --cluster create (is redis-cli installed?): {e}"),
                )
            })?;
        if !out.status.success() {
            return Err(std::io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .chain(String::from_utf8_lossy(&out.stderr).lines())
                    .filter(|l| l.contains("ERR") || l.contains("rror"))
                    .collect::<Vec<_>>()
                    .join("; ")
            )));
        }
        cluster.wait_formed(primaries, Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// Waits until every node says `cluster_state:ok` and knows every other, `primaries`
    /// primaries serve every slot, and each replica's link to its primary is up.
    fn wait_formed(&self, primaries: usize, limit: Duration) -> std::io::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let formed = self.nodes.iter().all(|n| {
                let info = self.cli(n.port(), &["CLUSTER", "INFO"]);
                info.contains("cluster_state:ok")
                    && info.contains(&format!("cluster_known_nodes:{}", self.nodes.len()))
                    && info.contains("cluster_slots_assigned:16384")
            }) && self.nodes().iter().filter(|n| n.primary).count() == primaries
                && self.nodes().iter().filter(|n| !n.primary).all(|r| {
                    self.cli(r.port, &["INFO", "replication"])
                        .contains("master_link_status:up")
                });
            if formed {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the Redis Cluster did not form within {limit:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `redis-cli -p PORT ARGS...`: its output (empty when it cannot run).
    fn cli(&self, port: u16, args: &[&str]) -> String {
        Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The nodes as the first one that answers sees them (`CLUSTER NODES`), in port order.
    pub fn nodes(&self) -> Vec<ClusterNode> {
        let mut out: Vec<ClusterNode> = self
            .nodes
            .iter()
            .map(|n| self.cli(n.port(), &["CLUSTER", "NODES"]))
            .find(|s| !s.trim().is_empty())
            .unwrap_or_default()
            .lines()
            .filter_map(parse_node)
            .collect();
        out.sort_by_key(|n| n.port);
        out
    }

    /// The servers, in the order they were started.
    pub fn servers(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The seed URLs, comma-separated (`redis://127.0.0.1:P1,redis://127.0.0.1:P2,…`): what
    /// `--redis-url` takes in cluster mode.
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(RedisServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The slot `key` hashes to (`CLUSTER KEYSLOT`, asked of the first node).
    ///
    /// # Errors
    /// When the node does not answer a number.
    pub fn slot_of(&self, key: &str) -> std::io::Result<u16> {
        let port = self.nodes.first().map_or(0, RedisServer::port);
        let said = self.cli(port, &["CLUSTER", "KEYSLOT", key]);
        said.trim()
            .parse()
            .map_err(|_| std::io::Error::other(format!("CLUSTER KEYSLOT answered {said:?}")))
    }

    /// The port of the primary serving `slot` now, if one does.
    pub fn primary_of_slot(&self, slot: u16) -> Option<u16> {
        self.nodes()
            .into_iter()
            .find(|n| {
                n.primary && !n.failed && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
            })
            .map(|n| n.port)
    }
}

/// The port of a `CLUSTER NODES` address (`127.0.0.1:7000@17000`).
fn port_of(addr: &str) -> Option<u16> {
    addr.split('@').next()?.rsplit(':').next()?.parse().ok()
}

/// One `CLUSTER NODES` line: `id addr flags primary-id ping pong epoch link slots...` (a slot
/// range `a-b` or a single slot; slots being moved, `[…]`, are skipped).
fn parse_node(line: &str) -> Option<ClusterNode> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let flags = *f.get(2)?;
    Some(ClusterNode {
        id: (*f.first()?).to_owned(),
        port: port_of(f.get(1)?)?,
        primary: flags.split(',').any(|x| x == "master"),
        replica_of: f.get(3).filter(|p| **p != "-").map(|p| (*p).to_owned()),
        failed: flags.split(',').any(|x| x == "fail"),
        slots: f
            .iter()
            .skip(8)
            .filter_map(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect(),
    })
}
