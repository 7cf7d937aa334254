//! The embedded engine: all state in this process, behind one mutex.
//!
//! Not persisted: jobs live as long as the process does. Every operation is
//! O(log n) or better in the number of jobs: ready jobs sit in a per-tube
//! ordered set keyed by (priority, job key), delayed jobs in a per-tube set
//! keyed by due time, reserved jobs in one set keyed by deadline, so nothing
//! scans the job pool.
//!
//! Memory per job is kept near beanstalkd's: the jobs live in a slab (a
//! vector with a free list, so a million jobs are one array of records and
//! the room it has not used yet is never touched), found by key through a
//! hash table of 4-byte slot numbers; each index holds (order, key) pairs.
//!
//! Times are microseconds since the store's epoch, so a job is never handed
//! out before its delay has passed, not even by a fraction of a millisecond.
//!
//! The mutex is a `std` one and is never held across an `.await`: each method
//! takes it, does its whole transition, and lets go.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use indexmap::IndexMap;
use slab::Slab;
use tokio::time::Instant;

use super::{
    ConnId, Counts, JobState, JobStats, NewJob, PutOutcome, Reserved, Store, StoreStats, Tick,
    TubeRef, TubeStats,
};
use crate::error::StoreResult;
use crate::names::{JobId, Tube};
use crate::reply::JobBody;

/// Jobs with a priority below this count as urgent in the stats.
const URGENT: u32 = 1024;
/// Most due items one tick moves, so one pass never holds the lock for long.
const TICK_BATCH: usize = 10_000;
/// The holder `link` is given for states other than reserved.
const NO_CONN: ConnId = 0;

/// Microseconds since the store's epoch.
type Micros = u64;
/// Where a job lives in the slab.
type Slot = usize;

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
                jobs: Slab::new(),
                slots: HashTable::new(),
                hasher: DefaultHashBuilder::default(),
                names: HashMap::new(),
                tubes,
                soonest: BTreeSet::new(),
                reserved: BTreeMap::new(),
                pauses: BTreeSet::new(),
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
    Delayed { due: Micros },
    Reserved { deadline: Micros },
    Buried { seq: u64 },
}

struct Job {
    /// The job's sequence number: its id unless it has a client-chosen name.
    key: u64,
    name: Option<Arc<str>>,
    tube: Tube,
    pri: u32,
    delay: Micros,
    ttr: Micros,
    created: Micros,
    state: St,
    reserves: u32,
    timeouts: u32,
    releases: u32,
    buries: u32,
    kicks: u32,
    /// A boxed slice rather than `Bytes`: half the size in the record, and a
    /// backlog of a million jobs is mostly records.
    body: Box<[u8]>,
}

impl Job {
    fn id(&self) -> JobId {
        match &self.name {
            Some(name) => JobId::Client(name.clone()),
            None => JobId::Server(self.key),
        }
    }

    fn body(&self) -> JobBody {
        JobBody {
            id: self.id(),
            tube: self.tube.clone(),
            body: Bytes::copy_from_slice(&self.body),
        }
    }
}

#[derive(Default)]
struct TubeState {
    /// (priority, key): the first entry is the next job to hand out.
    ready: BTreeSet<(u32, u64)>,
    /// (due, key).
    delayed: BTreeSet<(Micros, u64)>,
    /// (bury sequence, key): oldest burial first.
    buried: BTreeSet<(u64, u64)>,
    /// The due time this tube is listed under in `State::soonest`: the
    /// first of `delayed`, while it has any.
    listed: Option<Micros>,
    urgent: u64,
    reserved: u64,
    total_jobs: u64,
    using: u64,
    watching: u64,
    cmd_delete: u64,
    cmd_pause: u64,
    /// The pause length and when it ends, while paused.
    pause: Option<(Micros, Micros)>,
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
    /// The job pool.
    jobs: Slab<Job>,
    /// The slot of every job, found by its key (the table holds only the
    /// slot; the key is read from the job).
    slots: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// Client-chosen id -> slot.
    names: HashMap<Arc<str>, Slot>,
    /// In creation order, which `list-tubes` reports.
    tubes: IndexMap<Tube, TubeState>,
    /// Every tube with delayed jobs, by the due time of its first one: the
    /// timer looks at the first entry only.
    soonest: BTreeSet<(Micros, Tube)>,
    /// All reserved jobs, (deadline, key), for the timer, and who holds
    /// each. Holders live here rather than in every job record, which they
    /// would make 8 bytes bigger; reserved jobs are few.
    reserved: BTreeMap<(Micros, u64), ConnId>,
    /// Paused tubes, (unpause time, tube), for the timer.
    pauses: BTreeSet<(Micros, Tube)>,
    bury_seq: u64,
    total_jobs: u64,
    timeouts: u64,
}

fn micros(d: Duration) -> Micros {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Whole seconds of a time in microseconds.
fn secs(us: Micros) -> u64 {
    us / 1_000_000
}

/// Whole seconds left of a time in microseconds, as beanstalkd reports them
/// (see [`super::secs_left`]: a time just set reads one second less).
fn secs_left_us(us: Micros) -> u64 {
    us.saturating_sub(1) / 1_000_000
}

impl State {
    fn now(&self) -> Micros {
        micros(self.epoch.elapsed())
    }

    fn hash(&self, key: u64) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The slot of the job with this key.
    fn slot(&self, key: u64) -> Option<Slot> {
        let jobs = &self.jobs;
        self.slots
            .find(self.hash(key), |&s| jobs[s as usize].key == key)
            .map(|&s| s as Slot)
    }

    fn slot_of(&self, id: &JobId) -> Option<Slot> {
        match id {
            JobId::Server(n) => self.slot(*n).filter(|&s| self.jobs[s].name.is_none()),
            JobId::Client(name) => self.names.get(name).copied(),
        }
    }

    /// Who holds the job in `slot`, if it is reserved.
    fn holder(&self, slot: Slot) -> Option<ConnId> {
        let job = &self.jobs[slot];
        match job.state {
            St::Reserved { deadline } => self.reserved.get(&(deadline, job.key)).copied(),
            _ => None,
        }
    }

    /// The slot of a job that `conn` has reserved.
    fn held_by(&self, conn: ConnId, id: &JobId) -> Option<Slot> {
        let slot = self.slot_of(id)?;
        (self.holder(slot) == Some(conn)).then_some(slot)
    }

    /// Adds a job to the pool; its state is set by `link` straight after.
    fn insert(&mut self, job: Job) -> Slot {
        let key = job.key;
        let slot = self.jobs.insert(job);
        let hash = self.hash(key);
        let (jobs, hasher) = (&self.jobs, &self.hasher);
        // A slab of more than 4 billion jobs would not fit in memory anyway.
        let slot32 = u32::try_from(slot).expect("fewer than 2^32 jobs");
        self.slots
            .insert_unique(hash, slot32, |&s| hasher.hash_one(jobs[s as usize].key));
        slot
    }

    /// Takes an unlinked job out of the pool.
    fn take(&mut self, slot: Slot) -> Job {
        let key = self.jobs[slot].key;
        let hash = self.hash(key);
        if let Ok(entry) = self.slots.find_entry(hash, |&s| s as Slot == slot) {
            entry.remove();
        }
        self.jobs.remove(slot)
    }

    /// Lists `tube` in `soonest` under the due time of its first delayed
    /// job, if that changed.
    fn relist(&mut self, tube: &Tube) {
        let Some(ts) = self.tubes.get_mut(tube) else {
            return;
        };
        let first = ts.delayed.first().map(|&(due, _)| due);
        if first == ts.listed {
            return;
        }
        let old = std::mem::replace(&mut ts.listed, first);
        if let Some(old) = old {
            self.soonest.remove(&(old, tube.clone()));
        }
        if let Some(first) = first {
            self.soonest.insert((first, tube.clone()));
        }
    }

    /// Takes a job out of the index of its current state (not out of the pool).
    fn unlink(&mut self, slot: Slot) {
        let job = &self.jobs[slot];
        let key = job.key;
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
                if ts.listed == Some(due) {
                    let tube = job.tube.clone();
                    self.relist(&tube);
                }
            }
            St::Reserved { deadline } => {
                ts.reserved -= 1;
                self.reserved.remove(&(deadline, key));
            }
            St::Buried { seq } => {
                ts.buried.remove(&(seq, key));
            }
        }
    }

    /// Puts an unlinked job into state `st` and its index; `conn` is who
    /// holds it, if `st` is reserved.
    fn link(&mut self, slot: Slot, st: St, conn: ConnId) {
        let job = &mut self.jobs[slot];
        job.state = st;
        let key = job.key;
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
                if ts.listed.is_none_or(|listed| due < listed) {
                    let tube = job.tube.clone();
                    self.relist(&tube);
                }
            }
            St::Reserved { deadline } => {
                ts.reserved += 1;
                self.reserved.insert((deadline, key), conn);
            }
            St::Buried { seq } => {
                ts.buried.insert((seq, key));
            }
        }
    }

    fn reserve_slot(&mut self, conn: ConnId, slot: Slot) -> Reserved {
        let now = self.now();
        self.unlink(slot);
        let job = &mut self.jobs[slot];
        job.reserves += 1;
        let ttr = job.ttr;
        let deadline = now + ttr;
        self.link(slot, St::Reserved { deadline }, conn);
        Reserved {
            job: self.jobs[slot].body(),
            ttr: Duration::from_micros(ttr),
        }
    }

    fn remove(&mut self, slot: Slot) {
        self.unlink(slot);
        let job = self.take(slot);
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

    /// The body of the job `pick` chooses among `tube`'s.
    fn first_body(&self, tube: &Tube, pick: impl Fn(&TubeState) -> Option<u64>) -> Option<JobBody> {
        let key = pick(self.tubes.get(tube)?)?;
        Some(self.jobs[self.slot(key)?].body())
    }

    fn make_ready(&mut self, slot: Slot, ready: &mut Vec<Tube>) {
        self.unlink(slot);
        self.link(slot, St::Ready, NO_CONN);
        let tube = &self.jobs[slot].tube;
        if !ready.contains(tube) {
            ready.push(tube.clone());
        }
    }

    /// The slot of an indexed job.
    fn indexed(&self, key: u64) -> Slot {
        self.slot(key).expect("an indexed job is in the pool")
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
        let delay = micros(new.delay);
        let id = match &new.id {
            Some(name) => JobId::Client(name.clone()),
            None => JobId::Server(key),
        };
        let name = new.id.clone();
        let slot = st.insert(Job {
            key,
            name: new.id,
            tube: new.tube,
            pri: new.pri,
            delay,
            ttr: micros(new.ttr),
            created: now,
            // Replaced by `link` straight away.
            state: St::Ready,
            reserves: 0,
            timeouts: 0,
            releases: 0,
            buries: 0,
            kicks: 0,
            // The codec hands over a body that owns its bytes exactly, so
            // this takes them without copying.
            body: Vec::from(new.body).into_boxed_slice(),
        });
        if let Some(name) = name {
            st.names.insert(name, slot);
        }
        let state = if delay > 0 {
            St::Delayed { due: now + delay }
        } else {
            St::Ready
        };
        st.link(slot, state, NO_CONN);
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
        Ok(best.map(|(_, key)| {
            let slot = st.indexed(key);
            st.reserve_slot(conn, slot)
        }))
    }

    async fn reserve_job(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Reserved>> {
        let mut st = self.lock();
        let Some(slot) = st.slot_of(id) else {
            return Ok(None);
        };
        if matches!(st.jobs[slot].state, St::Reserved { .. }) {
            return Ok(None);
        }
        Ok(Some(st.reserve_slot(conn, slot)))
    }

    async fn give_back(&self, conn: ConnId, id: &JobId) -> StoreResult<()> {
        let mut st = self.lock();
        if let Some(slot) = st.held_by(conn, id) {
            st.unlink(slot);
            let job = &mut st.jobs[slot];
            job.reserves = job.reserves.saturating_sub(1);
            st.link(slot, St::Ready, NO_CONN);
        }
        Ok(())
    }

    async fn delete(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        let mut st = self.lock();
        let Some(slot) = st.slot_of(id) else {
            return Ok(false);
        };
        if st.holder(slot).is_some_and(|holder| holder != conn) {
            return Ok(false);
        }
        st.remove(slot);
        Ok(true)
    }

    async fn finish(&self, conn: ConnId, id: &JobId) -> StoreResult<bool> {
        let mut st = self.lock();
        let Some(slot) = st.held_by(conn, id) else {
            return Ok(false);
        };
        st.remove(slot);
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
        let Some(slot) = st.held_by(conn, id) else {
            return Ok(None);
        };
        let now = st.now();
        st.unlink(slot);
        let job = &mut st.jobs[slot];
        job.pri = pri;
        job.releases += 1;
        let delay = micros(delay);
        job.delay = delay;
        let state = if delay > 0 {
            St::Delayed { due: now + delay }
        } else {
            St::Ready
        };
        let tube = job.tube.clone();
        st.link(slot, state, NO_CONN);
        Ok(Some(tube))
    }

    async fn bury(&self, conn: ConnId, id: &JobId, pri: u32) -> StoreResult<bool> {
        let mut st = self.lock();
        let Some(slot) = st.held_by(conn, id) else {
            return Ok(false);
        };
        st.unlink(slot);
        st.bury_seq += 1;
        let seq = st.bury_seq;
        let job = &mut st.jobs[slot];
        job.pri = pri;
        job.buries += 1;
        st.link(slot, St::Buried { seq }, NO_CONN);
        Ok(true)
    }

    async fn touch(&self, conn: ConnId, id: &JobId) -> StoreResult<Option<Duration>> {
        let mut st = self.lock();
        let Some(slot) = st.held_by(conn, id) else {
            return Ok(None);
        };
        let now = st.now();
        let ttr = st.jobs[slot].ttr;
        st.unlink(slot);
        st.link(
            slot,
            St::Reserved {
                deadline: now + ttr,
            },
            conn,
        );
        Ok(Some(Duration::from_micros(ttr)))
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
            let slot = st.indexed(key);
            st.jobs[slot].kicks += 1;
            st.make_ready(slot, &mut ready);
        }
        Ok(keys.len() as u64)
    }

    async fn kick_job(&self, id: &JobId) -> StoreResult<Option<Tube>> {
        let mut st = self.lock();
        let Some(slot) = st.slot_of(id) else {
            return Ok(None);
        };
        if !matches!(st.jobs[slot].state, St::Buried { .. } | St::Delayed { .. }) {
            return Ok(None);
        }
        st.jobs[slot].kicks += 1;
        let mut ready = Vec::new();
        st.make_ready(slot, &mut ready);
        Ok(ready.pop())
    }

    async fn peek(&self, id: &JobId) -> StoreResult<Option<JobBody>> {
        let st = self.lock();
        Ok(st.slot_of(id).map(|slot| st.jobs[slot].body()))
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
        let Some(slot) = st.slot_of(id) else {
            return Ok(None);
        };
        let now = st.now();
        let job = &st.jobs[slot];
        let (state, time_left) = match job.state {
            St::Ready => (JobState::Ready, 0),
            St::Delayed { due } => (JobState::Delayed, due.saturating_sub(now)),
            St::Reserved { deadline, .. } => (JobState::Reserved, deadline.saturating_sub(now)),
            St::Buried { .. } => (JobState::Buried, 0),
        };
        Ok(Some(JobStats {
            id: job.id(),
            tube: job.tube.clone(),
            state,
            pri: job.pri,
            age: secs(now - job.created),
            delay: secs(job.delay),
            ttr: secs(job.ttr),
            time_left: secs_left_us(time_left),
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
                pause_time_left: secs_left_us(left),
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
        let delay = micros(delay);
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

    async fn release_all(&self, conn: ConnId, held: &[JobId]) -> StoreResult<Vec<Tube>> {
        let mut st = self.lock();
        let mut ready = Vec::new();
        for id in held {
            if let Some(slot) = st.held_by(conn, id) {
                st.make_ready(slot, &mut ready);
            }
        }
        Ok(ready)
    }

    async fn tick(&self) -> StoreResult<Tick> {
        let mut st = self.lock();
        let now = st.now();
        let mut ready = Vec::new();
        let mut budget = TICK_BATCH;
        while budget > 0 {
            let Some((due, tube)) = st.soonest.first().cloned() else {
                break;
            };
            if due > now {
                break;
            }
            let ts = &st.tubes[&tube];
            let key = ts
                .delayed
                .first()
                .expect("a listed tube has delayed jobs")
                .1;
            let slot = st.indexed(key);
            st.make_ready(slot, &mut ready);
            budget -= 1;
        }
        while budget > 0 {
            let Some((&(deadline, key), _)) = st.reserved.first_key_value() else {
                break;
            };
            if deadline > now {
                break;
            }
            let slot = st.indexed(key);
            st.jobs[slot].timeouts += 1;
            st.timeouts += 1;
            st.make_ready(slot, &mut ready);
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
                st.soonest.first().map(|d| d.0),
                st.reserved.first_key_value().map(|d| d.0.0),
                st.pauses.first().map(|d| d.0),
            ]
            .into_iter()
            .flatten()
            .min()
            .map(|at| Duration::from_micros(at.saturating_sub(now)))
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
