//! Every coordinator backend runs the one conformance suite from `botfleet-testkit`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use botfleet_coord::{Coordinator, MemoryHub, MemorySnapshot, RedisConfig, RedisCoordinator};
use botfleet_testkit::{CoordFixture, RedisServer, SentinelSetup, SENTINEL_MASTER};

/// Handles on one in-memory hub (on the system clock, like the embedded mode).
struct Memory {
    hub: MemoryHub,
}

impl CoordFixture for Memory {
    type Snapshot = MemorySnapshot;
    async fn handle(&self) -> Arc<dyn Coordinator> {
        Arc::new(self.hub.coordinator())
    }
    async fn lose_everything(&self) {
        self.hub.wipe();
    }
    async fn snapshot(&self) -> MemorySnapshot {
        self.hub.snapshot()
    }
    async fn roll_back(&self, snapshot: &MemorySnapshot) {
        self.hub.restore(snapshot);
    }
}

/// Handles on a private `redis-server`, killed when the fixture drops.
struct Redis {
    server: RedisServer,
}

/// Every key of the fleet with its remaining TTL (ms, 0 for none) and its `DUMP`.
type Dump = Vec<(String, i64, Vec<u8>)>;

/// A plain connection to the Redis at `url`, for the fixture's own reads and writes.
async fn raw(url: String) -> ::redis::aio::MultiplexedConnection {
    ::redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// A coordinator on `config`, keys under `conf`.
async fn coordinator(config: RedisConfig) -> Arc<dyn Coordinator> {
    Arc::new(
        RedisCoordinator::connect(config.prefix("conf"))
            .await
            .unwrap(),
    )
}

impl CoordFixture for Redis {
    type Snapshot = Dump;
    async fn handle(&self) -> Arc<dyn Coordinator> {
        coordinator(RedisConfig::new(self.server.url())).await
    }
    async fn lose_everything(&self) {
        self.server.flushall().unwrap();
    }
    async fn snapshot(&self) -> Dump {
        dump(&mut raw(self.server.url()).await).await
    }
    async fn roll_back(&self, snapshot: &Dump) {
        restore(&mut raw(self.server.url()).await, snapshot).await;
    }
}

/// Every key of the fleet, with its TTL and its `DUMP`.
async fn dump(c: &mut ::redis::aio::MultiplexedConnection) -> Dump {
    let keys: Vec<String> = ::redis::cmd("KEYS")
        .arg("{conf}:*")
        .query_async(c)
        .await
        .unwrap();
    let mut out = Vec::new();
    for k in keys {
        let ttl: i64 = ::redis::cmd("PTTL").arg(&k).query_async(c).await.unwrap();
        let dump: Vec<u8> = ::redis::cmd("DUMP").arg(&k).query_async(c).await.unwrap();
        out.push((k, ttl.max(0), dump));
    }
    out
}

/// Replaces every key with `snapshot`'s.
async fn restore(c: &mut ::redis::aio::MultiplexedConnection, snapshot: &Dump) {
    let _: () = ::redis::cmd("FLUSHALL").query_async(c).await.unwrap();
    for (k, ttl, dump) in snapshot {
        let _: () = ::redis::cmd("RESTORE")
            .arg(k)
            .arg(*ttl)
            .arg(dump.as_slice())
            .query_async(c)
            .await
            .unwrap();
    }
}

mod memory {
    use super::*;
    botfleet_testkit::coordinator_conformance!(Memory {
        hub: MemoryHub::new()
    });
}

mod redis {
    use super::*;
    botfleet_testkit::coordinator_conformance!(Redis {
        server: RedisServer::start().unwrap()
    });
}

/// Handles through Redis Sentinel (a primary, a replica, three Sentinels), killed when the
/// fixture drops: the suite's data losses and snapshots act on the primary.
struct Sentinel {
    setup: SentinelSetup,
}

impl CoordFixture for Sentinel {
    type Snapshot = Dump;
    async fn handle(&self) -> Arc<dyn Coordinator> {
        coordinator(RedisConfig::new(self.setup.urls()).sentinel(SENTINEL_MASTER)).await
    }
    async fn lose_everything(&self) {
        self.setup.primary().flushall().unwrap();
    }
    async fn snapshot(&self) -> Dump {
        dump(&mut raw(self.setup.primary_url()).await).await
    }
    async fn roll_back(&self, snapshot: &Dump) {
        restore(&mut raw(self.setup.primary_url()).await, snapshot).await;
    }
}

mod sentinel {
    use super::*;
    botfleet_testkit::coordinator_conformance!(Sentinel {
        setup: SentinelSetup::start().unwrap()
    });
}
