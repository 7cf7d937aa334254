//! The harness on its own, with `redis-cli` as the client: a cluster spreads
//! keys over its primaries and heals when one is killed, two clusters side
//! by side stay apart, a stopped node is silent until continued, and the
//! sentinels promote the replica when the primary is killed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::common::cluster::{RedisCluster, SETTLE_LIMIT, query_within, wait_until};
use crate::common::sentinel::RedisSentinel;

/// What the brief of these tests promises for a failover.
const FAILOVER_LIMIT: Duration = Duration::from_secs(20);

/// The hash slot of `key`, as the cluster computes it.
/// The replication offset `field` of an `INFO replication` text.
fn offset_in(info: &str, field: &str) -> Option<u64> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix(field)?.strip_prefix(':'))
        .and_then(|n| n.parse().ok())
}

/// A replication offset `field` from node `node`'s `INFO replication`.
fn repl_offset(cluster: &RedisCluster, node: usize, field: &str) -> u64 {
    let info = cluster.cli(node, &["INFO", "replication"]);
    offset_in(&info, field).unwrap_or_else(|| panic!("node {node} has no {field}: {info}"))
}

fn keyslot(cluster: &RedisCluster, key: &str) -> u16 {
    let out = cluster.cli(0, &["CLUSTER", "KEYSLOT", key]);
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key}: {out:?}"))
}

#[test]
fn cluster_spreads_keys_over_every_primary_and_survives_losing_one() {
    let mut cluster = RedisCluster::start(3, 1);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "three primaries: {masters:?}");
    for &m in &masters {
        assert_eq!(cluster.replicas_of(m).len(), 1, "one replica of node {m}");
    }
    assert_eq!(cluster.seeds().split(',').count(), 6);

    // Written through node 0 with redirections followed, so most keys land
    // on other nodes; each must then be on the node serving its slot.
    let mut keys_of: BTreeMap<usize, Vec<(String, u16)>> = BTreeMap::new();
    for i in 0..30 {
        let key = format!("harness:{i}");
        assert_eq!(cluster.cli(0, &["-c", "SET", &key, &i.to_string()]), "OK\n");
        let slot = keyslot(&cluster, &key);
        let owner = cluster.slot_owner(slot);
        assert_eq!(cluster.cli(owner, &["GET", &key]), format!("{i}\n"));
        keys_of.entry(owner).or_default().push((key, slot));
    }
    let owners: BTreeSet<usize> = keys_of.keys().copied().collect();
    assert_eq!(
        owners,
        masters.iter().copied().collect(),
        "every primary got keys"
    );

    // A node that does not serve a slot redirects instead of answering.
    let (victim, keys) = keys_of.iter().next().expect("keys");
    let (victim, (key, slot)) = (*victim, keys[0].clone());
    let other = masters
        .iter()
        .copied()
        .find(|&m| m != victim)
        .expect("another primary");
    let moved = cluster.cli(other, &["GET", &key]);
    assert!(
        moved.contains("MOVED"),
        "GET {key} on node {other}: {moved:?}"
    );

    // The replica must hold the key before its primary dies. (Not by
    // `WAIT`: it waits only for its own connection's writes, and a fresh
    // connection has none, so it answers at once.)
    let replica = cluster.replicas_of(victim)[0];
    let written = repl_offset(&cluster, victim, "master_repl_offset");
    wait_until("the replica to have every write", SETTLE_LIMIT, || {
        let seen = repl_offset(&cluster, replica, "slave_repl_offset");
        if seen >= written {
            Ok(())
        } else {
            Err(format!("the replica is at offset {seen} of {written}"))
        }
    });
    cluster.kill(victim);
    let killed = Instant::now();
    let new = cluster.wait_for_failover(victim);
    let took = killed.elapsed();
    assert!(took < FAILOVER_LIMIT, "failover took {took:?}");
    assert_eq!(new, replica, "the killed primary's replica took over");
    assert!(!cluster.masters().contains(&victim));
    assert_eq!(cluster.slot_owner(slot), new);
    let value = cluster.cli(new, &["GET", &key]);
    assert_eq!(cluster.cli(other, &["-c", "GET", &key]), value);
    assert_ne!(value, "\n", "{key} survived the failover");

    // Back on its own nodes.conf, the old primary rejoins as a replica.
    cluster.restart(victim);
    assert_eq!(cluster.replicas_of(new), vec![victim]);
    assert_eq!(cluster.masters().len(), 3);
    eprintln!("cluster failover took {took:?}");
}

#[test]
fn clusters_side_by_side_stay_apart_and_count_commands() {
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| RedisCluster::start(3, 0));
        let b = s.spawn(|| RedisCluster::start(3, 0));
        (a.join().expect("cluster a"), b.join().expect("cluster b"))
    });
    let ports_a: BTreeSet<u16> = a.ports().into_iter().collect();
    let ports_b: BTreeSet<u16> = b.ports().into_iter().collect();
    assert_eq!(ports_a.len() + ports_b.len(), 6);
    assert!(ports_a.is_disjoint(&ports_b), "{ports_a:?} and {ports_b:?}");
    for (cluster, ports) in [(&a, &ports_a), (&b, &ports_b)] {
        for node in 0..3 {
            let nodes = cluster.cli(node, &["CLUSTER", "NODES"]);
            let known: BTreeSet<u16> = nodes
                .lines()
                .map(|l| {
                    let addr = l.split(' ').nth(1).expect("an address");
                    let port = addr.split([':', '@']).nth(1).expect("a port");
                    port.parse().expect("a port number")
                })
                .collect();
            assert_eq!(&known, ports, "node {node} knows only its own cluster");
        }
    }

    a.reset_stats();
    let owner = a.slot_owner(keyslot(&a, "counted"));
    for _ in 0..3 {
        assert_eq!(a.cli(owner, &["GET", "counted"]), "\n");
    }
    assert_eq!(a.commands(owner, "get"), 3);
    assert_eq!(a.commands(owner, "fcall"), 0);
    for node in (0..3).filter(|&n| n != owner) {
        assert_eq!(a.commands(node, "get"), 0, "node {node}");
    }

    // Stopped, a node still accepts connections but answers nothing.
    let port = a.ports()[owner];
    let ping = |limit| query_within(port, &["PING"], Duration::from_millis(limit));
    a.stop(owner);
    assert!(ping(300).is_err(), "a stopped node answers");
    a.cont(owner);
    assert!(ping(2000).is_ok(), "a continued node does not answer");
}

#[test]
fn sentinels_promote_the_replica_when_the_primary_dies() {
    let mut setup = RedisSentinel::start();
    let [first, second] = setup.data_ports();
    assert_eq!(setup.primary_port(), first);
    assert_eq!(setup.sentinel_seeds().split(',').count(), 3);
    assert_eq!(setup.master_name(), "mymaster");
    assert_eq!(setup.cli(first, &["SET", "before", "1"]), "OK\n");
    // The replica has the write before the primary dies (see the cluster
    // case for why not by `WAIT`).
    let offset = |port, field| {
        let info = setup.cli(port, &["INFO", "replication"]);
        offset_in(&info, field).unwrap_or_else(|| panic!("{port} has no {field}: {info}"))
    };
    let written = offset(first, "master_repl_offset");
    wait_until("the replica to have the write", SETTLE_LIMIT, || {
        let seen = offset(second, "slave_repl_offset");
        if seen >= written {
            Ok(())
        } else {
            Err(format!("the replica is at offset {seen} of {written}"))
        }
    });
    // The replica refuses writes while it is one.
    let refused = setup.cli(second, &["SET", "x", "1"]);
    assert!(refused.contains("READONLY"), "{refused:?}");

    assert_eq!(setup.kill_primary(), first);
    let killed = Instant::now();
    let new = setup.wait_for_failover(first);
    let took = killed.elapsed();
    assert!(took < FAILOVER_LIMIT, "failover took {took:?}");
    assert_eq!(new, second);
    assert_eq!(setup.primary_port(), second);
    assert_eq!(setup.cli(new, &["SET", "after", "2"]), "OK\n");
    assert_eq!(setup.cli(new, &["GET", "before"]), "1\n");
    eprintln!("sentinel failover took {took:?}");
}
