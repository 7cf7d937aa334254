//! The embedded engine: all state in this process, behind one mutex.
//!
//! * `state.rs`: the job pool and its indexes, and their upkeep;
//! * `transitions.rs`: every state change, as a plain synchronous method
//!   given the time it happens at and the journal its records go to;
//! * `stats.rs`: the peeks and figures;
//! * `journal.rs`: the records a change leaves, and the [`Log`] they go to;
//! * `replay.rs`: the state rebuilt from records, and written out as them.
//!
//! [`MemoryStore`] is the [`Store`] over them: each call takes the mutex,
//! reads the clock, runs one transition and lets go; then, if the change
//! must be safe before its reply, it waits for its log. With no log
//! ([`Volatile`]) that is the memory-only engine; with the write-ahead log
//! of `src/store/log/` it is the durable one. The mutex is a `std` one and
//! is never held across an `.await`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;

pub mod journal;
pub mod replay;
mod state;
mod stats;
mod transitions;

pub use state::State;

use crate::clock::{Clock, Micros};
use crate::error::{StoreError, StoreResult};
use crate::job::{
    ExportCursor, ExportPage, JobBody, JobStats, Lifecycle, NewJob, Put, PutOutcome, Released,
    Reserved, StoreStats, TubeStats, WholeJob,
};
use crate::names::{JobId, Tube};
use crate::store::{ConnId, Store, Tick, TubeList, TubeRef, TubeSettings};
use journal::{Journal, Log, Volatile, Written};

/// The embedded storage engine; in memory only unless given a log.
pub struct MemoryStore<L: Log = Volatile> {
    state: Arc<Mutex<State>>,
    clock: Clock,
    log: L,
    /// When the timer must wake to free the ids of unique windows begun
    /// since it was last told (µs since the epoch; `u64::MAX`: none).
    window_end: AtomicU64,
    /// Changes the log had no room for, waiting to run again in the order
    /// they came: a connection's pipelined puts run side by side, and must
    /// still get their ids, and their place in their tube, in the order
    /// they were sent.
    queue: RoomQueue,
}

/// The line of changes waiting for room in the log.
#[derive(Default)]
struct RoomQueue {
    /// How many changes are in it (or about to be): while any are, a new
    /// change joins the line instead of trying on its own and overtaking.
    waiting: AtomicUsize,
    /// Taken in turn (tokio's mutex is fair); its holder tries the log.
    turn: tokio::sync::Mutex<()>,
}

/// A place in the [`RoomQueue`], given up when dropped, also when the
/// change's connection goes away while it waits.
struct InLine<'a>(&'a AtomicUsize);

impl<'a> InLine<'a> {
    fn join(waiting: &'a AtomicUsize) -> InLine<'a> {
        waiting.fetch_add(1, Ordering::SeqCst);
        InLine(waiting)
    }
}

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store holding only the `default` tube, in memory only.
    pub fn new() -> MemoryStore {
        MemoryStore::with_clock(Clock::system())
    }

    /// An empty in-memory store that reads the time from `clock` (a test's
    /// manual clock, so that delays pass without sleeping).
    pub fn with_clock(clock: Clock) -> MemoryStore {
        MemoryStore::from_parts(Arc::new(Mutex::new(State::new())), clock, Volatile)
    }
}

/// Whether a change waits for its log before its reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reply {
    /// After its records are as safe as the log promises (a change the reply
    /// acknowledges: a put, delete, release, bury, kick).
    WhenSafe,
    /// At once (a reserve, a touch: nothing a client relies on surviving a
    /// crash).
    AtOnce,
}

impl<L: Log> MemoryStore<L> {
    /// A store over `state`, reading `clock`, writing its records to `log`.
    pub fn from_parts(state: Arc<Mutex<State>>, clock: Clock, log: L) -> MemoryStore<L> {
        MemoryStore {
            state,
            clock,
            log,
            window_end: AtomicU64::new(u64::MAX),
            queue: RoomQueue::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not take every other connection down with it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the state at the current time.
    fn read<T>(&self, f: impl FnOnce(&State, Micros) -> T) -> StoreResult<T> {
        let state = self.lock();
        Ok(f(&state, self.clock.now()))
    }

    /// Runs one transition at the current time, its records going to the
    /// log, and answers as `reply` says. A transition refused for want of
    /// prepared room in the log (it changed nothing) runs again once the
    /// log has prepared more, unless the disk is full; it and every change
    /// after it wait in line, so none overtakes another.
    async fn change<T>(
        &self,
        reply: Reply,
        mut f: impl FnMut(&mut State, Micros, &mut L::Journal<'_>) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let at_once = (self.queue.waiting.load(Ordering::SeqCst) == 0)
            .then(|| self.try_change(reply, &mut f))
            .filter(|(out, _)| !matches!(out, Err(StoreError::OutOfMemory)));
        let (out, written) = match at_once {
            Some(done) => done,
            None => {
                let _in_line = InLine::join(&self.queue.waiting);
                let _turn = self.queue.turn.lock().await;
                loop {
                    let (out, written) = self.try_change(reply, &mut f);
                    if matches!(out, Err(StoreError::OutOfMemory)) && self.log.wait_for_room().await
                    {
                        continue;
                    }
                    break (out, written);
                }
            }
        };
        if reply == Reply::WhenSafe && out.is_ok() {
            // Also for a change that wrote nothing (a put answered EXISTS, a
            // delete of a job deleted a moment ago): what it answers about
            // may still be on its way to the disk.
            self.log.settle(written).await?;
        }
        out
    }

    /// One try of a transition; the sequence number of its last record.
    fn try_change<T>(
        &self,
        reply: Reply,
        f: &mut impl FnMut(&mut State, Micros, &mut L::Journal<'_>) -> StoreResult<T>,
    ) -> (StoreResult<T>, u64) {
        let mut state = self.lock();
        let now = self.clock.now();
        let mut journal = self.log.journal();
        // The journal holds the log's buffer, so the log cannot fail between
        // this look and the transition's records.
        let out = match journal.refusing() {
            Some(e) if reply == Reply::WhenSafe => Err(e),
            _ => f(&mut state, now, &mut journal),
        };
        state.note_unpaused(&mut journal);
        if let Some(end) = state.window_begun.take() {
            self.window_end.fetch_min(end, Ordering::Relaxed);
        }
        (out, journal.written())
    }
}

use Reply::{AtOnce, WhenSafe};

/// Adds the tubes of `more` that `tubes` lacks.
fn merge(tubes: &mut Vec<Tube>, more: Vec<Tube>) {
    for tube in more {
        if !tubes.contains(&tube) {
            tubes.push(tube);
        }
    }
}

impl<L: Log> Store for MemoryStore<L> {
    async fn put(&self, mut job: NewJob) -> StoreResult<Put> {
        self.change(WhenSafe, |st, now, log| st.put(&mut job, now, log))
            .await
    }

    async fn export(&self, from: ExportCursor, max: usize) -> StoreResult<ExportPage> {
        self.read(|st, now| st.export(from, max, now))
    }

    async fn import(&self, job: WholeJob) -> StoreResult<PutOutcome> {
        self.change(WhenSafe, |st, now, log| st.import(job.clone(), now, log))
            .await
    }

    async fn reserve(&self, conn: ConnId, tubes: &[Tube]) -> StoreResult<Option<Reserved>> {
        self.change(AtOnce, |st, now, log| Ok(st.reserve(conn, tubes, now, log)))
            .await
    }

    async fn reserve_batch(
        &self,
        conn: ConnId,
        tubes: &[Tube],
        max: usize,
    ) -> StoreResult<Vec<Reserved>> {
        self.change(AtOnce, |st, now, log| {
            Ok(st.reserve_batch(conn, tubes, max, now, log))
        })
        .await
    }

    async fn remove_batch(&self, conn: ConnId, ids: &[JobId], finish: bool) -> StoreResult<u64> {
        self.change(WhenSafe, |st, now, log| {
            Ok(st.remove_batch(conn, ids, finish, now, log))
        })
        .await
    }

    async fn reserve_job(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Reserved>> {
        self.change(
            AtOnce,
            |st, now, log| Ok(st.reserve_job(conn, id, now, log)),
        )
        .await
    }

    async fn give_back(&self, conn: ConnId, id: &JobId) -> StoreResult<()> {
        self.change(AtOnce, |st, now, log| {
            st.give_back(conn, id, now, log);
            Ok(())
        })
        .await
    }

    async fn delete(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        self.change(WhenSafe, |st, now, log| Ok(st.delete(conn, id, now, log)))
            .await
    }

    async fn finish(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        self.change(WhenSafe, |st, now, log| Ok(st.finish(conn, id, now, log)))
            .await
    }

    async fn release(
        &self,
        conn: ConnId,
        id: &JobId,
        pri: u32,
        delay: Duration,
    ) -> StoreResult<Option<Released>> {
        self.change(WhenSafe, |st, now, log| {
            st.release(conn, id, pri, delay, now, log)
        })
        .await
    }

    async fn bury(&self, conn: ConnId, id: &JobId, pri: u32) -> StoreResult<bool> {
        self.change(WhenSafe, |st, now, log| st.bury(conn, id, pri, now, log))
            .await
    }

    async fn touch(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Duration>> {
        self.change(AtOnce, |st, now, _| Ok(st.touch(conn, id, now)))
            .await
    }

    async fn kick(&self, tube: &Tube, bound: u64) -> StoreResult<u64> {
        // A kick of more jobs than the log has room prepared for goes on in
        // rounds, each once the keeper has prepared more, rather than stop
        // short with room on the disk; only a full disk stops it short.
        // The rounds keep to the first one's kind of job, as one kick does.
        let (mut kicked, mut from) = (0, None);
        loop {
            let round = self
                .change(WhenSafe, |st, _, log| {
                    st.kick(tube, bound - kicked, from, log)
                })
                .await;
            match round {
                Ok(round) => {
                    kicked += round.count;
                    from = Some(round.from);
                    if !round.short || kicked >= bound || !self.log.wait_for_room().await {
                        return Ok(kicked);
                    }
                }
                Err(_) if kicked > 0 => return Ok(kicked),
                Err(e) => return Err(e),
            }
        }
    }

    async fn kick_job(&self, id: &JobId) -> StoreResult<Option<Tube>> {
        self.change(WhenSafe, |st, _, log| st.kick_job(id, log))
            .await
    }

    async fn peek(&self, id: &JobId) -> StoreResult<Option<JobBody>> {
        self.read(|st, _| st.peek(id))
    }

    async fn peek_ready(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        self.read(|st, _| st.peek_ready(tube))
    }

    async fn peek_delayed(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        self.read(|st, _| st.peek_delayed(tube))
    }

    async fn peek_buried(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        self.read(|st, _| st.peek_buried(tube))
    }

    async fn stats_job(&self, id: &JobId) -> StoreResult<Option<JobStats>> {
        self.read(|st, now| st.stats_job(id, now))
    }

    async fn stats_tube(&self, tube: &Tube) -> StoreResult<Option<TubeStats>> {
        self.read(|st, now| st.stats_tube(tube, now))
    }

    async fn stats(&self) -> StoreResult<StoreStats> {
        let mut stats = self.read(|st, _| st.stats())?;
        stats.log = self.log.stats();
        Ok(stats)
    }

    async fn list_tubes(&self) -> StoreResult<TubeList> {
        self.read(|st, _| st.list_tubes())
    }

    async fn pause_tube(&self, tube: &Tube, delay: Duration) -> StoreResult<bool> {
        // Answered once safe, as a tube's settings are: the README promises
        // that a paused tube stays paused across a restart (a reviewer's
        // kills right after `PAUSED` found a third of them undone).
        self.change(WhenSafe, |st, now, log| {
            st.pause_tube(tube, delay, now, log)
        })
        .await
    }

    async fn set_tube(&self, tube: &Tube, options: Lifecycle) -> StoreResult<()> {
        self.change(WhenSafe, |st, _, log| st.set_tube(tube, options, log))
            .await
    }

    async fn tube_settings(&self, tube: &Tube) -> StoreResult<Lifecycle> {
        self.read(|st, _| st.tube_settings(tube))
    }

    async fn all_tube_settings(&self) -> StoreResult<TubeSettings> {
        self.read(|st, _| st.all_tube_settings())
    }

    async fn set_schedule(&self, name: &str, encoded: Bytes) -> StoreResult<bool> {
        self.change(WhenSafe, |st, _, log| st.set_schedule(name, &encoded, log))
            .await
    }

    async fn remove_schedule(&self, name: &str) -> StoreResult<bool> {
        self.change(WhenSafe, |st, _, log| st.remove_schedule(name, log))
            .await
    }

    async fn schedules(&self) -> StoreResult<Vec<Bytes>> {
        self.read(|st, _| st.schedules())
    }

    async fn release_all(
        &self,
        conn: ConnId,
        held: &[JobId],
        failed: bool,
    ) -> StoreResult<Vec<Tube>> {
        // In rounds, as a tick's timeouts: a worker that leaves holding
        // thousands of jobs on their last try makes more dead letters than
        // the log has room prepared for.
        let (mut ready, mut from, mut checked) = (Vec::new(), 0, true);
        loop {
            let rest = &held[from..];
            let (tubes, done) = self
                .change(AtOnce, |st, now, log| {
                    Ok(st.release_all(conn, rest, failed, checked, now, log))
                })
                .await?;
            merge(&mut ready, tubes);
            from += done;
            if from >= held.len() {
                return Ok(ready);
            }
            checked = self.log.wait_for_room().await;
        }
    }

    async fn tick(&self) -> StoreResult<Tick> {
        // A timeout that a restart must not undo (a dead letter, a
        // backoff) waits for room in the log rather than take the room set
        // aside for deletes; on a full disk (no room coming) it is made
        // anyway, its record taken as room allows, and a crash may then
        // bring the job back ready.
        let (mut ready, mut checked) = (Vec::new(), true);
        loop {
            let (tick, short) = self
                .change(AtOnce, |st, now, log| Ok(st.tick(now, checked, log)))
                .await?;
            merge(&mut ready, tick.ready);
            if !short {
                return Ok(Tick {
                    ready,
                    next: tick.next,
                });
            }
            checked = self.log.wait_for_room().await;
        }
    }

    async fn attach(&self, tube: &Tube, how: TubeRef) -> StoreResult<()> {
        self.change(AtOnce, |st, _, _| {
            st.attach(tube, how);
            Ok(())
        })
        .await
    }

    async fn detach(&self, tube: &Tube, how: TubeRef) -> StoreResult<()> {
        self.change(AtOnce, |st, _, _| {
            st.detach(tube, how);
            Ok(())
        })
        .await
    }

    fn windows_begun(&self) -> Option<Duration> {
        if self.window_end.load(Ordering::Relaxed) == u64::MAX {
            return None;
        }
        let end = self.window_end.swap(u64::MAX, Ordering::Relaxed);
        (end != u64::MAX).then(|| Duration::from_micros(end.saturating_sub(self.clock.now())))
    }

    fn held_back(&self) -> Option<Duration> {
        let state = self.lock();
        let (at, _) = state.limited.first()?;
        Some(Duration::from_micros(at.saturating_sub(self.clock.now())))
    }

    fn describe(&self) -> String {
        format!("embedded, {}", self.log.describe())
    }
}
