//! The two kinds of failure: the client's fault (answer and carry on) and the
//! server's fault (log with context, answer `INTERNAL_ERROR`).

use std::fmt;

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
}

/// A failure of the storage engine, not of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The engine has no room for the job; the client may retry later.
    OutOfMemory,
    /// The engine could not carry out the transition (for example, its
    /// backing service is unreachable). The text is for the log.
    Unavailable(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::OutOfMemory => f.write_str("out of memory"),
            StoreError::Unavailable(why) => write!(f, "storage unavailable: {why}"),
        }
    }
}

impl std::error::Error for StoreError {}

/// The result of a store transition.
pub type StoreResult<T> = Result<T, StoreError>;
