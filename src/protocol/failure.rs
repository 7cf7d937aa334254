//! The store's failures as replies: the client's `OUT_OF_MEMORY`, or a
//! logged `INTERNAL_ERROR`, logged at most once a second.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::error;

use super::reply::Reply;
use crate::error::StoreError;
use crate::store::ConnId;

/// The reply to a command of connection `conn` the store could not carry out.
pub fn failed(conn: ConnId, e: StoreError) -> Reply {
    static LOG: Throttle = Throttle::new();
    match e {
        StoreError::OutOfMemory => Reply::OutOfMemory,
        e => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if let Some(left_out) = LOG.admit(now) {
                error!(conn, error = %e, left_out, "command failed");
            }
            Reply::InternalError
        }
    }
}

/// Lets one log line through per second and counts the rest.
///
/// While Redis is unreachable every command of every client fails the same
/// way; a line for each would flood the log with copies of one message.
struct Throttle {
    second: AtomicU64,
    left_out: AtomicU64,
}

impl Throttle {
    const fn new() -> Throttle {
        Throttle {
            second: AtomicU64::new(u64::MAX),
            left_out: AtomicU64::new(0),
        }
    }

    /// At second `now`: `Some(how many were left out since the last line)`
    /// if this one is to be logged, else `None`.
    fn admit(&self, now: u64) -> Option<u64> {
        let last = self.second.load(Ordering::Relaxed);
        if last != now
            && self
                .second
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            Some(self.left_out.swap(0, Ordering::Relaxed))
        } else {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Throttle;

    #[test]
    fn throttle_logs_one_line_a_second_and_counts_the_rest() {
        let t = Throttle::new();
        assert_eq!(t.admit(100), Some(0));
        assert_eq!(t.admit(100), None);
        assert_eq!(t.admit(100), None);
        assert_eq!(t.admit(101), Some(2));
        assert_eq!(t.admit(101), None);
        assert_eq!(t.admit(250), Some(1));
        assert_eq!(t.admit(250), None);
    }
}
