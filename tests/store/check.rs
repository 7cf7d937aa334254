//! The tests' vocabulary: jobs to put, and the checks of a job's, a tube's
//! and the server's figures that every case ends with. Each check compares
//! whole values and names what it compared when it fails.

use std::time::Duration;

use bytes::Bytes;
use delayq::job::{
    Counts, JobCounters, JobState, JobStats, Lifecycle, NewJob, PutOutcome, TubeStats,
};
use delayq::names::{JobId, Tube};
use delayq::store::{Store, TubeRef};

use crate::env::Env;

/// A job's counters before anything happened to it.
pub const NO_COUNTERS: JobCounters = JobCounters {
    reserves: 0,
    timeouts: 0,
    releases: 0,
    buries: 0,
    kicks: 0,
};

/// The counts of a tube (or server) without jobs.
pub const NO_JOBS: Counts = Counts {
    urgent: 0,
    ready: 0,
    reserved: 0,
    delayed: 0,
    buried: 0,
};

/// The counts of jobs that all have priority [`PRI`], so that every ready
/// one is urgent, by state.
pub const fn counts(ready: u64, reserved: u64, delayed: u64, buried: u64) -> Counts {
    Counts {
        urgent: ready,
        ready,
        reserved,
        delayed,
        buried,
    }
}

/// One ready job of priority [`PRI`].
pub const ONE_READY: Counts = counts(1, 0, 0, 0);

/// One reserved job.
pub const ONE_RESERVED: Counts = counts(0, 1, 0, 0);

/// The counters of a job reserved once and nothing else.
pub const RESERVED_ONCE: JobCounters = JobCounters {
    reserves: 1,
    ..NO_COUNTERS
};

/// The TTR [`job`] gives: long enough never to run out unless a test waits
/// for it to.
pub const TTR: Duration = Duration::from_secs(60);

/// The priority [`job`] gives: urgent, as most of beanstalkd's clients put.
pub const PRI: u32 = 100;

/// A tube by name.
pub fn tube(name: &str) -> Tube {
    Tube::parse(name.as_bytes()).expect("a valid tube name")
}

/// A client-chosen job id.
pub fn named(id: &str) -> JobId {
    JobId::Client(id.into())
}

/// A ready job for `tube` with priority [`PRI`] and TTR [`TTR`]; a case
/// changes what it needs with [`Tweak`]: `job("a").pri(5)`.
pub fn job(tube_name: &str) -> NewJob {
    NewJob {
        tube: tube(tube_name),
        id: None,
        pri: PRI,
        delay: Duration::ZERO,
        ttr: TTR,
        body: Bytes::from_static(b"a job"),
        life: Default::default(),
    }
}

/// One-line changes to a [`job`].
pub trait Tweak {
    /// With priority `pri`.
    fn pri(self, pri: u32) -> Self;
    /// Delayed by `delay`.
    fn delay(self, delay: Duration) -> Self;
    /// With time-to-run `ttr`.
    fn ttr(self, ttr: Duration) -> Self;
    /// With the client-chosen id `id`.
    fn id(self, id: &str) -> Self;
    /// With body `body`.
    fn body(self, body: impl Into<Bytes>) -> Self;
    /// With its own tries and backoff options `life`.
    fn life(self, life: Lifecycle) -> Self;
}

impl Tweak for NewJob {
    fn pri(self, pri: u32) -> Self {
        NewJob { pri, ..self }
    }

    fn delay(self, delay: Duration) -> Self {
        NewJob { delay, ..self }
    }

    fn ttr(self, ttr: Duration) -> Self {
        NewJob { ttr, ..self }
    }

    fn id(self, id: &str) -> Self {
        let id = Some(id.into());
        NewJob { id, ..self }
    }

    fn body(self, body: impl Into<Bytes>) -> Self {
        let body = body.into();
        NewJob { body, ..self }
    }

    fn life(self, life: Lifecycle) -> Self {
        NewJob { life, ..self }
    }
}

/// Tubes by name.
pub fn tubes(names: &[&str]) -> Vec<Tube> {
    names.iter().map(|n| tube(n)).collect()
}

impl<S: Store> Env<S> {
    /// Puts a job that must be inserted; returns its id.
    pub async fn put(&self, job: NewJob) -> JobId {
        match self.broker.put(job).await.expect("put") {
            PutOutcome::Inserted(id) => id,
            other => panic!("put: want a new job, got {other:?}"),
        }
    }

    /// Reserves for `conn` from `names`; the id of the job it got.
    pub async fn reserve(&self, conn: u64, names: &[&str]) -> Option<JobId> {
        let got = self.broker.reserve(conn, &tubes(names)).await;
        got.expect("reserve").map(|r| r.job.id)
    }

    /// Reserves one job by id for `conn`; the id, if it got the job.
    pub async fn reserve_job(&self, conn: u64, id: &JobId) -> Option<JobId> {
        let got = self.broker.reserve_job(conn, id).await;
        got.expect("reserve-job").map(|r| r.job.id)
    }

    /// Releases a job `conn` holds with priority `pri`, ready at once;
    /// whether `conn` held it.
    pub async fn release(&self, conn: u64, id: &JobId, pri: u32) -> bool {
        let got = self.broker.release(conn, id, pri, Duration::ZERO).await;
        got.expect("release").is_some()
    }

    /// Counts a use or watch of a tube, as a connection's `use` or `watch`.
    pub async fn attach(&self, name: &str, how: TubeRef) {
        self.broker.attach(&tube(name), how).await.expect("attach");
    }

    /// Undoes one [`Env::attach`].
    pub async fn detach(&self, name: &str, how: TubeRef) {
        self.broker.detach(&tube(name), how).await.expect("detach");
    }

    /// Pauses a tube for `delay`; whether it exists.
    pub async fn pause(&self, name: &str, delay: Duration) -> bool {
        let got = self.broker.pause_tube(&tube(name), delay).await;
        got.expect("pause-tube")
    }

    /// The figures of a job that must exist.
    pub async fn stats_job(&self, id: &JobId) -> JobStats {
        let got = self.broker.stats_job(id).await.expect("stats-job");
        got.unwrap_or_else(|| panic!("job {id} exists"))
    }

    /// The figures of a tube that must exist.
    pub async fn stats_tube(&self, name: &str) -> TubeStats {
        let got = self
            .broker
            .stats_tube(&tube(name))
            .await
            .expect("stats-tube");
        got.unwrap_or_else(|| panic!("tube {name} exists")).0
    }

    /// Whether a tube exists, by `stats_tube` and by `list_tubes`, which
    /// must agree.
    pub async fn tube_exists(&self, name: &str) -> bool {
        let stats = self
            .broker
            .stats_tube(&tube(name))
            .await
            .expect("stats-tube");
        let listed = self.tube_names().await.iter().any(|t| t == name);
        assert_eq!(
            stats.is_some(),
            listed,
            "stats-tube and list-tubes on {name}"
        );
        listed
    }

    /// The tubes that exist, oldest first.
    pub async fn tube_names(&self) -> Vec<String> {
        let tubes = self.broker.list_tubes().await.expect("list-tubes");
        tubes.iter().map(|t| t.as_str().to_string()).collect()
    }

    /// Checks a job's state, priority and counters.
    pub async fn check_job(&self, id: &JobId, state: JobState, pri: u32, counters: JobCounters) {
        let s = self.stats_job(id).await;
        assert_eq!(
            (s.state, s.pri, s.counters),
            (state, pri, counters),
            "job {id}: (state, priority, counters)"
        );
    }

    /// Checks a job's times: `delay` and `ttr` exactly (they are set, not
    /// measured), `age` and `time_left` as the engine's clock allows.
    pub async fn check_times(
        &self,
        id: &JobId,
        age: Duration,
        delay: Duration,
        ttr: Duration,
        left: Duration,
    ) {
        let s = self.stats_job(id).await;
        assert_eq!((s.delay, s.ttr), (delay, ttr), "job {id}: (delay, ttr)");
        self.assert_time(s.age, age, &format!("job {id}: age"));
        self.assert_time(s.time_left, left, &format!("job {id}: time-left"));
    }

    /// Checks a tube's job counts, its jobs ever put and its deletes.
    pub async fn check_tube(&self, name: &str, counts: Counts, total_jobs: u64, cmd_delete: u64) {
        let s = self.stats_tube(name).await;
        assert_eq!(
            (s.counts, s.total_jobs, s.cmd_delete),
            (counts, total_jobs, cmd_delete),
            "tube {name}: (counts, total-jobs, cmd-delete)"
        );
    }

    /// Checks a tube's connections using and watching it.
    pub async fn check_users(&self, name: &str, using: u64, watching: u64) {
        let s = self.stats_tube(name).await;
        let got = (s.using, s.watching);
        assert_eq!(got, (using, watching), "tube {name}: (using, watching)");
    }

    /// Checks a tube's pause figures: its `pause-tube` commands and the
    /// pause's length exactly, the time left as the engine's clock allows.
    pub async fn check_pause(&self, name: &str, pauses: u64, pause: Duration, left: Duration) {
        let s = self.stats_tube(name).await;
        let got = (s.cmd_pause_tube, s.pause);
        assert_eq!(got, (pauses, pause), "tube {name}: (cmd-pause-tube, pause)");
        let what = format!("tube {name}: pause-time-left");
        self.assert_time(s.pause_time_left, left, &what);
    }

    /// Checks the server-wide figures: job counts, jobs ever put, TTRs run
    /// out, and tubes.
    pub async fn check_server(&self, counts: Counts, total_jobs: u64, timeouts: u64, tubes: u64) {
        let (s, _) = self.broker.stats().await.expect("stats");
        assert_eq!(
            (s.counts, s.total_jobs, s.job_timeouts, s.tubes),
            (counts, total_jobs, timeouts, tubes),
            "server: (counts, total-jobs, job-timeouts, tubes)"
        );
    }
}
