//! What can go wrong in the store. A client's mistakes are the front end's
//! business (see [`crate::protocol::ClientError`]); these are the server's.

use std::fmt;

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
