//! delayq: a delay-queue job server that speaks beanstalkd's protocol.
//!
//! Producers put jobs with a delay; workers block in `reserve` until one is
//! due, work on it, and delete (or `finish`) it; a job not finished within its
//! time-to-run comes back, so every job is delivered at least once.
//!
//! # How a command travels
//!
//! ```text
//! TcpStream -> codec (Request) -> connection -> dispatch (Session) -> broker -> store
//!                                    ^                                   |
//!                                    +------ Reply <- codec <------------+
//! ```
//!
//! * [`codec`] frames bytes into [`codec::Request`]s, bounded in size; client
//!   mistakes come out as items, never as stream errors.
//! * [`command`] and [`json`] parse a line into one [`command::Command`].
//! * [`connection`] runs one client: pipelined replies share a flush, and a
//!   blocked reserve waits on a channel.
//! * [`dispatch`] holds a connection's session and the one `match` over commands.
//! * [`broker`] wraps the store: hands ready jobs to [`waiters`] and runs the
//!   timer, which sleeps on [`timer::Alarm`] until the next due time, so
//!   nothing polls.
//! * [`store`] is the storage interface of whole, atomic transitions;
//!   [`store::memory`] is the embedded engine.
//! * [`reply`] spells every wire word; [`stats`] renders the YAML documents.
//! * [`server`] accepts connections and shuts down gracefully.

#![deny(missing_docs)]

pub mod broker;
pub mod codec;
pub mod command;
pub mod config;
pub mod connection;
pub mod dispatch;
pub mod error;
pub mod json;
pub mod names;
pub mod reply;
pub mod server;
pub mod stats;
pub mod store;
pub mod timer;
pub mod waiters;
