//! Hostile clients, on every backend: names and ids made of every byte
//! value (and, on Redis, proof that none reaches outside delayq's keys),
//! clients that send a byte at a time, clients that never read their
//! replies, more connections than the server allows, ten thousand at once,
//! and random byte streams cut at random points.
//!
//! Limits, malformed numbers and framing edge cases are in `tests/wire.rs`;
//! the codec's own property test (any stream, cut anywhere, never buffers
//! more than one frame needs) is in `src/codec.rs`.
//!
//! CI runs a bounded version. `DELAYQ_SOAK=1` runs the long one by hand
//! (a byte a second, many more fuzz streams with a fresh seed), and each
//! test prints what it went through:
//!
//! ```text
//! DELAYQ_SOAK=1 cargo test --release --test hostile -- --nocapture --test-threads 1
//! ```

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod connections;
mod fuzz;
mod http;
mod large_replies;
mod names;
mod never_reads;
mod slow;

use std::time::Duration;

use common::Backend;
use common::cluster::{RedisCluster, unique_prefix};
use common::daemon::Daemon;
use common::redis::RedisServer;

pub use common::{scale, soak};

/// A server process on `backend`, and the Redis it runs on (its own, on
/// Redis; a prefix of its own in the shared cluster, on a Redis Cluster),
/// which must be kept while it runs.
pub async fn daemon_on(backend: Backend) -> (Daemon, Option<RedisServer>) {
    let redis = (backend == Backend::Redis).then(|| RedisServer::start(&[]));
    let daemon = match (&redis, backend) {
        (Some(r), _) => Daemon::redis(&r.url).await,
        (None, Backend::Cluster) => {
            let seeds = RedisCluster::shared();
            let prefix = unique_prefix();
            Daemon::start(&["--redis-cluster", seeds, "--redis-prefix", &prefix]).await
        }
        (None, Backend::Memory) => Daemon::start(&["--in-memory"]).await,
        (None, _) => Daemon::start(&[]).await,
    };
    (daemon, redis)
}

/// A process's resident memory, from `/proc`.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kb * 1024
}

/// Waits for `f` to hold, checking every 10 ms; fails after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> bool) {
    let start = std::time::Instant::now();
    while !f().await {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
