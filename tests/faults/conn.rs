//! What the fault tests read of `stats`. Their client is the tests' one
//! [`Client`](crate::common::Client), in its fallible mode (`try_` methods
//! that return [`Gone`] when a killed server drops the connection).

use std::collections::HashMap;

pub use crate::common::{Gone, Io};

/// A figure of a `stats` map; panics if absent.
pub fn figure(stats: &HashMap<String, u64>, key: &str) -> u64 {
    *stats
        .get(key)
        .unwrap_or_else(|| panic!("no `{key}` in stats"))
}

/// The job counts that must all be zero once everything is drained.
pub const CURRENT: [&str; 5] = [
    "current-jobs-urgent",
    "current-jobs-ready",
    "current-jobs-reserved",
    "current-jobs-delayed",
    "current-jobs-buried",
];
