//! The text protocol front end: beanstalkd's protocol, with delayq's
//! extensions and the JSON-lines mode, over persistent TCP connections.
//!
//! ```text
//! TcpStream -> codec (Request) -> connection -> dispatch (Session) -> broker
//!                                    ^                                  |
//!                                    +------ Reply <- codec <-----------+
//! ```
//!
//! * [`codec`] frames bytes into [`codec::Request`]s, bounded in size; client
//!   mistakes come out as items, never as stream errors.
//! * [`command`] and [`json`] parse a line into one [`command::Command`].
//! * [`connection`] runs one client: pipelined replies share a flush, and a
//!   blocked reserve waits on a channel; [`hangup`] sees its client leave
//!   even behind input it does not read.
//! * [`session`] holds a connection's state; [`dispatch`] is the one `match`
//!   over commands, each arm one broker call.
//! * [`reply`] spells every wire word; [`stats`] keeps the counters and
//!   renders the YAML documents (whole seconds, as beanstalkd shows them);
//!   [`failure`] turns the store's failures into replies.
//! * [`access`] says which commands a session's token allows (`--tokens`),
//!   and answers `auth`.
//!
//! Nothing here is imported by the store: the protocol is one front end of
//! the broker among possible others.

pub mod access;
pub mod codec;
pub mod command;
pub mod connection;
pub mod dispatch;
pub mod export;
pub mod failure;
pub mod hangup;
pub mod json;
pub mod options;
pub mod reply;
pub mod session;
pub mod stats;

/// A request the client got wrong. The connection stays open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientError {
    /// The line is malformed: bad number, bad name, wrong arguments, too long.
    BadFormat,
    /// No such command.
    UnknownCommand,
    /// A job body was not followed by CRLF.
    ExpectedCrlf,
    /// A job body is larger than the server's `-z` limit.
    JobTooBig,
    /// An option is unknown, given twice, or out of range.
    BadOption,
    /// A schedule that cannot be kept, and why (one word: `bad-cron`,
    /// `bad-zone`, `bad-interval`, `too-often`, `never-fires`, `too-many`).
    BadSchedule(&'static str),
}
