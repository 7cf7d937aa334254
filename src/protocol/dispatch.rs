//! The one `match` that turns a command into a reply: each arm makes at most
//! one broker call.

use std::sync::Arc;
use std::time::SystemTime;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::ClientError;
use super::command::Command;
use super::export;
use super::failure::failed;
use super::options;
use super::reply::Reply;
use super::session::{Outcome, Session, Wanted, secs, without_waiting};
use super::stats::{render_job, render_tube};
use crate::auth::Access;
use crate::error::StoreResult;
use crate::job::{ExportCursor, NewJob, PutOutcome, WholeJob};
use crate::names::Tube;
use crate::rules;
use crate::schedule::{Schedule, now_ms};
use crate::store::{Store, TubeRef};

impl<S: Store> Session<S> {
    /// Carries out one command.
    pub async fn handle(&mut self, cmd: Command) -> Outcome {
        let cmd = match self.access {
            Access::Open => cmd,
            _ => match self.permit(cmd).await {
                Ok(cmd) => cmd,
                Err(refusal) => return Outcome::Reply(refusal),
            },
        };
        self.count(&cmd);
        match self.run(cmd).await {
            Ok(outcome) => outcome,
            Err(e) => Outcome::Reply(failed(self.id, e)),
        }
    }

    /// Carries out `put` (and `import`) commands that arrived together
    /// (pipelined): their jobs go to the broker at once, in order, so on a
    /// shared engine they share calls, and the replies come back in the
    /// same order.
    pub async fn handle_puts(&mut self, puts: Vec<Command>) -> Vec<Reply> {
        let jobs: Vec<_> = puts
            .into_iter()
            .map(|put| match self.refusal(&put) {
                Some(refusal) => Err(refusal),
                None => {
                    self.count(&put);
                    match put {
                        Command::Import(job) => self.whole_job(*job).map(Incoming::Whole),
                        put => self.new_job(put).map(Incoming::New),
                    }
                }
            })
            .collect();
        let (shared, conn) = (self.shared.clone(), self.id);
        join_all(jobs.into_iter().map(|job| async {
            let done = match job {
                Ok(Incoming::New(job)) => shared.broker.put(job).await.map(put_reply),
                Ok(Incoming::Whole(job)) => shared.broker.import(job).await.map(import_reply),
                Err(reply) => return reply,
            };
            done.unwrap_or_else(|e| failed(conn, e))
        }))
        .await
    }

    /// An imported job, if this server takes it.
    fn whole_job(&self, job: WholeJob) -> Result<WholeJob, Reply> {
        if job.body.len() > self.shared.config.max_job_size {
            return Err(Reply::Client(ClientError::JobTooBig));
        }
        if self.shared.stats.is_draining() {
            return Err(Reply::Draining);
        }
        Ok(job)
    }

    async fn run(&mut self, cmd: Command) -> StoreResult<Outcome> {
        let conn = self.id;
        let shared = self.shared.clone();
        let broker = &shared.broker;
        let found = |yes: bool, reply: Reply| if yes { reply } else { Reply::NotFound };
        if cmd.looks_at_others() {
            shared.stats.after_hangups().await;
        }
        let reply = match cmd {
            put @ Command::Put { .. } => match self.new_job(put) {
                Ok(job) => put_reply(broker.put(job).await?),
                Err(reply) => reply,
            },
            Command::Use(tube) => {
                if tube != self.used {
                    broker.attach(&tube, TubeRef::Using).await?;
                    let old = std::mem::replace(&mut self.used, tube.clone());
                    // Not waited for: the connection uses the new tube now,
                    // and a count that fails to go down is the store's to
                    // put right, so nothing here can fail once the new
                    // tube is counted (a failed `use` changes nothing).
                    let shared = shared.clone();
                    without_waiting(conn, "cannot uncount the tube a `use` left", async move {
                        shared.broker.detach(&old, TubeRef::Using).await
                    });
                }
                Reply::Using(tube)
            }
            Command::Reserve { timeout, tube } => return self.reserve(tube, timeout, None).await,
            Command::ReserveBatch {
                count,
                timeout,
                tube,
            } => return self.reserve(tube, timeout, Some(count)).await,
            Command::RemoveBatch { ids, finish } => {
                // As for `delete` below.
                for id in &ids {
                    self.deadlines.remove(id);
                }
                let count = broker.remove_batch(conn, &ids, finish).await?;
                Reply::Removed { finish, count }
            }
            Command::ReserveJob(id) => {
                let asked = Instant::now();
                match broker.reserve_job(conn, &id).await? {
                    Some(got) => self.took(got, asked),
                    None => Reply::NotFound,
                }
            }
            // A job named by one of these is no longer the connection's to
            // warn of (DEADLINE_SOON), whatever the answer: one answered
            // INTERNAL_ERROR may have been made all the same, and a job it
            // removed would answer every reserve in its last second with
            // DEADLINE_SOON at once. Should it not have been made, the job
            // comes back at its TTR, without the warning.
            Command::Delete(id) => {
                self.deadlines.remove(&id);
                let yes = broker.delete(conn, &id).await?;
                found(yes, Reply::Deleted(id))
            }
            Command::Finish(id) => {
                self.deadlines.remove(&id);
                let yes = broker.finish(conn, &id).await?;
                found(yes, Reply::Finished(id))
            }
            Command::Release { id, pri, delay } => {
                self.deadlines.remove(&id);
                let released = broker.release(conn, &id, pri, secs(delay)).await?;
                match released {
                    Some(r) if r.buried => Reply::Buried,
                    Some(_) => Reply::Released,
                    None => Reply::NotFound,
                }
            }
            Command::Bury { id, pri } => {
                self.deadlines.remove(&id);
                let yes = broker.bury(conn, &id, pri).await?;
                found(yes, Reply::Buried)
            }
            Command::Touch(id) => {
                // Counted from before the store was asked, as a reserve's.
                let asked = Instant::now();
                match broker.touch(conn, &id).await? {
                    Some(ttr) => {
                        self.deadlines.insert(id, asked + ttr);
                        Reply::Touched
                    }
                    None => Reply::NotFound,
                }
            }
            Command::Watch(tube) => {
                if !self.watched.contains(&tube) {
                    broker.attach(&tube, TubeRef::Watching).await?;
                    self.watch(tube);
                }
                Reply::Watching(self.watched.len())
            }
            Command::Ignore(tube) => match self.watched.contains(&tube) {
                true if self.watched.len() == 1 => Reply::NotIgnored,
                true => {
                    self.unwatch(&tube);
                    // Not waited for, as the tube a `use` leaves: an
                    // `ignore` cannot fail.
                    let shared = shared.clone();
                    without_waiting(conn, "cannot uncount an ignored tube", async move {
                        shared.broker.detach(&tube, TubeRef::Watching).await
                    });
                    Reply::Watching(self.watched.len())
                }
                false => Reply::Watching(self.watched.len()),
            },
            Command::Peek(id) => found_job(broker.peek(&id).await?),
            Command::PeekReady => found_job(broker.peek_ready(&self.used).await?),
            Command::PeekDelayed => found_job(broker.peek_delayed(&self.used).await?),
            Command::PeekBuried => found_job(broker.peek_buried(&self.used).await?),
            Command::Kick(bound) => Reply::Kicked(broker.kick(&self.used, bound).await?),
            Command::KickJob(id) => found(broker.kick_job(&id).await?, Reply::KickedJob),
            Command::StatsJob(id) => match broker.stats_job(&id).await? {
                Some(s) => Reply::Yaml(render_job(&s)),
                None => Reply::NotFound,
            },
            Command::StatsTube(tube) => match broker.stats_tube(&tube).await? {
                Some((s, waiting)) => Reply::Yaml(render_tube(&s, waiting)),
                None => Reply::NotFound,
            },
            Command::Stats => {
                let conns = shared.stats.connections_now();
                let (totals, waiting) = broker.stats().await?;
                let max_job_size = shared.config.max_job_size;
                Reply::Yaml(shared.stats.render(conns, &totals, waiting, max_job_size))
            }
            Command::ListTubes => {
                let tubes = broker.list_tubes().await?;
                // The list the store shares, unless a token's prefix hides
                // some of it.
                if tubes.iter().all(|t| self.may_reserve_from(t)) {
                    Reply::Tubes(tubes)
                } else {
                    let mine = tubes.iter().filter(|t| self.may_reserve_from(t));
                    Reply::Tubes(mine.cloned().collect())
                }
            }
            Command::ListTubeUsed => Reply::Using(self.used.clone()),
            Command::ListTubesWatched => Reply::Tubes(self.watched.iter().cloned().collect()),
            Command::PauseTube(tube, delay) => {
                found(broker.pause_tube(&tube, secs(delay)).await?, Reply::Paused)
            }
            Command::TubeSet(tube, options) => {
                broker.set_tube(&tube, *options).await?;
                Reply::Set
            }
            Command::TubeSettings(tube) => {
                let mut doc = String::from("---\n");
                options::yaml(&broker.tube_settings(&tube).await?, &mut doc);
                Reply::Yaml(doc)
            }
            Command::Schedule(new) => {
                let since = now_ms();
                let schedule = Schedule {
                    name: new.name,
                    when: new.when,
                    tube: new.tube,
                    pri: new.pri,
                    // Shown as its firings get it.
                    ttr: rules::ttr(secs(new.ttr)),
                    body: new.body,
                    since,
                };
                match schedule.when.next_after(since) {
                    Some(first) if broker.set_schedule(&schedule).await? => Reply::Scheduled(first),
                    Some(_) => Reply::Client(ClientError::BadSchedule("too-many")),
                    None => Reply::Client(ClientError::BadSchedule("never-fires")),
                }
            }
            Command::Unschedule(name) => {
                found(broker.remove_schedule(&name).await?, Reply::Unscheduled)
            }
            Command::ListSchedules => Reply::Schedules(broker.schedules().await?, now_ms()),
            Command::Quit => return Ok(Outcome::Quit),
            Command::Auth(token) => self.authenticate(&token).await,
            Command::Export { from, max } => {
                let max = export::page_size(max, self.shared.config.max_job_size);
                // What a deployment needs besides its jobs, first: an
                // import that sets a tube's settings before its jobs
                // arrive keeps them as they were.
                let (settings, schedules) = if from == ExportCursor::default() {
                    (broker.all_tube_settings().await?, broker.schedules().await?)
                } else {
                    Default::default()
                };
                let page = broker.export(from, max).await?;
                Reply::Exported {
                    next: export::show_cursor(page.next),
                    page: export::Page::new(settings, schedules, page.jobs, SystemTime::now()),
                }
            }
            Command::ImportSettings(tube, options) => {
                broker.set_tube(&tube, *options).await?;
                Reply::Imported(format!("settings {tube}"))
            }
            Command::ImportSchedule(schedule) => {
                if broker.set_schedule(&schedule).await? {
                    Reply::Imported(format!("schedule {}", schedule.name))
                } else {
                    Reply::Client(ClientError::BadSchedule("too-many"))
                }
            }
            Command::Import(job) => match self.whole_job(*job) {
                Ok(job) => import_reply(broker.import(job).await?),
                Err(reply) => reply,
            },
        };
        Ok(Outcome::Reply(reply))
    }
}

impl<S: Store> Session<S> {
    /// A reserve of one job, or with `batch` of up to that many: what is
    /// ready now, else `DEADLINE_SOON` or `TIMED_OUT` when due, else a wait.
    async fn reserve(
        &mut self,
        tube: Option<Tube>,
        timeout: Option<u32>,
        batch: Option<usize>,
    ) -> StoreResult<Outcome> {
        let tubes: Arc<[Tube]> = match tube {
            Some(t) => Arc::from([t]),
            None if matches!(self.access, Access::Open) => self.watched_tubes(),
            None => {
                // A prefix token takes only from the watched tubes it may
                // touch, so `default`, watched from the start, need not be
                // ignored first.
                let tubes: Vec<Tube> = (self.watched.iter())
                    .filter(|t| self.may_reserve_from(t))
                    .cloned()
                    .collect();
                if tubes.is_empty() {
                    return Ok(Outcome::Reply(Reply::Forbidden));
                }
                Arc::from(tubes)
            }
        };
        // A reserve that would wait anyway need not look at the store when
        // its tubes are known to have nothing (see `Broker::look`): its
        // look would find nothing. One that would not wait always looks: on
        // an engine shared with other processes, what they made ready is
        // known here only once their news arrives.
        let (looked, known_empty) = self.broker().look(&tubes);
        let found = if known_empty && timeout != Some(0) {
            None
        } else {
            self.reserve_now(&tubes, batch).await?
        };
        let reply = if let Some(reply) = found {
            reply
        } else if self
            .deadline_soon_at()
            .is_some_and(|at| at <= Instant::now())
        {
            Reply::DeadlineSoon
        } else if timeout == Some(0) {
            // With the timer behind, a job may have fallen due that it has
            // not moved yet: moved now and looked for once more, as
            // beanstalkd moves due jobs before it answers a command.
            let broker = self.broker();
            // Boxed: rare, and on Redis a timer pass's future is most of a
            // command's (6.7 of 7.7 KB), which every command's future
            // would otherwise carry, and each command copies into its box.
            let moved = broker.timer_behind() && Box::pin(broker.tick()).await.is_ok();
            // What another process made ready is known here once its news
            // arrives, which a client that saw its put answered need not
            // wait for.
            if moved | broker.catch_up().await {
                self.reserve_now(&tubes, batch)
                    .await?
                    .unwrap_or(Reply::TimedOut)
            } else {
                Reply::TimedOut
            }
        } else {
            return Ok(Outcome::Wait(Wanted {
                tubes,
                timeout: timeout.map(secs),
                batch,
                looked,
            }));
        };
        Ok(Outcome::Reply(reply))
    }
}

/// A job a `put` or an `import` brings.
enum Incoming {
    New(NewJob),
    Whole(WholeJob),
}

/// The reply to an import.
fn import_reply(outcome: PutOutcome) -> Reply {
    match outcome {
        PutOutcome::Inserted(id) => Reply::Imported(id.to_string()),
        PutOutcome::Exists(id) => Reply::Exists(id),
    }
}

/// The reply to a `put` the store took.
fn put_reply(outcome: PutOutcome) -> Reply {
    match outcome {
        PutOutcome::Inserted(id) => Reply::Inserted(id),
        PutOutcome::Exists(id) => Reply::Exists(id),
    }
}

fn found_job(job: Option<crate::job::JobBody>) -> Reply {
    job.map_or(Reply::NotFound, Reply::Found)
}
