//! The embedded engine's transitions: plain synchronous methods on
//! [`State`], each one whole state change, given the time it happens at and
//! the [`Journal`] its records go to.
//!
//! They know nothing of locks, clocks or files: [`super::MemoryStore`] calls
//! them under its mutex with the clock's reading. A change that must be kept
//! is recorded before it is made, so that one the log refuses (no room on
//! disk) is not made at all.

use std::time::Duration;

use super::journal::{Journal, Meta, Record};
use super::state::{Job, NO_CONN, Slot, St, State};
use crate::clock::{Micros, micros};
use crate::error::StoreResult;
use crate::job::{JobCounters, NewJob, PutOutcome, Reserved};
use crate::names::{JobId, Tube};
use crate::rules::{KickFrom, kick_from};
use crate::store::{ConnId, Tick, TubeRef};

/// Most due items one tick moves, so one pass never holds the lock for long.
const TICK_BATCH: usize = 10_000;

/// The state a job put or released with `delay` at `now` goes into.
fn ready_or_delayed(delay: Micros, now: Micros) -> St {
    if delay > 0 {
        St::Delayed {
            due: now.saturating_add(delay),
        }
    } else {
        St::Ready
    }
}

impl State {
    /// Inserts a job, ready or delayed.
    pub fn put(
        &mut self,
        new: NewJob,
        now: Micros,
        log: &mut impl Journal,
    ) -> StoreResult<PutOutcome> {
        if let Some(name) = &new.id
            && self.names.contains_key(name)
        {
            return Ok(PutOutcome::Exists(JobId::Client(name.clone())));
        }
        let key = self.next_key;
        let delay = micros(new.delay);
        let job = Job {
            key,
            name: new.id,
            tube: new.tube,
            pri: new.pri,
            delay,
            ttr: micros(new.ttr),
            created: now,
            state: ready_or_delayed(delay, now),
            counters: JobCounters::default(),
            // The codec hands over a body that owns its bytes exactly, so
            // this takes them without copying.
            body: Vec::from(new.body).into_boxed_slice(),
        };
        log.keep(Record::Job(job.image()))?;
        self.next_key += 1;
        self.total_jobs += 1;
        self.tubes.entry(job.tube.clone()).or_default().total_jobs += 1;
        let (id, state) = (job.id(), job.state);
        let slot = self.insert(job);
        self.link(slot, state, NO_CONN);
        Ok(PutOutcome::Inserted(id))
    }

    fn reserve_slot(
        &mut self,
        conn: ConnId,
        slot: Slot,
        now: Micros,
        log: &mut impl Journal,
    ) -> Reserved {
        let job = &mut self.jobs[slot];
        job.counters.reserves += 1;
        let ttr = job.ttr;
        self.relink(
            slot,
            St::Reserved {
                deadline: now.saturating_add(ttr),
            },
            conn,
        );
        let job = &self.jobs[slot];
        log.note(Record::Meta(job.meta()));
        Reserved {
            job: job.body(),
            ttr: Duration::from_micros(ttr),
        }
    }

    /// Reserves the most urgent ready job of the unpaused `tubes` for `conn`.
    pub fn reserve(
        &mut self,
        conn: ConnId,
        tubes: &[Tube],
        now: Micros,
        log: &mut impl Journal,
    ) -> Option<Reserved> {
        let (_, key) = tubes
            .iter()
            .filter_map(|t| self.tubes.get(t))
            .filter(|ts| !ts.paused(now))
            .filter_map(|ts| ts.ready.first().copied())
            .min()?;
        let slot = self.indexed(key);
        Some(self.reserve_slot(conn, slot, now, log))
    }

    /// Reserves one job by id, if it is not reserved already.
    pub fn reserve_job(
        &mut self,
        conn: ConnId,
        id: &JobId,
        now: Micros,
        log: &mut impl Journal,
    ) -> Option<Reserved> {
        let slot = self.slot_of(id)?;
        if matches!(self.jobs[slot].state, St::Reserved { .. }) {
            return None;
        }
        Some(self.reserve_slot(conn, slot, now, log))
    }

    /// Undoes a reservation that never reached its client.
    pub fn give_back(&mut self, conn: ConnId, id: &JobId, log: &mut impl Journal) {
        if let Some(slot) = self.held_by(conn, id) {
            let job = &mut self.jobs[slot];
            job.counters.reserves = job.counters.reserves.saturating_sub(1);
            self.relink(slot, St::Ready, NO_CONN);
            log.note(Record::Meta(self.jobs[slot].meta()));
        }
    }

    /// Removes a job for good and records it.
    fn drop_job(&mut self, slot: Slot, log: &mut impl Journal) {
        let job = self.remove(slot);
        log.forget(&job.image());
    }

    /// Deletes a job that is not reserved, or is reserved by `conn`.
    pub fn delete(&mut self, conn: ConnId, id: &JobId, log: &mut impl Journal) -> bool {
        let Some(slot) = self.slot_of(id) else {
            return false;
        };
        if self.holder(slot).is_some_and(|holder| holder != conn) {
            return false;
        }
        self.drop_job(slot, log);
        true
    }

    /// Deletes a job only if `conn` has it reserved.
    pub fn finish(&mut self, conn: ConnId, id: &JobId, log: &mut impl Journal) -> bool {
        let Some(slot) = self.held_by(conn, id) else {
            return false;
        };
        self.drop_job(slot, log);
        true
    }

    /// Records the job in `slot` as `change` leaves it, then makes the
    /// change (moving it to `st`, held by `conn`); nothing changes if the
    /// log refuses.
    fn change(
        &mut self,
        slot: Slot,
        st: St,
        conn: ConnId,
        log: &mut impl Journal,
        change: impl Fn(&mut Meta),
    ) -> StoreResult<()> {
        let mut meta = self.jobs[slot].meta();
        change(&mut meta);
        meta.state = st.stored();
        log.keep(Record::Meta(meta))?;
        self.unlink(slot);
        let job = &mut self.jobs[slot];
        job.pri = meta.pri;
        job.delay = meta.delay;
        job.counters = meta.counters;
        self.link(slot, st, conn);
        Ok(())
    }

    /// Puts a job reserved by `conn` back, ready or delayed; returns its tube.
    pub fn release(
        &mut self,
        conn: ConnId,
        id: &JobId,
        pri: u32,
        delay: Duration,
        now: Micros,
        log: &mut impl Journal,
    ) -> StoreResult<Option<Tube>> {
        let Some(slot) = self.held_by(conn, id) else {
            return Ok(None);
        };
        let delay = micros(delay);
        self.change(slot, ready_or_delayed(delay, now), NO_CONN, log, |m| {
            m.pri = pri;
            m.delay = delay;
            m.counters.releases += 1;
        })?;
        Ok(Some(self.jobs[slot].tube.clone()))
    }

    /// Buries a job reserved by `conn`.
    pub fn bury(
        &mut self,
        conn: ConnId,
        id: &JobId,
        pri: u32,
        log: &mut impl Journal,
    ) -> StoreResult<bool> {
        let Some(slot) = self.held_by(conn, id) else {
            return Ok(false);
        };
        let seq = self.bury_seq + 1;
        self.change(slot, St::Buried { seq }, NO_CONN, log, |m| {
            m.pri = pri;
            m.counters.buries += 1;
        })?;
        self.bury_seq = seq;
        Ok(true)
    }

    /// Restarts the TTR of a job reserved by `conn`; returns the TTR. Not
    /// recorded: after a restart the job is ready whatever its deadline was.
    pub fn touch(&mut self, conn: ConnId, id: &JobId, now: Micros) -> Option<Duration> {
        let slot = self.held_by(conn, id)?;
        let ttr = self.jobs[slot].ttr;
        let deadline = now.saturating_add(ttr);
        self.relink(slot, St::Reserved { deadline }, conn);
        Some(Duration::from_micros(ttr))
    }

    /// Kicks one job to ready.
    fn kick_slot(&mut self, slot: Slot, log: &mut impl Journal) -> StoreResult<()> {
        self.change(slot, St::Ready, NO_CONN, log, |m| m.counters.kicks += 1)
    }

    /// Kicks up to `bound` jobs of `tube` (see [`kick_from`]). Stops early
    /// if the log refuses, and fails only if it refused the first.
    pub fn kick(&mut self, tube: &Tube, bound: u64, log: &mut impl Journal) -> StoreResult<u64> {
        let Some(ts) = self.tubes.get(tube) else {
            return Ok(0);
        };
        let bound = usize::try_from(bound).unwrap_or(usize::MAX);
        let keys: Vec<u64> = match kick_from(ts.buried.len() as u64) {
            KickFrom::Buried => ts.buried.iter().take(bound).map(|&(_, k)| k).collect(),
            KickFrom::Delayed => ts.delayed.iter().take(bound).map(|&(_, k)| k).collect(),
        };
        for (kicked, &key) in keys.iter().enumerate() {
            let slot = self.indexed(key);
            if let Err(e) = self.kick_slot(slot, log) {
                return if kicked == 0 {
                    Err(e)
                } else {
                    Ok(kicked as u64)
                };
            }
        }
        Ok(keys.len() as u64)
    }

    /// Kicks one buried or delayed job; returns its tube.
    pub fn kick_job(&mut self, id: &JobId, log: &mut impl Journal) -> StoreResult<Option<Tube>> {
        let Some(slot) = self.slot_of(id) else {
            return Ok(None);
        };
        if !matches!(
            self.jobs[slot].state,
            St::Buried { .. } | St::Delayed { .. }
        ) {
            return Ok(None);
        }
        self.kick_slot(slot, log)?;
        Ok(Some(self.jobs[slot].tube.clone()))
    }

    /// Pauses an existing tube for `delay` (zero resumes it).
    pub fn pause_tube(
        &mut self,
        tube: &Tube,
        delay: Duration,
        now: Micros,
        log: &mut impl Journal,
    ) -> bool {
        let Some(ts) = self.tubes.get_mut(tube) else {
            return false;
        };
        ts.cmd_pause += 1;
        let delay = micros(delay);
        let until = now.saturating_add(delay);
        let old = std::mem::replace(&mut ts.pause, (delay > 0).then_some((delay, until)));
        if let Some((_, until)) = old {
            self.pauses.remove(&(until, tube.clone()));
        }
        if delay > 0 {
            self.pauses.insert((until, tube.clone()));
        }
        log.note(Record::Pause {
            tube: tube.as_str(),
            length: delay,
            until: if delay > 0 { until } else { 0 },
        });
        true
    }

    /// Returns to ready the jobs of `held` that `conn` still holds; returns
    /// the tubes that got jobs back. Not recorded: a restart makes them
    /// ready too, and nothing else about them changed.
    pub fn release_all(&mut self, conn: ConnId, held: &[JobId]) -> Vec<Tube> {
        let mut ready = Vec::new();
        for id in held {
            if let Some(slot) = self.held_by(conn, id) {
                self.make_ready(slot, &mut ready);
            }
        }
        ready
    }

    /// Moves what has fallen due by `now`, a bounded amount at a time.
    /// Only timeouts are recorded (for their counters): a due time passed
    /// is a due time passed after a restart too.
    pub fn tick(&mut self, now: Micros, log: &mut impl Journal) -> Tick {
        let mut ready = Vec::new();
        let mut budget = TICK_BATCH;
        while budget > 0 {
            let Some((due, tube)) = self.soonest.first().cloned() else {
                break;
            };
            if due > now {
                break;
            }
            let ts = &self.tubes[&tube];
            let key = ts
                .delayed
                .first()
                .expect("a listed tube has delayed jobs")
                .1;
            let slot = self.indexed(key);
            self.make_ready(slot, &mut ready);
            budget -= 1;
        }
        while budget > 0 {
            let Some((&(deadline, key), _)) = self.reserved.first_key_value() else {
                break;
            };
            if deadline > now {
                break;
            }
            let slot = self.indexed(key);
            self.jobs[slot].counters.timeouts += 1;
            self.timeouts += 1;
            self.make_ready(slot, &mut ready);
            log.note(Record::Meta(self.jobs[slot].meta()));
            budget -= 1;
        }
        while let Some((until, tube)) = self.pauses.first().cloned() {
            if until > now {
                break;
            }
            self.pauses.pop_first();
            if let Some(ts) = self.tubes.get_mut(&tube) {
                ts.pause = None;
            }
            if !ready.contains(&tube) {
                ready.push(tube);
            }
        }
        let next = if budget == 0 {
            Some(Duration::ZERO)
        } else {
            self.next_due()
                .map(|at| Duration::from_micros(at.saturating_sub(now)))
        };
        Tick { ready, next }
    }

    /// The earliest time anything falls due.
    fn next_due(&self) -> Option<Micros> {
        [
            self.soonest.first().map(|d| d.0),
            self.reserved.first_key_value().map(|d| d.0.0),
            self.pauses.first().map(|d| d.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Counts a connection's use or watch of `tube`, creating it if needed.
    pub fn attach(&mut self, tube: &Tube, how: TubeRef) {
        let ts = self.tubes.entry(tube.clone()).or_default();
        match how {
            TubeRef::Using => ts.using += 1,
            TubeRef::Watching => ts.watching += 1,
        }
    }

    /// Undoes one [`State::attach`]; a tube with no jobs and no users goes.
    pub fn detach(&mut self, tube: &Tube, how: TubeRef) {
        if let Some(ts) = self.tubes.get_mut(tube) {
            match how {
                TubeRef::Using => ts.using = ts.using.saturating_sub(1),
                TubeRef::Watching => ts.watching = ts.watching.saturating_sub(1),
            }
        }
        self.forget_if_unused(tube);
    }
}
