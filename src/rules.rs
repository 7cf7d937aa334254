//! The queue's rules that every engine follows, spelled once: the constants,
//! and the choices that do not depend on how jobs are stored.
//!
//! The Redis engine's Lua library gets the constants from here (the library
//! is put together with them at start), and the store-level conformance
//! suite (`tests/store`) proves that each engine applies the rules alike.

use std::time::Duration;

use crate::job::{Backoff, Lifecycle};

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

/// The most jobs one batch command reserves, deletes or finishes.
pub const MAX_BATCH: usize = 1000;

/// The most tries a job may be given.
pub const MAX_TRIES: u32 = 10_000;

/// The longest duration an option takes (a backoff, its cap).
pub const MAX_OPTION_TIME: Duration = Duration::from_secs(30 * 86_400);

/// The highest rate limit a tube may be given, in reserves a second.
pub const MAX_RATE: u32 = 1_000_000;

/// The longest time to live a job may be given.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 86_400);

/// Whether a job that has been reserved `tries` times in this round has
/// used up the tries its options allow.
pub fn out_of_tries(life: &Lifecycle, tries: u32) -> bool {
    life.tries.is_some_and(|max| tries >= max)
}

/// How long a job with `life`, key `key` (its server sequence number),
/// waits after its `tries`-th try of a round came back, if it waits at all.
///
/// The jitter is not random but spread by the key and the try, so that
/// every engine, the Redis one in Lua included, computes the same wait,
/// and a test can tell what it will be. The arithmetic stays in whole
/// milliseconds below 2^53, which a Lua number holds exactly.
pub fn backoff_wait(life: &Lifecycle, key: u64, tries: u32) -> Option<Duration> {
    let max = life.backoff_max.unwrap_or(MAX_OPTION_TIME).as_millis() as u64;
    let ms = match life.backoff? {
        Backoff::Fixed(base) => base.as_millis() as u64,
        Backoff::Exponential(base) => {
            let doublings = tries.saturating_sub(1).min(40);
            (base.as_millis() as u64).saturating_mul(1 << doublings)
        }
    }
    .min(max);
    let jitter = u64::from(life.jitter.unwrap_or(0));
    let per_mille = ((key % 1_000_003) * 7_919 + u64::from(tries) * 104_729) % 1_000;
    Some(Duration::from_millis(
        ms - ms * jitter * per_mille / 100_000,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_waits() {
        let exp = Lifecycle {
            tries: Some(5),
            backoff: Some(Backoff::Exponential(Duration::from_secs(10))),
            ..Lifecycle::default()
        };
        let waits: Vec<u64> = (1..=4)
            .map(|n| backoff_wait(&exp, 7, n).unwrap().as_secs())
            .collect();
        assert_eq!(waits, [10, 20, 40, 80]);
        let capped = Lifecycle {
            backoff_max: Some(Duration::from_secs(30)),
            ..exp
        };
        assert_eq!(backoff_wait(&capped, 7, 4), Some(Duration::from_secs(30)));
        let huge = backoff_wait(&exp, 7, 10_000).unwrap();
        assert_eq!(huge, MAX_OPTION_TIME);
        assert_eq!(backoff_wait(&Lifecycle::default(), 7, 1), None);
        let jittered = Lifecycle {
            backoff: Some(Backoff::Fixed(Duration::from_secs(2))),
            jitter: Some(50),
            ..Lifecycle::default()
        };
        let waits: Vec<Duration> = (1..200)
            .map(|k| backoff_wait(&jittered, k, 1).unwrap())
            .collect();
        assert!(waits.iter().all(|w| (1000..=2000).contains(&w.as_millis())));
        assert!(waits.iter().any(|w| w.as_millis() < 1500), "jitter spreads");
        assert!(out_of_tries(&exp, 5) && !out_of_tries(&exp, 4));
        assert!(!out_of_tries(&Lifecycle::default(), 1_000_000));
    }

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
