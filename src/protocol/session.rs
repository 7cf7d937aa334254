//! One connection's session: its tubes, the jobs it holds, its roles, and
//! what the whole server shares with it; and a reserve blocked on the
//! broker ([`Blocked`]), as a connection and an HTTP long-poll both wait.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use indexmap::IndexSet;
use tokio::sync::{Semaphore, oneshot};
use tokio::time::{Instant, Sleep, sleep_until};
use tracing::{debug, error, warn};

use super::ClientError;
use super::command::Command;
use super::reply::Reply;
use super::stats::{Cmd, ServerStats};
use crate::auth::Access;
use crate::broker::{Broker, Handout, Look, WaiterId};
use crate::config::Config;
use crate::error::StoreResult;
use crate::job::{Lifecycle, NewJob, Reserved};
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
    /// A permit for each descriptor a client holds
    /// ([`Config::client_files`]).
    pub client_files: Arc<Semaphore>,
}

impl<S> Shared<S> {
    /// What the server shares, around `broker`.
    pub fn new(broker: Broker<S>, stats: ServerStats, config: Config) -> Shared<S> {
        let client_files = Arc::new(Semaphore::new(
            config.client_files.min(Semaphore::MAX_PERMITS),
        ));
        Shared {
            broker,
            stats,
            config,
            client_files,
        }
    }
}

/// What the connection must do after a command.
#[derive(Debug)]
pub enum Outcome {
    /// Send this reply.
    Reply(Reply),
    /// Nothing is ready: block until a job is handed over, the timeout
    /// passes, or a reserved job's deadline comes near.
    Wait(Wanted),
    /// Close the connection.
    Quit,
}

/// What a reserve that found nothing ready waits for.
#[derive(Debug)]
pub struct Wanted {
    /// The tubes it takes from.
    pub tubes: Arc<[Tube]>,
    /// How long it waits at most.
    pub timeout: Option<Duration>,
    /// For a batch: the most jobs it takes once one is handed over.
    pub batch: Option<usize>,
    /// When its look at the store, which found nothing, began.
    pub looked: Look,
}

/// One connection's state: its tubes and the jobs it holds.
pub struct Session<S: Store> {
    /// This connection's id.
    pub id: ConnId,
    pub(super) shared: Arc<Shared<S>>,
    pub(super) used: Tube,
    /// In the order `list-tubes-watched` prints them: as watched, an
    /// ignored tube's place taken by the last (beanstalkd's order). A set,
    /// so that watching or letting go of each of many tubes is not a walk
    /// over all of them.
    pub(super) watched: IndexSet<Tube>,
    /// `watched` as a reserve hands it to the broker, made again only after
    /// a `watch` or an `ignore` (not for every reserve: it cost a worker two
    /// allocations a job).
    watching: Option<Arc<[Tube]>>,
    /// When each job this connection holds runs out of time, as far as this
    /// connection knows (only it can touch, release or finish them; the timer
    /// takes them when the deadline passes).
    pub(super) deadlines: HashMap<JobId, Instant>,
    producer: bool,
    worker: bool,
    /// What its token allows; [`Access::Open`] when tokens are off.
    pub(super) access: Access,
    /// Failed `auth` attempts in a row, which each wait longer.
    pub(super) failures: u32,
    /// The client's address, for the log of failed attempts.
    pub peer: Option<std::net::SocketAddr>,
    /// Whether this is a connection's session ([`Session::open`]): counted
    /// in `stats`, a user of its tubes, its jobs returned when it closes.
    /// A request's ([`Session::request`]) is none of these.
    connection: bool,
    /// The timer that holds each command to the store's time limit, kept
    /// from one command to the next (see [`Session::watchdog`]). Left set
    /// after a command, it goes off once if no command follows within the
    /// limit: one poll of an idle connection for nothing, at most one per
    /// command.
    watchdog: Option<Pin<Box<Sleep>>>,
}

/// Counts a new connection's use and watch of `default` in the store.
///
/// The store has both operations before anything the connection asks
/// (one poll hands them over, and an embedded store carries them out
/// then), but the connection does not wait for a remote store's answer:
/// on a Redis that hangs, that wait held a new connection's first reply
/// past its deadline (6 to 8 s instead of 2). The answer, or the failure
/// to count, comes to a task of its own.
fn count_default<S: Store>(shared: &Arc<Shared<S>>, id: ConnId, default: &Tube) {
    let shared = Arc::clone(shared);
    let default = default.clone();
    without_waiting(
        id,
        "cannot count a new connection's use of `default`",
        async move {
            let broker = &shared.broker;
            let (using, watching) = tokio::join!(
                broker.attach_kept(&default, TubeRef::Using),
                broker.attach_kept(&default, TubeRef::Watching)
            );
            using.and(watching)
        },
    );
}

/// Hands `work` (a change of a tube's count) to the store without waiting
/// for its answer: one poll here, so that the store has it before anything
/// the connection asks next, and the rest in a task of its own, which logs
/// a failure as `what` (the store puts its counts right by itself).
pub(super) fn without_waiting(
    id: ConnId,
    what: &'static str,
    work: impl Future<Output = StoreResult<()>> + Send + 'static,
) {
    let mut work = Box::pin(async move {
        if let Err(e) = work.await {
            warn!(conn = id, error = %e, "{what}");
        }
    });
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if work.as_mut().poll(&mut cx).is_pending() {
        tokio::spawn(work);
    }
}

impl<S: Store> Session<S> {
    /// Opens a session using and watching `default`.
    ///
    /// Opening never fails: if the store cannot count the new user of
    /// `default` (its engine is unreachable), that is logged and only the
    /// tube's `current-using`/`current-watching` figures are off; the
    /// connection is kept, as every command will say what is wrong.
    pub fn open(shared: Arc<Shared<S>>, id: ConnId) -> Session<S> {
        let default = Tube::default_tube();
        count_default(&shared, id, &default);
        shared.stats.connections.fetch_add(1, Ordering::Relaxed);
        shared
            .stats
            .total_connections
            .fetch_add(1, Ordering::Relaxed);
        Session::fresh(shared, id, default, true)
    }

    /// Opens a session for one request of a front end without connections
    /// (HTTP), acting as `id`, with `tube` as its used tube and its one
    /// watched tube.
    ///
    /// It is not counted anywhere: not as a connection, producer or worker
    /// in `stats`, and not as a user of `tube` (so asking about a tube does
    /// not create it). So it has nothing to undo and is simply dropped
    /// afterwards, even half way through a command: the jobs it reserved
    /// stay reserved by `id` until they are finished, released, buried or
    /// their TTR runs out.
    ///
    /// With tokens on it may do nothing until it authenticates
    /// ([`Session::authenticate`]).
    pub fn request(shared: Arc<Shared<S>>, id: ConnId, tube: Tube) -> Session<S> {
        Session::fresh(shared, id, tube, false)
    }

    /// The watched tubes, as a reserve hands them to the broker.
    pub(super) fn watched_tubes(&mut self) -> Arc<[Tube]> {
        let watched = &self.watched;
        self.watching
            .get_or_insert_with(|| watched.iter().cloned().collect())
            .clone()
    }

    /// Watches `tube` too.
    pub(super) fn watch(&mut self, tube: Tube) {
        self.watching = None;
        self.watched.insert(tube);
    }

    /// Lets go of `tube`.
    pub(super) fn unwatch(&mut self, tube: &Tube) {
        self.watching = None;
        self.watched.swap_remove(tube);
    }

    /// A session using and watching `tube`, holding nothing, not yet
    /// authenticated; `connection` says whether it is a connection's.
    fn fresh(shared: Arc<Shared<S>>, id: ConnId, tube: Tube, connection: bool) -> Session<S> {
        let access = first_access(&shared);
        Session {
            id,
            shared,
            used: tube.clone(),
            watched: IndexSet::from([tube]),
            watching: None,
            deadlines: HashMap::new(),
            producer: false,
            worker: false,
            access,
            failures: 0,
            peer: None,
            connection,
            watchdog: None,
        }
    }

    /// Failed `auth` attempts in a row so far. An HTTP connection keeps
    /// them across its requests, each a session of its own.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Starts the count of failed attempts in a row at `n` (see
    /// [`Session::failures`]).
    pub fn set_failures(&mut self, n: u32) {
        self.failures = n;
    }

    /// A timer set to go off `limit` from now, for one command, to be
    /// given back with [`Session::keep_watchdog`]; `None` without a limit.
    ///
    /// One timer moved on at every command rather than one made and
    /// dropped per command: moving a timer's deadline later is one atomic
    /// step in tokio, where a new timer takes the timer wheel's lock twice
    /// and, when it is due before the runtime's next wake-up, a write to
    /// wake the runtime's driver (on Redis, one such write every four or
    /// five cycles of the cycle benchmark).
    pub(super) fn watchdog(&mut self, limit: Option<Duration>) -> Option<Pin<Box<Sleep>>> {
        let at = Instant::now() + limit?;
        Some(match self.watchdog.take() {
            Some(mut timer) => {
                timer.as_mut().reset(at);
                timer
            }
            None => Box::pin(sleep_until(at)),
        })
    }

    /// Keeps the timer [`Session::watchdog`] gave for the next command.
    pub(super) fn keep_watchdog(&mut self, timer: Option<Pin<Box<Sleep>>>) {
        if timer.is_some() {
            self.watchdog = timer;
        }
    }

    /// The shared broker.
    pub fn broker(&self) -> &Broker<S> {
        &self.shared.broker
    }

    /// Ends the session: its reservations go back to ready at once (or, with
    /// `failed`, as their worker's failure: see [`Store::release_all`]), its
    /// tubes are let go. A request's session has nothing to end.
    pub async fn close(self, failed: bool) {
        if !self.connection {
            return;
        }
        let broker = &self.shared.broker;
        let conn = self.id;
        let held: Vec<JobId> = self.deadlines.keys().cloned().collect();
        let mut result = broker.release_all(conn, &held, failed).await;
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

    /// Records a job this connection now holds, reserved by a store asked
    /// at `asked`, and builds its reply.
    pub fn took(&mut self, got: Reserved, asked: Instant) -> Reply {
        self.holds(&got, asked);
        Reply::Reserved(got.job)
    }

    /// Records the jobs of a batch reserved by a store asked at `asked`;
    /// its reply.
    pub fn took_batch(&mut self, got: Vec<Reserved>, asked: Instant) -> Reply {
        for r in &got {
            self.holds(r, asked);
        }
        Reply::Batch(got.into_iter().map(|r| r.job).collect())
    }

    /// Notes the deadline of a job this connection holds, counted from when
    /// the store was asked for it: the store counts it from a moment after
    /// that, so this deadline has never passed while the job is still
    /// reserved. Counted from the reply (later, the more so for a job
    /// handed to a waiting reserve), it could outlive the job's TTR, and a
    /// reserve right after the TTR took the job back was answered
    /// `DEADLINE_SOON` for a job no longer held.
    fn holds(&mut self, got: &Reserved, asked: Instant) {
        self.deadlines.insert(got.job.id.clone(), asked + got.ttr);
    }

    /// Reserves what is ready without waiting: one job, or with `batch`
    /// up to that many; the reply, if anything was ready.
    pub async fn reserve_now(
        &mut self,
        tubes: &[Tube],
        batch: Option<usize>,
    ) -> StoreResult<Option<Reply>> {
        let asked = Instant::now();
        let Some(max) = batch else {
            let got = self.shared.broker.reserve(self.id, tubes).await?;
            return Ok(got.map(|got| self.took(got, asked)));
        };
        let got = self
            .shared
            .broker
            .reserve_batch(self.id, tubes, max)
            .await?;
        Ok((!got.is_empty()).then(|| self.took_batch(got, asked)))
    }

    /// The reply for a job handed to this connection while it waited: with
    /// `batch`, whatever else is ready joins it, up to the batch's size.
    pub async fn handed(&mut self, handed: Handout, tubes: &[Tube], batch: Option<usize>) -> Reply {
        let Handout { got, asked } = handed;
        let Some(max) = batch else {
            return self.took(got, asked);
        };
        self.holds(&got, asked);
        let mut all = vec![got];
        if max > 1 {
            let asked = Instant::now();
            match self
                .shared
                .broker
                .reserve_batch(self.id, tubes, max - 1)
                .await
            {
                Ok(more) => {
                    for r in &more {
                        self.holds(r, asked);
                    }
                    all.extend(more);
                }
                // The job handed over is this connection's all the same.
                Err(e) => tracing::debug!(error = %e, "the rest of a batch could not be reserved"),
            }
        }
        Reply::Batch(all.into_iter().map(|r| r.job).collect())
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
        if let Some(counter) = Cmd::of(cmd) {
            self.count_as(counter, true);
        }
    }

    /// Counts a `put` refused for its body, as beanstalkd does: in
    /// `cmd-put` either way, and as a producer only once the body was read
    /// (`EXPECTED_CRLF`), not when it was skipped (`JOB_TOO_BIG`).
    pub(super) fn count_refused_put(&mut self, error: ClientError) {
        self.count_as(Cmd::Put, error == ClientError::ExpectedCrlf);
    }

    fn count_as(&mut self, counter: Cmd, roles: bool) {
        let stats = &self.shared.stats;
        stats.count(counter);
        if !self.connection || !roles {
            return;
        }
        let role = match counter {
            Cmd::Put => Some((&mut self.producer, &stats.producers)),
            // beanstalkd counts `reserve-job` too.
            Cmd::Reserve | Cmd::ReserveWithTimeout | Cmd::ReserveJob => {
                Some((&mut self.worker, &stats.workers))
            }
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
            life: life.map_or_else(Lifecycle::default, |life| *life),
        })
    }
}

impl<S: Store> Session<S> {
    /// Blocks a reserve that found nothing ready ([`Outcome::Wait`]): queues
    /// this session on the tubes it wants, then, if anything may have made
    /// a job of them ready since its look began, serves them, so that such
    /// a job is not missed.
    ///
    /// `started` is when the reserve began: its time on the store is
    /// counted from then.
    pub fn block(&self, wanted: Wanted, started: Instant) -> Blocked<S> {
        let Wanted {
            tubes,
            timeout,
            batch,
            looked,
        } = wanted;
        let timeout_at = timeout.map(|t| Instant::now() + t);
        let (waiter, rx, serve) = self.broker().register(self.id, tubes.clone(), Some(looked));
        // Served in a task of its own, not before the wait: should the store
        // hang, the timeout still ends the wait on time; and a pass is never
        // cut off half way (a job it reserved for a waiter that left is given
        // back, not left reserved by a closed connection).
        if serve {
            let shared = self.shared.clone();
            let serving = tubes.clone();
            tokio::spawn(async move { shared.broker.serve_waiting(&serving).await });
        }
        Blocked {
            shared: self.shared.clone(),
            conn: self.id,
            waiter,
            rx: Some(rx),
            tubes,
            timeout,
            timeout_at,
            batch,
            started,
        }
    }
}

/// A reserve blocked on the broker: queued as a waiter of its tubes, it is
/// handed a job by the hand-out pass that follows whatever makes one ready
/// (a put, a release, a kick, the timer). Nothing polls. A text connection
/// blocked in `reserve` and an HTTP long-poll both wait so; each adds what
/// else it watches (the socket, `DEADLINE_SOON`).
///
/// Dropped before it ends ([`Blocked::end`], or a job taken with
/// [`Blocked::handed`]), as an HTTP long-poll is when its client hangs up,
/// it leaves the queue at once, and a job already handed to it goes back to
/// ready: nothing waits for a client that has gone, and no job stays
/// reserved by it.
pub struct Blocked<S: Store> {
    shared: Arc<Shared<S>>,
    conn: ConnId,
    waiter: WaiterId,
    /// Where the handed job comes; `None` once one came or the waiter left
    /// the queue, when dropping has nothing left to undo.
    rx: Option<oneshot::Receiver<Handout>>,
    tubes: Arc<[Tube]>,
    timeout: Option<Duration>,
    timeout_at: Option<Instant>,
    batch: Option<usize>,
    started: Instant,
}

impl<S: Store> Blocked<S> {
    /// When the reserve times out, if it has a timeout.
    pub fn timeout_at(&self) -> Option<Instant> {
        self.timeout_at
    }

    /// Waits for the job the broker hands over; `None` if the waiter was
    /// dropped without one, which the broker never does. Cancel safe: a
    /// job is either returned or still on its way.
    pub async fn handed(&mut self) -> Option<Handout> {
        let rx = self.rx.as_mut()?;
        let got = rx.await.ok();
        self.rx = None;
        got
    }

    /// The reply to what [`Blocked::handed`] returned: with a batch,
    /// whatever else is ready joins the job, up to the batch's size.
    pub async fn deliver(&self, session: &mut Session<S>, handed: Option<Handout>) -> Reply {
        match handed {
            Some(got) => session.handed(got, &self.tubes, self.batch).await,
            None => Reply::TimedOut,
        }
    }

    /// Stops waiting, for `why`: `TIMED_OUT`, `DEADLINE_SOON`, or `None`
    /// (the client left, or the server is stopping). Returns the reply.
    ///
    /// A timeout first moves whatever has fallen due and looks once more
    /// (`last_chance`). If a job was handed over meanwhile, it is
    /// the session's (its reply, if the client is still there; a closing
    /// connection returns it).
    pub async fn end(mut self, session: &mut Session<S>, why: Option<Reply>) -> Option<Reply> {
        if self.shared.broker.stop_waiting(self.waiter) {
            // Out of the queue: nothing can be handed over any more.
            self.rx = None;
            if why == Some(Reply::TimedOut) {
                let limit = self.shared.broker.call_limit();
                // The command's time on the store is counted from when it
                // began: a `reserve-with-timeout T` answers by T plus the
                // limit, however long its first look took.
                let deadline =
                    limit.map(|limit| self.started + self.timeout.unwrap_or_default() + limit);
                // Boxed: a connection blocked in `reserve` should hold only
                // the waiting itself, not the room of this passing future.
                let last = Box::pin(last_chance(session, &self.tubes, self.batch));
                let last = match deadline {
                    Some(at) => tokio::time::timeout_at(at, last).await.ok(),
                    None => Some(last.await),
                };
                return Some(last.unwrap_or(Reply::TimedOut));
            }
            return why;
        }
        // The broker took this waiter first: a job is on its way.
        match self.handed().await {
            Some(Handout { got, asked }) => {
                let reply = session.took(got, asked);
                why.map(|_| match reply {
                    Reply::Reserved(job) if self.batch.is_some() => Reply::Batch(vec![job]),
                    reply => reply,
                })
            }
            None => why,
        }
    }
}

impl<S: Store> Drop for Blocked<S> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        self.shared.broker.stop_waiting(self.waiter);
        // Closed before the look, so that no job can arrive after it: a
        // hand-out pass whose send fails gives its job back itself.
        rx.close();
        let Ok(got) = rx.try_recv() else {
            return;
        };
        // A drop cannot wait: the job goes back in a task of its own, as a
        // departed connection's do.
        let (shared, conn) = (self.shared.clone(), self.conn);
        let id = got.got.job.id;
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = shared.broker.release_all(conn, &[id], false).await {
                    // Left to its TTR.
                    error!(conn, error = %e, "cannot give back a job handed to a reserve that was dropped");
                }
            });
        }
    }
}

/// How far past a reserve's timeout a job may fall due and still be
/// delivered: the timeout runs on this process's clock, due times on the
/// engine's (Redis's), and the two may differ by a few milliseconds.
const TIMEOUT_GRACE: Duration = Duration::from_millis(10);

/// Before a reserve times out, moves whatever has fallen due and tries once
/// more, as beanstalkd does: a job due a millisecond before the timeout must
/// not be missed because the timer had not run yet.
async fn last_chance<S: Store>(
    session: &mut Session<S>,
    tubes: &[Tube],
    batch: Option<usize>,
) -> Reply {
    for _ in 0..3 {
        let broker = session.broker();
        let next = match broker.tick().await {
            Ok(next) => next,
            Err(e) => {
                debug!(error = %e, "tick before a reserve timeout failed");
                None
            }
        };
        // A pass may have reserved a job for this very connection as it
        // timed out, and be giving it back.
        broker.settle().await;
        if let Ok(Some(reply)) = session.reserve_now(tubes, batch).await {
            return reply;
        }
        match next {
            Some(after) if after <= TIMEOUT_GRACE => tokio::time::sleep(after).await,
            _ => break,
        }
    }
    Reply::TimedOut
}

/// Where a new session stands: nowhere until it authenticates, if tokens
/// are on.
fn first_access<S>(shared: &Shared<S>) -> Access {
    match shared.config.tokens {
        Some(_) => Access::Anonymous,
        None => Access::Open,
    }
}

/// Whole seconds, as the text protocol gives times.
pub(super) fn secs(n: u32) -> Duration {
    Duration::from_secs(n.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::Lifecycle;
    use crate::store::memory::MemoryStore;

    fn shared() -> Arc<Shared<MemoryStore>> {
        Arc::new(Shared::new(
            Broker::new(MemoryStore::new()),
            ServerStats::new(Arc::default()),
            Config::default(),
        ))
    }

    /// A reserve of `tubes` with no timeout, as if its look began now.
    fn wanted(shared: &Shared<MemoryStore>, tubes: &Arc<[Tube]>) -> Wanted {
        Wanted {
            tubes: tubes.clone(),
            timeout: None,
            batch: None,
            looked: shared.broker.look(tubes).0,
        }
    }

    async fn waiting(shared: &Shared<MemoryStore>) -> u64 {
        shared.broker.stats().await.expect("stats").1
    }

    #[tokio::test]
    async fn a_dropped_wait_leaves_the_queue_and_gives_back_a_job_handed_to_it() {
        let shared = shared();
        let tube = Tube::parse(b"t").expect("a tube name");
        let tubes: Arc<[Tube]> = Arc::from([tube.clone()]);
        let session = Session::request(shared.clone(), 7, tube.clone());

        let blocked = session.block(wanted(&shared, &tubes), Instant::now());
        assert_eq!(waiting(&shared).await, 1);
        drop(blocked);
        assert_eq!(waiting(&shared).await, 0);

        // The put's hand-out pass reserves the job for the waiter and sends
        // it, but the waiter is dropped before it looks.
        let blocked = session.block(wanted(&shared, &tubes), Instant::now());
        let job = NewJob {
            tube: tube.clone(),
            id: None,
            pri: 0,
            delay: Duration::ZERO,
            ttr: Duration::from_secs(60),
            body: bytes::Bytes::from_static(b"x"),
            life: Lifecycle::default(),
        };
        shared.broker.put(job).await.expect("put");
        assert_eq!(waiting(&shared).await, 0, "served");
        assert!(
            shared
                .broker
                .reserve(8, &tubes)
                .await
                .expect("reserve")
                .is_none()
        );
        drop(blocked);
        for _ in 0..100 {
            if let Some(got) = shared.broker.reserve(8, &tubes).await.expect("reserve") {
                assert_eq!(&got.job.body[..], b"x");
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the job handed to a dropped wait was not given back");
    }

    /// With the timer behind (here it does not run at all), a job that has
    /// fallen due is still what `reserve-with-timeout 0` answers with.
    #[tokio::test]
    async fn reserve_with_timeout_0_moves_what_fell_due_when_the_timer_is_behind() {
        let shared = shared();
        let tube = Tube::parse(b"t").expect("a tube name");
        let mut session = Session::request(shared.clone(), 7, tube.clone());
        let job = NewJob {
            tube,
            id: None,
            pri: 0,
            delay: Duration::from_millis(20),
            ttr: Duration::from_secs(60),
            body: bytes::Bytes::from_static(b"due"),
            life: Lifecycle::default(),
        };
        shared.broker.put(job).await.expect("put");
        let poll = Command::Reserve {
            timeout: Some(0),
            tube: None,
        };
        assert!(matches!(
            session.handle(poll.clone()).await,
            Outcome::Reply(Reply::TimedOut)
        ));
        tokio::time::sleep(Duration::from_millis(30)).await;
        match session.handle(poll).await {
            Outcome::Reply(Reply::Reserved(job)) => assert_eq!(&job.body[..], b"due"),
            other => panic!("expected RESERVED, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_request_session_counts_only_its_commands() {
        let shared = shared();
        let mut session = Session::request(shared.clone(), 7, Tube::default_tube());
        session.count(&Command::Reserve {
            timeout: Some(0),
            tube: None,
        });
        session.close(true).await;
        assert_eq!(shared.stats.connections_now(), [0; 4]);
        assert_eq!(waiting(&shared).await, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_jobs_deadline_counts_from_when_the_store_was_asked() {
        let tube = Tube::parse(b"t").expect("a tube name");
        let mut session = Session::request(shared(), 7, tube.clone());
        let ttr = Duration::from_secs(3);
        let job = |n| Reserved {
            job: crate::job::JobBody {
                id: JobId::Server(n),
                tube: tube.clone(),
                body: bytes::Bytes::from_static(b"x"),
            },
            ttr,
        };
        // The store was asked, and the job reached the session 300 ms
        // later (a slow store, or a job handed to a waiting reserve).
        let asked = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        session.took(job(1), asked);
        assert_eq!(
            session.deadline_soon_at(),
            Some(asked + ttr - SAFETY_MARGIN)
        );
        // Once the store's TTR is over, the job is not held any more.
        tokio::time::advance(ttr - Duration::from_millis(300)).await;
        assert_eq!(session.deadline_soon_at(), None);

        let asked = Instant::now();
        tokio::time::advance(Duration::from_millis(300)).await;
        session.took_batch(vec![job(2), job(3)], asked);
        assert_eq!(
            session.deadline_soon_at(),
            Some(asked + ttr - SAFETY_MARGIN)
        );
    }

    /// Whether `timer` goes off within `within` from now.
    async fn goes_off(timer: &mut Pin<Box<Sleep>>, within: Duration) -> bool {
        tokio::time::timeout(within, timer.as_mut()).await.is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_gives_each_command_the_whole_limit_from_its_start() {
        let tube = Tube::parse(b"t").expect("a tube name");
        let mut session = Session::request(shared(), 7, tube);
        let limit = Duration::from_secs(2);
        let just_short = Duration::from_millis(1990);
        let slack = Duration::from_millis(20);
        assert!(session.watchdog(None).is_none(), "no limit, no timer");

        // A command that takes 1.5 s, and the next one: moved on, the
        // timer does not go off at the first command's deadline.
        let first = session.watchdog(Some(limit));
        tokio::time::advance(Duration::from_millis(1500)).await;
        session.keep_watchdog(first);
        let mut second = session.watchdog(Some(limit)).expect("a timer");
        assert!(!goes_off(&mut second, just_short).await);
        assert!(goes_off(&mut second, slack).await, "2 s after it began");
        session.keep_watchdog(Some(second));

        // One that went off is set again for the next command.
        let mut third = session.watchdog(Some(limit)).expect("a timer");
        assert!(!goes_off(&mut third, just_short).await);
        assert!(goes_off(&mut third, slack).await);
    }
}
