//! The embedded engine: all state in this process, behind one mutex.
//!
//! Not persisted: jobs live as long as the process does. Every operation is
//! O(log n) or better in the number of jobs: ready jobs sit in a per-tube
//! ordered set keyed by (priority, job key), delayed and reserved jobs in
//! ordered sets keyed by due time, so nothing scans the job pool.
//!
//! The mutex is a `std` one and is never held across an `.await`: each method
//! takes it, does its whole transition, and lets go.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use indexmap::IndexMap;
use tokio::time::Instant;

use super::{
    ConnId, Counts, JobState, JobStats, NewJob, PutOutcome, Reserved, Store, StoreStats, Tick,
    TubeRef, TubeStats, secs_left,
};
use crate::error::StoreResult;
use crate::names::{JobId, Tube};
use crate::reply::JobBody;

/// Jobs with a priority below this count as urgent in the stats.
const URGENT: u32 = 1024;
/// Most due items one tick moves, so one pass never holds the lock for long.
const TICK_BATCH: usize = 10_000;

/// Milliseconds since the store's epoch.
type Ms = u64;

/// The embedded storage engine.
pub struct MemoryStore {
    state: Mutex<State>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store holding only the `default` tube.
    pub fn new() -> MemoryStore {
        let mut tubes = IndexMap::new();
        tubes.insert(Tube::default_tube(), TubeState::default());
        MemoryStore {
            state: Mutex::new(State {
                epoch: Instant::now(),
                next_key: 1,
                jobs: HashMap::new(),
                names: HashMap::new(),
                tubes,
                delayed: BTreeSet::new(),
                reserved: BTreeSet::new(),
                pauses: BTreeSet::new(),
                owned: HashMap::new(),
                bury_seq: 0,
                total_jobs: 0,
                timeouts: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere must not take every other connection down with it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Ready,
    Delayed { due: Ms },
    Reserved { deadline: Ms, conn: ConnId },
    Buried { seq: u64 },
}

struct Job {
    /// The client-chosen id; `None` means the key is the job's id.
    name: Option<Arc<str>>,
    tube: Tube,
    pri: u32,
    delay: Ms,
    ttr: Ms,
    created: Ms,
    state: St,
    reserves: u32,
    timeouts: u32,
    releases: u32,
    buries: u32,
    kicks: u32,
    body: Bytes,
}

impl Job {
    fn id(&self, key: u64) -> JobId {
        match &self.name {
            Some(name) => JobId::Client(name.clone()),
            None => JobId::Server(key),
        }
    }

    fn body(&self, key: u64) -> JobBody {
        JobBody {
            id: self.id(key),
            tube: self.tube.clone(),
            body: self.body.clone(),
        }
    }
}

#[derive(Default)]
struct TubeState {
    /// (priority, key): the first entry is the next job to hand out.
    ready: BTreeSet<(u32, u64)>,
    /// (due, key).
    delayed: BTreeSet<(Ms, u64)>,
    /// (bury sequence, key): oldest burial first.
    buried: BTreeSet<(u64, u64)>,
    urgent: u64,
    reserved: u64,
    total_jobs: u64,
    using: u64,
    watching: u64,
    cmd_delete: u64,
    cmd_pause: u64,
    /// The pause length and when it ends, while paused.
    pause: Option<(Ms, Ms)>,
}

impl TubeState {
    fn unused(&self) -> bool {
        self.ready.is_empty()
            && self.delayed.is_empty()
            && self.buried.is_empty()
            && self.reserved == 0
            && self.using == 0
            && self.watching == 0
    }

    fn counts(&self) -> Counts {
        Counts {
            urgent: self.urgent,
            ready: self.ready.len() as u64,
            reserved: self.reserved,
            delayed: self.delayed.len() as u64,
            buried: self.buried.len() as u64,
        }
    }
}

struct State {
    epoch: Instant,
    next_key: u64,
    jobs: HashMap<u64, Job>,
    names: HashMap<Arc<str>, u64>,
    /// In creation order, which `list-tubes` reports.
    tubes: IndexMap<Tube, TubeState>,
    /// All delayed jobs, (due, key), for the timer.
    delayed: BTreeSet<(Ms, u64)>,
    /// All reserved jobs, (deadline, key), for the timer.
    reserved: BTreeSet<(Ms, u64)>,
    /// Paused tubes, (unpause time, tube), for the timer.
    pauses: BTreeSet<(Ms, Tube)>,
    /// Keys of the jobs each connection holds.
    owned: HashMap<ConnId, HashSet<u64>>,
    bury_seq: u64,
    total_jobs: u64,
    timeouts: u64,
}

fn ms(d: Duration) -> Ms {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn secs(ms: Ms) -> u64 {
    ms / 1000
}

impl State {
    fn now(&self) -> Ms {
        ms(self.epoch.elapsed())
    }

    fn key(&self, id: &JobId) -> Option<u64> {
        match id {
            JobId::Server(n) => self
                .jobs
                .get(n)
                .filter(|job| job.name.is_none())
                .map(|_| *n),
            JobId::Client(name) => self.names.get(name).copied(),
        }
    }

    /// The key of a job that `conn` has reserved.
    fn held_by(&self, conn: ConnId, id: &JobId) -> Option<u64> {
        let key = self.key(id)?;
        matches!(self.jobs[&key].state, St::Reserved { conn: c, .. } if c == conn).then_some(key)
    }

    /// Takes a job out of the index of its current state (not out of the pool).
    fn unlink(&mut self, key: u64) {
        let job = &self.jobs[&key];
        let ts = self.tubes.get_mut(&job.tube).expect("a job's tube exists");
        match job.state {
            St::Ready => {
                ts.ready.remove(&(job.pri, key));
                if job.pri < URGENT {
                    ts.urgent -= 1;
                }
            }
            St::Delayed { due } => {
                ts.delayed.remove(&(due, key));
                self.delayed.remove(&(due, key));
            }
            St::Reserved { deadline, conn } => {
                ts.reserved -= 1;
                self.reserved.remove(&(deadline, key));
                if let Some(held) = self.owned.get_mut(&conn) {
                    held.remove(&key);
                    if held.is_empty() {
                        self.owned.remove(&conn);
                    }
                }
            }
            St::Buried { seq } => {
                ts.buried.remove(&(seq, key));
            }
        }
    }

    /// Puts an unlinked job into state `st` and its index.
    fn link(&mut self, key: u64, st: St) {
        let job = self.jobs.get_mut(&key).expect("linking a job in the pool");
        job.state = st;
        let ts = self.tubes.get_mut(&job.tube).expect("a job's tube exists");
        match st {
            St::Ready => {
                ts.ready.insert((job.pri, key));
                if job.pri < URGENT {
                    ts.urgent += 1;
                }
            }
            St::Delayed { due } => {
                ts.delayed.insert((due, key));
                self.delayed.insert((due, key));
            }
            St::Reserved { deadline, conn } => {
                ts.reserved += 1;
                self.reserved.insert((deadline, key));
                self.owned.entry(conn).or_default().insert(key);
            }
            St::Buried { seq } => {
                ts.buried.insert((seq, key));
            }
        }
    }

    fn reserve_key(&mut self, conn: ConnId, key: u64) -> Reserved {
        let now = self.now();
        self.unlink(key);
        let job = self
            .jobs
            .get_mut(&key)
            .expect("reserving a job in the pool");
        job.reserves += 1;
        let ttr = job.ttr;
        self.link(
            key,
            St::Reserved {
                deadline: now + ttr,
                conn,
            },
        );
        Reserved {
            job: self.jobs[&key].body(key),
            ttr: Duration::from_millis(ttr),
        }
    }

    fn remove(&mut self, key: u64) {
        self.unlink(key);
        let job = self.jobs.remove(&key).expect("removing a job in the pool");
        if let Some(name) = &job.name {
            self.names.remove(name);
        }
        if let Some(ts) = self.tubes.get_mut(&job.tube) {
            ts.cmd_delete += 1;
        }
        self.forget_if_unused(&job.tube);
    }

    /// A tube exists while it is used, watched or holds jobs; `default` always.
    fn forget_if_unused(&mut self, tube: &Tube) {
        if tube.as_str() == "default" {
            return;
        }
        if let Some(ts) = self.tubes.get(tube).filter(|ts| ts.unused()) {
            if let Some((_, until)) = ts.pause {
                self.pauses.remove(&(until, tube.clone()));
            }
            self.tubes.shift_remove(tube);
        }
    }

    fn first_body(&self, tube: &Tube, pick: impl Fn(&TubeState) -> Option<u64>) -> Option<JobBody> {
        let key = pick(self.tubes.get(tube)?)?;
        Some(self.jobs[&key].body(key))
    }

    fn make_ready(&mut self, key: u64, ready: &mut Vec<Tube>) {
        self.unlink(key);
        self.link(key, St::Ready);
        let tube = &self.jobs[&key].tube;
        if !ready.contains(tube) {
            ready.push(tube.clone());
        }
    }
}

impl Store for MemoryStore {
    async fn put(&self, new: NewJob) -> StoreResult<PutOutcome> {
        let mut st = self.lock();
        if let Some(name) = &new.id
            && st.names.contains_key(name)
        {
            return Ok(PutOutcome::Exists(JobId::Client(name.clone())));
        }
        let now = st.now();
        let key = st.next_key;
        st.next_key += 1;
        st.total_jobs += 1;
        st.tubes.entry(new.tube.clone()).or_default().total_jobs += 1;
        let delay = ms(new.delay);
        if let Some(name) = &new.id {
            st.names.insert(name.clone(), key);
        }
        let id = match &new.id {
            Some(name) => JobId::Client(name.clone()),
            None => JobId::Server(key),
        };
        st.jobs.insert(
            key,
            Job {
                name: new.id,
                tube: new.tube,
                pri: new.pri,
                delay,
                ttr: ms(new.ttr),
                created: now,
                // Replaced by `link` straight away.
                state: St::Ready,
                reserves: 0,
                timeouts: 0,
                releases: 0,
                buries: 0,
                kicks: 0,
                body: new.body,
            },
        );
        let state = if delay > 0 {
            St::Delayed { due: now + delay }
        } else {
            St::Ready
        };
        st.link(key, state);
        Ok(PutOutcome::Inserted(id))
    }

    async fn reserve(&self, conn: ConnId, tubes: &[Tube]) -> StoreResult<Option<Reserved>> {
        let mut st = self.lock();
        let now = st.now();
        let best = tubes
            .iter()
            .filter_map(|t| st.tubes.get(t))
            .filter(|ts| !matches!(ts.pause, Some((_, until)) if until > now))
            .filter_map(|ts| ts.ready.first().copied())
            .min();
        Ok(best.map(|(_, key)| st.reserve_key(conn, key)))
    }

    async fn reserve_job(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Reserved>> {
        let mut st = self.lock();
        let Some(key) = st.key(id) else {
            return Ok(None);
        };
        if matches!(st.jobs[&key].state, St::Reserved { .. }) {
            return Ok(None);
        }
        Ok(Some(st.reserve_key(conn, key)))
    }

    async fn give_back(&self, conn: ConnId, id: &JobId) -> StoreResult<()> {
        let mut st = self.lock();
        if let Some(key) = st.held_by(conn, id) {
            st.unlink(key);
            let job = st.jobs.get_mut(&key).expect("held job in the pool");
            job.reserves = job.reserves.saturating_sub(1);
            st.link(key, St::Ready);
        }
        Ok(())
    }

    async fn delete(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        let mut st = self.lock();
        let Some(key) = st.key(id) else {
            return Ok(false);
        };
        if matches!(st.jobs[&key].state, St::Reserved { conn: c, .. } if c != conn) {
            return Ok(false);
        }
        st.remove(key);
        Ok(true)
    }

    async fn finish(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        let mut st = self.lock();
        let Some(key) = st.held_by(conn, id) else {
            return Ok(false);
        };
        st.remove(key);
        Ok(true)
    }

    async fn release(
        &self,
        conn: ConnId,
        id: &JobId,
        pri: u32,
        delay: Duration,
    ) -> StoreResult<Option<Tube>> {
        let mut st = self.lock();
        let Some(key) = st.held_by(conn, id) else {
            return Ok(None);
        };
        let now = st.now();
        st.unlink(key);
        let job = st.jobs.get_mut(&key).expect("held job in the pool");
        job.pri = pri;
        job.releases += 1;
        let delay = ms(delay);
        job.delay = delay;
        let state = if delay > 0 {
            St::Delayed { due: now + delay }
        } else {
            St::Ready
        };
        let tube = job.tube.clone();
        st.link(key, state);
        Ok(Some(tube))
    }

    async fn bury(&self, conn: ConnId, id: &JobId, pri: u32) -> StoreResult<bool> {
        let mut st = self.lock();
        let Some(key) = st.held_by(conn, id) else {
            return Ok(false);
        };
        st.unlink(key);
        st.bury_seq += 1;
        let seq = st.bury_seq;
        let job = st.jobs.get_mut(&key).expect("held job in the pool");
        job.pri = pri;
        job.buries += 1;
        st.link(key, St::Buried { seq });
        Ok(true)
    }

    async fn touch(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Duration>> {
        let mut st = self.lock();
        let Some(key) = st.held_by(conn, id) else {
            return Ok(None);
        };
        let now = st.now();
        let ttr = st.jobs[&key].ttr;
        st.unlink(key);
        st.link(
            key,
            St::Reserved {
                deadline: now + ttr,
                conn,
            },
        );
        Ok(Some(Duration::from_millis(ttr)))
    }

    async fn kick(&self, tube: &Tube, bound: u64) -> StoreResult<u64> {
        let mut st = self.lock();
        let Some(ts) = st.tubes.get(tube) else {
            return Ok(0);
        };
        let bound = usize::try_from(bound).unwrap_or(usize::MAX);
        let keys: Vec<u64> = if ts.buried.is_empty() {
            ts.delayed.iter().take(bound).map(|&(_, k)| k).collect()
        } else {
            ts.buried.iter().take(bound).map(|&(_, k)| k).collect()
        };
        let mut ready = Vec::new();
        for &key in &keys {
            st.jobs
                .get_mut(&key)
                .expect("indexed job in the pool")
                .kicks += 1;
            st.make_ready(key, &mut ready);
        }
        Ok(keys.len() as u64)
    }

    async fn kick_job(&self, id: &JobId) -> StoreResult<Option<Tube>> {
        let mut st = self.lock();
        let Some(key) = st.key(id) else {
            return Ok(None);
        };
        if !matches!(st.jobs[&key].state, St::Buried { .. } | St::Delayed { .. }) {
            return Ok(None);
        }
        st.jobs.get_mut(&key).expect("job in the pool").kicks += 1;
        let mut ready = Vec::new();
        st.make_ready(key, &mut ready);
        Ok(ready.pop())
    }

    async fn peek(&self, id: &JobId) -> StoreResult<Option<JobBody>> {
        let st = self.lock();
        Ok(st.key(id).map(|key| st.jobs[&key].body(key)))
    }

    async fn peek_ready(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        let st = self.lock();
        Ok(st.first_body(tube, |ts| ts.ready.first().map(|&(_, k)| k)))
    }

    async fn peek_delayed(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        let st = self.lock();
        Ok(st.first_body(tube, |ts| ts.delayed.first().map(|&(_, k)| k)))
    }

    async fn peek_buried(&self, tube: &Tube) -> StoreResult<Option<JobBody>> {
        let st = self.lock();
        Ok(st.first_body(tube, |ts| ts.buried.first().map(|&(_, k)| k)))
    }

    async fn stats_job(&self, id: &JobId) -> StoreResult<Option<JobStats>> {
        let st = self.lock();
        let Some(key) = st.key(id) else {
            return Ok(None);
        };
        let now = st.now();
        let job = &st.jobs[&key];
        let (state, time_left) = match job.state {
            St::Ready => (JobState::Ready, 0),
            St::Delayed { due } => (JobState::Delayed, due.saturating_sub(now)),
            St::Reserved { deadline, .. } => (JobState::Reserved, deadline.saturating_sub(now)),
            St::Buried { .. } => (JobState::Buried, 0),
        };
        Ok(Some(JobStats {
            id: job.id(key),
            tube: job.tube.clone(),
            state,
            pri: job.pri,
            age: secs(now - job.created),
            delay: secs(job.delay),
            ttr: secs(job.ttr),
            time_left: secs_left(time_left),
            reserves: job.reserves.into(),
            timeouts: job.timeouts.into(),
            releases: job.releases.into(),
            buries: job.buries.into(),
            kicks: job.kicks.into(),
        }))
    }

    async fn stats_tube(&self, tube: &Tube) -> StoreResult<Option<TubeStats>> {
        let st = self.lock();
        let now = st.now();
        Ok(st.tubes.get(tube).map(|ts| {
            let (pause, left) = match ts.pause {
                Some((len, until)) if until > now => (len, until - now),
                _ => (0, 0),
            };
            TubeStats {
                name: tube.clone(),
                counts: ts.counts(),
                total_jobs: ts.total_jobs,
                using: ts.using,
                watching: ts.watching,
                cmd_delete: ts.cmd_delete,
                cmd_pause_tube: ts.cmd_pause,
                pause: secs(pause),
                pause_time_left: secs_left(left),
            }
        }))
    }

    async fn stats(&self) -> StoreResult<StoreStats> {
        let st = self.lock();
        let mut counts = Counts::default();
        for ts in st.tubes.values() {
            let c = ts.counts();
            counts.urgent += c.urgent;
            counts.ready += c.ready;
            counts.reserved += c.reserved;
            counts.delayed += c.delayed;
            counts.buried += c.buried;
        }
        Ok(StoreStats {
            counts,
            job_timeouts: st.timeouts,
            total_jobs: st.total_jobs,
            tubes: st.tubes.len() as u64,
        })
    }

    async fn list_tubes(&self) -> StoreResult<Vec<Tube>> {
        Ok(self.lock().tubes.keys().cloned().collect())
    }

    async fn pause_tube(&self, tube: &Tube, delay: Duration) -> StoreResult<bool> {
        let mut st = self.lock();
        let now = st.now();
        let Some(ts) = st.tubes.get_mut(tube) else {
            return Ok(false);
        };
        ts.cmd_pause += 1;
        let old = ts.pause.take();
        let delay = ms(delay);
        if delay > 0 {
            ts.pause = Some((delay, now + delay));
        }
        if let Some((_, until)) = old {
            st.pauses.remove(&(until, tube.clone()));
        }
        if delay > 0 {
            st.pauses.insert((now + delay, tube.clone()));
        }
        Ok(true)
    }

    async fn release_all(&self, conn: ConnId, _held: &[JobId]) -> StoreResult<Vec<Tube>> {
        let mut st = self.lock();
        let Some(keys) = st.owned.get(&conn).cloned() else {
            return Ok(Vec::new());
        };
        let mut ready = Vec::new();
        for key in keys {
            st.make_ready(key, &mut ready);
        }
        Ok(ready)
    }

    async fn tick(&self) -> StoreResult<Tick> {
        let mut st = self.lock();
        let now = st.now();
        let mut ready = Vec::new();
        let mut budget = TICK_BATCH;
        while budget > 0 {
            let Some(&(due, key)) = st.delayed.first() else {
                break;
            };
            if due > now {
                break;
            }
            st.make_ready(key, &mut ready);
            budget -= 1;
        }
        while budget > 0 {
            let Some(&(deadline, key)) = st.reserved.first() else {
                break;
            };
            if deadline > now {
                break;
            }
            st.jobs
                .get_mut(&key)
                .expect("reserved job in the pool")
                .timeouts += 1;
            st.timeouts += 1;
            st.make_ready(key, &mut ready);
            budget -= 1;
        }
        while let Some((until, tube)) = st.pauses.first().cloned() {
            if until > now {
                break;
            }
            st.pauses.pop_first();
            if let Some(ts) = st.tubes.get_mut(&tube) {
                ts.pause = None;
            }
            if !ready.contains(&tube) {
                ready.push(tube);
            }
        }
        let next = if budget == 0 {
            Some(Duration::ZERO)
        } else {
            [
                st.delayed.first().map(|d| d.0),
                st.reserved.first().map(|d| d.0),
                st.pauses.first().map(|d| d.0),
            ]
            .into_iter()
            .flatten()
            .min()
            .map(|at| Duration::from_millis(at.saturating_sub(now)))
        };
        Ok(Tick { ready, next })
    }

    async fn attach(&self, tube: &Tube, how: TubeRef) -> StoreResult<()> {
        let mut st = self.lock();
        let ts = st.tubes.entry(tube.clone()).or_default();
        match how {
            TubeRef::Using => ts.using += 1,
            TubeRef::Watching => ts.watching += 1,
        }
        Ok(())
    }

    async fn detach(&self, tube: &Tube, how: TubeRef) -> StoreResult<()> {
        let mut st = self.lock();
        if let Some(ts) = st.tubes.get_mut(tube) {
            match how {
                TubeRef::Using => ts.using = ts.using.saturating_sub(1),
                TubeRef::Watching => ts.watching = ts.watching.saturating_sub(1),
            }
        }
        st.forget_if_unused(tube);
        Ok(())
    }
}
