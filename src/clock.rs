//! The embedded engines' clock: wall-clock time in microseconds, read through
//! a monotonic clock.
//!
//! Due times are wall-clock times, so that they mean the same after a restart
//! (a job due in five minutes is due at once after a ten-minute outage). While
//! the process runs, time is the wall clock at start plus a monotonic
//! clock's reading since, so a clock step (NTP, a VM resumed) never moves a
//! due time or makes time run backwards.
//!
//! A test clock moves only when told, so that tests of delays and TTRs need
//! not sleep.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch.
pub type Micros = u64;

/// Microseconds in a duration, saturating.
pub fn micros(d: Duration) -> Micros {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A source of the current time. Cheap to clone; clones read the same time.
#[derive(Clone, Debug)]
pub struct Clock(Source);

#[derive(Clone, Debug)]
enum Source {
    System { wall: Micros, mono: Instant },
    Manual(Arc<AtomicU64>),
}

impl Clock {
    /// The wall clock, read through a monotonic one from now on.
    pub fn system() -> Clock {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, micros);
        Clock(Source::System {
            wall,
            mono: Instant::now(),
        })
    }

    /// A clock that shows `start` until [`Clock::advance`] moves it.
    pub fn manual(start: Micros) -> Clock {
        Clock(Source::Manual(Arc::new(AtomicU64::new(start))))
    }

    /// The time now.
    pub fn now(&self) -> Micros {
        match &self.0 {
            Source::System { wall, mono } => wall.saturating_add(micros(mono.elapsed())),
            Source::Manual(now) => now.load(Ordering::Acquire),
        }
    }

    /// Moves a manual clock forward by `by`; the system clock moves by itself.
    ///
    /// # Panics
    /// On the system clock, which cannot be moved.
    pub fn advance(&self, by: Duration) {
        match &self.0 {
            Source::System { .. } => panic!("the system clock cannot be advanced"),
            Source::Manual(now) => {
                now.fetch_add(micros(by), Ordering::AcqRel);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_time_is_wall_time_and_never_goes_back() {
        let clock = Clock::system();
        let wall = micros(SystemTime::now().duration_since(UNIX_EPOCH).unwrap());
        let a = clock.now();
        assert!(a.abs_diff(wall) < 1_000_000, "{a} vs {wall}");
        assert!(clock.now() >= a);
    }

    #[test]
    fn a_manual_clock_moves_when_told() {
        let clock = Clock::manual(5);
        let same = clock.clone();
        assert_eq!(clock.now(), 5);
        same.advance(Duration::from_micros(10));
        assert_eq!(clock.now(), 15);
    }
}
