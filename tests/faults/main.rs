//! Faults under load, with real processes: delayq killed with SIGKILL
//! mid-work and restarted, on Redis and on the durable embedded engine (one
//! harness for both); on Redis also several processes whose timers race,
//! redis-server killed and restarted on its own data, and a Redis that is
//! full.
//!
//! The multi-process tests keep a [`Ledger`](ledger::Ledger) of every put
//! (acknowledged with `INSERTED`, or in doubt because its connection died
//! before the reply), every delivery and every `DELETED`, and check the
//! delivery guarantees against it at the end.
//!
//! Split into modules: the harness (`conn`: what is read of `stats`, the
//! client being the tests' one in its fallible mode; `in_process`, `ledger`,
//! `load`, and `restarts::killed_and_restarted` over any engine that keeps
//! jobs across a process) and the tests grouped by theme (`restarts`,
//! `durable`, `timers`, `handout`, `redis_down`, `durability`).
//!
//! CI runs a bounded version of every test. `DELAYQ_SOAK=1` runs the long
//! one by hand (more faults, more jobs, ten-second outages), and each test
//! prints what it went through:
//!
//! ```text
//! DELAYQ_SOAK=1 cargo test --release --test faults -- --nocapture --test-threads 1
//! ```

#[path = "../common/mod.rs"]
mod common;

mod conn;
mod in_process;
mod ledger;
mod load;

mod cluster;
mod durability;
mod durable;
mod handout;
mod rate;
mod redis_down;
mod replicas;
mod restarts;
mod schedules;
mod timers;

pub use common::{scale, soak};
