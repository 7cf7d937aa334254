//! The figures of one scrape, and how each becomes a metric family: names,
//! types, units and help texts are all spelled here.

use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

use super::MAX_TUBES;
use crate::job::{Counts, StoreStats, TubeStats};
use crate::metrics::{HistogramSnapshot, StoreOp};

/// Everything one scrape shows, read before it is encoded.
#[derive(Debug)]
pub(super) struct Figures {
    /// Connections now, producers, workers, accepted ever (as `stats`).
    pub connections: [u64; 4],
    /// Each command counter.
    pub commands: Vec<(&'static str, u64)>,
    /// Whether puts are refused.
    pub draining: bool,
    /// Since the server started.
    pub uptime: Duration,
    /// `-z`.
    pub max_job_size: usize,
    /// `None` if the store did not answer.
    pub store: Option<StoreFigures>,
    /// The broker's measurements.
    pub lateness: HistogramSnapshot,
    /// Likewise, for each kind of store call made.
    pub store_calls: Vec<(StoreOp, HistogramSnapshot)>,
}

/// What the store said.
#[derive(Debug)]
pub(super) struct StoreFigures {
    /// Server-wide, as `stats` shows them.
    pub stats: StoreStats,
    /// Connections of this process waiting in `reserve`.
    pub waiting: u64,
    /// The listed tubes' figures, and how many connections wait on each.
    pub tubes: Vec<(TubeStats, u64)>,
    /// Tubes past the cap, left out.
    pub unlisted: u64,
}

type Enc<'a, 'b> = &'a mut DescriptorEncoder<'b>;
type Result = std::result::Result<(), std::fmt::Error>;

/// A gauge family: each row's labels and value.
fn family<L: EncodeLabelSet, V: EncodeGaugeValue>(
    e: Enc,
    (name, help, unit): (&str, &str, Option<&Unit>),
    rows: impl IntoIterator<Item = (L, V)>,
) -> Result {
    let mut m = e.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, value) in rows {
        m.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

/// A gauge without labels.
fn gauge(
    e: Enc,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: impl EncodeGaugeValue,
) -> Result {
    e.encode_descriptor(name, help, unit, MetricType::Gauge)?
        .encode_gauge(&value)
}

/// A counter family; `name` without its `_total`, which the encoder adds.
fn counters<L: EncodeLabelSet>(
    e: Enc,
    name: &str,
    help: &str,
    rows: impl IntoIterator<Item = (L, u64)>,
) -> Result {
    let mut m = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in rows {
        m.encode_family(&labels)?
            .encode_counter::<NoLabelSet, _, u64>(&value, None)?;
    }
    Ok(())
}

/// A counter without labels.
fn counter(e: Enc, name: &str, help: &str, value: u64) -> Result {
    e.encode_descriptor(name, help, None, MetricType::Counter)?
        .encode_counter::<NoLabelSet, _, u64>(&value, None)
}

/// A histogram of durations, in seconds, without labels.
fn seconds(e: Enc, name: &str, help: &str, h: &HistogramSnapshot) -> Result {
    e.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?
        .encode_histogram::<NoLabelSet>(h.sum_seconds(), h.count(), &h.buckets(), None)
}

/// A tube's `tube` label.
fn tube(t: &TubeStats) -> &str {
    t.name.as_str()
}

/// The job states, as the `state` label names them, and their counts.
fn by_state(c: &Counts) -> [(&'static str, u64); 4] {
    [
        ("ready", c.ready),
        ("reserved", c.reserved),
        ("delayed", c.delayed),
        ("buried", c.buried),
    ]
}

impl Collector for Figures {
    fn encode(&self, mut e: DescriptorEncoder) -> Result {
        let e = &mut e;
        self.process(e)?;
        if let Some(store) = &self.store {
            store.encode(e)?;
        }
        gauge(
            e,
            "delayq_store_up",
            "1 if the store answered this scrape (its figures are shown), 0 if not.",
            None,
            u64::from(self.store.is_some()),
        )?;
        self.timings(e)
    }
}

impl Figures {
    /// What this process counts itself.
    fn process(&self, e: Enc) -> Result {
        counters(
            e,
            "delayq_commands",
            "Commands received by this process, by the name `stats` gives them less `cmd-`.",
            self.commands.iter().map(|&(c, n)| ([("command", c)], n)),
        )?;
        let [connections, producers, workers, accepted] = self.connections;
        gauge(
            e,
            "delayq_connections",
            "Client connections open now (current-connections).",
            None,
            connections,
        )?;
        counter(
            e,
            "delayq_connections_accepted",
            "Client connections ever accepted (total-connections).",
            accepted,
        )?;
        gauge(
            e,
            "delayq_producers",
            "Open connections that have put a job (current-producers).",
            None,
            producers,
        )?;
        gauge(
            e,
            "delayq_workers",
            "Open connections that have reserved (current-workers).",
            None,
            workers,
        )?;
        gauge(
            e,
            "delayq_draining",
            "1 while the server refuses new jobs (SIGUSR1), else 0.",
            None,
            u64::from(self.draining),
        )?;
        gauge(
            e,
            "delayq_uptime",
            "How long this process has been up.",
            Some(&Unit::Seconds),
            self.uptime.as_secs_f64(),
        )?;
        gauge(
            e,
            "delayq_max_job_size",
            "The largest job body accepted.",
            Some(&Unit::Bytes),
            self.max_job_size,
        )?;
        e.encode_descriptor(
            "delayq_build",
            "The delayq version running.",
            None,
            MetricType::Info,
        )?
        .encode_info(&[("version", env!("CARGO_PKG_VERSION"))])
    }

    /// What the broker measured.
    fn timings(&self, e: Enc) -> Result {
        seconds(
            e,
            "delayq_due_lateness",
            "For each time the timer woke for a due time (a delay, a TTR, a pause, a time to \
             live, a rate limit ending), how long after it the tick that moved what had \
             fallen due and the hand-out to waiting workers were done. Counted from the \
             first scrape on.",
            &self.lateness,
        )?;
        let mut m = e.encode_descriptor(
            "delayq_store_call",
            "How long each call to the store took, as the broker waited for it (on Redis the \
             round trip; on the durable engine, for a change, the wait for its sync), by the \
             store method. Counted from the first scrape on.",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (op, h) in &self.store_calls {
            m.encode_family(&[("op", op.name())])?
                .encode_histogram::<NoLabelSet>(h.sum_seconds(), h.count(), &h.buckets(), None)?;
        }
        Ok(())
    }
}

impl StoreFigures {
    fn encode(&self, e: Enc) -> Result {
        let s = &self.stats;
        family(
            e,
            (
                "delayq_jobs",
                "Jobs by state, over all tubes (current-jobs-*).",
                None,
            ),
            by_state(&s.counts).map(|(state, n)| ([("state", state)], n)),
        )?;
        gauge(
            e,
            "delayq_jobs_urgent",
            "Ready jobs of a priority below 1024, over all tubes (current-jobs-urgent).",
            None,
            s.counts.urgent,
        )?;
        counter(
            e,
            "delayq_jobs_put",
            "Jobs ever put (total-jobs).",
            s.total_jobs,
        )?;
        counter(
            e,
            "delayq_job_timeouts",
            "Times a reserved job's TTR ran out (job-timeouts).",
            s.job_timeouts,
        )?;
        counter(
            e,
            "delayq_jobs_expired",
            "Jobs removed because their time to live ran out (total-jobs-expired).",
            s.expired,
        )?;
        gauge(
            e,
            "delayq_waiting_workers",
            "This process's workers blocked in reserve, text connections and HTTP long-polls \
             (current-waiting).",
            None,
            self.waiting,
        )?;
        gauge(
            e,
            "delayq_tubes",
            "Tubes that exist (current-tubes).",
            None,
            s.tubes,
        )?;
        gauge(
            e,
            "delayq_tubes_unlisted",
            &format!(
                "Tubes left out of the delayq_tube_* families: those past the first {MAX_TUBES}."
            ),
            None,
            self.unlisted,
        )?;
        self.tubes(e)?;
        let Some(log) = &s.log else {
            return Ok(());
        };
        counter(
            e,
            "delayq_log_records_written",
            "Records written to the log (binlog-records-written).",
            log.records_written,
        )?;
        counter(
            e,
            "delayq_log_records_migrated",
            "Records rewritten by compaction (binlog-records-migrated).",
            log.records_migrated,
        )?;
        counter(
            e,
            "delayq_log_syncs",
            "Syncs of the log (each makes a group of changes safe).",
            log.syncs,
        )?;
        seconds(
            e,
            "delayq_log_sync",
            "How long each sync of the log took (fdatasync): under the default policy, \
             the disk's part of every change's wait for its reply.",
            &log.sync_times,
        )?;
        gauge(
            e,
            "delayq_log_oldest_file",
            "The number of the oldest log file kept (binlog-oldest-index).",
            None,
            log.oldest_file,
        )?;
        gauge(
            e,
            "delayq_log_current_file",
            "The number of the log file being written (binlog-current-index).",
            None,
            log.current_file,
        )?;
        gauge(
            e,
            "delayq_log_file_size",
            "The size of one log file (binlog-max-size).",
            Some(&Unit::Bytes),
            log.file_size,
        )
    }

    /// The per-tube families, for the listed tubes.
    fn tubes(&self, e: Enc) -> Result {
        let tubes = &self.tubes;
        family(
            e,
            (
                "delayq_tube_jobs",
                "A tube's jobs by state (stats-tube current-jobs-*).",
                None,
            ),
            tubes.iter().flat_map(|(t, _)| {
                by_state(&t.counts)
                    .map(move |(state, n)| ([("tube", tube(t)), ("state", state)], n))
            }),
        )?;
        counters(
            e,
            "delayq_tube_jobs_put",
            "Jobs ever put into a tube (stats-tube total-jobs; from zero when the tube is made \
             anew).",
            tubes
                .iter()
                .map(|(t, _)| ([("tube", tube(t))], t.total_jobs)),
        )?;
        counters(
            e,
            "delayq_tube_deletes",
            "Deletes of a tube's jobs (stats-tube cmd-delete).",
            tubes
                .iter()
                .map(|(t, _)| ([("tube", tube(t))], t.cmd_delete)),
        )?;
        counters(
            e,
            "delayq_tube_jobs_expired",
            "A tube's jobs removed because their time to live ran out.",
            tubes.iter().map(|(t, _)| ([("tube", tube(t))], t.expired)),
        )?;
        family(
            e,
            (
                "delayq_tube_waiting_workers",
                "This process's workers blocked in reserve on a tube (stats-tube \
                 current-waiting).",
                None,
            ),
            tubes
                .iter()
                .map(|(t, waiting)| ([("tube", tube(t))], *waiting)),
        )?;
        family(
            e,
            (
                "delayq_tube_pause_remaining",
                "Time until a paused tube resumes; 0 if it is not paused.",
                Some(&Unit::Seconds),
            ),
            tubes
                .iter()
                .map(|(t, _)| ([("tube", tube(t))], t.pause_time_left.as_secs_f64())),
        )
    }
}
