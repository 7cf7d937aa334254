//! The embedded engine's transitions: plain synchronous methods on
//! [`State`], each one whole state change, given the time it happens at and
//! the [`Journal`] its records go to.
//!
//! They know nothing of locks, clocks or files: [`super::MemoryStore`] calls
//! them under its mutex with the clock's reading. A change that must be kept
//! is recorded before it is made, so that one the log refuses (no room on
//! disk) is not made at all.

use std::time::Duration;

use super::journal::{Journal, Meta, Record, Round};
use super::state::{Job, Life, NO_CONN, Slot, St, State};
use crate::clock::{Micros, micros};
use crate::error::StoreResult;
use crate::job::{
    JobCounters, JobState, Lifecycle, NewJob, Put, PutOutcome, Released, Reserved, WholeJob,
};
use crate::names::{JobId, Tube};
use crate::rules::{KickFrom, backoff_wait, kick_from, out_of_tries};
use crate::schedule::MAX_SCHEDULES;
use crate::store::{ConnId, Tick, TubeRef};
use std::sync::OnceLock;

/// What one [`State::kick`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kicked {
    /// How many jobs it kicked.
    pub count: u64,
    /// Which of the tube's jobs it kicked.
    pub from: KickFrom,
    /// It stopped short of its bound for want of room in the log.
    pub short: bool,
}

/// Most due items one tick moves, so one pass never holds the lock for long.
const TICK_BATCH: usize = 10_000;

/// How long after a unique window ends its client id may stay in memory:
/// the timer frees the ids whose windows ended together, once a second at
/// most, rather than waking at each one's end (a put checks the window's
/// end itself, so only memory waits).
const TAKEN_SLACK: Micros = 1_000_000;

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
    ///
    /// Takes the body out of `new` only once the job is in: a put refused
    /// for want of room in the log is tried again with it, and a put that
    /// cloned its job for that would turn the body, which the codec hands
    /// over owning its bytes exactly, into a shared one, and then copy it
    /// back out (two allocations and a copy per put).
    pub fn put(
        &mut self,
        new: &mut NewJob,
        now: Micros,
        log: &mut impl Journal,
    ) -> StoreResult<Put> {
        if let Some(name) = &new.id
            && (self.named(name).is_some() || self.taken.get(name).is_some_and(|&u| u > now))
        {
            return Ok(Put {
                outcome: PutOutcome::Exists(JobId::Client(name.clone())),
                expires: None,
            });
        }
        let key = self.next_key;
        let delay = micros(new.delay);
        let options = new.life.or(self.tube_settings(&new.tube));
        let mut job = Job {
            key,
            name: new.id.clone(),
            tube: new.tube.clone(),
            pri: new.pri,
            delay,
            ttr: micros(new.ttr),
            created: now,
            state: ready_or_delayed(delay, now),
            counters: JobCounters::default(),
            body: Box::default(),
            life: Life::of(options, Round::default()),
        };
        let mut image = job.image();
        image.body = &new.body;
        log.keep(Record::Job(image))?;
        // The codec hands over a body that owns its bytes exactly, so this
        // takes them without copying.
        job.body = Vec::from(std::mem::take(&mut new.body)).into_boxed_slice();
        self.next_key += 1;
        self.total_jobs += 1;
        self.tubes.entry(job.tube.clone()).or_default().total_jobs += 1;
        let (id, state) = (job.id(), job.state);
        let slot = self.insert(job);
        self.link(slot, state, NO_CONN);
        Ok(Put {
            outcome: PutOutcome::Inserted(id),
            expires: options.ttl,
        })
    }

    /// Inserts a whole job from an export (see [`crate::store::Store::import`]).
    pub fn import(
        &mut self,
        whole: WholeJob,
        now: Micros,
        log: &mut impl Journal,
    ) -> StoreResult<PutOutcome> {
        // Its put time as the line gave it, where it did: counted back from
        // `age`, it moved by however long the line waited between its
        // parsing and this (a millisecond or more on a busy server).
        let created = whole
            .put_at
            .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or_else(|| now.saturating_sub(micros(whole.age)), micros);
        // A server id keeps its number unless a put of this store may have
        // handed it out (that job's id, gone or not: a client may still
        // hold it). Every key below `next_key` may have been, except those
        // that imports skipped over when they raised it: the floor is where
        // puts last left it. Every key an import takes counts as imported.
        // (After a restart nothing is known of imports, and the floor is
        // `next_key`: ids then change rather than being reused.)
        let last = self.next_key - 1;
        if last > self.imported {
            self.import_floor = self.import_floor.max(last);
        }
        let (key, name) = match &whole.id {
            JobId::Client(name) => {
                if self.named(name).is_some() || self.taken.get(name).is_some_and(|&u| u > now) {
                    return Ok(PutOutcome::Exists(whole.id));
                }
                (self.next_key, Some(name.clone()))
            }
            &JobId::Server(key) => match self.slot(key) {
                Some(slot) => {
                    let held = &self.jobs[slot];
                    let same = held.name.is_none()
                        && held.tube == whole.tube
                        && *held.body == *whole.body
                        && held.created.abs_diff(created) <= 1_000_000;
                    if same {
                        return Ok(PutOutcome::Exists(whole.id));
                    }
                    (self.next_key, None)
                }
                None if key > self.import_floor => (key, None),
                None => (self.next_key, None),
            },
        };
        let state = match whole.state {
            JobState::Ready | JobState::Reserved => St::Ready,
            JobState::Delayed => ready_or_delayed(micros(whole.time_left), now),
            JobState::Buried => St::Buried {
                seq: whole.bury_order,
            },
        };
        // Tries count only for a job with options.
        let round = match whole.options.is_empty() {
            true => Round::default(),
            false => Round {
                start: whole.counters.reserves.saturating_sub(whole.tries),
                dead: whole.dead && matches!(state, St::Buried { .. }),
            },
        };
        let job = Job {
            key,
            name,
            tube: whole.tube,
            pri: whole.pri,
            delay: micros(whole.delay),
            ttr: micros(whole.ttr),
            created,
            state,
            counters: whole.counters,
            body: Vec::from(whole.body).into_boxed_slice(),
            life: Life::of(whole.options, round),
        };
        log.keep(Record::Job(job.image()))?;
        self.next_key = self.next_key.max(key + 1);
        self.imported = self.imported.max(key);
        if let St::Buried { seq } = state {
            self.bury_seq = self.bury_seq.max(seq);
        }
        self.total_jobs += 1;
        self.tubes.entry(job.tube.clone()).or_default().total_jobs += 1;
        let id = job.id();
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
        let second = now / 1_000_000;
        let mut best: Option<(u32, u64)> = None;
        let mut held_back = Vec::new();
        for t in tubes {
            let Some(ts) = self.tubes.get(t).filter(|ts| !ts.paused(now)) else {
                continue;
            };
            let Some(&first) = ts.ready.first() else {
                continue;
            };
            if self.rate_used_up(t, second) {
                held_back.push(t.clone());
            } else if best.is_none_or(|b| first < b) {
                best = Some(first);
            }
        }
        // The timer serves these tubes' waiting workers when the next
        // second begins.
        for t in held_back {
            self.limited.insert(((second + 1) * 1_000_000, t));
        }
        let (_, key) = best?;
        let slot = self.indexed(key);
        if !self.settings.is_empty() {
            let tube = self.jobs[slot].tube.clone();
            self.count_reserve(&tube, second);
        }
        Some(self.reserve_slot(conn, slot, now, log))
    }

    /// Reserves up to `max` jobs as `reserve` would one by one.
    pub fn reserve_batch(
        &mut self,
        conn: ConnId,
        tubes: &[Tube],
        max: usize,
        now: Micros,
        log: &mut impl Journal,
    ) -> Vec<Reserved> {
        let mut got = Vec::new();
        while got.len() < max {
            match self.reserve(conn, tubes, now, log) {
                Some(r) => got.push(r),
                None => break,
            }
        }
        got
    }

    /// Deletes (or finishes) each of `ids`; returns how many went.
    pub fn remove_batch(
        &mut self,
        conn: ConnId,
        ids: &[JobId],
        finish: bool,
        now: Micros,
        log: &mut impl Journal,
    ) -> u64 {
        let removed = ids.iter().filter(|id| {
            if finish {
                self.finish(conn, id, now, log)
            } else {
                self.delete(conn, id, now, log)
            }
        });
        removed.count() as u64
    }

    /// Whether `tube` has had all the reserves its rate allows in `second`.
    fn rate_used_up(&self, tube: &Tube, second: u64) -> bool {
        if self.settings.is_empty() {
            return false;
        }
        let Some(rate) = self.settings.get(tube).and_then(|s| s.rate) else {
            return false;
        };
        self.tubes
            .get(tube)
            .is_some_and(|ts| ts.window.0 == second && ts.window.1 >= rate)
    }

    /// Counts a reserve from `tube` in `second`, for its rate.
    fn count_reserve(&mut self, tube: &Tube, second: u64) {
        if self.settings.get(tube).and_then(|s| s.rate).is_none() {
            return;
        }
        if let Some(ts) = self.tubes.get_mut(tube) {
            if ts.window.0 != second {
                ts.window = (second, 0);
            }
            ts.window.1 += 1;
        }
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

    /// Removes a job a worker let go of if its time to live ran out while
    /// the worker held it, and records that; says whether it did.
    fn gone_if_expired(&mut self, slot: Slot, now: Micros, log: &mut impl Journal) -> bool {
        if !self.jobs[slot].expired() {
            return false;
        }
        let job = self.expire(slot);
        self.gone(&job, now, log);
        true
    }

    /// Records that a job is gone, and keeps its client id taken for its
    /// unique window, if it has one.
    pub(super) fn gone(&mut self, job: &Job, now: Micros, log: &mut impl Journal) {
        log.forget(&job.image());
        if let (Some(name), Some(window)) = (&job.name, job.options().unique) {
            let until = now.saturating_add(micros(window));
            self.keep_taken(name.clone(), until);
            // Noted, not kept: a delete is never refused for want of room,
            // so neither is this; on a full disk a crash may lose it.
            log.note(Record::Taken { name, until });
        }
    }

    /// Undoes a reservation that never reached its client.
    pub fn give_back(&mut self, conn: ConnId, id: &JobId, now: Micros, log: &mut impl Journal) {
        if let Some(slot) = self.held_by(conn, id)
            && !self.gone_if_expired(slot, now, log)
        {
            let job = &mut self.jobs[slot];
            job.counters.reserves = job.counters.reserves.saturating_sub(1);
            self.relink(slot, St::Ready, NO_CONN);
            log.note(Record::Meta(self.jobs[slot].meta()));
        }
    }

    /// Removes a job for good and records it.
    fn drop_job(&mut self, slot: Slot, now: Micros, log: &mut impl Journal) {
        let job = self.remove(slot);
        self.gone(&job, now, log);
    }

    /// Deletes a job that is not reserved, or is reserved by `conn`.
    pub fn delete(
        &mut self,
        conn: ConnId,
        id: &JobId,
        now: Micros,
        log: &mut impl Journal,
    ) -> bool {
        let Some(slot) = self.slot_of(id) else {
            return false;
        };
        if self.holder(slot).is_some_and(|holder| holder != conn) {
            return false;
        }
        self.drop_job(slot, now, log);
        true
    }

    /// Deletes a job only if `conn` has it reserved.
    pub fn finish(
        &mut self,
        conn: ConnId,
        id: &JobId,
        now: Micros,
        log: &mut impl Journal,
    ) -> bool {
        let Some(slot) = self.held_by(conn, id) else {
            return false;
        };
        self.drop_job(slot, now, log);
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
        if job.meta().round != meta.round {
            job.set_round(meta.round);
        }
        self.link(slot, st, conn);
        Ok(())
    }

    /// Buries a job for having used up its tries, as `change` does.
    fn bury_dead(&mut self, slot: Slot, pri: u32, log: &mut impl Journal) -> StoreResult<()> {
        let seq = self.bury_seq + 1;
        self.change(slot, St::Buried { seq }, NO_CONN, log, |m| {
            m.pri = pri;
            m.counters.buries += 1;
            m.round.dead = true;
        })?;
        self.bury_seq = seq;
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
    ) -> StoreResult<Option<Released>> {
        let Some(slot) = self.held_by(conn, id) else {
            return Ok(None);
        };
        let job = &self.jobs[slot];
        let tube = job.tube.clone();
        let (options, tries) = (job.options(), job.tries());
        if self.gone_if_expired(slot, now, log) {
            return Ok(Some(Released {
                tube,
                buried: false,
                delay: Duration::ZERO,
            }));
        }
        let job = &self.jobs[slot];
        if out_of_tries(&options, tries) {
            self.bury_dead(slot, pri, log)?;
            return Ok(Some(Released {
                tube,
                buried: true,
                delay: Duration::ZERO,
            }));
        }
        let mut delay = micros(delay);
        if delay == 0
            && let Some(wait) = backoff_wait(&options, job.key, tries)
        {
            delay = micros(wait);
        }
        self.change(slot, ready_or_delayed(delay, now), NO_CONN, log, |m| {
            m.pri = pri;
            m.delay = delay;
            m.counters.releases += 1;
        })?;
        Ok(Some(Released {
            tube,
            buried: false,
            delay: Duration::from_micros(delay),
        }))
    }

    /// Buries a job reserved by `conn`.
    pub fn bury(
        &mut self,
        conn: ConnId,
        id: &JobId,
        pri: u32,
        now: Micros,
        log: &mut impl Journal,
    ) -> StoreResult<bool> {
        let Some(slot) = self.held_by(conn, id) else {
            return Ok(false);
        };
        if self.gone_if_expired(slot, now, log) {
            return Ok(true);
        }
        let seq = self.bury_seq + 1;
        self.change(slot, St::Buried { seq }, NO_CONN, log, |m| {
            m.pri = pri;
            m.counters.buries += 1;
            m.round.dead = false;
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

    /// Kicks one job to ready; one kicked out of buried starts a fresh
    /// round of tries.
    fn kick_slot(&mut self, slot: Slot, log: &mut impl Journal) -> StoreResult<()> {
        let job = &self.jobs[slot];
        let fresh = matches!(job.state, St::Buried { .. }) && job.life.is_some();
        let start = job.counters.reserves;
        self.change(slot, St::Ready, NO_CONN, log, |m| {
            m.counters.kicks += 1;
            if fresh {
                m.round = Round { start, dead: false };
            }
        })
    }

    /// Kicks up to `bound` jobs of `tube`, from `from` (else as
    /// [`kick_from`] says). Stops early if the log refuses (`short`), and
    /// fails only if it refused the first.
    pub fn kick(
        &mut self,
        tube: &Tube,
        bound: u64,
        from: Option<KickFrom>,
        log: &mut impl Journal,
    ) -> StoreResult<Kicked> {
        let Some(ts) = self.tubes.get(tube) else {
            return Ok(Kicked {
                count: 0,
                from: from.unwrap_or(KickFrom::Buried),
                short: false,
            });
        };
        let bound = usize::try_from(bound).unwrap_or(usize::MAX);
        let from = from.unwrap_or_else(|| kick_from(ts.buried.len() as u64));
        let keys: Vec<u64> = match from {
            KickFrom::Buried => ts.buried.iter().take(bound).map(|&(_, k)| k).collect(),
            KickFrom::Delayed => ts.delayed.iter().take(bound).map(|&(_, k)| k).collect(),
        };
        for (kicked, &key) in keys.iter().enumerate() {
            let slot = self.indexed(key);
            if let Err(e) = self.kick_slot(slot, log) {
                return if kicked == 0 {
                    Err(e)
                } else {
                    Ok(Kicked {
                        count: kicked as u64,
                        from,
                        short: true,
                    })
                };
            }
        }
        Ok(Kicked {
            count: keys.len() as u64,
            from,
            short: false,
        })
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
    ) -> StoreResult<bool> {
        let Some(ts) = self.tubes.get_mut(tube) else {
            return Ok(false);
        };
        let delay = micros(delay);
        let until = now.saturating_add(delay);
        log.keep(Record::Pause {
            tube: tube.as_str(),
            length: delay,
            until: if delay > 0 { until } else { 0 },
        })?;
        ts.cmd_pause += 1;
        let old = std::mem::replace(&mut ts.pause, (delay > 0).then_some((delay, until)));
        if let Some((_, until)) = old {
            self.pauses.remove(&(until, tube.clone()));
        }
        if delay > 0 {
            self.pauses.insert((until, tube.clone()));
        }
        Ok(true)
    }

    /// Returns to ready the jobs of `held` that `conn` still holds; returns
    /// the tubes that got jobs back, and how many of `held` it went
    /// through. Not recorded: a restart makes them ready too, and nothing
    /// else about them changed. With `failed`, a job with tries or a
    /// backoff is moved as when its TTR runs out instead (see
    /// [`crate::store::Store::release_all`]), which is recorded; with
    /// `checked`, it stops before such a move that the log has no room
    /// for (see [`Journal::has_room_for`]).
    pub fn release_all(
        &mut self,
        conn: ConnId,
        held: &[JobId],
        failed: bool,
        checked: bool,
        now: Micros,
        log: &mut impl Journal,
    ) -> (Vec<Tube>, usize) {
        let mut ready = Vec::new();
        for (done, id) in held.iter().enumerate() {
            let Some(slot) = self.held_by(conn, id) else {
                continue;
            };
            let options = self.jobs[slot].options();
            let fails = failed && (options.tries.is_some() || options.backoff.is_some());
            if fails && checked && !self.room_to_time_out(slot, log) {
                return (ready, done);
            }
            if self.gone_if_expired(slot, now, log) {
                continue;
            }
            if fails {
                // A worker that died holding the job failed it, as one
                // whose TTR ran out: else a job that crashes its worker
                // would come back at once for ever, never a dead letter.
                self.time_out(slot, now, &mut ready);
                log.note(Record::Meta(self.jobs[slot].meta()));
            } else {
                // Given back unfailed (the server stops, or the reserve's
                // client had gone): the try its reserve counted goes back
                // too, or a job on its last try would be reserved once
                // more than it allows.
                let given_back = !failed && self.jobs[slot].give_back_try();
                self.make_ready(slot, &mut ready);
                // Noted as ready: a replay gives back the try of a job the
                // log last saw reserved, and would give this one twice.
                if given_back {
                    log.note(Record::Meta(self.jobs[slot].meta()));
                }
            }
        }
        (ready, held.len())
    }

    /// Moves what has fallen due by `now`, a bounded amount at a time.
    /// Only timeouts are recorded (for their counters): a due time passed
    /// is a due time passed after a restart too. With `checked`, it stops
    /// before a timeout whose record the log has no room for and that a
    /// restart must not undo (see [`Journal::has_room_for`]), and says so
    /// (`true`).
    pub fn tick(&mut self, now: Micros, checked: bool, log: &mut impl Journal) -> (Tick, bool) {
        let mut short = false;
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
            if checked && !self.room_to_time_out(slot, log) {
                short = true;
                break;
            }
            self.jobs[slot].counters.timeouts += 1;
            self.timeouts += 1;
            budget -= 1;
            if self.gone_if_expired(slot, now, log) {
                continue;
            }
            self.time_out(slot, now, &mut ready);
            log.note(Record::Meta(self.jobs[slot].meta()));
        }
        while budget > 0 {
            let Some(&(at, key)) = self.expiries.first() else {
                break;
            };
            if at > now {
                break;
            }
            let slot = self.indexed(key);
            let job = &mut self.jobs[slot];
            if let (St::Reserved { .. }, Some(life)) = (job.state, job.life.as_mut()) {
                // Its worker may still finish it; it goes when let go of.
                life.expired = true;
                self.expiries.pop_first();
            } else {
                // Gone when its time ran out, not when this tick came (after
                // an outage, much later), so its unique window ends as if
                // delayq had never stopped.
                let job = self.expire(slot);
                self.gone(&job, at, log);
            }
            budget -= 1;
        }
        while let Some((until, _)) = self.taken_until.first() {
            if *until > now || budget == 0 {
                break;
            }
            let (until, name) = self.taken_until.pop_first().expect("a first");
            self.taken.remove(&name);
            log.let_go(&Record::Taken { name: &name, until });
            budget -= 1;
        }
        while let Some((at, tube)) = self.limited.first().cloned() {
            if at > now {
                break;
            }
            self.limited.pop_first();
            if !ready.contains(&tube) {
                ready.push(tube);
            }
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
        (Tick { ready, next }, short)
    }

    /// Whether the log has room for the record of a timeout of `slot`, if
    /// that timeout would keep the job out of the ready queue (buried as a
    /// dead letter, or delayed by its backoff): a restart must not undo
    /// such a move, as it may a timeout that makes the job ready. Asks the
    /// log for more room if not.
    fn room_to_time_out(&self, slot: Slot, log: &mut impl Journal) -> bool {
        let job = &self.jobs[slot];
        let (options, tries) = (job.options(), job.tries());
        let sticks = out_of_tries(&options, tries)
            || backoff_wait(&options, job.key, tries).is_some_and(|wait| !wait.is_zero());
        !sticks || log.has_room_for(&Record::Meta(job.meta()))
    }

    /// Moves a job whose TTR ran out: buried if it used up its tries,
    /// else delayed by its backoff, else ready (a caller over many jobs
    /// first asks [`State::room_to_time_out`]).
    fn time_out(&mut self, slot: Slot, now: Micros, ready: &mut Vec<Tube>) {
        let job = &mut self.jobs[slot];
        let (options, tries) = (job.options(), job.tries());
        if out_of_tries(&options, tries) {
            self.bury_seq += 1;
            let seq = self.bury_seq;
            job.counters.buries += 1;
            job.set_round(Round {
                dead: true,
                ..job.meta().round
            });
            self.relink(slot, St::Buried { seq }, NO_CONN);
            return;
        }
        let wait = backoff_wait(&options, job.key, tries).map_or(0, micros);
        if wait > 0 {
            job.delay = wait;
            let due = now.saturating_add(wait);
            self.relink(slot, St::Delayed { due }, NO_CONN);
        } else {
            self.make_ready(slot, ready);
        }
    }

    /// Sets a tube's settings as a whole (all unset clears them).
    pub fn set_tube(
        &mut self,
        tube: &Tube,
        options: Lifecycle,
        log: &mut impl Journal,
    ) -> StoreResult<()> {
        log.keep(Record::Settings {
            tube: tube.as_str(),
            options,
        })?;
        self.keep_settings(tube.clone(), options);
        Ok(())
    }

    /// Keeps a tube's settings, forgetting them once all are unset.
    pub(super) fn keep_settings(&mut self, tube: Tube, options: Lifecycle) {
        self.settings_listed = OnceLock::new();
        if options.is_empty() {
            self.settings.remove(&tube);
        } else {
            self.settings.insert(tube, options);
        }
    }

    /// Registers or replaces a schedule; refused (`false`) if it is new and
    /// the store has [`MAX_SCHEDULES`] already.
    pub fn set_schedule(
        &mut self,
        name: &str,
        encoded: &[u8],
        log: &mut impl Journal,
    ) -> StoreResult<bool> {
        if self.schedules.len() >= MAX_SCHEDULES && !self.schedules.contains_key(name) {
            return Ok(false);
        }
        log.keep(Record::Schedule { name, encoded })?;
        self.keep_schedule(name, encoded);
        Ok(true)
    }

    /// Removes a schedule; returns whether there was one.
    pub fn remove_schedule(&mut self, name: &str, log: &mut impl Journal) -> StoreResult<bool> {
        if !self.schedules.contains_key(name) {
            return Ok(false);
        }
        log.keep(Record::Schedule { name, encoded: &[] })?;
        self.keep_schedule(name, &[]);
        Ok(true)
    }

    /// Keeps a schedule (empty: forgets it).
    pub(super) fn keep_schedule(&mut self, name: &str, encoded: &[u8]) {
        if encoded.is_empty() {
            self.schedules.remove(name);
        } else {
            let encoded = bytes::Bytes::copy_from_slice(encoded);
            self.schedules.insert(std::sync::Arc::from(name), encoded);
        }
    }

    /// Every schedule, by name.
    pub fn schedules(&self) -> Vec<bytes::Bytes> {
        self.schedules.values().cloned().collect()
    }

    /// Keeps a gone job's client id taken until `until` (a later window
    /// replaces an earlier one).
    pub(super) fn keep_taken(&mut self, name: std::sync::Arc<str>, until: Micros) {
        if let Some(old) = self.taken.insert(name.clone(), until) {
            self.taken_until.remove(&(old, name.clone()));
        }
        self.taken_until.insert((until, name));
        let end = until.saturating_add(TAKEN_SLACK);
        self.window_begun = Some(self.window_begun.map_or(end, |e| e.min(end)));
    }

    /// A tube's settings.
    pub fn tube_settings(&self, tube: &Tube) -> Lifecycle {
        self.settings.get(tube).copied().unwrap_or_default()
    }

    /// The earliest time anything falls due.
    fn next_due(&self) -> Option<Micros> {
        [
            self.soonest.first().map(|d| d.0),
            self.reserved.first_key_value().map(|d| d.0.0),
            self.pauses.first().map(|d| d.0),
            self.expiries.first().map(|d| d.0),
            self.limited.first().map(|d| d.0),
            self.taken_until
                .first()
                .map(|d| d.0.saturating_add(TAKEN_SLACK)),
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

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use bytes::Bytes;

    use super::*;
    use crate::job::{ExportCursor, JobCounters, JobState, Lifecycle, WholeJob};
    use crate::store::memory::journal::Volatile;

    /// A job moved keeps its put time exact, however long its line waited
    /// before the import ran or the export was written (counted back from
    /// its age, it moved by that wait: a millisecond under load).
    #[test]
    fn a_moved_job_keeps_its_put_time_exact() {
        let put: Micros = 1_767_225_600_123_000;
        let at = UNIX_EPOCH + Duration::from_micros(put);
        let whole = WholeJob {
            id: JobId::Client("order-close:4711".into()),
            tube: Tube::parse(b"orders").expect("a tube"),
            state: JobState::Ready,
            pri: 1,
            // As the line's reader counted it, 1 s after the put.
            age: Duration::from_secs(1),
            put_at: Some(at),
            delay: Duration::ZERO,
            time_left: Duration::ZERO,
            bury_order: 0,
            ttr: Duration::from_secs(1),
            counters: JobCounters::default(),
            options: Lifecycle::default(),
            tries: 0,
            dead: false,
            body: Bytes::from_static(b"x"),
        };
        let mut state = State::new();
        // The import runs 5 ms after the line was read.
        let now = put + 1_005_000;
        state.import(whole, now, &mut Volatile).expect("imported");
        let page = state.export(ExportCursor::default(), 10, now + 7_000);
        assert_eq!(page.jobs.len(), 1);
        assert_eq!(page.jobs[0].put_at, Some(at));
        assert_eq!(page.jobs[0].age, Duration::from_millis(1_012));
    }
}
