//! The testkit's Redis Cluster: it forms with every slot served, follows a key to its
//! primary, and leaves nothing behind.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Command;

use botfleet_testkit::RedisCluster;

/// `redis-cli [-c] -p PORT ARGS...`: the first line of its output.
fn cli(follow: bool, port: u16, args: &[&str]) -> String {
    let mut c = Command::new("redis-cli");
    if follow {
        c.arg("-c");
    }
    let out = c
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn three_primaries_with_a_replica_each_serve_every_slot_and_are_removed() {
    let cluster = RedisCluster::start().unwrap();
    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 6, "{nodes:?}");
    let primaries: Vec<_> = nodes.iter().filter(|n| n.primary).collect();
    assert_eq!(primaries.len(), 3, "{nodes:?}");
    for p in &primaries {
        let replicas = nodes
            .iter()
            .filter(|n| n.replica_of.as_deref() == Some(p.id.as_str()))
            .count();
        assert_eq!(replicas, 1, "one replica for {p:?}");
    }
    assert!(nodes.iter().all(|n| !n.failed), "{nodes:?}");
    assert_eq!(cluster.seeds().split(',').count(), 6);
    let ports: Vec<u16> = cluster.servers().iter().map(|s| s.port()).collect();
    // Keys under three hash tags, each written through one node (following the redirect to
    // its slot's primary) and read back through another.
    let mut owners = std::collections::BTreeSet::new();
    for (i, tag) in ["{a}", "{b}", "{c}", "{d}", "{e}", "{f}"]
        .iter()
        .enumerate()
    {
        let key = format!("{tag}:k");
        let slot = cluster.slot_of(&key).unwrap();
        let owner = cluster.primary_of_slot(slot).unwrap();
        assert!(primaries.iter().any(|p| p.port == owner), "{key}: {owner}");
        owners.insert(owner);
        let value = format!("v{i}");
        assert_eq!(cli(true, ports[i], &["SET", &key, &value]), "OK");
        assert_eq!(cli(true, ports[(i + 3) % 6], &["GET", &key]), value);
        assert_eq!(cli(false, owner, &["GET", &key]), value, "on its primary");
        let other = primaries.iter().find(|p| p.port != owner).unwrap();
        assert!(
            cli(false, other.port, &["GET", &key]).starts_with("MOVED"),
            "another primary redirects"
        );
    }
    assert!(
        owners.len() >= 2,
        "the tags spread over primaries: {owners:?}"
    );
    drop(cluster);
    for p in ports {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", p)).is_err(),
            "port {p} still answers"
        );
    }
}
