//! The figures no engine keeps, measured where they happen: how late the
//! timer delivers what falls due, and how long each store call takes as the
//! broker sees it (on Redis the round trip, on the durable engine the wait
//! for the disk). `/metrics` (`src/http/metrics.rs`) reads them with the
//! rest.
//!
//! Each [`crate::broker::Broker`] owns its [`Instruments`], so servers in one
//! process (the tests') keep apart. A measurement costs two clock reads and
//! two relaxed atomic additions into a histogram of fixed buckets; nothing
//! is measured until `/metrics` is first scraped ([`Instruments::switch_on`]),
//! so a server nobody scrapes pays one relaxed load per store call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The buckets' upper bounds in nanoseconds, shared by every histogram:
/// 10 µs to 10 s, three to a decade. The embedded engine's calls land in
/// the first buckets, a durable sync or a Redis round trip in the middle,
/// an outage in the last.
const BOUNDS_NANOS: [u64; 19] = [
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// One bucket per bound, and one past the last (`+Inf`).
const BUCKETS: usize = BOUNDS_NANOS.len() + 1;

/// A histogram of durations with fixed buckets, updated with relaxed
/// atomics: a reader may see an observation's bucket before its sum, which
/// a scrape can live with, and no writer ever waits.
pub struct Histogram {
    /// Observations per bucket (not cumulative).
    counts: [AtomicU64; BUCKETS],
    sum_nanos: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_nanos: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Counts one duration.
    pub fn observe(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        // Prometheus buckets hold what is at most their bound.
        let bucket = BOUNDS_NANOS.partition_point(|&bound| bound < nanos);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The figures now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: std::array::from_fn(|i| self.counts[i].load(Ordering::Relaxed)),
            sum_nanos: self.sum_nanos.load(Ordering::Relaxed),
        }
    }
}

/// A histogram's figures at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    counts: [u64; BUCKETS],
    sum_nanos: u64,
}

impl HistogramSnapshot {
    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The observations' sum, in seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_nanos as f64 / 1e9
    }

    /// Each bucket's upper bound in seconds (the last infinite) and the
    /// observations in it alone, as prometheus-client's encoders take them.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        BOUNDS_NANOS
            .iter()
            .map(|&b| b as f64 / 1e9)
            .chain([f64::INFINITY])
            .zip(self.counts)
            .collect()
    }
}

/// Declares [`StoreOp`] from one list of variants and their labels.
macro_rules! store_ops {
    ($($variant:ident => $name:literal),+ $(,)?) => {
        /// A store call, as `delayq_store_call_seconds` labels it: the
        /// [`crate::store::Store`] method's name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum StoreOp {
            $(
                #[doc = concat!("`", $name, "`.")]
                $variant,
            )+
        }

        impl StoreOp {
            /// Every store call, in the order of the trait.
            pub const ALL: &'static [StoreOp] = &[$(StoreOp::$variant),+];

            /// The label.
            pub fn name(self) -> &'static str {
                match self {
                    $(StoreOp::$variant => $name,)+
                }
            }
        }
    };
}

store_ops! {
    Put => "put",
    Reserve => "reserve",
    ReserveBatch => "reserve_batch",
    ReserveJob => "reserve_job",
    GiveBack => "give_back",
    Delete => "delete",
    Finish => "finish",
    RemoveBatch => "remove_batch",
    Release => "release",
    Bury => "bury",
    Touch => "touch",
    Kick => "kick",
    KickJob => "kick_job",
    Peek => "peek",
    PeekReady => "peek_ready",
    PeekDelayed => "peek_delayed",
    PeekBuried => "peek_buried",
    StatsJob => "stats_job",
    StatsTube => "stats_tube",
    Stats => "stats",
    ListTubes => "list_tubes",
    PauseTube => "pause_tube",
    SetTube => "set_tube",
    TubeSettings => "tube_settings",
    AllTubeSettings => "all_tube_settings",
    SetSchedule => "set_schedule",
    RemoveSchedule => "remove_schedule",
    Schedules => "schedules",
    Export => "export",
    Import => "import",
    ReleaseAll => "release_all",
    Tick => "tick",
    Attach => "attach",
    Detach => "detach",
}

/// One broker's measurements.
pub struct Instruments {
    on: AtomicBool,
    lateness: Histogram,
    /// Indexed by `StoreOp as usize`.
    store_calls: Box<[Histogram]>,
}

impl Default for Instruments {
    fn default() -> Self {
        Instruments {
            on: AtomicBool::new(false),
            lateness: Histogram::default(),
            store_calls: StoreOp::ALL.iter().map(|_| Histogram::default()).collect(),
        }
    }
}

impl Instruments {
    /// Starts measuring (the first scrape does): the histograms count from
    /// then on.
    pub fn switch_on(&self) {
        self.on.store(true, Ordering::Relaxed);
    }

    /// Whether anything is measured.
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The moment a store call begins, if calls are measured.
    pub fn start(&self) -> Option<Instant> {
        self.is_on().then(Instant::now)
    }

    /// A store call begun at `started` has returned.
    pub fn store_call(&self, op: StoreOp, started: Instant) {
        self.store_calls[op as usize].observe(started.elapsed());
    }

    /// What fell due was delivered `by` after its due time (see
    /// [`crate::broker::Broker::run_timer`]).
    pub fn late(&self, by: Duration) {
        self.lateness.observe(by);
    }

    /// The lateness histogram now.
    pub fn lateness(&self) -> HistogramSnapshot {
        self.lateness.snapshot()
    }

    /// Each kind of store call made at least once, and its histogram now.
    pub fn store_calls(&self) -> Vec<(StoreOp, HistogramSnapshot)> {
        StoreOp::ALL
            .iter()
            .map(|&op| (op, self.store_calls[op as usize].snapshot()))
            .filter(|(_, h)| h.count() > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observation_lands_in_the_first_bucket_that_holds_it() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(10)); // on the bound: held by it
        h.observe(Duration::from_micros(11));
        h.observe(Duration::from_secs(60)); // past every bound
        let s = h.snapshot();
        let buckets = s.buckets();
        assert_eq!(buckets.len(), BUCKETS);
        assert_eq!(buckets[0], (0.00001, 1));
        assert_eq!(buckets[1], (0.000025, 1));
        assert_eq!(buckets[BUCKETS - 1], (f64::INFINITY, 1));
        assert_eq!(s.count(), 3);
        assert!((s.sum_seconds() - 60.000021).abs() < 1e-9);
    }

    #[test]
    fn nothing_is_timed_until_switched_on() {
        let m = Instruments::default();
        assert!(m.start().is_none());
        m.switch_on();
        let started = m.start().expect("on");
        m.store_call(StoreOp::Put, started);
        let calls = m.store_calls();
        assert_eq!(calls.len(), 1, "only the ops called are listed");
        assert_eq!((calls[0].0.name(), calls[0].1.count()), ("put", 1));
        assert_eq!(StoreOp::ALL[StoreOp::Detach as usize], StoreOp::Detach);
    }
}
