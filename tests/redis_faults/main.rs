//! Faults under the Redis engine, with real processes and a real
//! redis-server: delayq processes killed with SIGKILL mid-work and restarted,
//! several processes whose timers race, redis-server killed and restarted on
//! its own data, and a Redis that is full.
//!
//! The multi-process tests keep a [`Ledger`](ledger::Ledger) of every put
//! (acknowledged with `INSERTED`, or in doubt because its connection died
//! before the reply), every delivery and every `DELETED`, and check the
//! delivery guarantees against it at the end.
//!
//! Split into modules: the harness (`conn`, `in_process`, `ledger`,
//! `load`) and the tests grouped by theme (`restarts`, `timers`,
//! `redis_down`, `durability`).
//!
//! CI runs a bounded version of every test. `DELAYQ_SOAK=1` runs the long
//! one by hand (more faults, more jobs, ten-second outages), and each test
//! prints what it went through:
//!
//! ```text
//! DELAYQ_SOAK=1 cargo test --release --test redis_faults -- --nocapture --test-threads 1
//! ```

#[path = "../common/mod.rs"]
mod common;

mod conn;
mod in_process;
mod ledger;
mod load;

mod durability;
mod redis_down;
mod restarts;
mod timers;

pub use common::{scale, soak};
