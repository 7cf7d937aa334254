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
//! `redis_down`).

#[path = "../common/mod.rs"]
mod common;

mod conn;
mod in_process;
mod ledger;
mod load;

mod redis_down;
mod restarts;
mod timers;
