//! One connection's session state and the one `match` that turns a command
//! into a reply: each arm makes at most one broker or store call.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use tokio::time::Instant;
use tracing::{error, warn};

use crate::broker::Broker;
use crate::command::Command;
use crate::config::Config;
use crate::error::{StoreError, StoreResult};
use crate::names::{JobId, Tube};
use crate::reply::Reply;
use crate::stats::{Cmd, ServerStats, render_job, render_tube, render_tubes};
use crate::store::{ConnId, NewJob, PutOutcome, Reserved, Store, TubeRef};

/// How close a reserved job's deadline must be for `reserve` to answer
/// `DEADLINE_SOON` (beanstalkd's safety margin).
const SAFETY_MARGIN: Duration = Duration::from_secs(1);

/// What the whole server shares: the broker, the counters, the settings.
pub struct Shared<S> {
    /// Store, waiters and timer.
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
    },
    /// Close the connection.
    Quit,
}

/// One connection's state: its tubes and the jobs it holds.
pub struct Session<S: Store> {
    /// This connection's id.
    pub id: ConnId,
    shared: Arc<Shared<S>>,
    used: Tube,
    /// In the order they were watched, as `list-tubes-watched` prints them.
    watched: Vec<Tube>,
    /// When each job this connection holds runs out of time, as far as this
    /// connection knows (only it can touch, release or finish them; the timer
    /// takes them when the deadline passes).
    deadlines: HashMap<JobId, Instant>,
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
        let store = &shared.broker.store;
        let counted = store
            .attach(&default, TubeRef::Using)
            .await
            .and(store.attach(&default, TubeRef::Watching).await);
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
        let store = &self.shared.broker.store;
        let conn = self.id;
        let held: Vec<JobId> = self.deadlines.keys().cloned().collect();
        let mut result = self.shared.broker.release_all(conn, &held).await;
        result = result.and(store.detach(&self.used, TubeRef::Using).await);
        for tube in &self.watched {
            result = result.and(store.detach(tube, TubeRef::Watching).await);
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

    /// When the next `DEADLINE_SOON` is due, if this connection holds jobs.
    pub fn deadline_soon_at(&mut self) -> Option<Instant> {
        let now = Instant::now();
        // A deadline that has passed belongs to a job the timer took back.
        self.deadlines.retain(|_, at| *at > now);
        self.deadlines.values().min().map(|at| *at - SAFETY_MARGIN)
    }

    fn count(&self, cmd: Cmd) {
        self.shared.stats.count(cmd);
    }

    /// Carries out one command.
    pub async fn handle(&mut self, cmd: Command) -> Outcome {
        match self.run(cmd).await {
            Ok(outcome) => outcome,
            Err(e) => Outcome::Reply(failed(self.id, e)),
        }
    }

    /// Carries out `put` commands that arrived together (pipelined): their
    /// jobs go to the broker at once, in order, so on a shared engine they
    /// share calls, and the replies come back in the same order.
    pub async fn handle_puts(&mut self, puts: Vec<Command>) -> Vec<Reply> {
        let jobs: Vec<_> = puts.into_iter().map(|put| self.new_job(put)).collect();
        let (shared, conn) = (self.shared.clone(), self.id);
        join_all(jobs.into_iter().map(|job| async {
            match job {
                Ok(job) => match shared.broker.put(job).await {
                    Ok(outcome) => put_reply(outcome),
                    Err(e) => failed(conn, e),
                },
                Err(reply) => reply,
            }
        }))
        .await
    }

    /// Counts a `put` and makes its job, or says why it is refused.
    fn new_job(&mut self, put: Command) -> Result<NewJob, Reply> {
        let Command::Put {
            pri,
            delay,
            ttr,
            id,
            tube,
            body,
        } = put
        else {
            unreachable!("new_job is only given puts")
        };
        self.count(Cmd::Put);
        let stats = &self.shared.stats;
        if !self.producer {
            self.producer = true;
            stats.producers.fetch_add(1, Ordering::Relaxed);
        }
        if stats.is_draining() {
            return Err(Reply::Draining);
        }
        Ok(NewJob {
            tube: tube.unwrap_or_else(|| self.used.clone()),
            id,
            pri,
            delay: secs(delay),
            // beanstalkd raises a TTR of zero to one second.
            ttr: secs(ttr.max(1)),
            body,
        })
    }

    async fn run(&mut self, cmd: Command) -> StoreResult<Outcome> {
        let conn = self.id;
        let shared = self.shared.clone();
        let broker = &shared.broker;
        let store = &broker.store;
        let found = |yes: bool, reply: Reply| if yes { reply } else { Reply::NotFound };
        let reply = match cmd {
            put @ Command::Put { .. } => match self.new_job(put) {
                Ok(job) => return Ok(Outcome::Reply(put_reply(broker.put(job).await?))),
                Err(reply) => reply,
            },
            Command::Use(tube) => {
                self.count(Cmd::Use);
                if tube != self.used {
                    store.attach(&tube, TubeRef::Using).await?;
                    store.detach(&self.used, TubeRef::Using).await?;
                    self.used = tube.clone();
                }
                Reply::Using(tube)
            }
            Command::Reserve { timeout, tube } => {
                self.count(if timeout.is_some() {
                    Cmd::ReserveWithTimeout
                } else {
                    Cmd::Reserve
                });
                if !self.worker {
                    self.worker = true;
                    shared.stats.workers.fetch_add(1, Ordering::Relaxed);
                }
                let tubes: Arc<[Tube]> = match tube {
                    Some(t) => Arc::from([t]),
                    None => Arc::from(self.watched.as_slice()),
                };
                if let Some(got) = broker.reserve(conn, &tubes).await? {
                    self.took(got)
                } else if self
                    .deadline_soon_at()
                    .is_some_and(|at| at <= Instant::now())
                {
                    Reply::DeadlineSoon
                } else if timeout == Some(0) {
                    Reply::TimedOut
                } else {
                    return Ok(Outcome::Wait {
                        tubes,
                        timeout: timeout.map(secs),
                    });
                }
            }
            Command::ReserveJob(id) => {
                self.count(Cmd::ReserveJob);
                match broker.reserve_job(conn, &id).await? {
                    Some(got) => self.took(got),
                    None => Reply::NotFound,
                }
            }
            Command::Delete(id) => {
                self.count(Cmd::Delete);
                let yes = store.delete(conn, &id).await?;
                self.deadlines.remove(&id);
                found(yes, Reply::Deleted(id))
            }
            Command::Finish(id) => {
                self.count(Cmd::Finish);
                let yes = store.finish(conn, &id).await?;
                self.deadlines.remove(&id);
                found(yes, Reply::Finished(id))
            }
            Command::Release { id, pri, delay } => {
                self.count(Cmd::Release);
                let yes = broker.release(conn, &id, pri, secs(delay)).await?;
                self.deadlines.remove(&id);
                found(yes, Reply::Released)
            }
            Command::Bury { id, pri } => {
                self.count(Cmd::Bury);
                let yes = store.bury(conn, &id, pri).await?;
                self.deadlines.remove(&id);
                found(yes, Reply::Buried)
            }
            Command::Touch(id) => {
                self.count(Cmd::Touch);
                match broker.touch(conn, &id).await? {
                    Some(ttr) => {
                        self.deadlines.insert(id, Instant::now() + ttr);
                        Reply::Touched
                    }
                    None => Reply::NotFound,
                }
            }
            Command::Watch(tube) => {
                self.count(Cmd::Watch);
                if !self.watched.contains(&tube) {
                    store.attach(&tube, TubeRef::Watching).await?;
                    self.watched.push(tube);
                }
                Reply::Watching(self.watched.len())
            }
            Command::Ignore(tube) => {
                self.count(Cmd::Ignore);
                match self.watched.iter().position(|t| *t == tube) {
                    Some(_) if self.watched.len() == 1 => Reply::NotIgnored,
                    Some(at) => {
                        self.watched.remove(at);
                        store.detach(&tube, TubeRef::Watching).await?;
                        Reply::Watching(self.watched.len())
                    }
                    None => Reply::Watching(self.watched.len()),
                }
            }
            Command::Peek(id) => {
                self.count(Cmd::Peek);
                store.peek(&id).await?.map_or(Reply::NotFound, Reply::Found)
            }
            Command::PeekReady => {
                self.count(Cmd::PeekReady);
                let job = store.peek_ready(&self.used).await?;
                job.map_or(Reply::NotFound, Reply::Found)
            }
            Command::PeekDelayed => {
                self.count(Cmd::PeekDelayed);
                let job = store.peek_delayed(&self.used).await?;
                job.map_or(Reply::NotFound, Reply::Found)
            }
            Command::PeekBuried => {
                self.count(Cmd::PeekBuried);
                let job = store.peek_buried(&self.used).await?;
                job.map_or(Reply::NotFound, Reply::Found)
            }
            Command::Kick(bound) => {
                self.count(Cmd::Kick);
                Reply::Kicked(broker.kick(&self.used, bound).await?)
            }
            Command::KickJob(id) => {
                self.count(Cmd::KickJob);
                found(broker.kick_job(&id).await?, Reply::KickedJob)
            }
            Command::StatsJob(id) => {
                self.count(Cmd::StatsJob);
                let stats = store.stats_job(&id).await?;
                stats.map_or(Reply::NotFound, |s| Reply::Yaml(render_job(&s)))
            }
            Command::StatsTube(tube) => {
                self.count(Cmd::StatsTube);
                let waiting = broker.waiters.waiting_on(&tube);
                let stats = store.stats_tube(&tube).await?;
                stats.map_or(Reply::NotFound, |s| Reply::Yaml(render_tube(&s, waiting)))
            }
            Command::Stats => {
                self.count(Cmd::Stats);
                let totals = store.stats().await?;
                let waiting = broker.waiters.total();
                Reply::Yaml(
                    shared
                        .stats
                        .render(&totals, waiting, shared.config.max_job_size),
                )
            }
            Command::ListTubes => {
                self.count(Cmd::ListTubes);
                Reply::Yaml(render_tubes(&store.list_tubes().await?))
            }
            Command::ListTubeUsed => {
                self.count(Cmd::ListTubeUsed);
                Reply::Using(self.used.clone())
            }
            Command::ListTubesWatched => {
                self.count(Cmd::ListTubesWatched);
                Reply::Yaml(render_tubes(&self.watched))
            }
            Command::PauseTube(tube, delay) => {
                self.count(Cmd::PauseTube);
                found(broker.pause_tube(&tube, secs(delay)).await?, Reply::Paused)
            }
            Command::Quit => return Ok(Outcome::Quit),
        };
        Ok(Outcome::Reply(reply))
    }
}

/// The reply to a `put` the store took.
fn put_reply(outcome: PutOutcome) -> Reply {
    match outcome {
        PutOutcome::Inserted(id) => Reply::Inserted(id),
        PutOutcome::Exists(id) => Reply::Exists(id),
    }
}

/// The reply to a command the store could not carry out: the client's
/// `OUT_OF_MEMORY`, or a logged `INTERNAL_ERROR`.
fn failed(conn: ConnId, e: StoreError) -> Reply {
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

fn secs(n: u32) -> Duration {
    Duration::from_secs(n.into())
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
