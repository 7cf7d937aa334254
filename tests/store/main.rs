//! Store-level conformance: every state transition and every reading of the
//! storage interface, run against every engine through the broker, without
//! TCP, so that times and counters are checked exactly where an engine keeps
//! them exactly (the embedded engine on a manual clock, to the microsecond)
//! and to its own precision elsewhere (Redis, in real milliseconds).
//!
//! This complements `tests/conformance`, which checks the same behaviour as
//! a client sees it, in wire words and whole seconds.
//!
//! Every test is written once, as `async fn name(env: Env<impl Store>)`, and
//! listed in its module's `store_tests!`, which instantiates it in one module
//! per engine (`put::memory::name`, `put::redis::name`, ...).
//!
//! A case an engine is known to fail is not weakened for it: the module
//! lists it after the others as `ENGINE fails "why"`, and it is ignored on
//! that engine only (`cargo test --test store -- --ignored` runs it).
//!
//! Adding an engine is one word in the `engines!` list below and a
//! constructor of the same name in `engines.rs`.

#[macro_use]
mod engines;
mod check;
mod env;

// Shared with the Redis fault tests; this crate only starts and drops
// servers, so most of it is unused here.
#[allow(dead_code)]
#[path = "../common/redis.rs"]
mod redis_server;

// Free loopback ports, which the Redis harness needs for a server on TCP.
#[allow(dead_code)]
#[path = "../common/ports.rs"]
mod ports;

// The cluster harness: this crate only uses the shared cluster.
#[allow(dead_code)]
#[path = "../common/cluster.rs"]
mod cluster;

engines!($ memory, durable, redis, cluster);

mod batch;
mod connections;
mod delete;
mod expiry;
mod kick;
mod lua;
mod pause;
mod peek;
mod put;
mod release;
mod reserve;
mod retries;
mod schedules;
mod timer;
mod tubes;
