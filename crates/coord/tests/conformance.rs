//! Every coordinator backend runs the one conformance suite from `botfleet-testkit`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use botfleet_coord::{Coordinator, MemoryHub, RedisConfig, RedisCoordinator};
use botfleet_testkit::{CoordFixture, RedisServer};

/// Handles on one in-memory hub (on the system clock, like the embedded mode).
struct Memory {
    hub: MemoryHub,
}

impl CoordFixture for Memory {
    async fn handle(&self) -> Arc<dyn Coordinator> {
        Arc::new(self.hub.coordinator())
    }
}

/// Handles on a private `redis-server`, killed when the fixture drops.
struct Redis {
    server: RedisServer,
}

impl CoordFixture for Redis {
    async fn handle(&self) -> Arc<dyn Coordinator> {
        let c = RedisCoordinator::connect(RedisConfig::new(self.server.url()).prefix("conf"))
            .await
            .unwrap();
        Arc::new(c)
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
