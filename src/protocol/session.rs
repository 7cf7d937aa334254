//! One connection's session: its tubes, the jobs it holds, its roles, and
//! what the whole server shares with it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, warn};

use super::command::Command;
use super::reply::Reply;
use super::stats::{Cmd, ServerStats};
use crate::broker::Broker;
use crate::config::Config;
use crate::error::StoreResult;
use crate::job::{NewJob, Reserved};
use crate::names::{JobId, Tube};
use crate::rules::SAFETY_MARGIN;
use crate::store::{ConnId, Store, TubeRef};

/// What the whole server shares: the broker, the counters, the settings.
pub struct Shared<S> {
    /// The one door to the store.
    pub broker: Broker<S>,
    /// Process-wide counters.
    pub stats: ServerStats,
    /// Settings.
    pub config: Config,
}

/// What the connection must do after a command.
#[derive(Debug)]
pub enum Outcome {
    /// Send this reply.
    Reply(Reply),
    /// Nothing is ready: block until a job of `tubes` is handed over, the
    /// timeout passes, or a reserved job's deadline comes near.
    Wait {
        /// The tubes to wait on.
        tubes: Arc<[Tube]>,
        /// How long to wait at most.
        timeout: Option<Duration>,
        /// For a batch: the most jobs to take once one is handed over.
        batch: Option<usize>,
    },
    /// Close the connection.
    Quit,
}

/// One connection's state: its tubes and the jobs it holds.
pub struct Session<S: Store> {
    /// This connection's id.
    pub id: ConnId,
    pub(super) shared: Arc<Shared<S>>,
    pub(super) used: Tube,
    /// In the order they were watched, as `list-tubes-watched` prints them.
    pub(super) watched: Vec<Tube>,
    /// When each job this connection holds runs out of time, as far as this
    /// connection knows (only it can touch, release or finish them; the timer
    /// takes them when the deadline passes).
    pub(super) deadlines: HashMap<JobId, Instant>,
    producer: bool,
    worker: bool,
}

impl<S: Store> Session<S> {
    /// Opens a session using and watching `default`.
    ///
    /// Opening never fails: if the store cannot count the new user of
    /// `default` (its engine is unreachable), that is logged and only the
    /// tube's `current-using`/`current-watching` figures are off; the
    /// connection is kept, as every command will say what is wrong.
    pub async fn open(shared: Arc<Shared<S>>, id: ConnId) -> Session<S> {
        let default = Tube::default_tube();
        let broker = &shared.broker;
        let counted = broker
            .attach(&default, TubeRef::Using)
            .await
            .and(broker.attach(&default, TubeRef::Watching).await);
        if let Err(e) = counted {
            warn!(conn = id, error = %e, "cannot count a new connection's use of `default`");
        }
        shared.stats.connections.fetch_add(1, Ordering::Relaxed);
        shared
            .stats
            .total_connections
            .fetch_add(1, Ordering::Relaxed);
        Session {
            id,
            shared,
            used: default.clone(),
            watched: vec![default],
            deadlines: HashMap::new(),
            producer: false,
            worker: false,
        }
    }

    /// The shared broker.
    pub fn broker(&self) -> &Broker<S> {
        &self.shared.broker
    }

    /// Ends the session: its reservations go back to ready at once, its tubes
    /// are let go.
    pub async fn close(self) {
        let broker = &self.shared.broker;
        let conn = self.id;
        let held: Vec<JobId> = self.deadlines.keys().cloned().collect();
        let mut result = broker.release_all(conn, &held).await;
        result = result.and(broker.detach(&self.used, TubeRef::Using).await);
        for tube in &self.watched {
            result = result.and(broker.detach(tube, TubeRef::Watching).await);
        }
        if let Err(e) = result {
            error!(conn, error = %e, "cleaning up a closed connection");
        }
        // Counted as connected until its jobs and tubes are let go, so that
        // whoever sees the connection gone also sees its jobs back.
        let stats = &self.shared.stats;
        stats.connections.fetch_sub(1, Ordering::Relaxed);
        if self.producer {
            stats.producers.fetch_sub(1, Ordering::Relaxed);
        }
        if self.worker {
            stats.workers.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Records a job this connection now holds and builds its reply.
    pub fn took(&mut self, got: Reserved) -> Reply {
        self.deadlines
            .insert(got.job.id.clone(), Instant::now() + got.ttr);
        Reply::Reserved(got.job)
    }

    /// Notes the deadlines of a batch just reserved; its reply.
    pub fn took_batch(&mut self, got: Vec<Reserved>) -> Reply {
        let now = Instant::now();
        let jobs = got
            .into_iter()
            .map(|r| {
                self.deadlines.insert(r.job.id.clone(), now + r.ttr);
                r.job
            })
            .collect();
        Reply::Batch(jobs)
    }

    /// Reserves what is ready without waiting: one job, or with `batch`
    /// up to that many; the reply, if anything was ready.
    pub async fn reserve_now(
        &mut self,
        tubes: &[Tube],
        batch: Option<usize>,
    ) -> StoreResult<Option<Reply>> {
        let Some(max) = batch else {
            let got = self.shared.broker.reserve(self.id, tubes).await?;
            return Ok(got.map(|got| self.took(got)));
        };
        let got = self
            .shared
            .broker
            .reserve_batch(self.id, tubes, max)
            .await?;
        Ok((!got.is_empty()).then(|| self.took_batch(got)))
    }

    /// The reply for a job handed to this connection while it waited: with
    /// `batch`, whatever else is ready joins it, up to the batch's size.
    pub async fn handed(&mut self, got: Reserved, tubes: &[Tube], batch: Option<usize>) -> Reply {
        let Some(max) = batch else {
            return self.took(got);
        };
        let mut all = vec![got];
        if max > 1 {
            match self
                .shared
                .broker
                .reserve_batch(self.id, tubes, max - 1)
                .await
            {
                Ok(more) => all.extend(more),
                // The job handed over is this connection's all the same.
                Err(e) => tracing::debug!(error = %e, "the rest of a batch could not be reserved"),
            }
        }
        self.took_batch(all)
    }

    /// When the next `DEADLINE_SOON` is due, if this connection holds jobs.
    pub fn deadline_soon_at(&mut self) -> Option<Instant> {
        let now = Instant::now();
        // A deadline that has passed belongs to a job the timer took back.
        self.deadlines.retain(|_, at| *at > now);
        self.deadlines.values().min().map(|at| *at - SAFETY_MARGIN)
    }

    /// Counts a command in `stats`, and the roles it gives the connection
    /// (`current-producers`, `current-workers`).
    pub(super) fn count(&mut self, cmd: &Command) {
        let Some(counter) = Cmd::of(cmd) else {
            return;
        };
        let stats = &self.shared.stats;
        stats.count(counter);
        let role = match counter {
            Cmd::Put => Some((&mut self.producer, &stats.producers)),
            Cmd::Reserve | Cmd::ReserveWithTimeout => Some((&mut self.worker, &stats.workers)),
            _ => None,
        };
        if let Some((flag, gauge)) = role
            && !*flag
        {
            *flag = true;
            gauge.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The job of a (counted) `put`, or the reply that refuses it.
    pub(super) fn new_job(&self, put: Command) -> Result<NewJob, Reply> {
        let Command::Put {
            pri,
            delay,
            ttr,
            id,
            tube,
            body,
            life,
        } = put
        else {
            unreachable!("new_job is only given puts")
        };
        if self.shared.stats.is_draining() {
            return Err(Reply::Draining);
        }
        Ok(NewJob {
            tube: tube.unwrap_or_else(|| self.used.clone()),
            id,
            pri,
            delay: secs(delay),
            ttr: secs(ttr),
            body,
            life,
        })
    }
}

/// Whole seconds, as the text protocol gives times.
pub(super) fn secs(n: u32) -> Duration {
    Duration::from_secs(n.into())
}
