//! delayq on Redis Cluster and Redis Sentinel: real topologies of
//! `redis-server` processes on loopback ports, broken on purpose (primaries
//! killed or frozen) while delayq runs on them.
//!
//! `harness` checks the topologies themselves first: that they come up as
//! asked, spread keys, and heal, so a failure elsewhere in this binary is
//! delayq's and not the harness's.

#[path = "../common/mod.rs"]
mod common;

mod faults;
mod harness;
