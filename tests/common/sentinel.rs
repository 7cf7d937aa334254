//! A real Redis Sentinel setup for one test: a primary, its replica and
//! three sentinels watching them, each its own `redis-server` process on a
//! loopback port, in its own directory under one temporary directory.
//! Dropping it kills the processes and removes the directory.
//!
//! The sentinels are quick to act (down after 1 s, quorum 2), so a test can
//! kill the primary ([`RedisSentinel::kill_primary`]) and wait for the
//! replica to be promoted ([`RedisSentinel::wait_for_failover`]) in a few
//! seconds.
//!
//! Everything here blocks the calling thread while it waits.

use std::collections::BTreeSet;

use super::cluster::{
    Node, Reply, SETTLE_LIMIT, StartError, data_node_args, redis_cli, reserve_ports,
    try_wait_until, wait_until,
};

/// The name the sentinels know the primary by.
const MASTER_NAME: &str = "mymaster";

/// How many times the setup is started over on fresh ports when one of its
/// ports was taken by another process between the check and the bind.
const START_ATTEMPTS: usize = 5;

/// A primary, a replica and three sentinels on loopback ports.
pub struct RedisSentinel {
    /// The data nodes: the first primary, then its replica. Which one is
    /// primary now is asked of the sentinels.
    data: Vec<Node>,
    sentinels: Vec<Node>,
    /// Declared after the nodes: removed once their processes are gone.
    _dir: tempfile::TempDir,
}

impl RedisSentinel {
    /// Starts the five processes and waits until the replica's link is up
    /// and every sentinel knows the primary, the replica and the two other
    /// sentinels.
    pub fn start() -> RedisSentinel {
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            match RedisSentinel::spawn_all() {
                Ok(setup) => {
                    setup.no_tilt();
                    wait_until("the sentinels to settle", SETTLE_LIMIT, || setup.settled());
                    return setup;
                }
                Err(why) => last = why,
            }
        }
        panic!("could not start the sentinel setup in {START_ATTEMPTS} attempts; last: {last}");
    }

    /// Starts the processes; `Err` if a port was taken under them.
    fn spawn_all() -> Result<RedisSentinel, String> {
        let root = tempfile::Builder::new()
            .prefix("delayq-sentinel-")
            .tempdir()
            .expect("a directory for the sentinel setup");
        let mut guards = reserve_ports(5, false).into_iter();
        let mut start = |args: &dyn Fn(u16, &str) -> Vec<String>| {
            let guard = guards.next().expect("five ports");
            let dir = root.path().join(guard.port.to_string());
            std::fs::create_dir(&dir).expect("a directory for a node");
            let args = args(guard.port, dir.to_str().expect("a UTF-8 temp path"));
            match Node::start(guard, &dir, args) {
                Ok(node) => Ok(node),
                Err(StartError::PortTaken(why)) => Err(why),
                Err(StartError::Failed(why)) => {
                    panic!("a sentinel setup node did not start: {why}")
                }
            }
        };
        let primary = start(&data_node_args)?;
        let primary_port = primary.port();
        let replica = start(&|port, dir| {
            let mut args = data_node_args(port, dir);
            args.extend([
                "--replicaof".into(),
                "127.0.0.1".into(),
                primary_port.to_string(),
            ]);
            args
        })?;
        let mut sentinels = Vec::with_capacity(3);
        for _ in 0..3 {
            sentinels.push(start(&|port, dir| {
                // Sentinel rewrites its configuration file as it learns, so
                // each has its own, writable, in its directory.
                let conf = format!("{dir}/sentinel.conf");
                let text = format!(
                    "port {port}\n\
                     bind 127.0.0.1\n\
                     dir \"{dir}\"\n\
                     sentinel resolve-hostnames no\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 3000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n"
                );
                std::fs::write(&conf, text).expect("write a sentinel's configuration");
                vec![conf, "--sentinel".into()]
            })?);
        }
        Ok(RedisSentinel {
            data: vec![primary, replica],
            sentinels,
            _dir: root,
        })
    }

    /// Keeps the sentinels out of TILT mode. A sentinel whose timer fires
    /// more than 2 s late (the whole machine stalled, as a loaded shared VM
    /// does) believes its clock jumped and stops acting for 30 s: longer
    /// than a test waits for a failover. A CI run lost two failover tests
    /// so, with every sentinel naming the dead primary after 30 s. Here a
    /// stall must last 10 s to count, and TILT ends after 1 s.
    fn no_tilt(&self) {
        for s in &self.sentinels {
            let reply = s.query(&[
                "SENTINEL",
                "DEBUG",
                "tilt-trigger",
                "10000",
                "tilt-period",
                "1000",
            ]);
            match reply {
                Ok(Reply::Status(ok)) if ok == "OK" => {}
                other => panic!(
                    "SENTINEL DEBUG (Redis 7.0 or later) on port {}: {other:?}",
                    s.port()
                ),
            }
        }
    }

    /// Whether the replica's link is up and every sentinel knows the
    /// primary, the replica and the two others.
    fn settled(&self) -> Result<(), String> {
        let replica = &self.data[1];
        match replica.query(&["INFO", "replication"]) {
            Ok(Reply::Bulk(Some(info))) if info.contains("master_link_status:up") => {}
            other => return Err(format!("the replica's link is not up: {other:?}")),
        }
        let primary = self.data[0].port();
        for (i, s) in self.sentinels.iter().enumerate() {
            let named = self.named_by(s)?;
            if named != primary {
                return Err(format!("sentinel {i} names port {named}, not {primary}"));
            }
            let replicas = self.ask_sentinel(s, "replicas")?;
            let flags: Vec<&str> = replicas
                .items()
                .iter()
                .map(|r| r.field("flags").map_or("?", Reply::text))
                .collect();
            if flags != ["slave"] {
                return Err(format!("sentinel {i} sees replicas flagged {flags:?}"));
            }
            let others = self.ask_sentinel(s, "sentinels")?.items().len();
            if others != 2 {
                return Err(format!(
                    "sentinel {i} knows {others} other sentinels, not 2"
                ));
            }
        }
        Ok(())
    }

    /// `SENTINEL <what> mymaster` on sentinel `s`, which must be an array.
    fn ask_sentinel(&self, s: &Node, what: &str) -> Result<Reply, String> {
        match s.query(&["SENTINEL", what, MASTER_NAME]) {
            Ok(reply @ Reply::Array(_)) => Ok(reply),
            other => Err(format!("SENTINEL {what} on port {}: {other:?}", s.port())),
        }
    }

    /// The primary's port as sentinel `s` names it.
    fn named_by(&self, s: &Node) -> Result<u16, String> {
        let addr = self.ask_sentinel(s, "get-master-addr-by-name")?;
        match addr.items() {
            [_, port] => port
                .text()
                .parse()
                .map_err(|_| format!("bad port in {addr:?}")),
            _ => Err(format!("sentinel on port {} names no primary", s.port())),
        }
    }

    /// The data node on `port`.
    fn data_node(&mut self, port: u16) -> &mut Node {
        self.data
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no data node on port {port}"))
    }

    /// `redis://127.0.0.1:P` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port()))
            .collect()
    }

    /// The sentinels' URLs, comma-separated: what delayq is given to find
    /// the primary.
    pub fn sentinel_seeds(&self) -> String {
        self.sentinel_urls().join(",")
    }

    /// The name the sentinels know the primary by.
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// The primary's port now, as the first sentinel that answers names it.
    pub fn primary_port(&self) -> u16 {
        let mut why = Vec::new();
        for s in self.sentinels.iter().filter(|s| s.running()) {
            match self.named_by(s) {
                Ok(port) => return port,
                Err(e) => why.push(e),
            }
        }
        panic!("no sentinel names the primary: {why:?}");
    }

    /// The two data nodes' ports: the first primary, then its replica.
    pub fn data_ports(&self) -> [u16; 2] {
        [self.data[0].port(), self.data[1].port()]
    }

    /// Runs `redis-cli -p port args...` (a data node or a sentinel) and
    /// returns what it prints (raw: `OK\n`, a value and `\n`).
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        redis_cli(port, args)
    }

    /// Kills the data node that is primary now with SIGKILL and reaps it;
    /// returns its port.
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary_port();
        self.data_node(port).kill();
        port
    }

    /// Waits until every live sentinel names the same primary, not the one
    /// on `old_port`, and that node's ROLE says master; returns its port.
    /// On failure it names what each sentinel last logged.
    pub fn wait_for_failover(&self, old_port: u16) -> u16 {
        let waited = try_wait_until(
            &format!("the sentinels to promote a replica of port {old_port}"),
            SETTLE_LIMIT,
            || {
                let named = self
                    .sentinels
                    .iter()
                    .filter(|s| s.running())
                    .map(|s| self.named_by(s))
                    .collect::<Result<BTreeSet<u16>, String>>()?;
                let new = match named.iter().collect::<Vec<_>>()[..] {
                    [&port] if port != old_port => port,
                    _ => return Err(format!("the sentinels name {named:?}")),
                };
                let node = self
                    .data
                    .iter()
                    .find(|n| n.port() == new)
                    .ok_or_else(|| format!("the sentinels name unknown port {new}"))?;
                match node.query(&["ROLE"]) {
                    Ok(role) if matches!(role.items().first(), Some(r) if r.text() == "master") => {
                        Ok(new)
                    }
                    other => Err(format!("port {new} answers ROLE with {other:?}")),
                }
            },
        );
        waited.unwrap_or_else(|why| {
            let logs: Vec<String> = self
                .sentinels
                .iter()
                .map(|s| format!("sentinel on port {}:\n{}", s.port(), s.log_tail()))
                .collect();
            panic!("{why}\n{}", logs.join("\n"))
        })
    }

    /// Freezes the data node on `port` with SIGSTOP; to the sentinels it
    /// goes silent.
    pub fn stop(&self, port: u16) {
        let node = self.data.iter().find(|n| n.port() == port);
        node.unwrap_or_else(|| panic!("no data node on port {port}"))
            .stop();
    }

    /// Lets the stopped data node on `port` run again.
    pub fn cont(&self, port: u16) {
        let node = self.data.iter().find(|n| n.port() == port);
        node.unwrap_or_else(|| panic!("no data node on port {port}"))
            .cont();
    }

    /// Starts the killed data node on `port` again with its old arguments
    /// and waits until it answers. A former primary comes back as a primary
    /// of nothing; the sentinels make it a replica of the new one several
    /// seconds later.
    pub fn restart(&mut self, port: u16) {
        self.data_node(port).restart();
    }
}
