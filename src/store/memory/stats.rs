//! The embedded engine's readings: peeks and figures, none of which change
//! anything.

use std::time::Duration;

use super::state::{St, State, TubeState};
use crate::clock::Micros;
use crate::store::{TubeList, TubeSettings};
use bytes::Bytes;
use std::sync::PoisonError;

use crate::job::{
    Counts, ExportCursor, ExportPage, JobBody, JobState, JobStats, StoreStats, TubeStats, WholeJob,
};
use crate::names::{JobId, Tube};

fn span(us: Micros) -> Duration {
    Duration::from_micros(us)
}

impl State {
    /// Every tube that has settings, with them, in the order of the names:
    /// listed once until they next change, so that exports begun together
    /// share one list (and one sort: 200,000 tubes' took 50 ms apiece).
    pub fn all_tube_settings(&self) -> TubeSettings {
        self.settings_listed
            .get_or_init(|| {
                let mut all: Vec<_> = self.settings.iter().map(|(t, &o)| (t.clone(), o)).collect();
                all.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
                all.into()
            })
            .clone()
    }

    /// Up to `max` whole jobs in slab order from slot `from.at` on. A job
    /// keeps its slot for its whole life, so one that lives through an
    /// export is in exactly one page.
    pub fn export(&self, from: ExportCursor, max: usize, now: Micros) -> ExportPage {
        let mut jobs = Vec::new();
        let end = self.jobs.capacity();
        let mut slot = usize::try_from(from.at).unwrap_or(usize::MAX);
        while slot < end && jobs.len() < max {
            if let Some(job) = self.jobs.get(slot) {
                let (state, time_left, bury_order) = match job.state {
                    St::Ready => (JobState::Ready, 0, 0),
                    St::Delayed { due } => (JobState::Delayed, due.saturating_sub(now), 0),
                    St::Reserved { .. } => (JobState::Reserved, 0, 0),
                    St::Buried { seq } => (JobState::Buried, 0, seq),
                };
                jobs.push(WholeJob {
                    id: job.id(),
                    tube: job.tube.clone(),
                    state,
                    pri: job.pri,
                    age: span(now.saturating_sub(job.created)),
                    // The engine's clock is the wall clock: its put time
                    // goes out exact, not counted back from `age` at the
                    // later moment the line is written.
                    put_at: Some(std::time::UNIX_EPOCH + Duration::from_micros(job.created)),
                    delay: span(job.delay),
                    time_left: span(time_left),
                    bury_order,
                    ttr: span(job.ttr),
                    counters: job.counters,
                    options: job.options(),
                    tries: job.tries(),
                    dead: job.life.as_ref().is_some_and(|l| l.round.dead),
                    body: Bytes::copy_from_slice(&job.body),
                });
            }
            slot += 1;
        }
        ExportPage {
            jobs,
            next: (slot < end).then_some(ExportCursor {
                part: 0,
                at: slot as u64,
            }),
        }
    }

    /// Any job, by id.
    pub fn peek(&self, id: &JobId) -> Option<JobBody> {
        self.slot_of(id).map(|slot| self.jobs[slot].body())
    }

    /// The body of the job `pick` chooses among `tube`'s.
    fn first_body(&self, tube: &Tube, pick: impl Fn(&TubeState) -> Option<u64>) -> Option<JobBody> {
        let key = pick(self.tubes.get(tube)?)?;
        Some(self.jobs[self.slot(key)?].body())
    }

    /// The job `reserve` would take next from `tube`, paused or not.
    pub fn peek_ready(&self, tube: &Tube) -> Option<JobBody> {
        self.first_body(tube, |ts| ts.ready.first().map(|&(_, k)| k))
    }

    /// The delayed job of `tube` that is due soonest.
    pub fn peek_delayed(&self, tube: &Tube) -> Option<JobBody> {
        self.first_body(tube, |ts| ts.delayed.first().map(|&(_, k)| k))
    }

    /// The buried job of `tube` that `kick` would take first.
    pub fn peek_buried(&self, tube: &Tube) -> Option<JobBody> {
        self.first_body(tube, |ts| ts.buried.first().map(|&(_, k)| k))
    }

    /// A job's figures at `now`.
    pub fn stats_job(&self, id: &JobId, now: Micros) -> Option<JobStats> {
        let job = &self.jobs[self.slot_of(id)?];
        let (state, left) = match job.state {
            St::Ready => (JobState::Ready, 0),
            St::Delayed { due } => (JobState::Delayed, due.saturating_sub(now)),
            St::Reserved { deadline } => (JobState::Reserved, deadline.saturating_sub(now)),
            St::Buried { .. } => (JobState::Buried, 0),
        };
        Some(JobStats {
            id: job.id(),
            tube: job.tube.clone(),
            state,
            pri: job.pri,
            age: span(now.saturating_sub(job.created)),
            delay: span(job.delay),
            ttr: span(job.ttr),
            time_left: span(left),
            counters: job.counters,
            life: job.life_stats(),
        })
    }

    /// A tube's figures at `now`, if it exists.
    pub fn stats_tube(&self, tube: &Tube, now: Micros) -> Option<TubeStats> {
        let ts = self.tubes.get(tube)?;
        let (pause, left) = match ts.pause {
            Some((len, until)) if until > now => (len, until - now),
            _ => (0, 0),
        };
        Some(TubeStats {
            name: tube.clone(),
            counts: ts.counts(),
            total_jobs: ts.total_jobs,
            expired: ts.expired,
            using: ts.using,
            watching: ts.watching,
            cmd_delete: ts.cmd_delete,
            cmd_pause_tube: ts.cmd_pause,
            pause: span(pause),
            pause_time_left: span(left),
        })
    }

    /// Server-wide job figures.
    pub fn stats(&self) -> StoreStats {
        let mut counts = Counts::default();
        for ts in self.tubes.values() {
            counts += ts.counts();
        }
        StoreStats {
            counts,
            job_timeouts: self.timeouts,
            expired: self.expired,
            total_jobs: self.total_jobs,
            tubes: self.tubes.len() as u64,
            log: None,
        }
    }

    /// Tubes that exist, oldest first: listed once until a tube comes or
    /// goes, so that listings asked for together share one list.
    pub fn list_tubes(&self) -> TubeList {
        let mut listed = self
            .tubes_listed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // A tube only ever comes by adding to the end, and goes through
        // `tubes_gone`: an unchanged count of both is an unchanged list.
        let now = (self.tubes.len(), self.tubes_gone);
        match &*listed {
            Some((then, list)) if *then == now => list.clone(),
            _ => {
                let list: TubeList = self.tubes.keys().cloned().collect();
                *listed = Some((now, list.clone()));
                list
            }
        }
    }
}
