//! The embedded engine: all state in this process, behind one mutex.
//!
//! * `state.rs`: the job pool and its indexes, and their upkeep;
//! * `transitions.rs`: every state change, as a plain synchronous method
//!   given the time it happens at;
//! * `stats.rs`: the peeks and figures.
//!
//! [`MemoryStore`] is the [`Store`] over them: each call takes the mutex,
//! reads the clock, runs one transition and lets go. The mutex is a `std`
//! one and is never held across an `.await`.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

mod state;
mod stats;
mod transitions;

pub use state::State;

use crate::clock::{Clock, Micros};
use crate::error::StoreResult;
use crate::job::{JobBody, JobStats, NewJob, PutOutcome, Reserved, StoreStats, TubeStats};
use crate::names::{JobId, Tube};
use crate::store::{ConnId, Store, Tick, TubeRef};

/// The embedded storage engine, in memory only.
pub struct MemoryStore {
    state: Mutex<State>,
    clock: Clock,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store holding only the `default` tube.
    pub fn new() -> MemoryStore {
        MemoryStore::with_clock(Clock::system())
    }

    /// An empty store that reads the time from `clock` (a test's manual
    /// clock, so that delays pass without sleeping).
    pub fn with_clock(clock: Clock) -> MemoryStore {
        MemoryStore {
            state: Mutex::new(State::new()),
            clock,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not take every other connection down with it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the state at the current time.
    fn at_now<T>(&self, f: impl FnOnce(&mut State, Micros) -> T) -> StoreResult<T> {
        let mut state = self.lock();
        let now = self.clock.now();
        Ok(f(&mut state, now))
    }
}

impl Store for MemoryStore {
    async fn put(&self, job: NewJob) -> StoreResult<PutOutcome> {
        self.at_now(|st, now| st.put(job, now))
    }

    async fn reserve(&self, conn: ConnId, tubes: &[Tube]) -> StoreResult<Option<Reserved>> {
        self.at_now(|st, now| st.reserve(conn, tubes, now))
    }

    async fn reserve_job(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Reserved>> {
        self.at_now(|st, now| st.reserve_job(conn, id, now))
    }

    async fn give_back(&self, conn: ConnId, id: &JobId) -> StoreResult<()> {
        self.at_now(|st, _| st.give_back(conn, id))
    }

    async fn delete(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        self.at_now(|st, _| st.delete(conn, id))
    }

    async fn finish(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        self.at_now(|st, _| st.finish(conn, id))
    }

    async fn release(
        &self,
        conn: ConnId,
        id: &JobId,
        pri: u32,
        delay: Duration,
    ) -> StoreResult<Option<Tube>> {
        self.at_now(|st, now| st.release(conn, id, pri, delay, now))
    }

    async fn bury(&self, conn: ConnId, id: &JobId, pri: u32) -> StoreResult<bool> {
        self.at_now(|st, _| st.bury(conn, id, pri))
    }

    async fn touch(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Duration>> {
        self.at_now(|st, now| st.touch(conn, id, now))
    }

    async fn kick(&self, tube: &Tube, bound: u64) -> StoreResult<u64> {
        self.at_now(|st, _| st.kick(tube, bound))
    }

    async fn kick_job(&self, id: &JobId) -> StoreResult<Option<Tube>> {
        self.at_now(|st, _| st.kick_job(id))
    }

    async fn peek(&self, id: &JobId) -> StoreResult<Option<JobBody>> {
        Ok(self.lock().peek(id))
    }

    async fn peek_ready(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        Ok(self.lock().peek_ready(tube))
    }

    async fn peek_delayed(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        Ok(self.lock().peek_delayed(tube))
    }

    async fn peek_buried(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        Ok(self.lock().peek_buried(tube))
    }

    async fn stats_job(&self, id: &JobId) -> StoreResult<Option<JobStats>> {
        self.at_now(|st, now| st.stats_job(id, now))
    }

    async fn stats_tube(&self, tube: &Tube) -> StoreResult<Option<TubeStats>> {
        self.at_now(|st, now| st.stats_tube(tube, now))
    }

    async fn stats(&self) -> StoreResult<StoreStats> {
        Ok(self.lock().stats())
    }

    async fn list_tubes(&self) -> StoreResult<Vec<Tube>> {
        Ok(self.lock().list_tubes())
    }

    async fn pause_tube(&self, tube: &Tube, delay: Duration) -> StoreResult<bool> {
        self.at_now(|st, now| st.pause_tube(tube, delay, now))
    }

    async fn release_all(&self, conn: ConnId, held: &[JobId]) -> StoreResult<Vec<Tube>> {
        self.at_now(|st, _| st.release_all(conn, held))
    }

    async fn tick(&self) -> StoreResult<Tick> {
        self.at_now(|st, now| st.tick(now))
    }

    async fn attach(&self, tube: &Tube, how: TubeRef) -> StoreResult<()> {
        self.at_now(|st, _| st.attach(tube, how))
    }

    async fn detach(&self, tube: &Tube, how: TubeRef) -> StoreResult<()> {
        self.at_now(|st, _| st.detach(tube, how))
    }

    fn describe(&self) -> String {
        "embedded, in memory only".into()
    }
}
