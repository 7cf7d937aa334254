//! delayq: a delay-queue job server that speaks beanstalkd's protocol.
//!
//! Producers put jobs with a delay; workers block in `reserve` until one is
//! due, work on it, and delete (or `finish`) it; a job not finished within its
//! time-to-run comes back, so every job is delivered at least once.
//!
//! # The layers
//!
//! ```text
//!  protocol (codec, commands, replies, sessions)      a front end
//!     |
//!  broker (the one door: hand-outs, timer, rules)     the queue server
//!     |
//!  store (trait) -- memory   (state, transitions)     the engines
//!               \-- redis    (Lua library, batching)
//! ```
//!
//! * [`job`], [`names`] and [`rules`] are the domain: what a job is, the
//!   names of jobs and tubes, the rules every engine follows. Everything else
//!   builds on them; they import nothing of the layers.
//! * [`protocol`] is the text protocol front end (beanstalkd's, with the
//!   JSON-lines mode); [`server`] accepts its connections. [`http`] is the
//!   HTTP front end, which runs the protocol's commands.
//! * [`broker`] is the only way into the store: every transition passes it,
//!   and it hands ready jobs to blocked connections and runs the timer, which
//!   sleeps until the next due time, so nothing polls.
//! * [`store`] is the storage interface of whole, atomic transitions, with
//!   its engines; it imports nothing from the front ends.
//! * [`schedule`] is the periodic jobs' domain: when a schedule fires, and
//!   the id of each firing.
//! * [`clock`] is the embedded engine's time; [`config`] the flags;
//!   [`auth`] the access tokens and what each one grants.
//! * [`metrics`] holds what the broker measures for `/metrics` (store call
//!   times, the timer's lateness); the figures the engines already keep are
//!   read at scrape time.
//! * [`cli`] is the admin command line (`delayq stats`, `delayq drain`...),
//!   a client of the text protocol that shares only the name rules and
//!   limits with the server.

#![deny(missing_docs)]

pub mod auth;
pub mod broker;
pub mod cli;
pub mod clock;
pub mod config;
pub mod error;
pub mod http;
pub mod job;
pub mod metrics;
pub mod names;
pub mod protocol;
pub mod rules;
pub mod schedule;
pub mod server;
pub mod store;
pub mod tls;
