//! What every store test is given: a broker over a fresh engine, and that
//! engine's time, which the test moves and compares through [`Env`] so that
//! one test body serves both kinds of clock:
//!
//! * a manual clock the engine reads (the embedded engine): moving it is
//!   instant and exact, and every time is checked to the microsecond;
//! * real time (Redis reads its own clock, in milliseconds): moving it means
//!   sleeping, and times are checked to within a few milliseconds plus
//!   however far real time has run ahead of the time the test advanced (the
//!   sleeps' lateness and the calls' own time, which a loaded machine
//!   stretches).

use std::any::Any;
use std::cell::Cell;
use std::time::{Duration, Instant};

use delayq::broker::Broker;
use delayq::clock::Clock;
use delayq::store::Store;

/// Added to every real sleep: Redis rounds a due time up to the next
/// millisecond, so a sleep of exactly `d` can end just before a job due `d`
/// after the sleep began.
const SLACK: Duration = Duration::from_millis(2);

/// How far a real time may be from the expected one, besides real time's
/// lead over the time advanced: Redis's rounding to the millisecond, up or
/// down.
const TOLERANCE: Duration = Duration::from_millis(3);

/// How far before the true time a real-time engine may say the next thing
/// is due: a cluster keeps each shard's next due time in this process,
/// counted from when the call that learnt it was sent, so that it is never
/// late; it is early by the time the call took to reach Redis.
const EARLY: Duration = Duration::from_millis(20);

/// How far before a due time a real-time test looks to see that nothing is
/// due yet: far enough that a sleep that wakes late still lands before it.
const REAL_MOMENT: Duration = Duration::from_millis(200);

/// How the engine under test keeps time.
pub enum Time {
    /// A manual clock the engine reads; clones share the time.
    Manual(Clock),
    /// Real time since `start`, of which the test has advanced `advanced`.
    Real {
        start: Instant,
        advanced: Cell<Duration>,
    },
}

impl Time {
    /// Real time, from now.
    pub fn real() -> Time {
        Time::Real {
            start: Instant::now(),
            advanced: Cell::new(Duration::ZERO),
        }
    }
}

/// A broker over a fresh, empty engine, and the engine's time.
pub struct Env<S: Store> {
    /// The one door into the store, as every front end uses it.
    pub broker: Broker<S>,
    time: Time,
    /// What the engine needs running (its redis-server). Declared after the
    /// broker, so it is dropped after the store is.
    _keep: Option<Box<dyn Any>>,
}

impl<S: Store> Env<S> {
    /// An environment over `broker`; `keep` lives as long as it does.
    pub fn new(broker: Broker<S>, time: Time, keep: Option<Box<dyn Any>>) -> Env<S> {
        Env {
            broker,
            time,
            _keep: keep,
        }
    }

    /// Lets `by` pass: exactly, on a manual clock; in real time, at least
    /// that and a little more, so that whatever was due within `by` of the
    /// last call is due.
    pub async fn advance(&self, by: Duration) {
        match &self.time {
            Time::Manual(clock) => clock.advance(by),
            Time::Real { advanced, .. } => {
                tokio::time::sleep(by + SLACK).await;
                advanced.set(advanced.get() + by);
            }
        }
    }

    /// The least time that must pass for something to go from "not yet
    /// due" to "due": one microsecond on a manual clock; in real time, a
    /// margin that absorbs a sleep's lateness. A test advances to `due -
    /// moment` to see nothing has moved yet, then by `moment` to see it has.
    pub fn moment(&self) -> Duration {
        match self.time {
            Time::Manual(_) => Duration::from_micros(1),
            Time::Real { .. } => REAL_MOMENT,
        }
    }

    /// Checks a time the engine reported: exactly, on a manual clock. In
    /// real time, every time a test expects is reckoned in the time it
    /// advanced, so none can be further off than real time's lead over
    /// that, plus the engine's rounding.
    #[track_caller]
    pub fn assert_time(&self, got: Duration, want: Duration, what: &str) {
        self.assert_within(got, want, Duration::ZERO, what);
    }

    /// Checks when a tick says the next thing is due: as [`Env::assert_time`],
    /// but in real time it may also be early by up to [`EARLY`] (never
    /// later: a timer that wakes early ticks again, one that wakes late
    /// hands jobs out late).
    #[track_caller]
    pub fn assert_next_due(&self, got: Duration, want: Duration, what: &str) {
        self.assert_within(got, want, EARLY, what);
    }

    /// [`Env::assert_time`], allowing `early` more below `want` in real
    /// time.
    #[track_caller]
    fn assert_within(&self, got: Duration, want: Duration, early: Duration, what: &str) {
        let Time::Real { start, advanced } = &self.time else {
            return assert_eq!(got, want, "{what} (manual clock, exact)");
        };
        let lead = start.elapsed().saturating_sub(advanced.get());
        let low = want.saturating_sub(TOLERANCE + lead + early);
        let high = want + TOLERANCE + lead;
        assert!(
            low <= got && got <= high,
            "{what}: got {got:?}, want {want:?}, between {low:?} and {high:?} (real time; \
             {lead:?} more has passed than the test advanced)"
        );
    }
}
