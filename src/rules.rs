//! The queue's rules that every engine follows, spelled once: the constants,
//! and the choices that do not depend on how jobs are stored.
//!
//! The Redis engine's Lua library gets the constants from here (the library
//! is put together with them at start), and the store-level conformance
//! suite (`tests/store`) proves that each engine applies the rules alike.

use std::time::Duration;

/// Ready jobs with a priority below this are counted as urgent
/// (`current-jobs-urgent`), as in beanstalkd.
pub const URGENT_PRIORITY: u32 = 1024;

/// The shortest time to run: beanstalkd raises a TTR of zero to one second,
/// so that a worker has a chance to do anything at all.
pub const MIN_TTR: Duration = Duration::from_secs(1);

/// How close a reserved job's deadline must be for `reserve` to answer
/// `DEADLINE_SOON` instead of waiting (beanstalkd's safety margin).
pub const SAFETY_MARGIN: Duration = Duration::from_secs(1);

/// Whether a priority counts as urgent.
pub fn is_urgent(pri: u32) -> bool {
    pri < URGENT_PRIORITY
}

/// The time to run a job gets for a requested one.
pub fn ttr(requested: Duration) -> Duration {
    requested.max(MIN_TTR)
}

/// Which jobs of a tube `kick` moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KickFrom {
    /// Buried jobs, oldest burial first.
    Buried,
    /// Delayed jobs, soonest due first.
    Delayed,
}

/// beanstalkd's kick order: a tube's buried jobs if it has any, else its
/// delayed ones; never both in one kick.
pub fn kick_from(buried: u64) -> KickFrom {
    if buried > 0 {
        KickFrom::Buried
    } else {
        KickFrom::Delayed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_in_a_table() {
        for (pri, urgent) in [(0, true), (1023, true), (1024, false), (u32::MAX, false)] {
            assert_eq!(is_urgent(pri), urgent, "priority {pri}");
        }
        for (asked, got) in [(0, 1), (1, 1), (2, 2), (86_400, 86_400)] {
            assert_eq!(
                ttr(Duration::from_secs(asked)),
                Duration::from_secs(got),
                "TTR {asked}"
            );
        }
        for (buried, from) in [(0, KickFrom::Delayed), (1, KickFrom::Buried)] {
            assert_eq!(kick_from(buried), from, "{buried} buried");
        }
    }
}
